"""The fake Feishu itself: how it reads a sent message's mention of everyone, which the
end-to-end tests rely on to say that nothing pinged the whole chat, and how it hands events
to several long connections of one app (a cluster), which the cluster tests rely on."""

from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest
from lark_oapi.ws.pb.pbbp2_pb2 import Frame

from tests.e2e.harness import eventually
from tests.fakes.feishu_api import FakeFeishu, FakeMessage


def _card(tag: str, content: str) -> str:
    return json.dumps({"schema": "2.0", "body": {"elements": [{"tag": tag, "content": content}]}})


@pytest.mark.parametrize(
    ("msg_type", "content", "pings"),
    [
        ("text", json.dumps({"text": 'hi <at user_id="all"></at>'}), True),
        ("text", json.dumps({"text": "hi <AT  user_id = all>x</at>"}), True),
        ("text", json.dumps({"text": 'hi \uff1cat user_id="all"\uff1e @_all @all'}), False),
        ("interactive", _card("markdown", "see <at id=all></at>"), True),
        ("interactive", _card("markdown", "see <at ids=ou_1,all></at>"), True),
        ("interactive", _card("markdown", "see &lt;at id=all&gt;"), False),
        ("interactive", _card("markdown", "see <\u200bat id=all>"), False),
        ("interactive", _card("plain_text", "see <at id=all></at>"), False),
        ("post", json.dumps({"zh_cn": {"content": [[{"tag": "at", "user_id": "all"}]]}}), True),
    ],
)
def test_a_mention_of_everyone_is_read_as_feishu_reads_it(
    msg_type: str, content: str, pings: bool
) -> None:
    message = FakeMessage("om_1", "oc_1", msg_type, [content], 0.0)
    assert message.mentions_everyone is pings


async def test_an_event_goes_to_one_long_connection_of_the_app() -> None:
    """Feishu hands each event to one connection of an app, chosen at random among those
    open (cluster mode); the fake sent it over every one, so a cluster test passed even if
    only one instance could take events. Now each event reaches exactly one connection."""
    async with FakeFeishu() as fake, aiohttp.ClientSession() as session:
        received: list[list[str]] = [[], []]

        async def listen(socket: aiohttp.ClientWebSocketResponse, into: list[str]) -> None:
            async for message in socket:
                frame = Frame()
                frame.ParseFromString(message.data)
                into.append(json.loads(frame.payload)["header"]["event_id"])

        sockets = [await session.ws_connect(f"{fake.base_url}/ws") for _ in received]
        listeners = [
            asyncio.create_task(listen(s, r)) for s, r in zip(sockets, received, strict=True)
        ]
        await eventually(lambda: fake.ws_connections == 2, what="two long connections")
        sent = [fake.command_event("oc_1", "/taskcard", event_id=f"ev{n}") for n in range(40)]
        for event in sent:
            assert await fake.push_ws_event(event) == 1
        assert await fake.push_ws_event(
            fake.command_event("oc_1", "x", event_id="to1"), connection=1
        )
        await eventually(lambda: len(received[0]) + len(received[1]) == 41, what="the events")
        assert sorted(received[0] + received[1]) == sorted([f"ev{n}" for n in range(40)] + ["to1"])
        assert received[0] and received[1], "each connection gets some of the events"
        assert "to1" in received[1]
        for socket in sockets:
            await socket.close()
        await asyncio.gather(*listeners)
