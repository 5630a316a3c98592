"""The MCP form: the SDK's real stdio client drives `taskcard mcp` as a subprocess."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from queue import Empty
from typing import Any

import jsonschema
import pytest
from mcp import ClientSession, stdio_client

from taskcard.producers.task_card.contract import CardPaths
from taskcard.producers.task_card.envelope import ACTIONS
from taskcard.producers.task_card.notifications import (
    FileNotificationPort,
    TaskCardErrorNotification,
)
from tests.conftest import INITIALIZE
from tests.inbox.conftest import queue

from .conftest import STATIC_RENDERER, CliHost, tool_call, write_renderer


def taskcard_meta(result: Any) -> dict[str, Any] | None:
    meta = result.meta or {}
    payload = meta.get("agent_meta", {}).get("taskcard")
    assert payload is None or isinstance(payload, dict)
    return payload


async def test_an_mcp_client_starts_inspects_and_removes_a_watch(
    workdir: Path, cli: CliHost
) -> None:
    write_renderer(workdir, "r.py", STATIC_RENDERER)
    async with (
        stdio_client(cli.mcp_server()) as (read, write),
        ClientSession(read, write) as session,
    ):
        init = await session.initialize()
        assert init.server_info.name == "taskcard"
        assert init.server_info.version == metadata.version("taskcard")
        assert init.instructions is not None and "prints the whole card" in init.instructions
        tools = (await session.list_tools()).tools
        assert [tool.name for tool in tools] == [
            "task_card",
            "ledger",
            "report",
            "reports",
            "spawn",
            "inbox",
        ]
        tool = tools[0]
        assert tool.input_schema["properties"]["action"]["enum"] == list(ACTIONS)
        assert "oneOf" not in tool.input_schema
        assert tool.annotations is not None and tool.annotations.destructive_hint is True
        assert tool.output_schema is not None

        async def call(arguments: dict[str, object]) -> tuple[dict[str, Any], Any]:
            result = await session.call_tool("task_card", arguments)
            text = result.content[0].text  # type: ignore[union-attr]
            assert result.structured_content == json.loads(text)
            jsonschema.validate(result.structured_content, tool.output_schema)
            return json.loads(text), result

        started, raw = await call(
            {"action": "start", "input": {"renderer_path": "r.py"}, "reasoning": "mcp test"}
        )
        assert (started["status"], started["watch_id"], raw.is_error) == ("watching", "tc_1", False)
        assert taskcard_meta(raw) == {
            "present": True,
            "status": "active",
            "body": "# Work\nsteady body\n",
        }
        inspected, raw = await call(
            {"action": "inspect", "input": {"watch_id": "tc_1"}, "reasoning": "check"}
        )
        assert inspected["last_body"] == "# Work\nsteady body\n"
        assert taskcard_meta(raw) is None  # unchanged card: not sent again
        refused, raw = await call({"action": "start", "input": {}, "reasoning": "again"})
        assert raw.is_error is True and "input.renderer_path" in str(refused["message"])
        removed, raw = await call({"action": "remove", "input": {}, "reasoning": "done"})
        assert (removed["status"], removed["body_removed"]) == ("removed", True)
        absent = taskcard_meta(raw)
        assert absent is not None and absent["present"] is False
        # The manual's generic hint, word for word, while no card is present.
        assert absent["hint"] == (
            "no taskcard present, consider maintaining one, see task_card manual"
        )
    assert (workdir / "taskcard" / "status").read_bytes() == b"inactive"


async def test_a_task_card_wake_reaches_the_mcp_client_once(workdir: Path, cli: CliHost) -> None:
    port = FileNotificationPort(CardPaths(workdir))
    port.notify(TaskCardErrorNotification("tc_1", 1, "renderer_failed", "old"))  # before: not news
    async with cli.mcp() as session:
        envelope = {"action": "settings", "input": {}, "reasoning": "look"}
        first = taskcard_meta(await session.call_tool("task_card", envelope))
        assert first is not None and "notices" not in first  # the first projection only
        port.notify(TaskCardErrorNotification("tc_1", 2, "renderer_timeout", "slow"))
        woken = taskcard_meta(await session.call_tool("task_card", envelope))
        assert woken is not None
        (notice,) = woken["notices"]
        assert "tc_1 failed to refresh (renderer_timeout)" in notice
        assert taskcard_meta(await session.call_tool("task_card", envelope)) is None


@pytest.mark.parametrize(
    "cursor",
    ['{"inode": 1e999, "offset": 0}', '{"inode": INODE, "offset": -5}'],
    ids=["huge", "neg"],
)
async def test_a_wake_cursor_edited_by_hand_is_placed_anew(
    workdir: Path, cli: CliHost, cursor: str
) -> None:
    """The MCP host's read position in `system.jsonl`, edited by hand (a number no `int` holds,
    an offset before the start): it is placed at the end again, as an unreadable one is, and
    the next wake reaches the client. The first failed the tool call with an `OverflowError`;
    the second made every read fail, so no wake ever came again."""
    from taskcard.producers.task_card.mcp_server import WAKE_CONSUMER
    from taskcard.producers.task_card.wakes import CURSOR_DIR

    port = FileNotificationPort(CardPaths(workdir))
    stored = CardPaths(workdir).notification_dir / CURSOR_DIR / f"{WAKE_CONSUMER}.json"
    port.notify(TaskCardErrorNotification("tc_1", 0, "renderer_failed", "old"))  # a file to read
    async with cli.mcp() as session:
        envelope = {"action": "settings", "input": {}, "reasoning": "look"}
        await session.call_tool("task_card", envelope)  # the cursor is placed
        placed = json.loads(stored.read_text())
        stored.write_text(cursor.replace("INODE", str(placed["inode"])))
        port.notify(TaskCardErrorNotification("tc_1", 1, "renderer_failed", "before"))
        again = await session.call_tool("task_card", envelope)
        assert not again.is_error, again
        port.notify(TaskCardErrorNotification("tc_1", 2, "renderer_timeout", "after"))
        woken = taskcard_meta(await session.call_tool("task_card", envelope))
        assert woken is not None, "the wake after the cursor was placed anew"
        (notice,) = woken["notices"]
        assert "renderer_timeout" in notice


async def test_the_inbox_tool_names_the_files_it_left_alone(workdir: Path, cli: CliHost) -> None:
    """As `taskcard inbox` prints them: a file in the queue that is no message is named in
    the result, beside the messages it returns."""
    queue(workdir, "m1", "please rerun the tests")
    (workdir / "inbox" / "queued" / "not a message.json").write_text("{}")
    async with cli.mcp() as session:
        result = await session.call_tool("inbox", {})
        content = result.structured_content
        assert not result.is_error and isinstance(content, dict)
        assert [message["id"] for message in content["messages"]] == ["m1"]
        (problem,) = content["problems"]
        assert "not a message" in problem and "left alone" in problem


def child_reports(child: Path, flag: str, verdict: str) -> dict[str, Any]:
    """A report of the child, as the child writes it: `taskcard report`, its details on stdin."""
    done = subprocess.run(
        [sys.executable, "-m", "taskcard.bridge.cli", "report", "--workdir", str(child),
         flag, "--verdict", verdict, "--role", "reviewer", "--payload", "-"],
        input=f"round {verdict}", capture_output=True, text=True, check=True,
    )  # fmt: skip
    result: dict[str, Any] = json.loads(done.stdout)
    return result


async def test_an_orchestrator_reads_its_childs_reports_in_order_over_mcp(
    workdir: Path, cli: CliHost
) -> None:
    """The reports-and-signals spec: the orchestrator reads what a card returned, with the
    last number seen, without re-reading one or losing an old round. Over MCP it could write
    reports and spawn children, but read none (only `taskcard reports` did)."""
    child = workdir / "reviewer"
    child.mkdir()
    async with cli.mcp() as session:

        async def read(arguments: dict[str, Any]) -> dict[str, Any]:
            result = await session.call_tool("reports", arguments)
            content = result.structured_content
            assert isinstance(content, dict)
            assert result.is_error is (content["status"] == "failed"), content
            return content

        spawned = await session.call_tool(
            "spawn", {"child_workdir": "reviewer", "reason": "review"}
        )
        assert not spawned.is_error, spawned.structured_content
        assert await read({"child_workdir": "reviewer"}) == {"status": "ok", "report": None}
        for flag, verdict in (("--failed", "reprovado"), ("--ok", "aprovado")):
            assert child_reports(child, flag, verdict)["channel"] == "cli"
        seen: list[tuple[int, bool, str, str]] = []
        after = 0
        while report := (await read({"child_workdir": str(child), "after": after}))["report"]:
            seen.append((report["seq"], report["ok"], report["verdict"], report["payload"]))
            after = report["seq"]
        assert seen == [
            (1, False, "rejected", "round reprovado"),
            (2, True, "approved", "round aprovado"),
        ]
        latest = (await read({"child_workdir": "reviewer"}))["report"]
        assert latest["seq"] == 2 and latest["role"] == "reviewer"
        # Its own reports, by default; the child's are not its own.
        assert (await session.call_tool("report", {"ok": True})).is_error is False
        assert (await read({}))["report"]["channel"] == "mcp"
        assert (await read({"after": 1})) == {"status": "ok", "report": None}
        # Bad input names the field and the fix.
        refused = await read({"after": -1})
        assert refused["message"].startswith("after:") and "last seq you read" in refused["message"]
        refused = await read({"after": 1.5})
        assert refused["message"].startswith("after: must be a whole number")
        refused = await read({"child_workdir": "nowhere"})
        assert (
            refused["message"].startswith("child_workdir:")
            and "not a directory" in (refused["message"])
        )


def cli_said(workdir: Path, after: str) -> list[str]:
    """What `taskcard reports --after AFTER` says on stderr."""
    done = subprocess.run(
        [sys.executable, "-m", "taskcard.bridge.cli", "reports", "--workdir", str(workdir),
         "--after", after],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return done.stderr.splitlines()


async def test_the_reports_tool_names_the_broken_lines_it_read_past(
    workdir: Path, cli: CliHost
) -> None:
    """`taskcard reports` names on stderr each broken line it read past where a report could
    have been; the MCP tool answered `{"report": null}` alone, so an orchestrator reading a
    child's reports over MCP never learned that one may be there and cannot be read. Its
    result now lists them as the command line words them, five and a count of the rest: a
    file of 100,000 broken lines makes no huge result."""
    folder = workdir / "reports"
    folder.mkdir()
    good = b'{"seq": 1, "at": "2026-01-01T00:00:00Z", "ok": true}\n'
    (folder / "reports.jsonl").write_bytes(good + b"not json\n" + b"[1]\n" * 99_999)
    said = [line.removeprefix("taskcard reports: ") for line in cli_said(workdir, "1")]
    async with cli.mcp() as session:
        tool = next(t for t in (await session.list_tools()).tools if t.name == "reports")
        result = await session.call_tool("reports", {"after": 1})
        content = result.structured_content
        assert not result.is_error and isinstance(content, dict), content
        jsonschema.validate(content, tool.output_schema)
        assert content["report"] is None
        assert [item["line"] for item in content["skipped"]] == [2, 3, 4, 5, 6]
        assert [item["problem"] for item in content["skipped"]] == said[:5]
        assert content["skipped"][0]["problem"] == (
            "reports/reports.jsonl line 2 is not JSON; skipped (write one JSON object per line,"
            " as `taskcard report` does)"
        )
        assert content["skipped"][1]["problem"].startswith(
            "reports/reports.jsonl line 3 is not a JSON object; skipped"
        )
        assert content["skipped_more"] == 99_995
        assert said[5] == "reports/reports.jsonl: 99,995 more broken lines skipped"
        # The latest report is read past them too; after a report that follows, nothing is
        # named (the broken lines lie before it).
        latest = (await session.call_tool("reports", {})).structured_content
        assert isinstance(latest, dict) and latest["report"]["seq"] == 1
        assert latest["skipped_more"] == 99_995
        assert (await session.call_tool("report", {"ok": True})).is_error is False
        after = (await session.call_tool("reports", {"after": 2})).structured_content
        assert after == {"status": "ok", "report": None}


def resolved(path: Path) -> Path:
    return path.resolve()


def exists(path: Path) -> bool:
    return path.exists()


def make_folder(path: Path) -> None:
    path.mkdir()


async def test_a_workdir_removed_while_serving_is_not_created_again(
    workdir: Path, cli: CliHost
) -> None:
    """Once the agent's workdir was removed (its work cleared away), the next call of any
    tool made it again (the notice cursor, the ledger's or the reports' folder), so a
    discovering service found the retired agent back. Each call now says the workdir is gone
    and writes nothing."""
    (workdir / "child").mkdir()
    shown = f"workdir: {resolved(workdir)} no longer"
    calls: dict[str, dict[str, Any]] = {
        "task_card": {"action": "settings", "input": {}, "reasoning": "check"},
        "ledger": {"command": "init", "task_id": "t", "purpose": "p"},
        "report": {"ok": True, "summary": "done"},
        "reports": {},
        "spawn": {"child_workdir": str(workdir.parent), "reason": "lint"},
        "inbox": {},
    }
    async with cli.mcp() as session:
        shutil.rmtree(workdir)
        for name, arguments in calls.items():
            result = await session.call_tool(name, arguments)
            content = result.structured_content
            assert result.is_error and isinstance(content, dict), (name, content)
            assert content["message"].startswith(shown), content
            assert not exists(workdir), name
        assert not exists(workdir.parent / "lineage.json")
        # The same folder made again by its owner is served again.
        make_folder(workdir)
        result = await session.call_tool("report", {"ok": True})
        assert not result.is_error, result.structured_content


def test_mcp_refuses_an_unusable_workdir_at_start(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere"
    done = subprocess.run(
        [sys.executable, "-m", "taskcard.bridge.cli", "mcp", "--workdir", str(missing)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr.strip().splitlines() == [
        f"taskcard mcp: argument --workdir: {missing} is not a directory; "
        "pass the agent's working directory; see `taskcard mcp --help`"
    ]


async def test_a_notices_folder_linked_out_of_the_workdir_gets_no_cursor_and_tools_work(
    workdir: Path, tmp_path: Path, cli: CliHost
) -> None:
    """The server keeps its wake cursor under `.notification/`; linked out of the workdir,
    that folder got `cursors/` created in it. Now nothing is written there, and the server
    still starts and answers (the wakes wait until the folder is a real one)."""
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (workdir / ".notification").symlink_to(outside)
    async with cli.mcp() as session:
        envelope = {"action": "settings", "input": {}, "reasoning": "look"}
        result = await session.call_tool("task_card", envelope)
        assert not result.is_error, result.structured_content
        assert (await session.call_tool("report", {"ok": True})).is_error is False
    assert list(outside.iterdir()) == []


async def test_a_card_linked_out_of_the_workdir_is_unreadable_never_shown_as_the_agents(
    workdir: Path, tmp_path: Path, cli: CliHost
) -> None:
    """The `_meta` projection read `taskcard/status` and the body through a link out of the
    workdir (another agent's card folder, a file elsewhere), so the agent was shown a card
    the service refuses to post. It reads as unreadable instead (never absent, which would
    invite a duplicate card)."""
    other = tmp_path / "other" / "taskcard"
    other.mkdir(parents=True)
    (other / "status").write_text("active")
    (other / "taskcard.md").write_text("# Other\nOTHER BODY")
    (workdir / "taskcard").symlink_to(other)
    async with cli.mcp() as session:
        meta = taskcard_meta(await session.call_tool("report", {"ok": True}))
        assert meta is not None and meta["status"] == "unreadable", meta
        assert "OTHER BODY" not in json.dumps(meta)
        # The folder real again, only its body linked out: the same.
        (workdir / "taskcard").unlink()
        (workdir / "taskcard").mkdir()
        (workdir / "taskcard" / "status").write_text("active")
        (workdir / "taskcard" / "taskcard.md").symlink_to(other / "taskcard.md")
        meta = taskcard_meta(await session.call_tool("report", {"ok": True}))
        assert meta is None or "OTHER BODY" not in json.dumps(meta), meta
        (workdir / "taskcard" / "taskcard.md").unlink()
        (workdir / "taskcard" / "taskcard.md").write_text("# Mine\nMY BODY")
        meta = taskcard_meta(await session.call_tool("report", {"ok": True}))
        assert meta is not None and meta.get("body") == "# Mine\nMY BODY", meta


def test_every_line_a_client_gets_wrong_is_answered_and_the_server_goes_on(
    workdir: Path, cli: CliHost
) -> None:
    """A client with a bug (or a pipe that garbled a line) gets a JSON-RPC error for each line
    `taskcard mcp` cannot read, with the request's id when it can be read; the SDK alone
    dropped such lines and left the client waiting."""
    huge = "9" * 5000
    lines = [
        json.dumps(INITIALIZE),
        '{"jsonrpc":"2.0","method":"notifications/initialized"}',
        "{not json",  # -32700, id null
        "",  # a blank line: no answer
        "\udcff".encode("utf-8", "surrogatepass").decode("latin-1"),  # not UTF-8
        "[]",  # not one message
        tool_call(
            2, f'{{"name":"task_card","arguments":{{"action":"inspect","input":{{"n":{huge}}}}}}}'
        ),
        f'{{"jsonrpc":"2.0","method":"notifications/x","params":{{"n":{huge}}}}}',  # no answer
        '{"jsonrpc":"2.0","id":"three","method":5}',
        tool_call(4, "3"),
        # An id too long to read: answered with a null id, never with another request's.
        f'{{"jsonrpc":"2.0","id":{huge},"method":"tools/list"}}',
        # Half of a surrogate pair, as a cut emoji is escaped: the SDK cannot read the line (in
        # a tool's arguments it is a refusal naming the field: test_mcp_wire_requests).
        '{"jsonrpc":"2.0","id":6,"method":"tools/list","params":{"_meta":{"n":"\\ud83d"}}}',
        '{"jsonrpc":"2.0","id":5,"method":"tools/list"}',
    ]
    with cli.raw_mcp() as (server, answers):
        assert server.stdin is not None
        server.stdin.write(("\n".join(lines) + "\n").encode("latin-1"))
        server.stdin.flush()
        got = [answers.get(timeout=60) for _ in range(10)]
        by_id = {answer["id"]: answer for answer in got if answer["id"] is not None}
        unnamed = [answer["error"] for answer in got if answer["id"] is None]
        assert [error["code"] for error in unnamed] == [-32700, -32700, -32600, -32602]
        assert "not one JSON document" in unnamed[0]["message"]
        assert by_id[1]["result"]["serverInfo"]["name"] == "taskcard"
        assert by_id[2]["error"]["code"] == -32602
        assert "4300 digits" in by_id[2]["error"]["message"]
        assert by_id["three"]["error"]["code"] == -32600
        assert "method" in by_id["three"]["error"]["message"]
        assert by_id[4]["error"]["code"] == -32600
        assert "params" in by_id[4]["error"]["message"]
        assert by_id[6]["error"]["code"] == -32700, by_id[6]
        assert "surrogate pair" in by_id[6]["error"]["message"]
        assert 0 not in by_id
        assert "task_card" in {tool["name"] for tool in by_id[5]["result"]["tools"]}
        with pytest.raises(Empty):  # nothing more: the notification and blank line
            answers.get(timeout=1)


def test_a_tool_call_of_the_wrong_shape_is_answered_naming_the_field(
    workdir: Path, cli: CliHost
) -> None:
    """A tools/call whose `arguments` is not an object, or without a `name`, was answered
    "Invalid request parameters" with empty data: the client was not told which field. (The
    SDK's own client refuses to send these; a hand-written client does.)"""
    wrong = [
        ({"name": "report", "arguments": [True]}, "params.arguments:"),
        ({"name": "report", "arguments": "ok"}, "params.arguments:"),
        ({"name": 7, "arguments": {}}, "params.name:"),
        ({"arguments": {"ok": True}}, "params.name:"),
    ]
    lines = [
        {**INITIALIZE, "id": 0},
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        *({"jsonrpc": "2.0", "id": n, "method": "tools/call", "params": p} for n, (p, _) in
          enumerate(wrong, 1)),
        {"jsonrpc": "2.0", "id": 9, "method": "tools/call",
         "params": {"name": "report", "arguments": {"ok": True}}},
    ]  # fmt: skip
    with cli.raw_mcp() as (server, answers):
        assert server.stdin is not None
        server.stdin.write("".join(json.dumps(line) + "\n" for line in lines).encode())
        server.stdin.flush()
        by_id = {answer["id"]: answer for answer in (answers.get(timeout=60) for _ in range(6))}
        for ident, (_, field) in enumerate(wrong, 1):
            error = by_id[ident]["error"]
            assert error["code"] == -32602, error
            assert error["message"].startswith(f"Invalid params: {field}"), error
            assert "arguments" in error["message"], error
        assert by_id[9]["result"]["isError"] is False, by_id[9]
        assert (workdir / "reports" / "reports.jsonl").read_text().count("\n") == 1


async def test_a_task_card_call_the_schema_refuses_starts_no_host(
    workdir: Path, cli: CliHost
) -> None:
    """The refusal is the host's sentence, given without starting a host that would then
    idle for its grace."""
    async with cli.mcp() as session:
        result = await session.call_tool(
            "task_card", {"action": "inspect", "input": {}, "reasoning": "look"}
        )
        content = result.structured_content
        assert result.is_error and isinstance(content, dict)
        assert content["message"] == "input.watch_id: required for inspect"
        assert content["code"] == "bad_envelope"  # the caller's envelope, as on the CLI
    assert cli.host_pid() is None and not cli.paths.socket.exists()


def _hook_ends_a_turn(workdir: Path) -> None:
    """Claude Code's `Stop` hook, run as Claude Code runs it: one payload on stdin."""
    payload = {"hook_event_name": "Stop", "session_id": "s1", "cwd": str(workdir)}
    done = subprocess.run(
        [sys.executable, "-m", "taskcard.bridge.cli", "hook", "claude-code"],
        input=json.dumps({**payload, "stop_hook_active": False}),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr


async def test_a_hooks_reminder_is_cleared_by_the_start_that_publishes_the_card(
    workdir: Path, cli: CliHost
) -> None:
    """A reminder is for an absent or stale card; the card published after it retracts it
    (a `reminder_cleared` line). The host cleared only a reminder it had written itself, not
    the hooks' (which count the turns as the agent host ends them): the result of the very
    `start` that published the card told the agent that its card was absent or stale."""
    write_renderer(workdir, "r.py", STATIC_RENDERER)
    (workdir / "taskcard").mkdir()
    (workdir / "taskcard" / "taskcard.json").write_text('{"reminder_turns": 2}')
    async with cli.mcp() as session:
        look = {"action": "settings", "input": {}, "reasoning": "look"}
        await session.call_tool("task_card", look)  # the notices are read from here on
        for _ in range(5):  # reminders at the second and fourth turns, one more turn after
            _hook_ends_a_turn(workdir)
        start = {"renderer_path": "r.py", "interval_s": 3600}
        started = await session.call_tool(
            "task_card", {"action": "start", "input": start, "reasoning": "long work"}
        )
        assert not started.is_error, started.structured_content
        shown = taskcard_meta(started)
        assert shown is not None and shown["body"] == "# Work\nsteady body\n"
        assert "notices" not in shown, shown["notices"]
    lines = [json.loads(line) for line in CardPaths(workdir).notifications.read_text().splitlines()]
    reminders = [line["id"] for line in lines if line["extra"]["state"] == "reminder"]
    cleared = [
        line["extra"]["clears"] for line in lines if line["extra"]["state"] == "reminder_cleared"
    ]
    assert len(reminders) == 2 and cleared == reminders
