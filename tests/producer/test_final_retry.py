"""The one final `retry` of a watch whose refresh budget ran out (the manual: "Optionally
`retry` once more to publish a final state before winding down"): it renders and publishes
the body, the card stays `inactive`, and a second one is refused naming the fix. Through
`card` and `tool` as processes, through MCP over stdio, and across a host restart."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

from .conftest import (
    COUNTER_RENDERER,
    CliHost,
    envelope,
    notifications,
    pid_alive,
    wait_for,
    write_renderer,
)


def body(workdir: Path) -> str:
    return (workdir / "taskcard" / "taskcard.md").read_text()


def status(workdir: Path) -> bytes:
    return (workdir / "taskcard" / "status").read_bytes()


def start_and_exhaust(cli: CliHost) -> None:
    """A watch of one refresh, left to spend it on its own tick."""
    started = cli.run("card", "start", "r.py", "--interval-s", "1", "--max-refreshes", "1")
    assert started.returncode == 0, started.stdout + started.stderr
    wait_for(lambda: cli.json("card", "inspect", "tc_1")["status"] == "exhausted")


def test_an_exhausted_watch_gets_one_final_retry(workdir: Path, cli: CliHost) -> None:
    write_renderer(workdir, "r.py", COUNTER_RENDERER)
    start_and_exhaust(cli)
    assert body(workdir) == "# Work\nrender 2\n"
    assert cli.json("card", "inspect", "tc_1")["final_retry_available"] is True
    said = cli.run("card", "inspect", "tc_1").stdout
    assert "  final retry: available (retry once to publish a final state)\n" in said, said
    final = cli.run("card", "retry", "tc_1")
    assert final.returncode == 0, final.stdout
    assert final.stdout.startswith("retry: exhausted (watch tc_1)\n")
    assert body(workdir) == "# Work\nrender 3\n"
    assert status(workdir) == b"inactive"  # the watch stays retired
    inspected = cli.json("card", "inspect", "tc_1")
    assert (inspected["status"], inspected["last_body"]) == ("exhausted", "# Work\nrender 3\n")
    assert inspected["final_retry_available"] is False
    said = cli.run("card", "inspect", "tc_1").stdout
    assert "  final retry: not available (start a new watch to publish again)\n" in said, said
    again = cli.run("card", "retry", "tc_1")
    assert again.returncode == 1, again.stdout
    assert "its one final retry; start a new watch" in again.stdout
    as_tool = cli.run("tool", json.dumps(envelope("retry", watch_id="tc_1")))
    assert as_tool.returncode == 1
    refused = json.loads(as_tool.stdout)
    assert refused["status"] == "failed" and "start a new watch" in refused["message"]
    assert refused["code"] == "refreshes_exhausted"
    assert body(workdir) == "# Work\nrender 3\n"  # nothing rendered for the refusals
    started = cli.json("card", "start", "r.py", "--interval-s", "3600")
    assert (started["status"], started["final_retry_available"]) == ("watching", False)


async def test_the_final_retry_through_mcp(workdir: Path, cli: CliHost) -> None:
    write_renderer(workdir, "r.py", COUNTER_RENDERER)
    start_and_exhaust(cli)
    async with cli.mcp() as session:
        look = envelope("inspect", watch_id="tc_1")
        inspected = await session.call_tool("task_card", look)
        assert isinstance(inspected.structured_content, dict)
        assert inspected.structured_content["final_retry_available"] is True
        retry = envelope("retry", watch_id="tc_1")
        final = await session.call_tool("task_card", retry)
        assert not final.is_error
        assert isinstance(final.structured_content, dict)
        assert final.structured_content["status"] == "exhausted"
        assert final.structured_content["final_retry_available"] is False
        assert body(workdir) == "# Work\nrender 3\n"
        assert status(workdir) == b"inactive"
        again = await session.call_tool("task_card", retry)
        assert again.is_error
        assert isinstance(again.structured_content, dict)
        assert again.structured_content["status"] == "failed"
        assert again.structured_content["code"] == "refreshes_exhausted"
        assert "start a new watch" in again.structured_content["message"]
    assert body(workdir) == "# Work\nrender 3\n"


def test_the_final_retry_is_known_to_a_later_host(workdir: Path, cli: CliHost) -> None:
    write_renderer(workdir, "r.py", COUNTER_RENDERER)
    start_and_exhaust(cli)
    cli.shutdown()  # as the idle grace ends it: the next host knows the watch from its record
    assert cli.json("card", "inspect", "tc_1")["final_retry_available"] is True
    assert cli.run("card", "retry", "tc_1").returncode == 0
    cli.shutdown()
    assert cli.json("card", "inspect", "tc_1")["final_retry_available"] is False
    assert body(workdir) == "# Work\nrender 3\n"
    assert status(workdir) == b"inactive"
    cli.shutdown()
    again = cli.run("card", "retry", "tc_1")
    assert again.returncode == 1, again.stdout
    assert "its one final retry; start a new watch" in again.stdout
    assert body(workdir) == "# Work\nrender 3\n"


def test_a_record_of_an_earlier_version_still_allows_the_final_retry(
    workdir: Path, cli: CliHost
) -> None:
    write_renderer(workdir, "r.py", COUNTER_RENDERER)
    start_and_exhaust(cli)
    cli.shutdown()
    record = workdir / ".taskcard-host" / "ended.json"
    data = json.loads(record.read_text())
    assert data.pop("final_retry_used") is False
    record.write_text(json.dumps(data))  # as an earlier version wrote it
    assert cli.json("card", "inspect", "tc_1")["status"] == "exhausted"
    assert cli.run("card", "retry", "tc_1").returncode == 0
    assert body(workdir) == "# Work\nrender 3\n"
    assert cli.run("card", "retry", "tc_1").returncode == 1


def test_no_final_retry_once_the_card_was_removed(workdir: Path, cli: CliHost) -> None:
    write_renderer(workdir, "r.py", COUNTER_RENDERER)
    start_and_exhaust(cli)
    assert cli.json("card", "remove")["status"] == "removed"
    refused = cli.run("card", "retry", "tc_1")
    assert refused.returncode == 1, refused.stdout
    assert "its card was removed; start a new watch" in refused.stdout
    assert not (workdir / "taskcard" / "taskcard.md").exists()


# COUNTER_RENDERER, but its third render (the final retry's) waits until `go.flag` exists.
WAITING_RENDERER = """
import os, time
from pathlib import Path
p = Path("count.txt")
n = int(p.read_text()) + 1 if p.exists() else 1
Path("count.txt.tmp").write_text(str(n))
os.replace("count.txt.tmp", p)
while n == 3 and not Path("go.flag").exists():
    time.sleep(0.05)
print(f"# Work\\nrender {n}")
"""


def test_a_host_killed_during_the_final_retry_gives_no_second_one(
    workdir: Path, cli: CliHost
) -> None:
    """The final retry was recorded as spent only after its render: a host killed while
    the renderer ran left the record saying it was not, and the next host gave it again."""
    write_renderer(workdir, "r.py", WAITING_RENDERER)
    start_and_exhaust(cli)
    pid = cli.host_pid()
    assert pid is not None
    retry = subprocess.Popen(
        cli.command("card", "retry", "tc_1"), stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        wait_for(lambda: (workdir / "count.txt").read_text() == "3")  # the final render runs
        record = json.loads((workdir / ".taskcard-host" / "ended.json").read_text())
        assert record["final_retry_used"] is True
        os.kill(pid, signal.SIGKILL)
        retry.communicate(timeout=120)
    finally:
        if retry.poll() is None:
            retry.kill()
            retry.communicate()
    (workdir / "go.flag").write_text("")
    again = cli.run("card", "retry", "tc_1")  # a new host, from the record
    assert again.returncode == 1, again.stdout
    assert "its one final retry; start a new watch" in again.stdout


def test_a_watch_whose_budget_ran_out_while_no_host_ran_keeps_its_final_retry(
    workdir: Path, cli: CliHost
) -> None:
    """The manual reads `max-refreshes` again at each resume, so a ceiling the owner lowered
    while the host was dead can leave a watch with its budget spent. The next host cleared
    it and left the card inactive (the manual's stale descriptor) and then knew nothing of
    it: "not resumed ... start a new watch", so the final retry the manual offers a watch
    that expired was lost. It is still not resumed (nothing renders at boot, the card stays
    inactive), but it is known as exhausted, its limit notice goes out, and the final retry
    is there, also for a host started after that one."""
    write_renderer(workdir, "r.py", COUNTER_RENDERER)
    started = cli.run("card", "start", "r.py", "--interval-s", "3600", "--max-refreshes", "10")
    assert started.returncode == 0, started.stdout + started.stderr
    assert cli.run("card", "retry", "tc_1").returncode == 0  # one refresh spent: render 2
    pid = cli.host_pid()
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: not pid_alive(pid))
    (workdir / "taskcard" / "taskcard.json").write_text('{"max_refreshes": 1}')
    inspected = cli.json("card", "inspect", "tc_1")  # a new host, from watch.json
    assert (inspected["status"], inspected["stop_reason"]) == ("exhausted", "max_refreshes")
    assert inspected["final_retry_available"] is True, inspected
    assert body(workdir) == "# Work\nrender 2\n"  # not rendered at boot
    assert status(workdir) == b"inactive"
    assert not (workdir / "taskcard" / "watch.json").exists()
    limits = [n for n in notifications(workdir) if n["source"] == "task_card.limit"]
    assert [n["extra"]["watch_id"] for n in limits] == ["tc_1"]
    final = cli.run("card", "retry", "tc_1")
    assert final.returncode == 0, final.stdout
    assert body(workdir) == "# Work\nrender 3\n"
    assert status(workdir) == b"inactive"
    cli.shutdown()
    later = cli.json("card", "inspect", "tc_1")
    assert (later["status"], later["final_retry_available"]) == ("exhausted", False)
    again = cli.run("card", "retry", "tc_1")
    assert again.returncode == 1, again.stdout
    assert "its one final retry; start a new watch" in again.stdout
    assert len([n for n in notifications(workdir) if n["source"] == "task_card.limit"]) == 1
