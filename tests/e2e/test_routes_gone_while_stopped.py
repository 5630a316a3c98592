"""Routes that go while `taskcard serve` is stopped, end to end: the operator stops the
service, edits the config file, and starts it again. The cards of the routes that went say
that their chat no longer follows the agent, as after a reload, once; routed there again,
the same card comes back. Against the fake Telegram Bot API and the fake Feishu Open API,
the chats read as people see them."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest

from tests.e2e.harness import ServeProcess, activity, agents_lines, eventually, publish
from tests.e2e.test_reload_routes import UNROUTED, WAIT_S, card_of, cards, write_config
from tests.fakes.feishu_api import FakeFeishu
from tests.fakes.telegram_api import FakeTelegram

TELEGRAM_CHATS = (-1003333333333, -1004444444444)
FEISHU_CHATS = ("oc_stopped_first", "oc_stopped_second")
# The start's log line when it finds cards of routes that went while it was stopped.
OWED = "of routes the configuration no longer has"


def edits(fake: FakeTelegram | FakeFeishu, chat: object, message_id: str) -> int:
    """How many times the bot edited the message since it posted it."""
    if isinstance(fake, FakeTelegram):
        assert isinstance(chat, int)
        found = fake.message(chat, int(message_id))
        assert found is not None
        return found.edit_count
    [message] = [m for m in fake.chat(str(chat)) if m.message_id == message_id]
    return message.update_count


def platform_of(
    platform: str, telegram: FakeTelegram, feishu: FakeFeishu
) -> tuple[FakeTelegram | FakeFeishu, object, object]:
    if platform == "telegram":
        return telegram, *TELEGRAM_CHATS
    return feishu, *FEISHU_CHATS


@pytest.mark.parametrize("platform", ["telegram", "feishu"])
async def test_a_route_removed_while_stopped_has_its_cards_say_so_once_at_the_next_start(
    tmp_path: Path, platform: str, telegram: FakeTelegram, feishu: FakeFeishu
) -> None:
    """The operator takes the second chat's route, and beta out of the first chat's, while
    the service is stopped: the next start edits those two cards a last time to say their
    chat no longer follows the agent (they went on showing the last state as if live, for
    good), and alpha's card in the first chat goes on. A further restart leaves them as they
    are; routed there again, the same card shows alpha again."""
    fake, first, second = platform_of(platform, telegram, feishu)
    agents = tmp_path / "agents"
    both: list[tuple[object, list[str]]] = [(first, ["alpha", "beta"]), (second, ["alpha"])]
    config, env = write_config(tmp_path, fake, both)
    with ServeProcess(config, env=env) as serve:
        for agent in ("alpha", "beta"):
            publish(agents / agent, f"{agent} step 1")
        await eventually(
            lambda: (
                len(cards(fake, first)) == 2
                and all("step 1" in text for text in cards(fake, first).values())
                and "alpha step 1" in "".join(cards(fake, second).values())
            ),
            timeout_s=WAIT_S,
            what="alpha and beta in the first chat, alpha in the second",
        )
        assert await serve.aterminate() == 0
    beta_card, second_card = card_of(fake, first, "beta"), card_of(fake, second, "alpha")
    alpha_card = card_of(fake, first, "alpha")
    assert beta_card is not None and second_card is not None and alpha_card is not None

    write_config(tmp_path, fake, [(first, ["alpha"])])
    with ServeProcess(config, env=env) as serve:
        await eventually(
            lambda: UNROUTED in cards(fake, second).get(second_card[0], ""),
            timeout_s=WAIT_S,
            what="the second chat's card saying its chat no longer follows alpha",
        )
        await eventually(
            lambda: UNROUTED in cards(fake, first).get(beta_card[0], ""),
            timeout_s=WAIT_S,
            what="beta's card in the first chat saying so",
        )
        publish(agents / "alpha", "alpha step 2")
        await eventually(
            lambda: "alpha step 2" in cards(fake, first).get(alpha_card[0], ""),
            timeout_s=WAIT_S,
            what="alpha's card in the first chat going on",
        )
        assert UNROUTED not in cards(fake, first)[alpha_card[0]]
        assert "alpha step 2" not in cards(fake, second)[second_card[0]], "the edits stopped"
        assert await serve.aterminate() == 0
    told = {
        (chat, ident): (cards(fake, chat)[ident], edits(fake, chat, ident))
        for chat, ident in ((first, beta_card[0]), (second, second_card[0]))
    }

    # Restarted on the same file: told once is enough.
    with ServeProcess(config, env=env) as serve:
        publish(agents / "alpha", "alpha step 3")
        publish(agents / "beta", "beta step 3")
        await eventually(
            lambda: "alpha step 3" in cards(fake, first).get(alpha_card[0], ""),
            timeout_s=WAIT_S,
            what="alpha's card in the first chat going on",
        )
        await eventually(lambda: f"channel {platform} ready" in serve.logs, what="the log")
        assert OWED not in serve.logs, "a card already told was owed its last edit again"
        assert await serve.aterminate() == 0
    for (chat, ident), (text, count) in told.items():
        assert (cards(fake, chat)[ident], edits(fake, chat, ident)) == (text, count)

    # Routed there again while stopped: the same cards come back.
    write_config(tmp_path, fake, both)
    with ServeProcess(config, env=env) as serve:
        publish(agents / "alpha", "alpha step 4")
        publish(agents / "beta", "beta step 4")
        await eventually(
            lambda: "alpha step 4" in cards(fake, second).get(second_card[0], ""),
            timeout_s=WAIT_S,
            what="the same card in the second chat showing alpha again",
        )
        await eventually(
            lambda: "beta step 4" in cards(fake, first).get(beta_card[0], ""),
            timeout_s=WAIT_S,
            what="the same card in the first chat showing beta again",
        )
        assert len(cards(fake, first)) == 2 and len(cards(fake, second)) == 1, "no new card"
        assert await serve.aterminate() == 0


def edited(fake: FakeTelegram | FakeFeishu, chat: object, since: int) -> list[str]:
    """The ids of the messages in `chat` that the bot asked to edit, in order, from the
    fake's `since`-th request on."""
    if isinstance(fake, FakeTelegram):
        return [
            str(r.params.get("message_id"))
            for r in fake.requests[since:]
            if r.method == "editMessageText" and r.chat_id == chat
        ]
    return [
        r.message_id or ""
        for r in fake.requests[since:]
        if r.operation == "patch" and r.chat_id in (chat, None)
    ]


@pytest.mark.parametrize("platform", ["telegram", "feishu"])
async def test_the_live_card_of_a_chat_goes_before_the_last_edits_a_start_owes_there(
    tmp_path: Path, platform: str, telegram: FakeTelegram, feishu: FakeFeishu
) -> None:
    """Four agents leave a chat's route while the service is stopped, and the agent that
    stays there changed meanwhile: the start edits the live card first, and each of the
    four once after it, one at a time while the chat has nothing else to send."""
    fake, chat, _ = platform_of(platform, telegram, feishu)
    gone = [f"gone{n}" for n in range(4)]
    names = ["alpha", *gone]
    env = write_config(tmp_path, fake, [(chat, names)])[1]
    config = tmp_path / "taskcard.toml"
    config.write_text(config.read_text() + "\n".join(agents_lines(tmp_path, gone)[1:]) + "\n")
    with ServeProcess(config, env=env) as serve:
        for agent in names:
            publish(tmp_path / "agents" / agent, f"{agent} step 1")
        await eventually(
            lambda: all(
                f"{agent} step 1" in (card_of(fake, chat, agent) or ("", ""))[1] for agent in names
            ),
            timeout_s=WAIT_S,
            what="every agent's card",
        )
        assert await serve.aterminate() == 0
    ids = {agent: (card_of(fake, chat, agent) or ("", ""))[0] for agent in names}

    text = config.read_text().replace(json.dumps(names), json.dumps(["alpha"]))
    config.write_text(text)
    publish(tmp_path / "agents" / "alpha", "alpha step 2")
    since = len(fake.requests)
    with ServeProcess(config, env=env) as serve:
        await eventually(
            lambda: all(UNROUTED in cards(fake, chat)[ids[agent]] for agent in gone),
            timeout_s=WAIT_S,
            what="the four cards saying the chat no longer follows their agents",
        )
        assert "alpha step 2" in cards(fake, chat)[ids["alpha"]]
        order = edited(fake, chat, since)
        assert order[0] == ids["alpha"], order
        assert sorted(order[1:]) == sorted(ids[agent] for agent in gone), "each once"
        assert await serve.aterminate() == 0


def origin(platform: str, chat: object) -> str:
    return f"{platform}:{chat}"


@pytest.mark.parametrize("platform", ["telegram", "feishu"])
async def test_a_chat_taken_out_of_origin_chats_while_stopped_has_its_open_cards_say_so(
    tmp_path: Path, platform: str, telegram: FakeTelegram, feishu: FakeFeishu
) -> None:
    """A turn from a chat in `origin_chats` opened alpha's route there. The operator takes
    the chat out of `origin_chats` while the service is stopped: the next start closes the
    route and edits its card a last time to say the chat no longer follows alpha (it kept
    the route open and the card live), and a further restart leaves it as it is."""
    fake, chat, routed = platform_of(platform, telegram, feishu)
    alpha = tmp_path / "agents" / "alpha"
    only_routed: list[tuple[object, list[str]]] = [(routed, ["beta"])]
    config, env = write_config(tmp_path, fake, only_routed, origin_chats=(chat,))
    with ServeProcess(config, env=env) as serve:
        publish(alpha, "alpha step 1")
        activity(alpha, "turn.start", origin=origin(platform, chat))
        await eventually(
            lambda: "alpha step 1" in (card_of(fake, chat, "alpha") or ("", ""))[1],
            timeout_s=WAIT_S,
            what="alpha's card in the chat its turn came from",
        )
        assert await serve.aterminate() == 0
    opened = card_of(fake, chat, "alpha")
    assert opened is not None

    write_config(tmp_path, fake, only_routed)
    with ServeProcess(config, env=env) as serve:
        await eventually(
            lambda: UNROUTED in cards(fake, chat).get(opened[0], ""),
            timeout_s=WAIT_S,
            what="the card saying its chat no longer follows alpha",
        )
        publish(alpha, "alpha step 2")
        await eventually(lambda: "closed: its chat is no longer in" in serve.logs, what="the log")
        assert await serve.aterminate() == 0
    told = (cards(fake, chat)[opened[0]], edits(fake, chat, opened[0]))
    assert "alpha step 2" not in told[0]

    with ServeProcess(config, env=env) as serve:
        publish(alpha, "alpha step 3")
        publish(tmp_path / "agents" / "beta", "beta step 3")
        await eventually(
            lambda: "beta step 3" in "".join(cards(fake, routed).values()),
            timeout_s=WAIT_S,
            what="beta's card in the routed chat",
        )
        await eventually(lambda: f"channel {platform} ready" in serve.logs, what="the log")
        assert OWED not in serve.logs, "a card already told was owed its last edit again"
        assert await serve.aterminate() == 0
    assert (cards(fake, chat)[opened[0]], edits(fake, chat, opened[0])) == told
    assert len(cards(fake, chat)) == 1, "no new card"


@pytest.mark.parametrize("platform", ["telegram", "feishu"])
async def test_a_reload_that_takes_a_chat_out_of_origin_chats_closes_its_open_routes(
    tmp_path: Path, platform: str, telegram: FakeTelegram, feishu: FakeFeishu
) -> None:
    """A reload that takes a chat out of `origin_chats` closes the routes turns from it
    opened, their cards saying that the chat no longer follows the agent, as for a route
    taken out of the file. Listed again, the chat's next turn opens the route on the same
    card."""
    fake, chat, routed = platform_of(platform, telegram, feishu)
    alpha = tmp_path / "agents" / "alpha"
    only_routed: list[tuple[object, list[str]]] = [(routed, ["beta"])]
    config, env = write_config(tmp_path, fake, only_routed, origin_chats=(chat,))
    with ServeProcess(config, env=env) as serve:
        assert serve.proc is not None
        publish(alpha, "alpha step 1")
        activity(alpha, "turn.start", origin=origin(platform, chat))
        await eventually(
            lambda: "alpha step 1" in (card_of(fake, chat, "alpha") or ("", ""))[1],
            timeout_s=WAIT_S,
            what="alpha's card in the chat its turn came from",
        )
        opened = card_of(fake, chat, "alpha")
        assert opened is not None

        write_config(tmp_path, fake, only_routed)
        serve.proc.send_signal(signal.SIGHUP)
        await eventually(
            lambda: UNROUTED in cards(fake, chat).get(opened[0], ""),
            timeout_s=WAIT_S,
            what="the card saying its chat no longer follows alpha",
        )

        write_config(tmp_path, fake, only_routed, origin_chats=(chat,))
        serve.proc.send_signal(signal.SIGHUP)
        await eventually(lambda: serve.logs.count("config reloaded") == 2, what="the reload")
        publish(alpha, "alpha step 2")
        activity(alpha, "turn.start", origin=origin(platform, chat))
        await eventually(
            lambda: "alpha step 2" in cards(fake, chat).get(opened[0], ""),
            timeout_s=WAIT_S,
            what="the same card showing alpha again after the chat's next turn",
        )
        assert len(cards(fake, chat)) == 1, "no new card"
        assert await serve.aterminate() == 0


# The last edit of a card whose agent left the fleet.
RETIRED = "Agent retired"


@pytest.mark.parametrize("platform", ["telegram", "feishu"])
async def test_the_live_card_goes_before_the_retirements_a_start_owes_in_its_chat(
    tmp_path: Path, platform: str, telegram: FakeTelegram, feishu: FakeFeishu
) -> None:
    """While the service is stopped the operator takes gamma out of the configuration (it
    retired) and beta out of the chat's route (still served, no longer followed there), and
    alpha, which stays, changes: the start edits alpha's live card first, what people
    follow, and only then the two cards' last edits, each once."""
    fake, chat, _ = platform_of(platform, telegram, feishu)
    names = ["alpha", "beta", "gamma"]
    config, env = write_config(tmp_path, fake, [(chat, names)])
    gamma = "\n".join(agents_lines(tmp_path, ["gamma"])[1:])
    text = config.read_text()
    config.write_text(text + gamma + "\n")
    with ServeProcess(config, env=env) as serve:
        for agent in names:
            publish(tmp_path / "agents" / agent, f"{agent} step 1")
        await eventually(
            lambda: all(
                f"{agent} step 1" in (card_of(fake, chat, agent) or ("", ""))[1] for agent in names
            ),
            timeout_s=WAIT_S,
            what="every agent's card",
        )
        assert await serve.aterminate() == 0
    ids = {agent: (card_of(fake, chat, agent) or ("", ""))[0] for agent in names}

    config.write_text(text.replace(json.dumps(names), json.dumps(["alpha"])))
    publish(tmp_path / "agents" / "alpha", "alpha step 2")
    since = len(fake.requests)
    with ServeProcess(config, env=env) as serve:
        await eventually(
            lambda: (
                UNROUTED in cards(fake, chat)[ids["beta"]]
                and RETIRED in cards(fake, chat)[ids["gamma"]]
            ),
            timeout_s=WAIT_S,
            what="beta's card no longer followed, gamma's retired",
        )
        assert "alpha step 2" in cards(fake, chat)[ids["alpha"]]
        order = edited(fake, chat, since)
        assert order[0] == ids["alpha"], order
        assert sorted(order[1:]) == sorted([ids["beta"], ids["gamma"]]), "each once"
        assert await serve.aterminate() == 0
