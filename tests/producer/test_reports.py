"""Reports and lineage through the CLI, Python and the real MCP client."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from taskcard.producers.reports import LineageError, ReportError, Reports, read_lineage, spawn
from taskcard.producers.reports.store import COUNTER_FILE

from ..conftest import mcp_session
from ..inbox.conftest import acks, names, queue
from .conftest import CliHost, wait_for

TASKCARD = str(Path(sys.executable).parent / "taskcard")


def taskcard(*args: str, stdin: bytes = b"") -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [TASKCARD, *args], input=stdin, capture_output=True, timeout=120, check=False
    )


def next_report(workdir: Path, *after: str) -> dict[str, Any] | None:
    done = taskcard("reports", "--workdir", str(workdir), *after)
    assert done.returncode == 0, done.stderr
    for said in done.stderr.decode().splitlines():  # only the broken lines read past
        assert said.startswith("taskcard reports: reports/reports.jsonl line "), said
        assert "; skipped (write one JSON object per line" in said, said
    report: dict[str, Any] | None = json.loads(done.stdout)["report"]
    return report


def test_twenty_concurrent_report_processes_get_unique_gapless_seqs(workdir: Path) -> None:
    processes = [
        subprocess.Popen(
            [TASKCARD, "report", "--workdir", str(workdir), "--ok", "--summary", f"round {n}"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for n in range(20)
    ]
    seqs = []
    for process in processes:
        out, err = process.communicate(timeout=120)
        assert (process.returncode, err) == (0, b"")
        seqs.append(json.loads(out)["seq"])
    assert sorted(seqs) == list(range(1, 21))
    lines = (workdir / "reports" / "reports.jsonl").read_text().splitlines()
    assert [json.loads(line)["seq"] for line in lines] == list(range(1, 21))


def test_reading_with_the_last_seq_walks_every_round_once(workdir: Path) -> None:
    assert next_report(workdir) is None
    taskcard("report", "--workdir", str(workdir), "--failed", "--role", "implementer")
    taskcard(
        "report", "--workdir", str(workdir), "--ok", "--verdict", "rejected", "--role", "reviewer"
    )
    taskcard(
        "report", "--workdir", str(workdir), "--ok", "--verdict", "approved", "--role", "reviewer"
    )
    walked = []
    last = 0
    while (report := next_report(workdir, "--after", str(last))) is not None:
        walked.append((report["seq"], report["ok"], report["verdict"], report["role"]))
        last = report["seq"]
    assert walked == [
        (1, False, None, "implementer"),
        (2, True, "rejected", "reviewer"),
        (3, True, "approved", "reviewer"),
    ]
    latest = next_report(workdir)
    assert latest is not None and latest["seq"] == 3 and latest["channel"] == "cli"


def test_a_seq_is_never_reused_after_the_file_or_the_counter_is_lost(workdir: Path) -> None:
    reports = Reports(workdir)
    assert [reports.add(ok=True)["seq"] for _ in range(3)] == [1, 2, 3]
    (workdir / "reports" / "reports.jsonl").write_bytes(b"")  # truncated
    assert reports.add(ok=True)["seq"] == 4
    (workdir / "reports" / ".seq").unlink()
    assert reports.add(ok=True)["seq"] == 5
    with (workdir / "reports" / "reports.jsonl").open("ab") as handle:
        handle.write(b"{broken line\n")
    record = reports.add(ok=False, summary="after garbage")
    assert (record["seq"], record["channel"]) == (6, "python")
    following = reports.after(5)
    assert following is not None and following["summary"] == "after garbage"


def test_the_channel_is_stamped_never_taken_from_the_caller(workdir: Path) -> None:
    with pytest.raises(ReportError, match=r"^channel: stamped"):
        Reports(workdir).add(ok=True, channel="cli")
    with pytest.raises(ReportError, match=r"^verdict"):
        Reports(workdir).add(ok=True, verdict="approve")


def test_a_payload_goes_to_a_side_file_and_is_bounded(workdir: Path, tmp_path: Path) -> None:
    done = taskcard("report", "--workdir", str(workdir), "--ok", "--payload", "-", stdin=b"diff")
    assert done.returncode == 0
    assert json.loads(done.stdout)["payload_file"] == "payloads/1.txt"
    assert (workdir / "reports" / "payloads" / "1.txt").read_text() == "diff"
    report = next_report(workdir)
    assert report is not None and report["payload"] == "diff"
    big = tmp_path / "big.txt"
    big.write_bytes(b"x" * (64 * 1024 + 1))
    refused = taskcard("report", "--workdir", str(workdir), "--ok", "--payload", str(big))
    assert refused.returncode == 2
    assert refused.stderr.startswith(b"taskcard report: --payload: over 65536 bytes")
    assert refused.stderr.count(b"\n") == 1
    # Text in another encoding (Latin-1 here) was refused without the way out.
    latin = tmp_path / "notes.txt"
    latin.write_bytes("café au lait".encode("latin-1"))
    refused = taskcard("report", "--workdir", str(workdir), "--ok", "--payload", str(latin))
    assert refused.returncode == 2 and refused.stderr.count(b"\n") == 1
    assert refused.stderr.startswith(b"taskcard report: --payload: not UTF-8 text (byte 3 is 0xe9)")
    assert b"convert it to UTF-8" in refused.stderr


@pytest.mark.parametrize(
    ("args", "field"),
    [
        (["--ok", "--role", "a\nb"], b"--role:"),
        (["--ok", "--summary", " "], b"--summary:"),
        # Zero-width space, word joiner, byte-order mark, Hangul filler: nothing shows.
        (["--ok", "--summary", "\u200b\u2060\ufeff\u3164"], b"--summary:"),
        (["--ok", "--summary", "\u0301\u0301 \u202e"], b"--summary:"),
        (["--ok", "--verdict", "maybe"], b"--verdict"),
        ([], b"--ok"),
    ],
)
def test_bad_report_input_exits_2_naming_the_field(
    workdir: Path, args: list[str], field: bytes
) -> None:
    done = taskcard("report", "--workdir", str(workdir), *args)
    assert done.returncode == 2
    assert field in done.stderr
    assert not (workdir / "reports" / "reports.jsonl").exists()


def test_spawn_records_lineage_with_depth_and_refuses_past_the_cap(tmp_path: Path) -> None:
    dirs = [tmp_path / f"a{n}" for n in range(5)]
    for path in dirs:
        path.mkdir()
    done = taskcard(
        "spawn", "--workdir", str(dirs[1]), "--parent", "a0", "--reason", "split the tests",
        "--provider", "claude-code", "--parent-workdir", str(dirs[0]),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    record = read_lineage(dirs[1])
    assert record is not None
    assert {k: record[k] for k in ("parent", "reason", "provider", "depth")} == {
        "parent": "a0",
        "reason": "split the tests",
        "provider": "claude-code",
        "depth": 1,
    }
    spawn(dirs[2], parent="a1", reason="r", parent_workdir=dirs[1])
    spawn(dirs[3], parent="a2", reason="r", parent_workdir=dirs[2])
    assert read_lineage(dirs[3]) is not None and read_lineage(dirs[3])["depth"] == 3  # type: ignore[index]
    refused = taskcard(
        "spawn", "--workdir", str(dirs[4]), "--parent", "a3", "--reason", "deeper",
        "--parent-workdir", str(dirs[3]),
    )  # fmt: skip
    assert refused.returncode == 2
    assert b"depth 4, over the cap of 3" in refused.stderr
    assert not (dirs[4] / "lineage.json").exists()
    blank = taskcard("spawn", "--workdir", str(dirs[4]), "--parent", "a3", "--reason", "  ")
    assert (blank.returncode, blank.stderr.split(b":")[1].strip()) == (2, b"--reason")
    unseen = taskcard("spawn", "--workdir", str(dirs[4]), "--parent", "a3", "--reason", "\u200b")
    assert (unseen.returncode, unseen.stderr.split(b":")[1].strip()) == (2, b"--reason")
    assert b"invisible characters" in unseen.stderr and not (dirs[4] / "lineage.json").exists()

    # `_a3` has only allowed characters; the message said so little that it looked valid.
    odd = taskcard("spawn", "--workdir", str(dirs[4]), "--parent", "_a3", "--reason", "r")
    assert odd.returncode == 2 and b"starting with a letter or digit" in odd.stderr
    (dirs[3] / "lineage.json").write_text('{"depth": "zero"}')
    with pytest.raises(LineageError, match="fix or remove it"):
        spawn(dirs[4], parent="a3", reason="r", parent_workdir=dirs[3])


async def test_report_spawn_and_inbox_through_the_real_mcp_client(
    workdir: Path, cli: CliHost
) -> None:
    queue(workdir, "m1", "please report when the suite is green")
    (workdir / "child").mkdir()
    async with mcp_session(workdir, cli.runtime_dir, (TASKCARD,)) as session:

        async def call(name: str, arguments: dict[str, Any]) -> tuple[dict[str, Any], bool]:
            result = await session.call_tool(name, arguments)
            assert isinstance(result.structured_content, dict)
            return result.structured_content, result.is_error

        inbox, failed = await call("inbox", {})
        assert (failed, [m["id"] for m in inbox["messages"]]) == (False, ["m1"])
        assert "> please report when the suite is green" in inbox["messages"][0]["framed"]
        # acknowledged once the client read the answer, which the server learns just after
        wait_for(lambda: [a["via"] for a in acks(workdir)] == ["mcp"])
        assert names(workdir, "taken") == ["m1.json"]
        again, _ = await call("inbox", {})
        assert (again["messages"], again["more_queued"]) == ([], False)

        report, failed = await call(
            "report", {"ok": True, "role": "implementer", "summary": "suite green"}
        )
        assert (failed, report["seq"], report["channel"]) == (False, 1, "mcp")
        forged, failed = await call("report", {"ok": True, "channel": "cli"})
        assert failed and forged["message"].startswith("channel:")

        child, failed = await call("spawn", {"child_workdir": "child", "reason": "run lint"})
        assert (failed, child["parent"], child["depth"]) == (False, workdir.name, 1)
        none, failed = await call("spawn", {"child_workdir": "child", "reason": ""})
        assert failed and none["message"].startswith("reason:")
    latest = next_report(workdir)
    assert latest is not None and latest["summary"] == "suite green"


@pytest.mark.parametrize(
    ("args", "field"),
    [
        ([b"--summary", b"suite \xff green"], b"--summary:"),
        ([b"--role", b"review\xffer"], b"--role:"),
    ],
)
def test_undecodable_command_line_text_exits_2_naming_the_field(
    workdir: Path, args: list[bytes], field: bytes
) -> None:
    """Bytes that are not UTF-8 in an argument are bad input, never a traceback."""
    done = subprocess.run(
        [TASKCARD.encode(), b"report", b"--workdir", bytes(workdir), b"--ok", *args],
        capture_output=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith(b"taskcard report: " + field), done.stderr
    assert b"Traceback" not in done.stderr
    assert not (workdir / "reports" / "reports.jsonl").exists()
    assert next_report(workdir) is None
    with pytest.raises(ReportError, match=r"^summary"):
        Reports(workdir).add(ok=True, summary="a\udcffb")
    # The payload too: it used to be stored with the bytes silently turned into "?".
    with pytest.raises(ReportError, match=r"^payload: holds bytes that are not UTF-8"):
        Reports(workdir).add(ok=True, payload="a\udcffb")
    assert next_report(workdir) is None


async def test_the_spawn_tool_says_when_the_folder_name_is_no_parent_id(
    tmp_path: Path, runtime_dir: Path
) -> None:
    """The default parent is the folder's name; one that is no agent id is named as such."""
    workdir = tmp_path / "my agent"
    (workdir / "child").mkdir(parents=True)
    async with mcp_session(workdir, runtime_dir, (TASKCARD,)) as session:
        result = await session.call_tool("spawn", {"child_workdir": "child", "reason": "lint"})
        assert result.is_error and isinstance(result.structured_content, dict)
        message = result.structured_content["message"]
        assert message.startswith("parent: defaults to this workdir's folder name")
        assert "'my agent'" in message and "pass parent" in message
        named = await session.call_tool(
            "spawn", {"child_workdir": "child", "reason": "lint", "parent": "planner"}
        )
        assert not named.is_error
    assert json.loads((workdir / "child" / "lineage.json").read_text())["parent"] == "planner"


def test_spawn_with_an_undecodable_reason_exits_2_naming_it(tmp_path: Path) -> None:
    child = tmp_path / "child"
    child.mkdir()
    reason = [b"--reason", b"split \xff the matrix"]
    done = subprocess.run(
        [TASKCARD.encode(), b"spawn", b"--workdir", bytes(child), b"--parent", b"p", *reason],
        capture_output=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith(b"taskcard spawn: --reason: holds bytes that are not UTF-8")
    assert not (child / "lineage.json").exists()


def test_a_child_folder_not_created_yet_is_refused_saying_what_to_create(tmp_path: Path) -> None:
    """The line said "create the child's first", a word short of telling what to create."""
    done = taskcard(
        "spawn", "--workdir", str(tmp_path / "later"), "--parent", "p", "--reason", "split"
    )
    assert done.returncode == 2, done.stderr
    [line] = done.stderr.decode().splitlines()
    assert line.startswith("taskcard spawn: --workdir: "), line
    assert line.endswith("is not a directory; create the child's working directory first"), line
    assert not (tmp_path / "later").exists()


async def refused_over_mcp(workdir: Path, cli: CliHost) -> str:
    """The message of the MCP `report` tool's refusal of a report in `workdir`."""
    async with mcp_session(workdir, cli.runtime_dir, (TASKCARD,)) as session:
        result = await session.call_tool("report", {"ok": True, "summary": "suite green"})
        content = result.structured_content
        assert isinstance(content, dict) and content["status"] == "failed"
        return str(content["message"])


def test_a_reports_file_linked_out_of_the_workdir_is_named(workdir: Path, tmp_path: Path) -> None:
    """A symlink at `reports/reports.jsonl` leading out of the workdir was refused naming
    `reports/`, the folder, which is a real folder inside it: the file is named."""
    (tmp_path / "elsewhere.jsonl").write_text('{"seq": 1, "at": "2026-01-01T00:00:00Z"}\n')
    (workdir / "reports").mkdir()
    (workdir / "reports" / "reports.jsonl").symlink_to(tmp_path / "elsewhere.jsonl")
    for args in (["report", "--ok"], ["reports"]):
        done = taskcard(args[0], "--workdir", str(workdir), *args[1:])
        assert (done.returncode, done.stdout) == (2, b""), done.stderr
        assert done.stderr.startswith(
            f"taskcard {args[0]}: reports/reports.jsonl: leads out of the workdir (a symlink);"
            " nothing outside it is read or written, so replace the link with a regular file"
            " inside the workdir".encode()
        ), done.stderr
    assert (tmp_path / "elsewhere.jsonl").read_text().count("\n") == 1  # nothing written there


async def test_a_named_pipe_for_the_reports_file_is_refused_never_waited_on(
    workdir: Path, cli: CliHost
) -> None:
    """A fifo at `reports/reports.jsonl` used to hold `report`, `reports` and the MCP tool
    forever (a blocking open); each now answers at once naming the file. A fifo in place of
    the counter only loses the counter, which the file's tail stands in for."""
    (workdir / "reports").mkdir()
    os.mkfifo(workdir / "reports" / "reports.jsonl")
    for args in (["report", "--ok"], ["reports"], ["reports", "--after", "0"]):
        done = taskcard(args[0], "--workdir", str(workdir), *args[1:])
        assert done.returncode == 2, done.stderr
        assert done.stderr.startswith(
            f"taskcard {args[0]}: reports/reports.jsonl: a named pipe, not a regular file".encode()
        ), done.stderr
    refused = await refused_over_mcp(workdir, cli)
    assert refused.startswith("reports/reports.jsonl: a named pipe"), refused
    (workdir / "reports" / "reports.jsonl").unlink()
    os.mkfifo(workdir / "reports" / ".seq")
    done = taskcard("report", "--workdir", str(workdir), "--failed", "--summary", "red")
    assert (done.returncode, json.loads(done.stdout)["seq"]) == (0, 1), done.stderr
    latest = next_report(workdir)
    assert latest is not None and latest["summary"] == "red"


def test_the_latest_report_is_found_behind_a_long_run_of_other_lines(workdir: Path) -> None:
    """`taskcard reports` read only the file's last 256 KiB for the latest report and answered
    `null` when other lines filled them; it now walks the file when the tail holds none."""
    for summary in ("first", "second"):
        assert (
            taskcard("report", "--workdir", str(workdir), "--ok", "--summary", summary).returncode
            == 0
        )
    with (workdir / "reports" / "reports.jsonl").open("ab") as handle:
        handle.write(b"x" * (300 * 1024) + b"\n" + b'{"note": "not a report"}\n')
    latest = next_report(workdir)
    assert latest is not None and (latest["seq"], latest["summary"]) == (2, "second")
    after = next_report(workdir, "--after", "1")
    assert after is not None and after["summary"] == "second"
    assert next_report(workdir, "--after", "2") is None
    # The counter lost as well: the next report still follows the last one, not #1 (which
    # the service, having seen #2, would never announce).
    (workdir / "reports" / COUNTER_FILE).unlink()
    done = taskcard("report", "--workdir", str(workdir), "--ok", "--summary", "third")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["seq"] == 3


def test_a_lone_surrogate_escape_in_a_report_line_is_printed_not_a_traceback(
    workdir: Path,
) -> None:
    """`"\\ud800"` in a hand-written line is valid JSON; `taskcard reports` used to die
    printing it (UnicodeEncodeError). It is read as U+FFFD."""
    (workdir / "reports").mkdir()
    line = b'{"seq":1,"at":"2026-01-01T00:00:00Z","ok":true,"summary":"a \\ud800 b"}\n'
    (workdir / "reports" / "reports.jsonl").write_bytes(line)
    for after in ((), ("--after", "0")):
        latest = next_report(workdir, *after)
        assert latest is not None and latest["summary"] == "a \ufffd b"


def test_report_output_cannot_steer_the_terminal_printing_it(workdir: Path) -> None:
    """The JSON of `report` / `reports` quoted a summary's bidi override and C1 controls raw:
    a terminal showed the rest of the line reversed, or read 0x9b as an escape sequence."""
    summary = "done \u202e(ok: false) \x9b2J \u2066x\u2069 \u2028 next \x7f"
    done = taskcard("report", "--workdir", str(workdir), "--ok", "--summary", summary)
    assert done.returncode == 0, done.stderr
    read = taskcard("reports", "--workdir", str(workdir))
    for out in (done.stdout.decode(), read.stdout.decode()):
        assert not set(out) & set("\u202e\x9b\u2066\u2069\u2028\x7f"), repr(out)
        assert "\\u202e" in out and "\\u009b" in out
    assert json.loads(read.stdout)["report"]["summary"] == summary


def test_a_recorded_report_is_not_reported_failed_when_only_its_counter_fails(
    workdir: Path,
) -> None:
    """A folder planted at `reports/.seq`: the report line was written, then the counter
    write failed and `report` exited 1, so an agent retrying added the report again."""
    (workdir / "reports" / ".seq").mkdir(parents=True)
    for seq in (1, 2):
        done = taskcard("report", "--ok", "--summary", f"r{seq}", "--workdir", str(workdir))
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["seq"] == seq
    lines = (workdir / "reports" / "reports.jsonl").read_text().splitlines()
    assert [json.loads(line)["summary"] for line in lines] == ["r1", "r2"]


def test_an_unknown_channel_is_the_report_error_naming_it(workdir: Path) -> None:
    with pytest.raises(ReportError, match=r"^channel: 'fax' is not one of cli, mcp"):
        Reports(workdir, channel="fax")


async def test_spawn_refuses_a_child_folder_that_holds_the_parent_in_every_entry_point(
    tmp_path: Path, runtime_dir: Path
) -> None:
    """A child's workdir above the parent's (named directly, through `..`, or through a
    symbolic link) was recorded: `lineage.json` landed in a folder that holds the parent's
    files and the lineage looped. Refused by the tool, the command and the Python API, naming
    the child's field; a child inside the parent's workdir or beside it is still recorded."""
    top = tmp_path / "team"
    parent = top / "planner"
    (parent / "inner").mkdir(parents=True)
    (top / "sibling").mkdir()
    (parent / "up").symlink_to(top)
    (tmp_path / "me").symlink_to(parent)
    above = ["..", "../..", "up", str(top), "inner/../.."]
    async with mcp_session(parent, runtime_dir, (TASKCARD,)) as session:
        for child in above:
            result = await session.call_tool("spawn", {"child_workdir": child, "reason": "lint"})
            content = result.structured_content
            assert result.is_error and isinstance(content, dict), child
            assert content["message"].startswith("child_workdir: "), content
            assert "holds the parent's workdir" in content["message"], content
            assert "a folder of its own" in content["message"], content
        for child in ("inner", "../sibling"):
            result = await session.call_tool("spawn", {"child_workdir": child, "reason": "lint"})
            assert not result.is_error, result.structured_content
    for child_path in (str(top), str(tmp_path), str(parent / "up")):
        done = taskcard(
            "spawn", "--workdir", child_path, "--parent", "planner", "--reason", "lint",
            "--parent-workdir", str(parent),
        )  # fmt: skip
        assert done.returncode == 2, done.stderr
        assert done.stderr.startswith(b"taskcard spawn: --workdir: "), done.stderr
        assert b"holds the parent's workdir" in done.stderr
    # The parent named through a link, the child by its real path: the same folder.
    done = taskcard(
        "spawn", "--workdir", str(parent), "--parent", "x", "--reason", "lint",
        "--parent-workdir", str(tmp_path / "me"),
    )  # fmt: skip
    assert done.returncode == 2 and b"an agent is not its own parent" in done.stderr
    for child_path in (top, parent / "inner" / ".." / "..", parent / "up"):
        with pytest.raises(LineageError, match=r"^child: .* holds the parent's workdir"):
            spawn(child_path, parent="planner", reason="lint", parent_workdir=tmp_path / "me")
    assert not (top / "lineage.json").exists() and not (tmp_path / "lineage.json").exists()
    assert read_lineage(parent) is None
    assert read_lineage(parent / "inner") is not None
    assert read_lineage(top / "sibling") is not None


def test_spawn_never_rewrites_who_created_a_child(tmp_path: Path) -> None:
    """A folder recorded as a's child was "spawned" again by b: its lineage.json was rewritten,
    so who created whom changed after the fact (and two folders could name each other). A
    retry naming the same parent still records; another parent is refused, naming the field
    and the fix, in the command and the Python API; a broken record is still replaced."""
    child = tmp_path / "child"
    child.mkdir()
    spawn(child, parent="a", reason="first")
    spawn(child, parent="a", reason="retried")
    assert json.loads((child / "lineage.json").read_text())["parent"] == "a"
    with pytest.raises(LineageError, match=r"^child: .* already recorded as a child of 'a'"):
        spawn(child, parent="b", reason="second")
    done = taskcard("spawn", "--workdir", str(child), "--parent", "b", "--reason", "second")
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith(b"taskcard spawn: --workdir: "), done.stderr
    assert b"a folder of its own" in done.stderr and b"remove its lineage.json" in done.stderr
    assert json.loads((child / "lineage.json").read_text())["reason"] == "retried"
    (child / "lineage.json").write_text("{not json")
    spawn(child, parent="b", reason="over a broken record")
    assert json.loads((child / "lineage.json").read_text())["parent"] == "b"


def test_concurrent_spawns_into_one_folder_record_one_parent_and_refuse_the_others(
    tmp_path: Path,
) -> None:
    """Spawns of one folder by several parents at once (the Python API, from threads that
    start together): each read "no record yet", each wrote its own, and all were told they
    had spawned the child while the file kept only the last. Exactly one wins now; every
    other is refused naming the winner, as a later spawn is."""
    for round_ in range(20):
        child = tmp_path / f"child{round_}"
        child.mkdir()
        start = threading.Barrier(8)
        won: list[str] = []
        refused: list[str] = []

        def attempt(
            parent: str,
            child: Path = child,
            start: threading.Barrier = start,
            won: list[str] = won,
            refused: list[str] = refused,
        ) -> None:
            start.wait()
            try:
                spawn(child, parent=parent, reason="split the work")
                won.append(parent)
            except LineageError as exc:
                refused.append(str(exc))

        threads = [threading.Thread(target=attempt, args=(f"p{n}",)) for n in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=120)
        assert len(won) == 1, (round_, won)
        assert json.loads((child / "lineage.json").read_text())["parent"] == won[0]
        assert len(refused) == 7, refused
        assert all(f"already recorded as a child of '{won[0]}'" in text for text in refused)


def test_two_agents_spawning_each_other_at_once_record_no_loop(tmp_path: Path) -> None:
    """a records b as its child while b records a, at the same moment (threads that start
    together): each locked only the folder it wrote, read no record on the other side and
    succeeded, so the two named each other. Now exactly one spawn wins and the other is
    refused as the loop it would close."""
    for round_ in range(20):
        a, b = tmp_path / f"a{round_}", tmp_path / f"b{round_}"
        a.mkdir()
        b.mkdir()
        start = threading.Barrier(2)
        won: list[str] = []
        refused: list[str] = []

        def attempt(
            child: Path,
            parent_dir: Path,
            start: threading.Barrier = start,
            won: list[str] = won,
            refused: list[str] = refused,
        ) -> None:
            start.wait()
            try:
                spawn(child, parent=parent_dir.name, reason="split", parent_workdir=parent_dir)
                won.append(child.name)
            except LineageError as exc:
                refused.append(str(exc))

        threads = [
            threading.Thread(target=attempt, args=(b, a)),
            threading.Thread(target=attempt, args=(a, b)),
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=120)
        assert len(won) == 1 and len(refused) == 1, (round_, won, refused)
        assert refused[0].startswith("child: "), refused
        assert sum((folder / "lineage.json").exists() for folder in (a, b)) == 1


def test_a_reader_gets_only_typed_reports_as_the_service_reads_them(workdir: Path) -> None:
    """`taskcard reports` handed hand-written lines back as written: `"ok": "false"` (true to
    any caller testing it), `"verdict": "maybe"`, the spec's `aprovado` unconverted, a role
    that was a list. It now returns what the service would announce, typed as documented."""
    assert taskcard("report", "--workdir", str(workdir), "--ok", "--summary", "one").returncode == 0
    at = '"at":"2026-01-01T00:00:00Z"'
    with (workdir / "reports" / "reports.jsonl").open("a") as handle:
        handle.write(f'{{"seq":2,{at},"ok":"false","summary":"not a report"}}\n')
        handle.write('{"seq":3,"at":"yesterday","ok":false,"summary":"no date"}\n')
        handle.write(
            f'{{"seq":4,{at},"ok":false,"verdict":"reprovado","role":["x"],"channel":7,'
            '"summary":"typed","payload_file":"../../etc/passwd","payload_bytes":-1,'
            '"extra":{"deep":[1]}}\n'
        )
        handle.write(f'{{"seq":5,{at},"ok":true,"verdict":"maybe","summary":"last"}}\n')
        handle.write(f'{{"seq":6,{at},"ok":1,"summary":"one is not true"}}\n')
    walked = []
    last = 0
    while (report := next_report(workdir, "--after", str(last))) is not None:
        walked.append(report)
        last = report["seq"]
    assert [r["seq"] for r in walked] == [1, 4, 5]
    assert walked[1] == {
        "seq": 4,
        "at": "2026-01-01T00:00:00.000Z",
        "ok": False,
        "verdict": "rejected",
        "role": None,
        "channel": None,
        "summary": "typed",
        "payload_file": None,
        "payload_bytes": None,
        "payload": None,
    }
    assert walked[2]["verdict"] is None
    latest = next_report(workdir)
    assert latest is not None and (latest["seq"], latest["summary"]) == (5, "last")
    # The writer still numbers after every line with a seq, so none is handed out twice.
    done = taskcard("report", "--workdir", str(workdir), "--ok")
    assert json.loads(done.stdout)["seq"] == 7


def test_every_date_a_reader_gets_is_in_the_writers_utc_form(workdir: Path) -> None:
    """`taskcard reports` returned a hand-written line's `at` as written: `+05:00` stayed an
    offset, unlike the UTC `Z` form the writers stamp. Every `at` a reader gets (the command
    line, the Python API) is now that form; a line whose `at` is no date stays no report, as
    for the service, which never announces it."""
    written = json.loads(taskcard("report", "--workdir", str(workdir), "--ok").stdout)
    hand_written = {
        2: ("2026-03-01T17:30:00+05:00", "2026-03-01T12:30:00.000Z"),
        3: ("2026-03-01T12:30:00.123456-02:30", "2026-03-01T15:00:00.123Z"),
        4: ("2026-03-01T12:30:00", "2026-03-01T12:30:00.000Z"),  # no offset: UTC, as served
        5: ("2026-03-01", "2026-03-01T00:00:00.000Z"),
    }
    with (workdir / "reports" / "reports.jsonl").open("a") as handle:
        for seq, (at, _) in hand_written.items():
            handle.write(json.dumps({"seq": seq, "at": at, "ok": True}) + "\n")
        handle.write('{"seq":6,"at":"tomorrow","ok":true}\n')
        handle.write('{"seq":7,"at":1767225600,"ok":true}\n')
    expected = {1: written["at"], **{seq: utc for seq, (_, utc) in hand_written.items()}}
    assert written["at"].endswith("Z") and len(written["at"]) == len("2026-03-01T12:30:00.000Z")
    for after, seq in [(str(n - 1), n) for n in expected]:
        report = next_report(workdir, "--after", after)
        assert report is not None and (report["seq"], report["at"]) == (seq, expected[seq])
        python = Reports(workdir).after(seq - 1)
        assert python is not None and python["at"] == expected[seq]
    # Not a date: no report, for the reader as for the service (nothing after seq 5).
    assert next_report(workdir, "--after", "5") is None
    latest = next_report(workdir)
    assert latest is not None and (latest["seq"], latest["at"]) == (5, expected[5])


def test_a_role_in_any_script_is_taken_as_the_error_says_letters(workdir: Path) -> None:
    """`--role revisão` or `--role 审阅者` was refused with "role: 1-64 letters, ...": only
    ASCII letters passed, though the spec this follows is Portuguese and Feishu chats are
    often Chinese. Letters of any script pass (a decomposed one is stored composed); what is
    not a letter or digit still does not."""
    for given, stored in (
        ("revisão", "revisão"),
        ("revisa\u0303o", "revisão"),
        ("审阅者", "审阅者"),
        ("समीक्षक", "समीक्षक"),
        ("code reviewer 2", "code reviewer 2"),
    ):
        done = taskcard("report", "--workdir", str(workdir), "--ok", "--role", given)
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["role"] == stored
        latest = next_report(workdir)
        assert latest is not None and latest["role"] == stored
    for bad in ("rev\u202eiewer", "_x", "\u0303x", "a\u200bb", "x" * 65):
        done = taskcard("report", "--workdir", str(workdir), "--ok", "--role", bad)
        assert done.returncode == 2
        assert done.stderr.startswith(b"taskcard report: --role: 1-64 letters"), done.stderr


def test_a_retried_spawn_keeps_the_time_the_child_was_created(tmp_path: Path) -> None:
    """A second run of the same spawn (an orchestrator restarted, a retry) wrote `created_at`
    anew, so the record said the child was created at the retry. The recorded time stays; a
    record without a usable one takes the retry's."""
    child = tmp_path / "child"
    child.mkdir()
    args = ("spawn", "--workdir", str(child), "--parent", "planner", "--reason", "split")
    first = taskcard(*args)
    assert first.returncode == 0, first.stderr
    created = json.loads(first.stdout)["created_at"]
    record = json.loads((child / "lineage.json").read_text())
    record["created_at"] = "2026-01-02T03:04:05.678+01:00"
    (child / "lineage.json").write_text(json.dumps(record))
    again = taskcard(*args[:-1], "split, retried")
    assert again.returncode == 0, again.stderr
    kept = json.loads((child / "lineage.json").read_text())
    assert (kept["created_at"], kept["reason"]) == ("2026-01-02T02:04:05.678Z", "split, retried")
    assert json.loads(again.stdout)["created_at"] == kept["created_at"] != created
    record["created_at"] = "yesterday"
    (child / "lineage.json").write_text(json.dumps(record))
    assert taskcard(*args).returncode == 0
    assert json.loads((child / "lineage.json").read_text())["created_at"] > created


async def test_a_file_where_the_reports_folder_goes_is_bad_input_naming_it(
    workdir: Path, cli: CliHost
) -> None:
    """A file (or a named pipe) at `reports/` made `report` exit 1 with "File exists" and
    `reports` exit 1 with "Not a directory", as if the system had failed; it is the agent's
    files that are wrong, so each exits 2 naming the path and the fix, as a folder at
    `reports/reports.jsonl` already does, and the MCP tool says the same. Nothing is lost."""
    (workdir / "reports").write_text("notes\n")
    for args in (["report", "--ok"], ["reports"], ["reports", "--after", "0"]):
        done = taskcard(args[0], "--workdir", str(workdir), *args[1:])
        assert done.returncode == 2, done.stderr
        assert done.stderr.startswith(
            f"taskcard {args[0]}: reports/: a regular file, not a folder; move it aside".encode()
        ), done.stderr
    refused = await refused_over_mcp(workdir, cli)
    assert refused.startswith("reports/: a regular file, not a folder"), refused
    assert (workdir / "reports").read_text() == "notes\n"
    (workdir / "reports").unlink()
    os.mkfifo(workdir / "reports")
    done = taskcard("reports", "--workdir", str(workdir))
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith(b"taskcard reports: reports/: a named pipe, not a folder")
    (workdir / "reports").unlink()
    (workdir / "reports").symlink_to(workdir.parent / "gone-elsewhere")  # dangling, out
    for args in (["report", "--ok"], ["reports"]):
        done = taskcard(args[0], "--workdir", str(workdir), *args[1:])
        assert done.returncode == 2, done.stderr
        assert b"reports/: leads out of the workdir (a symlink)" in done.stderr, done.stderr
    (workdir / "reports").unlink()
    (workdir / "reports").symlink_to("missing-inside")  # dangling, inside
    for args in (["report", "--ok"], ["reports"]):
        done = taskcard(args[0], "--workdir", str(workdir), *args[1:])
        assert done.returncode == 2, done.stderr
        assert b"reports/: a symlink that leads nowhere" in done.stderr, done.stderr
    assert not (workdir / "missing-inside").exists()


def test_reports_names_the_broken_lines_it_reads_past_by_number(workdir: Path) -> None:
    """Broken lines of `reports/reports.jsonl` gave `{"report": null}` and nothing on stderr:
    a reader could not tell an empty file from one whose report could not be read. Each one
    read past where a report could have been is named by its line number, counted alike
    whether the file is walked from its start or only its tail is read (a carriage return
    in random bytes is no line break), and the answer and its exit code stay as they were."""
    reports = workdir / "reports"
    reports.mkdir()

    def report(seq: int, summary: str) -> bytes:
        line = {"seq": seq, "at": "2026-01-01T00:00:00Z", "ok": True, "summary": summary}
        return json.dumps(line).encode() + b"\n"

    filler = b'{"seq": 1, "note": "' + b"x\r" * 200_000 + b'"}\n'  # over the tail read
    (reports / "reports.jsonl").write_bytes(
        report(1, "first") + filler + report(2, "second") + b"\x80\xff\r\n" + b"[1]\n" * 7
    )
    fix = "; skipped (write one JSON object per line, as `taskcard report` does)"
    prefix = "taskcard reports: reports/reports.jsonl"
    after_second = [
        f"{prefix} line 4 is not UTF-8 text{fix}",
        *(f"{prefix} line {n} is not a JSON object{fix}" for n in (5, 6, 7, 8)),
        f"{prefix}: 3 more broken lines skipped",
    ]
    for after, summary, said in (
        ((), "second", after_second),  # the tail alone is read
        (("--after", "0"), "first", []),
        (
            ("--after", "1"),
            "second",
            [f"{prefix} line 2 is longer than 65,536 bytes, the most a report line may hold{fix}"],
        ),
        (("--after", "2"), None, after_second),
    ):
        done = taskcard("reports", "--workdir", str(workdir), *after)
        assert done.returncode == 0, done.stderr
        found = json.loads(done.stdout)["report"]
        assert (found and found["summary"]) == summary
        assert done.stderr.decode().splitlines() == said, (after, done.stderr)
        # The Python API says the same: the first five by number, in the same words, and
        # how many more.
        reader = Reports(workdir)
        read = reader.after(int(after[1]) if after else None)
        assert (read and read["summary"]) == summary
        assert [f"taskcard reports: {line}" for line in reader.skipped()] == said
        shown, more = reader.skipped_lines()
        assert [f"taskcard reports: {text}" for _, text in shown] == said[:5]
        assert [number for number, _ in shown] == [
            int(line.split(" line ")[1].split()[0]) for line in said[:5]
        ]
        assert more == (3 if len(said) > 5 else 0)


async def test_a_seq_past_any_report_is_refused_with_the_range_by_every_way_in(
    workdir: Path, cli: CliHost
) -> None:
    """MCP refused an `after` above 10^15, the most a report's seq may be, while `taskcard
    reports --after 10000000000000001` exited 0 with no report and `Reports(wd).after(10**30)`
    returned None: each refuses it now, with the range (a usage error, exit 2, on the command
    line), as each refuses -1."""
    assert Reports(workdir).add(ok=True)["seq"] == 1
    said = "is out of range; give the last seq you read (0 to 1000000000000000)"
    for seq in (10**15 + 1, -1):
        done = taskcard("reports", "--workdir", str(workdir), "--after", str(seq))
        assert (done.returncode, done.stdout) == (2, b""), done.stderr
        assert f"argument --after: {seq} {said}".encode() in done.stderr, done.stderr
    for seq in (10**15 + 1, 10**30, -1):
        with pytest.raises(ReportError) as raised:
            Reports(workdir).after(seq)
        assert str(raised.value) == f"after: {seq} {said}"
    async with mcp_session(workdir, cli.runtime_dir, (TASKCARD,)) as session:
        for seq in (10**15 + 1, -1):
            result = await session.call_tool("reports", {"after": seq})
            content = result.structured_content
            assert result.is_error and isinstance(content, dict), content
            assert (content["status"], content["message"]) == ("failed", f"after: {seq} {said}")
        result = await session.call_tool("reports", {"after": 10**15})
        assert result.structured_content == {"status": "ok", "report": None}
    assert next_report(workdir, "--after", str(10**15)) is None
    assert Reports(workdir).after(10**15) is None
