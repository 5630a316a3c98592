"""Overlapping emphasis marks show the same on Telegram and Feishu: as CommonMark reads them.

CommonMark pairs marks from the left and leaves a mark it cannot pair as text:
`**bold _both** italic_` is "bold _both" in bold, then " italic_"; `~~a **b~~ c**` is
"a **b" struck through, then " c**". Telegram's entities come from that reading. Feishu's card
Markdown is no CommonMark: it gets the same reading written out so that it cannot pair the
marks another way (only `**`, `*` and `~~` around the spans CommonMark found, every other
mark a character reference). These tests read the Feishu Markdown back with a CommonMark
parser and compare, character by character, with what Telegram is sent.
"""

from __future__ import annotations

import itertools

import pyromark
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from telegramify_markdown.converter import STANDARD_OPTIONS
from telegramify_markdown.converter import _parse as telegram_parse

from taskcard.channels.base import CardView
from taskcard.channels.feishu.card import (
    PARSE_OPTIONS,
    _Prefixes,
    _telegram_reading,
    feishu_markdown,
)
from taskcard.channels.telegram.render import _math_as_text, markdown_to_rich, render_card

Styled = list[tuple[str, frozenset[str]]]

ENTITY_STYLES = {"bold": "bold", "italic": "italic", "strikethrough": "strike"}
TAG_STYLES = {"Strong": "bold", "Emphasis": "italic", "Strikethrough": "strike"}
CANONICAL = {"Strong": "**", "Emphasis": "*", "Strikethrough": "~~"}


def telegram_styled(markdown: str) -> Styled:
    """Each character Telegram shows for `markdown`, with its styles (text of the BMP only,
    so UTF-16 offsets are indices)."""
    rich = markdown_to_rich(markdown)
    styles: list[set[str]] = [set() for _ in rich.text]
    for entity in rich.entities:
        if entity.type in ENTITY_STYLES:
            for at in range(entity.offset, entity.offset + entity.length):
                styles[at].add(ENTITY_STYLES[entity.type])
    return [(char, frozenset(style)) for char, style in zip(rich.text, styles, strict=True)]


def commonmark_styled(markdown: str) -> Styled:
    """Each character a CommonMark reader shows for `markdown`, with its styles."""
    out: Styled = []
    open_styles: list[str] = []
    for event in pyromark.events(markdown, options=PARSE_OPTIONS):
        tag = event.get("Start", event.get("End")) if isinstance(event, dict) else None
        if not isinstance(tag, str) or tag not in TAG_STYLES:
            tag = None
        if tag is not None and "Start" in event:
            open_styles.append(TAG_STYLES[tag])
        elif tag is not None and "End" in event:
            open_styles.pop()
        elif isinstance(event, dict) and "Text" in event:
            out += [(char, frozenset(open_styles)) for char in event["Text"]]
        elif event == "SoftBreak":
            out.append(("\n", frozenset(open_styles)))
    while out and out[-1][0].isspace():
        out.pop()
    return out


def assert_unambiguous(markdown: str) -> None:
    """Every mark left in the Feishu Markdown is a canonical one around a span CommonMark
    found; a mark that is text is a character reference (or an `_` inside a word)."""
    source = markdown.encode()
    for event, span in pyromark.events_with_range(markdown, options=PARSE_OPTIONS):
        written = source[span["start"] : span["end"]].decode()
        if isinstance(event, dict) and "Start" in event and event["Start"] in CANONICAL:
            mark = CANONICAL[event["Start"]]
            assert written.startswith(mark) and written.endswith(mark), (markdown, written)
            assert not written.startswith("_") and not written.startswith("~~~"), markdown
        elif isinstance(event, dict) and "Text" in event:
            for at, char in enumerate(written):
                if char in "*~" or (
                    char == "_"
                    and not (written[at - 1 : at].isalnum() and written[at + 1 :][:1].isalnum())
                ):
                    raise AssertionError(f"a bare {char!r} in {markdown!r}")


def assert_nested(entities: list[dict[str, object]]) -> None:
    """Telegram's rule: two entities sharing characters nest, one wholly inside the other."""
    spans = [(int(e["offset"]), int(e["offset"]) + int(e["length"])) for e in entities]  # type: ignore[call-overload]
    for (a_start, a_end), (b_start, b_end) in itertools.combinations(spans, 2):
        if a_start < b_end and b_start < a_end:  # they overlap
            inside = (a_start <= b_start and b_end <= a_end) or (
                b_start <= a_start and a_end <= b_end
            )
            assert inside, f"entities {a_start}-{a_end} and {b_start}-{b_end} partly overlap"


@pytest.mark.parametrize(
    ("body", "bold", "italic", "struck", "as_typed"),
    [
        ("x **bold _both** italic_", "bold _both", "", "", " italic_"),
        ("x ~~a **b~~ c**", "", "", "a **b", " c**"),
        ("x _a **b_ c**", "", "a **b", "", " c**"),
        ("x **a ~~b** c~~", "a ~~b", "", "", " c~~"),
        ("x ~~a *b~~ c*", "", "", "a *b", " c*"),
    ],
)
def test_overlapping_marks_read_as_commonmark_on_both(
    body: str, bold: str, italic: str, struck: str, as_typed: str
) -> None:
    telegram = telegram_styled(body)
    feishu_written = feishu_markdown(body)
    assert commonmark_styled(feishu_written) == telegram
    text = "".join(char for char, _ in telegram)
    for words, style in ((bold, "bold"), (italic, "italic"), (struck, "strike")):
        shown = "".join(char for char, styles in telegram if style in styles)
        assert shown == words, (style, text)
    assert text.endswith(as_typed)
    assert_unambiguous(feishu_written)


def test_the_feishu_reading_is_the_telegram_converters() -> None:
    assert PARSE_OPTIONS == STANDARD_OPTIONS


MARKS = ["**", "*", "_", "__", "~~", "~"]
WORDS = ["a", "bold", "中文", "x y"]


@st.composite
def overlapping(draw: st.DrawFn) -> str:
    """Two or three marks each opened and later closed, in any order (so partly overlapping,
    nested or apart), a word after each mark with a space on either side of it or not."""
    marks = draw(st.lists(st.sampled_from(MARKS), min_size=2, max_size=3))
    # Each mark appears twice: its first place opens it, its second closes it.
    places = draw(st.permutations([n for n in range(len(marks)) for _ in range(2)]))
    parts = ["x "]
    for index in places:
        parts.append(marks[index])
        word = draw(st.sampled_from(WORDS))
        parts.append(draw(st.sampled_from(["", " "])) + word + draw(st.sampled_from(["", " "])))
    return "".join(parts)


@given(overlapping())
@settings(max_examples=500, deadline=None)
def test_overlapping_spans_show_the_same_on_both(body: str) -> None:
    feishu_written = feishu_markdown(body)
    assert commonmark_styled(feishu_written) == telegram_styled(body), feishu_written
    assert_unambiguous(feishu_written)
    outgoing = render_card(CardView("builder", "running", body=body))
    assert_nested(outgoing.payload.get("entities", []))
    for limit in (24, 30, 40):  # cut through the body: still nested
        cut = render_card(CardView("builder", "running", body=body * 3), limit_utf16=limit)
        assert_nested(cut.payload.get("entities", []))


@given(st.lists(overlapping(), min_size=1, max_size=3), st.sampled_from([" ", "\n"]), st.integers())
@example(["x _a**a**a**a_a**a"], " ", 185)  # `a_` left last, before a closing `**`
@settings(max_examples=300, deadline=None)
def test_a_cut_shows_the_whole_bodys_styles_up_to_it(
    bodies: list[str], gap: str, where: int
) -> None:
    """The Markdown of a prefix (fitting measures a dozen), read back with CommonMark, shows
    what Telegram shows for the whole body, up to the cut: each word kept, with its styles
    (a span the cut goes through stays styled to the cut); marks never bare."""
    body = gap.join(bodies)
    prefix = body[: where % (len(body) + 1)].rstrip()
    markdown = _Prefixes(body).markdown(prefix)
    shown = commonmark_styled(markdown)
    assert shown == telegram_styled(body)[: len(shown)], markdown
    # Only marks and spaces at the very end may be left out, never a word.
    letters = [char for char, _ in shown if char.isalnum()]
    assert letters == [char for char in prefix if char.isalnum()], markdown
    assert_unambiguous(markdown)


READING_PARTS = [
    "~",
    "~~",
    "*",
    "**",
    "_",
    "$",
    "$5",
    "5",
    "a",
    "b c",
    " ",
    "中文",
    "\\",
    "`",
    "\n",
]


@given(st.lists(st.sampled_from(READING_PARTS), max_size=30))
@example(["\\", "~", "~", "\\", "~~"])  # `\~~\~~`: an escape leaves single tildes
@example(["$", "~", "$", "~", "5", "$", "~", "~", "$", "~"])  # maths are text before tildes pair
@settings(max_examples=500, deadline=None)
def test_the_feishu_reading_follows_the_telegram_converter(parts: list[str]) -> None:
    """Feishu's reading of emphasis copies what the Telegram renderer and telegramify-markdown
    do before the events are walked (maths and single `~` read as text, parsing again): over
    generated bodies, the events are the converter's own, so that a new version of it that reads
    otherwise fails here instead of making the two platforms differ."""
    body = "".join(parts)
    _, events = telegram_parse(_math_as_text(body), STANDARD_OPTIONS, latex_escape=False)
    reading = _telegram_reading(body)
    assert reading is not None
    assert [event for event, _, _ in reading] == [event for event, _ in events], body
    if not any(char in body for char in "$`\\\n"):  # no maths, code or breaks: same text
        inline = "x " + body  # no list, rule or fence: a line of text
        feishu_written = feishu_markdown(inline)
        assert commonmark_styled(feishu_written) == telegram_styled(inline), feishu_written
