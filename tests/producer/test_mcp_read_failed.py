"""A read the system fails (EIO) answers `code: read_failed` from the report, reports and
inbox tools too, naming the file, the errno and the fix, as the ledger and spawn tools do;
and a `lineage.json` that is a symbolic link leading nowhere is a broken record, as a loop
of links is.

Driven with the SDK's real stdio client against `taskcard mcp`, whose `os.open` of the
file fails with EIO (`failing_open`: no file system fails on demand). Before: `report`
answered a failed read of `reports/reports.jsonl` as `write_failed` ("cannot write ...; move
what is in the way aside"), `reports` named the folder without the errno or a fix, and the
inbox said "cannot read the inbox: Input/output error", or, for a message file, nothing
(it was skipped as if claimed meanwhile). A `lineage.json` linked to nothing read as no
lineage: the parent counted as a root, and its child escaped the depth cap.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
from mcp import ClientSession

from taskcard.producers.reports import LineageError, Reports, read_lineage
from tests.conftest import failing_open, mcp_session
from tests.inbox.conftest import queue

from .test_reports import taskcard

FIX = "nothing is wrong with the name: call again, and if it keeps failing, check the file"


async def call(session: ClientSession, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
    result = await session.call_tool(tool, arguments)
    content = result.structured_content
    assert isinstance(content, dict), result
    assert result.is_error == (content["status"] == "failed"), result
    return content


async def test_report_and_reports_answer_a_failed_read_as_read_failed(
    workdir: Path, runtime_dir: Path
) -> None:
    Reports(workdir, channel="python").add(ok=True, summary="first")
    written = (workdir / "reports" / "reports.jsonl").read_bytes()
    faulty = failing_open("reports/reports.jsonl", reads_only=True)
    async with mcp_session(workdir, runtime_dir, faulty) as session:
        for tool, arguments in (("report", {"ok": True, "summary": "second"}), ("reports", {})):
            answer = await call(session, tool, arguments)
            assert answer["code"] == "read_failed", (tool, answer)
            said = answer["message"]
            assert said.startswith(
                "reports/reports.jsonl: cannot read it (Input/output error, EIO); " + FIX
            ), (tool, said)
    assert (workdir / "reports" / "reports.jsonl").read_bytes() == written  # nothing added


def test_report_and_reports_exit_1_for_a_failed_read(workdir: Path) -> None:
    """The system's failure exits 1, as a failed write does; it was 2, the code of input to
    mend, or (for `report`) 1 with "cannot write"."""
    Reports(workdir, channel="python").add(ok=True, summary="first")
    faulty = failing_open("reports/reports.jsonl", reads_only=True)
    for command in (("report", "--ok", "--summary", "s"), ("reports",)):
        done = subprocess.run(
            [*faulty, *command, "--workdir", str(workdir)],
            capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        assert done.returncode == 1, done
        assert "reports/reports.jsonl: cannot read it (Input/output error, EIO)" in done.stderr


async def test_the_inbox_names_a_folder_or_message_whose_read_failed(
    workdir: Path, runtime_dir: Path
) -> None:
    queue(workdir, "m1", "hello")
    message_fails = failing_open("m1.json", reads_only=True)
    async with mcp_session(workdir, runtime_dir, message_fails) as session:
        for arguments in ({"peek": True}, {}):
            answer = await call(session, "inbox", arguments)
            assert answer["status"] == "ok" and answer["messages"] == [], answer
            assert answer["problems"] == [
                "inbox/queued/m1.json: cannot read it (Input/output error, EIO); " + FIX
                + " system that holds it; it stays queued"
            ], answer  # fmt: skip
    assert (workdir / "inbox" / "queued" / "m1.json").exists()
    async with mcp_session(workdir, runtime_dir, failing_open("queued")) as session:
        answer = await call(session, "inbox", {})
    assert answer["code"] == "read_failed", answer
    assert answer["message"].startswith(
        "inbox/queued/: cannot read it (Input/output error, EIO); " + FIX
    ), answer
    async with mcp_session(workdir, runtime_dir) as session:  # read once the system reads it
        answer = await call(session, "inbox", {})
    assert [message["id"] for message in answer["messages"]] == ["m1"], answer


async def test_a_lineage_linked_to_nothing_is_a_broken_record_every_way(
    tmp_path: Path, runtime_dir: Path
) -> None:
    parent, child = tmp_path / "parent", tmp_path / "parent" / "child"
    child.mkdir(parents=True)
    (parent / "lineage.json").symlink_to("gone.json")
    said = (
        f"{parent / 'lineage.json'} is a symbolic link that leads nowhere (to gone.json,"
        " which does not exist); restore what it points to, or remove the link (then the"
        " agent counts as a root)"
    )
    with pytest.raises(LineageError) as raised:  # Python
        read_lineage(parent)
    assert str(raised.value) == said
    assert raised.value.code == "unusable_file"
    done = taskcard(  # the command line
        "spawn", "--workdir", str(child), "--parent", "p", "--reason", "split",
        "--parent-workdir", str(parent),
    )  # fmt: skip
    assert done.returncode == 2, done
    assert said in done.stderr.decode(), done.stderr
    async with mcp_session(parent, runtime_dir) as session:  # MCP: the server's own lineage
        answer = await call(session, "spawn", {"child_workdir": "child", "reason": "split"})
    assert answer["code"] == "unusable_file" and answer["message"].startswith(said), answer
    assert not (child / "lineage.json").exists()
