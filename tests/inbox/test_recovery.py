"""A reader killed between its claim and its acknowledgement: the next reader gets the messages.

Each test kills a real reader (`taskcard inbox`, `taskcard mcp` over stdio) with SIGKILL at the
moment it holds its claim: every message is in `inbox/taken/`, the first one written to an
output the test never reads, none acknowledged. No test hook is needed for that moment: both
readers claim everything before they write, then wait for their reader to read. The crash
points inside a claim (after a claim's record, after an acknowledgement) are set up as files,
as a dead reader leaves them.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from taskcard.producers.inbox.claim import claim

from ..conftest import mcp_session
from ..hooks.conftest import TASKCARD, hook, payload, run_taskcard
from .conftest import acks, names, queue
from .test_delivery import TIMEOUT_S, Wire, call_inbox_tool, mcp_args, queue_three, wait_until


def claimed_by_all_texts(stdout: bytes) -> list[str]:
    """The ids of the texts `taskcard inbox` printed, in the order printed."""
    return [line[len("> text ") :] for line in stdout.decode().splitlines() if "> text " in line]


@contextmanager
def cli_reader_holding(workdir: Path) -> Iterator[subprocess.Popen[bytes]]:
    """`taskcard inbox` with a socket as stdout that nobody reads: once the first message
    sits on it, the command holds its claim (all of them taken, none acknowledged)."""
    out = Wire("socket")
    reader = subprocess.Popen(
        [TASKCARD, "inbox", "--workdir", str(workdir)],
        stdout=out.child_fd,
        stderr=subprocess.DEVNULL,
    )
    out.attach(reader)
    try:
        wait_until(out.has_unread, "the first message on the socket")
        yield reader
    finally:
        if reader.poll() is None:
            reader.kill()
        reader.wait(timeout=TIMEOUT_S)
        out.close()


@contextmanager
def mcp_server_holding(workdir: Path, runtime_dir: Path) -> Iterator[subprocess.Popen[bytes]]:
    """`taskcard mcp` whose client called `inbox` and never reads the answer: the server
    waits for it as long as it takes, holding the claim."""
    out = Wire("pipe")
    server = subprocess.Popen(
        [TASKCARD, *mcp_args(workdir, runtime_dir)],
        stdin=subprocess.PIPE,
        stdout=out.child_fd,
        stderr=subprocess.DEVNULL,
    )
    out.attach(server)
    try:
        call_inbox_tool(server, out)
        wait_until(out.has_unread, "the answer on the wire")
        yield server
    finally:
        if server.poll() is None:
            server.kill()
        server.wait(timeout=TIMEOUT_S)
        assert server.stdin is not None
        server.stdin.close()
        out.close()


def killed(process: subprocess.Popen[bytes]) -> None:
    process.send_signal(signal.SIGKILL)
    assert process.wait(timeout=TIMEOUT_S) == -signal.SIGKILL


def stranded(workdir: Path) -> None:
    """What the killed reader left: all three taken, none acknowledged."""
    assert names(workdir, "taken") == ["m0.json", "m1.json", "m2.json"]
    assert names(workdir, "queued") == []
    assert acks(workdir) == []


def test_the_next_cli_read_gets_what_a_killed_cli_reader_held_once_each_in_order(
    workdir: Path,
) -> None:
    queue_three(workdir)
    with cli_reader_holding(workdir) as reader:
        killed(reader)
    stranded(workdir)
    again = run_taskcard("inbox", "--workdir", str(workdir))
    assert again.returncode == 0, again.stderr
    assert claimed_by_all_texts(again.stdout) == ["0", "1", "2"]
    assert b"warning" not in again.stderr, again.stderr
    assert [a["id"] for a in acks(workdir)] == ["m0", "m1", "m2"]
    assert names(workdir, "claims") == []
    last = run_taskcard("inbox", "--workdir", str(workdir))
    assert last.returncode == 0 and claimed_by_all_texts(last.stdout) == [], last
    assert [a["id"] for a in acks(workdir)] == ["m0", "m1", "m2"]


async def test_the_next_mcp_client_gets_what_a_killed_mcp_server_held(
    workdir: Path, runtime_dir: Path
) -> None:
    queue_three(workdir)
    with mcp_server_holding(workdir, runtime_dir) as server:
        killed(server)
    stranded(workdir)
    async with mcp_session(workdir, runtime_dir, (TASKCARD,)) as session:
        result = await session.call_tool("inbox", {})
        assert isinstance(result.structured_content, dict)
        assert [m["id"] for m in result.structured_content["messages"]] == ["m0", "m1", "m2"]
        assert "problems" not in result.structured_content
        wait_until(lambda: len(acks(workdir)) == 3, "the acks")
        again = await session.call_tool("inbox", {})
        assert isinstance(again.structured_content, dict)
        assert again.structured_content["messages"] == []
    assert [(a["id"], a["via"]) for a in acks(workdir)] == [
        ("m0", "mcp"),
        ("m1", "mcp"),
        ("m2", "mcp"),
    ]
    assert names(workdir, "queued") == [] and names(workdir, "claims") == []


def test_a_live_reader_keeps_its_claim_and_a_killed_one_gives_it_up_once(
    workdir: Path, runtime_dir: Path
) -> None:
    """While the MCP server holds m0..m2 another reader gets only what came after; once the
    server is killed, the next reader gets m0..m2, and nothing is read twice."""
    queue_three(workdir)
    with mcp_server_holding(workdir, runtime_dir) as server:
        queue(workdir, "m3", "text 3", queued_at="2026-01-01T00:00:03Z")
        during = run_taskcard("inbox", "--workdir", str(workdir))
        assert during.returncode == 0, during.stderr
        assert claimed_by_all_texts(during.stdout) == ["3"]
        assert server.poll() is None, "the holder is still alive"
        assert names(workdir, "taken") == ["m0.json", "m1.json", "m2.json", "m3.json"]
        killed(server)
    after = run_taskcard("inbox", "--workdir", str(workdir))
    assert after.returncode == 0, after.stderr
    assert claimed_by_all_texts(after.stdout) == ["0", "1", "2"]
    assert sorted(a["id"] for a in acks(workdir)) == ["m0", "m1", "m2", "m3"]
    assert len(acks(workdir)) == 4


def own_start_time() -> str:
    text = Path(f"/proc/{os.getpid()}/stat").read_text()
    return text[text.rindex(")") + 1 :].split()[19]


def write_claim(workdir: Path, ident: str, **holder: object) -> None:
    """A claim record as a reader writes it before its rename (`producers/inbox/holders.py`)."""
    me = {
        "pid": os.getpid(),
        "start": own_start_time(),
        "boot": Path("/proc/sys/kernel/random/boot_id").read_text().strip(),
        "pidns": os.readlink("/proc/self/ns/pid"),
        "via": "inbox-cli",
    }
    folder = workdir / "inbox" / "claims"
    folder.mkdir(exist_ok=True)
    (folder / f"{ident}.json").write_text(json.dumps({**me, **holder}))


def take(workdir: Path, ident: str) -> None:
    inbox = workdir / "inbox"
    os.rename(inbox / "queued" / f"{ident}.json", inbox / "taken" / f"{ident}.json")


def test_a_reused_pid_is_not_the_holder_and_the_holder_itself_keeps_its_claim(
    workdir: Path,
) -> None:
    """m0's record names this test's pid with another start time (the pid was reused after
    its reader died): queued again. m1's names this very process: left held."""
    queue_three(workdir)
    write_claim(workdir, "m0", start="1")
    take(workdir, "m0")
    write_claim(workdir, "m1")
    take(workdir, "m1")
    done = run_taskcard("inbox", "--workdir", str(workdir))
    assert done.returncode == 0, done.stderr
    assert claimed_by_all_texts(done.stdout) == ["0", "2"]
    assert names(workdir, "claims") == ["m1.json"]
    assert names(workdir, "queued") == []


def test_the_crash_points_of_a_claim_leave_nothing_offered_twice_nor_held(workdir: Path) -> None:
    """A reader that died after writing its record but before its rename (m0 still queued),
    one that died after acknowledging but before removing its record (m1 delivered), one
    that died holding m2 in another pid namespace (cannot be judged: left alone)."""
    queue_three(workdir)
    dead = subprocess.Popen(["true"])
    dead.wait()
    write_claim(workdir, "m0", pid=dead.pid)
    write_claim(workdir, "m1", pid=dead.pid)
    take(workdir, "m1")
    (workdir / "inbox" / "acks.jsonl").write_text(
        json.dumps({"id": "m1", "state": "delivered", "at": "x", "via": "inbox-cli"}) + "\n"
    )
    write_claim(workdir, "m2", pid=dead.pid, pidns="pid:[1]")
    take(workdir, "m2")
    done = run_taskcard("inbox", "--workdir", str(workdir))
    assert done.returncode == 0, done.stderr
    assert claimed_by_all_texts(done.stdout) == ["0"]
    assert [a["id"] for a in acks(workdir)] == ["m1", "m0"]
    assert names(workdir, "claims") == ["m2.json"]
    assert names(workdir, "taken") == ["m0.json", "m1.json", "m2.json"]


def test_a_claude_code_hook_is_the_next_reader_too(workdir: Path) -> None:
    """The hooks claim through the same code: the next PostToolUse hands the killed
    reader's messages to the model, oldest first."""
    queue_three(workdir)
    with cli_reader_holding(workdir) as reader:
        killed(reader)
    stranded(workdir)
    done = hook(payload("04_post_tool_use.json", workdir))
    assert done.returncode == 0, done.stderr
    context = json.loads(done.stdout)["hookSpecificOutput"]["additionalContext"]
    assert claimed_by_all_texts(context.encode()) == ["0", "1", "2"]
    assert [(a["id"], a["via"]) for a in acks(workdir)] == [
        ("m0", "claude-code:PostToolUse"),
        ("m1", "claude-code:PostToolUse"),
        ("m2", "claude-code:PostToolUse"),
    ]
    assert names(workdir, "claims") == []


def test_a_reader_that_read_the_queue_before_another_claimed_leaves_that_claim_recorded(
    workdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two readers on an inbox without `claims/` yet: B reads the queue, and before it gets
    the lock (as it creates `claims/`) A claims everything. B used to record itself over A's
    claims and then remove the records when its renames failed: A's messages were left
    without a holder, stranded should A be killed. The moment is placed by running A's claim
    from inside B's `mkdir` (the standard library's, not taskcard's)."""
    queue_three(workdir)
    real_mkdir = os.mkdir
    held: list[list[str]] = []
    a_ran = threading.Event()

    def mkdir_after_a_claims(path: Any, *args: Any, **kwargs: Any) -> None:
        if path == "claims" and not a_ran.is_set():
            a_ran.set()
            held.append([m.id for m in claim(workdir, "mcp").messages])  # reader A
        real_mkdir(path, *args, **kwargs)

    monkeypatch.setattr(os, "mkdir", mkdir_after_a_claims)
    b = claim(workdir, "inbox-cli")  # reader B
    monkeypatch.setattr(os, "mkdir", real_mkdir)
    assert held == [["m0", "m1", "m2"]]
    assert b.messages == [] and b.problems == []
    assert names(workdir, "claims") == ["m0.json", "m1.json", "m2.json"]
    folder = workdir / "inbox" / "claims"
    records = [json.loads((folder / name).read_text()) for name in names(workdir, "claims")]
    assert {(r["pid"], r["via"]) for r in records} == {(os.getpid(), "mcp")}


@pytest.mark.parametrize("pid", [2**31, 10**30])
def test_a_claim_record_naming_a_pid_no_process_can_have_is_a_gone_holder(
    workdir: Path, pid: int
) -> None:
    """A record in the agent's workdir is untrusted: one naming a pid beyond what the kernel
    gives out made every later claim in that inbox fail on an overflow. No process can hold
    it, so its message is queued again and read."""
    queue_three(workdir)
    write_claim(workdir, "m0", pid=pid)
    take(workdir, "m0")
    done = run_taskcard("inbox", "--workdir", str(workdir))
    assert done.returncode == 0, done.stderr
    assert claimed_by_all_texts(done.stdout) == ["0", "1", "2"]
