"""`taskcard serve` with `[cluster]`: the shared store, limiter, leases and command relay.

Kept apart from `serve_cli` so that the embedded (SQLite) path reads as before: `open_cluster`
connects (or says in one line why it cannot), `cursor_store` fences the Telegram update
offset with the poll lease, and `attach` wraps every built channel so its commands go through
the shared stream and its polling through the lease.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable, Mapping
from dataclasses import replace

from redis.exceptions import RedisError

from taskcard.bridge.cluster.commands import ClusteredChannel
from taskcard.bridge.cluster.config import ClusterUrlMissing, resolve_redis_url
from taskcard.bridge.cluster.lease import PollLease
from taskcard.bridge.cluster.runtime import Cluster, ClusterUnreachable, shared_store
from taskcard.bridge.config import ServiceConfig
from taskcard.bridge.deliver.registry import BuiltChannel
from taskcard.bridge.run.logs import start_error
from taskcard.bridge.store.base import StateFileError, StateStore
from taskcard.bridge.store.redis import permission_fix, redis_trouble, wrong_type
from taskcard.channels.base import CursorStore


def open_cluster(config: ServiceConfig, env: Mapping[str, str]) -> Cluster | None:
    """The connected cluster, or None after printing one line (the caller exits 2)."""
    try:
        url = resolve_redis_url(config.cluster, env)
        cluster = Cluster.connect(config.cluster, url)
    except (ClusterUrlMissing, ClusterUnreachable) as error:
        start_error(str(error))
        return None
    try:
        # First: a refusal would read as an unreachable Redis in the checks after it.
        refused = cluster.refused_permissions()
        misplaced = None if refused else cluster.misplaced_key()
        other = None if refused or misplaced else _other_bot(config, env, cluster)
    except RedisError as error:
        reason = type(error).__name__
        start_error(f"cannot reach the Redis of [cluster] ({reason})")
        return None
    if refused:
        start_error(permission_fix(refused))
        cluster.store.close()
        return None
    if misplaced:
        key, found, expected = misplaced
        start_error(
            f"cluster.key_prefix {config.cluster.key_prefix!r}: {wrong_type(key, found, expected)}"
        )
        cluster.store.close()
        return None
    if other:
        cluster.forget_bots()  # the one it did claim (a Telegram bot before a Feishu refusal)
        start_error(
            f"cluster.key_prefix {config.cluster.key_prefix!r}: a running instance"
            f" on this prefix posts as another {other}, and one prefix serves one {other}; give"
            f" this instance the same {other}'s credentials, or its own cluster.key_prefix"
        )
        cluster.store.close()
        return None
    return cluster


def _other_bot(config: ServiceConfig, env: Mapping[str, str], cluster: Cluster) -> str | None:
    """Which identity ("Telegram bot", "Feishu app") a live instance on the prefix holds
    otherwise than this one; None when all agree. Only public ids are kept in Redis: a
    Telegram token's `<bot id>` part and a Feishu app id."""
    token = env.get(config.telegram.token_env, "") if config.telegram else ""
    bot = token.split(":", 1)[0].strip() if ":" in token else ""
    if bot and not cluster.claim_bot("telegram", bot):
        return "Telegram bot"
    app = env.get(config.feishu.app_id_env, "").strip() if config.feishu else ""
    if app and not cluster.claim_bot("feishu", app):
        return "Feishu app"
    return None


def say_read_failure(error: Exception) -> None:
    """One line on stderr for a Redis failure met while `taskcard status` or `chats` read the
    shared state (a permission the Redis user lacks, Redis gone mid-read), which was a
    traceback; anything else is raised again. Called from the command's `except`."""
    if not isinstance(error, RedisError):
        raise error
    print(f"taskcard: reading the cluster's Redis failed: {redis_trouble(error)}", file=sys.stderr)


def status_store(config: ServiceConfig, env: Mapping[str, str]) -> StateStore:
    """The shared store `taskcard status` reads; `StateFileError` (one line) if unreachable."""
    try:
        return shared_store(config.cluster, resolve_redis_url(config.cluster, env))
    except (ClusterUrlMissing, ClusterUnreachable) as error:
        raise StateFileError(str(error)) from None


class ClusterWiring:
    """What `serve` hands to the channel registry and gets back wrapped."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self._telegram_gate: PollLease | None = None
        self._relays: dict[str, ClusteredChannel] = {}

    def cursor_store(self, config: ServiceConfig) -> CursorStore:
        store = self.cluster.store
        if config.telegram is None or not config.telegram.commands:
            return store
        from taskcard.channels.telegram import import_client_library

        import_client_library()  # before the first module of it that loads the library
        from taskcard.channels.telegram.commands import OFFSET_CURSOR_KEY

        gate, cursors = self.cluster.poll_gate("telegram", store, OFFSET_CURSOR_KEY)
        self._telegram_gate = gate
        return cursors

    def attach(self, built: Mapping[str, BuiltChannel]) -> dict[str, BuiltChannel]:
        wired: dict[str, BuiltChannel] = {}
        for name, item in built.items():
            item = replace(item, secrets=item.secrets + self.cluster.secrets)
            if name == "console":
                wired[name] = item  # a terminal of this instance: nothing to share
                continue
            if name == "telegram" and self._telegram_gate is not None:
                item.channel.poll_gate = self._telegram_gate
            chats = frozenset(spec.chat.chat_id for spec in item.routes)
            channel = ClusteredChannel(
                item.channel, self.cluster.aio, self.cluster.prefix, self.cluster.owner, chats
            )
            self._relays[name] = channel
            wired[name] = replace(item, channel=channel)
        return wired

    def follow(self, routes_chat: Callable[[str, str], bool]) -> None:
        """Claim the replies of the chats `routes_chat(channel, chat_id)` says this instance
        routes now, not only of those routed at start."""
        for name, relay in self._relays.items():
            relay.routes_chat = functools.partial(routes_chat, name)
