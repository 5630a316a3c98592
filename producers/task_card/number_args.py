"""Numbers as typed on the command line: one reading for every numeric option of `taskcard`.

Python's `int` and `float` take more than a person means to type: digits of other scripts
(`１０`, `٣`), underscores between digits (`1_0`) and white space around the number, so
`--max-depth １０` was taken as 10 and `--bytes 1_0` as 10. Every float option reads its text
with `decimal_number` (ASCII digits 0-9 with an optional sign, a decimal point and an exponent;
`inf` and `nan` pass the form and meet each option's own range check). Every integer option
reads it with `whole_number`: ASCII digits with an optional sign, or a number in the float's
form whose value is whole (`2.0`, `1e3`), taken as exactly that int (read as a decimal, never
through a float, which took `2.0000000000000001` as 2), so a flag takes what the same field
takes in JSON (below); a fraction, NaN or an infinity is refused, saying the fix.
Anything else is a usage error (exit 2); argparse puts the option's name before the message,
which says the form expected.

Numbers in JSON (an MCP tool's arguments, a `task_card` envelope given to `taskcard tool`, the
host socket or the Python API) are read by `whole_numbers`: a field typed `integer` takes a
whole number written as a float (`2.0`, `1e3`) as that int, and refuses a fraction, NaN, an
infinity, a boolean or text, naming the field. The MCP server applies it to every tool's
arguments and `parse_envelope` to every envelope, so each way in takes the same values.
"""

from __future__ import annotations

import argparse
import decimal
import json
import math
import re
import sys
from collections.abc import Mapping
from typing import Any, Final

from taskcard.producers.task_card.contract import quoted

_WHOLE: Final = re.compile(r"[+-]?[0-9]+")
_DECIMAL: Final = re.compile(
    r"[+-]?(?:(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?|inf|infinity|nan)",
    re.IGNORECASE,
)
_FLOAT_MAX: Final = decimal.Decimal(sys.float_info.max)
WHOLE_FORM: Final = "write ASCII digits 0-9 with an optional sign, e.g. 10"
DECIMAL_FORM: Final = (
    "write ASCII digits 0-9 with an optional sign, decimal point and exponent, e.g. 2.5"
)


def whole_number(text: str, what: str = "a whole number") -> int:
    """An argparse `type=` for an integer option, or the form check of one that checks a
    range too (`what` names what the option counts, e.g. "a seq, the last one you read"):
    ASCII digits with an optional sign, or a float's form (`2.0`, `1e3`) of a finite whole
    number, as `whole_numbers` takes an integer field of JSON."""
    if not _WHOLE.fullmatch(text):
        if not _DECIMAL.fullmatch(text):
            raise argparse.ArgumentTypeError(f"{quoted(text)} is not {what}; {WHOLE_FORM}")
        return _exactly_whole(text, what)
    try:
        return int(text)
    except ValueError:  # more digits than Python converts (4,300)
        raise argparse.ArgumentTypeError(
            f"{quoted(text)} has too many digits ({len(text)}); give a smaller number"
        ) from None


def _exactly_whole(text: str, what: str) -> int:
    """A number in a float's form (`2.0`, `1e3`) as the int it is, read exactly: through a
    float, `2.0000000000000001` was taken as 2 and `9007199254740993.0` as one less."""
    try:
        value = decimal.Decimal(text)
    except decimal.InvalidOperation:  # an exponent past what any decimal holds (1e99...9)
        value = decimal.Decimal("Infinity")
    # Past the largest float, JSON reads the same text as an infinity: refused alike (and
    # `1e99999999` is never made digit by digit).
    if not value.is_finite() or value.copy_abs() > _FLOAT_MAX:
        raise argparse.ArgumentTypeError(f"{quoted(text)} is not {what}; {_fix(math.inf)}")
    if value != value.to_integral_value():
        raise argparse.ArgumentTypeError(f"{quoted(text)} is not {what}; {_fix(0.5)}")
    return int(value)


def in_digits(text: str) -> bool:
    """Whether `text` is a whole number written in ASCII digits with an optional sign, not in a
    float's form: for a reader that keeps `2.0` a float where the value's type is free."""
    return _WHOLE.fullmatch(text) is not None


def decimal_number(text: str, what: str = "a number") -> float:
    """An argparse `type=` for a float option, or the form check of one that checks a range
    too (`what` names what the option counts, e.g. "a number of seconds"): ASCII digits with
    an optional sign, decimal point and exponent (or `inf`, `nan`)."""
    if not _DECIMAL.fullmatch(text):
        raise argparse.ArgumentTypeError(f"{quoted(text)} is not {what}; {DECIMAL_FORM}")
    return float(text)


def _json_kind(value: object) -> str:
    """How a JSON value that is not a number is named in a refusal."""
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, str):
        return "text; give the number without quotes"
    return "a list" if isinstance(value, list) else "an object"


def whole_numbers(
    schema: Mapping[str, Any], arguments: Mapping[str, Any], where: str = ""
) -> tuple[dict[str, Any], str | None]:
    """The arguments with every field the schema types `integer` (at any depth of its object
    properties) as an `int`, and the refusal of the first that is not a whole number (None:
    all fine). JSON Schema counts `2.0` as an integer, and clients written in JavaScript send
    a whole number so. Still refused, naming the field: a fraction, NaN or an infinity, a
    boolean, text. The range is left to the caller's own check, as for any int."""
    fields = schema.get("properties", {})
    checked = dict(arguments)
    for name, value in arguments.items():
        spec = fields.get(name)
        if value is None or not isinstance(spec, dict):
            continue
        path = f"{where}{name}"
        if spec.get("type") == "object" and isinstance(value, Mapping):
            checked[name], refused = whole_numbers(spec, dict(value), f"{path}.")
            if refused is not None:
                return dict(arguments), refused
        elif spec.get("type") != "integer" or (
            isinstance(value, int) and not isinstance(value, bool)
        ):
            continue
        elif isinstance(value, float) and math.isfinite(value) and value.is_integer():
            checked[name] = int(value)
        else:
            return dict(arguments), f"{path}: must be a whole number, not {_not_whole(value)}"
    return checked, None


def _not_whole(value: object) -> str:
    """What a value given for an integer field is, and the fix, for the refusal."""
    if isinstance(value, float):
        return f"{json.dumps(value)}; {_fix(value)}"
    return _json_kind(value)


def _fix(value: float) -> str:
    """The fix for a float given where a whole number is wanted."""
    return "drop the fraction" if math.isfinite(value) else "give a finite whole number"
