"""A cluster instance whose Redis goes away while it records a 429 answered at its start.

The Telegram menu (`setMyCommands`) is optional: a 429 answered to it is recorded as a pause
of the menu (`telegram:menu`) and the channel starts without it. Clustered, that pause is
written to Redis; a Redis gone at that moment must cost a warning, never the service, as
any other Redis outage does: once Redis is back the instance serves cards again.
"""

from __future__ import annotations

from contextlib import ExitStack
from pathlib import Path

from tests.e2e.harness import eventually, publish
from tests.e2e.test_cluster import instance
from tests.e2e.test_serve_telegram import GROUP, shown
from tests.fakes.telegram_api import FakeTelegram
from tests.redis_server import private_redis


async def test_redis_gone_while_a_menu_429_is_recorded_does_not_stop_serve(
    tmp_path: Path, telegram: FakeTelegram, prefix: str, fleet: ExitStack
) -> None:
    server = private_redis(tmp_path / "redis", fleet)
    # The menu's answer is held until Redis is gone: the 429 is recorded without it.
    telegram.hold_answers("setMyCommands")
    telegram.fail_next(
        "setMyCommands", 429, "Too Many Requests: retry after 600", {"retry_after": 600}
    )
    serve = instance(tmp_path, "i0", telegram, ["builder"], redis_url=server.url, prefix=prefix)
    # The held answer must not time out in the client however long stopping Redis takes.
    text = serve.config.read_text()
    assert "poll_timeout_s = 1\n" in text
    serve.config.write_text(
        text.replace("poll_timeout_s = 1\n", "poll_timeout_s = 1\nrequest_timeout_s = 300\n")
    )
    fleet.enter_context(serve)
    await eventually(lambda: telegram.count("setMyCommands") >= 1, what="the menu asked")
    server.stop()
    telegram.release_answers("setMyCommands")
    await eventually(
        lambda: "rate limited in the start of channel telegram" in serve.logs,
        timeout_s=60,
        what="the menu's 429 recorded",
    )
    await eventually(
        lambda: "the rate-limit pause could not be saved" in serve.logs,
        timeout_s=60,
        what="the unsaved pause said",
    )
    assert serve.proc is not None and serve.proc.poll() is None, serve.logs
    server.start()
    publish(tmp_path / "agents" / "builder", "card after the outage")
    await eventually(
        lambda: any("card after the outage" in t for t in shown(telegram, GROUP)),
        timeout_s=90,
        what="the card served after the outage",
    )
    assert telegram.count("setMyCommands") == 1, "not asked again inside its window"
    assert await serve.aterminate() == 0, serve.logs
    # Other work may log a Redis outage with its traceback (an agent read while Redis was
    # gone); the pause's write never does.
    assert "set_pause" not in serve.logs
    assert serve.logs.count("the rate-limit pause could not be saved") == 1
