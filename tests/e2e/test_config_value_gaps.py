"""Configuration values an operator writes by mistake that passed without a word or were
called the wrong thing: a repeated id, a loop of symbolic links, a listen address that is
no address, a config file reached through a link, secrets in their variables written
carelessly. Driven through the CLI (`config check`, `serve --check`) as an operator runs it."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.e2e.test_cli import AGENT, console_config, refused_by_every_command


@pytest.mark.parametrize("key", ["state_dir", "agents[0].workdir", "discover.roots[0]"])
def test_a_path_that_is_a_loop_of_links_is_called_a_loop(tmp_path: Path, key: str) -> None:
    """A path key naming a symbolic link to itself (or two links to each other) was "a
    dangling symlink" (state_dir) or a workdir or root "not made yet", a note, served as if
    the folder might still come. It never can until the links change: refused as a loop,
    naming the link, by every command."""
    loop = tmp_path / "loop"
    loop.symlink_to("loop")
    if key == "state_dir":
        config = tmp_path / "taskcard.toml"
        config.write_text('state_dir = "loop/state"\n' + AGENT)
    elif key == "agents[0].workdir":
        config = console_config(tmp_path, '[[agents]]\nid = "builder"\nworkdir = "loop"\n')
    else:
        config = console_config(tmp_path, extra='[discover]\nroots = ["loop"]\n')
    for line, _ in refused_by_every_command(config, key):
        if key == "state_dir":
            assert f"{loop}/state goes round a loop of symbolic links at {loop} (" in line, line
        else:
            assert f"{loop} goes round a loop of symbolic links (" in line, line
        assert "dangling" not in line and "does not exist yet" not in line, line
        assert line.endswith(
            (
                "fix the link or choose another state_dir",
                "fix the link or point workdir at the agent's folder",
                "fix the link or choose another root",
            )
        ), line
