"""Rendering a `CardView` as a Feishu interactive card (card JSON 2.0), pure functions.

The card has a header (agent id, state as subtitle, a template colour per state), the
automatic slot as plain text (never interpreted, so agent-written text cannot inject
markup), a divider, and the programmable body as a card `markdown` element.

Feishu's card Markdown is not CommonMark: it interprets some HTML-like tags (`<at id=all>`
mentions everyone, `<font>`, `<text_tag>`, ...), wants `http(s)` links, shows images only by
uploaded `img_key`, and renders `#` headings large (older clients not at all). So the body
is converted line by line: headings become bold lines, `& < >` become entities outside code
(only a clean ```` ``` ```` fence counts as code; `~~~` and other fence-like lines are text),
a mention tag inside code gets a zero-width space, images become links, and a fenced code block
left open by a cut is closed.

Size: Feishu rejects a card whose request content exceeds 30 KB (code 230025). We measure
the card exactly as it travels: the compact JSON string, escaped once more inside the
request body, in UTF-8 bytes (`card_request_bytes`), and shrink with `fit_view`. A text
message (notices, command replies) may be at most 150 KB, measured the same way; a longer
one (`/taskcard` in a chat following thousands of agents) is cut with a marker.
"""

from __future__ import annotations

import bisect
import html
import json
import re
from collections.abc import Mapping
from typing import Any

from taskcard.channels.base import (
    BOARD_HIDDEN_NOTICE,
    BOARD_TITLE,
    BODY_CUT_MARKER,
    SOURCE_BUDGET_FACTOR,
    AgentState,
    BoardView,
    CardView,
    Outgoing,
    board_line_parts,
    board_omitted_text,
    fit_view,
    precut_body,
    web_link,
)

CARD_LIMIT_BYTES = 30 * 1024
# Headroom under the documented bound for the rest of the request body (msg_type, ids).
CARD_BUDGET_BYTES = CARD_LIMIT_BYTES - 512

TEXT_LIMIT_BYTES = 150 * 1024
TEXT_BUDGET_BYTES = TEXT_LIMIT_BYTES - 512
TEXT_CUT_MARKER = "…"

HIDDEN_NOTICE = "Task card hidden in this chat. Send /taskcard on to show it again."

STATE_TEMPLATE: dict[AgentState, str] = {
    "running": "blue",
    "idle": "green",
    "waiting": "orange",
    "exited": "grey",
    "no output": "red",
    "at prompt": "blue",
    "unknown": "grey",
}

_HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
# The only code fences trusted to stay code: exactly three backticks (at most three spaces in),
# an opener with at most a plain language word, a closer with nothing after it. Any other
# fence-like line (`~~~`, four backticks, an opener with an info string) is text to Feishu's
# parser as far as we can tell, so it and what follows it are escaped.
_OPEN_FENCE = re.compile(r"^ {0,3}```[A-Za-z0-9_+.#-]*[ \t]*$")
_CLOSE_FENCE = re.compile(r"^ {0,3}```[ \t]*$")
_FENCE_LIKE = re.compile(r"^\s*(`{3,}|~{3,})")
_IMAGE = re.compile(r"!\[([^\]]*)\]\(([^)\s]*)\)")
_QUOTE_PREFIX = re.compile(r"^(\s{0,3}(?:>\s?)+)")
# A Markdown link: `[words](target)` or `[words](<target>)`, a target with one level of
# parentheses (`javascript:f(1)`), an optional title.
_LINK = re.compile(
    r"\[([^\[\]]*)\]\(\s*(<[^<>\n]*>|(?:[^()\s]|\([^()\s]*\))*)"
    r"(?:\s+(?:\"[^\"]*\"|'[^']*'|\([^()]*\)))?\s*\)"
)
_INLINE_CODE = re.compile(r"(`+)(.+?)\1")
# What is left of a link to anything but a web address, once escaped.
_NON_WEB_TARGET = re.compile(r"\]\((?!\s*(?:&lt;)?\s*https?://)", re.IGNORECASE)


def _escape_entities(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


# A mention tag (`<at id=all>`, `</at>`), however spaced or cased.
_AT_TAG = re.compile(r"<(?=\s*/?\s*at\b)", re.IGNORECASE)


def _defuse_tags(code_line: str) -> str:
    return _AT_TAG.sub("<\u200b", code_line)


def _image_to_link(match: re.Match[str]) -> str:
    alt, url = match.group(1), match.group(2)
    if url.startswith(("http://", "https://")):
        return f"[{alt or url}]({url})"
    return alt


def _link_or_words(match: re.Match[str]) -> str:
    return match.group() if web_link(match.group(2).strip().lstrip("<")) else match.group(1)


# What CommonMark reads as one character outside code: a character reference (`&amp;`,
# `&#42;`, `&#x1F600;`) or a backslash before ASCII punctuation (`\*`).
_LITERAL = re.compile(
    r"&(?:#[0-9]{1,7}|#[xX][0-9A-Fa-f]{1,6}|[A-Za-z][A-Za-z0-9]{0,31});"
    r"|\\[!-/:-@\[-`{-~]"
)
# Characters Feishu card Markdown may read as markup (`& < >` written as usual).
_MARKUP = frozenset("*_~`[]()#|\\!")


def _literal(match: re.Match[str]) -> str:
    """The one character `match` stands for, written so that Feishu shows it as it is: a
    character reference for markup, white space and control characters; an unknown
    reference (`&nosuch;`) stays as typed, as in CommonMark."""
    token = match.group()
    char = token[1] if token[0] == "\\" else html.unescape(token)
    if char == token:
        return _escape_entities(token)
    if len(char) != 1 or char in _MARKUP or not char.isprintable():
        return "".join(f"&#{ord(c)};" for c in char)
    return _escape_entities(char)


def _escape_literals(text: str) -> str:
    """`_escape_entities` of `text`, its character references and backslash escapes read as
    the one character each stands for, as on Telegram: `&amp;` shows `&`, not `&amp;`."""
    if "&" not in text and "\\" not in text:
        return _escape_entities(text)
    out: list[str] = []
    last = 0
    for match in _LITERAL.finditer(text):
        out += [_escape_entities(text[last : match.start()]), _literal(match)]
        last = match.end()
    out.append(_escape_entities(text[last:]))
    return "".join(out)


def _escaped_text(text: str) -> str:
    """Text of a line outside inline code, escaped: each link whose target is not a web
    address (see `web_link`) replaced by its words, as on Telegram; a link form the pattern
    does not take (a target nested deeper) gets its `(` as a character reference, so it shows
    as typed and opens nothing."""
    if "](" in text:
        text = _LINK.sub(_link_or_words, text)
    return _NON_WEB_TARGET.sub("]&#40;", _escape_literals(text))


def _converted_text(text: str) -> str:
    """A line's text (after any heading or quote marker) in Feishu card Markdown: images as
    links, links only to web addresses, `& < >` escaped, character references and backslash
    escapes read (see `_escape_literals`); inline code spans as written."""
    text = _IMAGE.sub(_image_to_link, text)
    if "](" not in text and "&" not in text and "\\" not in text:
        return _escape_entities(text)
    parts = _INLINE_CODE.split(text)  # text, then each code span's backticks and its text
    out = [_escaped_text(parts[0])]
    for index in range(1, len(parts), 3):
        ticks, code, after = parts[index : index + 3]
        out += [ticks, _escape_entities(code), ticks, _escaped_text(after)]
    return "".join(out)


def _convert_line(line: str) -> str:
    heading = _HEADING.match(line)
    if heading is not None:
        title = heading.group(2)
        return f"**{_converted_text(title)}**" if title else ""
    quote = _QUOTE_PREFIX.match(line)
    prefix = quote.group(1) if quote is not None else ""
    return prefix + _converted_text(line[len(prefix) :])


def feishu_markdown(body: str) -> str:
    """Convert agent Markdown into Feishu card Markdown (see the module docstring).

    Only lines between a clean ```` ``` ```` opener and its clean closer are left as code; an
    ambiguous fence-like line inside a block ends the block first. Even in code a mention tag
    gets a zero-width space after its `<`: should a parser read the fences differently,
    `<at id=all>` there still mentions no one, and it looks the same in code.
    """
    out: list[str] = []
    in_code = False
    for line in body.split("\n"):
        in_code = _convert_next(line, in_code, out)
    if in_code:
        out.append("```")
    return "\n".join(out)


def _convert_next(line: str, in_code: bool, out: list[str]) -> bool:
    """Append to `out` what the next `line` of a body becomes (see `feishu_markdown`), given
    whether a code block is open before it; return whether one is open after it."""
    if in_code:
        if _CLOSE_FENCE.match(line):
            out.append(line)
            return False
        if not _FENCE_LIKE.match(line):
            out.append(_defuse_tags(line))
            return True
        out.append("```")  # ambiguous: close here, then the line is text
    if _OPEN_FENCE.match(line):
        out.append(line)
        return True
    out.append(_convert_line(line))
    return False


class _Prefixes:
    """`feishu_markdown` of `body` and of its prefixes, each line converted once.

    The conversion goes line by line, a line's result depending only on whether a code block
    is open before it: a prefix is the converted lines before its last one, that last line
    (cut) converted, and a fence closing a block the cut left open. Fitting a card measures
    a dozen prefixes of one body; this keeps that one conversion of the body."""

    def __init__(self, body: str) -> None:
        self._body = body
        self._out: list[str] = []
        # Per line: where it starts in `body`, its first output in `_out`, and whether a code
        # block is open before it.
        self._starts: list[int] = []
        self._firsts: list[int] = []
        self._in_code: list[bool] = []
        in_code, start = False, 0
        for line in body.split("\n"):
            self._starts.append(start)
            self._firsts.append(len(self._out))
            self._in_code.append(in_code)
            in_code = _convert_next(line, in_code, self._out)
            start += len(line) + 1

    def markdown(self, prefix: str) -> str:
        """`feishu_markdown(prefix)`, for `prefix` a prefix of the body."""
        if not self._body.startswith(prefix):
            return feishu_markdown(prefix)
        index = bisect.bisect_right(self._starts, len(prefix)) - 1  # the line the cut is in
        start = self._starts[index]
        out = self._out[: self._firsts[index]]
        in_code = _convert_next(self._body[start : len(prefix)], self._in_code[index], out)
        if in_code:
            out.append("```")
        return "\n".join(out)


def _plain(content: str, *, notation: bool = False) -> dict[str, Any]:
    text: dict[str, Any] = {"tag": "plain_text", "content": content}
    if notation:
        text["text_size"] = "notation"
        text["text_color"] = "grey"
    return {"tag": "div", "text": text}


def card_json(view: CardView, markdown: str | None = None) -> dict[str, Any]:
    """The card JSON 2.0 document for `view` (no fitting: see `render_card`); `markdown`:
    `view.body` already converted by `feishu_markdown`."""
    template = "grey" if view.hidden else STATE_TEMPLATE.get(view.state, "grey")
    header = {
        "title": {"tag": "plain_text", "content": view.agent_id},
        "subtitle": {"tag": "plain_text", "content": "hidden" if view.hidden else view.state},
        "template": template,
    }
    elements: list[dict[str, Any]] = []
    if view.hidden:
        elements.append(_plain(HIDDEN_NOTICE))
    else:
        if view.auto_rows:
            elements.append(_plain("\n".join(view.auto_rows)))
        if view.body_note:
            elements.append(_plain(view.body_note, notation=True))
        if view.body is not None or view.body_cut:
            elements.append({"tag": "hr"})
            if markdown is None:
                markdown = feishu_markdown(view.body or "")
            if view.body_cut:
                markdown += _escape_entities(BODY_CUT_MARKER)
            elements.append({"tag": "markdown", "content": markdown})
    if not elements:
        elements.append(_plain(view.state))
    return {
        "schema": "2.0",
        "config": {"update_multi": True},
        "header": header,
        "body": {"elements": elements},
    }


def card_content(card: dict[str, Any]) -> str:
    """The `content` field of a create or patch request: the card as compact JSON."""
    return json.dumps(card, ensure_ascii=False, separators=(",", ":"))


def card_request_bytes(content: str) -> int:
    """Bytes the card takes inside the request body (escaped once more as a JSON string)."""
    return len(json.dumps(content, ensure_ascii=False).encode("utf-8"))


def card_plain_text(card: Mapping[str, Any]) -> str:
    """What a card shows, as plain text: "title · subtitle", then each element's text.

    `Outgoing.text` of a card is defined as this function of the card itself, so a reader
    of the chat (a test fake, the console) can compare what is shown with what was sent.
    """
    header = card.get("header")
    lines: list[str] = []
    if isinstance(header, Mapping):
        title = _text_of(header.get("title"))
        subtitle = _text_of(header.get("subtitle"))
        lines.append(f"{title} · {subtitle}" if subtitle else title)
    body = card.get("body")
    elements = body.get("elements") if isinstance(body, Mapping) else None
    for element in elements if isinstance(elements, list) else []:
        if not isinstance(element, Mapping):
            continue
        if element.get("tag") == "markdown":
            lines.append(html.unescape(str(element.get("content", ""))))
        elif element.get("tag") == "hr":
            lines.append("")
        else:
            lines.append(_text_of(element.get("text")))
    return "\n".join(lines)


def _text_of(node: object) -> str:
    if isinstance(node, Mapping):
        return str(node.get("content", ""))
    return ""


def render_card(view: CardView, limit_bytes: int = CARD_BUDGET_BYTES) -> Outgoing:
    """The interactive message for `view`, shrunk until it fits `limit_bytes` (the body is
    converted once however many of its cuts are measured: see `_Prefixes`; a hidden card's
    body not at all, see `CardView.shown_part`)."""
    view = precut_body(view.shown_part(), limit_bytes * SOURCE_BUDGET_FACTOR)
    prefixes = _Prefixes(view.body or "")

    def converted(candidate: CardView) -> dict[str, Any]:
        body = candidate.body
        return card_json(candidate, None if body is None else prefixes.markdown(body))

    def size(candidate: CardView) -> int:
        return card_request_bytes(card_content(converted(candidate)))

    fitted = converted(fit_view(view, size, limit_bytes))
    content = card_content(fitted)
    return Outgoing.build(card_plain_text(fitted), {"msg_type": "interactive", "content": content})


# Characters Feishu card Markdown may read as markup, written as character references so an
# agent's text shows as typed (`&`, `<`, `>` first of all: `<at id=all>` mentions everyone).
_BOARD_ESCAPES = str.maketrans(
    {c: f"&#{ord(c)};" for c in "&<>*_~`[]()#|\\!"},
)


def board_markdown_text(text: str) -> str:
    """Agent-written text for a board line in card Markdown: shown as typed, never markup."""
    return text.translate(_BOARD_ESCAPES)


def board_card_json(view: BoardView) -> dict[str, Any]:
    """The board as a card: the summary as subtitle, one Markdown line per agent with its
    agent and state in bold, the cut count in grey; orange while an agent needs people."""
    header: dict[str, Any] = {
        "title": {"tag": "plain_text", "content": BOARD_TITLE},
        "subtitle": {"tag": "plain_text", "content": "hidden" if view.hidden else view.summary},
        "template": "grey" if view.hidden else ("orange" if view.attention else "blue"),
    }
    elements: list[dict[str, Any]] = []
    if view.hidden:
        elements.append(_plain(BOARD_HIDDEN_NOTICE))
    else:
        rows = []
        for line in view.lines:
            lead, rest = board_line_parts(line)
            rows.append(f"**{board_markdown_text(lead)}**{board_markdown_text(rest)}")
        if rows:
            elements.append({"tag": "markdown", "content": "\n".join(rows)})
        if view.omitted:
            elements.append(_plain(board_omitted_text(view.omitted), notation=True))
        if not elements:
            # A board without lines (one retired for cards) says its summary once, in the
            # body, as Telegram's one-line board does, not again as the subtitle.
            del header["subtitle"]
            elements.append(_plain(view.summary))
    return {
        "schema": "2.0",
        "config": {"update_multi": True},
        "header": header,
        "body": {"elements": elements},
    }


def board_fits(view: BoardView, limit_bytes: int = CARD_BUDGET_BYTES) -> bool:
    return card_request_bytes(card_content(board_card_json(view))) <= limit_bytes


def render_board(view: BoardView) -> Outgoing:
    """The board card (`fit_board` has cut it to `CARD_BUDGET_BYTES` beforehand)."""
    board = board_card_json(view)
    content = card_content(board)
    return Outgoing.build(card_plain_text(board), {"msg_type": "interactive", "content": content})


# A Feishu text message shows `[words](https://...)` as a link under the words alone.
_TEXT_LINK = re.compile(r"\[([^\[\]\n]*)\](?=\s*\()")
_LINK_CLOSE = re.compile(r"\](?=\s*\()")  # what is left: `[a\]b](url)`, nested brackets


def text_message_safe(text: str) -> str:
    """`text` fit for a Feishu text message, which reads `<at user_id="all">` as a mention of
    everyone and has no escape for it: angle brackets become full-width look-alikes. It also
    reads `[words](url)` as a link that shows only the words (an agent's report summary could
    dress any address as anything): the brackets of such a link become full-width too, so it
    shows as typed, address and all, as on Telegram."""
    text = text.replace("<", "\uff1c").replace(">", "\uff1e")
    if "]" not in text:
        return text
    return _LINK_CLOSE.sub("\uff3d", _TEXT_LINK.sub("\uff3b\\1\uff3d", text))


def _text_content(text: str) -> str:
    return json.dumps({"text": text}, ensure_ascii=False)


def render_text(text: str, limit_bytes: int = TEXT_BUDGET_BYTES) -> Outgoing:
    """A plain text message (notices and command replies); no tag in it takes effect. Cut
    with a marker to fit `limit_bytes` as it travels, as Telegram's replies are cut to fit."""
    text = text_message_safe(text)
    if card_request_bytes(_text_content(text)) > limit_bytes:
        fits, too_long = 0, len(text)  # the longest prefix that fits with the marker
        while too_long - fits > 1:
            middle = (fits + too_long) // 2
            cut = text[:middle].rstrip() + TEXT_CUT_MARKER
            if card_request_bytes(_text_content(cut)) <= limit_bytes:
                fits = middle
            else:
                too_long = middle
        text = text[:fits].rstrip() + TEXT_CUT_MARKER
    return Outgoing.build(text, {"msg_type": "text", "content": _text_content(text)})
