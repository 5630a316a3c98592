"""What the service should serve right now: agents and routes, from config, disk and origins.

The fleet changes while serving (folders appear under a discovery root, SIGHUP reloads the
config, a turn's origin opens a route), so it is computed, never patched: `desired_fleet` is a
pure function of its inputs, and the service diffs its result against what runs
(`Service.apply`). `discover_agents` is the one impure step (it lists the roots).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, tzinfo
from pathlib import Path

from taskcard.bridge.compose.view import route_zone
from taskcard.bridge.config import AGENT_ID_PATTERN, AGENT_ID_RULE, ServiceConfig
from taskcard.bridge.deliver.registry import RouteSpec, original_chat
from taskcard.bridge.schedule.scheduler import RouteKey
from taskcard.channels.base import ChatRef, CursorStore, RouteView
from taskcard.producers.task_card.contract import Origin

log = logging.getLogger(__name__)

# The last edit of a resident whose agent left the fleet.
RETIRED_NOTE = "Agent retired: its folder was removed or it left the configuration."
# The last edit of a card whose chat a reload stopped routing the agent to (still served).
UNROUTED_NOTE = (
    "No longer followed in this chat: the configuration stopped routing this agent here."
)
# Keys that SIGHUP applies; a change anywhere else needs a restart.
_RELOADABLE = ("agents", "discover", "display")
_CHANNEL_RELOADABLE: dict[str, list[object]] = {"routes": [], "origin_chats": []}


@dataclass(frozen=True)
class Route:
    """One resident message's route: from the config, or opened by a turn's origin."""

    key: RouteKey
    pin: bool
    allowed_user_ids: frozenset[str] | None
    zone: tzinfo = UTC
    origin: bool = False
    view: RouteView = "cards"  # the chat's view until a /taskcard board|cards there
    orchestrator: str | None = None  # the chat's until a /taskcard orchestrator there


@dataclass(frozen=True)
class Fleet:
    agents: Mapping[str, Path]
    routes: tuple[Route, ...] = ()


@dataclass
class Discovery:
    """The agents found under the roots, and the problems seen (each worth one warning)."""

    agents: dict[str, Path] = field(default_factory=dict)
    problems: set[str] = field(default_factory=set)


def discover_agents(roots: Sequence[Path], configured: Collection[str]) -> Discovery:
    """Every immediate subdirectory of each root whose name is a valid, unclaimed agent id.

    Hidden folders (`.git`) are passed over silently; other names that are not agent ids,
    names already configured and names found under an earlier root are reported.
    """
    found = Discovery()
    read: set[str] = set()
    for root in roots:
        real = os.path.realpath(root)
        if real in read:
            continue  # the same folder listed twice (a warning at start): its agents once
        read.add(real)
        try:
            entries = sorted(os.scandir(root), key=lambda entry: entry.name)
        except OSError:
            continue  # a missing root is served as soon as it appears (the watcher sees it)
        for entry in entries:
            name = entry.name
            try:
                is_dir = entry.is_dir()
            except OSError:
                continue
            if not is_dir or name.startswith("."):
                continue
            if not AGENT_ID_PATTERN.fullmatch(name):
                found.problems.add(
                    f"discovered folder {os.path.join(root, name)!r} skipped: its name is not a"
                    f" valid agent id ({AGENT_ID_RULE}); rename it"
                )
            elif name in configured:
                found.problems.add(
                    f"discovered folder {os.path.join(root, name)!r} skipped: agent {name!r}"
                    " is configured in [[agents]], which wins"
                )
            elif name in found.agents:
                found.problems.add(
                    f"discovered folder {os.path.join(root, name)!r} skipped: agent {name!r}"
                    f" was already found at {found.agents[name]}"
                )
            else:
                found.agents[name] = Path(root) / name
    return found


def desired_fleet(
    config: ServiceConfig,
    specs: Iterable[RouteSpec],
    discovered: Mapping[str, Path],
    origin_routes: Iterable[RouteKey],
) -> Fleet:
    """The agents (configured first, then discovered) and every route that should run.

    A route's `["*"]` covers discovered agents too. An origin route runs while its agent is
    in the fleet and its channel is among `specs`' channels or configured; a configured route
    of the same key wins over it.
    """
    agents: dict[str, Path] = {agent.id: agent.workdir for agent in config.agents}
    for agent_id, workdir in discovered.items():
        agents.setdefault(agent_id, workdir)
    routes: dict[RouteKey, Route] = {}
    for spec in specs:
        names = list(agents) if spec.all_agents else list(spec.agents)
        for agent_id in names:
            if agent_id not in agents:
                continue  # named but not (yet) discovered
            key = RouteKey(spec.channel, spec.chat, agent_id)
            routes.setdefault(
                key,
                Route(
                    key,
                    spec.pin,
                    spec.allowed_user_ids,
                    route_zone(spec.timezone),
                    view=spec.view,
                    orchestrator=spec.orchestrator,
                ),
            )
    for key in origin_routes:
        if key.agent_id in agents and key not in routes:
            routes[key] = Route(key, pin=False, allowed_user_ids=None, origin=True)
    return Fleet(agents, tuple(routes.values()))


def origin_chats(config: ServiceConfig) -> dict[str, frozenset[str]]:
    """Per channel, the chat ids where an origin may open a route."""
    chats: dict[str, frozenset[str]] = {}
    if config.telegram is not None:
        chats["telegram"] = frozenset(str(chat) for chat in config.telegram.origin_chats)
    if config.feishu is not None:
        chats["feishu"] = frozenset(config.feishu.origin_chats)
    return chats


def keyed_origin_chats(
    config: ServiceConfig, cursor: CursorStore | None
) -> dict[str, frozenset[str]]:
    """`origin_chats` with each chat under the id the service keys it by (a supergroup a
    routed group became, under the group's id; as written without a state to ask)."""
    return {
        channel: frozenset(
            chat_id if cursor is None else original_chat(channel, cursor, ChatRef(chat_id)).chat_id
            for chat_id in chats
        )
        for channel, chats in origin_chats(config).items()
    }


def origin_listed(key: RouteKey, allowed: Mapping[str, frozenset[str]]) -> bool:
    """Whether the chat of origin route `key` is in its channel's `origin_chats` (keyed as
    `keyed_origin_chats` gives them): an open route of a chat taken out of them closes."""
    return key.chat.chat_id in allowed.get(key.channel, frozenset())


def origin_route(
    origin: Origin, agent_id: str, allowed: Mapping[str, frozenset[str]]
) -> RouteKey | None:
    """The route an origin opens for `agent_id`, or None when its chat is not allowed."""
    if origin.chat_id not in allowed.get(origin.channel, frozenset()):
        return None
    return RouteKey(origin.channel, ChatRef(origin.chat_id, origin.thread_id), agent_id)


def restart_needed(running: ServiceConfig, new: ServiceConfig) -> list[str]:
    """The keys (dotted paths) whose change SIGHUP cannot apply (channels, state, limits...).

    Agents, discovery roots, display defaults and each channel's routes and origin_chats are
    applied while serving; credentials, endpoints and the rest need a restart.
    """

    def comparable(config: ServiceConfig) -> dict[str, object]:
        data = config.model_dump()
        for key in _RELOADABLE:
            data.pop(key, None)
        for channel in ("telegram", "feishu"):
            if data.get(channel) is not None:
                data[channel] = {**data[channel], **_CHANNEL_RELOADABLE}
        return data

    before, after = comparable(running), comparable(new)
    return sorted(_changed_keys(before, after))


def _changed_keys(before: object, after: object, path: str = "") -> list[str]:
    """The dotted key paths (`telegram.poll_timeout_s`) whose values differ: a table added
    or removed is named as a whole, an array compared whole. The refusal named only the
    table (`telegram changed`), leaving the operator to hunt for the key a reload cannot
    apply among the table's others."""
    if isinstance(before, dict) and isinstance(after, dict):
        return [
            changed
            for key in sorted(before.keys() | after.keys(), key=str)
            for changed in _changed_keys(
                before.get(key), after.get(key), f"{path}.{key}" if path else str(key)
            )
        ]
    return [] if before == after else [path]
