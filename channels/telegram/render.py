"""Card views as Telegram plain text plus `entities` (pure functions, no I/O).

We never send a `parse_mode`: text with an explicit entity list cannot fail on escaping, which
is the classic MarkdownV2 failure. The Markdown body is converted by `telegramify-markdown`,
whose entity offsets are already in UTF-16 code units, the unit Telegram counts in (a body of
paragraphs and inline styles alone is read the same way without it: `_inline_rich`). The
rendered message always fits `MAX_MESSAGE_UTF16` after entity parsing (`render_card` shrinks the
automatic slot first, then cuts the body) and is never empty, since Telegram rejects that.
"""

from __future__ import annotations

import bisect
import functools
import re
import unicodedata
from collections.abc import Iterable, Sequence
from dataclasses import replace
from typing import Any, NamedTuple

import pyromark
import telegramify_markdown
from telegramify_markdown.config import RenderConfig
from telegramify_markdown.converter import STANDARD_OPTIONS

from taskcard.channels.base import (
    BOARD_HIDDEN_NOTICE,
    BOARD_TITLE,
    BODY_CUT_MARKER,
    SOURCE_BUDGET_FACTOR,
    BoardView,
    CardView,
    Outgoing,
    board_line_parts,
    board_omitted_text,
    code_language,
    may_hold_maths,
    precut_body,
    task_boxes_as_text,
    web_link,
)

MAX_MESSAGE_UTF16 = 4096
# Telegram applies the first 100 entities of a message and ignores the rest without an error.
MAX_ENTITIES = 100
# Entities of the service's own in a card around the body: the header, the note, the cut mark.
_OWN_CARD_ENTITIES = 3
_BODY_ENTITIES = MAX_ENTITIES - _OWN_CARD_ENTITIES
# Entities whose text reads the same without them: dropped first when a message has too many.
_STYLES = frozenset({"bold", "italic", "underline", "strikethrough", "spoiler"})
SEPARATOR = "──────────"
_STATE_ICONS = {
    "running": "🟢",
    "idle": "⚪",
    "waiting": "🟡",
    "exited": "⚫",
    "no output": "🟠",
    "at prompt": "⌨",
    "unknown": "❔",
}
# The converter's settings, apart from its process-global ones (which another library in the
# process may change). Made once: the converter only reads them, and making them per body
# (`RenderConfig.isolated()`) was a tenth of its work on a short card.
_CONVERTER_CONFIG = RenderConfig.isolated()


def utf16_len(text: str) -> int:
    """Length in UTF-16 code units: how Telegram counts message length and entity offsets."""
    if text.isascii():
        return len(text)
    return len(text.encode("utf-16-le", "surrogatepass")) // 2


class Entity(NamedTuple):
    """One Bot API `MessageEntity`, offsets and lengths in UTF-16 code units.

    A named tuple rather than a frozen dataclass: as immutable, and made in a fraction of
    the interpreter's work (a frozen dataclass sets each field through `object.__setattr__`),
    which counts because every card composed on a change makes several."""

    type: str
    offset: int
    length: int
    url: str | None = None
    language: str | None = None

    def to_api(self) -> dict[str, Any]:
        data: dict[str, Any] = {"type": self.type, "offset": self.offset, "length": self.length}
        if self.url is not None:
            data["url"] = self.url
        if self.language is not None:
            data["language"] = self.language
        return data


class RichText(NamedTuple):
    """Plain text and the entities that format it (a named tuple, as `Entity`)."""

    text: str
    entities: tuple[Entity, ...] = ()


class _Part(NamedTuple):
    """Fragments added to a `_Builder`, joined, not yet built: to start others from."""

    text: str
    entities: tuple[Entity, ...]
    length_utf16: int


class _Builder:
    """Appends fragments, shifting each fragment's entities by the UTF-16 length so far."""

    def __init__(self, start: _Part | None = None) -> None:
        self._parts: list[str] = [start.text] if start else []
        self._entities: list[Entity] = list(start.entities) if start else []
        self._length_utf16 = start.length_utf16 if start else 0

    def add(self, text: str, entities: Sequence[Entity] = ()) -> None:
        shift = self._length_utf16
        if shift:
            for entity in entities:
                self._entities.append(
                    Entity(
                        entity.type,
                        entity.offset + shift,
                        entity.length,
                        entity.url,
                        entity.language,
                    )
                )
        else:  # nothing before them: they stand where they are (entities are immutable)
            self._entities.extend(entities)
        self._parts.append(text)
        self._length_utf16 = shift + (len(text) if text.isascii() else utf16_len(text))

    def add_styled(self, text: str, entity_type: str) -> None:
        """`text` as one entity of `entity_type`, made where it lands (not made at 0 and
        made again shifted: a card is composed on every change)."""
        if text:
            length = utf16_len(text)
            self._entities.append(Entity(entity_type, self._length_utf16, length))
            self._parts.append(text)
            self._length_utf16 += length

    def part(self) -> _Part:
        return _Part("".join(self._parts), tuple(self._entities), self._length_utf16)

    def build(self) -> RichText:
        rich = RichText("".join(self._parts), tuple(self._entities))
        # Without white space at the end it is as trimmed: each fragment's entities lie
        # within it and are not empty (`add_styled`'s, and `add`'s from a trimmed body).
        return defuse_mentions(_trim_end(rich) if rich.text[-1:].isspace() else rich)


# Where Telegram would find a mention of a user by name: `@` at the start of a word, before a
# username's first character. Telegram detects these in any text a bot sends (no parse mode
# needed) and notifies the person named, so an agent's `@boss` in a card or a report summary
# would page them. A zero-width space after the `@` reads the same and mentions no one, as
# the Feishu card defuses its `<at>` tags.
# Each pattern starts with its character and looks behind it after (`@(?<!X@)` rather than
# `(?<!X)@`): the regex engine then skips to the next `@` or `/` instead of trying the
# look-behind at every position of a card composed on each change (four times faster on a
# card of paths, and a card without `@` or `/` is not scanned at all).
_MENTION = r"@(?<![\w@/.:+-]@)(?=[A-Za-z0-9_])"
# Where Telegram would find a bot command: `/` where no word, `/`, `<` or `>` comes before it,
# then 1-64 ASCII letters, digits or underscores, optionally `@` and a bot's username, and no
# word character, `/`, `<` or `>` after (so `/tmp/x` and `a/b` are none). Telegram makes it
# tappable in any text a bot sends: one tap by a person sends it to the group, so an agent's
# "/taskcard off" in a card, a report summary or an activity row would hide everyone's cards.
# A zero-width space after the `/` reads the same and is no command (and pasted back into a
# chat, it is read as the command: `channels.base.first_word`).
_COMMAND = r"/(?<![\w/<>]/)(?=[A-Za-z0-9_]{1,64}(?:@[A-Za-z0-9_]{3,32})?(?![\w/<>]))"
_TAPPABLE = re.compile(f"{_MENTION}|{_COMMAND}")
_MENTION_ONLY = re.compile(_MENTION)
_NO_MENTION = "\u200b"
# Entities whose text is shown and copied exactly as written: never touched.
_VERBATIM = frozenset({"code", "pre"})
# A `@` in a link (`https://host/?by=@name`, `example.com/@name`) is part of the link, which
# Telegram detects before any mention in it: a zero-width space there would cut the link
# short. Matched against the word the `@` ends (no white space between).
_LINK_START = re.compile(r"://|\bwww\.|\w\.[A-Za-z]{2,}(?::\d+)?/", re.IGNORECASE)


def defuse_mentions(rich: RichText, *, commands: bool = False) -> RichText:
    """`rich` with a zero-width space after every `@` that would mention someone and every
    `/` that would start a bot command, the entities moved to keep covering their text; both
    inside code and links stay as written. With `commands` (the service's own words), its
    commands stay as written: tappable.

    Linear in the text (the card of an agent that lists many people is composed on each of
    its changes, several times when it has to be cut to fit): offsets are counted as the
    matches go, and looked up by bisection."""
    if "@" not in rich.text and ("/" not in rich.text or commands):
        return rich
    verbatim = _merged(
        (entity.offset, entity.offset + entity.length)
        for entity in rich.entities
        if entity.type in _VERBATIM
    )
    starts = [begin for begin, _ in verbatim]
    parts: list[str] = []
    inserted: list[int] = []  # UTF-16 offsets (in the original text) after each new character
    start = 0
    counted, at = 0, 0  # `at`: the UTF-16 offset of `rich.text[counted]`
    for found in (_MENTION_ONLY if commands else _TAPPABLE).finditer(rich.text):
        at += utf16_len(rich.text[counted : found.end()])
        counted = found.end()
        index = bisect.bisect_left(starts, at) - 1  # the last span beginning before `at`
        if (index >= 0 and at <= verbatim[index][1]) or _in_link(rich.text, found.start()):
            continue
        parts.append(rich.text[start : found.end()] + _NO_MENTION)
        start = found.end()
        inserted.append(at)
    if not inserted:
        return rich
    parts.append(rich.text[start:])

    def moved(offset: int) -> int:
        return offset + bisect.bisect_right(inserted, offset)

    entities = tuple(
        entity._replace(
            offset=moved(entity.offset),
            length=moved(entity.offset + entity.length) - moved(entity.offset),
        )
        for entity in rich.entities
    )
    return RichText("".join(parts), entities)


def _merged(spans: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    """`spans` sorted, overlapping ones joined: disjoint spans in order."""
    merged: list[tuple[int, int]] = []
    for begin, end in sorted(spans):
        if merged and begin <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((begin, end))
    return merged


# How far back from a `@` a link's start is looked for: links are shorter, and the look stays
# bounded in a long run of text without white space.
_LINK_LOOKBACK = 2048


def _in_link(text: str, at: int) -> bool:
    """Whether the `@` (or `/`) at `at` belongs to a link written in `text` (see `_LINK_START`)."""
    floor = max(0, at - _LINK_LOOKBACK)
    word_start = max(text.rfind(space, floor, at) for space in (" ", "\n", "\t")) + 1
    return _LINK_START.search(text, max(floor, word_start), at) is not None


def _trim_end(rich: RichText) -> RichText:
    """Drop trailing whitespace (Telegram strips it) and clamp entities to what is left."""
    text = rich.text.rstrip()
    limit = utf16_len(text)
    kept: list[Entity] = []
    for entity in rich.entities:
        end = entity.offset + entity.length
        if end <= limit:
            if entity.length > 0:
                kept.append(entity)
        elif limit > entity.offset:
            kept.append(
                Entity(
                    entity.type, entity.offset, limit - entity.offset, entity.url, entity.language
                )
            )
    return RichText(text, tuple(kept))


@functools.lru_cache(maxsize=256)
def markdown_to_rich(markdown: str) -> RichText:
    """Telegram text + entities for a Markdown body.

    Our own render config (`_CONVERTER_CONFIG`) keeps us off the library's global one, and
    maths is not read at all (`_math_as_text`): agent bodies use `$` for shell and money.

    A task list item shows its box as Feishu's card does (`task_boxes_as_text`): the
    converter's own boxes both look ticked.

    A custom emoji (`![👍](tg://emoji?id=...)`) goes as its plain emoji: its entity would go
    without the emoji's id (`Entity` has no such field), which Telegram refuses, and a bot
    may send custom emoji only with a username bought on Fragment anyway.

    Cached (the result is immutable): the service renders a card once per route, and again
    when only its automatic rows moved, both with the same body. 256 bodies of at most
    4 x 4096 characters bound the cache to a few MB.
    """
    prepared = _html_as_text(_pipes_as_text(_math_as_text(task_boxes_as_text(markdown))))
    rich = _inline_rich(prepared)
    if rich is None:
        text, entities = telegramify_markdown.convert(
            prepared, latex_escape=False, config=_CONVERTER_CONFIG
        )
        rich = _trim_end(
            RichText(
                text,
                _outer_quotes_only(
                    Entity(e.type, e.offset, e.length, e.url, _language(e.language))
                    for e in entities
                    if e.length > 0 and e.type != "custom_emoji" and not _unsafe_link(e.type, e.url)
                ),
            )
        )
    elif rich.text[-1:].isspace():  # else as trimmed: its entities lie within its text
        rich = _trim_end(rich)
    # Defused here too, so that composing the card again finds the body's mentions done.
    return defuse_mentions(rich)


# The inline styles `_inline_rich` reads, with their entities' types (the tags also as a
# tuple: a tag may be a dict, which a tuple compares and a dict cannot look up).
_INLINE_STYLES = {"Strong": "bold", "Emphasis": "italic"}
_STYLE_TAGS = tuple(_INLINE_STYLES)
# The longest body `_inline_rich` reads, in characters: a card of a few paragraphs.
_INLINE_MAX = 2048
# Line breaks and the marks before a paragraph that the converter's block spacing looks
# through for a blank line (see `_inline_rich`).
_BLANK = b" \t>\n"


def _inline_rich(markdown: str) -> RichText | None:
    """What the converter (`telegramify_markdown.convert`) makes of `markdown` when it is
    paragraphs of text, bold, italic, inline code and line breaks alone, as most cards are;
    None for any other body, which the converter reads.

    The converter's walker dispatches each parser event through a dozen comparisons into
    buffer and scope objects: about 1,400 bytecodes for a two-line card, a tenth of a card
    change's work. This loop reads the same events (one parse, in C) in about 500 and makes
    what the walker makes of them, which a property test holds it to
    (`test_inline_bodies_read_as_the_converter_reads_them`): text and code spans as written,
    each line break as `\n`, a style's or a code span's entity listed when it closes (none
    when empty), and before each paragraph but the first as many line breaks as make two
    where the source has a blank line since the last paragraph began (`>`, spaces and tabs
    apart), one elsewhere (a link definition between them). Left to the converter as well:
    `$`, `~` and `||`, which it reads again (prices, "about", spoilers) before walking, and
    `\r`, which its blank-line scan reads with rules of its own; and a long body
    (`_INLINE_MAX`), where giving up late (at a list far down) would cost more than this
    saves.
    """
    if (
        len(markdown) > _INLINE_MAX
        or "$" in markdown
        or "~" in markdown
        or "||" in markdown
        or "\r" in markdown
    ):
        return None
    parts: list[str] = []
    entities: list[Entity] = []
    opened: list[tuple[str, int]] = []  # the styles open: their tag, their UTF-16 offset
    at = 0  # the UTF-16 length of the text so far
    paragraph = -1  # where the last paragraph began in `source`, none yet
    source = markdown.encode()  # the parser's spans count UTF-8 bytes
    # Most events are dicts of one key, looked for most frequent first. The few events that
    # are strings (line breaks, a rule) hold none of these keys as a substring, so they fall
    # through the `in` tests to their own branch: one type check fewer for every other event.
    # (Typed `Any`: mypy cannot tell the kinds apart by those tests.)
    read: Iterable[tuple[Any, Any]] = pyromark.events_with_range(markdown, options=STANDARD_OPTIONS)
    for event, span in read:
        if "Text" in event:
            text = event["Text"]
            parts.append(text)
            at += len(text) if text.isascii() else utf16_len(text)
        elif "Start" in event:
            tag = event["Start"]
            if tag == "Paragraph":
                if paragraph >= 0:
                    gap = source[paragraph + 1 : span["start"]]
                    wanted = 2 if gap[len(gap.rstrip(_BLANK)) :].count(b"\n") >= 2 else 1
                    breaks = wanted - _trailing_breaks(parts)
                    if breaks > 0:
                        parts.append("\n" * breaks)
                        at += breaks
                paragraph = span["start"]
            elif tag in _STYLE_TAGS:
                opened.append((tag, at))
            else:
                return None
        elif "End" in event:
            closed = event["End"]
            if closed == "Paragraph":
                continue
            if closed in _STYLE_TAGS and opened[-1][0] == closed:
                begin = opened.pop()[1]
                if at > begin:
                    entities.append(Entity(_INLINE_STYLES[closed], begin, at - begin))
            else:
                return None
        elif isinstance(event, str):
            if event != "SoftBreak" and event != "HardBreak":
                return None
            parts.append("\n")
            at += 1
        elif "Code" in event:
            code = event["Code"]
            parts.append(code)
            length = len(code) if code.isascii() else utf16_len(code)
            if length:
                entities.append(Entity("code", at, length))
            at += length
        else:
            return None
    return RichText("".join(parts), tuple(entities))


def _trailing_breaks(parts: list[str]) -> int:
    """How many `\n` end the text made of `parts`."""
    count = 0
    for part in reversed(parts):
        kept = part.rstrip("\n")
        count += len(part) - len(kept)
        if kept:
            break
    return count


def _language(info: str | None) -> str | None:
    """A code block's language as the Feishu card shows it too (`channels.base.code_language`):
    `python` of `python title=x`, none for an info string that names no plain language."""
    return (code_language(info) or None) if info else info


_QUOTES = frozenset({"blockquote", "expandable_blockquote"})  # a long quote is expandable


def _outer_quotes_only(entities: Iterable[Entity]) -> tuple[Entity, ...]:
    """`entities` without the quotes inside another quote (`> > x`): Telegram allows no
    quote in a quote. The outer quote shows the text of the inner ones."""
    kept = list(entities)
    quotes = sorted(
        (index for index, entity in enumerate(kept) if entity.type in _QUOTES),
        key=lambda index: (kept[index].offset, -kept[index].length),
    )
    inner: set[int] = set()
    reach = -1  # where the last outer quote ends
    for index in quotes:
        entity = kept[index]
        if entity.offset < reach:
            inner.add(index)
        else:
            reach = entity.offset + entity.length
    return tuple(entity for index, entity in enumerate(kept) if index not in inner)


def within_entity_limit(rich: RichText, limit: int = MAX_ENTITIES) -> RichText:
    """`rich` with at most `limit` entities, so that Telegram applies every one it is sent.

    Beyond its first 100 Telegram ignores a message's entities silently, and a `@name` or a
    `/command` left as written inside code (see `defuse_mentions`) would then be live: a
    mention that pages, a command one tap sends. Styles go first, from the end (their words
    read the same); then code, quotes and the rest but links, whose text is defused anew as
    any plain text is. Links are never dropped here (their address would be lost without a
    trace): a card with more than fit is cut by `render_card`, with the visible marker.
    """
    excess = len(rich.entities) - limit
    if excess <= 0:
        return rich
    dropped: set[int] = set()
    for droppable in (lambda kind: kind in _STYLES, lambda kind: kind != "text_link"):
        candidates = [
            index
            for index, entity in enumerate(rich.entities)
            if index not in dropped and droppable(entity.type)
        ]
        last = candidates[max(0, len(candidates) - excess) :]  # the last ones go first
        dropped.update(last)
        excess -= len(last)
        if excess <= 0:
            break
    kept = tuple(entity for index, entity in enumerate(rich.entities) if index not in dropped)
    return defuse_mentions(RichText(rich.text, kept))


_PIPES = re.compile(rb"\|{2,}")


def _escaped_pipes(run: re.Match[bytes]) -> bytes:
    return run.group().replace(b"|", b"\\|")


def _pipes_as_text(markdown: str) -> str:
    """`markdown` with each `|` of a run of two or more outside code escaped (`\\|`), so that
    it shows as typed.

    The converter reads `||words||` as a spoiler, a Telegram-only syntax no Markdown or
    Feishu card knows: a shell line `make || make retry || true` in a card lost its pipes
    and hid its middle behind a spoiler on Telegram alone. Code and tables (where `||` is an
    empty cell) stay as written."""
    if "||" not in markdown:
        return markdown
    source = markdown.encode()
    kept: list[tuple[int, int, bool]] = []  # code, tables and bare links (True)
    for event, span in pyromark.events_with_range(markdown, options=STANDARD_OPTIONS):
        if not isinstance(event, dict):
            continue
        start = event.get("Start")
        if "Code" in event or (
            isinstance(start, dict) and ("CodeBlock" in start or "Table" in start)
        ):
            kept.append((span["start"], span["end"], False))
        elif isinstance(start, dict) and _is_autolink(start):
            kept.append((span["start"], span["end"], True))
    parts: list[bytes] = []
    last = 0
    for begin, end, link in [*kept, (len(source), len(source), False)]:
        if begin >= last:
            written = source[begin:end]
            parts += [
                _PIPES.sub(_escaped_pipes, source[last:begin]),
                _as_inline_link(written) if link else written,
            ]
            last = end
        elif end > last:  # inside a table: a code span in a cell
            parts.append(source[last:end])
            last = end
    return b"".join(parts).decode()


def _is_autolink(start: dict[str, object]) -> bool:
    link = start.get("Link")
    return isinstance(link, dict) and link.get("link_type") == "Autolink"


def _as_inline_link(autolink: bytes) -> bytes:
    """`<https://a||b>` as `[https://a\\|\\|b](https://a\\|\\|b)`: an autolink takes
    no escapes (a `\\|` would show and change the address), and left as it is its `||`
    pairs with another run into a spoiler; an inline link's text and address take them."""
    if b"||" not in autolink or any(mark in autolink for mark in (b"[", b"]", b"(", b")", b"\\")):
        return autolink  # an address an inline link could not hold as it is: left alone
    address = _PIPES.sub(_escaped_pipes, autolink[1:-1])
    return b"[" + address + b"](" + address + b")"


def _math_as_text(markdown: str) -> str:
    """`markdown` with the `$` marks of what the converter reads as maths (`$x$`, `$$x$$`)
    escaped (`\\$`), so that they show as typed, as the Feishu card shows them.

    The converter always reads maths: `$HOME/$USER` in a card lost its dollars and showed
    `HOME/` as code, on Telegram alone. Parsed again while escaping uncovers more (a `$`
    left over may pair with a later one); the Feishu card's reading escapes the same marks
    (`channels.feishu.card._telegram_reading`)."""
    for _ in range(_HTML_PASSES):
        if not may_hold_maths(markdown):
            break
        offsets: list[int] = []
        for event, span in pyromark.events_with_range(markdown, options=STANDARD_OPTIONS):
            if isinstance(event, dict) and ("InlineMath" in event or "DisplayMath" in event):
                width = 2 if "DisplayMath" in event else 1
                start, end = span["start"], span["end"]
                offsets += [*range(start, start + width), *range(end - width, end)]
        if not offsets:
            break
        markdown = _backslash_at(markdown.encode(), offsets)
    return markdown


# How often a body is parsed again for raw HTML that escaping uncovered (see `_html_as_text`).
_HTML_PASSES = 8


def _html_as_text(markdown: str) -> str:
    """`markdown` with the `<` of its raw HTML escaped (`\\<`), so that it shows as typed.

    The converter drops raw HTML, inline and in blocks: `Vec<String>`, `<T>`, `a <b> tag` or
    `<!-- note -->` lost their words on Telegram, while Feishu, which escapes `<` outside
    code, shows them. Parsed again while escaping uncovers more (a block of HTML is text once
    its first `<` is escaped, and its tags are then inline HTML); code stays as written."""
    for _ in range(_HTML_PASSES):
        if "<" not in markdown:
            break
        source = markdown.encode()
        offsets: list[int] = []
        fence: bytes | None = None  # the fence open in the HTML block being read
        for event, span in pyromark.events_with_range(markdown, options=STANDARD_OPTIONS):
            if not isinstance(event, dict):
                continue
            start, end = span["start"], span["end"]
            if "InlineHtml" in event:
                offsets += (at for at in range(start, end) if source[at] == 0x3C)  # `<`
            elif "Html" in event:
                # A line of an HTML block: only a `<` that begins it (the next pass reads
                # the rest as text, its inline HTML as such and its code as code); a line
                # inside a fence in the block is code already.
                raw = source[start:end]
                line = raw.lstrip(b" ").rstrip()
                if fence is None and line[:3] in (b"```", b"~~~"):
                    fence = line[:1]
                elif fence is not None:
                    if line[:3] == fence * 3 and not line.strip(fence):
                        fence = None  # the closing fence
                elif line.startswith(b"<"):
                    offsets.append(start + len(raw) - len(raw.lstrip(b" ")))
            else:
                fence = None
        if not offsets:
            break
        markdown = _backslash_at(source, offsets)
    return markdown


def _backslash_at(source: bytes, offsets: list[int]) -> str:
    """`source` (a body's UTF-8) with a backslash put before each byte offset in `offsets`."""
    parts: list[bytes] = []
    last = 0
    for at in sorted(offsets):
        parts += [source[last:at], b"\\"]
        last = at
    parts.append(source[last:])
    return b"".join(parts).decode()


def _unsafe_link(kind: str, url: str | None) -> bool:
    """A link to anything but a web address (see `web_link`): a `tg:` link
    (`[boss](tg://user?id=42)`) is Telegram's inline mention, which notifies the user, and a
    `javascript:`, `data:` or `file:` one may run or open something. Its text stays; only
    the link goes."""
    return kind == "text_link" and not web_link(url or "")


def hidden_notice(agent_id: str) -> str:
    return f"{agent_id}: task card hidden — /taskcard on to show"


def compose_rich(view: CardView, body: RichText | None = None) -> RichText:
    """The full layout of one card, without any size bound (the body's conversion is cached
    by `markdown_to_rich`, so measuring many variants of one view converts it once). `body`:
    the body already converted (and cut), in place of `view.body`'s conversion."""
    agent = view.agent_id.strip() or "agent"
    if view.hidden:
        return RichText(hidden_notice(agent))
    separated = view.body is not None or view.body_note is not None or view.body_cut
    out = _Builder(_card_head(agent, view.state, view.auto_rows, separated, view.body_note))
    if body is None and view.body is not None and view.body.strip():
        body = markdown_to_rich(view.body)
    if body is not None:
        body = within_entity_limit(body, _BODY_ENTITIES)
        out.add("\n")
        out.add(body.text, body.entities)
    if view.body_cut:
        out.add_styled(BODY_CUT_MARKER, "italic")
    return out.build()


@functools.lru_cache(maxsize=1024)
def _card_head(
    agent: str, state: str, rows: tuple[str, ...], separated: bool, note: str | None
) -> _Part:
    """The card above its body (`compose_rich`): the header, the automatic rows, the
    separator when there is a body slot, the body's note.

    Remembered, as a card's body changes with each of its changes and its rows (times to
    the minute) far less often: laying them out again was a sixth of the rendering's work.
    Any other agent, state, row, separator or note is another key, laid out anew. 1,024
    heads of a few lines each (a card's rows as the chat shows them) bound the cache to a
    MB or two."""
    out = _Builder()
    icon = _STATE_ICONS.get(state, "")
    out.add_styled(f"{icon} {agent} · {state}".strip(), "bold")
    for row in rows:
        out.add("\n" + row)
    if separated:
        out.add("\n" + SEPARATOR)
    if note:
        out.add("\n")
        out.add_styled(note, "italic")
    return out.part()


def _outgoing(rich: RichText) -> Outgoing:
    payload: dict[str, Any] = {"text": rich.text}
    if rich.entities:
        payload["entities"] = [entity.to_api() for entity in rich.entities]
    return Outgoing.build(rich.text, payload)


def render_card(view: CardView, limit_utf16: int = MAX_MESSAGE_UTF16) -> Outgoing:
    """The resident message for `view`, always non-empty and within `limit_utf16`.

    The automatic rows are dropped from the end first (keeping the first `kept_rows`), as
    `fit_view` does; then the body is cut. The body is converted once: what is cut is its text and
    entities, at the longest prefix that fits (`_cut_rich`), never its Markdown source, so a
    dense body costs one conversion however many cuts are measured; a hidden card's body
    none (see `CardView.shown_part`)."""
    view = precut_body(view.shown_part(), limit_utf16 * SOURCE_BUDGET_FACTOR)
    body = markdown_to_rich(view.body) if view.body is not None and view.body.strip() else None
    if body is not None:
        view, body = _links_cut(view, body)

    def fits(rich: RichText) -> bool:
        return len(rich.entities) <= MAX_ENTITIES and utf16_len(rich.text) <= limit_utf16

    rich = compose_rich(view, body)
    if fits(rich):  # most cards: nothing to drop or cut, and no need to measure it again
        return _outgoing(rich)
    rows = list(view.auto_rows)
    while not fits(rich) and len(rows) > max(1, view.kept_rows):
        rows.pop()
        rich = compose_rich(replace(view, auto_rows=tuple(rows)), body)
    if not fits(rich):
        shrunk = replace(view, auto_rows=tuple(rows), body=None, body_cut=True)
        whole = body or RichText("")

        def cut_at(cut: int) -> RichText:
            kept = _cut_rich(whole, cut)
            return compose_rich(shrunk, kept if kept.text else None)

        rich = cut_at(0)
        low, high = 1, len(whole.text)  # in code points: never inside a surrogate pair
        while low <= high:
            middle = (low + high) // 2
            candidate = cut_at(middle)
            if fits(candidate):
                rich, low = candidate, middle + 1
            else:
                high = middle - 1
        if len(rows) > 1 and not fits(rich):  # the kept rows alone are too long
            return render_card(replace(view, kept_rows=1), limit_utf16)
    if utf16_len(rich.text) > limit_utf16:
        # Only reachable when the header or the one kept row alone is too long: cut by code
        # points, which never splits a surrogate pair.
        rich = _trim_end(RichText(_cut_utf16(rich.text, limit_utf16), rich.entities))
    return _outgoing(rich)


# Characters a cut must not come just before: they belong to the character before them (a
# mark of any kind, combining or spacing, such as a keycap or a Devanagari vowel sign; a
# variation selector, an emoji's skin tone or joined part, the zero-width
# space that defuses a `@` or `/`).
_JOINED = frozenset("\u200b\u200c\u200d\ufe0e\ufe0f") | frozenset(
    chr(code) for code in range(0x1F3FB, 0x1F400)
)


def _cut_rich(rich: RichText, cut: int) -> RichText:
    """`rich` cut to its first `cut` code points (less a character's marks and joiners, and
    a `@` or `/` whose defusing space would be cut off), its entities clamped to the text
    left; trailing white space dropped."""
    text = rich.text
    cut = min(cut, len(text))
    while 0 < cut < len(text) and (
        text[cut] in _JOINED
        or text[cut - 1] == "\u200d"
        or unicodedata.category(text[cut]).startswith("M")
    ):
        cut -= 1
    if cut < len(text) and text[cut] == _NO_MENTION and cut > 0 and text[cut - 1] in "@/":
        cut -= 1
    if cut >= len(text):
        return _trim_end(rich)
    limit = utf16_len(text[:cut])
    # Only the entities that start before the cut are clamped by `_trim_end`: a long dense
    # body has thousands, and the cut is measured a dozen times.
    return _trim_end(RichText(text[:cut], tuple(e for e in rich.entities if e.offset < limit)))


def _links_cut(view: CardView, body: RichText) -> tuple[CardView, RichText]:
    """`view` and its converted `body`, the body cut, marked, to the longest prefix whose
    entities Telegram all applies once `within_entity_limit` has let the others go: more
    links than that. Links are never dropped, so the cut comes just before the first link
    that does not fit; at a space or a line's end before it, where there is one.

    Cut before fitting, which would first drop the automatic rows for nothing."""
    if len(within_entity_limit(body, _BODY_ENTITIES).entities) <= _BODY_ENTITIES:
        return view, body
    links = [entity for entity in body.entities if entity.type == "text_link"]
    first_out = sorted(entity.offset for entity in links)[_BODY_ENTITIES]
    cut = _code_points(body.text, first_out)
    gap = max(body.text.rfind(" ", 0, cut), body.text.rfind("\n", 0, cut))
    return replace(view, body_cut=True), _cut_rich(body, gap if gap > 0 else cut)


def _code_points(text: str, offset_utf16: int) -> int:
    """The index in `text` of the character at UTF-16 offset `offset_utf16`."""
    if text.isascii():
        return offset_utf16
    used = 0
    for index, char in enumerate(text):
        if used >= offset_utf16:
            return index
        used += 2 if ord(char) > 0xFFFF else 1
    return len(text)


def board_rich(view: BoardView) -> RichText:
    """The board as text and entities: a bold title, each line's agent and state in bold, the
    cut count in italics. Agent-written parts are plain text, never parsed as markup."""
    if view.hidden:
        return RichText(BOARD_HIDDEN_NOTICE)
    out = _Builder()
    out.add_styled(f"{'🟠' if view.attention else '📋'} {BOARD_TITLE}", "bold")
    out.add(f" · {view.summary}")
    for line in view.lines:
        lead, rest = board_line_parts(line)
        out.add(f"\n{_STATE_ICONS.get(line.state, '')} ")
        out.add_styled(lead, "bold")
        out.add(rest)
    if view.omitted:
        out.add("\n")
        out.add_styled(board_omitted_text(view.omitted), "italic")
    return within_entity_limit(out.build())


def board_fits(view: BoardView, limit_utf16: int = MAX_MESSAGE_UTF16) -> bool:
    return utf16_len(board_rich(view).text) <= limit_utf16


def render_board(view: BoardView, limit_utf16: int = MAX_MESSAGE_UTF16) -> Outgoing:
    """The board message; `fit_board` has cut it to fit, so the hard cut here is a safeguard."""
    rich = board_rich(view)
    if utf16_len(rich.text) > limit_utf16:
        rich = _trim_end(RichText(_cut_utf16(rich.text, limit_utf16), rich.entities))
    return _outgoing(rich)


def render_text(
    text: str, limit_utf16: int = MAX_MESSAGE_UTF16, *, commands: bool = False
) -> Outgoing:
    """A plain message (notice or command reply), cut to fit and never empty; with
    `commands` (the service's own words alone), its commands stay tappable."""
    # A text has no entities.
    defused = defuse_mentions(RichText(text.strip()), commands=commands).text
    cut = _cut_utf16(defused, limit_utf16).rstrip()
    return _outgoing(RichText(cut or "…"))


def plain_fallback(text: str, limit_utf16: int = MAX_MESSAGE_UTF16) -> str:
    """The text of a message sent again without its entities (Telegram refused them): a
    `@name` or `/command` left as written inside code is defused too, as nothing marks it as
    code any more; cut to fit, as the zero-width spaces lengthen it."""
    return _cut_utf16(defuse_mentions(RichText(text)).text, limit_utf16).rstrip()


def _cut_utf16(text: str, limit_utf16: int) -> str:
    if utf16_len(text) <= limit_utf16:
        return text
    used = 0
    for index, char in enumerate(text):
        used += 2 if ord(char) > 0xFFFF else 1
        if used > limit_utf16 - 1:
            return text[:index] + "…"
    return text
