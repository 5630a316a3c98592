"""`taskcard init codex --config ''` is a usage error naming the option, and writes nothing.

An empty `--config` meant the default: `--config "$CONFIG"` with `CONFIG` unset merged the
agent's notify program, MCP server and lifecycle hooks into the person's own
`$CODEX_HOME/config.toml` (or `~/.codex/config.toml`) and the hooks.json beside it, which every
Codex project on the machine reads. Driven as a person at a shell: `taskcard` as a process.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from .conftest import TASKCARD, run_taskcard


@pytest.mark.parametrize("empty", ["", " "])
def test_an_empty_codex_config_is_refused_and_nothing_is_written(
    workdir: Path, tmp_path: Path, empty: str
) -> None:
    home = tmp_path / "home"
    codex_home = tmp_path / "codex-home"
    home.mkdir()
    env = {**os.environ, "HOME": str(home), "CODEX_HOME": str(codex_home)}
    # Run from a folder of its own: read as a relative name, " " was a file in the checkout.
    done = subprocess.run(
        [TASKCARD, "init", "codex", "--workdir", str(workdir), "--config", empty],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        timeout=120,
        check=False,
    )
    assert (done.returncode, done.stdout) == (2, b"")
    assert done.stderr.decode().splitlines() == [
        "taskcard init codex: argument --config: is empty; give the path of Codex's"
        " config.toml, or leave the option out for $CODEX_HOME/config.toml or"
        " ~/.codex/config.toml; see `taskcard init codex --help`"
    ]
    assert not codex_home.exists()
    assert list(home.iterdir()) == []
    assert sorted(path.name for path in tmp_path.iterdir()) == ["agent", "home"]
    # Left out, the option still means $CODEX_HOME/config.toml.
    done = run_taskcard("init", "codex", "--workdir", str(workdir), env=env)
    assert done.returncode == 0, done.stderr
    assert (codex_home / "config.toml").is_file()


@pytest.mark.parametrize("blank", [" ", "\t"], ids=["space", "tab"])
def test_a_blank_codex_home_is_refused_naming_it(workdir: Path, tmp_path: Path, blank: str) -> None:
    """A `CODEX_HOME` of white space only was a folder named by spaces in the current
    folder: the hooks were written where no Codex looks. An empty one still counts as unset,
    as Codex reads it."""
    home = tmp_path / "home"
    home.mkdir()
    here = tmp_path / "here"
    here.mkdir()
    command = [TASKCARD, "init", "codex", "--workdir", str(workdir)]
    env = {**os.environ, "HOME": str(home), "CODEX_HOME": blank}
    done = subprocess.run(command, cwd=here, env=env, capture_output=True, timeout=120)
    assert (done.returncode, done.stdout) == (2, b"")
    assert done.stderr.decode() == (
        "taskcard init: CODEX_HOME is blank; set it to Codex's home folder, unset it for"
        " ~/.codex, or pass --config\n"
    )
    assert sorted(os.listdir(here)) == [] and sorted(os.listdir(home)) == []
    env["CODEX_HOME"] = ""
    done = subprocess.run(command, cwd=here, env=env, capture_output=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert (home / ".codex" / "config.toml").is_file()


def test_a_codex_config_with_an_unexpanded_tilde_is_written_in_the_home_folder(
    workdir: Path, tmp_path: Path
) -> None:
    """`--config=~/.codex/config.toml` (or the path in quotes) reaches the command with its
    `~`: the files were written into a folder named `~` in the current folder, where no
    Codex looks. `~` is expanded; `~user` of no known user is a usage error."""
    home = tmp_path / "home"
    home.mkdir()
    env = {**os.environ, "HOME": str(home)}
    done = subprocess.run(
        [TASKCARD, "init", "codex", "--workdir", str(workdir), "--config=~/.codex/config.toml"],
        cwd=tmp_path,
        capture_output=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert (home / ".codex" / "config.toml").is_file()
    assert (home / ".codex" / "hooks.json").is_file()
    assert not (tmp_path / "~").exists()
    done = subprocess.run(
        [TASKCARD, "init", "codex", "--workdir", str(workdir), "--config", "~no-such-user-x/c"],
        cwd=tmp_path,
        capture_output=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert (done.returncode, done.stdout) == (2, b""), done.stderr
    assert done.stderr.decode().startswith(
        "taskcard init codex: argument --config: ~no-such-user-x/c cannot be expanded (no such"
        " user); give the full path of Codex's config.toml"
    )
    assert sorted(os.listdir(tmp_path)) == ["agent", "home"]


@pytest.mark.parametrize("kind", ["file on its path", "file further up", "name too long"])
def test_a_codex_config_no_file_can_be_at_is_a_usage_error(
    workdir: Path, tmp_path: Path, kind: str
) -> None:
    """A `--config` under a regular file, or too long to open, was "cannot write ...", exit 1,
    as if the disk had failed; it is a usage error naming the option, nothing written."""
    (tmp_path / "notes.txt").write_text("mine\n")
    given = {
        "file on its path": "notes.txt/config.toml",
        "file further up": "notes.txt/codex/config.toml",
        "name too long": "c" * 5000,
    }[kind]
    done = subprocess.run(
        [TASKCARD, "init", "codex", "--workdir", str(workdir), "--config", given],
        cwd=tmp_path,
        capture_output=True,
        timeout=120,
        check=False,
    )
    assert (done.returncode, done.stdout) == (2, b""), done.stderr
    said = done.stderr.decode()
    assert said.startswith("taskcard init codex: argument --config: "), said
    assert len(said.splitlines()) == 1 and len(said) < 600, said
    if kind == "name too long":
        assert "cannot be used (File name too long); give a shorter path" in said
    else:
        assert (
            f"{given} goes through a file as if it were a folder ({tmp_path}/notes.txt is a"
            " file); give a path in a folder" in said
        )
    assert (tmp_path / "notes.txt").read_text() == "mine\n"
    assert sorted(os.listdir(tmp_path)) == ["agent", "notes.txt"]
