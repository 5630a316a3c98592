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
from tests.fakes.feishu_api import TOKEN_PATH, FakeFeishu, FakeMessage


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


async def test_a_token_request_answers_the_live_token_until_half_an_hour_is_left() -> None:
    """Feishu answers a tenant token request with the token it gave before, and the seconds
    it has left as `expire`, while half an hour or more is left; then a new one, the old
    one still valid until it expires. The fake gave a new two-hour token every time, so a
    client that took `expire` for the full two hours was never caught."""
    now_s = [1000.0]
    async with FakeFeishu(rate_clock=lambda: now_s[0]) as fake, aiohttp.ClientSession() as session:

        async def token() -> tuple[str, int]:
            body = {"app_id": fake.app_id, "app_secret": fake.app_secret}
            async with session.post(f"{fake.base_url}{TOKEN_PATH}", json=body) as answer:
                document = await answer.json()
            return document["tenant_access_token"], document["expire"]

        async def works(value: str) -> bool:
            headers = {"Authorization": f"Bearer {value}"}
            async with session.get(f"{fake.base_url}/open-apis/bot/v3/info", headers=headers) as a:
                return (await a.json())["code"] == 0

        first, expire = await token()
        assert expire == 7200
        now_s[0] += 5000
        assert await token() == (first, 2200)
        now_s[0] += 500  # 1700 s left: a new token
        second, expire = await token()
        assert second != first and expire == 7200
        assert await works(first) and await works(second)
        now_s[0] += 1700
        assert not await works(first)
        assert await works(second)


async def test_a_send_whose_answer_is_lost_is_posted_and_its_uuid_answers_it_again() -> None:
    """`drop_after_accept` posts the message and closes the connection unanswered, as a
    network that loses Feishu's answer does; a send again with the same uuid posts nothing
    and answers the first message (Feishu: one message per uuid within an hour)."""
    async with FakeFeishu() as fake, aiohttp.ClientSession() as session:
        body = {"app_id": fake.app_id, "app_secret": fake.app_secret}
        async with session.post(f"{fake.base_url}{TOKEN_PATH}", json=body) as answer:
            token = (await answer.json())["tenant_access_token"]
        url = f"{fake.base_url}/open-apis/im/v1/messages?receive_id_type=chat_id"
        headers = {"Authorization": f"Bearer {token}"}
        send = {
            "receive_id": "oc_1",
            "msg_type": "text",
            "content": json.dumps({"text": "hello"}),
            "uuid": "notice-1",
        }
        fake.drop_after_accept("send")
        with pytest.raises(aiohttp.ClientError):
            async with session.post(url, json=send, headers=headers) as answer:
                await answer.read()
        assert fake.texts("oc_1") == ["hello"]
        async with session.post(url, json=send, headers=headers) as answer:
            document = await answer.json()
        assert document["code"] == 0
        assert [m.message_id for m in fake.chat("oc_1")] == [document["data"]["message_id"]]
