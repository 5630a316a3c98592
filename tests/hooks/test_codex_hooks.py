"""Codex's lifecycle hooks (hooks.json) through the real `taskcard hook codex`.

The payloads are shaped as Codex documents them (its hook input schemas: the common fields
`session_id`, `transcript_path`, `cwd`, `hook_event_name`, `model`, `permission_mode`, plus
`turn_id` on the turn-scoped events and each event's own fields); Codex writes one on the
hook's stdin and passes no argument.
"""

from __future__ import annotations

import json
import os
import subprocess
import tomllib
from pathlib import Path
from typing import Any

from taskcard.producers.task_card.contract import CardPaths
from taskcard.producers.task_card.turns import completed_turns

from .conftest import FIXTURES, events, kinds, run_taskcard

SESSION = [
    "01_session_start.json",
    "02_user_prompt_submit.json",
    "03_pre_tool_use.json",
    "04_permission_request.json",
    "05_post_tool_use.json",
    "06_stop.json",
]


def codex_payload(name: str, workdir: Path, **changes: Any) -> dict[str, Any]:
    text = (FIXTURES / "codex_hooks" / name).read_text().replace("CWD", str(workdir))
    data: dict[str, Any] = json.loads(text)
    data.update(changes)
    return data


def codex_hook(data: dict[str, Any], *extra: str) -> subprocess.CompletedProcess[bytes]:
    return run_taskcard("hook", "codex", *extra, stdin=json.dumps(data))


def notify(workdir: Path, turn_id: str) -> subprocess.CompletedProcess[bytes]:
    """Codex's notify program for the same turn, as config.toml's `notify` runs it."""
    argument = {
        "type": "agent-turn-complete",
        "thread-id": "019a3f6e-7c2d-7b40-9d55-2f1e8a6b4c10",
        "turn-id": turn_id,
        "cwd": str(workdir),
        "input-messages": ["Run the tests and fix what fails."],
        "last-assistant-message": "All tests pass.",
    }
    return run_taskcard("hook", "codex", json.dumps(argument))


def turns(workdir: Path) -> int:
    return completed_turns(CardPaths(workdir))


def test_a_codex_session_through_its_hooks_reads_as_activity(workdir: Path) -> None:
    for name in SESSION:
        done = codex_hook(codex_payload(name, workdir))
        # Codex reads a hook's stdout (plain text at SessionStart and UserPromptSubmit becomes
        # model context, JSON a decision): nothing may be printed.
        assert (done.returncode, done.stdout, done.stderr) == (0, b"", b""), name
    assert kinds(workdir) == [
        "agent.start",
        "turn.start",
        "tool.start",
        "wait.start",
        "wait.end",
        "tool.end",
        "turn.end",
    ]
    tool = events(workdir)[2]
    assert (tool["call_id"], tool["name"]) == ("call_Xq81bT0n", "Bash")
    assert events(workdir)[3]["reason"] == "permission"
    assert "pytest" not in (workdir / "logs" / "events.jsonl").read_text()  # no tool input
    assert turns(workdir) == 1
    assert not (workdir / "logs" / "taskcard-hook.log").exists()


def test_an_interrupt_ends_the_turn_as_interrupted_and_once(workdir: Path) -> None:
    # Codex's Interrupt hook: the person stopped the turn, and no Stop will come.
    for name in ("02_user_prompt_submit.json", "03_pre_tool_use.json"):
        codex_hook(codex_payload(name, workdir))
    codex_hook(codex_payload("04_permission_request.json", workdir))
    base = codex_payload("06_stop.json", workdir)
    interrupt = {
        key: base[key]
        for key in ("session_id", "turn_id", "transcript_path", "cwd", "model", "permission_mode")
    }
    for _copy in range(2):  # ~/.codex's copy and the project's: one end, one line
        done = codex_hook({"hook_event_name": "Interrupt", **interrupt})
        assert (done.returncode, done.stdout) == (0, b"")
    assert kinds(workdir)[-3:] == ["wait.end", "turn.end", "text"]
    assert kinds(workdir).count("text") == 1
    assert events(workdir)[-2]["error"] == "interrupted"
    assert turns(workdir) == 0  # not a completed turn for reminders
    codex_hook(codex_payload("06_stop.json", workdir))  # a late Stop of it ends nothing
    assert kinds(workdir).count("turn.end") == 1


def test_a_stop_that_another_stop_hook_continued_ends_the_turn_once(workdir: Path) -> None:
    """A stop hook of the user's blocks the first stop; Codex goes on (a tool call) and stops
    again with `stop_hook_active`. That stop ended nothing, and `notify` of the turn was
    skipped as already reported, so the card read running while Codex sat at its prompt.
    Copies of the hook from two config layers end it once."""
    codex_hook(codex_payload("02_user_prompt_submit.json", workdir))
    assert codex_hook(codex_payload("06_stop.json", workdir)).returncode == 0
    assert codex_hook(codex_payload("03_pre_tool_use.json", workdir)).returncode == 0
    again = codex_payload("06_stop.json", workdir, stop_hook_active=True)
    again["last_assistant_message"] = "Fixed the lint the check asked for."
    for _copy in range(2):  # ~/.codex's copy and the project's
        done = codex_hook(again)
        assert (done.returncode, done.stdout) == (0, b"")
    assert kinds(workdir) == ["turn.start", "turn.end", "tool.start", "turn.end"]
    assert turns(workdir) == 1  # one turn for reminders
    assert notify(workdir, again["turn_id"]).returncode == 0  # already ended: skipped
    assert kinds(workdir).count("turn.end") == 2


def test_notify_and_the_stop_hook_of_one_turn_end_it_once(workdir: Path) -> None:
    # `init codex` wires both: the Stop hook fires first, then notify for the same turn id.
    env_origin = {**os.environ, "TASKCARD_ORIGIN": "telegram:-1001234567890:42"}
    turn = codex_payload("06_stop.json", workdir)["turn_id"]
    prompt = codex_payload("02_user_prompt_submit.json", workdir)
    run_taskcard("hook", "codex", stdin=json.dumps(prompt), env=env_origin)
    assert codex_hook(codex_payload("06_stop.json", workdir)).returncode == 0
    done = notify(workdir, turn)
    assert (done.returncode, done.stdout) == (0, b"")
    assert kinds(workdir) == ["turn.start", "turn.end"]
    assert events(workdir)[0]["origin"] == "telegram:-1001234567890:42"
    assert turns(workdir) == 1
    # The next turn, reported by notify first this time: still once.
    second = "019a3f6e-9999-7d21-b3c4-5e6f7a8b9c0d"
    codex_hook(codex_payload("02_user_prompt_submit.json", workdir, turn_id=second))
    notify(workdir, second)
    codex_hook(codex_payload("06_stop.json", workdir, turn_id=second))
    assert kinds(workdir)[2:] == ["turn.start", "turn.end"]
    assert turns(workdir) == 2
    # A Codex with hooks off reports through notify alone: each turn still ends.
    notify(workdir, "019a3f6e-aaaa-7d21-b3c4-5e6f7a8b9c0d")
    assert kinds(workdir)[4:] == ["turn.end"] and turns(workdir) == 3
    # An older Codex numbers turns from 0 in each process: a resumed session's turn "1" is
    # a new turn, whether only hooks report it or both do.
    for _ in range(2):
        codex_hook(codex_payload("02_user_prompt_submit.json", workdir, turn_id="1"))
        codex_hook(codex_payload("06_stop.json", workdir, turn_id="1"))
        notify(workdir, "1")
    assert kinds(workdir)[5:] == ["turn.start", "turn.end"] * 2 and turns(workdir) == 5
    for _ in range(2):
        codex_hook(codex_payload("02_user_prompt_submit.json", workdir, turn_id="1"))
        codex_hook(codex_payload("06_stop.json", workdir, turn_id="1"))
    assert kinds(workdir)[9:] == ["turn.start", "turn.end"] * 2 and turns(workdir) == 7
    notify(workdir, "2")
    notify(workdir, "2")  # notify alone: the same id again is a new turn
    assert kinds(workdir)[13:] == ["turn.end", "turn.end"] and turns(workdir) == 9


def test_the_hooks_of_two_config_layers_count_a_turn_once(workdir: Path) -> None:
    # `init codex` run for ~/.codex and for the project's .codex: Codex runs both copies of
    # each hook, so each reports the turn's Stop.
    codex_hook(codex_payload("02_user_prompt_submit.json", workdir))
    codex_hook(codex_payload("02_user_prompt_submit.json", workdir))
    codex_hook(codex_payload("06_stop.json", workdir))
    codex_hook(codex_payload("06_stop.json", workdir))
    notify(workdir, codex_payload("06_stop.json", workdir)["turn_id"])
    assert kinds(workdir).count("turn.end") == 1 and turns(workdir) == 1


def test_a_turn_that_failed_ends_once_saying_why(workdir: Path) -> None:
    """Codex's StopFailure hook (the turn ended in an API error; no Stop comes): the turn
    ends as failed, with the error's category and its details in one line, once for both
    config layers' copies and notify; nothing is printed (Codex would read a recovery)."""
    for name in ("02_user_prompt_submit.json", "03_pre_tool_use.json"):
        codex_hook(codex_payload(name, workdir))
    failure = codex_payload("07_stop_failure.json", workdir)
    for _copy in range(2):  # ~/.codex's copy and the project's
        done = codex_hook(failure)
        assert (done.returncode, done.stdout, done.stderr) == (0, b"", b"")
    assert notify(workdir, failure["turn_id"]).returncode == 0
    assert kinds(workdir) == ["turn.start", "tool.start", "turn.end", "text"]
    assert events(workdir)[2]["error"] == "rate_limit"
    assert events(workdir)[3]["text"] == (
        "turn failed (rate_limit): You've hit your usage limit. Try again in 20 minutes."
    )
    assert turns(workdir) == 1
    assert not (workdir / "logs" / "taskcard-hook.log").exists()
    # No details (Codex sends null): the category alone.
    second = "019a3f6e-bbbb-7d21-b3c4-5e6f7a8b9c0d"
    codex_hook(codex_payload("02_user_prompt_submit.json", workdir, turn_id=second))
    codex_hook(
        codex_payload(
            "07_stop_failure.json", workdir, turn_id=second, error="overloaded", error_details=None
        )
    )
    assert events(workdir)[-1]["text"] == "turn failed (overloaded)"
    # A StopFailure hook of the user's asked Codex to retry (its recovery): the turn goes
    # on, and its Stop ends it after all.
    codex_hook(codex_payload("03_pre_tool_use.json", workdir, turn_id=second))
    codex_hook(codex_payload("06_stop.json", workdir, turn_id=second))
    assert kinds(workdir)[-3:] == ["text", "tool.start", "turn.end"]
    assert "error" not in events(workdir)[-1]


def test_a_hook_with_no_payload_or_a_broken_one_logs_and_exits_0(workdir: Path) -> None:
    done = run_taskcard("hook", "codex", "--workdir", str(workdir), stdin=b"")
    assert (done.returncode, done.stdout) == (0, b"")
    log = (workdir / "logs" / "taskcard-hook.log").read_text()
    assert "no payload" in log and "stdin" in log
    done = run_taskcard("hook", "codex", "--workdir", str(workdir), stdin=b'{"hook_event_name": ')
    assert (done.returncode, done.stdout) == (0, b"")
    assert "not JSON" in (workdir / "logs" / "taskcard-hook.log").read_text()
    assert kinds(workdir) == []
    stop = json.dumps(codex_payload("06_stop.json", workdir))
    for bad, says in (("", b"--only-in is empty"), (str(workdir / "gone"), b"not a directory")):
        done = run_taskcard("hook", "codex", "--only-in", bad, stdin=stop)
        assert (done.returncode, done.stdout) == (0, b"") and says in done.stderr, done.stderr
    assert kinds(workdir) == []


def test_init_codex_registers_the_hooks_beside_config_toml(workdir: Path, tmp_path: Path) -> None:
    config = tmp_path / "codex" / "config.toml"
    config.parent.mkdir()
    config.write_text('model = "gpt-5.1-codex"\n')
    hooks_path = config.parent / "hooks.json"
    user_stop = {"hooks": [{"type": "command", "command": "./check-style.sh", "timeout": 30}]}
    user_tool = {"matcher": "Bash", "hooks": [{"type": "command", "command": "./guard.sh"}]}
    user_hooks = {"Stop": [user_stop], "PreToolUse": [user_tool]}
    hooks_path.write_text(json.dumps({"description": "mine", "hooks": user_hooks}))
    done = run_taskcard("init", "codex", "--workdir", str(workdir), "--config", str(config))
    assert done.returncode == 0, done.stderr
    assert f"{hooks_path}: updated".encode() in done.stdout
    assert b"reviewed and trusted" in done.stdout  # Codex runs no untrusted hook
    merged = json.loads(hooks_path.read_text())
    assert merged["description"] == "mine"
    assert merged["hooks"]["Stop"][0] == user_stop
    assert merged["hooks"]["PreToolUse"][0] == user_tool
    # Every event the adapter maps that Codex documents; not SessionEnd, whose one reason
    # cannot tell an exit from a /clear.
    assert set(merged["hooks"]) == {
        "SessionStart",
        "UserPromptSubmit",
        "PreToolUse",
        "PermissionRequest",
        "PostToolUse",
        "PreCompact",
        "Stop",
        "StopFailure",
        "Interrupt",
    }
    timeouts = {
        event: groups[-1]["hooks"][0]["timeout"] for event, groups in merged["hooks"].items()
    }
    # Codex caps this one at 3 seconds (and warns at each start about more).
    assert timeouts.pop("Interrupt") == 3
    assert set(timeouts.values()) == {10}
    ours = merged["hooks"]["PreToolUse"][1]
    assert "matcher" not in ours  # no matcher: every tool, in Codex's matching
    command = ours["hooks"][0]["command"]
    assert command.endswith(f" hook codex --only-in {workdir.resolve()}")
    notify_argv = tomllib.loads(config.read_text())["notify"]  # kept: for Codex without hooks
    assert notify_argv[1:] == ["hook", "codex", "--only-in", str(workdir.resolve())]
    before = (config.read_bytes(), hooks_path.read_bytes())
    again = run_taskcard("init", "codex", "--workdir", str(workdir), "--config", str(config))
    assert again.returncode == 0
    assert again.stdout.decode().splitlines() == [
        f"{config}: already set up",
        f"{hooks_path}: already set up",
    ]
    assert (config.read_bytes(), hooks_path.read_bytes()) == before
    # The command it wrote, run as Codex runs it (through a shell, the JSON on stdin), works.
    stop = json.dumps(codex_payload("06_stop.json", workdir))
    ran = subprocess.run(
        command, shell=True, input=stop.encode(), capture_output=True, timeout=120, check=False
    )
    assert (ran.returncode, ran.stdout) == (0, b"")
    assert kinds(workdir) == ["turn.end"]
    # The same hooks run for Codex in every other project: those sessions write nothing,
    # there or here; one in a folder of the workdir writes here.
    other = tmp_path / "other-project"
    (workdir / "src").mkdir()
    for cwd in (other, tmp_path, workdir / "src"):
        cwd.mkdir(exist_ok=True)
        prompt = json.dumps(codex_payload("02_user_prompt_submit.json", cwd))
        ran = subprocess.run(
            command, shell=True, input=prompt.encode(), capture_output=True, timeout=120
        )
        assert (ran.returncode, ran.stdout, ran.stderr) == (0, b"", b"")
    assert not (other / "logs").exists() and not (tmp_path / "logs").exists()
    assert kinds(workdir) == ["turn.end", "turn.start"]
    # notify, as Codex runs it (the JSON appended): the other project's turn is not ours,
    # the one in a folder of the workdir ends here, once with its Stop hook.
    for cwd in (other, workdir / "src"):
        argument = json.dumps({"type": "agent-turn-complete", "turn-id": "9", "cwd": str(cwd)})
        assert subprocess.run([*notify_argv, argument], timeout=120).returncode == 0
    assert not (other / "logs").exists()
    assert kinds(workdir) == ["turn.end", "turn.start", "turn.end"]


def test_init_codex_refuses_a_broken_hooks_json_and_writes_nothing(
    workdir: Path, tmp_path: Path
) -> None:
    config = tmp_path / "config.toml"
    config.write_text('model = "o3"\n')
    hooks_path = tmp_path / "hooks.json"
    for broken, says in (("{not json", "not valid JSON"), ('{"hooks": []}', "hooks must be")):
        hooks_path.write_text(broken)
        done = run_taskcard("init", "codex", "--workdir", str(workdir), "--config", str(config))
        assert done.returncode == 2 and says.encode() in done.stderr, done.stderr
        assert str(hooks_path).encode() in done.stderr
        assert hooks_path.read_text() == broken
        assert config.read_text() == 'model = "o3"\n'  # nothing half-written


def test_a_turn_id_of_any_length_keeps_every_turns_record(workdir: Path) -> None:
    """Which turns ended is kept by thread and turn id in a file read with a size limit: one
    turn id of 70,000 characters made it unreadable, so every turn's second report (notify
    after the Stop hook) ended that turn again. A long id is kept as its digest."""
    huge = "t" * 70_000
    for turn in ("019a3f6e-80aa-7d21-b3c4-5e6f7a8b9c0d", huge):
        done = codex_hook(codex_payload("06_stop.json", workdir, turn_id=turn))
        assert (done.returncode, done.stdout, done.stderr) == (0, b"", b"")
    for turn in (huge, "019a3f6e-80aa-7d21-b3c4-5e6f7a8b9c0d"):
        done = notify(workdir, turn)  # the same turns, reported again: skipped
        assert (done.returncode, done.stdout, done.stderr) == (0, b"", b"")
    assert kinds(workdir) == ["turn.end", "turn.end"]
    assert turns(workdir) == 2
    assert (workdir / "logs" / ".taskcard-codex-turns.json").stat().st_size < 1000
