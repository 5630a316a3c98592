"""Which state an agent is in, decided from the facts of its activity log alone.

The states, as people read them (the reports-and-signals table mapped to agents):

| state       | the evidence                                                              |
|-------------|---------------------------------------------------------------------------|
| exited      | `agent.exit` after the latest `agent.start`                               |
| waiting     | `wait.start` for a consent decision (reason `permission`, or any reason   |
|             | but `input`) and no `wait.end` yet                                        |
| no output   | `agent.start` and not one event after it for `start_silence_s`: a warning |
|             | only; the first event clears it                                           |
| running     | a turn is open and the log moved within `no_output_after_s`; a            |
|             | `tool.start` after the latest `turn.end` opens a turn (a new one began)   |
| idle        | the turn was declared finished (`turn.end`), or the agent waits for input |
| at prompt   | it started and spoke, but never had a turn (a shell): never idle          |
| unknown     | nothing tells work from silence: no events, an open turn silent beyond    |
|             | `no_output_after_s`, a fresh start still inside its grace                 |

Unknown is said plainly instead of guessing idle: a wrong "idle" teaches people to dispatch
work onto an agent that is busy.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from taskcard.channels.base import AgentState

INPUT_WAIT = "input"


@dataclass(frozen=True)
class StateFacts:
    """What the activity log said, reduced to what the state depends on."""

    exited_at: datetime | None = None
    waiting_since: datetime | None = None
    waiting_reason: str | None = None
    started_at: datetime | None = None
    after_start: bool = False  # any event since the latest `agent.start`
    turns_after_start: bool = False  # any turn fact since it
    turn_started_at: datetime | None = None
    turn_ended_at: datetime | None = None
    last_event_at: datetime | None = None


def agent_state(
    facts: StateFacts, now: datetime, no_output_after_s: float, start_silence_s: float
) -> tuple[AgentState, datetime | None, datetime | None]:
    """(state, since when, until when this answer holds without a new event)."""
    if facts.exited_at is not None:
        return "exited", facts.exited_at, None
    if facts.waiting_since is not None and facts.waiting_reason != INPUT_WAIT:
        return "waiting", facts.waiting_since, None
    if facts.started_at is not None and not facts.after_start:
        silent_from = facts.started_at + timedelta(seconds=start_silence_s)
        if now >= silent_from:
            return "no output", facts.started_at, None
        return "unknown", facts.started_at, silent_from
    turn_open = facts.turn_started_at is not None and facts.turn_ended_at is None
    if turn_open and facts.waiting_since is None:
        assert facts.turn_started_at is not None
        last = facts.last_event_at or facts.turn_started_at
        silent_from = last + timedelta(seconds=no_output_after_s)
        if now >= silent_from:
            return "unknown", last, None
        return "running", facts.turn_started_at, silent_from
    if facts.waiting_since is not None:  # waiting for input: the agent stopped for you
        return "idle", facts.waiting_since, None
    if facts.turn_ended_at is not None:
        return "idle", facts.turn_ended_at, None
    if facts.started_at is not None and not facts.turns_after_start:
        return "at prompt", facts.started_at, None
    return "unknown", None, None
