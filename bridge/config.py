"""The service configuration: one TOML file validated once, at the edge, into frozen models.

`load_config` is the only reader. Relative paths (`state_dir`, each agent's `workdir`) are
resolved against the folder of the config file as its path was given (a link to the file
is not followed), so a service started from any directory sees the same agents. Every
problem is reported as a `ConfigError` whose messages each name the key path
(`telegram.routes[0].chat_id`) and say how to fix it; nothing is half-loaded.

Every number has a documented range (a timeout of 1e12 seconds passes a type check and breaks
the service hours later), every URL is checked for its form, and `load_config` also checks the
paths against the filesystem: a `state_dir` that is a file, or that cannot be written, is
refused here rather than at the first state write. An agent's `workdir` that cannot be one
(a file, a loop of links) is refused only by the pre-flight (`preflight`: `config check`,
`serve --check`); elsewhere it is that agent's problem alone (`workdir_problems`).

Run `python -m taskcard.bridge.config --write-schema` to regenerate
`config/taskcard.schema.json` after changing a model; a test fails while the two disagree.
"""

from __future__ import annotations

import argparse
import difflib
import errno
import ipaddress
import json
import os
import re
import select
import socket
import stat
import sys
import tomllib
import types
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, Final, Literal, Union, get_args, get_origin
from urllib.parse import urlsplit

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from taskcard.bridge.cluster.config import ClusterConfig
from taskcard.bridge.compose.redact import redact_every_shape, redact_tokens
from taskcard.bridge.observe.config import MetricsConfig
from taskcard.channels.base import TIMEZONE_HELP, TimeZoneName, counted
from taskcard.channels.feishu.config import FeishuConfig
from taskcard.channels.telegram.config import TelegramConfig
from taskcard.producers.task_card.contract import dangling_link, file_on_path, shown_path

AGENT_ID_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
# The pattern in words, for every message that refuses an id.
AGENT_ID_RULE = "1-64 letters, digits, '_', '.' or '-', starting with a letter or digit"
ALL_AGENTS = "*"
SCHEMA_PATH = Path(__file__).resolve().parent.parent / "config" / "taskcard.schema.json"
EXAMPLE_PATH = Path(__file__).resolve().parent.parent / "config" / "taskcard.example.toml"


class ConfigError(Exception):
    """The config file cannot be used. `messages` holds one line per problem.

    A problem may quote what the file holds (`log_level: ... (got '...')`); a secret pasted
    under the wrong key must not reach the terminal or the log, so every line is cleared of
    the secret shapes first.
    """

    def __init__(self, messages: Sequence[str]) -> None:
        self.messages = [_clip_quotes(redact_tokens(message)) for message in messages]
        super().__init__("\n".join(self.messages))


# A value quoted back longer than this is cut: an agent id, a log level or an address pasted
# many times over (or a whole file pasted into one string) was echoed whole, a screen of
# text per line in the terminal and the log, burying the key and the fix after it.
MAX_QUOTED_CHARS: Final = 120
MAX_KEY_CHARS: Final = 64
# A value as `repr` quotes it: a quote after no letter or digit (an apostrophe in a word,
# "chat's", opens nothing), escapes inside, the same quote before no letter or digit.
_QUOTED = re.compile(r"(?<!\w)(?:'(?:[^'\\\n]|\\.)*'|\"(?:[^\"\\\n]|\\.)*\")(?!\w)")


def _clip_quotes(message: str) -> str:
    """`message` with each quoted value over `MAX_QUOTED_CHARS` cut to its head and tail,
    saying how long it was."""

    def clip(found: re.Match[str]) -> str:
        text = found.group()
        inner = text[1:-1]
        if len(inner) <= MAX_QUOTED_CHARS:
            return text
        quote = text[0]
        return f"{quote}{inner[:60]}…{inner[-20:]}{quote} ({len(inner)} characters)"

    return _QUOTED.sub(clip, message)


def _no_empty_path(value: object) -> object:
    """An empty path is refused: `Path("")` is `.`, so it silently meant the config file's
    own folder (the state kept beside the config, every folder there taken for an agent).
    So is a path of spaces only (`" "`, or any other blank: a tab is refused earlier, as a
    control character): it was taken as a folder named by those spaces, created beside the
    config file, which no one means."""
    if value == "":
        raise ValueError(
            'is empty; give a path (relative paths start at this file\'s folder; "." is that'
            " folder itself)"
        )
    if isinstance(value, str) and not value.strip():
        raise ValueError(
            "holds only spaces, which would be taken as a folder named by them;"
            ' give a path (relative paths start at this file\'s folder; "." is that folder'
            " itself)"
        )
    return value


def _resolve_against_config(value: Path, info: ValidationInfo) -> Path:
    """Relative paths are relative to the config file, never to the current directory.

    A `~user` of no known user is refused here, naming the key: it ended `config check` and
    `serve` with a traceback. (A NUL never gets here: see `control_problems`.)
    """
    try:
        value = value.expanduser()
    except RuntimeError:
        raise ValueError(
            f"starts with ~ but the home folder of {str(value).split('/')[0]!r} is not known"
            " here; write the full path"
        ) from None
    base = (info.context or {}).get("base_dir")
    if isinstance(base, Path) and not value.is_absolute():
        return base / value
    return value


class AgentConfig(BaseModel):
    """One agent whose working directory holds the card files."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)

    id: str = Field(
        description="Agent id shown in cards and logs; 1-64 of [A-Za-z0-9_.-], a letter or digit"
        " first."
    )
    workdir: Path = Field(
        strict=False,  # TOML gives text; strict mode would ask for a Path object
        description="The agent's working directory (relative: to this file).",
    )

    @field_validator("id")
    @classmethod
    def _check_id(cls, value: str) -> str:
        if not AGENT_ID_PATTERN.fullmatch(value):
            raise ValueError(f"{value!r} is not a valid agent id; use {AGENT_ID_RULE}")
        return value

    @field_validator("workdir", mode="before")
    @classmethod
    def _workdir_given(cls, value: object) -> object:
        return _no_empty_path(value)

    @field_validator("workdir")
    @classmethod
    def _resolve_workdir(cls, value: Path, info: ValidationInfo) -> Path:
        return _resolve_against_config(value, info)

    @model_validator(mode="after")
    def _share_fields_set(self) -> AgentConfig:
        """Every agent sets both keys: one shared record of that instead of a set per agent.

        Why: a fleet of 10,000 configured agents held 10,000 identical sets (2 MB). The model
        is frozen, so nothing adds to the set; `model_copy` copies it before changing it.
        """
        if self.__pydantic_fields_set__ == _AGENT_FIELDS:
            object.__setattr__(self, "__pydantic_fields_set__", _AGENT_FIELDS)
        return self


_AGENT_FIELDS: set[str] = {"id", "workdir"}


class ConsoleConfig(BaseModel):
    """The terminal projection: every agent's composed card, live."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)

    enabled: Literal["auto"] | bool = Field(
        default="auto",
        description='"auto": on exactly when no chat channel is configured; or true / false.',
    )
    timezone: TimeZoneName = Field(default="UTC", description=TIMEZONE_HELP)

    @field_validator("enabled", mode="before")
    @classmethod
    def _check_enabled(cls, value: object) -> object:
        if value == "auto" or isinstance(value, bool):
            return value
        shown = repr(value) if isinstance(value, str | int | float) else _toml_kind(value)
        if isinstance(value, str) and value.casefold() in ("true", "false"):
            raise ValueError(f"got {shown}; write {value.casefold()} without quotes (a boolean)")
        if isinstance(value, str) and value.casefold() == "auto":
            raise ValueError(f"got {shown}{_case_meant(value, ['auto'])}")
        raise ValueError(f'got {shown}; use "auto", true or false')


class WatchConfig(BaseModel):
    """How quickly file changes are noticed."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)

    backend: Literal["auto", "inotify", "watchfiles"] = Field(
        default="auto",
        description=(
            "How file events are read: inotify from the service's loop (Linux, the default"
            " there as `auto`: no polling), or watchfiles (its own thread, any system)."
        ),
    )
    debounce_ms: int = Field(
        default=50,
        ge=1,
        le=10_000,
        description="watchfiles only: group file events arriving within this window.",
    )
    rescan_interval_s: float = Field(
        default=300.0,
        ge=1,
        le=3600,
        description=(
            "Safety-net rescan: every agent is re-read once in this many seconds (1-3600),"
            " a slice of the fleet each second; file events do the rest."
        ),
    )


class DiscoverConfig(BaseModel):
    """Folders whose immediate subdirectories are agents, found while serving."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)

    # TOML gives text; strict mode would ask for Path objects.
    roots: list[Annotated[Path, Field(strict=False)]] = Field(
        default_factory=list,
        max_length=64,
        description=(
            "Each immediate subdirectory of a root is an agent whose id is the folder's name"
            " (relative roots: to this file); at most 64 roots."
        ),
    )

    @field_validator("roots", mode="before")
    @classmethod
    def _roots_given(cls, value: object) -> object:
        if isinstance(value, list):
            for index, root in enumerate(value):
                try:
                    _no_empty_path(root)
                except ValueError as exc:
                    raise ValueError(f"entry {index} {exc}") from None
        return value

    @field_validator("roots")
    @classmethod
    def _resolve_roots(cls, value: list[Path], info: ValidationInfo) -> list[Path]:
        resolved: list[Path] = []
        for index, root in enumerate(value):
            try:
                resolved.append(_resolve_against_config(root, info))
            except ValueError as exc:
                raise ValueError(f"entry {index} {exc}") from None
        return resolved


class DisplayConfig(BaseModel):
    """What the automatic slot shows by default."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)

    activity_rows: int = Field(
        default=3, ge=1, le=10, description="Recent activity rows (routes may override, 1-10)."
    )
    no_output_after_s: float = Field(
        default=300.0,
        ge=1,
        le=86_400,
        description=(
            'An open turn silent this long is shown as "unknown": work cannot be told from'
            " silence (1-86400 s)."
        ),
    )


class SignalsConfig(BaseModel):
    """When the service tells people (and a parent agent) that an agent owes a report."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)

    idle_floor_s: float = Field(
        default=180.0,
        ge=5,
        le=86_400,
        description=(
            "Quiet this long with a live card and no report since the turn began gives one"
            ' "idle without report" notice (5-86400 s).'
        ),
    )
    no_output_after_start_s: float = Field(
        default=30.0,
        ge=1,
        le=3600,
        description=(
            'An agent that started and wrote no event for this long is "no output": one'
            " warning, cleared by its first event (1-3600 s)."
        ),
    )


class InboxConfig(BaseModel):
    """Text people send to an agent (a reply to its card, `/tell`): limits and timeouts."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)

    max_messages: int = Field(
        default=5,
        ge=1,
        le=100,
        description="Messages one person may send one agent in any window of period_s (1-100).",
    )
    period_s: float = Field(
        default=10.0, ge=1, le=3600, description="The window of max_messages (1-3600 s)."
    )
    unconfirmed_after_s: float = Field(
        default=120.0,
        ge=5,
        le=86_400,
        description=(
            'A message still queued this long during a running turn is shown as "unconfirmed"'
            " (5-86400 s)."
        ),
    )


class LimitsConfig(BaseModel):
    """Bounds the service applies to what the platforms ask of it."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)

    max_pause_s: float = Field(
        default=3600.0,
        ge=1,
        le=86_400,
        description=(
            "Longest pause a 429 may impose on a chat or bot (1-86400 s); longer requests"
            " are capped and logged."
        ),
    )


class NoticesConfig(BaseModel):
    """How many notices one route shows before the rest are folded into a summary."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)

    max_per_minute: int = Field(
        default=5,
        ge=1,
        le=60,
        description=(
            "Notices per route in any minute (1-60); the excess is folded into one summary"
            " message per minute."
        ),
    )


class ServiceConfig(BaseModel):
    """The whole configuration of `taskcard serve`."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)

    state_dir: Path = Field(
        default=Path(".taskcard"),
        strict=False,  # TOML gives text; strict mode would ask for a Path object
        # The default goes through the validator too: relative to the config file, not the cwd.
        validate_default=True,
        description="Service state (SQLite); relative paths are relative to this file.",
    )
    forget_departed_after_s: float = Field(
        default=604_800.0,
        ge=1,
        le=31_622_400,
        description=(
            "An agent that left the fleet (removed from this file, its discovered folder"
            " gone) keeps its resident messages, offsets and notices this long (1 s to 366"
            " days; default 7 days): back within it, it edits the same messages; after it,"
            " all of it is forgotten and a return posts new cards. Not in a cluster: there"
            " a departed agent's state is kept for good."
        ),
    )
    agents: list[AgentConfig] = Field(default_factory=list, description="The watched agents.")
    telegram: TelegramConfig | None = Field(default=None, description="The Telegram channel.")
    feishu: FeishuConfig | None = Field(default=None, description="The Feishu channel.")
    console: ConsoleConfig = Field(default_factory=ConsoleConfig)
    watch: WatchConfig = Field(default_factory=WatchConfig)
    discover: DiscoverConfig = Field(default_factory=DiscoverConfig)
    display: DisplayConfig = Field(default_factory=DisplayConfig)
    limits: LimitsConfig = Field(default_factory=LimitsConfig)
    notices: NoticesConfig = Field(default_factory=NoticesConfig)
    signals: SignalsConfig = Field(default_factory=SignalsConfig)
    inbox: InboxConfig = Field(default_factory=InboxConfig)
    metrics: MetricsConfig = Field(default_factory=MetricsConfig)
    cluster: ClusterConfig = Field(default_factory=ClusterConfig)
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = Field(
        default="INFO", description="Log verbosity."
    )

    @field_validator("state_dir", mode="before")
    @classmethod
    def _state_dir_given(cls, value: object) -> object:
        return _no_empty_path(value)

    @field_validator("log_level", mode="before")
    @classmethod
    def _log_level_any_case(cls, value: object) -> object:
        """`log_level = "info"` is taken as INFO, as `--log-level info` and
        `TASKCARD_LOG_LEVEL=info` are: the file alone refused it."""
        if isinstance(value, str) and value.upper() in get_args(
            cls.model_fields["log_level"].annotation
        ):
            return value.upper()
        return value  # anything else is refused quoted as written

    @field_validator("state_dir")
    @classmethod
    def _resolve_state_dir(cls, value: Path, info: ValidationInfo) -> Path:
        return _resolve_against_config(value, info)

    @model_validator(mode="after")
    def _cross_check(self) -> ServiceConfig:
        problems = _cross_problems(self)
        if problems:
            # One ValueError per validator: the lines are split again by `_format_errors`.
            raise ValueError("\n".join(problems))
        _share_agent_ids(self)
        return self

    @property
    def console_enabled(self) -> bool:
        """Whether the console channel runs: explicitly, or by default without chat channels."""
        if self.console.enabled == "auto":
            return self.telegram is None and self.feishu is None
        return bool(self.console.enabled)

    def agent_ids(self) -> list[str]:
        return [agent.id for agent in self.agents]


def _share_agent_ids(config: ServiceConfig) -> None:
    """Routes name each agent by the very string its `[[agents]]` entry holds.

    Why: TOML gives every mention of an id its own string, so a fleet of 10,000 agents listed
    in routes held each id twice (about 0.6 MB); the route lists are rebuilt in place from
    the configured ids (equal strings, so nothing a reader can see changes).
    """
    ids = {agent.id: agent.id for agent in config.agents}
    for channel in (config.telegram, config.feishu):
        for route in channel.routes if channel is not None else ():
            route.agents[:] = [ids.get(name, name) for name in route.agents]


def _cross_problems(config: ServiceConfig) -> list[str]:
    """Checks that span sections: unique ids, routes naming configured agents, unique chats."""
    problems: list[str] = []
    seen: dict[str, int] = {}
    for index, agent in enumerate(config.agents):
        if agent.id in seen:
            problems.append(
                f"agents[{index}].id: {agent.id!r} is already used by agents[{seen[agent.id]}];"
                " give every agent a unique id"
            )
        else:
            seen[agent.id] = index
    problems.extend(_endpoint_problems(config))
    known = sorted(seen)
    route_groups: list[tuple[str, Sequence[tuple[object, Sequence[str], str | None]]]] = []
    if config.telegram is not None:
        route_groups.append(
            (
                "telegram",
                # A username is one chat however it is cased, as Telegram reads it.
                [
                    ((_chat_key(r.chat_id), r.thread_id), r.agents, r.orchestrator)
                    for r in config.telegram.routes
                ],
            )
        )
    if config.feishu is not None:
        route_groups.append(
            (
                "feishu",
                [((r.chat_id, None), r.agents, r.orchestrator) for r in config.feishu.routes],
            )
        )
    for section, routes in route_groups:
        chats: dict[object, int] = {}
        for index, (chat, agents, orchestrator) in enumerate(routes):
            where = f"{section}.routes[{index}]"
            if chat in chats:
                problems.append(
                    f"{where}: the same chat (and thread) as {section}.routes[{chats[chat]}];"
                    " merge the two routes' agents into one route"
                )
            else:
                chats[chat] = index
            if ALL_AGENTS in agents and len(agents) > 1:
                problems.append(f'{where}.agents: "*" already means every agent; list it alone')
            for position, name in enumerate(agents):
                # With discovery roots, a name may be a folder that appears while serving.
                if name != ALL_AGENTS and name not in seen and not config.discover.roots:
                    choices = ", ".join(known) if known else "none configured"
                    problems.append(
                        f"{where}.agents[{position}]: unknown agent {name!r}; use the id of an"
                        f' [[agents]] entry ({choices}) or "*"'
                    )
            if orchestrator is not None:
                problem = _orchestrator_problem(orchestrator, agents, known, config)
                if problem is not None:
                    problems.append(f"{where}.orchestrator: {problem}")
    return problems


def _orchestrator_problem(
    name: str, agents: Sequence[str], known: list[str], config: ServiceConfig
) -> str | None:
    """Why a route's `orchestrator` cannot be `name` (None when it can): it must be one of
    the agents the route follows, since only their signals wake it and only there is it
    shown. Under `["*"]` that is any configured agent, or any agent id when folders are
    discovered (one may appear while serving)."""
    if ALL_AGENTS in agents:
        if name in known or (config.discover.roots and AGENT_ID_PATTERN.fullmatch(name)):
            return None
        choices = ", ".join(known) if known else "none configured"
        return f"unknown agent {name!r}; name one of the route's agents ({choices}) or leave it out"
    if name in agents:
        return None
    listed = ", ".join(repr(agent) for agent in dict.fromkeys(agents))
    return (
        f"{name!r} is not one of the route's agents ({listed}); name one of them, add it to"
        " the route's agents, or leave orchestrator out"
    )


def _chat_key(chat_id: int | str) -> int | str:
    return chat_id.lower() if isinstance(chat_id, str) else chat_id


_LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain"})


# The parts of a URL that may carry a secret: everything up to the last `@` after `//` (a
# password may itself hold `/`, `?` or `#`), the query and fragment (`?token=...`), and a
# path that looks like a Bot API call (`/bot<id>:<token>`). A problem quotes the URL masked.
_URL_USERINFO = re.compile(r"(?<=//).*@", re.DOTALL)
_URL_QUERY = re.compile(r"[?#].*", re.DOTALL)
_URL_BOT_PATH = re.compile(r"/bot[0-9]+:[^/]*")


def _shown_url(value: str) -> str:
    """`value` quoted for an error or a log line, any credentials, token or query masked."""
    masked = _URL_USERINFO.sub("***@", value)
    return repr(_URL_QUERY.sub("?***", _URL_BOT_PATH.sub("/bot***", masked)))


def url_problem(value: str) -> str | None:
    """Why `value` cannot be an API root URL, or None when it can.

    An https URL with a host and nothing after the path; plain http only towards this
    machine (a local Bot API server or a test fake), never across a network with a token.
    The problem quotes the URL without its user information or query: they may hold a
    secret, which must not reach the terminal or the service's log.
    """
    shown = _shown_url(value)
    try:
        parts = urlsplit(value)
        port = parts.port
    except ValueError:
        # Not the parser's own words: they quote the part it could not read (a password).
        return f"{shown} is not a URL (its host or port cannot be read); use e.g. https://host"
    del port
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return f"{shown} is not an http(s) URL with a host; use e.g. https://host"
    if parts.username is not None or parts.password is not None:
        return f"{shown} carries credentials; put secrets in the environment, not the URL"
    if _URL_BOT_PATH.search(parts.path):
        return (
            f"{shown} carries a bot token in its path; give only the API root (e.g."
            " https://api.telegram.org) and put the token in the environment"
        )
    if parts.query or parts.fragment or any(c.isspace() for c in value):
        return f"{shown} has a query, fragment or spaces; give only scheme, host and path"
    if parts.scheme == "http" and not _is_loopback(parts.hostname):
        return f"{shown} uses plain http to another host; use https"
    return None


def _is_loopback(host: str) -> bool:
    if host.lower() in _LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def path_problems(config: ServiceConfig, *, workdirs: bool = False) -> list[str]:
    """Problems of the configured paths on this machine (the one impure check).

    `state_dir` must be a writable directory, or creatable in one. A path the system cannot
    even look at (a name longer than the file system allows, a folder on the way this user
    may not enter) is refused naming its key, never a traceback.

    With `workdirs` (the operator's pre-flight: `config check`, `serve --check`), an agent's
    `workdir` that exists and is no folder, lies under a file or goes round a loop of links
    is refused too. Elsewhere it is that agent's problem alone (`workdir_problems`): the
    folder is the agent's, which may replace it at any moment, and it refused the start, a
    reload and `taskcard status` for every other agent.
    """
    problems: list[str] = []
    state_problem = _examined(config.state_dir, _state_dir_problem)
    if state_problem is not None:
        problems.append(f"state_dir: {state_problem}")
    for index, root in enumerate(config.discover.roots):
        problem = _examined(root, _root_problem)
        if problem is not None:
            problems.append(f"discover.roots[{index}]: {problem}")
    if workdirs:
        for index, agent in enumerate(config.agents):
            problem = _examined(agent.workdir, _workdir_problem)
            if problem is not None:
                problems.append(f"agents[{index}].workdir: {problem}")
    return problems


def workdir_problems(config: ServiceConfig) -> dict[str, str]:
    """Per configured agent whose workdir cannot be one now (a file, under a file, a loop of
    links, a path the service cannot look at), the line that says so (agent id -> line):
    logged at a start and at a reload and listed by `taskcard status`, the agent served all
    the same and its files read once the workdir is a folder again, the others untouched."""
    lines: dict[str, str] = {}
    for index, agent in enumerate(config.agents):
        problem = _examined(agent.workdir, _workdir_problem)
        if problem is not None:
            lines[agent.id] = workdir_unusable(agent.id, index, problem)
    return lines


def workdir_unusable(agent_id: str, index: int, problem: str) -> str:
    """The line that says an agent's workdir cannot be one now (`workdir_problems`)."""
    return (
        f"agent {agent_id}: agents[{index}].workdir: {problem}; the agent is served all the"
        " same and its files are read once its workdir is a folder (the other agents are not"
        " affected)"
    )


def workdirs_not_yet(config: ServiceConfig) -> list[AgentConfig]:
    """The configured agents whose workdir does not exist (yet). Each is served all the same
    and picked up once its folder is made, so this is information rather than a warning;
    but a slip in the path (`agents/buidler`) would otherwise show nothing anywhere. Said by
    `config check`, `serve --check`, `taskcard status` and the log of a start and of a reload
    (`workdir_not_yet`). A link to a folder not made yet counts as not existing; a loop of
    links, which never becomes a folder until the links change, is a problem
    (`workdir_problems`), not said here."""
    return [
        agent
        for agent in config.agents
        if not os.path.exists(agent.workdir) and _examined(agent.workdir, _workdir_problem) is None
    ]


def workdir_not_yet(agent_id: str, workdir: Path | str) -> str:
    """The line that says an agent's workdir does not exist yet (`workdirs_not_yet`)."""
    return f"agent {agent_id}: workdir {_not_yet(workdir)}; it is picked up when created"


def _not_yet(path: Path | str) -> str:
    """`path` and "does not exist yet", or, when a symbolic link on it leads nowhere (the
    path's own name or a folder link on its way), that link and where it points: "does not
    exist yet" about a name `ls` shows sent the operator to make a folder where the link is."""
    # A loop is a problem of its own (`_loop_problem`): `dangling_link` names none.
    dangling = dangling_link(Path(path), "does not exist yet: ", yet=True)
    return f"{shown_path(path)} {dangling or 'does not exist yet'}"


def roots_not_yet(config: ServiceConfig) -> list[tuple[int, Path]]:
    """The discovery roots that do not exist (yet), with their index in `discover.roots`.
    Watched all the same (their folders are taken as agents once the root is made); said as
    `workdirs_not_yet` says agents, since a slip in a root's path showed nothing anywhere:
    no agent, no line, `config check` valid."""
    return [
        (index, root)
        for index, root in enumerate(config.discover.roots)
        if not os.path.exists(root)
    ]


def root_not_yet(index: int, root: Path | str) -> str:
    """The line that says a discovery root does not exist yet (`roots_not_yet`)."""
    return (
        f"discover.roots[{index}]: {_not_yet(root)}; its folders are taken as agents once it"
        " is created"
    )


def _examined(path: Path, check: Callable[[Path], str | None]) -> str | None:
    """`check(path)`, or what keeps the system from looking at `path` at all.

    `Path.exists` answers False only for a missing path: a name too long (ENAMETOOLONG) or a
    folder on the way this user may not search (EACCES) raised through `config check`,
    `serve --check`, `serve` and a reload as a traceback. The path is not quoted when it is
    the name that is too long (it would fill the screen).
    """
    try:
        return check(path)
    except OSError as exc:
        if exc.errno == errno.ENAMETOOLONG:
            return (
                "the path (or one of its folder names) is longer than the file system allows;"
                " use a shorter path"
            )
        reason = exc.strerror or type(exc).__name__
        return (
            f"{path} cannot be examined by this user ({reason}); fix the permissions of"
            " the folders on the way to it, or choose another path"
        )


def _loop_at(path: Path) -> Path | None:
    """The first part of `path` that goes round a loop of symbolic links (a link to itself,
    or two links to each other), or None. Such a path never exists until the links change:
    `exists()` answers False and `is_symlink()` True, as for a link to a folder not made
    yet, so a loop was called a dangling link, or a workdir not made yet."""
    try:
        os.stat(path)
        return None
    except OSError as exc:
        if exc.errno != errno.ELOOP:
            return None
    for probe in (*reversed(path.parents), path):
        try:
            os.stat(probe)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                return probe
    return path


def _loop_problem(path: Path, fix: str) -> str | None:
    """The line that says `path` goes round a loop of links (`_loop_at`), or None."""
    loop = _loop_at(path)
    if loop is None:
        return None
    where = "" if loop == path else f" at {loop}"
    return (
        f"{path} goes round a loop of symbolic links{where} (following them leads back to"
        f" where they start); fix the link{fix}"
    )


def _root_problem(root: Path) -> str | None:
    if (loop := _loop_problem(root, " or choose another root")) is not None:
        return loop
    if root.exists() and not root.is_dir():
        return (
            f"{root} exists and is not a directory; point it at the folder that holds the"
            " agents' folders"
        )
    if (blocker := file_on_path(root)) is not None:
        return f"{blocker} is not a directory, so {root} can never exist; fix the path"
    return None


def _workdir_problem(workdir: Path) -> str | None:
    if (loop := _loop_problem(workdir, " or point workdir at the agent's folder")) is not None:
        return loop
    if workdir.exists() and not workdir.is_dir():
        return f"{workdir} exists and is not a directory; point it at the agent's working directory"
    if (blocker := file_on_path(workdir)) is not None:
        return f"{blocker} is not a directory, so {workdir} can never exist; fix the path"
    return None


# Kernel file systems: they take a `mkdir` from root, or look writable to `os.access`, yet
# hold no data of ours (proc and sysfs refuse files or invent them, /dev lives in memory).
_PSEUDO_ROOTS: Final = ("/proc", "/sys", "/dev")
_SHARED_MEMORY: Final = "/dev/shm"


def _pseudo_root(path: Path) -> str | None:
    """The kernel file system `path` (once symlinks are resolved) lies in, or None."""
    real = os.path.realpath(path)
    if real == _SHARED_MEMORY or real.startswith(_SHARED_MEMORY + "/"):
        return None  # an ordinary tmpfs: state kept there lasts until the next boot
    for root in _PSEUDO_ROOTS:
        if real == root or real.startswith(root + "/"):
            return root
    return None


def _state_dir_problem(state_dir: Path) -> str | None:
    pseudo = _pseudo_root(state_dir)
    if pseudo is not None:
        return (
            f"{state_dir} is under {pseudo}, a kernel file system where no state is kept; choose"
            " a directory on a disk, such as /var/lib/taskcard"
        )
    if (loop := _loop_problem(state_dir, " or choose another state_dir")) is not None:
        return loop
    probe = state_dir
    while not probe.exists():  # the nearest existing ancestor is where it will be created
        if probe.parent == probe:
            break
        if probe.is_symlink():
            return f"{probe} is a dangling symlink; fix the link or choose another state_dir"
        probe = probe.parent
    if not probe.is_dir():
        if probe == state_dir:
            return f"{state_dir} exists and is not a directory; choose a directory path"
        return f"{probe} is not a directory, so {state_dir} cannot be created; fix the path"
    if not _writable(probe):
        what = state_dir if probe == state_dir else f"{probe} (to create {state_dir})"
        return (
            f"{what} is not writable by this user or is on a read-only file system;"
            " fix its permissions or mount, or choose another state_dir"
        )
    return None


def _writable(directory: Path) -> bool:
    """Writable for real: `os.access` alone says yes to root on a read-only mount."""
    try:
        if os.statvfs(directory).f_flag & os.ST_RDONLY:
            return False
    except OSError:
        return False
    return os.access(directory, os.W_OK | os.X_OK)


def _endpoint_problems(config: ServiceConfig) -> list[str]:
    """URL and listen-address keys, checked for their form (the channel models hold text)."""
    problems: list[str] = []
    urls: list[tuple[str, str]] = []
    if config.telegram is not None:
        urls.append(("telegram.api_base_url", config.telegram.api_base_url))
    if config.feishu is not None:
        urls.append(("feishu.domain", config.feishu.domain))
        webhook = config.feishu.webhook
        if not webhook.path.startswith("/") or any(c.isspace() or c in "?#" for c in webhook.path):
            # Quoted without its query or fragment (`?token=...`), which may hold a secret.
            shown = repr(_URL_QUERY.sub("?***", webhook.path))
            problems.append(
                f'feishu.webhook.path: {shown} is not a request path; use e.g. "/feishu/events"'
            )
        host_problem = _listen_host_problem(webhook.host)
        if host_problem is not None:
            problems.append(f"feishu.webhook.host: {host_problem}")
    for key, value in urls:
        problem = url_problem(value)
        if problem is None and key == "feishu.domain":
            problem = _origin_problem(value)
        if problem is not None:
            problems.append(f"{key}: {problem}")
    return problems


def bot_root_doubt(value: str) -> str | None:
    """Why `value` (a valid URL) is likely not the Bot API root: it ends in `/bot`, as the
    `base_url` of python-telegram-bot does. The channel adds `/bot<token>` itself, so the
    requests go to `.../bot/bot<token>/...`, which only a proxy mounted under such a path
    serves. A warning, not a refusal: that proxy is a valid root."""
    parts = urlsplit(value)
    head, _, last = parts.path.rstrip("/").rpartition("/")
    if last.lower() != "bot":
        return None
    root = f"{parts.scheme}://{parts.netloc.rpartition('@')[2]}{head}"  # no credentials
    return (
        f"{_shown_url(value)} ends in /bot, which the service adds itself (with the token):"
        f" requests go to .../bot/bot<token>/; unless a proxy serves that path, give the API"
        f" root without the /bot, e.g. {root!r}"
    )


def _origin_problem(value: str) -> str | None:
    """Why `value` (a valid URL) is not an origin: the Feishu channel takes only scheme and
    host, and refused any path when it started, with a traceback that quoted the URL whole (a
    custom bot's webhook URL, `.../bot/v2/hook/<secret>`, is the likely paste)."""
    parts = urlsplit(value)
    if not parts.path.strip("/"):
        return None
    origin = f"{parts.scheme}://{parts.netloc}"
    return f"{origin!r} is followed by a path; give only the origin, e.g. {origin!r}"


_HOST_LABEL = re.compile(r"(?!-)[A-Za-z0-9-]{1,63}(?<!-)")
_HOST_EXAMPLES = 'e.g. "127.0.0.1" (this machine only) or "0.0.0.0" (every address)'


def _listen_host_problem(value: str) -> str | None:
    """Why `value` is not an address the webhook server can be told to listen on (an IP
    address, or a name the resolver looks up), or None when it is.

    A name whose last part is a number is none: `"5"` or `"127.1"` passed as host names,
    yet the resolver reads them as the IPv4 shorthand (0.0.0.5, 127.0.0.1), so `"5"` failed
    only at the bind. An address in brackets or with its port is said as such, with the key
    to move the port to. Quoted without what comes before an @ (`user:password@0.0.0.0`).
    """
    shown = repr(_URL_USERINFO.sub("***@", "//" + value)[2:])
    try:
        ipaddress.ip_address(value)
        return None
    except ValueError:
        pass
    if "@" not in value:
        if value.startswith("[") and value.endswith("]"):
            try:
                ipaddress.IPv6Address(value[1:-1])
            except ValueError:
                pass
            else:
                return f"{shown} is in brackets; write the IPv6 address alone, as {value[1:-1]!r}"
        host, sep, port = value.rpartition(":")
        if sep and port.isdigit() and _listen_host_problem(host.strip("[]")) is None:
            return (
                f"{shown} holds a port; write the address alone here, as"
                f" {host.strip('[]')!r}, and the port in feishu.webhook.port"
            )
    try:
        ascii_name = value.removesuffix(".").encode("idna").decode("ascii")
    except UnicodeError:
        ascii_name = ""
    labels = ascii_name.split(".")
    if not (0 < len(ascii_name) <= 253 and all(_HOST_LABEL.fullmatch(x) for x in labels)):
        return f"{shown} is not an IP address or host name; use {_HOST_EXAMPLES}"
    if labels[-1].isdigit():
        try:
            read_as = f", and the resolver reads it as {socket.inet_ntoa(socket.inet_aton(value))}"
        except OSError:
            read_as = ""
        return (
            f"{shown} is not a full IPv4 address (no host name ends in a number{read_as});"
            f" write all four numbers, {_HOST_EXAMPLES}"
        )
    return None


# Far more than a fleet of 10,000 agents takes; a bound so that `--config /dev/zero` (or any
# endless stream) is refused instead of read until memory runs out.
MAX_CONFIG_BYTES = 16 * 1024 * 1024
_UTF8_BOM = b"\xef\xbb\xbf"


def _read_config_bytes(path: Path) -> tuple[bytes, bool]:
    """The file's bytes, at most `MAX_CONFIG_BYTES`: a regular file, or a pipe such as
    `--config <(...)`; a device or socket is refused before anything is read from it, except
    /dev/null (an empty configuration: the embedded defaults). And whether it is a regular
    file, the only kind with a folder that relative paths can start at.

    Opened without blocking: a named pipe nothing writes to held `config check`, `serve` and
    `status` in `open` for ever. A pipe is read once a writer has written or gone
    (`CONFIG_PIPE_WAIT_S`)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    with open(fd, "rb") as stream:
        info = os.fstat(fd)
        mode = info.st_mode
        if stat.S_ISCHR(mode) and info.st_rdev == _devnull_rdev():
            return b"", False
        if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) or stat.S_ISSOCK(mode):
            raise ConfigError(
                [f"{path}: is a device, not a configuration file; give the path of a TOML file"]
            )
        if stat.S_ISFIFO(mode):
            _await_pipe_writer(fd, path)
        os.set_blocking(fd, True)
        raw = stream.read(MAX_CONFIG_BYTES + 1)
        regular = stat.S_ISREG(mode)
    if len(raw) > MAX_CONFIG_BYTES:
        raise ConfigError(
            [
                f"{path}: larger than {MAX_CONFIG_BYTES // (1024 * 1024)} MB, which no"
                " configuration needs; give the path of the TOML file"
            ]
        )
    return raw, regular


# How long a configuration that is a pipe may stay silent before it is refused: longer than
# a command feeding `--config <(...)` takes to start (a secret store's client, say).
CONFIG_PIPE_WAIT_S: Final = 30.0


def _await_pipe_writer(fd: int, path: Path) -> None:
    """Return once the pipe `fd` has bytes or its writer has gone; `ConfigError` when neither
    happens within `CONFIG_PIPE_WAIT_S` (a named pipe with no writer shows neither)."""
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    if not poller.poll(int(CONFIG_PIPE_WAIT_S * 1000)):
        raise ConfigError(
            [
                f"{path}: is a pipe that nothing wrote to within {CONFIG_PIPE_WAIT_S:g} s;"
                " give the path of a TOML file, or start what writes the pipe first"
            ]
        )


def _devnull_rdev() -> int | None:
    try:
        return os.stat(os.devnull).st_rdev
    except OSError:
        return None


# What to do about a configuration path the system refuses for its own sake, not for the
# file's permissions (which were named for all of these).
_CONFIG_PATH_FIXES: Final = {
    errno.ENAMETOOLONG: "the path (or one of its folder names) is longer than the file system"
    " allows; use a shorter path",
    errno.ENOTDIR: "a part of the path before the file is not a folder; fix the path",
    errno.ELOOP: "the path goes round a loop of symbolic links; fix the path or the links",
}


# Byte order marks of the encodings a text editor offers beside UTF-8 (UTF-32 first: its
# little-endian mark starts with UTF-16's).
_WIDE_MARKS: Final = (
    (b"\xff\xfe\x00\x00", "UTF-32"),
    (b"\x00\x00\xfe\xff", "UTF-32"),
    (b"\xff\xfe", "UTF-16"),
    (b"\xfe\xff", "UTF-16"),
)


def _wide_encoding(raw: bytes) -> str | None:
    """Why `raw` is no UTF-8 text when it holds NUL bytes or starts with a UTF-16 or UTF-32
    byte order mark, else None.

    A file saved as UTF-16 (Windows editors call it "Unicode") was refused as "not UTF-8 text
    (byte 0xff at line 1, column 1)", or, without its mark, as a TOML syntax error at line 1
    ("Expected '=' after a key"): every ASCII letter has a NUL beside it, which is valid
    UTF-8. TOML takes no NUL anywhere, so a file holding one is refused here, saying where.
    """
    for mark, encoding in _WIDE_MARKS:
        if raw.startswith(mark):
            return f"is {encoding} text (it starts with that byte order mark); save it as UTF-8"
    at = raw.find(b"\x00")
    if at < 0:
        return None
    line = raw.count(b"\n", 0, at) + 1
    column = at - (raw.rfind(b"\n", 0, at) + 1) + 1
    return (
        f"holds a NUL byte (line {line}, column {column}), which TOML does not allow: the file"
        " is likely saved as UTF-16, or is not a text file; save it as UTF-8 text"
    )


# A key as TOML writes it: bare, "basic" or 'literal', dotted with optional spaces.
_TOML_KEY_PART = r"""(?:[A-Za-z0-9_-]+|"(?:[^"\\\n]|\\.)*"|'[^'\n]*')"""
_TOML_KEY = rf"{_TOML_KEY_PART}(?:[ \t]*\.[ \t]*{_TOML_KEY_PART})*"
_TOML_STATEMENT = re.compile(rf"[ \t]*({_TOML_KEY})[ \t]*=")
_TOML_HEADER = re.compile(rf"[ \t]*(\[\[?)[ \t]*({_TOML_KEY})[ \t]*\]\]?[ \t]*(?:#.*)?")
_TOML_WHERE = re.compile(r" \(at (?:line (\d+), column \d+|end of document)\)$")
_DECLARED_TWICE = re.compile(r"Cannot declare \((.*)\) twice")


def _given_twice(text: str, error: str) -> str | None:
    """The line that names a key (or table) the file gives twice, or None for other errors.

    tomllib says only "Cannot overwrite a value (at line 7, column 19)", or "at end of
    document", and names a table twice as a Python tuple: the key was hunted through the
    file. The line reported is where the second statement ends; its key is read from the
    nearest statement at or above it, under the nearest table header (an entry of an array
    of tables is counted, as the other messages name it: `telegram.routes[1].pin`). Only key
    names are shown, never a value (it may be a secret)."""
    where = _TOML_WHERE.search(error)
    if where is None:
        return None
    lines = text.splitlines()
    number = int(where.group(1)) if where.group(1) else len(lines)
    while number > 1 and number <= len(lines) and not lines[number - 1].strip():
        number -= 1  # "end of document": the last line that holds something
    declared = _DECLARED_TWICE.match(error)
    if declared is not None:
        names = re.findall(r"'((?:[^'\\]|\\.)*)'|\"((?:[^\"\\]|\\.)*)\"", declared.group(1))
        table = ".".join(single or double for single, double in names)
        return (
            f"line {number}: the table [{_clipped_key(table)}] is declared twice (or its name"
            " is also a key given above); TOML takes each table once: put its keys together"
            " under one header"
        )
    if not error.startswith("Cannot overwrite a value"):
        return None
    start = min(number, len(lines))
    while start >= 1:
        line = lines[start - 1]
        if (header := _TOML_HEADER.fullmatch(line)) is not None:
            return (
                f"line {start}: [{_clipped_key(_dotted(header.group(2)))}] names a table, but"
                " that name is already given a value above; remove one of the two, or rename"
                " the key you meant"
            )
        if (statement := _TOML_STATEMENT.match(line)) is not None:
            key = _dotted(statement.group(1))
            tables = _tables(lines[:start])
            shown = f"{tables[-1]}.{key}" if tables[-1] else key
            first = next(
                (
                    number
                    for number, line in enumerate(lines[: start - 1], 1)
                    if tables[number - 1] == tables[-1]
                    and (other := _TOML_STATEMENT.match(line)) is not None
                    and _dotted(other.group(1)) == key
                ),
                None,
            )
            also = f" (first at line {first})" if first is not None else ""
            return (
                f"line {start}: {_clipped_key(shown)} is given twice{also}; TOML takes each key"
                " once: keep the line with the value you mean and remove the other"
            )
        start -= 1
    return None


def _dotted(key: str) -> str:
    """A TOML key as written, without the spaces around its dots."""
    return ".".join(part.strip() for part in re.findall(rf"{_TOML_KEY_PART}", key))


def _tables(lines: Sequence[str]) -> list[str]:
    """The table each of `lines` belongs to, as the other messages name it: an entry of an
    array of tables with its index (`telegram.routes[1]`); "" at the top of the file."""
    tables: list[str] = []
    entries: dict[str, int] = {}
    table = ""
    for line in lines:
        header = _TOML_HEADER.fullmatch(line)
        if header is not None:
            table = _dotted(header.group(2))
            if header.group(1) == "[[":
                entries[table] = entries.get(table, -1) + 1
                table = f"{table}[{entries[table]}]"
        tables.append(table)
    return tables


def _clipped_key(key: str) -> str:
    """`key` cut to its head when pasted long, as `_key_path` cuts an unknown key."""
    if len(key) > MAX_KEY_CHARS:
        return f"{key[:MAX_KEY_CHARS]}…({len(key)} characters)"
    return key


# More brackets or braces than this on one line: no key nests that deep.
_DEEP_LINE: Final = 64


def _too_deep(raw: bytes) -> str:
    """Why a file tomllib could not read for its nesting cannot be used, naming the first
    line that opens many arrays or inline tables, when one does."""
    where = ""
    for number, line in enumerate(raw.split(b"\n"), 1):
        if line.count(b"[") + line.count(b"{") > _DEEP_LINE:
            where = f"line {number}: "
            break
    return (
        f"{where}arrays or inline tables nested too deeply to be read (no key takes more than"
        " two levels); fix the value"
    )


_LONG_DIGITS = re.compile(rb"[0-9_]{1000,}")


def _too_long_number(raw: bytes, error: ValueError) -> str:
    """Why a file holding a number of thousands of digits cannot be used, saying where."""
    found = _LONG_DIGITS.search(raw)
    if found is None:
        return f"cannot be read as TOML ({type(error).__name__}); check the file"
    line = raw.count(b"\n", 0, found.start()) + 1
    digits = len(found.group().replace(b"_", b""))
    return (
        f"line {line}: a number of {digits} digits, more than Python reads and far past any"
        " key's range; fix the value"
    )


def _home_hint(path: Path) -> str:
    """`, e.g. <path with its ~ expanded>` where that home folder is known, else ""."""
    try:
        return f", e.g. {path.expanduser()}"
    except RuntimeError:  # `~user` of no known user
        return ""


def load_config(path: Path, *, reload: bool = False, preflight: bool = False) -> ServiceConfig:
    """Read and validate the TOML file at `path`; raise `ConfigError` with every problem.

    With `preflight` (`config check`, `serve --check`), an agent's workdir that cannot be
    one is refused too (`path_problems`); otherwise it is that agent's problem alone.

    With `reload` (SIGHUP), a file that holds no key at all is refused: empty, it is most
    likely caught between an editor's truncation and its write (or emptied by mistake), and
    taken as valid it retired every agent the running service served. At a start such a file
    is the defaults with nothing to serve, which `config check` and the start warn of.
    """
    try:
        raw, regular = _read_config_bytes(path)
    except FileNotFoundError:
        if str(path).startswith("~"):
            # `--config=~/taskcard.toml`, `"~/..."` in quotes, a unit's ExecStart: no shell
            # expanded the ~, so a folder named "~" was looked for in the current one.
            raise ConfigError(
                [
                    f"{path}: no such file: the ~ was not expanded (only a shell does, and not"
                    f" in quotes or after --config=); write the full path{_home_hint(path)}"
                ]
            ) from None
        dangling = dangling_link(path)
        if dangling is not None:
            # "No such file" about a name that is there, in `ls` as in the editor's list,
            # sent the operator looking at the wrong end of the link.
            raise ConfigError(
                [f"{path}: {dangling}; restore what it points to, or fix the link"]
            ) from None
        raise ConfigError(
            [f"{path}: no such file; create it (see config/taskcard.example.toml) or fix the path"]
        ) from None
    except IsADirectoryError:
        raise ConfigError([f"{path}: is a folder; give the path of the TOML file in it"]) from None
    except OSError as exc:
        fix = _CONFIG_PATH_FIXES.get(exc.errno or 0, "check its permissions")
        raise ConfigError([f"{path}: cannot be read ({exc.strerror}); {fix}"]) from None
    if raw.startswith(_UTF8_BOM):
        # TOML allows no byte order mark; tomllib's "Invalid statement" at 1:1 hides why.
        raise ConfigError(
            [
                f"{path}: starts with a byte order mark (BOM), which TOML does not allow;"
                " save the file as UTF-8 without BOM"
            ]
        )
    wide = _wide_encoding(raw)
    if wide is not None:
        raise ConfigError([f"{path}: {wide}"])
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        # Where: one stray byte (a Latin-1 "é" pasted in) is otherwise hunted through the file.
        line = raw.count(b"\n", 0, exc.start) + 1
        column = exc.start - (raw.rfind(b"\n", 0, exc.start) + 1) + 1
        raise ConfigError(
            [
                f"{path}: not UTF-8 text (byte 0x{raw[exc.start]:02x} at line {line}, column"
                f" {column}); save the file as UTF-8"
            ]
        ) from None
    except tomllib.TOMLDecodeError as exc:
        twice = _given_twice(raw.decode("utf-8"), str(exc))
        if twice is not None:
            raise ConfigError([f"{path}: {twice}"]) from None
        raise ConfigError([f"{path}: TOML syntax error: {exc}; fix the file there"]) from None
    except RecursionError:
        # `x = [[[[...` or `{a={a={...` some hundreds deep: tomllib reads nesting by recursion,
        # and the start, `config check` and a reload ended in a RecursionError traceback.
        raise ConfigError([f"{path}: {_too_deep(raw)}"]) from None
    except ValueError as exc:
        # An integer of more digits than Python converts (4300): a traceback too.
        raise ConfigError([f"{path}: {_too_long_number(raw, exc)}"]) from None
    if reload and not data:
        raise ConfigError(
            [
                f"{path}: holds no settings (it is empty, or only comments and blank lines),"
                " which would stop serving every agent; write the configuration back and"
                " reload again (to serve nothing, stop the service)"
            ]
        )
    # An anonymous pipe (`--config <(...)`) or /dev/null has no folder of its own: its
    # folder is /proc/<pid>/fd or /dev, where no state can be kept. Relative paths start at
    # the current folder then, where such a command is run. A named pipe keeps its folder.
    # The folder of the path as given, links not followed: a file linked into place
    # (/etc/taskcard/taskcard.toml -> /srv/releases/7/taskcard.toml) keeps its state and
    # workdirs beside the link, where the operator reads the file, not beside each target.
    base_dir = path.absolute().parent
    if not regular and _pseudo_root(base_dir) is not None:
        base_dir = Path.cwd()
    config = parse_config(data, base_dir=base_dir, source=str(path))
    problems = path_problems(config, workdirs=preflight)
    if problems:
        raise ConfigError([f"{path}: {line}" for line in problems])
    return config


_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def control_problems(value: object, loc: tuple[int | str, ...] = ()) -> list[str]:
    """One problem per text value holding a control character (TOML writes them as escapes
    such as `\u0000`), naming its key. No key takes one, and a NUL reached a system call as a
    traceback (a `state_dir`, a `metrics.listen`) or passed the check in a URL or chat id."""
    if isinstance(value, str):
        found = _CONTROL.search(value)
        if found is None:
            return []
        return [
            f"{_key_path(loc)}: holds a control character (U+{ord(found.group()):04X}), which"
            " no key takes; remove it"
        ]
    items: list[tuple[int | str, object]] = []
    if isinstance(value, dict):
        items = list(value.items())
    elif isinstance(value, list):
        items = list(enumerate(value))
    return [problem for key, item in items for problem in control_problems(item, (*loc, key))]


def parse_config(data: dict[str, Any], *, base_dir: Path, source: str = "config") -> ServiceConfig:
    """Validate already-parsed TOML data; relative paths are resolved against `base_dir`."""
    controls = control_problems(data)
    if controls:
        raise ConfigError([f"{source}: {line}" for line in controls])
    try:
        return ServiceConfig.model_validate(data, context={"base_dir": base_dir})
    except ValidationError as exc:
        raise ConfigError([f"{source}: {line}" for line in _format_errors(exc)]) from None


def _key_path(loc: Sequence[int | str]) -> str:
    text = ""
    for part in loc:
        if isinstance(part, int):
            text += f"[{part}]"
        else:
            if len(part) > MAX_KEY_CHARS:  # an unknown key pasted long: its head names it
                part = f"{part[:MAX_KEY_CHARS]}…({len(part)} characters)"
            text += f".{part}" if text else part
    return text or "(top level)"


def _model_at(loc: Sequence[int | str]) -> type[BaseModel] | None:
    """The model class whose fields live at `loc`, following field annotations."""
    model: type[BaseModel] | None = ServiceConfig
    for part in loc:
        if isinstance(part, int):
            continue
        if model is None or part not in model.model_fields:
            return None
        model = _inner_model(model.model_fields[part].annotation)
    return model


def _inner_model(annotation: object) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    origin = get_origin(annotation)
    if origin in (list, Union, types.UnionType):
        for arg in get_args(annotation):
            found = _inner_model(arg)
            if found is not None:
                return found
    return None


def _format_errors(exc: ValidationError) -> list[str]:
    messages: list[str] = []
    for error in exc.errors(include_url=False):
        loc = tuple(error["loc"])
        kind = error["type"]
        path = _key_path(loc)
        message = str(error["msg"]).removeprefix("Value error, ")
        if kind == "extra_forbidden":
            model = _model_at(loc[:-1])
            allowed = sorted(model.model_fields) if model is not None else []
            env_key = _ENV_KEY_OF.get(str(loc[-1]), f"{loc[-1]}_env")
            if env_key in allowed:
                # A credential written into the file (`token = "..."` beside `token_env`):
                # "did you mean 'token_env'?" read as "rename the key", leaving the secret in.
                messages.append(
                    f"{path}: unknown key: credentials are never read from this file; remove"
                    f" it, export the value in an environment variable and give that"
                    f" variable's NAME in {_key_path((*loc[:-1], env_key))}"
                )
                continue
            misplaced = _misplaced_key(loc)
            if misplaced is not None:
                messages.append(f"{path}: unknown key here; {misplaced}")
                continue
            if _credential_written(str(loc[-1]), error["input"]):
                # `api_token = "123:AA..."`, `TELEGRAM_BOT_TOKEN = "..."`: told only that the
                # key is unknown, the fix read as "rename it", leaving the secret in the file.
                messages.append(
                    f"{path}: unknown key, and its value looks like a credential, which is never"
                    f" read from this file; remove it, export the value in an environment"
                    f" variable and {_env_keys_hint(loc[:-1], allowed)}"
                )
                continue
            hint = ""
            close = difflib.get_close_matches(str(loc[-1]), allowed, n=1)
            if (other := _other_channel_key(loc)) is not None:
                hint = f" ({other})"
            elif close:
                hint = f" (did you mean {close[0]!r}?)"
            messages.append(
                f"{path}: unknown key{hint}; allowed keys here: {', '.join(allowed) or 'none'}"
            )
        elif kind == "missing":
            messages.append(f"{path}: required key is missing; add it")
        elif not loc:
            messages.extend(message.splitlines())
        elif kind == "literal_error":
            value = error["input"]
            got = repr(value) if isinstance(value, str | int | float) else _toml_kind(value)
            choices = re.findall(r"'([^']*)'", str((error.get("ctx") or {}).get("expected", "")))
            messages.append(f"{path}: {message} (got {got}){_case_meant(value, choices)}")
        elif kind.endswith("_type") or kind.endswith("_parsing"):
            messages.append(_type_problem(path, loc, kind, message, error["input"]))
        elif (fix := _bound_fix(kind, error.get("ctx") or {})) is not None:
            # Only a number is quoted back: a string or list could hold a pasted secret.
            value = error["input"]
            got = f" (got {value!r})" if isinstance(value, int | float) else ""
            messages.append(f"{path}: {message}{got}; {fix}")
        else:
            messages.append(f"{path}: {message}")
        if kind != "missing" and _unset_meant(loc, error["input"]):
            messages[-1] += f"; TOML has no null: to leave {path} unset, remove its line"
    return messages


# What people write for "no value" in a key that takes none when left out.
_NULL_WORDS: Final = frozenset({"", "none", "null", "nil", "~", "unset", "off", "disabled"})


def _unset_meant(loc: Sequence[int | str], value: object) -> bool:
    """Whether `value` is a null-like stand-in (`""`, `"none"`, `"null"`, a `0` for an
    optional number) given to a key that is unset when left out (`metrics.listen`,
    `cluster.redis_url`, a route's `thread_id`). Refused for its form alone, the fix named
    a value to write (`"127.0.0.1:9464"`, a thread of at least 1) when none was meant:
    TOML has no null, and leaving the key out is how it is written."""
    if not loc or not isinstance(loc[-1], str):
        return False
    model = _model_at(loc[:-1])
    field = model.model_fields.get(loc[-1]) if model is not None else None
    if field is None or field.is_required() or field.default is not None:
        return False
    if isinstance(value, str):
        return value.strip().casefold() in _NULL_WORDS
    return value == 0 and not isinstance(value, bool)


# An environment variable's name as people write them (`TELEGRAM_BOT_TOKEN`): a value of
# this shape under a secret-sounding key names a variable, it is no secret itself.
_ENV_STYLE_NAME = re.compile(r"[A-Z_][A-Z0-9_]*")


def _credential_written(key: str, value: object) -> bool:
    """Whether an unknown key holds a credential: a value of a token's shape, or a text under
    a secret-sounding name (`password`, `..._token`, `app_key`), as the redaction of cards
    finds them."""
    if not isinstance(value, str) or _ENV_STYLE_NAME.fullmatch(value):
        return False
    assignment = f"{key} = {json.dumps(value)}"
    return redact_tokens(value) != value or redact_every_shape(assignment) != assignment


def _env_keys_hint(table: Sequence[int | str], allowed: Sequence[str]) -> str:
    """Where the table at `table` takes the NAME of a secret's variable (its `*_env` keys)."""
    env_keys = [_key_path((*table, key)) for key in allowed if key.endswith("_env")]
    if len(env_keys) == 1:
        return f"give that variable's NAME in {env_keys[0]}"
    if env_keys:
        return f"give that variable's NAME in the key for it ({', '.join(env_keys)})"
    return (
        "give that variable's NAME in the section that uses it (telegram.token_env,"
        " feishu.app_id_env, feishu.app_secret_env, cluster.redis_url_env)"
    )


_CHANNELS: Final = {"telegram": "Telegram", "feishu": "Feishu"}


def _other_channel_key(loc: Sequence[int | str]) -> str | None:
    """Why a key of one channel's table is unknown in the other's: a `thread_id` copied
    into a Feishu route was asked "did you mean 'chat_id'?", which invites the wrong fix."""
    if not loc or loc[0] not in _CHANNELS:
        return None
    other = next(name for name in _CHANNELS if name != loc[0])
    model = _model_at((other, *loc[1:-1]))
    if model is None or str(loc[-1]) not in model.model_fields:
        return None
    return f"a {_CHANNELS[other]} key, which {_CHANNELS[str(loc[0])]} does not take: remove it"


def _misplaced_key(loc: Sequence[int | str]) -> str | None:
    """Where a key unknown at `loc` belongs, when an enclosing table takes it.

    TOML puts every key written after a `[table]` or `[[table]]` header into that table, so
    `log_level = "DEBUG"` appended at the end of a file lands in the last `[[agents]]` entry,
    and an `origin_chats` after `[[telegram.routes]]` in that route. "Unknown key; allowed
    keys here: id, workdir" did not say why a key the docs list was refused.
    """
    key = str(loc[-1])
    for depth in range(len(loc) - 2, -1, -1):
        table = loc[:depth]
        if table and isinstance(table[-1], int):
            continue  # an entry of an array of tables: its own keys were looked at already
        model = _model_at(table)
        if model is None or key not in model.model_fields:
            continue
        header = ".".join(str(part) for part in loc[: depth + 1] if isinstance(part, str))
        inner = f"[[{header}]]" if isinstance(loc[depth + 1], int) else f"[{header}]"
        if not table:
            return (
                f"{key!r} is a top-level key, but TOML reads every key after a table header as"
                f" part of that table (here {inner}); move the line above the first [table]"
                " or [[table]] header of the file"
            )
        outer = ".".join(str(part) for part in table if isinstance(part, str))
        return (
            f"{key!r} belongs to [{outer}], but TOML reads every key after a table header as"
            f" part of that table (here {inner}); move the line up under [{outer}], before"
            f" its first {inner} header"
        )
    return None


# Names a credential is likely written under, beside the `<name>_env` key that names its
# variable (`app_secret` -> `app_secret_env` needs no entry).
_ENV_KEY_OF: Final = {"bot_token": "token_env", "secret": "app_secret_env"}

# pydantic's words for a wrong type that name our classes; said in TOML's terms instead.
_EXPECTED_TABLE = re.compile(r"a valid dictionary(?: or instance of \w+)?")
_EXPECTED_PATH = "Input is not a valid path for <class 'pathlib.Path'>"


def _case_meant(value: object, choices: Sequence[str]) -> str:
    """The end of the refusal of an enumerated word: the one meant when `value` differs from
    it by case alone (the values are case-sensitive, as the time zones are: `Webhook` and
    `BOARD` were answered with the list only), else the advice to use one of the list."""
    if isinstance(value, str):
        meant = [choice for choice in choices if choice.casefold() == value.casefold()]
        if meant:
            return f"; did you mean {meant[0]!r}? the values are case-sensitive"
    return "; use one of these"


def _toml_kind(value: object) -> str:
    """What a TOML value is, in the file's terms, without quoting what it holds."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return "a string"
    if isinstance(value, dict):
        return "a table"
    if isinstance(value, list):
        if value and all(isinstance(item, dict) for item in value):
            return "an array of tables"
        return "an array"
    return "a date or time"


def _type_problem(
    path: str, loc: Sequence[int | str], kind: str, message: str, value: object
) -> str:
    """A value of the wrong type: what the key takes, what the file gives and how to write it.

    Only a number or boolean is quoted back: a string, table or array may hold a secret pasted
    in the wrong place (`[[feishu]]` with an `app_secret` in it), and this line reaches the
    terminal and the log. A table written as an array of tables (or the other way round) is
    named as such, since pydantic's words ("a valid dictionary or instance of FeishuConfig")
    name a class of ours, not the TOML form to write.
    """
    message = _EXPECTED_TABLE.sub("a table", message)
    message = message.replace(_EXPECTED_PATH, "Input should be a path")
    message = message.replace("a valid list", "an array")
    header = ".".join(str(part) for part in loc if isinstance(part, str))
    got = _toml_kind(value)
    if kind in ("model_type", "dict_type"):
        if isinstance(loc[-1], int):
            fix = f"write each entry as a [[{header}]] table"
        elif got == "an array of tables":
            fix = f"write it as one [{header}] table, not [[{header}]]"
        else:
            fix = f"write it as a [{header}] table"
    elif kind == "list_type":
        if got == "a table" and _model_at((*loc, 0)) is not None:
            fix = f"write each entry as [[{header}]], not [{header}]"
        else:
            fix = "write an array, e.g. [...]"
    elif kind == "path_type":
        fix = "write the path in double quotes"
    elif kind == "string_type":
        fix = "write it in double quotes"
    elif kind == "bool_type":
        fix = "write true or false, without quotes"
    elif got == "a string" and kind.startswith(("int_", "float_")):
        fix = "write the number without quotes"
    elif kind.startswith("int_") and isinstance(value, float) and value.is_integer():
        # TOML keeps integers and floats apart (`2.0` is a float there): the key takes one
        # written as an integer, without a decimal point or exponent. Not offered when out
        # of the key's range: `1e300` was answered with its 301 digits to write instead.
        outside = _out_of_range(loc, value)
        if outside is not None:
            fix = f"write a whole number {outside}, without a decimal point or exponent"
        else:
            fix = f"write it as an integer, without a decimal point or exponent: {int(value)}"
    elif kind.startswith("int_"):
        fix = "write a whole number"
    elif kind.startswith("float_"):
        fix = "write a number"
    else:
        fix = "fix the value's type"
    return f"{path}: {message} (got {got}); {fix}"


# Past this, a float no longer holds every whole number exactly: its digits as an integer
# are not what was written (`1e300` is 1000000000000000052504760255204420248...).
_EXACT_FLOAT_INTEGERS: Final = 2**53


def _out_of_range(loc: Sequence[int | str], value: float) -> str | None:
    """The range of the integer key at `loc` in words ("of at most 10000") when `value` lies
    outside it, or "of fewer digits" for a key of no known bound and a value too large to
    be written back exactly; None when `value` written as an integer would be taken."""
    model = _model_at(loc[:-1]) if loc and isinstance(loc[-1], str) else None
    field = model.model_fields.get(str(loc[-1])) if model is not None else None
    for rule in field.metadata if field is not None else ():
        low = getattr(rule, "ge", None)
        high = getattr(rule, "le", None)
        if isinstance(low, int) and value < low:
            return f"of at least {low}"
        if isinstance(high, int) and value > high:
            return f"of at most {high}"
    if abs(value) >= _EXACT_FLOAT_INTEGERS:
        return "of fewer digits"
    return None


def _bound_fix(kind: str, ctx: Mapping[str, Any]) -> str | None:
    """What to write instead of a value out of its bounds (pydantic names only the bound)."""

    def number(key: str) -> str:
        value = ctx.get(key)
        return f"{value:g}" if isinstance(value, float) else str(value)

    def count(key: str, one: str, many: str) -> str:
        value = ctx.get(key)
        return counted(value, one, many) if isinstance(value, int) else f"{value} {many}"

    fixes: dict[str, Callable[[], str]] = {
        "greater_than_equal": lambda: f"use a number of at least {number('ge')}",
        "less_than_equal": lambda: f"use a number of at most {number('le')}",
        "greater_than": lambda: f"use a number above {number('gt')}",
        "less_than": lambda: f"use a number below {number('lt')}",
        "finite_number": lambda: "write a finite number (not nan or inf)",
        "too_short": lambda: f"give at least {count('min_length', 'entry', 'entries')}",
        "too_long": lambda: f"give at most {count('max_length', 'entry', 'entries')}",
        "string_too_short": lambda: (
            f"write at least {count('min_length', 'character', 'characters')}"
        ),
        "string_too_long": lambda: (
            f"write at most {count('max_length', 'character', 'characters')}"
        ),
    }
    fix = fixes.get(kind)
    return None if fix is None else fix()


def config_json_schema() -> dict[str, Any]:
    """The JSON Schema of the config file, as committed in `config/taskcard.schema.json`."""
    schema = ServiceConfig.model_json_schema()
    schema["title"] = "taskcard service configuration"
    return schema


def schema_text() -> str:
    return json.dumps(config_json_schema(), indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m taskcard.bridge.config")
    parser.add_argument("--write-schema", action="store_true", help="regenerate the schema file")
    parser.add_argument("--check", type=Path, metavar="FILE", help="validate a config file")
    args = parser.parse_args(argv)
    if args.write_schema:
        SCHEMA_PATH.write_text(schema_text(), encoding="utf-8")
        print(f"wrote {SCHEMA_PATH}")
    if args.check is not None:
        try:
            load_config(args.check, preflight=True)
        except ConfigError as exc:
            for line in exc.messages:
                print(line, file=sys.stderr)
            return 2
        print(f"{args.check}: valid")
    if not args.write_schema and args.check is None:
        parser.print_help()
    return 0


if __name__ == "__main__":
    sys.exit(main())
