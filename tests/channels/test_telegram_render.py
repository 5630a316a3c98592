"""Table tests of the pure Telegram rendering: layout, entities, bounds, never empty."""

from __future__ import annotations

import re
import string
from typing import Any

import pytest
import telegramify_markdown
from hypothesis import given, settings
from hypothesis import strategies as st
from telegramify_markdown.config import RenderConfig

from taskcard.channels.base import BODY_CUT_MARKER, CardView
from taskcard.channels.telegram.render import (
    MAX_MESSAGE_UTF16,
    SEPARATOR,
    Entity,
    RichText,
    _card_head,
    _inline_rich,
    _trim_end,
    defuse_mentions,
    hidden_notice,
    markdown_to_rich,
    render_card,
    render_text,
    utf16_len,
)


def _entity_texts(payload: Any) -> list[tuple[str, str]]:
    """(type, covered text) for each entity, slicing by UTF-16 units as Telegram does."""
    raw = payload["text"].encode("utf-16-le")
    out = []
    for entity in payload.get("entities", []):
        start, end = entity["offset"] * 2, (entity["offset"] + entity["length"]) * 2
        out.append((entity["type"], raw[start:end].decode("utf-16-le")))
    return out


def _assert_valid(payload: Any) -> None:
    text = payload["text"]
    assert text.strip(), "Telegram cannot show an empty message"
    assert utf16_len(text) <= MAX_MESSAGE_UTF16
    for entity in payload.get("entities", []):
        assert entity["offset"] >= 0 and entity["length"] > 0
        assert entity["offset"] + entity["length"] <= utf16_len(text)


def test_layout_header_rows_separator_body() -> None:
    view = CardView(
        agent_id="builder",
        state="running",
        auto_rows=("last: pytest passed 2m ago", "turn: 12m"),
        body="Step **3** of 5",
    )
    out = render_card(view)
    lines = out.text.split("\n")
    assert "builder" in lines[0] and "running" in lines[0]
    assert lines[1:3] == ["last: pytest passed 2m ago", "turn: 12m"]
    assert lines[3] == SEPARATOR
    assert lines[4] == "Step 3 of 5"
    covered = _entity_texts(out.payload)
    assert ("bold", lines[0]) in covered
    assert ("bold", "3") in covered
    assert out.payload["text"] == out.text
    _assert_valid(out.payload)


@pytest.mark.parametrize(
    ("markdown", "expected"),
    [
        ("**bold**", ("bold", "bold")),
        ("_it_", ("italic", "it")),
        ("`x = 1`", ("code", "x = 1")),
        ("~~old~~", ("strikethrough", "old")),
        ("[docs](https://example.org/a)", ("text_link", "docs")),
        ("> quoted line", ("blockquote", "quoted line")),
        ("# Heading", ("bold", "Heading")),
    ],
)
def test_markdown_becomes_entities(markdown: str, expected: tuple[str, str]) -> None:
    out = render_card(CardView(agent_id="a", state="idle", body=markdown))
    covered = _entity_texts(out.payload)
    kind, text = expected
    assert any(k == kind and text in t for k, t in covered), covered
    assert "**" not in out.text and "~~" not in out.text
    _assert_valid(out.payload)


def test_code_block_keeps_language_and_link_keeps_url() -> None:
    body = "```python\nprint('hi')\n```\n\nsee [the log](https://example.org/log)"
    out = render_card(CardView(agent_id="a", state="idle", body=body))
    entities = out.payload["entities"]
    pre = [e for e in entities if e["type"] == "pre"]
    assert pre and pre[0]["language"] == "python"
    links = [e for e in entities if e["type"] == "text_link"]
    assert links and links[0]["url"] == "https://example.org/log"


def test_entities_moved_by_the_card_keep_their_url_and_language() -> None:
    """Each entity is made again where it lands (shifted past the header, moved by a
    defused mention, clamped at trailing white space): its link and language come along."""
    body = "@ops wrote\n\n```python\nprint('hi')\n```\n\nsee [the log](https://example.org/log)"
    out = render_card(CardView(agent_id="a", state="idle", body=body))
    covered = dict(_entity_texts(out.payload))
    assert covered["pre"] == "print('hi')"
    assert covered["text_link"] == "the log"
    by_type = {e["type"]: e for e in out.payload["entities"]}
    assert by_type["pre"]["language"] == "python"
    assert by_type["text_link"]["url"] == "https://example.org/log"
    clamped = _trim_end(
        RichText("see log  ", (Entity("text_link", 4, 5, url="https://x.example/"),))
    )
    assert clamped == RichText("see log", (Entity("text_link", 4, 3, url="https://x.example/"),))
    with pytest.raises(AttributeError):
        clamped.entities[0].length = 9  # type: ignore[misc]


def test_lists_stay_text_bullets() -> None:
    out = render_card(CardView(agent_id="a", state="idle", body="- one\n- two\n\n1. first"))
    lines = out.text.split("\n")
    assert any(line.endswith(" one") and line != "one" for line in lines), lines
    assert "1. first" in out.text


def test_markdown_v2_hostile_body_renders_as_is() -> None:
    body = "cost: $5 (est.) - ratio 1+1=2 | a_b_c #tag {x} [y] v1.2! > not quote"
    out = render_card(CardView(agent_id="a", state="idle", body=body))
    assert "a_b_c" in out.text and "(est.)" in out.text and "v1.2!" in out.text
    _assert_valid(out.payload)


def test_hidden_renders_one_line_notice() -> None:
    out = render_card(CardView(agent_id="builder", state="running", body="x", hidden=True))
    assert out.text == hidden_notice("builder")
    assert "\n" not in out.text


def test_a_hidden_card_never_converts_its_body() -> None:
    # A body the converter cannot take (a lone surrogate beside raw HTML): shown, it fails;
    # hidden, the chat gets its one-line notice, so nothing of the body was converted.
    unconvertible = "a <b>tag</b> \ud800"
    with pytest.raises(UnicodeEncodeError):
        render_card(CardView(agent_id="builder", state="running", body=unconvertible))
    out = render_card(
        CardView("builder", "running", ("row",), body=unconvertible, body_cut=True, hidden=True)
    )
    assert out.text == hidden_notice("builder")
    assert out == render_card(CardView(agent_id="builder", state="idle", hidden=True))


def test_body_note_shown_when_no_body() -> None:
    out = render_card(CardView(agent_id="b", state="exited", body=None, body_note="card stopped"))
    assert "card stopped" in out.text
    assert ("italic", "card stopped") in _entity_texts(out.payload)


def test_body_cut_appends_marker() -> None:
    out = render_card(CardView(agent_id="b", state="idle", body="short", body_cut=True))
    assert out.text.endswith(BODY_CUT_MARKER.strip())


@pytest.mark.parametrize("agent_id", ["", "   "])
def test_never_empty(agent_id: str) -> None:
    out = render_card(CardView(agent_id=agent_id, state="unknown"))
    _assert_valid(out.payload)
    assert render_text("   ").text.strip()


@pytest.mark.parametrize(
    "unit",
    ["😀", "中", "a", "👨‍👩‍👧", "**粗**", "`😀`"],
)
def test_over_long_body_fits_in_utf16(unit: str) -> None:
    body = unit * 10_000 + "\n\n**end**"
    rows = tuple(f"row {i}: " + "🙂" * 40 for i in range(10))
    out = render_card(CardView(agent_id="big", state="running", auto_rows=rows, body=body))
    _assert_valid(out.payload)
    assert utf16_len(out.text) > MAX_MESSAGE_UTF16 // 2, "the cut should keep most of the room"
    assert out.text.endswith(BODY_CUT_MARKER.strip())
    assert "row 0" in out.text, "the first automatic row is kept"
    assert "row 9" not in out.text, "later automatic rows shrink first"


def test_fingerprint_changes_exactly_with_content() -> None:
    first = render_card(CardView(agent_id="a", state="idle", body="x"))
    same = render_card(CardView(agent_id="a", state="idle", body="x"))
    bolder = render_card(CardView(agent_id="a", state="idle", body="**x**"))
    assert first.fingerprint == same.fingerprint
    assert first.fingerprint != bolder.fingerprint


def test_render_text_cuts_long_text() -> None:
    out = render_text("😀" * 5000)
    _assert_valid(out.payload)
    assert "entities" not in out.payload


def test_mentions_are_defused_and_entities_follow_their_text() -> None:
    rich = markdown_to_rich("🟢 **@ops** and @bob, `@code`, a@b.example, [x](tg://user?id=1) @")
    defused = defuse_mentions(rich)
    assert defused.text == "🟢 @\u200bops and @\u200bbob, @code, a@b.example, x @"
    units = defused.text.encode("utf-16-le")
    shown = {
        e.type: units[2 * e.offset : 2 * (e.offset + e.length)].decode("utf-16-le")
        for e in defused.entities
    }
    assert shown == {"bold": "@\u200bops", "code": "@code"}  # the tg:// link is gone


def test_many_mentions_between_code_spans_keep_every_entity_on_its_text() -> None:
    # Offsets are counted as the matches go and code spans looked up by bisection (the
    # card of an agent listing people was composed in quadratic time on each change).
    source = " ".join(f"😀 @u{i} `@c{i}` **@b{i}**" for i in range(300))
    defused = defuse_mentions(markdown_to_rich(source))
    assert defused == defuse_mentions(defused)  # a second pass finds nothing to do
    units = defused.text.encode("utf-16-le")
    shown = [
        (e.type, units[2 * e.offset : 2 * (e.offset + e.length)].decode("utf-16-le"))
        for e in defused.entities
    ]
    expected = []
    for i in range(300):
        expected += [("code", f"@c{i}"), ("bold", f"@\u200bb{i}")]
    assert shown == expected
    assert defused.text.count("@\u200bu") == 300 and "@c299" in defused.text


def _defused_by_rule(text: str) -> str:
    """The defusing rule written out character by character (no links or code in `text`):
    a `@` not after a word character or one of `@/.:+-`, before a username's character; a `/`
    not after a word character or one of `/<>`, before 1-64 command characters, an optional
    `@` and 3-32 more, and then no word character, `/`, `<` or `>`."""
    rules = {
        "@": ("_@/.:+-", r"[A-Za-z0-9_]"),
        "/": ("_/<>", r"[A-Za-z0-9_]{1,64}(?:@[A-Za-z0-9_]{3,32})?(?![\w/<>])"),
    }
    out = []
    for index, char in enumerate(text):
        out.append(char)
        before = text[index - 1] if index else ""
        if char in rules:
            not_after, then = rules[char]
            starts_word = not (before.isalnum() or (before and before in not_after))
            if starts_word and re.match(then, text[index + 1 :]):
                out.append("\u200b")
    return "".join(out)


@settings(max_examples=400, deadline=None)
@given(st.text(alphabet="ab_Z9/@<>+- \n\u00e9", max_size=24))
def test_defusing_follows_the_rule_at_every_position(text: str) -> None:
    # The patterns look behind after their character (a faster scan); the rule is the same.
    assert defuse_mentions(RichText(text)).text == _defused_by_rule(text)


def test_a_dense_body_is_converted_once_however_often_it_is_cut(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Fitting a long body used to convert its Markdown once per cut measured (15 times for
    16,000 characters of `**w**`, half a second of CPU); the converted text is cut instead."""
    calls: list[str] = []
    convert = telegramify_markdown.convert

    def counted(markdown: str, *args: Any, **kwargs: Any) -> Any:
        calls.append(markdown)
        return convert(markdown, *args, **kwargs)

    monkeypatch.setattr(telegramify_markdown, "convert", counted)
    markdown_to_rich.cache_clear()
    rows = tuple(f"row {i}: " + "x" * 30 for i in range(5))
    body = "**w** " * 2666 + "\n\nend-marker"
    out = render_card(CardView(agent_id="dense", state="running", auto_rows=rows, body=body))
    _assert_valid(out.payload)
    assert len(calls) == 1
    assert out.text.endswith(BODY_CUT_MARKER.strip()) and "end-marker" not in out.text
    assert utf16_len(out.text) > MAX_MESSAGE_UTF16 - 200, "the cut keeps nearly all the room"
    assert "row 0" in out.text and "row 4" not in out.text


CUT_UNITS = [
    "😀",
    "👍🏽",
    "👨\u200d👩\u200d👧",
    "e\u0301",
    "1\ufe0f\u20e3",  # a keycap: the enclosing mark is not a combining one to unicodedata
    "\u0915\u093f",  # a Devanagari vowel sign (a spacing mark)
    "❤\ufe0f",
    "@boss ",
    "/stop ",
    "`@x` ",
    "**b** ",
]


@pytest.mark.parametrize("limit", range(160, 260, 3))
def test_a_cut_body_ends_on_a_whole_character_and_pages_no_one(limit: int) -> None:
    """The converted body is cut at a code point, never inside a surrogate pair, and never
    between a character and what joins it (a skin tone, a joiner, an accent, a variation
    selector) nor between a `@` or `/` and the space that defuses it."""
    body = "".join(CUT_UNITS) * 20
    view = CardView(agent_id="cut", state="running", body=body)
    out = render_card(view, limit)
    assert utf16_len(out.text) <= limit and out.text.endswith(BODY_CUT_MARKER.strip())
    for entity in out.payload.get("entities", []):
        assert entity["offset"] + entity["length"] <= utf16_len(out.text)
    shown = out.text[: -len(BODY_CUT_MARKER.strip())].rstrip()
    whole = markdown_to_rich(body).text
    assert whole.startswith(shown.split("\n", 2)[2])  # the header and separator first
    after = whole[len(shown.split("\n", 2)[2]) :]
    assert not after or (after[0] not in "\u200b\u200d\ufe0f\U0001f3fd\u0301\u20e3\u093f")
    assert not shown.endswith("\u200d")


@pytest.mark.parametrize(
    ("markdown", "shown"),
    [
        ("make || make retry || true", "make || make retry || true"),
        ("||not hidden||", "||not hidden||"),
        ("x|||y", "x|||y"),
        ("`a || b` || c ||", "a || b || c ||"),
        ("[l](https://x.test/a||b) || c ||", "l || c ||"),
        ("> q || r ||", "q || r ||"),
        ("<https://x.test/a||b> || c ||", "https://x.test/a||b || c ||"),
        ("see <https://x.test/a||b> now", "see https://x.test/a||b now"),
    ],
)
def test_double_pipes_show_as_typed_never_as_a_spoiler(markdown: str, shown: str) -> None:
    """`||words||` is a spoiler to the converter alone (no Markdown, no Feishu card knows
    it): a shell line lost its pipes and hid its middle on Telegram only."""
    rich = markdown_to_rich(markdown)
    assert rich.text == shown
    assert not [e for e in rich.entities if e.type == "spoiler"]
    assert all(e.url == "https://x.test/a||b" for e in rich.entities if e.type == "text_link")


def test_a_cut_card_keeps_its_kept_rows_and_falls_back_to_one_when_they_cannot_fit() -> None:
    # The first `kept_rows` (the state and what is wrong with the agent's files) stay on a
    # card whose body is cut; rows that could never fit leave the first row alone.
    rows = ("state: running", "⚠ logs/events.jsonl: is a named pipe", "last: tests", "· more")
    view = CardView("a", "running", rows, body="line of a long body\n" * 2000, kept_rows=2)
    text = render_card(view).payload["text"]
    assert "⚠ logs/events.jsonl: is a named pipe" in text and "last: tests" not in text
    assert BODY_CUT_MARKER in text and utf16_len(text) <= MAX_MESSAGE_UTF16
    huge = ("state: running", "⚠ " + "x" * 5000, "last: tests")
    text = render_card(CardView("a", "running", huge, body="body", kept_rows=2)).payload["text"]
    assert "state: running" in text and "x" * 100 not in text
    assert utf16_len(text) <= MAX_MESSAGE_UTF16


# What bodies are made of in the property test below: text (ASCII, accented, beyond the BMP,
# a character reference to a line break), inline marks, breaks and blank lines (one with a
# tab), which the fast reading takes, a link definition between two paragraphs (one line
# break between them, not two), and the block syntax, links, HTML and marks it must leave
# to the converter.
INLINE_PIECES = ["word", "a", "é", "😀", " ", "  ", "\t", "\n", "\n\n", "\n \n", "\n\t\n"]
INLINE_PIECES += ["*", "**", "***", "_", "__", "`", "``", "\\", "&#10;", "&amp;", "@ops", "/stop"]
INLINE_PIECES += ["  \n", ">", "\n\n[x]: /u\n"]
# Marks already paired, nested, inside a word or across a line: the styles and code spans
# whose entities the reading lists (a code span with spaces and a backtick inside).
INLINE_PIECES += ["*a*", "**a**", "_a_", "a_b_c", "a*b*c", "`a`", "` a `", "``a`b``", "*a\nb*"]
# White space that is not ASCII's and control characters, which the parser and the blank-line
# count between paragraphs could each take for white space or not: alone and as a line of
# their own between two paragraphs.
INLINE_PIECES += ["\u00a0", "\u2028", "\u2029", "\u3000", "\u200b", "\ufeff", "\x0c", "\x0b"]
INLINE_PIECES += ["\x00", "\x85", "\n\u00a0\n", "\n\x0c\n", "\n\x0b\n", "\n\u3000\n"]
# Character references the parser reads as a character, as U+FFFD (NUL, a surrogate, beyond
# Unicode) or as written, and text whose UTF-16 length is not its length in code points.
INLINE_PIECES += ["&nbsp;", "&#0;", "&#x1F600;", "&#xD800;", "&#x110000;", "&#42;", "&bogus;"]
INLINE_PIECES += ["&#;", "\u0301", "👍🏽", "\U0010ffff"]
# Every ASCII punctuation mark escaped (`\$` and `\~` left to the converter, as bare).
ESCAPED_MARKS = ["\\" + mark for mark in string.punctuation]
OTHER_PIECES = ["> ", "# ", "- ", "1. ", "    ", "```", "---", "===", "[x]", "(/u)", "[x]: /u\n"]
OTHER_PIECES += ["<b>", "<!-- -->", "!", "|", "||", "~", "~~", "$", "\r", "\r\n", "- [ ] "]
_BODIES = st.lists(
    st.one_of(
        st.sampled_from(INLINE_PIECES),
        st.sampled_from(ESCAPED_MARKS),
        st.sampled_from(INLINE_PIECES + OTHER_PIECES),
    ),
    max_size=20,
).map("".join)


def _up_to_the_fast_limit(body: str) -> str:
    """`body` repeated as often as fits in the longest body the fast reading takes."""
    return body * (2048 // max(len(body), 1))


@settings(max_examples=4000, deadline=None)
@given(st.one_of(_BODIES, _BODIES.map(_up_to_the_fast_limit)))
def test_inline_bodies_read_as_the_converter_reads_them(markdown: str) -> None:
    """A body of paragraphs, styles, code spans and line breaks is read without the
    converter (a tenth of a card change's work): to the same text and entities, in the same
    order, as the converter makes of it."""
    fast = _inline_rich(markdown)
    if fast is not None:
        assert fast == _as_the_converter_reads(markdown)


def _as_the_converter_reads(markdown: str) -> RichText:
    text, entities = telegramify_markdown.convert(
        markdown, latex_escape=False, config=RenderConfig.isolated()
    )
    return RichText(
        text, tuple(Entity(e.type, e.offset, e.length, e.url, e.language) for e in entities)
    )


@pytest.mark.parametrize(
    "markdown",
    [
        "a\n\n\x0c\nb",  # a form feed's line after a blank line: the converter makes one break
        "a\n\u00a0\nb",  # a line of a no-break space is no blank line
        "a&#10;&#10;\nb",  # character references to line breaks end the paragraph's text
        "a\\\n\nb\\",  # a backslash before a blank line, and at the very end
        "***a***",
        "_a_b_ snake_case_name 2*3*4",
        "*a **b* c**",
        "**a\nb**",
        "`` a`b `` `  ` ` `` `",  # code spans: a backtick inside, spaces only, stripped edges
        "&#0;&#xD800;&#x110000;&nbsp;&bogus;",  # U+FFFD for the invalid, as written for none
        "a\u2028b\u2029c \u200b\n\n\ufeffd",
        "e\u0301 👍🏽 \U0010ffff *😀*",
        "\n\n  a  \n\n\n",
        "\\*a\\* \\_b\\_ \\`c\\` \\&amp; \\[x]",
        "**a**\n" * 341,  # near the longest body the fast reading takes (2,048 characters)
    ],
)
def test_edge_bodies_read_as_the_converter_reads_them(markdown: str) -> None:
    """Bodies of each kind the property test's pieces stand for, written out: each is read
    without the converter, as the converter reads it."""
    assert _inline_rich(markdown) == _as_the_converter_reads(markdown)


@pytest.mark.parametrize(
    "markdown",
    [
        "card a00042 v7\n\n**step** 7: still working",
        "just words",
        "**bold _both_** and `code`\nnext line  \nhard break\n\n\n\nlast 😀",
        "[ref]: https://example.org\nafter a definition",
    ],
)
def test_a_body_of_inline_styles_is_read_without_the_converter(markdown: str) -> None:
    """The property test above has something to compare: common cards take the fast way."""
    assert _inline_rich(markdown) is not None


@pytest.mark.parametrize(
    "markdown",
    ["# heading", "- item", "> quote", "[l](https://example.org)", "a ~b~", "$5", "x\r\ny"],
)
def test_other_markdown_is_left_to_the_converter(markdown: str) -> None:
    assert _inline_rich(markdown) is None


HEAD_ROWS = ("❔ state unknown: no activity reported", "card updated 17:05 UTC")


@pytest.mark.parametrize(
    "changed",
    [
        CardView("a1", "unknown", (HEAD_ROWS[0], "card updated 17:06 UTC"), body="v2 **x**"),
        CardView("a1", "unknown", HEAD_ROWS[:1], body="v2 **x**"),
        CardView("a1", "running", HEAD_ROWS, body="v2 **x**"),
        CardView("a2", "unknown", HEAD_ROWS, body="v2 **x**"),
        CardView("a1", "unknown", HEAD_ROWS, body_note="The task card stopped."),
        CardView("a1", "unknown", HEAD_ROWS, body="v2 **x**", body_note="Cut: too long."),
        CardView("a1", "unknown", HEAD_ROWS),
    ],
)
def test_the_card_head_is_laid_out_once_and_anew_when_it_changes(changed: CardView) -> None:
    """The header, the automatic rows, the separator and the note are remembered across
    changes of the body alone (a card's body changes on each change, its rows seldom); a
    head with anything else in it (a row, the state, the agent, a note, no body slot) is
    laid out anew: as it shows when nothing was remembered."""
    _card_head.cache_clear()
    before = render_card(CardView("a1", "unknown", HEAD_ROWS, body="v1 **x**"))
    again = render_card(CardView("a1", "unknown", HEAD_ROWS, body="v2 **x**"))
    assert _card_head.cache_info().hits == 1
    assert again.payload == {
        **before.payload,
        "text": before.text.replace("v1", "v2"),
    }
    shown = render_card(changed)
    assert _card_head.cache_info().misses == 2
    _card_head.cache_clear()
    assert shown.payload == render_card(changed).payload


@pytest.mark.parametrize(
    "view",
    [
        CardView("a", "idle", ("last row  ",)),
        CardView("a", "idle", body_note="The task card stopped.  "),
        CardView("a", "idle", body="**bold** ends in a break&#10;"),
        CardView("a", "idle", body="**bold&#10;**"),
        CardView("a", "idle", body="> quoted  \n>\n"),
    ],
)
def test_white_space_at_the_end_goes_and_entities_end_with_the_text(view: CardView) -> None:
    """Telegram strips white space at a message's end: a card ends without any (only a
    text that ends in some is trimmed: the rest is as trimmed), and no entity runs past it."""
    out = render_card(view)
    assert out.text == out.text.rstrip()
    _assert_valid(out.payload)
