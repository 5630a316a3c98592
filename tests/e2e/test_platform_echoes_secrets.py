"""A platform's error answer that echoes the bot token (a proxy or API front end quoting the
request URL) never puts the token into the service log or `taskcard status`, whatever case
the client library gave the description."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.e2e.harness import eventually, publish, run_cli
from tests.e2e.test_serve_feishu import CHAT, Setup, card_texts
from tests.e2e.test_serve_telegram import GROUP, PRIVATE, agent_dir, setup, shown
from tests.fakes.feishu_api import FakeFeishu
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
    if status == 403:  # the stored reason, scrubbed by the channel before the store
        assert "bot<token> may not post here" in status_out.stdout
    else:  # the lowercased echo, scrubbed by the channel before it is logged
        assert "https://api.example/bot<token>/editmessagetext" in serve.logs


@pytest.fixture
async def feishu() -> AsyncIterator[FakeFeishu]:
    async with FakeFeishu() as server:
        yield server


async def test_a_feishu_answer_echoing_the_app_secret_or_the_tenant_token_never_shows_them(
    tmp_path: Path, feishu: FakeFeishu
) -> None:
    """A Feishu refusal whose `msg` quotes the request (the bearer tenant token, the app
    secret) becomes the route's disabled reason: `taskcard status` and the log show
    `<secret>` in their place, in whatever case the answer wrote them."""
    setup = Setup(tmp_path, feishu, ["builder"])
    workdir = tmp_path / "agents" / "builder"
    with setup.serve() as serve:
        publish(workdir, "first body")
        await eventually(lambda: any("first body" in t for t in card_texts(feishu)), what="card")
        tenant = next(iter(feishu._tokens))
        feishu.fail_chat(
            CHAT,
            230002,
            msg=f"Bot not in chat. Authorization: Bearer {tenant.upper()} app {feishu.app_secret}",
        )
        publish(workdir, "second body")
        report = await eventually(
            lambda: (lambda text: text if "DISABLED" in text else "")(
                run_cli("status", "--config", str(setup.config)).stdout
            ),
            timeout_s=60,
            what="the route disabled",
        )
        assert await serve.aterminate() == 0
    for text in (report, serve.logs):
        assert tenant.lower() not in text.lower()
        assert feishu.app_secret.lower() not in text.lower()
    assert "Bearer <secret> app <secret>" in report
