"""The turn's origin on the producer side: the form, `taskcard activity`, the hook adapters."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from taskcard.producers.task_card.contract import ORIGIN_FORMS, Origin, parse_origin
from tests.hooks.conftest import TASKCARD, events, payload


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("telegram:-1001234567890", Origin("telegram", "-1001234567890")),
        ("telegram:-1001234567890:42", Origin("telegram", "-1001234567890", "42")),
        ("telegram:123456", Origin("telegram", "123456")),
        ("feishu:oc_abc123", Origin("feishu", "oc_abc123")),
    ],
)
def test_valid_origins_parse_and_print_back(text: str, expected: Origin) -> None:
    assert parse_origin(text) == expected
    assert str(expected) == text


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("slack:C123", "names no known channel"),
        ("console:console", "names no known channel"),
        ("telegram", "integer ids"),
        ("telegram:", "integer ids"),
        ("telegram:abc", "integer ids"),
        ("telegram:-100:1:2", "integer ids"),
        ("telegram:0", "out of range"),
        ("telegram:99999999999999999", "integer ids"),
        ("telegram:-100123:0", "topic id"),
        ("telegram:-100123:x", "topic id"),
        ("feishu:oc_abc:7", "no topic"),
        ("feishu:oc abc", "feishu:<chat id>"),
        ("feishu:", "feishu:<chat id>"),
        ("", "names no known channel"),
    ],
)
def test_invalid_origins_say_what_is_wrong(text: str, says: str) -> None:
    problem = parse_origin(text)
    assert isinstance(problem, str) and says in problem


def test_a_non_text_origin_is_refused() -> None:
    assert (
        parse_origin(12)
        == "must be text written telegram:<chat id>[:<topic id>] or feishu:<chat id>"
    )


@pytest.mark.parametrize("origin", ["slack:C123", "telegram:abc", "feishu:oc_abc:7"])
def test_a_refused_origin_names_the_forms_once(tmp_path: Path, origin: str) -> None:
    """`origin=slack:C1` was told "write FORMS (forms: FORMS)", the same forms twice."""
    done = activity(tmp_path, "turn.start", f"origin={origin}")
    assert done.returncode == 2
    assert done.stderr.count(ORIGIN_FORMS) == 1, done.stderr


def activity(workdir: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [TASKCARD, "activity", "--workdir", str(workdir), *argv],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_activity_writes_turn_start_with_an_origin(tmp_path: Path) -> None:
    done = activity(tmp_path, "turn.start", "origin=telegram:-1001234567890:42")
    assert done.returncode == 0, done.stderr
    assert done.stdout == ""
    [line] = events(tmp_path)
    assert line["kind"] == "turn.start" and line["origin"] == "telegram:-1001234567890:42"


def test_activity_writes_turn_origin_and_requires_its_origin(tmp_path: Path) -> None:
    assert activity(tmp_path, "turn.origin", "origin=feishu:oc_abc123").returncode == 0
    missing = activity(tmp_path, "turn.origin")
    assert missing.returncode == 2
    assert "origin: required for turn.origin" in missing.stderr
    assert [e["origin"] for e in events(tmp_path)] == ["feishu:oc_abc123"]


def test_activity_refuses_a_malformed_origin_naming_the_field(tmp_path: Path) -> None:
    done = activity(tmp_path, "turn.start", "origin=telegram:general")
    assert done.returncode == 2
    assert done.stderr.startswith("taskcard activity: origin: ")
    assert "telegram:<chat id>[:<topic id>]" in done.stderr
    assert events(tmp_path) == []


def hook_with_env(
    data: dict[str, object], origin: str | None
) -> subprocess.CompletedProcess[bytes]:
    env = {k: v for k, v in os.environ.items() if k != "TASKCARD_ORIGIN"}
    if origin is not None:
        env["TASKCARD_ORIGIN"] = origin
    return subprocess.run(
        [TASKCARD, "hook", "claude-code"],
        input=json.dumps(data).encode(),
        capture_output=True,
        timeout=120,
        check=False,
        env=env,
    )


def test_the_claude_code_hook_copies_taskcard_origin_into_turn_start(tmp_path: Path) -> None:
    (tmp_path / "taskcard").mkdir()  # an agent's workdir, which the hook writes into
    done = hook_with_env(
        payload("02_user_prompt_submit.json", tmp_path), "telegram:-1001234567890:42"
    )
    assert done.returncode == 0 and done.stderr == b""
    [line] = events(tmp_path)
    assert line["kind"] == "turn.start" and line["origin"] == "telegram:-1001234567890:42"
    # Other events never carry it.
    hook_with_env(payload("03_pre_tool_use.json", tmp_path), "telegram:-1001234567890:42")
    assert "origin" not in events(tmp_path)[-1]


def test_an_invalid_taskcard_origin_is_logged_and_the_turn_still_written(tmp_path: Path) -> None:
    (tmp_path / "taskcard").mkdir()  # an agent's workdir, which the hook writes into
    done = hook_with_env(payload("02_user_prompt_submit.json", tmp_path), "telegram:our-group")
    assert done.returncode == 0 and done.stdout == b"" and done.stderr == b""
    [line] = events(tmp_path)
    assert line["kind"] == "turn.start" and "origin" not in line
    log = (tmp_path / "logs" / "taskcard-hook.log").read_text()
    assert "TASKCARD_ORIGIN" in log and "turn written without it" in log
