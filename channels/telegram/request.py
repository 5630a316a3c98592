"""PTB's HTTPX transport with one change: a 429 becomes `FloodWait` before PTB sees it.

PTB 22 builds `RetryAfter` from a 429 and, in doing so, emits a deprecation warning about
the type of `retry_after` unless the process opted in through an environment variable.
A process that treats warnings as errors (our tests) would then see the warning instead
of the 429. Reading the 429 here keeps the signal exact (the float the server sent, with
its description) and independent of process-wide settings. PTB passes any `TelegramError`
raised by the transport straight through to the caller.
"""

from __future__ import annotations

import json
from typing import Any

from telegram import error as tg
from telegram.request import HTTPXRequest, RequestData

from channels.errors import sane_retry_after_s

_TOO_MANY_REQUESTS = 429


class FloodWait(tg.TelegramError):
    """Telegram's flood control answered 429 with `retry_after` seconds."""

    def __init__(self, retry_after_s: float, description: str) -> None:
        super().__init__(description)
        self.retry_after_s = retry_after_s


def flood_wait_from(payload: bytes) -> FloodWait | None:
    """The flood wait described by a 429 body, or None when it names no `retry_after`."""
    try:
        body = json.loads(payload)
    except ValueError:
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
    """An `HTTPXRequest` that raises `FloodWait` for a 429 carrying `retry_after`."""

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
        code, payload = await super().do_request(
            url,
            method,
            request_data=request_data,
            read_timeout=read_timeout,
            write_timeout=write_timeout,
            connect_timeout=connect_timeout,
            pool_timeout=pool_timeout,
        )
        if code == _TOO_MANY_REQUESTS:
            flood = flood_wait_from(payload)
            if flood is not None:
                raise flood
        return code, payload
