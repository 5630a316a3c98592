"""The board end to end: `taskcard serve` with a config file, the contract files, the fake
Telegram Bot API (with Telegram's group limit of 20 messages a minute) and the fake Feishu
Open API (commands through the signed, encrypted callback), as people would see it."""

from __future__ import annotations

import html
import json
import os
import shutil
import signal
from pathlib import Path

from taskcard.producers.task_card.contract import CardPaths
from tests.e2e.harness import (
    ServeProcess,
    activity,
    agents_lines,
    eventually,
    notify,
    publish,
    run_cli,
)
from tests.e2e.test_serve_feishu import CHAT, ENCRYPT, VERIFY, free_port
from tests.fakes.feishu_api import FakeFeishu
from tests.fakes.telegram_api import FakeTelegram, StoredMessage

GROUP = -1009876543210
BOARD_TITLE = "Task board"
RETIRED_NOTE = "followed on this chat's task board"


def telegram_serve(
    tmp_path: Path, fake: FakeTelegram, agents: list[str], view: str
) -> ServeProcess:
    lines = [
        *agents_lines(tmp_path, agents),
        "[telegram]",
        'token_env = "TC_TEST_TOKEN"',
        f'api_base_url = "{fake.base_url}"',
        "poll_timeout_s = 1",
        "[[telegram.routes]]",
        f"chat_id = {GROUP}",
        f"agents = {json.dumps(agents)}",
        f'view = "{view}"',
    ]
    config = tmp_path / "taskcard.toml"
    config.write_text("\n".join(lines) + "\n")
    return ServeProcess(config, env={"TC_TEST_TOKEN": fake.token})


def boards(fake: FakeTelegram) -> list[StoredMessage]:
    return [
        m
        for m in fake.bot_messages(GROUP)
        if m.text.startswith(f"📋 {BOARD_TITLE}") or m.text.startswith(f"🟠 {BOARD_TITLE}")
    ]


def board_text(fake: FakeTelegram) -> str:
    found = boards(fake)
    return found[0].text if len(found) == 1 else ""


async def test_telegram_board_of_30_agents_one_message_and_an_error_card(
    tmp_path: Path, telegram: FakeTelegram
) -> None:
    agents = [f"agent{i:02d}" for i in range(30)]
    with telegram_serve(tmp_path, telegram, agents, "board") as serve:
        for agent in agents:
            publish(tmp_path / "agents" / agent, f"**{agent}** step 1/5")
        await eventually(
            lambda: all(f"{a} step 1/5" in board_text(telegram) for a in agents),
            what="every agent on the one board",
        )
        assert "30 agents" in board_text(telegram)
        assert len(telegram.bot_messages(GROUP)) == 1, "only the board: no card per agent"
        board = boards(telegram)[0]
        assert any(e["type"] == "bold" for e in board.entities)

        publish(tmp_path / "agents" / "agent07", "**agent07** step 4/5")
        await eventually(lambda: "agent07 step 4/5" in board_text(telegram), what="the edit")

        notify(tmp_path / "agents" / "agent13", "n-err-1", "error", code="timeout")
        await eventually(
            lambda: "agent13 · unknown · ⚠ error" in board_text(telegram),
            what="the mark",
            timeout_s=90,
        )
        lines = board_text(telegram).splitlines()
        assert "agent13" in lines[1], "what needs people comes first"
        card = await eventually(
            lambda: next(
                (
                    m
                    for m in telegram.bot_messages(GROUP)
                    if "agent13 ·" in m.text.split("\n")[0] and "renderer error" in m.text
                ),
                None,
            ),
            what="the agent in error gets its own card",
            timeout_s=90,
        )
        assert "agent13 step 1/5" in card.text
        assert len(boards(telegram)) == 1

        notify(tmp_path / "agents" / "agent13", "n-err-2", "recovered")
        await eventually(
            lambda: RETIRED_NOTE in (telegram.message(GROUP, card.message_id) or card).text,
            what="its card says it needs no one now",
            timeout_s=90,
        )
        await eventually(
            lambda: "⚠ error" not in board_text(telegram), what="mark cleared", timeout_s=90
        )
        assert telegram.rate_limited == []
        assert await serve.aterminate() == 0


async def test_telegram_board_and_cards_commands_switch_and_persist(
    tmp_path: Path, telegram: FakeTelegram
) -> None:
    agents = ["alpha", "beta", "gamma"]
    serve = telegram_serve(tmp_path, telegram, agents, "cards")
    with serve:
        for agent in agents:
            publish(tmp_path / "agents" / agent, f"{agent} card v1")
        await eventually(lambda: len(telegram.bot_messages(GROUP)) == 3, what="three cards")
        cards = [m.message_id for m in telegram.bot_messages(GROUP)]
        telegram.inject_command(GROUP, "/taskcard board")
        await eventually(lambda: "alpha card v1" in board_text(telegram), what="the board")
        await eventually(
            lambda: all(
                RETIRED_NOTE in (telegram.message(GROUP, mid) or _none).text for mid in cards
            ),
            what="the three cards retired",
        )
        await eventually(
            lambda: any("now shows one task board" in m.text for m in telegram.bot_messages(GROUP))
        )
        assert await serve.aterminate() == 0

    count = len(telegram.bot_messages(GROUP))
    publish(tmp_path / "agents" / "beta", "beta card v2")
    with ServeProcess(serve.config, env=serve.env) as again:
        await eventually(lambda: "beta card v2" in board_text(telegram), what="board after restart")
        assert len(telegram.bot_messages(GROUP)) == count, "still the board: no new card"
        telegram.inject_command(GROUP, "/taskcard cards")
        await eventually(lambda: "replaced by one card per agent" in boards(telegram)[0].text)
        fresh = await eventually(
            lambda: [
                m
                for m in telegram.bot_messages(GROUP)
                if m.message_id not in cards
                and "beta card v2" in m.text
                and BOARD_TITLE not in m.text
            ],
            what="a fresh card per agent",
        )
        assert len(fresh) == 1
        assert await again.aterminate() == 0


async def test_telegram_reload_that_changes_a_routes_view_switches_the_chat(
    tmp_path: Path, telegram: FakeTelegram
) -> None:
    """SIGHUP with the route's `view` changed: a chat that never chose a view follows the
    configuration at once, as routes do on a reload; a chat's own choice still wins."""
    agents = ["alpha", "beta"]
    serve = telegram_serve(tmp_path, telegram, agents, "cards")
    with serve:
        for agent in agents:
            publish(tmp_path / "agents" / agent, f"{agent} card v1")
        await eventually(lambda: len(telegram.bot_messages(GROUP)) == 2, what="two cards")
        cards = [m.message_id for m in telegram.bot_messages(GROUP)]

        serve.config.write_text(serve.config.read_text().replace('"cards"', '"board"'))
        assert serve.proc is not None
        serve.proc.send_signal(signal.SIGHUP)
        await eventually(lambda: "beta card v1" in board_text(telegram), what="the board")
        await eventually(
            lambda: all(
                RETIRED_NOTE in (telegram.message(GROUP, mid) or _none).text for mid in cards
            ),
            what="the two cards retired",
        )

        telegram.inject_command(GROUP, "/taskcard cards")
        await eventually(lambda: "replaced by one card per agent" in boards(telegram)[0].text)
        serve.config.write_text(serve.config.read_text() + "# touched\n")
        serve.proc.send_signal(signal.SIGHUP)
        await eventually(lambda: serve.logs.count("config reloaded") == 2, what="the 2nd reload")
        publish(tmp_path / "agents" / "beta", "beta card v2")
        await eventually(
            lambda: any(
                "beta card v2" in m.text and BOARD_TITLE not in m.text
                for m in telegram.bot_messages(GROUP)
            ),
            what="beta's card, the chat's choice kept",
        )
        assert "replaced by one card per agent" in boards(telegram)[0].text
        assert await serve.aterminate() == 0


class _None:
    text = ""


_none = _None()


class FeishuSetup:
    def __init__(self, tmp_path: Path, fake: FakeFeishu, agents: list[str]) -> None:
        self.url = f"http://127.0.0.1:{free_port()}/feishu/events"
        port = self.url.split(":")[2].split("/")[0]
        lines = [
            *agents_lines(tmp_path, agents),
            "[feishu]",
            'app_id_env = "TC_FS_APP_ID"',
            'app_secret_env = "TC_FS_APP_SECRET"',
            f'domain = "{fake.base_url}"',
            'events = "webhook"',
            "[feishu.webhook]",
            'host = "127.0.0.1"',
            f"port = {port}",
            'path = "/feishu/events"',
            'verification_token_env = "TC_FS_VERIFY"',
            'encrypt_key_env = "TC_FS_ENCRYPT"',
            "[[feishu.routes]]",
            f'chat_id = "{CHAT}"',
            'agents = ["*"]',
            'view = "board"',
        ]
        self.config = tmp_path / "taskcard.toml"
        self.config.write_text("\n".join(lines) + "\n")
        self.env = {
            "TC_FS_APP_ID": fake.app_id,
            "TC_FS_APP_SECRET": fake.app_secret,
            "TC_FS_VERIFY": VERIFY,
            "TC_FS_ENCRYPT": ENCRYPT,
        }

    def serve(self) -> ServeProcess:
        return ServeProcess(self.config, env=self.env)


def feishu_cards(fake: FakeFeishu) -> list[str]:
    """Each card's visible strings (title, subtitle, elements), entities read as a client does."""
    return [html.unescape(m.text) for m in fake.chat(CHAT) if m.msg_type == "interactive"]


def feishu_board(fake: FakeFeishu) -> str:
    found = [t for t in feishu_cards(fake) if t.startswith(BOARD_TITLE + "\n")]
    return found[0] if len(found) == 1 else ""


def feishu_card_of(fake: FakeFeishu, agent: str) -> str | None:
    return next((t for t in feishu_cards(fake) if t.split("\n")[0] == agent), None)


async def test_feishu_board_error_card_and_switch_persisting_across_restart(
    tmp_path: Path, feishu: FakeFeishu
) -> None:
    agents = [f"worker{i}" for i in range(6)]
    setup = FeishuSetup(tmp_path, feishu, agents)
    with setup.serve() as serve:
        for agent in agents:
            publish(tmp_path / "agents" / agent, f"# {agent} *phase* 1 <at id=all>")
        await eventually(
            lambda: all(f"{a} phase 1 <at id=all>" in feishu_board(feishu) for a in agents),
            what="the board with every agent, their text shown as typed",
        )
        assert len(feishu_cards(feishu)) == 1
        board_card = next(c for c in feishu.cards(CHAT) if "Task board" in str(c["header"]))
        markdown = board_card["body"]["elements"][0]
        assert markdown["tag"] == "markdown" and "**worker" in markdown["content"]
        assert "<at" not in markdown["content"]

        notify(tmp_path / "agents" / "worker4", "f-err-1", "error", code="crash")
        await eventually(
            lambda: "renderer error" in (feishu_card_of(feishu, "worker4") or ""),
            what="worker4's own card",
        )
        await eventually(
            lambda: (
                feishu_board(feishu).split("\n")[2].startswith("**worker4 · unknown** · ⚠ error")
            ),
            what="worker4 first on the board, marked",
        )

        answer = await feishu.deliver_command(
            setup.url, CHAT, "/taskcard cards", verification_token=VERIFY, encrypt_key=ENCRYPT
        )
        assert answer.status == 200
        await eventually(
            lambda: "replaced by one card per agent" in feishu_board(feishu), what="board retired"
        )
        # Said once, as on Telegram (it was the subtitle and the body both).
        assert feishu_board(feishu).count("replaced by one card per agent") == 1
        await eventually(
            lambda: all(feishu_card_of(feishu, agent) for agent in agents),
            what="one card per agent",
        )
        assert await serve.aterminate() == 0

    publish(tmp_path / "agents" / "worker1", "worker1 after the restart")
    with setup.serve() as again:
        await eventually(
            lambda: any("worker1 after the restart" in t for t in feishu_cards(feishu)),
            what="the card edited after the restart",
        )
        assert "replaced by one card per agent" in feishu_board(feishu), "the choice persisted"
        assert len(feishu_cards(feishu)) == 7
        assert await again.aterminate() == 0


async def test_telegram_board_drops_the_line_of_an_agent_whose_folder_is_removed(
    tmp_path: Path, telegram: FakeTelegram
) -> None:
    """A discovered agent in error leaves the fleet: the board stops listing it (and stops
    saying someone needs people) without waiting for another agent of the chat to change;
    once the chat's last agent leaves, the board lists none. `taskcard status` shows the
    board's resident message beside the agents' routes."""
    for agent in ("keeper", "leaver"):
        (tmp_path / "fleet" / agent).mkdir(parents=True)
    config = tmp_path / "taskcard.toml"
    lines = [
        'state_dir = ".taskcard"',
        "[discover]",
        'roots = ["fleet"]',
        "[telegram]",
        'token_env = "TC_TEST_TOKEN"',
        f'api_base_url = "{telegram.base_url}"',
        "poll_timeout_s = 1",
        "[[telegram.routes]]",
        f"chat_id = {GROUP}",
        'agents = ["*"]',
        'view = "board"',
    ]
    config.write_text("\n".join(lines) + "\n")
    with ServeProcess(config, env={"TC_TEST_TOKEN": telegram.token}) as serve:
        publish(tmp_path / "fleet" / "keeper", "keeper v1")
        publish(tmp_path / "fleet" / "leaver", "leaver v1")
        notify(tmp_path / "fleet" / "leaver", "l-err-1", "error", code="renderer_timeout")
        await eventually(
            lambda: "leaver · unknown · ⚠ error" in board_text(telegram),
            what="the agent in error first on the board",
        )
        status = run_cli("status", "--config", str(config))
        assert status.returncode == 0, status.stderr
        board_id = boards(telegram)[0].message_id
        assert f"telegram:{GROUP}::#board\n  resident message: {board_id}\n" in status.stdout

        shutil.rmtree(tmp_path / "fleet" / "leaver")
        await eventually(
            lambda: any(
                "Agent retired" in m.text and m.text.startswith("❔ leaver")
                for m in telegram.bot_messages(GROUP)
            ),
            what="the leaver's own card retired",
        )
        await eventually(
            lambda: "leaver" not in board_text(telegram) and "keeper v1" in board_text(telegram),
            what="the board without the leaver",
        )
        assert board_text(telegram).startswith("📋 Task board · 1 agent · 1 unknown")

        shutil.rmtree(tmp_path / "fleet" / "keeper")  # the chat's last agent
        await eventually(
            lambda: board_text(telegram) == "📋 Task board · 0 agents",
            what="a board that lists no agent",
        )
        assert await serve.aterminate() == 0


# What the card of an agent whose activity log is a named pipe says, and the board's mark.
PIPE_ROW = (
    "⚠ logs/events.jsonl: is a named pipe, not a regular file; replace it with a regular file"
)
PROBLEMS_MARK = "⚠ problems with its files: see its card"


def pipe_events(workdir: Path) -> Path:
    """Make the agent's activity log a named pipe, a file the service refuses to read."""
    events = CardPaths(workdir).events
    events.parent.mkdir(parents=True, exist_ok=True)
    if events.exists():
        events.unlink()
    os.mkfifo(events)
    return events


async def test_telegram_board_marks_an_agent_with_refused_files_and_gives_it_a_card(
    tmp_path: Path, telegram: FakeTelegram
) -> None:
    """A file the service refuses to read is said on the agent's card in the cards view; on
    a board, the agent's line is marked, first, and the agent gets its own card saying which
    file and the fix, until the file is fixed."""
    agents = ["alpha", "beta", "piped"]
    piped = tmp_path / "agents" / "piped"
    with telegram_serve(tmp_path, telegram, agents, "board") as serve:
        for agent in agents:
            publish(tmp_path / "agents" / agent, f"{agent} step 1")
        await eventually(
            lambda: all(f"{a} step 1" in board_text(telegram) for a in agents),
            what="every agent on the board",
        )
        assert PROBLEMS_MARK not in board_text(telegram)

        events = pipe_events(piped)  # while served, with no other change
        await eventually(
            lambda: f"piped · unknown · {PROBLEMS_MARK}" in board_text(telegram),
            what="the mark on the agent's line",
        )
        assert "piped" in board_text(telegram).splitlines()[1], "what needs people comes first"
        assert "1 needs people" in board_text(telegram).splitlines()[0]
        card = await eventually(
            lambda: next(
                (
                    m
                    for m in telegram.bot_messages(GROUP)
                    if m.text.split("\n")[0].startswith("❔ piped") and PIPE_ROW in m.text
                ),
                None,
            ),
            what="the agent's own card naming the file and the fix",
            timeout_s=90,
        )
        assert "piped step 1" in card.text
        assert len(boards(telegram)) == 1
        assert not any(
            m.text.split("\n")[0].startswith(("❔ alpha", "❔ beta"))
            for m in telegram.bot_messages(GROUP)
        ), "healthy agents stay on the board alone"

        events.unlink()
        activity(piped, "turn.start")
        await eventually(
            lambda: RETIRED_NOTE in (telegram.message(GROUP, card.message_id) or card).text,
            what="its card says the board follows it again",
            timeout_s=90,
        )
        await eventually(
            lambda: (
                PROBLEMS_MARK not in board_text(telegram)
                and "piped · running" in board_text(telegram)
            ),
            what="the mark cleared",
            timeout_s=90,
        )
        assert await serve.aterminate() == 0


async def test_feishu_board_marks_an_agent_with_refused_files_and_gives_it_a_card(
    tmp_path: Path, feishu: FakeFeishu
) -> None:
    agents = ["alpha", "beta", "piped"]
    piped = tmp_path / "agents" / "piped"
    setup = FeishuSetup(tmp_path, feishu, agents)
    with setup.serve() as serve:
        for agent in agents:
            publish(tmp_path / "agents" / agent, f"{agent} step 1")
        await eventually(
            lambda: all(f"{a} step 1" in feishu_board(feishu) for a in agents),
            what="every agent on the board",
        )
        assert len(feishu_cards(feishu)) == 1

        events = pipe_events(piped)
        await eventually(
            lambda: (
                feishu_board(feishu)
                .split("\n")[2]
                .startswith(f"**piped · unknown** · {PROBLEMS_MARK}")
            ),
            what="the agent first on the board, marked",
        )
        await eventually(
            lambda: PIPE_ROW in (feishu_card_of(feishu, "piped") or ""),
            what="the agent's own card naming the file and the fix",
        )
        assert "piped step 1" in (feishu_card_of(feishu, "piped") or "")
        assert feishu_card_of(feishu, "alpha") is None and feishu_card_of(feishu, "beta") is None

        events.unlink()
        activity(piped, "turn.start")
        await eventually(
            lambda: RETIRED_NOTE in (feishu_card_of(feishu, "piped") or ""),
            what="its card says the board follows it again",
        )
        await eventually(lambda: PROBLEMS_MARK not in feishu_board(feishu), what="the mark cleared")
        assert await serve.aterminate() == 0


def agent_cards(texts: list[str], agents: list[str]) -> list[str]:
    """The texts of `texts` that are an agent's own card (its name heads the first line)."""
    return [t for t in texts if any(a in t.split("\n")[0].split() for a in agents)]


async def test_telegram_board_asked_back_while_cards_are_on_their_way_retires_them(
    tmp_path: Path, telegram: FakeTelegram
) -> None:
    """`/taskcard cards` then `/taskcard board` before the cards the first asked for were
    posted: each card still on its way is let go too (dropped unsent, or edited to say the
    board follows its agent). Only the cards already posted were retired: one on its way was
    posted afterwards and stayed, showing its first state as if live, beside the board."""
    agents = ["alpha", "gamma"]
    with telegram_serve(tmp_path, telegram, agents, "board") as serve:
        for agent in agents:
            publish(tmp_path / "agents" / agent, f"{agent} v1")
        await eventually(
            lambda: all(f"{a} v1" in board_text(telegram) for a in agents), what="the board"
        )
        telegram.hold_answers("sendMessage")  # what `cards` sends stays on its way
        telegram.inject_command(GROUP, "/taskcard cards")
        await eventually(
            lambda: serve.logs.count("now shows cards") == 1 and telegram.bot_messages(GROUP)[1:],
            what="the switch to cards, its first send taken by Telegram",
        )
        telegram.inject_command(GROUP, "/taskcard board")
        await eventually(lambda: "now shows board" in serve.logs, what="the switch back")
        telegram.release_answers("sendMessage")
        for agent in agents:
            publish(tmp_path / "agents" / agent, f"{agent} v2")

        def settled() -> bool:
            texts = [m.text for m in telegram.bot_messages(GROUP)]
            return (
                all(f"{a} v2" in board_text(telegram) for a in agents)
                and any("now shows one task board" in t for t in texts)
                and all(RETIRED_NOTE in t for t in agent_cards(texts, agents))
            )

        await eventually(settled, timeout_s=90, what="the board alone, every card let go")
        assert await serve.aterminate() == 0
    texts = [m.text for m in telegram.bot_messages(GROUP)]
    assert all(RETIRED_NOTE in t for t in agent_cards(texts, agents)), texts


async def test_feishu_board_asked_back_while_cards_wait_for_the_chats_limit_retires_them(
    tmp_path: Path, feishu: FakeFeishu
) -> None:
    """The same on Feishu, the cards waiting for the chat's send limit rather than for an
    answer: `/taskcard board` lets them go, and none is posted later beside the board."""
    agents = ["alpha", "gamma"]
    setup = FeishuSetup(tmp_path, feishu, agents)
    setup.config.write_text(
        setup.config.read_text() + "[feishu.limits.chat_send]\nmax_calls = 1\nperiod_s = 10.0\n"
    )
    with setup.serve() as serve:
        for agent in agents:
            publish(tmp_path / "agents" / agent, f"{agent} v1")
        await eventually(
            lambda: all(f"{a} v1" in feishu_board(feishu) for a in agents), what="the board"
        )
        for command in ("/taskcard cards", "/taskcard board"):
            answer = await feishu.deliver_command(
                setup.url, CHAT, command, verification_token=VERIFY, encrypt_key=ENCRYPT
            )
            assert answer.status == 200
        await eventually(lambda: serve.logs.count("now shows") == 2, what="both switches taken")
        for agent in agents:
            publish(tmp_path / "agents" / agent, f"{agent} v2")

        def settled() -> bool:
            texts = [m.text for m in feishu.chat(CHAT)]
            return (
                all(f"{a} v2" in feishu_board(feishu) for a in agents)
                and any("now shows one task board" in t for t in texts)
                and all(RETIRED_NOTE in t for t in agent_cards(feishu_cards(feishu), agents))
            )

        await eventually(settled, timeout_s=90, what="the board alone, every card let go")
        assert await serve.aterminate() == 0
    assert all(RETIRED_NOTE in t for t in agent_cards(feishu_cards(feishu), agents))
