"""Point 1: the strict LTP-v2 envelope and the schema generated from the same models."""

from __future__ import annotations

import pytest

from taskcard.producers.task_card.envelope import (
    ACTIONS,
    EnvelopeError,
    StartInput,
    envelope_json_schema,
    parse_envelope,
)


def _start(**extra: object) -> dict[str, object]:
    return {"action": "start", "input": {"renderer_path": "r.py", **extra}, "reasoning": "r"}


def test_actions_are_declared_in_order_with_settings_before_manual() -> None:
    assert ACTIONS == ("start", "inspect", "retry", "stop", "remove", "settings", "manual")
    assert envelope_json_schema()["properties"]["action"]["enum"] == list(ACTIONS)


def test_a_valid_start_is_parsed_into_its_closed_input() -> None:
    env = parse_envelope(
        '{"action":"start","input":{"renderer_path":"r.py","interval_s":2},'
        '"reasoning":"long job","summarize":true}'
    )
    assert env.action == "start"
    assert env.input == StartInput(renderer_path="r.py", interval_s=2)
    assert env.summarize is True


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ({"action": "start", "input": {}, "reasoning": "r"}, "input.renderer_path: required"),
        (
            {"action": "start", "input": {"renderer_path": "r.py", "colour": 1}, "reasoning": "r"},
            "input.colour: unknown field; start accepts: renderer_path, interval_s",
        ),
        (
            {
                "action": "start",
                "input": {"renderer_path": "r.py", "interval_s": 0.5},
                "reasoning": "r",
            },
            "input.interval_s: Input should be greater than or equal to 1",
        ),
        (
            {
                "action": "start",
                "input": {"renderer_path": "r.py", "max_refreshes": True},
                "reasoning": "r",
            },
            "input.max_refreshes: must be a whole number, not a boolean",
        ),
        (
            {
                "action": "start",
                "input": {"renderer_path": "r.py", "timeout_s": "5"},
                "reasoning": "r",
            },
            "input.timeout_s",
        ),
        ({"action": "inspect", "input": {}, "reasoning": "r"}, "input.watch_id: required"),
        (
            {"action": "remove", "input": {"watch_id": "tc_1"}, "reasoning": "r"},
            "input.watch_id: unknown field; remove accepts: none (pass {})",
        ),
        (
            {"action": "launch", "input": {}, "reasoning": "r"},
            "action: 'launch' is not one of start",
        ),
        ({"action": "manual", "input": {}}, "reasoning: required"),
        ({"action": "manual", "input": {}, "reasoning": "\u200b\u2060\ufeff"}, "reasoning:"),
        (
            {"action": "manual", "input": {}, "reasoning": "r", "force": 1},
            "force: unknown root field",
        ),
        ({"action": "manual", "reasoning": "r"}, "input: required"),
        ({"action": "manual", "input": [], "reasoning": "r"}, "input: must be an object"),
        ({"action": "manual", "input": {}, "reasoning": "r", "summarize": "yes"}, "summarize:"),
        ("not json", "envelope: not valid JSON"),
        ("[1]", "envelope: must be a JSON object"),
    ],
)
def test_violations_are_refused_naming_the_field_and_what_is_allowed(
    raw: object, expected: str
) -> None:
    with pytest.raises(EnvelopeError) as caught:
        parse_envelope(raw)  # type: ignore[arg-type]
    assert expected in str(caught.value)


def test_schema_is_one_flat_object_listing_every_field_of_every_action() -> None:
    schema = envelope_json_schema()
    assert schema["type"] == "object"
    assert schema["required"] == ["action", "input", "reasoning"]
    inputs = schema["properties"]["input"]["properties"]
    assert set(inputs) == {"renderer_path", "interval_s", "timeout_s", "max_refreshes", "watch_id"}
    assert inputs["interval_s"]["type"] == "number" and inputs["interval_s"]["minimum"] == 1
    assert inputs["max_refreshes"]["type"] == "integer"
    assert inputs["watch_id"]["description"].endswith("For: inspect, retry, stop.")
    # The closedness the schema no longer states is still enforced on the server.
    with pytest.raises(EnvelopeError, match=r"input\.watch_id: unknown field; start accepts"):
        parse_envelope(
            {
                "action": "start",
                "input": {"renderer_path": "r.py", "watch_id": "x"},
                "reasoning": "r",
            }
        )
