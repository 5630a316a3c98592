"""`taskcard card settings` on a `taskcard/taskcard.json` that cannot be read as a JSON object,
through the real command line (no host is started): the refusal says why, not only that the
document "is not valid JSON"."""

from __future__ import annotations

import pytest

from .conftest import CliHost

UNAVAILABLE = "  effective settings are unavailable: taskcard/taskcard.json "


@pytest.mark.parametrize(
    ("written", "why"),
    [
        (b"", "is empty; write a JSON object (such as {})"),
        (b" \n", "is empty; write a JSON object (such as {})"),
        (b'{"interval_s": "a\xffb"}', "is not UTF-8 (byte 18, counting from 1); save it as UTF-8"),
        (b'{"interval_s": 5}\0', "is not valid JSON: extra data at line 1, column 18"),
        (b'{"interval_s": 5,', "is not valid JSON: it ends before the object is complete"),
        (b"[" * 100_000, "nests too deeply to read"),
        (
            b'{"interval_s": ' + b"9" * 100_000 + b"}",
            "holds a number of over 4300 digits, more than can be read; shorten it",
        ),
    ],
)
def test_a_settings_file_that_cannot_be_read_says_why(
    cli: CliHost, written: bytes, why: str
) -> None:
    """It was "is not valid JSON" whatever was wrong: an empty file, bytes that are not
    UTF-8, a NUL, a number too long for Python to read, a document nested too deeply."""
    (cli.workdir / "taskcard").mkdir()
    (cli.workdir / "taskcard" / "taskcard.json").write_bytes(written)
    done = cli.run("card", "settings")
    assert (done.returncode, done.stderr) == (1, "")
    assert done.stdout.splitlines() == [
        "settings: failed",
        f"{UNAVAILABLE}{why}. No rows are shown; fix or delete taskcard/taskcard.json, then"
        " call settings again",
    ]
