"""Hostile input on the producer side: envelope bytes, runtime folders, settings, renderers.

Each test drives a class of input the way an agent or another local user would (the CLI,
the host socket, the Python API, files on disk) and checks the refusal is clear and names
the problem, and that nothing else breaks.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from taskcard.producers.task_card.capability import TaskCard, _wait_until
from taskcard.producers.task_card.contract import CardPaths
from taskcard.producers.task_card.notifications import FileNotificationPort, TaskCardNotification
from taskcard.producers.task_card.renderer import (
    ProcEntry,
    RunOutcome,
    RunRequest,
    decide_doomed,
    run_renderer,
)

from .conftest import (
    COUNTER_RENDERER,
    FLAG_RENDERER,
    POLL_TIMEOUT_S,
    STATIC_RENDERER,
    CliHost,
    envelope,
    notifications,
    wait_for,
    write_renderer,
)

MakeCard = Any

# ----------------------------------------------------------------- envelope transport (12)

DEEP = b"[" * 200_000 + b"]" * 200_000
BIG = b'{"action": "settings", "input": {}, "reasoning": "' + b"a" * 2_000_000 + b'"}'

# (id, raw bytes, words the refusal must contain)
BAD_ENVELOPES: list[tuple[str, bytes, str]] = [
    ("invalid-utf8", b'{"action": "settings", "input": {}, "reasoning": "\xff\xfe"}', "UTF-8"),
    (
        "lone-surrogate",
        b'{"action": "settings", "input": {}, "reasoning": "\\ud800"}',
        "surrogate",
    ),
    ("deep-nesting", b'{"action": "settings", "input": ' + DEEP + b', "reasoning": "x"}', "nested"),
    ("two-megabytes", BIG, "limit"),
    ("truncated", b'{"action": "settings", "input": {}, "reas', "truncated"),
    ("top-level-array", b'[{"action": "settings"}]', "JSON object"),
    ("nul-byte", b'{"action": "settings", "input": {}, "reasoning": "a\x00b"}', "NUL"),
    ("nan", b'{"action": "start", "input": {"renderer_path": "r.py", "interval_s": NaN}}', "NaN"),
    ("empty", b"", "empty"),
    # What a Windows editor or shell may put first: refused as "line 1, column 1" before.
    ("byte-order-mark", b'\xef\xbb\xbf{"action": "settings", "input": {}}', "byte-order mark"),
    # A strict object names each key once: which "action" counts is up to each JSON reader.
    (
        "repeated-key",
        b'{"action": "settings", "input": {}, "reasoning": "x", "action": "remove"}',
        'key "action" appears twice',
    ),
    (
        "repeated-input-key",
        b'{"action": "start", "input": {"renderer_path": "r.py", "renderer_path": "s.py"},'
        b' "reasoning": "x"}',
        'key "renderer_path" appears twice',
    ),
    (
        "huge-integer",
        b'{"action": "start", "input": {"renderer_path": "r.py", "interval_s": '
        + b"9" * 5000
        + b'}, "reasoning": "x"}',
        "digits",
    ),
]
# What the kernel will not put in an argument: NUL ends the string, 128 KiB is the cap.
NOT_AS_ARGUMENT = {"nul-byte", "two-megabytes", "deep-nesting", "empty"}


def _run_tool(cli: CliHost, *, arg: bytes | None, stdin: bytes | None) -> tuple[int, str, str]:
    command = [sys.executable, "-m", "taskcard.bridge.cli", "tool"]
    command += ["--workdir", str(cli.workdir), "--runtime-dir", str(cli.runtime_dir)]
    if arg is not None:
        command.append(os.fsdecode(arg))
    done = subprocess.run(command, input=stdin or b"", capture_output=True, timeout=120)
    return done.returncode, done.stdout.decode(errors="replace"), done.stderr.decode()


@pytest.mark.parametrize(("raw", "words"), [case[1:] for case in BAD_ENVELOPES],
                         ids=[case[0] for case in BAD_ENVELOPES])  # fmt: skip
def test_tool_refuses_unusable_envelopes_on_stdin_with_exit_2(
    cli: CliHost, raw: bytes, words: str
) -> None:
    code, out, err = _run_tool(cli, arg=None, stdin=raw)
    assert code == 2, (out, err)
    result = json.loads(out)
    assert result["status"] == "failed" and result["code"] == "bad_envelope"
    assert words in result["message"]
    for noise in ("Traceback", "Expecting value", "Broken pipe"):
        assert noise not in out + err


@pytest.mark.parametrize(
    ("raw", "words"),
    [case[1:] for case in BAD_ENVELOPES if case[0] not in NOT_AS_ARGUMENT],
    ids=[case[0] for case in BAD_ENVELOPES if case[0] not in NOT_AS_ARGUMENT],
)
def test_tool_refuses_unusable_envelopes_as_argument_with_exit_2(
    cli: CliHost, raw: bytes, words: str
) -> None:
    code, out, err = _run_tool(cli, arg=raw, stdin=None)
    assert code == 2, (out, err)
    assert words in json.loads(out)["message"]
    assert "Traceback" not in err


def test_tool_refuses_a_reasoning_of_invisible_characters(cli: CliHost) -> None:
    """The root `reasoning` is required: one of zero-width characters only gave none."""
    raw = '{"action": "manual", "input": {}, "reasoning": "\u200b\u2060\ufeff \u3164"}'
    code, out, err = _run_tool(cli, arg=raw.encode(), stdin=None)
    assert code == 2, (out, err)  # the schema's refusal: a usage error
    result = json.loads(out)
    assert result["status"] == "failed" and result["message"].startswith("reasoning: required")
    assert "invisible characters" in result["message"]


def test_card_refuses_an_argument_that_is_not_utf8(cli: CliHost) -> None:
    command = [
        sys.executable,
        "-m",
        "taskcard.bridge.cli",
        "card",
        "start",
        os.fsdecode(b"r\xff.py"),
    ]
    command += ["--workdir", str(cli.workdir), "--runtime-dir", str(cli.runtime_dir)]
    done = subprocess.run([*command, "--json"], capture_output=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert "input.renderer_path" in json.loads(done.stdout)["message"]
    summary = subprocess.run(command, capture_output=True, timeout=120)
    assert summary.returncode == 2, summary.stderr
    assert summary.stdout.startswith(b"start: failed\n  envelope: input.renderer_path")


def _socket_exchange(cli: CliHost, line: bytes) -> dict[str, Any]:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.settimeout(60)
        conn.connect(str(cli.paths.socket))
        conn.sendall(line + b"\n")
        reply = b""
        while not reply.endswith(b"\n"):
            chunk = conn.recv(65536)
            if not chunk:
                break
            reply += chunk
    result: dict[str, Any] = json.loads(reply)
    return result


@pytest.mark.parametrize(
    ("raw", "words"),
    [case[1:] for case in BAD_ENVELOPES if case[0] != "empty"],
    ids=[case[0] for case in BAD_ENVELOPES if case[0] != "empty"],
)
def test_the_host_socket_answers_unusable_requests_and_keeps_serving(
    cli: CliHost, raw: bytes, words: str
) -> None:
    cli.start_host()
    if raw.startswith(b"{"):
        raw = b'{"op": "call", "envelope": ' + raw + b"}"
    reply = _socket_exchange(cli, raw)
    assert reply["ok"] is False or reply["result"]["status"] == "failed"
    text = reply.get("error") or reply["result"]["message"]
    assert words in text or "JSON" in text
    assert _socket_exchange(cli, b'{"op": "ping"}')["ok"] is True


@pytest.mark.parametrize(("raw", "words"), [case[1:] for case in BAD_ENVELOPES],
                         ids=[case[0] for case in BAD_ENVELOPES])  # fmt: skip
def test_the_python_api_refuses_unusable_envelopes_as_results(
    make_card: MakeCard, raw: bytes, words: str
) -> None:
    card = make_card()
    for form in (raw, raw.decode("utf-8", "surrogateescape")):
        result = card.call(form)
        assert result["status"] == "failed"
        assert words in result["message"] or "UTF-8" in result["message"]
    assert card.call(envelope("settings"))["status"] == "ok"


def test_the_python_api_refuses_hostile_objects_too(make_card: MakeCard) -> None:
    card = make_card()
    deep: dict[str, Any] = {}
    cursor = deep
    for _ in range(200_000):
        cursor["a"] = {}
        cursor = cursor["a"]
    cases = [
        ({"action": "settings", "input": deep, "reasoning": "x"}, "nested"),
        ({"action": "settings", "input": {}, "reasoning": "\ud800"}, "surrogate"),
        ({"action": "settings", "input": {}, "reasoning": "a" * 2_000_000}, "limit"),
        ({"action": "start", "input": {"renderer_path": "r\x00.py"}, "reasoning": "x"}, "NUL"),
        ({"action": "settings", "input": {"n": 10**4000}, "reasoning": "x"}, "digits"),
    ]
    for raw, words in cases:
        result = card.call(raw)
        assert result["status"] == "failed" and words in result["message"]


# ----------------------------------------------------------------- runtime folder (6)


@pytest.fixture
def foreign_runtime_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="tcrt"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _make_unsafe(path: Path, how: str) -> Path:
    if how == "other-owner":
        os.chown(path, 65534, 65534)
        return path
    if how == "group-writable":
        path.chmod(0o770)
        return path
    if how == "world-readable":
        path.chmod(0o755)
        return path
    link = path.with_name(path.name + "-link")
    link.symlink_to(path)
    return link


@pytest.mark.parametrize("how", ["other-owner", "group-writable", "world-readable", "symlink"])
def test_an_unsafe_runtime_dir_is_refused_with_one_line_and_exit_2(
    workdir: Path, foreign_runtime_dir: Path, how: str
) -> None:
    runtime = _make_unsafe(foreign_runtime_dir, how)
    # Valid (a schema refusal comes first), and one that needs a host (not manual or settings).
    inspect = '{"action": "inspect", "input": {"watch_id": "tc_1"}, "reasoning": "x"}'
    for args in (["card", "inspect", "tc_1"], ["tool", inspect], ["host"], ["mcp"]):
        command = [sys.executable, "-m", "taskcard.bridge.cli", *args]
        command += ["--workdir", str(workdir), "--runtime-dir", str(runtime)]
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL
        )
        assert done.returncode == 2, (args, done.stdout, done.stderr)
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and str(runtime) in lines[0] and "refusing" in lines[0]
    assert not list(foreign_runtime_dir.glob("*.sock"))
    with pytest.raises(RuntimeError, match="refusing"):
        TaskCard(workdir, runtime_dir=runtime, environ={"PATH": os.defpath})


@pytest.mark.parametrize("where", ["under-a-file", "in-proc"])
def test_a_runtime_dir_that_cannot_be_created_is_refused_with_one_line_and_exit_2(
    workdir: Path, foreign_runtime_dir: Path, where: str
) -> None:
    """It was a bare "[Errno 17] File exists: ..." (or errno 2) with exit 4, "no host could
    be reached", naming neither the option nor what to do."""
    if where == "under-a-file":
        (foreign_runtime_dir / "file").write_text("")
        runtime = foreign_runtime_dir / "file" / "rt"
    else:
        runtime = Path("/proc/taskcard-no-such-folder")
    inspect = '{"action": "inspect", "input": {"watch_id": "tc_1"}, "reasoning": "x"}'
    for args in (["card", "inspect", "tc_1"], ["tool", inspect], ["host"], ["mcp"]):
        command = [sys.executable, "-m", "taskcard.bridge.cli", *args]
        command += ["--workdir", str(workdir), "--runtime-dir", str(runtime)]
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL
        )
        assert done.returncode == 2, (args, done.stdout, done.stderr)
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1, done.stderr
        assert f"runtime dir {runtime} cannot be created" in lines[0], lines[0]
        assert "--runtime-dir" in lines[0] and "Errno" not in lines[0], lines[0]
    with pytest.raises(RuntimeError, match="cannot be created"):
        TaskCard(workdir, runtime_dir=runtime, environ={"PATH": os.defpath})


def _private_tmp_available() -> bool:
    probe = ["unshare", "--mount", "--propagation", "private", "sh", "-c", "mount -t tmpfs n /tmp"]
    try:
        return subprocess.run(probe, capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def _lives_in_tmp() -> bool:
    """The private /tmp hides everything under /tmp, this checkout and its venv included."""
    places = (Path(sys.executable).resolve(), Path(__file__).resolve())
    return any(Path("/tmp") in place.parents for place in places)


@pytest.mark.skipif(not _private_tmp_available(), reason="needs a private /tmp (unshare)")
@pytest.mark.skipif(_lives_in_tmp(), reason="the checkout or its venv is under /tmp")
def test_the_tmp_fallback_is_created_0700_and_a_planted_one_is_refused() -> None:
    """In a private mount namespace, so the real /tmp/taskcard-<uid> is never touched."""
    workdir = Path(tempfile.mkdtemp(dir="/var/tmp", prefix="tcwd"))
    try:
        (workdir / "r.py").write_text(STATIC_RENDERER)
        remove = """'{"action": "remove", "input": {}, "reasoning": "x"}'"""  # needs a host
        taskcard = f"{sys.executable} -m bridge.cli tool {remove} --workdir {workdir}"
        fallback = f"/tmp/taskcard-{os.getuid()}"
        script = f"""
            mount -t tmpfs none /tmp || exit 99
            {taskcard} --idle-grace-s 1 >/dev/null; echo "fresh=$? $(stat -c %a {fallback})"
            rm -rf {fallback}; mkdir -m 0755 {fallback}
            {taskcard} >/dev/null 2>/tmp/err; echo "loose=$? $(wc -l </tmp/err)"
            rm -rf {fallback}; mkdir -m 0700 {fallback}; chown 65534 {fallback}
            {taskcard} >/dev/null 2>/tmp/err; echo "foreign=$? $(cat /tmp/err)"
        """
        env = {k: v for k, v in os.environ.items() if "RUNTIME_DIR" not in k}
        env["PYTHONPATH"] = str(Path(__file__).resolve().parents[2])
        done = subprocess.run(
            ["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
            capture_output=True,
            text=True,
            timeout=300,
            env=env,
            cwd=str(Path(__file__).resolve().parents[2]),
        )
        lines = done.stdout.strip().splitlines()
        assert lines[0] == "fresh=0 700", done.stdout + done.stderr
        assert lines[1] == "loose=2 1", done.stdout + done.stderr
        assert lines[2].startswith("foreign=2 ") and "uid 65534" in lines[2]
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def test_the_host_log_is_never_opened_through_a_symlink(workdir: Path, runtime_dir: Path) -> None:
    cli = CliHost(workdir, runtime_dir)
    target = runtime_dir.parent / f"{runtime_dir.name}-target"
    target.write_text("")
    try:
        cli.paths.log.symlink_to(target)
        done = cli.run("host", "--detach")
        assert done.returncode == 2, done.stderr
        assert "host log" in done.stderr and "Traceback" not in done.stderr
        assert target.read_text() == ""
    finally:
        target.unlink()
        cli.shutdown()


# ----------------------------------------------------------------- settings ceilings (11)


@pytest.mark.parametrize(
    ("field", "value", "words"),
    [
        ("interval_s", 0.999, "greater than or equal to 1"),
        ("timeout_s", 0.05, "greater than or equal to 0.1"),
        ("max_refreshes", 0, "greater than or equal to 1"),
        ("max_refreshes", -(10**12), "greater than or equal to 1"),
    ],
)
def test_start_refuses_values_below_a_floor_naming_the_field(
    workdir: Path, make_card: MakeCard, field: str, value: float, words: str
) -> None:
    write_renderer(workdir, "r.py", STATIC_RENDERER)
    card = make_card()
    result = card.call(envelope("start", renderer_path="r.py", **{field: value}))
    assert result["status"] == "failed"
    assert f"input.{field}" in result["message"] and words in result["message"]
    assert not (workdir / "taskcard" / "watch.json").exists()


def test_start_caps_huge_ceilings_silently_and_honours_any_slower_interval(
    workdir: Path, make_card: MakeCard
) -> None:
    """The manual: a request above a ceiling is capped, not an error; interval has no ceiling."""
    write_renderer(workdir, "r.py", STATIC_RENDERER)
    card = make_card()
    huge = {"interval_s": 1e12, "timeout_s": 1e300, "max_refreshes": 10**40}
    result = card.call(envelope("start", renderer_path="r.py", **huge))
    assert result["status"] == "watching", result
    assert result["max_refreshes"] == 2000  # the max-refreshes setting in force
    inspected = card.inspect("tc_1")
    assert (inspected["interval_s"], inspected["timeout_s"]) == (1e12, 10)
    descriptor = json.loads((workdir / "taskcard" / "watch.json").read_text())
    assert (descriptor["interval_s"], descriptor["timeout_s"]) == (1e12, 10)
    # The updater waits for its far first tick without dying (no OverflowError).
    assert card.inspect("tc_1")["status"] == "watching"
    # A restarted host resumes the same far cadence instead of calling the descriptor corrupt.
    card.close()
    resumed = make_card()
    inspected = resumed.inspect("tc_1")
    assert (inspected["status"], inspected["interval_s"]) == ("watching", 1e12)
    assert resumed.stop("tc_1")["status"] == "stopped"


def test_a_whole_number_too_large_for_a_float_is_capped_like_any_huge_request(
    cli: CliHost,
) -> None:
    """JSON puts no limit on a number's size: `timeout_s` written as 401 digits is a request
    above the ceiling, which the manual caps silently, and `interval_s` so written is a slower
    cadence, always honoured. Both were refused as "Input should be a valid number"."""
    write_renderer(cli.workdir, "r.py", STATIC_RENDERER)
    huge = "1" + "0" * 400
    raw = (
        '{"action": "start", "input": {"renderer_path": "r.py", '
        f'"timeout_s": {huge}, "interval_s": {huge}}}, "reasoning": "x"}}'
    )
    started = cli.json("tool", raw)
    assert started["status"] == "watching", started
    inspected = cli.json("card", "inspect", "tc_1")
    assert inspected["timeout_s"] == 10  # the timeout-s setting in force
    assert inspected["interval_s"] == sys.float_info.max
    below = raw.replace(f'"timeout_s": {huge}', f'"timeout_s": -{huge}')
    refused = cli.json("tool", below)
    assert "input.timeout_s: Input should be greater than or equal to 0.1" in refused["message"]


def test_a_far_tick_is_waited_for_in_steps_and_a_stop_ends_the_wait() -> None:
    stop = threading.Event()
    done: list[bool] = []
    waiter = threading.Thread(target=lambda: done.append(_wait_until(stop, 1e300)))
    waiter.start()
    stop.set()
    waiter.join(POLL_TIMEOUT_S)
    assert done == [True]
    assert _wait_until(threading.Event(), 0.0) is False  # already due: no wait, not stopped


def test_out_of_range_settings_are_refused_per_field_with_their_range(
    workdir: Path, make_card: MakeCard
) -> None:
    (workdir / "taskcard").mkdir()
    document = {"max_body_chars": 10**12, "interval_s": 0.5, "reminder_turns": 7}
    (workdir / "taskcard" / "taskcard.json").write_text(json.dumps(document))
    card = make_card()
    result = card.call(envelope("settings"))
    assert result["status"] == "ok"
    rows = {row["key"]: row for row in result["settings"]}
    assert rows["max-body-chars"]["current"] == 2000
    assert "100 to 100000" in rows["max-body-chars"]["comment"]
    assert rows["interval-s"]["current"] == 5
    assert rows["reminder-turns"]["current"] == 7  # the good field is kept
    problems = " ".join(result["problems"])
    assert "max_body_chars" in problems and "interval_s" in problems
    assert "a finite number of at least 1" in problems


def test_a_descriptor_past_a_ceiling_is_cleared_not_resumed(
    workdir: Path, make_card: MakeCard
) -> None:
    write_renderer(workdir, "r.py", STATIC_RENDERER)
    (workdir / "taskcard").mkdir()
    descriptor = {
        "watch_id": "tc_4",
        "renderer_path": "r.py",
        "interval_s": 5,
        "timeout_s": 1e9,
        "max_refreshes": 10,
        "refreshes_used": 0,
        "started_at": "2024-01-01T00:00:00Z",
    }
    (workdir / "taskcard" / "watch.json").write_text(json.dumps(descriptor))
    card = make_card()
    assert not card.has_live_watch()
    assert not (workdir / "taskcard" / "watch.json").exists()


class _UpdaterKiller(BaseException):
    """Escapes `except Exception`, as a bug or an interpreter-level error would."""


def test_a_dead_updater_shows_as_an_error_with_a_notification_never_as_watching(
    workdir: Path, make_card: MakeCard
) -> None:
    write_renderer(workdir, "r.py", STATIC_RENDERER)
    runs = []
    killed = threading.Event()

    def runner(request: RunRequest, cancel: threading.Event) -> RunOutcome:
        runs.append(request)
        if len(runs) == 2:  # the first tick after start
            killed.set()
            raise _UpdaterKiller()
        return run_renderer(request, cancel)

    card = make_card(runner=runner)
    assert card.call(envelope("start", renderer_path="r.py", interval_s=1))["status"] == "watching"
    assert killed.wait(60)
    wait_for(lambda: card.inspect("tc_1")["status"] == "error")
    inspected = card.inspect("tc_1")
    assert inspected["error"]["code"] == "watch_crash"
    assert "updater stopped" in inspected["error"]["message"]
    wait_for(lambda: any(n["source"] == "task_card.error" for n in notifications(workdir)))
    retried = card.call(envelope("retry", watch_id="tc_1"))  # restarts the updater
    assert retried["status"] == "watching"
    wait_for(lambda: len(runs) >= 4)
    assert card.inspect("tc_1")["status"] == "watching"


class _BrokenPort(FileNotificationPort):
    def notify(self, event: TaskCardNotification) -> None:
        raise OSError("disk full")


def test_a_dead_updater_is_an_error_even_when_the_notification_fails(
    workdir: Path, make_card: MakeCard
) -> None:
    write_renderer(workdir, "r.py", COUNTER_RENDERER)
    calls = []

    def runner(request: RunRequest, cancel: threading.Event) -> RunOutcome:
        calls.append(1)
        if len(calls) >= 2:
            raise _UpdaterKiller()
        return run_renderer(request, cancel)

    card = make_card(runner=runner, notifier=_BrokenPort(CardPaths(workdir)))
    card.call(envelope("start", renderer_path="r.py", interval_s=1))
    wait_for(lambda: card.inspect("tc_1")["status"] == "error")


# ----------------------------------------------------------------- renderer descendants (10)


def _marked_processes(marker: str) -> list[int]:
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{name}/cmdline").read_bytes()
            state = Path(f"/proc/{name}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if marker.encode() in cmdline and state != "Z":
            found.append(int(name))
    return found


def _escaping_renderer(marker: str, *, clear_env: bool) -> str:
    """Starts a grandchild in its own session (and maybe a clean environment) every run."""
    prefix = "env -i " if clear_env else ""
    sleeper = f"{sys.executable} -c 'import time; time.sleep(1000)' {marker}"
    return (
        "import os\n"
        f'os.system("{prefix}setsid {sleeper} &")\n'
        'print("# Work\\nspawned a grandchild")\n'
    )


@pytest.mark.parametrize("clear_env", [False, True], ids=["setsid", "setsid-env-i"])
def test_grandchildren_of_renderers_die_with_the_render_in_the_host(
    workdir: Path, cli: CliHost, clear_env: bool
) -> None:
    marker = f"tcmark-{uuid.uuid4().hex}"
    write_renderer(workdir, "r.py", _escaping_renderer(marker, clear_env=clear_env))
    started = cli.json("card", "start", "r.py", "--interval-s", "1", "--timeout-s", "30")
    assert started["status"] == "watching", started
    wait_for(lambda: cli.json("card", "inspect", "tc_1")["refreshes_used"] >= 3)
    inspected = cli.json("card", "inspect", "tc_1")
    assert inspected["error"] is None, inspected["error"]  # pipes were not held to a timeout
    cli.json("card", "stop", "tc_1")
    wait_for(lambda: not _marked_processes(marker), 30)
    cli.json("card", "retry", "tc_1")
    cli.json("card", "remove")
    wait_for(lambda: not _marked_processes(marker), 30)


def test_grandchildren_of_renderers_die_with_the_render_in_process(
    workdir: Path, make_card: MakeCard
) -> None:
    marker = f"tcmark-{uuid.uuid4().hex}"
    write_renderer(workdir, "r.py", _escaping_renderer(marker, clear_env=False))
    card = make_card()
    assert card.call(envelope("start", renderer_path="r.py", interval_s=3600))["status"] == (
        "watching"
    )
    for _ in range(3):
        card.call(envelope("retry", watch_id="tc_1"))
    wait_for(lambda: not _marked_processes(marker), 30)
    card.call(envelope("remove"))
    wait_for(lambda: not _marked_processes(marker), 30)


def test_a_descendant_the_first_sweep_missed_is_found_while_it_holds_the_pipes(
    workdir: Path, make_card: MakeCard
) -> None:
    # Outside a subreaper, an escaped descendant is found by the token in its environment.
    # One caught in the middle of an exec reads an empty environment, so the sweep after the
    # renderer's exit could find nothing; the run then waited on the pipes the descendant
    # held until its timeout (renderer_timeout), and the descendant lived on. Here the
    # grandchild bears no token at first and takes it back a moment later.
    marker = f"tcmark-{uuid.uuid4().hex}"
    tools = {name: shutil.which(name) for name in ("env", "setsid", "sh", "sleep")}
    later = (
        f"{tools['sleep']} 1.5; exec {tools['env']} TASKCARD_RENDER_TOKEN=$0 "
        f"{sys.executable} -c 'import time; time.sleep(1000)' {marker}"
    )
    renderer = (
        "import os, subprocess\n"
        f"subprocess.Popen([{tools['env']!r}, '-i', {tools['setsid']!r}, {tools['sh']!r}, "
        f"'-c', {later!r}, os.environ['TASKCARD_RENDER_TOKEN']])\n"
        'print("# Work")\n'
    )
    write_renderer(workdir, "r.py", renderer)
    card = make_card()
    started = card.call(envelope("start", renderer_path="r.py", interval_s=3600, timeout_s=60))
    assert started["status"] == "watching", started
    inspected = card.call(envelope("inspect", watch_id="tc_1"))
    assert inspected["error"] is None, inspected
    assert not _marked_processes(marker)
    card.call(envelope("remove"))


def _row(
    pid: int, ppid: int, *, zombie: bool = False, tagged: bool = False, host: bool = False
) -> ProcEntry:
    return ProcEntry(pid, ppid, zombie, tagged, host=host)


@pytest.mark.parametrize(
    ("table", "leader", "live", "subreaper", "expected"),
    [
        # the renderer's subtree, not its siblings
        ([_row(10, 1), _row(11, 10), _row(12, 11), _row(20, 1)], 10, set(), False, {10, 11, 12}),
        # a tagged orphan under init and its own child
        ([_row(30, 1, tagged=True), _row(31, 30)], None, set(), False, {30, 31}),
        # as subreaper: our orphaned children die, a running renderer does not
        ([_row(40, 5), _row(41, 40), _row(50, 5)], None, {50}, True, {40, 41}),
        # as subreaper: a taskcard host reparented to us lives on, with what it runs
        ([_row(40, 5, host=True), _row(41, 40), _row(42, 5)], None, set(), True, {42}),
        # a host below a finished renderer is spared, with its subtree, not its parents
        (
            [_row(10, 1), _row(11, 10), _row(12, 11, host=True), _row(13, 12)],
            10,
            set(),
            False,
            {10, 11},
        ),
        # not a subreaper: our other children are the agent's business
        ([_row(40, 5), _row(50, 5)], None, set(), False, set()),
        # never ourselves, even when tagged
        ([_row(5, 1, tagged=True), _row(60, 5)], None, set(), False, set()),
        # a parent cycle in a torn snapshot terminates
        ([_row(70, 71), _row(71, 70)], None, set(), False, set()),
    ],
)
def test_decide_doomed(
    table: list[ProcEntry], leader: int | None, live: set[int], subreaper: bool, expected: set[int]
) -> None:
    doomed = decide_doomed(
        table, me=5, leader=leader, live_leaders=frozenset(live), subreaper=subreaper
    )
    assert doomed == expected


# ----------------------------------------------------------------- non-regular files (1)


def _plant(path: Path, kind: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "device":
        path.symlink_to("/dev/zero")
    else:
        path.mkdir()


@pytest.mark.parametrize("kind", ["fifo", "device", "folder"])
def test_a_planted_watch_descriptor_never_stalls_the_host(cli: CliHost, kind: str) -> None:
    """Rehydration meets it first: the host retires it as corrupt and serves calls."""
    _plant(CardPaths(cli.workdir).watch, kind)
    done = cli.run("host", "--detach")  # times out after 120 s if the host hangs
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    assert _socket_exchange(cli, b'{"op": "ping"}')["ok"] is True


@pytest.mark.parametrize("kind", ["fifo", "device", "folder"])
def test_a_planted_settings_file_is_refused_by_name_never_read(cli: CliHost, kind: str) -> None:
    _plant(CardPaths(cli.workdir).settings, kind)
    for command in (("card", "settings", "--json"), ("card", "start", "r.py", "--json")):
        done = cli.run(*command)
        assert done.returncode in (1, 2), done.stderr
        assert "Traceback" not in done.stderr and "MemoryError" not in done.stderr
        result = json.loads(done.stdout)
        assert result["status"] == "failed"
        if command[1] == "settings":
            assert "taskcard.json" in result["message"]
            assert "not a regular file" in result["message"]


def test_a_notification_folder_that_cannot_be_written_never_stops_the_card(
    cli: CliHost,
) -> None:
    """Notices and the turn count are written beside the card; failing there is only logged."""
    write_renderer(cli.workdir, "r.py", FLAG_RENDERER)
    notices = cli.workdir / ".notification"
    notices.mkdir()
    (notices / "turns.json").write_text('{"turns": 3}')  # a publication resets it...
    (notices / ".turns.lock").mkdir()  # ...under a lock that cannot be opened
    started = cli.run("card", "start", "r.py", "--interval-s", "1", "--json")
    assert started.returncode == 0, started.stderr
    assert json.loads(started.stdout)["status"] == "watching"
    shutil.rmtree(notices)
    notices.write_text("planted: not a folder")  # no error or recovery notice can be written
    flag = cli.workdir / "fail.flag"
    flag.touch()
    wait_for(lambda: cli.json("card", "inspect", "tc_1")["status"] == "error")
    assert cli.json("card", "inspect", "tc_1")["error"]["code"] == "renderer_nonzero_exit"
    flag.unlink()
    wait_for(lambda: cli.json("card", "inspect", "tc_1")["status"] == "watching")
    assert cli.json("card", "retry", "tc_1")["status"] == "watching"


@pytest.mark.parametrize(
    ("raw", "words"),
    [
        (b'{"input": {}, "reasoning": "r"}', "action: required, one of start, inspect"),
        (b'{"action": "manual", "input": null, "reasoning": "r"}', "must be an object, got null"),
        (b'{"action": "manual", "input": [], "reasoning": "r"}', "must be an object, got an array"),
        (
            b'{"action": "manual", "input": "{}", "reasoning": "r"}',
            "must be an object, got a string",
        ),
    ],
    ids=["no-action", "input-null", "input-array", "input-string"],
)
def test_a_refused_envelope_is_explained_in_json_words(
    cli: CliHost, raw: bytes, words: str
) -> None:
    code, out, err = _run_tool(cli, arg=None, stdin=raw)
    assert code == 2, (out, err)  # the schema's refusal: a usage error
    message = json.loads(out)["message"]
    assert words in message
    for python in ("None", "NoneType", "list", "str"):
        assert python not in message.split()


def test_the_python_api_names_a_key_that_is_not_a_string_once(make_card: MakeCard) -> None:
    result = make_card().call({"action": "manual", "input": {}, "reasoning": "r", 7: "x"})
    assert result["message"] == "envelope: keys must be strings, got 7"


def test_settings_problems_spell_values_and_ranges_as_the_json_file_does(cli: CliHost) -> None:
    (cli.workdir / "taskcard").mkdir()
    document = '{"max_refreshes": true, "timeout_s": null, "interval_s": "5"}'
    (cli.workdir / "taskcard" / "taskcard.json").write_text(document)
    problems = cli.json("card", "settings")["problems"]
    assert problems == [
        'taskcard.json interval_s: "5" is not allowed; use a finite number of at least 1; '
        "the default 5 is in force",
        "taskcard.json timeout_s: null is not allowed; use a number from 0.1 to 300; "
        "the default 10 is in force",
        "taskcard.json max_refreshes: true is not allowed; use an integer from 1 to 1000000; "
        "the default 2000 is in force",
    ]


@pytest.mark.parametrize(
    ("written", "key"),
    [
        ("interval-s", "interval_s"),  # as the rows of SHOW name it
        ("maxRefreshes", "max_refreshes"),
        ("Reminder_Turns", "reminder_turns"),
        ("max_body_char", "max_body_chars"),
        ("timeout", "timeout_s"),
    ],
)
def test_a_setting_spelt_another_way_is_named_not_silently_ignored(
    cli: CliHost, written: str, key: str
) -> None:
    """The rows name a setting `interval-s` and the file's key is `interval_s`: an owner who
    wrote the row's name (or another case, or a slip) saw the default "from default" and
    nothing saying their value was never read."""
    (cli.workdir / "taskcard").mkdir()
    document = {written: 7, "owner": "ana"}  # fields of the owner's own stay unremarked
    (cli.workdir / "taskcard" / "taskcard.json").write_text(json.dumps(document))
    shown = cli.json("card", "settings")
    (problem,) = shown["problems"]
    assert problem.startswith(f'taskcard.json "{written}" is not read; the key is {key}; ')
    row = next(row for row in shown["settings"] if row["key"] == key.replace("_", "-"))
    assert f'"{written}" is not read; the key is {key}' in row["comment"]
    assert row["current"] == row["default"]


def test_a_setting_named_twice_in_the_document_falls_back_to_its_default(
    cli: CliHost,
) -> None:
    """JSON leaves open which of two values for one key counts, and readers differ (ours took
    the last, an editor or `jq` reading the file may show the first): an owner reading `1`
    got a watch with a budget of 5000. Such a field is refused on its own, as an invalid one
    is; the others keep their values."""
    write_renderer(cli.workdir, "r.py", STATIC_RENDERER)
    (cli.workdir / "taskcard").mkdir()
    document = '{"max_refreshes": 1, "interval_s": 2, "max_refreshes": 5000}'
    (cli.workdir / "taskcard" / "taskcard.json").write_text(document)
    shown = cli.json("card", "settings")
    rows = {row["key"]: row["current"] for row in shown["settings"]}
    assert (rows["max-refreshes"], rows["interval-s"]) == (2000, 2)
    assert shown["problems"] == [
        "taskcard.json max_refreshes: given twice in one object (readers differ on which"
        " counts); keep one; the default 2000 is in force"
    ]
    started = cli.json("card", "start", "r.py")
    assert (started["status"], started["max_refreshes"]) == ("watching", 2000)


HUGE_WHOLE = "1" + "0" * 400  # a finite JSON number past the largest float


def test_a_settings_value_too_large_for_a_float_is_read_not_a_traceback(cli: CliHost) -> None:
    """`math.isfinite` of a whole number past the largest float raises OverflowError: such an
    `interval_s` made `card settings` print a traceback, and every render (which reads the
    settings) fail. It is a finite number of at least 1: honoured as the largest float, as a
    start's request is; past a ceiling, it is refused like any value out of range."""
    write_renderer(cli.workdir, "r.py", COUNTER_RENDERER)
    (cli.workdir / "taskcard").mkdir()
    document = f'{{"interval_s": {HUGE_WHOLE}, "max_refreshes": {HUGE_WHOLE}}}'
    (cli.workdir / "taskcard" / "taskcard.json").write_text(document)
    done = cli.run("card", "settings", "--json")
    assert done.returncode == 0, done.stderr
    shown = json.loads(done.stdout)
    rows = {row["key"]: row["current"] for row in shown["settings"]}
    assert (rows["interval-s"], rows["max-refreshes"]) == (sys.float_info.max, 2000)
    assert [problem.split(":")[0] for problem in shown["problems"]] == [
        "taskcard.json max_refreshes"
    ]
    started = cli.json("card", "start", "r.py")
    assert (started["status"], started["max_refreshes"]) == ("watching", 2000)
    retried = cli.json("card", "retry", "tc_1")  # a render reads the settings again
    assert (retried["status"], retried.get("refresh_error")) == ("watching", None)
    assert (cli.workdir / "count.txt").read_text() == "2"


def test_a_descriptor_with_a_number_too_large_for_a_float_is_cleared_and_the_host_serves(
    cli: CliHost,
) -> None:
    """The host never writes such a number, so it was planted; reading it raised
    OverflowError and the host never came up (every call: no host reachable, exit 4)."""
    write_renderer(cli.workdir, "r.py", STATIC_RENDERER)
    folder = cli.workdir / "taskcard"
    folder.mkdir()
    (folder / "watch.json").write_text(
        '{"watch_id": "tc_4", "renderer_path": "r.py", "interval_s": ' + HUGE_WHOLE + ","
        ' "timeout_s": 10, "max_refreshes": 10, "refreshes_used": 0,'
        ' "started_at": "2024-01-01T00:00:00Z"}'
    )
    (folder / "status").write_bytes(b"active")
    done = cli.run("card", "inspect", "tc_4", "--json")
    assert done.returncode == 1, done.stderr  # refused by a host that runs, not exit 4
    assert "not a watch of this host" in json.loads(done.stdout)["message"]
    assert not (folder / "watch.json").exists()
    assert (folder / "status").read_bytes() == b"inactive"


@pytest.fixture
def undecodable_workdir(tmp_path: Path, runtime_dir: Path) -> Iterator[CliHost]:
    """An agent folder whose name is not UTF-8 (Latin-1 `ÿ`), and `taskcard` for it."""
    workdir = Path(os.fsdecode(os.fsencode(tmp_path) + b"/agent-\xff"))
    workdir.mkdir()
    host = CliHost(workdir, runtime_dir)
    yield host
    host.shutdown()


async def test_a_workdir_whose_name_is_not_utf8_works_from_the_shell_and_mcp(
    undecodable_workdir: CliHost,
) -> None:
    """Every command on such a folder ended in a traceback (the host's socket name hashed the
    path as UTF-8), and the MCP server, once that was past, ended on the first result: its
    paths held surrogate escapes the SDK's writer cannot encode."""
    cli = undecodable_workdir
    write_renderer(cli.workdir, "r.py", STATIC_RENDERER)
    started = cli.run("card", "start", "r.py", "--interval-s", "3600")
    assert (started.returncode, started.stderr) == (0, ""), started.stdout
    assert cli.json("card", "stop", "tc_1")["status"] == "stopped"
    async with cli.mcp() as session:
        for arguments, status in (
            ({"action": "start", "input": {"renderer_path": "r.py"}}, "watching"),
            ({"action": "inspect", "input": {"watch_id": "tc_2"}}, "watching"),
            ({"action": "remove", "input": {}}, "removed"),
        ):
            result = await session.call_tool("task_card", {**arguments, "reasoning": "odd name"})
            answer = json.loads(result.content[0].text)  # type: ignore[union-attr]
            assert (answer["status"], result.is_error) == (status, False), answer
            assert answer["taskcard_dir"].endswith("/agent-\\xff/taskcard")  # the byte, shown
    assert not (cli.workdir / "taskcard" / "taskcard.md").exists()
