"""Every failed result of every tool `taskcard mcp` offers carries a `code` from one shared
vocabulary (`tool_failure.TOOL_CODES`), listed in each tool's output schema.

The ledger, report, reports, spawn and inbox tools answered `{"status": "failed", "message":
...}` alone, while `task_card` and the server's own refusals carried a code: a program had to
read the words to tell a wrong argument from a broken file or a failed write. Driven with the
SDK's real stdio client against `taskcard mcp`, each kind of failure of each tool made with
real files in the workdir (a link round a loop, a file where a folder belongs, a link to
`/proc/self/mem`, whose read fails with EIO).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

from mcp import ClientSession

from taskcard.producers.task_card.tool_failure import TASK_CARD_ONLY, TOOL_CODES

from .conftest import STATIC_RENDERER, CliHost, envelope, write_renderer


def failure(result: Any) -> tuple[str, str]:
    """The code and message of a failed result, checked for the shape every failure has."""
    content = result.structured_content
    assert result.is_error and isinstance(content, dict), result
    assert json.loads(result.content[0].text) == content  # the text says the same
    assert content["status"] == "failed", content
    assert content.get("code") in TOOL_CODES, content
    return content["code"], content["message"]


async def call(session: ClientSession, tool: str, arguments: dict[str, Any]) -> tuple[str, str]:
    return failure(await session.call_tool(tool, arguments))


async def test_each_tools_failures_carry_the_shared_code_of_their_kind(
    workdir: Path, cli: CliHost, tmp_path: Path
) -> None:
    async with cli.mcp() as session:
        listed = {tool.name: tool for tool in (await session.list_tools()).tools}
        for name in ("ledger", "report", "reports", "spawn", "inbox"):
            schema = listed[name].output_schema
            assert schema is not None
            codes = schema["properties"]["code"]["enum"]
            assert set(codes) == set(TOOL_CODES) - TASK_CARD_ONLY, (name, codes)
        task_card = listed["task_card"].output_schema
        assert task_card is not None and "host_unavailable" in str(task_card["properties"]["code"])

        # ledger: an argument, a broken ledger file, a file where its folder belongs.
        code, message = await call(session, "ledger", {"command": "init", "purpose": "p"})
        assert code == "bad_envelope" and message.startswith("task_id:"), message
        (workdir / "ledger").mkdir()
        (workdir / "ledger" / "long-task-ledger.json").write_text("{", encoding="utf-8")
        code, message = await call(session, "ledger", {"command": "show"})
        assert code == "unusable_file" and "is not a valid ledger" in message, message
        shutil.rmtree(workdir / "ledger")
        (workdir / "ledger").write_text("not a folder", encoding="utf-8")
        init = {"command": "init", "task_id": "t", "purpose": "p"}
        code, message = await call(session, "ledger", init)
        assert code == "unusable_file" and "goes through a file" in message, message
        (workdir / "ledger").unlink()

        # report and reports: an argument, a file where reports/ belongs, a folder where
        # its lock file belongs, a named pipe where reports.jsonl belongs.
        code, message = await call(session, "report", {"ok": True, "role": "!"})
        assert code == "bad_envelope" and message.startswith("role:"), message
        code, message = await call(session, "reports", {"after": 2**62})
        assert code == "bad_envelope" and message.startswith("after:"), message
        (workdir / "reports").write_text("not a folder", encoding="utf-8")
        for tool, arguments in (("report", {"ok": True}), ("reports", {})):
            code, message = await call(session, tool, arguments)
            assert code == "unusable_file" and message.startswith("reports/:"), (tool, message)
        (workdir / "reports").unlink()
        (workdir / "reports" / ".lock").mkdir(parents=True)
        code, message = await call(session, "report", {"ok": True})
        assert code == "write_failed" and "reports/.lock" in message, message
        (workdir / "reports" / ".lock").rmdir()
        os.mkfifo(workdir / "reports" / "reports.jsonl")
        code, message = await call(session, "reports", {})
        assert code == "unusable_file" and "a named pipe" in message, message

        # spawn: an argument, this workdir's lineage round a loop and failing with EIO, a
        # folder where the child's lineage.json belongs.
        (workdir / "child").mkdir()
        spawn = {"child_workdir": "child", "reason": "review"}
        code, message = await call(session, "spawn", {**spawn, "child_workdir": "."})
        assert code == "bad_envelope" and message.startswith("child_workdir:"), message
        lineage = workdir / "lineage.json"
        lineage.symlink_to("lineage.json")
        code, message = await call(session, "spawn", spawn)
        assert code == "unusable_file" and "goes round a loop" in message, message
        lineage.unlink()
        lineage.symlink_to("/proc/self/mem")  # its read fails with EIO
        code, message = await call(session, "spawn", spawn)
        assert code == "read_failed" and "Input/output error" in message, message
        lineage.unlink()
        (workdir / "child" / "lineage.json").mkdir()
        code, message = await call(session, "spawn", spawn)
        assert code == "write_failed" and "cannot write" in message, message

        # inbox: an argument, inbox/ a link.
        code, message = await call(session, "inbox", {"peek": "yes"})
        assert code == "bad_envelope" and message.startswith("peek:"), message
        (workdir / "inbox").symlink_to(tmp_path)
        code, message = await call(session, "inbox", {"peek": True})
        assert code == "unusable_file" and message.startswith("inbox/"), message

        # task_card: its card folder leading out of the workdir (no host is started).
        (workdir / "taskcard").symlink_to(tmp_path)
        envelope = {"action": "inspect", "input": {"watch_id": "w1"}, "reasoning": "look"}
        code, message = await call(session, "task_card", envelope)
        assert code == "unusable_file" and "taskcard" in message, message


async def test_a_workdir_made_a_loop_of_links_is_named_as_one(
    workdir: Path, cli: CliHost, tmp_path: Path
) -> None:
    async with cli.mcp() as session:
        make_loop(workdir, tmp_path / "other")
        try:
            for tool in ("inbox", "report"):
                arguments = {"peek": True} if tool == "inbox" else {"ok": True}
                code, message = await call(session, tool, arguments)
                assert code == "workdir_gone", message
                assert "goes round a loop of symbolic links" in message, message
                assert "fix the links" in message, message
        finally:  # the fixture's teardown resolves the workdir
            make_loop(workdir, None)


def make_loop(workdir: Path, other: Path | None) -> None:
    """The workdir replaced by a link round a loop through `other`; None: a folder again."""
    if other is None:
        workdir.unlink()
        workdir.mkdir()
        return
    shutil.rmtree(workdir)
    other.symlink_to(workdir)
    workdir.symlink_to(other)  # workdir -> other -> workdir


async def test_task_cards_own_refusals_carry_a_code_of_their_kind(
    workdir: Path, cli: CliHost
) -> None:
    """`task_card` refused an unknown watch id, a second start and unreadable settings with a
    message alone (its renderer's failures and schema refusals carried a code): each carries
    its own code now, through MCP as through `taskcard tool`."""
    write_renderer(workdir, "r.py", STATIC_RENDERER)

    def refused(result: Any) -> tuple[str, str]:
        content = result.structured_content
        assert result.is_error and isinstance(content, dict), result
        assert content["status"] == "failed", content
        return content["code"], content["message"]

    async with cli.mcp() as session:
        for action in ("inspect", "stop", "retry"):  # before any watch
            answer = await session.call_tool("task_card", envelope(action, watch_id="tc_9"))
            code, message = refused(answer)
            assert code == "unknown_watch" and message.startswith("watch_id: 'tc_9'"), message
        start = envelope("start", renderer_path="r.py", interval_s=3600)
        started = await session.call_tool("task_card", start)
        assert not started.is_error, started
        code, message = refused(await session.call_tool("task_card", start))
        assert code == "already_active" and "is already active" in message, message
        answer = await session.call_tool("task_card", envelope("inspect", watch_id="tc_9"))
        code, message = refused(answer)
        assert code == "unknown_watch" and "(known: tc_1)" in message, message
        (workdir / "taskcard" / "taskcard.json").write_text("{", encoding="utf-8")
        code, message = refused(await session.call_tool("task_card", envelope("settings")))
        assert code == "settings_unavailable" and "taskcard/taskcard.json" in message, message
    as_tool = cli.run("tool", json.dumps(envelope("inspect", watch_id="tc_9")))
    assert as_tool.returncode == 1, as_tool.stdout
    assert json.loads(as_tool.stdout)["code"] == "unknown_watch"
