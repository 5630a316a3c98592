"""The configuration file written carelessly, as an operator meets it: `taskcard config
check` and a reload of a running `taskcard serve` refuse it with one line naming the key (as
written in the file) or the place, and the fix; a reload keeps the running configuration."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.e2e.test_cli import AGENT, console_config, taskcard

# A bot token's shape: a value given twice must never be quoted back.
TOKEN = "123456789:AAHdqTcvCH1vGWJxfSeofSAs0K5PALDsaw"


def refusal(config: Path) -> str:
    """The one problem line `config check` gives for `config` (exit 2, no traceback)."""
    result = taskcard("config", "check", str(config))
    assert result.returncode == 2, result.stdout + result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.splitlines()[1:]
    assert len(lines) == 1, result.stderr
    return lines[0].removeprefix(f"  - {config}: ")


@pytest.mark.parametrize(
    ("body", "words"),
    [
        (
            AGENT + '[telegram]\ntoken_env = "A"\ncommands = true\ntoken_env = "{token}"\n',
            "line 8: telegram.token_env is given twice (first at line 6)",
        ),
        (
            '[telegram]\n[[telegram.routes]]\nchat_id = 1\nagents = ["*"]\n'
            '[[telegram.routes]]\nchat_id = 2\nagents = ["*"]\npin = true\n'
            "pin = [\n  false,\n]",
            "line 10: telegram.routes[1].pin is given twice (first at line 9)",
        ),
        (
            'log_level = "INFO"\nlog_level = "{token}"\n\n# the end\n',
            "line 3: log_level is given twice (first at line 2)",
        ),
        (
            "[watch]\ndebounce_ms = 5\n[display]\n[watch]\n",
            "line 5: the table [watch] is declared twice",
        ),
    ],
    ids=["in-a-table", "in-an-array-of-tables", "at-the-end", "a-table"],
)
def test_a_key_given_twice_is_named_with_its_lines(tmp_path: Path, body: str, words: str) -> None:
    """tomllib says "Cannot overwrite a value (at line 7, column 19)" (or "at end of
    document") without the key, and names a table given twice as a Python tuple; the key was
    hunted through the file. It is named as the other problems name keys, with both lines,
    and the value (here a token) is not quoted back."""
    config = console_config(tmp_path, extra=body.format(token=TOKEN))
    line = refusal(config)
    assert line.startswith(words), line
    assert "TOML takes each" in line, line
    assert TOKEN not in line and "Cannot" not in line, line
