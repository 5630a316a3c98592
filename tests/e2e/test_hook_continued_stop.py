"""A Claude Code turn that a stop hook of the user's made go on, seen in the chats through
`taskcard serve` (the fakes of Telegram and Feishu).

The user's hook blocks the first `Stop`; Claude goes on (a tool call) and stops again, the
second `Stop` coming with `stop_hook_active`. The hooks are the real `taskcard hook
claude-code` with payloads shaped as Claude Code's hooks reference documents them. That
second stop wrote nothing, so the card read the turn as running while the agent sat at its
prompt; it must read idle.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from tests.e2e.harness import TOKEN_ENV, ServeProcess, eventually, publish, telegram_config
from tests.e2e.test_serve_feishu import Setup, card_texts
from tests.fakes.feishu_api import FakeFeishu
from tests.fakes.telegram_api import FakeTelegram
from tests.hooks.conftest import hook, payload

GROUP = -1001234567890


def send(workdir: Path, name: str, **changes: object) -> None:
    done = hook(payload(name, workdir, transcript_path="", **changes))
    assert (done.returncode, done.stdout) == (0, b""), name


async def check_card(texts: Callable[[], list[str]], workdir: Path) -> None:
    publish(workdir, "# Work\nmigrating the schema")

    def card() -> str:
        found = [text for text in texts() if "migrating the schema" in text]
        return found[-1] if found else ""

    for name in ("01_session_start.json", "02_user_prompt_submit.json", "10_stop.json"):
        send(workdir, name)
    await eventually(lambda: "idle" in card(), what="the card reading idle at the first stop")
    send(workdir, "03_pre_tool_use.json")  # the user's stop hook blocked: Claude goes on
    await eventually(lambda: "running" in card(), what="the card reading running again")
    send(workdir, "04_post_tool_use.json")
    send(workdir, "10_stop.json", stop_hook_active=True)
    await eventually(lambda: "idle" in card(), what="the card reading idle at the second stop")
    assert "running" not in card()


async def test_a_continued_turn_reads_idle_at_its_last_stop_on_telegram(
    tmp_path: Path, telegram: FakeTelegram
) -> None:
    config = telegram_config(tmp_path, telegram.base_url, GROUP)
    workdir = tmp_path / "agents" / "builder"
    (workdir / "taskcard").mkdir(parents=True, exist_ok=True)
    with ServeProcess(config, env={TOKEN_ENV: telegram.token}) as serve:
        await check_card(lambda: telegram.every_text(GROUP), workdir)
        assert await serve.aterminate() == 0


async def test_a_continued_turn_reads_idle_at_its_last_stop_on_feishu(
    tmp_path: Path, feishu: FakeFeishu
) -> None:
    setup = Setup(tmp_path, feishu, ["builder"])
    workdir = tmp_path / "agents" / "builder"
    (workdir / "taskcard").mkdir(parents=True, exist_ok=True)

    def texts() -> list[str]:
        return [c for m in feishu.messages.values() for c in m.contents] + card_texts(feishu)

    with setup.serve() as serve:
        await check_card(texts, workdir)
        assert await serve.aterminate() == 0
