"""`taskcard hook codex` (Codex's notify program) and `taskcard init claude-code|codex`."""

from __future__ import annotations

import json
import os
import subprocess
import tomllib
from pathlib import Path

import pytest
import tomlkit

from taskcard.bridge.track.activity import ActivityTracker

from .conftest import FIXTURES, events, kinds, payload, run_taskcard


def codex_payload(workdir: Path) -> str:
    text = (FIXTURES / "codex_agent_turn_complete.json").read_text()
    return text.replace("CWD", str(workdir))


def test_codex_notify_ends_the_turn_in_the_payload_cwd(workdir: Path) -> None:
    done = run_taskcard("hook", "codex", codex_payload(workdir))
    assert (done.returncode, done.stdout) == (0, b"")
    assert kinds(workdir) == ["turn.end"]
    other = run_taskcard("hook", "codex", json.dumps({"type": "something-else", "cwd": "x"}))
    assert other.returncode == 0


def test_codex_notify_carries_the_origin_of_its_environment(workdir: Path) -> None:
    # Codex reports only the end of a turn: the origin goes on a turn.origin before it,
    # where the service finds it (before, TASKCARD_ORIGIN did nothing for Codex).
    env = {**os.environ, "TASKCARD_ORIGIN": "telegram:-1001234567890:42"}
    done = run_taskcard("hook", "codex", codex_payload(workdir), env=env)
    assert (done.returncode, done.stdout) == (0, b"")
    assert kinds(workdir) == ["turn.origin", "turn.end"]
    tracker = ActivityTracker()
    for line in (workdir / "logs" / "events.jsonl").read_bytes().splitlines():
        tracker.feed(line)
    assert [origin for origin, _ in tracker.origins] == ["telegram:-1001234567890:42"]
    bad = {**os.environ, "TASKCARD_ORIGIN": "somewhere"}
    assert run_taskcard("hook", "codex", codex_payload(workdir), env=bad).returncode == 0
    assert kinds(workdir)[2:] == ["turn.end"]  # written without it, and the log says why
    assert "TASKCARD_ORIGIN" in (workdir / "logs" / "taskcard-hook.log").read_text()


def test_codex_notify_with_garbage_exits_0_and_logs(workdir: Path) -> None:
    done = run_taskcard("hook", "codex", "--workdir", str(workdir), "{broken")
    assert (done.returncode, done.stdout) == (0, b"")
    assert "not JSON" in (workdir / "logs" / "taskcard-hook.log").read_text()


def test_init_claude_code_merges_idempotently_and_the_hook_it_writes_works(
    workdir: Path,
) -> None:
    settings = workdir / ".claude" / "settings.json"
    settings.parent.mkdir()
    user_hook = {"matcher": "Bash", "hooks": [{"type": "command", "command": "./guard.sh"}]}
    settings.write_text(
        json.dumps({"model": "opus", "hooks": {"PreToolUse": [user_hook]}, "env": {"A": "1"}})
    )
    (workdir / ".mcp.json").write_text(json.dumps({"mcpServers": {"other": {"command": "x"}}}))
    first = run_taskcard("init", "claude-code", "--workdir", str(workdir))
    assert first.returncode == 0, first.stderr
    merged = json.loads(settings.read_text())
    assert (merged["model"], merged["env"]) == ("opus", {"A": "1"})
    assert merged["hooks"]["PreToolUse"][0] == user_hook
    ours = merged["hooks"]["PreToolUse"][1]
    assert ours["matcher"] == "*"
    command = ours["hooks"][0]["command"]
    assert command.endswith('hook claude-code --workdir "$CLAUDE_PROJECT_DIR"')
    assert set(merged["hooks"]) >= {"SessionStart", "Stop", "Notification", "SessionEnd"}
    servers = json.loads((workdir / ".mcp.json").read_text())["mcpServers"]
    assert servers["other"] == {"command": "x"}
    assert servers["taskcard"]["args"] == ["mcp", "--workdir", str(workdir.resolve())]
    before = (settings.read_bytes(), (workdir / ".mcp.json").read_bytes())
    again = run_taskcard("init", "claude-code", "--workdir", str(workdir))
    assert again.returncode == 0 and b"already set up" in again.stdout
    assert (settings.read_bytes(), (workdir / ".mcp.json").read_bytes()) == before
    # The command as Claude Code would run it: through a shell, with the project dir set.
    env = {**os.environ, "CLAUDE_PROJECT_DIR": str(workdir)}
    data = json.dumps(payload("02_user_prompt_submit.json", workdir / "sub"))
    done = subprocess.run(
        command, shell=True, input=data.encode(), env=env, capture_output=True, timeout=120
    )
    assert done.returncode == 0
    assert kinds(workdir) == ["turn.start"]


def test_init_claude_code_refuses_a_malformed_file_and_leaves_it(workdir: Path) -> None:
    settings = workdir / ".claude" / "settings.json"
    settings.parent.mkdir()
    settings.write_text('{"hooks": [trailing,]')
    done = run_taskcard("init", "claude-code", "--workdir", str(workdir))
    assert done.returncode == 2
    assert b"settings.json: not valid JSON" in done.stderr
    assert settings.read_text() == '{"hooks": [trailing,]'
    settings.write_text('{"hooks": []}')
    done = run_taskcard("init", "claude-code", "--workdir", str(workdir))
    assert (done.returncode, b"hooks must be an object" in done.stderr) == (2, True)
    assert not (workdir / ".mcp.json").exists()


@pytest.mark.parametrize(
    ("host", "name", "plant", "said"),
    [
        ("claude-code", ".claude/settings.json", "folder", "a folder, not a regular file"),
        ("claude-code", ".claude/settings.json", "fifo", "a named pipe, not a regular file"),
        ("claude-code", ".claude/settings.json", "huge", "over 10000000 bytes"),
        ("claude-code", ".claude/settings.json", "comma", "not valid JSON (expecting"),
        ("claude-code", ".mcp.json", "folder", "a folder, not a regular file"),
        ("codex", "codex/config.toml", "folder", "a folder, not a regular file"),
        ("codex", "codex/hooks.json", "fifo", "a named pipe, not a regular file"),
    ],
)
def test_init_says_why_a_file_it_cannot_read_is_refused(
    workdir: Path, tmp_path: Path, host: str, name: str, plant: str, said: str
) -> None:
    """A folder or a pipe at a settings file was "not valid JSON (NotRegularFile)" (and "not
    valid TOML ([Errno 22] ...)"), a file over the size read was cut and then "not valid
    JSON", and a syntax error was "not valid JSON (JSONDecodeError)" without its place."""
    path = (tmp_path if host == "codex" else workdir) / name
    path.parent.mkdir(parents=True, exist_ok=True)
    if plant == "folder":
        path.mkdir()
    elif plant == "fifo":
        os.mkfifo(path)
    elif plant == "huge":
        path.write_text("{}" + " " * 10_000_000)
    else:
        path.write_text('{"hooks": {},\n}')
    extra = ("--config", str(tmp_path / "codex" / "config.toml")) if host == "codex" else ()
    done = run_taskcard("init", host, "--workdir", str(workdir), *extra)
    line = done.stderr.decode()
    assert done.returncode == 2 and line.count("\n") == 1, line
    assert line.startswith(f"taskcard init: {path}: "), line
    assert said in line and "then run init again (it was left untouched)" in line, line
    if plant == "comma":
        assert "at line 2, column 1" in line, line
    assert not (workdir / ".mcp.json").is_file() or name == ".mcp.json"


@pytest.mark.parametrize(
    ("stop", "problem"),
    [
        ([{"hooks": "./notify.sh"}], b"hooks.Stop[0].hooks must be a list"),
        ([5], b"hooks.Stop[0] must be an object with a hooks list"),
        ([{"matcher": 3, "hooks": []}], b"hooks.Stop[0].matcher must be a string"),
        # Under an event taskcard does not hook: Claude Code refuses the file all the same.
        ("SubagentStop", b"hooks.SubagentStop[0].hooks must be a list"),
        ("SubagentStop-list", b"hooks.SubagentStop must be a list"),
    ],
)
def test_init_claude_code_refuses_a_hook_group_of_another_shape(
    workdir: Path, stop: list[object] | str, problem: bytes
) -> None:
    """A group under an event that is not the documented object with a hooks list was kept
    as it was, ours added beside it, and init said "updated": Claude Code refuses such a
    file, so none of the hooks ran."""
    settings = workdir / ".claude" / "settings.json"
    settings.parent.mkdir()
    hooks: dict[str, object] = {"Stop": stop}
    if stop == "SubagentStop":
        hooks = {"Stop": [], "SubagentStop": [{"hooks": "./notify.sh"}]}
    elif stop == "SubagentStop-list":
        hooks = {"SubagentStop": {"hooks": []}}
    text = json.dumps({"hooks": hooks})
    settings.write_text(text)
    done = run_taskcard(
        "init", "claude-code", "--workdir", str(workdir), "--claude-version", "2.1.90"
    )
    assert done.returncode == 2, done.stdout
    assert problem in done.stderr and b"then run" in done.stderr
    assert settings.read_text() == text
    assert not (workdir / ".mcp.json").exists()


def fake_claude(folder: Path, version: str) -> dict[str, str]:
    """An environment whose PATH has a `claude` printing `version` as Claude Code does."""
    folder.mkdir(exist_ok=True)
    exe = folder / "claude"
    exe.write_text(f'#!/bin/sh\necho "{version} (Claude Code)"\n')
    exe.chmod(0o755)
    return {**os.environ, "PATH": f"{folder}:/usr/bin:/bin"}


def test_init_claude_code_registers_stop_failure_only_where_claude_knows_it(
    workdir: Path, tmp_path: Path
) -> None:
    # A Claude Code before 2.1.78 refuses a settings file that names StopFailure, and then
    # runs none of its hooks or permission rules: an install must never do that to it.
    settings = workdir / ".claude" / "settings.json"
    args = ("init", "claude-code", "--workdir", str(workdir))
    done = run_taskcard(*args, env=fake_claude(tmp_path / "new", "2.1.90"))
    assert done.returncode == 0, done.stderr
    hooks = json.loads(settings.read_text())["hooks"]
    assert hooks["StopFailure"] == [{"hooks": [hooks["Stop"][0]["hooks"][0]]}]
    assert b"not registered" not in done.stdout
    # The same project under an older Claude Code: our entry comes out again.
    done = run_taskcard(*args, env=fake_claude(tmp_path / "old", "2.1.40"))
    assert done.returncode == 0, done.stderr
    assert "StopFailure" not in json.loads(settings.read_text())["hooks"]
    assert b"StopFailure not registered: Claude Code 2.1.40 predates it" in done.stdout
    # No claude on PATH: left out, and the report says how to get it.
    done = run_taskcard(*args, env={**os.environ, "PATH": "/usr/bin:/bin"})
    assert b"no Claude Code version found" in done.stdout and b"--claude-version" in done.stdout
    assert "StopFailure" not in json.loads(settings.read_text())["hooks"]
    done = run_taskcard(*args, "--claude-version", "2.1.78", env={"PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr
    assert "StopFailure" in json.loads(settings.read_text())["hooks"]
    # What `claude --version` prints, given as it is (`--claude-version "$(claude --version)"`).
    done = run_taskcard(*args, "--claude-version", "2.1.90 (Claude Code)", env={"PATH": "/bin"})
    assert done.returncode == 0, done.stderr
    assert "StopFailure" in json.loads(settings.read_text())["hooks"]
    bad = run_taskcard(*args, "--claude-version", "latest")
    assert bad.returncode == 2 and b"--claude-version: 'latest' is not a version" in bad.stderr
    # A file already holding StopFailure hooks of the user's is read by a Claude Code that
    # knows the event: ours joins them, and theirs stay when ours would come out.
    theirs = {"hooks": [{"type": "command", "command": "./alert.sh"}]}
    data = json.loads(settings.read_text())
    data["hooks"]["StopFailure"].insert(0, theirs)
    settings.write_text(json.dumps(data))
    done = run_taskcard(*args, env={**os.environ, "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0 and b"not registered" not in done.stdout
    assert json.loads(settings.read_text())["hooks"]["StopFailure"][0] == theirs
    assert len(json.loads(settings.read_text())["hooks"]["StopFailure"]) == 2
    settings.write_text(json.dumps({"hooks": {"StopFailure": 5}}))
    done = run_taskcard(*args, env={**os.environ, "PATH": "/usr/bin:/bin"})
    assert done.returncode == 2 and b"hooks.StopFailure must be a list" in done.stderr
    assert b"Traceback" not in done.stderr


CODEX_CONFIG = """# my codex settings
model = "gpt-5-codex"  # keep this comment

[mcp_servers.docs]
command = "docs-server"
args = ["--port", "0"]
"""


def test_init_codex_merges_into_config_toml_keeping_the_rest(workdir: Path, tmp_path: Path) -> None:
    config = tmp_path / "codex" / "config.toml"
    config.parent.mkdir()
    config.write_text(CODEX_CONFIG)
    done = run_taskcard("init", "codex", "--workdir", str(workdir), "--config", str(config))
    assert done.returncode == 0, done.stderr
    text = config.read_text()
    assert text.startswith("# my codex settings\n") and "# keep this comment" in text
    doc = tomlkit.parse(text).unwrap()
    assert doc["notify"][1:] == ["hook", "codex", "--only-in", str(workdir.resolve())]
    assert doc["mcp_servers"]["docs"] == {"command": "docs-server", "args": ["--port", "0"]}
    assert doc["mcp_servers"]["taskcard"]["args"] == ["mcp", "--workdir", str(workdir.resolve())]
    again = run_taskcard("init", "codex", "--workdir", str(workdir), "--config", str(config))
    assert again.returncode == 0 and b"already set up" in again.stdout
    assert config.read_text() == text


def test_init_codex_uses_codex_home_and_refuses_what_it_must_not_overwrite(
    workdir: Path, tmp_path: Path
) -> None:
    home = tmp_path / "codex-home"
    env = {**os.environ, "CODEX_HOME": str(home)}
    done = run_taskcard("init", "codex", "--workdir", str(workdir), env=env)
    assert done.returncode == 0, done.stderr
    assert "notify" in (home / "config.toml").read_text()
    foreign = tmp_path / "foreign.toml"
    foreign.write_text('notify = ["notify-send-wrapper"]\n')
    done = run_taskcard("init", "codex", "--workdir", str(workdir), "--config", str(foreign))
    assert done.returncode == 2 and b"notify already runs 'notify-send-wrapper'" in done.stderr
    assert foreign.read_text() == 'notify = ["notify-send-wrapper"]\n'
    broken = tmp_path / "broken.toml"
    broken.write_text("model = \n")
    done = run_taskcard("init", "codex", "--workdir", str(workdir), "--config", str(broken))
    assert done.returncode == 2 and b"broken.toml: not valid TOML" in done.stderr
    assert broken.read_text() == "model = \n"


def test_init_codex_fills_an_empty_notify_list(workdir: Path, tmp_path: Path) -> None:
    # `notify = []` runs no program: nothing of the user's to keep, so init installs the
    # hook (it used to end in a traceback).
    config = tmp_path / "config.toml"
    config.write_text('model = "o3"\nnotify = []\n')
    done = run_taskcard("init", "codex", "--workdir", str(workdir), "--config", str(config))
    assert done.returncode == 0, done.stderr
    document = tomllib.loads(config.read_text())
    assert document["notify"][1:3] == ["hook", "codex"] and document["model"] == "o3"
    again = run_taskcard("init", "codex", "--workdir", str(workdir), "--config", str(config))
    assert (again.returncode, again.stdout.strip().endswith(b"already set up")) == (0, True)


def test_codex_hook_without_its_argument_reads_a_hook_payload_on_stdin(workdir: Path) -> None:
    # Wired as a hooks.json hook, Codex sends the JSON on stdin and no argument: it used to
    # be refused ("no payload argument"); now it is a lifecycle hook's payload, and only
    # neither an argument nor stdin says what is missing.
    stdin = json.dumps({"hook_event_name": "Stop", "cwd": str(workdir), "turn_id": "t1"})
    done = run_taskcard("hook", "codex", "--workdir", str(workdir), stdin=stdin)
    assert (done.returncode, done.stdout) == (0, b"")
    assert kinds(workdir) == ["turn.end"]
    done = run_taskcard("hook", "codex", "--workdir", str(workdir))
    assert (done.returncode, done.stdout) == (0, b"")
    log = (workdir / "logs" / "taskcard-hook.log").read_text()
    assert "no payload" in log and '"hook", "codex"' in log


@pytest.mark.parametrize("host", ["claude-code", "codex"])
def test_init_refuses_a_workdir_whose_path_is_not_utf8(tmp_path: Path, host: str) -> None:
    """JSON and TOML cannot name such a folder: the write failed with a traceback (exit 1),
    after creating `.claude/`. It is refused, naming `--workdir`, and nothing is written."""
    workdir = os.fsdecode(bytes(tmp_path) + b"/caf\xe9")
    os.mkdir(workdir)
    config = tmp_path / "codex" / "config.toml"
    extra = ["--config", str(config)] if host == "codex" else ["--claude-version", "2.1.90"]
    done = run_taskcard("init", host, "--workdir", workdir, *extra)
    assert done.returncode == 2
    assert b"--workdir" in done.stderr and b"not UTF-8" in done.stderr
    assert b"Traceback" not in done.stderr
    assert os.listdir(workdir) == [] and not config.parent.exists()


@pytest.mark.parametrize(
    "layout",
    [
        'mcp_servers.docs.command = "docs-server"\n',
        'model = "o3"\nmcp_servers.docs.command = "docs-server"\n\n[profiles.fast]\nmodel = "m"\n',
        'mcp_servers = { docs = { command = "docs-server" } }\n',
        '[mcp_servers.taskcard]\ncommand = "old"\nenv = { TASKCARD_X = "1" }  # mine\n',
        'mcp_servers.docs.command = "docs-server"\nmcp_servers.docs.args = ["--port", "1"]\n',
    ],
    ids=["dotted", "dotted-then-table", "inline", "ours-with-env", "two-dotted-keys"],
)
def test_init_codex_puts_notify_at_the_top_level_whatever_the_layout(
    workdir: Path, tmp_path: Path, layout: str
) -> None:
    """Under `mcp_servers.docs.command = ...` dotted keys, notify was written below the new
    `[mcp_servers.taskcard]` header, a key of that table: Codex never ran it. An inline
    `mcp_servers = {...}` ended in a traceback; our server's own `env` was dropped."""
    config = tmp_path / "config.toml"
    config.write_text(layout)
    before = tomllib.loads(layout)
    args = ("init", "codex", "--workdir", str(workdir), "--config", str(config))
    done = run_taskcard(*args)
    assert done.returncode == 0, done.stderr
    after = tomllib.loads(config.read_text())
    assert after["notify"][1:] == ["hook", "codex", "--only-in", str(workdir.resolve())]
    server = after["mcp_servers"]["taskcard"]
    assert server["args"] == ["mcp", "--workdir", str(workdir.resolve())]
    assert server.get("env") == before.get("mcp_servers", {}).get("taskcard", {}).get("env")
    del after["notify"], after["mcp_servers"]["taskcard"], server["command"], server["args"]
    before.get("mcp_servers", {}).pop("taskcard", None)
    assert {k: v for k, v in after.items() if v} == {k: v for k, v in before.items() if v}
    again = run_taskcard(*args)
    assert again.returncode == 0 and again.stdout.count(b"already set up") == 2


@pytest.mark.parametrize("host", ["claude-code", "codex"])
def test_init_keeps_a_private_file_private_and_a_linked_file_linked(
    tmp_path: Path, host: str
) -> None:
    """A 0600 settings file holding a key came back 0644 (readable by every user), and a
    settings file linked from a dotfiles folder was replaced by a copy, the link lost."""
    workdir = tmp_path / "agent"
    workdir.mkdir()
    dotfiles = tmp_path / "dotfiles"
    dotfiles.mkdir()
    if host == "codex":
        real = dotfiles / "config.toml"
        real.write_text('[mcp_servers.docs.env]\nAPI_KEY = "sk-private"\n')
        link = tmp_path / "codex" / "config.toml"
        extra = ["--config", str(link)]
    else:
        real = dotfiles / "settings.json"
        real.write_text(json.dumps({"env": {"API_KEY": "sk-private"}}))
        link = workdir / ".claude" / "settings.json"
        extra = ["--claude-version", "2.1.90"]
    real.chmod(0o600)
    link.parent.mkdir()
    link.symlink_to(real)
    done = run_taskcard("init", host, "--workdir", str(workdir), *extra)
    assert done.returncode == 0, done.stderr
    assert link.is_symlink() and link.resolve() == real.resolve()
    assert "sk-private" in real.read_text() and "hook" in real.read_text()
    assert real.stat().st_mode & 0o777 == 0o600


@pytest.mark.parametrize("host", ["claude-code", "codex"])
def test_init_refuses_a_read_only_file_and_writes_nothing(tmp_path: Path, host: str) -> None:
    """A read-only file was replaced all the same (a rename needs only the folder); now it
    is refused before any file is written, naming the file and the fix."""
    workdir = tmp_path / "agent"
    workdir.mkdir()
    config = tmp_path / "codex" / "config.toml"
    if host == "codex":
        locked = config.parent / "hooks.json"
        other = config
        extra = ["--config", str(config)]
    else:
        locked = workdir / ".mcp.json"
        other = workdir / ".claude" / "settings.json"
        extra = ["--claude-version", "2.1.90"]
    locked.parent.mkdir(parents=True, exist_ok=True)
    locked.write_text("{}\n")
    locked.chmod(0o444)
    done = run_taskcard("init", host, "--workdir", str(workdir), *extra)
    assert done.returncode == 2
    assert f"{locked}: is read-only; make it writable (chmod u+w".encode() in done.stderr
    assert b"Traceback" not in done.stderr
    assert locked.read_text() == "{}\n" and not other.exists()
    locked.chmod(0o644)
    done = run_taskcard("init", host, "--workdir", str(workdir), *extra)
    assert done.returncode == 0, done.stderr
    assert locked.stat().st_mode & 0o777 == 0o644 and other.exists()


def test_init_claude_code_registers_permission_request_and_the_hook_leaves_the_answer(
    workdir: Path, tmp_path: Path
) -> None:
    """`PermissionRequest` (the dialog opens) was not registered, so a wait showed only if a
    permission `Notification` came. It is registered for every tool where Claude Code has it
    (2.0.45 on), starts the wait, prints nothing (no decision: the person answers) and the
    tool's end, once granted, ends the wait."""
    settings = workdir / ".claude" / "settings.json"
    args = ("init", "claude-code", "--workdir", str(workdir))
    done = run_taskcard(*args, env=fake_claude(tmp_path / "new", "2.1.90"))
    assert done.returncode == 0, done.stderr
    groups = json.loads(settings.read_text())["hooks"]["PermissionRequest"]
    assert len(groups) == 1 and groups[0]["matcher"] == "*"
    command = groups[0]["hooks"][0]["command"]
    assert command.endswith('hook claude-code --workdir "$CLAUDE_PROJECT_DIR"')
    env = {**os.environ, "CLAUDE_PROJECT_DIR": str(workdir)}
    for name, changes in (
        ("03_pre_tool_use.json", {}),
        ("13_permission_request.json", {}),
        ("06_notification_permission.json", {}),
        ("04_post_tool_use.json", {"tool_use_id": "toolu_01ABC"}),
    ):
        data = json.dumps(payload(name, workdir, **changes)).encode()
        ran = subprocess.run(
            command, shell=True, input=data, env=env, capture_output=True, timeout=120
        )
        assert (ran.returncode, ran.stdout, ran.stderr) == (0, b"", b""), name
    assert kinds(workdir) == ["tool.start", "wait.start", "wait.end", "tool.end"]
    assert [e.get("reason") for e in events(workdir)][1:3] == ["permission", "permission"]
    # A Claude Code before the event refuses the whole file for it: left out, and said so.
    done = run_taskcard(*args, env=fake_claude(tmp_path / "old", "2.0.40"))
    assert done.returncode == 0, done.stderr
    assert "PermissionRequest" not in json.loads(settings.read_text())["hooks"]
    assert b"PermissionRequest not registered: Claude Code 2.0.40 predates it" in done.stdout


def test_init_codex_for_a_second_agent_refuses_to_take_the_first_ones_config(
    workdir: Path, tmp_path: Path
) -> None:
    """One config.toml runs one notify program: `init codex` for a second workdir silently
    pointed notify, the MCP server and the hooks at it, and the first agent's Codex sessions
    reported nothing from then on. A workdir that is gone (a moved agent) is taken over."""
    first, second = tmp_path / "first agent", tmp_path / "second"
    first.mkdir()
    second.mkdir()
    config = tmp_path / "codex" / "config.toml"
    config.parent.mkdir()
    done = run_taskcard("init", "codex", "--workdir", str(first), "--config", str(config))
    assert done.returncode == 0, done.stderr
    hooks = config.parent / "hooks.json"
    before = (config.read_bytes(), hooks.read_bytes())
    taken = run_taskcard("init", "codex", "--workdir", str(second), "--config", str(config))
    assert taken.returncode == 2, taken.stdout
    message = taken.stderr.decode()
    assert str(config) in message and str(first.resolve()) in message, message
    assert "--config" in message and "CODEX_HOME" in message, message
    assert (config.read_bytes(), hooks.read_bytes()) == before
    # The same folder through a link is the same agent: set up again, not refused.
    (tmp_path / "link").symlink_to(first)
    link = str(tmp_path / "link")
    again = run_taskcard("init", "codex", "--workdir", link, "--config", str(config))
    assert again.returncode == 0 and b"already set up" in again.stdout, again.stderr
    first.rmdir()  # the first agent's folder is gone: nothing of it is lost any more
    moved = run_taskcard("init", "codex", "--workdir", str(second), "--config", str(config))
    assert moved.returncode == 0, moved.stderr
    notify = tomllib.loads(config.read_text())["notify"]
    assert notify[1:] == ["hook", "codex", "--only-in", str(second.resolve())]
