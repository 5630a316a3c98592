"""The contract's text helpers: what shows, and agent text flattened into one plain line."""

from __future__ import annotations

import pytest

from taskcard.producers.task_card.contract import (
    MAX_STACKED_MARKS,
    escape_controls,
    limit_mark_stacks,
    one_line,
    one_line_cut,
    shown_body,
    shows_text,
)


@pytest.mark.parametrize(
    ("text", "shows"),
    [
        ("ok", True),
        ("\u05e9\u05dc\u05d5\u05dd", True),  # Hebrew
        ("\U0001f44d", True),
        ("", False),
        (" \t\n\u3000", False),
        ("\u200b\u200c\u200d\u2060\ufeff", False),  # zero-width and format characters
        ("\u3164\u115f\u1160\uffa0\u2800", False),  # Hangul fillers, blank braille
        ("\u0301\u0308\u20dd", False),  # combining marks with nothing to combine with
        ("\u202e\u2066\u200f\u061c", False),  # bidi controls only
        ("\x1b\x07\x85", False),
    ],
)
def test_shows_text(text: str, shows: bool) -> None:
    assert shows_text(text) is shows


def flag(region: str) -> str:
    """A black flag followed by `region` in tag letters and a cancel tag."""
    return "\U0001f3f4" + "".join(chr(0xE0000 + ord(c)) for c in region) + "\U000e007f"


@pytest.mark.parametrize(
    ("text", "line"),
    [
        ("plain words", "plain words"),
        ("\u202erennalp", "rennalp"),
        ("a\u2067b\u2069c\u200ed\u200fe\u061cf", "abcdef"),
        ("one\ntwo\r\nthree\u2028four\u2029five\x85six", "one two three four five six"),
        ("red \x1b[31mword\x07", "red [31mword"),
        ("  spaced \t out  ", "spaced out"),
        ("\u200b\u2060", ""),
        ("ok" + "".join(chr(0xE0000 + ord(c)) for c in "hidden") + " done", "ok done"),
        # The three recommended subdivision flags keep their tags; any other run of tag
        # letters after a black flag is hidden text and goes.
        (f"go {flag('gbsct')}{flag('gbwls')}!", f"go {flag('gbsct')}{flag('gbwls')}!"),
        (f"go {flag('gbengland')}", "go \U0001f3f4"),
        (f"{flag('gbeng')[:-1]} x", "\U0001f3f4 x"),  # no cancel tag: not a flag
        ("e" + "\u0301" * 40, "e" + "\u0301" * MAX_STACKED_MARKS),
        ("Vi\u1ec7\u0323t", "Vi\u1ec7\u0323t"),  # ordinary stacked diacritics stay
    ],
)
def test_one_line(text: str, line: str) -> None:
    assert one_line(text) == line


@pytest.mark.parametrize(
    ("text", "limit", "line"),
    [
        ("short", 10, "short"),
        ("a\nb\r\nc\vd", 20, "a b c d"),
        ("exactly10!", 10, "exactly10!"),
        ("one two three four", 9, "one two…"),
        ("x" * 50, 5, "xxxx…"),
        ("\u200b\u2060", 5, ""),
    ],
)
def test_one_line_cut(text: str, limit: int, line: str) -> None:
    """One line of at most `limit` characters, a cut one ending in an ellipsis."""
    assert one_line_cut(text, limit) == line
    assert len(one_line_cut(text, limit)) <= limit


def test_mark_stacks_are_bounded_per_character_only() -> None:
    zalgo = ("a" + "\u0336" * 9) * 3
    assert limit_mark_stacks(zalgo) == ("a" + "\u0336" * MAX_STACKED_MARKS) * 3
    assert limit_mark_stacks("plain\nascii") == "plain\nascii"


def test_escape_controls_keeps_tab_and_newline() -> None:
    assert escape_controls("a\tb\nc\x1b[2Jd\x00\x9b") == "a\tb\nc\\x1b[2Jd\\x00\\x9b"


def test_a_body_keeps_its_markdown_and_loses_its_controls() -> None:
    body = "# title\r\n**bold** \x1b[2J\ttab\rnext\u2028sep `code` [x](https://a.example)"
    assert shown_body(body) == (
        "# title\n**bold** [2J\ttab\nnext\nsep `code` [x](https://a.example)"
    )
