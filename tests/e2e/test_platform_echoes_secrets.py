"""A platform's error answer that echoes the bot token (a proxy or API front end quoting the
request URL) never puts the token into the service log or `taskcard status`, whatever case
the client library gave the description."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.e2e.harness import eventually, publish, run_cli
from tests.e2e.test_serve_telegram import GROUP, PRIVATE, agent_dir, setup, shown
from tests.fakes.telegram_api import FakeTelegram


@pytest.fixture
async def fake() -> AsyncIterator[FakeTelegram]:
    async with FakeTelegram() as server:
        yield server


@pytest.mark.parametrize(
    ("status", "description", "logged"),
    [
        # PTB strips "Bad Request: " and capitalizes the rest, which lowercases the token.
        (
            400,
            "Bad Request: odd answer for https://api.example/bot{token}/editMessageText",
            "refused this card for good",
        ),
        (403, "Forbidden: bot{token} may not post here", "disabled"),
    ],
)
async def test_a_token_echoed_in_an_error_answer_is_never_logged_or_shown(
    tmp_path: Path, fake: FakeTelegram, status: int, description: str, logged: str
) -> None:
    serve = setup(tmp_path, fake, ["a", "b"], [(GROUP, ["a"]), (PRIVATE, ["b"])])
    with serve:
        publish(agent_dir(tmp_path, "a"), "first body")
        await eventually(lambda: any("first body" in t for t in shown(fake, GROUP)), what="card")
        fake.fail_chat(GROUP, status, description.format(token=fake.token))
        publish(agent_dir(tmp_path, "a"), "second body")
        await eventually(lambda: logged in serve.logs, timeout_s=60, what="the refusal logged")
        publish(agent_dir(tmp_path, "b"), "other route")
        await eventually(lambda: any("other route" in t for t in shown(fake, PRIVATE)), what="b")
        status_out = run_cli("status", "--config", str(serve.config))
        assert await serve.aterminate() == 0
    secret = fake.token.split(":", 1)[1].lower()
    assert secret not in serve.logs.lower()
    assert secret not in (status_out.stdout + status_out.stderr).lower()
    assert "[secret]" in serve.logs or "<token>" in serve.logs or "[redacted]" in serve.logs
