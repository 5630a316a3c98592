"""Agents in the loop, end to end: the chat a turn came from, a fleet that changes while serving.

A Claude Code–shaped session is driven through the real `taskcard hook claude-code` with the
recorded payloads and `TASKCARD_ORIGIN` set, the agent starts its task card through the real
`mcp` client over stdio, and the workdir lives under a discovery root and did not exist when
`taskcard serve` started. The chats are the stateful fakes of Telegram and Feishu.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from taskcard.producers.task_card.client import request_host
from taskcard.producers.task_card.runtime import HostPaths
from tests.conftest import mcp_session
from tests.e2e.harness import ServeProcess, eventually, publish
from tests.fakes.feishu_api import FakeFeishu
from tests.fakes.telegram_api import FakeTelegram
from tests.hooks.conftest import TASKCARD, payload

GROUP = -1001234567890
TOPIC = 42
STRANGER_CHAT = 4242
FEISHU_CHAT = "oc_origin_group"
RENDERER = 'print("# Work\\nsteady body from the renderer")\n'


@pytest.fixture
def runtime_dir() -> Iterator[Path]:
    """Short on purpose (unix socket paths); every host started here is shut down after."""
    path = Path(tempfile.mkdtemp(prefix="tcor"))
    yield path
    for lock in path.rglob("*.lock"):
        with contextlib.suppress(OSError, ValueError):
            os.kill(int(lock.read_text().strip()), signal.SIGTERM)
    shutil.rmtree(path, ignore_errors=True)


def hook_run(
    name: str, workdir: Path, origin: str | None = None
) -> subprocess.CompletedProcess[bytes]:
    """One Claude Code hook call, as the host makes it (payload on stdin, env inherited, with
    TASKCARD_ORIGIN only when `origin` is given)."""
    env = {k: v for k, v in os.environ.items() if k != "TASKCARD_ORIGIN"}
    if origin is not None:
        env["TASKCARD_ORIGIN"] = origin
    return subprocess.run(
        # As `taskcard init claude-code` installs it: --workdir "$CLAUDE_PROJECT_DIR".
        [TASKCARD, "hook", "claude-code", "--workdir", str(workdir)],
        input=json.dumps(payload(name, workdir)).encode(),
        capture_output=True,
        timeout=120,
        check=False,
        env=env,
    )


def hook(name: str, workdir: Path, origin: str | None = None) -> None:
    """One hook call that must succeed without a word on stderr."""
    done = hook_run(name, workdir, origin)
    assert done.returncode == 0 and done.stderr == b"", done.stderr


async def task_card(workdir: Path, runtime_dir: Path, action: str, **fields: Any) -> Any:
    """One `task_card` call through the real MCP client over stdio (`taskcard mcp`)."""
    async with mcp_session(workdir, runtime_dir) as session:
        result = await session.call_tool(
            "task_card", {"action": action, "input": fields, "reasoning": "e2e"}
        )
        assert result.is_error is False, result.content
        return result.structured_content


def shutdown_host(workdir: Path, runtime_dir: Path) -> None:
    with contextlib.suppress(OSError, ValueError):
        request_host(HostPaths(runtime_dir, workdir.resolve()), {"op": "shutdown"}, 5.0)


async def start_session(workdir: Path, runtime_dir: Path, origin: str) -> None:
    """A session whose turn came from `origin`: prompt, the card started, a tool running."""
    hook("01_session_start.json", workdir)
    hook("02_user_prompt_submit.json", workdir, origin)
    (workdir / "r.py").write_text(RENDERER)
    started = await task_card(workdir, runtime_dir, "start", renderer_path="r.py")
    assert started["status"] == "watching"
    hook("03_pre_tool_use.json", workdir)  # Bash is running


def telegram_config(
    tmp_path: Path, telegram: FakeTelegram, extra: str = "", origin_chats: str = f"[{GROUP}]"
) -> Path:
    config = tmp_path / "taskcard.toml"
    config.write_text(
        "\n".join(
            [
                'state_dir = ".taskcard"',
                "[discover]",
                'roots = ["fleet"]',
                "[watch]",
                "rescan_interval_s = 60",
                "[telegram]",
                'token_env = "TC_TEST_TOKEN"',
                f'api_base_url = "{telegram.base_url}"',
                "poll_timeout_s = 1",
                f"origin_chats = {origin_chats}",
                extra,
            ]
        )
        + "\n"
    )
    (tmp_path / "fleet").mkdir(exist_ok=True)
    return config


def texts(telegram: FakeTelegram, chat: int, thread: int | None = None) -> list[str]:
    return [m.text for m in telegram.bot_messages(chat, thread)]


async def ready(serve: ServeProcess, channel: str) -> None:
    await eventually(lambda: f"channel {channel} ready" in serve.logs, what=f"{channel} ready")


async def test_a_turn_from_a_telegram_topic_brings_the_card_there(
    tmp_path: Path, telegram: FakeTelegram, runtime_dir: Path
) -> None:
    config = telegram_config(tmp_path, telegram)
    coder = tmp_path / "fleet" / "coder"
    stranger = tmp_path / "fleet" / "stranger"
    with ServeProcess(config, env={"TC_TEST_TOKEN": telegram.token}) as serve:
        await ready(serve, "telegram")
        coder.mkdir()  # a new agent, found while serving
        stranger.mkdir()
        try:
            await start_session(coder, runtime_dir, f"telegram:{GROUP}:{TOPIC}")

            def card_in_topic() -> bool:
                return any(
                    "steady body from the renderer" in t and "Bash" in t
                    for t in texts(telegram, GROUP, TOPIC)
                )

            await eventually(card_in_topic, timeout_s=60, what="the card in the origin topic")
            assert len(telegram.bot_messages(GROUP, TOPIC)) == 1

            # A turn from a chat outside origin_chats opens nothing, and is logged.
            hook("02_user_prompt_submit.json", stranger, f"telegram:{STRANGER_CHAT}")
            publish(stranger, "stranger's card")
            await eventually(
                lambda: f"telegram:{STRANGER_CHAT} ignored" in serve.logs, what="refusal logged"
            )
            assert "not in telegram.origin_chats" in serve.logs
            assert telegram.bot_messages(STRANGER_CHAT) == []

            # People turn it off there: the resident says hidden, the route closes.
            telegram.inject_command(GROUP, "/taskcard off", thread_id=TOPIC)
            await eventually(
                lambda: any("until its next turn" in t for t in texts(telegram, GROUP, TOPIC)),
                what="the reply to /taskcard off",
            )
            resident = telegram.bot_messages(GROUP, TOPIC)[0]
            await eventually(
                lambda: "hidden" in (telegram.message(GROUP, resident.message_id) or resident).text,
                what="the resident hidden",
            )
            # The next turn from that chat opens it again, on the same resident.
            hook("02_user_prompt_submit.json", coder, f"telegram:{GROUP}:{TOPIC}")
            await eventually(
                lambda: "steady body" in str(telegram.message(GROUP, resident.message_id).text),  # type: ignore[union-attr]
                what="the card shown again",
            )

            # Removing the card: the resident shows it stopped, then the route closes.
            removed = await task_card(coder, runtime_dir, "remove")
            assert removed["status"] == "removed"
            await eventually(
                lambda: "stopped" in str(telegram.message(GROUP, resident.message_id).text),  # type: ignore[union-attr]
                what="the resident showing the card stopped",
            )
            await eventually(lambda: "closed: its card was removed" in serve.logs)
        finally:
            shutdown_host(coder, runtime_dir)
        assert await serve.aterminate() == 0
    assert telegram.token not in serve.logs


def feishu_config(tmp_path: Path, feishu: FakeFeishu) -> tuple[Path, dict[str, str]]:
    config = tmp_path / "taskcard.toml"
    config.write_text(
        "\n".join(
            [
                'state_dir = ".taskcard"',
                "[discover]",
                'roots = ["fleet"]',
                "[feishu]",
                'app_id_env = "TC_FS_APP_ID"',
                'app_secret_env = "TC_FS_APP_SECRET"',
                f'domain = "{feishu.base_url}"',
                'events = "none"',
                f'origin_chats = ["{FEISHU_CHAT}"]',
            ]
        )
        + "\n"
    )
    (tmp_path / "fleet").mkdir(exist_ok=True)
    env = {"TC_FS_APP_ID": feishu.app_id, "TC_FS_APP_SECRET": feishu.app_secret}
    return config, env


def feishu_cards(feishu: FakeFeishu) -> list[str]:
    return [m.text for m in feishu.chat(FEISHU_CHAT) if m.msg_type == "interactive"]


async def test_a_turn_from_a_feishu_chat_brings_the_card_there_across_a_restart(
    tmp_path: Path, feishu: FakeFeishu, runtime_dir: Path
) -> None:
    config, env = feishu_config(tmp_path, feishu)
    coder = tmp_path / "fleet" / "coder"
    try:
        with ServeProcess(config, env=env) as serve:
            await ready(serve, "feishu")
            coder.mkdir()
            await start_session(coder, runtime_dir, f"feishu:{FEISHU_CHAT}")
            await eventually(
                lambda: any(
                    "steady body from the renderer" in t and "Bash" in t
                    for t in feishu_cards(feishu)
                ),
                timeout_s=60,
                what="the card in the origin chat",
            )
            assert await serve.aterminate() == 0
        # The route is persisted: after a restart the same card is edited there.
        with ServeProcess(config, env=env) as again:
            hook("04_post_tool_use.json", coder)
            await eventually(
                lambda: any("Bash done" in t for t in feishu_cards(feishu)),
                timeout_s=60,
                what="the edit after the restart",
            )
            assert len(feishu_cards(feishu)) == 1
            assert len(feishu.requests_of("send")) == 1
            assert await again.aterminate() == 0
    finally:
        shutdown_host(coder, runtime_dir)


async def test_sighup_adds_and_refuses_and_a_removed_folder_retires(
    tmp_path: Path, telegram: FakeTelegram
) -> None:
    config = telegram_config(
        tmp_path,
        telegram,
        extra=f'[[telegram.routes]]\nchat_id = {GROUP}\nagents = ["*"]',
        origin_chats="[]",
    )
    scout = tmp_path / "fleet" / "scout"
    scout.mkdir(parents=True)
    builder = tmp_path / "builder"
    builder.mkdir()
    with ServeProcess(config, env={"TC_TEST_TOKEN": telegram.token}) as serve:
        await ready(serve, "telegram")
        publish(scout, "scout card")
        await eventually(lambda: any("scout card" in t for t in texts(telegram, GROUP)))

        # SIGHUP with a new agent and a new route: served without a restart.
        original = config.read_text()
        config.write_text(
            original
            + f'[[telegram.routes]]\nchat_id = {STRANGER_CHAT}\nagents = ["builder"]\n'
            + '[[agents]]\nid = "builder"\nworkdir = "builder"\n'
        )
        assert serve.proc is not None
        serve.proc.send_signal(signal.SIGHUP)
        await eventually(lambda: "config reloaded" in serve.logs, what="the reload")
        publish(builder, "builder card")
        await eventually(lambda: any("builder card" in t for t in texts(telegram, STRANGER_CHAT)))
        await eventually(lambda: any("builder card" in t for t in texts(telegram, GROUP)))

        # An invalid file is refused with the start-up messages; the running config stays.
        config.write_text(original + "[[agents]]\nid = 'bad id!'\nworkdir = 'x'\n")
        serve.proc.send_signal(signal.SIGHUP)
        await eventually(lambda: "config reload refused" in serve.logs, what="the refusal")
        assert "agents[0].id" in serve.logs and "is not a valid agent id" in serve.logs
        publish(builder, "builder still served")
        await eventually(
            lambda: any("builder still served" in t for t in texts(telegram, STRANGER_CHAT))
        )

        # Channel credentials or endpoints need a restart.
        config.write_text(original.replace("poll_timeout_s = 1", "poll_timeout_s = 2"))
        serve.proc.send_signal(signal.SIGHUP)
        await eventually(lambda: "restart to change channels" in serve.logs)
        # named by its path: "telegram changed" left the key to be hunted for in the table
        assert "config reload refused: telegram.poll_timeout_s changed" in serve.logs

        # A removed discovered folder: its resident says the agent retired.
        scout_message = next(
            m for m in telegram.bot_messages(GROUP) if "scout card" in m.text
        ).message_id
        shutil.rmtree(scout)
        await eventually(
            lambda: "Agent retired" in str(telegram.message(GROUP, scout_message).text),  # type: ignore[union-attr]
            what="the retired resident",
        )
        assert await serve.aterminate() == 0


async def test_a_tell_in_a_topic_becomes_a_turn_whose_card_appears_in_that_topic(
    tmp_path: Path, telegram: FakeTelegram, runtime_dir: Path
) -> None:
    """The whole loop: a person's `/tell` in a forum topic is queued in the agent's inbox,
    the service restarts before the agent takes it (nothing lost, nothing doubled), the
    Claude Code hook hands it to the agent at its next prompt as that turn's origin, the agent
    starts its card through the real MCP client, and the card appears in the person's topic;
    the person's status message is edited to "delivered", never sent again."""
    person = 7
    route = (
        f'[[telegram.routes]]\nchat_id = {GROUP}\nagents = ["*"]\nallowed_user_ids = [{person}]\n'
    )
    config = telegram_config(tmp_path, telegram, extra=route)
    builder = tmp_path / "fleet" / "builder"
    builder.mkdir(parents=True)
    env = {"TC_TEST_TOKEN": telegram.token}
    try:
        with ServeProcess(config, env=env) as serve:
            await ready(serve, "telegram")
            hook("01_session_start.json", builder)
            telegram.inject_message(
                GROUP, "/tell builder please start the migration card", person, TOPIC
            )
            queued = builder / "inbox" / "queued"
            await eventually(lambda: list(queued.glob("*.json")), what="the text in the inbox")
            await eventually(
                lambda: [t for t in texts(telegram, GROUP) if "Message to builder" in t],
                what="the person's status message",
            )
            assert await serve.aterminate() == 0

        with ServeProcess(config, env=env) as serve:
            await ready(serve, "telegram")
            prompt = hook_run("02_user_prompt_submit.json", builder)
            assert prompt.returncode == 0, prompt.stderr
            context = json.loads(prompt.stdout)["hookSpecificOutput"]["additionalContext"]
            assert "please start the migration card" in context
            events = [
                json.loads(line)
                for line in (builder / "logs" / "events.jsonl").read_text().splitlines()
            ]
            starts = [e for e in events if e["kind"] == "turn.start"]
            assert starts[-1]["origin"] == f"telegram:{GROUP}:{TOPIC}"

            (builder / "r.py").write_text(RENDERER)
            started = await task_card(builder, runtime_dir, "start", renderer_path="r.py")
            assert started["status"] == "watching"
            await eventually(
                lambda: any("steady body" in t for t in texts(telegram, GROUP, TOPIC)),
                timeout_s=60,
                what="the card in the topic the person wrote from",
            )

            def statuses() -> list[str]:
                return [t for t in texts(telegram, GROUP) if "Message to builder" in t]

            await eventually(
                lambda: any("delivered" in t for t in statuses()),
                what="the status message saying delivered",
            )
            assert len(statuses()) == 1, "edited in place across the restart, never re-sent"

            again = hook_run("02_user_prompt_submit.json", builder)
            assert b"please start the migration card" not in again.stdout
            acks = (builder / "inbox" / "acks.jsonl").read_text().splitlines()
            assert len(acks) == 1, "delivered exactly once"
            assert await serve.aterminate() == 0
    finally:
        shutdown_host(builder, runtime_dir)
