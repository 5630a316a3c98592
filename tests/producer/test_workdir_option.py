"""`--workdir` read the same way by every agent-side command, and by the MCP tools.

MCP clients and hand-written hook configs pass `~/agent` verbatim (no shell expands it), and
an empty value used to mean "the current folder" to most commands: a report, a ledger or an
activity line then landed wherever the command happened to run.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from mcp import ClientSession, StdioServerParameters, stdio_client

from taskcard.producers.inbox import claim_all, peek
from taskcard.producers.ledger import Ledger, LedgerError
from taskcard.producers.reports import LineageError, ReportError, Reports, read_lineage, spawn
from taskcard.producers.task_card import TaskCard, WorkdirError
from tests.conftest import mcp_session

from .conftest import CliHost
from .test_reports import TASKCARD

CODEX = (
    '{"type": "agent-turn-complete", "turn-id": "1", "cwd": "/", "input-messages": ["go"], '
    '"last-assistant-message": "done"}'
)
PROMPT = {"session_id": "s1", "cwd": "/", "hook_event_name": "UserPromptSubmit", "prompt": "go"}

# Each agent-side command that takes --workdir; "W" is replaced by the workdir's name, and
# the path is a file it must have written there.
COMMANDS: dict[str, tuple[list[str], str]] = {
    "ledger": (["ledger", "init", "t1", "--purpose", "p", "--no-renderer"], "ledger"),
    "report": (["report", "--ok"], "reports/reports.jsonl"),
    "reports": (["reports"], ""),
    "spawn": (["spawn", "--parent", "p0", "--reason", "r"], "lineage.json"),
    "inbox": (["inbox", "--peek"], ""),
    "activity": (["activity", "turn.start"], "logs/events.jsonl"),
    "hook claude-code": (["hook", "claude-code"], "logs/events.jsonl"),
    "hook codex": (["hook", "codex", CODEX], "logs/events.jsonl"),
    "init claude-code": (["init", "claude-code"], ".claude/settings.json"),
    "card settings": (["card", "settings"], ""),
}


def _run(argv: list[str], workdir: str, home: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [TASKCARD, *argv, "--workdir", workdir],
        input=json.dumps(PROMPT) if argv[:2] == ["hook", "claude-code"] else "",
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=home / "elsewhere",
        env={**os.environ, "HOME": str(home)},
    )


@pytest.fixture
def home(workdir: Path) -> Path:
    """The HOME of these runs: it holds the agent's workdir and a folder they run in."""
    assert workdir.name == "agent"
    (workdir.parent / "elsewhere").mkdir()
    return workdir.parent


@pytest.mark.parametrize("name", COMMANDS)
def test_an_unexpanded_tilde_names_the_home_folder(home: Path, name: str) -> None:
    argv, written = COMMANDS[name]
    done = _run(argv, "~/agent", home)
    assert done.returncode == 0, done.stderr
    assert "not a directory" not in done.stderr
    if written:
        assert (home / "agent" / written).exists(), (name, done.stderr)
    assert not (home / "elsewhere" / "~").exists()
    assert list((home / "elsewhere").iterdir()) == []


@pytest.mark.parametrize("name", COMMANDS)
def test_an_empty_workdir_is_refused_naming_the_option(home: Path, name: str) -> None:
    argv, _ = COMMANDS[name]
    done = _run(argv, "", home)
    assert "--workdir" in done.stderr and "empty" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
    # A hook never fails its agent's turn; every other command exits with a usage error.
    assert done.returncode == (0 if argv[0] == "hook" else 2)
    assert list((home / "elsewhere").iterdir()) == [], "nothing lands in the current folder"


@pytest.mark.parametrize("name", ["ledger", "inbox", "activity", "reports", "init claude-code"])
def test_a_missing_workdir_is_refused_and_never_created(home: Path, name: str) -> None:
    argv, _ = COMMANDS[name]
    done = _run(argv, str(home / "typo"), home)
    assert done.returncode == 2 and "--workdir" in done.stderr, done.stderr
    assert "not a directory" in done.stderr
    assert not (home / "typo").exists()


@pytest.mark.parametrize(
    "argv",
    [
        ["card", "start", "r.py"],
        ["card", "inspect", "tc_1"],
        ["card", "retry", "tc_1"],
        ["card", "stop", "tc_1"],
        ["card", "remove"],
        ["card", "settings"],
        ["card", "manual"],
        ["card", "manual", "--json"],
    ],
    ids=lambda argv: " ".join(argv[1:]),
)
def test_every_card_action_refuses_a_missing_workdir(home: Path, argv: list[str]) -> None:
    """`card manual` printed the manual for a --workdir that names no folder, where every
    other action (and `tool` with the same envelope) says the workdir is missing, exit 2."""
    done = _run(argv, str(home / "typo"), home)
    assert done.returncode == 2, (done.returncode, done.stderr)
    assert done.stdout == ""
    [line] = done.stderr.splitlines()
    assert "typo" in line and "not a directory" in line and "--workdir" in line, line
    assert not (home / "typo").exists()


@pytest.mark.parametrize("name", ["ledger", "inbox", "reports", "card settings", "mcp", "tool"])
def test_a_workdir_with_a_line_break_or_an_escape_is_still_one_line(home: Path, name: str) -> None:
    """A missing `--workdir` named with a line break and an escape sequence was printed raw:
    the one-line error came out as two lines, and the terminal acted on the escape."""
    argv = COMMANDS[name][0] if name in COMMANDS else [name]
    done = _run(argv, str(home / "typo\nnext\x1b[31m"), home)
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and done.stderr.endswith("\n"), done.stderr
    assert "\x1b" not in done.stderr, done.stderr
    assert "typo\\nnext\\x1b[31m" in done.stderr, done.stderr
    assert list((home / "elsewhere").iterdir()) == []


async def test_the_spawn_tool_expands_a_tilde_and_refuses_an_empty_child_workdir(
    home: Path, cli: CliHost
) -> None:
    (home / "child").mkdir()
    server = StdioServerParameters(
        command=TASKCARD,
        args=["mcp", "--workdir", "~/agent", "--runtime-dir", str(cli.runtime_dir)],
        env={**os.environ, "HOME": str(home)},
        cwd=home / "elsewhere",
    )
    async with (
        stdio_client(server) as (read, write),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        empty = await session.call_tool("spawn", {"child_workdir": " ", "reason": "lint"})
        assert empty.is_error and isinstance(empty.structured_content, dict)
        assert empty.structured_content["message"].startswith("child_workdir: is empty")
        done = await session.call_tool("spawn", {"child_workdir": "~/child", "reason": "lint"})
        assert not done.is_error, done.structured_content
        assert json.loads((home / "child" / "lineage.json").read_text())["parent"] == "agent"
        report = await session.call_tool("report", {"ok": True})
        assert not report.is_error
        assert (home / "agent" / "reports" / "reports.jsonl").is_file()
    assert list((home / "elsewhere").iterdir()) == []


# Each Python API entry that takes a folder (or the ledger's file), with the error type its
# callers catch and the field its message must name.
def _api_calls(
    runtime_dir: Path, child: Path
) -> dict[str, tuple[Callable[[Any], object], type, str]]:
    def card(value: Any) -> object:
        with TaskCard(value, runtime_dir=runtime_dir):
            return None

    return {
        "TaskCard": (card, WorkdirError, "workdir: "),
        "Reports.add": (lambda value: Reports(value).add(ok=True), ReportError, "workdir: "),
        "Reports.after": (lambda value: Reports(value).after(), ReportError, "workdir: "),
        "spawn": (lambda value: spawn(value, parent="p0", reason="r"), LineageError, "child: "),
        "spawn parent": (
            lambda value: spawn(child, parent="p0", reason="r", parent_workdir=value),
            LineageError,
            "parent_workdir: ",
        ),
        "read_lineage": (read_lineage, LineageError, "workdir: "),
        "Ledger": (lambda value: Ledger(value).read(), LedgerError, "ledger: "),
        "peek": (peek, WorkdirError, "workdir: "),
        "claim_all": (lambda value: claim_all(value, "mcp"), WorkdirError, "workdir: "),
    }


@pytest.mark.parametrize("value", ["", "  ", "a\0b", 7, None, b"/tmp"])
def test_the_python_api_refuses_an_unusable_folder_name_naming_the_field(
    home: Path, runtime_dir: Path, monkeypatch: pytest.MonkeyPatch, value: object
) -> None:
    """`TaskCard("")` and `Reports("")` used to work in the current folder (`Path("")` is
    `.`); a NUL or a number came back as a bare TypeError or ValueError naming nothing."""
    monkeypatch.chdir(home / "elsewhere")
    for name, (call, error, field) in _api_calls(runtime_dir, home / "agent").items():
        if name == "spawn parent" and value is None:
            continue  # None is its default: no parent workdir
        with pytest.raises(error) as raised:
            call(value)
        message = str(raised.value)
        assert message.startswith(field) and "give " in message, (name, message)
    assert list((home / "elsewhere").iterdir()) == [], "nothing lands in the current folder"


def test_the_python_api_refuses_a_file_given_as_the_workdir(
    home: Path, runtime_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(home / "elsewhere")
    (home / "notes.txt").write_text("keep")
    for name, (call, error, field) in _api_calls(runtime_dir, home / "agent").items():
        if name in ("Ledger", "read_lineage"):
            continue  # a file is the ledger's own shape; lineage.json is read under it
        with pytest.raises(error) as raised:
            call(str(home / "notes.txt"))
        assert str(raised.value).startswith(field), (name, raised.value)
        assert "not a directory" in str(raised.value), (name, raised.value)
    assert (home / "notes.txt").read_text() == "keep"


def test_the_inbox_api_refuses_a_missing_or_file_workdir_naming_it(home: Path) -> None:
    """`peek` and `claim_all` on a folder that is not there, or on a file, raised the
    system's bare FileNotFoundError or NotADirectoryError, naming neither the field nor the
    fix: the `WorkdirError` the docs promise says both."""
    (home / "notes.txt").write_text("keep")
    for given in (home / "gone", home / "notes.txt", str(home / "gone" / "agent")):
        for call in (peek, lambda value: claim_all(value, "mcp")):
            with pytest.raises(WorkdirError) as raised:
                call(given)
            assert str(raised.value) == (
                f"workdir: {given} is not a directory; pass the agent's working directory"
            )
    assert not (home / "gone").exists()
    assert (home / "notes.txt").read_text() == "keep"


def test_the_python_api_names_a_loop_of_links_given_as_the_workdir(
    home: Path, runtime_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A folder in a loop of links was "cannot be used (Too many levels of symbolic links)"
    from `TaskCard` and "is not a directory" from the others, naming no link: each says it in
    the words of every command (`contract.link_loop`)."""
    monkeypatch.chdir(home / "elsewhere")
    (home / "a").symlink_to("b")
    (home / "b").symlink_to("a")
    loop = "a symbolic link that goes round a loop of symbolic links (to b); "
    for name, (call, error, field) in _api_calls(runtime_dir, home / "agent").items():
        if name in ("Ledger", "read_lineage", "peek", "claim_all"):
            continue  # they read a file under it: said as a file they cannot read
        with pytest.raises(error) as raised:
            call(str(home / "a"))
        message = str(raised.value)
        assert message.startswith(f"{field}{home / 'a'}") or message.startswith(
            f"{field}'{home / 'a'}'"  # the reports' errors quote the name
        ), (name, message)
        assert f" is {loop}" in message, (name, message)


def test_an_empty_ledger_option_is_refused_not_read_as_the_workdir(home: Path) -> None:
    done = _run(
        ["ledger", "init", "t1", "--purpose", "p", "--ledger", ""], str(home / "agent"), home
    )
    assert done.returncode == 2, done.stderr
    assert "ledger: is empty" in done.stderr and "Traceback" not in done.stderr
    assert not (home / "agent" / "ledger").exists()


@pytest.mark.parametrize("kind", ["dangling", "folder link", "loop", "unknown user"])
@pytest.mark.parametrize("command", ["report", "activity", "card settings"])
def test_a_workdir_behind_a_broken_link_or_unknown_home_is_said_as_such(
    tmp_path: Path, kind: str, command: str
) -> None:
    """A `--workdir` that is a link leading nowhere was "is not a directory" about a name
    `ls` shows; one in a loop of links, and `~user` of no known user, were both "cannot be
    expanded or resolved; give the full path", which named neither. Each says which."""
    gone = tmp_path / "gone"
    if kind == "dangling":
        (tmp_path / "agent").symlink_to(gone)
        given = str(tmp_path / "agent")
        says = f"{given} is a symbolic link that leads nowhere (to {gone}, which does not exist);"
    elif kind == "folder link":
        (tmp_path / "up").symlink_to(gone)
        given = str(tmp_path / "up" / "agent")
        says = (
            f"{given} is not a directory: the symbolic link {tmp_path / 'up'} on its path leads"
            f" nowhere (to {gone}, which does not exist);"
        )
    elif kind == "loop":
        (tmp_path / "a").symlink_to("b")
        (tmp_path / "b").symlink_to("a")
        given = str(tmp_path / "a")
        says = (
            f"{given} is a symbolic link that goes round a loop of symbolic links (to b); fix"
            " the links, or give the folder itself"
        )
    else:
        given = "~no-such-user-here/agent"
        says = f"{given!r} cannot be expanded (no such user); give the full path"
    (tmp_path / "elsewhere").mkdir()
    done = _run(COMMANDS[command][0], given, tmp_path)
    assert (done.returncode, done.stdout) == (2, ""), done.stderr
    assert done.stderr.startswith(f"taskcard {command}: argument --workdir: {says}"), done.stderr
    assert len(done.stderr.splitlines()) == 1
    assert not gone.exists()


def test_a_hook_workdir_behind_a_dangling_link_names_the_link(tmp_path: Path) -> None:
    """The hooks read `--workdir` as the commands do, and exit 0 (a hook never fails its
    agent): a link that leads nowhere was "is not a directory" there too."""
    gone = tmp_path / "gone"
    (tmp_path / "agent").symlink_to(gone)
    (tmp_path / "elsewhere").mkdir()
    done = _run(COMMANDS["hook claude-code"][0], str(tmp_path / "agent"), tmp_path)
    assert (done.returncode, done.stdout) == (0, ""), done.stderr
    assert done.stderr == (
        f"taskcard hook claude-code: argument --workdir: {tmp_path / 'agent'} is a symbolic"
        f" link that leads nowhere (to {gone}, which does not exist); pass the agent's working"
        " directory; nothing written\n"
    )
    assert not gone.exists()


async def test_a_spawn_refusal_names_the_childs_folder_as_each_way_in_calls_it(
    home: Path, runtime_dir: Path
) -> None:
    """The child's folder is `--workdir` to `taskcard spawn`, `child_workdir` to the MCP
    tool and `child` to `spawn()`. From Python the refusal said "workdir:", a parameter
    `spawn` does not have; each way in now names the one its caller typed."""
    gone = home / "gone"
    done = _run(["spawn", "--parent", "p0", "--reason", "r"], str(gone), home)
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith(f"taskcard spawn: --workdir: '{gone}' is not a directory")
    async with mcp_session(home / "agent", runtime_dir, (TASKCARD,)) as session:
        result = await session.call_tool("spawn", {"child_workdir": str(gone), "reason": "r"})
    assert isinstance(result.structured_content, dict), result
    said = result.structured_content["message"]
    assert said.startswith(f"child_workdir: '{gone}' is not a directory"), said
    for given in (gone, ""):
        with pytest.raises(LineageError) as raised:
            spawn(given, parent="p0", reason="r")  # type: ignore[arg-type]
        assert str(raised.value).startswith("child: "), raised.value
    with pytest.raises(LineageError) as raised:
        spawn(child=gone, parent="p0", reason="r")  # the name the refusal gives works
    assert str(raised.value).startswith(f"child: '{gone}' is not a directory"), raised.value
    assert not gone.exists()
