"""SIGUSR1 on `taskcard serve`: every thread's and task's stack on stderr, the service goes on.

And the harness's side of it: a service that does not exit in time after SIGTERM fails its
test with those stacks and the tail of its log in the failure message, so that a stop which
hangs once under load can be read afterwards instead of guessed at.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.e2e.harness import TOKEN_ENV, ServeProcess, eventually, publish, telegram_config
from tests.fakes.telegram_api import FakeLimits, FakeTelegram

GROUP = -1007000000000
FOOTER = "--- end of asyncio tasks ---"


@pytest.fixture
async def fake() -> AsyncIterator[FakeTelegram]:
    async with FakeTelegram(limits=FakeLimits.unlimited()) as server:
        yield server


def serving(tmp_path: Path, fake: FakeTelegram) -> ServeProcess:
    config = telegram_config(tmp_path, fake.base_url, GROUP)
    return ServeProcess(config, env={TOKEN_ENV: fake.token})


async def stacks_of(serve: ServeProcess) -> list[str]:
    """The stderr lines of one dump: SIGUSR1 sent, read until its footer."""
    mark = len(serve.stderr)
    serve._ask_for_stacks()
    await eventually(lambda: FOOTER in "".join(serve.stderr[mark:]), what="the stacks")
    return serve.stderr[mark:]


def texts(fake: FakeTelegram) -> list[str]:
    return [m.text for m in fake.bot_messages(GROUP)]


async def test_sigusr1_prints_every_stack_and_the_service_goes_on(
    tmp_path: Path, fake: FakeTelegram
) -> None:
    with serving(tmp_path, fake) as serve:
        workdir = tmp_path / "agents" / "builder"
        publish(workdir, "first card")
        await eventually(lambda: any("first card" in t for t in texts(fake)), what="the card")
        dump = "".join(await stacks_of(serve))
        # Every thread, by faulthandler (the main thread sits in the event loop) ...
        assert "most recent call first" in dump
        assert "run_forever" in dump
        # ... and every asyncio task, with what it awaits.
        for task in ("'watch'", "'timer'", "'telegram-command-poll'"):
            assert f"task {task}" in dump, task
        assert "get_updates" in dump or "wait_turn" in dump or "_read_answer" in dump
        assert serve.proc is not None and serve.proc.poll() is None, "still running"
        publish(workdir, "second card")
        await eventually(lambda: any("second card" in t for t in texts(fake)), what="an edit")
        assert fake.rate_limited == []
        assert await serve.aterminate() == 0


async def test_with_json_logs_every_line_of_the_dump_is_a_json_record(
    tmp_path: Path, fake: FakeTelegram
) -> None:
    """The dump was plain text in a JSON log, so a shipper reading one object per line
    choked on it."""
    config = telegram_config(tmp_path, fake.base_url, GROUP)
    env = {TOKEN_ENV: fake.token, "TASKCARD_LOG_FORMAT": "json"}
    with ServeProcess(config, env=env) as serve:
        publish(tmp_path / "agents" / "builder", "first card")
        await eventually(lambda: any("first card" in t for t in texts(fake)), what="the card")
        records = [json.loads(line) for line in await stacks_of(serve)]
        dumped = [r["message"] for r in records if r["logger"] == "taskcard.bridge.run.stackdump"]
        assert all(r["level"] == "INFO" and "ts" in r for r in records)
        assert any("most recent call first" in line for line in dumped)
        assert any(line.startswith("task 'watch'") for line in dumped)
        assert dumped[-1] == FOOTER
        assert serve.proc is not None and serve.proc.poll() is None, "still running"
        assert await serve.aterminate() == 0
    assert all(json.loads(line) for line in serve.stderr)
    assert fake.token not in serve.logs


async def test_a_service_that_does_not_stop_in_time_fails_with_its_stacks(
    tmp_path: Path, fake: FakeTelegram
) -> None:
    # The card's send is performed but answered minutes later: on SIGTERM the service waits
    # for that answer (its grace), so it cannot be gone within the harness's short wait.
    fake.delay_answers("sendMessage", 600.0)
    with serving(tmp_path, fake) as serve:
        publish(tmp_path / "agents" / "builder", "held card")
        await eventually(lambda: fake.count("sendMessage") == 1, what="the send performed")
        with pytest.raises(AssertionError) as failure:
            await serve.aterminate(timeout_s=1.0)
        message = str(failure.value)
        assert "did not exit within 1s after SIGTERM" in message
        assert "log lines before SIGUSR1" in message
        assert "serving 1 agent on 1 route" in message, "the log's tail"
        assert "most recent call first" in message, "the threads' stacks"
        # The lane of the chat, awaiting the send's answer: what held the stop.
        assert f"task 'lane telegram:{GROUP}'" in message
        assert "_read_answer" in message
        assert fake.token not in message
        serve.kill()


async def test_the_dump_shows_where_a_chats_request_waits_for_its_answer(
    tmp_path: Path, fake: FakeTelegram
) -> None:
    """A chat's lane runs each request through a wrapper that passes its yields through
    (to tell whether the loop went round): the dump must follow it down to the request's
    own innermost wait, which is what it is for when a stop or a chat hangs."""
    with serving(tmp_path, fake) as serve:
        workdir = tmp_path / "agents" / "builder"
        publish(workdir, "first card")
        await eventually(lambda: any("first card" in t for t in texts(fake)), what="the card")
        fake.hold_answers("editMessageText")
        publish(workdir, "second card")
        # Performed at once, answered only when released: the lane waits for the answer.
        await eventually(lambda: any("second card" in t for t in texts(fake)), what="an edit")
        dump = "".join(await stacks_of(serve))
        fake.release_answers("editMessageText")
        lane = dump[dump.index(f"task 'lane telegram:{GROUP}'") :]
        lane = lane[: lane.index("\ntask ", 1)] if "\ntask " in lane[1:] else lane
        assert "in awaited" in lane, lane  # the wrapper ...
        assert "in _read_answer" in lane or "in readuntil" in lane, lane  # ... and below it
        assert await serve.aterminate() == 0
