"""The console channel: resident "messages" are blocks on the terminal.

On a terminal the whole screen is redrawn on every change, so each agent keeps one block that
changes in place, as a chat would show it. Elsewhere (a pipe, a log file) every accepted send
or edit is printed once as a timestamped block, which keeps the output a truthful history.
It has no rate limits and receives no commands.
"""

from __future__ import annotations

import sys
from datetime import UTC, datetime
from typing import TextIO

from channels.base import (
    BODY_CUT_MARKER,
    CardView,
    Channel,
    ChatRef,
    CommandSink,
    Operation,
    Outgoing,
    RateScope,
    fit_view,
)
from channels.errors import MessageGone, NotModified

CONSOLE_CHAT = ChatRef("console")
MAX_CARD_CHARS = 8000


def render_plain(view: CardView) -> str:
    """A card as plain text: header, automatic slot, separator, body."""
    if view.hidden:
        return f"{view.agent_id}: task card hidden"
    lines = [f"■ {view.agent_id} · {view.state}"]
    lines.extend(f"  {row}" for row in view.auto_rows)
    lines.append("  " + "─" * 40)
    if view.body:
        lines.extend(f"  {line}" for line in view.body.splitlines())
    if view.body_cut:
        lines.extend(f"  {line}" for line in BODY_CUT_MARKER.strip().splitlines())
    if view.body_note:
        lines.append(f"  ({view.body_note})")
    return "\n".join(lines)


class ConsoleChannel(Channel):
    name = "console"

    def __init__(self, stream: TextIO | None = None, *, live: bool | None = None) -> None:
        self._stream = stream if stream is not None else sys.stdout
        self._live = self._stream.isatty() if live is None else live
        self._messages: dict[str, str] = {}
        self._next_id = 1

    async def start(self, on_command: CommandSink) -> None:
        del on_command  # the console receives no commands

    async def stop(self) -> None:
        self._stream.flush()

    def render_card(self, view: CardView) -> Outgoing:
        fitted = fit_view(view, lambda v: len(render_plain(v)), MAX_CARD_CHARS)
        return Outgoing.build(render_plain(fitted), {})

    def render_text(self, text: str) -> Outgoing:
        return Outgoing.build(text, {"notice": True})

    def rate_scopes(
        self, chat: ChatRef, operation: Operation, message_id: str | None
    ) -> tuple[RateScope, ...]:
        return ()

    @property
    def messages(self) -> dict[str, str]:
        """What the console shows now, by message id (for tests and the demo)."""
        return dict(self._messages)

    async def send(
        self, chat: ChatRef, message: Outgoing, *, idempotency_key: str | None = None
    ) -> str:
        del idempotency_key  # nothing to deduplicate on a terminal
        message_id = str(self._next_id)
        self._next_id += 1
        if message.payload.get("notice"):
            self._print(f"! {message.text}")
            return message_id
        self._messages[message_id] = message.text
        self._show(message.text)
        return message_id

    async def edit(self, chat: ChatRef, message_id: str, message: Outgoing) -> None:
        current = self._messages.get(message_id)
        if current is None:
            raise MessageGone(f"console message {message_id} does not exist")
        if current == message.text:
            raise NotModified("unchanged")
        self._messages[message_id] = message.text
        self._show(message.text)

    async def delete(self, chat: ChatRef, message_id: str) -> None:
        self._messages.pop(message_id, None)

    async def pin(self, chat: ChatRef, message_id: str) -> None:
        return None

    def _show(self, text: str) -> None:
        if self._live:
            screen = "\n\n".join(self._messages[key] for key in sorted(self._messages, key=int))
            self._stream.write("\x1b[H\x1b[2J" + screen + "\n")
            self._stream.flush()
        else:
            self._print(text)

    def _print(self, text: str) -> None:
        stamp = datetime.now(UTC).strftime("%H:%M:%S")
        self._stream.write(f"[{stamp}] {text}\n\n")
        self._stream.flush()
