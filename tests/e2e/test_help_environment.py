"""`--help` of every command says where a default comes from, never what a variable holds.

`serve`, `status` and `chats` showed `TASKCARD_CONFIG`'s value as `--config`'s default, and
`serve` `TASKCARD_LOG_FORMAT`'s as `--log-format`'s, raw: surrounding spaces invisible, a line
break splitting the help, an escape sequence acting on the terminal, and whatever was in the
variable printed on every help page. Driven as a user runs it: `taskcard ... --help` as a
process, every page of the command tree.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

from taskcard.bridge.cli import build_parser

from .harness import ROOT

# Values that must never reach a help page: each holds a marker no help text has.
ODD = {
    "TASKCARD_CONFIG": "  /srv/odd\x1b[2J MARKERCFG\nname.toml  ",
    "TASKCARD_LOG_FORMAT": "json MARKERFMT ",
    "TASKCARD_LOG_LEVEL": "debug MARKERLVL",
}


def _pages(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    found = [path]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found += _pages(sub, (*path, name))
    return found


def test_no_help_page_shows_a_variable_s_value() -> None:
    pages = _pages(build_parser())
    assert ("serve",) in pages and ("config", "check") in pages
    env = {**os.environ, **ODD}
    for page in pages:
        done = subprocess.run(
            [sys.executable, "-m", "taskcard.bridge.cli", *page, "--help"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == 0, (page, done.stderr)
        for marker in ("MARKERCFG", "MARKERFMT", "MARKERLVL", "\x1b"):
            assert marker not in done.stdout, (page, done.stdout)
        if page in (("serve",), ("status",), ("chats",)):
            said = " ".join(done.stdout.split())
            assert "(default: the file TASKCARD_CONFIG names, when set)" in said, said
