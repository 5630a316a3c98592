"""`taskcard config check`, `serve --check` and `serve` on paths the system cannot look at,
and on one agent's folder configured twice through different spellings."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from tests.e2e.harness import ServeProcess, eventually
from tests.e2e.test_cli import (
    AGENT,
    console_config,
    refused_by_every_command,
    taskcard,
    warned_by_serve,
)

# One folder name longer than any Linux file system takes (NAME_MAX is 255 bytes).
LONG = "x" * 300


def _locked(tmp_path: Path) -> str:
    """A folder this user may not enter (mode 000; root enters it anyway)."""
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0)
    return "locked"


@pytest.mark.parametrize(
    "kind",
    [
        "name-too-long",
        pytest.param(
            "no-permission",
            marks=pytest.mark.skipif(os.geteuid() == 0, reason="root enters a folder of mode 000"),
        ),
    ],
)
@pytest.mark.parametrize(
    ("toml", "key"),
    [
        ('state_dir = "{bad}/state"\n' + AGENT, "state_dir"),
        ('state_dir = "s"\n[[agents]]\nid = "a"\nworkdir = "{bad}/a"\n', "agents[0].workdir"),
        ('state_dir = "s"\n[discover]\nroots = ["fleet", "{bad}/fleet"]\n', "discover.roots[1]"),
    ],
    ids=["state-dir", "workdir", "root"],
)
def test_a_path_that_cannot_be_examined_is_refused_naming_the_key(
    tmp_path: Path, toml: str, key: str, kind: str
) -> None:
    """A path whose name is longer than the file system allows, or under a folder this user
    may not enter, ended `config check`, `serve --check` and `serve` with a traceback (exit
    1) from `Path.exists`. It is an invalid configuration: exit 2, one line naming the key.
    An agent's workdir is that agent's problem alone: refused by the pre-flight two, while
    `serve` warns of it in the same words and serves the rest (test_workdir_unusable.py)."""
    bad = LONG if kind == "name-too-long" else _locked(tmp_path) + "/inner"
    config = tmp_path / "taskcard.toml"
    config.write_text(toml.format(bad=bad) + "[console]\nenabled = true\n")
    workdir = key.startswith("agents[")
    try:
        said = [line for line, _ in refused_by_every_command(config, key, serve=not workdir)]
        if workdir:
            said.append(warned_by_serve(config, key))
        for line in said:
            if kind == "name-too-long":
                assert "longer than the file system allows" in line, line
                assert LONG not in line  # the screenful of a name is not echoed
            else:
                assert "cannot be examined by this user" in line, line
    finally:
        if (tmp_path / "locked").exists():
            (tmp_path / "locked").chmod(0o700)


@pytest.mark.parametrize(
    "spelling",
    ["link", "link/", "agents/../link", "{tmp}/link"],
)
async def test_one_workdir_through_a_symlink_is_warned_of_by_check_and_serve(
    tmp_path: Path, spelling: str
) -> None:
    """A second agent on the first one's folder, reached through a symlink, was taken without
    a word (only spellings that differ in text were compared): one agent's card shown twice
    under two names, a `/tell` to either queued in the same inbox. It is warned of like the
    other spellings, once by `config check` and once by `serve`."""
    (tmp_path / "agents" / "builder").mkdir(parents=True)
    (tmp_path / "link").symlink_to(tmp_path / "agents" / "builder")
    twin = f'[[agents]]\nid = "twin"\nworkdir = "{spelling.format(tmp=tmp_path)}"\n'
    config = console_config(tmp_path, AGENT + twin, extra="[console]\nenabled = true\n")
    words = "agents[1].workdir: the same folder as agents[0] ('builder')"
    check = taskcard("config", "check", str(config))
    assert check.returncode == 0, check.stderr
    assert check.stderr.count(f"warning: {words}") == 1, check.stderr
    with ServeProcess(config) as serve:
        await eventually(lambda: "channel console ready" in serve.logs, what="the start")
        assert await serve.aterminate() == 0
    assert serve.logs.count(words) == 1, serve.logs


@pytest.mark.parametrize(
    "extra",
    [
        f'[[agents]]\nid = "late"\nworkdir = "{LONG}/late"\n',
        f'[discover]\nroots = ["{LONG}"]\n',
    ],
    ids=["workdir", "root"],
)
async def test_a_reload_naming_a_path_that_cannot_be_examined_is_refused_and_serving_goes_on(
    tmp_path: Path, extra: str
) -> None:
    """SIGHUP after the file gained such a path: the reload was cut short by the same
    traceback, logged as an exception of the loop. It is refused with the key's line, as an
    invalid file is, and the running configuration stays (a later valid reload applies).
    An agent's workdir is that agent's problem alone: the reload is taken and warns of it
    in the same words (test_workdir_unusable.py)."""
    (tmp_path / "agents" / "builder").mkdir(parents=True)
    (tmp_path / "agents" / "other").mkdir(parents=True)
    config = console_config(tmp_path, AGENT, extra="[console]\nenabled = true\n")
    good = config.read_text()
    with ServeProcess(config, env={"TASKCARD_LOG_LEVEL": "INFO"}) as serve:
        await eventually(lambda: "channel console ready" in serve.logs, what="the start")
        assert serve.proc is not None
        config.write_text(good + extra)
        serve.proc.send_signal(signal.SIGHUP)
        if "late" in extra:
            await eventually(
                lambda: "config reloaded: 2 agents" in serve.logs, what="the reload taken"
            )
            key = "agent late: agents[1].workdir: the path (or one of its folder names) is"
        else:
            await eventually(lambda: "config reload refused" in serve.logs, what="the refusal")
            key = "discover.roots[0]: the path (or one of its folder names) is"
        await eventually(
            lambda: f"{key} longer than the file system allows" in serve.logs,
            what="the key's line",
        )
        config.write_text(good + '[[agents]]\nid = "other"\nworkdir = "agents/other"\n')
        serve.proc.send_signal(signal.SIGHUP)
        reloads = 2 if "late" in extra else 1
        await eventually(
            lambda: serve.logs.count("config reloaded: 2 agents") == reloads,
            what="the later valid reload",
        )
        assert await serve.aterminate() == 0
    assert "Traceback" not in serve.logs, serve.logs
    assert LONG not in serve.logs


@pytest.mark.parametrize("where", ["file", "folder"])
def test_a_config_behind_a_dangling_link_says_the_link_and_where_it_points(
    tmp_path: Path, where: str
) -> None:
    """`--config` naming a symbolic link whose file is gone (a config kept in a repository
    that moved), or a path through a folder link that leads nowhere, was "no such file;
    create it" about a name `ls` shows: the line says it is a dangling link and where it
    points, for every command that reads the file and for TASKCARD_CONFIG alike."""
    if where == "file":
        gone = tmp_path / "repo" / "taskcard.toml"
        named = tmp_path / "taskcard.toml"
        named.symlink_to(gone)
        says = f"{named}: is a symbolic link that leads nowhere (to {gone}, which does not exist)"
    else:
        gone = tmp_path / "repo"
        (tmp_path / "conf").symlink_to(gone)
        named = tmp_path / "conf" / "taskcard.toml"
        says = (
            f"{named}: the symbolic link {tmp_path / 'conf'} on its path leads nowhere (to"
            f" {gone}, which does not exist)"
        )
    for args, env in (
        (("config", "check", str(named)), {}),
        (("serve", "--config", str(named), "--check"), {}),
        (("serve", "--config", str(named)), {}),
        (("status", "--config", str(named)), {}),
        (("status",), {"TASKCARD_CONFIG": str(named)}),
    ):
        result = taskcard(*args, env=env)
        assert result.returncode == 2, (args, result.stderr)
        assert "Traceback" not in result.stderr and "no such file" not in result.stderr
        assert f"{says}; restore what it points to, or fix the link" in result.stderr, (
            args,
            result.stderr,
        )
    assert not gone.exists()
