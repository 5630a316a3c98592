"""`taskcard activity`: one well-formed line per call, clear errors for bad input."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest

from taskcard.bridge.compose.activity import movement_text
from taskcard.bridge.track.monitor import AgentMonitor, MemoryOffsetStore
from taskcard.producers.agent_hooks import activity_cli as activity
from taskcard.producers.task_card.contract import CardPaths, parse_event, parse_iso

REPO = Path(__file__).resolve().parents[2]


def run(workdir: Path, *argv: str) -> int:
    parser = argparse.ArgumentParser()
    subparsers = parser.add_subparsers(dest="command")
    activity.register(subparsers)
    try:
        args = parser.parse_args(["activity", "--workdir", str(workdir), *argv])
    except SystemExit as exc:  # a usage error, as the command line reports it
        assert isinstance(exc.code, int)
        return exc.code
    handler = args.handler
    result = handler(args)
    assert isinstance(result, int)
    return result


def lines(workdir: Path) -> list[dict[str, object]]:
    events = CardPaths(workdir).events
    if not events.exists():
        return []
    return [json.loads(line) for line in events.read_text().splitlines()]


def test_appends_typed_fields_and_a_utc_timestamp(tmp_path: Path) -> None:
    code = run(tmp_path, "tool.start", "call_id=7", "name=pytest", "summary=tests/ -q", "attempt=2")
    assert code == 0
    code = run(tmp_path, "tool.end", "call_id=7", "ok=true", "duration_s=1.5")
    assert code == 0
    first, second = lines(tmp_path)
    assert first["kind"] == "tool.start"
    assert first["call_id"] == "7"  # declared text fields stay text
    assert first["summary"] == "tests/ -q"
    assert first["attempt"] == 2
    assert second["ok"] is True
    assert second["duration_s"] == 1.5
    assert parse_iso(first["ts"]) is not None
    assert str(first["ts"]).endswith("Z")
    raw = CardPaths(tmp_path).events.read_bytes().splitlines()
    assert all(parse_event(line) is not None for line in raw)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["dance"], "KIND: unknown kind 'dance'; use one of agent.exit"),
        (["tool.start", "name=x"], "call_id: required for tool.start; add call_id=..."),
        (
            ["usage", "input_tokens=ten", "output_tokens=1"],
            "input_tokens: 'ten' is not a whole number",
        ),
        (["tool.end", "call_id=1", "ok=maybe"], "ok: must be true or false"),
        (["text", "oops"], "'oops': expected key=value"),
        (["text", "text=a", "ts=yesterday"], "ts: set by the command itself"),
        (["text", "text=a", "text=b"], "text: given twice"),
        (["agent.exit", "code=true"], "code: 'true' is not a whole number"),
        # Written before, then read by the service as unknown: the card showed nothing.
        (["usage", "input_tokens=-1", "output_tokens=2"], "input_tokens: -1 is out of range"),
        (["tool.end", "call_id=1", "ok=true", "duration_s=-3"], "duration_s: -3 is out of range"),
        (["agent.start", "pid=-5"], "pid: -5 is out of range"),
        # A typo of a field of the kind was carried as a field of its own, and the card
        # never showed the summary.
        (
            ["tool.start", "call_id=1", "name=x", "sumary=tests"],
            "sumary: not a field of tool.start; did you mean summary=...?",
        ),
        (["tool.end", "calll_id=1", "ok=true"], "calll_id: not a field of tool.end; did you"),
    ],
)
def test_bad_input_exits_2_naming_the_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    assert run(tmp_path, *argv) == 2
    assert message in capsys.readouterr().err
    assert lines(tmp_path) == []


def test_missing_workdir_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(tmp_path / "nope", "turn.start") == 2
    assert "--workdir" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("text", "value"),
    [("12", 12), ("-3", -3), ("1.5", 1.5), ("true", True), ("false", False), ("nan", "nan")],
)
def test_parse_value(text: str, value: object) -> None:
    assert activity.parse_value(text) == value


def test_written_events_feed_the_automatic_slot(tmp_path: Path) -> None:
    from datetime import UTC, datetime

    assert run(tmp_path, "turn.start") == 0
    assert run(tmp_path, "text", "text=compiling the kernel") == 0
    monitor = AgentMonitor("a", tmp_path, MemoryOffsetStore(), clock=lambda: datetime.now(UTC))
    # Written before the monitor existed: read from the tail at first sight.
    monitor.refresh()
    assert monitor.activity.state == "running"
    movement = monitor.activity.last_movement
    assert movement is not None and movement_text(movement) == "compiling the kernel"


def test_through_the_taskcard_command_line(tmp_path: Path) -> None:
    ok = subprocess.run(
        [
            sys.executable,
            "-m",
            "taskcard.bridge.cli",
            "activity",
            "--workdir",
            str(tmp_path),
            "text",
            "text=hello from a hook",
        ],
        capture_output=True,
        text=True,
        check=False,
        cwd=REPO,
    )
    assert ok.returncode == 0, ok.stderr
    assert lines(tmp_path)[0]["text"] == "hello from a hook"
    bad = subprocess.run(
        [
            sys.executable,
            "-m",
            "taskcard.bridge.cli",
            "activity",
            "--workdir",
            str(tmp_path),
            "usage",
        ],
        capture_output=True,
        text=True,
        check=False,
        cwd=REPO,
    )
    assert bad.returncode == 2
    assert "input_tokens, output_tokens: required for usage" in bad.stderr


def test_an_argument_that_is_not_utf8_exits_2_naming_the_field(tmp_path: Path) -> None:
    """A Latin-1 byte in a value (text read from a file of another encoding) arrives as a
    surrogate, which no line of the log can carry: the append failed with a traceback."""
    taskcard = str(Path(sys.executable).parent / "taskcard")
    argv = [taskcard, "activity", "--workdir", str(tmp_path), "text"]
    done = subprocess.run([*argv, b"text=caf\xe9"], capture_output=True, check=False)
    assert done.returncode == 2
    assert done.stderr.startswith(b"taskcard activity: text: not UTF-8 text")
    assert b"Traceback" not in done.stderr
    assert lines(tmp_path) == []
    assert subprocess.run([*argv, "text=café"], check=False).returncode == 0
    assert lines(tmp_path)[0]["text"] == "café"


def test_fields_of_ones_own_that_extend_a_fields_name_are_written(tmp_path: Path) -> None:
    """Only a misspelling of a kind's field is refused: `names=` or `oks=` are fields of
    their own that scripts wrote before the check, and still write."""
    assert run(tmp_path, "tool.start", "call_id=c1", "name=x", "names=a,b", "name_2=y") == 0
    assert run(tmp_path, "tool.end", "call_id=c1", "ok=true", "oks=3") == 0
    first, second = lines(tmp_path)
    assert (first["names"], first["name_2"], second["oks"]) == ("a,b", "y", 3)


@pytest.mark.parametrize("text", ["", "   ", "\u200b\u200d"], ids=["empty", "blank", "invisible"])
def test_a_text_event_that_shows_nothing_exits_2_naming_the_field(
    tmp_path: Path, text: str
) -> None:
    """`text text=` was written with exit 0, and the card showed nothing of it (the service
    reads a blank text as no movement): the caller never learnt that the line was useless."""
    taskcard = str(Path(sys.executable).parent / "taskcard")
    argv = [taskcard, "activity", "--workdir", str(tmp_path)]
    done = subprocess.run([*argv, "text", f"text={text}"], capture_output=True, text=True)
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("taskcard activity: text: must show text"), done.stderr
    assert lines(tmp_path) == []
    # A blank call_id or reason still does what its kind does (pairs a call, opens a wait),
    # so those lines are written as before.
    for kind, fields in (("tool.start", ["call_id=", "name=pytest"]), ("wait.start", ["reason="])):
        assert subprocess.run([*argv, kind, *fields], check=False).returncode == 0
    assert [line["kind"] for line in lines(tmp_path)] == ["tool.start", "wait.start"]
