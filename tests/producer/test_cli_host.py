"""The shell forms and the background host: detached, single, surviving SIGKILL (point 6)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from taskcard.producers.task_card.envelope import MAX_ENVELOPE_BYTES

from .conftest import (
    COUNTER_RENDERER,
    FLAG_RENDERER,
    STATIC_RENDERER,
    CliHost,
    notifications,
    pid_alive,
    wait_for,
    write_renderer,
)

# A call through the host (`card settings` answers without one).


def test_a_watch_started_from_the_shell_keeps_refreshing_after_the_command_exits(
    workdir: Path, cli: CliHost
) -> None:
    write_renderer(workdir, "r.py", COUNTER_RENDERER)
    done = cli.run("card", "start", "r.py", "--interval-s", "1", "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["status"] == "watching"
    wait_for(lambda: int((workdir / "count.txt").read_text()) >= 3)
    inspected = cli.json("card", "inspect", "tc_1")
    assert inspected["status"] == "watching"
    assert inspected["refreshes_used"] >= 2
    assert not str(cli.paths.socket).startswith(str(workdir))
    removed = cli.json("card", "remove")
    assert (removed["status"], removed["body_removed"]) == ("removed", True)


def test_tool_takes_the_envelope_as_argument_or_stdin(workdir: Path, cli: CliHost) -> None:
    settings = cli.json("tool", '{"action": "settings", "input": {}, "reasoning": "look"}')
    assert settings["status"] == "ok" and len(settings["settings"]) == 5
    manual = cli.json("tool", stdin='{"action": "manual", "input": {}, "reasoning": "read"}')
    assert "### max-body-chars" in manual["manual"]
    # `-` is stdin, as for `report --payload -`; it was read as the envelope's text.
    dash = cli.json("tool", "-", stdin='{"action": "settings", "input": {}, "reasoning": "r"}')
    assert dash["status"] == "ok"
    bad = cli.run("tool", '{"action": "start", "input": {"renderer_path": 3}, "reasoning": "x"}')
    assert bad.returncode == 2  # the schema's refusal: the caller's envelope
    assert "input.renderer_path" in json.loads(bad.stdout)["message"]
    assert "## Lifecycle" in cli.run("card", "manual").stdout


# Over the envelope cap, by less than the 64 KiB a blocking read of the rest waited for.
_OVERSIZED = b'{"action": "manual", "input": {"pad": "%s"}, "reasoning": "r"}' % (
    b"x" * (MAX_ENVELOPE_BYTES + 16_000)
)


@pytest.mark.parametrize(
    ("written", "code", "said"),
    [
        (b'{"action": "manual", "input": {}, "reasoning": "read"}\n', 0, "### max-body-chars"),
        (
            b'{"action": "manual", "input"',
            2,
            "the text ends before the object is complete (truncated?); stdin stayed open 30 s"
            " with nothing more: close stdin after writing the envelope",
        ),
        (
            b'{"action": "manual", "input": {}, "reasoning": "read",}\n',
            2,
            "envelope: not valid JSON at line 1, column 55; send exactly one JSON object",
        ),
        (b"{'action': 'manual'}", 2, "envelope: not valid JSON at line 1, column 2;"),
        (_OVERSIZED, 2, f"over the {MAX_ENVELOPE_BYTES}-byte limit"),
    ],
    ids=["a whole envelope", "half an envelope", "a trailing comma", "single quotes", "too large"],
)
def test_tool_ends_when_its_caller_keeps_stdin_open(
    cli: CliHost, written: bytes, code: int, said: str
) -> None:
    """A caller that writes the envelope and never closes the pipe held `taskcard tool`
    forever: a whole envelope is taken once the pipe goes quiet, bytes no more input can make
    one (a trailing comma, quotes that are not JSON's) are refused as soon as it goes quiet,
    naming line and column as on a closed pipe, and a pipe that stays open with half an
    envelope is refused after 30 s naming what is wrong with it and the fix. An oversized
    envelope is refused without waiting for the rest (the drain of it waited for ever)."""
    with subprocess.Popen(
        cli.command("tool"), stdin=subprocess.PIPE, stdout=subprocess.PIPE
    ) as tool:
        assert tool.stdin is not None and tool.stdout is not None
        tool.stdin.write(written)
        tool.stdin.flush()
        try:
            assert tool.wait(timeout=120) == code
        finally:
            tool.kill()
        result = json.loads(tool.stdout.read())
    assert said in json.dumps(result), result
    if code:
        assert said in result["message"], result
        # Only a pipe that went quiet with bytes more input could still mend is waited on.
        assert ("stayed open" in result["message"]) == ("stayed open" in said), result


def test_an_oversized_envelope_is_answered_while_its_writer_goes_on_writing(
    cli: CliHost,
) -> None:
    """A caller that wrote an oversized envelope and went on writing (a byte now and then,
    the pipe never closed) held `taskcard tool` for as long as it wrote: the rest was drained
    before the refusal was answered, up to 64 MiB. The refusal, naming the limit and the fix,
    is answered at once and the command ends while the writer still writes."""
    stop = threading.Event()
    # Unbuffered: closing the pipe at the end has nothing left to flush into a closed reader.
    with subprocess.Popen(
        cli.command("tool"), stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0
    ) as tool:
        assert tool.stdin is not None and tool.stdout is not None
        writer_stdin = tool.stdin

        def write_on() -> None:
            try:
                writer_stdin.write(_OVERSIZED)
                while not stop.wait(0.05):  # the writer's pace, not a wait for the command
                    writer_stdin.write(b" ")
            except (BrokenPipeError, ValueError):
                pass  # the command stopped reading, as it should

        writer = threading.Thread(target=write_on, daemon=True)
        writer.start()
        try:
            assert tool.wait(timeout=60) == 2
            assert not stop.is_set(), "the writer was still writing when the command ended"
        finally:
            stop.set()
            tool.kill()
            writer.join(timeout=10)
        result = json.loads(tool.stdout.read())
    assert result["code"] == "bad_envelope", result
    assert result["message"] == (
        f"envelope: over the {MAX_ENVELOPE_BYTES}-byte limit; send a short envelope (put long"
        " detail in files the renderer reads)"
    )


@pytest.mark.parametrize(
    "command",
    [
        ("tool", '{"action": "bogus", "input": {}, "reasoning": "x"}'),
        ("tool", '{"action": "start", "input": {"renderer_path": 3}, "reasoning": "x"}'),
        ("tool", '{"action": "settings", "input": {"extra": 1}, "reasoning": "x"}'),
        ("card", "inspect", ""),
    ],
    ids=["unknown-action", "wrong-type", "unknown-field", "card-empty-id"],
)
def test_an_envelope_the_schema_refuses_starts_no_host(cli: CliHost, command: tuple[str]) -> None:
    """Refused as the host would refuse it, before a host is started: one used to start and
    idle for its grace (120 s by default) after answering only this refusal. A usage error,
    the caller's envelope (exit 2, `bad_envelope`, as an envelope that breaks the transport
    rules): it exited 1 without a code, as if the call had failed at its work."""
    done = cli.run(*command, *(("--json",) if command[0] == "card" else ()))
    assert done.returncode == 2, (done.stdout, done.stderr)
    result = json.loads(done.stdout)
    assert (result["status"], result["code"]) == ("failed", "bad_envelope"), result
    assert result["message"].split(":")[0] in {"action", "input.renderer_path", "input.extra",
                                                 "input.watch_id"}  # fmt: skip
    assert cli.host_pid() is None
    assert not cli.paths.socket.exists() and not cli.paths.log.exists()


def test_a_second_host_for_the_same_workdir_is_refused(workdir: Path, cli: CliHost) -> None:
    cli.start_host()
    second = cli.run("host", timeout_s=60)
    assert second.returncode == 3
    assert "already runs" in second.stderr


def test_concurrent_starts_from_two_processes_exactly_one_wins(workdir: Path, cli: CliHost) -> None:
    write_renderer(workdir, "r.py", "import time\ntime.sleep(0.5)\nprint('# one card')\n")
    with ThreadPoolExecutor(2) as pool:
        runs = list(pool.map(lambda _: cli.run("card", "start", "r.py", "--json"), range(2)))
    statuses = sorted(json.loads(run.stdout)["status"] for run in runs)
    assert statuses == ["failed", "watching"]


def test_a_start_while_another_renders_says_what_to_do_then_names_the_watch(
    workdir: Path, cli: CliHost
) -> None:
    """The start that lost the race was told only "another start is in progress": not
    what to do, nor how to find the watch the other one made."""
    write_renderer(
        workdir,
        "r.py",
        "import pathlib, time\n"
        "pathlib.Path('rendering').touch()\n"
        "while not pathlib.Path('go').exists():\n"
        "    time.sleep(0.05)\n"
        "print('# one card')\n",
    )
    first = subprocess.Popen(
        cli.command("card", "start", "r.py", "--json"), stdout=subprocess.PIPE, text=True
    )
    try:
        wait_for(lambda: (workdir / "rendering").exists())
        second = cli.json("card", "start", "r.py")
        assert second["status"] == "failed", second
        assert second["message"].startswith("another start is in progress"), second
        assert "call start again once it is done" in second["message"], second
    finally:
        (workdir / "go").touch()
        out, _ = first.communicate(timeout=120)
    assert json.loads(out)["status"] == "watching"
    again = cli.json("card", "start", "r.py")
    assert (again["status"], again["watch_id"]) == ("failed", "tc_1"), again


def test_sigkill_of_the_host_then_rehydration_with_the_same_id_and_budget(
    workdir: Path, cli: CliHost
) -> None:
    write_renderer(workdir, "r.py", COUNTER_RENDERER)
    started = cli.json("card", "start", "r.py", "--interval-s", "3600", "--max-refreshes", "9")
    assert started["watch_id"] == "tc_1"
    for _ in range(3):
        cli.json("card", "retry", "tc_1")
    pid = cli.host_pid()
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: not pid_alive(pid))
    renders_before = int((workdir / "count.txt").read_text())
    inspected = cli.json("card", "inspect", "tc_1")  # spawns a new host, which rehydrates
    assert cli.host_pid() != pid
    assert inspected["status"] == "watching"
    assert inspected["status_value"] == "active"
    assert (inspected["refreshes_used"], inspected["refreshes_remaining"]) == (3, 6)
    assert inspected["interval_s"] == 3600
    assert int((workdir / "count.txt").read_text()) == renders_before + 1  # reran on resume
    assert cli.json("card", "start", "r.py")["status"] == "failed"  # still the one watch


@pytest.mark.parametrize("deleted", ["card-folder", "descriptor"])
def test_card_files_deleted_under_a_running_watch_come_back_with_the_descriptor(
    workdir: Path, cli: CliHost, deleted: str
) -> None:
    """The manual keeps `taskcard/watch.json` while a watch is active, so the watch survives a
    restart. A shell `rm` of the card folder (or of the descriptor) under a running watch used
    to leave the descriptor gone for good: the ticks brought back the body and the status, so
    the host that followed a killed one found no watch and left the card `active`, never
    refreshed again."""
    write_renderer(workdir, "r.py", COUNTER_RENDERER)
    assert cli.json("card", "start", "r.py", "--interval-s", "1")["status"] == "watching"
    folder = workdir / "taskcard"
    if deleted == "card-folder":
        trash = workdir / "trash"
        folder.rename(trash)  # one step, so no tick writes into a half-deleted folder
        shutil.rmtree(trash)
    else:
        (folder / "watch.json").unlink()
    card_files = ("watch.json", "status", "taskcard.md")
    wait_for(lambda: all((folder / name).is_file() for name in card_files))
    kill_host(cli)
    renders = int((workdir / "count.txt").read_text())
    inspected = cli.json("card", "inspect", "tc_1")  # a new host: it resumes the watch
    assert (inspected["status"], inspected["status_value"]) == ("watching", "active")
    wait_for(lambda: int((workdir / "count.txt").read_text()) > renders + 1)
    assert cli.json("card", "remove")["status"] == "removed"


def kill_host(cli: CliHost) -> None:
    pid = cli.host_pid()
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: not pid_alive(pid))


def test_a_host_killed_mid_error_resumes_the_episode_no_second_error_then_one_recovery(
    workdir: Path, cli: CliHost
) -> None:
    write_renderer(workdir, "r.py", FLAG_RENDERER)
    assert cli.json("card", "start", "r.py", "--interval-s", "3600")["status"] == "watching"
    (workdir / "fail.flag").touch()
    assert cli.json("card", "retry", "tc_1")["status"] == "error"
    kill_host(cli)
    # The next host resumes the watch and its render still fails: the same episode goes on.
    inspected = cli.json("card", "inspect", "tc_1")
    assert (inspected["status"], inspected["error"]["code"]) == ("error", "renderer_nonzero_exit")
    assert [n["id"] for n in notifications(workdir)] == [
        "task_card.error:tc_1:1:renderer_nonzero_exit"
    ]
    kill_host(cli)
    (workdir / "fail.flag").unlink()
    # Fixed while no host ran: the resume publishes, and the chats hear the episode ended.
    inspected = cli.json("card", "inspect", "tc_1")
    assert (inspected["status"], inspected["error"]) == ("watching", None)
    assert [n["id"] for n in notifications(workdir)] == [
        "task_card.error:tc_1:1:renderer_nonzero_exit",
        "task_card.recovered:tc_1:1",
    ]
    kill_host(cli)
    (workdir / "fail.flag").touch()
    assert cli.json("card", "inspect", "tc_1")["status"] == "error"  # a new episode: a new key
    assert notifications(workdir)[-1]["id"] == "task_card.error:tc_1:2:renderer_nonzero_exit"


def test_ceilings_lowered_while_no_host_runs_cap_the_resumed_watch(
    workdir: Path, cli: CliHost
) -> None:
    write_renderer(workdir, "r.py", STATIC_RENDERER)
    started = cli.json(
        "card", "start", "r.py", "--interval-s", "3600", "--max-refreshes", "50", "--timeout-s", "5"
    )
    assert (started["status"], started["max_refreshes"]) == ("watching", 50)
    for _ in range(3):
        cli.json("card", "retry", "tc_1")
    cli.shutdown()
    # The owner lowers both ceilings; the manual reads them again at every resume.
    settings = workdir / "taskcard" / "taskcard.json"
    settings.write_text(json.dumps({"max_refreshes": 10, "timeout_s": 2}))
    inspected = cli.json("card", "inspect", "tc_1")
    assert inspected["status"] == "watching"
    assert (inspected["max_refreshes"], inspected["refreshes_used"]) == (10, 3)
    assert (inspected["refreshes_remaining"], inspected["timeout_s"]) == (7, 2)
    assert json.loads((workdir / "taskcard" / "watch.json").read_text())["max_refreshes"] == 10
    cli.shutdown()
    # Lowered under what the watch already spent: nothing is left, the card goes inactive,
    # and the watch is known as exhausted, its final retry still there (test_final_retry).
    settings.write_text(json.dumps({"max_refreshes": 3}))
    ended = cli.json("card", "inspect", "tc_1")
    assert (ended["status"], ended["final_retry_available"]) == ("exhausted", True)
    assert not (workdir / "taskcard" / "watch.json").exists()
    assert (workdir / "taskcard" / "status").read_bytes() == b"inactive"


def test_a_stopped_watch_can_be_retried_and_inspected_after_its_host_exited(
    workdir: Path, cli: CliHost
) -> None:
    """The manual keeps a stopped watch "for a possible later retry/inspection", but a host
    exits once no watch is live (its idle grace): the stopped watch was then "not a watch of
    this host" for every later call. A later host knows it, its budget and how it ended."""
    write_renderer(workdir, "r.py", COUNTER_RENDERER)
    assert (
        cli.json("card", "start", "r.py", "--interval-s", "3600", "--max-refreshes", "3")["status"]
        == "watching"
    )
    assert cli.json("card", "stop", "tc_1")["status"] == "stopped"
    cli.shutdown()  # as the idle grace ends it
    inspected = cli.json("card", "inspect", "tc_1")
    assert (inspected["status"], inspected["stop_reason"]) == ("stopped", "stopped")
    assert inspected["last_body"] == "# Work\nrender 1\n"
    retried = cli.json("card", "retry", "tc_1")  # a stopped watch's retry: body only
    assert (retried["status"], retried["refreshes_used"]) == ("stopped", 1)
    assert (workdir / "taskcard" / "taskcard.md").read_text() == "# Work\nrender 2\n"
    assert (workdir / "taskcard" / "status").read_bytes() == b"inactive"
    cli.shutdown()
    assert cli.json("card", "retry", "tc_1")["refreshes_used"] == 2  # the spent budget stays
    assert cli.json("card", "retry", "tc_1")["status"] == "exhausted"
    assert [n["source"] for n in notifications(workdir)] == ["task_card.limit"]
    cli.shutdown()
    exhausted = cli.json("card", "inspect", "tc_1")
    assert (exhausted["status"], exhausted["stop_reason"]) == ("exhausted", "max_refreshes")
    assert cli.json("card", "retry", "tc_1")["status"] == "exhausted"  # its final retry
    refused = cli.json("card", "retry", "tc_1")
    assert "start a new watch" in refused["message"]
    # A removed card stays removed for later hosts too.
    assert cli.json("card", "remove")["status"] == "removed"
    cli.shutdown()
    assert "not a watch of this host" in cli.json("card", "inspect", "tc_1")["message"]
    assert not (workdir / "taskcard" / "taskcard.md").exists()


def test_a_new_watch_replaces_the_stopped_one_a_later_host_knows(
    workdir: Path, cli: CliHost
) -> None:
    write_renderer(workdir, "r.py", STATIC_RENDERER)
    assert cli.json("card", "start", "r.py", "--interval-s", "3600")["watch_id"] == "tc_1"
    assert cli.json("card", "stop", "tc_1")["status"] == "stopped"
    assert cli.json("card", "start", "r.py", "--interval-s", "3600")["watch_id"] == "tc_2"
    kill_host(cli)
    assert cli.json("card", "inspect", "tc_2")["status"] == "watching"  # resumed
    assert "not a watch of this host" in cli.json("card", "retry", "tc_1")["message"]


def test_a_resumed_watch_keeps_its_cadence_whatever_interval_s_says_now(
    workdir: Path, cli: CliHost
) -> None:
    """`interval-s` is a default for new watches, not a ceiling: a host killed and resumed
    (which the agent never sees) keeps the cadence the watch started with, whether it came
    from the setting or from `--interval-s`; the manual the agent reads says so."""
    write_renderer(workdir, "r.py", STATIC_RENDERER)
    settings = workdir / "taskcard" / "taskcard.json"
    settings.parent.mkdir(exist_ok=True)
    settings.write_text(json.dumps({"interval_s": 3600}))
    assert cli.json("card", "start", "r.py")["status"] == "watching"
    assert cli.json("card", "inspect", "tc_1")["interval_s"] == 3600  # the setting's default
    kill_host(cli)
    settings.write_text(json.dumps({"interval_s": 7200}))
    resumed = cli.json("card", "inspect", "tc_1")
    assert (resumed["status"], resumed["interval_s"]) == ("watching", 3600)
    assert json.loads((workdir / "taskcard" / "watch.json").read_text())["interval_s"] == 3600
    assert cli.json("card", "stop", "tc_1")["status"] == "stopped"
    # An explicit cadence survives a resume under a different setting too.
    assert cli.json("card", "start", "r.py", "--interval-s", "1800")["status"] == "watching"
    kill_host(cli)
    settings.write_text(json.dumps({"interval_s": 5}))
    resumed = cli.json("card", "inspect", "tc_2")
    assert (resumed["status"], resumed["interval_s"]) == ("watching", 1800)
    # New watches take the setting in force.
    assert cli.json("card", "stop", "tc_2")["status"] == "stopped"
    assert cli.json("card", "start", "r.py")["status"] == "watching"
    assert cli.json("card", "inspect", "tc_3")["interval_s"] == 5
    # The manual the agent reads says the same, in the setting's own section.
    manual = cli.run("card", "manual").stdout
    section = manual.split("### interval-s", 1)[1].split("###", 1)[0]
    assert "new and resumed watches" not in section
    assert "keeps the cadence it started with" in " ".join(section.split())


def test_a_corrupt_descriptor_found_by_a_new_host_leaves_the_card_inactive(
    workdir: Path, cli: CliHost
) -> None:
    write_renderer(workdir, "r.py", STATIC_RENDERER)
    folder = workdir / "taskcard"
    folder.mkdir()
    (folder / "watch.json").write_text("{ this is not json")
    (folder / "status").write_bytes(b"active")
    cli.start_host()  # and it finds the descriptor
    assert not (folder / "watch.json").exists()
    assert (folder / "status").read_bytes() == b"inactive"


def test_a_resumed_watch_whose_body_cannot_be_written_is_an_error_not_a_dead_host(
    workdir: Path, cli: CliHost
) -> None:
    write_renderer(workdir, "r.py", STATIC_RENDERER)
    assert cli.json("card", "start", "r.py", "--interval-s", "3600")["status"] == "watching"
    cli.shutdown()
    body = workdir / "taskcard" / "taskcard.md"
    body.unlink()
    body.mkdir()  # planted between two hosts: the resume render cannot be published
    inspected = cli.run("card", "inspect", "tc_1", "--json")
    assert inspected.returncode == 0, inspected.stderr
    result = json.loads(inspected.stdout)
    assert result["status"] == "error"
    assert result["error"]["code"] == "write_failed"
    assert "taskcard/taskcard.md (Is a directory)" in result["error"]["message"]
    body.rmdir()
    retried = cli.json("card", "retry", "tc_1")
    assert (retried["status"], retried["status_value"]) == ("watching", "active")
    assert body.read_text() == "# Work\nsteady body\n"


def test_a_stale_descriptor_beside_a_status_folder_still_lets_remove_answer(
    workdir: Path, cli: CliHost
) -> None:
    folder = workdir / "taskcard"
    folder.mkdir()
    (folder / "watch.json").write_text("{ this is not json")
    (folder / "status").mkdir()
    removed = cli.run("card", "remove", "--json")
    assert removed.returncode == 1, removed.stderr  # refused, not "no host reachable" (4)
    result = json.loads(removed.stdout)
    assert result["status"] == "remove_failed"
    assert "taskcard/status (Is a directory)" in result["message"]
    assert not (folder / "watch.json").exists()


def test_remove_that_cannot_write_the_status_says_so_not_that_the_updater_hung(
    workdir: Path, cli: CliHost
) -> None:
    write_renderer(workdir, "r.py", STATIC_RENDERER)
    assert cli.json("card", "start", "r.py", "--interval-s", "3600")["status"] == "watching"
    status = workdir / "taskcard" / "status"
    status.unlink()
    status.mkdir()
    removed = cli.json("card", "remove")
    assert (removed["status"], removed["body_removed"]) == ("remove_failed", False)
    assert "taskcard/status (Is a directory)" in removed["message"]
    assert "quiesce" not in removed["message"]
    assert (workdir / "taskcard" / "taskcard.md").exists()
    stopped = cli.json("card", "stop", "tc_1")
    assert (stopped["status"], stopped["code"]) == ("stop_failed", "write_failed")
    status.rmdir()
    removed = cli.json("card", "remove")
    assert (removed["status"], removed["body_removed"]) == ("removed", True)
    assert status.read_bytes() == b"inactive"


def test_a_start_that_cannot_write_its_descriptor_leaves_no_active_card(
    workdir: Path, cli: CliHost
) -> None:
    write_renderer(workdir, "r.py", STATIC_RENDERER)
    (workdir / "taskcard" / "watch.json").mkdir(parents=True)
    started = cli.json("card", "start", "r.py")
    assert (started["status"], started["code"]) == ("failed", "write_failed")
    assert "taskcard/watch.json (Is a directory)" in started["message"]
    # Body and `active` were written before the descriptor failed; no watch refreshes them.
    assert (workdir / "taskcard" / "status").read_bytes() == b"inactive"
    (workdir / "taskcard" / "watch.json").rmdir()
    (workdir / ".taskcard-host" / "watch-seq").unlink()
    (workdir / ".taskcard-host" / "watch-seq").mkdir()
    refused = cli.json("card", "start", "r.py")
    assert "cannot write .taskcard-host/watch-seq (Is a directory)" in refused["message"]


def test_the_lead_entry_point_registers_every_subcommand() -> None:
    code = (
        "import argparse\n"
        "from taskcard.producers.task_card.cli import register\n"
        "p = argparse.ArgumentParser(); s = p.add_subparsers(dest='c'); register(s)\n"
        "print(sorted(s.choices))\n"
        "a = p.parse_args(['card', 'start', 'r.py', '--interval-s', '2'])\n"
        "print(a.handler.__name__, a.card_action, a.interval_s)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.splitlines() == ["['card', 'host', 'mcp', 'tool']", "run_card start 2.0"]


def test_a_printed_body_of_exactly_max_body_chars_is_accepted_one_more_is_refused(
    workdir: Path, cli: CliHost
) -> None:
    """`print` ends the card with a newline; the limit counts the card, not that terminator."""
    (workdir / "taskcard").mkdir()
    (workdir / "taskcard" / "taskcard.json").write_text('{"max_body_chars": 100}')
    write_renderer(workdir, "over.py", "print('x' * 101)\n")
    refused = cli.run("card", "start", "over.py", "--json")
    assert refused.returncode == 1
    assert json.loads(refused.stdout)["code"] == "body_too_large"
    assert "101 characters" in json.loads(refused.stdout)["message"]
    write_renderer(workdir, "exact.py", "print('é' * 100)\n")
    started = cli.json("card", "start", "exact.py")
    assert started["status"] == "watching", started
    assert (workdir / "taskcard" / "taskcard.md").read_text() == "é" * 100 + "\n"
    inspected = cli.json("card", "inspect", started["watch_id"])
    assert (inspected["status"], inspected["last_body"]) == ("watching", "é" * 100 + "\n")
    cli.json("card", "remove")


def test_a_workdir_given_with_an_unexpanded_tilde_is_the_home_folder(
    workdir: Path, cli: CliHost
) -> None:
    """MCP clients pass arguments verbatim, so `~/agent` reaches us unexpanded."""
    write_renderer(workdir, "r.py", STATIC_RENDERER)
    env = {**os.environ, "HOME": str(workdir.parent)}

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "taskcard.bridge.cli", *args]
        command += ["--workdir", f"~/{workdir.name}", "--runtime-dir", str(cli.runtime_dir)]
        return subprocess.run(
            command, capture_output=True, text=True, timeout=120, check=False, env=env
        )

    started = run("card", "start", "r.py", "--json")
    assert started.returncode == 0, started.stderr
    assert json.loads(started.stdout)["status_path"] == str(workdir / "taskcard" / "status")
    assert (workdir / "taskcard" / "status").read_bytes() == b"active"
    settings = json.loads(run("card", "settings", "--json").stdout)
    assert settings["settings_path"] == str(workdir / "taskcard" / "taskcard.json")
    assert run("card", "remove").returncode == 0
    assert (workdir / "taskcard" / "status").read_bytes() == b"inactive"


def test_an_empty_workdir_is_refused_naming_the_option(cli: CliHost) -> None:
    for args in (("card", "settings"), ("card", "remove"), ("tool", "{}"), ("host",), ("mcp",)):
        command = [sys.executable, "-m", "taskcard.bridge.cli", *args, "--workdir", ""]
        done = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
        assert done.returncode == 2, (args, done.stderr)
        assert "--workdir" in done.stderr and "Traceback" not in done.stderr


def test_a_caller_with_another_runtime_dir_starts_no_second_host(
    workdir: Path, cli: CliHost, other_runtime_dir: Path
) -> None:
    """Two environments (say, with and without XDG_RUNTIME_DIR) must not run the watch twice."""
    write_renderer(workdir, "r.py", COUNTER_RENDERER)
    assert cli.json("card", "start", "r.py", "--interval-s", "3600")["status"] == "watching"
    other = other_runtime_dir
    command = [sys.executable, "-m", "taskcard.bridge.cli", "card", "inspect", "tc_1"]
    command += ["--workdir", str(workdir), "--runtime-dir", str(other)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=180, check=False)
    assert done.returncode == 3, done.stderr
    assert f"runtime dir {cli.runtime_dir}" in done.stderr
    assert f"pid {cli.host_pid()}" in done.stderr
    # No second host resumed the watch: one render at start, none since.
    assert (workdir / "count.txt").read_text() == "1"
    assert cli.json("card", "inspect", "tc_1")["refreshes_used"] == 0
    cli.json("card", "remove")


def test_host_durations_out_of_range_are_usage_errors_naming_the_option(cli: CliHost) -> None:
    for option, value in (
        ("--idle-grace-s", "nan"),
        ("--idle-grace-s", "-1"),
        ("--idle-grace-s", "inf"),
        ("--idle-grace-s", "1e300"),
        ("--ledger-check-s", "0"),
        ("--ledger-check-s", "x"),
    ):
        done = cli.run("host", f"{option}={value}", timeout_s=60)
        assert done.returncode == 2, (option, value, done.stderr)
        assert option in done.stderr and "seconds" in done.stderr
        assert cli.host_pid() is None  # nothing was started


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("--interval-s", "nan"),
        ("--interval-s", "inf"),
        ("--interval-s", "1e400"),
        ("--timeout-s", "-inf"),
        ("--timeout-s", "NaN"),
    ],
)
def test_card_start_numbers_that_are_not_finite_are_usage_errors_naming_the_option(
    workdir: Path, cli: CliHost, option: str, value: str
) -> None:
    """`nan` or `1e400` given to `card start` is a usage error like any bad option: one line on
    stderr naming the option and the value as typed. It used to reach the envelope check and
    come back on stdout as `envelope: input.interval_s: inf is not a finite number` (for
    `1e400`, a value nobody typed), naming a field the command line does not have."""
    write_renderer(workdir, "r.py", STATIC_RENDERER)
    for extra in ((), ("--json",)):
        done = cli.run("card", "start", "r.py", f"{option}={value}", *extra, timeout_s=60)
        assert done.returncode == 2, (done.stdout, done.stderr)
        assert done.stdout == "", done.stdout
        assert done.stderr.count("\n") == 1, done.stderr
        assert f"argument {option}: {value!r}" in done.stderr, done.stderr
        assert "finite" in done.stderr and "--help" in done.stderr, done.stderr
        assert "input." not in done.stderr and "Traceback" not in done.stderr
    assert cli.host_pid() is None  # nothing was started
    assert not (workdir / "taskcard").exists()


@pytest.mark.parametrize("how", ["env", "option"])
def test_a_relative_runtime_dir_is_the_callers_folder(
    workdir: Path, runtime_dir: Path, how: str
) -> None:
    """`TASKCARD_RUNTIME_DIR=rt taskcard card start ...` waited 60 s and exited 4: the
    detached host runs from `/`, so it made its socket in `/rt` while the caller waited in
    `./rt`."""
    write_renderer(workdir, "r.py", STATIC_RENDERER)
    command = [sys.executable, "-m", "taskcard.bridge.cli", "card", "start", "r.py"]
    command += ["--workdir", str(workdir)]
    env = {k: v for k, v in os.environ.items() if k != "TASKCARD_RUNTIME_DIR"}
    if how == "env":
        env["TASKCARD_RUNTIME_DIR"] = "rt"
    else:
        command += ["--runtime-dir", "rt"]
    host = CliHost(workdir, runtime_dir / "rt")
    try:
        done = subprocess.run(
            command, cwd=runtime_dir, env=env, capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0, done.stderr
        assert host.paths.socket.exists()
        assert host.json("card", "inspect", "tc_1")["status"] == "watching"
    finally:
        host.shutdown()


def test_the_human_output_says_why_a_render_failed(workdir: Path, cli: CliHost) -> None:
    write_renderer(workdir, "r.py", 'import json\nprint(json.loads("{"))\n')
    started = cli.run("card", "start", "r.py")
    assert started.returncode == 1
    assert "renderer stderr, last line: json.decoder.JSONDecodeError: " in started.stdout
    write_renderer(workdir, "r.py", FLAG_RENDERER)
    assert cli.json("card", "start", "r.py", "--interval-s", "3600")["status"] == "watching"
    (workdir / "fail.flag").touch()
    retried = cli.run("card", "retry", "tc_2")
    assert "this render: renderer_nonzero_exit: the renderer exited with code 3" in retried.stdout
    inspected = cli.run("card", "inspect", "tc_2")
    assert "renderer stderr, last line: boom" in inspected.stdout


def test_the_human_output_names_what_taskcard_json_got_wrong(workdir: Path, cli: CliHost) -> None:
    """`card settings` and `card start` without --json showed the rows with their defaults
    and nothing else: an owner who misspelt a key or wrote a value out of range read it as
    if the document held nothing, while the JSON result named both."""
    write_renderer(workdir, "r.py", STATIC_RENDERER)
    (workdir / "taskcard").mkdir()
    (workdir / "taskcard" / "taskcard.json").write_text('{"intervl_s": 2, "max_refreshes": 0}')
    wrong = (
        'settings problem: taskcard.json "intervl_s" is not read; the key is interval_s',
        "settings problem: taskcard.json max_refreshes: 0 is not allowed; use an integer from 1",
    )
    shown = cli.run("card", "settings")
    assert shown.returncode == 0
    assert all(line in shown.stdout for line in wrong), shown.stdout
    started = cli.run("card", "start", "r.py", "--interval-s", "3600")
    assert started.returncode == 0
    assert all(line in started.stdout for line in wrong), started.stdout


def test_a_file_where_the_card_folder_belongs_is_named_with_the_fix(
    workdir: Path, cli: CliHost
) -> None:
    """`settings` and `start` said "fix or delete taskcard/taskcard.json", a file that cannot
    exist while `taskcard` is a file, and not what was in the way."""
    write_renderer(workdir, "r.py", STATIC_RENDERER)
    (workdir / "taskcard").write_text("notes")
    for args in (("card", "settings"), ("card", "start", "r.py")):
        answer = cli.json(*args)
        assert answer["status"] == "failed", answer
        assert "taskcard is a file, not a folder" in answer["message"], answer
        assert "move the file taskcard out of the way" in answer["message"], answer
        assert "delete taskcard/taskcard.json" not in answer["message"], answer
    assert (workdir / "taskcard").read_text() == "notes"


def test_the_human_output_keeps_a_workdir_name_with_controls_on_one_line(
    tmp_path: Path, runtime_dir: Path
) -> None:
    """A refusal naming the workdir printed its name raw: a line break in it split the
    message, an escape in it acted on the terminal."""
    workdir = tmp_path / "agent\nline \x1b[2J"
    workdir.mkdir()
    cli = CliHost(workdir, runtime_dir)
    refused = cli.run("card", "start", "/etc/passwd")
    cli.shutdown()
    assert refused.returncode == 2  # a usage error, as a --workdir naming no folder is
    assert refused.stdout.count("\n") == 2, refused.stdout
    assert "resolves outside the workdir" in refused.stdout and "\x1b" not in refused.stdout


def test_a_host_killed_during_a_call_is_named_as_gone_and_the_next_call_resumes(
    workdir: Path, cli: CliHost
) -> None:
    write_renderer(
        workdir,
        "r.py",
        "import time\nfrom pathlib import Path\n"
        "if Path('slow.flag').exists():\n"
        "    Path('running.flag').touch()\n"
        "    time.sleep(60)\n"
        "print('# Work\\nsteady')\n",
    )
    assert cli.json("card", "start", "r.py", "--interval-s", "3600")["status"] == "watching"
    (workdir / "slow.flag").touch()
    with ThreadPoolExecutor(1) as pool:
        retry = pool.submit(cli.run, "card", "retry", "tc_1")
        wait_for(lambda: (workdir / "running.flag").exists())
        kill_host(cli)
        done = retry.result()
    assert done.returncode == 4
    assert "the task card host ended before it answered" in done.stderr
    assert "malformed" not in done.stderr
    (workdir / "slow.flag").unlink()
    assert cli.json("card", "inspect", "tc_1")["status"] == "watching"


@pytest.mark.parametrize(
    ("envelope", "field"),
    [
        (b'{"action": "settings", "input": {}, "reasoning": "caf\xe9"}', "reasoning"),
        (b'{"action": "start", "input": {"renderer_path": "r\xe9.py"}, "reasoning": "r"}',
         "input.renderer_path"),
        (b'{"action": "start", "input": {"r\xe9": "r.py"}, "reasoning": "r"}', "input.r\ufffd"),
    ],
)  # fmt: skip
def test_bytes_that_are_not_utf8_are_refused_naming_the_field(
    cli: CliHost, envelope: bytes, field: str
) -> None:
    """A Latin-1 `é` in the reasoning was refused as "not valid UTF-8 (byte offset 50)",
    leaving the caller to count bytes; the MCP server named the field, and so does `tool`,
    from stdin and from its argument alike."""
    said = f"envelope: {field}: not valid UTF-8 (bytes of another encoding?); send UTF-8 text"
    for args, stdin in ((("tool",), envelope), (("tool", os.fsdecode(envelope)), b"")):
        done = subprocess.run(
            cli.command(*args), input=stdin, capture_output=True, timeout=120, check=False
        )
        assert done.returncode == 2, done.stderr
        assert json.loads(done.stdout)["message"] == said
    # Bytes that are not UTF-8 in text that is no JSON either: still named by their offset.
    done = subprocess.run(
        cli.command("tool"), input=b'{"reasoning": "\xff', capture_output=True, timeout=120
    )
    assert "not valid UTF-8 (byte offset 15)" in json.loads(done.stdout)["message"]


@pytest.mark.parametrize(
    ("content", "said"),
    [
        (
            b'{"interval_s": 2,\n "timeout_s": 3,}',
            (
                "is not valid JSON: expecting property name enclosed in double quotes at line 2,"
                " column 17"
            ),
        ),
        (
            b'{"interval_s": 2} {"timeout_s": 3}',
            "is not valid JSON: extra data at line 1, column 19",
        ),
        (b"", "is empty"),
        (b'{"note": "caf\xe9"}', "is not UTF-8 (byte 14, counting from 1); save it as UTF-8"),
        (b"[1, 2]", "is not a JSON object (the top level is an array)"),
    ],
    ids=["trailing-comma", "two-objects", "empty", "latin-1", "array"],
)
def test_a_broken_taskcard_json_is_named_where_it_breaks(
    workdir: Path, cli: CliHost, content: bytes, said: str
) -> None:
    """The owner edits the document by hand; "is not valid JSON" alone sent them looking
    through the whole file for one stray comma, and said the same of an empty file or one
    saved in Latin-1. `settings` and `start` now name the place or the kind of fault."""
    write_renderer(workdir, "r.py", STATIC_RENDERER)
    (workdir / "taskcard").mkdir()
    (workdir / "taskcard" / "taskcard.json").write_bytes(content)
    shown = cli.run("card", "settings")
    assert shown.returncode == 1
    assert f"taskcard/taskcard.json {said}" in shown.stdout, shown.stdout
    started = cli.run("card", "start", "r.py")
    assert started.returncode == 1
    assert f"taskcard/taskcard.json {said}" in started.stdout, started.stdout
    assert not (workdir / "taskcard" / "status").exists()


@pytest.mark.parametrize(
    ("replace", "why"),
    [
        ("link-out", "resolves outside the workdir"),
        ("folder", "is not a regular file"),
        ("deleted", "does not exist"),
    ],
)
def test_a_watch_not_resumed_says_what_became_of_its_renderer(
    workdir: Path, tmp_path: Path, cli: CliHost, replace: str, why: str
) -> None:
    """A host killed, then its watch's renderer made unusable before the next host: the
    watch is dropped and the card left inactive. `inspect` said the renderer "is gone" even
    when it was a link out of the workdir to a file that still existed, or a folder."""
    write_renderer(workdir, "r.py", STATIC_RENDERER)
    assert cli.json("card", "start", "r.py", "--interval-s", "3600")["status"] == "watching"
    kill_host(cli)
    renderer = workdir / "r.py"
    renderer.unlink()
    if replace == "link-out":
        outside = tmp_path / "elsewhere.py"
        outside.write_text(STATIC_RENDERER)
        renderer.symlink_to(outside)
    elif replace == "folder":
        renderer.mkdir()
    inspected = cli.json("card", "inspect", "tc_1")
    assert inspected["status"] == "failed"
    assert inspected["message"].startswith(
        f"watch_id: tc_1 was not resumed when this host started: its renderer 'r.py' {why},"
        " so its card was left inactive"
    ), inspected["message"]
    assert (workdir / "taskcard" / "status").read_bytes() == b"inactive"
