"""The inbox desk's bookkeeping: a card change looks only at its agent's open messages, and
closed messages leave memory once they are history (a long-running service that relayed many
messages must not keep, or scan, every one of them)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

from taskcard.bridge.config import InboxConfig
from taskcard.bridge.run.inbox_desk import KEEP_CLOSED_S, InboxDesk, status_key
from taskcard.bridge.store.sqlite import SqliteStore
from taskcard.bridge.track.activity import ActivitySummary
from taskcard.channels.base import ChatRef
from taskcard.producers.reports.contract import Ack
from tests.bridge.test_scheduler import ScriptedChannel, settle, started, store  # noqa: F401

CHAT = ChatRef("-100")


async def test_closed_messages_leave_memory_after_a_day_and_open_ones_stay(
    tmp_path: Path,
    store: SqliteStore,  # noqa: F811
) -> None:
    for agent in ("a", "b"):
        (tmp_path / agent).mkdir()
    channel = ScriptedChannel()
    scheduler = await started(store, channel)
    now = [datetime(2026, 12, 1, 9, 0, tzinfo=UTC)]
    desk = InboxDesk(
        InboxConfig(max_messages=100),
        store,
        scheduler,
        {"fake": channel},
        {"a": tmp_path / "a", "b": tmp_path / "b"},
        clock=lambda: now[0],
        activity=lambda _agent: ActivitySummary(state="running"),
        zone=lambda _channel, _chat: UTC,
        render=lambda ch, view: ch.render_card(view),
    )
    desk.channel_ready("fake")
    for agent in ("a", "a", "b"):
        assert desk.queue("fake", CHAT, agent, "ann", f"hello {agent}") is None
    records = {r.message_id: r for r in store.inbox_messages(0)}
    first_a, second_a = (i for i, r in records.items() if r.agent_id == "a")
    (only_b,) = (i for i, r in records.items() if r.agent_id == "b")
    assert desk.open_messages() == 3

    desk.on_acks("a", [Ack(first_a, now[0], "hook")])
    desk.on_acks("b", [Ack(first_a, now[0], "hook")])  # another agent's id: not b's to close
    assert desk.open_messages() == 2
    await settle(scheduler)
    delivered = status_key(records[first_a])
    assert scheduler.message_id(delivered) is not None

    now[0] += timedelta(seconds=KEEP_CLOSED_S - 60)
    desk.refresh()  # the timer: a day has not passed since it closed
    assert scheduler.message_id(delivered) is not None

    now[0] += timedelta(seconds=120)
    desk.refresh()
    assert scheduler.message_id(delivered) is None  # its status message is history
    desk.on_acks("a", [Ack(first_a, now[0], "hook")])  # a late duplicate ack: ignored
    assert desk.open_messages() == 2  # the open ones are kept however old
    for message_id in (second_a, only_b):
        assert scheduler.message_id(status_key(records[message_id])) is not None

    assert "latest message to a was cancelled" in desk.cancel_latest("fake", CHAT, "ann")
    assert desk.open_messages() == 1
    desk.remove_agent("b")
    assert desk.open_messages() == 0
    await settle(scheduler)
    await scheduler.stop()
