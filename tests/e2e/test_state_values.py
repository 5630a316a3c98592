"""A state file whose values are not of their column's kind: text where a time or a count
belongs, a blob where an id does, as a hand edit or a bug leaves them. `taskcard serve` keeps
serving: each such value is skipped with one warning naming the row and what happens instead,
every other row is still honoured and every other card still lands; `taskcard status` and
`taskcard chats` still show the state. Driven through the fake Bot API; the reading is the
store's, so it is the same for every platform."""

from __future__ import annotations

import json
import re
import sqlite3
import time
from pathlib import Path

import pytest

from taskcard.bridge.store.sqlite import STATE_FILE, ChatPrefs, InboxRecord, SeenChat, SqliteStore
from tests.e2e.harness import ServeProcess, eventually, publish, run_cli
from tests.e2e.test_serve_telegram import GROUP, agent_dir, setup, shown
from tests.fakes.telegram_api import FakeTelegram

AGENTS = ["builder", "tester"]
BUILDER = f"telegram:{GROUP}::builder"


def edit_state(tmp_path: Path, *statements: str) -> None:
    """Change the state file as a person with the sqlite3 shell would."""
    with sqlite3.connect(tmp_path / ".taskcard" / STATE_FILE) as db:
        for statement in statements:
            db.execute(statement)


def cards_with(fake: FakeTelegram, text: str) -> int:
    return sum(text in shown_text for shown_text in shown(fake, GROUP))


def readable_status(config: Path) -> tuple[str, str]:
    """`taskcard status`, `status --json` and `chats` all show the state: the first one's
    output, and what they all logged."""
    outputs, logs = [], ""
    for args in (("status",), ("status", "--json"), ("chats",)):
        result = run_cli(*args, "--config", str(config))
        assert result.returncode == 0, (args, result.stderr)
        assert "Traceback" not in result.stderr, result.stderr
        outputs.append(result.stdout)
        logs += result.stderr
    return outputs[0], logs


async def both_cards(serve: ServeProcess, fake: FakeTelegram, text: str) -> None:
    """Publish `text` for every agent and wait until both cards show it."""
    for agent in AGENTS:
        publish(agent_dir(serve.config.parent, agent), f"{agent} {text}")
    await eventually(
        lambda: all(cards_with(fake, f"{agent} {text}") for agent in AGENTS),
        timeout_s=60,
        what=f"both cards showing {text!r}",
    )


@pytest.mark.parametrize(
    ("column", "value"),
    [
        ("committed_at", "'soon'"),
        ("committed_at", "'nan'"),
        ("committed_at", "1e308"),
        ("committed_at", "x'00ff'"),
        ("unsure_sends", "'soon'"),
        ("unsure_sends", "x'00ff'"),
        ("unsure_at", "'inf'"),
        ("stale_message_id", "x'00ff'"),
        ("message_id", "x'00ff'"),
    ],
)
async def test_a_card_value_of_another_kind_is_skipped_and_the_rest_kept(
    tmp_path: Path, telegram: FakeTelegram, column: str, value: str
) -> None:
    """A resident row edited by hand ended `serve` in a traceback at start (a text last-edit
    time, a text count of unanswered sends), or left the card failing on every change (a blob
    message id); `status --json` ended in one on a blob. The value is skipped with a warning
    naming the route and the column's meaning; the other agent's card is still edited in
    place. Only a message id that cannot be read costs a second message, as the warning
    says."""
    serve = setup(tmp_path, telegram, AGENTS, [(GROUP, AGENTS)])
    with serve:
        await both_cards(serve, telegram, "before")
        assert await serve.aterminate() == 0, serve.logs
    edit_state(tmp_path, f"UPDATE residents SET {column} = {value} WHERE route = '{BUILDER}'")
    assert f"{GROUP}::tester" in readable_status(serve.config)[0]
    again = ServeProcess(serve.config, env={"TC_TEST_TOKEN": telegram.token})
    with again:
        await both_cards(again, telegram, "after")
        assert await again.aterminate() == 0, again.logs
    assert "Traceback" not in again.logs
    assert again.logs.count(f"card {BUILDER} holds") == 1, again.logs
    assert cards_with(telegram, "tester") == 1, "the other card is edited in place"
    if column == "message_id":
        assert "the card is posted as a new message" in again.logs
        assert cards_with(telegram, "builder") == 2
    else:
        assert cards_with(telegram, "builder") == 1


# A row of each other table kept by a run, and a hand edit that makes one of its values
# another kind; the words the warning gives for the row.
OTHER_VALUES = {
    "a notice's text as a blob": (
        "UPDATE notices SET text = x'00ff' WHERE notice_id = 'odd'",
        f"the text of notice {BUILDER} odd holds",
    ),
    "an inbox message's queue time as text": (
        "UPDATE inbox SET queued_at = 'soon'",
        "the queue time of inbox message m1 holds",
    ),
    "an inbox message's queue time beyond any date": (
        "UPDATE inbox SET queued_at = 1e300",
        "the queue time of inbox message m1 holds",
    ),
    "a seen chat's last command as text": (
        "UPDATE seen_chats SET last_seen = 'yesterday' WHERE chat_id = '555'",
        "the last command time of seen chat telegram:555: holds",
    ),
    "the rows setting as text": (
        "UPDATE prefs SET activity_rows = 'many'",
        f"the /taskcard <rows> setting of telegram:{GROUP}: holds",
    ),
    "the on/off setting as a blob": (
        "UPDATE prefs SET hidden = x'01'",
        f"the /taskcard on/off setting of telegram:{GROUP}: holds",
    ),
    "a read offset as text": (
        "UPDATE offsets SET offset = 'end' WHERE agent_id = 'builder' AND name = 'reports'",
        "the read offset of builder/reports holds",
    ),
    "a read offset beyond 64 bits": (
        "UPDATE offsets SET offset = 99999999999999999999999 WHERE agent_id = 'builder'"
        " AND name = 'reports'",
        "the read offset of builder/reports holds",
    ),
}


@pytest.mark.parametrize("change", list(OTHER_VALUES))
async def test_a_value_of_another_kind_in_any_table_is_skipped_and_the_rest_kept(
    tmp_path: Path, telegram: FakeTelegram, change: str
) -> None:
    """A notice text as a blob ended `serve` in a traceback at start; a text queue time of an
    inbox message or last-seen time of a chat ended `status` or `chats` in the unreadable-state
    error; a text rows setting failed every card of the chat; a text read offset failed the
    reading of the agent's files. Each is skipped with one warning naming the row; both cards
    land, the good notice is still sent, and status and chats show the state."""
    serve = setup(tmp_path, telegram, AGENTS, [(GROUP, AGENTS)])
    with serve:
        await both_cards(serve, telegram, "before")
        assert await serve.aterminate() == 0, serve.logs
    store = SqliteStore.in_dir(tmp_path / ".taskcard")
    now = time.time()
    store.set_prefs(f"telegram:{GROUP}:", ChatPrefs(hidden=False, activity_rows=3))
    store.add_notice(BUILDER, "odd", "an odd notice", "pending")
    store.add_notice(BUILDER, "good", "a good notice", "pending")
    store.add_inbox_message(InboxRecord("m1", "builder", "telegram", str(GROUP), None, "al", now))
    store.record_chat(SeenChat("telegram", "555", None, "another chat", now))
    store.close()
    statement, warning = OTHER_VALUES[change]
    edit_state(tmp_path, statement)
    _, logs = readable_status(serve.config)
    again = ServeProcess(serve.config, env={"TC_TEST_TOKEN": telegram.token})
    with again:
        await both_cards(again, telegram, "after")
        await eventually(lambda: cards_with(telegram, "a good notice"), what="the good notice")
        assert await again.aterminate() == 0, again.logs
    assert "Traceback" not in again.logs
    # Said once by each command that reads the row (`taskcard chats` alone reads seen chats).
    assert again.logs.count(warning) <= 1, again.logs
    assert warning in logs + again.logs, logs
    assert cards_with(telegram, "tester") == 1, "the cards are edited in place"


async def test_a_removed_agents_inbox_message_leaves_serve_running(
    tmp_path: Path, telegram: FakeTelegram
) -> None:
    """An agent taken out of the config while a message to it waited in its inbox ended every
    `serve` start in a traceback (its status had no agent to show) until the row was forgotten
    a week later. The message is cancelled and the other agent's card is served."""
    serve = setup(tmp_path, telegram, AGENTS, [(GROUP, AGENTS)])
    with serve:
        await both_cards(serve, telegram, "before")
        assert await serve.aterminate() == 0, serve.logs
    store = SqliteStore.in_dir(tmp_path / ".taskcard")
    store.add_inbox_message(
        InboxRecord("m1", "builder", "telegram", str(GROUP), None, "al", time.time())
    )
    store.close()
    without = setup(tmp_path, telegram, ["tester"], [(GROUP, ["tester"])])
    with without:
        publish(agent_dir(tmp_path, "tester"), "tester alone")
        await eventually(lambda: cards_with(telegram, "tester alone"), what="the card")
        assert await without.aterminate() == 0, without.logs
    assert "Traceback" not in without.logs
    assert cards_with(telegram, "tester") == 1


async def test_a_row_key_with_a_line_break_is_one_log_line(
    tmp_path: Path, telegram: FakeTelegram
) -> None:
    """The warning names the row by its key; a key edited to hold a line break split a
    text log line in two, the second looking like a line of its own. It is written escaped."""
    serve = setup(tmp_path, telegram, AGENTS, [(GROUP, AGENTS)])
    store = SqliteStore.in_dir(tmp_path / ".taskcard")
    store.record_chat(SeenChat("telegram", "555", None, "another chat", time.time()))
    store.close()
    edit_state(
        tmp_path,
        "UPDATE seen_chats SET chat_id = '55' || char(10) || 'forged: line',"
        " last_seen = 'yesterday' WHERE chat_id = '555'",
    )
    result = run_cli("chats", "--config", str(serve.config))
    assert result.returncode == 0, result.stderr
    warnings = [line for line in result.stderr.splitlines() if "seen chat" in line]
    assert len(warnings) == 1, result.stderr
    assert "'telegram:55\\nforged: line:' holds 'yesterday'" in warnings[0], result.stderr
    assert not any(line.startswith("forged") for line in result.stderr.splitlines())


# Values a hand edit or a bug may leave where a time belongs that no date can show, or that
# are no number at all: (as SQL for a column, as JSON for the card refusal's start).
NO_TIMES = {
    "1e23": ("1e23", "1e23"),
    "1e308": ("1e308", "1e308"),
    "-1e308": ("-1e308", "-1e308"),
    "infinity": ("9e999", "Infinity"),
    "minus infinity": ("-9e999", "-Infinity"),
    "NaN": ("'NaN'", "NaN"),
    "the year 10000": ("253402300800", "253402300800"),
    "the year 0": ("-62135596801", "-62135596801"),
    "beyond the system's time_t": ("4611686018427387904", "4611686018427387904"),
    "text": ("'soon'", '"soon"'),
    "a blob": ("x'00ff'", "[0, 255]"),
}


def _console_fleet(tmp_path: Path) -> Path:
    for agent in ("a", "b"):
        (tmp_path / "agents" / agent).mkdir(parents=True)
    config = tmp_path / "taskcard.toml"
    config.write_text(
        'state_dir = "state"\n'
        '[[agents]]\nid = "a"\nworkdir = "agents/a"\n'
        '[[agents]]\nid = "b"\nworkdir = "agents/b"\n'
        "[console]\nenabled = true\n"
    )
    return config


@pytest.mark.parametrize("value", list(NO_TIMES))
def test_a_time_no_date_can_show_is_skipped_by_status_and_chats(tmp_path: Path, value: str) -> None:
    """A card's last edit or unanswered send time, a rate-limit pause, a refused card's start
    or a chat's last command holding a time beyond any date (`1e23`, `-1e308`, the year
    10000) ended `status` and `chats` in the unreadable-state error while `serve` ran on; the
    values of another kind were already skipped. Every such time is now skipped the same way,
    with one warning naming the row, and the rest of the state is shown."""
    config = _console_fleet(tmp_path)
    SqliteStore.in_dir(tmp_path / "state").close()
    sql, json_value = NO_TIMES[value]
    with sqlite3.connect(tmp_path / "state" / STATE_FILE) as db:
        for statement in (
            "INSERT INTO residents (route, message_id, committed_at, unsure_sends, unsure_at)"
            f" VALUES ('console:console::a', '7', {sql}, 3, {sql})",
            "INSERT INTO residents (route, message_id, committed_at)"
            " VALUES ('console:console::b', '8', 1700000000)",
            "INSERT INTO cursors VALUES ('card-refused:console:console::a',"
            f' \'{{"reason": "too long", "at": {json_value}}}\')',
            f"INSERT INTO pauses VALUES ('console', {sql})",
            f"INSERT INTO seen_chats VALUES ('console', 'console', '', NULL, {sql})",
            "INSERT INTO seen_chats VALUES ('telegram', '-100', '', 'Ops', 1700000000)",
        ):
            db.execute(statement)
    warnings = {
        "status": [
            "the rate-limit pause of console holds",
            "the last edit time of card console:console::a holds",
            "the last unanswered send time of card console:console::a holds",
            "the start of the refusal of card console:console::a holds",
        ],
        "chats": ["the last command time of seen chat console:console: holds"],
    }
    for args in (("status",), ("status", "--json"), ("chats",), ("chats", "--json")):
        result = run_cli(*args, "--config", str(config))
        assert result.returncode == 0, (args, result.stderr)
        lines = result.stderr.strip().splitlines()
        expected = warnings[args[0]]
        assert len(lines) == len(expected), (args, result.stderr)
        for line, start in zip(lines, expected, strict=True):
            assert start in line and "not a time" in line, (args, line)
        assert "2023-11-14T22:13:20Z" in result.stdout, (args, result.stdout)
    status = json.loads(run_cli("status", "--json", "--config", str(config)).stdout)
    (route,) = [r for r in status["routes"] if r["agent"] == "a"]
    assert route["last_committed"] is None and route["message_id"] == "7"
    assert route["card_refused"] == {"reason": "too long", "since": None, "chat_told": False}
    assert status["pauses"] == []
    assert (
        "CARD REFUSED (agent a) since an unknown time: too long"
        in run_cli("status", "--config", str(config)).stdout
    )
    chats = json.loads(run_cli("chats", "--json", "--config", str(config)).stdout)
    assert [(c["chat_id"], c["last_seen"]) for c in chats] == [
        ("-100", "2023-11-14T22:13:20Z"),
        ("console", None),
    ]


@pytest.mark.parametrize("value", ["1e308", "text"])
def test_an_unreadable_time_is_shown_as_unreadable_not_as_never(tmp_path: Path, value: str) -> None:
    """`status` showed a card's last edit time it could not read as "(never)", and `chats`
    a chat's last command time as 1970: both now say the time is unreadable (null in
    `--json`), a card never edited still says "(never)", and the rest is shown as before."""
    config = _console_fleet(tmp_path)
    SqliteStore.in_dir(tmp_path / "state").close()
    sql, _ = NO_TIMES[value]
    with sqlite3.connect(tmp_path / "state" / STATE_FILE) as db:
        for statement in (
            "INSERT INTO residents (route, message_id, committed_at)"
            f" VALUES ('console:console::a', '7', {sql})",
            "INSERT INTO residents (route, message_id) VALUES ('console:console::b', '8')",
            f"INSERT INTO seen_chats VALUES ('console', 'console', '', 'Desk', {sql})",
        ):
            db.execute(statement)
    status = run_cli("status", "--config", str(config))
    assert status.returncode == 0, status.stderr
    blocks = status.stdout.split("console:console::")
    (a,) = [block for block in blocks if block.startswith("a\n")]
    (b,) = [block for block in blocks if block.startswith("b\n")]
    assert "  last committed edit: (unreadable; see the warning above)\n" in a, status.stdout
    assert "  resident message: 7\n" in a and "pending notices: 0" in a, status.stdout
    assert "  last committed edit: (never)\n" in b, status.stdout
    report = json.loads(run_cli("status", "--json", "--config", str(config)).stdout)
    unreadable = {route["agent"]: route["unreadable"] for route in report["routes"]}
    assert unreadable == {"a": ["last_committed"], "b": []}
    chats = run_cli("chats", "--config", str(config))
    assert chats.returncode == 0, chats.stderr
    (row,) = chats.stdout.splitlines()[1:]
    assert re.split(r"\s{2,}", row)[3:] == ["Desk", "(unreadable; see the warning above)", "yes"], (
        row
    )


def test_chats_cuts_a_cell_too_wide_for_a_table_and_json_keeps_it(tmp_path: Path) -> None:
    """A seen chat's title of 100,000 characters (a state edited by hand: the platforms cap
    titles far below) padded every row of `taskcard chats` to its width, and a channel name
    holding an escape reached the terminal raw; `--json` keeps the whole text."""
    config = _console_fleet(tmp_path)
    SqliteStore.in_dir(tmp_path / "state").close()
    title = "T" * 100_000
    with sqlite3.connect(tmp_path / "state" / STATE_FILE) as db:
        db.execute(
            "INSERT INTO seen_chats VALUES (?, '-100', '', ?, 1700000000)",
            ("tele\x1b[2Jgram", title),
        )
        db.execute("INSERT INTO seen_chats VALUES ('telegram', '-200', '', 'Ops', 1700000000)")
    result = run_cli("chats", "--config", str(config))
    assert result.returncode == 0, result.stderr
    assert "\x1b" not in result.stdout and "tele\\x1b[2Jgram" in result.stdout
    lines = result.stdout.splitlines()
    assert len(lines) == 3 and max(len(line) for line in lines) < 250, [len(x) for x in lines]
    assert "T" * 97 + "..." in result.stdout
    chats = json.loads(run_cli("chats", "--json", "--config", str(config)).stdout)
    assert title in [chat["title"] for chat in chats]
