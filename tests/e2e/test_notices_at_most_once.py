"""Notices whose send got no answer, end to end: `taskcard serve` with one Telegram and one
Feishu route of one agent, against fakes that post a message and then lose its answer, answer
it after the client gave up, or hold it while the service is killed.

Telegram's sendMessage takes no idempotency key, so a notice there is sent at most once: what
may have been posted is never sent again, by a retry or by a restart. Feishu posts at most
one message per `uuid`, so a notice there is retried with the same uuid, also after a restart,
and still shows once. What is asserted is what people see: how often each chat shows the
notice. Each test ends on a second notice and on no notice left pending, so that a retry
the service was going to make has been made.
"""

from __future__ import annotations

import json
import signal
import sqlite3
from collections.abc import AsyncIterator
from contextlib import ExitStack
from pathlib import Path

import pytest

from taskcard.bridge.store.base import UNSURE_KEEP_PER_ROUTE
from taskcard.bridge.store.sqlite import SqliteStore
from tests.e2e.harness import TOKEN_ENV, ServeProcess, eventually, notify, publish, run_cli
from tests.e2e.test_cluster import instance
from tests.e2e.test_serve_telegram import GROUP
from tests.fakes.feishu_api import FakeFeishu
from tests.fakes.telegram_api import FakeLimits, FakeTelegram
from tests.redis_server import free_port

TG_CHAT = -1009000000001
FS_CHAT = "oc_notices"
FIRST, SECOND = "renderer_timeout", "renderer_nonzero_exit"


@pytest.fixture
async def telegram() -> AsyncIterator[FakeTelegram]:
    async with FakeTelegram(limits=FakeLimits.unlimited()) as server:
        yield server


@pytest.fixture
async def feishu() -> AsyncIterator[FakeFeishu]:
    async with FakeFeishu() as server:
        yield server


def feishu_sends(feishu: FakeFeishu) -> int:
    """The send requests Feishu answered so far (a card's, a notice's, a repeated one's)."""
    return sum(request.operation == "send" for request in feishu.requests)


class Setup:
    """One agent with a route on each platform; short send timeouts on both."""

    def __init__(self, tmp_path: Path, telegram: FakeTelegram, feishu: FakeFeishu) -> None:
        self.workdir = tmp_path / "agents" / "builder"
        self.workdir.mkdir(parents=True)
        lines = [
            'state_dir = ".taskcard"',
            "[[agents]]",
            'id = "builder"',
            'workdir = "agents/builder"',
            "[telegram]",
            f'token_env = "{TOKEN_ENV}"',
            f'api_base_url = "{telegram.base_url}"',
            "poll_timeout_s = 1",
            "send_timeout_s = 5",
            "[telegram.limits]",
            "group_chat = { max_calls = 1000, period_s = 60.0 }",
            "[[telegram.routes]]",
            f"chat_id = {TG_CHAT}",
            'agents = ["builder"]',
            "[feishu]",
            'app_id_env = "TC_FS_APP_ID"',
            'app_secret_env = "TC_FS_APP_SECRET"',
            f'domain = "{feishu.base_url}"',
            "request_timeout_s = 2",
            'events = "webhook"',
            "[feishu.webhook]",
            'host = "127.0.0.1"',
            f"port = {free_port()}",
            'path = "/feishu/events"',
            'verification_token_env = "TC_FS_VERIFY"',
            'encrypt_key_env = "TC_FS_ENCRYPT"',
            "[[feishu.routes]]",
            f'chat_id = "{FS_CHAT}"',
            'agents = ["builder"]',
        ]
        self.config = tmp_path / "taskcard.toml"
        self.config.write_text("\n".join(lines) + "\n")
        self.env = {
            TOKEN_ENV: telegram.token,
            "TC_FS_APP_ID": feishu.app_id,
            "TC_FS_APP_SECRET": feishu.app_secret,
            "TC_FS_VERIFY": "verify",
            "TC_FS_ENCRYPT": "encrypt",
        }
        self.telegram, self.feishu = telegram, feishu

    def serve(self) -> ServeProcess:
        return ServeProcess(self.config, env=self.env)

    def shown(self, code: str) -> tuple[int, int]:
        """How often the Telegram chat and the Feishu chat show the notice of `code`."""
        marker = f"[{code}]"
        on_telegram = sum(marker in m.text for m in self.telegram.bot_messages(TG_CHAT))
        return on_telegram, sum(marker in text for text in self.feishu.texts(FS_CHAT))

    def pending(self) -> list[str]:
        result = run_cli("status", "--config", str(self.config), "--json")
        assert result.returncode == 0, result.stderr
        routes = json.loads(result.stdout)["routes"]
        return [notice for route in routes for notice in route["pending_notices"]]

    async def cards_up(self) -> None:
        publish(self.workdir, "# Build\nworking")
        await eventually(
            lambda: self.telegram.bot_messages(TG_CHAT) and self.feishu.cards(FS_CHAT),
            timeout_s=60,
            what="the cards on both platforms",
        )

    def notify(self, code: str) -> None:
        notify(self.workdir, f"task_card.error:tc_1:1:{code}", "error", code=code)

    async def settled(self) -> None:
        """The second notice shown on both platforms and no notice left to send."""
        await eventually(
            lambda: self.shown(SECOND) >= (1, 1) and not self.pending(),
            timeout_s=90,
            what="the second notice shown and nothing pending",
        )


async def test_a_notice_whose_answer_is_lost_shows_once(
    tmp_path: Path, telegram: FakeTelegram, feishu: FakeFeishu
) -> None:
    setup = Setup(tmp_path, telegram, feishu)
    with setup.serve() as service:
        await setup.cards_up()
        # Each platform posts the notice, then closes the connection unanswered.
        telegram.drop_after_accept("sendMessage")
        feishu.drop_after_accept("send")
        setup.notify(FIRST)
        await eventually(lambda: setup.shown(FIRST) >= (1, 1), what="the notice posted")
        setup.notify(SECOND)
        await setup.settled()
        assert setup.shown(FIRST) == (1, 1)
        assert setup.shown(SECOND) == (1, 1)
        assert await service.aterminate() == 0
    assert "a notice may have been posted" in service.logs
    # `taskcard status` shows the operator the notice that may be missing from the chat:
    # which one, in which chat, since when, and what that means.
    result = run_cli("status", "--config", str(setup.config), "--json")
    routes = {route["route"]: route for route in json.loads(result.stdout)["routes"]}
    (unsure,) = routes[f"telegram:{TG_CHAT}::builder"]["unsure_notices"]
    assert unsure["id"] == f"task_card.error:tc_1:1:{FIRST}"
    assert f"[{FIRST}]" in unsure["text"] and unsure["since"].endswith("Z")
    assert routes[f"feishu:{FS_CHAT}::builder"]["unsure_notices"] == []
    text = run_cli("status", "--config", str(setup.config)).stdout
    block = text[text.index(f"telegram:{TG_CHAT}::builder") :]
    assert "unsure notices: 1 (" in block and "may be in the chat or missing from it" in block
    assert f"- task_card.error:tc_1:1:{FIRST} since {unsure['since']}: " in block, block


async def test_a_notice_answered_after_the_timeout_shows_once(
    tmp_path: Path, telegram: FakeTelegram, feishu: FakeFeishu
) -> None:
    setup = Setup(tmp_path, telegram, feishu)
    with setup.serve() as service:
        await setup.cards_up()
        # Posted at once, answered long after each client gave up (a slow Bot API).
        telegram.delay_answers("sendMessage", 30)
        feishu.delay_answers("send", 8)
        sends = feishu_sends(feishu)
        setup.notify(FIRST)
        await eventually(lambda: setup.shown(FIRST) >= (1, 1), what="the notice posted")
        await eventually(
            lambda: "may have performed the request" in service.logs,
            timeout_s=60,
            what="the Telegram send given up",
        )
        await eventually(
            lambda: feishu_sends(feishu) >= sends + 2,
            timeout_s=60,
            what="the Feishu send tried again",
        )
        telegram.delay_answers("sendMessage", 0)
        feishu.delay_answers("send", 0)
        setup.notify(SECOND)
        await setup.settled()
        assert setup.shown(FIRST) == (1, 1)
        assert await service.aterminate() == 0


async def test_a_kill_while_a_notice_awaits_its_answer_does_not_post_it_again(
    tmp_path: Path, telegram: FakeTelegram, feishu: FakeFeishu
) -> None:
    setup = Setup(tmp_path, telegram, feishu)
    with setup.serve() as service:
        await setup.cards_up()
        telegram.hold_answers("sendMessage")
        feishu.hold_answers("send")
        setup.notify(FIRST)
        await eventually(lambda: setup.shown(FIRST) >= (1, 1), what="the notice posted")
        service.kill()
    telegram.release_answers("sendMessage")
    feishu.release_answers("send")
    with setup.serve() as again:
        setup.notify(SECOND)
        await setup.settled()
        assert setup.shown(FIRST) == (1, 1)
        assert await again.aterminate() == 0


async def test_a_notice_refused_before_it_was_posted_is_sent_again_once(
    tmp_path: Path, telegram: FakeTelegram, feishu: FakeFeishu
) -> None:
    setup = Setup(tmp_path, telegram, feishu)
    with setup.serve() as service:
        await setup.cards_up()
        # Answered without posting: a server error, then a 429 naming its wait.
        telegram.fail_next("sendMessage", 500, "Internal Server Error")
        telegram.fail_next("sendMessage", 429, "Too Many Requests", {"retry_after": 1})
        feishu.script_error("send", 1, http_status=500, msg="internal error")
        feishu.script_rate_limit("send", reset_s=1)
        setup.notify(FIRST)
        await eventually(lambda: setup.shown(FIRST) >= (1, 1), timeout_s=60, what="the notice")
        setup.notify(SECOND)
        await setup.settled()
        assert setup.shown(FIRST) == (1, 1)
        assert await service.aterminate() == 0


async def test_a_command_reply_whose_answer_is_lost_shows_once_on_telegram(
    tmp_path: Path, telegram: FakeTelegram, feishu: FakeFeishu
) -> None:
    """A `/taskcard` answer goes through the notices' send path: one whose answer was lost
    was sent again and showed twice. The service now says so in its log and leaves it; the
    next command's answer shows as usual (Feishu's answers carry a uuid, so a retry there
    posts nothing new: see the notices above)."""
    setup = Setup(tmp_path, telegram, feishu)

    def answers(words: str) -> int:
        return sum(words in m.text for m in telegram.bot_messages(TG_CHAT))

    with setup.serve() as service:
        await setup.cards_up()
        telegram.drop_after_accept("sendMessage")
        telegram.inject_command(TG_CHAT, "/taskcard 2")
        await eventually(
            lambda: "a reply may have been posted" in service.logs,
            timeout_s=60,
            what="the lost answer given up",
        )
        telegram.inject_command(TG_CHAT, "/taskcard 4")
        await eventually(lambda: answers("now show 4 activity rows") == 1, what="the next one")
        assert answers("now show 2 activity rows") == 1
        assert await service.aterminate() == 0


async def test_a_kill_while_a_command_reply_awaits_its_answer_does_not_post_it_again(
    tmp_path: Path, telegram: FakeTelegram, feishu: FakeFeishu
) -> None:
    """A command's answer is kept in the state until it is sent, so that a stop does not lose
    it; one whose send was under way at a kill -9 was sent again by the next start, and the
    chat showed it twice. It is now kept as unsure before its request goes out, as a notice
    is, and the next start says so in its log and leaves it."""
    setup = Setup(tmp_path, telegram, feishu)

    def answers(words: str) -> int:
        return sum(words in m.text for m in telegram.bot_messages(TG_CHAT))

    with setup.serve() as service:
        await setup.cards_up()
        telegram.hold_answers("sendMessage")
        telegram.inject_command(TG_CHAT, "/taskcard 2")
        await eventually(lambda: answers("now show 2 activity rows") == 1, what="the answer")
        service.kill()
    telegram.release_answers("sendMessage")
    with setup.serve() as again:
        telegram.inject_command(TG_CHAT, "/taskcard 4")
        await eventually(lambda: answers("now show 4 activity rows") == 1, what="the next one")
        assert answers("now show 2 activity rows") == 1
        assert await again.aterminate() == 0
    assert "a command reply the last run was sending may have been posted" in again.logs


async def test_a_start_keeps_the_unsure_notices_to_their_bound(
    tmp_path: Path, telegram: FakeTelegram, feishu: FakeFeishu
) -> None:
    """`taskcard status` lists the unsure notices a route kept from its earlier runs; they
    were never forgotten, so a chat whose answers kept getting lost grew the list without
    end. A start keeps each route's newest `UNSURE_KEEP_PER_ROUTE` (docs/operators.md)."""
    setup = Setup(tmp_path, telegram, feishu)
    route = f"telegram:{TG_CHAT}::builder"
    store = SqliteStore.in_dir(tmp_path / ".taskcard")
    try:
        for n in range(UNSURE_KEEP_PER_ROUTE + 5):
            store.add_notice(route, f"old:{n:03}", f"notice {n}", "pending")
            store.set_notice_state(route, f"old:{n:03}", "unsure")
    finally:
        store.close()

    def unsure_listed() -> str:
        text = run_cli("status", "--config", str(setup.config)).stdout
        return text[text.index(route) :]

    assert f"unsure notices: {UNSURE_KEEP_PER_ROUTE + 5} (" in unsure_listed()
    with setup.serve() as service:
        await setup.cards_up()
        assert await service.aterminate() == 0
    block = unsure_listed()
    assert f"unsure notices: {UNSURE_KEEP_PER_ROUTE} (" in block, block
    assert f"- old:{UNSURE_KEEP_PER_ROUTE + 4:03} since" in block, "the newest are listed"


def lock_state(tmp_path: Path) -> sqlite3.Connection:
    """Another process holding the service's state file in a write transaction (a sqlite3
    shell left in `BEGIN EXCLUSIVE`): every write of the service fails until it ends."""
    holder = sqlite3.connect(tmp_path / ".taskcard" / "state.sqlite3", isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    return holder


async def test_a_notice_is_not_sent_while_its_mark_cannot_be_written(
    tmp_path: Path, telegram: FakeTelegram, feishu: FakeFeishu
) -> None:
    """The state store keeps a write it cannot make in memory, to retry it: the `unsure`
    mark of a notice was kept so and the notice sent all the same, and a kill -9 before the
    store could write again left no mark (nor the notice), so the next start posted it a
    second time. Telegram's send now waits until the mark is on disk; Feishu's does not
    need one."""
    setup = Setup(tmp_path, telegram, feishu)
    with setup.serve() as service:
        await setup.cards_up()
        holder = lock_state(tmp_path)
        try:
            setup.notify(FIRST)
            await eventually(
                lambda: "did not take the notice's send" in service.logs or setup.shown(FIRST)[0],
                timeout_s=60,
                what="the notice's send held or made",
            )
            await eventually(lambda: setup.shown(FIRST)[1] == 1, what="the notice on Feishu")
            assert setup.shown(FIRST)[0] == 0, "sent before its mark was written"
            publish(setup.workdir, "# Build\nstill working")
            await eventually(  # the chat's card is edited meanwhile
                lambda: any("still working" in m.text for m in telegram.bot_messages(TG_CHAT)),
                what="the card edited while the state is locked",
            )
            service.kill()
        finally:
            holder.close()
    with setup.serve() as again:
        setup.notify(SECOND)
        await setup.settled()
        assert setup.shown(FIRST) == (1, 1)
        assert await again.aterminate() == 0


async def test_a_command_reply_is_not_sent_while_its_mark_cannot_be_written(
    tmp_path: Path, telegram: FakeTelegram, feishu: FakeFeishu
) -> None:
    """The same for a command's answer, which is kept in the state until sent and marked
    `unsure` before its request: it waits while the state file is locked, goes out once the
    lock ends, and a kill -9 and a restart after that do not post it again."""
    setup = Setup(tmp_path, telegram, feishu)

    def answers(words: str) -> int:
        return sum(words in m.text for m in telegram.bot_messages(TG_CHAT))

    with setup.serve() as service:
        await setup.cards_up()
        holder = lock_state(tmp_path)
        try:
            telegram.inject_command(TG_CHAT, "/taskcard 2")
            await eventually(
                lambda: (
                    "did not take the reply's send" in service.logs
                    or answers("now show 2 activity rows")
                ),
                timeout_s=60,
                what="the answer's send held or made",
            )
            assert answers("now show 2 activity rows") == 0, "sent before its mark was written"
        finally:
            holder.close()
        await eventually(
            lambda: answers("now show 2 activity rows") == 1, timeout_s=90, what="the answer"
        )
        await eventually(lambda: "work again" in service.logs, what="the state written")
        service.kill()
    with setup.serve() as again:
        telegram.inject_command(TG_CHAT, "/taskcard 4")
        await eventually(lambda: answers("now show 4 activity rows") == 1, what="the next one")
        assert answers("now show 2 activity rows") == 1
        assert await again.aterminate() == 0


async def test_in_a_cluster_a_notice_whose_answer_is_lost_shows_once(
    tmp_path: Path,
    telegram: FakeTelegram,
    redis_url: str,
    prefix: str,
    fleet: ExitStack,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two `serve` on one bot through a real Redis: the agent's owner sends a notice whose
    answer is lost, and then dies; the instance taking the agent over sends what the owner
    left pending, never the notice that may be in the chat, and `taskcard status` of either
    instance lists it as unsure."""
    serves = {
        name: fleet.enter_context(
            instance(tmp_path, name, telegram, ["shared"], redis_url=redis_url, prefix=prefix)
        )
        for name in ("i0", "i1")
    }
    workdir = tmp_path / "agents" / "shared"
    publish(workdir, "# Build\nworking")
    await eventually(lambda: telegram.bot_messages(GROUP), timeout_s=60, what="the card")

    def shown_(code: str) -> int:
        return sum(f"[{code}]" in m.text for m in telegram.bot_messages(GROUP))

    def notify_(code: str) -> None:
        notify(workdir, f"task_card.error:tc_1:1:{code}", "error", code=code)

    telegram.drop_after_accept("sendMessage")
    notify_(FIRST)
    await eventually(
        lambda: any("a notice may have been posted" in s.logs for s in serves.values()),
        timeout_s=60,
        what="the lost answer given up",
    )
    assert shown_(FIRST) == 1
    serving = "agent shared: this instance serves it now"
    owner = next(n for n, s in serves.items() if serving in s.logs)
    serves.pop(owner).kill()
    (survivor,) = serves.values()
    await eventually(
        lambda: f"{serving}, taking over" in survivor.logs, timeout_s=60, what="the takeover"
    )
    notify_(SECOND)
    await eventually(lambda: shown_(SECOND) == 1, timeout_s=60, what="the second notice")
    assert shown_(FIRST) == 1
    monkeypatch.setenv("TC_REDIS_URL", redis_url)
    result = run_cli("status", "--config", str(survivor.config), "--json")
    assert result.returncode == 0, result.stderr
    (route,) = [r for r in json.loads(result.stdout)["routes"] if r["agent"] == "shared"]
    assert [u["id"] for u in route["unsure_notices"]] == [f"task_card.error:tc_1:1:{FIRST}"]
    assert route["pending_notices"] == []


async def test_in_a_cluster_a_notice_queued_where_the_lease_was_lost_shows_once(
    tmp_path: Path,
    telegram: FakeTelegram,
    redis_url: str,
    prefix: str,
    fleet: ExitStack,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two `serve` on one bot through a real Redis. The agent's owner has a notice queued
    behind a card edit still awaiting its answer when it stalls (SIGSTOP) past its lease:
    the other instance takes the agent over and sends the notice it finds pending. Resumed,
    the old owner does not send it again (its lanes let go of the agent's notices, and a
    send begins only from a notice still pending), and the chat shows it once."""
    serves: dict[str, ServeProcess] = {}
    for name in ("i0", "i1"):
        serve = instance(tmp_path, name, telegram, ["shared"], redis_url=redis_url, prefix=prefix)
        # The held edit below must outlast the takeover, not time out in between.
        slow = "poll_timeout_s = 1\nrequest_timeout_s = 300"
        serve.config.write_text(serve.config.read_text().replace("poll_timeout_s = 1", slow))
        serves[name] = fleet.enter_context(serve)
    workdir = tmp_path / "agents" / "shared"
    publish(workdir, "# Build\nworking")
    await eventually(lambda: telegram.bot_messages(GROUP), timeout_s=60, what="the card")
    serving = "agent shared: this instance serves it now"
    await eventually(
        lambda: any(serving in s.logs for s in serves.values()), timeout_s=60, what="an owner"
    )
    owner = next(s for s in serves.values() if serving in s.logs)
    (other,) = [s for s in serves.values() if s is not owner]
    assert owner.proc is not None
    monkeypatch.setenv("TC_REDIS_URL", redis_url)
    notice = f"task_card.error:tc_1:1:{FIRST}"

    def pending() -> list[str]:
        result = run_cli("status", "--config", str(other.config), "--json")
        assert result.returncode == 0, result.stderr
        return [n for r in json.loads(result.stdout)["routes"] for n in r["pending_notices"]]

    def shown_() -> int:
        return sum(f"[{FIRST}]" in m.text for m in telegram.bot_messages(GROUP))

    edits = telegram.count("editMessageText", GROUP)
    telegram.hold_answers("editMessageText")  # the owner's lane waits on its card's edit
    publish(workdir, "# Build\nstep 2")
    await eventually(
        lambda: telegram.count("editMessageText", GROUP) > edits,
        timeout_s=60,
        what="the owner's edit on its way",
    )
    notify(workdir, notice, "error", code=FIRST)
    await eventually(
        lambda: pending() == [notice], timeout_s=60, what="the notice queued behind the edit"
    )
    owner.proc.send_signal(signal.SIGSTOP)
    try:
        await eventually(
            lambda: f"{serving}, taking over" in other.logs, timeout_s=60, what="the takeover"
        )
        telegram.release_answers("editMessageText")
        await eventually(lambda: shown_() == 1, timeout_s=60, what="the notice, sent by the other")
    finally:
        owner.proc.send_signal(signal.SIGCONT)
    let_go = ("left for the instance serving it now", f"notice {notice} not sent from here")
    await eventually(
        lambda: shown_() > 1 or any(line in owner.logs for line in let_go),
        timeout_s=60,
        what="the old owner letting the notice go (or sending it again)",
    )
    assert shown_() == 1, "sent by both instances"
    assert pending() == []
