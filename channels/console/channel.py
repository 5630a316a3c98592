"""The console channel: resident "messages" are panels on the terminal, drawn with rich.

On a terminal the screen is redrawn on every change: a header (the agents, the routes,
"Ctrl-C to stop"), one panel per agent that changes in place as a chat would show it, with the
card's Markdown rendered and its state in colour, and under them the latest notices, which
stay on screen across redraws instead of flashing by. Elsewhere (a pipe, a log file) the header
is printed once and every accepted send, edit or notice once, as a timestamped block without
colour codes, which keeps the output a truthful history. It has no rate limits and receives no
commands.
"""

from __future__ import annotations

import sys
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final, TextIO

from rich.console import Console, Group, RenderableType
from rich.markdown import Markdown
from rich.panel import Panel
from rich.rule import Rule
from rich.text import Text

from taskcard.channels.base import (
    BODY_CUT_MARKER,
    CardView,
    Channel,
    ChatRef,
    CommandSink,
    Operation,
    Outgoing,
    RateScope,
    ReplyTo,
    counted,
    fit_view,
)
from taskcard.channels.errors import MessageGone, NotModified

CONSOLE_CHAT = ChatRef("console")
MAX_CARD_CHARS = 8000
MAX_NOTICES: Final = 8
STATE_STYLES: Final[dict[str, str]] = {
    "running": "green",
    "no output": "yellow",
    "at prompt": "cyan",
    "waiting": "magenta",
    "idle": "blue",
    "exited": "bright_black",
    "unknown": "bright_black",
}


@dataclass(frozen=True)
class ConsoleHeader:
    """What this service watches, shown above the cards."""

    agents: tuple[str, ...] = ()
    routes: tuple[str, ...] = ()  # one line per route, e.g. "telegram -100123: builder"


def render_plain(view: CardView) -> str:
    """A card as Markdown text: header, automatic slot, separator, body."""
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


def _card_payload(view: CardView) -> dict[str, Any]:
    body = view.body or ""
    if view.body_cut:
        body += BODY_CUT_MARKER
    return {
        "agent": view.agent_id,
        "state": view.state,
        "hidden": view.hidden,
        "rows": list(view.auto_rows),
        "body": body,
        "note": view.body_note,
    }


def card_renderable(payload: dict[str, Any]) -> RenderableType:
    """One agent's panel: state in colour, automatic rows dimmed, the body as Markdown."""
    style = STATE_STYLES.get(str(payload["state"]), "white")
    title = Text.assemble((str(payload["agent"]), "bold"), " · ", (str(payload["state"]), style))
    if payload["hidden"]:
        return Panel(Text("task card hidden", style="dim"), title=title, title_align="left")
    parts: list[RenderableType] = [Text(row, style="dim") for row in payload["rows"]]
    parts.append(Rule(style="dim"))
    if payload["body"]:
        parts.append(Markdown(payload["body"]))
    if payload["note"]:
        parts.append(Text(str(payload["note"]), style="italic"))
    return Panel(Group(*parts), title=title, title_align="left", border_style=style)


def header_renderable(header: ConsoleHeader) -> RenderableType:
    agents = ", ".join(header.agents) or "none configured"
    lines = [
        Text.assemble(
            ("taskcard", "bold"),
            f" · {counted(len(header.agents), 'agent', 'agents')}: {agents}",
        ),
        *(Text(f"  route {route}", style="dim") for route in header.routes),
        Text("Ctrl-C to stop", style="dim italic"),
    ]
    return Group(*lines)


class ConsoleChannel(Channel):
    name = "console"
    # Its "messages" are panels of this process: after a restart the ids stored by the last
    # run would be reused by new panels, two routes sharing one, and unchanged cards were
    # never printed again.
    messages_outlive_process = False

    def __init__(
        self,
        stream: TextIO | None = None,
        *,
        live: bool | None = None,
        header: ConsoleHeader | None = None,
        width: int | None = None,
    ) -> None:
        self._stream = stream if stream is not None else sys.stdout
        self._live = self._stream.isatty() if live is None else live
        self._console = Console(
            file=self._stream,
            force_terminal=self._live,
            no_color=not self._live,
            highlight=False,
            width=width,
            soft_wrap=False,
        )
        self._header = header or ConsoleHeader()
        self._messages: dict[str, Outgoing] = {}
        self._notices: deque[tuple[str, str]] = deque(maxlen=MAX_NOTICES)
        self._next_id = 1

    async def start(self, on_command: CommandSink) -> None:
        del on_command  # the console receives no commands
        if self._live:
            self._redraw()
        else:
            self._console.print(header_renderable(self._header))
            self._console.print()
            self._stream.flush()

    async def stop(self) -> None:
        self._stream.flush()

    def render_card(self, view: CardView) -> Outgoing:
        fitted = fit_view(view.shown_part(), lambda v: len(render_plain(v)), MAX_CARD_CHARS)
        return Outgoing.build(render_plain(fitted), _card_payload(fitted))

    def render_text(self, text: str) -> Outgoing:
        return Outgoing.build(text, {"notice": True})

    def rate_scopes(
        self, chat: ChatRef, operation: Operation, message_id: str | None
    ) -> tuple[RateScope, ...]:
        return ()

    @property
    def messages(self) -> dict[str, str]:
        """What the console shows now, by message id (for tests and the demo)."""
        return {key: message.text for key, message in self._messages.items()}

    @property
    def notices(self) -> list[str]:
        """The notices kept on screen, oldest first."""
        return [text for _, text in self._notices]

    async def send(
        self,
        chat: ChatRef,
        message: Outgoing,
        *,
        idempotency_key: str | None = None,
        reply_to: ReplyTo | None = None,
    ) -> str:
        del idempotency_key, reply_to  # nothing to deduplicate or quote on a terminal
        message_id = str(self._next_id)
        self._next_id += 1
        if message.payload.get("notice"):
            stamp = _stamp()
            self._notices.append((stamp, message.text))
            if self._live:
                self._redraw()
            else:
                self._print(Text(f"! {message.text}", style="bold yellow"), stamp)
            return message_id
        self._messages[message_id] = message
        self._show(message)
        return message_id

    async def edit(self, chat: ChatRef, message_id: str, message: Outgoing) -> None:
        current = self._messages.get(message_id)
        if current is None:
            raise MessageGone(f"console message {message_id} does not exist")
        if current.fingerprint == message.fingerprint:
            raise NotModified("unchanged")
        self._messages[message_id] = message
        self._show(message)

    async def delete(self, chat: ChatRef, message_id: str) -> None:
        if self._messages.pop(message_id, None) is not None and self._live:
            self._redraw()

    async def pin(self, chat: ChatRef, message_id: str) -> None:
        return None

    def _show(self, message: Outgoing) -> None:
        if self._live:
            self._redraw()
        else:
            self._print(card_renderable(dict(message.payload)), _stamp())

    def _redraw(self) -> None:
        parts: list[RenderableType] = [header_renderable(self._header)]
        for key in sorted(self._messages, key=int):
            parts.append(card_renderable(dict(self._messages[key].payload)))
        if self._notices:
            parts.append(Rule("notices", style="yellow", align="left"))
            parts.extend(Text(f"[{stamp}] {text}", style="yellow") for stamp, text in self._notices)
        self._console.clear()
        self._console.print(Group(*parts))
        self._stream.flush()

    def _print(self, renderable: RenderableType, stamp: str) -> None:
        self._console.print(Text(f"[{stamp}]", style="dim"))
        self._console.print(renderable)
        self._console.print()
        self._stream.flush()


def _stamp() -> str:
    """When a block appeared on this terminal, in the terminal's local time."""
    return datetime.now().astimezone().strftime("%H:%M:%S")


def route_lines(routes: Sequence[tuple[str, str, Sequence[str]]]) -> tuple[str, ...]:
    """`(channel, chat, agents)` triples as the header's route lines."""
    return tuple(
        f"{channel if chat == channel else f'{channel} {chat}'}: {', '.join(agents)}"
        for channel, chat, agents in routes
    )
