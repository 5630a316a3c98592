"""A Codex session driven through its lifecycle hooks, seen in the chats via `taskcard serve`.

Each payload goes through the real `taskcard hook codex` on stdin, shaped as Codex documents
its hook input; then Codex's notify program reports the same turn, as it does when
`init codex` wired both. The card must read running while the turn runs and idle once its
`Stop` hook fires, and the notify of that turn must not end it a second time. The chats are
the fakes of Telegram and Feishu.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from tests.e2e.harness import TOKEN_ENV, ServeProcess, eventually, publish, telegram_config
from tests.e2e.test_serve_feishu import Setup, card_texts
from tests.fakes.feishu_api import FakeFeishu
from tests.fakes.telegram_api import FakeTelegram
from tests.hooks.conftest import kinds
from tests.hooks.test_codex_hooks import codex_hook, codex_payload, notify

GROUP = -1001234567890


async def run_turn(texts: Callable[[], list[str]], workdir: Path) -> None:
    def card() -> str:
        found = [text for text in texts() if "fixing the tests" in text]
        return found[-1] if found else ""

    publish(workdir, "# Work\nfixing the tests")
    for name in ("01_session_start.json", "02_user_prompt_submit.json", "03_pre_tool_use.json"):
        done = codex_hook(codex_payload(name, workdir))
        assert (done.returncode, done.stdout) == (0, b""), name
    await eventually(lambda: "running" in card(), what="the card reading running")
    for name in ("05_post_tool_use.json", "06_stop.json"):
        assert codex_hook(codex_payload(name, workdir)).returncode == 0, name
    await eventually(
        lambda: "idle" in card() and "running" not in card(), what="the card reading idle"
    )
    turn = codex_payload("06_stop.json", workdir)["turn_id"]
    assert notify(workdir, turn).returncode == 0
    assert kinds(workdir).count("turn.end") == 1


async def test_a_codex_turn_reads_running_then_idle_on_telegram(
    tmp_path: Path, telegram: FakeTelegram
) -> None:
    config = telegram_config(tmp_path, telegram.base_url, GROUP)
    workdir = tmp_path / "agents" / "builder"
    (workdir / "taskcard").mkdir(parents=True, exist_ok=True)

    with ServeProcess(config, env={TOKEN_ENV: telegram.token}) as serve:
        await run_turn(lambda: telegram.every_text(GROUP), workdir)
        assert await serve.aterminate() == 0


async def test_a_codex_turn_reads_running_then_idle_on_feishu(
    tmp_path: Path, feishu: FakeFeishu
) -> None:
    setup = Setup(tmp_path, feishu, ["builder"])
    workdir = tmp_path / "agents" / "builder"
    (workdir / "taskcard").mkdir(parents=True, exist_ok=True)
    with setup.serve() as serve:
        await run_turn(lambda: card_texts(feishu), workdir)
        assert await serve.aterminate() == 0
