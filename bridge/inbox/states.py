"""Which state a message to an agent is in, and the one line people read about it.

Pure. The outcome stored for a message (open, delivered, failed, cancelled) is final once it
is not "open"; an open message's state comes from the agent's activity (the inbox contract):

| state       | when                                                                      |
|-------------|---------------------------------------------------------------------------|
| unconfirmed | no host has ever written the agent's activity log (nobody reads the       |
|             | inbox), the agent exited, or a turn runs and the message waited longer    |
|             | than `unconfirmed_after_s`                                                |
| parked      | the agent's session is idle (its turn ended, or it waits for input): it   |
|             | gets the text at its next turn; parked is not delivered                   |
| queued      | otherwise: a turn runs and its host hands queued text over, or the agent  |
|             | is in a state that tells no turn (unknown, no output), which the line     |
|             | says instead of promising a turn                                          |

The text a person typed is never part of the line: a chat member's text is not echoed.
"""

from __future__ import annotations

from datetime import datetime, timedelta, tzinfo
from typing import Final, Literal

from taskcard.bridge.compose.view import format_at
from taskcard.bridge.store.sqlite import InboxRecord
from taskcard.bridge.track.monitor import ActivitySummary

MessageState = Literal["queued", "parked", "unconfirmed", "delivered", "failed", "cancelled"]
# The agent states in which a turn runs, whose host hands queued text over (a consent
# prompt holds the turn, which goes on once it is answered).
TURN_STATES: Final = frozenset({"running", "waiting"})


def message_state(
    record: InboxRecord, activity: ActivitySummary, now: datetime, unconfirmed_after_s: float
) -> tuple[MessageState, datetime | None]:
    """(the state, when an open message's state next changes by time alone)."""
    if record.outcome != "open":
        return record.outcome, None
    if activity.last_event_at is None or activity.state == "exited":
        return "unconfirmed", None
    if activity.state in ("idle", "at prompt"):
        return "parked", None
    overdue = datetime.fromtimestamp(record.queued_at, now.tzinfo) + timedelta(
        seconds=unconfirmed_after_s
    )
    if now >= overdue:
        return "unconfirmed", None
    return "queued", overdue


def state_line(
    record: InboxRecord,
    state: MessageState,
    activity: ActivitySummary,
    now: datetime,
    zone: tzinfo,
) -> str:
    """The status line of the one reply message that follows a message's fate."""
    agent = record.agent_id
    queued = format_at(datetime.fromtimestamp(record.queued_at, now.tzinfo), now, zone)
    closed = (
        format_at(datetime.fromtimestamp(record.closed_at, now.tzinfo), now, zone)
        if record.closed_at is not None
        else None
    )
    head = f"✉ Message to {agent} (sent {queued}): "
    if state == "delivered":
        via = f" via {record.reason}" if record.reason else ""
        return head + f"delivered{' at ' + closed if closed else ''}{via}: the agent has it."
    if state == "failed":
        return head + f"failed: {record.reason or 'it could not be queued'}. Send it again."
    if state == "cancelled":
        why = record.reason or "withdrawn"
        return head + f"cancelled ({why}); the agent never saw it."
    if state == "parked":
        return (
            head + f"parked. {agent}'s session is idle; it gets the message when its next"
            " turn begins. Not delivered yet. /taskcard cancel withdraws it."
        )
    if state == "unconfirmed":
        if activity.last_event_at is None:
            why = f"no host reads {agent}'s activity, so nothing may pick it up"
        elif activity.state == "exited":
            why = f"{agent} exited; it is read when the agent starts again"
        elif activity.state in TURN_STATES:
            why = "a turn is running but no host has acknowledged it yet"
        else:
            why = f"no host has acknowledged it yet ({_no_turn(agent, activity)})"
        return head + f"unconfirmed: {why}. /taskcard cancel withdraws it."
    if activity.state not in TURN_STATES:
        # Unknown and no output tell no turn: the line says so rather than promise a turn
        # that may not run (the signals spec reads unknown as "check before deciding").
        return (
            head + f"queued; {_no_turn(agent, activity)}, so no running turn is known to hand"
            " it over: the next host to read its inbox does. /taskcard cancel withdraws it."
        )
    return head + "queued; the running turn's host hands it over. /taskcard cancel withdraws it."


def _no_turn(agent: str, activity: ActivitySummary) -> str:
    """What is known of an agent in a state that tells no turn, as a clause."""
    if activity.state == "no output":
        return f"{agent} has written nothing since it started"
    return f"{agent}'s state is {activity.state}"
