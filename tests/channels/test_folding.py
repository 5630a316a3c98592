"""The one folding rule (`channels.base.folded`) as a pattern (`folding_pattern`): the
characters it is built from (`folding_table`) are found in `FOLDING_BLOCKS` alone, which
must hold every character `folded` reads as ASCII letters and digits; checked here against
every code point of this Python's Unicode, so the table reads as the whole scan did."""

from __future__ import annotations

import re
import sys

import pytest

from taskcard.channels.base import TASKCARD_WORDS, folded, folding_pattern, folding_table


def test_the_blocks_hold_every_character_read_as_ascii_letters_and_digits() -> None:
    found: dict[str, set[str]] = {}
    for code in range(sys.maxunicode + 1):
        read = folded(chr(code))
        if read.isascii() and read.isalnum():
            found.setdefault(read, set()).add(chr(code))
    table = {read: set(chars) for read, chars in folding_table().items()}
    assert table == found, "a Unicode update: add the blocks missing from FOLDING_BLOCKS"


@pytest.mark.parametrize("word", TASKCARD_WORDS)
@pytest.mark.parametrize(
    "form",
    [
        str,
        str.upper,
        str.title,
        lambda w: "".join(chr(ord(c) - 0x20 + 0xFF00) for c in w.upper()),  # full width
        lambda w: w.replace("ff", "ﬀ").replace("st", "ﬆ").replace("fi", "ﬁ"),
    ],
)
def test_each_option_is_found_as_folded_reads_it(word: str, form: object) -> None:
    assert callable(form)
    typed = form(word)
    assert folded(typed) == word
    assert re.fullmatch(folding_pattern(word), typed), typed


def test_a_longer_word_or_another_letter_is_not_the_option() -> None:
    assert re.fullmatch(folding_pattern("off"), "oﬀline") is None
    assert re.fullmatch(folding_pattern("off"), "oﬁ") is None
    assert re.match(folding_pattern("off"), "oﬀline")
    assert re.fullmatch(folding_pattern("status"), "ﬅatus")
