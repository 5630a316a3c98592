"""Feishu card rendering and error translation: pure functions, table-tested."""

from __future__ import annotations

import json
from typing import Any

import pyromark
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from taskcard.channels.base import (
    BODY_CUT_MARKER,
    SOURCE_BUDGET_FACTOR,
    AgentState,
    CardView,
    fit_view,
    precut_body,
)
from taskcard.channels.errors import (
    ChannelError,
    Forbidden,
    MessageGone,
    Permanent,
    RateLimited,
    Transient,
)
from taskcard.channels.feishu import card as card_module
from taskcard.channels.feishu.card import (
    CARD_BUDGET_BYTES,
    CARD_LIMIT_BYTES,
    HIDDEN_NOTICE,
    _converted_lines,
    _Prefixes,
    card_content,
    card_json,
    card_plain_text,
    card_request_bytes,
    feishu_markdown,
    render_card,
    render_text,
)
from taskcard.channels.feishu.errors import translate
from taskcard.channels.feishu.events import command_args
from taskcard.channels.telegram.render import render_card as telegram_render_card


def _card(view: CardView) -> dict[str, Any]:
    message = render_card(view)
    assert message.payload["msg_type"] == "interactive"
    card = json.loads(message.payload["content"])
    assert isinstance(card, dict)
    return card


def _markdown(card: dict[str, Any]) -> str:
    return next(e["content"] for e in card["body"]["elements"] if e["tag"] == "markdown")


@pytest.mark.parametrize(
    ("state", "template"),
    [
        ("running", "blue"),
        ("idle", "green"),
        ("waiting", "orange"),
        ("exited", "grey"),
        ("no output", "red"),
        ("unknown", "grey"),
    ],
)
def test_header_names_agent_and_colours_state(state: AgentState, template: str) -> None:
    card = _card(CardView("builder", state, ("row",), body="x"))
    assert card["schema"] == "2.0"
    assert card["config"]["update_multi"] is True
    assert card["header"]["title"]["content"] == "builder"
    assert card["header"]["subtitle"]["content"] == state
    assert card["header"]["template"] == template


def test_card_layout_rows_divider_body() -> None:
    card = _card(CardView("a", "running", ("state: running", "last: tests"), body="**bold**"))
    tags = [e["tag"] for e in card["body"]["elements"]]
    assert tags == ["div", "hr", "markdown"]
    assert card["body"]["elements"][0]["text"]["content"] == "state: running\nlast: tests"
    assert _markdown(card) == "**bold**"


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("# Title", "**Title**"),
        ("### Step 2 ###", "**Step 2**"),
        ("<at id=all></at> hi", "&lt;at id=all&gt;&lt;/at&gt; hi"),
        ("a & b", "a &amp; b"),
        ("> quoted <b>", "> quoted &lt;b&gt;"),
        ("![shot](https://x.test/a.png)", "[shot](https://x.test/a.png)"),
        ("![local](img/a.png)", "local"),
        ("- item **bold** `code`", "- item **bold** `code`"),
        ("```\n<raw> # not heading\n```", "```\n<raw> # not heading\n```"),
        ("```py\nunclosed <x>", "```py\nunclosed <x>\n```"),
        ("AT&amp;T &lt;x&gt; &copy;", "AT&amp;T &lt;x&gt; ©"),
        ("&#42;no&#42; \\*star\\* \\_x\\_ \\\\", "&#42;no&#42; &#42;star&#42; &#95;x&#95; &#92;"),
        ("&#60;at id=all&#62; \\<at id=all>", "&lt;at id=all&gt; &lt;at id=all&gt;"),
        ("&nosuch; &#10; &nbsp;", "&amp;nosuch; &#10; &#160;"),
        ("`&amp; \\*` &amp;", "`&amp;amp; \\*` &amp;"),
        ("[a &amp; b](https://x.test/?a=1&amp;b=2)", "[a &amp; b](https://x.test/?a=1&amp;b=2)"),
        # An escaped backtick is a backtick, never the start of code (CommonMark, Telegram).
        ("run \\`make\\` first", "run &#96;make&#96; first"),
        ("\\``code` \\\\`more`", "&#96;`code` &#92;`more`"),
        ("`a``b` and ` alone \\*", "`a``b` and ` alone &#42;"),
    ],
)
def test_markdown_is_converted_to_feishu_dialect(source: str, expected: str) -> None:
    assert feishu_markdown(source) == expected


def test_hidden_renders_one_line_notice_without_body() -> None:
    card = _card(CardView("builder", "running", ("row",), body="secret plan", hidden=True))
    text = card_plain_text(card)
    assert HIDDEN_NOTICE in text
    assert "secret plan" not in json.dumps(card)
    assert card["header"]["template"] == "grey"


class _Unconvertible(str):
    """A body whose conversion fails at its first step (splitting it into lines)."""

    def split(self, sep: str | None = None, maxsplit: int = -1) -> list[str]:
        raise ValueError("the body was converted")


def test_a_hidden_card_never_converts_its_body() -> None:
    body = _Unconvertible("**plan** with `code`")
    with pytest.raises(ValueError, match="converted"):
        render_card(CardView("builder", "running", body=body))
    hidden = render_card(CardView("builder", "running", ("row",), body=body, hidden=True))
    assert HIDDEN_NOTICE in hidden.text
    # What the chat sees does not depend on the body, the rows or the state.
    assert hidden == render_card(CardView("builder", "idle", hidden=True))


def test_cut_body_carries_the_marker() -> None:
    card = _card(CardView("a", "running", body="start", body_cut=True))
    assert _markdown(card).endswith(BODY_CUT_MARKER.replace(">", "&gt;"))


@pytest.mark.parametrize(
    "unit",
    ["a", "进度", "😀", '"\\', "<&>", "\nx"],
    ids=["ascii", "cjk", "emoji", "escaped", "entities", "newlines"],
)
def test_huge_body_always_fits_30_kb(unit: str) -> None:
    rows = tuple(f"activity row {i} " + unit * 50 for i in range(10))
    view = CardView("builder", "running", rows, body=unit * 100_000, body_note="note")
    message = render_card(view)
    content = message.payload["content"]
    assert card_request_bytes(content) <= CARD_LIMIT_BYTES
    card = json.loads(content)
    assert _markdown(card).endswith(BODY_CUT_MARKER.replace(">", "&gt;"))
    assert card["body"]["elements"][0]["text"]["content"].startswith("activity row 0")


def test_small_card_is_not_shrunk() -> None:
    rows = ("r1", "r2", "r3")
    card = _card(CardView("a", "idle", rows, body="short"))
    assert card["body"]["elements"][0]["text"]["content"] == "r1\nr2\nr3"
    assert BODY_CUT_MARKER not in _markdown(card)


def test_text_message_payload() -> None:
    message = render_text("agent builder: renderer failing")
    assert message.payload["msg_type"] == "text"
    assert json.loads(message.payload["content"]) == {"text": "agent builder: renderer failing"}
    assert message.text == "agent builder: renderer failing"


def test_fingerprint_changes_exactly_with_content() -> None:
    a = render_card(CardView("a", "running", ("r",), body="x"))
    b = render_card(CardView("a", "running", ("r",), body="x"))
    c = render_card(CardView("a", "running", ("r",), body="y"))
    assert a.fingerprint == b.fingerprint != c.fingerprint


APP, NARROW = "feishu:app", "feishu:message:om_1"


@pytest.mark.parametrize(
    ("status", "code", "headers", "kind", "scope", "retry_after_s"),
    [
        (429, 99991400, {"x-ogw-ratelimit-reset": "7"}, RateLimited, APP, 7.0),
        (400, 99991400, {"X-Ogw-Ratelimit-Reset": "3"}, RateLimited, APP, 3.0),
        (429, None, {}, RateLimited, APP, 1.0),
        (400, 230020, {}, RateLimited, NARROW, 1.0),
        (400, 230031, {}, MessageGone, None, None),
        (400, 230011, {}, MessageGone, None, None),
        (400, 230110, {}, MessageGone, None, None),
        (400, 230025, {}, Permanent, None, None),
        (400, 230027, {}, Forbidden, None, None),
        (400, 230002, {}, Forbidden, None, None),
        (400, 99991663, {}, Transient, None, None),
        (500, 1, {}, Transient, None, None),
        (502, None, {}, Transient, None, None),
        (400, 230001, {}, Permanent, None, None),
    ],
)
def test_error_translation(
    status: int,
    code: int | None,
    headers: dict[str, str],
    kind: type[ChannelError],
    scope: str | None,
    retry_after_s: float | None,
) -> None:
    error = translate(
        status=status,
        code=code,
        msg="m",
        headers=headers,
        app_scope=APP,
        narrow_scope=NARROW,
        operation="edit",
    )
    assert type(error) is kind
    if isinstance(error, RateLimited):
        assert error.scope == scope
        assert error.retry_after_s == retry_after_s


INVALID_MESSAGE_ID = "Your request contains an invalid request parameter, ext=invalid message_id."


@pytest.mark.parametrize(
    ("status", "code", "msg", "operation", "kind"),
    [
        (400, 230001, INVALID_MESSAGE_ID, "edit", MessageGone),
        (400, 230001, INVALID_MESSAGE_ID, "delete", MessageGone),
        (400, 230001, INVALID_MESSAGE_ID, "pin", MessageGone),
        (400, 230001, INVALID_MESSAGE_ID, "send", Permanent),
        (400, 230001, "ext=invalid receive_id.", "send", Permanent),
        (400, 230001, "ext=content is required.", "edit", Permanent),
        (404, 230001, "not found", "edit", MessageGone),
        (404, None, "", "delete", MessageGone),
        (404, 1, "not found", "send", Permanent),
        (400, 230110, "deleted", "edit", MessageGone),
        (400, 230110, "deleted", "delete", MessageGone),
        (400, 231003, "not found", "edit", MessageGone),
        (400, 231003, "not found", "delete", MessageGone),
        (400, 231003, "not found", "pin", MessageGone),
        (400, 231003, "not found", "reply", MessageGone),
        (400, 231003, "not found", "send", Permanent),
        (400, 232009, "dissolved", "send", Forbidden),
        (400, 232009, "dissolved", "edit", Forbidden),
        (400, 230053, "stopped", "send", Forbidden),
        (400, 230049, "being sent", "send", Transient),
        (400, 230049, "being sent", "reply", Transient),
    ],
)
def test_error_translation_per_operation(
    status: int, code: int | None, msg: str, operation: str, kind: type[ChannelError]
) -> None:
    error = translate(
        status=status,
        code=code,
        msg=msg,
        headers={},
        app_scope=APP,
        narrow_scope=NARROW,
        operation=operation,  # type: ignore[arg-type]
    )
    assert type(error) is kind


def test_success_translates_to_nothing() -> None:
    success = translate(
        status=200, code=0, msg="ok", headers={}, app_scope=APP, narrow_scope=APP, operation="send"
    )
    assert success is None


@pytest.mark.parametrize(
    ("text", "mention_key", "args"),
    [
        ("/taskcard", None, ""),
        ("/taskcard off", None, "off"),
        ("@_user_1 /taskcard  on ", "@_user_1", "on"),
        ("@_user_1 @_user_2 /taskcard 3", "@_user_2", None),
        ("@_user_2 /taskcard 3 @_user_1", "@_user_2", "3 @_user_1"),
        ("/taskcard off @_user_1", "@_user_1", "off"),
        ("@_user_12 /taskcard off", "@_user_1", None),
        ("@_user_1 /taskcard off", None, None),
        ("/taskcard@taskcard_bot 5", None, None),  # a bot name not known to be ours
        ("hello /taskcard", None, None),
        ("/taskcards", None, None),
        ("@_user_1", "@_user_1", None),
    ],
)
def test_command_text(text: str, mention_key: str | None, args: str | None) -> None:
    assert command_args(text, mention_key) == args


AT_ALL = "<at id=all></at>"
TICKS = "```"


@pytest.mark.parametrize(
    "body",
    [
        f"~~~\n{AT_ALL} tilde fence\n~~~",
        f"{TICKS}{AT_ALL}\n{TICKS}",
        f"    {TICKS}\n{AT_ALL} indented fence\n    {TICKS}",
        f"{TICKS}`\n{TICKS}\n{AT_ALL} four ticks\n{TICKS}`",
        f"{TICKS}\n{AT_ALL} plain code\n{TICKS}",
        f"{TICKS}\n< AT id=all></ at> spaced\n{TICKS}",
        f"{TICKS}\nx\n~~~\n{AT_ALL} after a tilde inside code",
        f"{TICKS}js title={AT_ALL}\n{TICKS}",
        f"{TICKS}\nunclosed {AT_ALL}",
    ],
    ids=["tilde", "info-string", "indented", "four-ticks", "code", "spaced", "tilde-in-code",
         "attribute", "unclosed"],
)  # fmt: skip
def test_no_live_mention_reaches_the_card_markdown_anywhere(body: str) -> None:
    markdown = feishu_markdown(body)
    lowered = markdown.lower().replace(" ", "")
    assert "<at" not in lowered and "</at" not in lowered, markdown


@given(
    st.lists(
        st.sampled_from(
            ["```", "```py", "~~~", "# head", "> quote", "[l](https://e.x)", "[j](javascript:x)",
             "<at id=all>", "&amp;", "  ", "\n", "text", "`code`", "中文", "😀", "**b", "a**",
             "_i", "i_", "~~s", "s~~ c", "*x* y", "    code", "- ```", "> ```", "````",
             "~~~~py"]
        ),
        max_size=40,
    ),
    st.integers(min_value=0),
)  # fmt: skip
@settings(max_examples=200, deadline=None)
def test_a_prefix_converts_as_the_whole_body_would(parts: list[str], where: int) -> None:
    """Fitting converts the body once and measures its prefixes from the converted lines: a
    prefix comes out as converting the body cut there would (a code block left open is
    closed, emphasis read in the whole body). What the cut's emphasis shows is checked
    against Telegram's reading of the whole body in test_overlapping_styles.py
    (`test_a_cut_shows_the_whole_bodys_styles_up_to_it`)."""
    body = "\n".join(parts)
    prefix = body[: where % (len(body) + 1)].rstrip()
    prefixes = _Prefixes(body)
    assert prefixes.markdown(prefix) == _converted_lines(prefixes.written(prefix))
    if not any(mark in body for mark in "*_~"):
        assert prefixes.markdown(prefix) == feishu_markdown(prefix)


def test_a_long_body_is_converted_once_however_often_it_is_cut(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Fitting a long body converted it whole once per cut measured (a dozen times, 0.4 s of
    CPU for 500 KB of short lines); now each line once, and the last line of each cut."""
    lines = [f"- item **{i}** & <b> [link](https://example.com/{i})" for i in range(10_000)]
    body = "\n".join(lines)
    converted: list[str] = []
    convert_line = card_module._convert_line

    def counted(line: str) -> str:
        converted.append(line)
        return convert_line(line)

    monkeypatch.setattr(card_module, "_convert_line", counted)
    rows = tuple(f"row {i}" for i in range(5))
    card = _card(CardView("dense", "running", rows, body=body))
    assert _markdown(card).endswith(BODY_CUT_MARKER.replace(">", "&gt;"))
    kept = body[: SOURCE_BUDGET_FACTOR * CARD_BUDGET_BYTES]  # what can show at all
    assert len(converted) <= kept.count("\n") + 1 + 64  # a line once, and each cut's last
    shown = _markdown(card).removesuffix(BODY_CUT_MARKER.replace(">", "&gt;"))
    assert feishu_markdown(body).startswith(shown)


def _parsed_lengths(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The length of each text the CommonMark parser is given from now on."""
    lengths: list[int] = []
    parse = pyromark.events_with_range

    def counted(text: str, **options: Any) -> Any:
        lengths.append(len(text))
        return parse(text, **options)

    monkeypatch.setattr(pyromark, "events_with_range", counted)
    return lengths


def _whole_reading_card(view: CardView) -> dict[str, Any]:
    """The card as fitting it with the emphasis of the whole precut body read would give."""
    view = precut_body(view, CARD_BUDGET_BYTES * SOURCE_BUDGET_FACTOR)
    prefixes = _Prefixes(view.body or "")

    def converted(candidate: CardView) -> dict[str, Any]:
        body = candidate.body
        return card_json(candidate, None if body is None else prefixes.markdown(body))

    def size(candidate: CardView) -> int:
        return card_request_bytes(card_content(converted(candidate)))

    return converted(fit_view(view, size, CARD_BUDGET_BYTES))


LONG_BODIES = {
    "marks": "*a **b _c ~~d " * 4600,
    "tildes": "~a " * 21000,
    "hostile": "~$*_" * 64000,
    "styled lines": "\n".join(["**w** `x` _y_ ~~z~~ " * 40] * 100),
    "prose": ("All good here, step 3 of 7 done. " * 20 + "\n") * 200,
    # Links to no web address show as their words: the source shrinks so much that the
    # whole precut body fits, and is read to its end (in more than one step).
    "shrinking": "\n\n".join(
        f"[step {i} **done**](file:///{'x' * 300}/{i}) and _more_" for i in range(2000)
    ),
}


@pytest.mark.parametrize("name", LONG_BODIES)
def test_only_the_part_of_a_long_body_that_can_show_is_read(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Reading the emphasis of the whole precut body (4 x 30 KB of source) took up to 0.5 s of
    event-loop time for a body dense with marks, most of it past the cut; the card is the
    same as that reading gives, and the parser reads little more than what shows."""
    body = LONG_BODIES[name]
    view = CardView("dense", "running", ("row 1", "row 2"), body=body)
    expected = _whole_reading_card(view)
    card_module._READINGS.clear()
    lengths = _parsed_lengths(monkeypatch)
    card = _card(view)
    assert card == expected
    shown = len(card_plain_text(card))
    assert bool(lengths) == any(mark in body for mark in "*_~")  # read if it has marks
    if name == "shrinking":
        assert max(lengths) == CARD_BUDGET_BYTES * SOURCE_BUDGET_FACTOR
    else:
        assert all(length <= max(2 * shown, CARD_BUDGET_BYTES) for length in lengths), shown


def test_a_body_rendered_again_is_not_read_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each route renders the same body (and again when only the automatic rows move): its
    reading is kept, as Telegram keeps its conversion."""
    body = "**bold _both** italic_ " * 3000
    lengths = _parsed_lengths(monkeypatch)
    first = _card(CardView("dense", "running", ("row 1",), body=body))
    read = len(lengths)
    again = _card(CardView("dense", "running", ("row 2",), body=body))
    assert read > 0 and len(lengths) == read
    assert _markdown(first) == _markdown(again)


def test_the_readings_kept_stay_within_their_budget() -> None:
    """Readings are kept per body, up to a million characters of bodies together (a reading
    of a body of marks takes about 100 bytes a character); the last one is always kept."""
    card_module._READINGS.clear()
    bodies = [f"agent {index} " + "all good " * 33_000 for index in range(8)]  # 300 K each
    for body in bodies:
        prefixes = card_module._prefixes(body)
        assert card_module._prefixes(body) is prefixes  # kept
        assert sum(map(len, card_module._READINGS)) <= 1_000_000
    assert list(card_module._READINGS) == bodies[-3:]  # the least recently used went
    card_module._READINGS.clear()


def test_a_cut_card_keeps_its_kept_rows_and_falls_back_to_one_when_they_cannot_fit() -> None:
    # As on Telegram: the state and the problem rows stay on a card whose body is cut; rows
    # that could never fit leave the first row alone.
    rows = ("state: running", "⚠ ledger/long-task-ledger.json: is a folder", "last: tests")
    view = CardView("a", "running", rows, body="line of a long body\n" * 8000, kept_rows=2)
    out = render_card(view)
    assert "⚠ ledger/long-task-ledger.json: is a folder" in out.text
    assert "last: tests" not in out.text and BODY_CUT_MARKER in out.text
    assert card_request_bytes(out.payload["content"]) <= CARD_BUDGET_BYTES
    huge = ("state: running", "⚠ " + "x" * 40_000, "last: tests")
    out = render_card(CardView("a", "running", huge, body="body", kept_rows=2))
    assert "state: running" in out.text and "x" * 100 not in out.text
    assert card_request_bytes(out.payload["content"]) <= CARD_BUDGET_BYTES


def test_a_code_line_cut_to_a_bare_fence_converts_as_the_cut_body() -> None:
    # Found by the property test above: "```py" inside an open block, cut to "```", closes
    # the block in the cut body, which the whole body's reading did not say.
    body = "```py\n```py"
    prefixes = _Prefixes(body)
    assert prefixes.markdown("```py\n```") == _converted_lines(prefixes.written("```py\n```"))
    assert prefixes.markdown("```py\n```") == feishu_markdown("```py\n```")
    # Cut to nothing, a body opening with indented code shows no empty code block.
    assert _Prefixes("    code").markdown("") == feishu_markdown("") == ""


@pytest.mark.parametrize(
    "body", ["v0", "# B\nv0", "- a\n- b", "```\ncode", "```\ncode\n```", "line\\", "**bold**"]
)
@pytest.mark.parametrize("padding", ["\n", "\n\n\n", "  \n \t\n", "\r\n", " "])
def test_white_space_at_the_end_of_a_body_costs_no_update(body: str, padding: str) -> None:
    """A renderer that pads its output with blank lines wrote a new Feishu card each time
    (the markdown element kept them), while Telegram's text, which drops them, stayed the
    same bytes and sent nothing. The bytes of both are now those of the body unpadded."""
    padded = CardView("builder", "running", ("row",), body=body + padding)
    plain = CardView("builder", "running", ("row",), body=body)
    assert render_card(padded).payload == render_card(plain).payload
    assert telegram_render_card(padded).fingerprint == telegram_render_card(plain).fingerprint
