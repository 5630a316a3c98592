"""Signals: the four notices that tell people (and a parent agent) an agent owes them news.

| signal          | due when                                                              |
|-----------------|-----------------------------------------------------------------------|
| report          | a new report line (seq greater than any seen)                          |
| exited          | `agent.exit` with no report since `agent.start`                        |
| idle            | a live card, no report since the turn began, quiet beyond the floor    |
|                 | (never at a prompt: a shell has no turn, so it is never idle)          |
| no output       | `agent.start` and not one event since, past the start grace           |

Idle has three sentences because three different mechanisms lead there, and a wrong alarm
teaches people to ignore the true one: no host reads the agent (it *could not* report: no
accusation); the agent declared its turn finished (`turn.end`, a fact it wrote; one with an
`error` says the turn failed or was interrupted instead, never that the agent finished); or nothing
says whether a turn ended (inferred silence: how long, and a request to check, never a claim
that the agent gave up). No output warns and never kills: a slow start is not a failure.

Each signal has an episode id (the notice id): the same episode is announced once, across
restarts too, because the store refuses a notice id it already holds. Texts are built from
typed fields only; the free texts of a report (its summary and role) are redacted whole, with
the caller's redaction (the service's own secrets too), before they are cut: a cut first
could leave the front of a secret that redaction no longer recognises.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Final, Literal

from taskcard.bridge.compose.redact import redact
from taskcard.channels.base import counted
from taskcard.producers.reports.contract import Report
from taskcard.producers.task_card.contract import cut_line, iso_utc, one_line

SignalKind = Literal["report", "exited", "idle", "no output"]
IdleMechanism = Literal["no host", "turn ended", "silence"]
SUMMARY_CHARS: Final = 300
ROLE_CHARS: Final = 40
# An agent that exits owing a report less than this long after it started is told as one that
# may have failed to launch (the reference app counts a life under 30 s as a launch failure).
LAUNCH_FAILURE_S: Final = 30.0


@dataclass(frozen=True)
class SignalFacts:
    """What the signals are decided from (the tracked activity, card and latest report)."""

    agent_id: str
    state: str
    card_live: bool
    card_since: datetime | None
    started_at: datetime | None
    exited_at: datetime | None
    turn_started_at: datetime | None
    turn_ended_at: datetime | None
    last_event_at: datetime | None
    latest_report: Report | None
    turn_error: str | None = None  # the turn ended without finishing: why (a category word)


@dataclass(frozen=True)
class Signal:
    kind: SignalKind
    episode: str  # the notice id: one announcement per episode
    text: str
    report_seq: int | None = None  # the report's seq, for a "report" signal


def _one_line(text: str, limit: int, redactor: Callable[[str], str]) -> str:
    return cut_line(redactor(one_line(text)), limit)


def _minutes(seconds: float) -> str:
    """How long, in words: seconds under a minute (the idle floor may be as low as 5 s, and
    "1 minute" for 5 s of quiet would overstate it), whole minutes from then on."""
    if seconds < 59.5:
        whole = max(1, round(seconds))
        return counted(whole, "second", "seconds")
    return counted(round(seconds / 60), "minute", "minutes")


def report_outcome(report: Report, redactor: Callable[[str], str] = redact) -> str:
    """How a report ended, in one line: `ok, verdict approved, as reviewer.`"""
    parts = ["ok" if report.ok else "failed"]
    if report.verdict is not None:
        parts.append(f"verdict {report.verdict}")
    if report.role is not None:
        parts.append(f"as {_one_line(report.role, ROLE_CHARS, redactor)}")
    return ", ".join(parts) + "."


def report_summary(
    report: Report, limit: int = SUMMARY_CHARS, redactor: Callable[[str], str] = redact
) -> str:
    """A report's summary in one line of at most `limit` characters ("" when it has none),
    redacted whole before it is cut."""
    return "" if report.summary is None else _one_line(report.summary, limit, redactor)


def report_signal(agent_id: str, report: Report, redactor: Callable[[str], str] = redact) -> Signal:
    """The "report available" notice of one report; `redactor` is applied to each free text
    before it is cut (the service passes its `Redactor`, which knows its own secrets)."""
    text = f"📋 {agent_id} reported (#{report.seq}): {report_outcome(report, redactor)}"
    summary = report_summary(report, SUMMARY_CHARS, redactor)
    if summary:
        text += f"\n{summary}"
    # The date is part of the key: a series numbered from 1 again (reports/ moved aside)
    # must not be taken for the first series' notices already sent.
    stamp = int(report.at.timestamp() * 1000)
    return Signal("report", f"signal:report:{report.seq}:{stamp}", text, report.seq)


def _reported_since(report: Report | None, moment: datetime | None) -> bool:
    if report is None:
        return False
    return moment is None or report.at >= moment


def _launch_failure(facts: SignalFacts) -> str:
    """For a life shorter than `LAUNCH_FAILURE_S`, the words saying so: such an agent more
    likely failed to start than left its work unreported, and the sentence says which."""
    if facts.started_at is None or facts.exited_at is None:
        return ""
    life_s = (facts.exited_at - facts.started_at).total_seconds()
    if not 0 <= life_s < LAUNCH_FAILURE_S:
        return ""
    return (
        f" {round(life_s)} s after it started, too soon to have done its work: it may have"
        " failed to launch (check the command that starts it)"
    )


def due_signals(
    facts: SignalFacts, now: datetime, idle_floor_s: float
) -> tuple[list[Signal], datetime | None]:
    """The time-driven signals due now, and when the next one may become due."""
    agent = facts.agent_id
    due: list[Signal] = []
    if facts.exited_at is not None:
        if not _reported_since(facts.latest_report, facts.started_at):
            due.append(
                Signal(
                    "exited",
                    f"signal:exited:{iso_utc(facts.exited_at)}",
                    f"⏹ {agent} exited without a report{_launch_failure(facts)}.",
                )
            )
        return due, None
    if facts.state == "no output" and facts.started_at is not None:
        quiet_s = (now - facts.started_at).total_seconds()
        due.append(
            Signal(
                "no output",
                f"signal:no-output:{iso_utc(facts.started_at)}",
                f"⏸ {agent} started {round(quiet_s)} s ago and has written nothing since. It is"
                " still running; nothing was stopped.",
            )
        )
    # A shell at its prompt has no turn to have left without a report: the spec's state
    # table says it is never idle, and "no report since its turn began" would be untrue.
    if not facts.card_live or facts.state in ("waiting", "no output", "at prompt"):
        return due, None
    turn_began = facts.turn_started_at or facts.started_at
    if _reported_since(facts.latest_report, turn_began):
        return due, None
    anchor = facts.last_event_at or facts.card_since
    if anchor is None:
        return due, None
    ready_at = anchor + timedelta(seconds=idle_floor_s)
    if now < ready_at:
        return due, ready_at
    quiet = _minutes((now - anchor).total_seconds())
    mechanism: IdleMechanism
    if facts.last_event_at is None:
        mechanism = "no host"
        text = (
            f"💤 {agent} has a live card, but no host reads its activity, so it could not"
            f" report. Nothing has been heard from it for {quiet}."
        )
    elif facts.turn_ended_at is not None and (
        facts.turn_started_at is None or facts.turn_ended_at >= facts.turn_started_at
    ):
        mechanism = "turn ended"
        if facts.turn_error == "interrupted":
            text = f"💤 {agent}'s turn was interrupted {quiet} ago, and it has not reported."
        elif facts.turn_error is not None:
            text = (
                f"💤 {agent}'s turn ended in an error ({facts.turn_error}) {quiet} ago, and it"
                " has not reported."
            )
        else:
            text = f"💤 {agent} declared its turn finished {quiet} ago and has not reported."
    else:
        mechanism = "silence"
        text = (
            f"💤 {agent} has been quiet for {quiet} with a live card and no report since its"
            " turn began. Please check on it: this is silence, not proof that it stopped."
        )
    due.append(Signal("idle", f"signal:idle:{mechanism}:{iso_utc(anchor)}", text))
    return due, None
