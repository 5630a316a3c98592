"""SIGHUP reloads that change the routes or the display defaults, end to end: `taskcard serve`
with a config file rewritten while it runs, against the fake Telegram Bot API and the fake
Feishu Open API, the chats read as people see them."""

from __future__ import annotations

import contextlib
import json
import signal
import sqlite3
from pathlib import Path

import pytest

from tests.e2e.harness import ServeProcess, activity, agents_lines, eventually, notify, publish
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
) -> tuple[Path, dict[str, str]]:
    """`tmp_path/taskcard.toml`: agents alpha and beta and one route per (chat, agents) on
    the fake's platform, turns from `origin_chats` opening routes, then the `tail` lines
    (sections of their own); returns the file and the secrets' environment."""
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
    lines.append(f"origin_chats = {json.dumps(list(origin_chats))}")
    for chat, agents in routes:
        shown = f'"{chat}"' if isinstance(chat, str) else str(chat)
        lines += [f"[[{section}.routes]]", f"chat_id = {shown}", f"agents = {agents!r}"]
    config = tmp_path / "taskcard.toml"
    config.write_text("\n".join([*lines, *tail]).replace("'", '"') + "\n")
    return config, env


def notice_states(tmp_path: Path, chat: object) -> list[str]:
    """The states the service's state file records for the notices of `chat`'s routes."""
    uri = f"file:{tmp_path / '.taskcard' / 'state.sqlite3'}?mode=ro"
    with contextlib.closing(sqlite3.connect(uri, uri=True)) as db:
        rows = db.execute("SELECT route, state FROM notices").fetchall()
    return [state for route, state in rows if route.split(":")[1] == str(chat)]


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
        publish(tmp_path / "agents" / "alpha", "alpha step 2")
        await eventually(
            lambda: "alpha step 2" in "".join(cards(fake, first).values()),
            timeout_s=WAIT_S,
            what="alpha's card in the first chat going on",
        )
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


def state_shown(fake: FakeTelegram | FakeFeishu, chat: object, agent: str) -> str:
    """The head of `agent`'s card in `chat` (its name and state), "" while there is none."""
    found = card_of(fake, chat, agent)
    return "" if found is None else " ".join(found[1].split("\n")[:2])


async def test_the_notices_queued_for_a_route_a_reload_removes_are_withdrawn(
    tmp_path: Path, telegram: FakeTelegram
) -> None:
    """A notice waits its turn in both of alpha's chats (each one's card edit is still on
    its way) when a reload takes the first chat's route away: it is withdrawn there, said in
    the log, and shows in the second chat alone. It went on to the chat that no longer
    follows alpha."""
    first, second = TELEGRAM_CHATS
    both: list[tuple[object, list[str]]] = [(first, ["alpha"]), (second, ["alpha"])]
    config, env = write_config(tmp_path, telegram, both)
    # The held edits below must outlast the steps of the test, not time out in between.
    slow = "poll_timeout_s = 1\nrequest_timeout_s = 300"
    config.write_text(config.read_text().replace("poll_timeout_s = 1", slow))
    workdir = tmp_path / "agents" / "alpha"
    code = "renderer_timeout"

    def notices(chat: int) -> int:
        return sum(f"[{code}]" in m.text for m in telegram.bot_messages(chat))

    with ServeProcess(config, env=env) as serve:
        assert serve.proc is not None
        publish(workdir, "alpha step 1")
        await eventually(
            lambda: all("alpha step 1" in "".join(cards(telegram, c).values()) for c, _ in both),
            timeout_s=WAIT_S,
            what="alpha's card in both chats",
        )
        edits = {chat: telegram.count("editMessageText", chat) for chat in (first, second)}
        telegram.hold_answers("editMessageText")  # each chat's lane waits on its edit
        publish(workdir, "alpha step 2")
        await eventually(
            lambda: all(telegram.count("editMessageText", c) > n for c, n in edits.items()),
            timeout_s=WAIT_S,
            what="an edit on its way in each chat",
        )
        notify(workdir, f"task_card.error:tc_1:1:{code}", "error", code=code)
        await eventually(
            lambda: (
                notice_states(tmp_path, first) == ["pending"]
                and notice_states(tmp_path, second) == ["pending"]
            ),
            timeout_s=WAIT_S,
            what="the notice recorded for both chats, queued behind their edits",
        )

        write_config(tmp_path, telegram, [(second, ["alpha"])])
        config.write_text(config.read_text().replace("poll_timeout_s = 1", slow))
        serve.proc.send_signal(signal.SIGHUP)
        await eventually(
            lambda: "config reloaded" in serve.logs, timeout_s=WAIT_S, what="the reload"
        )
        telegram.release_answers("editMessageText")
        await eventually(
            lambda: notices(second) == 1 and UNROUTED in "".join(cards(telegram, first).values()),
            timeout_s=WAIT_S,
            what="the notice in the second chat, the first chat's card saying it is unfollowed",
        )
        await eventually(
            lambda: notice_states(tmp_path, first) != ["pending"],
            timeout_s=WAIT_S,
            what="the first chat's notice settled",
        )
        assert notice_states(tmp_path, first) == ["suppressed"]
        assert notices(first) == 0, "not sent to a chat that no longer follows alpha"
        assert "1 unsent notice withdrawn" in serve.logs
        assert await serve.aterminate() == 0


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
