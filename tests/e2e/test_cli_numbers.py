"""Every numeric option of every command reads ASCII digits only, through one converter.

Options typed with Python's `int` and `float` took `１０` (full-width digits), `٣` (Arabic-Indic),
`1_0` and ` 3` as 10, 3, 10 and 3. Driven as a user at a shell: `taskcard` run as a process,
each option given a number in one of those forms, which is a usage error (exit 2) naming the
option and the form expected; ASCII digits with a sign still work.

An integer option refused `2.0` too, which every JSON way in (MCP tool arguments, envelopes,
settings) takes for an integer field: each integer option now takes a whole number written in
a float's form as that int, and refuses a fraction, NaN or an infinity naming itself and the fix.
"""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from taskcard.bridge.cli import build_parser

from .test_cli import taskcard

# Option readers that take text, not a number (a workdir, a log level, a version).
TEXT_READERS = {
    "workdir_arg",
    "existing_workdir_arg",
    "writable_workdir_arg",
    "_one_of.<locals>.parse",
    "_version_arg",
    "config_path",
    "runtime_dir_arg",
    "codex_config_arg",
    "demo_dir_arg",
    "_spawn_folder_arg.<locals>.read",
}
WHOLE = "is not a whole number; write ASCII digits 0-9 with an optional sign, e.g. 10"
SEQ = "is not a seq (the last one you read); write ASCII digits 0-9 with an optional sign"
# A float option may name what it counts ("is not a number of seconds; write ...").
DECIMAL = re.compile(
    r"is not a number( of seconds)?; write ASCII digits 0-9 with an optional sign, decimal"
    r" point and exponent, e\.g\. 2\.5"
)
# Each command's positional arguments and required options, so only the number is wrong.
REQUIRED = {
    ("card", "start"): ["r.py"],
    ("card", "inspect"): ["tc_1"],
    ("card", "retry"): ["tc_1"],
    ("card", "stop"): ["tc_1"],
    ("ledger", "init"): ["t", "--purpose", "p"],
    ("ledger", "checkpoint"): ["t", "--event-type", "DOWNLOAD_OBSERVED", "--name", "d"],
    ("ledger", "external-job"): ["t", "--job-id", "j", "--status", "running"],
    ("ledger", "download-observed"): ["t", "--name", "d"],
    ("spawn",): ["--parent", "p", "--reason", "r"],
}
# Whole numbers as Python's `int` reads them, and floats as `float` does, none typed in ASCII.
NOT_WHOLE = ["１０", "٣", "1_0", " 3", "3\t", "+ 3", "0x10", "3.0.0"]
# A whole number in a float's form, taken by an integer option as JSON's integer fields take
# it; and floats that are no whole number, refused with the fix (the words after the value).
WHOLE_FLOATS = ["2.0", "1e3", "+3.0", "0.5E1", "7."]
NO_WHOLE_FLOATS = [
    ("2.5", "drop the fraction"),
    ("1e-3", "drop the fraction"),
    ("nan", "give a finite whole number"),
    ("-Infinity", "give a finite whole number"),
    ("1e400", "give a finite whole number"),
    # An exponent past what a decimal holds: a traceback once read exactly.
    ("1e9999999999999999999999", "give a finite whole number"),
    # Read exactly, not through a float (which took it as 2).
    ("2.0000000000000001", "drop the fraction"),
]
NOT_DECIMAL = ["１.5", "٣", "1_0.5", " 2", "2 ", "2,5", "0x10", "1e"]


def numeric_readers() -> Iterator[tuple[tuple[str, ...], str, str]]:
    """(command words, option, reader's name) for every option read as a number, found by
    walking the parser: an option added later is covered without editing this test."""

    def walk(
        parser: argparse.ArgumentParser, words: tuple[str, ...]
    ) -> Iterator[tuple[tuple[str, ...], str, str]]:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    yield from walk(sub, (*words, name))
            elif action.type is not None and action.type is not str:
                reader = getattr(action.type, "__qualname__", repr(action.type))
                if reader not in TEXT_READERS:
                    yield words, action.option_strings[0], reader

    yield from walk(build_parser(), ())


READERS = sorted(numeric_readers())
OPTIONS = [
    (words, option, reader in ("whole_number", "_seq", "int")) for words, option, reader in READERS
]


def test_the_walk_finds_every_kind_of_numeric_option() -> None:
    plain = [(words, option) for words, option, reader in READERS if reader in ("int", "float")]
    assert plain == [], "an option read by Python's int or float takes other scripts' digits"
    found = {(" ".join(words), option) for words, option, _ in OPTIONS}
    assert {
        ("spawn", "--max-depth"),
        ("reports", "--after"),
        ("card start", "--max-refreshes"),
        ("card start", "--interval-s"),
        ("ledger init", "--max-nudges"),
        ("ledger download-observed", "--bytes"),
        ("ledger external-job", "--max-wait-sec"),
        ("host", "--ledger-check-s"),
        ("tool", "--idle-grace-s"),
        ("demo", "--duration"),
    } <= found
    assert len(OPTIONS) >= 30


@pytest.mark.parametrize(
    ("words", "option", "whole"), OPTIONS, ids=[f"{' '.join(w)} {o}" for w, o, _ in OPTIONS]
)
def test_a_number_not_in_ascii_digits_is_a_usage_error_naming_the_option(
    tmp_path: Path, words: tuple[str, ...], option: str, whole: bool
) -> None:
    values = NOT_WHOLE if whole else NOT_DECIMAL
    # One form per option, each form by several options: every form and every option is
    # tried without running each option once per form.
    value = values[OPTIONS.index((words, option, whole)) % len(values)]
    where = [] if words[0] == "demo" else ["--workdir", str(tmp_path)]
    result = taskcard(*words, *REQUIRED.get(words, []), *where, f"{option}={value}")
    assert result.returncode == 2, (result.stdout, result.stderr)
    named = f"argument {option}: {value!r} "
    assert named in result.stderr, result.stderr
    form = result.stderr.split(named, 1)[1]
    if not whole:
        assert DECIMAL.match(form), result.stderr
    else:
        assert form.startswith(SEQ if option == "--after" else WHOLE), result.stderr
    assert result.stderr.count("\n") == 1 and result.stdout == "", result.stderr
    assert list(tmp_path.iterdir()) == []  # nothing was written or started


@pytest.mark.parametrize("value", NOT_WHOLE)
def test_every_form_is_refused_by_an_integer_option(tmp_path: Path, value: str) -> None:
    (tmp_path / "child").mkdir()
    child = ("--workdir", str(tmp_path / "child"), "--parent", "p", "--reason", "r")
    result = taskcard("spawn", *child, f"--max-depth={value}")
    assert result.returncode == 2, result.stderr
    assert f"argument --max-depth: {value!r} {WHOLE}" in result.stderr
    assert not (tmp_path / "child" / "lineage.json").exists()


def test_ascii_digits_with_a_sign_still_work(tmp_path: Path) -> None:
    (tmp_path / "child").mkdir()
    child = ("--workdir", str(tmp_path / "child"), "--parent", "p", "--reason", "r")
    spawned = taskcard("spawn", *child, "--max-depth", "+2")
    assert spawned.returncode == 0, spawned.stderr
    common = ("--workdir", str(tmp_path))
    created = taskcard(
        "ledger", "init", "t", "--purpose", "p", "--max-nudges", "07", "--timeout-sec", "1.5e3",
        "--no-renderer", *common,
    )  # fmt: skip
    assert created.returncode == 0, created.stderr
    seen = taskcard("ledger", "download-observed", "t", "--name", "d", "--bytes", "+10", *common)
    assert seen.returncode == 0, seen.stderr
    shown = json.loads(taskcard("ledger", "show", "t", *common).stdout)
    assert shown["task"]["limits"]["max_nudges"] == 7
    assert shown["task"]["limits"]["timeout_sec"] == 1500.0
    assert shown["observed"]["downloads"][0]["observed_bytes"] == 10
    # A negative seq still meets its own range check, not the form's.
    after = taskcard("reports", "--after", "-1", *common)
    assert after.returncode == 2 and "--after: -1 is out of range" in after.stderr, after.stderr


@pytest.mark.parametrize("value", ["１０", "1_0", " 3"])
def test_an_activity_field_reads_numbers_as_the_options_do(tmp_path: Path, value: str) -> None:
    """`taskcard activity usage input_tokens=１０` was written as 10: the integer field now
    meets the text as given and refuses it, naming the field."""
    result = taskcard(
        "activity", "--workdir", str(tmp_path), "usage", "output_tokens=1", f"input_tokens={value}"
    )
    assert result.returncode == 2, result.stderr
    assert f"input_tokens: {value!r} is not a whole number; write ASCII digits" in result.stderr
    assert not (tmp_path / "logs").exists()


def test_an_activity_count_takes_what_an_integer_option_takes(tmp_path: Path) -> None:
    """`input_tokens=1e3` was refused as "must be an integer for usage, got 1000.0" where
    `--max-refreshes 1e3` is 1000, `true` as "got True", and `2.0000000000000001` shown as
    2.0: a count reads its text as every integer option does, exactly."""
    for value, fix in (
        ("true", "write ASCII digits 0-9 with an optional sign, e.g. 10"),
        ("1.5", "drop the fraction"),
        ("2.0000000000000001", "drop the fraction"),
        ("1e400", "give a finite whole number"),
        ("-1e9999999999999999999999", "give a finite whole number"),
    ):
        result = taskcard("activity", "--workdir", str(tmp_path), "usage", f"input_tokens={value}")
        assert result.returncode == 2, result.stderr
        said = f"taskcard activity: input_tokens: {value!r} is not a whole number; {fix}\n"
        assert result.stderr == said
    assert not (tmp_path / "logs").exists()
    written = taskcard(
        "activity", "--workdir", str(tmp_path), "usage", "input_tokens=1e3", "output_tokens=7.0"
    )
    assert written.returncode == 0, written.stderr
    record = json.loads((tmp_path / "logs" / "events.jsonl").read_text())
    assert (record["input_tokens"], record["output_tokens"]) == (1000, 7)


WHOLE_OPTIONS = [(words, option) for words, option, whole in OPTIONS if whole]


@pytest.mark.parametrize(
    ("words", "option"), WHOLE_OPTIONS, ids=[f"{' '.join(w)} {o}" for w, o in WHOLE_OPTIONS]
)
def test_an_integer_option_takes_a_whole_float_and_refuses_any_other_naming_itself(
    tmp_path: Path, words: tuple[str, ...], option: str
) -> None:
    """Each integer option of every command (the walk above finds them all) reads `2.0` as
    an MCP tool or an envelope reads it. An unknown option after it shows the value passed:
    the command stops at that option, nothing runs."""
    index = WHOLE_OPTIONS.index((words, option))
    base = [*words, *REQUIRED.get(words, []), "--workdir", str(tmp_path)]
    value = WHOLE_FLOATS[index % len(WHOLE_FLOATS)]
    taken = taskcard(*base, f"{option}={value}", "--no-such-option")
    assert taken.returncode == 2, taken.stderr
    assert ": unrecognized arguments: --no-such-option; see `taskcard " in taken.stderr
    assert "argument " not in taken.stderr, taken.stderr
    value, fix = NO_WHOLE_FLOATS[index % len(NO_WHOLE_FLOATS)]
    refused = taskcard(*base, f"{option}={value}")
    assert refused.returncode == 2, refused.stderr
    named = f"argument {option}: {value!r} is not a {'seq' if option == '--after' else 'whole'}"
    assert named in refused.stderr, refused.stderr
    assert f"; {fix}; see `taskcard " in refused.stderr, refused.stderr
    assert list(tmp_path.iterdir()) == []  # nothing was written or started


def test_whole_floats_are_taken_as_their_int(tmp_path: Path) -> None:
    (tmp_path / "child").mkdir()
    child = ("--workdir", str(tmp_path / "child"), "--parent", "p", "--reason", "r")
    spawned = taskcard("spawn", *child, "--max-depth", "2.0")  # a float is refused by spawn
    assert spawned.returncode == 0, spawned.stderr
    common = ("--workdir", str(tmp_path))
    created = taskcard(
        "ledger", "init", "t", "--purpose", "p", "--max-nudges", "7.0", "--max-retries", "3e0",
        "--no-renderer", *common,
    )  # fmt: skip
    assert created.returncode == 0, created.stderr
    seen = taskcard("ledger", "download-observed", "t", "--name", "d", "--bytes", "1e3", *common)
    assert seen.returncode == 0, seen.stderr
    shown = json.loads(taskcard("ledger", "show", "t", *common).stdout)
    limits = shown["task"]["limits"]
    assert (limits["max_nudges"], limits["max_retries"]) == (7, 3)
    assert type(limits["max_nudges"]) is int and type(limits["max_retries"]) is int
    observed = shown["observed"]["downloads"][0]["observed_bytes"]
    assert observed == 1000 and type(observed) is int
    # Read exactly: through a float this was a petabyte, the fraction lost.
    inexact = "999999999999999.99999"
    refused = taskcard(
        "ledger", "download-observed", "t", "--name", "e", "--bytes", inexact, *common
    )
    assert refused.returncode == 2
    assert f"--bytes: {inexact!r} is not a whole number; drop the fraction" in refused.stderr
    shown = json.loads(taskcard("ledger", "show", "t", *common).stdout)
    assert [d["observed_bytes"] for d in shown["observed"]["downloads"]] == [1000]
