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
_SUCCESS_MIN = 200
_SUCCESS_MAX = 299
_GATEWAY_TIMEOUT = 504
_PLAIN_SUCCESS = b'{"ok":true,"result":'
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


def read_answer(status: int, payload: bytes) -> tuple[int, bytes]:
    """The answer as PTB may read it; both transports call this before PTB sees it.

    Raises `FloodWait` for a 429 naming `retry_after`. The Bot API always answers a JSON
    object; what else arrives came from something in between (a proxy's HTML error page, an
    empty or cut body) or is a success status carrying an error. PTB would log such a body
    with a traceback and fail with a `KeyError` or `TypeError` that is no Telegram error:

    - a success status with `ok: false` and an `error_code` is read as that error;
    - any other success status without a `result` raises `AnswerLost`: the request was
      performed or not, nobody can say;
    - an error status whose body is not a JSON object with `ok: false` is no word from
      Telegram about the request, whatever the status (a proxy's 403 page or JSON says
      nothing about the chat): a `NetworkError` naming the status, or `AnswerLost` for a
      gateway timeout (504), after which Telegram may have performed the request.
    """
    if status == _SUCCESS_MIN and payload.startswith(_PLAIN_SUCCESS):
        return status, payload  # how the Bot API writes every success: no second parse
    raise_for_flood(status, payload)
    body = _json_object(payload)
    if _SUCCESS_MIN <= status <= _SUCCESS_MAX:
        if body is not None and body.get("ok") is True and "result" in body:
            return status, payload
        code = _error_status(body)
        if code is not None:
            raise_for_flood(code, payload)
            return code, payload
        shape = "a JSON object without a result" if body is not None else _shape(payload)
        raise AnswerLost(f"HTTP {status} with no Bot API result ({shape})")
    if body is None or body.get("ok") is not False:
        # The Bot API words every error as an object with `ok: false`; a proxy's JSON (an
        # API gateway's `{"message": "Forbidden"}`) is no more its word than an HTML page.
        shape = "a JSON object without ok: false" if body is not None else _shape(payload)
        description = f"HTTP {status}, the answer was not a Bot API answer ({shape})"
        if status == _GATEWAY_TIMEOUT:
            # Something in between gave up waiting for Telegram, which may have performed it.
            raise AnswerLost(description)
        raise tg.NetworkError(description)
    return status, payload


def _json_object(payload: bytes) -> dict[str, Any] | None:
    try:
        body = json.loads(payload)
    except (ValueError, RecursionError):
        return None
    return body if isinstance(body, dict) else None


def _error_status(body: dict[str, Any] | None) -> int | None:
    """The `error_code` of an `ok: false` body when it is an HTTP error status, else None."""
    if body is None or body.get("ok") is not False:
        return None
    code = body.get("error_code")
    if isinstance(code, int) and not isinstance(code, bool) and 400 <= code <= 599:
        return code
    return None


def _shape(payload: bytes) -> str:
    """What a body was, for a log line: never the body itself (it may be a whole page)."""
    if not payload.strip():
        return "an empty body"
    return f"{len(payload)} bytes that are not a JSON object"


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
    `AnswerLost` when the request went out but its answer did not come back (or came back
    unreadable, see `read_answer`)."""

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
        return read_answer(code, payload)
