"""`taskcard serve` end to end against the fake Telegram Bot API, driven as a user would.

The service runs as a subprocess with a config file; the fake runs in the test's loop and
enforces Telegram's limits with real 429 answers. Cards are published through the file
contract, exactly as the producer does.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import signal
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.harness import ServeProcess, activity, eventually, notify, publish, run_cli
from tests.fakes.telegram_api import FakeLimits, FakeTelegram, Window, utf16_len

GROUP = -1001234567890
PRIVATE = 4242


@pytest.fixture
async def fake() -> AsyncIterator[FakeTelegram]:
    async with FakeTelegram() as server:
        yield server


def config_text(
    fake: FakeTelegram,
    agents: list[str],
    routes: list[tuple[int, list[str]]],
    limits: str = "",
    allowed: str = "",
) -> str:
    lines = ['state_dir = ".taskcard"']
    for agent in agents:
        lines += ["[[agents]]", f'id = "{agent}"', f'workdir = "agents/{agent}"']
    lines += [
        "[telegram]",
        'token_env = "TC_TEST_TOKEN"',
        f'api_base_url = "{fake.base_url}"',
        "poll_timeout_s = 1",
    ]
    for chat_id, route_agents in routes:
        lines += [
            "[[telegram.routes]]",
            f"chat_id = {chat_id}",
            f"agents = {json.dumps(route_agents)}",
        ]
        if allowed:
            lines.append(allowed)
    if limits:
        lines.append(limits)
    return "\n".join(lines) + "\n"


def setup(
    tmp_path: Path,
    fake: FakeTelegram,
    agents: list[str],
    routes: list[tuple[int, list[str]]],
    **kwargs: str,
) -> ServeProcess:
    for agent in agents:
        (tmp_path / "agents" / agent).mkdir(parents=True, exist_ok=True)
    config = tmp_path / "taskcard.toml"
    config.write_text(config_text(fake, agents, routes, **kwargs))
    return ServeProcess(config, env={"TC_TEST_TOKEN": fake.token})


def shown(fake: FakeTelegram, chat: int) -> list[str]:
    return [m.text for m in fake.bot_messages(chat)]


def mapped_files(pid: int) -> str:
    """What a running process has mapped: its libraries, one line each (`/proc/PID/maps`)."""
    return Path(f"/proc/{pid}/maps").read_text()


def agent_dir(tmp_path: Path, agent: str) -> Path:
    return tmp_path / "agents" / agent


async def test_first_card_creates_resident_and_changes_edit_it(
    tmp_path: Path, fake: FakeTelegram
) -> None:
    serve = setup(tmp_path, fake, ["builder"], [(GROUP, ["builder"])])
    with serve:
        publish(agent_dir(tmp_path, "builder"), "**compile** 1/3")
        await eventually(lambda: any("compile" in t for t in shown(fake, GROUP)), what="card")
        message = fake.bot_messages(GROUP)[0]
        assert any(e["type"] == "bold" for e in message.entities), "Markdown sent as entities"
        publish(agent_dir(tmp_path, "builder"), "**tests** 2/3")
        await eventually(lambda: any("tests 2/3" in t for t in shown(fake, GROUP)), what="edit")
        assert len(fake.bot_messages(GROUP)) == 1
        assert fake.count("sendMessage") == 1
        assert fake.count("editMessageText") >= 1
        assert await serve.aterminate() == 0
    assert fake.token not in serve.logs


async def test_the_service_leaves_the_passport_cryptography_unloaded(
    tmp_path: Path, fake: FakeTelegram
) -> None:
    """PTB would load `cryptography` (installed here) for Telegram Passport, which the service
    never uses: a running service has none of its files mapped, and still edits its cards."""
    if importlib.util.find_spec("cryptography") is None:
        pytest.skip("cryptography is not installed, so nothing could load it")
    with setup(tmp_path, fake, ["builder"], [(GROUP, ["builder"])]) as serve:
        publish(agent_dir(tmp_path, "builder"), "**compile** 1/3")
        await eventually(lambda: any("compile" in t for t in shown(fake, GROUP)), what="card")
        assert serve.proc is not None
        maps = mapped_files(serve.proc.pid)
        assert "telegramify" in maps or "pyromark" in maps, "the maps list the native libraries"
        assert "/cryptography/" not in maps
        assert await serve.aterminate() == 0


async def test_taskcard_is_in_the_bot_command_menu(tmp_path: Path, fake: FakeTelegram) -> None:
    with setup(tmp_path, fake, ["builder"], [(GROUP, ["builder"])]) as serve:
        menu = await eventually(lambda: fake.my_commands.get(("default", "")), what="the menu")
        assert [item["command"] for item in menu] == ["taskcard", "tell"]
        assert "on, off" in menu[0]["description"]
        assert await serve.aterminate() == 0


async def test_times_on_the_card_are_in_the_route_timezone(
    tmp_path: Path, fake: FakeTelegram
) -> None:
    serve = setup(
        tmp_path, fake, ["builder"], [(GROUP, ["builder"])], allowed='timezone = "Asia/Tokyo"'
    )
    workdir = agent_dir(tmp_path, "builder")
    with serve:
        activity(workdir, "turn.start")
        activity(workdir, "tool.start", call_id="c1", name="pytest")
        publish(workdir, "**compile** 1/3")
        text = await eventually(
            lambda: next((t for t in shown(fake, GROUP) if "pytest" in t), None), what="card"
        )
        assert "running, turn since" in text
        # Every time on the card, in one format and the route's zone.
        times = re.findall(r"\b\d\d:\d\d(?::\d\d)?(?: [A-Z+0-9]+)?", text)
        assert times and all(re.fullmatch(r"\d\d:\d\d JST", t) for t in times), times
        assert "UTC" not in text
        assert await serve.aterminate() == 0


async def test_no_duplicate_after_sigkill_and_restart(tmp_path: Path, fake: FakeTelegram) -> None:
    serve = setup(tmp_path, fake, ["builder"], [(GROUP, ["builder"])])
    workdir = agent_dir(tmp_path, "builder")
    with serve:
        publish(workdir, "before the crash")
        await eventually(lambda: any("before the crash" in t for t in shown(fake, GROUP)))
        # The promise holds once the id is stored: a message seen in the chat may not have
        # reached the store yet (that window is bounded separately, see the unknown-send tests).
        await eventually(lambda: _status_if(serve.config, "resident message: 1"), what="the id")
        serve.kill()
    publish(workdir, "after the restart")
    with ServeProcess(serve.config, env=serve.env) as again:
        await eventually(lambda: any("after the restart" in t for t in shown(fake, GROUP)))
        assert len(fake.bot_messages(GROUP)) == 1
        assert await again.aterminate() == 0


async def test_edit_just_before_sigkill_costs_at_most_one_repeated_edit(
    tmp_path: Path, fake: FakeTelegram
) -> None:
    """A shown card's fingerprint is committed up to a timer tick late (the store batches
    them): a SIGKILL right after an edit may cost one more edit with the same bytes after
    the restart, never a second resident or an unshown change."""
    serve = setup(tmp_path, fake, ["builder"], [(GROUP, ["builder"])])
    workdir = agent_dir(tmp_path, "builder")
    with serve:
        publish(workdir, "first version")
        await eventually(lambda: any("first version" in t for t in shown(fake, GROUP)))
        await eventually(lambda: _status_if(serve.config, "resident message: 1"), what="the id")
        publish(workdir, "second version")
        await eventually(lambda: any("second version" in t for t in shown(fake, GROUP)))
        serve.kill()
    edits_before = fake.count("editMessageText")
    with ServeProcess(serve.config, env=serve.env) as again:
        publish(workdir, "third version")
        await eventually(lambda: any("third version" in t for t in shown(fake, GROUP)))
        assert len(fake.bot_messages(GROUP)) == 1
        assert fake.count("sendMessage") == 1
        # The third version's edit, and at most one repeat of the second version's bytes.
        assert 1 <= fake.count("editMessageText") - edits_before <= 2
        assert await again.aterminate() == 0


async def test_user_deleted_message_is_replaced_once(tmp_path: Path, fake: FakeTelegram) -> None:
    serve = setup(tmp_path, fake, ["builder"], [(PRIVATE, ["builder"])])
    workdir = agent_dir(tmp_path, "builder")
    with serve:
        publish(workdir, "v1")
        await eventually(lambda: shown(fake, PRIVATE))
        first = fake.bot_messages(PRIVATE)[0].message_id
        fake.user_delete(PRIVATE, first)
        publish(workdir, "v2 after delete")
        await eventually(lambda: any("v2 after delete" in t for t in shown(fake, PRIVATE)))
        publish(workdir, "v3")
        await eventually(lambda: any("v3" in t for t in shown(fake, PRIVATE)))
        assert len(fake.bot_messages(PRIVATE)) == 1
        assert fake.count("sendMessage") == 2
        assert await serve.aterminate() == 0


async def _disable_one_route(
    tmp_path: Path, fake: FakeTelegram, chat_id: int, cut: Callable[[], None]
) -> str:
    """Serve `builder` to `chat_id` and the private chat, `cut` the group off, and return
    `taskcard status` once the group's route is disabled; the private chat keeps its card
    current throughout."""
    serve = setup(tmp_path, fake, ["builder"], [(chat_id, ["builder"]), (PRIVATE, ["builder"])])
    workdir = agent_dir(tmp_path, "builder")
    with serve:
        publish(workdir, "v1")
        await eventually(lambda: shown(fake, chat_id) and shown(fake, PRIVATE))
        cut()
        publish(workdir, "v2")
        await eventually(lambda: any("v2" in t for t in shown(fake, PRIVATE)))
        status = await eventually(
            lambda: _status_if(serve.config, "DISABLED"),
            what="the route disabled with its reason",
        )
        publish(workdir, "v3")
        await eventually(lambda: any("v3" in t for t in shown(fake, PRIVATE)))
        assert await serve.aterminate() == 0
    assert f"telegram:{chat_id}::builder" in status
    assert fake.token not in status
    return status


async def test_kicked_route_is_disabled_and_others_continue(
    tmp_path: Path, fake: FakeTelegram
) -> None:
    status = await _disable_one_route(tmp_path, fake, GROUP, lambda: fake.kick(GROUP))
    assert "kicked" in status


def _ask_state(fake: FakeTelegram, needle: str) -> bool:
    """Send `/taskcard` unless one is still unanswered; True once a reply contains `needle`."""
    replies = [t for t in shown(fake, GROUP) if t.startswith("Task cards here")]
    if any(needle in t for t in replies):
        return True
    asked = sum(1 for m in fake.messages(GROUP) if m.text == "/taskcard" and not m.from_bot)
    if asked <= len(replies):
        fake.inject_command(GROUP, "/taskcard")
    return False


def _status_if(config: Path, needle: str) -> str | None:
    out = _status(config)
    return out if needle in out else None


def _status(config: Path) -> str:
    result = run_cli("status", "--config", str(config))
    assert result.returncode == 0, result.stderr
    return result.stdout


async def test_off_hides_and_on_shows_current_card(tmp_path: Path, fake: FakeTelegram) -> None:
    serve = setup(tmp_path, fake, ["builder"], [(GROUP, ["builder"])])
    workdir = agent_dir(tmp_path, "builder")
    with serve:
        publish(workdir, "visible body")
        await eventually(lambda: any("visible body" in t for t in shown(fake, GROUP)))
        resident = fake.bot_messages(GROUP)[0].message_id
        fake.inject_command(GROUP, f"/taskcard@{fake.username} off")
        await eventually(
            lambda: "hidden" in (fake.message(GROUP, resident) or _none).text.lower(),
            what="the hidden notice",
        )
        edits_when_hidden = fake.count("editMessageText")
        publish(workdir, "changed while hidden")
        # A state query is answered after the change was seen; the resident must stay hidden.
        fake.inject_command(GROUP, "/taskcard")
        await eventually(lambda: any("Task cards here: hidden" in t for t in shown(fake, GROUP)))
        assert "changed while hidden" not in (fake.message(GROUP, resident) or _none).text
        assert fake.count("editMessageText") == edits_when_hidden
        fake.inject_command(GROUP, "/taskcard on")
        await eventually(
            lambda: "changed while hidden" in (fake.message(GROUP, resident) or _none).text,
            what="the current card shown again",
        )
        assert await serve.aterminate() == 0


class _None:
    text = ""


_none = _None()


async def test_commands_for_other_bots_and_edits_are_ignored(
    tmp_path: Path, fake: FakeTelegram
) -> None:
    serve = setup(tmp_path, fake, ["builder"], [(GROUP, ["builder"])])
    workdir = agent_dir(tmp_path, "builder")
    with serve:
        publish(workdir, "body")
        await eventually(lambda: shown(fake, GROUP))
        resident = fake.bot_messages(GROUP)[0].message_id
        fake.inject_command(GROUP, "/taskcard@SomeOtherBot off")
        fake.inject_command(GROUP, "/taskcard off", edited=True)
        fake.inject_command(GROUP, "/taskcard 7")
        await eventually(lambda: any("7 activity rows" in t for t in shown(fake, GROUP)))
        assert "hidden" not in (fake.message(GROUP, resident) or _none).text.lower()
        assert await serve.aterminate() == 0


async def test_notices_once_each_across_restart(tmp_path: Path, fake: FakeTelegram) -> None:
    serve = setup(tmp_path, fake, ["builder"], [(GROUP, ["builder"])])
    workdir = agent_dir(tmp_path, "builder")
    with serve:
        publish(workdir, "body")
        await eventually(lambda: shown(fake, GROUP))
        notify(workdir, "task_card.error:tc_1:1:renderer_timeout", "error", code="renderer_timeout")
        await eventually(lambda: len(shown(fake, GROUP)) == 2, what="the error notice")
        assert await serve.aterminate() == 0
    notify(workdir, "task_card.error:tc_1:1:renderer_timeout", "error", code="renderer_timeout")
    notify(workdir, "task_card.recovered:tc_1:1", "recovered")
    with ServeProcess(serve.config, env=serve.env) as again:
        await eventually(lambda: len(shown(fake, GROUP)) >= 3, what="the recovery notice")
        notify(workdir, "task_card.limit:tc_1:2000", "limit", max_refreshes=2000)
        await eventually(lambda: len(shown(fake, GROUP)) >= 4, what="the limit notice")
        fake.inject_command(GROUP, "/taskcard")
        await eventually(lambda: len(shown(fake, GROUP)) >= 5, what="a sync point")
        assert await again.aterminate() == 0
    texts = shown(fake, GROUP)
    assert len(texts) == 5, texts
    for text in texts:
        assert "SECRET" not in text and "/home/agent" not in text


async def test_over_long_body_fits_4096_utf16_units(tmp_path: Path, fake: FakeTelegram) -> None:
    serve = setup(tmp_path, fake, ["builder"], [(PRIVATE, ["builder"])])
    with serve:
        body = "**start** " + "进度🚀 line with emoji and CJK\n" * 600 + "THE END"
        publish(agent_dir(tmp_path, "builder"), body)
        await eventually(lambda: shown(fake, PRIVATE), what="the long card")
        text = shown(fake, PRIVATE)[0]
        assert utf16_len(text) <= 4096
        assert "start" in text and "THE END" not in text
        assert "cut" in text
        assert await serve.aterminate() == 0


async def test_storm_in_one_group_no_429_and_final_state_lands(tmp_path: Path) -> None:
    # Telegram's 20 per minute per group, scaled to 20 per 2 s so the test stays short.
    limits = FakeLimits(
        private_chat=Window(1, 1.0), group_chat=Window(20, 2.0), bot=Window(30, 1.0)
    )
    agents = [f"agent{i:02d}" for i in range(50)]
    async with FakeTelegram(limits=limits) as fake:
        serve = setup(
            tmp_path,
            fake,
            agents,
            [(GROUP, ["*"])],
            limits="[telegram.limits]\ngroup_chat = { max_calls = 20, period_s = 2.0 }",
        )
        with serve:
            for round_no in range(30):  # every 100 ms for 3 s
                for agent in agents:
                    _quick_publish(agent_dir(tmp_path, agent), f"{agent} round {round_no}")
                await _sleep(0.1)
            for agent in agents:
                _quick_publish(agent_dir(tmp_path, agent), f"{agent} FINAL")
            await eventually(
                lambda: sum("FINAL" in t for t in shown(fake, GROUP)) == 50,
                timeout_s=120,
                what="every resident's final state",
            )
            assert fake.rate_limited == []
            assert len(fake.bot_messages(GROUP)) == 50
            assert await serve.aterminate() == 0


def _quick_publish(workdir: Path, body: str) -> None:
    """An atomic publication without fsync (the storm writes 500 files a second)."""
    card = workdir / "taskcard"
    card.mkdir(exist_ok=True)
    tmp = card / ".taskcard.md.tmp"
    tmp.write_text(body)
    os.replace(tmp, card / "taskcard.md")
    status = card / "status"
    if not status.exists():
        status.write_bytes(b"active")


async def _sleep(seconds: float) -> None:
    import asyncio

    await asyncio.sleep(seconds)


async def test_server_errors_retry_and_the_card_lands(tmp_path: Path, fake: FakeTelegram) -> None:
    serve = setup(tmp_path, fake, ["builder"], [(PRIVATE, ["builder"])])
    workdir = agent_dir(tmp_path, "builder")
    with serve:
        publish(workdir, "v1")
        await eventually(lambda: shown(fake, PRIVATE))
        fake.fail_next("editMessageText", 502, "Bad Gateway")
        fake.fail_next("editMessageText", 500, "Internal Server Error")
        publish(workdir, "v2 after outage")
        await eventually(
            lambda: any("v2 after outage" in t for t in shown(fake, PRIVATE)), timeout_s=60
        )
        assert len(fake.bot_messages(PRIVATE)) == 1
        assert await serve.aterminate() == 0


async def test_broken_workdir_does_not_stop_the_others(tmp_path: Path, fake: FakeTelegram) -> None:
    serve = setup(tmp_path, fake, ["broken", "fine"], [(GROUP, ["*"])])
    broken = agent_dir(tmp_path, "broken")
    (broken / "taskcard").mkdir()
    (broken / "taskcard" / "taskcard.md").mkdir()  # a folder where the body should be
    (broken / "taskcard" / "status").write_bytes(b"active")
    (broken / "logs").mkdir()
    (broken / "logs" / "events.jsonl").write_bytes(b'\x00\xff not json\n{"kind": 5}\n')
    with serve:
        publish(agent_dir(tmp_path, "fine"), "fine agent body")
        await eventually(lambda: any("fine agent body" in t for t in shown(fake, GROUP)))
        publish(agent_dir(tmp_path, "fine"), "still fine")
        await eventually(lambda: any("still fine" in t for t in shown(fake, GROUP)))
        assert serve.proc is not None and serve.proc.poll() is None
        assert await serve.aterminate() == 0
    assert "Traceback" not in serve.logs


async def test_pin_turned_on_by_a_reload_pins_the_card_already_shown(
    tmp_path: Path, fake: FakeTelegram
) -> None:
    """`pin = true` added to a route and SIGHUP: the resident shown before is pinned at
    once, not only the next one sent (the docs say routes change without a restart)."""
    serve = setup(tmp_path, fake, ["builder"], [(GROUP, ["builder"])])
    with serve:
        publish(agent_dir(tmp_path, "builder"), "**compile** 1/3")
        await eventually(lambda: fake.bot_messages(GROUP), what="the card")
        [card] = fake.bot_messages(GROUP)
        assert not card.pinned
        serve.config.write_text(serve.config.read_text() + "pin = true\n")
        assert serve.proc is not None
        serve.proc.send_signal(signal.SIGHUP)
        await eventually(lambda: "config reloaded" in serve.logs, what="the reload")
        await eventually(lambda: fake.message(GROUP, card.message_id).pinned, what="the pin")
        assert len(fake.bot_messages(GROUP)) == 1  # the same message, not a new one
        assert await serve.aterminate() == 0


async def test_forum_topic_pin_redaction_and_legacy_json(
    tmp_path: Path, fake: FakeTelegram
) -> None:
    (tmp_path / "agents" / "builder").mkdir(parents=True)
    config = tmp_path / "taskcard.toml"
    config.write_text(
        config_text(fake, ["builder"], [])
        + f'[[telegram.routes]]\nchat_id = {GROUP}\nthread_id = 42\nagents = ["builder"]\n'
        "pin = true\n"
    )
    token_like = "123456789:AAFakeSecretTokenValueForTesting_abcdefg"
    legacy = json.dumps(
        {"title": "Nightly build", "lines": ["step: link", f"token {token_like}"], "footer": "ok"}
    )
    with ServeProcess(config, env={"TC_TEST_TOKEN": fake.token}) as serve:
        publish(agent_dir(tmp_path, "builder"), legacy)
        await eventually(lambda: fake.bot_messages(GROUP, thread_id=42), what="card in topic")
        message = fake.bot_messages(GROUP, thread_id=42)[0]
        await eventually(lambda: fake.message(GROUP, message.message_id).pinned, what="pin")
        assert "Nightly build" in message.text and "step: link" in message.text
        assert token_like not in message.text
        assert not message.text.lstrip().startswith("{"), "legacy JSON is shown as a card"
        assert await serve.aterminate() == 0


async def test_only_allowed_users_control_the_card(tmp_path: Path, fake: FakeTelegram) -> None:
    serve = setup(
        tmp_path, fake, ["builder"], [(GROUP, ["builder"])], allowed="allowed_user_ids = [7]"
    )
    with serve:
        publish(agent_dir(tmp_path, "builder"), "body")
        await eventually(lambda: shown(fake, GROUP))
        resident = fake.bot_messages(GROUP)[0].message_id
        fake.inject_command(GROUP, "/taskcard off", user_id=99)
        fake.inject_command(GROUP, "/taskcard", user_id=7)
        await eventually(lambda: any("Task cards here" in t for t in shown(fake, GROUP)))
        assert "hidden" not in (fake.message(GROUP, resident) or _none).text.lower()
        assert await serve.aterminate() == 0


async def test_wrong_token_stops_the_service_with_a_clear_error(
    tmp_path: Path, fake: FakeTelegram
) -> None:
    serve = setup(tmp_path, fake, ["builder"], [(GROUP, ["builder"])])
    wrong = "999999:WRONG-token-value"
    with ServeProcess(serve.config, env={"TC_TEST_TOKEN": wrong}) as bad:
        await eventually(lambda: bad.proc is not None and bad.proc.poll() is not None)
        assert bad.proc is not None and bad.proc.returncode == 1
    assert "telegram" in bad.logs.lower()
    assert wrong not in bad.logs and "WRONG-token" not in bad.logs


async def test_notices_are_suppressed_while_the_route_is_off(
    tmp_path: Path, fake: FakeTelegram
) -> None:
    serve = setup(tmp_path, fake, ["builder"], [(GROUP, ["builder"])])
    workdir = agent_dir(tmp_path, "builder")
    with serve:
        publish(workdir, "body")
        await eventually(lambda: shown(fake, GROUP))
        fake.inject_command(GROUP, "/taskcard off")
        await eventually(lambda: any("hidden here" in t for t in shown(fake, GROUP)))
        notify(workdir, "task_card.error:tc_1:1:renderer_timeout", "error", code="renderer_timeout")
        # Sync point: the state reply mentions the error once the service has read it.
        await eventually(lambda: _ask_state(fake, "renderer error"), what="the error read")
        fake.inject_command(GROUP, "/taskcard on")
        await eventually(lambda: any("shown here" in t for t in shown(fake, GROUP)))
        notify(workdir, "task_card.recovered:tc_1:1", "recovered")
        await eventually(lambda: any("recovered" in t for t in shown(fake, GROUP)))
        assert not any("task card error" in t for t in shown(fake, GROUP))
        assert await serve.aterminate() == 0


async def test_a_legacy_frame_of_25_lines_shows_20_and_counts_the_rest(
    tmp_path: Path, fake: FakeTelegram
) -> None:
    serve = setup(tmp_path, fake, ["builder"], [(GROUP, ["builder"])])
    frame = {"title": "Sweep", "lines": [f"row {n:02d}" for n in range(1, 26)], "footer": "end"}
    with serve:
        publish(agent_dir(tmp_path, "builder"), json.dumps(frame))
        await eventually(lambda: any("Sweep" in t for t in shown(fake, GROUP)), what="card")
        [text] = shown(fake, GROUP)
        assert "row 20" in text and "row 21" not in text and "row 25" not in text
        assert "5 more lines not shown" in text and "end" in text
        assert await serve.aterminate() == 0


async def test_a_command_from_a_forum_topic_is_answered_in_that_topic(
    tmp_path: Path, fake: FakeTelegram
) -> None:
    # The route follows the whole group (its cards in the General topic); a person asking
    # from topic 42 reads the answer there, not in another topic. The command acts on the
    # whole chat's route, and the answer says where its cards are: it said "here", in a
    # topic holding no card. A topic with a route of its own is "here".
    serve = setup(tmp_path, fake, ["builder", "tester"], [(GROUP, ["builder"])])
    config = tmp_path / "taskcard.toml"
    topic_route = f'[[telegram.routes]]\nchat_id = {GROUP}\nthread_id = 7\nagents = ["tester"]\n'
    config.write_text(config.read_text() + topic_route)
    general = "in this chat's General topic"

    def answers(thread: int, words: str) -> list[str]:
        return [m.text for m in fake.bot_messages(GROUP, thread) if words in m.text]

    with serve:
        publish(agent_dir(tmp_path, "builder"), "body")
        publish(agent_dir(tmp_path, "tester"), "checks")
        await eventually(lambda: len(shown(fake, GROUP)) == 2, what="both cards")
        [card] = [m for m in fake.bot_messages(GROUP) if "body" in m.text]
        assert card.thread_id is None
        fake.inject_command(GROUP, "/taskcard", thread_id=42)
        [answer] = await eventually(lambda: answers(42, "Task cards"), what="the answer")
        assert answer.startswith(f"Task cards {general}: shown") and "builder" in answer
        assert "tester" not in answer
        fake.inject_command(GROUP, "/taskcard off", thread_id=42)
        [hidden] = await eventually(lambda: answers(42, "hidden"), what="the answer to off")
        assert hidden.startswith(f"Task cards hidden {general}.")
        await eventually(
            lambda: "body" not in (fake.message(GROUP, card.message_id) or card).text,
            what="the General topic's card hidden",
        )
        fake.inject_command(GROUP, "/taskcard 3", thread_id=42)
        await eventually(lambda: answers(42, f"Task cards {general} now show 3"), what="rows")
        fake.inject_command(GROUP, "/taskcard on", thread_id=42)
        await eventually(lambda: answers(42, f"Task cards shown {general}."), what="on")
        # The topic with a route of its own: its card is there, and so is "here".
        fake.inject_command(GROUP, "/taskcard off", thread_id=7)
        await eventually(lambda: answers(7, "Task cards hidden here."), what="the topic's")
        said_here = [t for t in fake.every_text(GROUP) if "Task cards" in t and "here" in t]
        assert said_here == ["Task cards hidden here. /taskcard on shows them again."]
        assert await serve.aterminate() == 0


async def test_a_command_from_a_topic_no_route_follows_says_where_the_cards_are(
    tmp_path: Path, fake: FakeTelegram
) -> None:
    # Every route of the forum chat is a topic's (7 and 12). A command from topic 42, or from
    # the General topic, was ignored without a word, as in a chat the service does not
    # serve. It is answered in place: no cards here, they are in topics 7 and 12, and the
    # route that gives this topic cards. Once per person and topic in a while, like the
    # other hints; a chat with no route at all stays silent.
    stranger = -1005555555555
    serve = setup(tmp_path, fake, ["builder", "tester"], [])
    config = tmp_path / "taskcard.toml"
    for thread, agent in ((12, "tester"), (7, "builder")):
        topic = (
            f'[[telegram.routes]]\nchat_id = {GROUP}\nthread_id = {thread}\nagents = ["{agent}"]\n'
        )
        config.write_text(config.read_text() + topic)

    def answers(thread: int | None) -> list[str]:
        return [
            m.text
            for m in fake.bot_messages(GROUP)
            if m.thread_id == thread and m.text.startswith("No task cards")
        ]

    with serve:
        publish(agent_dir(tmp_path, "builder"), "body")
        publish(agent_dir(tmp_path, "tester"), "checks")
        await eventually(lambda: len(shown(fake, GROUP)) == 2, what="both topics' cards")
        fake.inject_command(stranger, "/taskcard")
        fake.inject_command(GROUP, "/taskcard off", thread_id=42)
        [answer] = await eventually(lambda: answers(42), what="the answer in topic 42")
        assert answer == (
            "No task cards in this topic: this chat's are in topic 7 and topic 12 (by thread"
            " id). For cards here, whoever runs the task card service adds a route for chat"
            f" {GROUP} with thread_id = 42."
        )
        fake.inject_command(GROUP, "/tell builder hello")
        [general] = await eventually(lambda: answers(None), what="the answer in General")
        assert general.startswith("No task cards in this chat's General topic: this chat's")
        assert "without a thread_id" in general
        # Asked again in the same topic: not answered again, while the next command is.
        fake.inject_command(GROUP, "/taskcard", thread_id=42)
        fake.inject_command(GROUP, "/taskcard", thread_id=7)
        await eventually(
            lambda: any(m.text.startswith("Task cards here") for m in fake.bot_messages(GROUP, 7)),
            what="the routed topic's answer",
        )
        assert len(answers(42)) == 1
        assert not any("hidden" in t for t in fake.every_text(GROUP))
        assert fake.bot_messages(stranger) == [] and fake.count("sendMessage", stranger) == 0
        assert "ignoring /taskcard from an unrouted chat telegram:" in serve.logs
        assert await serve.aterminate() == 0


def _builder_and_tester_in_topics(
    tmp_path: Path, fake: FakeTelegram, deploy: int, qa: int
) -> ServeProcess:
    """`serve` with builder's route in topic `deploy` and tester's in topic `qa` of GROUP."""
    serve = setup(tmp_path, fake, ["builder", "tester"], [])
    config = tmp_path / "taskcard.toml"
    for thread, agent in ((deploy, "builder"), (qa, "tester")):
        topic = (
            f'[[telegram.routes]]\nchat_id = {GROUP}\nthread_id = {thread}\nagents = ["{agent}"]\n'
        )
        config.write_text(config.read_text() + topic)
    return serve


async def test_the_topics_that_have_cards_are_named_by_their_names(
    tmp_path: Path, fake: FakeTelegram
) -> None:
    # The answer from a topic no route follows named the topics that have cards by thread id
    # alone, though Telegram tells a bot a topic's name: when it is opened or renamed (service
    # messages), and with every message in it (replying to the message that opened it). Named
    # so now, cleaned (one line, 64 characters, never a mention or a command), and by thread
    # id while no name was seen; a rename wins over the name the topic was opened with.
    hostile = "Deploy <b>now</b>\x07\u200b  @alice /start " + "x" * 80
    deploy = fake.create_topic(GROUP, hostile)
    qa = fake.create_topic(GROUP, "QA", announced=False)  # opened before the bot was there
    lobby = fake.create_topic(GROUP, "Lobby")
    serve = _builder_and_tester_in_topics(tmp_path, fake, deploy, qa)

    def answers(thread: int | None) -> list[str]:
        return [m.text for m in fake.bot_messages(GROUP, thread) if m.thread_id == thread]

    with serve:
        publish(agent_dir(tmp_path, "builder"), "body")
        publish(agent_dir(tmp_path, "tester"), "checks")
        await eventually(lambda: len(shown(fake, GROUP)) == 2, what="both topics' cards")
        fake.inject_command(GROUP, "/taskcard", thread_id=lobby)
        [first] = await eventually(lambda: answers(lobby), what="the answer in the lobby")
        assert first.startswith("No task cards in this topic: this chat's are in topic \"Deploy")
        assert f'…" and topic {qa}. For cards here' in first, first
        assert "<b>now</b>" in first and "\x07" not in first and "\u200b " not in first
        assert "@alice" not in first and "/start" not in first  # defused: no mention, command
        # A command in the QA topic carries the message that opened it, named "QA".
        fake.inject_command(GROUP, "/taskcard", thread_id=qa)
        await eventually(lambda: answers(qa), what="the QA topic's answer")
        fake.edit_topic(GROUP, qa, "QA nightly")
        fake.inject_command(GROUP, "/taskcard", thread_id=qa)  # still replies to "QA"
        await eventually(lambda: len(answers(qa)) == 2, what="the QA topic's second answer")
        fake.inject_command(GROUP, "/taskcard")
        [general] = await eventually(lambda: answers(None), what="the answer in General")
        assert '…" and topic "QA nightly". For cards here' in general, general
        assert "by thread id" not in general
        assert await serve.aterminate() == 0


async def test_topic_names_outlive_a_restart_and_show_in_chats(
    tmp_path: Path, fake: FakeTelegram
) -> None:
    # The names the poll learnt lived in its memory alone: after a restart the topics were
    # named by thread id until Telegram told each name again, a message in a renamed topic
    # brought back the name it was opened with, and `taskcard chats` showed thread ids only.
    # They are kept in the state now, cleaned as before, and `chats` shows them beside the id.
    deploy = fake.create_topic(GROUP, "Deploy\x07 @alice")
    qa = fake.create_topic(GROUP, "QA")
    lobby = fake.create_topic(GROUP, "Lobby")
    serve = _builder_and_tester_in_topics(tmp_path, fake, deploy, qa)

    def answers(thread: int | None) -> list[str]:
        return [m.text for m in fake.bot_messages(GROUP, thread) if m.thread_id == thread]

    with serve:
        publish(agent_dir(tmp_path, "builder"), "body")
        publish(agent_dir(tmp_path, "tester"), "checks")
        await eventually(lambda: len(shown(fake, GROUP)) == 2, what="both topics' cards")
        fake.edit_topic(GROUP, qa, "QA nightly")
        fake.inject_command(GROUP, "/taskcard", thread_id=qa)
        await eventually(lambda: answers(qa), what="the QA topic's answer")
        assert await serve.aterminate() == 0
    again = ServeProcess(serve.config, env={"TC_TEST_TOKEN": fake.token})
    with again:
        await eventually(lambda: "channel telegram ready" in again.logs, what="the restart")
        # Its message replies to the one that opened the topic, named "QA": the rename stays.
        fake.inject_command(GROUP, "/taskcard", thread_id=qa)
        await eventually(lambda: len(answers(qa)) == 2, what="the QA topic's second answer")
        fake.inject_command(GROUP, "/taskcard", thread_id=lobby)
        [first] = await eventually(lambda: answers(lobby), what="the answer in the lobby")
        assert first.startswith(
            'No task cards in this topic: this chat\'s are in topic "Deploy @\u200balice" and'
            ' topic "QA nightly". For cards here'
        ), first
        assert await again.aterminate() == 0
    listed = run_cli("chats", "--config", str(serve.config), "--json")
    assert listed.returncode == 0, listed.stderr
    topics = {row["thread_id"]: row["topic"] for row in json.loads(listed.stdout)}
    assert topics == {str(qa): "QA nightly", str(lobby): "Lobby"}, topics
    table = run_cli("chats", "--config", str(serve.config))
    assert f'{lobby} "Lobby"' in table.stdout and f'{qa} "QA nightly"' in table.stdout, table


async def test_a_routed_channel_is_commanded_by_its_posts(
    tmp_path: Path, fake: FakeTelegram
) -> None:
    # A channel (chat ids are negative for channels too) has no members writing messages:
    # its administrators post as the channel, which arrives as `channel_post`. /taskcard off
    # there hid nothing, since only `message` updates were asked for.
    channel = -1009876543210
    serve = setup(tmp_path, fake, ["builder"], [(channel, ["builder"])])
    with serve:
        publish(agent_dir(tmp_path, "builder"), "visible body")
        await eventually(lambda: any("visible body" in t for t in shown(fake, channel)))
        resident = fake.bot_messages(channel)[0].message_id
        fake.inject_channel_post(channel, "/taskcard off")
        await eventually(
            lambda: "hidden" in (fake.message(channel, resident) or _none).text.lower(),
            what="the card hidden by a channel post",
        )
        await eventually(
            lambda: any("Task cards hidden here" in t for t in shown(fake, channel)),
            what="the answer in the channel",
        )
        assert await serve.aterminate() == 0


async def test_a_reply_in_a_routed_channel_to_its_card_reaches_the_agent(
    tmp_path: Path, fake: FakeTelegram
) -> None:
    # Every post of a channel is the channel's: the bot's card there comes without `from`,
    # and so does an administrator's reply to it. Such a reply was dropped, since it answered
    # no message a bot wrote. It reaches the agent, named by the post's signature, else by
    # the channel's title; a reply to another administrator's post gets no answer at all.
    channel = -1009876543210
    fake.make_channel(channel, "Release desk")
    serve = setup(tmp_path, fake, ["builder"], [(channel, ["builder"])])
    inbox = agent_dir(tmp_path, "builder") / "inbox" / "queued"

    def queued() -> list[dict[str, Any]]:
        files = sorted(inbox.glob("*.json")) if inbox.is_dir() else []
        return [json.loads(path.read_text()) for path in files]

    with serve:
        publish(agent_dir(tmp_path, "builder"), "visible body")
        await eventually(lambda: any("visible body" in t for t in shown(fake, channel)))
        card = fake.bot_messages(channel)[0].message_id
        fake.inject_channel_post(channel, "release at noon")
        [post] = [m for m in fake.messages(channel) if m.text == "release at noon"]
        fake.inject_channel_post(channel, "looks fine", reply_to=post.message_id)
        fake.inject_channel_post(channel, "ship it", reply_to=card, signature="Ann")
        await eventually(lambda: len(queued()) == 1, what="the signed reply queued")
        fake.inject_channel_post(channel, "/tell builder then tag it")
        await eventually(lambda: len(queued()) == 2, what="the unsigned /tell queued")
        by_text = {str(m["text"]): m for m in queued()}
        signed = by_text["ship it"]["from"]
        assert (signed["user"], signed["name"]) == (None, "Ann")
        assert by_text["then tag it"]["from"]["name"] == "Release desk"
        fake.inject_channel_post(channel, "/taskcard off")
        await eventually(
            lambda: any("Task cards hidden here" in t for t in shown(fake, channel)),
            what="the answer to off in the channel",
        )
        fake.inject_channel_post(channel, "/taskcard on")
        await eventually(
            lambda: any("Task cards shown here" in t for t in shown(fake, channel)),
            what="the answer to on in the channel",
        )
        texts = shown(fake, channel)
        assert not any("AGENT is one of" in t for t in texts), texts
        assert len(queued()) == 2
        assert await serve.aterminate() == 0


async def test_a_channel_posts_name_reaches_the_agent_as_a_name_not_a_user_id(
    tmp_path: Path, fake: FakeTelegram
) -> None:
    # A channel's post names no person: its signature (else the channel's title) came as the
    # author's user id. The agent got it as `from.user`, unsanitised (a direction override,
    # tag characters), "5551234" read as the person with that id, and the per-person rate
    # of /tell counted it as that person's: their own /tell was refused. It comes as
    # `from.name`, cleaned and cut as the text is, and the user is null as before.
    channel = -1009876543210
    fake.make_channel(channel, "Release desk")
    serve = setup(
        tmp_path,
        fake,
        ["builder"],
        [(channel, ["builder"]), (GROUP, ["builder"])],
        limits="[inbox]\nmax_messages = 2\nperiod_s = 600",
    )
    workdir = agent_dir(tmp_path, "builder")
    inbox = workdir / "inbox" / "queued"

    def queued() -> dict[str, dict[str, Any]]:
        files = sorted(inbox.glob("*.json")) if inbox.is_dir() else []
        messages = [json.loads(path.read_text()) for path in files]
        return {str(m["text"]): m for m in messages}

    signature = "5551234\u202e\U000e0041\U000e0042 " + "x" * 80
    with serve:
        publish(workdir, "visible body")
        await eventually(lambda: any("visible body" in t for t in shown(fake, channel)))
        fake.inject_channel_post(channel, "/tell builder signed", signature="5551234")
        fake.inject_channel_post(channel, "/tell builder from the desk", signature=signature)
        await eventually(lambda: len(queued()) == 2, what="the channel's /tells queued")
        for text in ("/tell builder from the person", "/tell builder again"):
            fake.inject_command(GROUP, text, user_id=5551234)
        await eventually(lambda: len(queued()) == 4, what="both of the person's /tells queued")
        signed = queued()["signed"]["from"]
        assert (signed["user"], signed["name"]) == (None, "5551234")
        name = "5551234<U+202E> " + "x" * 47 + "…"
        assert queued()["from the desk"]["from"]["user"] is None
        assert queued()["from the desk"]["from"]["name"] == name and len(name) == 64
        assert queued()["from the person"]["from"]["user"] == "5551234"
        assert "name" not in queued()["from the person"]["from"]
        # Another program may queue anything: the reader cleans the user and the name too.
        hidden = "\u202eroot\U000e0041"
        other = {"v": 1, "id": "other", "kind": "message", "text": "hi", "origin": None}
        other |= {"queued_at": "2026-12-05T00:00:00Z"}
        other["from"] = {"channel": "telegram", "chat_id": "1", "thread_id": None}
        other["from"] |= {"user": hidden, "name": hidden}
        (inbox / "other.json").write_text(json.dumps(other))
        read = run_cli("inbox", "--workdir", str(workdir), "--peek", "--json")
        assert read.returncode == 0, read.stderr
        summaries = {m["text"]: m for m in json.loads(read.stdout)["messages"]}
        desk, person = summaries["from the desk"], summaries["from the person"]
        assert (desk["from"]["user"], desk["from"]["name"]) == (None, name)
        assert desk["framed"].startswith(
            f'Message from "{name}" (a name the message shows, not a user id) in telegram'
        )
        assert person["framed"].startswith("Message from 5551234 in telegram")
        hi = summaries["hi"]["from"]
        assert (hi["user"], hi["name"]) == ("<U+202E>root", "<U+202E>root")
        assert await serve.aterminate() == 0


async def test_a_channels_signers_each_have_their_own_tell_rate_and_cancel(
    tmp_path: Path, fake: FakeTelegram
) -> None:
    # Every post of a channel names no person: all of them shared one /tell rate window (the
    # user id, None), so one administrator's texts used up the others', and "/taskcard
    # cancel" withdrew the latest text of any post. A signed post counts as its signature's
    # (never as a person's id, "7" included), an unsigned one as the channel's own.
    channel = -1009876543210
    fake.make_channel(channel, "Release desk")
    serve = setup(
        tmp_path,
        fake,
        ["builder"],
        [(channel, ["builder"]), (GROUP, ["builder"])],
        limits="[inbox]\nmax_messages = 1\nperiod_s = 600",
    )
    workdir = agent_dir(tmp_path, "builder")

    def texts(folder: str) -> list[str]:
        path = workdir / "inbox" / folder
        files = sorted(path.glob("*.json")) if path.is_dir() else []
        return sorted(json.loads(file.read_text())["text"] for file in files)

    def said(words: str) -> int:
        return sum(words in text for text in shown(fake, channel))

    with serve:
        publish(workdir, "visible body")
        await eventually(lambda: any("visible body" in t for t in shown(fake, channel)))
        fake.inject_channel_post(channel, "/tell builder from Ann", signature="Ann")
        fake.inject_channel_post(channel, "/tell builder from Bob", signature="Bob")
        fake.inject_channel_post(channel, "/tell builder from 7", signature="7")
        fake.inject_channel_post(channel, "/tell builder unsigned")
        fake.inject_command(GROUP, "/tell builder from the person 7", user_id=7)
        await eventually(lambda: len(texts("queued")) == 5, what="every writer's first text")
        fake.inject_channel_post(channel, "/tell builder Ann again", signature="Ann")
        await eventually(lambda: said("Too many messages to builder"), what="Ann's second refused")
        fake.inject_channel_post(channel, "/taskcard cancel", signature="Bob")
        await eventually(lambda: texts("cancelled") == ["from Bob"], what="Bob's text withdrawn")
        fake.inject_channel_post(channel, "/taskcard cancel", signature="Bob")
        await eventually(lambda: said("no queued message here to cancel"), what="Bob has none")
        fake.inject_channel_post(channel, "/taskcard cancel")
        await eventually(
            lambda: texts("cancelled") == ["from Bob", "unsigned"], what="the channel's withdrawn"
        )
        assert texts("queued") == ["from 7", "from Ann", "from the person 7"]
        assert said("Too many messages") == 1
        assert await serve.aterminate() == 0


async def test_answers_to_signers_arriving_together_are_each_sent(
    tmp_path: Path, fake: FakeTelegram
) -> None:
    # An unsent answer is replaced by a later one to the same sender's same command. Every
    # post of a channel and every anonymous administrator of a group was one sender, so
    # Ann's answer waiting its turn was replaced by Bob's, and Ann never learnt hers. Each
    # signer (a channel's signature, an administrator's custom title) is a sender of its own.
    channel = -1009876543210
    fake.make_channel(channel, "Release desk")
    serve = setup(tmp_path, fake, ["builder"], [(channel, ["builder"]), (GROUP, ["builder"])])
    workdir = agent_dir(tmp_path, "builder")
    with serve:
        publish(workdir, "visible body")
        for chat in (channel, GROUP):
            await eventually(lambda chat=chat: any("visible body" in t for t in shown(fake, chat)))
        # Each chat's lane busy with an answer the fake holds: the next answers wait.
        fake.hold_answers("sendMessage")
        fake.inject_channel_post(channel, "/taskcard 3", signature="Cy")
        fake.inject_on_behalf(GROUP, "/taskcard 3", signature="Cy")
        await eventually(
            lambda: all(fake.count("sendMessage", chat) == 2 for chat in (channel, GROUP)),
            what="both first answers on their way",
        )
        for rows, name in (("4", "Ann"), ("5", "Bob")):
            fake.inject_channel_post(channel, f"/taskcard {rows}", signature=name)
            fake.inject_on_behalf(GROUP, f"/taskcard {rows}", signature=name)
        await eventually(lambda: not fake.pending_updates, what="every command handled")
        fake.release_answers("sendMessage")
        for chat in (channel, GROUP):
            for rows in ("3", "4", "5"):
                await eventually(
                    lambda chat=chat, rows=rows: any(
                        f"show {rows} activity rows" in t for t in shown(fake, chat)
                    ),
                    what=f"the answer to /taskcard {rows} in {chat}",
                )
        assert await serve.aterminate() == 0


async def test_answers_that_are_no_bot_api_answer(tmp_path: Path, fake: FakeTelegram) -> None:
    """A proxy's HTML 502/504/403 page is retried like any server error, with one short line
    and no traceback or page in the log; a 200 carrying `ok: false` is read as the error it names
    (here: not modified, which is success), never as a crash."""
    serve = setup(tmp_path, fake, ["builder"], [(PRIVATE, ["builder"])])
    workdir = agent_dir(tmp_path, "builder")
    page = b"<html><body><h1>502 Bad Gateway</h1>nginx</body></html>"
    with serve:
        publish(workdir, "v1")
        await eventually(lambda: shown(fake, PRIVATE))
        fake.answer_raw_next("editMessageText", 502, page)
        fake.answer_raw_next("editMessageText", 504, b"")
        # A proxy's 403 page is no word from Telegram about the chat: the route stays on.
        fake.answer_raw_next("editMessageText", 403, b"<html>403 Forbidden</html>")
        # Nor is a proxy's JSON 403 (an API gateway's), which has no `ok: false`.
        fake.answer_raw_next("editMessageText", 403, b'{"message":"Forbidden"}', "application/json")
        publish(workdir, "v2 after outage")
        await eventually(
            lambda: any("v2 after outage" in t for t in shown(fake, PRIVATE)), timeout_s=60
        )
        not_modified = (
            b'{"ok":false,"error_code":400,"description":"Bad Request: message is not modified"}'
        )
        fake.answer_raw_next("editMessageText", 200, not_modified, "application/json")
        publish(workdir, "v3 seen as shown")
        await eventually(lambda: fake.count("editMessageText") >= 6)
        publish(workdir, "v4 lands")
        await eventually(lambda: any("v4 lands" in t for t in shown(fake, PRIVATE)), timeout_s=60)
        assert len(fake.bot_messages(PRIVATE)) == 1
        assert await serve.aterminate() == 0
    assert "Traceback" not in serve.logs
    assert "nginx" not in serve.logs
    assert "not a Bot API answer" in serve.logs


@pytest.mark.parametrize(
    ("description", "reason"),
    [
        ("Bad Request: chat not found", "chat not found"),
        ("Bad Request: TOPIC_CLOSED", "topic is closed"),
        ("Bad Request: not enough rights to send text messages to the chat", "rights to post"),
        ("Bad Request: have no rights to send a message", "rights to post"),
        ("Bad Request: need administrator rights in the channel chat", "administrator rights"),
    ],
)
async def test_a_chat_the_bot_cannot_reach_disables_its_route(
    tmp_path: Path, fake: FakeTelegram, description: str, reason: str
) -> None:
    """Telegram says with a 400 too that the bot cannot post there: the route is disabled
    with the reason, like a 403, instead of refusing every change anew."""
    status = await _disable_one_route(
        tmp_path, fake, GROUP, lambda: fake.fail_next("editMessageText", 400, description)
    )
    assert reason in status
    assert len(fake.bot_messages(GROUP)) == 1


async def test_a_hidden_chat_is_not_edited_for_body_changes_and_catches_up_on_on(
    tmp_path: Path, fake: FakeTelegram
) -> None:
    # The agent is followed in two chats; one hides the cards. The other sees every change,
    # the hidden one keeps its one-line notice untouched, and `/taskcard on` shows the latest
    # card there at once, without waiting for the agent's next change.
    other = -1005550001111
    serve = setup(tmp_path, fake, ["builder"], [(GROUP, ["builder"]), (other, ["builder"])])
    workdir = agent_dir(tmp_path, "builder")
    with serve:
        publish(workdir, "**step** 0")
        await eventually(
            lambda: all(any("step 0" in t for t in shown(fake, c)) for c in (GROUP, other)),
            what="the first card in both chats",
        )
        resident = fake.bot_messages(GROUP)[0].message_id
        fake.inject_command(GROUP, "/taskcard off")
        await eventually(
            lambda: "card hidden" in (fake.message(GROUP, resident) or _none).text,
            what="the hidden notice",
        )
        hidden_at = len(fake.edit_history(GROUP, resident))
        for step in range(1, 6):
            publish(workdir, f"**step** {step}\n\nline {step} of a longer body")
            await eventually(
                lambda step=step: any(f"step {step}" in t for t in shown(fake, other)),
                what=f"step {step} in the chat that shows the cards",
            )
        fake.inject_command(GROUP, "/taskcard on")
        await eventually(
            lambda: "step 5" in (fake.message(GROUP, resident) or _none).text,
            what="the latest card once shown again",
        )
        history = fake.edit_history(GROUP, resident)
        assert "card hidden" in history[hidden_at - 1]
        assert len(history) == hidden_at + 1, history[hidden_at - 1 :]
        assert not any(f"step {n}" in t for t in history for n in range(1, 5)), history
        assert any("step 3" in t for t in fake.edit_history(other, shown_id(fake, other)))
        assert await serve.aterminate() == 0


def shown_id(fake: FakeTelegram, chat: int) -> int:
    """The id of the bot's first message in `chat` (the resident card)."""
    return fake.bot_messages(chat)[0].message_id
