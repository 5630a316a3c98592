"""`/taskcard` handling as tables: what people type, what it does to the chat's preferences,
and how the service dispatches it (replies, hidden cards, suppressed notices, who may ask).

The platform parsers (Telegram's `parse_command`, Feishu's `command_args`) have their own
tables in tests/channels; here the service's side runs a real `Service` over a recording
channel, calling the command sink a channel calls."""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from taskcard.bridge.config import parse_config
from taskcard.bridge.deliver.registry import BuiltChannel, RouteSpec
from taskcard.bridge.run.chat_commands import matching_agents
from taskcard.bridge.run.commands import (
    TaskcardCommand,
    apply_to_prefs,
    parse_taskcard,
    rows_out_of_range,
    suggestion,
    without_mentions,
)
from taskcard.bridge.run.service import Service
from taskcard.bridge.schedule.scheduler import RouteKey
from taskcard.bridge.store.sqlite import ChatPrefs, SqliteStore
from taskcard.channels.base import (
    TASKCARD_WORDS,
    CardView,
    Channel,
    ChatRef,
    CommandSink,
    IncomingCommand,
    Operation,
    Outgoing,
    RateScope,
    ReplyTo,
    SentAs,
    folded,
)


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        ("", TaskcardCommand("state")),
        ("   ", TaskcardCommand("state")),
        ("status", TaskcardCommand("state")),
        ("STATE", TaskcardCommand("state")),
        ("off", TaskcardCommand("off")),
        (" Off ", TaskcardCommand("off")),
        ("on", TaskcardCommand("on")),
        ("help", TaskcardCommand("help")),
        (" HELP ", TaskcardCommand("help")),
        ("?", TaskcardCommand("help")),
        ("1", TaskcardCommand("rows", 1)),
        ("10", TaskcardCommand("rows", 10)),
        ("05", TaskcardCommand("rows", 5)),
        ("0", TaskcardCommand("unknown")),
        ("11", TaskcardCommand("unknown")),
        ("100", TaskcardCommand("unknown")),
        ("-3", TaskcardCommand("unknown")),
        ("3.5", TaskcardCommand("unknown")),
        ("on off", TaskcardCommand("unknown")),
        ('<at user_id="all">', TaskcardCommand("unknown")),
        ("٣", TaskcardCommand("unknown")),  # a digit, but not an ASCII one
        # Compatibility forms (NFKC) are the word, for every option as for orchestrator's
        # `off`: `/taskcard ＯＦＦ` was answered "Did you mean /taskcard off?".
        ("\uff2f\uff26\uff26", TaskcardCommand("off")),
        ("\uff42\uff4f\uff41\uff52\uff44", TaskcardCommand("board")),
        ("\uff15", TaskcardCommand("rows", 5)),  # a full-width digit
        ("off\u200b", TaskcardCommand("off")),  # an invisible character pasted with it
        (
            "\uff4f\uff52\uff43\uff48\uff45\uff53\uff54\uff52\uff41\uff54\uff4f\uff52",
            TaskcardCommand("orchestrator"),
        ),
        ("orchestrator \uff2f\uff26\uff26", TaskcardCommand("orchestrator", agent="off")),
        ("orchestrator \uff42uilder", TaskcardCommand("orchestrator", agent="\uff42uilder")),
    ],
)
def test_parse_taskcard(args: str, expected: TaskcardCommand) -> None:
    assert parse_taskcard(args) == expected


def test_every_option_word_the_channels_know_is_an_option() -> None:
    # A Feishu app's CJK name is read with one of these glued after it (`TASKCARD_WORDS`).
    assert all(parse_taskcard(word).action != "unknown" for word in TASKCARD_WORDS)


@pytest.mark.parametrize(
    ("args", "meant"),
    [
        ("of", "/taskcard off"),
        ("borad", "/taskcard board"),
        ("cancle", "/taskcard cancel"),
        ("hlep", "/taskcard help"),
        ("off please", "/taskcard off"),
        ("\uff4f\uff46\uff46 please", "/taskcard off"),  # full-width letters, then more
        ("\u0667", "/taskcard 7"),  # an Arabic-Indic digit: not taken, but meant
        ("+\u0665", "/taskcard 5"),
        ("\u0969", "/taskcard 3"),  # a Devanagari one
        ("on off", None),  # two options: the help says which is which
        ("xyzzy", None),
        ("11", None),
        ("+5", "/taskcard 5"),  # an in-range count written another way
        ("005", "/taskcard 5"),
        ('<at user_id="all">', None),
    ],
)
def test_an_unknown_option_suggests_only_an_option(args: str, meant: str | None) -> None:
    assert parse_taskcard(args) == TaskcardCommand("unknown")
    assert suggestion(args) == meant


@pytest.mark.parametrize(
    ("args", "left"),
    [
        ("off @alice_person", "off"),
        ("@_user_2 3", "3"),  # a Feishu mention's placeholder
        ("@_all", ""),
        ("off", None),  # no mention
        ("off @", None),  # a lone sign mentions no one
        ("orchestrator builder @alice_person", "orchestrator builder"),
    ],
)
def test_the_options_without_their_mentions(args: str, left: str | None) -> None:
    assert without_mentions(args) == left


@pytest.mark.parametrize(
    ("args", "out"),
    [
        ("0", True),
        ("11", True),
        ("-3", True),
        ("\uff11\uff12", True),  # a full-width 12
        ("\u0661\u0662", True),  # an Arabic-Indic 12, as an ASCII one
        ("\u0660", True),
        ("\u0665", False),  # in range: suggested as /taskcard 5
        ("99999999999999999999999", True),
        ("+5", False),  # in range, written another way: suggested as /taskcard 5
        ("005", False),
        ("-0", True),
        ("five", False),
        ("", False),
    ],
)
def test_only_a_count_outside_the_range_is_answered_with_the_range(args: str, out: bool) -> None:
    assert rows_out_of_range(args) is out


@pytest.mark.parametrize(
    ("command", "before", "after"),
    [
        (TaskcardCommand("off"), ChatPrefs(), ChatPrefs(hidden=True)),
        (TaskcardCommand("off"), ChatPrefs(activity_rows=4), ChatPrefs(True, 4)),
        (TaskcardCommand("on"), ChatPrefs(True, 4), ChatPrefs(False, 4)),
        (TaskcardCommand("rows", 7), ChatPrefs(True, 4), ChatPrefs(True, 7)),
        (TaskcardCommand("state"), ChatPrefs(True, 4), ChatPrefs(True, 4)),
        (TaskcardCommand("unknown"), ChatPrefs(True, 4), ChatPrefs(True, 4)),
    ],
)
def test_what_a_command_does_to_the_preferences(
    command: TaskcardCommand, before: ChatPrefs, after: ChatPrefs
) -> None:
    assert apply_to_prefs(command, before) == after


class RecordingChannel(Channel):
    """Accepts every request and keeps what was sent, by chat."""

    name = "rec"

    def __init__(self) -> None:
        self.sent: list[tuple[ChatRef, str]] = []

    async def start(self, on_command: CommandSink) -> None:
        return None

    async def stop(self) -> None:
        return None

    def render_card(self, view: CardView) -> Outgoing:
        return Outgoing.build(f"card {view.agent_id} hidden={view.hidden}", {})

    def render_text(self, text: str) -> Outgoing:
        return Outgoing.build(text, {})

    def rate_scopes(
        self, chat: ChatRef, operation: Operation, message_id: str | None
    ) -> tuple[RateScope, ...]:
        return ()

    async def send(
        self,
        chat: ChatRef,
        message: Outgoing,
        *,
        idempotency_key: str | None = None,
        reply_to: ReplyTo | None = None,
    ) -> str:
        self.sent.append((chat, message.text))
        return str(len(self.sent))

    async def edit(self, chat: ChatRef, message_id: str, message: Outgoing) -> None:
        self.sent.append((chat, message.text))

    async def delete(self, chat: ChatRef, message_id: str) -> None:
        return None

    async def pin(self, chat: ChatRef, message_id: str) -> None:
        return None


GROUP = ChatRef("-100")
STRANGER_CHAT = ChatRef("-999")


class Running:
    """A real service over the recording channel, started on the test's loop."""

    def __init__(self, tmp_path: Path) -> None:
        (tmp_path / "agent").mkdir()
        config = parse_config(
            {"agents": [{"id": "a", "workdir": "agent"}], "state_dir": "state"}, base_dir=tmp_path
        )
        self.channel = RecordingChannel()
        self.store = SqliteStore.in_dir(tmp_path / "state")
        route = RouteSpec("rec", GROUP, ("a",), allowed_user_ids=frozenset({"7"}))
        built = {"rec": BuiltChannel(self.channel, (route,), ())}
        self.service = Service(config, built, self.store)
        self.key = RouteKey("rec", GROUP, "a")
        self.stop = asyncio.Event()
        self.task: asyncio.Task[None] | None = None

    async def command(self, args: str, *, user: str = "7", chat: ChatRef = GROUP) -> None:
        await self.service._on_command("rec", IncomingCommand(chat, args, user_id=user))

    async def replies(self, count: int) -> list[str]:
        deadline = time.monotonic() + 30
        while len(self.channel.sent) < count:
            assert time.monotonic() < deadline, f"only {self.channel.sent}"
            await asyncio.sleep(0.01)
        return [text for _, text in self.channel.sent]


@pytest.fixture
async def running(tmp_path: Path) -> AsyncIterator[Running]:
    service = Running(tmp_path)
    service.task = asyncio.create_task(service.service.run(service.stop))
    await asyncio.wait_for(service.service.started.wait(), timeout=30)
    yield service
    service.stop.set()
    await asyncio.wait_for(service.task, timeout=60)
    service.store.close()


@pytest.mark.parametrize(
    ("args", "reply", "prefs"),
    [
        ("", "Task cards here: shown, 3 activity rows.", ChatPrefs()),
        ("off", "Task cards hidden here. /taskcard on shows them again.", ChatPrefs(True)),
        ("on", "Task cards shown here.", ChatPrefs(False)),
        ("4", "Task cards here now show 4 activity rows.", ChatPrefs(False, 4)),
        ("1", "Task cards here now show 1 activity row.", ChatPrefs(False, 1)),
        ("dance <b>", "Unknown option. /taskcard: show the state here", ChatPrefs()),
        ("12", "A card shows 1 to 10 activity rows: /taskcard 10 shows the most", ChatPrefs()),
    ],
)
async def test_a_command_is_answered_and_remembered(
    running: Running, args: str, reply: str, prefs: ChatPrefs
) -> None:
    await running.command(args)
    (text,) = await running.replies(1)
    assert text.startswith(reply)
    assert "dance" not in text and "<b>" not in text  # never echoed
    assert running.store.prefs(running.key.chat_scope) == prefs


async def test_off_suppresses_the_notices_still_owed(running: Running) -> None:
    running.store.add_notice(running.key.store_key, "n1", "an old notice", "pending")
    await running.command("off")
    await running.replies(1)
    assert running.store.pending_notices() == []
    assert running.store.notice_counts() == {"suppressed": 1}


@pytest.mark.parametrize(
    ("user", "chat"),
    [(None, GROUP), ("7", STRANGER_CHAT)],
    ids=["no user", "unrouted chat"],
)
async def test_commands_from_others_are_ignored(
    running: Running, user: str | None, chat: ChatRef
) -> None:
    await running.service._on_command("rec", IncomingCommand(chat, "off", user_id=user))
    await running.command("")  # an allowed command after it, to know the lane has run
    (text,) = await running.replies(1)
    assert "shown" in text  # the ignored `off` changed nothing and got no reply
    assert running.store.prefs(running.key.chat_scope) == ChatPrefs()


TOPIC = ChatRef("-100", "5")  # a topic of GROUP: its answers never replace the main flow's


async def test_a_person_not_listed_is_told_once_how_to_be_added(running: Running) -> None:
    # A person not on `allowed_user_ids` was ignored without a word. They are told why and
    # what to do, once: repeating the command (or a /tell) in the chat within the quiet
    # spell gets no second answer, so they cannot spend the chat's send budget on answers.
    await running.command("off", user="8")
    (refusal,) = await running.replies(1)
    assert refusal.startswith("Only the people listed for this chat")
    assert refusal.endswith("your user id: 8")
    await running.command("off", user="8")
    await running.service._on_command(
        "rec", IncomingCommand(GROUP, "a hello", user_id="8", command="tell")
    )
    await running.command("", chat=TOPIC)  # a listed person's command, answered after them
    texts = await running.replies(2)
    # The topic has no route of its own: the answer names where the chat's cards are.
    assert len(texts) == 2, texts
    assert texts[1].startswith("Task cards in this chat's General topic: shown"), texts
    assert running.store.prefs(running.key.chat_scope) == ChatPrefs()


@pytest.mark.parametrize(
    ("sent_as", "answer", "prefs"),
    [
        ("admin", "Task cards hidden here.", ChatPrefs(True)),
        ("chat", "Only the people listed for this chat", ChatPrefs()),
    ],
    ids=["anonymous admin of the chat", "on behalf of another chat"],
)
async def test_a_message_on_behalf_of_a_chat(
    running: Running, sent_as: SentAs, answer: str, prefs: ChatPrefs
) -> None:
    command = IncomingCommand(GROUP, "off", user_id="1087968824", sent_as=sent_as)
    await running.service._on_command("rec", command)
    (text,) = await running.replies(1)
    assert text.startswith(answer)
    assert sent_as == "admin" or "Send it again as yourself" in text
    assert running.store.prefs(running.key.chat_scope) == prefs


async def test_a_reply_while_the_state_is_unreadable_is_told_to_send_it_again(
    running: Running,
) -> None:
    # A reply to a notice about an agent, while the state could not be read: the notice
    # was taken for none, and its author was told to reply to a notice about the agent,
    # which they had done, while their text went nowhere. They are told it was not
    # delivered and to send it again, once in a while like the other answers.
    running.store.remember_notice("rec", GROUP.chat_id, "n1", "a", time.time())
    # The notices cannot be read: each read of them fails as a damaged page would.
    with sqlite3.connect(running.store.path) as other:
        other.executescript(
            "DROP TABLE notice_messages; CREATE VIEW notice_messages AS SELECT 'rec' AS"
            " channel, '-100' AS chat_id, 'n1' AS message_id, 'a' AS agent_id,"
            " abs(-9223372036854775807 - 1) AS at"
        )
    reply = IncomingCommand(GROUP, "stop now", user_id="7", command="reply", reply_to=("n1",))
    await running.service._on_command("rec", reply)
    (told,) = await running.replies(1)
    assert told.startswith("Your reply was not delivered") and "again" in told
    assert "reaches no agent" not in told and "stop now" not in told
    await running.service._on_command("rec", reply)
    await running.command("help")  # answered after the second reply: that one was read
    texts = await running.replies(2)
    assert len(texts) == 2 and texts[1].startswith("Task card commands here"), texts


def test_one_folding_rule_reads_options_and_agents_names_alike() -> None:
    # The service folded agents' names by a rule of its own (composed again after case
    # folding), close to the options' but not the same; `folded` is now both's. A name
    # typed full-width with a variation selector pasted after it is the agent's, and a
    # letter that case folding decomposes (`ǰ`) reads the same whichever way it was typed.
    assert matching_agents("ＢＵＩＬＤＥＲ\ufe0f", ["builder", "keeper"]) == ["builder"]
    assert folded("ＯＦＦ\u200b") == "off"
    assert folded("\u01f0") == folded("j\u030c") == "\u01f0"
