"""How a renderer error episode ends in the chats, when the watch that failed does not
recover while running: stopped and retried, stopped and replaced by a new watch, removed.

Driven the way an agent does it (`taskcard card ...` from the shell, the real producer host)
and projected by `taskcard serve` to the fake Bot API and the fake Feishu. Before, a new
watch's good card cleared the card's error line silently, the chat's last word staying the
error notice, and a removed card kept "renderer error since ..." for good; the recovery
notice said "it is refreshing again" of a stopped watch that a retry had published once.
The card's error line names no code: the service hears only an episode's first error, and
the renderer may fail otherwise since.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.e2e.harness import TOKEN_ENV, ServeProcess, eventually, telegram_config
from tests.e2e.test_producer_to_chat import card
from tests.e2e.test_serve_feishu import CHAT, Setup
from tests.fakes.feishu_api import FakeFeishu
from tests.fakes.telegram_api import FakeTelegram

GROUP = -1001234567890
RENDERER = """\
from pathlib import Path
state = Path("state.txt").read_text().strip()
if state == "fail":
    raise SystemExit(3)
print(f"**deploy** state: {state}")
"""
FAILING = "⚠ renderer error since"


@dataclass
class Chat:
    """One platform's chat: the resident card's text and the notices, oldest first."""

    serve: ServeProcess
    card: Callable[[], str]
    notices: Callable[[], list[str]]


@pytest.fixture(params=["telegram", "feishu"])
async def chat(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Chat]:
    workdir = tmp_path / "agents" / "builder"
    if request.param == "telegram":
        async with FakeTelegram() as telegram:
            config = telegram_config(tmp_path, telegram.base_url, GROUP)

            def tg_messages() -> list[str]:
                return [m.text for m in telegram.bot_messages(GROUP)]

            yield Chat(
                ServeProcess(config, env={TOKEN_ENV: telegram.token}),
                lambda: next(iter(tg_messages()), ""),
                lambda: tg_messages()[1:],
            )
        return
    async with FakeFeishu() as feishu:
        setup = Setup(tmp_path, feishu, ["builder"])

        def fs_of(interactive: bool) -> list[str]:
            return [
                m.text
                for m in feishu.chat(CHAT)
                if m.visible and (m.msg_type == "interactive") == interactive
            ]

        yield Chat(
            setup.serve(),
            lambda: next(iter(fs_of(True)), ""),
            lambda: fs_of(False),
        )
    assert workdir.is_dir()


async def failing_card(chat: Chat, workdir: Path, runtime: Path) -> None:
    """A watch whose card reached the chat, then an error episode the chat was told of."""
    (workdir / "render.py").write_text(RENDERER)
    (workdir / "state.txt").write_text("building")
    started = card(workdir, runtime, "start", "render.py", "--interval-s", "1")
    assert started["status"] == "watching", started
    await eventually(lambda: "state: building" in chat.card(), what="the card")
    (workdir / "state.txt").write_text("fail")
    await eventually(lambda: chat.notices(), what="the error notice")
    assert "task card error (watch tc_1)" in chat.notices()[0], chat.notices()
    await eventually(lambda: FAILING in chat.card(), what="the card's error line")
    # No code on the card: it would stay the first one while the renderer fails otherwise.
    assert "renderer_nonzero_exit" not in chat.card(), chat.card()


async def test_a_new_watch_after_a_failed_one_tells_the_chat_the_card_publishes_again(
    chat: Chat, tmp_path: Path, runtime_dir: Path
) -> None:
    workdir = tmp_path / "agents" / "builder"
    with chat.serve as serve:
        await failing_card(chat, workdir, runtime_dir)
        assert card(workdir, runtime_dir, "stop", "tc_1")["status"] == "stopped"
        (workdir / "state.txt").write_text("deployed")
        started = card(workdir, runtime_dir, "start", "render.py", "--interval-s", "1")
        assert started["watch_id"] == "tc_2", started
        await eventually(lambda: len(chat.notices()) >= 2, what="the end of the episode")
        assert chat.notices()[1] == (
            "✅ builder: task card publishes again: watch tc_2 replaced watch tc_1,"
            " which had failed."
        )
        await eventually(lambda: "state: deployed" in chat.card(), what="the new card")
        assert FAILING not in chat.card()
        assert await serve.aterminate() == 0
    assert len(chat.notices()) == 2, chat.notices()


async def test_a_retried_stopped_watch_is_told_recovered_without_saying_it_refreshes(
    chat: Chat, tmp_path: Path, runtime_dir: Path
) -> None:
    workdir = tmp_path / "agents" / "builder"
    with chat.serve as serve:
        await failing_card(chat, workdir, runtime_dir)
        assert card(workdir, runtime_dir, "stop", "tc_1")["status"] == "stopped"
        (workdir / "state.txt").write_text("fixed")
        retried = card(workdir, runtime_dir, "retry", "tc_1")
        assert retried["status"] == "stopped" and "refresh_error" not in retried, retried
        await eventually(lambda: len(chat.notices()) >= 2, what="the recovery")
        assert chat.notices()[1] == (
            "✅ builder: task card recovered (watch tc_1): its renderer works again."
        )
        await eventually(lambda: FAILING not in chat.card(), what="the error line gone")
        assert "stopped" in chat.card()
        assert await serve.aterminate() == 0


async def test_a_card_removed_while_failing_no_longer_says_its_renderer_fails(
    chat: Chat, tmp_path: Path, runtime_dir: Path
) -> None:
    workdir = tmp_path / "agents" / "builder"
    with chat.serve as serve:
        await failing_card(chat, workdir, runtime_dir)
        assert card(workdir, runtime_dir, "remove")["status"] == "removed"
        await eventually(lambda: FAILING not in chat.card(), what="the error line gone")
        assert "stopped" in chat.card()
        assert await serve.aterminate() == 0
    # Nothing recovered: the chat is told of no recovery.
    assert len(chat.notices()) == 1, chat.notices()
