"""The lean Telegram transport's failure modes, against scripted HTTP servers on 127.0.0.1.

Each server answers requests as its script says (answer, answer then hang up, cut the answer
off, stay silent) and counts what arrived, so every test can say both what the caller saw
and how many times the request reached the server: a request that may have been performed
is never sent a second time.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import socket
import ssl
import subprocess
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from telegram import error as tg
from telegram.request import RequestData
from telegram.request._requestparameter import RequestParameter

from taskcard.channels.base import CardView, ChatRef
from taskcard.channels.errors import OutcomeUnknown, RateLimited, Transient
from taskcard.channels.telegram.channel import TelegramChannel
from taskcard.channels.telegram.config import TelegramConfig
from taskcard.channels.telegram.http11 import (
    LeanRequest,
    _Incomplete,
    _read_answer,
    proxy_configured,
)
from taskcard.channels.telegram.request import (
    AnswerLost,
    FloodWait,
    checked_answer,
    checked_success,
)
from tests.channels.conftest import MemoryCursorStore, wait_until

OK_BODY = b'{"ok":true,"result":{"message_id":5,"date":1,"chat":{"id":-1,"type":"group"}}}'
PATH = "/bot1:T/sendMessage"
GET_ME = b'{"ok":true,"result":{"id":1,"is_bot":true,"first_name":"b","username":"b"}}'


def _answer(body: bytes = OK_BODY, status: str = "200 OK", extra: bytes = b"") -> bytes:
    head = f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\n".encode()
    return head + extra + b"Content-Length: %d\r\n\r\n" % len(body) + body


@dataclass
class ScriptedServer:
    """Per connection, the n-th request gets `script[n]`: bytes to answer with, or one of
    "close" (read it, hang up), "silent" (read it, never answer). Past the script's end
    the connection is closed after answering the last step's bytes."""

    script: list[bytes | str]
    close_after_script: bool = True
    requests: list[bytes] = field(default_factory=list)
    connections: int = 0
    server: asyncio.Server | None = None
    handlers: set[asyncio.Task[None]] = field(default_factory=set)

    @property
    def url(self) -> str:
        assert self.server is not None
        port = self.server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        handler = asyncio.current_task()
        assert handler is not None
        self.handlers.add(handler)
        try:
            for step in self.script:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
                self.requests.append(head + await reader.readexactly(length))
                if step == "close":
                    return  # `finally` hangs up
                if step == "silent":
                    await asyncio.Event().wait()
                assert isinstance(step, bytes)
                writer.write(step)
                await writer.drain()
            if not self.close_after_script:
                await asyncio.Event().wait()
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            pass  # the test ended (its loop cancels a silent connection) or the client left
        finally:
            writer.close()


@asynccontextmanager
async def scripted(
    *script: bytes | str, ssl_context: ssl.SSLContext | None = None, keep_open: bool = False
) -> AsyncIterator[ScriptedServer]:
    server = ScriptedServer(list(script), close_after_script=not keep_open)
    server.server = await asyncio.start_server(server._handle, "127.0.0.1", 0, ssl=ssl_context)
    try:
        yield server
    finally:
        server.server.close()
        # A connection still open (kept alive, or silent) is closed here, on the test's
        # loop: left to the loop's end, its pending handler and unclosed transport were
        # reported as unraisable warnings in whichever test the collector ran next.
        for handler in server.handlers:
            handler.cancel()
        await asyncio.gather(*server.handlers, return_exceptions=True)


def _data(text: str = "hello") -> RequestData:
    return RequestData(
        [RequestParameter.from_input("chat_id", -1), RequestParameter.from_input("text", text)]
    )


async def _post(request: LeanRequest, base: str, **timeouts: float) -> object:
    return await request.post(f"{base}{PATH}", request_data=_data(), **timeouts)


@pytest.fixture
async def lean() -> AsyncIterator[LeanRequest]:
    request = LeanRequest(pool_size=4, timeout_s=20.0)
    await request.initialize()
    yield request
    await request.shutdown()


async def test_keep_alive_reuses_one_connection_and_sends_json(lean: LeanRequest) -> None:
    async with scripted(_answer(), _answer(), keep_open=True) as server:
        authority = server.url.removeprefix("http://")
        assert (await _post(lean, server.url))["message_id"] == 5  # type: ignore[index]
        assert (await _post(lean, server.url))["message_id"] == 5  # type: ignore[index]
    assert server.connections == 1
    head, _, body = server.requests[0].partition(b"\r\n\r\n")
    assert head.startswith(b"POST /bot1:T/sendMessage HTTP/1.1\r\n")
    assert f"\r\nHost: {authority}\r\n".encode() in head
    assert b"content-type: application/json" in head.lower()
    assert json.loads(body) == {"chat_id": -1, "text": "hello"}


async def test_connection_refused_is_a_network_error_that_sent_nothing(
    lean: LeanRequest,
) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with pytest.raises(tg.NetworkError) as caught:
        await _post(lean, f"http://127.0.0.1:{port}")
    assert not isinstance(caught.value, AnswerLost)
    assert "nothing was sent" in caught.value.message


@pytest.mark.parametrize(
    ("body", "said"),
    [(b"x", "1 byte, not a JSON object"), (b"<p>", "3 bytes, not a JSON object")],
)
async def test_a_body_that_is_not_json_is_told_by_its_size_in_words_that_agree(
    lean: LeanRequest, body: bytes, said: str
) -> None:
    async with scripted(_answer(body, "502 Bad Gateway")) as server:
        with pytest.raises(tg.NetworkError) as caught:
            await _post(lean, server.url)
    assert caught.value.message.endswith(f"(a body of {said})")


async def test_answer_cut_off_after_the_write_is_answer_lost(lean: LeanRequest) -> None:
    cut = _answer()[:-10]
    async with scripted(cut) as server:
        with pytest.raises(AnswerLost):
            await _post(lean, server.url)
    assert len(server.requests) == 1


async def test_an_oversized_answer_head_is_answer_lost(lean: LeanRequest) -> None:
    # A head past the reader's 64 KiB limit: the request went out, the answer is unusable.
    huge = _answer(extra=b"X-Filler: " + b"x" * (70 * 1024) + b"\r\n")
    async with scripted(huge) as server:
        with pytest.raises(AnswerLost) as caught:
            await _post(lean, server.url)
    assert "LimitOverrunError" in caught.value.message
    assert len(server.requests) == 1
    assert lean.idle_connections() == 0


async def test_hang_up_without_an_answer_is_answer_lost_and_not_resent(
    lean: LeanRequest,
) -> None:
    # The second request goes out on the reused connection, which the server then drops
    # without answering: it may have been performed, so it is not tried again.
    async with scripted(_answer(), "close", keep_open=True) as server:
        await _post(lean, server.url)
        with pytest.raises(AnswerLost):
            await _post(lean, server.url)
    assert len(server.requests) == 2
    assert server.connections == 1


async def test_a_keep_alive_connection_closed_while_idle_is_replaced(
    lean: LeanRequest,
) -> None:
    # Each connection answers one request and is then closed by the server.
    async with scripted(_answer()) as server:
        await _post(lean, server.url)
        await wait_until(lambda: lean.idle_connections() == 0, what="the client sees the close")
        assert (await _post(lean, server.url))["message_id"] == 5  # type: ignore[index]
    assert len(server.requests) == 2
    assert server.connections == 2


async def test_connection_close_header_is_honoured(lean: LeanRequest) -> None:
    closing = _answer(extra=b"Connection: close\r\n")
    async with scripted(closing, closing, keep_open=True) as server:
        await _post(lean, server.url)
        assert lean.idle_connections() == 0
        await _post(lean, server.url)
    assert server.connections == 2


async def test_read_timeout_is_answer_lost(lean: LeanRequest) -> None:
    async with scripted("silent") as server:
        with pytest.raises(AnswerLost) as caught:
            await _post(lean, server.url, read_timeout=0.2)
    assert "TimeoutError" in caught.value.message
    assert len(server.requests) == 1


async def test_requests_on_their_way_share_one_read_timer(
    lean: LeanRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A timer per request piles cancelled timers up in the loop's heap at a hundred
    # requests a second; one timer keeps every read deadline. It still stands at the
    # earliest one: a request with a shorter timeout than the one the timer stands for
    # times out on its own time, and a cancellation from elsewhere stays one.
    loop = asyncio.get_running_loop()
    timers: list[float] = []
    plain_call_at = loop.call_at

    def counting_call_at(when: float, *args: Any, **kwargs: Any) -> asyncio.TimerHandle:
        # Only timers as far off as the transport's timeouts (20 s): short ones the loop,
        # the scripted server or a loaded machine's slow steps set are not the transport's.
        if when - loop.time() > 10:
            timers.append(when)
        return plain_call_at(when, *args, **kwargs)

    quick = [_answer() for _ in range(20)]
    async with scripted(*quick, keep_open=True) as server:
        monkeypatch.setattr(loop, "call_at", counting_call_at)
        for _ in quick:
            assert (await _post(lean, server.url))["message_id"] == 5  # type: ignore[index]
        monkeypatch.undo()
    assert len(timers) <= 2, timers  # the connection's connect timeout, the read timer
    assert server.connections == 1
    async with scripted("silent") as silent:
        # The timer stands at the quick requests' 20 s; this request's 0.2 s comes first.
        with pytest.raises(AnswerLost) as caught:
            async with asyncio.timeout(15):
                await _post(lean, silent.url, read_timeout=0.2)
    assert "TimeoutError" in caught.value.message
    async with scripted("silent") as silent:
        hanging = asyncio.create_task(_post(lean, silent.url))
        await wait_until(lambda: len(silent.requests) == 1, what="the request")
        hanging.cancel()
        with pytest.raises(asyncio.CancelledError):
            await hanging


async def test_pool_timeout_sends_nothing() -> None:
    request = LeanRequest(pool_size=1, timeout_s=20.0)
    async with scripted("silent") as server:
        hanging = asyncio.create_task(_post(request, server.url))
        await wait_until(lambda: len(server.requests) == 1, what="the first request")
        with pytest.raises(tg.TimedOut) as caught:
            await _post(request, server.url, pool_timeout=0.1)
        assert not isinstance(caught.value, AnswerLost)
        assert "not sent" in caught.value.message
        hanging.cancel()
        with pytest.raises(asyncio.CancelledError):
            await hanging
    assert len(server.requests) == 1
    await request.shutdown()


async def test_429_with_retry_after_is_flood_wait(lean: LeanRequest) -> None:
    body = b'{"ok":false,"error_code":429,"description":"Too Many Requests: retry after 7",'
    body += b'"parameters":{"retry_after":7}}'
    async with scripted(_answer(body, "429 Too Many Requests")) as server:
        with pytest.raises(FloodWait) as caught:
            await _post(lean, server.url)
    assert caught.value.retry_after_s == 7
    assert "retry after 7" in caught.value.message


async def test_an_error_status_reaches_ptb_unchanged(lean: LeanRequest) -> None:
    body = b'{"ok":false,"error_code":400,"description":"Bad Request: message is too long"}'
    async with scripted(_answer(body, "400 Bad Request")) as server:
        with pytest.raises(tg.BadRequest, match=r"(?i)message is too long"):
            await _post(lean, server.url)


async def test_channel_over_a_refused_port_is_transient() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    config = TelegramConfig(api_base_url=f"http://127.0.0.1:{port}", commands=False)
    channel = TelegramChannel(config, "1:T", MemoryCursorStore())

    async def ignore(command: object) -> None:
        del command

    with pytest.raises(Transient):
        await channel.start(ignore)


def _feed(data: bytes) -> asyncio.StreamReader:
    reader = asyncio.StreamReader()
    reader.feed_data(data)
    reader.feed_eof()
    return reader


@pytest.mark.parametrize(
    ("raw", "status", "body", "keep_alive"),
    [
        (_answer(b"{}"), 200, b"{}", True),
        (
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
            b'3\r\n{"a\r\n4;x=1\r\n":1}\r\n0\r\nTrailer: t\r\n\r\n',
            200,
            b'{"a":1}',
            True,
        ),
        (b"HTTP/1.1 200 OK\r\n\r\nuntil the end", 200, b"until the end", False),
        (b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok", 200, b"ok", False),
        (
            b"HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 2\r\n\r\nok",
            200,
            b"ok",
            True,
        ),
        (b"HTTP/1.1 204 No Content\r\n\r\n", 204, b"", True),
        # Header names in any case and with spaces before the colon; names that only
        # contain one of the names read are not them.
        (
            b"HTTP/1.1 200 OK\r\nX-Content-Length: 9\r\ncontent-LENGTH \t: 2\r\n"
            b"Content-Length-Extra: 7\r\nServer: x\r\n\r\nok",
            200,
            b"ok",
            True,
        ),
        (
            b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nCONNECTION:  Close\r\n\r\nok",
            200,
            b"ok",
            False,
        ),
        (b"HTTP/1.1 100 Continue\r\n\r\n" + _answer(b"{}"), 200, b"{}", True),
    ],
)
async def test_answers_are_read_by_length_chunks_or_end(
    raw: bytes, status: int, body: bytes, keep_alive: bool
) -> None:
    answer = await _read_answer(_feed(raw))
    assert (answer.status, answer.body, answer.keep_alive) == (status, body, keep_alive)


@pytest.mark.parametrize(
    "raw",
    [
        b"",
        b"SMTP ready\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nabXY",
        # Digits `str.isdigit` accepts and `int` refuses, and a negative chunk size.
        b"HTTP/1.1 \xb200 OK\r\n\r\n",
        b"HTTP/1.1 20\r\n\r\n",  # a status code is three digits
        b"HTTP/2 200\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: \xb2\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\rX\r\n\r\nok",  # a lone CR is no line end
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n-5\r\nabc",
    ],
)
async def test_broken_answers_are_incomplete(raw: bytes) -> None:
    with pytest.raises(_Incomplete):
        await _read_answer(_feed(raw))


SENT = {"ok": True, "result": {"message_id": 9, "date": 3, "chat": {"id": -5, "type": "group"}}}


@pytest.mark.parametrize(
    ("endpoint", "payload", "expected"),
    [
        ("editMessageText", OK_BODY, {"ok": True, "result": True}),
        # A full message in another order and with extra fields, or `true`: an edit done.
        (
            "editMessageText",
            b'{"result":{"chat":{"type":"group","id":-1},"message_id":5,"x":[1]},"ok":true}',
            {"ok": True, "result": True},
        ),
        ("editMessageText", b'{"ok": true, "result": true}', {"ok": True, "result": True}),
        ("deleteMessage", b'{"ok":true,"result":true}', {"ok": True, "result": True}),
        ("pinChatMessage", b'{"ok":true,"result":true}', {"ok": True, "result": True}),
        (
            "sendMessage",
            b'{"ok":true,"result":{"message_id":9,"date":3,"text":"x","entities":[],'
            b'"chat":{"id":-5,"type":"group","title":"t"},"from":{"id":1,"is_bot":true}}}',
            SENT,
        ),
        # Fields in another order, extra ones, and the id as a string of digits.
        (
            "sendMessage",
            b'{"result":{"chat":{"title":"t","type":"group","id":-5},"date":3,'
            b'"message_id":"9","via":{}},"ok":true,"extra":1}',
            SENT,
        ),
        # Without date or chat (PTB needs them): the id is what the channel reads.
        (
            "sendMessage",
            b'{"ok":true,"result":{"message_id":9}}',
            {
                "ok": True,
                "result": {"message_id": 9, "date": 0, "chat": {"id": 0, "type": "private"}},
            },
        ),
        ("getUpdates", b'{"ok":true,"result":[]}', None),
        ("getMe", GET_ME, None),
    ],
)
def test_checked_success(endpoint: str, payload: bytes, expected: object) -> None:
    checked = checked_success(endpoint, payload)
    if expected is None:
        assert checked == payload  # untouched: PTB sees exactly what came
    else:
        assert json.loads(checked) == expected


@pytest.mark.parametrize(
    ("endpoint", "payload"),
    [
        ("sendMessage", b'{"ok":true,"result":true}'),
        ("sendMessage", b'{"ok":true,"result":[{"message_id":9}]}'),
        ("sendMessage", b'{"ok":true,"result":{"date":3,"chat":{"id":-5,"type":"group"}}}'),
        ("sendMessage", b'{"ok":true,"result":{"message_id":9.5}}'),
        ("sendMessage", b'{"ok":true,"result":{"message_id":"nine"}}'),
        ("sendMessage", b'{"ok":true,"result":{"message_id":true}}'),
        ("sendMessage", b'{"ok":true,"result":{"message_id":0}}'),
        ("editMessageText", b'{"ok":true,"result":[1]}'),
        ("editMessageText", b'{"ok":true,"result":false}'),
        ("deleteMessage", b'{"ok":true,"result":{"message_id":5}}'),
        ("pinChatMessage", b'{"ok":true,"result":"yes"}'),
        ("getMe", b'{"ok":true,"result":{"id":1}}'),
        ("getMe", b'{"ok":true,"result":true}'),
    ],
)
def test_a_success_of_another_shape_is_an_unknown_outcome(endpoint: str, payload: bytes) -> None:
    with pytest.raises(AnswerLost, match=endpoint):
        checked_success(endpoint, payload)


NOT_MODIFIED = b'{"ok":false,"error_code":400,"description":"Bad Request: message is not modified"}'
TRUE_ANSWER = {"ok": True, "result": True}


@pytest.mark.parametrize(
    ("endpoint", "status", "payload", "expected"),
    [
        # Answered as the Bot API writes them: known by the one match.
        ("editMessageText", 200, OK_BODY, (200, TRUE_ANSWER)),
        ("deleteMessage", 200, b'{"ok":true,"result":true}', (200, TRUE_ANSWER)),
        ("pinChatMessage", 200, b'{ "ok" : true , "result" : true }', (200, TRUE_ANSWER)),
        # Any other success is read in full, as before.
        (
            "editMessageText",
            200,
            b'{"result":{"chat":{"type":"group","id":-1},"message_id":5},"ok":true}',
            (200, TRUE_ANSWER),
        ),
        ("editMessageText", 201, OK_BODY, (201, TRUE_ANSWER)),
        ("sendMessage", 200, OK_BODY, (200, json.loads(checked_success("sendMessage", OK_BODY)))),
        # Errors reach PTB as `read_answer` leaves them, also under a success status.
        ("editMessageText", 400, NOT_MODIFIED, (400, json.loads(NOT_MODIFIED))),
        ("editMessageText", 200, NOT_MODIFIED, (400, json.loads(NOT_MODIFIED))),
    ],
)
def test_checked_answer_is_read_answer_then_checked_success(
    endpoint: str, status: int, payload: bytes, expected: tuple[int, object]
) -> None:
    code, body = checked_answer(endpoint, status, payload)
    assert (code, json.loads(body)) == expected


@pytest.mark.parametrize(
    ("endpoint", "payload"),
    [
        ("editMessageText", b'{"ok":true,"result":[1]}'),
        ("deleteMessage", b'{"ok":true,"result":{"message_id":5}}'),
        ("sendMessage", b'{"ok":true,"result":true}'),
    ],
)
def test_checked_answer_of_another_shape_is_an_unknown_outcome(
    endpoint: str, payload: bytes
) -> None:
    with pytest.raises(AnswerLost, match=endpoint):
        checked_answer(endpoint, 200, payload)


PROXY_VARIABLES = ("https_proxy", "http_proxy", "all_proxy", "no_proxy")


@pytest.fixture
def no_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    """No proxy variable from the machine's environment, in either spelling."""
    for name in PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.upper(), raising=False)


async def started_through(
    proxy: ScriptedServer, monkeypatch: pytest.MonkeyPatch
) -> TelegramChannel:
    """A channel started with `proxy` as the environment's HTTP proxy (the API is plain HTTP
    at a name that does not resolve: only the proxy can carry its requests)."""
    monkeypatch.setenv("http_proxy", proxy.url)
    config = TelegramConfig(api_base_url="http://bot-api.invalid:8081", commands=False)
    channel = TelegramChannel(config, "1:T", MemoryCursorStore())

    async def ignore(command: object) -> None:
        del command

    await channel.start(ignore)
    return channel


@pytest.mark.parametrize(
    ("env", "configured"),
    [
        ({}, False),
        ({"https_proxy": "http://proxy:3128"}, True),
        ({"ALL_PROXY": "socks5://proxy:1080"}, True),
        ({"http_proxy": "http://proxy:3128"}, False),  # the API is https
        ({"https_proxy": "http://proxy:3128", "no_proxy": "api.telegram.org"}, False),
    ],
)
def test_proxy_configured(
    monkeypatch: pytest.MonkeyPatch, no_proxy: None, env: dict[str, str], configured: bool
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert proxy_configured("https://api.telegram.org") is configured


@pytest.fixture
def certificate(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("needs the openssl command to make a test certificate")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        [
            openssl,
            *("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"),
            *("-subj", "/CN=localhost", "-addext", "subjectAltName=IP:127.0.0.1"),
            *("-keyout", str(key), "-out", str(cert)),
        ],
        check=True,
        capture_output=True,
    )
    yield cert, key


async def test_https_verifies_the_certificate(certificate: tuple[Path, Path]) -> None:
    cert, key = certificate
    server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_context.load_cert_chain(cert, key)
    async with scripted(_answer(), ssl_context=server_context) as server:
        https = server.url.replace("http://", "https://")
        # The public CA bundle does not vouch for a self-signed certificate: refused, unsent.
        default = LeanRequest(pool_size=1, timeout_s=20.0)
        with pytest.raises(tg.NetworkError) as caught:
            await _post(default, https)
        assert not isinstance(caught.value, AnswerLost)
        assert server.requests == []
        # Trusting it, the same server answers over TLS.
        trusting = LeanRequest(
            pool_size=1, timeout_s=20.0, ssl_context=ssl.create_default_context(cafile=cert)
        )
        assert (await _post(trusting, https))["message_id"] == 5  # type: ignore[index]
        await trusting.shutdown()
    assert len(server.requests) == 1


async def test_channel_edit_sends_raw_entities_and_no_preview() -> None:
    # Entities and preview options go as plain JSON (no PTB objects); the edit's answer is
    # not turned into a message.
    async with scripted(
        _answer(b'{"ok":true,"result":{"id":1,"is_bot":true,"first_name":"b","username":"b"}}'),
        _answer(OK_BODY),
        keep_open=True,
    ) as server:
        config = TelegramConfig(api_base_url=server.url, commands=False)
        channel = TelegramChannel(config, "1:T", MemoryCursorStore())

        async def ignore(command: object) -> None:
            del command

        await channel.start(ignore)
        # A card: its bold header and Markdown body carry entities (plain text has none).
        view = CardView(agent_id="a", state="running", auto_rows=(), body="**bold** move")
        message = channel.render_card(view)
        await channel.edit(ChatRef("-1"), "5", message)
        await channel.stop()
    sent = json.loads(server.requests[1].partition(b"\r\n\r\n")[2])
    assert sent["link_preview_options"] == {"is_disabled": True}
    assert sent["message_id"] == 5 and sent["chat_id"] == -1
    assert sent["entities"] == message.payload["entities"] != []


async def test_a_proxy_in_the_environment_carries_the_requests(
    monkeypatch: pytest.MonkeyPatch, no_proxy: None
) -> None:
    # The lean transport has no proxy support, so with a proxy configured the channel uses
    # PTB's httpx transport, which sends every request through it.
    async with scripted(_answer(GET_ME), keep_open=True) as proxy:
        channel = await started_through(proxy, monkeypatch)
        assert channel.bot_username == "b"
        await channel.stop()
    assert proxy.requests[0].startswith(b"POST http://bot-api.invalid:8081/bot1:T/getMe ")


async def test_through_a_proxy_a_429_and_a_lost_answer_keep_their_meaning(
    monkeypatch: pytest.MonkeyPatch, no_proxy: None
) -> None:
    # PTB's httpx transport (used with a proxy) translates the same two signals as the lean
    # one: a 429 is a rate limit with its wait, a hang-up after the write an unknown outcome
    # that is not sent again.
    flood = b'{"ok":false,"error_code":429,"description":"Too Many Requests: retry after 7",'
    flood += b'"parameters":{"retry_after":7}}'
    async with scripted(
        _answer(GET_ME), _answer(flood, "429 Too Many Requests"), "close", keep_open=True
    ) as proxy:
        channel = await started_through(proxy, monkeypatch)
        message = channel.render_text("move")
        with pytest.raises(RateLimited) as limited:
            await channel.edit(ChatRef("-1"), "5", message)
        assert limited.value.retry_after_s == 7
        with pytest.raises(OutcomeUnknown):
            await channel.edit(ChatRef("-1"), "5", message)
        await channel.stop()
    assert len(proxy.requests) == 3
    assert proxy.connections == 1


@pytest.mark.parametrize(
    "spacing",
    [
        pytest.param(lambda body: body, id="compact, as the Bot API writes it"),
        pytest.param(lambda body: json.dumps(json.loads(body)).encode(), id="re-encoded"),
    ],
)
async def test_edits_deletes_and_pins_answered_ok_decode_no_json(
    spacing: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Every card change is an edit: its answer is recognised by its first bytes, whatever
    # the JSON spacing, and neither this layer nor PTB decodes it.
    assert callable(spacing)
    edited = b'{"ok":true,"result":{"message_id":5,"date":1,"chat":{"id":-1,"type":"group"}}}'
    done = b'{"ok":true,"result":true}'
    async with scripted(
        _answer(GET_ME),
        _answer(spacing(edited)),
        _answer(spacing(done)),
        _answer(spacing(done)),
        _answer(spacing(done)),
        keep_open=True,
    ) as server:
        config = TelegramConfig(api_base_url=server.url, commands=False)
        channel = TelegramChannel(config, "1:T", MemoryCursorStore())

        async def ignore(command: object) -> None:
            del command

        await channel.start(ignore)
        decoded: list[object] = []
        plain_loads = json.loads

        def counting_loads(text: str | bytes, **kwargs: object) -> object:
            decoded.append(text)
            return plain_loads(text, **kwargs)  # type: ignore[arg-type]

        monkeypatch.setattr(json, "loads", counting_loads)
        message = channel.render_card(CardView(agent_id="a", state="running", auto_rows=()))
        await channel.edit(ChatRef("-1"), "5", message)  # answered with the message
        await channel.edit(ChatRef("-1"), "5", message)  # answered true
        await channel.pin(ChatRef("-1"), "5")
        await channel.delete(ChatRef("-1"), "5")
        monkeypatch.undo()
        await channel.stop()
    assert len(server.requests) == 5
    assert decoded == []
