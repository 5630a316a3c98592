"""Where a JSON document an agent or its host wrote breaks, in words a person can act on.

Python words a raw control character in a string "Invalid control character at", with an
"at" of its own, and the hook's log line, `taskcard init`'s refusal and the settings' reason
each added "at line ...": they read "invalid control character at at line 1, column 17".
Driven through the real commands.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from .conftest import hook, run_taskcard

# A tab typed into a string: a raw control character, which JSON does not allow there.
BROKEN = '{"cwd": "a\tb"}'
SAID = "invalid control character at line 1, column 11"


def test_the_hook_says_where_its_payload_breaks_once(workdir: Path) -> None:
    payload = json.dumps({"hook_event_name": "Stop", "cwd": str(workdir)})
    raw = payload[:-1] + ', "note": "a\x01b"}'
    done = hook(raw.encode())
    assert done.returncode == 0
    column = len(payload[:-1] + ', "note": "a') + 1
    assert done.stderr.decode().splitlines() == [
        "taskcard hook claude-code: payload is not JSON: invalid control character at line 1,"
        f" column {column}; nothing written"
    ]


def test_init_says_where_a_settings_file_breaks_once(workdir: Path) -> None:
    settings = workdir / ".claude" / "settings.json"
    settings.parent.mkdir()
    settings.write_text(BROKEN)
    done = run_taskcard("init", "claude-code", "--workdir", str(workdir))
    assert done.returncode == 2
    assert f"not valid JSON ({SAID}); fix or move it" in done.stderr.decode()
    assert settings.read_text() == BROKEN


def test_card_settings_says_where_taskcard_json_breaks_once(workdir: Path) -> None:
    (workdir / "taskcard").mkdir(exist_ok=True)
    (workdir / "taskcard" / "taskcard.json").write_text('{"interval_s": "a\tb"}')
    done = subprocess.run(
        [sys.executable, "-m", "taskcard.bridge.cli", "card", "settings"],
        cwd=workdir,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 1
    assert "is not valid JSON: invalid control character at line 1, column 18." in done.stdout
