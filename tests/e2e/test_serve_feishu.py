"""`taskcard serve` end to end against the fake Feishu Open API, with real lark-oapi.

Commands arrive through the HTTP callback endpoint, as Feishu delivers them (encrypted and
signed); cards go out as interactive messages and are updated with PATCH.
"""

from __future__ import annotations

import itertools
import json
import signal
import socket
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from taskcard.channels.base import BIND_RETRY_S
from tests.e2e.harness import (
    LONG_WINDOW_S,
    ServeProcess,
    eventually,
    lift_long_pauses,
    notify,
    publish,
    run_cli,
)
from tests.fakes.feishu_api import PIN_TOO_OFTEN, PINS_RESTRICTED, FakeFeishu, FakeLimits
from tests.redis_server import free_port

CHAT = "oc_fleet_group"
VERIFY = "fake-verification-token"
ENCRYPT = "fake-encrypt-key"
# A tenant whose administrator lets bots recall their messages for 30 days (Feishu's default
# is 24 hours): the copy a card past its 14 days left can then still be recalled.
TENANT_RECALL_WINDOW_S = 30 * 24 * 3600.0


@pytest.fixture
async def fake() -> AsyncIterator[FakeFeishu]:
    async with FakeFeishu() as server:
        yield server


class Setup:
    def __init__(self, tmp_path: Path, fake: FakeFeishu, agents: list[str]) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/feishu/events"
        for agent in agents:
            (tmp_path / "agents" / agent).mkdir(parents=True, exist_ok=True)
        lines = ['state_dir = ".taskcard"']
        for agent in agents:
            lines += ["[[agents]]", f'id = "{agent}"', f'workdir = "agents/{agent}"']
        lines += [
            "[feishu]",
            'app_id_env = "TC_FS_APP_ID"',
            'app_secret_env = "TC_FS_APP_SECRET"',
            f'domain = "{fake.base_url}"',
            'events = "webhook"',
            "[feishu.webhook]",
            'host = "127.0.0.1"',
            f"port = {self.port}",
            'path = "/feishu/events"',
            'verification_token_env = "TC_FS_VERIFY"',
            'encrypt_key_env = "TC_FS_ENCRYPT"',
            "[[feishu.routes]]",
            f'chat_id = "{CHAT}"',
            'agents = ["*"]',
        ]
        self.config = tmp_path / "taskcard.toml"
        self.config.write_text("\n".join(lines) + "\n")
        self.env = {
            "TC_FS_APP_ID": fake.app_id,
            "TC_FS_APP_SECRET": fake.app_secret,
            "TC_FS_VERIFY": VERIFY,
            "TC_FS_ENCRYPT": ENCRYPT,
        }

    def serve(self) -> ServeProcess:
        return ServeProcess(self.config, env=self.env)


def card_texts(fake: FakeFeishu) -> list[str]:
    return [m.text for m in fake.chat(CHAT) if m.msg_type == "interactive"]


async def test_create_then_patch_in_place(tmp_path: Path, fake: FakeFeishu) -> None:
    setup = Setup(tmp_path, fake, ["builder"])
    workdir = tmp_path / "agents" / "builder"
    with setup.serve() as serve:
        publish(workdir, "**compile** 1/3")
        await eventually(lambda: any("compile" in t for t in card_texts(fake)), what="card")
        card = fake.cards(CHAT)[0]
        assert card["schema"] == "2.0" and card["config"]["update_multi"] is True
        assert "builder" in str(card["header"])
        publish(workdir, "**tests** 2/3")
        await eventually(lambda: any("tests" in t for t in card_texts(fake)), what="patch")
        assert len(fake.requests_of("send")) == 1
        assert len(fake.requests_of("patch")) >= 1
        assert len(card_texts(fake)) == 1
        assert await serve.aterminate() == 0
    assert fake.app_secret not in serve.logs


async def test_pin_turned_on_by_a_reload_pins_the_card_already_shown(
    tmp_path: Path, fake: FakeFeishu
) -> None:
    """As on Telegram: `pin = true` added to the route and SIGHUP pin the card shown."""
    setup = Setup(tmp_path, fake, ["builder"])
    with setup.serve() as serve:
        publish(tmp_path / "agents" / "builder", "**compile** 1/3")
        await eventually(lambda: card_texts(fake), what="the card")
        [card] = [m for m in fake.chat(CHAT) if m.msg_type == "interactive"]
        assert not card.pinned
        setup.config.write_text(setup.config.read_text() + "pin = true\n")
        assert serve.proc is not None
        serve.proc.send_signal(signal.SIGHUP)
        await eventually(lambda: "config reloaded" in serve.logs, what="the reload")
        await eventually(lambda: card.pinned, what="the pin")
        assert len(card_texts(fake)) == 1 and len(fake.requests_of("send")) == 1
        assert await serve.aterminate() == 0


async def test_no_duplicate_after_sigkill_and_restart(tmp_path: Path, fake: FakeFeishu) -> None:
    setup = Setup(tmp_path, fake, ["builder"])
    workdir = tmp_path / "agents" / "builder"
    with setup.serve() as serve:
        publish(workdir, "before the crash")
        await eventually(lambda: any("before the crash" in t for t in card_texts(fake)))
        serve.kill()
    publish(workdir, "after the restart")
    with setup.serve() as again:
        await eventually(lambda: any("after the restart" in t for t in card_texts(fake)))
        # What people see: one card. The kill may land before the new id was stored; the
        # restart then sends again with the same uuid and Feishu answers with that card, so
        # the number of send requests is not fixed.
        assert len(card_texts(fake)) == 1
        assert await again.aterminate() == 0


async def test_card_older_than_14_days_is_replaced_once(tmp_path: Path, fake: FakeFeishu) -> None:
    setup = Setup(tmp_path, fake, ["builder"])
    workdir = tmp_path / "agents" / "builder"
    with setup.serve() as serve:
        publish(workdir, "v1")
        await eventually(lambda: card_texts(fake))
        first = fake.chat(CHAT)[0].message_id
        fake.age_message(first, days=15)
        publish(workdir, "v2 on a fresh card")
        await eventually(lambda: any("v2 on a fresh card" in t for t in card_texts(fake)))
        publish(workdir, "v3")
        await eventually(lambda: any("v3" in t for t in card_texts(fake)))
        assert len(fake.requests_of("send")) == 2
        assert [r.code for r in fake.requests_of("patch")].count(230031) == 1
        assert await serve.aterminate() == 0


async def test_a_chats_send_throttle_pauses_that_chat_not_the_app(
    tmp_path: Path, fake: FakeFeishu
) -> None:
    """Feishu answers a chat's sixth message in a second with its throttle, 230020 (HTTP
    400, no reset header), as the send page documents; the app's 99991400 is another limit.
    The service pauses that chat alone, a second at a time, and posts each card once when
    the chat takes messages again."""
    fake.limits = FakeLimits(chat_send=1, window_s=4.0)
    setup = Setup(tmp_path, fake, ["alpha", "gamma"])
    with setup.serve() as serve:
        for agent in ("alpha", "gamma"):
            publish(tmp_path / "agents" / agent, f"{agent} v1")
        await eventually(
            lambda: all(any(f"{a} v1" in t for t in card_texts(fake)) for a in ("alpha", "gamma")),
            timeout_s=60,
            what="both cards, once the chat takes messages again",
        )
        assert await serve.aterminate() == 0
    assert {r.code for r in fake.errors()} == {230020}
    assert f"pausing scope feishu:chat:{CHAT}" in serve.logs
    assert "pausing scope feishu:app" not in serve.logs
    assert len(card_texts(fake)) == 2
    assert len([r for r in fake.requests_of("send") if r.code == 0]) == 2


@pytest.mark.parametrize(
    ("code", "scope"),
    [(11233, f"feishu:chat:{CHAT}"), (11232, "feishu:app"), (11247, "feishu:app")],
)
async def test_the_message_services_own_limit_codes_are_pauses_not_refusals(
    tmp_path: Path, fake: FakeFeishu, code: int, scope: str
) -> None:
    """Feishu's server error codes page lists the message service's limits beside 99991400:
    11232 ("create message service trigger rate limit"), 11233 ("create message chat
    trigger rate limit") and 11247 ("internal send message trigger rate limit"). A send
    answered so is paused (the chat's for 11233, the app's for the others) and posted once
    the pause is over, without the agent changing anything; it is not refused for good."""
    fake.script_error("send", code, msg="create message trigger rate limit")
    setup = Setup(tmp_path, fake, ["builder"])
    with setup.serve() as serve:
        publish(tmp_path / "agents" / "builder", "v1")
        await eventually(lambda: card_texts(fake), timeout_s=60, what="the card, once paused")
        assert await serve.aterminate() == 0
    assert [r.code for r in fake.requests_of("send")] == [code, 0]
    assert f"pausing scope {scope}" in serve.logs
    assert len(card_texts(fake)) == 1


async def test_a_replaced_copy_past_the_recall_window_stays_and_is_not_asked_again(
    tmp_path: Path, fake: FakeFeishu
) -> None:
    """A card past Feishu's 14 days is posted anew; its old copy is older than the 24 hours in
    which a bot may recall its message by default, so Feishu answers the recall 230009. The
    copy stays (nothing else can remove it), the route goes on with its new card, and the
    recall is asked neither again nor by the next run."""
    setup = Setup(tmp_path, fake, ["builder"])
    workdir = tmp_path / "agents" / "builder"
    with setup.serve() as serve:
        publish(workdir, "v1")
        await eventually(lambda: card_texts(fake), what="the card")
        first = fake.chat(CHAT)[0].message_id
        fake.age_message(first, days=15)
        publish(workdir, "v2 on a fresh card")
        await eventually(lambda: fake.requests_of("delete"), what="the refused recall")
        publish(workdir, "v3")
        await eventually(lambda: any("v3" in t for t in card_texts(fake)), what="v3")
        assert await serve.aterminate() == 0
    with setup.serve() as again:
        publish(workdir, "v4")
        await eventually(lambda: any("v4" in t for t in card_texts(fake)), what="v4")
        assert await again.aterminate() == 0
    assert [(r.message_id, r.code) for r in fake.requests_of("delete")] == [(first, 230009)]
    assert "disabled" not in serve.logs + again.logs
    assert len(fake.requests_of("send")) == 2
    assert fake.chat(CHAT)[0].message_id == first  # it still shows


async def test_storm_is_coalesced_without_rate_limit_errors(
    tmp_path: Path, fake: FakeFeishu
) -> None:
    import asyncio

    agents = [f"agent{i:02d}" for i in range(20)]
    setup = Setup(tmp_path, fake, agents)
    with setup.serve() as serve:
        for round_no in range(30):
            for agent in agents:
                publish(tmp_path / "agents" / agent, f"{agent} round {round_no}")
            await asyncio.sleep(0.1)
        for agent in agents:
            publish(tmp_path / "agents" / agent, f"{agent} FINAL")
        await eventually(
            lambda: sum("FINAL" in t for t in card_texts(fake)) == 20,
            timeout_s=120,
            what="every card's final state",
        )
        assert [r for r in fake.errors() if r.code in (99991400, 230020)] == []
        assert len(card_texts(fake)) == 20
        assert await serve.aterminate() == 0


async def test_a_callback_stamped_in_milliseconds_is_taken(
    tmp_path: Path, fake: FakeFeishu
) -> None:
    """Feishu's pages name `X-Lark-Request-Timestamp` but not its unit (Feishu writes seconds;
    its events' `create_time` are milliseconds): a signed command stamped now in milliseconds
    is answered, not refused as sent from the far future. A stale one still is."""
    setup = Setup(tmp_path, fake, ["builder"])
    with setup.serve() as serve:
        publish(tmp_path / "agents" / "builder", "visible body")
        await eventually(lambda: any("visible body" in t for t in card_texts(fake)), what="card")
        document = fake.command_event(CHAT, "/taskcard off", verification_token=VERIFY)
        answer = await fake.deliver_event(setup.url, document, encrypt_key=ENCRYPT, stamp_ms=True)
        assert (answer.status, answer.body) == (200, {"msg": "success"})
        await eventually(lambda: any("hidden" in t.lower() for t in card_texts(fake)), what="off")
        fake.advance_time(-3600)  # the next stamp an hour old
        stale = fake.command_event(CHAT, "/taskcard on", verification_token=VERIFY)
        answer = await fake.deliver_event(setup.url, stale, encrypt_key=ENCRYPT, stamp_ms=True)
        assert answer.status == 401
        assert await serve.aterminate() == 0
    assert "request timestamp too old" in serve.logs


async def test_off_and_on_through_webhook_events(tmp_path: Path, fake: FakeFeishu) -> None:
    setup = Setup(tmp_path, fake, ["builder"])
    workdir = tmp_path / "agents" / "builder"
    with setup.serve() as serve:
        publish(workdir, "visible body")
        await eventually(lambda: any("visible body" in t for t in card_texts(fake)))
        delivery = await eventually(
            lambda: True, what="noop"
        )  # the endpoint is up once the first card exists
        del delivery
        answer = await fake.deliver_command(
            setup.url, CHAT, "/taskcard off", verification_token=VERIFY, encrypt_key=ENCRYPT
        )
        assert answer.status == 200
        await eventually(lambda: any("hidden" in t.lower() for t in card_texts(fake)))
        publish(workdir, "changed while hidden")
        await fake.deliver_command(
            setup.url, CHAT, "/taskcard", verification_token=VERIFY, encrypt_key=ENCRYPT
        )
        await eventually(lambda: any("hidden" in t for t in fake.texts(CHAT)), what="reply")
        assert not any("changed while hidden" in t for t in card_texts(fake))
        await fake.deliver_command(
            setup.url, CHAT, "/taskcard on", verification_token=VERIFY, encrypt_key=ENCRYPT
        )
        await eventually(lambda: any("changed while hidden" in t for t in card_texts(fake)))
        assert len(card_texts(fake)) == 1
        assert await serve.aterminate() == 0


async def test_notices_once_each(tmp_path: Path, fake: FakeFeishu) -> None:
    setup = Setup(tmp_path, fake, ["builder"])
    workdir = tmp_path / "agents" / "builder"
    with setup.serve() as serve:
        publish(workdir, "body")
        await eventually(lambda: card_texts(fake))
        notify(
            workdir,
            "task_card.error:tc_1:1:renderer_nonzero_exit",
            "error",
            code="renderer_nonzero_exit",
        )
        notify(
            workdir,
            "task_card.error:tc_1:1:renderer_nonzero_exit",
            "error",
            code="renderer_nonzero_exit",
        )
        await eventually(lambda: len(fake.texts(CHAT)) == 1, what="the error notice")
        assert await serve.aterminate() == 0
    notify(workdir, "task_card.recovered:tc_1:1", "recovered")
    with setup.serve() as again:
        await eventually(lambda: len(fake.texts(CHAT)) == 2, what="the recovery notice")
        await fake.deliver_command(
            setup.url, CHAT, "/taskcard", verification_token=VERIFY, encrypt_key=ENCRYPT
        )
        await eventually(lambda: len(fake.texts(CHAT)) == 3, what="a sync point")
        assert await again.aterminate() == 0
    texts = fake.texts(CHAT)
    assert len(texts) == 3
    assert all("SECRET" not in t and "/home/agent" not in t for t in texts)


async def test_a_busy_webhook_port_is_waited_for_and_feishu_comes_up_once_free(
    tmp_path: Path, fake: FakeFeishu
) -> None:
    """A webhook port in use at start (a previous instance still closing) disabled the Feishu
    channel until a restart. Now the port is tried again, with one warning naming the setting
    and the fix, the other channels go on meanwhile, and Feishu serves once the port is free."""
    from tests.fakes.telegram_api import FakeTelegram

    setup = Setup(tmp_path, fake, ["builder"])
    squatter = socket.socket()
    try:
        squatter.bind(("127.0.0.1", setup.port))
        squatter.listen()
        async with FakeTelegram() as telegram:
            setup.config.write_text(
                setup.config.read_text()
                + f'[telegram]\ntoken_env = "TC_TEST_TOKEN"\napi_base_url = "{telegram.base_url}"\n'
                + '[[telegram.routes]]\nchat_id = 99\nagents = ["*"]\n'
            )
            env = {**setup.env, "TC_TEST_TOKEN": telegram.token}
            with ServeProcess(setup.config, env=env) as serve:
                publish(tmp_path / "agents" / "builder", "still projected")
                await eventually(
                    lambda: any("still projected" in m.text for m in telegram.bot_messages(99)),
                    what="the Telegram card while the webhook port is taken",
                )
                await eventually(
                    lambda: "the port is in use; trying again" in serve.logs,
                    what="the warning about the busy webhook port",
                )
                assert card_texts(fake) == [], "Feishu is not ready while its port is taken"
                squatter.close()
                await eventually(
                    lambda: "channel feishu ready" in serve.logs,
                    timeout_s=90,
                    what="the Feishu channel ready once the port is free",
                )
                await eventually(
                    lambda: any("still projected" in t for t in card_texts(fake)),
                    what="the Feishu card",
                )
                answer = await fake.deliver_command(
                    setup.url, CHAT, "/taskcard", verification_token=VERIFY, encrypt_key=ENCRYPT
                )
                assert answer.status == 200
                await eventually(lambda: fake.texts(CHAT), what="the reply through the webhook")
                assert await serve.aterminate() == 0
    finally:
        squatter.close()
    # One warning per start attempt: two when the machine was slow enough to pass the quick
    # retries before the port was freed.
    lines = [line for line in serve.logs.splitlines() if "trying again" in line]
    assert lines
    for line in lines:
        assert f"[feishu.webhook] host '127.0.0.1', port {setup.port}: the port is in use" in line
        assert "choose another port" in line
    assert "channel feishu disabled" not in serve.logs
    assert "Traceback" not in serve.logs and "Errno" not in serve.logs


async def test_a_webhook_port_held_past_the_quick_retries_is_still_taken_once_free(
    tmp_path: Path, fake: FakeFeishu
) -> None:
    """A port still held after the quick retries (`BIND_RETRY_S`) does not disable the
    channel: its start is tried again with backoff, each attempt saying why, and the channel
    serves once the port is free."""
    setup = Setup(tmp_path, fake, ["builder"])
    squatter = socket.socket()
    try:
        squatter.bind(("127.0.0.1", setup.port))
        squatter.listen()
        with setup.serve() as serve:
            publish(tmp_path / "agents" / "builder", "after a long wait")
            await eventually(
                lambda: "channel feishu not ready" in serve.logs,
                timeout_s=BIND_RETRY_S + 60,
                what="the start tried again after the quick retries",
            )
            squatter.close()
            await eventually(
                lambda: any("after a long wait" in t for t in card_texts(fake)),
                timeout_s=120,
                what="the Feishu card once the port is free",
            )
            assert await serve.aterminate() == 0
    finally:
        squatter.close()
    [line, *_] = [line for line in serve.logs.splitlines() if "channel feishu not ready" in line]
    assert f"[feishu.webhook] host '127.0.0.1', port {setup.port}" in line
    assert "choose another port" in line
    assert "channel feishu disabled" not in serve.logs and "Traceback" not in serve.logs


async def test_a_legacy_frame_of_25_lines_shows_20_and_counts_the_rest(
    tmp_path: Path, fake: FakeFeishu
) -> None:
    setup = Setup(tmp_path, fake, ["builder"])
    frame = {"title": "Sweep", "lines": [f"row {n:02d}" for n in range(1, 26)], "footer": "end"}
    with setup.serve() as serve:
        publish(tmp_path / "agents" / "builder", json.dumps(frame))
        await eventually(lambda: any("Sweep" in t for t in card_texts(fake)), what="card")
        [text] = card_texts(fake)
        assert "row 20" in text and "row 21" not in text and "row 25" not in text
        assert "5 more lines not shown" in text and "end" in text
        assert await serve.aterminate() == 0


async def command(setup: Setup, fake: FakeFeishu, text: str, **event: Any) -> str:
    """Deliver `text` as a person's message mentioning the bot; its message id."""
    document = fake.command_event(CHAT, text, verification_token=VERIFY, **event)
    answer = await fake.deliver_event(setup.url, document, encrypt_key=ENCRYPT)
    assert answer.status == 200
    return str(document["event"]["message"]["message_id"])


async def test_a_command_in_a_thread_is_answered_in_that_thread(
    tmp_path: Path, fake: FakeFeishu
) -> None:
    # As a Telegram forum topic: a command written inside a topic (or a reply thread) gets
    # its answer there, as a reply to it; one in the main flow is answered in the main flow.
    # A route is the whole chat's: the answer in a thread says the cards are in the chat,
    # where it said "here", in a thread holding no card.
    setup = Setup(tmp_path, fake, ["builder"])
    with setup.serve() as serve:
        publish(tmp_path / "agents" / "builder", "body")
        await eventually(lambda: card_texts(fake), what="the card")
        in_thread = await command(setup, fake, "/taskcard", thread_id="omt_topic_1")
        [answer] = await eventually(lambda: fake.replies_to(in_thread), what="the answer")
        assert answer.thread_id == "omt_topic_1"
        assert answer.text.startswith("Task cards in this chat: shown")
        in_main = await command(setup, fake, "/taskcard 3")
        [answer] = await eventually(lambda: fake.replies_to(in_main), what="the answer")
        assert answer.thread_id is None
        assert answer.text == "Task cards here now show 3 activity rows."
        told = await command(setup, fake, "/tell builder look at the logs", thread_id="omt_t2")
        [status] = await eventually(lambda: fake.replies_to(told), what="the /tell status")
        assert status.thread_id == "omt_t2" and "builder" in status.text
        # The card itself stays where it was, in the main flow, and nothing else was posted.
        [card] = [m for m in fake.chat(CHAT) if "body" in m.text]
        assert card.thread_id is None and card.parent_id == ""
        assert len(fake.chat(CHAT)) == 4
        assert not fake.errors()
        assert await serve.aterminate() == 0


async def test_a_command_recalled_before_its_answer_is_answered_in_the_chat(
    tmp_path: Path, fake: FakeFeishu
) -> None:
    setup = Setup(tmp_path, fake, ["builder"])
    with setup.serve() as serve:
        publish(tmp_path / "agents" / "builder", "body")
        await eventually(lambda: card_texts(fake), what="the card")
        document = fake.command_event(
            CHAT, "/taskcard off", verification_token=VERIFY, thread_id="omt_topic_1"
        )
        fake.recall(document["event"]["message"]["message_id"])
        await fake.deliver_event(setup.url, document, encrypt_key=ENCRYPT)
        hidden = "Task cards hidden in this chat."
        await eventually(lambda: any(hidden in t for t in fake.texts(CHAT)), what="the answer")
        assert [r.code for r in fake.requests_of("reply")] == [230011]
        [answer] = [m for m in fake.chat(CHAT) if hidden in m.text]
        assert answer.parent_id == "" and answer.thread_id is None
        assert await serve.aterminate() == 0


async def test_a_failed_reply_is_retried_once_posted(tmp_path: Path, fake: FakeFeishu) -> None:
    # A 5xx after the reply may or may not have posted: the retry carries the same uuid, so
    # the person reads one answer; a rate-limited reply waits and is not replaced by a post.
    setup = Setup(tmp_path, fake, ["builder"])
    with setup.serve() as serve:
        publish(tmp_path / "agents" / "builder", "body")
        await eventually(lambda: card_texts(fake), what="the card")
        fake.script_error("reply", 1000, http_status=500, msg="internal error")
        fake.script_rate_limit("reply", reset_s=1)
        asked = await command(setup, fake, "/taskcard", thread_id="omt_topic_1")
        await eventually(lambda: fake.replies_to(asked), what="the answer")
        codes = [r.code for r in fake.requests_of("reply")]
        assert codes == [1000, 99991400, 0]
        assert len(fake.replies_to(asked)) == 1 and not fake.requests_of("send")[1:]
        assert await serve.aterminate() == 0


async def test_a_command_for_another_bot_is_not_ours(tmp_path: Path, fake: FakeFeishu) -> None:
    # As on Telegram, `/taskcard@OtherBot off` in a group is another bot's command, even
    # with our bot mentioned too; `/taskcard@<our app name>` and a plain mention are ours.
    setup = Setup(tmp_path, fake, ["builder"])
    with setup.serve() as serve:
        publish(tmp_path / "agents" / "builder", "visible body")
        await eventually(lambda: any("visible body" in t for t in card_texts(fake)))
        other = await command(setup, fake, "/taskcard@OtherBot off")
        glued = await command(setup, fake, "/taskcard@_user_1 off", mention_users=("ou_other",))
        ours = await command(setup, fake, "/taskcard@TaskCard")
        await eventually(lambda: fake.replies_to(ours), what="the answer to ours")
        assert not fake.replies_to(other) and not fake.replies_to(glued)
        assert any("visible body" in t for t in card_texts(fake))
        assert await serve.aterminate() == 0


async def test_tell_to_an_unknown_agent_of_a_large_fleet_lists_whole_names_that_fit(
    tmp_path: Path, fake: FakeFeishu
) -> None:
    # The list of agents answering a /tell with a wrong name was unbounded: Feishu showed
    # every name, Telegram cut it at 4096 units in the middle of one. Like `/taskcard`, it
    # now lists whole names as far as they fit one message and counts the rest.
    agents = [f"agent-with-a-rather-long-name-{i:03d}" for i in range(150)]
    setup = Setup(tmp_path, fake, agents)
    with setup.serve() as serve:
        publish(tmp_path / "agents" / agents[0], "body")
        await eventually(lambda: card_texts(fake), what="the webhook up (a first card)")
        told = await command(setup, fake, "/tell nobody hello")
        [answer] = await eventually(lambda: fake.replies_to(told), what="the answer")
        lines = answer.text.split("\n")
        assert lines[0] == "/tell AGENT TEXT: AGENT is one of:"
        assert all(line in agents for line in lines[1:-1])
        assert lines[-1].startswith("… and ") and "more agents" in lines[-1]
        shown = len(lines) - 2
        assert f"… and {150 - shown} more agents" in lines[-1]
        assert len(answer.text) <= 4096
        assert await serve.aterminate() == 0


@pytest.mark.parametrize(
    "answer",
    [(99991665, "invalid tenant code"), (99991671, "Invalid token: must start with t-/u-")],
)
async def test_a_token_refused_with_any_documented_code_is_fetched_anew(
    tmp_path: Path, fake: FakeFeishu, answer: tuple[int, str]
) -> None:
    """Feishu's server error codes page has more codes for a refused tenant token than
    99991663: "Illegal tenant access token" (99991665) and a token not of its form
    (99991671). Either drops the token: a new one is fetched and the card updated, not
    refused as a bad request while the same token is sent again until it expires."""
    setup = Setup(tmp_path, fake, ["builder"])
    workdir = tmp_path / "agents" / "builder"
    with setup.serve() as serve:
        publish(workdir, "first body")
        await eventually(lambda: any("first body" in t for t in card_texts(fake)), what="card")
        fake.refused_token_answer = answer
        fake.revoke_tokens()
        publish(workdir, "second body")
        await eventually(
            lambda: any("second body" in t for t in card_texts(fake)), what="patch", timeout_s=60
        )
        assert await serve.aterminate() == 0
    assert [r.code for r in fake.requests_of("patch")].count(answer[0]) == 1
    assert len(fake.requests_of("token")) == 2
    assert len(card_texts(fake)) == 1


async def test_a_rate_limited_token_request_pauses_and_keeps_the_channel(
    tmp_path: Path, fake: FakeFeishu
) -> None:
    """The token endpoint answering its frequency limit (HTTP 400, code 99991400, as some
    Open APIs do) is a pause, not rejected credentials: the channel stays in use and the
    next card lands once the limit has passed."""
    setup = Setup(tmp_path, fake, ["builder"])
    workdir = tmp_path / "agents" / "builder"
    with setup.serve() as serve:
        publish(workdir, "first body")
        await eventually(lambda: any("first body" in t for t in card_texts(fake)), what="card")
        fake.revoke_tokens()  # the next call is refused: a new token is fetched
        fake.script_error(
            "token",
            99991400,
            http_status=400,
            msg="request trigger frequency limit",
            headers={"x-ogw-ratelimit-reset": "1"},
        )
        publish(workdir, "second body")
        await eventually(
            lambda: any("second body" in t for t in card_texts(fake)), what="patch", timeout_s=60
        )
        assert len(card_texts(fake)) == 1
        assert await serve.aterminate() == 0
    assert "credentials rejected" not in serve.logs
    assert "channel feishu disabled" not in serve.logs
    assert "pausing scope feishu:app" in serve.logs
    assert fake.app_secret not in serve.logs


async def test_an_answer_that_is_no_open_api_answer_is_tried_again(
    tmp_path: Path, fake: FakeFeishu
) -> None:
    """A 200 with an empty body, or a gateway's HTML page, says nothing about the card: the
    same bytes go out again (a send deduplicated by its uuid), never given up for good."""
    setup = Setup(tmp_path, fake, ["builder"])
    workdir = tmp_path / "agents" / "builder"
    with setup.serve() as serve:
        fake.script_raw("send", 200, b"")
        publish(workdir, "first body")
        await eventually(lambda: any("first body" in t for t in card_texts(fake)), what="card")
        fake.script_raw("patch", 200, b"", content_type="application/json")
        fake.script_raw("patch", 502, b"<html><body>502 Bad Gateway</body></html>")
        # A proxy's 403 page is no word from Feishu about the chat: the route stays on.
        fake.script_raw("patch", 403, b"<html>403 Forbidden</html>")
        publish(workdir, "second body")
        await eventually(
            lambda: any("second body" in t for t in card_texts(fake)), what="patch", timeout_s=60
        )
        assert len(card_texts(fake)) == 1
        assert await serve.aterminate() == 0
    assert "refused this card for good" not in serve.logs
    assert "Traceback" not in serve.logs


async def test_a_token_answer_without_a_token_is_retried(tmp_path: Path, fake: FakeFeishu) -> None:
    """A token endpoint answering success without a token (or an empty 200) at start is
    tried again; only refused credentials disable the channel."""
    fake.script_raw("token", 200, b'{"code":0,"msg":"ok"}', content_type="application/json")
    fake.script_raw("token", 200, b"", content_type="application/json")
    setup = Setup(tmp_path, fake, ["builder"])
    workdir = tmp_path / "agents" / "builder"
    with setup.serve() as serve:
        publish(workdir, "first body")
        await eventually(
            lambda: any("first body" in t for t in card_texts(fake)), what="card", timeout_s=60
        )
        assert await serve.aterminate() == 0
    assert "channel feishu disabled" not in serve.logs
    assert fake.app_secret not in serve.logs


@pytest.mark.parametrize(
    ("code", "how"),
    [
        # Documented for pins; scripted on the card's update.
        (230045, "scripted: The chat not exist."),
        (232009, "the fake's chat is dissolved: every call about it is refused"),
        (230053, "the fake's person stopped the bot: the first card's send is refused"),
        # The group's own settings forbid it: that chat's, not the app's.
        (230018, "scripted: These operations are not allowed in current group settings."),
    ],
)
async def test_a_chat_the_bot_cannot_reach_disables_its_route(
    tmp_path: Path, fake: FakeFeishu, code: int, how: str
) -> None:
    """Feishu says with these codes that the bot cannot reach the chat at all: like 230002,
    the route is disabled with the reason in `taskcard status`, not refused change by change
    (nor a new card posted where the chat is gone)."""
    setup = Setup(tmp_path, fake, ["builder"])
    workdir = tmp_path / "agents" / "builder"

    def status() -> str:
        return run_cli("status", "--config", str(setup.config)).stdout

    with setup.serve() as serve:
        if code == 230053:
            fake.stop_bot(CHAT)
        else:
            publish(workdir, "first body")
            await eventually(lambda: any("first body" in t for t in card_texts(fake)), what="card")
            if code == 232009:
                fake.dissolve_chat(CHAT)
            else:
                fake.script_error("patch", code, msg="The chat not exist.")
        publish(workdir, "second body")
        report = await eventually(
            lambda: (lambda text: text if "DISABLED" in text else "")(status()),
            timeout_s=60,
            what="the route disabled",
        )
        assert await serve.aterminate() == 0
    assert f"code {code}" in report
    assert "refused this card for good" not in serve.logs
    assert {r.code for r in fake.errors()} == {code}
    assert len(fake.requests_of("send")) == 1, "no card posted again into a chat it cannot reach"


@pytest.mark.parametrize(
    ("code", "meaning"),
    [
        (230006, "bot ability is not turned on"),
        (99991401, "IP allow-list"),
        (99991662, "the app is disabled"),
        (99991673, "the app is not available"),
    ],
)
async def test_an_app_feishu_refuses_as_a_whole_is_held_and_goes_on_by_itself(
    tmp_path: Path, fake: FakeFeishu, code: int, meaning: str
) -> None:
    """The bot ability turned off, this host outside the IP allow-list, the app disabled:
    Feishu refuses every call of the app with one of these codes. Not the card's fault: the
    cause and its fix are logged once and shown by `taskcard status`, the card waits (not
    refused for good, the route not disabled, no request in a loop), and once the app works
    again the card goes out by itself. (The longest pause is 2 s here, so the test need not
    wait for the growing holds.)"""
    setup = Setup(tmp_path, fake, ["builder"])
    setup.config.write_text(setup.config.read_text() + "[limits]\nmax_pause_s = 2\n")
    workdir = tmp_path / "agents" / "builder"

    def status() -> str:
        return run_cli("status", "--config", str(setup.config)).stdout

    with setup.serve() as serve:
        publish(workdir, "first body")
        await eventually(lambda: any("first body" in t for t in card_texts(fake)), what="card")
        fake.refuse_app(code)
        publish(workdir, "second body")
        report = await eventually(
            lambda: (lambda text: text if "APP UNAVAILABLE" in text else "")(status()),
            timeout_s=60,
            what="the app shown unavailable",
        )
        await eventually(
            lambda: len([r for r in fake.errors() if r.code == code]) >= 3,
            timeout_s=60,
            what="tried again",
        )
        fake.refuse_app(None)
        await eventually(
            lambda: any("second body" in t for t in card_texts(fake)),
            timeout_s=60,
            what="the card once the app works",
        )
        await eventually(
            lambda: "takes the app's requests again" in serve.logs, what="said it works again"
        )
        after = status()
        assert await serve.aterminate() == 0
    assert meaning in report and f"code {code}" in report and "DISABLED" not in report
    assert "held: the platform refuses the app itself" in report
    assert "APP UNAVAILABLE" not in after
    assert serve.logs.count(meaning) == 1, "the cause is said once, not at each try"
    assert "refused this card for good" not in serve.logs
    assert "builder disabled" not in serve.logs and "channel feishu disabled" not in serve.logs
    refused = [r.at_s for r in fake.errors() if r.code == code]
    assert all(later - earlier >= 1.0 for earlier, later in itertools.pairwise(refused)), (
        "tried again after a pause, not in a loop"
    )
    assert len(fake.requests_of("send")) == 1 and len(card_texts(fake)) == 1


async def test_an_app_refused_at_its_token_from_the_start_waits_and_starts_by_itself(
    tmp_path: Path, fake: FakeFeishu
) -> None:
    """This host outside the app's IP allow-list from the start, the token request refused
    too: not rejected credentials (the channel is not disabled until a restart) but the
    app held, said with its fix, and started by itself once Feishu takes its requests."""
    setup = Setup(tmp_path, fake, ["builder"])
    setup.config.write_text(setup.config.read_text() + "[limits]\nmax_pause_s = 2\n")
    fake.refuse_app(99991401, token_too=True)
    with setup.serve() as serve:
        publish(tmp_path / "agents" / "builder", "first body")
        report = await eventually(
            lambda: (lambda text: text if "APP UNAVAILABLE" in text else "")(
                run_cli("status", "--config", str(setup.config)).stdout
            ),
            timeout_s=60,
            what="the app shown unavailable",
        )
        await eventually(
            lambda: len(fake.requests_of("token")) >= 2, timeout_s=60, what="asked again"
        )
        fake.refuse_app(None)
        await eventually(
            lambda: any("first body" in t for t in card_texts(fake)),
            timeout_s=60,
            what="the card once the app works",
        )
        assert await serve.aterminate() == 0
    assert "IP allow-list" in report and "code 99991401" in report
    assert "credentials rejected" not in serve.logs
    assert "channel feishu disabled" not in serve.logs


async def test_a_send_still_in_progress_is_tried_again_not_refused(
    tmp_path: Path, fake: FakeFeishu
) -> None:
    """230049 ("the message is being sent") answers a send repeated while the first with its
    uuid is still in progress: the card is sent again later, not refused for good."""
    setup = Setup(tmp_path, fake, ["builder"])
    with setup.serve() as serve:
        fake.script_error("send", 230049, msg="The message is being sent.")
        publish(tmp_path / "agents" / "builder", "the first card")
        await eventually(
            lambda: any("the first card" in t for t in card_texts(fake)),
            timeout_s=60,
            what="the card sent again",
        )
        assert len(card_texts(fake)) == 1
        assert fake.requests_of("send")[0].code == 230049
        assert await serve.aterminate() == 0
    assert "refused this card for good" not in serve.logs


async def test_a_card_not_found_is_replaced_once(tmp_path: Path, fake: FakeFeishu) -> None:
    """231003 ("the message is not found") on the card's update: as for a recalled card,
    one new card is posted and updated from then on."""
    setup = Setup(tmp_path, fake, ["builder"])
    workdir = tmp_path / "agents" / "builder"
    with setup.serve() as serve:
        publish(workdir, "v1")
        await eventually(lambda: card_texts(fake), what="the first card")
        fake.script_error(
            "patch", 231003, msg="The message is not found, maybe not exist or deleted."
        )
        publish(workdir, "v2 on a fresh card")
        await eventually(
            lambda: any("v2 on a fresh card" in t for t in card_texts(fake)), what="the new card"
        )
        publish(workdir, "v3")
        await eventually(lambda: any("v3" in t for t in card_texts(fake)), what="its update")
        assert len(fake.requests_of("send")) == 2
        assert [r.code for r in fake.requests_of("patch")].count(231003) == 1
        assert await serve.aterminate() == 0
    assert "refused this card for good" not in serve.logs


async def test_a_code_written_as_a_string_is_read_as_the_number(
    tmp_path: Path, fake: FakeFeishu
) -> None:
    """A gateway that writes `code` as a string ("0") says what Feishu said: a token answer
    with "0" is a token (the channel was disabled as if the credentials were refused), a
    patch answered "0" is done (it was refused for good), and "230002" still means the bot
    is not in the chat."""
    fake.script_raw(
        "token",
        200,
        json.dumps(
            {"code": "0", "msg": "ok", "tenant_access_token": "t-gateway", "expire": 7200}
        ).encode(),
        content_type="application/json",
    )
    setup = Setup(tmp_path, fake, ["builder"])
    workdir = tmp_path / "agents" / "builder"
    with setup.serve() as serve:
        publish(workdir, "first body")
        await eventually(
            lambda: any("first body" in t for t in card_texts(fake)), what="card", timeout_s=60
        )
        patches = len(fake.requests_of("patch"))
        answer = b'{"code":"0","msg":"success","data":{}}'
        fake.script_raw("patch", 200, answer, content_type="application/json")
        publish(workdir, "second body")
        await eventually(lambda: len(fake.requests_of("patch")) > patches, what="the patch")
        publish(workdir, "third body")
        await eventually(lambda: any("third body" in t for t in card_texts(fake)), what="third")
        refusal = b'{"code":"230002","msg":"Bot is not in the chat"}'
        fake.script_raw("patch", 400, refusal, content_type="application/json")
        publish(workdir, "fourth body")
        await eventually(
            lambda: "DISABLED" in run_cli("status", "--config", str(setup.config)).stdout,
            timeout_s=60,
            what="the route disabled",
        )
        assert await serve.aterminate() == 0
    assert "channel feishu disabled" not in serve.logs
    assert "refused this card for good" not in serve.logs
    assert "Traceback" not in serve.logs


async def test_a_message_that_is_no_text_is_read_as_text(tmp_path: Path, fake: FakeFeishu) -> None:
    """An answer whose `msg` is a number (a gateway's) is judged by its code like any other:
    a patch refused with 230001 is not a traceback in the log."""
    setup = Setup(tmp_path, fake, ["builder"])
    workdir = tmp_path / "agents" / "builder"
    with setup.serve() as serve:
        publish(workdir, "first body")
        await eventually(lambda: any("first body" in t for t in card_texts(fake)), what="card")
        odd = b'{"code":230001,"msg":12345}'
        fake.script_raw("patch", 400, odd, content_type="application/json")
        publish(workdir, "second body")
        await eventually(lambda: fake.errors(), what="the refused patch")
        publish(workdir, "third body")
        await eventually(lambda: any("third body" in t for t in card_texts(fake)), what="third")
        assert await serve.aterminate() == 0
    assert "Traceback" not in serve.logs
    assert "unexpected failure" not in serve.logs


async def test_a_posted_card_keeps_its_id_when_the_rest_of_the_answer_is_odd(
    tmp_path: Path, fake: FakeFeishu
) -> None:
    """A send answered code 0 with the message id, but with a field lark-oapi's model cannot
    read (a `body` as text): the card was posted and its id is there, so the service keeps
    it and edits that message; it threw the whole answer away and sent again (under the same
    uuid, answered the same way: the card never learned its id)."""
    setup = Setup(tmp_path, fake, ["builder"])
    workdir = tmp_path / "agents" / "builder"
    answer = {"code": 0, "msg": "success", "data": {"message_id": "om_gateway", "body": "text"}}
    fake.script_raw("send", 200, json.dumps(answer).encode(), content_type="application/json")
    with setup.serve() as serve:
        publish(workdir, "first body")
        await eventually(lambda: fake.requests_of("send"), what="the send")
        publish(workdir, "second body")
        await eventually(
            lambda: any(r.message_id == "om_gateway" for r in fake.requests_of("patch")),
            what="the patch of the message the answer named",
        )
        # The fake never posted it (a scripted answer): the patch finds it gone, and the
        # card is posted once more, as for any card deleted in the chat.
        await eventually(lambda: any("second body" in t for t in card_texts(fake)))
        assert await serve.aterminate() == 0
    assert "Traceback" not in serve.logs


async def test_a_normal_reconnect_of_the_long_connection_logs_no_error(
    tmp_path: Path, fake: FakeFeishu
) -> None:
    """Feishu closing the long connection the normal way (code 1000), after which lark-oapi
    reconnects, was logged as "ERROR ... receive message loop exit", and a second time on
    stdout by lark-oapi's own handler (not scrubbed, not in the log's format). A close for a
    failure stays an error."""
    setup = Setup(tmp_path, fake, ["builder"])
    setup.config.write_text(setup.config.read_text().replace('"webhook"', '"websocket"'))
    with setup.serve() as serve:
        await eventually(lambda: fake.ws_connections == 1, what="the long connection")
        assert await fake.close_ws() == 1
        await eventually(
            lambda: fake.ws_opened == 2 and fake.ws_connections == 1, what="the reconnect"
        )
        publish(tmp_path / "agents" / "builder", "after the reconnect")
        await eventually(lambda: any("after the reconnect" in t for t in card_texts(fake)))
        await eventually(lambda: "long connection closed by Feishu" in serve.logs)
        assert "ERROR" not in serve.logs, serve.logs
        assert await fake.close_ws(1011) == 1
        await eventually(lambda: fake.ws_opened == 3, what="the reconnect after a failure")
        await eventually(lambda: "ERROR lark_oapi: receive message loop exit" in serve.logs)
        assert await serve.aterminate() == 0
    assert serve.output == ""
    assert fake.app_secret not in serve.logs


async def test_lark_oapis_lines_name_it_at_the_configured_level_without_credentials(
    tmp_path: Path, fake: FakeFeishu
) -> None:
    """lark-oapi's own lines went out under the logger name `Lark` (no module of ours, nor
    the library's package) and at WARNING whatever level the operator chose. They now read
    `lark_oapi`, at the configured level (its "connected to" line at INFO shows at debug),
    and what the library holds at run time is masked: the long connection's URL query (its
    ticket and keys on Feishu), the tenant token; the app secret never shows."""
    setup = Setup(tmp_path, fake, ["builder"])
    setup.config.write_text(setup.config.read_text().replace('"webhook"', '"websocket"'))
    with ServeProcess(setup.config, env={**setup.env, "TASKCARD_LOG_LEVEL": "debug"}) as serve:
        await eventually(lambda: fake.ws_connections == 1, timeout_s=120, what="the connection")
        publish(tmp_path / "agents" / "builder", "a card over lark")
        await eventually(lambda: any("a card over lark" in t for t in card_texts(fake)))
        await eventually(lambda: " lark_oapi: connected to ws://" in serve.logs, what="lark's line")
        # At debug the library logs each event's payload: its header carries the app's
        # verification token, which no configuration names in long-connection mode.
        event = fake.command_event(CHAT, "/taskcard", verification_token="vt_" + "9" * 24)
        assert await fake.push_ws_event(event) == 1
        await eventually(lambda: " lark_oapi: " in serve.logs and "payload" in serve.logs)
        assert await serve.aterminate() == 0
    logs = serve.logs + serve.output
    assert "vt_" + "9" * 24 not in logs, logs
    assert " Lark: " not in logs and "[Lark]" not in logs, logs
    assert "/ws?***" in logs and "service_id=" not in logs, logs
    assert fake.app_secret not in logs
    issued = list(fake._tokens)
    assert issued and not any(token in logs for token in issued), issued


async def test_a_pin_refused_by_the_rate_limit_is_tried_again_once_its_window_has_passed(
    tmp_path: Path, fake: FakeFeishu
) -> None:
    """Feishu's app-level limit (99991400, seconds in `x-ogw-ratelimit-reset`) answered to the
    pin of a new card: the app waits the whole window (no request of any kind inside it, the
    card's next change included), then the pin is tried again by itself."""
    setup = Setup(tmp_path, fake, ["builder"])
    setup.config.write_text(setup.config.read_text() + "pin = true\n")
    workdir = tmp_path / "agents" / "builder"
    fake.script_rate_limit("pin", reset_s=3)
    with setup.serve() as serve:
        publish(workdir, "**compile** 1/3")
        await eventually(lambda: fake.requests_of("pin"), what="the refused pin")
        publish(workdir, "**tests** 2/3")
        await eventually(
            lambda: [m.pinned for m in fake.chat(CHAT) if m.msg_type == "interactive"] == [True],
            timeout_s=60,
            what="the card pinned after the window",
        )
        await eventually(lambda: any("tests" in t for t in card_texts(fake)), what="the patch")
        assert await serve.aterminate() == 0
    limited = next(r for r in fake.requests if r.code == 99991400)
    inside = [
        r.operation
        for r in fake.requests
        if r.operation != "token" and limited.at_s < r.at_s < limited.at_s + 3
    ]
    assert inside == []
    assert len(fake.requests_of("pin")) == 2
    assert len(fake.requests_of("send")) == 1


async def test_a_pin_answered_too_often_is_tried_again_and_made(
    tmp_path: Path, fake: FakeFeishu
) -> None:
    """Feishu's 230047 (that message pinned or unpinned too often, "try again later") is a
    wait: the pin is made a little later, the card not left unpinned."""
    setup = Setup(tmp_path, fake, ["builder"])
    setup.config.write_text(setup.config.read_text() + "pin = true\n")
    fake.script_error("pin", PIN_TOO_OFTEN[0], msg=PIN_TOO_OFTEN[1])
    with setup.serve() as serve:
        publish(tmp_path / "agents" / "builder", "**compile** 1/3")
        await eventually(
            lambda: [m.pinned for m in fake.chat(CHAT) if m.msg_type == "interactive"] == [True],
            timeout_s=60,
            what="the card pinned after the refusal",
        )
        assert await serve.aterminate() == 0
    assert [r.code for r in fake.requests_of("pin")] == [PIN_TOO_OFTEN[0], 0]
    assert len(fake.requests_of("send")) == 1


async def test_a_group_that_lets_only_its_admins_pin_is_said_once_not_per_card(
    tmp_path: Path, fake: FakeFeishu
) -> None:
    """Feishu's 230046 (only the group's owner and administrators may pin): every card of
    the chat is refused its pin alike, so the log says it once for the chat, not per card;
    the cards are shown unpinned."""
    setup = Setup(tmp_path, fake, ["builder", "tester", "docs"])
    setup.config.write_text(setup.config.read_text() + "pin = true\n")
    fake.pins_restricted.add(CHAT)
    with setup.serve() as serve:
        for agent in ("builder", "tester", "docs"):
            publish(tmp_path / "agents" / agent, f"**{agent}** working")
        await eventually(
            lambda: len([r for r in fake.requests_of("pin") if r.code == PINS_RESTRICTED[0]]) == 3,
            timeout_s=60,
            what="each card's pin refused",
        )
        await eventually(lambda: "code 230046" in serve.logs, what="the refusal said")
        assert await serve.aterminate() == 0
    assert serve.logs.count("code 230046") == 1, "said once for the chat"
    assert len(card_texts(fake)) == 3
    assert not any(m.pinned for m in fake.chat(CHAT))


async def test_a_pin_refused_by_the_rate_limit_is_made_after_a_restart_inside_its_window(
    tmp_path: Path, fake: FakeFeishu
) -> None:
    """As on Telegram: the pin of a new card draws the app-level limit and the service stops
    inside the window; the next run pins the card after the window, though no message is
    posted (the put-off pin was kept in memory only), and sends nothing inside it."""
    setup = Setup(tmp_path, fake, ["builder"])
    setup.config.write_text(setup.config.read_text() + "pin = true\n")
    fake.script_rate_limit("pin", reset_s=LONG_WINDOW_S)
    with setup.serve() as serve:
        publish(tmp_path / "agents" / "builder", "**compile** 1/3")
        await eventually(lambda: fake.requests_of("pin"), what="the refused pin")
        assert await serve.aterminate() == 0
    assert requests_inside_the_window(fake, LONG_WINDOW_S) == []
    restart_s = time.monotonic()
    capped_s = lift_long_pauses(setup.config)
    with setup.serve() as restarted:
        await eventually(
            lambda: [m.pinned for m in fake.chat(CHAT) if m.msg_type == "interactive"] == [True],
            timeout_s=60,
            what="the card pinned by the next run",
        )
        assert await restarted.aterminate() == 0, restarted.logs
    assert asked_between(fake, restart_s, capped_s) == []  # the next run's start included
    assert len(fake.requests_of("pin")) == 2
    assert len(fake.requests_of("send")) == 1


async def test_a_delete_refused_by_the_rate_limit_is_tried_again_once_its_window_has_passed(
    tmp_path: Path, fake: FakeFeishu
) -> None:
    """A card past Feishu's 14 days is posted anew, and the recall of the old copy draws the
    app-level limit: the recall is tried again by itself once the window has passed (the
    agent changes nothing more), and no request goes out inside it."""
    setup = Setup(tmp_path, fake, ["builder"])
    workdir = tmp_path / "agents" / "builder"
    with setup.serve() as serve:
        publish(workdir, "v1")
        await eventually(lambda: card_texts(fake), what="the card")
        first = fake.chat(CHAT)[0].message_id
        fake.age_message(first, days=15)
        fake.recall_window_s = TENANT_RECALL_WINDOW_S
        fake.script_rate_limit("delete", reset_s=3)
        publish(workdir, "v2 on a fresh card")
        await eventually(lambda: fake.requests_of("delete"), what="the refused recall")
        await eventually(
            lambda: len(fake.requests_of("delete")) == 2,
            timeout_s=60,
            what="the recall tried again after the window",
        )
        assert await serve.aterminate() == 0
    limited = next(r for r in fake.requests if r.code == 99991400)
    inside = [
        r.operation
        for r in fake.requests
        if r.operation != "token" and limited.at_s < r.at_s < limited.at_s + 3
    ]
    assert inside == []
    assert [r.message_id for r in fake.requests_of("delete")] == [first, first]
    assert any("v2 on a fresh card" in t for t in card_texts(fake))


async def test_the_card_names_a_refused_file_and_the_fix_until_it_is_fixed(
    tmp_path: Path, fake: FakeFeishu
) -> None:
    setup = Setup(tmp_path, fake, ["builder"])
    workdir = tmp_path / "agents" / "builder"
    ledger = workdir / "ledger" / "long-task-ledger.json"
    row = "ledger/long-task-ledger.json: is a folder, not a regular file"
    with setup.serve() as serve:
        publish(workdir, "**compile** 1/3")
        await eventually(lambda: any("compile" in t for t in card_texts(fake)), what="card")
        ledger.mkdir(parents=True)  # a folder where the ledger goes, while served
        # A body longer than a card holds: the card is cut, and still says what is wrong.
        publish(workdir, "**tests** 2/3\n\n" + "a line of the card's long body\n" * 4000)
        await eventually(
            lambda: any(row in t and "tests" in t for t in card_texts(fake)),
            what="the refusal and its fix on the card",
        )
        assert "replace it with a regular file" in card_texts(fake)[-1]
        assert str(tmp_path) not in "".join(card_texts(fake))
        ledger.rmdir()
        publish(workdir, "**lint** 3/3")
        await eventually(
            lambda: any("lint" in t and row not in t for t in card_texts(fake)),
            what="the row gone once the ledger is fixed",
        )
        assert await serve.aterminate() == 0


async def test_a_delete_refused_by_the_rate_limit_is_made_after_a_restart_inside_its_window(
    tmp_path: Path, fake: FakeFeishu
) -> None:
    """As on Telegram: the recall of the copy a fresh card replaced draws the app-level
    limit and the service stops inside the window; the next run recalls the copy after the
    window, though the agent changes nothing (the put-off recall waited for the route's next
    delivery), and sends nothing inside it."""
    setup = Setup(tmp_path, fake, ["builder"])
    workdir = tmp_path / "agents" / "builder"
    with setup.serve() as serve:
        publish(workdir, "v1")
        await eventually(lambda: card_texts(fake), what="the card")
        first = fake.chat(CHAT)[0].message_id
        fake.age_message(first, days=15)
        fake.recall_window_s = TENANT_RECALL_WINDOW_S
        fake.script_rate_limit("delete", reset_s=LONG_WINDOW_S)
        publish(workdir, "v2 on a fresh card")
        await eventually(lambda: fake.requests_of("delete"), what="the refused recall")
        assert await serve.aterminate() == 0
    assert not fake.messages[first].recalled
    assert requests_inside_the_window(fake, LONG_WINDOW_S) == []
    restart_s = time.monotonic()
    capped_s = lift_long_pauses(setup.config)
    with setup.serve() as restarted:
        await eventually(
            lambda: fake.messages[first].recalled,
            timeout_s=60,
            what="the replaced copy recalled by the next run",
        )
        assert await restarted.aterminate() == 0, restarted.logs
    assert asked_between(fake, restart_s, capped_s) == []  # the next run's start included
    assert [r.message_id for r in fake.requests_of("delete")] == [first, first]
    [card] = card_texts(fake)
    assert "v2 on a fresh card" in card
    assert len(fake.requests_of("send")) == 2


def requests_inside_the_window(fake: FakeFeishu, reset_s: float) -> list[str]:
    """The requests of any kind (the token's included) the fake received after its first
    answer of the app-level limit and before that answer's reset had passed."""
    limited = next(r for r in fake.requests if r.code == 99991400)
    return [r.operation for r in fake.requests if limited.at_s < r.at_s < limited.at_s + reset_s]


def asked_between(fake: FakeFeishu, after_s: float, until_s: float) -> list[str]:
    """The requests of any kind the fake received after `after_s` and before `until_s`."""
    return [r.operation for r in fake.requests if after_s < r.at_s < until_s]


async def test_the_app_limit_answered_to_the_token_at_start_is_a_pause_a_restart_keeps(
    tmp_path: Path, fake: FakeFeishu
) -> None:
    """The tenant token at the start draws the app-level limit and the service stops inside
    the window: the pause is stored like any other, so the next run asks for nothing inside
    it (it waited in memory only, and the restart asked for a token at once); the card goes
    once the window has passed."""
    setup = Setup(tmp_path, fake, ["builder"])
    fake.script_rate_limit("token", reset_s=LONG_WINDOW_S)
    with setup.serve() as serve:
        await eventually(lambda: fake.requests_of("token"), what="the refused token")
        await eventually(
            lambda: "rate-limit pause:" in run_cli("status", "--config", str(setup.config)).stdout,
            what="the pause in the status",
        )
        assert await serve.aterminate() == 0, serve.logs
    assert requests_inside_the_window(fake, LONG_WINDOW_S) == []
    restart_s = time.monotonic()
    capped_s = lift_long_pauses(setup.config)
    with setup.serve() as restarted:
        publish(tmp_path / "agents" / "builder", "after the token's window")
        await eventually(
            lambda: any("after the token's window" in t for t in card_texts(fake)),
            timeout_s=60,
            what="the card once the window has passed",
        )
        assert await restarted.aterminate() == 0, restarted.logs
    assert asked_between(fake, restart_s, capped_s) == [], restarted.logs
    assert len(fake.requests_of("token")) == 2
    assert "channel feishu waits" in restarted.logs, "the wait is said"
    assert fake.app_secret not in serve.logs + restarted.logs


async def test_the_app_limit_answered_to_the_bot_info_holds_the_app_not_the_start(
    tmp_path: Path, fake: FakeFeishu
) -> None:
    """The bot's info at the start draws the app-level limit: the bot info is optional, so
    the channel starts without it (commands are taken at once, any mention counting as the
    bot's meanwhile), the app's window is kept by the card as by any request, and the bot
    info is asked again once the window has passed (the whole start used to wait for it
    and be made again)."""
    setup = Setup(tmp_path, fake, ["builder"])
    fake.script_rate_limit("bot_info", reset_s=4)
    with setup.serve() as serve:
        publish(tmp_path / "agents" / "builder", "after the bot's window")
        await eventually(
            lambda: any("after the bot's window" in t for t in card_texts(fake)),
            timeout_s=60,
            what="the card once the window has passed",
        )
        await eventually(lambda: len(fake.requests_of("bot_info")) == 2, what="the bot info")
        assert await serve.aterminate() == 0, serve.logs
    assert requests_inside_the_window(fake, 4) == []
    assert [r.code for r in fake.requests_of("bot_info")] == [99991400, 0]
    assert len(fake.requests_of("token")) == 1, "the start is not made again"
    assert "bot info unavailable" not in serve.logs


async def test_a_bot_info_refused_by_the_app_limit_every_time_is_given_up_after_a_few(
    tmp_path: Path, fake: FakeFeishu
) -> None:
    """Answered the app-level limit however often it is asked, the bot info is asked once
    per window and given up after a few tries (until the next start), while the channel
    serves all along: the card goes out and no request goes inside a window."""
    setup = Setup(tmp_path, fake, ["builder"])
    fake.script_rate_limit("bot_info", reset_s=1, times=10)
    with setup.serve() as serve:
        publish(tmp_path / "agents" / "builder", "served all along")
        await eventually(
            lambda: "rate limited 4 times" in serve.logs, timeout_s=60, what="given up"
        )
        await eventually(
            lambda: any("served all along" in t for t in card_texts(fake)), what="the card"
        )
        assert await serve.aterminate() == 0, serve.logs
    # Nothing inside the window the start drew (a card already on its way when a later
    # bot info is refused is not held back, as for any two requests at once), and the bot
    # info never inside its own.
    assert requests_inside_the_window(fake, 1) == []
    asked = [r.at_s for r in fake.requests_of("bot_info")]
    assert all(later - earlier >= 1 for earlier, later in itertools.pairwise(asked)), asked
    assert [r.code for r in fake.requests_of("bot_info")] == [99991400] * 4
    assert len(fake.requests_of("token")) == 1
