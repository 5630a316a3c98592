"""PTB's HTTPX transport with two changes: a 429 becomes `FloodWait` before PTB sees it, and
a failure after the request was written becomes `AnswerLost`.

PTB 22 builds `RetryAfter` from a 429 and, in doing so, emits a deprecation warning about
the type of `retry_after` unless the process opted in through an environment variable.
A process that treats warnings as errors (our tests) would then see the warning instead
of the 429. Reading the 429 here keeps the signal exact (the float the server sent, with
its description) and independent of process-wide settings. PTB passes any `TelegramError`
raised by the transport straight through to the caller.

PTB folds every httpx failure into `TimedOut` or `NetworkError`, losing the one fact that
matters for a send: whether Telegram may have received it. A connection that could not be
opened or a pool that had no room means nothing was sent; a read that timed out or a
connection closed before the answer means the request was written and may have been
performed. Only this layer still sees the httpx exception, so it tells the two apart.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
from telegram import error as tg
from telegram.request import HTTPXRequest, RequestData

from taskcard.channels.errors import sane_retry_after_s

_TOO_MANY_REQUESTS = 429
# httpx failures that happen after the whole request was handed to the connection.
_AFTER_WRITE = (httpx.ReadTimeout, httpx.ReadError, httpx.RemoteProtocolError)


class FloodWait(tg.TelegramError):
    """Telegram's flood control answered 429 with `retry_after` seconds."""

    def __init__(self, retry_after_s: float, description: str) -> None:
        super().__init__(description)
        self.retry_after_s = retry_after_s


class AnswerLost(tg.NetworkError):
    """The request was written but no answer arrived: Telegram may have performed it."""


def answer_lost(cause: BaseException | None) -> bool:
    """True when the httpx failure behind a PTB error came after the request was written."""
    return isinstance(cause, _AFTER_WRITE)


def lost_after_write(cause: BaseException) -> AnswerLost:
    """The `AnswerLost` for a failure (`cause`) after the request was written."""
    return AnswerLost(f"no answer after the request was written ({type(cause).__name__})")


def raise_for_flood(status: int, payload: bytes) -> None:
    """Raise `FloodWait` when the answer is a 429 naming `retry_after`; both transports
    call this before PTB sees the answer."""
    if status == _TOO_MANY_REQUESTS:
        flood = flood_wait_from(payload)
        if flood is not None:
            raise flood


def flood_wait_from(payload: bytes) -> FloodWait | None:
    """The flood wait described by a 429 body, or None when it names no `retry_after`."""
    try:
        body = json.loads(payload)
    except (ValueError, RecursionError):
        return None
    if not isinstance(body, dict):
        return None
    parameters = body.get("parameters")
    retry_after = parameters.get("retry_after") if isinstance(parameters, dict) else None
    if retry_after is None:
        return None
    # Bounded here, at the edge: a retry_after of 1e9 (or Infinity, or -1) is not a plan.
    description = str(body.get("description") or "Too Many Requests")
    return FloodWait(sane_retry_after_s(retry_after), description)


class FloodAwareRequest(HTTPXRequest):
    """An `HTTPXRequest` that raises `FloodWait` for a 429 carrying `retry_after` and
    `AnswerLost` when the request went out but its answer did not come back."""

    async def do_request(
        self,
        url: str,
        method: str,
        request_data: RequestData | None = None,
        read_timeout: Any = HTTPXRequest.DEFAULT_NONE,
        write_timeout: Any = HTTPXRequest.DEFAULT_NONE,
        connect_timeout: Any = HTTPXRequest.DEFAULT_NONE,
        pool_timeout: Any = HTTPXRequest.DEFAULT_NONE,
    ) -> tuple[int, bytes]:
        try:
            code, payload = await super().do_request(
                url,
                method,
                request_data=request_data,
                read_timeout=read_timeout,
                write_timeout=write_timeout,
                connect_timeout=connect_timeout,
                pool_timeout=pool_timeout,
            )
        except tg.NetworkError as exc:
            if exc.__cause__ is not None and answer_lost(exc.__cause__):
                raise lost_after_write(exc.__cause__) from exc
            raise
        raise_for_flood(code, payload)
        return code, payload
