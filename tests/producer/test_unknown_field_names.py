"""An unknown field's name is said back escaped and cut, by every tool and `taskcard tool`.

The refusal of a field a tool does not know began with the name as the caller wrote it: an
empty one read ": not a field of report", one holding an escape sequence or a line break was
said raw (into the agent's context, or onto the terminal of `taskcard tool`), and one of
100,000 characters came back whole. Driven with the SDK's real stdio client against `taskcard
mcp`, and `taskcard tool` as a process.
"""

from __future__ import annotations

import json
from pathlib import Path

from .conftest import CliHost

LONG = "k" * 100_000
# (the name given, how the refusal starts)
NAMES = [
    ("", "'': "),
    ("a\x1b[2Jb", "'a\\x1b[2Jb': "),
    ("a\nb", "'a\\nb': "),
    (LONG, f"'{'k' * 79}... (100000 characters): "),
    ("colour", "colour: "),  # a plain name stays as written
]


async def test_every_tool_says_an_unknown_name_escaped_and_cut(workdir: Path, cli: CliHost) -> None:
    async with cli.mcp() as session:
        for name, said in NAMES:
            result = await session.call_tool("report", {"ok": True, name: 1})
            content = result.structured_content
            assert result.is_error and isinstance(content, dict), name
            assert content["message"].startswith(f"{said}not a field of report"), content
            assert len(content["message"]) < 300
            inner = {"action": "settings", "input": {name: 1}, "reasoning": "r"}
            result = await session.call_tool("task_card", inner)
            content = result.structured_content
            assert result.is_error and isinstance(content, dict), name
            message = content["message"]
            assert message.startswith(f"input.{said.removesuffix(': ')}: unknown field"), message
            assert len(message) < 300
        assert not (workdir / "reports").exists()


def test_taskcard_tool_says_an_unknown_root_name_escaped(cli: CliHost) -> None:
    envelope = {"action": "settings", "input": {}, "reasoning": "r", "a\x1b[2Jb": 1}
    done = cli.run("tool", json.dumps(envelope))
    assert done.returncode == 2, done  # a usage error: its envelope broke the schema
    message = json.loads(done.stdout)["message"]
    assert message.startswith("'a\\x1b[2Jb': unknown root field"), message
    assert "\x1b" not in done.stdout
