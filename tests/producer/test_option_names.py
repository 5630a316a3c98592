"""Every refusal of `taskcard ledger` and `taskcard spawn` starts with the option a person
types (`--kind: ...`, `--max-depth: ...`), not the field's name the store writes (`kind:`,
`max_depth:`): the docs promise that command line errors name the option. Each option is
given a bad value through the command line as a subprocess; the MCP tools keep their field
names and the Python APIs their parameters (`tool_failure.worded`, one wording for all)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from taskcard.producers.ledger.mcp_tool import call_ledger
from taskcard.producers.ledger.store import Ledger, LedgerError
from taskcard.producers.reports.lineage import LineageError, spawn
from taskcard.producers.reports.mcp_tool import call_spawn
from taskcard.producers.reports.store import ReportError, Reports
from taskcard.producers.task_card.runtime import HostPaths
from tests.conftest import mcp_session

LONG = "x" * 501  # over every text's 500 characters
CHECKPOINT = ("checkpoint", "t", "--event-type")
# (the command's arguments, the option its refusal must start with)
LEDGER_CASES = [
    (["init", "u", "--purpose", " "], "--purpose"),
    (["init", "u", "--purpose", LONG], "--purpose"),
    (["init", "u", "--purpose", "p", "--steps", "a,,b"], "--steps"),
    (["init", "u", "--purpose", "p", "--steps", "a b"], "--steps"),
    (["init", "u", "--purpose", "p", "--steps", "a,a"], "--steps"),
    *(
        (["init", "u", "--purpose", "p", option, "-1"], option)
        for option in (
            "--nudge-after-sec",
            "--timeout-sec",
            "--heartbeat-every-sec",
            "--renotify-sec",
            "--external-max-wait-sec",
            "--max-nudges",
            "--max-retries",
        )
    ),
    ([*CHECKPOINT, "STEP_PROGRESS", "--step", "zz"], "--step"),
    ([*CHECKPOINT, "STEP_PROGRESS", "--step", "a", "--note", LONG], "--note"),
    ([*CHECKPOINT, "STEP_PROGRESS", "--step", "a", "--artifact", "out"], "--artifact"),
    (
        [*CHECKPOINT, "BLOCKED_CONFIRMED", "--kind", "OTHER", "--reason", "r", "--note", "n"],
        "--note",
    ),
    (
        [*CHECKPOINT, "EXTERNAL_OBSERVED", "--new-step", "--job-id", "j", "--status", "running"],
        "--step",
    ),
    ([*CHECKPOINT, "OWNER_REPLY_RECORDED"], "--reply"),
    # An option another event type takes, each of them.
    *(
        ([*CHECKPOINT, "STARTED", option, *value], option)
        for option, *value in (
            ("--kind", "OTHER"),
            ("--reason", "r"),
            ("--safe-next-step", "s"),
            ("--failed",),
            ("--reply", "A"),
            ("--job-id", "j"),
            ("--status", "running"),
            ("--provider", "p"),
            ("--evidence", "e"),
            ("--max-wait-sec", "5"),
            ("--name", "d"),
            ("--bytes", "5"),
            ("--expected-bytes", "5"),
            ("--complete",),
            ("--corrupt",),
        )
    ),
    (["block", "t", "--reason", "r"], "--kind"),
    (["block", "t", "--kind", "OTHER"], "--reason"),
    (
        ["block", "t", "--kind", "OTHER", "--reason", "r", "--safe-next-step", LONG],
        "--safe-next-step",
    ),
    (["block", "t", "--kind", "OTHER", "--reason", "r", "--step", "zz"], "--step"),
    (["external-job", "t", "--job-id", "a b", "--status", "running"], "--job-id"),
    (["external-job", "t", "--job-id", "j"], "--status"),
    (
        ["external-job", "t", "--job-id", "j", "--status", "running", "--provider", " "],
        "--provider",
    ),
    (
        ["external-job", "t", "--job-id", "j", "--status", "running", "--evidence", " "],
        "--evidence",
    ),
    (
        ["external-job", "t", "--job-id", "j", "--status", "running", "--max-wait-sec", "-1"],
        "--max-wait-sec",
    ),
    (["download-observed", "t", "--name", "a b", "--bytes", "1"], "--name"),
    (["download-observed", "t", "--name", "d", "--bytes", "-1"], "--bytes"),
    (
        ["download-observed", "t", "--name", "d", "--bytes", "1", "--expected-bytes", "-1"],
        "--expected-bytes",
    ),
    (["owner-reply", "t", "--reply", "B"], "--reason"),
    (["owner-reply", "t", "--reply", "A", "--kind", "OTHER"], "--kind"),
    (["owner-reply", "t", "--reply", "A", "--note", LONG], "--note"),
    (["heartbeat", "t", "--note", LONG], "--note"),
    (["show", "t", "--ledger", "."], "--ledger"),
]
# A field's name as the store writes it, first in a message: none may reach the command line.
FIELD_FIRST = re.compile(r"^taskcard (?:ledger|spawn): [a-z][a-z_]*: ")


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "taskcard.bridge.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def refused_naming(done: subprocess.CompletedProcess[str], option: str) -> None:
    assert done.returncode == 2, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert not FIELD_FIRST.match(lines[0]), lines[0]
    # The store's refusals, and argparse's (`argument --kind: ...`) alike.
    said = re.match(r"^taskcard [a-z -]+: (?:argument )?(--[a-z-]+)(?:/-\w)?: ", lines[0])
    assert said is not None and said[1] == option, lines[0]


@pytest.mark.parametrize(("args", "option"), LEDGER_CASES)
def test_every_ledger_command_line_refusal_starts_with_the_option(
    workdir: Path, args: list[str], option: str
) -> None:
    ok = run("ledger", "init", "t", "--purpose", "p", "--steps", "a,b", "--workdir", str(workdir))
    assert ok.returncode == 0, ok.stderr
    refused_naming(run("ledger", *args, "--workdir", str(workdir)), option)


@pytest.mark.parametrize(
    ("args", "option"),
    [
        (["--parent", "a b", "--reason", "r"], "--parent"),
        (["--parent", "p", "--reason", " "], "--reason"),
        (["--parent", "p", "--reason", "x" * 1001], "--reason"),
        (["--parent", "p", "--reason", "r", "--provider", "!!"], "--provider"),
        (["--parent", "p", "--reason", "r", "--max-depth", "0"], "--max-depth"),
        (["--parent", "p", "--reason", "r", "--max-depth", "33"], "--max-depth"),
        (["--parent", "p", "--reason", "r", "--parent-workdir", "CHILD"], "--parent-workdir"),
        (["--parent", "p", "--reason", "r", "--parent-workdir", "PARENT"], "--workdir"),
    ],
)
def test_every_spawn_command_line_refusal_starts_with_the_option(
    workdir: Path, args: list[str], option: str
) -> None:
    child = workdir / "child"
    child.mkdir()
    # PARENT: the child's own folder sits above the parent's (it would hold its parent).
    parent = child / "parent"
    parent.mkdir()
    given = [{"CHILD": str(child), "PARENT": str(parent)}.get(arg, arg) for arg in args]
    refused_naming(run("spawn", "--workdir", str(child), *given), option)


def test_a_spawn_over_the_cap_names_the_cap_as_each_way_in_spells_it(workdir: Path) -> None:
    child = workdir / "child"
    child.mkdir()
    (workdir / "lineage.json").write_text('{"parent": "root", "depth": 1}')
    done = run(
        *("spawn", "--workdir", str(child), "--parent", "p", "--reason", "r"),
        *("--parent-workdir", str(workdir), "--max-depth", "1"),
    )
    assert done.returncode == 2
    assert "raise the cap (--max-depth)" in done.stderr, done.stderr
    with pytest.raises(LineageError, match=r"raise the cap \(max_depth=\)"):
        spawn(child, parent="p", reason="r", parent_workdir=workdir, max_depth=1)
    over_mcp = call_spawn(
        HostPaths(workdir, workdir), {"child_workdir": "child", "reason": "r", "max_depth": 1}
    )
    assert over_mcp["message"].endswith("raise the cap (max_depth)"), over_mcp


def test_mcp_keeps_the_fields_and_python_the_parameters(workdir: Path) -> None:
    """The same refusals over MCP and from Python: the field, and the parameter."""
    answer = call_ledger(
        HostPaths(workdir, workdir),
        {"command": "init", "task_id": "t", "purpose": "p", "max_nudges": -1},
    )
    assert answer["message"].startswith("max_nudges: "), answer
    ledger = Ledger(workdir / "ledger.json")
    ledger.init("t", "p", ["a"])
    with pytest.raises(
        LedgerError,
        match=r"^kind: not taken by a STARTED checkpoint; remove it \(it takes step=, note=\)$",
    ):
        ledger.checkpoint("t", "STARTED", kind="OTHER")
    with pytest.raises(LedgerError, match=r"\(it takes name=, observed_bytes=, expected_bytes="):
        ledger.checkpoint("t", "DOWNLOAD_OBSERVED", name="d", observed_bytes=1, kind="OTHER")
    answer = call_ledger(
        HostPaths(workdir, workdir),
        {"command": "checkpoint", "task_id": "t", "event_type": "STARTED", "kind": "OTHER"},
    )
    assert answer["message"] == (
        "kind: not taken by a STARTED checkpoint; remove it (it takes step, note)"
    ), answer
    with pytest.raises(LineageError, match=r"^max_depth: must be"):
        spawn(workdir, parent="p", reason="r", max_depth=0)
    with pytest.raises(LineageError, match=r"^child: "):
        spawn(workdir / "gone", parent="p", reason="r")
    answer = call_spawn(HostPaths(workdir, workdir), {"child_workdir": "gone", "reason": "r"})
    assert answer["message"].startswith("child_workdir: "), answer


@pytest.mark.parametrize(
    ("args", "field"),
    [
        (["--role", "!!"], "role"),
        (["--summary", " "], "summary"),
        (["--summary", "x" * 2001], "summary"),
    ],
)
async def test_a_report_refusal_names_the_option_on_the_command_line_only(
    workdir: Path, runtime_dir: Path, args: list[str], field: str
) -> None:
    """`taskcard report --role '!!'` said "role: 1-64 letters ...": the rule is the option as
    typed on the command line, as `ledger` and `spawn` say theirs. The MCP tool and the
    Python API keep the field, which is their argument's and parameter's name."""
    done = run("report", "--workdir", str(workdir), "--ok", *args)
    refused_naming(done, f"--{field}")
    words = done.stderr.strip().removeprefix(f"taskcard report: --{field}: ")
    async with mcp_session(workdir, runtime_dir) as session:
        result = await session.call_tool("report", {"ok": True, field: args[1]})
    assert isinstance(result.structured_content, dict), result
    assert result.structured_content["code"] == "bad_envelope", result.structured_content
    assert result.structured_content["message"] == f"{field}: {words}"
    with pytest.raises(ReportError) as raised:
        Reports(workdir).add(ok=True, **{field: args[1]})
    assert str(raised.value) == f"{field}: {words}"
    assert not (workdir / "reports" / "reports.jsonl").exists()
