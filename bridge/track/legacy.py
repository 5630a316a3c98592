"""The legacy card format: a `{title, lines, footer}` JSON frame read as Markdown.

The older Telegram renderer contract printed this JSON object instead of Markdown. Reading it
is part of reading the card format (what the body file means), so it lives with the monitor
that reads that file; anything that is not exactly such a frame is shown verbatim.
"""

from __future__ import annotations

from codecs import BOM_UTF8 as _BOM
from typing import Any, Final

from taskcard.producers.task_card.contract import parse_json

MAX_LINES: Final = 20
"""The older manual's cap on `lines`. A frame with more is still shown (refusing it would hide
the whole card over one line too many), but as its first MAX_LINES lines and a count of the
rest, so a chat never gets a wall of text and never a silently shortened one."""


def _escape_markdown(text: str) -> str:
    """Show legacy plain-text fields literally inside Markdown."""
    for char in ("\\", "`", "*", "_", "[", "]"):
        text = text.replace(char, "\\" + char)
    return text


def legacy_json_to_markdown(text: str) -> str | None:
    """A `{title, lines, footer}` renderer frame as Markdown, or None when `text` is not one.

    Shown as a card: the title in bold, the lines as they are (the first `MAX_LINES`, then
    how many more there were), the footer in italics.
    """
    stripped = text.strip()
    if not stripped.startswith("{"):
        return None
    data: Any = parse_json(stripped)
    if not isinstance(data, dict) or not data or not set(data) <= {"title", "lines", "footer"}:
        return None
    title, lines, footer = data.get("title"), data.get("lines"), data.get("footer")
    if title is not None and not isinstance(title, str):
        return None
    if footer is not None and not isinstance(footer, str):
        return None
    if lines is not None and not (
        isinstance(lines, list) and all(isinstance(line, str) for line in lines)
    ):
        return None
    if not any(text.strip() for text in (title or "", footer or "", *(lines or []))):
        return None
    parts: list[str] = []
    if title and title.strip():
        parts.append(f"**{_escape_markdown(title.strip())}**")
    shown = (lines or [])[:MAX_LINES]
    parts.extend(_escape_markdown(line) for line in shown)
    hidden = len(lines or []) - len(shown)
    if hidden:
        parts.append(f"_… {hidden} more line{'s' if hidden > 1 else ''} not shown_")
    if footer and footer.strip():
        parts.append(f"_{_escape_markdown(footer.strip())}_")
    return "\n".join(parts)


def body_markdown(raw: bytes) -> str:
    """The body bytes as Markdown: the legacy JSON frame converted, anything else verbatim.

    A byte-order mark at the start (a renderer that writes UTF-8 "with signature") marks the
    encoding, not text: kept, it made the first line's `#` heading and a legacy frame's `{`
    read as plain text."""
    # What the "utf-8-sig" codec does, without its decoder's Python frame on every change.
    text = (raw[3:] if raw.startswith(_BOM) else raw).decode("utf-8", errors="replace")
    return legacy_json_to_markdown(text) or text
