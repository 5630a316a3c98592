"""A Claude Code turn that dies of an API error, seen in the chats through `taskcard serve`.

The session is driven through the real `taskcard hook claude-code` with payloads shaped as
Claude Code's hooks reference documents them; the chats are the fakes of Telegram and Feishu.
Claude Code sends `StopFailure`, not `Stop`, for such a turn: the card must stop reading
"running" and say, in one short redacted line, that the turn failed and why; and the idle
signal that follows must say the turn failed, not that the agent declared it finished.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.e2e.harness import TOKEN_ENV, ServeProcess, eventually, publish, telegram_config
from tests.e2e.test_serve_feishu import Setup, card_texts
from tests.fakes.feishu_api import FakeFeishu
from tests.fakes.telegram_api import FakeTelegram
from tests.hooks.conftest import hook, payload

GROUP = -1001234567890
# An API key shape inside the error's details: it must never reach a chat.
LEAKED_KEY = "sk-ant-api03-" + "Q" * 40
SIGNALS = ("[signals]", "idle_floor_s = 5")
DETAILS = f"401 invalid x-api-key {LEAKED_KEY} for this organization"


def run_session(workdir: Path) -> None:
    for name in ("01_session_start.json", "02_user_prompt_submit.json", "03_pre_tool_use.json"):
        done = hook(payload(name, workdir, transcript_path=""))
        assert (done.returncode, done.stdout) == (0, b""), name


def fail_turn(workdir: Path) -> None:
    failure: dict[str, Any] = payload(
        "12_stop_failure.json",
        workdir,
        transcript_path="",
        error="authentication_failed",
        error_details=DETAILS,
        last_assistant_message="the private conversation",
    )
    done = hook(failure)
    assert (done.returncode, done.stdout, done.stderr) == (0, b"", b"")


async def check_card(texts: Callable[[], list[str]], workdir: Path) -> None:
    publish(workdir, "# Work\nmigrating the schema")
    run_session(workdir)

    def card() -> str:
        found = [text for text in texts() if "migrating the schema" in text]
        return found[-1] if found else ""

    await eventually(lambda: "running" in card(), what="the card reading running")
    fail_turn(workdir)
    await eventually(lambda: "turn failed (authentication_failed)" in card(), what="the failure")
    text = card()
    assert "running" not in text and "idle" in text
    assert "[redacted]" in text
    assert "private conversation" not in text

    def idle_signal() -> str:
        return next((shown for shown in texts() if "has not reported" in shown), "")

    signal = await eventually(idle_signal, timeout_s=60, what="the idle signal")
    assert "turn ended in an error (authentication_failed)" in signal
    assert not any("declared its turn finished" in shown for shown in texts())
    assert all(LEAKED_KEY not in shown for shown in texts())


async def test_a_failed_turn_reads_failed_not_running_on_telegram(
    tmp_path: Path, telegram: FakeTelegram
) -> None:
    config = telegram_config(tmp_path, telegram.base_url, GROUP, extra=SIGNALS)
    workdir = tmp_path / "agents" / "builder"
    (workdir / "taskcard").mkdir(parents=True, exist_ok=True)

    with ServeProcess(config, env={TOKEN_ENV: telegram.token}) as serve:
        await check_card(lambda: telegram.every_text(GROUP), workdir)
        assert await serve.aterminate() == 0
    assert LEAKED_KEY not in serve.logs


async def test_a_failed_turn_reads_failed_not_running_on_feishu(
    tmp_path: Path, feishu: FakeFeishu
) -> None:
    setup = Setup(tmp_path, feishu, ["builder"])
    with setup.config.open("a") as config:
        config.write("\n".join(SIGNALS) + "\n")
    workdir = tmp_path / "agents" / "builder"
    (workdir / "taskcard").mkdir(parents=True, exist_ok=True)

    def texts() -> list[str]:
        return [c for m in feishu.messages.values() for c in m.contents] + card_texts(feishu)

    with setup.serve() as serve:
        await check_card(texts, workdir)
        assert await serve.aterminate() == 0
    assert LEAKED_KEY not in serve.logs
