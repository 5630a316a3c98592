"""The metrics and health listener: `GET /metrics` and `GET /healthz` on the service's loop.

It runs on the same event loop as the service, on purpose: the level gauges read the
service's state (and the SQLite store) without crossing threads, and a loop that stops
turning stops answering `/healthz`, which is exactly what a health check should see.
"""

from __future__ import annotations

import logging

from aiohttp import web

from taskcard.bridge.observe.metrics import CONTENT_TYPE, ServiceMetrics

log = logging.getLogger(__name__)


class MetricsListener:
    """Lifecycle: `start()` binds (raising `OSError` when the port is taken), `stop()` closes.

    `stop()` is idempotent.
    """

    def __init__(self, metrics: ServiceMetrics, host: str, port: int) -> None:
        self._metrics = metrics
        self._host = host
        self._port = port
        self._runner: web.AppRunner | None = None

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/metrics", self._metrics_page)
        app.router.add_get("/healthz", self._healthz)
        runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await runner.setup()
        try:
            await web.TCPSite(runner, self._host, self._port).start()
        except BaseException:
            await runner.cleanup()
            raise
        self._runner = runner
        # An IPv6 address goes in brackets, so the URL in the log can be pasted as it is.
        host = f"[{self._host}]" if ":" in self._host else self._host
        log.info("metrics and health on http://%s:%d/metrics, /healthz", host, self._port)

    async def stop(self) -> None:
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()

    async def _metrics_page(self, request: web.Request) -> web.Response:
        del request
        return web.Response(body=self._metrics.exposition(), headers={"Content-Type": CONTENT_TYPE})

    async def _healthz(self, request: web.Request) -> web.Response:
        del request
        healthy, answer = self._metrics.health()
        return web.json_response(answer, status=200 if healthy else 503)
