"""`card start` (and the `task_card` tool over MCP) with a renderer path that names no Python
file: each refusal says what the name is and what to give instead.

A folder, a named pipe or a socket was "is not a regular file", leaving both to guess; a
name too long to look at, or one under a regular file (`notes.py/r.py`), was said not to
exist. Driven through the real command line and
the SDK's stdio client, one host for both, stopped at the end.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from taskcard.producers.task_card.contract import quoted

from .conftest import STATIC_RENDERER, CliHost, envelope, write_renderer

KINDS = ["folder", "fifo", "socket", "long", "under a file"]


def _make(workdir: Path, kind: str) -> tuple[str, str]:
    """The renderer_path to give, and what the refusal says after it."""
    name = {
        "folder": "r_dir",
        "fifo": "r_fifo",
        "socket": "r_sock",
        "long": "z" * 5000,
        "under a file": "notes.py/r.py",
    }[kind]
    if kind == "under a file":
        (workdir / "notes.py").write_text("# mine\n")
        return name, (
            "renderer_path: 'notes.py/r.py' goes through 'notes.py', a file, as if it were a"
            " folder; give the renderer's Python file"
        )
    if kind == "folder":
        (workdir / name).mkdir()
    elif kind == "fifo":
        os.mkfifo(workdir / name)
    elif kind == "socket":
        with socket.socket(socket.AF_UNIX) as bound:
            bound.bind(name)  # relative: the workdir's own path may pass 107 bytes
    what = {"folder": "a folder", "fifo": "a named pipe", "socket": "a socket"}
    if kind == "long":
        return name, (
            f"renderer_path: {quoted(name)} cannot be used (File name too long); give the"
            " renderer's Python file, inside the workdir"
        )
    return name, (
        f"renderer_path: '{name}' is {what[kind]}, not a regular file; give the renderer's"
        " Python file"
    )


@pytest.mark.parametrize("kind", KINDS)
async def test_a_renderer_path_that_is_no_file_says_what_it_is(
    workdir: Path, cli: CliHost, kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(workdir)
    name, said = _make(workdir, kind)
    started = cli.json("card", "start", name)
    assert (started["status"], started["message"]) == ("failed", said)
    async with cli.mcp() as session:
        result = await session.call_tool("task_card", envelope("start", renderer_path=name))
    assert result.is_error and isinstance(result.structured_content, dict)
    assert result.structured_content["message"] == said
    write_renderer(workdir, "r.py", STATIC_RENDERER)  # the good path answers as before
    assert cli.json("card", "start", "r.py")["status"] == "watching"


LINKS = ["dangling", "folder link", "loop"]


def _broken(workdir: Path, kind: str) -> tuple[str, str]:
    """A renderer_path through a symbolic link that leads nowhere, and what the refusal says."""
    if kind == "dangling":
        (workdir / "r.py").symlink_to("gone.py")
        return "r.py", "'r.py' is a symbolic link to 'gone.py', which does not exist; create"
    if kind == "folder link":
        (workdir / "cards").symlink_to("nowhere")
        return "cards/r.py", (
            "'cards/r.py' goes through the symbolic link 'cards' to 'nowhere', which does not"
            " exist; create"
        )
    (workdir / "r.py").symlink_to("s.py")
    (workdir / "s.py").symlink_to("r.py")
    return "r.py", "'r.py' is a symbolic link in a loop of links; fix the links"


@pytest.mark.parametrize("kind", LINKS)
async def test_a_renderer_path_through_a_broken_link_names_the_link(
    workdir: Path, cli: CliHost, kind: str
) -> None:
    """A renderer linked from elsewhere in the workdir whose file is gone (or a folder link
    leading nowhere, or a loop of links) was "does not exist (relative paths start at the
    workdir)" about a name the agent sees there: the refusal names the link and where it
    points, on the command line and over MCP alike."""
    name, said = _broken(workdir, kind)
    started = cli.json("card", "start", name)
    assert started["status"] == "failed", started
    assert started["message"].startswith(f"renderer_path: {said}"), started
    async with cli.mcp() as session:
        result = await session.call_tool("task_card", envelope("start", renderer_path=name))
    assert result.is_error and isinstance(result.structured_content, dict)
    assert result.structured_content["message"] == started["message"]
