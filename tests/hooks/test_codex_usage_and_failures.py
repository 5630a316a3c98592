"""A Codex turn's token usage (from its rollout) and a failed tool, through `taskcard hook codex`.

Codex's hook payloads name the session's rollout in `transcript_path`: JSON lines whose
`event_msg` entries of type `token_count` carry the session's running total
(`total_token_usage`) and the last model call's (`last_token_usage`), often written twice;
`task_started` opens a turn. A `PostToolUse` of an MCP tool carries the MCP call result as
`tool_response`, whose `isError` says the tool failed.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import pytest

from .conftest import events, kinds
from .test_codex_hooks import codex_hook, codex_payload

TURN = "019a3f6e-80aa-7d21-b3c4-5e6f7a8b9c0d"


def token_count(total: tuple[int, int], last: tuple[int, int]) -> dict[str, Any]:
    def usage(tokens: tuple[int, int]) -> dict[str, int]:
        return {
            "input_tokens": tokens[0],
            "cached_input_tokens": tokens[0] // 2,
            "output_tokens": tokens[1],
            "reasoning_output_tokens": tokens[1] // 3,
            "total_tokens": sum(tokens),
        }

    return {
        "timestamp": "2026-12-01T10:00:02.000Z",
        "type": "event_msg",
        "payload": {
            "type": "token_count",
            "info": {
                "total_token_usage": usage(total),
                "last_token_usage": usage(last),
                "model_context_window": 258400,
            },
            "rate_limits": {"primary": {"used_percent": 1.0, "window_minutes": 300}},
        },
    }


def turn_started(turn_id: str) -> dict[str, Any]:
    return {
        "timestamp": "2026-12-01T10:00:01.000Z",
        "type": "event_msg",
        "payload": {"type": "task_started", "turn_id": turn_id, "model_context_window": 258400},
    }


def two_turns() -> list[dict[str, Any]]:
    """A rollout of two turns: the first used 1000 in / 100 out, the second two calls of
    (3000, 200) and (4000, 300), each token count written twice."""
    return [
        {"timestamp": "2026-12-01T10:00:00.000Z", "type": "session_meta", "payload": {"id": "s"}},
        turn_started("turn-1"),
        {"type": "event_msg", "payload": {"type": "token_count", "info": None}},
        token_count((1000, 100), (1000, 100)),
        turn_started(TURN),
        token_count((4000, 300), (3000, 200)),
        token_count((4000, 300), (3000, 200)),
        {"type": "response_item", "payload": {"type": "message", "role": "assistant"}},
        token_count((8000, 600), (4000, 300)),
        token_count((8000, 600), (4000, 300)),
    ]


def write_rollout(path: Path, entries: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(entry) + "\n" for entry in entries))
    return path


def stop(workdir: Path, transcript: object) -> None:
    done = codex_hook(codex_payload("06_stop.json", workdir, transcript_path=transcript))
    assert (done.returncode, done.stdout, done.stderr) == (0, b"", b"")


def test_the_stop_hook_writes_the_turns_tokens_from_the_rollout(workdir: Path) -> None:
    rollout = write_rollout(workdir / "rollout.jsonl", two_turns())
    stop(workdir, str(rollout))
    assert kinds(workdir) == ["usage", "turn.end"]
    usage = events(workdir)[0]
    # The second turn only: 8000 - (4000 - 3000) in, 600 - (300 - 200) out.
    assert (usage["input_tokens"], usage["output_tokens"]) == (7000, 500)


def test_a_rollout_without_turn_starts_opens_turns_at_the_prompts(workdir: Path) -> None:
    prompt = {"type": "event_msg", "payload": {"type": "user_message", "message": "go on"}}
    entries = [
        prompt if entry["payload"].get("type") == "task_started" else entry for entry in two_turns()
    ]
    stop(workdir, str(write_rollout(workdir / "rollout.jsonl", entries)))
    usage = events(workdir)[0]
    assert (usage["kind"], usage["input_tokens"], usage["output_tokens"]) == ("usage", 7000, 500)


def test_a_turn_ended_twice_writes_its_tokens_once(workdir: Path) -> None:
    rollout = write_rollout(workdir / "rollout.jsonl", two_turns())
    stop(workdir, str(rollout))
    stop(workdir, str(rollout))  # the same hook from a second config layer
    assert kinds(workdir) == ["usage", "turn.end"]


def test_a_missing_broken_or_hostile_rollout_still_ends_the_turn(workdir: Path) -> None:
    fifo = workdir / "pipe.jsonl"
    os.mkfifo(fifo)
    broken = workdir / "broken.jsonl"
    broken.write_bytes(
        b'{"type":"event_msg","payload":{"type":"token_count","info":{"total_token_us\n'
        b"\xff\xfe not json\n[1, 2]\n" + b"[" * 100_000 + b"\n"
        b'{"type":"event_msg","payload":{"type":"token_count","info":{"total_token_usage":'
        b'{"input_tokens":"many","output_tokens":-5}}}}\n'
    )
    for transcript in (
        None,
        42,
        str(workdir / "absent.jsonl"),
        str(fifo),
        str(workdir),
        str(broken),
    ):
        stop(workdir, transcript)
        assert kinds(workdir)[-1] == "turn.end", transcript
        assert "usage" not in kinds(workdir), transcript
        (workdir / "logs" / "events.jsonl").unlink()
        (workdir / "logs" / ".taskcard-codex-turns.json").unlink()


def test_a_huge_rollout_is_read_from_its_tail(workdir: Path) -> None:
    rollout = workdir / "rollout.jsonl"
    filler = json.dumps({"type": "response_item", "payload": {"text": "x" * 1000}}) + "\n"
    with rollout.open("w") as handle:
        for entry in two_turns()[:4]:
            handle.write(json.dumps(entry) + "\n")
        handle.write(filler * 6000)  # ~6 MB, beyond what is read
        for entry in two_turns()[4:]:
            handle.write(json.dumps(entry) + "\n")
    stop(workdir, str(rollout))
    usage = events(workdir)[0]
    assert (usage["kind"], usage["input_tokens"], usage["output_tokens"]) == ("usage", 7000, 500)


def test_a_failed_mcp_tool_shows_as_failed_and_a_good_one_as_done(workdir: Path) -> None:
    base = codex_payload("05_post_tool_use.json", workdir, tool_name="mcp__tracker__create_issue")
    failed = {
        **base,
        "tool_use_id": "call_bad",
        "tool_response": {
            "content": [{"type": "text", "text": "permission denied"}],
            "isError": True,
        },
    }
    good = {
        **base,
        "tool_use_id": "call_good",
        "tool_response": {"content": [{"type": "text", "text": "created #12"}], "isError": False},
    }
    for data in (failed, good, codex_payload("05_post_tool_use.json", workdir)):
        done = codex_hook(data)
        assert (done.returncode, done.stdout) == (0, b"")
    assert [(e["call_id"], e["ok"]) for e in events(workdir)] == [
        ("call_bad", False),
        ("call_good", True),
        ("call_Xq81bT0n", True),
    ]


def test_a_turn_a_stop_hook_continued_writes_its_tokens_once_whole(workdir: Path) -> None:
    """A stop hook of the user's blocks the turn's first stop; Codex goes on under the same
    turn id and stops again with `stop_hook_active` (two config layers' copies), then its
    notify. The rollout's count at the second stop is the whole turn's: the part after the
    first stop was never written."""
    entries = two_turns()
    rollout = write_rollout(workdir / "rollout.jsonl", entries[:6])  # the turn's first call
    codex_hook(codex_payload("02_user_prompt_submit.json", workdir, transcript_path=str(rollout)))
    stop(workdir, str(rollout))
    write_rollout(rollout, entries)  # the continued part: one more call
    for _copy in range(2):
        done = codex_hook(
            codex_payload(
                "06_stop.json",
                workdir,
                transcript_path=str(rollout),
                stop_hook_active=True,
                last_assistant_message="Fixed the lint the check asked for.",
            )
        )
        assert (done.returncode, done.stdout) == (0, b"")
    usage = [
        (e["input_tokens"], e["output_tokens"]) for e in events(workdir) if e["kind"] == "usage"
    ]
    assert usage == [(3000, 200), (4000, 300)]  # 7000 in, 500 out: the whole turn, once
    assert kinds(workdir).count("turn.end") == 2
    # The same turn id in a new turn (an older Codex's numbering): counted afresh.
    codex_hook(codex_payload("02_user_prompt_submit.json", workdir))
    stop(workdir, str(rollout))
    assert [e["input_tokens"] for e in events(workdir) if e["kind"] == "usage"][-1] == 7000


def test_a_turn_notify_ended_first_still_writes_its_tokens(workdir: Path) -> None:
    """Codex's notify can report the turn before its Stop hook does: the stop no longer ends
    it, but the turn's tokens, which only the hook reads, are still written."""
    from .test_codex_hooks import notify

    rollout = write_rollout(workdir / "rollout.jsonl", two_turns())
    notify(workdir, TURN)
    stop(workdir, str(rollout))
    assert kinds(workdir) == ["turn.end", "usage"]
    assert (events(workdir)[1]["input_tokens"], events(workdir)[1]["output_tokens"]) == (7000, 500)


@pytest.mark.parametrize(
    ("planted", "kind", "said"),
    [
        *[
            (f"logs/.taskcard-codex-{name}.json.lock", kind, 2)  # each event takes the lock
            for name in ("turns", "usage")
            for kind in ("folder", "fifo", "link out")
        ],
        ("logs/.taskcard-codex-turns.json", "folder", 1),  # only the stop writes a record
        ("logs/.taskcard-codex-usage.json", "folder", 1),
    ],
)
def test_a_planted_turn_record_costs_only_that_record_never_the_event(
    workdir: Path, tmp_path: Path, planted: str, kind: str, said: int
) -> None:
    """The files where the hooks note which Codex turns ended and the tokens written of each
    are bookkeeping: a folder, a pipe or a link out of the workdir at one of them lost every
    prompt and stop event (one line in the hook log), where Claude Code's events were written
    without the waits' record. Each is written now, and the hook log says which file is in the
    way, once for each event that needed it."""
    path = workdir / planted
    path.parent.mkdir(parents=True)
    if kind == "folder":
        path.mkdir()
    elif kind == "fifo":
        os.mkfifo(path)
    else:
        (tmp_path / "elsewhere").mkdir()
        path.symlink_to(tmp_path / "elsewhere")
    rollout = write_rollout(workdir / "rollout.jsonl", two_turns())
    log = workdir / "logs" / "taskcard-hook.log"
    for data in (
        codex_payload("02_user_prompt_submit.json", workdir),
        codex_payload("06_stop.json", workdir, transcript_path=str(rollout)),
    ):
        done = codex_hook(data)
        assert (done.returncode, done.stdout, done.stderr) == (0, b"", b"")
    assert kinds(workdir) == ["turn.start", "usage", "turn.end"]
    usage = events(workdir)[1]
    assert (usage["input_tokens"], usage["output_tokens"]) == (7000, 500)  # as with it
    text = log.read_text()
    assert "Traceback" not in text
    lines = [line for line in text.splitlines() if re.search(f"{re.escape(str(path))}[: ]", line)]
    assert len(lines) == said, text
    assert all("cannot write the hook's files" in line for line in lines), text
    assert all("the event is written without the record" in line for line in lines), text
    if kind == "link out":
        assert not list((tmp_path / "elsewhere").iterdir())
