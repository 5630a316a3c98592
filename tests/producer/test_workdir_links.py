"""Links and planted files in an agent's workdir after a card started (the producer side).

Anything that writes the workdir (the agent, its renderer, another program) can swap a file
the host uses for a symlink between two ticks. The host checks again at every use what it
checked once at start, and never reads, writes or locks through a link out of the workdir.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from .conftest import COUNTER_RENDERER, FLAG_RENDERER, CliHost, wait_for, write_renderer


def activity(workdir: Path) -> subprocess.CompletedProcess[str]:
    """`taskcard activity turn.start` for `workdir`, as a hook or a script runs it."""
    command = [sys.executable, "-m", "taskcard.bridge.cli", "activity", "turn.start"]
    return subprocess.run(
        [*command, "--workdir", str(workdir)], capture_output=True, text=True, timeout=120
    )


OUTSIDE_RENDERER = 'print("# Outside\\nOUTSIDE BODY")\n'


def test_a_renderer_swapped_for_a_symlink_out_of_the_workdir_is_not_run(
    workdir: Path, tmp_path: Path, cli: CliHost
) -> None:
    write_renderer(workdir, "r.py", COUNTER_RENDERER)
    started = cli.json("card", "start", "r.py", "--interval-s", "1")
    assert started["status"] == "watching", started
    wait_for(lambda: int((workdir / "count.txt").read_text()) >= 2)
    outside = tmp_path / "outside.py"
    outside.write_text(
        "from pathlib import Path\n"
        f"Path({str(tmp_path / 'ran.flag')!r}).write_text('ran')\n" + OUTSIDE_RENDERER
    )
    (workdir / "r.py").unlink()
    (workdir / "r.py").symlink_to(outside)

    def refused() -> bool:
        inspected = cli.json("card", "inspect", "tc_1")
        error = inspected.get("error") or {}
        return inspected["status"] == "error" and error.get("code") == "renderer_failed"

    wait_for(refused)
    inspected = cli.json("card", "inspect", "tc_1")
    assert "r.py" in inspected["error"]["message"]
    assert "outside the workdir" in inspected["error"]["message"]
    assert not (tmp_path / "ran.flag").exists()
    assert "OUTSIDE BODY" not in (workdir / "taskcard" / "taskcard.md").read_text()
    # Put back as a regular file, the card recovers at the next tick.
    (workdir / "r.py").unlink()
    write_renderer(workdir, "r.py", COUNTER_RENDERER)
    wait_for(lambda: cli.json("card", "inspect", "tc_1")["status"] == "watching")
    assert cli.json("card", "remove")["status"] == "removed"
    assert not (tmp_path / "ran.flag").exists()


def test_a_renderer_named_by_a_link_runs_where_the_link_points_at_each_run(
    workdir: Path, tmp_path: Path, cli: CliHost
) -> None:
    versions = workdir / "versions"
    versions.mkdir()
    write_renderer(versions, "v1.py", 'print("# Work\\nversion one")\n')
    write_renderer(versions, "v2.py", 'print("# Work\\nversion two")\n')
    link = workdir / "r.py"
    link.symlink_to("versions/v1.py")
    started = cli.json("card", "start", "r.py", "--interval-s", "3600")
    assert (started["status"], started["watch_id"]) == ("watching", "tc_1")
    assert cli.json("card", "inspect", "tc_1")["renderer_path"] == "r.py"
    assert json.loads((workdir / "taskcard" / "watch.json").read_text())["renderer_path"] == "r.py"
    # The agent points its link at a new version: the next render runs that one.
    link.unlink()
    link.symlink_to("versions/v2.py")
    assert cli.json("card", "retry", "tc_1")["status"] == "watching"
    assert (workdir / "taskcard" / "taskcard.md").read_text() == "# Work\nversion two\n"
    # A link turned to lead out of the workdir is refused, as for a renderer file swapped.
    outside = tmp_path / "outside.py"
    outside.write_text(OUTSIDE_RENDERER)
    link.unlink()
    link.symlink_to(outside)
    retried = cli.json("card", "retry", "tc_1")
    assert (retried["status"], retried["refresh_error"]["code"]) == ("error", "renderer_failed")
    assert "version two" in (workdir / "taskcard" / "taskcard.md").read_text()


def test_a_card_folder_linked_out_of_the_workdir_is_refused_not_locked_through(
    workdir: Path, tmp_path: Path, runtime_dir: Path, cli: CliHost
) -> None:
    """`taskcard/` planted as a link to another agent's card folder: the host neither waits
    on that agent's lock (it was refused as "already running") nor writes its card there."""
    write_renderer(workdir, "r.py", COUNTER_RENDERER)
    assert cli.json("card", "start", "r.py", "--interval-s", "3600")["status"] == "watching"
    other = tmp_path / "other"
    other.mkdir()
    write_renderer(other, "r.py", 'print("# Other\\nOTHER BODY")\n')
    (other / "taskcard").symlink_to(workdir / "taskcard")
    second = CliHost(other, runtime_dir)
    try:
        for command in (("card", "start", "r.py"), ("host",)):
            done = second.run(*command, timeout_s=60)
            assert done.returncode == 2, (command, done.stdout, done.stderr)
            assert f"{other / 'taskcard'} is a symlink that leads out of the workdir" in done.stderr
            assert "already runs" not in done.stderr
        assert "OTHER BODY" not in (workdir / "taskcard" / "taskcard.md").read_text()
        assert cli.json("card", "inspect", "tc_1")["status"] == "watching"
        # A link that stays inside the workdir is followed as before.
        (other / "taskcard").unlink()
        (other / "state").mkdir()
        (other / "taskcard").symlink_to(other / "state")
        assert second.json("card", "start", "r.py")["status"] == "watching"
        wait_for(lambda: "OTHER BODY" in (other / "state" / "taskcard.md").read_text())
        assert (other / ".taskcard-host" / "lock").is_file()
        assert set(os.listdir(other / "state")) == {"status", "taskcard.md", "watch.json"}
    finally:
        second.shutdown()


def test_signal_files_linked_out_of_the_workdir_are_never_written_through(
    workdir: Path, tmp_path: Path, cli: CliHost
) -> None:
    """The notification file and the activity log planted as links to files outside (a
    dotfile of the agent's user, say): the host and `taskcard activity` refuse to append
    there, name the file, and the card itself goes on."""
    outside = tmp_path / "dotfile"
    outside.write_text("keep me\n")
    (workdir / ".notification").mkdir()
    (workdir / ".notification" / "system.jsonl").symlink_to(outside)
    (workdir / "logs").mkdir()
    (workdir / "logs" / "events.jsonl").symlink_to(outside)
    write_renderer(workdir, "r.py", FLAG_RENDERER)
    assert cli.json("card", "start", "r.py", "--interval-s", "1")["status"] == "watching"
    (workdir / "fail.flag").write_text("")
    wait_for(lambda: cli.json("card", "inspect", "tc_1")["status"] == "error")
    (workdir / "fail.flag").unlink()
    wait_for(lambda: cli.json("card", "inspect", "tc_1")["status"] == "watching")
    done = activity(workdir)
    assert done.returncode == 1, done.stderr
    assert "logs/events.jsonl leads out of the workdir" in done.stderr
    # A folder on the way linked out is refused the same way, and nothing is created there.
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (workdir / "logs" / "events.jsonl").unlink()
    (workdir / "logs").rmdir()
    (workdir / "logs").symlink_to(elsewhere)
    done = activity(workdir)
    assert done.returncode == 1, done.stderr
    assert "leads out of the workdir" in done.stderr
    assert list(elsewhere.iterdir()) == []
    assert outside.read_text() == "keep me\n"
    # Links that stay inside the workdir are written through as before.
    (workdir / "logs").unlink()
    (workdir / "kept").mkdir()
    (workdir / "logs").symlink_to(workdir / "kept")
    assert activity(workdir).returncode == 0
    assert "turn.start" in (workdir / "kept" / "events.jsonl").read_text()


def test_a_reports_folder_or_file_linked_out_of_the_workdir_takes_no_report(
    workdir: Path, tmp_path: Path
) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()

    def report() -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "taskcard.bridge.cli", "report", "--ok"]
        return subprocess.run(
            [*command, "--summary", "done", "--payload", "-", "--workdir", str(workdir)],
            input="details",
            capture_output=True,
            text=True,
            timeout=120,
        )

    (workdir / "reports").symlink_to(elsewhere)
    done = report()
    assert done.returncode != 0 and "reports/: leads out of the workdir" in done.stderr, done
    assert list(elsewhere.iterdir()) == []
    (workdir / "reports").unlink()
    (workdir / "reports").mkdir()
    outside = tmp_path / "dotfile"
    outside.write_text("keep me\n")
    (workdir / "reports" / "reports.jsonl").symlink_to(outside)
    done = report()
    assert done.returncode != 0 and "leads out of the workdir" in done.stderr, done
    assert outside.read_text() == "keep me\n"
    (workdir / "reports" / "reports.jsonl").unlink()
    assert report().returncode == 0
    assert '"seq":1' in (workdir / "reports" / "reports.jsonl").read_text()


def test_a_card_folder_swapped_for_a_link_out_while_watching_is_not_written_through(
    workdir: Path, tmp_path: Path, cli: CliHost
) -> None:
    write_renderer(workdir, "r.py", COUNTER_RENDERER)
    assert cli.json("card", "start", "r.py", "--interval-s", "1")["status"] == "watching"
    wait_for(lambda: int((workdir / "count.txt").read_text()) >= 2)
    moved = tmp_path / "moved"
    (workdir / "taskcard").rename(moved)
    (workdir / "taskcard").symlink_to(moved)
    body = (moved / "taskcard.md").read_text()
    runs = int((workdir / "count.txt").read_text())
    wait_for(lambda: int((workdir / "count.txt").read_text()) >= runs + 2)
    assert (moved / "taskcard.md").read_text() == body  # rendered, never written there
    done = cli.run("card", "inspect", "tc_1")
    assert done.returncode == 2 and "leads out of the workdir" in done.stderr
    # Made a folder again: the next tick publishes, and the host answers again.
    (workdir / "taskcard").unlink()
    moved.rename(workdir / "taskcard")
    wait_for(lambda: (workdir / "taskcard" / "taskcard.md").read_text() != body)
    inspected = cli.json("card", "inspect", "tc_1")
    assert inspected["status"] == "watching", inspected


def test_a_budget_running_out_while_the_card_folder_links_out_writes_nothing_there(
    workdir: Path, tmp_path: Path, cli: CliHost
) -> None:
    """The last refresh of a budget spent while `taskcard/` is a link out of the workdir: the
    `inactive` status and the descriptor's removal go through the same per-tick check as
    every other card write, so nothing in the folder the link leads to changes."""
    moved = tmp_path / "moved"
    swap = (
        "import os\nfrom pathlib import Path\n"
        'p = Path("count.txt")\nn = int(p.read_text()) + 1 if p.exists() else 1\n'
        "p.write_text(str(n))\n"
        "if n == 2:\n"
        f'    os.rename("taskcard", {str(moved)!r})\n'
        f'    os.symlink({str(moved)!r}, "taskcard")\n'
        'print("# Work\\nrun", n)\n'
    )
    write_renderer(workdir, "r.py", swap)
    started = cli.json("card", "start", "r.py", "--interval-s", "1", "--max-refreshes", "2")
    assert started["status"] == "watching", started

    def limit_noticed() -> bool:
        path = workdir / ".notification" / "system.jsonl"
        return path.is_file() and "task_card.limit" in path.read_text()

    wait_for(limit_noticed)
    assert (moved / "status").read_text() == "active"
    assert (moved / "watch.json").is_file()
    assert "run 1" in (moved / "taskcard.md").read_text()


def test_lock_files_planted_as_links_are_refused_and_create_nothing_elsewhere(
    workdir: Path, tmp_path: Path
) -> None:
    """`reports/.lock` and the ledger's `.lock` were opened with `O_CREAT` through a link: a
    dangling one made an empty file wherever it pointed, and a live one locked a foreign
    file (another agent's lock, say)."""

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "taskcard.bridge.cli", *args, "--workdir", str(workdir)]
        return subprocess.run(command, capture_output=True, text=True, timeout=120)

    (workdir / "reports").mkdir()
    (workdir / "ledger").mkdir()
    (workdir / "reports" / ".lock").symlink_to(tmp_path / "reports-lock")
    (workdir / "ledger" / "long-task-ledger.json.lock").symlink_to(tmp_path / "ledger-lock")
    done = run("report", "--ok", "--summary", "done")
    assert done.returncode == 2 and "leads out of the workdir" in done.stderr, done.stderr
    done = run("ledger", "init", "t", "--purpose", "p", "--no-renderer")
    assert done.returncode == 2, done.stderr
    assert "long-task-ledger.json.lock: a symlink" in done.stderr and "remove it" in done.stderr
    assert not (tmp_path / "reports-lock").exists()
    assert not (tmp_path / "ledger-lock").exists()
    # Removed, the lock files are made again and both commands work.
    (workdir / "reports" / ".lock").unlink()
    (workdir / "ledger" / "long-task-ledger.json.lock").unlink()
    assert run("report", "--ok", "--summary", "done").returncode == 0
    assert run("ledger", "init", "t", "--purpose", "p", "--no-renderer").returncode == 0


def test_reports_linked_out_of_the_workdir_are_not_read_as_the_agents_own(
    workdir: Path, tmp_path: Path
) -> None:
    """`taskcard reports` followed a `reports/` folder, or its `payloads/`, linked to another
    agent's: that agent's reports and payloads read as this one's (the writer refused it)."""

    def run(where: Path, *args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "taskcard.bridge.cli", *args, "--workdir", str(where)]
        return subprocess.run(command, input=stdin, capture_output=True, text=True, timeout=120)

    other = tmp_path / "other"
    other.mkdir()
    made = run(other, "report", "--ok", "--summary", "theirs", "--payload", "-", stdin="SECRET")
    assert made.returncode == 0, made.stderr
    (workdir / "reports").symlink_to(other / "reports")
    done = run(workdir, "reports")
    assert done.returncode == 2 and "reports/: leads out of the workdir" in done.stderr
    assert "theirs" not in done.stdout
    (workdir / "reports").unlink()
    mine = run(workdir, "report", "--ok", "--summary", "mine", "--payload", "-", stdin="own")
    assert mine.returncode == 0, mine.stderr
    (workdir / "reports" / "payloads").rename(tmp_path / "mine")
    (workdir / "reports" / "payloads").symlink_to(other / "reports" / "payloads")
    shown = json.loads(run(workdir, "reports").stdout)["report"]
    assert shown["summary"] == "mine" and shown["payload"] is None


def test_a_folder_linked_out_of_the_workdir_is_named_with_the_right_fix(
    workdir: Path, tmp_path: Path
) -> None:
    """`logs/` linked out: the refusal said to "replace the link with a regular file", which
    names neither the link (the folder, not the file below it) nor a fix that works (a file at
    `logs` breaks every writer). It names the link and says to make it a folder; a file that
    is the link itself is still told to be a regular file."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (workdir / "logs").symlink_to(elsewhere)
    done = activity(workdir)
    assert done.returncode == 1, done.stderr
    assert f"(a symlink at {workdir / 'logs'})" in done.stderr, done.stderr
    assert "replace the link with a folder" in done.stderr, done.stderr
    hook = subprocess.run(
        [
            sys.executable,
            "-m",
            "taskcard.bridge.cli",
            "hook",
            "claude-code",
            "--workdir",
            str(workdir),
        ],
        input='{"hook_event_name": "UserPromptSubmit", "session_id": "s", "prompt": "go"}',
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert hook.returncode == 0 and "replace the link with a folder" in hook.stderr, hook.stderr
    assert list(elsewhere.iterdir()) == []
    (workdir / "logs").unlink()
    (workdir / "logs").mkdir()
    (workdir / "logs" / "events.jsonl").symlink_to(tmp_path / "dotfile")
    done = activity(workdir)
    assert done.returncode == 1 and "events.jsonl leads out of the workdir" in done.stderr
    assert "replace the link with a regular file" in done.stderr, done.stderr


def test_a_link_above_the_workdir_is_never_named_as_the_one_to_replace(tmp_path: Path) -> None:
    """A workdir reached through a link (a linked home; `/tmp` on macOS) whose `logs/` leads
    out: the refusal names `logs`, never the link above the workdir, which is not the fault."""
    from taskcard.producers.task_card.contract import OutsideWorkdir, append_jsonl_line

    (tmp_path / "real" / "agent").mkdir(parents=True)
    (tmp_path / "home").symlink_to(tmp_path / "real")
    (tmp_path / "elsewhere").mkdir()
    workdir = tmp_path / "home" / "agent"
    (workdir / "logs").symlink_to(tmp_path / "elsewhere")
    try:
        append_jsonl_line(workdir / "logs" / "events.jsonl", {"kind": "x"}, inside=workdir)
    except OutsideWorkdir as exc:
        message = str(exc)
    else:
        raise AssertionError("written through the link")
    assert f"(a symlink at {workdir / 'logs'})" in message, message
    assert "replace the link with a folder" in message, message
    assert list((tmp_path / "elsewhere").iterdir()) == []
