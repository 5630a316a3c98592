"""Fixtures for channel tests: fake-backed channels and the shared contract harness.

`channel_harness` is the seam of the contract suite (docs/architecture.md, "Tests"): every transport
provides a `ChannelHarness` that builds its real channel against its fake server and reads
back what the chat shows. A channel-neutral test takes `channel_harness` and runs once per
transport; add a transport by adding its name to `HARNESSES` and a branch in the fixture.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from contextlib import AsyncExitStack
from typing import Protocol

import pytest

from taskcard.channels.base import Channel, ChatRef, IncomingCommand
from taskcard.channels.feishu.card import card_plain_text as feishu_card_plain_text
from taskcard.channels.feishu.channel import FeishuChannel
from taskcard.channels.feishu.config import FeishuConfig, FeishuWebhook
from taskcard.channels.telegram.channel import TelegramChannel
from taskcard.channels.telegram.config import TelegramConfig
from tests.fakes.feishu_api import FakeFeishu
from tests.fakes.feishu_api import FakeLimits as FakeFeishuLimits
from tests.fakes.feishu_api import FakeMessage as FakeFeishuMessage
from tests.fakes.telegram_api import FakeLimits, FakeTelegram

HARNESSES = ["telegram", "feishu"]


class MemoryCursorStore:
    """A `CursorStore` in a dict; share one instance to model a restart with the same store."""

    def __init__(self) -> None:
        self.values: dict[str, str] = {}

    def get_cursor(self, key: str) -> str | None:
        return self.values.get(key)

    def set_cursor(self, key: str, value: str) -> None:
        self.values[key] = value

    def delete_cursors(self, keys: Iterable[str]) -> None:
        for key in keys:
            self.values.pop(key, None)


class CommandInbox:
    """Collects commands a channel hands over; tests wait on it with a generous timeout."""

    def __init__(self) -> None:
        self.commands: list[IncomingCommand] = []
        self._changed = asyncio.Event()

    async def __call__(self, command: IncomingCommand) -> None:
        self.commands.append(command)
        self._changed.set()

    async def wait_for(self, count: int, timeout_s: float = 20.0) -> list[IncomingCommand]:
        deadline = time.monotonic() + timeout_s
        while len(self.commands) < count:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(f"expected {count} commands, got {self.commands}")
            self._changed.clear()
            try:
                await asyncio.wait_for(self._changed.wait(), min(remaining, 0.5))
            except TimeoutError:
                continue
        return self.commands


async def wait_until(
    condition: Callable[[], bool], timeout_s: float = 20.0, what: str = "condition"
) -> None:
    """Poll `condition` until it holds; fail after a generous timeout (never a fixed sleep)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


class ChannelHarness(Protocol):
    """What the contract suite needs from a transport and its fake."""

    name: str

    def private_chat(self) -> ChatRef: ...

    def group_chat(self) -> ChatRef: ...

    async def started_channel(
        self, on_command: Callable[[IncomingCommand], Awaitable[None]] | None = None
    ) -> Channel:
        """A real channel against the fake, started; stopped when the test ends."""

    def shown_text(self, chat: ChatRef, message_id: str) -> str | None:
        """The text the chat shows for the message, None when it is gone."""

    def shown_messages(self, chat: ChatRef) -> list[str]:
        """Texts of the bot's visible messages in the chat (a topic if `chat` has one)."""

    def user_delete(self, chat: ChatRef, message_id: str) -> None: ...

    def remove_bot(self, chat: ChatRef) -> None:
        """Kick the bot from a group / block it in a private chat."""

    def inject_command(
        self, chat: ChatRef, text: str, user_id: int, edited: bool = False
    ) -> None: ...

    def limit_chat(self, max_calls: int, period_s: float) -> None:
        """Make the fake enforce this per-chat limit from now on."""


class TelegramHarness:
    name = "telegram"

    def __init__(self, fake: FakeTelegram, stack: AsyncExitStack) -> None:
        self.fake = fake
        self.cursor = MemoryCursorStore()
        self._stack = stack

    def config(self, commands: bool = False) -> TelegramConfig:
        return TelegramConfig(
            api_base_url=self.fake.base_url,
            commands=commands,
            poll_timeout_s=1,
            request_timeout_s=10.0,
        )

    def private_chat(self) -> ChatRef:
        return ChatRef("4242")

    def group_chat(self) -> ChatRef:
        return ChatRef("-1001234567890")

    async def started_channel(
        self, on_command: Callable[[IncomingCommand], Awaitable[None]] | None = None
    ) -> Channel:
        channel = TelegramChannel(
            self.config(commands=on_command is not None), self.fake.token, self.cursor
        )
        await channel.start(on_command or CommandInbox())
        self._stack.push_async_callback(channel.stop)
        return channel

    def shown_text(self, chat: ChatRef, message_id: str) -> str | None:
        stored = self.fake.message(chat.chat_id, message_id)
        return None if stored is None or stored.deleted else stored.text

    def shown_messages(self, chat: ChatRef) -> list[str]:
        thread = None if chat.thread_id is None else int(chat.thread_id)
        return [m.text for m in self.fake.bot_messages(chat.chat_id, thread)]

    def user_delete(self, chat: ChatRef, message_id: str) -> None:
        self.fake.user_delete(chat.chat_id, message_id)

    def remove_bot(self, chat: ChatRef) -> None:
        self.fake.kick(chat.chat_id)

    def inject_command(self, chat: ChatRef, text: str, user_id: int, edited: bool = False) -> None:
        thread = None if chat.thread_id is None else int(chat.thread_id)
        self.fake.inject_command(chat.chat_id, text, user_id, thread, edited=edited)

    def limit_chat(self, max_calls: int, period_s: float) -> None:
        from tests.fakes.telegram_api import Window

        window = Window(max_calls, period_s)
        self.fake.limits = FakeLimits(private_chat=window, group_chat=window, bot=None)


@pytest.fixture
async def telegram_fake() -> AsyncIterator[FakeTelegram]:
    """A fake Bot API without limits (tests that need limits set `fake.limits`)."""
    async with FakeTelegram(limits=FakeLimits.unlimited()) as fake:
        yield fake


@pytest.fixture
def telegram_cursor() -> MemoryCursorStore:
    return MemoryCursorStore()


@pytest.fixture
def telegram_config(telegram_fake: FakeTelegram) -> TelegramConfig:
    return TelegramConfig(
        api_base_url=telegram_fake.base_url, commands=False, request_timeout_s=10.0
    )


@pytest.fixture
async def telegram_channel(
    telegram_fake: FakeTelegram,
    telegram_config: TelegramConfig,
    telegram_cursor: MemoryCursorStore,
) -> AsyncIterator[TelegramChannel]:
    """A started channel without command polling."""
    channel = TelegramChannel(telegram_config, telegram_fake.token, telegram_cursor)
    await channel.start(CommandInbox())
    try:
        yield channel
    finally:
        await channel.stop()


class FeishuHarness:
    """The Feishu channel against `tests.fakes.feishu_api`; commands over the webhook."""

    name = "feishu"

    def __init__(self, fake: FakeFeishu, stack: AsyncExitStack) -> None:
        self.fake = fake
        self.cursor = MemoryCursorStore()
        self._stack = stack
        self._deliveries: set[asyncio.Task[object]] = set()
        self._webhook_url: str | None = None
        stack.push_async_callback(self._await_deliveries)

    async def _await_deliveries(self) -> None:
        while self._deliveries:
            await asyncio.gather(*list(self._deliveries), return_exceptions=True)

    def private_chat(self) -> ChatRef:
        return ChatRef("oc_p2p_4242")

    def group_chat(self) -> ChatRef:
        return ChatRef("oc_group_1234")

    async def started_channel(
        self, on_command: Callable[[IncomingCommand], Awaitable[None]] | None = None
    ) -> Channel:
        config = FeishuConfig(
            domain=self.fake.base_url,
            events="webhook" if on_command is not None else "none",
            webhook=FeishuWebhook(host="127.0.0.1", port=0, path="/feishu/events"),
            request_timeout_s=10.0,
        )
        channel = FeishuChannel(config, self.fake.app_id, self.fake.app_secret, self.cursor)
        await channel.start(on_command or CommandInbox())
        self._stack.push_async_callback(channel.stop)
        if on_command is not None:
            self._webhook_url = f"http://127.0.0.1:{channel.webhook_port}/feishu/events"
        return channel

    @staticmethod
    def _text(stored: FakeFeishuMessage) -> str:
        if stored.msg_type == "interactive":
            return feishu_card_plain_text(stored.card)
        return str(json.loads(stored.content).get("text", ""))

    def shown_text(self, chat: ChatRef, message_id: str) -> str | None:
        stored = self.fake.messages.get(message_id)
        if stored is None or stored.chat_id != chat.chat_id or not stored.visible:
            return None
        return self._text(stored)

    def shown_messages(self, chat: ChatRef) -> list[str]:
        return [self._text(m) for m in self.fake.chat(chat.chat_id)]

    def user_delete(self, chat: ChatRef, message_id: str) -> None:
        self.fake.delete_message(message_id)

    def remove_bot(self, chat: ChatRef) -> None:
        self.fake.remove_bot(chat.chat_id)

    def inject_command(self, chat: ChatRef, text: str, user_id: int, edited: bool = False) -> None:
        url = self._webhook_url
        assert url is not None, "start the channel with a command sink first"
        document = self.fake.command_event(chat.chat_id, text, open_id=str(user_id))
        if edited:
            # Feishu reports an edit as another event type, never as a new message.
            document["header"]["event_type"] = "im.message.updated_v1"
        task = asyncio.get_running_loop().create_task(self.fake.deliver_event(url, document))
        self._deliveries.add(task)
        task.add_done_callback(self._deliveries.discard)

    def limit_chat(self, max_calls: int, period_s: float) -> None:
        self.fake.limits = FakeFeishuLimits(
            message_update=max_calls,
            chat_send=max_calls,
            app=max_calls,
            window_s=period_s,
            reset_s=max(1, int(period_s)),
        )


@pytest.fixture(params=HARNESSES)
async def channel_harness(request: pytest.FixtureRequest) -> AsyncIterator[ChannelHarness]:
    async with AsyncExitStack() as stack:
        if request.param == "telegram":
            fake = await stack.enter_async_context(FakeTelegram(limits=FakeLimits.unlimited()))
            # Registered after the fake, so channels stop before the fake does.
            inner = AsyncExitStack()
            stack.push_async_callback(inner.aclose)
            yield TelegramHarness(fake, inner)
        elif request.param == "feishu":
            feishu = await stack.enter_async_context(FakeFeishu())
            inner = AsyncExitStack()
            stack.push_async_callback(inner.aclose)
            yield FeishuHarness(feishu, inner)
        else:
            raise ValueError(f"no harness for {request.param}")
