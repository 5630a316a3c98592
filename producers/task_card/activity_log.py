"""The one validated writer of `logs/events.jsonl`, shared by `taskcard activity` and the hooks.

Every line the service reads should be well formed: a known kind, its required fields present
with the right types, `ts` in UTC ISO-8601, appended with one `write` so concurrent writers
(parallel tool hooks, a script) never interleave. It lives on the producer side because the
agent-host hooks run in the agent's domain and must not import the projection service.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Final

from taskcard.producers.task_card.contract import (
    EVENT_KINDS,
    MAX_DURATION_S,
    ORIGIN_FORMS,
    CardPaths,
    Origin,
    append_jsonl_line,
    count_field,
    duration_field,
    parse_origin,
)

# Required fields and their accepted types per kind (the activity log contract).
REQUIRED_FIELDS: Final[dict[str, dict[str, tuple[type, ...]]]] = {
    "agent.start": {},
    "agent.exit": {},
    "turn.start": {},
    "turn.end": {},
    "tool.start": {"call_id": (str,), "name": (str,)},
    "tool.end": {"call_id": (str,), "ok": (bool,)},
    "text": {"text": (str,)},
    "usage": {"input_tokens": (int,), "output_tokens": (int,)},
    "wait.start": {"reason": (str,)},
    "wait.end": {"reason": (str,)},
    "turn.origin": {"origin": (str,)},
}
OPTIONAL_FIELDS: Final[dict[str, dict[str, tuple[type, ...]]]] = {
    "agent.start": {"pid": (int,)},
    "agent.exit": {"code": (int,)},
    "turn.start": {"origin": (str,)},
    "turn.end": {"error": (str,)},
    "tool.start": {"summary": (str,)},
    "tool.end": {"duration_s": (int, float)},
}
# Fields whose value has a range besides its type, checked as the service reads them (a
# negative token count was written, then read as unknown, and the card showed nothing).
RANGES: Final[dict[str, tuple[Callable[[object], object], str]]] = {
    "input_tokens": (count_field, "a whole count of 0 or more"),
    "output_tokens": (count_field, "a whole count of 0 or more"),
    "pid": (count_field, "a process id, 0 or more"),
    "duration_s": (duration_field, f"seconds from 0 to {MAX_DURATION_S:g}"),
}
RESERVED_FIELDS: Final = frozenset({"kind", "ts"})
TYPE_NAMES: Final = {str: "text", int: "an integer", float: "a number", bool: "true or false"}


class ActivityInputError(ValueError):
    """The fields do not describe a valid event; the message names the field and the fix."""


def typed_fields(kind: str) -> dict[str, tuple[type, ...]]:
    """Every field of `kind` whose type is fixed by the contract."""
    return {**OPTIONAL_FIELDS.get(kind, {}), **REQUIRED_FIELDS.get(kind, {})}


def has_type(value: object, expected: tuple[type, ...]) -> bool:
    """`isinstance`, except that a bool never passes for a number."""
    return isinstance(value, expected) and (bool in expected or not isinstance(value, bool))


def event_record(kind: str, fields: Mapping[str, Any], *, ts: str) -> dict[str, Any]:
    """The validated record for `kind` with `fields`; raises `ActivityInputError`."""
    if kind not in EVENT_KINDS:
        raise ActivityInputError(
            f"KIND: unknown kind {kind!r}; use one of {', '.join(sorted(EVENT_KINDS))}"
        )
    typed = typed_fields(kind)
    record: dict[str, Any] = {"ts": ts, "kind": kind}
    for key, value in fields.items():
        if key in RESERVED_FIELDS:
            raise ActivityInputError(f"{key}: set by the writer itself; remove it")
        for text in (key, value) if isinstance(value, str) else (key,):
            try:
                text.encode()
            except UnicodeEncodeError:
                # Bytes that are not UTF-8 in a command-line argument arrive as surrogates,
                # which no line of the log can carry: the append failed with a traceback.
                raise ActivityInputError(
                    f"{key.encode(errors='replace').decode()}: not UTF-8 text "
                    "(bytes of another encoding?); give it as UTF-8"
                ) from None
        expected = typed.get(key)
        if expected is not None and not has_type(value, expected):
            names = " or ".join(TYPE_NAMES[t] for t in expected)
            raise ActivityInputError(f"{key}: must be {names} for {kind}, got {value!r}")
        if expected is not None and key in RANGES and RANGES[key][0](value) is None:
            raise ActivityInputError(f"{key}: {value!r} is out of range; use {RANGES[key][1]}")
        record[key] = value
    missing = [name for name in REQUIRED_FIELDS[kind] if name not in record]
    if missing:
        example = " ".join(f"{name}=..." for name in missing)
        raise ActivityInputError(f"{', '.join(missing)}: required for {kind}; add {example}")
    check_origin(record)
    return record


def check_origin(record: Mapping[str, Any]) -> None:
    """An `origin` field must be written `<channel>:<chat_id>[:<thread_id>]`; raises
    `ActivityInputError` naming the field and the accepted forms otherwise."""
    if "origin" not in record:
        return
    origin = parse_origin(record["origin"])
    if not isinstance(origin, Origin):
        raise ActivityInputError(f"origin: {origin} (forms: {ORIGIN_FORMS})")


def append_event(paths: CardPaths, record: dict[str, Any]) -> None:
    """Append one record built by `event_record` as one whole line."""
    append_jsonl_line(paths.events, record, inside=paths.workdir)
