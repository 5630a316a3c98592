"""Numbers as typed on the command line: one reading for every numeric option of `taskcard`.

Python's `int` and `float` take more than a person means to type: digits of other scripts
(`１０`, `٣`), underscores between digits (`1_0`) and white space around the number, so
`--max-depth １０` was taken as 10 and `--bytes 1_0` as 10. Every integer option of every
command reads its text with `whole_number` (ASCII digits 0-9 with an optional sign) and every
float option with `decimal_number` (the same, with a decimal point and an exponent; `inf` and
`nan` pass the form and meet each option's own range check). Anything else is a usage error
(exit 2); argparse puts the option's name before the message, which says the form expected.
"""

from __future__ import annotations

import argparse
import re
from typing import Final

from taskcard.producers.task_card.contract import quoted

_WHOLE: Final = re.compile(r"[+-]?[0-9]+")
_DECIMAL: Final = re.compile(
    r"[+-]?(?:(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?|inf|infinity|nan)",
    re.IGNORECASE,
)
WHOLE_FORM: Final = "write ASCII digits 0-9 with an optional sign, e.g. 10"
DECIMAL_FORM: Final = (
    "write ASCII digits 0-9 with an optional sign, decimal point and exponent, e.g. 2.5"
)


def whole_number(text: str, what: str = "a whole number") -> int:
    """An argparse `type=` for an integer option, or the form check of one that checks a
    range too (`what` names what the option counts, e.g. "a seq, the last one you read"):
    ASCII digits with an optional sign."""
    if not _WHOLE.fullmatch(text):
        raise argparse.ArgumentTypeError(f"{quoted(text)} is not {what}; {WHOLE_FORM}")
    try:
        return int(text)
    except ValueError:  # more digits than Python converts (4,300)
        raise argparse.ArgumentTypeError(
            f"{quoted(text)} has too many digits ({len(text)}); give a smaller number"
        ) from None


def decimal_number(text: str, what: str = "a number") -> float:
    """An argparse `type=` for a float option, or the form check of one that checks a range
    too (`what` names what the option counts, e.g. "a number of seconds"): ASCII digits with
    an optional sign, decimal point and exponent (or `inf`, `nan`)."""
    if not _DECIMAL.fullmatch(text):
        raise argparse.ArgumentTypeError(f"{quoted(text)} is not {what}; {DECIMAL_FORM}")
    return float(text)
