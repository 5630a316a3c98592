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
import re
from typing import Any

import httpx
from telegram import error as tg
from telegram.request import BaseRequest, HTTPXRequest, RequestData

from taskcard.channels.base import counted
from taskcard.channels.errors import sane_retry_after_s

_TOO_MANY_REQUESTS = 429
_SUCCESS_MIN = 200
_SUCCESS_MAX = 299
_GATEWAY_TIMEOUT = 504
_TRUE_ANSWER = b'{"ok":true,"result":true}'
# How every success answer begins: the Bot API writes `{"ok":true,"result":` compact, and
# something in between that encodes JSON again (a proxy, a gateway) may add spaces. Matched
# without a parse: most answers are read no further (see `read_answer`, `checked_success`).
_SUCCESS_HEAD = re.compile(rb'\{\s*"ok"\s*:\s*true\s*,\s*"result"\s*:\s*')
_TRUE_RESULT = re.compile(rb"true\s*\}\s*")
_SEND = "sendMessage"
_GET_ME = "getMe"
_EDIT = "editMessageText"
# Requests whose result the channel never reads: `true` on success (an edit: the message).
_RESULT_TRUE = frozenset({_EDIT, "deleteMessage", "pinChatMessage"})
# A 429 that names no wait is still flood control: long enough that a chat's requests do not
# run into it again and again (Telegram's waits grow for bots that keep sending), short
# enough that a card catches up soon.
FLOOD_WAIT_DEFAULT_S = 5.0
_RETRY_AFTER_TEXT = re.compile(r"retry after (\d+(?:\.\d+)?)", re.IGNORECASE)
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
    """Raise `FloodWait` when the answer is a 429; both transports call this before PTB
    sees the answer. A 429 without `parameters.retry_after` (a proxy's, an older gateway's)
    is flood control all the same: the wait is read from its description or defaults to
    `FLOOD_WAIT_DEFAULT_S`, so it pauses the chat as any flood wait does."""
    if status == _TOO_MANY_REQUESTS:
        raise flood_wait_from(payload)


def read_answer(status: int, payload: bytes) -> tuple[int, bytes]:
    """The answer as PTB may read it; both transports call this before PTB sees it.

    Raises `FloodWait` for a 429 (and any error naming `retry_after`). The Bot API always
    answers a JSON
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
    if status == _SUCCESS_MIN and _SUCCESS_HEAD.match(payload):
        return status, payload  # how the Bot API writes every success: no second parse
    raise_for_flood(status, payload)
    body = _json_object(payload)
    if _SUCCESS_MIN <= status <= _SUCCESS_MAX:
        if body is not None and body.get("ok") is True and "result" in body:
            return status, payload
        code = _error_status(body)
        if code is not None:
            raise_for_flood(code, payload)
            assert body is not None
            _flood_named(body, payload)
            return code, _plain_error(body, payload)
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
    _flood_named(body, payload)
    return status, _plain_error(body, payload)


def _flood_named(body: dict[str, Any], payload: bytes) -> None:
    """An error naming `parameters.retry_after` is a flood wait whatever its status (PTB
    reads it so too), bounded like any other."""
    parameters = body.get("parameters")
    if isinstance(parameters, dict) and parameters.get("retry_after") is not None:
        raise flood_wait_from(payload)


def _plain_error(body: dict[str, Any] | None, payload: bytes) -> bytes:
    """An `ok: false` answer as PTB can read it. PTB takes `description` for a string and
    `parameters` for an object of the documented types; anything else (a number for a
    description, a list for parameters, a retry_after in words) made it fail with a
    `TypeError` or `AttributeError` that is no Telegram error. Such fields are rewritten:
    the description as text, the parameters reduced to the ones that are well formed."""
    if body is None:
        return payload
    description, parameters = body.get("description"), body.get("parameters")
    if isinstance(description, str) and (parameters is None or _plain_parameters(parameters)):
        return payload
    plain: dict[str, Any] = {
        "ok": False,
        "error_code": body.get("error_code"),
        "description": description if isinstance(description, str) else str(description or ""),
    }
    migrate_to = (
        _chat_id(parameters.get("migrate_to_chat_id")) if isinstance(parameters, dict) else None
    )
    if migrate_to is not None:
        plain["parameters"] = {"migrate_to_chat_id": migrate_to}
    return json.dumps(plain).encode()


def _chat_id(value: Any) -> int | None:
    """A chat id PTB can take: an integer, or a string of one (a gateway's)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lstrip("-").isascii() and value.lstrip("-").isdigit():
        return int(value)
    return None


def _plain_parameters(parameters: Any) -> bool:
    """Parameters PTB reads as they are: an object whose chat id, if any, is an integer (the
    `retry_after` of an error never reaches PTB, see `_flood_named`)."""
    if not isinstance(parameters, dict):
        return False
    migrate_to = parameters.get("migrate_to_chat_id")
    return migrate_to is None or (isinstance(migrate_to, int) and not isinstance(migrate_to, bool))


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
    return f"a body of {counted(len(payload), 'byte', 'bytes')}, not a JSON object"


def flood_wait_from(payload: bytes) -> FloodWait:
    """The flood wait a 429 body describes: `parameters.retry_after`, else the seconds its
    description names ("retry after 35"), else `FLOOD_WAIT_DEFAULT_S`."""
    body = _json_object(payload) or {}
    parameters = body.get("parameters")
    retry_after = parameters.get("retry_after") if isinstance(parameters, dict) else None
    description = body.get("description")
    description = description if isinstance(description, str) and description else ""
    if retry_after is None:
        named = _RETRY_AFTER_TEXT.search(description)
        retry_after = named.group(1) if named is not None else FLOOD_WAIT_DEFAULT_S
    # Bounded here, at the edge: a retry_after of 1e9 (or Infinity, or -1) is not a plan.
    wait_s = sane_retry_after_s(retry_after, FLOOD_WAIT_DEFAULT_S) or FLOOD_WAIT_DEFAULT_S
    return FloodWait(wait_s, description or "Too Many Requests")


def endpoint_of(url: str) -> str:
    """The Bot API method a URL names: its last path segment (`.../bot<token>/sendMessage`)."""
    return url.partition("?")[0].rstrip("/").rsplit("/", 1)[-1]


def checked_success(endpoint: str, payload: bytes) -> bytes:
    """A success answer (`ok: true` with a `result`) to one of the requests the channel
    makes, cut down to what the channel reads; both transports call this before PTB sees it.

    Sends: the message's id (an integer; a string of digits is read as one) with the date
    and chat PTB needs to build its `Message`. Edits: the edited message or `true`; deletes
    and pins: `true`; either way `true` goes on, so PTB builds nothing the channel drops.
    A result of another shape (a send answered `true`, a list, a message without an id)
    raises `AnswerLost`: the request was performed, what it did is unknown (a send may
    have posted). getMe must name the bot's id, name and username (or it is tried again,
    as after a lost answer). Other methods' answers pass unchanged.
    """
    if endpoint in _RESULT_TRUE:
        head = _SUCCESS_HEAD.match(payload)
        if head is not None and _true_as_written(endpoint, payload, head.end()):
            return _TRUE_ANSWER  # how the Bot API writes these: no parse
        result = _success_result(payload)
        if result is True or (endpoint == _EDIT and isinstance(result, dict)):
            return _TRUE_ANSWER
        raise AnswerLost(f"{endpoint} answered ok with a result of another shape ({_kind(result)})")
    if endpoint == _GET_ME:
        # The bot's identity, read once at start: PTB builds a `User` of it, and the channel
        # needs the username (commands name the bot by it).
        me = _success_result(payload)
        if not isinstance(me, dict) or not all(
            isinstance(me.get(field), kind) and not isinstance(me.get(field), bool)
            for field, kind in (("id", int), ("first_name", str), ("username", str))
        ):
            raise AnswerLost(f"{endpoint} answered ok without the bot's id and username")
        return payload
    if endpoint != _SEND:
        return payload
    result = _success_result(payload)
    message_id = result.get("message_id") if isinstance(result, dict) else None
    if isinstance(message_id, str) and message_id.isascii() and message_id.isdigit():
        message_id = int(message_id)
    if isinstance(message_id, bool) or not isinstance(message_id, int) or message_id <= 0:
        what = "without a message id" if isinstance(result, dict) else _kind(result)
        raise AnswerLost(f"{endpoint} answered ok with no usable message id ({what})")
    assert isinstance(result, dict)
    date, chat = result.get("date"), result.get("chat")
    chat = chat if isinstance(chat, dict) else {}
    chat_id, chat_type = chat.get("id"), chat.get("type")
    slim = {
        "message_id": message_id,
        "date": date if isinstance(date, int) and not isinstance(date, bool) else 0,
        "chat": {
            "id": chat_id if isinstance(chat_id, int) and not isinstance(chat_id, bool) else 0,
            "type": chat_type if isinstance(chat_type, str) else "private",
        },
    }
    return json.dumps({"ok": True, "result": slim}).encode()


def checked_answer(endpoint: str, status: int, payload: bytes) -> tuple[int, bytes]:
    """The answer to a request to `endpoint` as PTB may read it: `read_answer`, then
    `checked_success` for a success; both transports hand PTB this. An edit, delete or pin
    answered as the Bot API writes it is known by one match (the common case, every card
    change), not by one in each of the two."""
    if status == _SUCCESS_MIN and endpoint in _RESULT_TRUE:
        head = _SUCCESS_HEAD.match(payload)
        if head is not None and _true_as_written(endpoint, payload, head.end()):
            return status, _TRUE_ANSWER
    status, payload = read_answer(status, payload)
    if _SUCCESS_MIN <= status <= _SUCCESS_MAX:
        return status, checked_success(endpoint, payload)
    return status, payload


def _true_as_written(endpoint: str, payload: bytes, result_at: int) -> bool:
    """A result at `result_at` that is `true`, or for an edit the message: read as `true`.
    The edit's message is looked for first: it is how every card change is answered."""
    return (endpoint == _EDIT and payload.startswith(b"{", result_at)) or (
        _TRUE_RESULT.fullmatch(payload, result_at) is not None
    )


def parse_answer(payload: bytes) -> dict[str, Any]:
    """PTB's `parse_json_payload` (its documented override point) for both transports: the
    `true` that `checked_success` hands on for every edit, delete and pin is known without
    decoding it again; any other answer is parsed by PTB as before."""
    if payload == _TRUE_ANSWER:
        return {"ok": True, "result": True}
    return BaseRequest.parse_json_payload(payload)


def _success_result(payload: bytes) -> Any:
    """The `result` of a success answer that `read_answer` let through (None if unreadable)."""
    body = _json_object(payload)
    return None if body is None else body.get("result")


def _kind(result: Any) -> str:
    """What a result was, for a log line: its JSON type, never its content."""
    if result is True or result is False:
        return f"result {str(result).lower()}"
    names = {dict: "an object", list: "a list", str: "a string", type(None): "null"}
    return f"result {names.get(type(result), 'a number')}"


class FloodAwareRequest(HTTPXRequest):
    """An `HTTPXRequest` that raises `FloodWait` for a 429 and `AnswerLost` when the request
    went out but its answer did not come back (or came back unreadable, see `read_answer`,
    or a success of another shape than documented, see `checked_success`)."""

    parse_json_payload = staticmethod(parse_answer)

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
        return checked_answer(endpoint_of(url), code, payload)
