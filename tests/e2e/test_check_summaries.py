"""`taskcard config check FILE` and `taskcard serve --config FILE --check` say the same of one
file: one summary line and the notes on stdout, the warnings on stderr, the same exit code.
`serve --check` printed a bare "FILE: valid" with its notes on stderr, while `config check`
printed the counts and its notes on stdout. Both commands run as a user runs them."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.e2e.test_cli import taskcard

TOKEN_ENV = "TC_SUMMARY_TOKEN"


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return taskcard(*args, env={TOKEN_ENV: "123456:placeholder"})


def _both(config: Path) -> tuple[subprocess.CompletedProcess[str], ...]:
    return _run("config", "check", str(config)), _run("serve", "--config", str(config), "--check")


def test_a_good_file_gets_one_summary_from_both_commands(tmp_path: Path) -> None:
    (tmp_path / "agents" / "builder").mkdir(parents=True)
    config = tmp_path / "taskcard.toml"
    config.write_text(
        'state_dir = ".taskcard"\n'
        '[[agents]]\nid = "builder"\nworkdir = "agents/builder"\n'
        '[[agents]]\nid = "buidler"\nworkdir = "agents/buidler"\n'  # not made: a note
        f'[telegram]\ntoken_env = "{TOKEN_ENV}"\n'
        'api_base_url = "http://127.0.0.1:9/bot"\n'  # ends in /bot: a warning
        '[[telegram.routes]]\nchat_id = -1001234500000\nagents = ["builder"]\n'
    )
    checked, serve_checked = _both(config)
    assert checked.returncode == serve_checked.returncode == 0, serve_checked.stderr
    assert checked.stdout == serve_checked.stdout, (checked.stdout, serve_checked.stdout)
    assert checked.stderr == serve_checked.stderr, (checked.stderr, serve_checked.stderr)
    lines = checked.stdout.splitlines()
    assert lines[0] == f"{config}: valid; 2 agents, 1 route (telegram)", lines
    assert lines[1].startswith("note: agent buidler: workdir"), lines
    assert "warning: telegram.api_base_url" in checked.stderr, checked.stderr


def test_a_bad_file_gets_the_same_refusal_from_both_commands(tmp_path: Path) -> None:
    config = tmp_path / "taskcard.toml"
    config.write_text('state_dir = ".taskcard"\nlog_levle = "info"\n')
    checked, serve_checked = _both(config)
    assert checked.returncode == serve_checked.returncode == 2
    assert checked.stdout == serve_checked.stdout == ""
    assert checked.stderr == serve_checked.stderr, (checked.stderr, serve_checked.stderr)
    assert "log_levle" in checked.stderr, checked.stderr
