"""Receiving events over Feishu's long connection (`events = "websocket"`).

`lark_oapi.ws.Client` captures a module-level event loop when it is imported and drives it
with `run_until_complete` (and fetches its endpoint with blocking `requests`), so it cannot
share the service's loop. It runs here in one owned thread with a loop of its own, which
is installed as that module-level loop before the client starts: consequently only one long
connection can run per process (one Feishu app per service, which is all we need).

Events leave the thread as plain JSON documents through `deliver`, which must be
thread-safe and return only once the event is taken (the channel waits for its own loop to
record it); when it raises, lark-oapi answers 500 and Feishu delivers the event again. Every
event type is delivered and acknowledged, as the HTTP callback does: lark-oapi's dispatcher
answers 500 for a type without a registered processor, so Feishu kept redelivering events
the app may receive but nothing here handles (the channel ignores them). Stopping
cancels every task of the private loop, which ends `Client.start()`; a thread blocked in
the library's blocking endpoint request cannot be interrupted, so `stop` waits only
`join_timeout_s` and the thread is a daemon.
"""

from __future__ import annotations

import asyncio
import contextlib
import http
import logging
import re
import threading
from collections.abc import Callable
from typing import Any, Final

import lark_oapi
import lark_oapi.ws.client as ws_client_module
from lark_oapi.core.enum import LogLevel
from lark_oapi.core.json import JSON
from lark_oapi.event.dispatcher_handler import EventDispatcherHandler
from lark_oapi.ws.model import Response

from taskcard.channels.feishu.events import EventRejected, read_json_object

log = logging.getLogger(__name__)
# lark-oapi logs through this logger; its receive loop logs every end of the connection at
# ERROR, also Feishu closing it the normal way (close code 1000 or 1001) before a reconnect.
LARK_LOGGER = "Lark"
# The name its records carry in our log: "Lark" named no module, as every other line does.
LARK_NAME: Final = "lark_oapi"
# What a lark-oapi line may carry that is a credential: the long connection's URL, whose
# query holds its ticket and keys ("connected to wss://...?device_id=..&ticket=.."), and a
# request's `Authorization` header (the tenant token).
_URL_QUERY = re.compile(r"(\b(?:wss?|https?)://[^\s?]+)\?[^\s\]]*")
_BEARER = re.compile(r"(?i)\b(bearer)\s+\S+")
_TENANT_TOKEN = re.compile(r"\b[tu]-[A-Za-z0-9_-]{16,}")
# A credential a JSON text names by its key: an event's payload (logged whole at debug)
# carries the app's verification token in its header.
_JSON_CREDENTIAL = re.compile(
    r'("(?:token|encrypt_key|app_secret|secret|[a-z_]*access_token|refresh_token)"\s*:\s*")'
    r'(?:[^"\\]|\\.)*"'
)
_LOOP_EXIT = re.compile(r"receive message loop exit, err: (?P<reason>.*?)(?: \[conn_id=[^]]*\])?$")
_CLOSE_CODE = re.compile(r"\b(?:received|sent) (\d{4})\b")
_NORMAL_CLOSE: Final = frozenset({"1000", "1001"})


class NormalCloseIsNoError(logging.Filter):
    """Lowers lark-oapi's ERROR for a connection closed the normal way to one INFO line in
    our words: the library reconnects by itself, so it is routine, and an ERROR for it
    teaches people to ignore the real ones (a refused connection, an abnormal close, which
    stay errors)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno != logging.ERROR:
            return True
        found = _LOOP_EXIT.match(record.getMessage())
        if found is None:
            return True
        codes = _CLOSE_CODE.findall(found["reason"])
        if not codes or not set(codes) <= _NORMAL_CLOSE:
            return True
        record.msg = "feishu long connection closed by Feishu (%s); reconnecting"
        record.args = (found["reason"],)
        record.levelno, record.levelname = logging.INFO, "INFO"
        return True


class LarkLinesAsOurs(logging.Filter):
    """lark-oapi's records as our log writes them: under the name `lark_oapi`, with any URL's
    query, `Bearer` value, tenant token or JSON credential field (an event's `token`) in the
    text replaced by `***` (the configured app secret is masked by the log's own formatter,
    `bridge.run.logs`; these are credentials the library gets at run time, which no
    configuration names)."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.name = LARK_NAME
        text = record.getMessage()
        masked = _URL_QUERY.sub(r"\1?***", text)
        masked = _BEARER.sub(r"\1 ***", masked)
        masked = _TENANT_TOKEN.sub("***", masked)
        masked = _JSON_CREDENTIAL.sub(r'\1***"', masked)
        if masked != text:
            record.msg, record.args = masked, None
        return True


def lark_at_our_level() -> None:
    """Let lark-oapi's logger take the level our log was configured with: its `ws.Client`
    sets the logger's own level when it is made (to the level it is given)."""
    logging.getLogger(LARK_LOGGER).setLevel(logging.NOTSET)


def _adopt_lark_logger() -> None:
    lark_log = logging.getLogger(LARK_LOGGER)
    if not any(isinstance(f, NormalCloseIsNoError) for f in lark_log.filters):
        lark_log.addFilter(NormalCloseIsNoError())
    if not any(isinstance(f, LarkLinesAsOurs) for f in lark_log.filters):
        lark_log.addFilter(LarkLinesAsOurs())  # after the one above, which reads its text


_adopt_lark_logger()


def _cancel_everything(loop: asyncio.AbstractEventLoop) -> None:
    for task in asyncio.all_tasks(loop):
        task.cancel()


class EveryEvent(EventDispatcherHandler):  # type: ignore[misc]  # lark-oapi is untyped
    """The dispatcher `lark_oapi.ws.Client` calls with each event's payload: every event, of
    any type, goes to `deliver` as the JSON document Feishu sent (the HTTP callback's shape).
    Whatever `deliver` raises makes the client answer 500, so Feishu delivers it again."""

    def __init__(self, deliver: Callable[[dict[str, Any]], None]) -> None:
        super().__init__()
        self._deliver = deliver

    def _do_without_validation(self, payload: bytes) -> Any:
        try:
            document = read_json_object(payload, "event")
        except EventRejected as rejected:
            # Acknowledged all the same: the same bytes delivered again cannot read better.
            log.warning("feishu long connection: event skipped: %s", rejected.reason)
            return None
        self._deliver(document)
        return None


class SkipsUnreadableFrames(lark_oapi.ws.Client):  # type: ignore[misc]  # lark-oapi is untyped
    """`lark_oapi.ws.Client` that answers a frame whose payload is not UTF-8.

    The library decodes every event's payload for a debug line before it calls the
    dispatcher, outside its own error handling: such a frame ended in an ERROR line from
    the library and no answer at all, so Feishu delivered it again and again. It is
    answered here as `EveryEvent` answers an event that is not JSON: skipped with one
    warning, and acknowledged.
    """

    async def _handle_data_frame(self, frame: Any) -> None:
        try:
            await super()._handle_data_frame(frame)
        except UnicodeDecodeError:
            # Only that debug line can raise it: the dispatcher's errors are caught inside.
            log.warning("feishu long connection: event skipped: event is not UTF-8 text")
            frame.payload = JSON.marshal(Response(code=http.HTTPStatus.OK)).encode()
            await self._write_message(frame.SerializeToString())


class LongConnection:
    """One `lark_oapi.ws.Client` in its own thread; `start` once, `stop` any number of times."""

    def __init__(
        self,
        app_id: str,
        app_secret: str,
        domain: str,
        deliver: Callable[[dict[str, Any]], None],
    ) -> None:
        self._app_id = app_id
        self._app_secret = app_secret
        self._domain = domain
        self._deliver = deliver
        self._guard = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping = False
        self._thread: threading.Thread | None = None
        self.failure: str | None = None

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> None:
        if self._thread is not None:
            return
        self._thread = threading.Thread(
            target=self._run, name="feishu-long-connection", daemon=True
        )
        self._thread.start()

    async def stop(self, join_timeout_s: float = 5.0) -> None:
        with self._guard:
            self._stopping = True
            loop = self._loop
        if loop is not None and not loop.is_closed():
            # The loop may close between the check and the call: then nothing is left to cancel.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(_cancel_everything, loop)
        thread = self._thread
        if thread is not None and thread.is_alive():
            await asyncio.to_thread(thread.join, join_timeout_s)
            if thread.is_alive():
                log.warning("feishu long connection thread did not stop within %gs", join_timeout_s)

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        with self._guard:
            if self._stopping:
                loop.close()
                return
            self._loop = loop
            # Borrow the module-level loop slot; the previous value is restored afterwards,
            # so the loop the library made at import is neither closed nor left to the GC.
            previous_loop = ws_client_module.loop
            ws_client_module.loop = loop
        handler = EveryEvent(self._deliver)
        client = SkipsUnreadableFrames(
            self._app_id,
            self._app_secret,
            log_level=LogLevel.WARNING,
            event_handler=handler,
            domain=self._domain,
        )
        lark_at_our_level()
        try:
            client.start()
        except asyncio.CancelledError:
            log.debug("feishu long connection stopped")
        except Exception as error:
            # Bad credentials end the client for good; the reason is kept for `start`'s caller.
            self.failure = f"{type(error).__name__}: {error}"
            log.error("feishu long connection ended: %s", self.failure)
        finally:
            self._close(loop, client)
            ws_client_module.loop = previous_loop

    @staticmethod
    def _close(loop: asyncio.AbstractEventLoop, client: Any) -> None:
        try:
            loop.run_until_complete(client._disconnect())
        except (Exception, asyncio.CancelledError) as error:
            log.debug("feishu long connection close: %s", type(error).__name__)
        _cancel_everything(loop)
        pending = asyncio.all_tasks(loop)
        if pending:
            loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()
