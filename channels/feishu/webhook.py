"""The HTTP callback endpoint Feishu posts events to (`events = "webhook"`).

Feishu expects an answer within 3 seconds and redelivers otherwise, so the endpoint only
verifies, decodes and deduplicates, reads the command with `parse` (the channel's, which
knows the bot's open_id), hands it to `dispatch` (which schedules the
work elsewhere and returns at once) and answers. lark-oapi's `EventDispatcherHandler` is
not used because it is synchronous, answers 500 (so Feishu retries) for every event type
without a registered processor, and logs the failure text; we reuse only its cipher.
"""

from __future__ import annotations

import errno
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from aiohttp import web

from taskcard.channels.base import BIND_RETRY_S, IncomingCommand, bind_problem, bind_retrying
from taskcard.channels.errors import Permanent, Transient
from taskcard.channels.feishu.config import FeishuWebhook
from taskcard.channels.feishu.events import (
    EventNotRecorded,
    EventRejected,
    SeenEvents,
    check_request_age,
    decode_callback,
    duplicate_key,
)

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 1024 * 1024


class WebhookServer:
    """Serves `config.path` on `config.host:config.port`; `port` is the bound one."""

    def __init__(
        self,
        config: FeishuWebhook,
        dispatch: Callable[[IncomingCommand], None],
        seen: SeenEvents,
        verification_token: str | None,
        encrypt_key: str | None,
        parse: Callable[[Mapping[str, Any]], IncomingCommand | None],
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._config = config
        self._dispatch = dispatch
        self._parse = parse
        self._seen = seen
        self._verification_token = verification_token
        self._encrypt_key = encrypt_key
        self._clock = clock
        self._runner: web.AppRunner | None = None
        self._port: int | None = None

    @property
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError("the webhook server is not running")
        return self._port

    async def start(self) -> None:
        """Bind the listener. A port in use is tried again for `BIND_RETRY_S` (a previous
        instance still closing), with one warning; still in use then, `Transient`, so the
        channel's start is retried with backoff and the channel comes up once the port is
        free. Any other bind error is `Permanent`."""
        config = self._config
        where = f"[feishu.webhook] host {config.host!r}, port {config.port}"
        try:
            await bind_retrying(
                self._bind,
                lambda: log.warning(
                    "%s: the port is in use; trying again for up to %g s (stop what holds it,"
                    " or choose another port)",
                    where,
                    BIND_RETRY_S,
                ),
            )
        except OSError as error:
            if error.errno == errno.EADDRINUSE:
                raise Transient(f"{where}: {bind_problem(error)}") from None
            raise Permanent(f"{where}: {bind_problem(error)}") from None

    async def _bind(self) -> None:
        """One attempt: the app served on the configured address, or nothing left open."""
        app = web.Application(client_max_size=MAX_BODY_BYTES)
        app.router.add_post(self._config.path, self._handle)
        runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await runner.setup()
        try:
            await web.TCPSite(runner, self._config.host, self._config.port).start()
        except BaseException:
            await runner.cleanup()
            raise
        self._runner = runner
        addresses = runner.addresses
        self._port = int(addresses[0][1]) if addresses else self._config.port

    async def stop(self) -> None:
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()

    async def _handle(self, request: web.Request) -> web.Response:
        try:
            raw_body = await request.read()
        except web.HTTPRequestEntityTooLarge:
            # aiohttp's own answer is a text/plain line and no log; answered as every other
            # refusal is, so the sender and the operator read the same reason.
            reason = f"body larger than {MAX_BODY_BYTES} bytes"
            log.warning("feishu callback rejected: %s", reason)
            return web.json_response({"msg": reason}, status=413)
        try:
            decoded = decode_callback(
                raw_body, request.headers, self._verification_token, self._encrypt_key
            )
            stamp = request.headers.get("X-Lark-Request-Timestamp")
            # Signed when there is an encrypt key (decode_callback required it then); without
            # one a stale timestamp is still refused, though a forger could write a fresh one.
            if decoded.challenge is None and (self._encrypt_key or stamp is not None):
                check_request_age(
                    stamp, self._clock(), self._config.max_request_age_s, self._config.clock_skew_s
                )
        except EventRejected as rejected:
            log.warning("feishu callback rejected: %s", rejected.reason)
            return web.json_response({"msg": rejected.reason}, status=rejected.status)
        if decoded.challenge is not None:
            return web.json_response({"challenge": decoded.challenge})
        try:
            first = self._seen.first_time(duplicate_key(decoded))
        except EventNotRecorded as error:
            log.warning("%s", error)
            return web.json_response({"msg": "not recorded, deliver again"}, status=503)
        if not first:
            log.info("feishu event %s delivered again; ignored", decoded.event_id or "(no id)")
            return web.json_response({"msg": "duplicate"})
        command = self._parse(decoded.document)
        if command is not None:
            self._dispatch(command)
        return web.json_response({"msg": "success"})
