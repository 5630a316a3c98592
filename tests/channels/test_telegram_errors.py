"""Table test of the one place PTB exceptions become `channels.errors` types."""

from __future__ import annotations

import warnings

import httpx
import pytest
from telegram import error as tg

from taskcard.bridge.schedule.ratelimit import bounded_pause_s
from taskcard.channels.errors import (
    RETRY_AFTER_CEILING_S,
    ChannelError,
    CredentialsRejected,
    Forbidden,
    MessageGone,
    NotModified,
    OutcomeUnknown,
    Permanent,
    RateLimited,
    Transient,
)
from taskcard.channels.feishu.errors import retry_after_s as feishu_retry_after_s
from taskcard.channels.telegram.errors import (
    ChatGone,
    ChatUpgraded,
    ParseEntitiesFailed,
    ThreadNotFound,
    translate,
)
from taskcard.channels.telegram.request import (
    FLOOD_WAIT_DEFAULT_S,
    AnswerLost,
    FloodWait,
    answer_lost,
    flood_wait_from,
)

SCOPE = "telegram:chat:-1"


def _retry_after(seconds: int) -> tg.RetryAfter:
    # PTB 22 warns about the attribute's future type while building the exception.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return tg.RetryAfter(seconds)


@pytest.mark.parametrize(
    ("exc", "expected"),
    [
        (tg.BadRequest("Message is not modified: specified new message content"), NotModified),
        (tg.BadRequest("Message to edit not found"), MessageGone),
        (tg.BadRequest("Message can't be edited"), MessageGone),
        (tg.BadRequest("MESSAGE_ID_INVALID"), MessageGone),
        (tg.BadRequest("Can't parse entities: unsupported start tag"), ParseEntitiesFailed),
        (tg.BadRequest("Message thread not found"), ThreadNotFound),
        (tg.BadRequest("Message is too long"), Permanent),
        (tg.BadRequest("Chat not found"), ChatGone),
        (tg.BadRequest("Topic_closed"), Forbidden),
        (tg.BadRequest("Not enough rights to send text messages to the chat"), Forbidden),
        (tg.BadRequest("Not enough rights to manage pinned messages in the chat"), Permanent),
        (tg.Forbidden("Forbidden: bot was blocked by the user"), ChatGone),
        (tg.Forbidden("Forbidden: bot was kicked from the group chat"), ChatGone),
        (tg.Forbidden("Forbidden: bot was kicked from the supergroup chat"), ChatGone),
        (tg.Forbidden("Forbidden: bot is not a member of the channel chat"), ChatGone),
        (tg.Forbidden("Forbidden: the group chat was deleted"), ChatGone),
        (tg.Forbidden("Forbidden: bot can't initiate conversation with a user"), Forbidden),
        (tg.TimedOut(), Transient),
        (tg.NetworkError("Bad Gateway"), Transient),
        (AnswerLost("no answer after the request was written"), OutcomeUnknown),
        (tg.InvalidToken("Unauthorized"), CredentialsRejected),
        (tg.Conflict("terminated by other getUpdates request"), Permanent),
        (tg.ChatMigrated(-100999), ChatUpgraded),
    ],
)
def test_translation(exc: tg.TelegramError, expected: type[ChannelError]) -> None:
    translated = translate(exc, SCOPE)
    assert type(translated) is expected
    # A bad request is never mistaken for a network problem worth retrying.
    if isinstance(exc, tg.BadRequest):
        assert not isinstance(translated, Transient)


def test_forbidden_reasons() -> None:
    blocked = translate(tg.Forbidden("Forbidden: bot was blocked by the user"), SCOPE)
    kicked = translate(tg.Forbidden("Forbidden: bot was kicked from the group chat"), SCOPE)
    assert isinstance(blocked, Forbidden) and "blocked" in blocked.reason
    assert isinstance(kicked, Forbidden) and "kicked" in kicked.reason


@pytest.mark.parametrize("exc", [FloodWait(12.0, "Too Many Requests"), _retry_after(12)])
def test_rate_limited_names_the_scope(exc: tg.TelegramError) -> None:
    translated = translate(exc, SCOPE)
    assert isinstance(translated, RateLimited)
    assert (translated.retry_after_s, translated.scope) == (12.0, SCOPE)


@pytest.mark.parametrize(
    ("payload", "retry_after_s"),
    [
        (
            b'{"ok":false,"error_code":429,"description":"Too Many Requests: retry after 35",'
            b'"parameters":{"retry_after":35}}',
            35.0,
        ),
        # No retry_after (a proxy's or an older gateway's 429): the description's seconds,
        # else the default; never a request again at once.
        (b'{"ok":false,"error_code":429,"description":"Too Many Requests: retry after 12"}', 12.0),
        (b'{"ok":false,"error_code":429,"description":"Too Many Requests"}', FLOOD_WAIT_DEFAULT_S),
        (b'{"ok":false,"error_code":429,"parameters":{"retry_after":0}}', FLOOD_WAIT_DEFAULT_S),
        (b"not json", FLOOD_WAIT_DEFAULT_S),
    ],
)
def test_flood_wait_from_body(payload: bytes, retry_after_s: float) -> None:
    assert flood_wait_from(payload).retry_after_s == retry_after_s


@pytest.mark.parametrize(
    ("cause", "lost"),
    [
        # Written, then no answer: Telegram may have performed it.
        (httpx.ReadTimeout("read"), True),
        (httpx.ReadError("reset"), True),
        (httpx.RemoteProtocolError("Server disconnected without sending a response."), True),
        # Never reached Telegram, or not completely: nothing was performed.
        (httpx.ConnectError("refused"), False),
        (httpx.ConnectTimeout("connect"), False),
        (httpx.PoolTimeout("pool"), False),
        (httpx.WriteTimeout("write"), False),
        (None, False),
    ],
)
def test_only_failures_after_the_write_lose_an_answer(
    cause: BaseException | None, lost: bool
) -> None:
    assert answer_lost(cause) is lost


@pytest.mark.parametrize(
    ("body", "expected_s"),
    [
        (b'{"ok":false,"parameters":{"retry_after":5}}', 5.0),
        (b'{"ok":false,"parameters":{"retry_after":1000000000}}', RETRY_AFTER_CEILING_S),
        (b'{"ok":false,"parameters":{"retry_after":1e999}}', RETRY_AFTER_CEILING_S),
        (b'{"ok":false,"parameters":{"retry_after":Infinity}}', RETRY_AFTER_CEILING_S),
        (b'{"ok":false,"parameters":{"retry_after":NaN}}', FLOOD_WAIT_DEFAULT_S),
        (b'{"ok":false,"parameters":{"retry_after":-30}}', FLOOD_WAIT_DEFAULT_S),
        (b'{"ok":false,"parameters":{"retry_after":"soon"}}', FLOOD_WAIT_DEFAULT_S),
        (b'{"ok":false,"parameters":{"retry_after":true}}', FLOOD_WAIT_DEFAULT_S),
    ],
)
def test_flood_wait_is_bounded_whatever_the_body_says(body: bytes, expected_s: float) -> None:
    assert flood_wait_from(body).retry_after_s == expected_s


@pytest.mark.parametrize(
    ("header", "expected_s"),
    [
        ("7", 7.0),
        ("1e9", RETRY_AFTER_CEILING_S),
        ("inf", RETRY_AFTER_CEILING_S),
        ("nan", 1.0),
        ("-5", 1.0),
        ("0", 1.0),
        ("later", 1.0),
        (" 3 ", 3.0),
    ],
)
def test_feishu_reset_header_is_bounded(header: str, expected_s: float) -> None:
    assert feishu_retry_after_s({"X-Ogw-Ratelimit-Reset": header}) == expected_s


@pytest.mark.parametrize(
    ("requested", "cap", "applied"),
    [
        (5.0, 3600.0, 5.0),
        (1e9, 3600.0, 3600.0),
        (float("inf"), 60.0, 60.0),
        (float("nan"), 60.0, 0.0),
        (-3.0, 60.0, 0.0),
    ],
)
def test_pauses_are_bounded(requested: float, cap: float, applied: float) -> None:
    assert bounded_pause_s(requested, cap) == applied
