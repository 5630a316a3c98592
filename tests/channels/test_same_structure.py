"""Telegram and Feishu show a card's code blocks (and its dollars) alike.

Telegram's entities come from CommonMark's reading (telegramify-markdown). Feishu's card
Markdown keeps as code only what stands between clean triple-backtick fences, so every block
CommonMark finds (fenced with backticks or tildes, of any length, with an info string or
none, left open, indented, in a list or a quote) must reach Feishu written that way, and
nothing else may. `feishu_code_blocks` reads the Feishu Markdown as that rule does; the
zero-width spaces Feishu's copy gets (a `<at` defused, a fence-like line kept from closing
the block) are the only difference allowed.
"""

from __future__ import annotations

import html
import json
import re

import pyromark
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from telegramify_markdown.converter import STANDARD_OPTIONS

from taskcard.channels.base import (
    _MAY_BE_BOX,
    _MAY_BE_TASK,
    CardView,
    may_hold_maths,
    task_boxes_as_text,
)
from taskcard.channels.feishu.card import (
    CARD_BUDGET_BYTES,
    _may_hold_single_tilde,
    card_request_bytes,
    feishu_markdown,
)
from taskcard.channels.feishu.card import render_card as render_feishu
from taskcard.channels.telegram.render import (
    MAX_ENTITIES,
    MAX_MESSAGE_UTF16,
    markdown_to_rich,
    utf16_len,
)
from taskcard.channels.telegram.render import render_card as render_telegram

Block = tuple[str, str]  # (language, content)

# An opener may follow quote marks and a list item's marker; the lines after it have spaces
# where the marker was (the marker again would open a new item).
_OPEN = re.compile(r"^((?:[ >]|[-+*] |\d{1,9}[.)] )*)```([A-Za-z0-9_+.#-]*)$")
_CLOSE = re.compile(r"^[ >]*```$")


def feishu_code_blocks(markdown: str) -> list[Block]:
    """The code blocks of Feishu card Markdown as its rule reads them: a clean opener,
    content lines (their quote or list prefix taken off), a clean closer. The content of a
    block after a quote mark, a list marker or indentation has `& < >` escaped (Feishu does
    not say it reads such a block as code): read here as the characters they stand for."""
    blocks: list[Block] = []
    lines = markdown.split("\n")
    index = 0
    while index < len(lines):
        opener = _OPEN.match(lines[index])
        index += 1
        if opener is None:
            continue
        prefix, content = len(opener.group(1)), []
        while index < len(lines) and not _CLOSE.match(lines[index]):
            line = lines[index]
            content.append(line[prefix:] if line[:prefix].strip(" >") == "" else line)
            index += 1
        assert index < len(lines), f"a block left open in {markdown!r}"
        index += 1
        shown = "\n".join(content).replace("\u200b", "")
        blocks.append((opener.group(2), html.unescape(shown) if prefix else shown))
    return blocks


def telegram_code_blocks(markdown: str) -> list[Block]:
    rich = markdown_to_rich(markdown)
    return [
        (entity.language or "", rich.text[entity.offset : entity.offset + entity.length])
        for entity in rich.entities
        if entity.type == "pre"
    ]


AT = "<at id=all></at>"


@pytest.mark.parametrize(
    ("body", "blocks"),
    [
        (f"~~~\nx {AT} *y*\n~~~\nafter *b*", [("", f"x {AT} *y*")]),
        ("~~~python\nx = 1\n~~~", [("python", "x = 1")]),
        ("```python title=x\ncode *x*\n```\nafter <b>", [("python", "code *x*")]),
        ("````\n```\ninside\n```\n````\nafter", [("", "```\ninside\n```")]),
        ("~~~~\n~~~\nstill code\n~~~~", [("", "~~~\nstill code")]),
        ("```\nunclosed *x*", [("", "unclosed *x*")]),
        ("~~~sh\nunclosed", [("sh", "unclosed")]),
        ("    indented *x*\n    two\n\npara", [("", "indented *x*\ntwo")]),
        ("- item\n\n  ```sh\n  make\n  ```\n- two", [("sh", "make")]),
        ("> quoted\n> ```js\n> let a = 1\n> ```", [("js", "let a = 1")]),
        ("1.     indented code in item\n2. next", [("", "indented code in item")]),
        ("-     one\n      two\n\n      three\n- next", [("", "one\ntwo\n\nthree")]),
        ("> 1.     quoted item code\n>        more", [("", "quoted item code\nmore")]),
        ("- ```sh\n  make", [("sh", "make")]),
        ("> ```html\n> <font>x</font> & y\n> ```", [("html", "<font>x</font> & y")]),
        ("- item\n\n  ```\n  <b>x</b> &amp;\n  ```", [("", "<b>x</b> &amp;")]),
        ("```a`b\nnot code `x`", []),
        ("~~~\n>```\n- ~~~\n1. ```\n~~~", [("", ">```\n- ~~~\n1. ```")]),
    ],
    ids=["tilde", "tilde-language", "info-string", "four-ticks", "four-tildes", "unclosed",
         "unclosed-tilde", "indented", "in-a-list", "in-a-quote", "indented-on-an-item",
         "indented-on-a-bullet", "indented-on-an-item-in-a-quote", "unclosed-on-an-item",
         "markup-in-a-quote", "markup-in-a-list",
         "no-fence", "fence-like-content"],
)  # fmt: skip
def test_code_blocks_are_the_same_on_both(body: str, blocks: list[Block]) -> None:
    assert telegram_code_blocks(body) == blocks
    assert feishu_code_blocks(feishu_markdown(body)) == blocks


@pytest.mark.parametrize(
    ("body", "written"),
    [
        ("1.     indented code\n2. next", "1. ```\n   indented code\n   ```\n2. next"),
        ("-     a\n      b\n- next", "- ```\n  a\n  b\n  ```\n- next"),
        ("- ```sh\n  make", "- ```sh\n  make\n  ```"),
    ],
)  # fmt: skip
def test_a_block_on_a_list_item_line_keeps_one_item(body: str, written: str) -> None:
    """A code block that starts on a list item's own line is in that one item on Feishu: the
    marker stands before the opening fence only, the lines after it get spaces of its width
    (the marker before each would make each line an item of its own, the fences apart)."""
    assert feishu_markdown(body) == written


@pytest.mark.parametrize(
    "body",
    [
        "> ```\n> <font color='red'>x</font> <at id=all></at>\n> ```",
        "- item\n\n  ```html\n  <text_tag color='red'>x</text_tag>\n  ```",
        "1.     <link url='https://e.x'>x</link>\n2. next",
        ">     <font color=red>quoted indented</font>\n\n> ~~~\n> <b>open",
        "  ```\n  <b>indented fence</b>\n  ```",
    ],
    ids=["quote", "list", "indented-on-an-item", "quote-indented-and-open", "indented-fence"],
)
def test_no_tag_reaches_feishu_from_a_nested_code_block(body: str) -> None:
    """Feishu documents fences at the start of a line only: a block inside a quote or a list
    item (or indented) may be read as text there, so its `& < >` are escaped as text's are.
    No tag of it reaches Feishu, and the block still reads as the same code as on Telegram."""
    markdown = feishu_markdown(body)
    assert "<" not in markdown
    assert feishu_code_blocks(markdown) == telegram_code_blocks(body) != []


@pytest.mark.parametrize("cut", range(1, 60))
def test_a_card_cut_in_a_code_block_keeps_it_code_on_feishu(cut: int) -> None:
    """However the fit cuts a body of blocks, Feishu gets every block closed, and the text
    after a block stays text."""
    body = "~~~py\nline one\nline two\n~~~\n```sh title=x\nmake <all>\n```\nafter"
    markdown = feishu_markdown(body[:cut].rstrip())
    for _, content in feishu_code_blocks(markdown):  # reads every block as closed
        assert "after" not in content


def test_a_huge_body_of_fences_fits_both_limits() -> None:
    """Thousands of blocks of both kinds, each with an info string and a mention tag: each
    platform's card fits its limit, Feishu's blocks all closed and no mention live."""
    fences = ["~~~", "```", "````"]
    body = "\n".join(
        f"{fences[n % 3]}lang{n} extra\n{AT} *{n}*\n{fences[n % 3]}" for n in range(6000)
    )
    view = CardView(agent_id="a", state="running", body=body)
    message = render_feishu(view)
    assert card_request_bytes(message.payload["content"]) <= CARD_BUDGET_BYTES
    card = json.loads(message.payload["content"])
    markdown = next(e["content"] for e in card["body"]["elements"] if e["tag"] == "markdown")
    blocks = feishu_code_blocks(markdown)
    assert len(blocks) > 100 and all(language.startswith("lang") for language, _ in blocks[:-1])
    assert "<at" not in markdown
    telegram = render_telegram(view)
    assert utf16_len(telegram.payload["text"]) <= MAX_MESSAGE_UTF16
    assert len(telegram.payload["entities"]) <= MAX_ENTITIES


@pytest.mark.parametrize(
    ("body", "shown"),
    [
        ("cd $HOME/$USER; ls", "cd $HOME/$USER; ls"),
        ("costs $5, total $x+y$ then $$z$$", "costs $5, total $x+y$ then $$z$$"),
        ("$$\nblock\n$$", "$$\nblock\n$$"),
    ],
)
def test_dollars_show_as_typed_on_both(body: str, shown: str) -> None:
    """Neither channel reads maths: agents write `$` for shell variables and money. Telegram's
    converter read `$HOME/$` as maths, dropped both dollars and showed `HOME/` as code."""
    rich = markdown_to_rich(body)
    assert rich.text == shown and not rich.entities
    assert feishu_markdown(body) == shown


def test_maths_marks_around_emphasis_read_alike() -> None:
    """`$a*b*c$` is text with an italic `b` on both, not code on one and text on the other."""
    rich = markdown_to_rich("x $a*b*c$ y")
    assert rich.text == "x $abc$ y"
    assert [(e.type, rich.text[e.offset : e.offset + e.length]) for e in rich.entities] == [
        ("italic", "b")
    ]
    assert feishu_markdown("x $a*b*c$ y") == "x $a*b*c$ y"


@given(
    st.lists(
        st.sampled_from(["$", "$$", " ", "a", "\n", "\\", "`", "5", "\t", "\u00a0", "中", "*"]),
        max_size=14,
    )
)
@settings(max_examples=2000, deadline=None)
def test_the_maths_guard_never_misses_maths(parts: list[str]) -> None:
    """`may_hold_maths` lets both channels skip the parse that reads maths as text; it must
    say yes wherever the parser would find maths (only ASCII white space counts as space)."""
    text = "".join(parts)
    events = pyromark.events(text, options=STANDARD_OPTIONS)
    if any(isinstance(e, dict) and ("InlineMath" in e or "DisplayMath" in e) for e in events):
        assert may_hold_maths(text)


@given(st.lists(st.sampled_from(["~", "~~", "~~~", "\\", "a", " ", "\n", "`", "*"]), max_size=14))
@settings(max_examples=2000, deadline=None)
def test_the_tilde_guard_never_misses_a_single_tilde(parts: list[str]) -> None:
    """The Feishu reading parses a second time only when a body may hold strikethrough with a
    single `~` (read as text, as Telegram's converter does): the guard must say yes wherever
    the parser finds such a span."""
    text = "".join(parts)
    source = text.encode()
    for event, span in pyromark.events_with_range(text, options=STANDARD_OPTIONS):
        start = span["start"]
        if event == {"Start": "Strikethrough"} and source[start + 1 : start + 2] != b"~":
            assert _may_hold_single_tilde(text)


@pytest.mark.parametrize(
    ("body", "telegram", "feishu"),
    [
        ("- [ ] open\n- [x] done", "⦁ ☐ open\n⦁ ☑ done", "- ☐ open\n- ☑ done"),
        ("* [ ] open\n+ [X] done", "⦁ ☐ open\n⦁ ☑ done", "* ☐ open\n+ ☑ done"),
        ("1. [ ] open\n2. [x] done", "1. ☐ open\n2. ☑ done", "1. ☐ open\n2. ☑ done"),
        ("- a\n  - [ ] open\n  - [x] done", "⦁ a\n  ⦁ ☐ open\n  ⦁ ☑ done", None),
        ("> - [ ] quoted", "⦁ ☐ quoted", "> - ☐ quoted"),
        ("- - [ ] inner", None, "- - ☐ inner"),
        ("- [ ]\n", "⦁ ☐", "- ☐\n"),
        ("- [\t] tab\n- [\x0c] feed", "⦁ ☐ tab\n⦁ ☐ feed", "- ☐ tab\n- ☐ feed"),
        ("- text [ ] later", "⦁ text [ ] later", "- text [ ] later"),
        ("[ ] no list", "[ ] no list", "[ ] no list"),
        ("```\n- [ ] code\n```", "- [ ] code", "```\n- [ ] code\n```"),
        ("    - [x] indented code", "- [x] indented code", None),
        ("- `[ ]` code span", "⦁ [ ] code span", "- `[ ]` code span"),
    ],
)
def test_task_boxes_show_open_or_done_alike(
    body: str, telegram: str | None, feishu: str | None
) -> None:
    """An open task item showed ☑ on Telegram (the converter's box for it), the same as a
    done one, and `[ ]` on Feishu (its card Markdown has no task lists): both show ☐ for
    open and ☑ for done, in every kind of list; a `[ ]` that is no task marker stays."""
    if telegram is not None:
        assert markdown_to_rich(body).text == telegram
    if feishu is not None:
        assert feishu_markdown(body) == feishu
    assert task_boxes_as_text(task_boxes_as_text(body)) == task_boxes_as_text(body)


def test_a_card_cut_after_a_task_list_shows_its_boxes_on_feishu() -> None:
    """The Feishu card reads the body with its boxes written, cut or not."""
    body = "\n".join(f"- [{'x' if n % 2 else ' '}] item {n}" for n in range(3000))
    card = render_feishu(CardView(agent_id="a", state="running", auto_rows=(), body=body))
    assert card.text.count("☐ item") > 10 and "[ ]" not in card.text and "[x]" not in card.text
    assert "☐ item 0" in card.text and "☑ item 1" in card.text


@given(
    st.lists(
        st.sampled_from(
            ["- ", "1. ", "* ", "[ ]", "[x]", "[", "]", "x", " ", "\t", "\x0b", "\x0c", "\n", ">"]
        )
    )
)
@settings(max_examples=2000, deadline=None)
def test_the_task_guard_never_misses_a_box(parts: list[str]) -> None:
    """The parse for task markers runs only when the guard finds a list marker before a box."""
    text = "".join(parts)
    events = pyromark.events(text, options=STANDARD_OPTIONS)
    if any(isinstance(e, dict) and "TaskListMarker" in e for e in events):
        assert _MAY_BE_BOX.search(text) and _MAY_BE_TASK.search(text)
