"""A Codex turn's tokens and a failed MCP tool, seen in the chats via `taskcard serve`.

The payloads go through the real `taskcard hook codex` on stdin, shaped as Codex documents
its hook input; the `Stop` hook names the session's rollout, whose token counts give the
turn's usage. The card must show the MCP tool that failed as failed, and the turn's tokens
once it ends, on Telegram and on Feishu alike (their fakes). A person's text reaches Codex
through its hook output, and the person sees it delivered.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from tests.e2e.harness import TOKEN_ENV, ServeProcess, eventually, publish, telegram_config
from tests.e2e.test_serve_feishu import Setup, card_texts
from tests.fakes.feishu_api import FakeFeishu
from tests.fakes.telegram_api import FakeTelegram
from tests.hooks.test_codex_hooks import codex_hook, codex_payload
from tests.hooks.test_codex_usage_and_failures import two_turns, write_rollout

GROUP = -1001234567890


async def run_turn(texts: Callable[[], list[str]], workdir: Path) -> None:
    def card() -> str:
        found = [text for text in texts() if "filing the issue" in text]
        return found[-1] if found else ""

    publish(workdir, "# Work\nfiling the issue")
    tool = {"tool_name": "mcp__tracker__create_issue", "tool_use_id": "call_mcp1"}
    failed = {"content": [{"type": "text", "text": "permission denied"}], "isError": True}
    steps = [
        codex_payload("01_session_start.json", workdir),
        codex_payload("02_user_prompt_submit.json", workdir),
        codex_payload("03_pre_tool_use.json", workdir, **tool),
        codex_payload("05_post_tool_use.json", workdir, **tool, tool_response=failed),
    ]
    for data in steps:
        done = codex_hook(data)
        assert (done.returncode, done.stdout) == (0, b""), data["hook_event_name"]
    await eventually(lambda: "failed" in card(), what="the card showing the failed tool")
    rollout = write_rollout(workdir / "rollout.jsonl", two_turns())
    stop = codex_hook(codex_payload("06_stop.json", workdir, transcript_path=str(rollout)))
    assert (stop.returncode, stop.stdout) == (0, b"")
    await eventually(
        lambda: "tokens last turn: 7.0k in, 500 out" in card(),
        what="the card showing the turn's tokens",
    )


async def test_a_codex_turns_tokens_and_failed_tool_show_on_telegram(
    tmp_path: Path, telegram: FakeTelegram
) -> None:
    config = telegram_config(tmp_path, telegram.base_url, GROUP)
    workdir = tmp_path / "agents" / "builder"
    (workdir / "taskcard").mkdir(parents=True, exist_ok=True)
    with ServeProcess(config, env={TOKEN_ENV: telegram.token}) as serve:
        await run_turn(lambda: telegram.every_text(GROUP), workdir)
        assert await serve.aterminate() == 0


async def test_a_codex_turns_tokens_and_failed_tool_show_on_feishu(
    tmp_path: Path, feishu: FakeFeishu
) -> None:
    setup = Setup(tmp_path, feishu, ["builder"])
    workdir = tmp_path / "agents" / "builder"
    (workdir / "taskcard").mkdir(parents=True, exist_ok=True)
    with setup.serve() as serve:
        await run_turn(lambda: card_texts(feishu), workdir)
        assert await serve.aterminate() == 0


async def test_a_tell_reaches_codex_at_its_next_tool_result_and_reads_delivered(
    tmp_path: Path, telegram: FakeTelegram
) -> None:
    """A person's `/tell` is queued in the agent's inbox; Codex's `PostToolUse` hook hands it
    to the model as `additionalContext`, and the person's status message turns delivered."""
    person = 7
    route = (
        f'[[telegram.routes]]\nchat_id = {GROUP}\nagents = ["*"]\nallowed_user_ids = [{person}]\n'
    )
    config = fleet_config(tmp_path, telegram, extra=route)
    builder = tmp_path / "fleet" / "builder"
    builder.mkdir(parents=True)
    with ServeProcess(config, env={TOKEN_ENV: telegram.token}) as serve:
        await eventually(lambda: "channel telegram ready" in serve.logs, what="telegram ready")
        for name in ("01_session_start.json", "02_user_prompt_submit.json"):
            assert codex_hook(codex_payload(name, builder)).stdout == b"", name
        telegram.inject_message(GROUP, "/tell builder use the staging database", person)
        queued = builder / "inbox" / "queued"
        await eventually(lambda: list(queued.glob("*.json")), what="the text in the inbox")
        done = codex_hook(codex_payload("05_post_tool_use.json", builder))
        context = json.loads(done.stdout)["hookSpecificOutput"]["additionalContext"]
        assert "use the staging database" in context

        def statuses() -> list[str]:
            return [t for t in telegram.every_text(GROUP) if "Message to builder" in t]

        await eventually(
            lambda: any("delivered" in t for t in statuses()), what="the status saying delivered"
        )
        assert await serve.aterminate() == 0


def fleet_config(tmp_path: Path, telegram: FakeTelegram, extra: str) -> Path:
    config = tmp_path / "taskcard.toml"
    config.write_text(
        "\n".join(
            [
                'state_dir = ".taskcard"',
                "[discover]",
                'roots = ["fleet"]',
                "[telegram]",
                f'token_env = "{TOKEN_ENV}"',
                f'api_base_url = "{telegram.base_url}"',
                "poll_timeout_s = 1",
                extra,
            ]
        )
        + "\n"
    )
    (tmp_path / "fleet").mkdir(exist_ok=True)
    return config
