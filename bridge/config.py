"""The service configuration: one TOML file validated once, at the edge, into frozen models.

`load_config` is the only reader. Relative paths (`state_dir`, each agent's `workdir`) are
resolved against the folder of the config file, so a service started from any directory sees
the same agents. Every problem is reported as a `ConfigError` whose messages each name the key
path (`telegram.routes[0].chat_id`) and say how to fix it; nothing is half-loaded.

Run `python -m bridge.config --write-schema` to regenerate `config/taskcard.schema.json` after
changing a model; a test fails while the two disagree.
"""

from __future__ import annotations

import argparse
import difflib
import json
import re
import sys
import tomllib
import types
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from channels.base import TIMEZONE_HELP, TimeZoneName
from channels.feishu.config import FeishuConfig
from channels.telegram.config import TelegramConfig

AGENT_ID_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
ALL_AGENTS = "*"
SCHEMA_PATH = Path(__file__).resolve().parent.parent / "config" / "taskcard.schema.json"
EXAMPLE_PATH = Path(__file__).resolve().parent.parent / "config" / "taskcard.example.toml"


class ConfigError(Exception):
    """The config file cannot be used. `messages` holds one line per problem."""

    def __init__(self, messages: Sequence[str]) -> None:
        self.messages = list(messages)
        super().__init__("\n".join(self.messages))


def _resolve_against_config(value: Path, info: ValidationInfo) -> Path:
    """Relative paths are relative to the config file, never to the current directory."""
    value = value.expanduser()
    base = (info.context or {}).get("base_dir")
    if isinstance(base, Path) and not value.is_absolute():
        return base / value
    return value


class AgentConfig(BaseModel):
    """One agent whose working directory holds the card files."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str = Field(description="Agent id shown in cards and logs; 1-64 of [A-Za-z0-9_.-].")
    workdir: Path = Field(description="The agent's working directory (relative: to this file).")

    @field_validator("id")
    @classmethod
    def _check_id(cls, value: str) -> str:
        if not AGENT_ID_PATTERN.fullmatch(value):
            raise ValueError(
                f"{value!r} is not a valid agent id; use 1-64 letters, digits, '_', '.' or '-',"
                " starting with a letter or digit"
            )
        return value

    @field_validator("workdir")
    @classmethod
    def _resolve_workdir(cls, value: Path, info: ValidationInfo) -> Path:
        return _resolve_against_config(value, info)


class ConsoleConfig(BaseModel):
    """The terminal projection: every agent's composed card, live."""

    model_config = ConfigDict(extra="forbid", frozen=True)

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
        raise ValueError(f'got {value!r}; use "auto", true or false')


class WatchConfig(BaseModel):
    """How quickly file changes are noticed."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    debounce_ms: int = Field(
        default=50, ge=1, le=10_000, description="Group file events arriving within this window."
    )
    rescan_interval_s: float = Field(
        default=30.0, gt=0, description="Safety-net rescan of every agent, in seconds."
    )


class DisplayConfig(BaseModel):
    """What the automatic slot shows by default."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    activity_rows: int = Field(
        default=3, ge=1, le=10, description="Recent activity rows (routes may override, 1-10)."
    )
    no_output_after_s: float = Field(
        default=300.0,
        gt=0,
        description='An open turn silent this long is shown as "no output".',
    )


class ServiceConfig(BaseModel):
    """The whole configuration of `taskcard serve`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    state_dir: Path = Field(
        default=Path(".taskcard"),
        # The default goes through the validator too: relative to the config file, not the cwd.
        validate_default=True,
        description="Service state (SQLite); relative paths are relative to this file.",
    )
    agents: list[AgentConfig] = Field(default_factory=list, description="The watched agents.")
    telegram: TelegramConfig | None = Field(default=None, description="The Telegram channel.")
    feishu: FeishuConfig | None = Field(default=None, description="The Feishu channel.")
    console: ConsoleConfig = Field(default_factory=ConsoleConfig)
    watch: WatchConfig = Field(default_factory=WatchConfig)
    display: DisplayConfig = Field(default_factory=DisplayConfig)
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = Field(
        default="INFO", description="Log verbosity."
    )

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
        return self

    @property
    def console_enabled(self) -> bool:
        """Whether the console channel runs: explicitly, or by default without chat channels."""
        if self.console.enabled == "auto":
            return self.telegram is None and self.feishu is None
        return bool(self.console.enabled)

    def agent_ids(self) -> list[str]:
        return [agent.id for agent in self.agents]


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
    known = sorted(seen)
    route_groups: list[tuple[str, Sequence[tuple[object, Sequence[str]]]]] = []
    if config.telegram is not None:
        route_groups.append(
            (
                "telegram",
                [((r.chat_id, r.thread_id), r.agents) for r in config.telegram.routes],
            )
        )
    if config.feishu is not None:
        route_groups.append(
            ("feishu", [((r.chat_id, None), r.agents) for r in config.feishu.routes])
        )
    for section, routes in route_groups:
        chats: dict[object, int] = {}
        for index, (chat, agents) in enumerate(routes):
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
                if name != ALL_AGENTS and name not in seen:
                    choices = ", ".join(known) if known else "none configured"
                    problems.append(
                        f"{where}.agents[{position}]: unknown agent {name!r}; use the id of an"
                        f' [[agents]] entry ({choices}) or "*"'
                    )
    return problems


def load_config(path: Path) -> ServiceConfig:
    """Read and validate the TOML file at `path`; raise `ConfigError` with every problem."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise ConfigError(
            [f"{path}: no such file; create it (see config/taskcard.example.toml) or fix --config"]
        ) from None
    except OSError as exc:
        raise ConfigError(
            [f"{path}: cannot be read ({exc.strerror}); check its permissions"]
        ) from None
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise ConfigError([f"{path}: not UTF-8 text; save the file as UTF-8"]) from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError([f"{path}: TOML syntax error: {exc}; fix the file there"]) from None
    return parse_config(data, base_dir=path.resolve().parent, source=str(path))


def parse_config(data: dict[str, Any], *, base_dir: Path, source: str = "config") -> ServiceConfig:
    """Validate already-parsed TOML data; relative paths are resolved against `base_dir`."""
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
            hint = ""
            close = difflib.get_close_matches(str(loc[-1]), allowed, n=1)
            if close:
                hint = f" (did you mean {close[0]!r}?)"
            messages.append(
                f"{path}: unknown key{hint}; allowed keys here: {', '.join(allowed) or 'none'}"
            )
        elif kind == "missing":
            messages.append(f"{path}: required key is missing; add it")
        elif not loc:
            messages.extend(message.splitlines())
        elif kind.endswith("_type") or kind.endswith("_parsing") or kind == "literal_error":
            messages.append(f"{path}: {message} (got {error['input']!r}); fix the value's type")
        else:
            messages.append(f"{path}: {message}")
    return messages


def config_json_schema() -> dict[str, Any]:
    """The JSON Schema of the config file, as committed in `config/taskcard.schema.json`."""
    schema = ServiceConfig.model_json_schema()
    schema["title"] = "taskcard service configuration"
    return schema


def schema_text() -> str:
    return json.dumps(config_json_schema(), indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bridge.config")
    parser.add_argument("--write-schema", action="store_true", help="regenerate the schema file")
    parser.add_argument("--check", type=Path, metavar="FILE", help="validate a config file")
    args = parser.parse_args(argv)
    if args.write_schema:
        SCHEMA_PATH.write_text(schema_text(), encoding="utf-8")
        print(f"wrote {SCHEMA_PATH}")
    if args.check is not None:
        try:
            load_config(args.check)
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
