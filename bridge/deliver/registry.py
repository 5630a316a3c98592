"""The one registry of transports: how each configured channel and its routes are built.

Adding a transport is one package under `channels/` plus one entry in `_BUILDERS` (and its
section in `bridge.config`). Secrets are read here, at the edge, from the environment
variables the configuration names, and handed to the channel; they are never logged.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final, Protocol
from urllib.parse import urlsplit

from taskcard.bridge.config import ServiceConfig
from taskcard.channels.base import (
    Channel,
    ChatRef,
    CursorStore,
    RouteView,
    env_name_shown,
    secret_value_problem,
)


class SecretMissing(Exception):
    """A secret environment variable the configuration names is unset, empty, or does not
    hold a value of the secret's form (white space around a value is taken off first: a
    trailing line break from a file or an `echo` is no mistake). `messages` holds one line
    per such variable: every one is named at once, not one per start."""

    def __init__(self, *messages: str) -> None:
        self.messages = list(messages)
        super().__init__("\n".join(self.messages))


# What a bot token may hold: @BotFather's are the bot's id, a colon and [A-Za-z0-9_-], but a
# local Bot API server or a test double may use other printable ASCII. Refused: white space,
# quotes, other characters than ASCII, and those that end or escape a URL's path (/ ? # % \),
# since the token is part of every request's path.
_BOT_TOKEN: Final = re.compile(r"[!$&()*+,.0-9:;<=>@A-Z\[\]^_a-z{|}~-]+")


@dataclass(frozen=True)
class RouteSpec:
    """One configured chat of one channel and the agents it shows."""

    channel: str
    chat: ChatRef
    agents: tuple[str, ...]  # already expanded from "*"
    pin: bool = False
    allowed_user_ids: frozenset[str] | None = None
    timezone: str = "UTC"  # IANA name, already validated
    all_agents: bool = False  # written ["*"]: also every agent discovered while serving
    view: RouteView = "cards"  # the chat's view until a /taskcard board|cards there
    orchestrator: str | None = None  # the chat's until a /taskcard orchestrator there


@dataclass(frozen=True)
class BuiltChannel:
    channel: Channel
    routes: tuple[RouteSpec, ...]
    secrets: tuple[str, ...]  # values to scrub from every log line


Builder = Callable[[ServiceConfig, CursorStore, Mapping[str, str]], BuiltChannel | None]


def _need(env: Mapping[str, str], key_path: str, variable: str, what: str) -> str:
    value = env.get(variable, "").strip()
    if not value:
        # Set but blank (an `export X=` or an env file's empty line) is told apart: "not set"
        # would send the operator looking for a variable that is there.
        state = "is empty" if variable in env else "is not set"
        raise SecretMissing(
            f"{key_path}: the environment variable {env_name_shown(variable)} {state}; export"
            f" the {what} "
            f"there (or point {key_path} at the variable that holds it)"
        )
    problem = _value_problem(key_path, value, what)
    if problem is not None:
        article = "an" if what[0] in "aeiou" else "a"
        raise SecretMissing(
            f"{key_path}: the environment variable {env_name_shown(variable)} does not hold"
            f" {article} {what}: {problem}"
        )
    return value


# A bot token from @BotFather: the bot's id, a colon, 35 characters of [A-Za-z0-9_-].
_TELEGRAM_TOKEN_FORM: Final = re.compile(r"[0-9]{5,}:[A-Za-z0-9_-]{30,}")


def _value_problem(key_path: str, value: str, what: str) -> str | None:
    """Why a secret's value (white space around it removed) is not the `what` that
    `key_path` names, without quoting it: a slip any secret can carry (quotes, `Bearer `,
    white space inside), or a credential of the other platform, or of the other key."""
    problem = secret_value_problem(value, what)
    if problem is not None:
        return problem
    if key_path.startswith("telegram.") and value.startswith("cli_"):
        return (
            "it is a Feishu app id (cli_...); point telegram.token_env at the variable that"
            " holds the bot token from @BotFather"
        )
    if key_path.startswith("feishu.") and _TELEGRAM_TOKEN_FORM.fullmatch(value):
        return (
            "it has a Telegram bot token's form (the bot's id, a colon, then letters); point"
            f" {key_path} at the variable that holds the Feishu {what}"
        )
    if key_path == "feishu.app_secret_env" and value.startswith("cli_"):
        return (
            "it is an app id (cli_...); the variables of feishu.app_id_env and"
            " feishu.app_secret_env may be swapped: the secret is the other value on the"
            " app's Credentials page"
        )
    return None


def _expand(agents: Sequence[str], config: ServiceConfig) -> tuple[str, ...]:
    if "*" in agents:
        return tuple(config.agent_ids())
    return tuple(dict.fromkeys(agents))


def _allowed(users: Sequence[int | str] | None) -> frozenset[str] | None:
    return None if users is None else frozenset(str(user) for user in users)


def route_specs(config: ServiceConfig, cursor: CursorStore | None = None) -> list[RouteSpec]:
    """Every configured route of every enabled channel; needs no secret (`taskcard status`).

    With the state's `cursor`, a Telegram chat the config names by the id of the supergroup a
    group became is keyed by the group's id, as the service learned it (see
    `channels.telegram.moves`): its residents and settings are the ones kept so far.
    """
    specs: list[RouteSpec] = []
    if config.telegram is not None:
        for t in config.telegram.routes:
            thread = None if t.thread_id is None else str(t.thread_id)
            chat = ChatRef(str(t.chat_id), thread)
            specs.append(
                RouteSpec(
                    "telegram",
                    chat if cursor is None else original_chat("telegram", cursor, chat),
                    _expand(t.agents, config),
                    t.pin,
                    _allowed(t.allowed_user_ids),
                    t.timezone,
                    "*" in t.agents,
                    t.view,
                    t.orchestrator,
                )
            )
    if config.feishu is not None:
        for f in config.feishu.routes:
            specs.append(
                RouteSpec(
                    "feishu",
                    ChatRef(f.chat_id),
                    _expand(f.agents, config),
                    f.pin,
                    _allowed(f.allowed_user_ids),
                    f.timezone,
                    "*" in f.agents,
                    f.view,
                    f.orchestrator,
                )
            )
    if config.console_enabled:
        from taskcard.channels.console.channel import CONSOLE_CHAT

        specs.append(
            RouteSpec(
                "console",
                CONSOLE_CHAT,
                tuple(config.agent_ids()),
                timezone=config.console.timezone,
                all_agents=True,
            )
        )
    return specs


def _routes_of(
    config: ServiceConfig, channel: str, cursor: CursorStore | None = None
) -> tuple[RouteSpec, ...]:
    return tuple(spec for spec in route_specs(config, cursor) if spec.channel == channel)


def _telegram(
    config: ServiceConfig, cursor: CursorStore, env: Mapping[str, str]
) -> BuiltChannel | None:
    if config.telegram is None:
        return None
    from taskcard.channels.telegram import import_client_library

    import_client_library()
    from taskcard.channels.telegram.channel import TelegramChannel

    section = config.telegram
    token = _telegram_token(config, env)
    channel = TelegramChannel(section, token, cursor)
    return BuiltChannel(channel, _routes_of(config, "telegram", cursor), (token,))


def _telegram_token(config: ServiceConfig, env: Mapping[str, str]) -> str:
    """The bot token from the variable `telegram.token_env` names; `SecretMissing` when it
    is unset, empty or not a token's form (never quoting it)."""
    assert config.telegram is not None
    section = config.telegram
    token = _need(env, "telegram.token_env", section.token_env, "bot token")
    if not _BOT_TOKEN.fullmatch(token):
        # Never quoted: it is a secret. A space, a quote or an accented letter copied along
        # would otherwise reach the request line, and a server's answer may echo it back
        # into the log in a form the log's scrubbing does not recognise.
        raise SecretMissing(
            f"telegram.token_env: the environment variable {section.token_env} does not hold a"
            " bot token (it has a space, a quote, a character that is not ASCII, or one of"
            " / ? # % \\); copy it again from @BotFather (digits, a colon, then letters,"
            " digits, '-' and '_')"
        )
    if ":" not in token and _public_bot_api(section.api_base_url):
        feishu = _FEISHU_SECRET_NOTE if _FEISHU_SECRET_FORM.fullmatch(token) else ""
        raise SecretMissing(
            f"telegram.token_env: the environment variable {env_name_shown(section.token_env)}"
            " does not hold a bot token: it has no colon, which every token from @BotFather"
            f" has (the bot's id, a colon, then letters){feishu}; point telegram.token_env at"
            " the variable that holds the bot token (one without a colon is taken only with"
            " telegram.api_base_url naming a local Bot API server)"
        )
    return token


# Telegram's own Bot API: every token it takes is the bot's id, a colon and a secret. Another
# root (a local Bot API server, a test double) may take tokens of its own, so only there is a
# token without a colon taken: a Feishu app secret (32 letters and digits) in the bot
# token's variable passed, and every request was refused as unauthorized.
_PUBLIC_BOT_API_HOST: Final = "api.telegram.org"
_FEISHU_SECRET_FORM: Final = re.compile(r"[A-Za-z0-9]{32}")
_FEISHU_SECRET_NOTE: Final = ", and has a Feishu app secret's form (32 letters and digits)"


def _public_bot_api(api_base_url: str) -> bool:
    """Whether `telegram.api_base_url` is Telegram's own Bot API."""
    try:
        host = urlsplit(api_base_url.strip()).hostname
    except ValueError:
        return False
    return host is not None and host.rstrip(".") == _PUBLIC_BOT_API_HOST


def _feishu(
    config: ServiceConfig, cursor: CursorStore, env: Mapping[str, str]
) -> BuiltChannel | None:
    if config.feishu is None:
        return None
    section = config.feishu
    app_id, app_secret, verification_token, encrypt_key = _feishu_secrets(config, env)
    # Imported once the variables are there: the Feishu SDK takes seconds to import, which a
    # start that stops on a missing variable need not wait for.
    from taskcard.channels.feishu.channel import FeishuChannel

    channel = FeishuChannel(
        section,
        app_id,
        app_secret,
        cursor,
        verification_token=verification_token,
        encrypt_key=encrypt_key,
    )
    secrets = tuple(s for s in (app_secret, verification_token, encrypt_key) if s)
    return BuiltChannel(channel, _routes_of(config, "feishu"), secrets)


def _feishu_secrets(
    config: ServiceConfig, env: Mapping[str, str]
) -> tuple[str, str, str | None, str | None]:
    """The app id, app secret, verification token (webhook only) and encrypt key (webhook,
    optional); `SecretMissing` naming every required variable that is unset or empty, and
    every variable whose value is not of its secret's form (`_value_problem`)."""
    assert config.feishu is not None
    section = config.feishu
    wanted = [
        ("feishu.app_id_env", section.app_id_env, "app id"),
        ("feishu.app_secret_env", section.app_secret_env, "app secret"),
    ]
    if section.events == "webhook":
        wanted.append(
            (
                "feishu.webhook.verification_token_env",
                section.webhook.verification_token_env,
                "event verification token",
            )
        )
    found: list[str] = []
    missing: list[str] = []
    for key_path, variable, what in wanted:
        try:
            found.append(_need(env, key_path, variable, what))
        except SecretMissing as problem:
            missing += problem.messages
    encrypt_key: str | None = None
    variable = section.webhook.encrypt_key_env
    # Optional: unset or empty is only a warning (`optional_secrets_unset`), but a value
    # given is checked as the others are.
    if section.events == "webhook" and env.get(variable, "").strip():
        try:
            encrypt_key = _need(env, "feishu.webhook.encrypt_key_env", variable, "encrypt key")
        except SecretMissing as problem:
            missing += problem.messages
    if missing:
        raise SecretMissing(*missing)
    app_id, app_secret = found[0], found[1]
    verification_token: str | None = found[2] if len(found) > 2 else None
    return app_id, app_secret, verification_token, encrypt_key


def missing_secrets(config: ServiceConfig, env: Mapping[str, str]) -> list[str]:
    """What `build_channels` would refuse for lack of a secret in `env`, one line per
    variable (the setting and the variable named, never a value), without building a
    channel (`taskcard serve --check`); empty when every configured channel can start."""
    missing: list[str] = []
    checks: list[Callable[[ServiceConfig, Mapping[str, str]], object]] = []
    if config.telegram is not None:
        checks.append(_telegram_token)
    if config.feishu is not None:
        checks.append(_feishu_secrets)
    for check in checks:
        try:
            check(config, env)
        except SecretMissing as problem:
            missing += problem.messages
    return missing


def optional_secrets_unset(config: ServiceConfig, env: Mapping[str, str]) -> list[str]:
    """Optional secret variables the configuration names that are unset or empty in `env`:
    the service starts without them, but likely not as meant."""
    notes: list[str] = []
    if config.feishu is not None and config.feishu.events == "webhook":
        variable = config.feishu.webhook.encrypt_key_env
        if not env.get(variable, "").strip():
            state = "is empty" if variable in env else "is not set"
            notes.append(
                f"feishu.webhook.encrypt_key_env: the environment variable"
                f" {env_name_shown(variable)} {state}; only unencrypted callbacks are then"
                " accepted, checked by the verification token alone: export the app's Encrypt"
                " Key there if it has one"
            )
    return notes


def _console(
    config: ServiceConfig, cursor: CursorStore, env: Mapping[str, str]
) -> BuiltChannel | None:
    if not config.console_enabled:
        return None
    from taskcard.channels.console.channel import ConsoleChannel, ConsoleHeader, route_lines

    header = ConsoleHeader(
        agents=tuple(config.agent_ids()),
        routes=route_lines([(s.channel, str(s.chat), s.agents) for s in route_specs(config)]),
    )
    return BuiltChannel(ConsoleChannel(header=header), _routes_of(config, "console"), ())


class ScopeRules(Protocol):
    """How a channel reads its own rate-scope keys back (its `scopes` module)."""

    def covers(self, scope: str, chat: ChatRef, message_id: str | None) -> bool: ...

    def describe(self, scope: str) -> str | None: ...


def scope_rules(channel: str) -> ScopeRules | None:
    """The channel's reading of its scope keys, without loading its client library (for
    `taskcard status`); None for a channel without rate scopes."""
    if channel == "telegram":
        from taskcard.channels.telegram import scopes as telegram_scopes

        return telegram_scopes
    if channel == "feishu":
        from taskcard.channels.feishu import scopes as feishu_scopes

        return feishu_scopes
    return None


def original_chat(channel: str, cursor: CursorStore, chat: ChatRef) -> ChatRef:
    """The chat under which the service keys `chat`: a Telegram supergroup that a routed
    group became is keyed by the group's id (`channels.telegram.moves`); any other as it is."""
    if channel != "telegram":
        return chat
    from taskcard.channels.telegram import moves

    return moves.original_chat(cursor, chat)


def chat_moved_to(channel: str, cursor: CursorStore, chat_id: str) -> str | None:
    """The id a routed chat lives under now, when its platform moved it: Telegram gives a
    group upgraded to a supergroup a new id (`channels.telegram.moves`); Feishu keeps a chat's
    id for life. None when the chat did not move."""
    if channel != "telegram":
        return None
    from taskcard.channels.telegram.moves import moved_to

    return moved_to(cursor, chat_id)


def stored_topic_names(channel: str, cursor: CursorStore, chat_id: str) -> dict[str, str]:
    """The names of chat `chat_id`'s forum topics its channel kept, by thread id (cleaned,
    untrusted text): Telegram's (`channels.telegram.topics`); a Feishu thread has none.
    Raises what the store raises."""
    if channel != "telegram":
        return {}
    from taskcard.channels.telegram.topics import stored_topic_names as telegram_names

    return telegram_names(cursor, chat_id)


def describe_scope(scope: str) -> str:
    """A stored scope key for people, worded by the channel whose key it is."""
    for channel in ("telegram", "feishu"):
        rules = scope_rules(channel)
        described = rules.describe(scope) if rules is not None else None
        if described is not None:
            return described
    return "an unknown scope"


_BUILDERS: dict[str, Builder] = {
    "telegram": _telegram,
    "feishu": _feishu,
    "console": _console,
}


def build_channels(
    config: ServiceConfig, cursor: CursorStore, env: Mapping[str, str]
) -> dict[str, BuiltChannel]:
    """Every configured channel with its routes; raises `SecretMissing` naming the variable."""
    built: dict[str, BuiltChannel] = {}
    missing: list[str] = []
    for name, builder in _BUILDERS.items():
        try:
            result = builder(config, cursor, env)
        except SecretMissing as problem:
            # Every channel's variables are named at once: an operator missing the bot token
            # and the app secret learnt of the second only after fixing the first.
            missing += problem.messages
            continue
        if result is not None:
            built[name] = result
    if missing:
        raise SecretMissing(*missing)
    return built
