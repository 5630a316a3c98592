"""429 pauses are bounded: whatever `retry_after` a platform sends, a chat waits at most
`limits.max_pause_s`, also when the pause comes from an old state file, and `taskcard status`
shows each pause with its end time. Driven through the fake Bot API's real 429 error shape."""

from __future__ import annotations

import itertools
import json
import sqlite3
import time
from collections.abc import AsyncIterator
from datetime import datetime
from pathlib import Path

import pytest

from taskcard.bridge.store.sqlite import STATE_FILE, SqliteStore
from tests.e2e.harness import (
    LONG_WINDOW_S,
    ServeProcess,
    eventually,
    lift_long_pauses,
    publish,
    run_cli,
)
from tests.e2e.test_serve_telegram import GROUP, agent_dir, setup, shown
from tests.fakes.telegram_api import FakeLimits, FakeTelegram, Window

HUGE = 1_000_000_000  # about 31 years


@pytest.fixture
async def fake() -> AsyncIterator[FakeTelegram]:
    async with FakeTelegram() as server:
        yield server


def flood(fake: FakeTelegram, method: str, retry_after: object) -> None:
    fake.fail_next(
        method, 429, f"Too Many Requests: retry after {retry_after}", {"retry_after": retry_after}
    )


def asked_before(fake: FakeTelegram, after_s: float, until_s: float) -> list[str]:
    """The methods the fake was asked after `after_s` and before `until_s` (its clock)."""
    return [r.method for r in fake.requests if after_s < r.at_s < until_s]


def pause_ends(config: Path) -> list[float]:
    """The end times `taskcard status` prints for the active pauses, as epochs."""
    result = run_cli("status", "--config", str(config))
    assert result.returncode == 0, result.stderr
    ends = []
    for line in result.stdout.splitlines():
        if line.startswith("rate-limit pause:"):
            ends.append(datetime.fromisoformat(line.rsplit(" until ", 1)[1]).timestamp())
    return ends


async def card_lands(tmp_path: Path, fake: FakeTelegram, text: str, what: str) -> None:
    """Publish `text` as the builder's card and wait until the group shows it."""
    publish(agent_dir(tmp_path, "builder"), text)
    await eventually(lambda: any(text in t for t in shown(fake, GROUP)), timeout_s=60, what=what)


async def test_a_huge_retry_after_is_capped_and_the_card_lands(
    tmp_path: Path, fake: FakeTelegram
) -> None:
    serve = setup(
        tmp_path, fake, ["builder"], [(GROUP, ["builder"])], limits="[limits]\nmax_pause_s = 2"
    )
    flood(fake, "sendMessage", HUGE)
    with serve:
        await card_lands(tmp_path, fake, "after the flood", "the card after a capped pause")
        assert await serve.aterminate() == 0
    assert "max_pause_s" in serve.logs, "the cap is logged"


@pytest.mark.parametrize("retry_after", [HUGE, 1e300, "Infinity"])
async def test_status_shows_each_pause_ending_within_the_cap(
    tmp_path: Path, fake: FakeTelegram, retry_after: object
) -> None:
    serve = setup(tmp_path, fake, ["builder"], [(GROUP, ["builder"])])
    if retry_after == "Infinity":
        # Python's JSON writer emits the bare token Infinity, as a broken server might.
        retry_after = float("inf")
    flood(fake, "sendMessage", retry_after)
    with serve:
        publish(agent_dir(tmp_path, "builder"), "paused card")
        await eventually(lambda: fake.count("sendMessage") >= 1, what="the flooded send")
        started = time.time()
        ends = await eventually(lambda: pause_ends(serve.config), what="a pause in the status")
        assert all(started < end <= started + 3600 + 60 for end in ends), ends
        assert await serve.aterminate() == 0
    # Across a restart the pause is still the capped one, never the asked-for one.
    ends = pause_ends(serve.config)
    assert ends and all(end <= time.time() + 3600 for end in ends), ends


async def test_a_stored_pause_from_an_old_state_file_is_capped(
    tmp_path: Path, fake: FakeTelegram
) -> None:
    serve = setup(
        tmp_path, fake, ["builder"], [(GROUP, ["builder"])], limits="[limits]\nmax_pause_s = 3"
    )
    old = SqliteStore.in_dir(tmp_path / ".taskcard")
    old.set_pause(f"telegram:chat:{GROUP}", time.time() + HUGE)
    old.set_pause("telegram:bot", time.time() + HUGE)
    old.close()
    ends = pause_ends(serve.config)
    assert len(ends) == 2 and all(end <= time.time() + 3 for end in ends), ends
    with serve:
        await card_lands(
            tmp_path, fake, "despite the old pause", "the card once the capped pause ended"
        )
        assert await serve.aterminate() == 0
    assert "capped" in serve.logs


async def test_a_quick_restart_keeps_to_the_window_the_last_run_filled(tmp_path: Path) -> None:
    """A group's window filled by the last run (cards posted, then edited) and a restart at
    once: the new run used to know one request per resident (its last edit) and sent as if
    the rest of the window were free, and the platform answered 429. It waits instead."""
    agents = ["a1", "a2", "a3"]
    limits = FakeLimits(private_chat=Window(1, 1.0), group_chat=Window(6, 12.0), bot=Window(30, 1))
    group_limit = "[telegram.limits]\ngroup_chat = { max_calls = 6, period_s = 12.0 }"
    async with FakeTelegram(limits=limits) as fake:
        serve = setup(tmp_path, fake, agents, [(GROUP, agents)], limits=group_limit)
        with serve:
            for round_no in (1, 2):  # three sends, then three edits: the window is full
                for agent in agents:
                    publish(agent_dir(tmp_path, agent), f"{agent} round {round_no}")
                await eventually(
                    lambda n=round_no: sum(f"round {n}" in t for t in shown(fake, GROUP)) == 3,
                    what=f"round {round_no} shown",
                )
            assert await serve.aterminate() == 0, serve.logs
        restarted = ServeProcess(serve.config, env={"TC_TEST_TOKEN": fake.token})
        with restarted:
            for agent in agents:
                publish(agent_dir(tmp_path, agent), f"{agent} after the restart")
            await eventually(
                lambda: sum("after the restart" in t for t in shown(fake, GROUP)) == 3,
                timeout_s=90,
                what="every card after the restart",
            )
            assert await restarted.aterminate() == 0, restarted.logs
        assert fake.rate_limited == [], "no 429 after the quick restart"


def kept_requests(state_dir: Path) -> int:
    """How many requests the state file keeps in the rate windows for the next start."""
    store = SqliteStore.in_dir(state_dir, readonly=True)
    try:
        raw = store.get_cursor("ratelimit:recent")
    finally:
        store.close()
    return sum(len(window["at"]) for window in json.loads(raw or "[]"))


async def test_a_restart_after_a_sigkill_keeps_to_the_window_the_last_run_filled(
    tmp_path: Path,
) -> None:
    """As above, but the first run is killed: the windows were kept only at a clean stop, so
    the run after a crash knew one request per resident and drew a 429. They are kept with
    the batched state writes of the timer now, so a crash loses a second of them at most."""
    agents = ["a1", "a2", "a3"]
    limits = FakeLimits(private_chat=Window(1, 1.0), group_chat=Window(6, 20.0), bot=Window(30, 1))
    group_limit = "[telegram.limits]\ngroup_chat = { max_calls = 6, period_s = 20.0 }"
    async with FakeTelegram(limits=limits) as fake:
        serve = setup(tmp_path, fake, agents, [(GROUP, agents)], limits=group_limit)
        with serve:
            for round_no in (1, 2):  # three sends, then three edits: the window is full
                for agent in agents:
                    publish(agent_dir(tmp_path, agent), f"{agent} round {round_no}")
                await eventually(
                    lambda n=round_no: sum(f"round {n}" in t for t in shown(fake, GROUP)) == 3,
                    what=f"round {round_no} shown",
                )
            await eventually(
                lambda: kept_requests(tmp_path / ".taskcard") >= 6,
                what="the full window kept in the state file while the service runs",
            )
            serve.kill()
        restarted = ServeProcess(serve.config, env={"TC_TEST_TOKEN": fake.token})
        with restarted:
            for agent in agents:
                publish(agent_dir(tmp_path, agent), f"{agent} after the crash")
            await eventually(
                lambda: sum("after the crash" in t for t in shown(fake, GROUP)) == 3,
                timeout_s=90,
                what="every card after the restart",
            )
            assert await restarted.aterminate() == 0, restarted.logs
        assert fake.rate_limited == [], "no 429 after the restart that followed a SIGKILL"


@pytest.mark.parametrize(
    "windows",
    [
        '[{"scope": "telegram:bot", "max_calls": 1e999, "period_s": 1, "at": [NOW]}]',
        '[{"scope": "telegram:bot", "max_calls": 30, "period_s": 1, "at": [1e999]}]',
        '{"scope": "telegram:bot"}',
    ],
    ids=["infinite-max-calls", "infinite-time", "not-a-list"],
)
async def test_rate_windows_of_a_state_file_edited_by_hand_are_ignored(
    tmp_path: Path, fake: FakeTelegram, windows: str
) -> None:
    """The windows a stop keeps for the next start, mangled by hand: the start says it ignores
    them and serves, instead of ending on an `OverflowError` before the first card."""
    serve = setup(tmp_path, fake, ["builder"], [(GROUP, ["builder"])])
    old = SqliteStore.in_dir(tmp_path / ".taskcard")
    old.set_cursor("ratelimit:recent", windows.replace("NOW", str(time.time() - 0.5)))
    old.close()
    with serve:
        await card_lands(tmp_path, fake, "despite the mangled windows", "the card")
        assert await serve.aterminate() == 0, serve.logs
    assert "Traceback" not in serve.logs


def inside_the_window(fake: FakeTelegram, chat: int, retry_after_s: float) -> list[str]:
    """The requests naming `chat` that the fake received after its first 429 and before that
    answer's `retry_after` had passed (the service starts counting later still, on receipt)."""
    flooded = next(r for r in fake.requests if r.status == 429)
    end_s = flooded.at_s + retry_after_s
    return [r.method for r in fake.requests if r.chat_id == chat and flooded.at_s < r.at_s < end_s]


async def test_a_pin_answered_429_is_tried_again_once_its_window_has_passed(
    tmp_path: Path, fake: FakeTelegram
) -> None:
    """A 429 on the pin of a new card: Telegram's answer to a request naming the chat says
    "this chat, wait", so nothing goes to the chat inside the window (the card's next change
    waits too), and once it has passed the pin is tried again, without any further change."""
    serve = setup(tmp_path, fake, ["builder"], [(GROUP, ["builder"])], allowed="pin = true")
    builder = agent_dir(tmp_path, "builder")
    flood(fake, "pinChatMessage", 3)
    with serve:
        publish(builder, "builder v1")
        await eventually(lambda: fake.count("pinChatMessage") == 1, what="the refused pin")
        publish(builder, "builder v2")
        await eventually(
            lambda: [m.pinned for m in fake.bot_messages(GROUP)] == [True],
            timeout_s=60,
            what="the card pinned after the window",
        )
        await eventually(
            lambda: any("builder v2" in t for t in shown(fake, GROUP)), what="the card's change"
        )
        assert await serve.aterminate() == 0
    assert inside_the_window(fake, GROUP, 3) == []
    assert fake.count("pinChatMessage") == 2
    assert fake.count("sendMessage") == 1


async def test_a_delete_answered_429_is_tried_again_once_its_window_has_passed(
    tmp_path: Path, fake: FakeTelegram
) -> None:
    """A card that could not be edited any more is posted anew, and the delete of the copy
    it replaced draws a 429: after the window the delete is tried again by itself (the agent
    changes nothing more), and nothing goes to the chat inside the window."""
    serve = setup(tmp_path, fake, ["builder"], [(GROUP, ["builder"])])
    builder = agent_dir(tmp_path, "builder")
    with serve:
        publish(builder, "builder v1")
        await eventually(lambda: shown(fake, GROUP), what="the card")
        [old] = fake.bot_messages(GROUP)
        fake.fail_next("editMessageText", 400, "Bad Request: message can't be edited")
        flood(fake, "deleteMessage", 3)
        publish(builder, "builder v2")
        await eventually(lambda: fake.count("deleteMessage") == 1, what="the refused delete")
        await eventually(
            lambda: old.deleted, timeout_s=60, what="the replaced copy deleted after the window"
        )
        assert await serve.aterminate() == 0
    assert inside_the_window(fake, GROUP, 3) == []
    [card] = shown(fake, GROUP)
    assert "builder v2" in card
    assert fake.count("deleteMessage") == 2


async def test_a_delete_put_off_by_a_429_is_made_after_a_restart_inside_its_window(
    tmp_path: Path, fake: FakeTelegram
) -> None:
    """A card that could not be edited any more is posted anew, the delete of the copy it
    replaced draws a 429, and the service stops inside the window: the next run deletes the
    copy once the window has passed, though its agent changes nothing (the put-off delete
    was kept in memory only: after the restart it waited for the route's next delivery,
    maybe for ever). Nothing reaches the chat inside the window."""
    serve = setup(tmp_path, fake, ["builder"], [(GROUP, ["builder"])])
    builder = agent_dir(tmp_path, "builder")
    with serve:
        publish(builder, "builder v1")
        await eventually(lambda: shown(fake, GROUP), what="the card")
        [old] = fake.bot_messages(GROUP)
        fake.fail_next("editMessageText", 400, "Bad Request: message can't be edited")
        flood(fake, "deleteMessage", LONG_WINDOW_S)
        publish(builder, "builder v2")
        await eventually(lambda: fake.count("deleteMessage") == 1, what="the refused delete")
        assert await serve.aterminate() == 0
    assert not old.deleted
    assert inside_the_window(fake, GROUP, LONG_WINDOW_S) == []
    restart_s = time.monotonic()
    capped_s = lift_long_pauses(serve.config)
    restarted = ServeProcess(serve.config, env={"TC_TEST_TOKEN": fake.token})
    with restarted:
        await eventually(
            lambda: old.deleted, timeout_s=60, what="the replaced copy deleted by the next run"
        )
        assert await restarted.aterminate() == 0, restarted.logs
    assert "deleteMessage" not in asked_before(fake, restart_s, capped_s)
    [card] = shown(fake, GROUP)
    assert "builder v2" in card
    assert fake.count("deleteMessage") == 2
    assert fake.count("sendMessage") == 2


async def test_a_pin_put_off_by_a_429_is_made_after_a_restart_inside_its_window(
    tmp_path: Path, fake: FakeTelegram
) -> None:
    """The pin of a new card draws a 429 and the service stops inside the window: the next
    run pins the card once the window has passed, though its agent changes nothing and no
    message is posted (the put-off pin was kept in memory only: after the restart it
    waited for a new message, maybe for ever). Nothing reaches the chat inside the window."""
    serve = setup(tmp_path, fake, ["builder"], [(GROUP, ["builder"])], allowed="pin = true")
    flood(fake, "pinChatMessage", LONG_WINDOW_S)
    with serve:
        publish(agent_dir(tmp_path, "builder"), "builder v1")
        await eventually(lambda: fake.count("pinChatMessage") == 1, what="the refused pin")
        assert await serve.aterminate() == 0
    assert inside_the_window(fake, GROUP, LONG_WINDOW_S) == []
    restart_s = time.monotonic()
    capped_s = lift_long_pauses(serve.config)
    restarted = ServeProcess(serve.config, env={"TC_TEST_TOKEN": fake.token})
    with restarted:
        await eventually(
            lambda: [m.pinned for m in fake.bot_messages(GROUP)] == [True],
            timeout_s=60,
            what="the card pinned by the next run",
        )
        assert await restarted.aterminate() == 0, restarted.logs
    assert "pinChatMessage" not in asked_before(fake, restart_s, capped_s)
    assert fake.count("pinChatMessage") == 2
    assert fake.count("sendMessage") == 1


async def test_a_pin_cut_short_by_a_sigkill_is_made_after_the_restart(
    tmp_path: Path, fake: FakeTelegram
) -> None:
    """The service dies while the pin of its new card is on its way (and Telegram did not
    pin it): the next run pins the card, though no new message is posted."""
    serve = setup(tmp_path, fake, ["builder"], [(GROUP, ["builder"])], allowed="pin = true")
    fake.fail_next("pinChatMessage", 500, "Internal Server Error")
    fake.delay_answers("pinChatMessage", 60)  # the answer never reaches the first run
    with serve:
        publish(agent_dir(tmp_path, "builder"), "builder v1")
        await eventually(lambda: fake.count("pinChatMessage") == 1, what="the pin on its way")
        serve.kill()
    fake.delay_answers("pinChatMessage", 0)
    restarted = ServeProcess(serve.config, env={"TC_TEST_TOKEN": fake.token})
    with restarted:
        await eventually(
            lambda: [m.pinned for m in fake.bot_messages(GROUP)] == [True],
            timeout_s=60,
            what="the card pinned by the next run",
        )
        assert await restarted.aterminate() == 0, restarted.logs
    assert fake.count("pinChatMessage") == 2
    assert fake.count("sendMessage") == 1


async def test_a_pin_that_failed_for_now_is_tried_again(tmp_path: Path, fake: FakeTelegram) -> None:
    """A pin answered with a server error is tried again after a backoff, without any
    further change of the card (it was dropped: the card stayed unpinned for good)."""
    serve = setup(tmp_path, fake, ["builder"], [(GROUP, ["builder"])], allowed="pin = true")
    fake.fail_next("pinChatMessage", 500, "Internal Server Error")
    with serve:
        publish(agent_dir(tmp_path, "builder"), "builder v1")
        await eventually(
            lambda: [m.pinned for m in fake.bot_messages(GROUP)] == [True],
            timeout_s=60,
            what="the card pinned at the second try",
        )
        assert await serve.aterminate() == 0, serve.logs
    assert fake.count("pinChatMessage") == 2
    assert fake.count("sendMessage") == 1


def bot_requests_inside_the_window(fake: FakeTelegram, retry_after_s: float) -> list[str]:
    """The requests of any kind the fake received after its first 429 and before that
    answer's `retry_after` had passed."""
    flooded = next(r for r in fake.requests if r.status == 429)
    end_s = flooded.at_s + retry_after_s
    return [r.method for r in fake.requests if flooded.at_s < r.at_s < end_s]


async def test_a_429_answered_to_the_start_is_a_pause_that_a_restart_keeps(
    tmp_path: Path, fake: FakeTelegram
) -> None:
    """`getMe` at the start draws a 429 and the service stops inside the window: the pause
    is stored like any other, so the next run does not ask again inside it (it waited in
    memory only, and the restart asked at once); the card goes once the window has passed."""
    serve = setup(tmp_path, fake, ["builder"], [(GROUP, ["builder"])])
    flood(fake, "getMe", LONG_WINDOW_S)
    with serve:
        await eventually(lambda: fake.count("getMe") == 1, what="the refused start")
        await eventually(lambda: pause_ends(serve.config), what="the pause in the status")
        assert await serve.aterminate() == 0, serve.logs
    assert bot_requests_inside_the_window(fake, LONG_WINDOW_S) == []
    restart_s = time.monotonic()
    capped_s = lift_long_pauses(serve.config)
    restarted = ServeProcess(serve.config, env={"TC_TEST_TOKEN": fake.token})
    with restarted:
        await card_lands(
            tmp_path, fake, "after the start's window", "the card once the window has passed"
        )
        assert await restarted.aterminate() == 0, restarted.logs
    assert asked_before(fake, restart_s, capped_s) == [], restarted.logs
    assert fake.count("getMe") == 2
    assert "channel telegram waits" in restarted.logs, "the wait is said"


async def test_a_menu_answered_429_every_time_never_holds_the_cards(
    tmp_path: Path, fake: FakeTelegram
) -> None:
    """`setMyCommands` is answered 429 with a long window, however often it is asked: the
    menu is optional, so the card goes out all the same (the start failed on the menu and
    was tried again after each window: no card went for as long as the 429s lasted). The
    window is stored over the menu alone and the menu is not asked again inside it."""
    serve = setup(tmp_path, fake, ["builder"], [(GROUP, ["builder"])])
    for _ in range(10):
        flood(fake, "setMyCommands", LONG_WINDOW_S)
    with serve:
        publish(agent_dir(tmp_path, "builder"), "card despite the menu")
        await eventually(
            lambda: any("card despite the menu" in t for t in shown(fake, GROUP)),
            timeout_s=LONG_WINDOW_S / 2,
            what="the card inside the menu's window",
        )
        ends = await eventually(lambda: pause_ends(serve.config), what="the menu's pause")
        assert len(ends) == 1, ends
        assert await serve.aterminate() == 0, serve.logs
    assert fake.count("setMyCommands") == 1
    assert fake.my_commands.get(("default", "")) is None
    assert "the /taskcard menu command is put off" in serve.logs


async def test_a_menu_put_off_by_a_429_is_set_after_the_window_and_given_up_after_a_few(
    tmp_path: Path, fake: FakeTelegram
) -> None:
    """A menu answered 429 is asked again once its window has passed, once per window, and
    set when Telegram takes it; answered 429 every time, it is given up after a few tries
    (until the next start) while the cards keep going."""
    serve = setup(tmp_path, fake, ["builder"], [(GROUP, ["builder"])])
    flood(fake, "setMyCommands", 1)
    flood(fake, "setMyCommands", 1)
    with serve:
        publish(agent_dir(tmp_path, "builder"), "first card")
        await eventually(lambda: fake.my_commands.get(("default", "")), what="the menu")
        assert any("first card" in t for t in shown(fake, GROUP))
        assert await serve.aterminate() == 0, serve.logs
    asked = [r.at_s for r in fake.requests if r.method == "setMyCommands"]
    assert len(asked) == 3
    assert all(later - earlier >= 1 for earlier, later in itertools.pairwise(asked)), asked

    fake.clear_failures()
    fake.my_commands.clear()
    for _ in range(10):
        flood(fake, "setMyCommands", 1)
    again = ServeProcess(serve.config, env={"TC_TEST_TOKEN": fake.token})
    with again:
        await eventually(
            lambda: "rate limited 4 times" in again.logs, timeout_s=60, what="the menu given up"
        )
        publish(agent_dir(tmp_path, "builder"), "second card")
        await eventually(
            lambda: any("second card" in t for t in shown(fake, GROUP)), what="the next card"
        )
        assert await again.aterminate() == 0, again.logs
    assert fake.count("setMyCommands") == 3 + 4


@pytest.mark.parametrize("value", ["'soon'", "'nan'", "'inf'", "x'00ff'"])
async def test_a_stored_pause_that_is_no_time_is_skipped_and_the_rest_kept(
    tmp_path: Path, fake: FakeTelegram, value: str
) -> None:
    """A pause edited by hand into something that is no time ended `serve` in a traceback
    while `serve --check` called the state valid. It is skipped with a warning naming the
    scope; the other, readable pause is still honoured and the card still lands."""
    serve = setup(
        tmp_path, fake, ["builder"], [(GROUP, ["builder"])], limits="[limits]\nmax_pause_s = 3"
    )
    old = SqliteStore.in_dir(tmp_path / ".taskcard")
    # Far beyond the 3 s cap, so that it is still running whenever the service starts: the
    # service cuts it to the cap and honours it.
    old.set_pause("telegram:bot", time.time() + 600)
    old.close()
    with sqlite3.connect(tmp_path / ".taskcard" / STATE_FILE) as db:
        db.execute(
            f"INSERT INTO pauses (scope, until_epoch) VALUES ('telegram:chat:{GROUP}', {value})"
        )
    assert len(pause_ends(serve.config)) == 1
    with serve:
        await card_lands(tmp_path, fake, "despite the odd pause", "the card")
        assert await serve.aterminate() == 0
    assert f"rate-limit pause of telegram:chat:{GROUP} holds" in serve.logs
    assert "not a time; it is ignored" in serve.logs
    assert "honouring a rate-limit pause from before the restart: telegram:bot" in serve.logs
