"""A configured agent whose workdir does not exist yet, as the operator sees it: served all
the same (its folder is watched and picked up when made), so it is information, never a
warning, but a slip in the path (`agents/buidler`) used to show nothing anywhere. `taskcard
config check`, `taskcard serve --check` and `taskcard status` name it, and `taskcard serve`
logs it once at the start and at a reload, through the CLI in a subprocess."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest

from tests.e2e.harness import TOKEN_ENV, ServeProcess, agents_lines, eventually, run_cli
from tests.fakes.telegram_api import FakeTelegram

CHAT = -1001234500000


def not_yet(agent: str, tmp_path: Path) -> str:
    """The line said of `agent`, whose workdir `tmp_path/agents/AGENT` was not made."""
    return (
        f"agent {agent}: workdir {tmp_path / 'agents' / agent} does not exist yet; it is picked"
        " up when created"
    )


def write_config(tmp_path: Path, base_url: str, missing: tuple[str, ...]) -> Path:
    """Agent builder (its workdir made) and the agents `missing` (theirs not), every one
    routed to `CHAT`."""
    lines = agents_lines(tmp_path, ["builder"])
    for agent in missing:
        lines += ["[[agents]]", f'id = "{agent}"', f'workdir = "agents/{agent}"']
    lines += [
        "[telegram]",
        f'token_env = "{TOKEN_ENV}"',
        f'api_base_url = "{base_url}"',
        "poll_timeout_s = 1",
        "[[telegram.routes]]",
        f"chat_id = {CHAT}",
        'agents = ["*"]',
    ]
    config = tmp_path / "taskcard.toml"
    config.write_text("\n".join(lines) + "\n")
    return config


def test_check_and_status_name_the_workdirs_not_made_yet(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = write_config(tmp_path, "http://127.0.0.1:9", ("buidler",))
    monkeypatch.setenv(TOKEN_ENV, "123456:placeholder")
    checked = run_cli("serve", "--config", str(config), "--check")
    assert checked.returncode == 0, checked.stderr
    assert f"note: {not_yet('buidler', tmp_path)}" in checked.stdout.splitlines()
    assert "builder" not in checked.stderr  # its workdir is there
    assert "warning" not in checked.stderr
    # `config check` says it too, in the same words, as it says its other notes (stdout).
    validated = run_cli("config", "check", str(config))
    assert validated.returncode == 0, validated.stderr
    assert f"note: {not_yet('buidler', tmp_path)}" in validated.stdout.splitlines()
    assert "builder:" not in validated.stdout
    status = run_cli("status", "--config", str(config))
    assert status.returncode == 0, status.stderr
    assert not_yet("buidler", tmp_path) in status.stdout.splitlines()
    assert "agent builder: workdir" not in status.stdout  # only its state and report
    as_json = run_cli("status", "--config", str(config), "--json")
    assert as_json.returncode == 0, as_json.stderr
    agents = {a["agent"]: a for a in json.loads(as_json.stdout)["agents"]}
    assert agents["buidler"]["workdir_exists"] is False
    assert agents["builder"]["workdir_exists"] is True
    # Made: nothing more to say.
    (tmp_path / "agents" / "buidler").mkdir()
    assert "does not exist" not in run_cli("serve", "--config", str(config), "--check").stderr
    assert "does not exist" not in run_cli("config", "check", str(config)).stdout
    assert "does not exist" not in run_cli("status", "--config", str(config)).stdout


async def test_serve_logs_a_workdir_not_made_yet_once_at_the_start_and_at_a_reload(
    tmp_path: Path, telegram: FakeTelegram
) -> None:
    config = write_config(tmp_path, telegram.base_url, ("buidler",))
    with ServeProcess(config, env={TOKEN_ENV: telegram.token}) as serve:
        assert serve.proc is not None
        await eventually(lambda: not_yet("buidler", tmp_path) in serve.logs, what="the line")
        assert "INFO" in next(
            line for line in serve.logs.splitlines() if not_yet("buidler", tmp_path) in line
        )
        # A reload says the agent it adds; the one said at the start is not said again.
        write_config(tmp_path, telegram.base_url, ("buidler", "ghost"))
        serve.proc.send_signal(signal.SIGHUP)
        await eventually(lambda: "config reloaded" in serve.logs, what="the reload")
        await eventually(lambda: not_yet("ghost", tmp_path) in serve.logs, what="ghost's line")
        assert serve.logs.count(not_yet("buidler", tmp_path)) == 1
        assert serve.logs.count(not_yet("ghost", tmp_path)) == 1
        assert "agent builder: workdir" not in serve.logs
        assert await serve.aterminate() == 0


def _linked_config(tmp_path: Path, base_url: str) -> Path:
    """Agent ghost's workdir and the one discovery root are symbolic links that lead nowhere
    (to folders not made yet), beside agent builder's real workdir."""
    lines = agents_lines(tmp_path, ["builder"])
    (tmp_path / "agents" / "ghost").symlink_to(tmp_path / "moved-ghost")
    (tmp_path / "fleet").symlink_to(tmp_path / "moved-fleet")
    lines += ["[[agents]]", 'id = "ghost"', 'workdir = "agents/ghost"']
    lines += ["[discover]", 'roots = ["fleet"]']
    lines += [
        "[telegram]",
        f'token_env = "{TOKEN_ENV}"',
        f'api_base_url = "{base_url}"',
        "poll_timeout_s = 1",
        "[[telegram.routes]]",
        f"chat_id = {CHAT}",
        'agents = ["*"]',
    ]
    config = tmp_path / "taskcard.toml"
    config.write_text("\n".join(lines) + "\n")
    return config


def linked_lines(tmp_path: Path) -> list[str]:
    """The notes of `_linked_config`: each names its link as one that leads nowhere."""
    return [
        f"agent ghost: workdir {tmp_path / 'agents' / 'ghost'} is a symbolic link that leads"
        f" nowhere (to {tmp_path / 'moved-ghost'}, which does not exist yet); it is picked up"
        " when created",
        f"discover.roots[0]: {tmp_path / 'fleet'} is a symbolic link that leads nowhere (to"
        f" {tmp_path / 'moved-fleet'}, which does not exist yet); its folders are taken as"
        " agents once it is created",
    ]


def test_check_names_a_workdir_or_root_behind_a_link_that_leads_nowhere(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Noted "does not exist yet" about a name `ls` shows, the operator made a folder where
    the link is; the note names the link and where it points."""
    config = _linked_config(tmp_path, "http://127.0.0.1:9")
    monkeypatch.setenv(TOKEN_ENV, "123456:placeholder")
    validated = run_cli("config", "check", str(config))
    assert validated.returncode == 0, validated.stderr
    for line in linked_lines(tmp_path):
        assert f"note: {line}" in validated.stdout.splitlines(), validated.stdout
    checked = run_cli("serve", "--config", str(config), "--check")
    assert checked.returncode == 0, checked.stderr
    for line in linked_lines(tmp_path):
        assert f"note: {line}" in checked.stdout.splitlines(), checked.stdout
    # The folders made where the links point: nothing more to say.
    (tmp_path / "moved-ghost").mkdir()
    (tmp_path / "moved-fleet").mkdir()
    assert "leads nowhere" not in run_cli("config", "check", str(config)).stdout


async def test_serve_names_a_workdir_or_root_behind_a_link_that_leads_nowhere(
    tmp_path: Path, telegram: FakeTelegram
) -> None:
    config = _linked_config(tmp_path, telegram.base_url)
    with ServeProcess(config, env={TOKEN_ENV: telegram.token}) as serve:
        for line in linked_lines(tmp_path):
            await eventually(lambda line=line: line in serve.logs, what=line)
        assert await serve.aterminate() == 0


def test_check_refuses_a_workdir_or_root_under_a_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A workdir or discovery root under a file (`notes.txt/fleet`) can never exist: it is
    refused naming the file (`contract.file_on_path`, the walk every path option uses), not
    noted as a folder not made yet."""
    lines = agents_lines(tmp_path, ["builder"])
    (tmp_path / "notes.txt").write_text("mine\n")
    lines += ["[[agents]]", 'id = "ghost"', 'workdir = "notes.txt/a/ghost"']
    lines += ["[discover]", 'roots = ["notes.txt/fleet"]']
    lines += ["[telegram]", f'token_env = "{TOKEN_ENV}"', "[[telegram.routes]]"]
    lines += [f"chat_id = {CHAT}", 'agents = ["*"]']
    config = tmp_path / "taskcard.toml"
    config.write_text("\n".join(lines) + "\n")
    monkeypatch.setenv(TOKEN_ENV, "123456:placeholder")
    validated = run_cli("config", "check", str(config))
    assert validated.returncode != 0, validated.stdout
    notes = tmp_path / "notes.txt"
    for line in (
        f"discover.roots[0]: {notes} is not a directory, so {notes / 'fleet'} can never exist;"
        " fix the path",
        f"agents[1].workdir: {notes} is not a directory, so {notes / 'a' / 'ghost'} can never"
        " exist; fix the path",
    ):
        assert line in validated.stdout + validated.stderr, (validated.stdout, validated.stderr)
