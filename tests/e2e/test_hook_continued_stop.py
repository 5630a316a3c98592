"""A turn that a stop hook of the user's made go on, seen in the chats through `taskcard
serve` (the fakes of Telegram and Feishu), for Claude Code and for Codex.

The user's hook blocks the first `Stop`; the agent goes on (a tool call) and stops again,
the second `Stop` coming with `stop_hook_active`. The hooks are the real `taskcard hook
claude-code` / `taskcard hook codex` with payloads shaped as the hosts document them (for
Codex, the second stop from two config layers, then its notify of the turn). That second
stop wrote nothing, so the card read the turn as running while the agent sat at its prompt;
it must read idle.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.e2e.harness import TOKEN_ENV, ServeProcess, eventually, publish, telegram_config
from tests.e2e.test_serve_feishu import Setup, card_texts
from tests.fakes.feishu_api import FakeFeishu
from tests.fakes.telegram_api import FakeTelegram
from tests.hooks.conftest import hook, kinds, payload
from tests.hooks.test_codex_hooks import codex_hook, codex_payload, notify

GROUP = -1001234567890
HOSTS = ["claude-code", "codex"]


def send(host: str, workdir: Path, name: str, **changes: object) -> None:
    if host == "codex":
        done = codex_hook(codex_payload(name, workdir, **changes))
    else:
        done = hook(payload(name, workdir, transcript_path="", **changes))
    assert (done.returncode, done.stdout) == (0, b""), name


def first_stop(host: str, workdir: Path) -> None:
    stop = "06_stop.json" if host == "codex" else "10_stop.json"
    for name in ("01_session_start.json", "02_user_prompt_submit.json", stop):
        send(host, workdir, name)


def second_stop(host: str, workdir: Path) -> None:
    if host == "claude-code":
        send(host, workdir, "04_post_tool_use.json")
        send(host, workdir, "10_stop.json", stop_hook_active=True)
        return
    send(host, workdir, "05_post_tool_use.json")
    last = "Fixed what the check asked for."
    for _copy in range(2):  # ~/.codex's copy of the hook and the project's
        send(host, workdir, "06_stop.json", stop_hook_active=True, last_assistant_message=last)
    assert notify(workdir, codex_payload("06_stop.json", workdir)["turn_id"]).returncode == 0
    assert kinds(workdir).count("turn.end") == 2


async def check_card(texts: Callable[[], list[str]], host: str, workdir: Path) -> None:
    publish(workdir, "# Work\nmigrating the schema")

    def card() -> str:
        found = [text for text in texts() if "migrating the schema" in text]
        return found[-1] if found else ""

    first_stop(host, workdir)
    await eventually(lambda: "idle" in card(), what="the card reading idle at the first stop")
    send(host, workdir, "03_pre_tool_use.json")  # the user's stop hook blocked: it goes on
    await eventually(lambda: "running" in card(), what="the card reading running again")
    second_stop(host, workdir)
    await eventually(lambda: "idle" in card(), what="the card reading idle at the second stop")
    assert "running" not in card()


@pytest.mark.parametrize("host", HOSTS)
async def test_a_continued_turn_reads_idle_at_its_last_stop_on_telegram(
    tmp_path: Path, telegram: FakeTelegram, host: str
) -> None:
    config = telegram_config(tmp_path, telegram.base_url, GROUP)
    workdir = tmp_path / "agents" / "builder"
    (workdir / "taskcard").mkdir(parents=True, exist_ok=True)
    with ServeProcess(config, env={TOKEN_ENV: telegram.token}) as serve:
        await check_card(lambda: telegram.every_text(GROUP), host, workdir)
        assert await serve.aterminate() == 0


@pytest.mark.parametrize("host", HOSTS)
async def test_a_continued_turn_reads_idle_at_its_last_stop_on_feishu(
    tmp_path: Path, feishu: FakeFeishu, host: str
) -> None:
    setup = Setup(tmp_path, feishu, ["builder"])
    workdir = tmp_path / "agents" / "builder"
    (workdir / "taskcard").mkdir(parents=True, exist_ok=True)

    def texts() -> list[str]:
        return [c for m in feishu.messages.values() for c in m.contents] + card_texts(feishu)

    with setup.serve() as serve:
        await check_card(texts, host, workdir)
        assert await serve.aterminate() == 0
