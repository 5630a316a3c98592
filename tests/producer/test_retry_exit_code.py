"""`card retry` and `tool` exit 1, and the MCP tool's result is an error, when the retry's
render fails: the exit code follows the answer as for every other action."""

from __future__ import annotations

import json
from pathlib import Path

from .conftest import FLAG_RENDERER, CliHost, write_renderer


def test_a_retry_whose_render_fails_exits_1(workdir: Path, cli: CliHost) -> None:
    """Its answer is the watch in `error` with the render's failure; `card retry` and `tool`
    said so on stdout and exited 0, so a script took the card for refreshed."""
    write_renderer(workdir, "r.py", FLAG_RENDERER)
    assert cli.run("card", "start", "r.py", "--interval-s", "3600").returncode == 0
    assert cli.run("card", "retry", "tc_1").returncode == 0
    (workdir / "fail.flag").touch()
    retried = cli.run("card", "retry", "tc_1")
    assert retried.returncode == 1, retried.stdout
    assert retried.stdout.startswith("retry: error (watch tc_1)\n")
    assert "this render: renderer_nonzero_exit" in retried.stdout
    as_json = cli.run("card", "retry", "tc_1", "--json")
    assert (as_json.returncode, json.loads(as_json.stdout)["status"]) == (1, "error")
    envelope = {"action": "retry", "input": {"watch_id": "tc_1"}, "reasoning": "now"}
    assert cli.run("tool", json.dumps(envelope)).returncode == 1
    # Looking at a watch in error is no failure of the look.
    assert cli.run("card", "inspect", "tc_1").returncode == 0
    # A stopped watch's retry that fails to render keeps `stopped`, and failed all the same.
    assert cli.run("card", "stop", "tc_1").returncode == 0
    stopped = cli.run("card", "retry", "tc_1")
    assert stopped.returncode == 1, stopped.stdout
    assert stopped.stdout.startswith("retry: stopped (watch tc_1)\n")
    (workdir / "fail.flag").unlink()
    assert cli.run("card", "retry", "tc_1").returncode == 0


async def test_a_retry_whose_render_fails_is_an_mcp_error(workdir: Path, cli: CliHost) -> None:
    write_renderer(workdir, "r.py", FLAG_RENDERER)
    (workdir / "fail.flag").touch()
    async with cli.mcp() as session:
        start = {"action": "start", "input": {"renderer_path": "r.py"}, "reasoning": "go"}
        assert (await session.call_tool("task_card", start)).is_error  # its first render failed
        (workdir / "fail.flag").unlink()
        assert not (await session.call_tool("task_card", start)).is_error
        (workdir / "fail.flag").touch()
        retry = {"action": "retry", "input": {"watch_id": "tc_2"}, "reasoning": "now"}
        result = await session.call_tool("task_card", retry)
        assert isinstance(result.structured_content, dict)
        assert result.structured_content["status"] == "error"
        assert result.is_error


def test_the_help_says_how_a_retry_exits(cli: CliHost) -> None:
    def words(*command: str) -> str:
        return " ".join(cli.run(*command).stdout.split())

    assert "Render now; exit 1 when the render fails" in words("card", "retry", "--help")
    assert "a retry whose render failed included" in words("card", "--help")
