"""What `taskcard card` says to the person at the terminal about a watch id it does not know
and about why a watch stopped, through the real command line: an unknown id was answered
"call remove to clear the card without an id" whatever the action (an `inspect` of a mistyped
id was pointed at deleting the card), and a stopped watch read `stopped: stopped`."""

from __future__ import annotations

import pytest

from taskcard.producers.task_card.cli import summarize

from .conftest import STATIC_RENDERER, CliHost, write_renderer

UNKNOWN = "  watch_id: 'tc_9' is not a watch of this host"


def summary(cli: CliHost, *args: str) -> tuple[int, list[str]]:
    done = cli.run("card", *args)
    assert done.stderr == "", done.stderr
    return done.returncode, done.stdout.splitlines()


@pytest.mark.parametrize(
    ("action", "fix"),
    [
        ("inspect", "nothing to inspect; call start, whose result names the watch's id"),
        ("retry", "nothing to retry; call start, whose result names the watch's id"),
        ("stop", "nothing runs to stop; call remove to clear a card left without an id"),
    ],
)
def test_an_unknown_id_on_a_host_without_watches_says_where_an_id_comes_from(
    cli: CliHost, action: str, fix: str
) -> None:
    code, lines = summary(cli, action, "tc_9")
    assert code == 1
    assert lines == [f"{action}: failed", f"{UNKNOWN}, which has no watch: {fix}"]


def test_an_unknown_id_names_the_known_ones_and_the_step_that_fits_each_action(
    cli: CliHost,
) -> None:
    write_renderer(cli.workdir, "r.py", STATIC_RENDERER)
    assert cli.json("card", "start", "r.py", "--interval-s", "3600")["watch_id"] == "tc_1"
    known = f"{UNKNOWN} (known: tc_1); "
    assert summary(cli, "inspect", "tc_9") == (
        1,
        ["inspect: failed", known + "inspect one of those ids (start's result names each)"],
    )
    assert summary(cli, "retry", "tc_9") == (
        1,
        ["retry: failed", known + "only the latest can be retried: retry tc_1"],
    )
    assert summary(cli, "stop", "tc_9") == (
        1,
        ["stop: failed", known + "the running one is tc_1: stop tc_1"],
    )
    assert cli.json("card", "stop", "tc_1")["status"] == "stopped"
    assert (
        summary(cli, "stop", "tc_9")[1][1] == known + "none is running, so there is nothing to stop"
    )
    assert cli.json("card", "remove")["status"] == "removed"
    assert summary(cli, "retry", "tc_9")[1][1] == (
        known + "none can be retried, its card was removed: call start for a new watch"
    )


def test_a_stopped_watch_says_why_in_words(cli: CliHost) -> None:
    write_renderer(cli.workdir, "r.py", STATIC_RENDERER)
    started = cli.json("card", "start", "r.py", "--interval-s", "3600", "--max-refreshes", "1")
    assert started["status"] == "watching"
    code, lines = summary(cli, "stop", "tc_1")
    assert code == 0 and lines[0] == "stop: stopped (watch tc_1)"
    assert "  why it stopped: a stop or remove call" in lines
    assert not [line for line in lines if "stopped: stopped" in line]
    assert cli.json("card", "retry", "tc_1")["status"] == "exhausted"  # its one refresh
    code, lines = summary(cli, "inspect", "tc_1")
    assert code == 0 and lines[0] == "inspect: exhausted (watch tc_1)"
    assert "  why it stopped: its refresh budget is used up; start a new watch to go on" in lines
    assert not [line for line in lines if "max_refreshes" in line]


@pytest.mark.parametrize(
    ("reason", "shown"),
    [
        ("stopped", "a stop or remove call"),
        ("max_refreshes", "its refresh budget is used up; start a new watch to go on"),
        ("workdir_gone", "its workdir was deleted"),
        # One a later host may add reads as given, on one line without escapes.
        ("paused\nby \u202ex", "paused by x"),
    ],
)
def test_every_stop_reason_reads_as_words(reason: str, shown: str) -> None:
    """`workdir_gone` is never seen through `card` (its --workdir is gone with the folder),
    but the summary is the same function for every reason."""
    text = summarize({"action": "inspect", "status": "stopped", "stop_reason": reason})
    assert text.splitlines()[1] == f"  why it stopped: {shown}"
