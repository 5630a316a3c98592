"""The ledger's refusals in one wording on every way in: the command line as a subprocess,
the `ledger` tool over MCP (the SDK's stdio client) and the Python API. Only the names of
the fields differ (`--max-nudges`, `max_nudges`), as `tool_failure.worded` says them.

Before: an option of another event type was "not taken by a STARTED checkpoint" from the
command line and Python but "not a field of checkpoint STARTED" over MCP; a limit of `init`
out of range said pydantic's "Input should be less than or equal to 1000" after the option,
without the unit, the other bound or the fix.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from taskcard.producers.ledger.store import Ledger, LedgerError
from tests.conftest import TASKCARD_MODULE, mcp_session

LEDGER = "ledger/long-task-ledger.json"


def cli(workdir: Path, *args: str) -> str:
    """The one line `taskcard ledger` refuses `args` with (exit 2), its prefix dropped."""
    done = subprocess.run(
        [*TASKCARD_MODULE, "ledger", *args, "--workdir", str(workdir)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 2, (args, done.stdout, done.stderr)
    [line] = done.stderr.splitlines()
    assert line.startswith("taskcard ledger: "), line
    return line.removeprefix("taskcard ledger: ")


def python(workdir: Path, method: str, *args: Any, **kwargs: Any) -> str:
    with pytest.raises(LedgerError) as raised:
        getattr(Ledger(workdir / LEDGER), method)(*args, **kwargs)
    return str(raised.value)


async def over_mcp(workdir: Path, runtime_dir: Path, calls: list[dict[str, Any]]) -> list[str]:
    """The message of each refused call of the `ledger` tool."""
    said = []
    async with mcp_session(workdir, runtime_dir) as session:
        for arguments in calls:
            result = await session.call_tool("ledger", arguments)
            content = result.structured_content
            assert result.is_error and isinstance(content, dict), (arguments, content)
            assert content["code"] == "bad_envelope", content
            said.append(str(content["message"]))
    return said


async def test_an_option_of_another_event_type_is_refused_in_one_wording(
    workdir: Path, runtime_dir: Path
) -> None:
    Ledger(workdir / LEDGER).init("t", "p", ["a"])
    before = (workdir / LEDGER).read_bytes()
    checkpoint = {"command": "checkpoint", "task_id": "t"}
    said_mcp = await over_mcp(
        workdir,
        runtime_dir,
        [
            {**checkpoint, "event_type": "STARTED", "kind": "OTHER"},
            {**checkpoint, "event_type": "EXTERNAL_OBSERVED", "job_id": "j", "name": "d"},
        ],
    )
    assert said_mcp == [
        "kind: not taken by a STARTED checkpoint; remove it (it takes step, note)",
        "name: not taken by an EXTERNAL_OBSERVED checkpoint; remove it (it takes job_id, status,"
        " provider, evidence, max_wait_sec)",
    ]
    assert cli(workdir, "checkpoint", "t", "--event-type", "STARTED", "--kind", "OTHER") == (
        "--kind: not taken by a STARTED checkpoint; remove it (it takes --step, --note)"
    )
    assert cli(
        workdir,
        "checkpoint",
        "t",
        "--event-type",
        "EXTERNAL_OBSERVED",
        "--job-id",
        "j",
        "--name",
        "d",
    ) == (
        "--name: not taken by an EXTERNAL_OBSERVED checkpoint; remove it (it takes --job-id,"
        " --status, --provider, --evidence, --max-wait-sec)"
    )
    assert python(workdir, "checkpoint", "t", "STARTED", kind="OTHER") == (
        "kind: not taken by a STARTED checkpoint; remove it (it takes step=, note=)"
    )
    assert (workdir / LEDGER).read_bytes() == before


# (the limit's field, a value out of range, what it must be, its default)
LIMITS = [
    ("max_nudges", 1001, "a whole number from 0 to 1000", "2"),
    ("max_retries", -1, "a whole number from 0 to 1000", "1"),
    ("timeout_sec", 0, "a number of seconds above 0, at most 315360000 (ten years)", "7200"),
    ("nudge_after_sec", 1e12, "a number of seconds above 0, at most 315360000 (ten years)", "1800"),
    ("heartbeat_every_sec", -1, "a number of seconds from 0 to 315360000 (ten years)", "300"),
]


async def test_a_limit_out_of_range_is_said_in_the_ledgers_words(
    workdir: Path, runtime_dir: Path
) -> None:
    init = {"command": "init", "task_id": "t", "purpose": "p"}
    said_mcp = await over_mcp(
        workdir, runtime_dir, [{**init, field: value} for field, value, _, _ in LIMITS]
    )
    for (field, value, rule, default), over in zip(LIMITS, said_mcp, strict=True):
        shown = str(int(value))
        words = f"must be {rule}, not {shown}; give one in that range, or leave it out for the"
        words += f" default, {default}"
        assert over == f"{field}: {words}", over
        option = "--" + field.replace("_", "-")
        assert cli(workdir, "init", "t", "--purpose", "p", option, shown) == f"{option}: {words}"
        assert python(workdir, "init", "t", "p", **{field: value}) == f"{field}: {words}"
    assert not (workdir / LEDGER).exists()
    # A job's own limit keeps the range of the task's, and says where that comes from.
    Ledger(workdir / LEDGER).init("t", "p")
    rule = "must be a number of seconds above 0, at most 315360000 (ten years), not 0; give the"
    rule += " seconds the job may take, or leave it out for the task's limit"
    [job] = await over_mcp(
        workdir,
        runtime_dir,
        [
            {"command": "external-job", "task_id": "t", "job_id": "j", "status": "running"}
            | {"max_wait_sec": 0}
        ],
    )
    assert job == f"max_wait_sec: {rule} (external_max_wait_sec, set at init)"
    assert cli(
        workdir, "external-job", "t", "--job-id", "j", "--status", "running", "--max-wait-sec", "0"
    ) == (f"--max-wait-sec: {rule} (--external-max-wait-sec, set at init)")
    assert python(workdir, "external_job", "t", job_id="j", status="running", max_wait_sec=0) == (
        f"max_wait_sec: {rule} (external_max_wait_sec=, set at init)"
    )


async def test_a_file_where_the_ledger_folder_belongs_is_said_alike_by_every_write(
    workdir: Path, runtime_dir: Path
) -> None:
    """A file at `ledger/`: the command line refused it naming the file in the way (exit 2),
    while a write over MCP said "cannot write .../ledger (File exists)" (`write_failed`) and
    `Ledger.init` raised a bare `FileExistsError`. Now all three say what a read says,
    `unusable_file`, and the file is left alone."""
    in_the_way = workdir / "ledger"
    in_the_way.write_text("notes\n")
    said = (
        f"{in_the_way}/long-task-ledger.json goes through a file as if it were a folder"
        f" ({in_the_way} is a file); "
    )
    # The command line names the default ledger as that (no --ledger was typed), and MCP's
    # fix is to move the file: neither can give another path (a ledger over MCP is always
    # the default one; the command line may, with --ledger).
    assert cli(workdir, "init", "t", "--purpose", "p") == (
        f"the workdir's default ledger {said}move that file aside, or give another ledger"
        " file with --ledger"
    )
    async with mcp_session(workdir, runtime_dir) as session:
        result = await session.call_tool(
            "ledger", {"command": "init", "task_id": "t", "purpose": "p"}
        )
    assert result.structured_content == {
        "status": "failed",
        "code": "unusable_file",
        "message": f"ledger {said}move that file aside",
    }
    with pytest.raises(LedgerError) as raised:
        Ledger(workdir / LEDGER).init("t", "p")
    said += "give a path in a folder"
    assert (str(raised.value), raised.value.code) == (f"ledger {said}", "unusable_file")
    assert in_the_way.read_text() == "notes\n"
