"""The strict LTP-v2 envelope of the `task_card` tool and its JSON Schema.

One pydantic model per action input, closed (`extra="forbid"`) and strict (no coercion of
`"5"` to 5 or `true` to 1), so the schema the MCP server advertises and the validation the
host applies come from the same source and cannot drift. Validation errors are rewritten into
one sentence per problem that names the field and what is allowed, because the reader is an
agent that has to fix its call, not a developer reading a traceback.

Before the schema, the transport: every way in (the `tool` argument or stdin, the host
socket, MCP arguments, the Python API) goes through `decode_envelope` / `check_values`, so
hostile bytes get the same one-sentence refusal everywhere instead of a decoder's message or
a traceback. Refused: more than `MAX_ENVELOPE_BYTES`, invalid UTF-8, a NUL byte, nesting
deeper than `MAX_ENVELOPE_DEPTH` (checked by a linear scan before any recursive parser sees
the text), `NaN`/`Infinity`, truncated or otherwise invalid JSON, a top level that is not an
object, strings that are not valid Unicode (a lone surrogate such as `"\\ud800"`), and an
object that names one key twice. Then the numbers: an integer field given a whole number
written as a float (`2.0`, as JSON Schema counts it) is taken as that int, by the same
`number_args.whole_numbers` the MCP server applies to every tool, so `taskcard tool`, the
Python API and MCP take the same values.
"""

from __future__ import annotations

import functools
import json
import math
import re
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from taskcard.producers.task_card.contract import (
    json_cut_short,
    json_kind,
    quoted,
    shown_field,
    shows_text,
)
from taskcard.producers.task_card.number_args import whole_numbers
from taskcard.producers.task_card.settings import BOUNDS

ActionName = Literal["start", "inspect", "retry", "stop", "remove", "settings", "manual"]

# Declared order: `settings` sits immediately before `manual`.
ACTIONS: Final[tuple[ActionName, ...]] = (
    "start",
    "inspect",
    "retry",
    "stop",
    "remove",
    "settings",
    "manual",
)
# The actions that only read files (the packaged manual, the settings documents): answered
# without a host by whoever receives them (`capability.read_only_answer`).
READ_ONLY_ACTIONS: Final[frozenset[ActionName]] = frozenset({"settings", "manual"})
ROOT_FIELDS: Final = ("action", "input", "reasoning", "summarize")
# A real envelope is a few hundred bytes; the cap leaves room for long reasoning.
MAX_ENVELOPE_BYTES: Final = 256 * 1024
MAX_ENVELOPE_DEPTH: Final = 32


_FLOAT_MAX: Final = int(sys.float_info.max)


class _ClosedInput(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, allow_inf_nan=False)


class StartInput(_ClosedInput):
    """Start the agent's one watch on a Python renderer under the workdir.

    Only floors are checked here. The manual makes `timeout_s` and `max_refreshes` safety
    ceilings that a request may lower but never raise, and "a request above the ceiling is
    silently capped to it, it is not an error": so any larger value is accepted and capped by
    `TaskCard.start` to the setting in force. `interval_s` has no ceiling at all.
    """

    renderer_path: str = Field(
        min_length=1, description="Python file, relative to the workdir or inside it."
    )
    interval_s: float | None = Field(
        default=None,
        ge=BOUNDS["interval_s"].floor,
        description="Seconds between refreshes, at least 1, no ceiling.",
    )
    timeout_s: float | None = Field(
        default=None,
        ge=BOUNDS["timeout_s"].floor,
        description="Ceiling of one renderer run, at least 0.1; capped to the timeout-s setting.",
    )
    max_refreshes: int | None = Field(
        default=None,
        ge=BOUNDS["max_refreshes"].floor,
        description="Refresh budget after the first render, at least 1; capped to the setting.",
    )

    @field_validator("interval_s", "timeout_s", mode="before")
    @classmethod
    def _clamp_huge_whole_numbers(cls, value: object) -> object:
        """A whole number past the largest float (JSON sets no size limit) as that float.

        Such a `timeout_s` is a request above the ceiling, which the manual caps silently,
        and such an `interval_s` a slower cadence, always honoured: refused as "not a valid
        number" they were neither. A negative one still meets the floor's refusal."""
        if isinstance(value, int) and not isinstance(value, bool) and abs(value) > _FLOAT_MAX:
            return sys.float_info.max if value > 0 else -sys.float_info.max
        return value


class WatchInput(_ClosedInput):
    """Name one watch by the id `start` returned."""

    watch_id: str = Field(min_length=1, description="The id returned by start, e.g. tc_1.")


class EmptyInput(_ClosedInput):
    """Actions that target the agent's one artifact take no input."""


INPUT_MODELS: Final[dict[ActionName, type[_ClosedInput]]] = {
    "start": StartInput,
    "inspect": WatchInput,
    "retry": WatchInput,
    "stop": WatchInput,
    "remove": EmptyInput,
    "settings": EmptyInput,
    "manual": EmptyInput,
}


@dataclass(frozen=True)
class Envelope:
    """A validated call: the action, its closed input, the caller's reasoning."""

    action: ActionName
    input: _ClosedInput
    reasoning: str
    summarize: bool


class EnvelopeError(ValueError):
    """The envelope broke the transport rules or the schema; the message says which and how."""


def _nesting_depth(text: str, limit: int) -> int:
    """Deepest `[`/`{` nesting outside strings, counting only up to `limit + 1`. Linear."""
    depth = deepest = 0
    in_string = escaped = False
    for char in text:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            if depth > deepest:
                deepest = depth
                if deepest > limit:
                    return deepest
        elif char in "]}":
            depth -= 1
    return deepest


def _constant(name: str) -> float:
    """`NaN`, `Infinity`, `-Infinity` read as the float they spell, for `check_values` to
    refuse naming the field that holds one (refused here, the message could not say which)."""
    return float(name)


def _refuse_repeated_keys(what: str) -> Callable[[list[tuple[str, Any]]], dict[str, Any]]:
    """An `object_pairs_hook` refusing an object that names one key twice.

    The envelope is a closed, strict object: with `"action": "stop"` and `"action": "remove"`
    in one object, JSON leaves open which one counts (readers differ; ours took the last, so
    a reviewer reading the first saw another call than the one made)."""

    def build(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        data: dict[str, Any] = {}
        for key, value in pairs:
            if key in data:
                raise EnvelopeError(
                    f"{what}: the key {json.dumps(key, ensure_ascii=False)} appears twice in"
                    " one object; give each field once"
                )
            data[key] = value
        return data

    return build


def _undecodable_field(raw: bytes) -> str | None:
    """The first field (`reasoning`, `input.renderer_path`) whose text or key holds a byte
    that is not UTF-8, when `raw` is JSON once such bytes are set aside; None otherwise. A
    byte offset alone left the caller counting bytes to find the text to fix (the MCP server
    names the field)."""
    try:
        data = json.loads(raw.decode("utf-8", "surrogateescape"))
    except (ValueError, RecursionError):
        return None
    stack: list[tuple[object, str]] = [(data, "")]
    while stack:
        value, where = stack.pop()
        if isinstance(value, str) and _UNDECODED.search(value):
            return where or None
        if isinstance(value, dict):
            for key in value:
                if _UNDECODED.search(key):
                    shown = key.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
                    return f"{where}.{shown}" if where else shown
            stack.extend(
                (item, f"{where}.{key}" if where else key) for key, item in reversed(value.items())
            )
        elif isinstance(value, list):
            stack.extend((item, f"{where}[{n}]") for n, item in reversed(list(enumerate(value))))
    return None


# A byte that is not UTF-8, as `surrogateescape` decodes it.
_UNDECODED: Final = re.compile("[\udc80-\udcff]")


def decode_envelope(
    raw: str | bytes,
    *,
    what: str = "envelope",
    max_bytes: int = MAX_ENVELOPE_BYTES,
    max_depth: int = MAX_ENVELOPE_DEPTH,
    cut: bool = False,
) -> dict[str, Any]:
    """Bytes or text off a transport into a JSON object; raises `EnvelopeError` naming why.

    A `str` that came from a byte source with `surrogateescape` (argv, for instance) should
    be passed as bytes (`os.fsencode`) so invalid UTF-8 is reported as such. `cut`: `raw`
    over `max_bytes` is only the start of what came (a read that stopped there), so its size
    is not the envelope's.
    """
    size = len(raw) if isinstance(raw, bytes) else len(raw.encode("utf-8", "surrogatepass"))
    if size > max_bytes:
        head = raw[: max_bytes + 1]
        prefix = head.decode("utf-8", "replace") if isinstance(head, bytes) else head
        if _nesting_depth(prefix, max_depth) > max_depth:  # name the worse problem
            raise EnvelopeError(
                f"{what}: nested deeper than {max_depth} levels (and over the "
                f"{max_bytes}-byte limit); an envelope is a flat object"
            )
        said = "" if cut else f" {size} bytes,"
        raise EnvelopeError(
            f"{what}:{said} over the {max_bytes}-byte limit; send a short envelope "
            "(put long detail in files the renderer reads)"
        )
    if isinstance(raw, bytes):
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            where = _undecodable_field(raw)
            if where is not None:
                raise EnvelopeError(
                    f"{what}: {where}: not valid UTF-8 (bytes of another encoding?); send"
                    " UTF-8 text"
                ) from None
            raise EnvelopeError(
                f"{what}: not valid UTF-8 (byte offset {exc.start}); send UTF-8 text"
            ) from None
    else:
        text = raw
    nul = text.find("\0")
    if nul >= 0:
        raise EnvelopeError(f"{what}: contains a NUL byte (offset {nul}); remove it")
    bad = check_unicode(text)
    if bad:
        raise EnvelopeError(f"{what}: {bad}")
    if not text.strip():
        raise EnvelopeError(f"{what}: empty; send one JSON object with action, input, reasoning")
    if text.startswith("\ufeff"):
        raise EnvelopeError(
            f"{what}: starts with a byte-order mark (U+FEFF); send the JSON object without it"
        )
    if _nesting_depth(text, max_depth) > max_depth:
        raise EnvelopeError(
            f"{what}: nested deeper than {max_depth} levels; an envelope is a flat object"
        )
    try:
        data = json.loads(
            text, parse_constant=_constant, object_pairs_hook=_refuse_repeated_keys(what)
        )
    except json.JSONDecodeError as exc:
        if json_cut_short(exc):
            raise EnvelopeError(
                f"{what}: not valid JSON, the text ends before the object is complete (truncated?)"
            ) from None
        raise EnvelopeError(
            f"{what}: not valid JSON at line {exc.lineno}, column {exc.colno}; "
            "send exactly one JSON object"
        ) from None
    except EnvelopeError:
        raise
    except ValueError:  # json's integer-digits limit: a plain ValueError
        raise EnvelopeError(
            f"{what}: a number with thousands of digits; send numbers of ordinary size"
        ) from None
    except RecursionError:  # unreachable after the depth scan; kept as a last barrier
        raise EnvelopeError(f"{what}: nested too deeply") from None
    if not isinstance(data, dict):
        raise EnvelopeError(
            f"{what}: must be a JSON object with action, input and reasoning; "
            f"the top level is {json_kind(data)}"
        )
    problem = check_values(data, max_depth=max_depth)
    if problem:
        raise EnvelopeError(f"{what}: {problem}")
    return data


def _shown(value: object) -> str:
    """A value of the envelope quoted back as its JSON spelling for null and booleans (the
    caller wrote `null`, not Python's `None`), else as `quoted`."""
    if value is None or isinstance(value, bool):
        return json.dumps(value)
    return quoted(value)


def check_unicode(text: str) -> str | None:
    """Why `text` cannot be encoded as UTF-8 (a lone surrogate), or None."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return (
            f"contains {text[exc.start]!r} at character {exc.start}, a lone surrogate "
            "(or bytes that were not UTF-8), which is not valid Unicode"
        )
    return None


_MAX_INT_BITS: Final = 13_000
"""About 3,900 decimal digits: below json's 4,300-digit limit, so any accepted number can be
written back out in a reply."""


def _utf8_size(text: str) -> int:
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))


def check_values(
    data: object, *, max_depth: int = MAX_ENVELOPE_DEPTH, max_bytes: int = MAX_ENVELOPE_BYTES
) -> str | None:
    """The first transport problem inside an already decoded value, or None.

    Iterative, so a hostile value nested thousands deep (the Python API accepts objects)
    costs a bounded walk, never a RecursionError. Catches what JSON escapes can smuggle past
    the byte checks (`\\ud800` and `\\u0000` inside keys or strings), and applies the size
    cap to objects that never were bytes (MCP arguments, Python callers), counting the UTF-8
    bytes of their text: counted in characters, a reasoning of non-ASCII text twice the limit
    in bytes passed over MCP or Python while `taskcard tool` refused the same envelope.
    """
    stack: list[tuple[object, str, int]] = [(data, "envelope", 0)]
    size = 0
    while stack:
        value, where, depth = stack.pop()
        if depth > max_depth:
            return f"nested deeper than {max_depth} levels; an envelope is a flat object"
        own = _utf8_size(value) if isinstance(value, str) else 1
        size += own
        if size > max_bytes:
            # The text that crossed the limit is named: a 1 MB `reasoning` was refused with
            # the envelope's name alone, leaving the caller to guess which field to cut.
            which = f"; {where} is {own} bytes" if isinstance(value, str) and depth else ""
            return (
                f"over the {max_bytes}-byte limit; send a short envelope (put long detail in"
                f" files the renderer reads){which}"
            )
        if isinstance(value, str):
            if "\0" in value:
                return f"{where}: contains a NUL character; remove it"
            bad = check_unicode(value)
            if bad:
                return f"{where}: {bad}"
        elif isinstance(value, Mapping):
            for key, item in value.items():
                inside = f"{where}: " if depth else ""  # the caller names the envelope
                if not isinstance(key, str):
                    return f"{inside}keys must be strings, got {key!r}"
                if "\0" in key or check_unicode(key):
                    return f"{inside}a key is not valid text (a NUL or a lone surrogate)"
                size += _utf8_size(key)
                stack.append((item, key if depth == 0 else f"{where}.{key}", depth + 1))
        elif isinstance(value, list | tuple):
            for index, item in enumerate(value):
                stack.append((item, f"{where}[{index}]", depth + 1))
        elif isinstance(value, float) and not math.isfinite(value):
            return f"{where}: {json.dumps(value)} is not a finite number; give a finite number"
        elif isinstance(value, int) and value.bit_length() > _MAX_INT_BITS:
            return f"{where}: a number with thousands of digits; send numbers of ordinary size"
    return None


def _allowed_fields(action: ActionName) -> str:
    names = list(INPUT_MODELS[action].model_fields)
    return ", ".join(names) if names else "none (pass {})"


def _describe(action: ActionName, error: Mapping[str, Any]) -> str:
    loc = ".".join(str(part) for part in ("input", *error["loc"]))
    kind = error["type"]
    if kind == "extra_forbidden":
        loc = ".".join(["input", *(str(part) for part in error["loc"][:-1])])
        loc += f".{shown_field(str(error['loc'][-1]))}"
        return f"{loc}: unknown field; {action} accepts: {_allowed_fields(action)}"
    if kind == "missing":
        return f"{loc}: required for {action}"
    field = INPUT_MODELS[action].model_fields.get(str(error["loc"][0])) if error["loc"] else None
    hint = f" ({field.description})" if field is not None and field.description else ""
    return f"{loc}: {error['msg']}, got {_shown(error.get('input'))}{hint}"


def parse_envelope(raw: Mapping[str, Any] | str | bytes) -> Envelope:
    """Validate a call. Raises `EnvelopeError` with every problem, one per line."""
    data: object = raw
    if isinstance(raw, str | bytes):
        data = decode_envelope(raw)
    if not isinstance(data, Mapping):
        raise EnvelopeError(
            "envelope: must be a JSON object with action, input and reasoning; the top level "
            f"is {json_kind(data)}"
        )
    problem = check_values(data)
    if problem:
        raise EnvelopeError(f"envelope: {problem}")
    problems: list[str] = []
    # Every way in reads its integer fields alike (the MCP server applies the same check to
    # its arguments first): `2.0` taken as 2, `2.5` or `true` refused naming the field.
    data, refused = whole_numbers(_numbers_schema(), data)
    for key in data:
        if key not in ROOT_FIELDS:
            allowed = ", ".join(ROOT_FIELDS)
            problems.append(f"{shown_field(key)}: unknown root field; allowed: {allowed}")
    action = data.get("action")
    if "action" not in data:
        problems.append(f"action: required, one of {', '.join(ACTIONS)}")
    elif action not in ACTIONS:
        problems.append(f"action: {_shown(action)} is not one of {', '.join(ACTIONS)}")
    reasoning = data.get("reasoning")
    if reasoning is not None and not isinstance(reasoning, str):
        problems.append(
            f"reasoning: must be text, not {json_kind(reasoning)}; say in one sentence why you"
            " call this"
        )
    elif not isinstance(reasoning, str) or not shows_text(reasoning):
        problems.append(
            "reasoning: required, a string that shows text (not only white space or invisible"
            " characters) saying why you call this"
        )
    summarize = data.get("summarize")
    if summarize is None:  # left out, or null (as an input field's null is)
        summarize = False
    if not isinstance(summarize, bool):
        problems.append(f"summarize: must be true or false, got {_shown(summarize)}")
    payload = data.get("input")
    if "input" not in data:
        problems.append("input: required, an object ({} for remove, settings, manual)")
    elif not isinstance(payload, Mapping):
        problems.append(f"input: must be an object, got {json_kind(payload)}")
    if refused is not None:
        problems.append(refused)
    if problems:
        raise EnvelopeError("; ".join(problems))
    assert isinstance(payload, Mapping) and isinstance(reasoning, str)
    name: ActionName = action  # type: ignore[assignment]
    model = INPUT_MODELS[name]
    try:
        parsed = model.model_validate(dict(payload))
    except ValidationError as exc:
        errors = exc.errors(include_url=False)
        raise EnvelopeError("; ".join(_describe(name, err) for err in errors)) from None
    return Envelope(action=name, input=parsed, reasoning=reasoning, summarize=bool(summarize))


@functools.cache
def _numbers_schema() -> dict[str, Any]:
    """The advertised schema, built once, for `whole_numbers` (read only, never changed)."""
    return envelope_json_schema()


def _portable_field(schema: dict[str, Any], actions: list[str]) -> dict[str, Any]:
    """One input field in the subset every major host accepts (see `envelope_json_schema`)."""
    description = str(schema.get("description", "")).rstrip(".")
    branches = schema.get("anyOf")
    if isinstance(branches, list):  # `X | None`: the null branch means "may be omitted"
        schema = next(branch for branch in branches if branch.get("type") != "null")
    field: dict[str, Any] = {"type": schema["type"]}
    for key in ("minimum", "minLength"):
        if key in schema:
            field[key] = schema[key]
    if "exclusiveMinimum" in schema:
        field["minimum"] = schema["exclusiveMinimum"]
    used_by = ", ".join(actions)
    field["description"] = f"{description}. For: {used_by}."
    return field


def envelope_json_schema() -> dict[str, Any]:
    """The tool's input schema: one flat object, in the subset every major agent host loads.

    Hosts differ in what they accept. Anthropic's API refuses `oneOf`/`anyOf`/`allOf` at the
    top of a tool schema; OpenAI function calling wants an object at the root; Gemini's
    function declarations take an OpenAPI subset without `$ref`/`$defs`, `const`,
    `oneOf`/`allOf`/`not`, type lists or `additionalProperties`. So the schema uses only
    `type`, `properties`, `required`, `enum`, `description`, `minimum` and `minLength`:
    `input` lists every field of every action, each saying which actions take it. The exact
    per-action rules (which fields, closed objects, strict types) are enforced by
    `parse_envelope` on the server, whose errors name the field and the fix.
    """
    fields: dict[str, dict[str, Any]] = {}
    users: dict[str, list[str]] = {}
    for action in ACTIONS:
        schema = INPUT_MODELS[action].model_json_schema()
        for name, prop in schema.get("properties", {}).items():
            fields.setdefault(name, prop)
            users.setdefault(name, []).append(action)
    per_action = "; ".join(f"{action}: {_allowed_fields(action)}" for action in ACTIONS)
    return {
        "type": "object",
        "properties": {
            "action": {
                "type": "string",
                "enum": list(ACTIONS),
                "description": "What to do. Call manual first if you have not read it.",
            },
            "input": {
                "type": "object",
                "description": f"The action's fields, nothing else ({per_action}).",
                "properties": {
                    name: _portable_field(prop, users[name]) for name, prop in fields.items()
                },
            },
            "reasoning": {
                "type": "string",
                "minLength": 1,
                "description": "Why you make this call, in one sentence.",
            },
            "summarize": {
                "type": "boolean",
                "description": "Add a one-line summary of the result.",
            },
        },
        "required": ["action", "input", "reasoning"],
    }
