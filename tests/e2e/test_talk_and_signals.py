"""Talking to an agent from a chat, signals and status, through `taskcard serve`.

Both platforms run through one small adapter (`Chat`): the fake Telegram Bot API (commands and
replies by long polling) and the fake Feishu Open API (events on the webhook). The agent side
is played exactly as the contracts say: activity lines in `logs/events.jsonl`, reports in
`reports/reports.jsonl`, `lineage.json`, and for a delivery the claim rename
`inbox/queued/<id>.json -> inbox/taken/<id>.json` followed by one ack line in
`inbox/acks.jsonl`.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, Protocol

import pytest

from taskcard.producers.reports import Reports
from taskcard.producers.task_card.contract import (
    CardPaths,
    append_jsonl_line,
    atomic_write,
    utc_now_iso,
)
from tests.e2e.harness import ServeProcess, activity, agents_lines, eventually, publish, run_cli
from tests.fakes.feishu_api import FakeFeishu
from tests.fakes.telegram_api import FakeTelegram
from tests.inbox.test_recovery import mcp_server_holding

GROUP = -1001234567890
FS_CHAT = "oc_fleet_group"
PERSON = 7
FS_PERSON = "ou_person"
FS_VERIFY = "fake-verification-token"
STATUS = "✉ Message to"


class Chat(Protocol):
    """One chat with the bot in it, as a person and an observer see it."""

    serve: ServeProcess

    async def say(
        self,
        text: str,
        *,
        reply_to: str | None = None,
        user: int = PERSON,
        thread: str | None = None,
    ) -> None: ...

    def bot_texts(self) -> list[str]: ...

    def message_id_with(self, words: str) -> str | None: ...

    def edits_of(self, message_id: str) -> int: ...

    def restart(self) -> ServeProcess: ...


class TelegramChat:
    def __init__(self, tmp_path: Path, fake: FakeTelegram, agents: list[str], extra: str) -> None:
        self.fake = fake
        lines = [*agents_lines(tmp_path, agents), extra]
        lines += [
            "[telegram]",
            'token_env = "TC_TEST_TOKEN"',
            f'api_base_url = "{fake.base_url}"',
            "poll_timeout_s = 1",
            "[[telegram.routes]]",
            f"chat_id = {GROUP}",
            f"agents = {json.dumps(agents)}",
            f"allowed_user_ids = [{PERSON}]",
        ]
        self.config = tmp_path / "taskcard.toml"
        self.config.write_text("\n".join(lines) + "\n")
        self.serve = self.restart()

    def restart(self) -> ServeProcess:
        self.serve = ServeProcess(self.config, env={"TC_TEST_TOKEN": self.fake.token})
        return self.serve

    async def say(
        self,
        text: str,
        *,
        reply_to: str | None = None,
        user: int = PERSON,
        thread: str | None = None,
    ) -> None:
        """`thread`: written in that forum topic (a number)."""
        self.fake.inject_message(
            GROUP,
            text,
            user_id=user,
            reply_to=None if reply_to is None else int(reply_to),
            thread_id=None if thread is None else int(thread),
        )

    def bot_texts(self) -> list[str]:
        return [m.text for m in self.fake.bot_messages(GROUP)]

    def message_id_with(self, words: str) -> str | None:
        found = [m for m in self.fake.bot_messages(GROUP) if words in m.text]
        return str(found[0].message_id) if found else None

    def edits_of(self, message_id: str) -> int:
        return len(self.fake.edit_history(GROUP, message_id))


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class FeishuChat:
    def __init__(self, tmp_path: Path, fake: FakeFeishu, agents: list[str], extra: str) -> None:
        self.fake = fake
        port = _free_port()
        self.url = f"http://127.0.0.1:{port}/feishu/events"
        lines = [*agents_lines(tmp_path, agents), extra]
        lines += [
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
            "[[feishu.routes]]",
            f'chat_id = "{FS_CHAT}"',
            f"agents = {json.dumps(agents)}",
            f'allowed_user_ids = ["{FS_PERSON}"]',
        ]
        self.config = tmp_path / "taskcard.toml"
        self.config.write_text("\n".join(lines) + "\n")
        self.serve = self.restart()

    def restart(self) -> ServeProcess:
        env = {
            "TC_FS_APP_ID": self.fake.app_id,
            "TC_FS_APP_SECRET": self.fake.app_secret,
            "TC_FS_VERIFY": FS_VERIFY,
        }
        self.serve = ServeProcess(self.config, env=env)
        return self.serve

    async def say(
        self,
        text: str,
        *,
        reply_to: str | None = None,
        user: int = PERSON,
        thread: str | None = None,
        mention: bool = True,
    ) -> None:
        """`thread`: written in that topic or reply thread (`omt_...`); `mention`: a message
        that is no reply mentions the bot (without it, a remark in a thread)."""
        open_id = FS_PERSON if user == PERSON else f"ou_other_{user}"
        # A reply answers the card itself; a command in a group mentions the bot.
        document = self.fake.command_event(
            FS_CHAT,
            text,
            open_id=open_id,
            mention_bot=mention and reply_to is None,
            parent_id=reply_to or "",
            verification_token=FS_VERIFY,
            thread_id=thread,
        )

        async def delivered() -> bool:
            try:
                answer = await self.fake.deliver_event(self.url, document)
            except OSError:
                return False  # the webhook is not listening yet
            return answer.status == 200

        await eventually_async(delivered, what="the event to be accepted")

    def bot_texts(self) -> list[str]:
        return [m.text for m in self.fake.chat(FS_CHAT) if m.visible]

    def message_id_with(self, words: str) -> str | None:
        found = [m for m in self.fake.chat(FS_CHAT) if m.visible and words in m.text]
        return found[0].message_id if found else None

    def edits_of(self, message_id: str) -> int:
        return next(m.update_count for m in self.fake.chat(FS_CHAT) if m.message_id == message_id)


async def eventually_async(check: Any, *, what: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.2)


@pytest.fixture(params=["telegram", "feishu"])
def platform(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@asynccontextmanager
async def chat_for(
    platform: str, tmp_path: Path, agents: list[str], extra: str = ""
) -> AsyncIterator[Chat]:
    if platform == "telegram":
        async with FakeTelegram() as telegram:
            yield TelegramChat(tmp_path, telegram, agents, extra)
    else:
        async with FakeFeishu() as feishu:
            yield FeishuChat(tmp_path, feishu, agents, extra)


def workdir(tmp_path: Path, agent: str = "builder") -> Path:
    return tmp_path / "agents" / agent


def queued(tmp_path: Path, agent: str = "builder", folder: str = "queued") -> list[Path]:
    path = workdir(tmp_path, agent) / "inbox" / folder
    return sorted(path.glob("*.json")) if path.is_dir() else []


def claim_and_ack(tmp_path: Path, message: Path, via: str = "claude-code:PostToolUse") -> None:
    """The agent side's delivery, exactly as the inbox contract says."""
    inbox = message.parent.parent
    os.rename(message, inbox / "taken" / message.name)
    ident = message.stem
    append_jsonl_line(
        inbox / "acks.jsonl", {"id": ident, "state": "delivered", "at": utc_now_iso(), "via": via}
    )


def status_texts(chat: Chat) -> list[str]:
    return [t for t in chat.bot_texts() if STATUS in t]


async def wait_status(chat: Chat, words: str) -> str:
    return await _first_with(status_texts, chat, words, f"a status message saying {words!r}")


async def wait_said(chat: Chat, words: str, what: str) -> str:
    """The first of the bot's messages in the chat that contains `words`, once there is one."""
    return await _first_with(lambda c: c.bot_texts(), chat, words, what)


async def _first_with(texts: Callable[[Chat], list[str]], chat: Chat, words: str, what: str) -> str:
    found: str = await eventually(
        lambda: next((t for t in texts(chat) if words in t), None), timeout_s=60, what=what
    )
    return found


def running_agent(tmp_path: Path) -> None:
    wd = workdir(tmp_path)
    activity(wd, "agent.start")
    activity(wd, "turn.start")
    activity(wd, "tool.start", call_id="c1", name="pytest")
    publish(wd, "**compile** 1/3")


async def running_card_shown(chat: Chat) -> None:
    """Wait for the card of `running_agent` in the chat."""
    await eventually(lambda: chat.message_id_with("compile"), timeout_s=60, what="card")


@asynccontextmanager
async def running_card(
    on: str, tmp_path: Path, agents: tuple[str, ...] = ("builder",)
) -> AsyncIterator[Chat]:
    """The chat on platform `on` of `taskcard serve` following `agents`, showing the card of
    the running agent `builder`; the service must stop cleanly (exit 0) when the block ends."""
    async with chat_for(on, tmp_path, list(agents)) as chat:
        running_agent(tmp_path)
        with chat.serve:
            await running_card_shown(chat)
            yield chat
            assert await chat.serve.aterminate() == 0


@pytest.mark.parametrize(
    ("typed", "text"),
    [
        ("/tell builder stop now <b>please</b>", "stop now <b>please</b>"),
        # The agent's name alone on the first line, the text on the next ones.
        ("/tell builder\nstop now\n<b>please</b>", "stop now\n<b>please</b>"),
    ],
    ids=["one-line", "text-on-next-lines"],
)
async def test_tell_is_queued_then_delivered_on_one_edited_message(
    platform: str, tmp_path: Path, typed: str, text: str
) -> None:
    async with running_card(platform, tmp_path) as chat:
        await chat.say(typed)
        await wait_status(chat, "queued")
        assert not any("AGENT is one of" in t for t in chat.bot_texts())
        [message] = queued(tmp_path)
        data = json.loads(message.read_text())
        assert data["text"] == text and data["kind"] == "message"
        assert data["origin"].split(":")[0] == platform
        claim_and_ack(tmp_path, message)
        await wait_status(chat, "delivered")
        assert len(status_texts(chat)) == 1  # one message, edited as the state changed
        status_id = chat.message_id_with(STATUS)
        assert status_id is not None and chat.edits_of(status_id) >= 1
        assert not any("stop now" in t or "please" in t for t in chat.bot_texts())


async def test_a_tell_to_an_agent_with_no_known_turn_promises_no_turn(
    platform: str, tmp_path: Path
) -> None:
    # An agent that started and has said nothing since is unknown (then no output): no turn
    # is known to run. Its status read "queued; the running turn's host hands it over", a
    # turn nobody saw, so people waited on it; it now says the state and who reads the text.
    async with chat_for(platform, tmp_path, ["builder"]) as chat:
        wd = workdir(tmp_path)
        activity(wd, "agent.start")
        publish(wd, "**warming up**")
        with chat.serve:
            await wait_said(chat, "warming up", "the card")
            await chat.say("/tell builder start with the docs")
            line = await wait_status(chat, "queued")
            assert "running turn's host" not in line
            assert "no running turn is known" in line and "next host to read its inbox" in line
            assert await chat.serve.aterminate() == 0


async def test_an_ack_line_with_a_way_in_that_is_not_text_costs_only_that_line(
    platform: str, tmp_path: Path
) -> None:
    async with chat_for(platform, tmp_path, ["builder"]) as chat:
        running_agent(tmp_path)
        with chat.serve:
            await running_card_shown(chat)
            await chat.say("/tell builder run the checks")
            await wait_status(chat, "queued")
            [message] = queued(tmp_path)
            # Lines before the good ack whose `via` is a list or an object: no known way in.
            acks = message.parent.parent / "acks.jsonl"
            for via in (["mcp"], {"mcp": 1}):
                append_jsonl_line(acks, {"id": "other", "state": "delivered", "via": via})
            claim_and_ack(tmp_path, message)
            await wait_status(chat, "delivered")
            assert await chat.serve.aterminate() == 0
        assert "Traceback" not in chat.serve.logs


async def test_reply_to_the_resident_is_parked_then_cancelled(
    platform: str, tmp_path: Path
) -> None:
    async with chat_for(platform, tmp_path, ["builder"]) as chat:
        wd = workdir(tmp_path)
        activity(wd, "agent.start")
        activity(wd, "turn.start")
        activity(wd, "turn.end")
        publish(wd, "**done** 3/3")
        with chat.serve:
            resident = await eventually(
                lambda: chat.message_id_with("done"), timeout_s=60, what="card"
            )
            await chat.say("and now the docs", reply_to=resident)
            await wait_status(chat, "parked")
            assert "Not delivered yet" in status_texts(chat)[0]
            [message] = queued(tmp_path)
            await chat.say("/taskcard cancel")
            await wait_status(chat, "cancelled")
            assert queued(tmp_path) == [] and [
                p.name for p in queued(tmp_path, folder="cancelled")
            ] == [message.name]
            await eventually(
                lambda: any("was cancelled" in t for t in chat.bot_texts()), what="the answer"
            )
            assert len(status_texts(chat)) == 1
            assert await chat.serve.aterminate() == 0


async def test_a_cancel_while_a_reader_holds_the_message_says_it_may_come_back(
    platform: str, tmp_path: Path, runtime_dir: Path
) -> None:
    """An MCP server holds the message, its answer unread: the cancel is too late, and says
    the message is queued again if the reader does not get it. The server is stopped
    (SIGTERM) before its client read it: queued again, and a second cancel withdraws it."""
    async with running_card(platform, tmp_path) as chat:
        await chat.say("/tell builder run the checks")
        await wait_status(chat, "queued")
        [message] = queued(tmp_path)
        with mcp_server_holding(workdir(tmp_path), runtime_dir) as server:
            assert queued(tmp_path, folder="taken") != []
            await chat.say("/taskcard cancel")
            late = await wait_said(chat, "Too late to cancel", "the answer")
            assert "queued again" in late and "builder" in late
            server.terminate()
            await asyncio.to_thread(server.wait, 120)
        assert [p.name for p in queued(tmp_path)] == [message.name]
        await chat.say("/taskcard cancel")
        await wait_status(chat, "cancelled")
        assert "was cancelled" in await wait_said(chat, "was cancelled", "the answer")


async def test_rate_limit_and_who_may_write(platform: str, tmp_path: Path) -> None:
    async with running_card(platform, tmp_path) as chat:
        await chat.say("/tell builder from a stranger", user=99)
        for index in range(6):
            await chat.say(f"/tell builder step {index}")
        await wait_said(chat, "Too many messages to builder", "the refusal")
        await eventually(lambda: len(status_texts(chat)) == 5, timeout_s=60, what="5 statuses")
        assert len(queued(tmp_path)) == 5
        texts = {json.loads(p.read_text())["text"] for p in queued(tmp_path)}
        assert "from a stranger" not in texts


async def test_a_tell_without_text_costs_no_message_of_the_rate(
    platform: str, tmp_path: Path
) -> None:
    # An empty `/tell builder` queues nothing, yet it used to count against the person's
    # `inbox.max_messages` (5): after two of them, the fourth real text was refused.
    async with running_card(platform, tmp_path) as chat:
        await chat.say("/tell builder")
        await chat.say("/tell builder \u200b")
        for index in range(5):
            await chat.say(f"/tell builder step {index}")
        await eventually(lambda: len(status_texts(chat)) == 5, timeout_s=60, what="5 statuses")
        assert len(queued(tmp_path)) == 5
        # (Unsent answers of a chat collapse into the latest: one or both refusals show.)
        await wait_said(chat, "Nothing to send", "the refusal of an empty text")
        assert not any("Too many messages" in t for t in chat.bot_texts())


async def test_a_text_too_long_for_the_inbox_is_refused_saying_to_split_it(
    platform: str, tmp_path: Path
) -> None:
    # Over the inbox file's 16 KiB: it used to become a "failed ... Send it again." status,
    # and sending it again failed the same way.
    async with running_card(platform, tmp_path) as chat:
        await chat.say("/tell builder " + "é" * 9000)
        await chat.say("/tell builder short one")
        await wait_status(chat, "queued")
        await wait_said(chat, "Split it into shorter messages", "the refusal")
        assert len(status_texts(chat)) == 1
        assert [json.loads(p.read_text())["text"] for p in queued(tmp_path)] == ["short one"]


async def test_restart_between_queue_and_delivery(platform: str, tmp_path: Path) -> None:
    async with chat_for(platform, tmp_path, ["builder"]) as chat:
        running_agent(tmp_path)
        with chat.serve:
            await running_card_shown(chat)
            await chat.say("/tell builder keep going")
            await wait_status(chat, "queued")
            assert await chat.serve.aterminate() == 0
        [message] = queued(tmp_path)
        claim_and_ack(tmp_path, message, via="inbox-cli")  # delivered while the service is down
        with chat.restart():
            text = await wait_status(chat, "via inbox-cli")
            assert "delivered" in text
            assert len(status_texts(chat)) == 1  # edited, never sent again
            assert queued(tmp_path) == [] and len(queued(tmp_path, folder="taken")) == 1
            assert await chat.serve.aterminate() == 0


def topic_of(chat: Chat) -> str:
    """A thread of the routed group: a Telegram forum topic, a Feishu topic."""
    return "42" if isinstance(chat, TelegramChat) else "omt_topic_a"


def status_threads(chat: Chat) -> list[str | None]:
    """The thread each status message is in (None: the main flow)."""
    if isinstance(chat, TelegramChat):
        shown = [m for m in chat.fake.bot_messages(GROUP) if STATUS in m.text]
        return [None if m.thread_id is None else str(m.thread_id) for m in shown]
    assert isinstance(chat, FeishuChat)
    return [m.thread_id for m in chat.fake.chat(FS_CHAT) if m.visible and STATUS in m.text]


async def test_cancel_withdraws_only_a_text_written_in_the_same_thread(
    platform: str, tmp_path: Path
) -> None:
    # A Telegram forum topic's `/taskcard cancel` withdraws only what was written in that
    # topic. On Feishu it used to withdraw the author's latest text from anywhere in the
    # group: a cancel in the main flow took back a text written in a topic.
    async with chat_for(platform, tmp_path, ["builder"]) as chat:
        running_agent(tmp_path)
        topic = topic_of(chat)
        with chat.serve:
            await running_card_shown(chat)
            await chat.say("/tell builder from the topic", thread=topic)
            await wait_status(chat, "queued")
            await chat.say("/taskcard cancel")
            await wait_said(chat, "no queued message here", "the main flow's answer")
            assert len(queued(tmp_path)) == 1
            await chat.say("/taskcard cancel", thread=topic)
            await wait_status(chat, "cancelled")
            assert queued(tmp_path) == [] and status_threads(chat) == [topic]
            assert await chat.serve.aterminate() == 0


async def test_a_status_first_sent_after_a_restart_goes_to_the_thread_of_its_tell(
    platform: str, tmp_path: Path
) -> None:
    # The command a status message answers was kept in memory only: a service stopped before
    # the status went out posted it, after the restart, in the main flow of a Feishu group
    # instead of the topic of the `/tell` (Telegram keeps the topic in the chat itself).
    async with chat_for(platform, tmp_path, ["builder"]) as chat:
        running_agent(tmp_path)
        topic = topic_of(chat)
        with chat.serve:
            await running_card_shown(chat)
            # Every answer fails until the service stops: the status is not sent in this run.
            if isinstance(chat, TelegramChat):
                for _ in range(1000):
                    chat.fake.fail_next("sendMessage", 502, "Bad Gateway")
            elif isinstance(chat, FeishuChat):
                chat.fake.script_error("reply", 2200, http_status=500, times=1000)
            await chat.say("/tell builder keep going", thread=topic)
            await eventually(lambda: queued(tmp_path), what="the text queued")
            assert await chat.serve.aterminate() == 0
        assert status_texts(chat) == []
        if isinstance(chat, TelegramChat):
            chat.fake.clear_failures()
        elif isinstance(chat, FeishuChat):
            chat.fake.clear_scripts()
        with chat.restart():
            await wait_status(chat, "queued")
            assert status_threads(chat) == [topic]
            if isinstance(chat, FeishuChat):  # a reply to the /tell, as before the restart
                [status] = [m for m in chat.fake.chat(FS_CHAT) if STATUS in m.text]
                assert status.parent_id in chat.fake.user_messages
            assert await chat.serve.aterminate() == 0


async def test_a_command_written_as_a_reply_to_a_card_is_a_command(
    platform: str, tmp_path: Path
) -> None:
    # Telegram takes `/taskcard off` written as a reply to the card as the command. A Feishu
    # reply without the bot's mention used to reach the agent as text instead ("/taskcard
    # off" queued in its inbox, the cards still shown); a reply addresses the bot, as on
    # Telegram. One replying to a person's message (not the bot's) is still no command.
    async with running_card(platform, tmp_path) as chat:
        card = chat.message_id_with("compile")
        assert card is not None
        await chat.say("/tell builder first")
        await wait_status(chat, "queued")
        status = chat.message_id_with(STATUS)
        assert status is not None
        await chat.say("/taskcard cancel", reply_to=status)
        await wait_status(chat, "cancelled")
        if isinstance(chat, FeishuChat):
            person = chat.fake.command_event(FS_CHAT, "hello", verification_token=FS_VERIFY)
            other = str(person["event"]["message"]["message_id"])
            await chat.say("/taskcard 4", reply_to=other)
        await chat.say("/taskcard off", reply_to=card)
        await wait_said(chat, "Task cards hidden here", "the answer to off")
        assert queued(tmp_path) == [] and len(queued(tmp_path, folder="cancelled")) == 1
        assert not any("4 activity rows" in t for t in chat.bot_texts())


async def test_another_bots_command_replying_to_a_card_is_not_text_for_the_agent(
    platform: str, tmp_path: Path
) -> None:
    # "/start@OtherBot" written as a reply to our card is the other bot's command; it was
    # queued in our agent's inbox as text, with a status message, on both platforms.
    async with running_card(platform, tmp_path) as chat:
        card = chat.message_id_with("compile")
        assert card is not None
        await chat.say("/start@OtherBot now", reply_to=card)
        await chat.say("a real answer", reply_to=card)
        await wait_status(chat, "queued")
        await eventually(lambda: queued(tmp_path), what="the text queued")
        texts = [json.loads(p.read_text())["text"] for p in queued(tmp_path)]
        assert texts == ["a real answer"] and len(status_texts(chat)) == 1


async def test_no_host_is_unconfirmed_and_a_symlinked_inbox_fails(
    platform: str, tmp_path: Path
) -> None:
    async with chat_for(platform, tmp_path, ["builder", "tester", "ghost"]) as chat:
        workdir(tmp_path, "ghost").rmdir()
        publish(workdir(tmp_path), "**quiet** card")
        publish(workdir(tmp_path, "tester"), "**tests** card")
        outside = tmp_path / "outside"
        outside.mkdir()
        (workdir(tmp_path, "tester") / "inbox").symlink_to(outside, target_is_directory=True)
        with chat.serve:
            await eventually(lambda: chat.message_id_with("tests"), timeout_s=60, what="cards")
            await chat.say("/tell builder hello")
            await wait_status(chat, "unconfirmed: no host reads builder")
            await chat.say("/tell tester hello")
            await wait_status(chat, "failed: inbox is a symlink")
            assert list(outside.iterdir()) == []
            # A workdir not made yet: "cannot be opened (No such file or directory)".
            await chat.say("/tell ghost hello")
            await wait_status(chat, "failed: the agent's workdir does not exist yet")
            await chat.say("/tell nobody hello")
            await eventually(
                lambda: any(
                    "AGENT is one of builder, ghost, tester" in t for t in chat.bot_texts()
                ),
                what="the usage answer",
            )
            assert await chat.serve.aterminate() == 0


SIGNALS = "[signals]\nidle_floor_s = 5\nno_output_after_start_s = 2\n"


def report(wd: Path, seq: float, **fields: Any) -> None:
    append_jsonl_line(
        wd / "reports" / "reports.jsonl",
        {
            "seq": seq,
            "at": utc_now_iso(),
            "channel": "cli",
            "verdict": None,
            "role": None,
            "summary": None,
            **fields,
        },
    )


async def test_signals_reach_the_chat_and_the_parent(platform: str, tmp_path: Path) -> None:
    async with chat_for(platform, tmp_path, ["lead", "worker", "shy"], SIGNALS) as chat:
        lead, worker, shy = (workdir(tmp_path, a) for a in ("lead", "worker", "shy"))
        atomic_write(
            worker / "lineage.json",
            json.dumps(
                {
                    "parent": "lead",
                    "reason": "split the migration",
                    "provider": None,
                    "depth": 1,
                    "created_at": utc_now_iso(),
                }
            ).encode(),
        )
        activity(worker, "agent.start")
        activity(worker, "turn.start")
        publish(worker, "**migrating** 1/9")
        publish(lead, "**leading**")
        with chat.serve:
            card = await wait_said(chat, "migrating", "worker card")
            assert "spawned by lead: split the migration" in card
            # report available: typed fields, the summary redacted
            report(
                worker,
                1,
                ok=True,
                verdict="approved",
                role="reviewer",
                summary="all green token=supersecret123456",
            )
            text = await wait_said(chat, "worker reported", "report notice")
            assert "ok, verdict approved, as reviewer" in text and "supersecret" not in text

            # Other wakes (a quiet spell on a loaded machine) may be queued before this one.
            def report_wake() -> dict[str, object] | None:
                for path in queued(tmp_path, "lead"):
                    entry = json.loads(path.read_text())
                    if "worker reported" in str(entry.get("text")):
                        return dict(entry)
                return None

            wake = await eventually(report_wake, timeout_s=30, what="the report's wake")
            assert wake["kind"] == "wake"
            # A lineage naming the agent as its own parent wakes nobody: not its own inbox.
            atomic_write(
                lead / "lineage.json",
                json.dumps({"parent": "lead", "reason": "self", "depth": 1}).encode(),
            )
            await eventually(
                lambda: any("leading" in t and "spawned by lead" in t for t in chat.bot_texts()),
                timeout_s=60,
                what="the lead's own lineage row",
            )
            report(lead, 1, ok=True)
            await wait_said(chat, "lead reported", "the lead's report notice")
            texts = [str(json.loads(p.read_text()).get("text")) for p in queued(tmp_path, "lead")]
            assert not any("lead reported" in text for text in texts), texts
            # idle without report: the turn was declared finished, and no report since
            activity(worker, "turn.start")
            activity(worker, "turn.end")
            await wait_said(chat, "declared its turn finished", "idle notice")
            # exited without report: a new run that owes one (the report was the last run's)
            activity(worker, "agent.start")
            activity(worker, "agent.exit", code=1)
            await wait_said(chat, "worker exited without a report", "exit notice")
            # no output: started, then nothing at all
            activity(shy, "agent.start")
            await eventually(
                lambda: any(
                    "shy started" in t and "nothing was stopped" in t for t in chat.bot_texts()
                ),
                timeout_s=60,
                what="no-output warning",
            )
            await eventually(lambda: len(queued(tmp_path, "lead")) >= 3, what="three wakes")
            await chat.say("/taskcard")
            answer = await wait_said(chat, "Task cards here", "/taskcard answer")
            assert "worker: exited" in answer and "shy: no output" in answer
            assert "latest report" in answer and "ok, verdict approved" in answer
            assert await chat.serve.aterminate() == 0
        # once per episode, also across a restart
        before = [t for t in chat.bot_texts() if "exited without a report" in t]
        with chat.restart():
            await eventually(lambda: "ready" in chat.serve.logs, timeout_s=60, what="restart")
            activity(lead, "text", text="poke")  # something to read after the restart
            await eventually(
                lambda: "channel" in chat.serve.logs and "ready" in chat.serve.logs,
                what="channel ready",
            )
            assert await chat.serve.aterminate() == 0
        assert [t for t in chat.bot_texts() if "exited without a report" in t] == before
        assert len(queued(tmp_path, "lead")) == len({p.name for p in queued(tmp_path, "lead")})


async def test_a_card_rewritten_while_its_agent_is_quiet_still_gets_the_idle_notice(
    platform: str, tmp_path: Path
) -> None:
    """A new card body moves nothing the idle notice is decided from, so the service does
    not decide it again on such a change; the notice must still come once the floor has
    passed. Each change also makes the agent due when its running state would go stale
    (minutes away), which must not push back the floor's earlier moment. The floor is 10 s
    here, so the three rewrites fall inside it even on a loaded machine."""
    floor = "[signals]\nidle_floor_s = 10\n"
    async with chat_for(platform, tmp_path, ["quiet"], floor) as chat:
        wd = workdir(tmp_path, "quiet")
        activity(wd, "agent.start")
        activity(wd, "turn.start")
        activity(wd, "tool.start", call_id="c1", name="pytest")
        publish(wd, "draft 0")
        with chat.serve:
            await wait_said(chat, "draft", "the card")
            activity(wd, "text", text="still going")  # the floor counts from here
            for step in range(1, 4):  # body only: the card stays live, nothing else moves
                atomic_write(CardPaths(wd).body, f"draft {step}".encode())
                await wait_said(chat, f"draft {step}", f"the card's body {step}")
            notice = await wait_said(chat, "quiet has been quiet for", "the idle notice")
            assert "silence, not proof" in notice
            assert await chat.serve.aterminate() == 0


async def test_a_shell_at_its_prompt_is_never_told_idle_without_a_report(
    platform: str, tmp_path: Path
) -> None:
    """The signals spec: at a prompt, "a shell has no turn, so it is never idle". A shell's
    live card quiet beyond the floor got "has been quiet ... no report since its turn
    began. Please check on it", about a turn it never had. An agent in a turn, quiet as
    long (its events written after the shell's, so its floor passes later), is still told."""
    floor = "[signals]\nidle_floor_s = 5\n"
    async with chat_for(platform, tmp_path, ["shell", "coder"], floor) as chat:
        shell, coder = workdir(tmp_path, "shell"), workdir(tmp_path, "coder")
        activity(shell, "agent.start")
        activity(shell, "text", text="$ make")
        publish(shell, "**shell** ready")
        activity(coder, "agent.start")
        activity(coder, "turn.start")
        activity(coder, "tool.start", call_id="c1", name="pytest")
        publish(coder, "**coder** testing")
        with chat.serve:
            await chat.say("/taskcard")
            answer = await wait_said(chat, "Task cards here", "/taskcard answer")
            assert "shell: at prompt" in answer, answer
            await wait_said(chat, "coder has been quiet for", "the coder's idle notice")
            assert not [t for t in chat.bot_texts() if "💤 shell" in t], chat.bot_texts()
            assert await chat.serve.aterminate() == 0


async def test_a_burst_of_reports_wakes_the_parent_once(tmp_path: Path) -> None:
    """Each report queued a wake of its own: a child reporting three times in a row put
    three notices in its parent's inbox. Reports the parent has not taken yet now travel in
    one wake; one it took is not repeated, and a later report gets a wake of its own."""
    async with chat_for("telegram", tmp_path, ["lead", "worker"], SIGNALS) as chat:
        lead, worker = workdir(tmp_path, "lead"), workdir(tmp_path, "worker")
        lineage = {"parent": "lead", "reason": "split", "depth": 1, "created_at": utc_now_iso()}
        atomic_write(worker / "lineage.json", json.dumps(lineage).encode())
        publish(worker, "**migrating**")
        publish(lead, "**leading**")

        def report_wakes() -> list[str]:
            texts = [str(json.loads(p.read_text())["text"]) for p in queued(tmp_path, "lead")]
            return [text for text in texts if "worker reported" in text]

        with chat.serve:
            await wait_said(chat, "migrating", "worker card")
            for seq in (1, 2, 3):
                report(worker, seq, ok=True, summary=f"part {seq} done")
            for seq in (1, 2, 3):
                await wait_said(chat, f"worker reported (#{seq})", f"report {seq} in the chat")
            await eventually(
                lambda: len(report_wakes()) == 1 and "part 3 done" in report_wakes()[0],
                what="one wake with the three reports",
            )
            [wake] = report_wakes()
            assert all(f"(#{seq})" in wake for seq in (1, 2, 3)), wake
            assert lead.joinpath("inbox", "taken").is_dir()
            for message in queued(tmp_path, "lead"):
                claim_and_ack(tmp_path, message)
            report(worker, 4, ok=False, summary="part 4 failed")
            await wait_said(chat, "worker reported (#4)", "report 4 in the chat")
            await eventually(lambda: len(report_wakes()) == 1, what="the wake of report 4")
            [later] = report_wakes()
            assert "(#4)" in later and "(#3)" not in later, later
            assert await chat.serve.aterminate() == 0


async def test_a_restart_between_two_reports_still_wakes_the_parent_once(
    tmp_path: Path,
) -> None:
    """Which report wake was still queued was known in memory only: after a restart the next
    report queued a second wake beside it. It is kept in the state store now."""
    async with chat_for("telegram", tmp_path, ["lead", "worker"], SIGNALS) as chat:
        lead, worker = workdir(tmp_path, "lead"), workdir(tmp_path, "worker")
        lineage = {"parent": "lead", "reason": "split", "depth": 1, "created_at": utc_now_iso()}
        atomic_write(worker / "lineage.json", json.dumps(lineage).encode())
        publish(worker, "**migrating**")
        publish(lead, "**leading**")

        def report_wakes() -> list[str]:
            texts = [str(json.loads(p.read_text())["text"]) for p in queued(tmp_path, "lead")]
            return [text for text in texts if "worker reported" in text]

        with chat.serve:
            await wait_said(chat, "migrating", "worker card")
            report(worker, 1, ok=True, summary="part 1 done")
            await wait_said(chat, "worker reported (#1)", "report 1 in the chat")
            await eventually(lambda: len(report_wakes()) == 1, what="the wake of report 1")
            assert await chat.serve.aterminate() == 0
        assert lead.joinpath("inbox", "queued").is_dir()
        with chat.restart():
            await eventually(lambda: "ready" in chat.serve.logs, timeout_s=60, what="restart")
            report(worker, 2, ok=True, summary="part 2 done")
            await wait_said(chat, "worker reported (#2)", "report 2 in the chat")
            await eventually(
                lambda: any("part 2 done" in text for text in report_wakes()),
                what="a wake carrying report 2",
            )
            [wake] = report_wakes()
            assert "(#1)" in wake and "(#2)" in wake, wake
            assert await chat.serve.aterminate() == 0


async def test_a_feishu_tell_names_the_people_it_mentions(tmp_path: Path) -> None:
    """Feishu writes a mention in the text as a placeholder (`@_user_1`); the agent reads the
    name instead, as a Telegram text keeps `@alice` as typed."""
    async with chat_for("feishu", tmp_path, ["builder"]) as chat:
        assert isinstance(chat, FeishuChat)
        running_agent(tmp_path)
        with chat.serve:
            await running_card_shown(chat)
            document = chat.fake.command_event(
                FS_CHAT,
                "unused",
                open_id=FS_PERSON,
                mention_users=("ou_alice",),
                verification_token=FS_VERIFY,
            )
            message = document["event"]["message"]
            message["mentions"][0]["name"] = "Alice Wong"  # @_user_1; the bot is @_user_2
            message["content"] = json.dumps(
                {"text": "@_user_2 /tell builder ask @_user_1 about the schema"}
            )
            answer = await chat.fake.deliver_event(chat.url, document)
            assert answer.status == 200
            await wait_status(chat, "queued")
            [queued_file] = queued(tmp_path)
            text = json.loads(queued_file.read_text())["text"]
            assert text == "ask @Alice Wong about the schema"
            assert await chat.serve.aterminate() == 0


async def test_reports_after_lines_with_odd_seqs_still_reach_the_chat(
    platform: str, tmp_path: Path
) -> None:
    """A hand-written line with a seq the contract does not allow (`5.0`, past 10**15) counts
    for neither side: the CLI's next report is #1 and the chat announces it."""
    async with chat_for(platform, tmp_path, ["tally"]) as chat:
        wd = workdir(tmp_path, "tally")
        publish(wd, "**tallying** 1/2")
        with chat.serve:
            await eventually(lambda: chat.message_id_with("tallying"), timeout_s=60, what="card")
            report(wd, 5.0, ok=True, summary="a float seq")
            report(wd, 10**16, ok=True, summary="a seq past the bound")
            done = run_cli("report", "--workdir", str(wd), "--ok", "--summary", "counted right")
            assert done.returncode == 0, done.stderr
            assert json.loads(done.stdout)["seq"] == 1
            text = await wait_said(chat, "counted right", "the CLI's report in the chat")
            assert "tally reported (#1): ok." in text
            assert not any("float seq" in t or "past the bound" in t for t in chat.bot_texts())
            assert await chat.serve.aterminate() == 0


async def test_the_state_answer_counts_the_agents_it_has_no_room_for(
    platform: str, tmp_path: Path
) -> None:
    """Sixteen agents with the longest names and long reports do not fit one Telegram message
    (each takes two lines of about 280 characters): the answer lists the ones that fit and
    counts the rest, alike on both platforms (Telegram's cut used to drop the last agents
    unseen, mid-line, while Feishu listed them all)."""
    agents = [f"agent{index:02d}-" + "n" * 56 for index in range(16)]
    async with chat_for(platform, tmp_path, agents) as chat:
        for agent in agents:
            publish(workdir(tmp_path, agent), f"**{agent} card**")
            Reports(workdir(tmp_path, agent)).add(ok=True, role="r" * 64, summary="S" * 1900)
        with chat.serve:
            await eventually(
                lambda: chat.message_id_with(f"{agents[-1]} card"), timeout_s=60, what="the cards"
            )
            await chat.say("/taskcard")
            answer = await wait_said(chat, "Task cards here", "the /taskcard answer")
            listed = [line for line in answer.splitlines() if line.startswith("• ")]
            last = answer.splitlines()[-1]
            assert 0 < len(listed) < len(agents)
            assert last == (
                f"… and {len(agents) - len(listed)} more agents, not listed:"
                " too many for one message."
            )
            assert answer.count("latest report") == len(listed)
            assert await chat.serve.aterminate() == 0


async def test_a_report_dated_in_the_future_does_not_silence_later_runs(
    platform: str, tmp_path: Path
) -> None:
    """A report line dated year 8999 counted as "reported since" every later start, so a run
    that exited owing a report was never announced; it is now taken as dated when read."""
    async with chat_for(platform, tmp_path, ["seer"], SIGNALS) as chat:
        wd = workdir(tmp_path, "seer")
        publish(wd, "**seeing** 1/2")
        with chat.serve:
            await eventually(lambda: chat.message_id_with("seeing"), timeout_s=60, what="card")
            report(wd, 1, ok=True, summary="from a skewed clock", at="8999-01-01T00:00:00Z")
            await wait_said(chat, "from a skewed clock", "the report notice")
            activity(wd, "agent.start")
            activity(wd, "agent.exit", code=1)
            await wait_said(chat, "seer exited without a report", "the exit notice")
            assert await chat.serve.aterminate() == 0


async def test_a_secret_across_the_summary_cut_is_not_shown_in_part(tmp_path: Path) -> None:
    """A report summary (and a lineage reason) holding the service's own Feishu verification
    token (shapeless: only its value finds it) where the notice (the card's row) cuts it: the
    cut used to come first, so the token's first 18 characters reached the chat, in the
    notice, in `/taskcard` and on the card."""
    async with chat_for("feishu", tmp_path, ["leaky"]) as chat:
        wd = workdir(tmp_path, "leaky")
        reason = "r" * 100 + " " + FS_VERIFY + " and more"
        atomic_write(wd / "lineage.json", json.dumps({"parent": "p", "reason": reason}).encode())
        publish(wd, "**leaking** 1/2")
        with chat.serve:
            await eventually(
                lambda: any("leaking" in t and "spawned by p" in t for t in chat.bot_texts()),
                timeout_s=60,
                what="the card with its lineage row",
            )
            Reports(wd).add(ok=True, summary="y" * 280 + " " + FS_VERIFY + " and more")
            await wait_said(chat, "leaky reported", "the report notice")
            await chat.say("/taskcard")
            await wait_said(chat, "latest report", "the /taskcard answer")
            assert await chat.serve.aterminate() == 0
        front = FS_VERIFY[:8]
        assert not any(front in text for text in chat.bot_texts())


async def test_a_lone_surrogate_in_a_report_lineage_or_activity_stops_nothing(
    platform: str, tmp_path: Path
) -> None:
    """`"\\ud800"` is valid JSON but no UTF-8: in a report's summary it failed the notice's
    write to the state store, and in `lineage.json` or an activity line every rendering of the
    agent's card, for good (the report never announced, the card frozen). It now shows as
    U+FFFD."""
    async with chat_for(platform, tmp_path, ["odd"]) as chat:
        wd = workdir(tmp_path, "odd")
        publish(wd, "**odd card** 1/2")
        with chat.serve:
            await eventually(lambda: chat.message_id_with("odd card"), timeout_s=60, what="card")
            line = b'{"seq":1,"at":"2026-01-01T00:00:00Z","ok":true,"summary":"lone \\ud800 one"}'
            (wd / "reports").mkdir()
            (wd / "reports" / "reports.jsonl").write_bytes(line + b"\n")
            atomic_write(wd / "lineage.json", b'{"parent": "lead", "reason": "why \\udc00 so"}')
            (wd / "logs").mkdir()
            (wd / "logs" / "events.jsonl").write_bytes(
                b'{"ts":"2026-01-01T00:00:00Z","kind":"agent.start"}\n'
                b'{"ts":"2026-01-01T00:00:01Z","kind":"turn.start"}\n'
                b'{"ts":"2026-01-01T00:00:02Z","kind":"tool.start","call_id":"c\\ud800",'
                b'"name":"py\\ud800test"}\n'
            )
            publish(wd, "**odd card** 2/2")
            await eventually(
                lambda: any(
                    "odd reported (#1)" in t and "lone \ufffd one" in t for t in chat.bot_texts()
                ),
                timeout_s=60,
                what="the report notice",
            )
            await eventually(
                lambda: any("2/2" in t and "why \ufffd so" in t for t in chat.bot_texts()),
                timeout_s=60,
                what="the card with its lineage row",
            )
            assert await chat.serve.aterminate() == 0


async def test_a_torn_last_line_does_not_swallow_the_next_report_or_exit(
    platform: str, tmp_path: Path
) -> None:
    """The agent's own tool died halfway through a line of `reports/reports.jsonl` and of
    `logs/events.jsonl`. `taskcard report` and `taskcard activity` appended right after the
    torn bytes, so the new line was glued onto them and lost: the report the CLI printed
    (seq 2) was never announced nor read back by `reports --after 1`, and the exit never
    happened for the card. Each now starts on a line of its own."""
    async with chat_for(platform, tmp_path, ["mender"], SIGNALS) as chat:
        wd = workdir(tmp_path, "mender")
        publish(wd, "**mending** 1/2")
        with chat.serve:
            await eventually(lambda: chat.message_id_with("mending"), timeout_s=60, what="card")
            first = run_cli("report", "--workdir", str(wd), "--ok", "--summary", "first round")
            assert first.returncode == 0, first.stderr
            await wait_said(chat, "first round", "the first report's notice")
            with (wd / "reports" / "reports.jsonl").open("ab") as handle:
                handle.write(b'{"seq": 2, "at": "2026-05-01T12:00:00Z", "ok": tr')
            done = run_cli("report", "--workdir", str(wd), "--failed", "--summary", "second")
            assert done.returncode == 0, done.stderr
            assert json.loads(done.stdout)["seq"] == 2
            text = await wait_said(chat, "mender reported (#2)", "the second report's notice")
            assert "failed" in text and "second" in text
            read = run_cli("reports", "--workdir", str(wd), "--after", "1")
            assert read.returncode == 0, read.stderr
            assert json.loads(read.stdout)["report"]["summary"] == "second"
            activity(wd, "agent.start")
            with CardPaths(wd).events.open("ab") as handle:
                handle.write(b'{"ts": "2026-05-01T12:00:00Z", "kind": "te')
            done = run_cli("activity", "--workdir", str(wd), "agent.exit", "code=1")
            assert done.returncode == 0, done.stderr
            await wait_said(chat, "mender exited without a report", "the exit notice")
            assert await chat.serve.aterminate() == 0


async def test_broken_report_lines_are_said_once_and_later_reports_still_read(
    platform: str, tmp_path: Path
) -> None:
    """Random bytes, a 9 MB line and a report with a 5,000-digit number in a field no reader
    uses were skipped without a word by `serve` and by `taskcard reports` (`{"report": null}`,
    nothing on stderr). `serve` now logs a run of broken lines once, until a report is read
    again; the report with the long number is read (its field left out); `taskcard reports`
    names each broken line it read past on stderr, its answer and exit code unchanged."""
    async with chat_for(platform, tmp_path, ["scribe"]) as chat:
        wd = workdir(tmp_path, "scribe")
        publish(wd, "**scribing** 1/2")
        with chat.serve:
            await eventually(lambda: chat.message_id_with("scribing"), timeout_s=60, what="card")
            (wd / "reports").mkdir()
            reports = wd / "reports" / "reports.jsonl"
            junk = os.urandom(2000).replace(b"\n", b"x") + b"\n[1]\n"
            reports.write_bytes(junk)
            said = "agent scribe: reports/reports.jsonl holds a line that "
            await eventually(lambda: said in chat.serve.logs, timeout_s=60, what="the warning")
            with reports.open("ab") as handle:  # the same run of broken lines
                handle.write(b'{"seq": 1, "summary": "' + b"q" * 9_000_000 + b'"}\n')
            with reports.open("ab") as handle:
                handle.write(
                    b'{"seq": 5, "at": "2026-01-01T00:00:00Z", "ok": true, "summary":'
                    b' "digits kept", "x": ' + b"9" * 5000 + b"}\n"
                )
            await wait_said(chat, "digits kept", "the report with a long number")
            logs = chat.serve.logs
            assert logs.count("reports/reports.jsonl") == 2, logs  # the warning, "again"
            assert "skipped, later reports are still read (write one JSON object per line" in logs
            assert "agent scribe: reports/reports.jsonl holds reports again" in logs
            with reports.open("ab") as handle:
                handle.write(b"not json\n")
            again = "reports/reports.jsonl holds a line that is not JSON; skipped"
            await eventually(lambda: again in chat.serve.logs, timeout_s=60, what="a new run")
            read = run_cli("reports", "--workdir", str(wd), "--after", "5")
            assert (read.returncode, json.loads(read.stdout)) == (0, {"report": None})
            assert read.stderr == (
                "taskcard reports: reports/reports.jsonl line 5 is not JSON; skipped (write one"
                " JSON object per line, as `taskcard report` does)\n"
            )
            latest = run_cli("reports", "--workdir", str(wd))
            assert json.loads(latest.stdout)["report"]["summary"] == "digits kept"
            assert "line 5 is not JSON" in latest.stderr
            assert await chat.serve.aterminate() == 0


async def test_broken_report_lines_are_a_problem_of_the_agent_until_its_file_is_good_again(
    platform: str, tmp_path: Path
) -> None:
    """A broken line of `reports/reports.jsonl` was said only in serve's log: `taskcard status`
    and the card, where people look for what is wrong with an agent, showed nothing, as the
    per-file problems are looked at again at every stat of the file. The line is a problem
    of its own now: listed with the fix, on the card and in `status`, until a good report is
    read after it, or the file is replaced; kept across a restart (the file still ends with
    it). Another agent's card and status stay clean."""
    async with chat_for(platform, tmp_path, ["scribe", "other"]) as chat:
        wd = workdir(tmp_path, "scribe")
        publish(wd, "**scribing** 1/3")
        publish(workdir(tmp_path, "other"), "**drafting**")
        (wd / "reports").mkdir()
        reports = wd / "reports" / "reports.jsonl"
        row = "⚠ reports/reports.jsonl: holds a line that is not JSON; skipped"
        fix = "write one JSON object per line, as `taskcard report` does"

        def card(words: str) -> str:
            return next(t for t in chat.bot_texts() if words in t)

        def status() -> str:
            return run_cli("status", "--config", str(chat.serve.config)).stdout

        def problems_of(agent: str) -> str | None:
            listed = json.loads(
                run_cli("status", "--config", str(chat.serve.config), "--json").stdout
            )
            (found,) = [a["problems"] for a in listed["agents"] if a["agent"] == agent]
            return "\n".join(found) or None

        async def shown(on: bool) -> None:
            await eventually(
                lambda: ("⚠ reports/reports.jsonl:" in card("scribing")) is on,
                timeout_s=60,
                what=f"the row {on}",
            )
            await eventually(
                lambda: (problems_of("scribe") is not None) is on, timeout_s=60, what="status"
            )

        with chat.serve:
            await wait_said(chat, "scribing", "scribe's card")
            await wait_said(chat, "drafting", "other's card")
            reports.write_bytes(b"not json\n")
            await shown(True)
            assert row in card("scribing")
            assert fix in card("scribing") and "`taskcard reports` names each" in card("scribing")
            said = problems_of("scribe")
            assert said is not None and said.startswith(
                "reports/reports.jsonl: holds a line that is not JSON; skipped, so a report"
                " there is lost"
            ), said
            assert fix in said
            text = status()
            assert "agent scribe: PROBLEMS" in text and "agent other: PROBLEMS" not in text
            assert "⚠" not in card("drafting") and problems_of("other") is None
            # A good report after the broken line: the file is good again.
            Reports(wd).add(ok=True, summary="first round")
            await wait_said(chat, "first round", "the report's notice")
            await shown(False)
            # Broken again, then the file replaced: the broken lines went with it.
            with reports.open("ab") as handle:
                handle.write(b"[1]\n")
            await eventually(
                lambda: (
                    "⚠ reports/reports.jsonl: holds a line that is not a JSON object"
                    in card("scribing")
                ),
                timeout_s=60,
                what="the row of a new run",
            )
            fresh = reports.with_name("fresh.jsonl")
            fresh.write_bytes(b"")
            os.replace(fresh, reports)
            await shown(False)
            with reports.open("ab") as handle:
                handle.write(b"\x80 not text\n")
            await eventually(
                lambda: "holds a line that is not UTF-8 text" in card("scribing"),
                timeout_s=60,
                what="the row of a line that is not UTF-8",
            )
            assert await chat.serve.aterminate() == 0
        with chat.restart():
            # The file still ends with the broken line: shown after the restart too.
            publish(wd, "**scribing** 2/3")
            await wait_said(chat, "2/3", "the card after the restart")
            await eventually(
                lambda: "holds a line that is not UTF-8 text" in card("2/3"),
                timeout_s=60,
                what="the row after the restart",
            )
            assert problems_of("scribe") is not None and problems_of("other") is None
            reports.unlink()  # removed: nothing broken is left
            publish(wd, "**scribing** 3/3")
            await eventually(lambda: "3/3" in card("scribing"), timeout_s=60, what="3/3")
            await shown(False)
            assert await chat.serve.aterminate() == 0


async def test_a_tool_started_after_the_turn_ended_reads_running(
    platform: str, tmp_path: Path
) -> None:
    """Output after the declared end of a turn means a new turn began (the reports-and-signals
    state table), also when no `turn.start` was written: a host that reports only turn ends,
    a tool the agent's own scripts log. The card kept saying idle while the tool ran, the
    one answer that invites a dispatch onto a busy agent."""
    async with chat_for(platform, tmp_path, ["runner"]) as chat:
        wd = workdir(tmp_path, "runner")
        activity(wd, "agent.start")
        activity(wd, "turn.start")
        activity(wd, "turn.end")
        publish(wd, "**running** the matrix")
        with chat.serve:
            await eventually(
                lambda: any("the matrix" in t and "💤 idle" in t for t in chat.bot_texts()),
                timeout_s=60,
                what="the idle card",
            )
            done = run_cli(
                "activity", "--workdir", str(wd), "tool.start", "call_id=c9", "name=pytest"
            )
            assert done.returncode == 0, done.stderr
            await eventually(
                lambda: any("the matrix" in t and "▶ running" in t for t in chat.bot_texts()),
                timeout_s=60,
                what="the card running again",
            )
            await chat.say("/taskcard")
            answer = await wait_said(chat, "Task cards here", "/taskcard answer")
            assert "runner: running" in answer, answer
            assert await chat.serve.aterminate() == 0


async def test_the_verdict_in_the_specs_own_words_reaches_the_chat(
    platform: str, tmp_path: Path
) -> None:
    """The reports-and-signals spec names a review's verdict aprovado or reprovado. The CLI
    refused `--verdict reprovado` (exit 2) and a hand-written line with `"aprovado"` reached
    the chat with no verdict at all, as if it were no review."""
    async with chat_for(platform, tmp_path, ["judge"]) as chat:
        wd = workdir(tmp_path, "judge")
        publish(wd, "**reviewing** 1/2")
        with chat.serve:
            await eventually(lambda: chat.message_id_with("reviewing"), timeout_s=60, what="card")
            report(wd, 1, ok=True, verdict="aprovado", role="reviewer", summary="by hand")
            text = await wait_said(chat, "judge reported (#1)", "the hand-written report")
            assert "ok, verdict approved, as reviewer" in text, text
            done = run_cli(
                "report",
                "--workdir",
                str(wd),
                "--failed",
                "--verdict",
                "reprovado",
                "--role",
                "reviewer",
                "--summary",
                "by the cli",
            )
            assert done.returncode == 0, done.stderr
            assert json.loads(done.stdout)["verdict"] == "rejected"
            text = await wait_said(chat, "judge reported (#2)", "the CLI's report")
            assert "failed, verdict rejected, as reviewer" in text, text
            assert await chat.serve.aterminate() == 0


def _state_cursors(tmp_path: Path, prefix: str) -> dict[str, str]:
    """The service's state cursors whose key starts with `prefix`, read from its file as an
    operator would."""
    import sqlite3
    from contextlib import closing

    with closing(sqlite3.connect(tmp_path / ".taskcard" / "state.sqlite3")) as db:
        query = "SELECT key, value FROM cursors WHERE substr(key, 1, ?) = ?"
        return {str(k): str(v) for k, v in db.execute(query, (len(prefix), prefix))}


def _worker_offsets(tmp_path: Path) -> list[str]:
    import sqlite3
    from contextlib import closing

    with closing(sqlite3.connect(tmp_path / ".taskcard" / "state.sqlite3")) as db:
        query = "SELECT name FROM offsets WHERE agent_id = 'worker'"
        return [str(name) for (name,) in db.execute(query)]


async def test_the_state_of_a_removed_agent_is_forgotten_and_a_returning_one_repeats_nothing(
    tmp_path: Path,
) -> None:
    """A child removed from the config left its report-wake cursor (and its health record)
    in the state for good. A start now forgets them for agents no longer served; the files'
    offsets stay, so the child, added back, repeats no old report, and its next one is
    announced and wakes its parent."""
    async with chat_for("telegram", tmp_path, ["lead", "worker"], SIGNALS) as chat:
        assert isinstance(chat, TelegramChat)
        lead, worker = workdir(tmp_path, "lead"), workdir(tmp_path, "worker")
        lineage = {"parent": "lead", "reason": "split", "depth": 1, "created_at": utc_now_iso()}
        atomic_write(worker / "lineage.json", json.dumps(lineage).encode())
        publish(worker, "**migrating**")
        publish(lead, "**leading**")

        def report_wakes() -> list[str]:
            texts = [str(json.loads(p.read_text())["text"]) for p in queued(tmp_path, "lead")]
            return [text for text in texts if "worker reported" in text]

        with chat.serve:
            await wait_said(chat, "migrating", "worker card")
            report(worker, 1, ok=True, summary="part 1 done")
            await wait_said(chat, "worker reported (#1)", "report 1 in the chat")
            await eventually(lambda: len(report_wakes()) == 1, what="the wake of report 1")
            card = worker / "taskcard" / "taskcard.md"
            card.unlink()
            card.symlink_to(tmp_path / "nowhere.md")  # a problem `taskcard status` lists
            await eventually(
                lambda: (
                    _state_cursors(tmp_path, "agent-health:worker").get("agent-health:worker", "[]")
                    != "[]"
                ),
                what="the worker's problem kept for status",
            )
            assert await chat.serve.aterminate() == 0
        card.unlink()
        publish(worker, "**migrating**")
        assert list(_state_cursors(tmp_path, "report-wake:")) == ['report-wake:["lead", "worker"]']

        alone = TelegramChat(tmp_path, chat.fake, ["lead"], SIGNALS)  # the worker removed
        with alone.serve:
            await eventually(lambda: "channel telegram ready" in alone.serve.logs, what="start")
            assert await alone.serve.aterminate() == 0
        assert "forgot the state of agents no longer served" in alone.serve.logs
        assert _state_cursors(tmp_path, "report-wake:") == {}
        assert "agent-health:worker" not in _state_cursors(tmp_path, "agent-health:")
        assert _worker_offsets(tmp_path), "the files' offsets stay, for its return"

        said = len([t for t in chat.bot_texts() if "worker reported" in t])
        back = TelegramChat(tmp_path, chat.fake, ["lead", "worker"], SIGNALS)  # it returns
        with back.serve:
            await eventually(lambda: "channel telegram ready" in back.serve.logs, what="start")
            report(worker, 2, ok=True, summary="part 2 done")
            await wait_said(back, "worker reported (#2)", "report 2 in the chat")
            await eventually(
                lambda: any("part 2 done" in text for text in report_wakes()),
                what="a wake carrying report 2",
            )
            assert await back.serve.aterminate() == 0
        reported = [t for t in chat.bot_texts() if "worker reported" in t]
        assert len(reported) == said + 1 and "(#2)" in reported[-1], reported
        assert sum("(#1)" in text for text in report_wakes()) == 1, report_wakes()
        assert "forgot the state" not in back.serve.logs
