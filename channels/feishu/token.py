"""The tenant access token, fetched without blocking the event loop and cached per channel.

lark-oapi fetches tokens inside `verify()` with blocking `requests` (even from its async
`acreate`/`apatch`) and caches them in a process-wide class attribute keyed by app id. Both
are wrong for us: a blocking call would stall every route, and a process-wide cache would
leak a token between two channels (or two test fakes) with the same app id. So this source
supplies the token: fetched with lark-oapi's request model over our pooled transport,
cached with an injected clock, renewed ahead of expiry, and dropped when refused.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from lark_oapi.core.token import AccessTokenResponse, CreateSelfTenantTokenRequest
from lark_oapi.core.token.create_token_request_body import CreateTokenRequestBody

from taskcard.channels.errors import (
    AppUnavailable,
    CredentialsRejected,
    RateLimited,
    Transient,
    without_secrets,
)
from taskcard.channels.feishu.errors import (
    APP_RATE_LIMITED,
    APP_UNAVAILABLE,
    answer_code,
    retry_after_s,
)
from taskcard.channels.feishu.scopes import APP_SCOPE
from taskcard.channels.feishu.transport import LarkTransport

# Renew this long before the announced expiry (Feishu tokens live two hours).
RENEW_AHEAD_S = 300.0


class TenantTokenSource:
    """Hands out a valid tenant access token; one fetch at a time."""

    def __init__(
        self,
        transport: LarkTransport,
        app_id: str,
        app_secret: str,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._transport = transport
        self._app_id = app_id
        self._app_secret = app_secret
        self._clock = clock
        self._token: str | None = None
        self._expires_at_s = 0.0
        self._lock = asyncio.Lock()

    def invalidate(self) -> None:
        """Forget the cached token (the platform said it is invalid)."""
        self._token = None

    async def get(self) -> str:
        async with self._lock:
            if self._token is not None and self._clock() < self._expires_at_s:
                return self._token
            token, lifetime_s = await self._fetch()
            self._token = token
            self._expires_at_s = self._clock() + max(lifetime_s - RENEW_AHEAD_S, 1.0)
            return token

    async def _fetch(self) -> tuple[str, float]:
        body = CreateTokenRequestBody.builder().app_id(self._app_id)
        request = (
            CreateSelfTenantTokenRequest.builder()
            .request_body(body.app_secret(self._app_secret).build())
            .build()
        )
        answer = await self._transport.execute(request, AccessTokenResponse, token=None)
        status = answer.raw.status_code if answer.raw is not None else 0
        status = status or 0
        token = answer.tenant_access_token
        code = answer_code(answer.code)
        if code == 0 and isinstance(token, str) and token:
            expire = answer.expire
            return token, float(expire) if isinstance(expire, int | float) else 7200.0
        detail = f"feishu: tenant token request failed: HTTP {status}, code {code}"
        if status == 429 or code == APP_RATE_LIMITED:
            # The frequency limit (HTTP 429, or 400 on some APIs) says nothing about the
            # credentials: the app waits, as for any other call it makes.
            headers = answer.raw.headers if answer.raw is not None else {}
            raise RateLimited(retry_after_s(headers or {}), APP_SCOPE, detail)
        if code is None or code == 0 or status >= 500:
            # No answer, a server failure, or a success without a token: nothing here says
            # the credentials are wrong.
            raise Transient(detail)
        msg = without_secrets(str(answer.msg), (self._app_secret,))
        if code in APP_UNAVAILABLE:
            # The app refused as a whole (this host outside its IP allow-list, the app
            # disabled), not its credentials: held like any other call of it; the channel
            # sets the hold (`FeishuChannel._call`).
            reason = f"feishu: {APP_UNAVAILABLE[code]} (code {code}: {msg})"
            raise AppUnavailable(0.0, APP_SCOPE, reason)
        raise CredentialsRejected(f"feishu: app credentials rejected (code {code}: {msg})")
