"""Every way into the `task_card` tool reads an integer field alike.

MCP took `"max_refreshes": 2.0` (JSON Schema counts it an integer) while `taskcard tool` and
the Python API refused the same envelope ("Input should be a valid integer, got 2.0"). One
check (`number_args.whole_numbers`, applied by `parse_envelope`) now serves them all: each
value of the table below gets the same answer from `taskcard tool` (argument and stdin),
`TaskCard.call` and `taskcard mcp` (the SDK's stdio client; raw lines for the NaN and
infinities that client cannot send). `taskcard card start --max-refreshes 2.0` was a usage
error: the flag now takes the same values, and refuses the others as a usage error (exit 2)
naming the flag and the fix.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from taskcard.producers.task_card.capability import TaskCard
from taskcard.producers.task_card.envelope import ACTIONS, INPUT_MODELS
from tests.conftest import INITIALIZE

from .conftest import STATIC_RENDERER, CliHost, tool_call, write_renderer

# Every integer field of every action, with the rest of an input that sets it.
INTEGER_FIELDS: dict[tuple[str, str], dict[str, Any]] = {
    ("start", "max_refreshes"): {"renderer_path": "r.py"},
}

RANGE = "(Refresh budget after the first render, at least 1; capped to the setting.)"
# The value as written in JSON, and the int taken (accepted) or the refusal's words after
# `input.<field>: ` (refused).
ACCEPTED: list[tuple[str, int]] = [("2.0", 2), ("1e3", 1000), ("3E0", 3), ("0.4e1", 4), ("5", 5)]
REFUSED: list[tuple[str, str]] = [
    ("2.5", "must be a whole number, not 2.5; drop the fraction"),
    ("1e-3", "must be a whole number, not 0.001; drop the fraction"),
    ("true", "must be a whole number, not a boolean"),
    ('"2"', "must be a whole number, not text; give the number without quotes"),
    ("0.0", f"Input should be greater than or equal to 1, got 0 {RANGE}"),
    ("-3.0", f"Input should be greater than or equal to 1, got -3 {RANGE}"),
]
# Refused by the transport check every envelope passes first, which names the field too.
NOT_FINITE: list[tuple[str, str]] = [
    ("NaN", "NaN is not a finite number; give a finite number"),
    ("-Infinity", "-Infinity is not a finite number; give a finite number"),
    ("1e400", "Infinity is not a finite number; give a finite number"),
]


def integer_fields() -> set[tuple[str, str]]:
    found = set()
    for action in ACTIONS:
        for name, spec in INPUT_MODELS[action].model_json_schema()["properties"].items():
            kinds = {branch.get("type") for branch in spec.get("anyOf", [spec])}
            if "integer" in kinds:
                found.add((action, name))
    return found


def envelope_text(action: str, field: str, value: str) -> str:
    given_input = json.dumps(INTEGER_FIELDS[action, field])[:-1] + f', "{field}": {value}}}'
    return f'{{"action": "{action}", "input": {given_input}, "reasoning": "numbers"}}'


def refusal(field: str, words: str, transport: bool) -> str:
    return f"{'envelope: ' if transport else ''}input.{field}: {words}"


def test_the_table_names_every_integer_field_of_every_action() -> None:
    assert integer_fields() == set(INTEGER_FIELDS)


def watch_budget(workdir: Path) -> int:
    budget = json.loads((workdir / "taskcard" / "watch.json").read_text())["max_refreshes"]
    assert isinstance(budget, int)
    return budget


def removed(call_with: Callable[[dict[str, Any]], dict[str, Any]]) -> None:
    result = call_with({"action": "remove", "input": {}, "reasoning": "next value"})
    assert result["status"] == "removed", result


@pytest.mark.parametrize(("action", "field"), sorted(INTEGER_FIELDS))
def test_taskcard_tool_takes_whole_floats_and_refuses_the_rest_naming_the_field(
    workdir: Path, cli: CliHost, action: str, field: str
) -> None:
    write_renderer(workdir, "r.py", STATIC_RENDERER)

    def tool(text: str, as_argument: bool) -> tuple[int, dict[str, Any]]:
        done = cli.run("tool", text) if as_argument else cli.run("tool", stdin=text)
        return done.returncode, json.loads(done.stdout)

    # Each value once, given as the argument and on stdin in turn.
    for index, (value, taken) in enumerate(ACCEPTED):
        code, result = tool(envelope_text(action, field, value), index % 2 == 0)
        assert code == 0 and result["status"] == "watching", (value, result)
        assert watch_budget(cli.workdir) == taken
        removed(lambda envelope: tool(json.dumps(envelope), True)[1])
    for index, (value, words) in enumerate(REFUSED):
        code, result = tool(envelope_text(action, field, value), index % 2 == 0)
        assert code == 2, (value, result)  # the schema's refusal: a usage error
        assert result == {
            "status": "failed",
            "code": "bad_envelope",
            "message": refusal(field, words, False),
        }
    for index, (value, words) in enumerate(NOT_FINITE):
        code, result = tool(envelope_text(action, field, value), index % 2 == 1)
        assert code == 2, (value, result)
        assert result["message"] == refusal(field, words, True), value
    assert not (workdir / "taskcard" / "watch.json").exists()


# What the command line's flag says, after the value, of a value JSON refuses before the range.
FLAG_REFUSED: list[tuple[str, str]] = [
    ("2.5", "drop the fraction"),
    ("1e-3", "drop the fraction"),
    ("NaN", "give a finite whole number"),
    ("-Infinity", "give a finite whole number"),
    ("1e400", "give a finite whole number"),
    ("true", "write ASCII digits 0-9 with an optional sign, e.g. 10"),
]


def test_the_card_start_flag_takes_whole_floats_and_refuses_the_rest_naming_the_flag(
    workdir: Path, cli: CliHost
) -> None:
    write_renderer(workdir, "r.py", STATIC_RENDERER)
    for value, taken in ACCEPTED:
        done = cli.run("card", "start", "r.py", f"--max-refreshes={value}", "--json")
        assert done.returncode == 0 and json.loads(done.stdout)["status"] == "watching", done
        assert watch_budget(cli.workdir) == taken
        removed(lambda envelope: cli.json("card", envelope["action"]))
    for value, fix in FLAG_REFUSED:
        done = cli.run("card", "start", "r.py", f"--max-refreshes={value}", "--json")
        assert done.returncode == 2 and done.stdout == "", (value, done)
        said = f"argument --max-refreshes: {value!r} is not a whole number; {fix}; see `"
        assert said in done.stderr, done.stderr
    # The range is the card's own check, as for the other ways in.
    for value, words in REFUSED:
        if words.startswith("Input should be"):
            done = cli.run("card", "start", "r.py", f"--max-refreshes={value}", "--json")
            assert done.returncode == 2, (value, done)
            assert json.loads(done.stdout)["message"] == refusal("max_refreshes", words, False)
    assert not (workdir / "taskcard" / "watch.json").exists()


@pytest.mark.parametrize(("action", "field"), sorted(INTEGER_FIELDS))
def test_the_python_api_takes_whole_floats_and_refuses_the_rest_naming_the_field(
    workdir: Path, make_card: Callable[..., TaskCard], action: str, field: str
) -> None:
    write_renderer(workdir, "r.py", STATIC_RENDERER)
    card = make_card()
    for value, taken in ACCEPTED:
        result = card.call(json.loads(envelope_text(action, field, value)))
        assert result["status"] == "watching", (value, result)
        assert watch_budget(workdir) == taken
        removed(card.call)
    for value, words in REFUSED:
        result = card.call(json.loads(envelope_text(action, field, value)))
        assert result == {
            "status": "failed",
            "code": "bad_envelope",
            "message": refusal(field, words, False),
        }
    for value, words in NOT_FINITE:
        # Python's json reads NaN and Infinity as the floats a Python caller may pass.
        result = card.call(json.loads(envelope_text(action, field, value)))
        assert result == {
            "status": "failed",
            "code": "bad_envelope",
            "message": refusal(field, words, True),
        }
    assert not (workdir / "taskcard" / "watch.json").exists()


@pytest.mark.parametrize(("action", "field"), sorted(INTEGER_FIELDS))
async def test_mcp_gives_the_same_answers(
    workdir: Path, cli: CliHost, action: str, field: str
) -> None:
    write_renderer(workdir, "r.py", STATIC_RENDERER)
    async with cli.mcp() as session:

        async def task_card(envelope: dict[str, Any]) -> dict[str, Any]:
            answer = await session.call_tool("task_card", envelope)
            assert isinstance(answer.structured_content, dict)
            return answer.structured_content

        for value, taken in ACCEPTED:
            result = await task_card(json.loads(envelope_text(action, field, value)))
            assert result["status"] == "watching", (value, result)
            assert watch_budget(workdir) == taken
            assert (await task_card({"action": "remove", "input": {}, "reasoning": "next"}))[
                "status"
            ] == "removed"
        for value, words in REFUSED:
            result = await task_card(json.loads(envelope_text(action, field, value)))
            assert result == {
                "status": "failed",
                "code": "bad_envelope",
                "message": refusal(field, words, False),
            }

    lines = [json.dumps(INITIALIZE), '{"jsonrpc":"2.0","method":"notifications/initialized"}']
    for ident, (value, _) in enumerate(NOT_FINITE, start=2):
        text = envelope_text(action, field, value)
        lines.append(tool_call(ident, f'{{"name":"task_card","arguments":{text}}}'))
    with cli.raw_mcp() as (server, answers):
        assert server.stdin is not None
        server.stdin.write("".join(line + "\n" for line in lines).encode())
        server.stdin.flush()
        got = [answers.get(timeout=60) for _ in range(1 + len(NOT_FINITE))]
        by_id = {answer["id"]: answer for answer in got}
        for ident, (value, words) in enumerate(NOT_FINITE, start=2):
            result = by_id[ident]["result"]
            assert result["isError"] is True, (value, result)
            assert result["structuredContent"]["message"] == refusal(field, words, True)
    assert not (workdir / "taskcard" / "watch.json").exists()


ANY_NUMBER = st.one_of(
    st.floats(), st.integers(-(10**6), 10**6).map(float), st.integers(), st.booleans()
)


@given(number=ANY_NUMBER)
def test_the_python_api_takes_exactly_the_finite_whole_numbers_in_range(
    tmp_path_factory: pytest.TempPathFactory, number: float | int | bool
) -> None:
    """Any number given to `max_refreshes` of a start whose renderer is missing: a whole one
    of at least 1 (int or float) passes the numbers and meets the renderer's refusal; any
    other is refused naming the field, before anything else is looked at."""
    workdir = tmp_path_factory.mktemp("agent")
    runtime_dir = tmp_path_factory.mktemp("rt")
    with TaskCard(workdir, runtime_dir=runtime_dir) as card:
        result = card.call(
            {
                "action": "start",
                "input": {"renderer_path": "absent.py", "max_refreshes": number},
                "reasoning": "any number",
            }
        )
    whole = not isinstance(number, bool) and (
        isinstance(number, int) or (math.isfinite(number) and number.is_integer())
    )
    assert result["status"] == "failed"
    if whole and number >= 1:
        assert result["message"].startswith("renderer_path: 'absent.py' does not exist"), result
    else:
        assert "input.max_refreshes: " in result["message"], result


def test_the_settings_document_reads_its_integers_as_a_start_input_does(cli: CliHost) -> None:
    """`taskcard/taskcard.json` refused `"max_refreshes": 300.0`, which `start` takes as 300
    (both JSON, JSON Schema's integer): the owner's ceiling silently became the default. A
    whole number in either form is now taken as its int; a boolean or a fraction is still
    refused for that field alone, naming it and the range."""
    (cli.workdir / "taskcard").mkdir()
    (cli.workdir / "taskcard" / "taskcard.json").write_text(
        '{"max_refreshes": 300.0, "reminder_turns": true, "max_body_chars": 150.5}'
    )
    shown = cli.json("card", "settings")
    rows = {row["key"]: row for row in shown["settings"]}
    assert rows["max-refreshes"]["current"] == 300
    assert type(rows["max-refreshes"]["current"]) is int
    assert "(source: taskcard.json)" in rows["max-refreshes"]["comment"]
    assert rows["reminder-turns"]["current"] == 10  # the default
    assert "reminder_turns: true is not allowed" in rows["reminder-turns"]["comment"]
    assert rows["max-body-chars"]["current"] == 2000
    assert "max_body_chars: 150.5 is not allowed" in rows["max-body-chars"]["comment"]
