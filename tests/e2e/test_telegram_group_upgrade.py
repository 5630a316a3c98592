"""A Telegram group upgraded to a supergroup while `taskcard serve` shows cards there.

Telegram gives the upgraded chat a new id and refuses the old one for good (HTTP 400 with
`migrate_to_chat_id`); the updates carry the pair as two service messages. The service must
follow by itself: the cards continue in the supergroup (one resident each, edited from then
on), commands from there act on the route, the chat's settings carry over, and the operator
learns the new id from the log and `taskcard status`, with no restart. Driven as a user
would: `taskcard serve` with a config file against the fake Bot API.
"""

from __future__ import annotations

import json
import signal
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.e2e.harness import ServeProcess, activity, eventually, notify, publish, run_cli
from tests.e2e.test_serve_telegram import agent_dir, config_text, setup, shown
from tests.fakes.telegram_api import FakeTelegram

BASIC = -4242
SUPER = -1009876543210


@pytest.fixture
async def fake() -> AsyncIterator[FakeTelegram]:
    async with FakeTelegram() as server:
        yield server


def _status(config: Path) -> str:
    result = run_cli("status", "--config", str(config))
    assert result.returncode == 0, result.stderr
    return result.stdout


def _texts(fake: FakeTelegram, chat: int, needle: str) -> list[str]:
    return [t for t in shown(fake, chat) if needle in t]


def _cards_follow(fake: FakeTelegram, needles: list[str], chat: int = SUPER) -> bool:
    """Exactly one card per needle in the chat (the supergroup), each showing its agent."""
    return all(len(_texts(fake, chat, needle)) == 1 for needle in needles)


async def _show_then_upgrade(fake: FakeTelegram, builder: Path) -> None:
    """The builder's card shown in the group, then the group upgraded and the card moved."""
    publish(builder, "builder v1")
    await eventually(lambda: shown(fake, BASIC), what="the card in the group")
    fake.migrate(BASIC, SUPER)
    await eventually(lambda: _texts(fake, SUPER, "builder v1"), what="the card moved")


def _builder_and_tester(
    tmp_path: Path, fake: FakeTelegram, **kwargs: str
) -> tuple[ServeProcess, Path, Path]:
    """A service routing the builder and the tester to the basic group, and their workdirs."""
    agents = ["builder", "tester"]
    serve = setup(tmp_path, fake, agents, [(BASIC, agents)], **kwargs)
    return serve, agent_dir(tmp_path, "builder"), agent_dir(tmp_path, "tester")


async def test_cards_follow_the_group_into_its_supergroup(
    tmp_path: Path, fake: FakeTelegram
) -> None:
    """Both cards of the group continue in the supergroup at once, one resident each (the
    idle one too), and are edited there afterwards; the old group keeps its frozen copies;
    nothing more is asked of the old id; the log and `status` name the id to set."""
    serve, builder, tester = _builder_and_tester(tmp_path, fake)
    with serve:
        publish(builder, "builder v1")
        publish(tester, "tester v1")
        await eventually(lambda: len(shown(fake, BASIC)) == 2, what="both cards in the group")
        fake.migrate(BASIC, SUPER)
        await eventually(
            lambda: _cards_follow(fake, ["builder v1", "tester v1"]),
            what="both cards shown again in the supergroup",
        )
        publish(builder, "builder v2")
        await eventually(lambda: _texts(fake, SUPER, "builder v2"), what="the edit there")
        assert len(fake.bot_messages(SUPER)) == 2
        assert fake.count("sendMessage", SUPER) == 2
        # Each resident of the supergroup only ever showed its own agent's card (the old
        # group's message ids are never taken for the supergroup's messages).
        for message in fake.bot_messages(SUPER):
            history = fake.edit_history(SUPER, message.message_id)
            assert {"builder v" in h for h in history} in ({True}, {False}), history
            assert {"tester v" in h for h in history} in ({True}, {False}), history
        old_requests = fake.count(chat_id=BASIC)
        publish(tester, "tester v2")
        await eventually(lambda: _texts(fake, SUPER, "tester v2"), what="the other edit")
        assert fake.count(chat_id=BASIC) == old_requests
        frozen = [m.text for m in fake.bot_messages(BASIC)]
        assert len(frozen) == 2 and "builder v1" in frozen[0] and "tester v1" in frozen[1]
        status = _status(serve.config)
        assert await serve.aterminate() == 0
    assert f"upgraded to supergroup {SUPER}" in status
    assert f"set chat_id = {SUPER}" in status
    assert "DISABLED" not in status
    warnings = [line for line in serve.logs.splitlines() if f"chat_id = {SUPER}" in line]
    assert len(warnings) == 1, warnings
    assert fake.token not in serve.logs


async def test_a_move_learned_from_the_refusal_alone_posts_one_card_each(
    tmp_path: Path, fake: FakeTelegram
) -> None:
    """The service messages were missed (the upgrade happened while the service was down and
    their updates expired): the first refused edit teaches the move, and each card of the
    chat is posted once in the supergroup, pinned as the route asks; the notice goes there
    too."""
    serve, builder, tester = _builder_and_tester(tmp_path, fake, allowed="pin = true")
    with serve:
        publish(builder, "builder v1")
        publish(tester, "tester v1")
        await eventually(lambda: len(shown(fake, BASIC)) == 2, what="both cards in the group")
        fake.migrate(BASIC, SUPER, announce=False)
        publish(builder, "builder v2")
        await eventually(
            lambda: _cards_follow(fake, ["builder v2", "tester v1"]),
            what="both cards in the supergroup",
        )
        await eventually(
            lambda: all(m.pinned for m in fake.bot_messages(SUPER)), what="pinned there"
        )
        notify(builder, "task_card.error:tc_1:1:renderer_timeout", "error", code="renderer_timeout")
        await eventually(lambda: len(shown(fake, SUPER)) == 3, what="the notice there")
        assert fake.count("sendMessage", SUPER) == 3
        assert await serve.aterminate() == 0


async def test_a_move_learned_while_a_card_is_being_posted_moves_that_card_too(
    tmp_path: Path, fake: FakeTelegram
) -> None:
    """The upgrade lands between the post of a new card and its pin: the refused pin teaches
    the move while that card's delivery is still under way. The card just posted in the old
    group is posted once more in the supergroup like the others (the end of its delivery
    must not count it as shown where it now only shows frozen)."""
    serve, builder, tester = _builder_and_tester(tmp_path, fake, allowed="pin = true")
    with serve:
        publish(builder, "builder v1")
        await eventually(
            lambda: [m.pinned for m in fake.bot_messages(BASIC)] == [True],
            what="the builder's card pinned in the group",
        )
        fake.migrate_before_next("pinChatMessage", BASIC, SUPER)
        publish(tester, "tester v1")
        await eventually(
            lambda: _cards_follow(fake, ["builder v1", "tester v1"]),
            what="both cards in the supergroup",
        )
        await eventually(
            lambda: all(m.pinned for m in fake.bot_messages(SUPER)), what="pinned there"
        )
        assert fake.count("sendMessage", SUPER) == 2
        assert await serve.aterminate() == 0


async def test_an_edit_the_group_took_just_before_the_upgrade_moves_its_card_too(
    tmp_path: Path, fake: FakeTelegram
) -> None:
    """The builder's edit is taken by the old group, and the upgrade lands while its answer
    is on its way: the service learns the move (and asks every card of the chat to show
    again) before that answer arrives. The answer must not count the builder's card as
    shown, where it now stays frozen: both cards end in the supergroup with their latest
    text, one resident each."""
    serve, builder, tester = _builder_and_tester(tmp_path, fake)
    with serve:
        publish(builder, "builder v1")
        publish(tester, "tester v1")
        await eventually(lambda: len(shown(fake, BASIC)) == 2, what="both cards in the group")
        fake.migrate_after_next("editMessageText", BASIC, SUPER)
        publish(builder, "builder v2")
        await eventually(
            lambda: _cards_follow(fake, ["builder v2", "tester v1"]),
            what="both cards in the supergroup, the builder's latest",
        )
        assert _texts(fake, BASIC, "builder v2"), "the edit was taken by the old group"
        assert fake.count("sendMessage", SUPER) == 2
        assert len(fake.bot_messages(SUPER)) == 2
        assert await serve.aterminate() == 0


async def test_a_card_the_group_took_just_before_the_upgrade_is_posted_again_there(
    tmp_path: Path, fake: FakeTelegram
) -> None:
    """The same race for a card's first post: the old group takes the tester's new card and
    the move is learned before the answer arrives. The tester's card is posted once more in
    the supergroup, beside the builder's."""
    serve, builder, tester = _builder_and_tester(tmp_path, fake)
    with serve:
        publish(builder, "builder v1")
        await eventually(lambda: len(shown(fake, BASIC)) == 1, what="the builder's card")
        fake.migrate_after_next("sendMessage", BASIC, SUPER)
        publish(tester, "tester v1")
        await eventually(
            lambda: _cards_follow(fake, ["builder v1", "tester v1"]),
            what="both cards in the supergroup",
        )
        assert _texts(fake, BASIC, "tester v1"), "the post was taken by the old group"
        assert fake.count("sendMessage", SUPER) == 2
        assert len(fake.bot_messages(SUPER)) == 2
        assert await serve.aterminate() == 0


async def test_an_upgrade_while_the_service_was_down_posts_one_card_there(
    tmp_path: Path, fake: FakeTelegram
) -> None:
    """The group was upgraded while the service was stopped: at the restart the refused
    first edit and the service messages waiting in the updates both tell the move; the card
    is posted once in the supergroup and edited there."""
    serve, builder, tester = _builder_and_tester(tmp_path, fake)
    with serve:
        publish(builder, "builder v1")
        publish(tester, "tester v1")
        await eventually(lambda: len(shown(fake, BASIC)) == 2, what="both cards in the group")
        assert await serve.aterminate() == 0
    fake.migrate(BASIC, SUPER)
    publish(builder, "builder v2")
    with ServeProcess(serve.config, env=serve.env) as again:
        await eventually(
            lambda: _cards_follow(fake, ["builder v2", "tester v1"]),
            what="both cards in the supergroup",
        )
        await eventually(lambda: not fake.pending_updates, what="the updates confirmed")
        publish(tester, "tester v2")
        await eventually(lambda: _texts(fake, SUPER, "tester v2"), what="edited there")
        assert await again.aterminate() == 0
    assert fake.count("sendMessage", SUPER) == 2
    assert len(fake.bot_messages(SUPER)) == 2


async def test_commands_from_the_supergroup_act_on_the_route_and_settings_carry_over(
    tmp_path: Path, fake: FakeTelegram
) -> None:
    """`/taskcard 3` set in the group still holds in the supergroup; `/taskcard off` sent
    from the supergroup hides the card there, and stays so across a restart."""
    serve = setup(tmp_path, fake, ["builder"], [(BASIC, ["builder"])])
    builder = agent_dir(tmp_path, "builder")
    with serve:
        publish(builder, "builder v1")
        await eventually(lambda: shown(fake, BASIC), what="the card in the group")
        fake.inject_command(BASIC, "/taskcard 3")
        await eventually(lambda: _texts(fake, BASIC, "3 activity rows"), what="the reply")
        fake.migrate(BASIC, SUPER)
        await eventually(lambda: _texts(fake, SUPER, "builder v1"), what="the card moved")
        fake.inject_command(SUPER, "/taskcard")
        await eventually(
            lambda: _texts(fake, SUPER, "shown, 3 activity rows"), what="the state, kept"
        )
        resident = _texts(fake, SUPER, "builder v1")
        assert len(resident) == 1
        card = next(m for m in fake.bot_messages(SUPER) if "builder v1" in m.text)
        fake.inject_command(SUPER, f"/taskcard@{fake.username} off")
        await eventually(
            lambda: "hidden" in (fake.message(SUPER, card.message_id) or card).text.lower(),
            what="the card hidden in the supergroup",
        )
        await eventually(lambda: _texts(fake, SUPER, "Task cards hidden here"), what="reply")
        assert await serve.aterminate() == 0
    publish(builder, "builder v2 while hidden")
    with ServeProcess(serve.config, env=serve.env) as again:
        fake.inject_command(SUPER, "/taskcard")
        await eventually(lambda: _texts(fake, SUPER, "Task cards here: hidden"), what="state")
        assert "v2" not in (fake.message(SUPER, card.message_id) or card).text
        assert await again.aterminate() == 0
    cards = [t for t in shown(fake, SUPER) if not t.startswith("Task cards")]
    assert len(cards) == 1 and "hidden" in cards[0].lower(), cards
    assert not any("builder v2" in t for t in shown(fake, SUPER))


async def test_the_move_survives_a_restart_and_the_new_id_in_the_config(
    tmp_path: Path, fake: FakeTelegram
) -> None:
    """After a restart with the old id still in the config, the card in the supergroup is
    edited without a word to the old id; once the operator writes the new id, the same
    resident goes on (no second card) and `status` no longer asks for the edit."""
    serve = setup(tmp_path, fake, ["builder"], [(BASIC, ["builder"])])
    builder = agent_dir(tmp_path, "builder")
    with serve:
        await _show_then_upgrade(fake, builder)
        assert await serve.aterminate() == 0
    resident = fake.bot_messages(SUPER)[0].message_id
    fake.reset_counters()
    publish(builder, "builder v2")
    with ServeProcess(serve.config, env=serve.env) as again:
        await eventually(
            lambda: "builder v2" in (fake.message(SUPER, resident) or _NONE).text,
            what="the resident edited after the restart",
        )
        assert await again.aterminate() == 0
    assert fake.count(chat_id=BASIC) == 0
    assert f"set chat_id = {SUPER}" in again.logs
    serve.config.write_text(config_text(fake, ["builder"], [(SUPER, ["builder"])]))
    publish(builder, "builder v3")
    with ServeProcess(serve.config, env=serve.env) as third:
        await eventually(
            lambda: "builder v3" in (fake.message(SUPER, resident) or _NONE).text,
            what="the same resident edited under the new id",
        )
        fake.inject_command(SUPER, "/taskcard")
        await eventually(lambda: _texts(fake, SUPER, "Task cards here"), what="the state")
        status = _status(serve.config)
        assert await third.aterminate() == 0
    assert len(fake.bot_messages(SUPER)) == 2  # the card and the state reply
    assert fake.count("sendMessage", SUPER) == 1  # since the first run: the reply only
    # The command came from the supergroup and is listed under the chat's key, routed.
    chats = run_cli("chats", "--config", str(serve.config), "--json")
    assert chats.returncode == 0, chats.stderr
    assert [(c["chat_id"], c["routed"]) for c in json.loads(chats.stdout)] == [(str(BASIC), True)]
    assert f"upgraded to supergroup {SUPER}" in status
    assert "set chat_id" not in status
    assert f"set chat_id = {SUPER}" not in third.logs


async def test_the_new_id_written_into_the_config_and_reloaded_keeps_the_resident(
    tmp_path: Path, fake: FakeTelegram
) -> None:
    """SIGHUP after writing the supergroup's id: the route is the same one, so its resident is
    edited (no second card) and a command from the supergroup still acts on it."""
    serve = setup(tmp_path, fake, ["builder"], [(BASIC, ["builder"])])
    builder = agent_dir(tmp_path, "builder")
    with serve:
        await _show_then_upgrade(fake, builder)
        resident = fake.bot_messages(SUPER)[0].message_id
        serve.config.write_text(config_text(fake, ["builder"], [(SUPER, ["builder"])]))
        assert serve.proc is not None
        serve.proc.send_signal(signal.SIGHUP)
        await eventually(lambda: "config reloaded" in serve.logs, what="the reload")
        publish(builder, "builder v2")
        await eventually(
            lambda: "builder v2" in (fake.message(SUPER, resident) or _NONE).text,
            what="the same resident edited",
        )
        fake.inject_command(SUPER, "/taskcard off")
        await eventually(
            lambda: "hidden" in (fake.message(SUPER, resident) or _NONE).text.lower(),
            what="hidden by a command from the supergroup",
        )
        assert await serve.aterminate() == 0
    cards = [t for t in shown(fake, SUPER) if not t.startswith("Task cards")]
    assert len(cards) == 1, cards


async def test_a_board_follows_and_switches_from_the_supergroup(
    tmp_path: Path, fake: FakeTelegram
) -> None:
    """A chat showing one board: the board continues in the supergroup (one message there),
    and `/taskcard cards` sent from the supergroup replaces it with a card per agent."""
    serve, builder, tester = _builder_and_tester(tmp_path, fake, allowed='view = "board"')
    with serve:
        publish(builder, "builder v1")
        publish(tester, "tester v1")
        await eventually(lambda: _texts(fake, BASIC, "Task board"), what="the board")
        fake.migrate(BASIC, SUPER)
        await eventually(lambda: _texts(fake, SUPER, "Task board"), what="the board moved")
        publish(builder, "builder v2")
        await eventually(lambda: _texts(fake, SUPER, "builder v2"), what="the board edited")
        assert len(_texts(fake, SUPER, "Task board")) == 1
        fake.inject_command(SUPER, "/taskcard cards")
        await eventually(
            lambda: _cards_follow(fake, ["builder v2", "tester v1"]), what="a card per agent"
        )
        await eventually(lambda: _texts(fake, SUPER, "replaced by one card"), what="retired")
        assert await serve.aterminate() == 0


async def test_a_reply_to_a_card_in_the_supergroup_reaches_the_agent(
    tmp_path: Path, fake: FakeTelegram
) -> None:
    """A reply to the card the service posted in the supergroup is text for its agent."""
    serve = setup(tmp_path, fake, ["builder"], [(BASIC, ["builder"])])
    builder = agent_dir(tmp_path, "builder")
    with serve:
        await _show_then_upgrade(fake, builder)
        card = fake.bot_messages(SUPER)[0].message_id
        fake.inject_message(SUPER, "please rebase first", reply_to=card)
        queued = builder / "inbox" / "queued"
        await eventually(
            lambda: queued.is_dir() and any(queued.glob("*.json")), what="the text queued"
        )
        (message,) = queued.glob("*.json")
        sent = json.loads(message.read_text())
        assert sent["text"] == "please rebase first"
        assert await serve.aterminate() == 0


async def test_a_reply_in_the_supergroup_is_never_taken_for_one_to_a_notice_of_the_group(
    tmp_path: Path, fake: FakeTelegram
) -> None:
    """Telegram numbers messages per chat, so the supergroup soon has a message with the
    number of a notice posted in the group before the upgrade. A reply to the service's
    answer of that number is no agent's text: it never reaches the agent the group's notice
    was about (it did, within the 30 days notices are kept), while a reply to a card still
    reaches its agent."""
    serve, builder, tester = _builder_and_tester(tmp_path, fake)
    with serve:
        publish(builder, "builder v1")
        publish(tester, "tester v1")
        await eventually(
            lambda: _cards_follow(fake, ["builder v1", "tester v1"], BASIC), what="the cards"
        )
        for n in range(8):  # people talking: the notice gets a number the supergroup reaches
            fake.inject_message(BASIC, f"chatter {n}")
        notify(builder, "task_card.error:tc_1:1:renderer_timeout", "error")
        await eventually(lambda: _texts(fake, BASIC, "builder: task card error"), what="notice")
        [notice] = [m for m in fake.bot_messages(BASIC) if "task card error" in m.text]
        fake.migrate(BASIC, SUPER)
        await eventually(lambda: _cards_follow(fake, ["builder v1", "tester v1"]), what="moved")
        while _last_number(fake, SUPER) < notice.message_id - 2:
            fake.inject_message(SUPER, "chatter")
        fake.inject_command(SUPER, "/taskcard")
        await eventually(lambda: _texts(fake, SUPER, "Task cards here"), what="the answer")
        [answer] = [m for m in fake.bot_messages(SUPER) if "Task cards here" in m.text]
        assert answer.message_id == notice.message_id  # the number the group's notice had
        fake.inject_message(SUPER, "not for the builder", reply_to=answer.message_id)
        [card] = [m for m in fake.bot_messages(SUPER) if "tester v1" in m.text]
        fake.inject_message(SUPER, "for the tester", reply_to=card.message_id)
        await eventually(lambda: _queued_texts(tester) == ["for the tester"], what="queued")
        assert _queued_texts(builder) == []
        assert await serve.aterminate() == 0


def _last_number(fake: FakeTelegram, chat: int) -> int:
    """The highest message number of the chat that the fake keeps (0 when none)."""
    return max((m.message_id for m in fake.messages(chat)), default=0)


def _queued_texts(workdir: Path) -> list[str]:
    queued = workdir / "inbox" / "queued"
    return sorted(json.loads(p.read_text())["text"] for p in queued.glob("*.json"))


async def test_a_turn_from_the_group_opens_its_route_once_origin_chats_names_the_supergroup(
    tmp_path: Path, fake: FakeTelegram
) -> None:
    """Texts sent from the supergroup carry the group's id as their origin (the chat's key);
    after the operator writes the supergroup's id into `origin_chats`, as the log asks,
    such a turn still opens the agent's route there, and a turn naming the supergroup too."""
    serve = setup(tmp_path, fake, ["builder", "helper"], [(BASIC, ["builder"])])
    builder, helper = agent_dir(tmp_path, "builder"), agent_dir(tmp_path, "helper")
    with serve:
        await _show_then_upgrade(fake, builder)
        assert await serve.aterminate() == 0
    text = config_text(fake, ["builder", "helper"], [(SUPER, ["builder"])])
    serve.config.write_text(
        text.replace("poll_timeout_s = 1\n", f"poll_timeout_s = 1\norigin_chats = [{SUPER}]\n")
    )
    with ServeProcess(serve.config, env=serve.env) as again:
        activity(helper, "turn.start", origin=f"telegram:{BASIC}")
        publish(helper, "helper v1")
        await eventually(lambda: _texts(fake, SUPER, "helper v1"), what="the origin route")
        assert await again.aterminate() == 0
    assert "ignored" not in again.logs
    assert len(_texts(fake, SUPER, "helper v1")) == 1


class _Empty:
    text = ""


_NONE = _Empty()
