"""A path in a hook payload that holds a NUL character, which no path can, is named as such:
a `transcript_path` holding one was dropped without a word, as if the host had sent none, and
a `cwd` holding one under `taskcard hook codex --only-in` was passed over as another project's
session. The hook still exits 0 and prints nothing to its host."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from .conftest import FIXTURES, hook, kinds, payload, run_taskcard
from .test_codex_hooks import codex_hook, codex_payload

TRANSCRIPT_NUL = "/tmp/a\0b.jsonl"


def hook_log(workdir: Path) -> list[str]:
    path = workdir / "logs" / "taskcard-hook.log"
    return path.read_text().splitlines() if path.exists() else []


def said_of_transcript(workdir: Path) -> str:
    """The one line of the hook log, without its time stamp."""
    (line,) = hook_log(workdir)
    return line.split(" ", 1)[1]


EXPECTED = (
    f"HookInputError: the payload's transcript_path {json.dumps(TRANSCRIPT_NUL)} holds a NUL"
    " character, which no path can; the event is written without the turn's token usage"
    " (send the transcript's path)"
)


def test_a_claude_code_transcript_path_holding_nul_is_named_and_the_turn_still_ends(
    workdir: Path,
) -> None:
    shutil.copy(FIXTURES / "claude_code" / "transcript.jsonl", workdir / "transcript.jsonl")
    done = hook(payload("10_stop.json", workdir, transcript_path=TRANSCRIPT_NUL))
    assert (done.returncode, done.stdout, done.stderr) == (0, b"", b"")
    assert kinds(workdir) == ["turn.end"]
    assert said_of_transcript(workdir) == EXPECTED


def test_a_codex_transcript_path_holding_nul_is_named_and_the_turn_still_ends(
    workdir: Path,
) -> None:
    done = codex_hook(codex_payload("06_stop.json", workdir, transcript_path=TRANSCRIPT_NUL))
    assert (done.returncode, done.stdout, done.stderr) == (0, b"", b"")
    assert kinds(workdir) == ["turn.end"]
    assert said_of_transcript(workdir) == EXPECTED


@pytest.mark.parametrize("given", [["/tmp/t.jsonl"], 7, {"path": "/tmp/t.jsonl"}])
def test_a_transcript_path_that_is_no_string_is_named_too(workdir: Path, given: object) -> None:
    done = hook(payload("10_stop.json", workdir, transcript_path=given))
    assert (done.returncode, done.stdout, done.stderr) == (0, b"", b"")
    assert kinds(workdir) == ["turn.end"]
    assert said_of_transcript(workdir) == (
        f"HookInputError: the payload's transcript_path {json.dumps(given)} is not a path (a"
        " string); the event is written without the turn's token usage (send the"
        " transcript's path)"
    )


def test_a_transcript_path_is_only_looked_at_when_a_turn_ends(workdir: Path) -> None:
    """Every event carries it; only a turn's end reads it, so only that one says so."""
    done = hook(payload("02_user_prompt_submit.json", workdir, transcript_path=TRANSCRIPT_NUL))
    assert (done.returncode, done.stdout, done.stderr) == (0, b"", b"")
    assert kinds(workdir) == ["turn.start"] and hook_log(workdir) == []


@pytest.mark.parametrize("name", ["/tmp/a\0b", "\0/tmp"])
def test_only_in_says_a_cwd_holding_nul_as_without_it(workdir: Path, name: str) -> None:
    """Under `--only-in` (hooks every project runs) a `cwd` holding NUL names no folder,
    this workdir's or another's: it is said on stderr in the line the hook says without
    `--only-in`, not passed over in silence, and nothing is written."""
    data = json.dumps(codex_payload("02_user_prompt_submit.json", workdir, cwd=name))
    plain = run_taskcard("hook", "codex", stdin=data)
    only_in = run_taskcard("hook", "codex", "--only-in", str(workdir), stdin=data)
    assert (only_in.returncode, only_in.stdout) == (0, b"")
    (line,) = only_in.stderr.decode().splitlines()
    assert only_in.stderr == plain.stderr
    assert line == (
        f"taskcard hook codex: the payload's cwd {json.dumps(name)} holds a NUL character,"
        " which no path can; nothing written (send the session's folder, or pass --workdir)"
    )
    assert kinds(workdir) == [] and hook_log(workdir) == []
