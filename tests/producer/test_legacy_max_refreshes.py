"""A legacy `telegram/taskcard.json` `max_refreshes` the product cannot take is named to the
owner, as a refused value of `taskcard/taskcard.json` is (the manual's max-refreshes section:
only a genuinely customised positive legacy ceiling is the migration's preview)."""

from __future__ import annotations

from pathlib import Path

import pytest

from .conftest import STATIC_RENDERER, CliHost, write_renderer


@pytest.mark.parametrize("value", ["5000000", "1e7", "0", "-3", "2.5", "true", '"300"'])
def test_a_legacy_max_refreshes_that_cannot_be_taken_is_named(
    value: str, workdir: Path, cli: CliHost
) -> None:
    """The legacy document's ceiling past 1,000,000 (or not a positive integer) is not
    migrated and the default stays in force: the owner is told so, naming the field, the
    value's problem and the fix, as for a refused value of taskcard.json."""
    (workdir / "telegram").mkdir()
    (workdir / "telegram" / "taskcard.json").write_text(f'{{"max_refreshes": {value}}}')
    shown = cli.json("card", "settings")
    rows = {row["key"]: row for row in shown["settings"]}
    assert rows["max-refreshes"]["current"] == 2000
    assert "telegram/taskcard.json" in rows["max-refreshes"]["comment"]
    (problem,) = shown["problems"]
    assert problem.startswith("telegram/taskcard.json max_refreshes: "), problem
    assert "use an integer from 1 to 1000000" in problem
    assert "not migrated" in problem and "the default 2000 is in force" in problem
    printed = cli.run("card", "settings")
    assert printed.returncode == 0
    assert f"  settings problem: {problem}" in printed.stdout.splitlines()
    # A start says it too, and migrates nothing.
    write_renderer(workdir, "r.py", STATIC_RENDERER)
    started = cli.json("card", "start", "r.py", "--interval-s", "3600")
    assert (started["status"], started["max_refreshes"]) == ("watching", 2000)
    assert started["settings_problems"] == [problem]
    assert not (workdir / "taskcard" / "taskcard.json").exists()


def test_the_untouched_or_a_good_legacy_max_refreshes_says_nothing(
    workdir: Path, cli: CliHost
) -> None:
    (workdir / "telegram").mkdir()
    for value, current in (("1000", 2000), ("1000000", 1_000_000), ("300.0", 300)):
        (workdir / "telegram" / "taskcard.json").write_text(f'{{"max_refreshes": {value}}}')
        shown = cli.json("card", "settings")
        assert "problems" not in shown, shown
        rows = {row["key"]: row for row in shown["settings"]}
        assert rows["max-refreshes"]["current"] == current
