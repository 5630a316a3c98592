"""`taskcard init` names the files it merges into escaped when their path holds a control.

Its refusals and its report printed `--config` (and the hooks.json beside it) as given: a
path holding an escape sequence acted on the terminal that showed it, and one holding a line
break split a one-line refusal in two. The ledger's, the payload's and the workdir's paths
are shown escaped (`workdir_arg.shown_path`); these are now too. Driven as a person at a
shell: `taskcard` as a process.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from .conftest import run_taskcard


@pytest.mark.parametrize("name", ["c\x1b[2Jx", "c\nx"])
def test_a_codex_config_path_with_controls_is_shown_escaped(
    workdir: Path, tmp_path: Path, name: str
) -> None:
    folder = tmp_path / name
    folder.mkdir()
    config = folder / "config.toml"
    config.mkdir()  # a folder where the file belongs: refused, naming it
    done = run_taskcard("init", "codex", "--workdir", str(workdir), "--config", str(config))
    assert (done.returncode, done.stdout) == (2, b"")
    stderr = done.stderr.decode()
    assert len(stderr.splitlines()) == 1 and "\x1b" not in stderr, stderr
    assert f"{str(config)!r}: a folder, not a regular file" in stderr
    config.rmdir()
    config.write_text("[ not toml\n")
    done = run_taskcard("init", "codex", "--workdir", str(workdir), "--config", str(config))
    stderr = done.stderr.decode()
    assert len(stderr.splitlines()) == 1 and "\x1b" not in stderr, stderr
    assert f"{str(config)!r}: not valid TOML" in stderr
    # Merged: the report names both files, escaped, one line each.
    config.write_text("")
    done = run_taskcard("init", "codex", "--workdir", str(workdir), "--config", str(config))
    assert done.returncode == 0, done.stderr
    lines = done.stdout.decode().splitlines()
    assert "\x1b" not in done.stdout.decode()
    assert f"{str(config)!r}: updated" in lines, lines
    assert f"{str(folder / 'hooks.json')!r}: updated" in lines, lines
