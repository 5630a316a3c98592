"""`taskcard init claude-code|codex`: wire a project to the hooks and the MCP server.

Merging, not writing: the user's other settings, hooks and servers stay as they are, running
it twice changes nothing, and a file we cannot parse (or whose shape is not what the host
documents) is refused with a message naming the file and the key, never overwritten.
Our entries are recognised by their command (`... hook claude-code`, the `taskcard` server
name), so a re-run updates them in place instead of adding copies.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

import tomlkit
import tomlkit.exceptions

from taskcard.producers.task_card.contract import atomic_write, read_bytes, read_regular

SERVER_NAME: Final = "taskcard"
CLAUDE_HOOK_MARK: Final = " hook claude-code"
# Events the adapter maps (`claude_code.py`); tool events take a matcher, the rest do not.
CLAUDE_EVENTS: Final = (
    "SessionStart",
    "UserPromptSubmit",
    "PreToolUse",
    "PostToolUse",
    "PostToolUseFailure",
    "Notification",
    "Stop",
    "PreCompact",
    "SessionEnd",
)
MATCHER_EVENTS: Final = frozenset({"PreToolUse", "PostToolUse", "PostToolUseFailure"})
HOOK_TIMEOUT_S: Final = 10
# An agent host's settings file is small; a bigger one (or a pipe) is refused, never slurped.
_MAX_CONFIG_BYTES: Final = 10_000_000


class InitError(ValueError):
    """An existing file cannot be merged into; the message names the file, the key, the fix."""


def taskcard_command() -> str:
    """The `taskcard` executable beside this interpreter, else the one on PATH."""
    beside = Path(sys.executable).parent / "taskcard"
    return str(beside) if beside.exists() else "taskcard"


def _load_json(path: Path) -> dict[str, Any]:
    if not path.exists():
        return {}
    try:
        data = json.loads(read_regular(path, _MAX_CONFIG_BYTES))
    except (OSError, ValueError, RecursionError) as exc:
        raise InitError(
            f"{path}: not valid JSON ({exc.__class__.__name__}); fix or move it, then run "
            "init again (it was left untouched)"
        ) from None
    if not isinstance(data, dict):
        raise InitError(f"{path}: the top level must be a JSON object; fix it, then run again")
    return data


def _object_at(data: dict[str, Any], key: str, path: Path) -> dict[str, Any]:
    value = data.setdefault(key, {})
    if not isinstance(value, dict):
        raise InitError(f"{path}: {key} must be an object; fix it, then run init again")
    return value


def merge_claude_settings(settings: dict[str, Any], command: str, path: Path) -> dict[str, Any]:
    """`settings` with one taskcard hook per mapped event (pure apart from raising)."""
    hooks = _object_at(settings, "hooks", path)
    for event in CLAUDE_EVENTS:
        groups = hooks.setdefault(event, [])
        if not isinstance(groups, list):
            raise InitError(f"{path}: hooks.{event} must be a list; fix it, then run again")
        ours = {"type": "command", "command": command, "timeout": HOOK_TIMEOUT_S}
        found = False
        for group in groups:
            entries = group.get("hooks") if isinstance(group, dict) else None
            if not isinstance(entries, list):
                continue
            for index, entry in enumerate(entries):
                text = entry.get("command") if isinstance(entry, dict) else None
                if isinstance(text, str) and CLAUDE_HOOK_MARK in text:
                    entries[index] = ours
                    found = True
        if not found:
            group_new: dict[str, Any] = {"hooks": [ours]}
            if event in MATCHER_EVENTS:
                group_new = {"matcher": "*", **group_new}
            groups.append(group_new)
    return settings


def _write_json(path: Path, data: Mapping[str, Any]) -> bool:
    text = (json.dumps(data, indent=2, ensure_ascii=False) + "\n").encode()
    if path.exists() and read_bytes(path, len(text) + 1) == text:
        return False
    atomic_write(path, text)
    return True


def init_claude_code(workdir: Path, command: str | None = None) -> list[str]:
    """Merge the hooks and the MCP server into the project; the lines to report."""
    exe = command or taskcard_command()
    settings_path = workdir / ".claude" / "settings.json"
    mcp_path = workdir / ".mcp.json"
    settings = _load_json(settings_path)
    servers_doc = _load_json(mcp_path)
    # $CLAUDE_PROJECT_DIR: the events belong to the project, even after Claude cd's elsewhere.
    hook_command = f'{shlex.quote(exe)} hook claude-code --workdir "$CLAUDE_PROJECT_DIR"'
    merge_claude_settings(settings, hook_command, settings_path)
    servers = _object_at(servers_doc, "mcpServers", mcp_path)
    servers[SERVER_NAME] = {
        "command": exe,
        "args": ["mcp", "--workdir", str(workdir.resolve())],
    }
    report = []
    for path, data in ((settings_path, settings), (mcp_path, servers_doc)):
        changed = _write_json(path, data)
        report.append(f"{path}: {'updated' if changed else 'already set up'}")
    return report


def codex_config_path(environ: Mapping[str, str]) -> Path:
    home = environ.get("CODEX_HOME")
    return Path(home) / "config.toml" if home else Path.home() / ".codex" / "config.toml"


def init_codex(workdir: Path, config: Path, command: str | None = None) -> list[str]:
    """Merge `notify` and `[mcp_servers.taskcard]` into Codex's config.toml."""
    exe = command or taskcard_command()
    try:
        text = read_regular(config, _MAX_CONFIG_BYTES).decode("utf-8") if config.exists() else ""
        document = tomlkit.parse(text)
    except (OSError, UnicodeDecodeError, tomlkit.exceptions.TOMLKitError) as exc:
        raise InitError(
            f"{config}: not valid TOML ({exc}); fix it, then run init again (left untouched)"
        ) from None
    notify = [exe, "hook", "codex"]
    current = document.get("notify")
    if current is not None:
        values = list(current) if isinstance(current, list) else None
        if values is None or not all(isinstance(v, str) for v in values):
            raise InitError(f"{config}: notify must be a list of strings; fix it, then run again")
        # An empty list runs nothing: there is no program of the user's to keep.
        if values and values != notify and values[1:3] != ["hook", "codex"]:
            raise InitError(
                f"{config}: notify already runs {values[0]!r}; Codex runs one notify program, "
                "so remove it (or call taskcard hook codex from it), then run init again"
            )
    document["notify"] = notify
    servers = document.get("mcp_servers")
    if servers is None:
        servers = tomlkit.table(is_super_table=True)
        document["mcp_servers"] = servers
    elif not isinstance(servers, dict):
        raise InitError(f"{config}: mcp_servers must be a table; fix it, then run init again")
    server = tomlkit.table()
    server["command"] = exe
    server["args"] = ["mcp", "--workdir", str(workdir.resolve())]
    servers[SERVER_NAME] = server
    new_text = tomlkit.dumps(document)
    if new_text == text:
        return [f"{config}: already set up"]
    config.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(config, new_text.encode("utf-8"))
    return [f"{config}: updated"]


def environment() -> Mapping[str, str]:
    return os.environ
