"""Executing lark-oapi request models over one pooled `httpx.AsyncClient`.

lark-oapi 1.7.5's async calls (`acreate`, `apatch`, ...) go through `Transport.aexecute`,
which opens a new `httpx.AsyncClient` for every request: building its SSL context costs
about 23 ms of CPU on this machine, on the event loop, and no connection is ever reused.
Under a storm of card edits that alone would stall every route. So we keep lark-oapi's
request builders and response models (the wire format stays theirs) and send them through
a client owned by the channel, closed on `stop`.

A response is always returned with `raw` set (status and headers, needed for
`x-ogw-ratelimit-reset`); a body that is not a JSON object leaves `code` as None, and one
lark-oapi's model cannot read keeps its code, msg and message id (`_essentials`).
"""

from __future__ import annotations

import json
import urllib.parse
from typing import Any, TypeVar

import httpx
from lark_oapi.core.exception import UnmarshalException
from lark_oapi.core.json import JSON
from lark_oapi.core.model import BaseRequest, BaseResponse, RawResponse

from taskcard.channels.errors import Transient

Response = TypeVar("Response", bound=BaseResponse)

USER_AGENT = "taskcard-feishu"


def build_url(domain: str, request: BaseRequest) -> str:
    """`domain + uri` with each `:name` path parameter URL-encoded (no `/` passes through)."""
    uri = str(request.uri)
    for key, value in (request.paths or {}).items():
        uri = uri.replace(":" + key, urllib.parse.quote(str(value), safe=""))
    return domain.rstrip("/") + uri


class LarkTransport:
    """One pooled HTTP client for every Open API call of a channel."""

    def __init__(self, domain: str, timeout_s: float) -> None:
        self._domain = domain
        self._client = httpx.AsyncClient(
            timeout=timeout_s, headers={"User-Agent": USER_AGENT}, trust_env=False
        )

    async def aclose(self) -> None:
        await self._client.aclose()

    async def execute(
        self, request: BaseRequest, response_type: type[Response], token: str | None
    ) -> Response:
        """Send `request`; network failures and timeouts raise `Transient`."""
        headers = {"Content-Type": "application/json; charset=utf-8"}
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
        content: bytes | None = None
        if request.body is not None:
            content = (JSON.marshal(request.body) or "null").encode("utf-8")
        method = request.http_method.name if request.http_method is not None else "GET"
        try:
            answer = await self._client.request(
                method,
                build_url(self._domain, request),
                params=list(request.queries or []),
                content=content,
                headers=headers,
            )
        except httpx.TimeoutException:
            raise Transient("feishu: request timed out") from None
        except httpx.HTTPError as error:
            raise Transient(f"feishu: request failed: {type(error).__name__}") from None
        raw = RawResponse()
        raw.status_code = answer.status_code
        raw.headers = dict(answer.headers)
        raw.content = answer.content
        try:
            document: Any = json.loads(answer.content)
        except (ValueError, RecursionError):
            document = None
        response: Response
        try:
            response = response_type(document if isinstance(document, dict) else None)
        except UnmarshalException:
            response = _essentials(response_type, document)
        response.raw = raw
        return response


def _essentials(response_type: type[Response], document: dict[str, Any]) -> Response:
    """The answer's `code`, `msg` and `data.message_id` when lark-oapi cannot read the rest
    (a field of another type than its model's, such as a message `body` as text): what the
    channel reads of an answer, so a card that was posted keeps its id instead of being
    tried again and again under the same uuid."""
    data = document.get("data")
    message_id = data.get("message_id") if isinstance(data, dict) else None
    essentials: dict[str, Any] = {"code": document.get("code"), "msg": document.get("msg")}
    if isinstance(message_id, str):
        essentials["data"] = {"message_id": message_id}
    response: Response
    try:
        response = response_type(essentials)
    except UnmarshalException:
        response = response_type(None)
    return response
