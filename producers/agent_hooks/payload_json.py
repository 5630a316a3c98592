"""JSON from an agent host read so that one odd part never loses what the hooks need.

Python's JSON reader recurses, one level of the stack per array or object, and gives up near
1,000 levels; the hooks read only fields near the top, so what lies deeper is left out."""

from __future__ import annotations

import json
from typing import Any, Final

from taskcard.producers.task_card.contract import cut_deep, int_or_digits, load_json

# Arrays and objects nested deeper than this are read as `DEEP_MARKER`, when the whole would
# be too deep for Python's reader.
MAX_DEPTH: Final = 100
DEEP_MARKER: Final = f"(nested deeper than {MAX_DEPTH} levels: left out)"


def read_json(raw: bytes | str) -> Any:
    """A hook payload read as JSON, losing nothing the hook uses to what it never uses:

    - a lone surrogate escaped in a string (`"\\ud800"`) is read as U+FFFD: no line of the
      activity log could carry it (the event was lost with a traceback);
    - a byte that is not UTF-8 (in a tool's output, a message) is read as U+FFFD too: the
      whole event (a turn's end) was lost for one byte in a field never used;
    - a number longer than Python reads (4,300 digits) is read as its digits;
    - an array or object nested deeper than `MAX_DEPTH` levels (in a tool's input, say) is
      read as the string `DEEP_MARKER`: Python's reader recurses, and past about 990 levels
      the whole payload was "not JSON". The fields the hooks read are all near the top.

    Raises `ValueError` for what is not JSON."""
    try:
        return load_json(raw, parse_int=int_or_digits)
    except UnicodeDecodeError:
        if isinstance(raw, str):
            raise  # never: only bytes are decoded
        # With a byte-order mark kept as a character, the text was "not JSON" after all.
        return read_json(raw.decode("utf-8-sig", errors="replace"))
    except RecursionError:
        return load_json(_shallow(_text(raw)), parse_int=int_or_digits)


def loads_at_any_depth(raw: bytes | str) -> Any:
    """`json.loads(raw)`, raising as it does, except that past the depth Python's reader
    takes the parts nested deeper than `MAX_DEPTH` levels are read as `DEEP_MARKER`: for a
    transcript's lines, where a tool's deep input was in a line whose usage then went
    uncounted."""
    try:
        return json.loads(raw)
    except RecursionError:
        return json.loads(_shallow(_text(raw)))


def _text(raw: bytes | str) -> str:
    """`raw` as text, in the encoding `json.loads` would read it in; a byte that does not
    fit it is U+FFFD."""
    if isinstance(raw, str):
        return raw
    return raw.decode(json.detect_encoding(raw), errors="replace")


def _shallow(text: str) -> str:
    """`text` with each array or object that opens deeper than `MAX_DEPTH` levels replaced,
    whole, by `DEEP_MARKER` as a JSON string (`cut_deep`)."""
    return cut_deep(text, MAX_DEPTH, DEEP_MARKER) or text
