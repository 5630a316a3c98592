"""The `ledger` tool on `taskcard mcp`, driven by the MCP SDK's stdio client."""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

from taskcard.producers.task_card.client import request_host
from taskcard.producers.task_card.runtime import HostPaths
from tests.conftest import mcp_session


async def test_an_mcp_client_keeps_a_ledger(workdir: Path, runtime_dir: Path) -> None:
    async with mcp_session(workdir, runtime_dir) as session:
        tools = {tool.name: tool for tool in (await session.list_tools()).tools}
        schema = tools["ledger"].input_schema
        assert schema["type"] == "object" and schema["required"] == ["command"]
        assert not {"oneOf", "anyOf", "allOf"} & set(schema)
        assert len(schema["properties"]["event_type"]["enum"]) == 10

        async def call(**arguments: object) -> tuple[dict[str, object], bool]:
            result = await session.call_tool("ledger", arguments)
            text = result.content[0].text  # type: ignore[union-attr]
            return json.loads(text), bool(result.is_error)

        created, error = await call(
            command="init", task_id="t", purpose="Sync", steps=["pull", "push"]
        )
        assert (created["status"], created["truth_state"], error) == ("ok", "NO_TRUTH", False)
        moved, _ = await call(
            command="checkpoint", task_id="t", event_type="STEP_COMPLETED", step="pull"
        )
        assert moved["next_gate"] == "complete step push"
        rendered, _ = await call(command="render")
        assert "step: 2 of 2 (`push`, pending)" in str(rendered["markdown"])
        refused, error = await call(command="checkpoint", task_id="t", event_type="CHECKPOINT")
        assert error is True and str(refused["message"]).startswith("event_type:")
        refused, error = await call(command="owner-reply", task_id="t", reply="B")
        assert error is True and str(refused["message"]).startswith("reason:")
        # A step not in the plan is refused, naming the field to add it with.
        refused, error = await call(
            command="checkpoint", task_id="t", event_type="STEP_PROGRESS", step="puhs"
        )
        message = str(refused["message"])
        assert error is True and message.startswith("step: 'puhs' is not a step"), message
        assert "did you mean 'push'?" in message and "with new_step" in message
        added, error = await call(
            command="block", task_id="t", kind="OTHER", reason="r", step="x", new_step=True
        )
        assert error is False, added
    assert (workdir / "ledger" / "long-task-ledger.json").is_file()


async def test_a_call_without_a_command_is_told_it_is_required(
    workdir: Path, runtime_dir: Path
) -> None:
    """The answer said "command: None is not a command", naming a value nobody sent."""
    async with mcp_session(workdir, runtime_dir) as session:
        result = await session.call_tool("ledger", {"task_id": "t"})
        message = json.loads(result.content[0].text)["message"]  # type: ignore[union-attr]
    assert result.is_error
    assert message.startswith("command: required; use one of init, checkpoint"), message
    assert "None" not in message
    assert not (workdir / "ledger").exists()


async def test_wrong_json_types_are_refused_naming_the_field_and_limits_are_settable(
    workdir: Path,
    runtime_dir: Path,
) -> None:
    """The MCP server does not check arguments against the schema: a string for `steps` was
    split into one step per character and `true` was taken for 1 byte. Each wrong type is
    refused naming the field, the ledger is left as it was, and init takes the limits the
    CLI takes."""
    ledger_file = workdir / "ledger" / "long-task-ledger.json"
    async with mcp_session(workdir, runtime_dir) as session:

        async def call(**arguments: object) -> tuple[dict[str, object], bool]:
            result = await session.call_tool("ledger", arguments)
            text = result.content[0].text  # type: ignore[union-attr]
            return json.loads(text), bool(result.is_error)

        created, error = await call(
            command="init", task_id="t", purpose="Sync", steps=["pull"], nudge_after_sec=60,
            max_nudges=5,
        )  # fmt: skip
        assert (created["status"], error) == ("ok", False)
        before = ledger_file.read_bytes()
        cases: list[tuple[dict[str, object], str]] = [
            ({"command": "init", "task_id": "u", "purpose": "p", "steps": "ab"}, "steps:"),
            ({"command": "init", "task_id": "u", "purpose": "p", "steps": [1]}, "steps:"),
            ({"command": "init", "task_id": "u", "purpose": 7}, "purpose:"),
            ({"command": "init", "task_id": "u", "purpose": "p", "timeout_sec": "9"},
             "timeout_sec:"),
            ({"command": "init", "task_id": "u", "purpose": "p", "max_retries": 1.5},
             "max_retries:"),
            ({"command": "init", "task_id": "u", "purpose": "p", "renotify_sec": -1},
             "renotify_sec:"),
            ({"command": "download-observed", "task_id": "t", "name": "w",
              "observed_bytes": True}, "observed_bytes:"),
            ({"command": "download-observed", "task_id": "t", "name": "w",
              "observed_bytes": "5"}, "observed_bytes:"),
            ({"command": "external-job", "task_id": "t", "job_id": "j", "status": "running",
              "max_wait_sec": "x"}, "max_wait_sec:"),
            ({"command": "block", "task_id": "t", "kind": "OTHER", "reason": "r",
              "failed": "yes"}, "failed:"),
            ({"command": "checkpoint", "task_id": "t", "event_type": "STEP_PROGRESS",
              "step": "pull", "note": {"a": 1}}, "note:"),
            ({"command": "show", "task_id": ["t"]}, "task_id:"),
        ]  # fmt: skip
        for arguments, field in cases:
            refused, error = await call(**arguments)
            assert error is True, arguments
            assert str(refused["message"]).startswith(field), (arguments, refused)
        assert ledger_file.read_bytes() == before
        shown, _ = await call(command="show", task_id="t")
        record = shown["record"]
        assert isinstance(record, dict)
        assert record["task"]["limits"]["nudge_after_sec"] == 60
        assert record["task"]["limits"]["max_nudges"] == 5
        assert [s["step_id"] for s in record["observed"]["steps"]] == ["pull"]


async def test_a_field_the_command_does_not_take_is_refused_and_records_nothing(
    workdir: Path,
    runtime_dir: Path,
) -> None:
    """A field another command takes was dropped without a word: a `step` on a heartbeat,
    a `note` on init, a `kind` on a STARTED checkpoint all answered ok, recording less than
    the agent said (the command line refuses an option its command lacks)."""
    ledger = workdir / "ledger" / "long-task-ledger.json"
    stray_calls = [
        ({"command": "init", "task_id": "u", "purpose": "p", "note": "n"}, "note", "init"),
        ({"command": "heartbeat", "task_id": "t", "step": "pull"}, "step", "heartbeat"),
        (
            {"command": "checkpoint", "task_id": "t", "event_type": "STARTED", "kind": "OTHER"},
            "kind",
            "a STARTED checkpoint",
        ),
        (
            {"command": "block", "task_id": "t", "kind": "OTHER", "reason": "r", "job_id": "j"},
            "job_id",
            "block",
        ),
        ({"command": "show", "task_id": "t", "purpose": "p"}, "purpose", "show"),
    ]
    async with mcp_session(workdir, runtime_dir) as session:
        created = await session.call_tool(
            "ledger", {"command": "init", "task_id": "t", "purpose": "p", "steps": ["pull"]}
        )
        assert not created.is_error
        before = ledger.read_bytes()
        for arguments, field, command in stray_calls:
            result = await session.call_tool("ledger", arguments)
            content = result.structured_content
            assert result.is_error and isinstance(content, dict), arguments
            said = content["message"]
            # A field of another event type, as the store and the command line say it.
            assert said.startswith(f"{field}: not a field of {command}; remove it") or (
                said.startswith(f"{field}: not taken by {command}; remove it")
            ), content
        assert ledger.read_bytes() == before
        # A field the command takes, or one left out as null, still goes through.
        fine = await session.call_tool(
            "ledger", {"command": "heartbeat", "task_id": "t", "note": "n", "step": None}
        )
        assert not fine.is_error, fine.structured_content


async def test_the_tools_errors_name_its_fields_not_the_command_lines_options(
    workdir: Path,
    runtime_dir: Path,
) -> None:
    """The ledger's errors were worded for `taskcard ledger`: an MCP caller read "give
    --bytes", "needs --reason and --safe-next-step" and "see `taskcard ledger init --help`",
    names it does not have. The same errors now say its fields."""
    refused = [
        (
            {"command": "init", "task_id": "u", "purpose": "p", "timeout_sec": 0},
            "timeout_sec: must be a number of seconds above 0",
        ),
        ({"command": "init", "task_id": "u", "purpose": "p", "steps": ["a b"]}, "steps: "),
        ({"command": "heartbeat", "task_id": "nope"}, "command init"),
        ({"command": "checkpoint", "task_id": "t", "event_type": "STEP_PROGRESS"}, "step"),
        ({"command": "download-observed", "task_id": "t", "name": "d"}, "observed_bytes"),
        ({"command": "owner-reply", "task_id": "t", "reply": "B"}, "safe_next_step"),
        ({"command": "block", "task_id": "t", "reason": "r"}, "give kind"),
    ]
    async with mcp_session(workdir, runtime_dir) as session:
        created = await session.call_tool(
            "ledger", {"command": "init", "task_id": "t", "purpose": "p"}
        )
        assert not created.is_error
        for arguments, words in refused:
            result = await session.call_tool("ledger", arguments)
            content = result.structured_content
            assert result.is_error and isinstance(content, dict), arguments
            message = content["message"]
            assert words in message, message
            assert "--" not in message and "taskcard ledger" not in message, message


async def test_init_over_mcp_writes_the_renderer_the_card_starts_with(
    workdir: Path, runtime_dir: Path
) -> None:
    """docs/ledger.md: `init` writes `ledger_renderer.py` (only the command line can skip
    it). Over MCP it wrote none, so an agent that then started the ledger's card through the
    `task_card` tool, as the docs say, was refused: no such renderer."""
    try:
        async with mcp_session(workdir, runtime_dir) as session:

            async def call(tool: str, arguments: dict[str, object]) -> dict[str, object]:
                result = await session.call_tool(tool, arguments)
                assert not result.is_error, result.content
                answer: dict[str, object] = json.loads(result.content[0].text)  # type: ignore[union-attr]
                return answer

            created = await call("ledger", {"command": "init", "task_id": "t", "purpose": "Sync"})
            assert created["renderer"] == "ledger_renderer.py"
            started = await call(
                "task_card",
                {
                    "action": "start",
                    "input": {"renderer_path": "ledger_renderer.py"},
                    "reasoning": "show the ledger",
                },
            )
            assert started["status"] == "watching", started
            assert "**Sync**" in (workdir / "taskcard" / "taskcard.md").read_text()
            await call("task_card", {"action": "remove", "input": {}, "reasoning": "done"})
    finally:
        _stop_host(runtime_dir, workdir)


async def test_a_ledger_folder_that_cannot_be_made_is_a_failed_result_not_a_lost_call(
    workdir: Path,
    runtime_dir: Path,
) -> None:
    """A file where `ledger/` belongs made every writing command raise `FileExistsError`
    out of the tool: the SDK answered a protocol error (a traceback on the server's stderr),
    where every other tool answers a failed result naming the path. Now the ledger tool does
    too, in the words of a read and of `--ledger` (it said "cannot write ... (File exists)"),
    the file in the way is left alone, and the session goes on."""
    in_the_way = workdir / "ledger"
    in_the_way.write_text("notes of the agent\n")
    writes: list[dict[str, object]] = [
        {"command": "init", "task_id": "t", "purpose": "Sync"},
        {"command": "checkpoint", "task_id": "t", "event_type": "STARTED"},
        {"command": "heartbeat", "task_id": "t"},
        {"command": "supervise", "apply_supervision": True},
    ]
    async with mcp_session(workdir, runtime_dir) as session:
        for arguments in writes:
            result = await session.call_tool("ledger", arguments)
            content = result.structured_content
            assert result.is_error and isinstance(content, dict), arguments
            assert content["status"] == "failed", content
            message = content["message"]
            assert content["code"] == "unusable_file", content
            assert message == (
                f"ledger {in_the_way}/long-task-ledger.json goes through a file as if it were a"
                f" folder ({in_the_way} is a file); move that file aside"
            ), message
        assert in_the_way.read_text() == "notes of the agent\n"
        reported = await session.call_tool("report", {"ok": True})
        assert not reported.is_error, reported.structured_content


async def test_a_ledger_behind_a_link_that_leads_nowhere_is_named_and_kept(
    workdir: Path, runtime_dir: Path
) -> None:
    """A link at the ledger's name to a file not there (inside the workdir, so followed) was
    read as an empty ledger ("has no task") and `init` wrote a file over it; every command
    now names the link and where it points, and the link is left as it is."""
    (workdir / "ledger").mkdir()
    link = workdir / "ledger" / "long-task-ledger.json"
    link.symlink_to("moved.json")
    said = (
        f"ledger {link} is a symbolic link that leads nowhere (to moved.json, which does not"
        " exist); restore what it points to, or fix the link"
    )
    calls: list[dict[str, object]] = [
        {"command": "show"},
        {"command": "init", "task_id": "t", "purpose": "Sync"},
        {"command": "heartbeat", "task_id": "t"},
    ]
    async with mcp_session(workdir, runtime_dir) as session:
        for arguments in calls:
            result = await session.call_tool("ledger", arguments)
            content = result.structured_content
            assert result.is_error and isinstance(content, dict), arguments
            assert said in str(content["message"]), content
    assert link.is_symlink() and os.readlink(link) == "moved.json"


async def test_init_never_writes_its_renderer_through_a_link_at_its_name(
    workdir: Path, runtime_dir: Path, tmp_path: Path
) -> None:
    """threat-model.md: nothing is created outside the workdir through a link. A dangling
    `ledger_renderer.py` link was followed by `init` (from MCP and the command line alike),
    which created the renderer where it led."""
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (workdir / "ledger_renderer.py").symlink_to(outside / "planted.py")
    async with mcp_session(workdir, runtime_dir) as session:
        result = await session.call_tool(
            "ledger", {"command": "init", "task_id": "t", "purpose": "Sync"}
        )
        assert not result.is_error, result.structured_content
    assert list(outside.iterdir()) == []
    assert (workdir / "ledger_renderer.py").readlink() == outside / "planted.py"


def test_init_from_the_command_line_keeps_a_link_at_the_renderers_name(
    workdir: Path, tmp_path: Path
) -> None:
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (workdir / "ledger_renderer.py").symlink_to(outside / "planted.py")
    done = subprocess.run(
        [sys.executable, "-m", "taskcard.bridge.cli", "ledger", "init", "u", "--purpose", "p"],
        cwd=workdir, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert list(outside.iterdir()) == []


# A value each field may take, for calls built from what the listing says a command needs.
_SAMPLES: dict[str, object] = {
    "task_id": "t", "purpose": "Sync", "event_type": "STARTED", "kind": "OTHER",
    "reason": "r", "job_id": "j", "status": "running", "name": "d", "observed_bytes": 1,
    "reply": "A",
}  # fmt: skip


async def test_the_listing_says_which_fields_each_command_needs(
    workdir: Path, runtime_dir: Path
) -> None:
    """The ledger's schema is one flat object, and its fields said nothing of the commands
    that take them: a caller learnt that `block` needs `kind` and `reason`, or
    `download-observed` `observed_bytes`, only from refused calls. Each field's description
    now names its commands and marks those that need it; a call with just those goes
    through, and one without any of them is refused naming it."""
    async with mcp_session(workdir, runtime_dir) as session:
        tools = {tool.name: tool for tool in (await session.list_tools()).tools}
        properties = tools["ledger"].input_schema["properties"]
        assert all(spec.get("description") for spec in properties.values()), properties
        commands = properties["command"]["enum"]
        for command in commands:
            marked = re.compile(rf"(?:^|: |, ){re.escape(command)} \(required\)")
            needed = [n for n, spec in properties.items() if marked.search(spec["description"])]
            if command in ("show", "render", "supervise"):
                assert needed == [], (command, needed)
                continue
            assert "task_id" in needed, (command, needed)
            arguments: dict[str, object] = {n: _SAMPLES[n] for n in needed}
            arguments["command"] = command
            for missing in needed:
                short = {n: v for n, v in arguments.items() if n != missing}
                result = await session.call_tool("ledger", short)
                content = result.structured_content
                assert result.is_error and isinstance(content, dict), short
                assert content["message"].startswith(f"{missing}:"), (short, content)
            result = await session.call_tool("ledger", arguments)
            assert not result.is_error, (arguments, result.structured_content)


def _stop_host(runtime: Path, workdir: Path) -> None:
    """The host the card's start brought up, asked to stop (not left to its idle grace)."""
    with contextlib.suppress(OSError, ValueError):
        request_host(HostPaths(runtime, workdir.resolve()), {"op": "shutdown"}, 5.0)


async def test_a_ledger_folder_linked_out_of_the_workdir_is_refused(
    workdir: Path, runtime_dir: Path, tmp_path: Path
) -> None:
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (workdir / "ledger").symlink_to(outside, target_is_directory=True)
    async with mcp_session(workdir, runtime_dir) as session:
        for arguments in (
            {"command": "init", "task_id": "t", "purpose": "Sync"},
            {"command": "show"},
        ):
            result = await session.call_tool("ledger", arguments)
            answer = json.loads(result.content[0].text)  # type: ignore[union-attr]
            assert result.is_error and "leads out of the workdir" in answer["message"]
    assert list(outside.iterdir()) == []


async def test_an_owner_reply_other_than_b_refuses_over_mcp_the_fields_a_block_records(
    workdir: Path,
    runtime_dir: Path,
) -> None:
    """`reply: "D"` with a `reason` was taken and the reason dropped unsaid. Refused naming
    the tool's field (the command line's is in test_cli); nothing is recorded."""
    async with mcp_session(workdir, runtime_dir) as session:
        init = {"command": "init", "task_id": "t", "purpose": "P"}
        created = await session.call_tool("ledger", init)
        assert not created.is_error
        for extra in ({"reason": "r"}, {"safe_next_step": "s"}, {"kind": "OTHER"}):
            result = await session.call_tool(
                "ledger", {"command": "owner-reply", "task_id": "t", "reply": "D", **extra}
            )
            answer = json.loads(result.content[0].text)  # type: ignore[union-attr]
            field = next(iter(extra))
            assert result.is_error, answer
            assert answer["message"].startswith(f"{field}: only reply B"), answer
            assert "--" not in answer["message"], answer
    document = json.loads((workdir / "ledger" / "long-task-ledger.json").read_text())
    assert document["tasks"]["t"]["observations"] == []


async def test_a_byte_count_past_a_petabyte_is_refused_naming_the_field(
    workdir: Path, runtime_dir: Path
) -> None:
    """The tool listed no maximum for `observed_bytes` and `expected_bytes` and took any
    whole number; both are now at most 10^15, listed so and refused past it, naming the
    field (not the command line's option)."""
    async with mcp_session(workdir, runtime_dir) as session:
        tools = {tool.name: tool for tool in (await session.list_tools()).tools}
        properties = tools["ledger"].input_schema["properties"]
        created = await session.call_tool(
            "ledger", {"command": "init", "task_id": "t", "purpose": "p"}
        )
        assert not created.is_error
        for field in ("observed_bytes", "expected_bytes"):
            assert properties[field]["maximum"] == 10**15
            call = {"command": "download-observed", "task_id": "t", "name": "d"}
            call = {"observed_bytes": 1, **call, field: 10**15 + 1}
            refused = await session.call_tool("ledger", call)
            content = refused.structured_content
            assert refused.is_error and isinstance(content, dict)
            assert content["message"] == (
                f"{field}: {10**15 + 1} is over the largest byte count a download may give"
                f" (1000000000000000, a petabyte); give {field} the size in bytes"
            )
            taken = await session.call_tool("ledger", {**call, field: 10**15})
            assert not taken.is_error, taken.structured_content
