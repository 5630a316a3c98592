"""Queued chat texts reach a Codex session through its lifecycle hooks (real subprocesses).

Codex reads `hookSpecificOutput.additionalContext` from a `UserPromptSubmit` or
`PostToolUse` hook's JSON, and a `Stop` hook's `{"decision": "block", "reason": ...}` makes
the turn go on with the reason as its next prompt, as Claude Code does.
"""

from __future__ import annotations

import json
from pathlib import Path

from ..hooks.conftest import events, kinds
from ..hooks.test_codex_hooks import codex_hook, codex_payload, notify
from ..hooks.test_codex_usage_and_failures import two_turns, write_rollout
from .conftest import acks, names, queue


def printed(done: object) -> dict[str, object]:
    assert getattr(done, "returncode", None) == 0
    data = json.loads(getattr(done, "stdout", b""))
    assert isinstance(data, dict)
    return data


def test_a_prompt_and_a_tool_result_hand_the_texts_to_codex_once(workdir: Path) -> None:
    queue(workdir, "m1", "what is the status?", origin="feishu:oc_abc")
    prompt = printed(codex_hook(codex_payload("02_user_prompt_submit.json", workdir)))
    specific = prompt["hookSpecificOutput"]
    assert isinstance(specific, dict)
    assert specific["hookEventName"] == "UserPromptSubmit"
    assert "> what is the status?" in specific["additionalContext"]
    started = events(workdir)[-1]
    assert (started["kind"], started["origin"]) == ("turn.start", "feishu:oc_abc")
    queue(workdir, "m2", "use the staging database", queued_at="2026-01-01T00:00:05.000Z")
    tool = printed(codex_hook(codex_payload("05_post_tool_use.json", workdir)))
    assert tool == {
        "hookSpecificOutput": {
            "hookEventName": "PostToolUse",
            "additionalContext": tool["hookSpecificOutput"]["additionalContext"],  # type: ignore[index]
        }
    }
    assert "> use the staging database" in str(tool)
    assert [(a["id"], a["via"]) for a in acks(workdir)] == [
        ("m1", "codex:UserPromptSubmit"),
        ("m2", "codex:PostToolUse"),
    ]
    assert names(workdir, "queued") == []
    again = codex_hook(codex_payload("05_post_tool_use.json", workdir))
    assert (again.returncode, again.stdout) == (0, b"")  # nothing twice


def test_a_stop_with_texts_queued_goes_on_and_its_next_stop_ends_the_turn_once(
    workdir: Path,
) -> None:
    queue(workdir, "m1", "stop now: the deploy is frozen")
    entries = two_turns()
    rollout = write_rollout(workdir / "rollout.jsonl", entries[:6])
    stop = codex_payload("06_stop.json", workdir, transcript_path=str(rollout))
    blocked = printed(codex_hook(stop))
    assert blocked["decision"] == "block"
    assert "> stop now: the deploy is frozen" in str(blocked["reason"])
    assert "turn.end" not in kinds(workdir)  # the turn goes on
    assert "usage" not in kinds(workdir)  # counted whole at the turn's real end
    write_rollout(rollout, entries)  # the turn went on: one more model call
    done = codex_hook({**stop, "stop_hook_active": True})
    assert (done.returncode, done.stdout) == (0, b"")
    assert kinds(workdir).count("turn.end") == 1
    usage = [event for event in events(workdir) if event["kind"] == "usage"]
    assert [(u["input_tokens"], u["output_tokens"]) for u in usage] == [(7000, 500)]
    turn = codex_payload("06_stop.json", workdir)["turn_id"]
    assert notify(workdir, turn).returncode == 0  # Codex's notify of the same turn
    assert kinds(workdir).count("turn.end") == 1


def test_a_subagents_hooks_take_no_texts(workdir: Path) -> None:
    queue(workdir, "m1", "for the main agent")
    sub = codex_payload("05_post_tool_use.json", workdir, agent_id="a1", agent_type="worker")
    done = codex_hook(sub)
    assert (done.returncode, done.stdout) == (0, b"")
    assert names(workdir, "queued") == ["m1.json"]


def test_the_copy_of_the_stop_hook_in_another_config_layer_does_not_end_a_held_turn(
    workdir: Path,
) -> None:
    # Codex runs the copies in ~/.codex and in the project at once: one claims the texts and
    # holds the stop, the other finds nothing; neither may end the turn, which goes on.
    queue(workdir, "m1", "also update the changelog")
    stop = codex_payload("06_stop.json", workdir)
    assert printed(codex_hook(stop))["decision"] == "block"
    other = codex_hook(stop)
    assert (other.returncode, other.stdout) == (0, b"")
    assert "turn.end" not in kinds(workdir)
    for _copy in range(2):  # the turn's real end, again from both layers
        done = codex_hook({**stop, "stop_hook_active": True})
        assert (done.returncode, done.stdout) == (0, b"")
    assert kinds(workdir).count("turn.end") == 1
    # The next turn's stop, with nothing queued, ends it as usual.
    later = {**stop, "turn_id": "019a3f6e-9100-7d21-b3c4-5e6f7a8b9c0e"}
    assert codex_hook(later).returncode == 0
    assert kinds(workdir).count("turn.end") == 2
