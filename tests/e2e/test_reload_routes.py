"""SIGHUP reloads that change the routes or the display defaults, end to end: `taskcard serve`
with a config file rewritten while it runs, against the fake Telegram Bot API and the fake
Feishu Open API, the chats read as people see them."""

from __future__ import annotations

import signal
from contextlib import ExitStack
from pathlib import Path

import pytest

from tests.e2e.harness import ServeProcess, activity, agents_lines, eventually, publish
from tests.e2e.test_card_refused_status import status_routes
from tests.fakes.feishu_api import FakeFeishu
from tests.fakes.telegram_api import FakeTelegram

TELEGRAM_CHATS = (-1001111111111, -1002222222222)
FEISHU_CHATS = ("oc_reload_first", "oc_reload_second")
# The last edit of a card whose chat no longer follows its agent.
UNROUTED = "No longer followed in this chat"
# Generous: polled, never a timing assertion (a loaded machine runs two suites at once).
WAIT_S = 90.0


def write_config(
    tmp_path: Path,
    fake: FakeTelegram | FakeFeishu,
    routes: list[tuple[object, list[str]]],
    tail: tuple[str, ...] = (),
    *,
    origin_chats: tuple[object, ...] = (),
    name: str = "taskcard.toml",
) -> tuple[Path, dict[str, str]]:
    """`tmp_path/NAME`: agents alpha and beta, the channel's `origin_chats` and one route
    per (chat, agents) on the fake's platform, then the `tail` lines (sections of their
    own); returns the file and the secrets' environment."""
    lines = agents_lines(tmp_path, ["alpha", "beta"])
    if isinstance(fake, FakeTelegram):
        section = "telegram"
        lines += [
            "[telegram]",
            'token_env = "TC_TEST_TOKEN"',
            f'api_base_url = "{fake.base_url}"',
            "poll_timeout_s = 1",
        ]
        env = {"TC_TEST_TOKEN": fake.token}
    else:
        section = "feishu"
        lines += [
            "[feishu]",
            'app_id_env = "TC_FS_APP_ID"',
            'app_secret_env = "TC_FS_APP_SECRET"',
            f'domain = "{fake.base_url}"',
            'events = "none"',
        ]
        env = {"TC_FS_APP_ID": fake.app_id, "TC_FS_APP_SECRET": fake.app_secret}
    lines.append(f"origin_chats = {list(origin_chats)!r}")
    for chat, agents in routes:
        shown = f'"{chat}"' if isinstance(chat, str) else str(chat)
        lines += [f"[[{section}.routes]]", f"chat_id = {shown}", f"agents = {agents!r}"]
    config = tmp_path / name
    config.write_text("\n".join([*lines, *tail]).replace("'", '"') + "\n")
    return config, env


def cards(fake: FakeTelegram | FakeFeishu, chat: object) -> dict[str, str]:
    """The bot's cards in `chat`, by message id: their text as it reads now."""
    if isinstance(fake, FakeTelegram):
        assert isinstance(chat, int)
        return {str(m.message_id): m.text for m in fake.bot_messages(chat)}
    assert isinstance(chat, str)
    return {m.message_id: m.text for m in fake.chat(chat) if m.msg_type == "interactive"}


def card_of(fake: FakeTelegram | FakeFeishu, chat: object, agent: str) -> tuple[str, str] | None:
    """(message id, text) of `agent`'s card in `chat`, when there is exactly one."""
    found = [(i, t) for i, t in cards(fake, chat).items() if agent in t.split("\n")[0].split()]
    return found[0] if len(found) == 1 else None


async def removed_routes_told(
    tmp_path: Path,
    fake: FakeTelegram | FakeFeishu,
    first: object,
    second: object,
    beta_id: str,
    second_id: str,
) -> None:
    """Alpha's card in the second chat and beta's in the first (both routes removed) say they
    are no longer followed, and alpha's card in the first chat goes on with its next change."""
    await eventually(
        lambda: UNROUTED in cards(fake, second).get(second_id, ""),
        timeout_s=WAIT_S,
        what="the second chat's card saying its chat no longer follows alpha",
    )
    await eventually(
        lambda: UNROUTED in cards(fake, first).get(beta_id, ""),
        timeout_s=WAIT_S,
        what="beta's card in the first chat saying so",
    )
    publish(tmp_path / "agents" / "alpha", "alpha step 2")
    await eventually(
        lambda: "alpha step 2" in "".join(cards(fake, first).values()),
        timeout_s=WAIT_S,
        what="alpha's card in the first chat going on",
    )


@pytest.mark.parametrize("platform", ["telegram", "feishu"])
async def test_a_route_a_reload_removes_leaves_its_cards_saying_so_and_a_return_edits_them(
    tmp_path: Path, platform: str, telegram: FakeTelegram, feishu: FakeFeishu
) -> None:
    """A reload that drops a chat's route, or an agent from a route, stops the cards there:
    each is edited a last time to say its chat no longer follows the agent (it went on
    showing the last state as if live: "running", for good). The other routes go on as
    before. A reload that routes the agent there again edits the same card back to life."""
    fake: FakeTelegram | FakeFeishu = telegram if platform == "telegram" else feishu
    first, second = TELEGRAM_CHATS if platform == "telegram" else FEISHU_CHATS
    both: list[tuple[object, list[str]]] = [(first, ["alpha", "beta"]), (second, ["alpha"])]
    config, env = write_config(tmp_path, fake, both)
    with ServeProcess(config, env=env) as serve:
        assert serve.proc is not None
        for agent in ("alpha", "beta"):
            publish(tmp_path / "agents" / agent, f"{agent} step 1")
        await eventually(
            lambda: (
                len(cards(fake, first)) == 2
                and all("step 1" in text for text in cards(fake, first).values())
                and "alpha step 1" in "".join(cards(fake, second).values())
            ),
            timeout_s=WAIT_S,
            what="alpha and beta in the first chat, alpha in the second",
        )
        beta_card = card_of(fake, first, "beta")
        second_card = card_of(fake, second, "alpha")
        assert beta_card is not None and second_card is not None

        write_config(tmp_path, fake, [(first, ["alpha"])])
        serve.proc.send_signal(signal.SIGHUP)
        await removed_routes_told(tmp_path, fake, first, second, beta_card[0], second_card[0])
        assert UNROUTED not in "".join(
            text for ident, text in cards(fake, first).items() if ident != beta_card[0]
        )
        assert "alpha step 2" not in cards(fake, second)[second_card[0]], "the edits stopped"

        write_config(tmp_path, fake, both)
        serve.proc.send_signal(signal.SIGHUP)
        await eventually(
            lambda: "alpha step 2" in cards(fake, second).get(second_card[0], ""),
            timeout_s=WAIT_S,
            what="the same card in the second chat showing alpha again",
        )
        assert UNROUTED not in cards(fake, second)[second_card[0]]
        assert len(cards(fake, second)) == 1, "no second card"
        assert await serve.aterminate() == 0


def edits(fake: FakeTelegram | FakeFeishu, chat: object, message_id: str) -> int:
    """How many edits of the bot's message `message_id` in `chat` the fake was asked for."""
    if isinstance(fake, FakeTelegram):
        return sum(
            1
            for r in fake.requests
            if r.method == "editMessageText"
            and r.chat_id == chat
            and str(r.params.get("message_id")) == message_id
        )
    return sum(1 for r in fake.requests_of("patch") if r.message_id == message_id)


def platform_of(
    platform: str, telegram: FakeTelegram, feishu: FakeFeishu
) -> tuple[FakeTelegram | FakeFeishu, object, object]:
    """The fake of `platform` and its two chats."""
    if platform == "telegram":
        return telegram, *TELEGRAM_CHATS
    return feishu, *FEISHU_CHATS


@pytest.mark.parametrize("platform", ["telegram", "feishu"])
async def test_a_route_removed_while_stopped_is_said_no_longer_followed_at_the_next_start(
    tmp_path: Path, platform: str, telegram: FakeTelegram, feishu: FakeFeishu
) -> None:
    """A route taken out of the file while `serve` was stopped left its cards as they were
    at the stop, looking live for good. The next start gives each the last edit a reload
    gives (once: a later start leaves it alone), and the routes still configured go on. A
    reload that routes the agent there again edits the same card back."""
    fake, first, second = platform_of(platform, telegram, feishu)
    both: list[tuple[object, list[str]]] = [(first, ["alpha", "beta"]), (second, ["alpha"])]
    config, env = write_config(tmp_path, fake, both)
    with ServeProcess(config, env=env) as serve:
        for agent in ("alpha", "beta"):
            publish(tmp_path / "agents" / agent, f"{agent} step 1")
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
    beta_card = card_of(fake, first, "beta")
    second_card = card_of(fake, second, "alpha")
    assert beta_card is not None and second_card is not None

    write_config(tmp_path, fake, [(first, ["alpha"])])
    with ServeProcess(config, env=env) as serve:
        await removed_routes_told(tmp_path, fake, first, second, beta_card[0], second_card[0])
        assert "alpha step 2" not in cards(fake, second)[second_card[0]], "the edits stopped"
        assert await serve.aterminate() == 0
    said = edits(fake, second, second_card[0])

    # Started again: the card said its last word already, and is not edited again.
    with ServeProcess(config, env=env) as serve:
        publish(tmp_path / "agents" / "alpha", "alpha step 3")
        await eventually(
            lambda: "alpha step 3" in "".join(cards(fake, first).values()),
            timeout_s=WAIT_S,
            what="alpha's card in the first chat after the second start",
        )
        assert edits(fake, second, second_card[0]) == said
        assert UNROUTED in cards(fake, second)[second_card[0]]

        write_config(tmp_path, fake, both)
        assert serve.proc is not None
        serve.proc.send_signal(signal.SIGHUP)
        await eventually(
            lambda: "alpha step 3" in cards(fake, second).get(second_card[0], ""),
            timeout_s=WAIT_S,
            what="the same card in the second chat showing alpha again",
        )
        assert UNROUTED not in cards(fake, second)[second_card[0]]
        assert len(cards(fake, second)) == 1, "no second card"
        assert await serve.aterminate() == 0

    # Taken out again while stopped: routed again in between, it is said again.
    write_config(tmp_path, fake, [(first, ["alpha", "beta"])])
    with ServeProcess(config, env=env) as serve:
        await eventually(
            lambda: UNROUTED in cards(fake, second).get(second_card[0], ""),
            timeout_s=WAIT_S,
            what="the second chat's card saying so again",
        )
        assert await serve.aterminate() == 0


@pytest.mark.parametrize("platform", ["telegram", "feishu"])
@pytest.mark.parametrize("how", ["reload", "restart"])
async def test_a_chat_taken_out_of_origin_chats_closes_the_routes_its_turns_opened(
    tmp_path: Path, platform: str, how: str, telegram: FakeTelegram, feishu: FakeFeishu
) -> None:
    """A turn from a chat in `origin_chats` brings the agent's card there. Taking the chat
    out of `origin_chats` (by a reload, or while the service is stopped) left that card
    edited on as if the chat still followed the agent; now it gets the "no longer followed"
    edit and the route closes: allowed again, only a later turn from the chat opens it."""
    fake, first, second = platform_of(platform, telegram, feishu)
    routes: list[tuple[object, list[str]]] = [(first, ["alpha"])]
    config, env = write_config(tmp_path, fake, routes, origin_chats=(second,))
    alpha = tmp_path / "agents" / "alpha"
    with ExitStack() as stack:
        serve = stack.enter_context(ServeProcess(config, env=env))
        publish(alpha, "alpha step 1")
        activity(alpha, "turn.origin", origin=f"{platform}:{second}")
        await eventually(
            lambda: "alpha step 1" in "".join(cards(fake, second).values()),
            timeout_s=WAIT_S,
            what="alpha's card in the chat its turn came from",
        )
        origin_card = card_of(fake, second, "alpha")
        assert origin_card is not None
        write_config(tmp_path, fake, routes)
        if how == "reload":
            assert serve.proc is not None
            serve.proc.send_signal(signal.SIGHUP)
        else:
            assert await serve.aterminate() == 0
            serve = stack.enter_context(ServeProcess(config, env=env))
        await eventually(
            lambda: UNROUTED in cards(fake, second).get(origin_card[0], ""),
            timeout_s=WAIT_S,
            what="the origin chat's card saying it no longer follows alpha",
        )
        publish(alpha, "alpha step 2")
        await eventually(
            lambda: "alpha step 2" in "".join(cards(fake, first).values()),
            timeout_s=WAIT_S,
            what="alpha's configured route going on",
        )
        assert "alpha step 2" not in cards(fake, second)[origin_card[0]], "the edits stopped"
        assert await serve.aterminate() == 0

    # Allowed again: the old turn opens nothing; a new one opens the same card again.
    write_config(tmp_path, fake, routes, origin_chats=(second,))
    with ServeProcess(config, env=env) as serve:
        publish(alpha, "alpha step 3")
        await eventually(
            lambda: "alpha step 3" in "".join(cards(fake, first).values()),
            timeout_s=WAIT_S,
            what="alpha's card after the restart",
        )
        assert UNROUTED in cards(fake, second)[origin_card[0]]
        activity(alpha, "turn.origin", origin=f"{platform}:{second}")
        await eventually(
            lambda: "alpha step 3" in cards(fake, second).get(origin_card[0], ""),
            timeout_s=WAIT_S,
            what="a new turn from the chat showing the same card again",
        )
        assert len(cards(fake, second)) == 1, "no second card"
        assert await serve.aterminate() == 0


@pytest.mark.parametrize("platform", ["telegram", "feishu"])
@pytest.mark.parametrize("how", ["reload", "restart"])
async def test_a_card_refusal_goes_with_its_route(
    tmp_path: Path, platform: str, how: str, telegram: FakeTelegram, feishu: FakeFeishu
) -> None:
    """A route whose card the platform refused for good keeps that refusal for `taskcard
    status` until a card goes through. Its route removed (by a reload, or while stopped),
    the refusal stayed in the state until the agent was forgotten (never, in a cluster), and
    showed again, stale, once the route came back; now it goes with the route."""
    fake, first, second = platform_of(platform, telegram, feishu)
    both: list[tuple[object, list[str]]] = [(first, ["alpha"]), (second, ["alpha"])]
    config, env = write_config(tmp_path, fake, both)
    # The same state, read by `taskcard status` with the removed route still configured.
    with_route, _ = write_config(tmp_path, fake, both, name="with-route.toml")
    route = f"{platform}:{second}::alpha"
    if isinstance(fake, FakeTelegram):
        assert isinstance(second, int)
        fake.fail_chat(second, 400, "Bad Request: message is too long")
    else:
        assert isinstance(second, str)
        fake.fail_chat(second, 230025, msg="The message content exceeds the length limit.")
    alpha = tmp_path / "agents" / "alpha"
    with ExitStack() as stack:
        serve = stack.enter_context(ServeProcess(config, env=env))
        publish(alpha, "alpha step 1")
        await eventually(
            lambda: status_routes(with_route)[route]["card_refused"],
            timeout_s=WAIT_S,
            what="the card refused in the second chat",
        )
        write_config(tmp_path, fake, [(first, ["alpha"])])
        if how == "reload":
            assert serve.proc is not None
            serve.proc.send_signal(signal.SIGHUP)
        else:
            assert await serve.aterminate() == 0
            serve = stack.enter_context(ServeProcess(config, env=env))
        await eventually(
            lambda: status_routes(with_route)[route]["card_refused"] is None,
            timeout_s=WAIT_S,
            what="the refusal gone with its route",
        )
        publish(alpha, "alpha step 2")
        await eventually(
            lambda: "alpha step 2" in "".join(cards(fake, first).values()),
            timeout_s=WAIT_S,
            what="alpha's other route going on",
        )
        assert await serve.aterminate() == 0
    assert status_routes(with_route)[route]["card_refused"] is None


def state_shown(fake: FakeTelegram | FakeFeishu, chat: object, agent: str) -> str:
    """The head of `agent`'s card in `chat` (its name and state), "" while there is none."""
    found = card_of(fake, chat, agent)
    return "" if found is None else " ".join(found[1].split("\n")[:2])


@pytest.mark.parametrize("platform", ["telegram", "feishu"])
async def test_a_reload_that_shortens_no_output_after_s_applies_to_the_agents_served(
    tmp_path: Path, platform: str, telegram: FakeTelegram, feishu: FakeFeishu
) -> None:
    """`[display] no_output_after_s` is one of the keys a reload applies: an agent already
    served takes the new value too (it kept the one it was first read with, so a silent
    turn went on showing "running" for the old hour; only agents added later took it)."""
    fake: FakeTelegram | FakeFeishu = telegram if platform == "telegram" else feishu
    chat = TELEGRAM_CHATS[0] if platform == "telegram" else FEISHU_CHATS[0]
    routes: list[tuple[object, list[str]]] = [(chat, ["alpha"])]
    config, env = write_config(tmp_path, fake, routes, ("[display]", "no_output_after_s = 3600"))
    with ServeProcess(config, env=env) as serve:
        assert serve.proc is not None
        publish(tmp_path / "agents" / "alpha", "alpha step 1")
        activity(tmp_path / "agents" / "alpha", "turn.start")
        await eventually(
            lambda: "running" in state_shown(fake, chat, "alpha"),
            timeout_s=WAIT_S,
            what="alpha's card showing its turn running",
        )

        write_config(tmp_path, fake, routes, ("[display]", "no_output_after_s = 1"))
        serve.proc.send_signal(signal.SIGHUP)
        await eventually(lambda: "config reloaded" in serve.logs, what="the reload")
        await eventually(
            lambda: "unknown" in state_shown(fake, chat, "alpha"),
            timeout_s=WAIT_S,
            what="the silent turn shown as unknown after the new second, not the old hour",
        )
        assert await serve.aterminate() == 0


@pytest.mark.parametrize("platform", ["telegram", "feishu"])
async def test_a_discovery_root_a_reload_adds_is_watched_for_new_agents(
    tmp_path: Path, platform: str, telegram: FakeTelegram, feishu: FakeFeishu
) -> None:
    """`[discover] roots` is one of the keys a reload applies: a folder that appears under
    a root the reload added is an agent served like one under a root given at the start (the
    watcher kept the roots it started with, so such a folder was never found by a service
    started without roots, and only at the next rescan by one that had others)."""
    fake: FakeTelegram | FakeFeishu = telegram if platform == "telegram" else feishu
    chat = TELEGRAM_CHATS[0] if platform == "telegram" else FEISHU_CHATS[0]
    (tmp_path / "fleet").mkdir()
    routes: list[tuple[object, list[str]]] = [(chat, ["*"])]
    config, env = write_config(tmp_path, fake, routes)
    with ServeProcess(config, env=env) as serve:
        assert serve.proc is not None
        publish(tmp_path / "agents" / "alpha", "alpha step 1")
        await eventually(
            lambda: "alpha step 1" in "".join(cards(fake, chat).values()),
            timeout_s=WAIT_S,
            what="alpha's card",
        )

        write_config(tmp_path, fake, routes, ("[discover]", 'roots = ["fleet"]'))
        serve.proc.send_signal(signal.SIGHUP)
        await eventually(lambda: "config reloaded" in serve.logs, what="the reload")
        (tmp_path / "fleet" / "newcomer").mkdir()
        publish(tmp_path / "fleet" / "newcomer", "newcomer step 1")
        await eventually(
            lambda: "newcomer step 1" in "".join(cards(fake, chat).values()),
            timeout_s=WAIT_S,
            what="the card of the agent found under the root the reload added",
        )
        assert await serve.aterminate() == 0
