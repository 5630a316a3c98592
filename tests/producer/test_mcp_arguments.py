"""Argument names the MCP tools do not know: a clear error naming the field, for every tool.

Driven with the SDK's real stdio client against `taskcard mcp`. An argument named `self`
used to reach `Reports.add` as a keyword, clash with the method's own `self`, and come back
as "ok: required" although `ok` was given.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest

from taskcard.producers.reports import ReportError, Reports
from taskcard.producers.task_card import TaskCard

from .conftest import CliHost

# One valid-looking call per tool; each test adds a stray argument to it.
VALID_CALLS: dict[str, dict[str, Any]] = {
    "task_card": {"action": "settings", "input": {}, "reasoning": "check"},
    "ledger": {"command": "heartbeat", "task_id": "t1"},
    "report": {"ok": True, "summary": "done"},
    "reports": {"after": 0},
    "spawn": {"child_workdir": "child", "reason": "lint"},
    "inbox": {"peek": True},
}


async def test_a_stray_argument_is_refused_by_every_tool_naming_it(
    workdir: Path, cli: CliHost
) -> None:
    (workdir / "child").mkdir()
    async with cli.mcp() as session:
        listed = {tool.name for tool in (await session.list_tools()).tools}
        assert listed == set(VALID_CALLS), "every tool of the server is covered here"
        for name, arguments in VALID_CALLS.items():
            for stray in ("self", "cls", "arguments", "colour"):
                result = await session.call_tool(name, {**arguments, stray: 1})
                content = result.structured_content
                assert result.is_error and isinstance(content, dict), (name, stray)
                assert content["message"].startswith(f"{stray}: not a field of {name}"), content
        # Nothing was recorded by the refused calls; a clean report still works.
        assert not (workdir / "reports").exists()
        assert not (workdir / "child" / "lineage.json").exists()
        result = await session.call_tool("report", {"ok": True})
        assert not result.is_error and isinstance(result.structured_content, dict)
        assert result.structured_content["seq"] == 1
        missing = await session.call_tool("report", {"summary": "no outcome"})
        assert isinstance(missing.structured_content, dict)
        assert missing.structured_content["message"].startswith("ok: required")


@pytest.mark.parametrize("stray", ["self", "colour"])
def test_the_python_api_names_a_stray_report_field(workdir: Path, stray: str) -> None:
    with pytest.raises(ReportError, match=f"^{stray}: not a report field"):
        Reports(workdir).add(ok=True, **{stray: 1})


LONG = "x" * 100_000
# A call per tool with a long value where a short one belongs, and the field it must name.
LONG_VALUES: list[tuple[str, dict[str, Any], str]] = [
    ("task_card", {"action": "inspect", "input": {"watch_id": LONG}, "reasoning": "r"}, "watch_id"),
    (
        "task_card",
        {"action": "start", "input": {"renderer_path": LONG}, "reasoning": "r"},
        "renderer_path",
    ),
    (
        "task_card",
        {
            "action": "start",
            "input": {"renderer_path": "r.py", "interval_s": LONG},
            "reasoning": "r",
        },
        "input.interval_s",
    ),
    ("task_card", {"action": LONG[:5000], "input": {}, "reasoning": "r"}, "action"),
    ("ledger", {"command": "init", "task_id": LONG, "purpose": "p"}, "task_id"),
    ("ledger", {"command": LONG}, "command"),
    ("spawn", {"child_workdir": LONG, "reason": "lint"}, "child_workdir"),
    ("spawn", {"child_workdir": "missing/" + LONG[:200], "reason": "lint"}, "child_workdir"),
    ("reports", {"child_workdir": LONG}, "child_workdir"),
    ("reports", {"child_workdir": "missing/" + LONG[:200]}, "child_workdir"),
]


async def test_a_long_value_is_named_not_echoed_whole(workdir: Path, cli: CliHost) -> None:
    """A 100,000-character id or path came back whole in the error, twice in the result (its
    text and its structured content), and a child folder name too long for the system was
    "cannot write lineage.json": the error names the field and quotes the start of the value."""
    async with cli.mcp() as session:
        for name, arguments, field in LONG_VALUES:
            result = await session.call_tool(name, arguments)
            content = result.structured_content
            assert result.is_error and isinstance(content, dict), (name, field)
            assert content["message"].startswith(f"{field}: "), content["message"][:200]
            assert len(content["message"]) < 1000, (field, content["message"][:200])
    assert not (workdir / "taskcard" / "watch.json").exists()
    assert not (workdir / "ledger").exists()


async def test_spawn_errors_name_its_own_field_and_the_file_it_cannot_write(
    workdir: Path, cli: CliHost
) -> None:
    """`spawn` of the server's own workdir was refused naming `parent_workdir`, a field the
    tool does not have; a folder in the way at the child's lineage.json was "cannot write
    lineage.json: Is a directory", naming neither the field, the file nor the fix; a blank one
    was told to give "." (for this one), the parent's own workdir, refused in turn."""
    blocked = workdir / "child"
    (blocked / "lineage.json").mkdir(parents=True)
    async with cli.mcp() as session:
        for own in (".", str(workdir), "../agent"):
            result = await session.call_tool("spawn", {"child_workdir": own, "reason": "lint"})
            content = result.structured_content
            assert result.is_error and isinstance(content, dict), own
            assert content["message"].startswith("child_workdir: is your own workdir"), content
        for blank in ("", "  "):  # told to give the child's folder, never "." (its own)
            result = await session.call_tool("spawn", {"child_workdir": blank, "reason": "lint"})
            content = result.structured_content
            assert result.is_error and isinstance(content, dict), blank
            assert content["message"].startswith("child_workdir: is empty; give the child's")
            assert ": ." not in content["message"], content
        result = await session.call_tool("spawn", {"child_workdir": "child", "reason": "lint"})
        content = result.structured_content
        assert result.is_error and isinstance(content, dict)
        path = blocked / "lineage.json"
        assert content["message"].startswith(f"child_workdir: cannot write {path} ("), content
        assert "move what is in the way aside" in content["message"], content
    assert not (workdir / "lineage.json").exists()
    assert (blocked / "lineage.json").is_dir()


def test_the_spawn_command_names_the_lineage_file_it_cannot_write(workdir: Path) -> None:
    blocked = workdir / "child"
    (blocked / "lineage.json").mkdir(parents=True)
    done = subprocess.run(
        [sys.executable, "-m", "taskcard.bridge.cli", "spawn", "--workdir", str(blocked),
         "--parent", "agent", "--reason", "lint"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 1, done.stderr
    path = blocked / "lineage.json"
    assert done.stderr.startswith(f"taskcard spawn: --workdir: cannot write {path} ("), done.stderr
    assert done.stderr.count("\n") == 1, done.stderr


# Every optional field of every tool, given as null (a client's way of leaving it empty).
NULL_OPTIONALS: dict[str, dict[str, Any]] = {
    "task_card": {
        "action": "settings",
        "input": {},
        "reasoning": "check",
        "summarize": None,
    },
    "ledger": {"command": "show", "task_id": None},
    "report": {"ok": True, "verdict": None, "role": None, "summary": None, "payload": None},
    "spawn": {
        "child_workdir": "child",
        "reason": "lint",
        "provider": None,
        "parent": None,
        "max_depth": None,
    },
    "inbox": {"peek": None},
}


async def test_a_null_is_a_field_left_out_by_every_tool(workdir: Path, cli: CliHost) -> None:
    """`report` and `ledger` took a null as left out, while `spawn` refused a null `parent`
    (it has a default), `inbox` a null `peek` and `task_card` a null `summarize`. Now every
    tool leaves a null out, and a required field given as null is refused as missing."""
    (workdir / "child").mkdir()
    async with cli.mcp() as session:
        created = await session.call_tool(
            "ledger", {"command": "init", "task_id": "t", "purpose": "p"}
        )
        assert not created.is_error
        for name, arguments in NULL_OPTIONALS.items():
            result = await session.call_tool(name, arguments)
            assert not result.is_error, (name, result.structured_content)
        spawned = json.loads((workdir / "child" / "lineage.json").read_text())
        assert spawned["parent"] == workdir.name and spawned["depth"] == 1
        for name, field, arguments in [
            ("report", "ok", {"ok": None, "summary": "done"}),
            ("spawn", "reason", {"child_workdir": "child", "reason": None}),
            ("task_card", "reasoning", {"action": "settings", "input": {}, "reasoning": None}),
        ]:
            result = await session.call_tool(name, arguments)
            content = result.structured_content
            assert result.is_error and isinstance(content, dict), (name, field)
            assert content["message"].startswith(f"{field}: required"), content


def test_the_tool_command_takes_a_null_summarize_as_left_out(cli: CliHost) -> None:
    """The same envelope through `taskcard tool` (the host's own check, which the Python API
    shares): a null `summarize` is left out; an input field's null is quoted as null."""
    done = cli.run(
        "tool", stdin='{"action":"settings","input":{},"reasoning":"r","summarize":null}'
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert json.loads(done.stdout)["status"] == "ok"
    refused = cli.run(
        "tool", stdin='{"action":"inspect","input":{"watch_id":null},"reasoning":"r"}'
    )
    message = json.loads(refused.stdout)["message"]
    assert message.startswith("input.watch_id: ") and "got null" in message, message


async def test_the_envelope_size_limit_counts_bytes_on_every_way_in(
    tmp_path: Path, workdir: Path, cli: CliHost, runtime_dir: Path
) -> None:
    """An envelope of 140,000 'é' (280,000 bytes, over the 256 KiB limit) was refused by
    `taskcard tool` and taken over MCP and from Python, which counted characters."""
    envelope = {"action": "settings", "input": {}, "reasoning": "é" * 140_000}
    refusal = "over the 262144-byte limit; send a short envelope"
    done = cli.run("tool", stdin=json.dumps(envelope, ensure_ascii=False))
    assert done.returncode == 2 and refusal in json.loads(done.stdout)["message"]
    async with cli.mcp() as session:
        result = await session.call_tool("task_card", envelope)
        content = result.structured_content
        assert result.is_error and isinstance(content, dict)
        assert content["message"].startswith(f"envelope: {refusal}"), content["message"][:200]
    other = tmp_path / "python-agent"
    other.mkdir()
    with TaskCard(other, runtime_dir=runtime_dir) as card:
        assert card.call(envelope)["message"].startswith(f"envelope: {refusal}")
        # Under the limit in bytes, the same text is taken.
        assert card.call({**envelope, "reasoning": "é" * 100_000})["status"] == "ok"


# Something in the way of a report's files, and the path its refusal must name.
REPORT_OBSTACLES: list[tuple[str, str]] = [
    ("reports/.lock", "reports/.lock (Is a directory)"),
    ("reports/payloads", "reports/payloads (Not a directory)"),
]


async def test_a_report_that_cannot_be_written_names_the_file_in_the_way(
    tmp_path: Path, cli: CliHost, runtime_dir: Path
) -> None:
    """The report tool and `taskcard report` said "cannot write reports/: Is a directory"
    for a folder at reports/.lock: not which file, nor the fix."""
    for obstacle, named in REPORT_OBSTACLES:
        workdir = tmp_path / obstacle.replace("/", "_")
        (workdir / "reports").mkdir(parents=True)
        if obstacle.endswith(".lock"):
            (workdir / obstacle).mkdir()
        else:
            (workdir / obstacle).write_text("the agent's notes\n")
        async with CliHost(workdir, runtime_dir).mcp() as session:
            result = await session.call_tool("report", {"ok": True, "payload": "details"})
            content = result.structured_content
            assert result.is_error and isinstance(content, dict), obstacle
            assert content["message"] == (
                f"cannot write {named}; move what is in the way aside or make it writable"
            ), content
        done = await anyio.to_thread.run_sync(
            lambda w=workdir: subprocess.run(
                [sys.executable, "-m", "taskcard.bridge.cli", "report", "--workdir", str(w),
                 "--ok", "--payload", "-"],
                input="details", capture_output=True, text=True, timeout=120, check=False,
            )
        )  # fmt: skip
        assert done.returncode == 1, done.stderr
        fix = "move what is in the way aside or make it writable"
        assert done.stderr == f"taskcard report: cannot write {named}; {fix}\n"
        assert not (workdir / "reports" / "reports.jsonl").exists()


MEGABYTE = "x" * 1_000_000
# A task_card call with 1 MB of text in one field, and that field's name.
HUGE_TEXTS: list[tuple[dict[str, Any], str]] = [
    ({"action": "settings", "input": {}, "reasoning": MEGABYTE}, "reasoning"),
    ({"action": MEGABYTE, "input": {}, "reasoning": "r"}, "action"),
    (
        {"action": "start", "input": {"renderer_path": MEGABYTE}, "reasoning": "r"},
        "input.renderer_path",
    ),
    ({"action": "inspect", "input": {"watch_id": MEGABYTE}, "reasoning": "r"}, "input.watch_id"),
]


async def test_an_envelope_over_the_limit_names_the_field_that_filled_it(
    workdir: Path, cli: CliHost
) -> None:
    """A 1 MB `reasoning` (or path, or id) was refused as "envelope: over the 262144-byte
    limit" alone: the caller had to guess which field to cut. The field is now named."""
    async with cli.mcp() as session:
        for arguments, field in HUGE_TEXTS:
            result = await session.call_tool("task_card", arguments)
            content = result.structured_content
            assert result.is_error and isinstance(content, dict), field
            message = content["message"]
            assert message.startswith("envelope: over the 262144-byte limit"), message[:200]
            assert message.endswith(f"; {field} is 1000000 bytes"), message[:300]
            assert len(message) < 300, message[:300]
    assert not (workdir / "taskcard" / "watch.json").exists()


# A text field of each tool with a NUL in it, and the field the refusal must name.
NUL_TEXTS: list[tuple[str, dict[str, Any], str]] = [
    ("task_card", {"action": "settings", "input": {}, "reasoning": "a\0b"}, "envelope: reasoning"),
    ("report", {"ok": True, "summary": "done\0"}, "summary"),
    ("spawn", {"child_workdir": "child", "reason": "lint\0"}, "reason"),
    ("ledger", {"command": "init", "task_id": "n", "purpose": "p\0"}, "purpose"),
    ("ledger", {"command": "heartbeat", "task_id": "t", "note": "\0"}, "note"),
    (
        "ledger",
        {"command": "block", "task_id": "t", "kind": "OTHER", "reason": "r\0"},
        "reason",
    ),
    (
        "ledger",
        {
            "command": "external-job",
            "task_id": "t",
            "job_id": "j",
            "status": "running",
            "evidence": "e\0",
        },
        "evidence",
    ),
]


async def test_a_nul_in_any_text_is_refused_by_every_tool(workdir: Path, cli: CliHost) -> None:
    """`task_card` refused a NUL anywhere in its envelope, while `report` stored one in its
    summary, `spawn` in the reason and `ledger` in a purpose or note: every tool refuses it
    now, naming the field, and records nothing."""
    (workdir / "child").mkdir()
    async with cli.mcp() as session:
        created = await session.call_tool(
            "ledger", {"command": "init", "task_id": "t", "purpose": "p"}
        )
        assert not created.is_error
        ledger = workdir / "ledger" / "long-task-ledger.json"
        before = ledger.read_bytes()
        for name, arguments, field in NUL_TEXTS:
            result = await session.call_tool(name, arguments)
            content = result.structured_content
            assert result.is_error and isinstance(content, dict), (name, field)
            assert content["message"].startswith(f"{field}: contains a NUL"), content
        assert ledger.read_bytes() == before
    assert not (workdir / "reports").exists()
    assert not (workdir / "child" / "lineage.json").exists()
