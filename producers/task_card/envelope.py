"""The strict LTP-v2 envelope of the `task_card` tool and its JSON Schema.

One pydantic model per action input, closed (`extra="forbid"`) and strict (no coercion of
`"5"` to 5 or `true` to 1), so the schema the MCP server advertises and the validation the
host applies come from the same source and cannot drift. Validation errors are rewritten into
one sentence per problem that names the field and what is allowed, because the reader is an
agent that has to fix its call, not a developer reading a traceback.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

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
ROOT_FIELDS: Final = ("action", "input", "reasoning", "summarize")


class _ClosedInput(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, allow_inf_nan=False)


class StartInput(_ClosedInput):
    """Start the agent's one watch on a Python renderer under the workdir."""

    renderer_path: str = Field(
        min_length=1, description="Python file, relative to the workdir or inside it."
    )
    interval_s: float | None = Field(
        default=None, ge=1, description="Seconds between refreshes (floor 1, no ceiling)."
    )
    timeout_s: float | None = Field(
        default=None, ge=0.1, description="Ceiling of one renderer run; capped to the setting."
    )
    max_refreshes: int | None = Field(
        default=None, ge=1, description="Refresh budget after the first render; capped."
    )


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
    """The envelope broke the schema; the message names each field and what is allowed."""


def _allowed_fields(action: ActionName) -> str:
    names = list(INPUT_MODELS[action].model_fields)
    return ", ".join(names) if names else "none (pass {})"


def _describe(action: ActionName, error: Mapping[str, Any]) -> str:
    loc = ".".join(str(part) for part in ("input", *error["loc"]))
    kind = error["type"]
    if kind == "extra_forbidden":
        return f"{loc}: unknown field; {action} accepts: {_allowed_fields(action)}"
    if kind == "missing":
        return f"{loc}: required for {action}"
    field = INPUT_MODELS[action].model_fields.get(str(error["loc"][0])) if error["loc"] else None
    hint = f" ({field.description})" if field is not None and field.description else ""
    return f"{loc}: {error['msg']}, got {error.get('input')!r}{hint}"


def parse_envelope(raw: Mapping[str, Any] | str | bytes) -> Envelope:
    """Validate a call. Raises `EnvelopeError` with every problem, one per line."""
    data: object = raw
    if isinstance(raw, str | bytes):
        try:
            data = json.loads(raw)
        except ValueError as exc:
            raise EnvelopeError(f"envelope: not valid JSON ({exc.__class__.__name__})") from None
    if not isinstance(data, Mapping):
        raise EnvelopeError("envelope: must be a JSON object with action, input and reasoning")
    problems: list[str] = []
    for key in data:
        if key not in ROOT_FIELDS:
            problems.append(f"{key}: unknown root field; allowed: {', '.join(ROOT_FIELDS)}")
    action = data.get("action")
    if action not in ACTIONS:
        problems.append(f"action: {action!r} is not one of {', '.join(ACTIONS)}")
    reasoning = data.get("reasoning")
    if not isinstance(reasoning, str) or not reasoning.strip():
        problems.append("reasoning: required, a non-empty string saying why you call this")
    summarize = data.get("summarize", False)
    if not isinstance(summarize, bool):
        problems.append(f"summarize: must be true or false, got {summarize!r}")
    payload = data.get("input")
    if "input" not in data:
        problems.append("input: required, an object ({} for remove, settings, manual)")
    elif not isinstance(payload, Mapping):
        problems.append(f"input: must be an object, got {type(payload).__name__}")
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
