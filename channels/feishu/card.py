"""Rendering a `CardView` as a Feishu interactive card (card JSON 2.0), pure functions.

The card has a header (agent id, state as subtitle, a template colour per state), the
automatic slot as plain text (never interpreted, so agent-written text cannot inject
markup), a divider, and the programmable body as a card `markdown` element.

Feishu's card Markdown is not CommonMark: it interprets some HTML-like tags (`<at id=all>`
mentions everyone, `<font>`, `<text_tag>`, ...), wants `http(s)` links, shows images only by
uploaded `img_key`, and renders `#` headings large (older clients not at all). So the body
is converted line by line: headings become bold lines, `& < >` become entities outside code,
a mention tag inside code gets a zero-width space, images become links. Code blocks are where
CommonMark (Telegram's reading) finds them (`_code_lines`): fenced with backticks or tildes,
with an info string or none, left open, indented, in a list or a quote; each is written with
the one fence Feishu surely keeps as code (three backticks and at most a plain language word,
the same word Telegram is given: `channels.base.code_language`), closed where CommonMark
ends it or where a cut does. A block in a quote or a list item keeps its `& < >` escaped in
its code: Feishu documents fences only at the start of a line (see `_CodeLine.nested`).

Emphasis is read first, once, by the CommonMark parser Telegram's converter uses (pyromark,
with the same extensions), and written back so that Feishu's parser cannot read it another
way (`_style_edits`): each bold, italic and strikethrough span CommonMark found is marked
`**`, `*` or `~~` (a span inside one of its own kind shows no differently and is left
unmarked), and every `*`, `_` or `~` CommonMark left as text becomes a character reference.
Overlapping marks (`**bold _both** italic_`, `~~a **b~~ c**`) then show on both platforms
as CommonMark reads them: the first span styled, the other marks as typed.

Size: Feishu rejects a card whose request content exceeds 30 KB (code 230025). We measure
the card exactly as it travels: the compact JSON string, escaped once more inside the
request body, in UTF-8 bytes (`card_request_bytes`), and shrink with `fit_view`. A text
message (notices, command replies) may be at most 150 KB, measured the same way; a longer
one (`/taskcard` in a chat following thousands of agents) is cut with a marker.
"""

from __future__ import annotations

import bisect
import html
import itertools
import json
import re
import threading
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal, NamedTuple

import pyromark

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
    code_language,
    fit_view,
    may_hold_maths,
    precut_body,
    task_boxes_as_text,
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
# Where a code block is, CommonMark decides (the reading Telegram's converter makes): fenced
# with backticks or tildes, of any length, with or without an info string, closed or left
# open, or indented. Each is written for Feishu in the one form trusted to stay code there:
# exactly three backticks, an opener with at most a plain language word, a closer with
# nothing after it. A line that would look like a fence to Feishu without being one to
# CommonMark (inside a block, or as text) gets its first mark made harmless, so Feishu never
# opens or closes a block where CommonMark does not.
# A line Feishu might take for a fence: a run of three marks after nothing but white space,
# quote marks or a list item's marker (`> ```` inside a code block, `- ~~~` as text).
_FENCE_LIKE = re.compile(r"^[\s>]*(?:(?:[-+*]|\d{1,9}[.)])[\s>]*)?(`{3,}|~{3,})")
_FENCE_RUN = re.compile(r"`{3,}|~{3,}")
_IMAGE = re.compile(r"!\[([^\]]*)\]\(([^)\s]*)\)")
_QUOTE_PREFIX = re.compile(r"^(\s{0,3}(?:>\s?)+)")
# A Markdown link: `[words](target)` or `[words](<target>)`, a target with one level of
# parentheses (`javascript:f(1)`), an optional title.
_LINK = re.compile(
    r"\[([^\[\]]*)\]\(\s*(<[^<>\n]*>|(?:[^()\s]|\([^()\s]*\))*)"
    r"(?:\s+(?:\"[^\"]*\"|'[^']*'|\([^()]*\)))?\s*\)"
)
_BACKTICKS = re.compile(r"`+")
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


def _code_span_parts(text: str) -> list[str]:
    """`text` cut at its inline code spans as CommonMark finds them on one line: the text
    before each, its backticks, its code, and the text after the last. A run of backticks
    opens a span that the next run of as many closes; a run with no such run after it is
    text, and so is a backtick escaped with a backslash outside code (`\\``), as on
    Telegram. Linear: each run is looked at once as an opening and once as a closing."""
    runs = [run.span() for run in _BACKTICKS.finditer(text)]
    # Per length, the indexes of the runs of that length, the last one first (popped from
    # the end as the scan passes them).
    ahead: dict[int, list[int]] = {}
    for index in range(len(runs) - 1, -1, -1):
        ahead.setdefault(runs[index][1] - runs[index][0], []).append(index)
    parts: list[str] = []
    start = 0  # where the current text part starts
    index = 0
    while index < len(runs):
        opening, after = runs[index]
        index += 1
        if opening < start:
            continue  # inside the code span just closed
        slash = opening
        while slash > start and text[slash - 1] == "\\":
            slash -= 1
        if (opening - slash) % 2:  # its first backtick is escaped
            opening += 1
        candidates = ahead.get(after - opening, [])
        while candidates and candidates[-1] < index:
            candidates.pop()
        if opening == after or not candidates:
            continue
        closing = candidates.pop()
        parts += [text[start:opening], text[opening:after], text[after : runs[closing][0]]]
        start = runs[closing][1]
        index = closing + 1
    parts.append(text[start:])
    return parts


def _converted_text(text: str) -> str:
    """A line's text (after any heading or quote marker) in Feishu card Markdown: images as
    links, links only to web addresses, `& < >` escaped, character references and backslash
    escapes read (see `_escape_literals`); inline code spans as written."""
    text = _IMAGE.sub(_image_to_link, text)
    if "](" not in text and "&" not in text and "\\" not in text:
        return _escape_entities(text)
    parts = _code_span_parts(text)  # text, then each code span's backticks and its text
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


# How Telegram's converter (telegramify-markdown) parses a body: the same reading of
# emphasis here (tests/channels/test_overlapping_styles.py checks the two stay equal).
PARSE_OPTIONS = (
    pyromark.Options.ENABLE_TABLES
    | pyromark.Options.ENABLE_STRIKETHROUGH
    | pyromark.Options.ENABLE_TASKLISTS
    | pyromark.Options.ENABLE_MATH
)
_STYLE_MARKS = {"Emphasis": "*", "Strong": "**", "Strikethrough": "~~"}
_DELIMITERS = frozenset("*_~")
_DELIMITER = re.compile(r"[*_~]")
_DELIMITER_REFS = {"*": "&#42;", "_": "&#95;", "~": "&#126;"}
# Private-use characters: one absent from the body stands for each delimiter reference while
# lines are converted (see `_delimiter_marks`).
_PLACEHOLDERS = (range(0xE000, 0xF900), range(0xF0000, 0xFFFFE), range(0x100000, 0x10FFFE))
# Blocks whose text CommonMark shows as written (code, raw HTML): no emphasis to read there.
_VERBATIM_BLOCKS = frozenset({"CodeBlock", "HtmlBlock", "MetadataBlock"})
# (start, end, replacement) in characters of the body: one delimiter run or character each.
Edit = tuple[int, int, str]


@dataclass(frozen=True)
class _Span:
    """One bold, italic or strikethrough span CommonMark found: its opening marks end at
    `content`, its closing marks are `closing`..`end`; `mark` is how it is written back."""

    start: int
    content: int
    closing: int
    end: int
    mark: str


@dataclass(frozen=True)
class _Styles:
    """How a body's emphasis is written for Feishu: the edits in order, and the spans; a
    delimiter left as text is written as a placeholder, which `restored` makes its reference."""

    edits: list[Edit]
    spans: list[_Span]
    placeholders: dict[str, str]
    # Where an `_` inside a word was left as typed: written as a reference should a cut leave
    # it last (then it is inside no word).
    in_word: set[int] = field(default_factory=set)
    # The events of the code blocks met on the way (their starts, texts and ends), so that
    # `_code_lines` need not walk every event again; None when the events were not walked.
    code_events: list[Located] | None = None

    def restored(self, converted: str) -> str:
        """`converted` with each placeholder written as the reference it stands for."""
        for placeholder, reference in self.placeholders.items():
            if placeholder in converted:
                converted = converted.replace(placeholder, reference)
        return converted


def _delimiter_marks(body: str) -> dict[str, str]:
    """What each delimiter CommonMark left as text is written as while the lines are
    converted: a private-use character `body` does not contain, so that the conversion passes
    it through instead of reading a reference (`_escape_literals`) thousands of times; the
    reference itself in the unlikely case that every such character is in `body`."""
    free = [chr(code) for code in range(0xE000, 0xE008) if chr(code) not in body]
    if len(free) < len(_DELIMITER_REFS):
        present = set(body)
        candidates = (chr(code) for code in itertools.chain(*_PLACEHOLDERS))
        free = list(itertools.islice((c for c in candidates if c not in present), 3))
    if len(free) < len(_DELIMITER_REFS):
        return dict(_DELIMITER_REFS)
    return dict(zip(_DELIMITER_REFS, free, strict=False))


def _tag(value: object) -> str:
    """The name of a parser event's tag: `"Strong"`, or the key of `{"CodeBlock": ...}`."""
    if isinstance(value, dict):
        return str(next(iter(value), ""))
    return value if isinstance(value, str) else ""


# Bytes that begin a character in UTF-8 (1) or continue one (0).
_CHARACTER_STARTS = bytes(0 if 0x80 <= byte < 0xC0 else 1 for byte in range(256))


def _char_offsets(body: str) -> list[int] | None:
    """The character offset of each UTF-8 byte offset of `body` (None: ASCII, the same)."""
    if body.isascii():
        return None
    starts = body.encode("utf-8").translate(_CHARACTER_STARTS)
    return [0, *itertools.accumulate(starts)]


_WHITE = re.compile(r"\s")


def _address_spans(body: str) -> list[tuple[int, int]]:
    """Where `body` has web addresses written as text (`https://host/~me/a_b`): the words
    around each `://` and those starting `www.`, which a character reference would break.
    Each character is looked at a bounded number of times, however long a word is."""
    spans: list[tuple[int, int]] = []
    for marker in ("://", "www."):
        at = body.find(marker)
        while at >= 0:
            if marker == "www." and at > 0 and not body[at - 1].isspace():
                at = body.find(marker, at + 1)
                continue
            start = max(body.rfind(space, 0, at) for space in (" ", "\n", "\t")) + 1
            after = _WHITE.search(body, at)
            end = len(body) if after is None else after.start()
            spans.append((start, end))
            at = body.find(marker, end)
    return sorted(spans)


def _in_word(body: str, at: int) -> bool:
    """Whether `body[at]` has a letter or digit on either side (`snake_case`): an `_` there is
    never emphasis, and stays as typed."""
    return 0 < at < len(body) - 1 and body[at - 1 : at + 2 : 2].isalnum()


def _in_address(at: int, addresses: list[tuple[int, int]]) -> bool:
    """Whether `at` is in one of `addresses` (see `_address_spans`): a reference would break it."""
    if not addresses:
        return False
    index = bisect.bisect_right(addresses, (at + 1, 0)) - 1
    return index >= 0 and addresses[index][0] <= at < addresses[index][1]


_STRIKETHROUGH = {"Start": "Strikethrough"}


def _may_hold_single_tilde(text: str) -> bool:
    """Whether `text` has a single `~` (also one a backslash splits off a run: `\\~~`), which
    may be strikethrough that Telegram's converter reads as text. Each run of `~` is looked
    at once (a regex with lookarounds tried every character: 15 µs for a typical card)."""
    at = text.find("~")
    while at >= 0:
        if at > 0 and text[at - 1] == "\\":
            return True
        end = at + 1
        while text[end : end + 1] == "~":
            end += 1
        if end == at + 1:
            return True
        at = text.find("~", end)
    return False


# An event and where it is in the body, in characters.
Located = tuple[object, int, int]


def _parse_located(text: str) -> tuple[list[Any], list[int] | None] | None:
    """`text`'s events with their byte ranges, and its character offsets (None when bytes
    and characters are the same), or None when the parser refuses it (a lone surrogate)."""
    try:
        events = list(pyromark.events_with_range(text, options=PARSE_OPTIONS))
    except ValueError:
        return None
    return events, _char_offsets(text)


def _telegram_reading(body: str) -> list[Located] | None:
    """`body` parsed as Telegram's converter reads it, or None when no parser takes it.

    Marks the extensions allow are read as text by escaping them and parsing again until
    none is left: strikethrough with a single `~` (it means "about"; telegramify-markdown
    does this itself) and maths (`$x$`, `$$x$$`: the Telegram renderer escapes it before the
    conversion, as agents write `$` for shell and money). The same here, with each event's
    place mapped back to `body` past the backslashes added."""
    text = body
    added: list[int] = []  # where backslashes were added, in characters of `text`
    # Maths first, until none is left, then single tildes, in the order Telegram's renderer
    # and its converter escape them: a tilde read while maths around it are still maths may
    # pair otherwise. Without either (the usual case), one parse.
    maths_done = False
    parsed = _parse_located(text)
    if parsed is None:  # a lone surrogate: written as it is
        return None
    events, chars = parsed
    while True:
        maths_done = maths_done or not may_hold_maths(text)
        if maths_done and not _may_hold_single_tilde(text):
            break

        def char_at(offset: int, chars: list[int] | None = chars) -> int:
            return offset if chars is None else chars[offset]

        source = text.encode()
        literal: list[int] = []
        for event, span in events:
            start, end = span["start"], span["end"]
            if maths_done:
                if event == _STRIKETHROUGH and source[start + 1 : start + 2] != b"~":
                    literal += (char_at(start), char_at(end - 1))
            elif isinstance(event, dict) and ("InlineMath" in event or "DisplayMath" in event):
                # Maths, read as text on both channels (see the Telegram renderer's
                # `_math_as_text`): its `$` marks escaped.
                width = 2 if "DisplayMath" in event else 1
                literal += (
                    char_at(at) for at in (*range(start, start + width), *range(end - width, end))
                )
        if not literal:
            if maths_done:
                break
            maths_done = True  # the same events, read for tildes now
            continue
        places = sorted(literal)
        added = sorted(
            [at + bisect.bisect_right(places, at) for at in added]
            + [at + index for index, at in enumerate(places)]
        )
        text = "\\".join(text[a:b] for a, b in itertools.pairwise([0, *places, len(text)]))
        parsed = _parse_located(text)
        if parsed is None:
            return None
        events, chars = parsed

    if not added:  # the usual case: only bytes to count as characters
        if chars is None:
            return [(event, span["start"], span["end"]) for event, span in events]
        offsets = chars
        return [(event, offsets[span["start"]], offsets[span["end"]]) for event, span in events]

    # Where each character of `text` (and its end) is in `body`: less the backslashes added
    # before it, looked up in one table rather than searched for at every event.
    edges = itertools.pairwise([0, *(at + 1 for at in added), len(text) + 1])
    in_body = list(
        itertools.chain.from_iterable(
            range(start - count, end - count) for count, (start, end) in enumerate(edges)
        )
    )
    if chars is None:
        return [(event, in_body[span["start"]], in_body[span["end"]]) for event, span in events]
    return [
        (event, in_body[chars[span["start"]]], in_body[chars[span["end"]]])
        for event, span in events
    ]


def _style_edits(body: str, reading: list[Located] | None = None) -> _Styles:
    """The edits that write `body`'s emphasis as CommonMark reads it (see the module
    docstring), in order; none inside code or raw HTML, none across a line. `reading`: the
    body already parsed (`_telegram_reading`)."""
    if not any(char in body for char in _DELIMITERS):
        return _Styles([], [], {})
    events = reading if reading is not None else _telegram_reading(body)
    if events is None:
        return _Styles([], [], {})
    marks = _delimiter_marks(body)
    code_events: list[Located] = []
    styles = _Styles(
        [], [], {mark: _DELIMITER_REFS[char] for char, mark in marks.items()}, set(), code_events
    )
    addresses: list[tuple[int, int]] | None = None
    edits = styles.edits
    # Open spans: [kind, start, end, where its content starts (None until seen), unmarked].
    spans: list[list[Any]] = []
    opened = False  # a span opened by the event before: its content starts at this one
    verbatim = 0
    previous_end = 0
    for event, start, end in events:
        if opened:
            spans[-1][3], opened = start, False
        if type(event) is not dict:  # a break, a rule, ...: nothing to read
            previous_end = end
            continue
        if "Text" in event:
            if verbatim:
                code_events.append((event, start, end))
            else:
                for found in _DELIMITER.finditer(body, start, end):
                    at = found.start()
                    if at == start and at > 0 and body[at - 1] == "\\":
                        continue  # written `\*`: read as a character by `_escape_literals`
                    if addresses is None:
                        addresses = _address_spans(body)
                    if _in_address(at, addresses):
                        continue
                    if found.group() == "_" and _in_word(body, at):
                        styles.in_word.add(at)
                    else:
                        edits.append((at, at + 1, marks[found.group()]))
        elif "Start" in event:
            tag = event["Start"]  # a name, or {name: details}: `_tag` inlined (hot loop)
            kind = tag if type(tag) is str else _tag(tag)
            if kind in _STYLE_MARKS:
                spans.append([kind, start, end, None, any(s[0] == kind for s in spans)])
                opened = True
            elif kind in _VERBATIM_BLOCKS:
                verbatim += 1
                if kind == "CodeBlock":
                    code_events.append((event, start, end))
        elif "End" in event:
            tag = event["End"]
            kind = tag if type(tag) is str else _tag(tag)
            if kind in _STYLE_MARKS and spans:
                kind, first, close_to, content, unmarked = spans.pop()
                mark = "" if unmarked else _STYLE_MARKS[kind]
                last = content if content is not None else end
                close_from = previous_end
                if (
                    set(body[first:last]) <= _DELIMITERS
                    and set(body[close_from:close_to]) <= _DELIMITERS
                ):
                    styles.spans.append(_Span(first, last, close_from, close_to, mark))
            elif kind in _VERBATIM_BLOCKS:
                verbatim -= 1
                if kind == "CodeBlock":
                    code_events.append((event, start, end))
        previous_end = end
    # Two spans of one kind, the second opening where the first closes (`*a**b*` read as
    # two), are written as one: their marks side by side would make one run of marks.
    opening = {(span.start, span.mark) for span in styles.spans if span.mark}
    joined = {span.end for span in styles.spans if (span.end, span.mark) in opening}
    for span in styles.spans:
        edits.append((span.start, span.content, "" if span.start in joined else span.mark))
        edits.append((span.closing, span.end, "" if span.end in joined else span.mark))
    edits.sort()
    return styles


def _edited(text: str, edits: list[Edit]) -> str:
    """`text` with `edits` made."""
    if not edits:
        return text
    parts: list[str] = []
    last = 0
    for start, end, replacement in edits:
        parts += [text[last:start], replacement]
        last = end
    parts.append(text[last:])
    return "".join(parts)


def feishu_markdown(body: str) -> str:
    """Convert agent Markdown into Feishu card Markdown (see the module docstring).

    Code blocks are where CommonMark finds them (see `_code_lines`), each written with clean
    triple-backtick fences. Even in code a mention tag gets a zero-width space after its `<`:
    should a parser read the fences differently, `<at id=all>` there still mentions no one,
    and it looks the same in code. A task list item's box is written as a character that
    shows whether it is ticked (`task_boxes_as_text`): card Markdown has no task lists.
    """
    body = task_boxes_as_text(body)
    reading = _reading(body)
    styles = _style_edits(body, reading)
    written = _edited(body, styles.edits)
    code = _code_lines_read(body, reading, styles)
    return styles.restored(_converted_lines(written, code))


def _reading(body: str) -> list[Located] | None:
    """`body` as Telegram's converter parses it (`_telegram_reading`), when anything in it
    needs the parse: a mark of emphasis or the start of a code block. None otherwise."""
    # The marks first: a look for one character each, quicker than one for a fence.
    if not any(char in body for char in _DELIMITERS) and not _may_hold_code(body):
        return None
    return _telegram_reading(body)


def _code_lines_read(
    body: str, reading: list[Located] | None, styles: _Styles
) -> dict[int, _CodeLine]:
    """The code blocks' lines of a body already read (`reading`, from `_reading`: None when
    the body holds neither marks nor code), from the code events the emphasis reading kept
    as it walked the events (`_Styles.code_events`) when it did."""
    if reading is None:
        return {}
    return _code_lines(body, reading if styles.code_events is None else styles.code_events)


def _converted_lines(written: str, code: dict[int, _CodeLine] | None = None) -> str:
    """`written` (emphasis already written for Feishu) converted line by line; `code`: its
    code blocks' lines (see `_code_lines`), found in `written` itself when not given."""
    if code is None:
        code = _code_lines(written)
    return "\n".join(
        _line_output(line, code.get(index)) for index, line in enumerate(written.split("\n"))
    )


# Text that may hold a code block: a fence, or indentation an indented block needs.
_CODE_SIGNS = ("```", "~~~", "    ", "\t")


def _may_hold_code(text: str) -> bool:
    return any(sign in text for sign in _CODE_SIGNS)


_FENCE_REFERENCES = {"`": "&#96;", "~": "&#126;"}


class _CodeLine(NamedTuple):
    """One line of a code block as CommonMark reads it, and what it is written as for Feishu.

    `kind`: `open` (a fenced block's opening fence), `code` (a line of its content) or
    `close` (its closing fence). `prefix`: what stands before the block on its first line (a
    quote's `>`, a list item's marker or indentation), written before the opening fence.
    `rest`: what stands before it on the lines after (`prefix` with each list marker as
    spaces of its width: `1. ` again would open a new item), written before the content of
    an indented block and before a closing fence that is added. `column`: where the
    content starts on a `code` line (-1: none of it does, as on a quote's bare `>` line).
    `first`: the line that opens an indented block (which has no fence of its own). `last`:
    the block's last line when no closing fence follows (the block was left open, or is
    indented). `fence`: the opening fence as typed (`~~~~`), which a closing one must match.
    `nested`: the block is inside a quote or a list item, or indented (anything stands before
    its first line): Feishu documents fences only at the start of a line, so whether it
    reads such a block as code is not known, and its content has `& < >` escaped as text has
    (`<font>` or a mention tag there then shows as typed whichever way Feishu reads it).
    """

    kind: Literal["open", "code", "close"]
    prefix: str
    rest: str
    language: str = ""
    column: int = -1
    first: bool = False
    last: bool = False
    indented: bool = False
    fence: str = ""
    nested: bool = False


def _code_lines(text: str, reading: list[Located] | None = None) -> dict[int, _CodeLine]:
    """The lines of `text` inside code blocks, by line index, as CommonMark reads them (the
    reading Telegram's converter makes, `reading` when given): fenced with backticks or
    tildes, closed or not, with or without an info string, indented, inside a list or a
    quote. Empty when no parser takes `text` (then every line is escaped as text)."""
    if reading is None:
        reading = _telegram_reading(text) if _may_hold_code(text) else None
        if reading is None:
            return {}
    lines: dict[int, _CodeLine] = {}
    block: tuple[int, int, int, object] | None = None
    columns: dict[int, int] = {}  # line -> where the first text of the block on it starts
    # The events come in the order of the text: the line a place is on is counted on from
    # the last place asked about (`at`, on line `line`), each newline counted once.
    at = line = 0
    for event, start, end in reading:
        if type(event) is not dict:
            continue
        if block is None:  # most events: only the start of a block matters
            tag = event.get("Start")
            if type(tag) is dict and "CodeBlock" in tag:
                line += text.count("\n", at, start)
                at = start
                block, columns = (start, end, line, tag["CodeBlock"]), {}
        elif "Text" in event:
            line += text.count("\n", at, start)
            at = max(start, end - 1)
            columns.setdefault(line, start - text.rfind("\n", 0, start) - 1)
            more = text.count("\n", start, at)  # a text running on over lines: all content
            for index in range(line + 1, line + more + 1):
                columns.setdefault(index, 0)
            line += more
        elif event.get("End") == "CodeBlock":
            last_at = max(block[0], block[1] - 1)
            line += text.count("\n", at, last_at)
            at = last_at
            _add_block(lines, text, block, line, columns)
            block = None
    return lines


def _line_at(text: str, at: int) -> str:
    """The line of `text` that `at` is on."""
    end = text.find("\n", at)
    return text[text.rfind("\n", 0, at) + 1 : len(text) if end < 0 else end]


def _add_block(
    lines: dict[int, _CodeLine],
    text: str,
    block: tuple[int, int, int, object],
    last: int,
    columns: dict[int, int],
) -> None:
    """Record in `lines` each line of one code block of `text` (see `_code_lines`): `block`
    is where it starts and ends, the line it starts on and its kind; `last`, its last line.
    (A few hundred blocks a body: the lines are made with positional fields, see `_CodeLine`.)"""
    start, end, first, kind = block
    line_start = text.rfind("\n", 0, start) + 1
    column = start - line_start
    prefix = text[line_start:start]
    if not (isinstance(kind, dict) and "Fenced" in kind):  # indented
        if prefix.endswith("    "):
            prefix = prefix[:-4]
        elif prefix.endswith("\t"):
            prefix = prefix[:-1]
        rest, nested = (_continuation(prefix), True) if prefix else ("", False)
        for index in range(first, last + 1):
            lines[index] = _CodeLine(
                "code",
                prefix,
                rest,
                "",
                columns.get(index, -1),
                index == first,
                index == last,
                True,
                "",
                nested,
            )
        return
    run = _FENCE_RUN.match(text, start)
    fence = run.group() if run is not None else "```"
    closer = closing = None
    if last > first and last not in columns:
        closing = _line_at(text, max(start, end - 1))
        closer = _FENCE_RUN.search(closing)
    closed = (
        closer is not None
        and closing is not None
        and closer.group()[0] == fence[0]
        and len(closer.group()) >= len(fence)
        and not closing[closer.end() :].strip()
    )
    content_end = last - 1 if closed else last
    rest, nested = (_continuation(prefix), True) if prefix else ("", False)
    language = code_language(str(kind["Fenced"]))
    open_last = not closed and content_end == first
    lines[first] = _CodeLine(
        "open", prefix, rest, language, -1, False, open_last, False, fence, nested
    )
    for index in range(first + 1, content_end + 1):
        at_end = not closed and index == content_end
        column = columns.get(index, -1)
        lines[index] = _CodeLine("code", prefix, rest, "", column, False, at_end, False, "", nested)
    if closed and closer is not None and closing is not None:
        lead = closing[: closer.start()]
        lines[last] = _CodeLine("close", lead, lead, "", -1, False, False, False, fence, nested)


# A list item's marker, in what stands before a code block (quote marks, markers, spaces).
_LIST_MARKER = re.compile(r"[-+*]|\d{1,9}[.)]")


def _continuation(prefix: str) -> str:
    """What stands before a code block on its lines after the first, `prefix` standing before
    it on the first: each list item's marker as spaces of its width, quote marks kept."""
    if not prefix.strip(" \t>"):
        return prefix
    return _LIST_MARKER.sub(lambda marker: " " * len(marker.group()), prefix)


# What a line Feishu might take for a fence (`_FENCE_LIKE`) can begin with.
_FENCE_LEADS = frozenset(" \t>-+*0123456789`~")


def _may_lead_to_fence(line: str) -> bool:
    first = line[:1]
    return first in _FENCE_LEADS or first.isspace()


def _line_output(line: str, code: _CodeLine | None) -> str:
    """What one line of a body becomes for Feishu: a line of a code block as `_code_output`
    writes it, any other line converted as text (see `_convert_line`), with a first mark
    that Feishu might take for a fence written as its reference."""
    if code is not None:
        return _code_output(line, code)
    converted = _convert_line(line)
    if not _may_lead_to_fence(converted):  # most lines: one look at the first character
        return converted
    # Anchored: it stops at the first character that cannot lead to a fence (`"```" in`
    # would read all of a long line: 0.25 ms for 40 K characters).
    fence = _FENCE_LIKE.match(converted)
    if fence is None:
        return converted
    at = fence.start(1)
    return converted[:at] + _FENCE_REFERENCES[converted[at]] + converted[at + 1 :]


def _code_output(line: str, code: _CodeLine) -> str:
    """A line of a code block written for Feishu (see `_CodeLine`): fences as clean triple
    backticks, content as typed but for a zero-width space that keeps a fence-like line from
    closing the block, and one after the `<` of a mention tag; in a nested block, `& < >`
    escaped instead."""
    if code.kind == "close":
        return f"{code.prefix}```"
    if code.kind == "open":
        opener = f"{code.prefix}```{code.language}"
        return f"{opener}\n{code.rest}```" if code.last else opener
    if code.column < 0:
        lead, content = (code.rest if code.indented else line), ""
    else:
        lead = code.rest if code.indented else line[: code.column]
        content = line[code.column :]
    run = _FENCE_LIKE.match(content) if _may_lead_to_fence(content) else None
    if run is not None:
        content = content[: run.start(1)] + "\u200b" + content[run.start(1) :]
    if code.nested:
        content = _escape_entities(content)
    elif "<" in content:
        content = _defuse_tags(content)
    written = lead + content
    if code.first:
        written = f"{code.prefix}```\n{written}"
    return f"{written}\n{code.rest}```" if code.last else written


def _cut_line_output(text: str, code: _CodeLine | None) -> str:
    """What the line a cut ends in becomes, `text` being what the cut keeps of it: as the
    line alone would be read, a block it leaves open closed."""
    if code is None:
        return _line_output(text, None)
    if code.kind == "open":
        run = _FENCE_RUN.match(text, len(code.prefix))
        if run is None or run.group()[0] != code.fence[0]:
            return _line_output(text, None)  # the fence itself is cut: no block
        return _code_output(
            text, code._replace(language=code_language(text[run.end() :]), last=True)
        )
    if code.kind == "close":
        run = _FENCE_RUN.search(text)
        if (
            run is not None
            and run.group()[0] == code.fence[0]
            and run.end() - run.start() >= len(code.fence)
        ):
            return _code_output(text, code)
        cut = _CodeLine(
            "code", code.prefix, code.rest, column=len(code.prefix), last=True, nested=code.nested
        )
        return _code_output(text, cut)
    return _code_output(text, code._replace(last=True))


# A line that, alone, may close a fenced code block: a run of backticks or tildes only.
_BARE_FENCE = re.compile(r"[ >\t]*(?:`{3,}|~{3,})[ \t]*\Z")


class _Prefixes:
    """`feishu_markdown` of `body`, and of its prefixes as the cut of that conversion (each
    line converted once).

    The conversion goes line by line, a line's result depending only on what the whole
    body's reading makes of it (text, or which line of a code block): a prefix is the
    converted lines before its last one, that last line (cut) converted as it reads alone,
    and a fence closing a block the cut left open. Fitting a card measures
    a dozen prefixes of one body; this keeps that one conversion of the body.

    Emphasis is read once, in the whole body, as Telegram's converter does before it cuts: a
    span the cut goes through is closed at the cut (the words kept show as in the whole
    card), marks the cut splits or leaves with nothing after them are dropped."""

    def __init__(self, body: str) -> None:
        self._body = body
        reading = _reading(body)
        styles = _style_edits(body, reading)
        self._styles = styles
        self._edits = styles.edits
        self._edit_ends = [end for _, end, _ in self._edits]
        self._spans = styles.spans
        self._opened = {span.content: span for span in self._spans}
        # Where a span closes and the next one opens, written as one span (see `_style_edits`).
        opening = {(span.start, span.mark) for span in self._spans if span.mark}
        self._joined = {span.end for span in self._spans if (span.end, span.mark) in opening}
        # The spans by where they start, each with the span it is in (they nest, as the
        # parser's events do): those a cut goes through are one chain, found by walking up.
        self._by_start = sorted(self._spans, key=lambda span: (span.start, -span.end))
        self._span_starts = [span.start for span in self._by_start]
        self._parents: list[int] = []
        inside: list[int] = []
        for index, span in enumerate(self._by_start):
            while inside and self._by_start[inside[-1]].end <= span.start:
                inside.pop()
            self._parents.append(inside[-1] if inside else -1)
            inside.append(index)
        # Per line: where it starts in `body`, and what it becomes (one output per line).
        self._code = _code_lines_read(body, reading, styles)
        # The body with its emphasis written, and how far each edit moved what follows it.
        self._written = _edited(body, self._edits)
        self._shifts = [0, *itertools.accumulate(len(r) - (e - s) for s, e, r in self._edits)]
        # A line's edits stay on it: the edited body has the body's lines, one for one.
        self._out: list[str] = []
        self._starts: list[int] = []
        start = 0
        lines = zip(self._written.split("\n"), body.split("\n"), strict=True)
        for index, (line, source) in enumerate(lines):
            self._starts.append(start)
            self._out.append(_line_output(line, self._code.get(index)))
            start += len(source) + 1

    def _cut(self, prefix: str) -> tuple[int, str]:
        """Where the body is cut for `prefix`, and the marks closing the spans cut through."""
        cut = len(prefix)
        while True:  # never inside a run of marks, nor just after an opening one
            index = bisect.bisect_right(self._edit_ends, cut)
            if index < len(self._edits) and self._edits[index][0] < cut:
                cut = self._edits[index][0]
            elif cut in self._opened:
                cut = self._opened[cut].start
            else:
                break
            cut = len(prefix[:cut].rstrip())
        closing: list[_Span] = []  # innermost first
        index = bisect.bisect_left(self._span_starts, cut) - 1  # the last span starting before
        while index >= 0:
            span = self._by_start[index]
            if span.content <= cut < span.end or (span.end == cut and span.end in self._joined):
                closing.append(span)
            index = self._parents[index]
        return cut, "".join(span.mark for span in closing)

    def _in_written(self, at: int) -> int:
        """Where `body[at]` is in the written body (`at` inside no edit)."""
        return at + self._shifts[bisect.bisect_right(self._edit_ends, at)]

    def _kept(self, start: int, cut: int) -> str:
        """`body[start:cut]` as written; an `_` left last that was inside a word is a mark
        now (`a_` before a closing `**`), written as its reference."""
        end = self._in_written(cut)
        if cut - 1 not in self._styles.in_word:
            return self._written[self._in_written(start) : end]
        underscore = next(p for p, ref in self._styles.placeholders.items() if ref == "&#95;")
        return self._written[self._in_written(start) : end - 1] + underscore

    def written(self, prefix: str) -> str:
        """The body cut to `prefix`, its emphasis written for Feishu (see the class docstring):
        what `markdown` converts, line by line."""
        cut, closing = self._cut(prefix)
        return self._styles.restored(self._kept(0, cut) + closing)

    def markdown(self, prefix: str) -> str:
        """The conversion of the body cut to `prefix` (see the class docstring); of `prefix`
        alone when it is no prefix of the body."""
        if not self._body.startswith(prefix) or not prefix:  # nothing kept: no code block
            return feishu_markdown(prefix)
        cut, closing = self._cut(prefix)
        line = bisect.bisect_right(self._starts, cut) - 1  # the line the cut is in
        text = self._kept(self._starts[line], cut) + closing
        if self._code.get(line) is not None and _BARE_FENCE.match(text):
            # A code line cut to a bare fence (```py -> ```) closes the block in the cut body,
            # which the whole body's reading cannot say: read the cut body itself (rare).
            return _converted_lines(self.written(prefix))
        out = [*self._out[:line], _cut_line_output(text, self._code.get(line))]
        return self._styles.restored("\n".join(out))


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


# `_Prefixes` of the bodies rendered last: the service renders a card once per route, and
# again when only its automatic rows moved, both with the same body. A reading takes up to
# about 100 bytes per character of its body (a body of nothing but marks): the bodies kept
# are at most a million characters together, some tens of MB.
_READINGS: OrderedDict[str, _Prefixes] = OrderedDict()
_READINGS_BUDGET = 1_000_000
_READINGS_LOCK = threading.Lock()


def _prefixes(body: str) -> _Prefixes:
    """`_Prefixes(body)`, kept for the next render of the same body (least recently used go)."""
    with _READINGS_LOCK:
        prefixes = _READINGS.get(body)
        if prefixes is not None:
            _READINGS.move_to_end(body)
            return prefixes
    prefixes = _Prefixes(body)
    with _READINGS_LOCK:
        _READINGS[body] = prefixes
        kept = sum(map(len, _READINGS))
        while kept > _READINGS_BUDGET and len(_READINGS) > 1:
            kept -= len(_READINGS.popitem(last=False)[0])
    return prefixes


def _reading_part(body: str, length: int) -> str:
    """The first `length` characters of `body` and the rest of their paragraph (to a blank
    line within another quarter of `length`; else to the end of a line within it; else
    `length` characters): the part whose emphasis is read for a card cut within it."""
    if len(body) <= length:
        return body
    reach = min(len(body), length + length // 4)
    end = body.find("\n\n", length, reach)
    if end < 0:
        end = body.find("\n", length, reach)
    return body[: length if end < 0 else end]


# What `render_card` trims from the end of a body: spaces, tabs and line breaks.
TRAILING_BLANKS = " \t\r\n"
_TRAILING = tuple(TRAILING_BLANKS)


def render_card(view: CardView, limit_bytes: int = CARD_BUDGET_BYTES) -> Outgoing:
    """The interactive message for `view`, shrunk until it fits `limit_bytes` (the body is
    converted once however many of its cuts are measured: see `_Prefixes`; a hidden card's
    body not at all, see `CardView.shown_part`).

    Only the part of a long body that can show is read and converted (see `_reading_part`):
    first half as many characters as the card has bytes (a body dense with marks, the
    costliest to read, grows past the card's bytes by then), more while that part fits whole
    (plain text, links shrunk to their words), at most the precut body. Once the part read
    does not fit even with a single automatic row, the card is cut within it, as it would be
    within the whole body. The reading of each body is kept (`_prefixes`)."""
    view = view.shown_part()
    if view.body is not None and view.body.endswith(_TRAILING):
        # White space at the end of a body never shows (Telegram's text drops it too): a
        # renderer padding its output must not cost an update of a card that looks the same.
        view = replace(view, body=view.body.rstrip(TRAILING_BLANKS))
    view = precut_body(view, limit_bytes * SOURCE_BUDGET_FACTOR)
    if view.body is not None:  # before the reading, whose cuts are prefixes of this body
        view = replace(view, body=task_boxes_as_text(view.body))

    def converted(candidate: CardView) -> dict[str, Any]:
        body = candidate.body
        return card_json(candidate, None if body is None else prefixes.markdown(body))

    def size(candidate: CardView) -> int:
        return card_request_bytes(card_content(converted(candidate)))

    body = view.body or ""
    length = len(body) if len(body) <= limit_bytes else limit_bytes // 2
    while True:
        part = _reading_part(body, length)
        prefixes = _prefixes(part)
        if part == body:
            break
        kept = view.auto_rows[: max(1, view.kept_rows)]
        candidate = replace(view, auto_rows=kept, body=part, body_cut=True)
        measured = size(candidate)
        if measured > limit_bytes:
            view = candidate  # the whole body fits no better: cut within the part read
            break
        # The part fits whole: read on, as far as its bytes per character suggest and more.
        length = int(length * 1.1 * limit_bytes / measured) + 1

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
