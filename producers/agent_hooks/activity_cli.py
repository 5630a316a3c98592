"""`taskcard activity --workdir W KIND [key=value ...]`: one line in `logs/events.jsonl`.

Shell scripts and agent hooks feed the automatic slot with this command instead of writing
JSON by hand, so every line the service reads is well formed: the kind is known, its required
fields are present with the right types, `ts` is UTC ISO-8601, and the line is appended with
one `write` so concurrent writers never interleave. Bad input exits with code 2 and a message
naming the field and the fix; nothing is written then. Fields of the caller's own are carried
as given, except one spelt almost like a field of the kind (`sumary`), which is refused as
the typo it is. A `text` event whose text is blank is refused too: it would put no words on
the card (it still counted as activity), and the caller never learnt that its text was empty.
This is the command line's rule; the hooks, which never write a blank text, call
`event_record` directly.
"""

from __future__ import annotations

import argparse
import difflib
import math
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from taskcard.producers.task_card.activity_log import (
    RESERVED_FIELDS,
    ActivityInputError,
    event_record,
    typed_fields,
)
from taskcard.producers.task_card.contract import (
    EVENT_KINDS,
    CardPaths,
    append_jsonl_line,
    shows_text,
    utc_now_iso,
)
from taskcard.producers.task_card.number_args import (
    decimal_number,
    in_digits,
    whole_number,
)
from taskcard.producers.task_card.workdir_arg import existing_workdir_arg


def parse_value(text: str) -> Any:
    """`12` -> int, `1.5` -> float, `true`/`false` -> bool, anything else stays text.

    A number is read as every numeric option of the command line reads one (`number_args`):
    `１０`, `1_0` or ` 3` stay text, so a field that must be an integer refuses them, naming
    itself, where `int` took them as 10, 10 and 3."""
    if text in ("true", "false"):
        return text == "true"
    if in_digits(text):  # `2.0` stays a float here: the field's type says what it must be
        try:
            return whole_number(text)
        except argparse.ArgumentTypeError:
            pass
    try:
        number = decimal_number(text)
    except argparse.ArgumentTypeError:
        return text
    return number if math.isfinite(number) else text


def _misspelt(key: str, known: Iterable[str]) -> list[str]:
    """The field of the kind that `key` is a typo of, if any: close in spelling, and not the
    field with something added at its end (`names=`, `oks=`, `name_2=` are fields of their
    own, as scripts use them)."""
    return [
        name
        for name in difflib.get_close_matches(key, list(known), n=1, cutoff=0.8)
        if not key.startswith(name)
    ]


def build_event(kind: str, assignments: list[str], *, ts: str) -> dict[str, Any]:
    """The event record for `kind` and `key=value` assignments, validated by the one writer
    (`activity_log.event_record`) the hooks use too, ranges included."""
    if kind not in EVENT_KINDS:
        raise ActivityInputError(
            f"KIND: unknown kind {kind!r}; use one of {', '.join(sorted(EVENT_KINDS))}"
        )
    typed = typed_fields(kind)
    fields: dict[str, Any] = {}
    for item in assignments:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise ActivityInputError(f"{item!r}: expected key=value, for example name=pytest")
        if key in RESERVED_FIELDS:
            raise ActivityInputError(f"{key}: set by the command itself; remove {key}=...")
        if key in fields:
            raise ActivityInputError(f"{key}: given twice; keep one {key}=...")
        near = [] if key in typed else _misspelt(key, typed)
        if near:
            # A field of its own is carried as given, but one this close to a field of the
            # kind is a typo: `sumary=...` was written and the card never showed the summary.
            raise ActivityInputError(
                f"{key}: not a field of {kind}; did you mean {near[0]}=...? "
                f"({kind} reads {', '.join(sorted(typed))})"
            )
        if typed.get(key) == (int,):
            # Read as every integer option reads its text (`2.0` and `1e3` exactly; `true`
            # or `1.5` refused saying the form), not as a number of any type the field
            # then refused as "got 1000.0".
            try:
                fields[key] = whole_number(raw)
            except argparse.ArgumentTypeError as exc:
                raise ActivityInputError(f"{key}: {exc}") from None
        else:
            fields[key] = raw if typed.get(key) == (str,) else parse_value(raw)
    text = fields.get("text")
    if kind == "text" and isinstance(text, str) and not shows_text(text):
        # `text text="$MSG"` with an empty variable was written with exit 0 and put no words
        # on the card (a sign of life only). A blank call_id, name or reason still pairs a
        # tool call or opens a wait, so only the text kind's own field is checked.
        raise ActivityInputError(
            "text: must show text (not only white space or invisible characters); "
            "give text=... the words to show"
        )
    return event_record(kind, fields, ts=ts)


def run(args: argparse.Namespace) -> int:
    """Handler of `taskcard activity`."""
    try:
        record = build_event(args.kind, list(args.fields), ts=utc_now_iso())
    except ActivityInputError as exc:
        print(f"taskcard activity: {exc}", file=sys.stderr)
        return 2
    workdir: Path = args.workdir
    try:
        append_jsonl_line(CardPaths(workdir).events, record, inside=workdir)
    except OSError as exc:
        print(f"taskcard activity: cannot append to logs/events.jsonl: {exc}", file=sys.stderr)
        return 1
    return 0


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    kinds = ", ".join(sorted(EVENT_KINDS))
    parser = subparsers.add_parser(
        "activity",
        help="append one activity event to <workdir>/logs/events.jsonl",
        description=(
            "Append one well-formed activity event for the automatic slot of the card. "
            f"Kinds: {kinds}. Values: integers, numbers (ASCII digits), true/false, else text."
        ),
    )
    parser.add_argument(
        "--workdir", type=existing_workdir_arg, default=".", help="the agent's working directory"
    )
    parser.add_argument("kind", metavar="KIND", help="the event kind, for example tool.start")
    parser.add_argument(
        "fields",
        metavar="key=value",
        nargs="*",
        default=[],  # optional: without a default argparse calls it required when KIND is missing
        help="event fields, e.g. call_id=c1 name=pytest",
    )
    parser.set_defaults(handler=run)
