"""`taskcard init claude-code|codex`: wire a project to the hooks and the MCP server.

Merging, not writing: the user's other settings, hooks and servers stay as they are, running
it twice changes nothing, and a file we cannot parse (or whose shape is not what the host
documents) is refused with a message naming the file and the key, never overwritten.
Our entries are recognised by their command (`... hook claude-code`, the `taskcard` server
name), so a re-run updates them in place instead of adding copies.

Claude Code refuses a whole settings file that names a hook event it does not know (older
versions: "Invalid key in record"; every hook and permission rule in the file is then off),
so an event it added late (`LATER_EVENTS`) is registered only when the Claude Code here is
known to have it: the version `claude --version` prints, or `--claude-version`, or the file
already holding that event for other hooks. Otherwise our entry for it is left out (and taken
out again, when an earlier run wrote it), and the report says so.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import stat
import subprocess
import sys
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

import tomlkit
import tomlkit.exceptions
import tomlkit.items

from taskcard.producers.task_card.contract import (
    LOOP_OF_LINKS,
    NotRegularFile,
    atomic_write,
    broken_link,
    dangling_link,
    json_error_place,
    link_loop,
    read_bytes,
    read_regular,
)
from taskcard.producers.task_card.workdir_arg import shown_path

# A file's writing plan: where the bytes land, with which permissions (see `_plan`).
Plan = tuple[Path, int]

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
MATCHER_EVENTS: Final = frozenset(
    {"PreToolUse", "PermissionRequest", "PostToolUse", "PostToolUseFailure"}
)
# Events Claude Code added later, with the first version that accepts them in settings.
# `PermissionRequest` fires as a permission dialog opens: the wait on the person starts
# there (a `Notification` of the same prompt then changes nothing). The hook prints nothing
# at it, which leaves the answer to the person. No event says the tool was granted: the
# wait ends with the next event that shows the session moved on (the tool's `PostToolUse`,
# a denial's next prompt or stop).
LATER_EVENTS: Final = {"PermissionRequest": (2, 0, 45), "StopFailure": (2, 1, 78)}
# Codex's lifecycle hooks (hooks.json beside its config.toml) that the adapter maps, of those
# Codex documents (never `PostToolUseFailure` or `Notification`: Codex has no such hook). Not
# `SessionEnd`: its only reason is `other`, so a `/clear` or `/new` (which
# start the session again at once) would read as the agent exiting. The tool events get no
# matcher, which in Codex matches every tool. A Codex that predates an event skips its key
# (it reads the events it knows, and refuses no other).
CODEX_HOOK_MARK: Final = " hook codex"
CODEX_EVENTS: Final = (
    "SessionStart",
    "UserPromptSubmit",
    "PreToolUse",
    "PermissionRequest",
    "PostToolUse",
    "PreCompact",
    "Stop",
    "StopFailure",
    "Interrupt",
)
# Codex gives this hook at most 3 seconds, and warns at each start about a longer timeout.
CODEX_SHORT_TIMEOUTS: Final = {"Interrupt": 3}
CODEX_HOOKS_FILE: Final = "hooks.json"
HOOK_TIMEOUT_S: Final = 10
VERSION_TIMEOUT_S: Final = 15
_VERSION = re.compile(r"(\d+)\.(\d+)\.(\d+)")
# An agent host's settings file is small; a bigger one (or a pipe) is refused, never slurped.
_MAX_CONFIG_BYTES: Final = 10_000_000


class InitError(ValueError):
    """An existing file cannot be merged into; the message names the file, the key, the fix."""


def taskcard_command() -> str:
    """The `taskcard` executable beside this interpreter, else the one on PATH."""
    beside = Path(sys.executable).parent / "taskcard"
    return str(beside) if beside.exists() else "taskcard"


def _read_config(path: Path) -> bytes:
    """The bytes of an existing configuration file, or an `InitError` saying why they cannot
    be read: a folder, a pipe or an unreadable file was "not valid JSON (NotRegularFile)",
    and a file over the size read was cut and then "not valid JSON" too."""
    try:
        raw = read_regular(path, _MAX_CONFIG_BYTES + 1)
    except NotRegularFile as exc:  # its text names what it is and the fix
        raise InitError(
            f"{shown_path(path)}: {exc.strerror}, then run init again (it was left untouched)"
        ) from None
    except OSError as exc:
        raise InitError(
            f"{shown_path(path)}:"
            f" cannot be read ({exc.strerror or exc.__class__.__name__}); fix or move "
            "it, then run init again (it was left untouched)"
        ) from None
    if len(raw) > _MAX_CONFIG_BYTES:
        raise InitError(
            f"{shown_path(path)}:"
            f" over {_MAX_CONFIG_BYTES} bytes, more than a configuration file holds; "
            "fix or move it, then run init again (it was left untouched)"
        )
    return raw


def _load_json(path: Path) -> dict[str, Any]:
    if not path.exists():
        return {}
    raw = _read_config(path)
    try:
        data = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise InitError(
            f"{shown_path(path)}:"
            f" not valid JSON ({json_error_place(exc)}); fix or move it, then run init"
            " again (it was left untouched)"
        ) from None
    except (ValueError, RecursionError) as exc:
        raise InitError(
            f"{shown_path(path)}:"
            f" not valid JSON ({exc.__class__.__name__}); fix or move it, then run "
            "init again (it was left untouched)"
        ) from None
    if not isinstance(data, dict):
        raise InitError(
            f"{shown_path(path)}: the top level must be a JSON object; fix it, then run again"
        )
    return data


def _object_at(data: dict[str, Any], key: str, path: Path) -> dict[str, Any]:
    value = data.setdefault(key, {})
    if not isinstance(value, dict):
        raise InitError(f"{shown_path(path)}: {key} must be an object; fix it, then run init again")
    return value


Version = tuple[int, int, int]


def parse_version(text: str) -> Version | None:
    """The first `X.Y.Z` in `text` (`claude --version` prints `2.1.90 (Claude Code)`)."""
    match = _VERSION.search(text)
    if match is None:
        return None
    major, minor, patch = (int(part) for part in match.groups())
    return major, minor, patch


def claude_version() -> Version | None:
    """The version of the `claude` on PATH, None when there is none or it does not say."""
    exe = shutil.which("claude")
    if exe is None:
        return None
    try:
        done = subprocess.run(
            [exe, "--version"],
            capture_output=True,
            stdin=subprocess.DEVNULL,
            timeout=VERSION_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    if done.returncode != 0:
        return None
    return parse_version(done.stdout.decode("utf-8", errors="replace"))


def _is_ours(entry: object, mark: str = CLAUDE_HOOK_MARK) -> bool:
    text = entry.get("command") if isinstance(entry, dict) else None
    return isinstance(text, str) and mark in text


def _groups(hooks: dict[str, Any], event: str, path: Path) -> list[Any]:
    """The matcher groups under `event`, each in the shape the host documents: an object
    with a list of hooks, and a string matcher if any. The host refuses a file with a group
    of another shape (all of its hooks, ours too, are then off), so init must not report it
    set up."""
    groups = hooks.setdefault(event, [])
    if not isinstance(groups, list):
        raise InitError(f"{shown_path(path)}: hooks.{event} must be a list; fix it, then run again")
    for index, group in enumerate(groups):
        where = f"hooks.{event}[{index}]"
        if not isinstance(group, dict):
            problem = f"{where} must be an object with a hooks list"
        elif not isinstance(group.get("hooks"), list):
            problem = f"{where}.hooks must be a list"
        elif not isinstance(group.get("matcher", ""), str | None):
            problem = f"{where}.matcher must be a string"
        else:
            continue
        raise InitError(
            f"{shown_path(path)}: {problem}; fix it, then run init again (it was left untouched)"
        )
    return groups


def _drop_ours(hooks: dict[str, Any], event: str, path: Path, mark: str) -> None:
    """Take our entry out of `hooks[event]`, and the key when nothing else is left in it."""
    if event not in hooks:
        return
    groups = _groups(hooks, event, path)
    for group in groups:
        entries = group.get("hooks") if isinstance(group, dict) else None
        if isinstance(entries, list):
            entries[:] = [entry for entry in entries if not _is_ours(entry, mark)]
    groups[:] = [
        group for group in groups if not (isinstance(group, dict) and group.get("hooks") == [])
    ]
    if not groups:
        del hooks[event]


def merge_claude_settings(
    settings: dict[str, Any],
    command: str,
    path: Path,
    version: Version | None = None,
) -> list[str]:
    """Merge one taskcard hook per mapped event into `settings` (in place); the later events
    left out because this Claude Code (`version`, None when unknown) may not know them.

    Every event's groups are checked, not only those of the mapped events: Claude Code
    refuses the whole file for one group of another shape under any event (a user's
    `SubagentStop`), and our hooks would be off with it."""
    hooks = _object_at(settings, "hooks", path)
    for event in [name for name in hooks if name not in CLAUDE_EVENTS and name not in LATER_EVENTS]:
        _groups(hooks, event, path)
    return merge_hooks(
        settings,
        command,
        path,
        mark=CLAUDE_HOOK_MARK,
        events=CLAUDE_EVENTS,
        later=LATER_EVENTS,
        version=version,
        matcher="*",
    )


def merge_hooks(
    settings: dict[str, Any],
    command: str,
    path: Path,
    *,
    mark: str,
    events: tuple[str, ...],
    later: Mapping[str, Version],
    version: Version | None,
    matcher: str | None,
    timeouts: Mapping[str, int] | None = None,
) -> list[str]:
    """Merge one hook running `command` per event into `settings["hooks"]` (Claude Code's
    settings and Codex's hooks.json share this shape); our entries are those whose command
    holds `mark`. The tool events get `matcher` (None: no matcher, which matches every
    tool); an event in `timeouts` gets that timeout instead of `HOOK_TIMEOUT_S`. Returns
    the `later` events left out because `version` may not know them."""
    hooks = _object_at(settings, "hooks", path)
    # Hooks of the user's under a later event: the host reading this file knows it, so it is
    # at least that event's version, and knows every event added before it too.
    for event, added in later.items():
        if _has_others(hooks.get(event), mark) and (version is None or version < added):
            version = added
    skipped: list[str] = []
    for event in (*events, *later):
        since = later.get(event)
        known = since is None or (version is not None and version >= since)
        if not known:
            _drop_ours(hooks, event, path, mark)
            skipped.append(event)
            continue
        groups = _groups(hooks, event, path)
        timeout = (timeouts or {}).get(event, HOOK_TIMEOUT_S)
        ours = {"type": "command", "command": command, "timeout": timeout}
        found = False
        for group in groups:
            entries = group.get("hooks") if isinstance(group, dict) else None
            if not isinstance(entries, list):
                continue
            for index, entry in enumerate(entries):
                if _is_ours(entry, mark):
                    entries[index] = ours
                    found = True
        if not found:
            group_new: dict[str, Any] = {"hooks": [ours]}
            if event in MATCHER_EVENTS and matcher is not None:
                group_new = {"matcher": matcher, **group_new}
            groups.append(group_new)
    return skipped


def _has_others(present: object, mark: str) -> bool:
    """Whether an event's entry holds anything but our hooks."""
    return present is not None and (
        not isinstance(present, list) or not all(_all_ours(g, mark) for g in present)
    )


def _all_ours(group: object, mark: str) -> bool:
    """A group holding only our entries (a group of the user's says the event is known)."""
    entries = group.get("hooks") if isinstance(group, dict) else None
    return isinstance(entries, list) and all(_is_ours(entry, mark) for entry in entries)


def _skipped_line(path: Path, event: str, version: Version | None) -> str:
    since = ".".join(str(part) for part in LATER_EVENTS[event])
    found = (
        "no Claude Code version found (claude --version)"
        if version is None
        else f"Claude Code {'.'.join(str(part) for part in version)} predates it"
    )
    return (
        f"{shown_path(path)}:"
        f" {event} not registered: {found}, and a Claude Code before {since} refuses "
        f"the whole file for it; run init again once it is {since} or later, or pass "
        "--claude-version"
    )


def _json_text(data: Mapping[str, Any]) -> bytes:
    return (json.dumps(data, indent=2, ensure_ascii=False) + "\n").encode()


def _plan(path: Path, text: bytes) -> Plan | None:
    """Where writing `text` to `path` lands and the mode it keeps; None when the file holds
    `text` already. Every file of an init is planned before any is written.

    The file behind a symbolic link is the one written (a settings file linked from a dotfiles
    repository was replaced by a copy, and the link lost); the file keeps its permissions (a
    0600 config.toml holding an MCP server's key came back 0644, readable by every user). A
    read-only file is refused: its owner said it must not change (and a rename replaced it
    all the same). A link that leads nowhere is refused (`_refuse_broken_link`)."""
    _refuse_broken_link(path)
    target = Path(os.path.realpath(path))
    try:
        info = os.stat(target)
    except FileNotFoundError:
        return target, 0o644
    if read_bytes(target, len(text) + 1) == text:
        return None
    mode = stat.S_IMODE(info.st_mode)
    if not mode & 0o222 or not os.access(target, os.W_OK):
        raise InitError(
            f"{shown_path(path)}:"
            f" is read-only; make it writable (chmod u+w {shlex.quote(str(path))}), "
            "then run init again (nothing was written)"
        )
    return target, mode


def _refuse_broken_link(path: Path) -> None:
    """`InitError` when `path`, or a folder above it, is a symbolic link that leads nowhere.

    Followed, a dangling link had its target created wherever it pointed (a dotfiles
    repository moved away, a folder on a disk not mounted), folders and all, while the host
    went on reading no file at the name it knows; a loop of links was a traceback."""
    broken = broken_link(path)
    if broken is None:
        return
    if broken[2]:  # the words of every path option (`contract.link_loop`)
        why = f"{link_loop(path) or LOOP_OF_LINKS}; fix the links"
    else:
        # The words of every path option (`contract.dangling_link`).
        nowhere = dangling_link(path)
        if nowhere is None:  # mended since `broken_link` looked
            return
        why = f"{nowhere}; create what it points to, or remove the link"
    raise InitError(f"{shown_path(path)}: {why}, then run init again (nothing was written)")


def _write(plan: Plan | None, text: bytes) -> bool:
    """Write a planned file; whether anything was written."""
    if plan is None:
        return False
    target, mode = plan
    target.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(target, text, mode=mode)
    return True


def init_claude_code(
    workdir: Path,
    command: str | None = None,
    version: Version | None = None,
) -> list[str]:
    """Merge the hooks and the MCP server into the project; the lines to report.

    `version`: the Claude Code version the project runs under (None: ask `claude --version`).
    """
    named = _named_workdir(workdir)
    exe = command or taskcard_command()
    version = version or claude_version()
    settings_path = workdir / ".claude" / "settings.json"
    mcp_path = workdir / ".mcp.json"
    settings = _load_json(settings_path)
    servers_doc = _load_json(mcp_path)
    # $CLAUDE_PROJECT_DIR: the events belong to the project, even after Claude cd's elsewhere.
    hook_command = f'{shlex.quote(exe)} hook claude-code --workdir "$CLAUDE_PROJECT_DIR"'
    skipped = merge_claude_settings(settings, hook_command, settings_path, version)
    servers = _object_at(servers_doc, "mcpServers", mcp_path)
    servers[SERVER_NAME] = _our_server(servers.get(SERVER_NAME), exe, named)
    texts = [(settings_path, _json_text(settings)), (mcp_path, _json_text(servers_doc))]
    plans = [_plan(path, text) for path, text in texts]
    report = []
    for (path, text), plan in zip(texts, plans, strict=True):
        changed = _write(plan, text)
        report.append(f"{shown_path(path)}: {'updated' if changed else 'already set up'}")
    report.extend(_skipped_line(settings_path, event, version) for event in skipped)
    return report


def _our_server(current: object, exe: str, named: str) -> dict[str, Any]:
    """Our MCP server's entry: its command and arguments set, any other key of the user's in
    it (`env`, a timeout) kept."""
    kept = dict(current) if isinstance(current, dict) else {}
    return {**kept, "command": exe, "args": ["mcp", "--workdir", named]}


def _named_workdir(workdir: Path) -> str:
    """The workdir's absolute path as the hosts' files name it; `InitError` when it is not
    UTF-8 text (JSON and TOML cannot carry it: the write failed with a traceback, after
    creating `.claude/`)."""
    text = str(workdir.resolve())
    try:
        text.encode()
    except UnicodeEncodeError:
        shown = text.encode(errors="replace").decode()
        raise InitError(
            f"--workdir {shown}: the folder's path is not UTF-8 text, which the host's "
            "settings cannot name; rename the folder, then run init again (nothing written)"
        ) from None
    return text


def codex_config_path(environ: Mapping[str, str]) -> Path:
    """Codex's config.toml by `CODEX_HOME`, as Codex finds it: an empty one counts as unset.
    One of white space only is refused (`InitError`): it was taken as a folder named by
    spaces in the current folder, and the hooks were written there, where no Codex looks
    (Codex itself fails on such a home)."""
    home = environ.get("CODEX_HOME")
    if home and not home.strip():
        raise InitError(
            "CODEX_HOME is blank; set it to Codex's home folder, unset it for ~/.codex, or"
            " pass --config"
        )
    return Path(home) / "config.toml" if home else Path.home() / ".codex" / "config.toml"


def init_codex(workdir: Path, config: Path, command: str | None = None) -> list[str]:
    """Merge `notify` and `[mcp_servers.taskcard]` into Codex's config.toml, and the
    lifecycle hooks into the hooks.json beside it; the lines to report.

    Both files are read (and refused when broken) before either is written. `notify` stays:
    a Codex without lifecycle hooks (older, or with `[features] hooks = false`) still ends
    its turns through it, and where both run, one turn id ends the turn once."""
    named = _named_workdir(workdir)
    exe = command or taskcard_command()
    hooks_path = config.parent / CODEX_HOOKS_FILE
    hooks_doc = _load_json(hooks_path)
    merge_hooks(
        hooks_doc,
        # Codex runs ~/.codex's hooks for every project: only this workdir's sessions count.
        f"{shlex.quote(exe)} hook codex --only-in {shlex.quote(named)}",
        hooks_path,
        mark=CODEX_HOOK_MARK,
        events=CODEX_EVENTS,
        later={},
        version=None,
        matcher=None,
        timeouts=CODEX_SHORT_TIMEOUTS,
    )
    config_text = _merge_codex_config(workdir, config, exe)
    hooks_text = _json_text(hooks_doc)
    config_plan, hooks_plan = _plan(config, config_text), _plan(hooks_path, hooks_text)
    report = [
        f"{shown_path(config)}:"
        f" {'updated' if _write(config_plan, config_text) else 'already set up'}"
    ]
    changed = _write(hooks_plan, hooks_text)
    report.append(f"{shown_path(hooks_path)}: {'updated' if changed else 'already set up'}")
    if changed:
        report.append(
            f"{shown_path(hooks_path)}: Codex runs a new or changed hook only once you have"
            " reviewed and trusted it in Codex (and a project's hooks only in a trusted"
            " project); until then notify still ends each turn"
        )
    return report


def _merge_codex_config(workdir: Path, config: Path, exe: str) -> bytes:
    """config.toml with `notify` and `[mcp_servers.taskcard]` merged in (not written)."""
    raw = _read_config(config) if config.exists() else b""
    try:
        text = raw.decode("utf-8")
        document = tomlkit.parse(text)
    except (UnicodeDecodeError, tomlkit.exceptions.TOMLKitError) as exc:
        raise InitError(
            f"{shown_path(config)}:"
            f" not valid TOML ({exc}); fix it, then run init again (left untouched)"
        ) from None
    # As the hooks: a session in another project is not this agent's (and its turn must not
    # end here, nor write into that project).
    notify = [exe, "hook", "codex", "--only-in", str(workdir.resolve())]
    current = document.get("notify")
    if current is not None:
        values = list(current) if isinstance(current, list) else None
        if values is None or not all(isinstance(v, str) for v in values):
            raise InitError(
                f"{shown_path(config)}: notify must be a list of strings; fix it, then run again"
            )
        # An empty list runs nothing: there is no program of the user's to keep.
        if values and values != notify and values[1:3] != ["hook", "codex"]:
            raise InitError(
                f"{shown_path(config)}:"
                f" notify already runs {values[0]!r}; Codex runs one notify program, "
                "so remove it (or call taskcard hook codex from it), then run init again"
            )
    ours = {"command": exe, "args": ["mcp", "--workdir", str(workdir.resolve())]}
    _refuse_another_agents(config, document, str(workdir.resolve()))
    try:
        new_text = _with_ours(config, tomlkit.parse(text), notify, ours, inline=False)
        _check_merged(config, text, new_text, notify, ours)
    except InitError:
        # `mcp_servers.x.y = ...` dotted keys: tomlkit put the next dotted key of the file
        # under a new `[mcp_servers.taskcard]` header. Written inline, our entry is one line
        # that takes nothing in.
        new_text = _with_ours(config, tomlkit.parse(text), notify, ours, inline=True)
        _check_merged(config, text, new_text, notify, ours)
    return new_text.encode("utf-8")


def _refuse_another_agents(config: Path, document: Any, workdir: str) -> None:
    """`InitError` when the file is set up for another agent whose folder still exists.

    Codex runs one `notify` program, and `--only-in` makes it one workdir's: taking the file
    over for this workdir pointed notify, the MCP server and the hooks here without a word,
    and the other agent's sessions reported nothing from then on. A folder that is gone (an
    agent moved or removed) has nothing left to lose, so its entries are taken over."""
    named: list[str] = []
    notify = document.get("notify")
    if isinstance(notify, list) and notify[1:4] == ["hook", "codex", "--only-in"]:
        named.append(str(notify[4]) if len(notify) > 4 else "")
    servers = document.get("mcp_servers")
    server = servers.get(SERVER_NAME) if isinstance(servers, dict) else None
    args = server.get("args") if isinstance(server, dict) else None
    if isinstance(args, list) and args[:2] == ["mcp", "--workdir"] and len(args) > 2:
        named.append(str(args[2]))
    for other in named:
        # Compared resolved: a link to this folder, or `..` in an older entry, is this one.
        if other and os.path.realpath(other) != workdir and Path(other).is_dir():
            raise InitError(
                f"{shown_path(config)}: set up for the agent in {other!r} (notify, [mcp_servers."
                f"{SERVER_NAME}], the hooks); Codex runs one notify program, so one config "
                "serves one agent: give this agent a config of its own (--config FILE, or "
                "CODEX_HOME), or remove those entries to move them here, then run init again"
            )


def _with_ours(
    config: Path,
    document: tomlkit.TOMLDocument,
    notify: list[str],
    ours: dict[str, Any],
    *,
    inline: bool,
) -> str:
    """`document` with our server and `notify` set, as text (`inline`: our server as an
    inline table)."""
    servers = document.get("mcp_servers")
    if servers is None:
        servers = tomlkit.table(is_super_table=True)
        document["mcp_servers"] = servers
    elif not isinstance(servers, dict):
        raise InitError(
            f"{shown_path(config)}: mcp_servers must be a table; fix it, then run init again"
        )
    current = servers.get(SERVER_NAME)
    if isinstance(current, dict):
        current.update(ours)  # in place: its other keys (env, timeouts) and comments stay
    else:
        # `mcp_servers = { ... }` is an inline table, which holds only inline tables (a
        # table there raised a traceback).
        inline = inline or isinstance(servers, tomlkit.items.InlineTable)
        server = tomlkit.inline_table() if inline else tomlkit.table()
        server.update(ours)
        servers[SERVER_NAME] = server
    # Set after the server: set before it, under `mcp_servers.x.y = ...` dotted keys, tomlkit
    # wrote notify below the new `[mcp_servers.taskcard]` header, which made it a key of
    # that table, and Codex never ran it.
    document["notify"] = notify
    return tomlkit.dumps(document)


def _check_merged(
    config: Path, old: str, new: str, notify: list[str], ours: Mapping[str, Any]
) -> None:
    """`InitError` unless `new`, read as Codex reads TOML, holds `notify` at the top level,
    our server under `mcp_servers`, and everything else of `old` as it was: the TOML editor
    places a new key by the file's layout, and in some layouts it landed in another table."""
    try:
        before, after = tomllib.loads(old), tomllib.loads(new)
    except tomllib.TOMLDecodeError as exc:
        raise InitError(
            f"{shown_path(config)}:"
            f" not valid TOML ({exc}); fix it, then run init again (left untouched)"
        ) from None
    servers = after.get("mcp_servers")
    server = servers.get(SERVER_NAME) if isinstance(servers, dict) else None
    placed = (
        after.get("notify") == notify
        and isinstance(server, dict)
        and all(server.get(key) == value for key, value in ours.items())
    )
    before_servers = before.get("mcp_servers")
    for document in (before, after):
        document.pop("notify", None)
        if isinstance(document.get("mcp_servers"), dict):
            document["mcp_servers"] = dict(document["mcp_servers"])
            document["mcp_servers"].pop(SERVER_NAME, None)
            if not document["mcp_servers"] and before_servers is None:
                del document["mcp_servers"]
    if placed and before == after:
        return
    raise InitError(
        f"{shown_path(config)}:"
        " cannot merge into this file's layout without moving its keys; add by "
        f"hand at the top: notify = {json.dumps(notify)}, and a table "
        f"[mcp_servers.{SERVER_NAME}] with command = {json.dumps(ours['command'])} and "
        f"args = {json.dumps(ours['args'])}; then run init again (left untouched)"
    )


def environment() -> Mapping[str, str]:
    return os.environ
