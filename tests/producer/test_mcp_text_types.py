"""A text field given a number, a list, an object or true is refused saying so, by every tool.

`report`'s summary said "must be text that shows (not only white space or invisible
characters ...)", `spawn`'s child_workdir "required" although it was given, its reason
"required, and it must show text", and `task_card`'s reasoning "required, a string that shows
text": each sent the agent looking for white space or a missing field, not at the type it sent.
Driven with the SDK's real stdio client against `taskcard mcp`; the Python API says the same.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from taskcard.producers.reports import LineageError, ReportError, Reports, spawn

from .conftest import CliHost

# (tool, the call with the text field at VALUE, the field, what the fix says)
CALLS: list[tuple[str, dict[str, Any], str, str]] = [
    ("report", {"ok": True, "summary": "VALUE"}, "summary", "give one short paragraph"),
    ("spawn", {"child_workdir": "VALUE", "reason": "r"}, "child_workdir", "give the child's"),
    ("spawn", {"child_workdir": "child", "reason": "VALUE"}, "reason", "say why this agent"),
    (
        "task_card",
        {"action": "settings", "input": {}, "reasoning": "VALUE"},
        "reasoning",
        "say in one sentence why",
    ),
]
WRONG: list[tuple[Any, str]] = [
    (5, "a number"),
    (2.5, "a number"),
    (True, "a boolean"),
    (["done"], "an array"),
    ({"text": "done"}, "an object"),
]


def _with(call: dict[str, Any], value: Any) -> dict[str, Any]:
    return {key: value if given == "VALUE" else given for key, given in call.items()}


async def test_a_text_field_of_another_type_is_refused_naming_the_type(
    workdir: Path, cli: CliHost
) -> None:
    (workdir / "child").mkdir()
    async with cli.mcp() as session:
        for tool, call, field, fix in CALLS:
            for value, kind in WRONG:
                result = await session.call_tool(tool, _with(call, value))
                content = result.structured_content
                assert result.is_error and isinstance(content, dict), (tool, value)
                message = content["message"]
                if tool == "task_card":
                    message = message.removeprefix("envelope: ")
                assert message.startswith(f"{field}: must be text, not {kind}; {fix}"), content
        # Nothing was written by the refused calls; the same calls with text work.
        assert not (workdir / "reports").exists()
        assert not (workdir / "child" / "lineage.json").exists()
        for tool, call, _, _ in CALLS:
            result = await session.call_tool(tool, _with(call, "child"))
            assert not result.is_error, (tool, result.structured_content)


def test_the_python_api_names_the_type_of_a_summary_or_reason(workdir: Path) -> None:
    (workdir / "child").mkdir()
    with pytest.raises(ReportError, match=r"^summary: must be text, not a number; "):
        Reports(workdir).add(ok=True, summary=5)
    with pytest.raises(LineageError, match=r"^reason: must be text, not an array; "):
        spawn(workdir / "child", parent="p", reason=["why"])  # type: ignore[arg-type]
