"""An empty configuration name given to a command that reads one, through the real command
line: it was read as `.`, and refused as "invalid configuration .: is a folder; give the path
of the TOML file in it", about a folder nobody named. It is a usage error naming the argument."""

from __future__ import annotations

import pytest

from tests.e2e.harness import run_cli


@pytest.mark.parametrize(
    ("args", "argument"),
    [
        (["status", "--config", ""], "argument --config/-c"),
        (["status", "-c", " "], "argument --config/-c"),
        (["chats", "--config", ""], "argument --config/-c"),
        (["serve", "--check", "--config", ""], "argument --config/-c"),
        (["config", "check", ""], "argument FILE"),
    ],
)
def test_an_empty_configuration_name_is_a_usage_error_naming_the_argument(
    args: list[str], argument: str
) -> None:
    done = run_cli(*args)
    assert (done.returncode, done.stdout) == (2, "")
    command = " ".join(args[:2] if args[0] == "config" else args[:1])
    assert done.stderr == (
        f"taskcard {command}: {argument}: is empty; give the path of the TOML configuration"
        f" file; see `taskcard {command} --help`\n"
    )
