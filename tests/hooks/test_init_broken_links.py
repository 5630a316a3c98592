"""`taskcard init` refuses a file it would write through a symbolic link that leads nowhere.

A dangling `config.toml` (linked from a dotfiles repository that moved) was followed: its
target was created where it pointed, folders and all, while Codex went on finding no file
at the name it reads; a `.claude` folder linked nowhere did the same to Claude Code's
settings. Each is now one line naming the file, the link and where it points, exit 2,
nothing written. Driven as a person at a shell: `taskcard` as a process. The words are those
of every path option (`contract.dangling_link`); init said "it is a symbolic link to T, which
does not exist" of its own.
"""

from __future__ import annotations

from pathlib import Path

from .conftest import run_taskcard


def _tree(root: Path) -> list[str]:
    return sorted(str(path.relative_to(root)) for path in root.rglob("*"))


def test_a_dangling_codex_config_is_refused_naming_where_it_points(
    workdir: Path, tmp_path: Path
) -> None:
    home = tmp_path / "codex"
    home.mkdir()
    gone = tmp_path / "dotfiles" / "codex" / "config.toml"
    (home / "config.toml").symlink_to(gone)
    done = run_taskcard(
        "init", "codex", "--workdir", str(workdir), "--config", str(home / "config.toml")
    )
    assert (done.returncode, done.stdout) == (2, b""), done.stderr
    assert done.stderr.decode() == (
        f"taskcard init: {home / 'config.toml'}: is a symbolic link that leads nowhere (to"
        f" {gone}, which does not exist); create what it points to, or remove the link, then"
        " run init again (nothing was written)\n"
    )
    assert not (tmp_path / "dotfiles").exists()
    assert _tree(home) == ["config.toml"]  # nor a hooks.json beside it


def test_a_codex_config_in_a_loop_of_links_is_refused_in_one_line(
    workdir: Path, tmp_path: Path
) -> None:
    (tmp_path / "a.toml").symlink_to("b.toml")
    (tmp_path / "b.toml").symlink_to("a.toml")
    done = run_taskcard(
        "init", "codex", "--workdir", str(workdir), "--config", str(tmp_path / "a.toml")
    )
    assert (done.returncode, done.stdout) == (2, b""), done.stderr
    assert done.stderr.decode() == (
        f"taskcard init: {tmp_path / 'a.toml'}: is a symbolic link that goes round a loop of"
        " symbolic links (to b.toml); fix the links, then run init again (nothing was"
        " written)\n"
    )


def test_a_claude_folder_linked_nowhere_is_refused_naming_the_link(
    workdir: Path, tmp_path: Path
) -> None:
    gone = tmp_path / "elsewhere" / ".claude"
    (workdir / ".claude").symlink_to(gone)
    done = run_taskcard(
        "init", "claude-code", "--workdir", str(workdir), "--claude-version", "2.1.90"
    )
    assert (done.returncode, done.stdout) == (2, b""), done.stderr
    assert done.stderr.decode() == (
        f"taskcard init: {workdir / '.claude' / 'settings.json'}: the symbolic link"
        f" {workdir / '.claude'} on its path leads nowhere (to {gone}, which does not exist);"
        " create what it points to, or remove the link, then run init again (nothing was"
        " written)\n"
    )
    assert not (tmp_path / "elsewhere").exists()
    assert not (workdir / ".mcp.json").exists()


def test_a_link_to_a_file_that_is_there_is_still_written_through(
    workdir: Path, tmp_path: Path
) -> None:
    """A settings file kept in a dotfiles repository and linked: the file behind the link
    is merged into, and the link stays."""
    real = tmp_path / "dotfiles" / "config.toml"
    real.parent.mkdir()
    real.write_text('model = "o3"\n')
    (tmp_path / "config.toml").symlink_to(real)
    done = run_taskcard(
        "init", "codex", "--workdir", str(workdir), "--config", str(tmp_path / "config.toml")
    )
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "config.toml").is_symlink()
    assert "[mcp_servers.taskcard]" in real.read_text()
