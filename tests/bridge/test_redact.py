"""Secrets never reach a chat; ordinary prose and paths pass unchanged."""

from __future__ import annotations

import pytest

from bridge.compose.redact import MARKER, redact

SECRET_CASES = [
    ("bot 123456789:AAHdqTcvCH1vGWJxfSeofSAs0K5PALDsaw0 ok", "123456789:AAHdqTcv"),
    ("key sk-proj-abcdefghijklmnop1234567890 used", "sk-proj-abc"),
    ("OPENAI sk-ant-api03-abcdefghijklmnopqrst", "sk-ant-api03"),
    ("push with ghp_abcdefghijklmnopqrstuvwxyz0123456789", "ghp_abcdef"),
    ("github_pat_11ABCDEFG0123456789_abcdefghijklmnop", "github_pat_11ABC"),
    ("slack xoxb-123456789012-abcdefghijkl", "xoxb-1234"),
    ("aws AKIAIOSFODNN7EXAMPLE here", "AKIAIOSFODNN7EXAMPLE"),
    ("g AIzaSyA1234567890abcdefghijklmnopqrstuv", "AIzaSyA123"),
    ("Authorization: Bearer abc.def-ghi_jkl012345", "abc.def-ghi"),
    (
        "jwt eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0"
        ".dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U",
        "eyJzdWIi",
    ),
    ("password=hunter22 in the env", "hunter22"),
    ("DB_PASSWORD: s3cr3t-value", "s3cr3t-value"),
    ('{"api_key": "abcd1234efgh"}', "abcd1234efgh"),
    ("token=zzz999yyy", "zzz999yyy"),
    ("client_secret=verysecretvalue", "verysecretvalue"),
    ("clone https://alice:pa55word@example.com/repo.git", "pa55word"),
    ("db postgres://svc:Tr0ub4dor@db.internal:5432/app", "Tr0ub4dor"),
]


@pytest.mark.parametrize(("text", "secret"), SECRET_CASES)
def test_secrets_are_replaced_by_a_visible_marker(text: str, secret: str) -> None:
    result = redact(text)
    assert secret not in result
    assert MARKER in result


def test_context_around_a_secret_is_kept() -> None:
    assert redact("clone https://alice:pa55@example.com/x") == (
        f"clone https://alice:{MARKER}@example.com/x"
    )
    assert redact("password=hunter22 done") == f"password={MARKER} done"
    assert redact("Authorization: Bearer abcdefghijk") == f"Authorization: Bearer {MARKER}"


PLAIN_CASES = [
    "Running pytest on tests/bridge/test_agent.py (42 passed)",
    "/home/user/project/src/tokenizer.py:120: refactor the token counter",
    "The password policy needs review; see docs/security.md",
    "Deploying to https://example.com/app/v2 at 14:02 UTC",
    "tokens this turn: 12.3k in, 4.5k out",
    "commit 3f2a9c1d4e5b6a7c8d9e0f1a2b3c4d5e6f7a8b9c merged",
    "skip-the-secret-handling step is done",
    "ratio 12:34 and time 10:15:00",
    "Use `make check` before pushing; ask the author.",
]


@pytest.mark.parametrize("text", PLAIN_CASES)
def test_ordinary_prose_and_paths_are_unchanged(text: str) -> None:
    assert redact(text) == text


def test_redaction_is_idempotent() -> None:
    once = redact("token=abc123456 and sk-abcdefghijklmnopqrstu")
    assert redact(once) == once
