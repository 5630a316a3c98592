"""What the Bot API answers, as `taskcard serve` reads it, end to end against the fake Bot API.

The real API's answers may differ from the fake's in every detail its documentation leaves
open; what the channel relies on is what it documents: a sent message's integer
`message_id`, `true` or the edited message for an edit, `true` for a delete or pin, and a
429 for flood control. Each test runs on the lean transport and on PTB's httpx transport
(which the service uses when a proxy is configured; here the fake is its own proxy).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.harness import ServeProcess, agents_lines, eventually, publish, run_cli
from tests.fakes.telegram_api import FakeLimits, FakeTelegram

GROUP = -1005550001111
TRANSPORTS = ["lean", "proxy"]


@pytest.fixture
async def fake() -> AsyncIterator[FakeTelegram]:
    async with FakeTelegram(limits=FakeLimits.unlimited()) as server:
        yield server


def serve(
    tmp_path: Path,
    fake: FakeTelegram,
    agents: list[str],
    transport: str,
    thread: int | None = None,
) -> ServeProcess:
    """All `agents` in one group chat (or forum topic), a card each; through a proxy when
    asked."""
    lines = [
        *agents_lines(tmp_path, agents),
        "[telegram]",
        'token_env = "TC_TEST_TOKEN"',
        f'api_base_url = "{fake.base_url}"',
        "poll_timeout_s = 1",
        "[[telegram.routes]]",
        f"chat_id = {GROUP}",
        *([] if thread is None else [f"thread_id = {thread}"]),
        f"agents = {json.dumps(agents)}",
    ]
    config = tmp_path / "taskcard.toml"
    config.write_text("\n".join(lines) + "\n")
    env = {"TC_TEST_TOKEN": fake.token}
    for name in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy"):
        env[name] = fake.base_url if transport == "proxy" and name == "http_proxy" else ""
    env["no_proxy"] = env["NO_PROXY"] = ""
    return ServeProcess(config, env=env)


def shown(fake: FakeTelegram) -> list[str]:
    return [m.text for m in fake.bot_messages(GROUP)]


def status(config: Path) -> dict[str, Any]:
    result = run_cli("status", "--config", str(config), "--json")
    assert result.returncode == 0, result.stderr
    report: dict[str, Any] = json.loads(result.stdout)
    return report


SEND_ANSWERS = {
    "true": b'{"ok":true,"result":true}',
    "a list": b'{"ok":true,"result":[{"message_id":7}]}',
    "no message_id": b'{"ok":true,"result":{"date":1,"chat":{"id":-1,"type":"supergroup"}}}',
    "a word for an id": b'{"ok":true,"result":{"message_id":"seven","date":1}}',
}


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("answer", list(SEND_ANSWERS))
async def test_a_send_answered_without_a_message_id_is_an_unknown_outcome(
    tmp_path: Path, fake: FakeTelegram, transport: str, answer: str
) -> None:
    """An `ok: true` send whose result holds no message id may have posted the card, and
    its id is unknown: the service retries it as a send whose answer was lost (counted, held
    after the bound), never keeps an id it cannot edit, and the card lands at once."""
    service = serve(tmp_path, fake, ["builder"], transport)
    fake.answer_raw_next("sendMessage", 200, SEND_ANSWERS[answer], "application/json")
    with service:
        publish(tmp_path / "agents" / "builder", "first card")
        await eventually(
            lambda: any("first card" in text for text in shown(fake)), what="the card shown"
        )
        route = status(service.config)["routes"][0]
        assert route["message_id"] == str(fake.bot_messages(GROUP)[0].message_id)
        publish(tmp_path / "agents" / "builder", "second card")
        await eventually(lambda: any("second card" in text for text in shown(fake)))
        assert len(shown(fake)) == 1
        assert await service.aterminate() == 0
    assert "may have performed" in service.logs
    assert "Traceback" not in service.logs


EDIT_ANSWERS = {
    # A full message with fields in another order and more of them, or `true` without spaces.
    "a full message": json.dumps(
        {
            "result": {
                "text": "x",
                "chat": {"type": "supergroup", "id": GROUP, "is_forum": False},
                "message_id": 1,
                "edit_date": 2,
                "reply_markup": {"inline_keyboard": []},
            },
            "ok": True,
        }
    ).encode(),
    "true, spaced": b'{ "ok": true, "result": true }',
}


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("answer", list(EDIT_ANSWERS))
async def test_an_edit_answered_in_another_documented_shape_is_done(
    tmp_path: Path, fake: FakeTelegram, transport: str, answer: str
) -> None:
    """The edit was done: the card is not retried, replaced or counted as an error."""
    service = serve(tmp_path, fake, ["builder"], transport)
    workdir = tmp_path / "agents" / "builder"
    with service:
        publish(workdir, "v1")
        await eventually(lambda: shown(fake), what="the card")
        edits = fake.count("editMessageText")
        fake.answer_raw_next("editMessageText", 200, EDIT_ANSWERS[answer], "application/json")
        publish(workdir, "v2 (answered oddly)")
        await eventually(lambda: fake.count("editMessageText") > edits, what="the edit")
        publish(workdir, "v3")
        await eventually(lambda: any("v3" in text for text in shown(fake)), what="v3")
        assert fake.count("editMessageText") == edits + 2, "the odd answer was retried"
        assert len(shown(fake)) == 1
        assert await service.aterminate() == 0
    assert "Traceback" not in service.logs
    assert "failed" not in service.logs.lower()


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize(
    ("description", "wait_s"),
    [("Too Many Requests", 5.0), ("Too Many Requests: retry after 7", 7.0)],
)
async def test_a_429_without_retry_after_pauses_the_chat(
    tmp_path: Path, fake: FakeTelegram, transport: str, description: str, wait_s: float
) -> None:
    """A 429 without `parameters.retry_after` (a proxy's, an older gateway's) is flood
    control too: the chat is paused (for the seconds its description names, else a default),
    so the other cards of the chat wait as well, and then everything lands."""
    service = serve(tmp_path, fake, ["builder", "tester"], transport)
    builder, tester = (tmp_path / "agents" / agent for agent in ("builder", "tester"))
    with service:
        publish(builder, "builder v1")
        publish(tester, "tester v1")
        await eventually(lambda: len(shown(fake)) == 2, what="both cards")
        fake.fail_next("editMessageText", 429, description)
        publish(builder, "builder v2")
        pause = f"pausing scope telegram:chat:{GROUP} for {wait_s:.1f}s"
        await eventually(lambda: pause in service.logs, what="the chat paused")
        publish(tester, "tester v2")
        await eventually(
            lambda: all(any(f"{a} v2" in t for t in shown(fake)) for a in ("builder", "tester")),
            what="both cards after the pause",
        )
        assert await service.aterminate() == 0
    assert "Traceback" not in service.logs


async def test_a_closed_topic_comes_back_when_it_is_reopened(
    tmp_path: Path, fake: FakeTelegram
) -> None:
    """TOPIC_CLOSED disables the topic's route; Telegram's service message that the topic
    was reopened (every bot gets it, privacy mode or not) brings the route back by itself,
    with the card it missed, and no one has to send a command or restart the service."""
    topic = 42
    service = serve(tmp_path, fake, ["builder"], "lean", thread=topic)
    workdir = tmp_path / "agents" / "builder"

    def disabled() -> bool:
        return bool(status(service.config)["routes"][0]["disabled"])

    with service:
        publish(workdir, "v1")
        await eventually(lambda: fake.bot_messages(GROUP, topic), what="the card in the topic")
        fake.fail_next("editMessageText", 400, "Bad Request: TOPIC_CLOSED")
        publish(workdir, "v2 while closed")
        await eventually(disabled, what="the route disabled")
        person = {"id": 1000, "is_bot": False, "first_name": "Admin"}
        fake.inject_update(
            {
                "message": {
                    "message_id": 500,
                    "date": 1,
                    "chat": {"id": GROUP, "type": "supergroup", "title": "G", "is_forum": True},
                    "from": person,
                    "message_thread_id": topic,
                    "is_topic_message": True,
                    "forum_topic_reopened": {},
                }
            }
        )
        await eventually(
            lambda: any("v2 while closed" in m.text for m in fake.bot_messages(GROUP, topic)),
            what="the card caught up after the reopening",
        )
        assert not disabled()
        assert len(fake.bot_messages(GROUP)) == 1
        assert await service.aterminate() == 0
    assert "Traceback" not in service.logs


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_a_get_me_answer_without_the_bot_is_tried_again(
    tmp_path: Path, fake: FakeTelegram, transport: str
) -> None:
    """getMe answered ok without the bot's id and username (`true`, a user without a
    username) at start: the channel is not ready yet and tries again, as after any other
    failure at start; it was disabled for good with a traceback."""
    fake.answer_raw_next("getMe", 200, b'{"ok":true,"result":true}', "application/json")
    other = b'{"ok":true,"result":{"id":1,"is_bot":true,"first_name":"bot"}}'
    fake.answer_raw_next("getMe", 200, other, "application/json")
    service = serve(tmp_path, fake, ["builder"], transport)
    with service:
        publish(tmp_path / "agents" / "builder", "first card")
        await eventually(
            lambda: any("first card" in text for text in shown(fake)),
            timeout_s=60,
            what="the card once the channel started",
        )
        assert await service.aterminate() == 0
    assert "Traceback" not in service.logs
    assert "could not start" not in service.logs


async def test_error_answers_with_fields_of_other_types_are_read(
    tmp_path: Path, fake: FakeTelegram
) -> None:
    """An error whose description is no text or whose parameters are no object is still
    Telegram's refusal of that request (never a crash of the client library), and a group's
    new id written as a string still moves its card to the supergroup."""
    supergroup = -1005550002222
    service = serve(tmp_path, fake, ["builder"], "lean")
    workdir = tmp_path / "agents" / "builder"
    with service:
        publish(workdir, "v1")
        await eventually(lambda: shown(fake), what="the card")
        odd = b'{"ok":false,"error_code":400,"description":400,"parameters":[1]}'
        fake.answer_raw_next("editMessageText", 400, odd, "application/json")
        publish(workdir, "v2 refused oddly")
        await eventually(lambda: fake.count("editMessageText") >= 1, what="the refused edit")
        publish(workdir, "v3")
        await eventually(lambda: any("v3" in text for text in shown(fake)), what="v3")
        moved = json.dumps(
            {
                "ok": False,
                "error_code": 400,
                "description": "Bad Request: group chat was upgraded to a supergroup chat",
                "parameters": {"migrate_to_chat_id": str(supergroup)},
            }
        ).encode()
        fake.answer_raw_next("editMessageText", 400, moved, "application/json")
        publish(workdir, "v4 in the supergroup")
        await eventually(
            lambda: any("v4" in m.text for m in fake.bot_messages(supergroup)),
            what="the card in the supergroup",
        )
        assert await service.aterminate() == 0
    assert "Traceback" not in service.logs


async def test_an_api_root_that_is_not_the_bot_api_is_said_so_not_blamed_on_the_token(
    tmp_path: Path, fake: FakeTelegram
) -> None:
    # The Bot API answers 404 Not Found (JSON) for a path it does not serve, and PTB raises
    # that as an invalid token: a wrong api_base_url (a local Bot API server's address with
    # a path it does not have) was logged as "Telegram rejected the bot token", and the
    # operator replaced a good token.
    (tmp_path / "agents" / "builder").mkdir(parents=True)
    config = tmp_path / "taskcard.toml"
    config.write_text(
        "\n".join(
            [
                *agents_lines(tmp_path, ["builder"]),
                "[telegram]",
                'token_env = "TC_TEST_TOKEN"',
                f'api_base_url = "{fake.base_url}/telegram"',
                "[[telegram.routes]]",
                f"chat_id = {GROUP}",
                'agents = ["builder"]',
            ]
        )
        + "\n"
    )
    with ServeProcess(config, env={"TC_TEST_TOKEN": fake.token}) as serve:
        line = await eventually(
            lambda: next((x for x in serve.stderr if "channel telegram disabled" in x), None),
            timeout_s=60,
            what="the channel's refusal",
        )
        assert "telegram.api_base_url" in line and "Not Found" in line, line
        assert fake.token not in serve.logs


async def test_a_card_whose_links_are_too_long_for_telegram_shows_as_plain_text(
    tmp_path: Path, fake: FakeTelegram
) -> None:
    """Telegram bounds the size of a message's entities, links' addresses included, and
    answers ENTITIES_TOO_LONG past it (a 400, whatever the text's length): the card goes as
    plain text, as after any refusal of its entities, instead of never showing."""
    service = serve(tmp_path, fake, ["builder"], "lean")
    workdir = tmp_path / "agents" / "builder"
    address = "https://example.com/" + "a" * 120
    links = " ".join(f"[link {n}]({address}/{n})" for n in range(60))
    with service:
        publish(workdir, f"report: {links}")
        await eventually(lambda: any("link 59" in text for text in shown(fake)), what="the card")
        assert fake.bot_messages(GROUP)[-1].entities == []
        assert await service.aterminate() == 0
    assert "Traceback" not in service.logs
