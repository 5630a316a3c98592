"""`taskcard serve` against agents whose files are hostile or broken, beside a healthy agent.

Every agent's files are untrusted: a named pipe, a symlink out of the workdir or one poisoned
activity line must cost only that agent (shown in `taskcard status`), never the service, the
other agents, SIGTERM or a secret. Once the files are fixed, the agent's card updates again.
"""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from taskcard.bridge.follow.tail import MAX_READ_BYTES
from taskcard.producers.task_card.contract import CardPaths, atomic_write
from tests.e2e.harness import (
    ServeProcess,
    activity,
    eventually,
    lineage_reaches_card,
    notify,
    publish,
    run_cli,
)
from tests.e2e.test_talk_and_signals import chat_for, wait_said
from tests.fakes.telegram_api import FakeLimits, FakeTelegram

GROUP = -1009876543210
PRIVATE = 5151


@pytest.fixture
async def fake() -> AsyncIterator[FakeTelegram]:
    async with FakeTelegram(limits=FakeLimits.unlimited()) as server:
        yield server


def setup(tmp_path: Path, fake: FakeTelegram, bad: list[str]) -> ServeProcess:
    """`good` is routed to a private chat, every agent in `bad` to the group."""
    lines = ['state_dir = ".taskcard"']
    for agent in ["good", *bad]:
        (tmp_path / "agents" / agent).mkdir(parents=True, exist_ok=True)
        lines += ["[[agents]]", f'id = "{agent}"', f'workdir = "agents/{agent}"']
    lines += [
        "[telegram]",
        'token_env = "TC_TEST_TOKEN"',
        f'api_base_url = "{fake.base_url}"',
        "poll_timeout_s = 1",
        "[telegram.limits.private_chat]",
        "max_calls = 1000",
        "period_s = 1.0",
        "[telegram.limits.group_chat]",
        "max_calls = 1000",
        "period_s = 1.0",
        "[telegram.limits.bot]",
        "max_calls = 1000",
        "period_s = 1.0",
        "[[telegram.routes]]",
        f"chat_id = {PRIVATE}",
        'agents = ["good"]',
        "[[telegram.routes]]",
        f"chat_id = {GROUP}",
        f"agents = {json.dumps(bad)}",
    ]
    config = tmp_path / "taskcard.toml"
    config.write_text("\n".join(lines) + "\n")
    return ServeProcess(config, env={"TC_TEST_TOKEN": fake.token})


def workdir(tmp_path: Path, agent: str) -> Path:
    return tmp_path / "agents" / agent


def texts(fake: FakeTelegram, chat: int) -> list[str]:
    return [m.text for m in fake.bot_messages(chat)]


def shows(fake: FakeTelegram, chat: int, needle: str) -> bool:
    return any(needle in text for text in texts(fake, chat))


def every_text(fake: FakeTelegram) -> str:
    """Everything the bot ever showed, earlier versions of edited messages included."""
    shown: list[str] = []
    for chat in (GROUP, PRIVATE):
        for message in fake.bot_messages(chat):
            shown += fake.edit_history(chat, message.message_id)
            shown.append(message.text)
    return "\n".join(shown)


def status_text(config: Path) -> str:
    result = run_cli("status", "--config", str(config))
    assert result.returncode == 0, result.stderr
    return result.stdout


def status_json(config: Path) -> dict[str, list[str]]:
    result = run_cli("status", "--config", str(config), "--json")
    assert result.returncode == 0, result.stderr
    return {a["agent"]: a["problems"] for a in json.loads(result.stdout)["agents"]}


def fifo(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists() or path.is_symlink():
        path.unlink()
    os.mkfifo(path)


async def test_named_pipes_cost_only_their_agent_and_sigterm_still_stops(
    tmp_path: Path, fake: FakeTelegram
) -> None:
    serve = setup(tmp_path, fake, ["piped", "later"])
    piped, later, good = (workdir(tmp_path, a) for a in ("piped", "later", "good"))
    paths = CardPaths(piped)
    # At start: pipes at the body, the activity log and the notifications (and its rotation).
    atomic_write(paths.status, b"active")
    for path in (
        paths.body,
        paths.events,
        paths.notifications,
        paths.notifications.with_name("system.jsonl.1"),
    ):
        fifo(path)
    publish(later, "later v1")
    with serve:
        publish(good, "good v1")
        await eventually(lambda: shows(fake, PRIVATE, "good v1"), what="the healthy card")
        await eventually(lambda: shows(fake, GROUP, "later v1"), what="later's card")
        problems = await eventually(
            lambda: (p := status_json(serve.config)["piped"]) and len(p) >= 3 and p,
            what="the pipes in taskcard status",
        )
        for name in ("taskcard/taskcard.md", "logs/events.jsonl", ".notification/system.jsonl"):
            assert any(p.startswith(name) and "named pipe" in p for p in problems), problems
        # Later: pipes replace the status file of a served agent, and a folder its body.
        fifo(CardPaths(later).status)
        publish(good, "good v2")
        await eventually(lambda: shows(fake, PRIVATE, "good v2"), what="good served on")
        await eventually(
            lambda: "taskcard/status" in "".join(status_json(serve.config)["later"]),
            what="the later pipe in taskcard status",
        )
        assert "named pipe" in status_text(serve.config)
        # Fixed: regular files again, and the card of the piped agent appears.
        for path in (paths.body, paths.events, paths.notifications):
            path.unlink()
        CardPaths(later).status.unlink()
        publish(piped, "piped fixed")
        publish(later, "later v2")
        await eventually(lambda: shows(fake, GROUP, "piped fixed"), what="fix")
        await eventually(lambda: shows(fake, GROUP, "later v2"), what="later")
        await eventually(
            lambda: not status_json(serve.config)["piped"], what="the problems cleared"
        )
        assert await serve.aterminate() == 0


async def test_the_card_names_a_refused_file_and_the_fix_until_it_is_fixed(
    tmp_path: Path, fake: FakeTelegram
) -> None:
    serve = setup(tmp_path, fake, ["piped"])
    piped, good = workdir(tmp_path, "piped"), workdir(tmp_path, "good")
    # A body longer than a message holds: the card is cut, and still says what is wrong.
    publish(piped, "piped v1\n\n" + "a line of the card's long body\n" * 400)
    activity(piped, "agent.start")
    row = "⚠ logs/events.jsonl: is a named pipe, not a regular file; replace it with a regular file"
    with serve:
        publish(good, "good v1")
        await eventually(lambda: shows(fake, GROUP, "piped v1"), what="the card")
        assert not shows(fake, GROUP, "⚠ logs/")
        fifo(CardPaths(piped).events)  # while served, with no other change
        await eventually(lambda: shows(fake, GROUP, row), what="the refusal on the card")
        card = next(t for t in texts(fake, GROUP) if row in t)
        assert "piped v1" in card  # the last good card stays
        assert str(tmp_path) not in every_text(fake)
        assert not shows(fake, PRIVATE, "⚠")  # the other agent's card is untouched
        CardPaths(piped).events.unlink()
        activity(piped, "turn.start")
        await eventually(
            lambda: any("piped v1" in t and row not in t for t in texts(fake, GROUP)),
            what="the row gone once the file is fixed",
        )
        assert await serve.aterminate() == 0


async def test_a_card_body_too_large_to_read_is_named_on_the_card_that_stays(
    tmp_path: Path, fake: FakeTelegram
) -> None:
    """A body over the 512 KB the service reads (only a writer other than the producer, which
    caps its bodies, can leave one): the last good card stays, with a row saying why it no
    longer moves and what to do, until a body of a size it reads comes."""
    serve = setup(tmp_path, fake, ["piped"])
    piped = workdir(tmp_path, "piped")
    publish(piped, "piped v1")
    row = "⚠ taskcard/taskcard.md: is larger than the 512 KB the service reads of it"
    with serve:
        await eventually(lambda: shows(fake, GROUP, "piped v1"), what="the card")
        atomic_write(CardPaths(piped).body, b"huge body\n" * 60_000)  # 600,000 bytes
        await eventually(lambda: shows(fake, GROUP, row), what="the refusal on the card")
        assert "piped v1" in next(t for t in texts(fake, GROUP) if row in t)
        publish(piped, "piped v2")
        await eventually(
            lambda: any("piped v2" in t and row not in t for t in texts(fake, GROUP)),
            what="the row gone with a body of a size it reads",
        )
        assert await serve.aterminate() == 0


async def test_a_status_file_not_exactly_active_or_inactive_is_named_with_the_fix(
    tmp_path: Path, fake: FakeTelegram
) -> None:
    """`echo active > taskcard/status` writes a line break after the word: the card never
    showed, and neither `taskcard status` nor the log said why. The status file is named
    with what to write; the card shows once it holds exactly the word, and a card shown
    keeps its state, with the row, while its status holds something else."""
    serve = setup(tmp_path, fake, ["echoed", "shouted"])
    echoed, shouted = workdir(tmp_path, "echoed"), workdir(tmp_path, "shouted")
    publish(shouted, "shouted v1")
    with serve:
        publish(echoed, "echoed v1")
        atomic_write(CardPaths(echoed).status, b"active\n")
        await eventually(lambda: shows(fake, GROUP, "shouted v1"), what="the other card")
        problems = await eventually(
            lambda: status_json(serve.config)["echoed"], what="the status named"
        )
        assert problems == [
            'taskcard/status: holds "active" with a line break or spaces around it; write'
            " exactly active, with nothing after it (printf active, not echo)"
        ]
        assert not shows(fake, GROUP, "echoed v1")
        assert "agent echoed: taskcard/status holds" in serve.logs
        atomic_write(CardPaths(shouted).status, b"INACTIVE")  # a card shown: it stays
        row = "⚠ taskcard/status: holds neither active nor inactive"
        await eventually(lambda: shows(fake, GROUP, row), what="the row on the card")
        assert "shouted v1" in next(t for t in texts(fake, GROUP) if row in t)
        atomic_write(CardPaths(echoed).status, b"active")
        await eventually(lambda: shows(fake, GROUP, "echoed v1"), what="the card once fixed")
        atomic_write(CardPaths(shouted).status, b"inactive")
        await eventually(
            lambda: not any(status_json(serve.config).values()), what="the problems cleared"
        )
        assert await serve.aterminate() == 0


async def test_symlinks_out_of_the_workdir_are_refused_never_posted(
    tmp_path: Path, fake: FakeTelegram
) -> None:
    serve = setup(tmp_path, fake, ["leaky", "linked"])
    leaky, linked, good = (workdir(tmp_path, a) for a in ("leaky", "linked", "good"))
    secret = tmp_path / "secret.env"
    secret.write_text("API_KEY=LEAKED-SECRET-VALUE\n")
    # leaky: the body is a symlink to a file outside, its logs folder a symlink out.
    (leaky / "taskcard").mkdir()
    (leaky / "taskcard" / "taskcard.md").symlink_to(secret)
    atomic_write(CardPaths(leaky).status, b"active")
    outside_logs = tmp_path / "outside-logs"
    outside_logs.mkdir()
    (outside_logs / "events.jsonl").write_text(
        json.dumps({"ts": "2030-01-01T00:00:00Z", "kind": "text", "text": "LEAKED-LOG-ROW"}) + "\n"
    )
    (leaky / "logs").symlink_to(outside_logs)
    # linked: the whole taskcard folder is a symlink to a folder outside.
    outside_card = tmp_path / "outside-card"
    publish(outside_card, "LEAKED-OUTSIDE-CARD")
    (linked / "taskcard").symlink_to(outside_card / "taskcard")
    # good: symlinks that stay inside its own workdir are followed.
    (good / "drafts").mkdir()
    (good / "drafts" / "card.md").write_text("good via an inside symlink")
    (good / "taskcard").mkdir()
    (good / "taskcard" / "taskcard.md").symlink_to(good / "drafts" / "card.md")
    with serve:
        atomic_write(CardPaths(good).status, b"active")
        await eventually(
            lambda: shows(fake, PRIVATE, "good via an inside symlink"), what="the inside link"
        )
        problems = await eventually(
            lambda: (s := status_json(serve.config))["leaky"] and s["linked"] and s,
            what="the refusals in taskcard status",
        )
        assert any(
            p.startswith("taskcard/taskcard.md") and "outside" in p for p in problems["leaky"]
        )
        assert any(p.startswith("logs/events.jsonl") and "outside" in p for p in problems["leaky"])
        assert any(p.startswith("taskcard/status") and "outside" in p for p in problems["linked"])
        assert "outside the agent's workdir" in serve.logs or "outside" in serve.logs
        # Fixed: the body is a regular file; the card appears without the outside log rows.
        (leaky / "taskcard" / "taskcard.md").unlink()
        publish(leaky, "leaky fixed")
        await eventually(lambda: shows(fake, GROUP, "leaky fixed"), what="fix")
        assert await serve.aterminate() == 0
    shown = every_text(fake)
    for leaked in ("LEAKED-SECRET-VALUE", "API_KEY", "LEAKED-LOG-ROW", "LEAKED-OUTSIDE-CARD"):
        assert leaked not in shown
    assert "LEAKED-SECRET-VALUE" not in serve.logs


async def test_a_shown_card_folder_swapped_for_a_symlink_out_is_refused(
    tmp_path: Path, fake: FakeTelegram
) -> None:
    """The reads of a card already shown take shortcuts (the workdir resolved once, plain
    paths not resolved again): a `taskcard/` folder swapped for a symlink out, or its missing
    `logs/` folder made one, while the service runs is refused all the same."""
    serve = setup(tmp_path, fake, ["swapped"])
    swapped, good = workdir(tmp_path, "swapped"), workdir(tmp_path, "good")
    outside = tmp_path / "outside"
    publish(outside, "LEAKED-SWAPPED-CARD")
    (outside / "logs").mkdir()
    (outside / "logs" / "events.jsonl").write_text(
        json.dumps({"ts": "2030-01-01T00:00:00Z", "kind": "text", "text": "LEAKED-SWAP-ROW"}) + "\n"
    )
    with serve:
        publish(swapped, "swapped before")
        await eventually(lambda: shows(fake, GROUP, "swapped before"), what="the first card")
        (swapped / "taskcard").rename(tmp_path / "old-card")
        (swapped / "taskcard").symlink_to(outside / "taskcard")
        (swapped / "logs").symlink_to(outside / "logs")
        problems = await eventually(
            lambda: (s := status_json(serve.config))["swapped"] and s,
            what="the refusal in taskcard status",
        )
        assert any(p.startswith("taskcard/status") and "outside" in p for p in problems["swapped"])
        publish(good, "good after the swap")  # the service carried on, and read it since
        await eventually(lambda: shows(fake, PRIVATE, "good after the swap"), what="good")
        (swapped / "taskcard").unlink()
        (swapped / "logs").unlink()
        publish(swapped, "swapped fixed")
        await eventually(lambda: shows(fake, GROUP, "swapped fixed"), what="fix")
        assert await serve.aterminate() == 0
    shown = every_text(fake)
    assert "LEAKED-SWAPPED-CARD" not in shown
    assert "LEAKED-SWAP-ROW" not in shown


POISON_LINES = [
    # A token count beyond float range, as a float literal and as an integer.
    '{"ts": "2030-01-01T00:00:00Z", "kind": "usage", "input_tokens": 1e309, "output_tokens": 1}',
    '{"ts": "2030-01-01T00:00:01Z", "kind": "usage", "input_tokens": 1'
    + "0" * 400
    + ', "output_tokens": 2}',
    # Year 1 with an offset overflows in the conversion to UTC; year 9999 the other way.
    '{"ts": "0001-01-01T00:00:00+05:00", "kind": "turn.start"}',
    '{"ts": "9999-12-31T23:59:59-05:00", "kind": "turn.start"}',
    # Non-finite and absurd values, wrong types.
    '{"ts": "2030-01-01T00:00:02Z", "kind": "tool.end", "call_id": "c", "duration_s": Infinity}',
    '{"ts": "2030-01-01T00:00:03Z", "kind": "tool.end", "call_id": "c", "duration_s": 1e300}',
    '{"ts": "2030-01-01T00:00:04Z", "kind": "agent.exit", "code": NaN}',
    '{"ts": "2030-01-01T00:00:05Z", "kind": "tool.start", "name": {"x": [1]}, "call_id": 7}',
    '{"ts": 1e309, "kind": "turn.end"}',
    # A kind that is not text (a list, an object): no known kind, not a failure of the read.
    '{"ts": "2030-01-01T00:00:06Z", "kind": ["turn.start"]}',
    '{"ts": "2030-01-01T00:00:07Z", "kind": {"turn.end": 1}}',
    # Nesting deeper than the JSON parser's recursion allows.
    "[" * 100_000 + "]" * 100_000,
]


async def test_poisoned_activity_lines_cost_only_those_lines(
    tmp_path: Path, fake: FakeTelegram
) -> None:
    serve = setup(tmp_path, fake, ["poisoned"])
    poisoned, good = workdir(tmp_path, "poisoned"), workdir(tmp_path, "good")
    publish(poisoned, "poisoned v1")
    events = CardPaths(poisoned).events
    events.parent.mkdir(parents=True)
    events.write_text("\n".join(POISON_LINES) + "\n")
    with serve:
        publish(good, "good v1")
        await eventually(lambda: shows(fake, PRIVATE, "good v1"), what="the healthy card")
        await eventually(lambda: shows(fake, GROUP, "poisoned v1"), what="card")
        # Later, the same poison again while the service runs, then a good line after it.
        with events.open("a") as log:
            log.write("\n".join(POISON_LINES) + "\n")
        activity(poisoned, "usage", input_tokens=1200, output_tokens=300)
        publish(poisoned, "poisoned v2")
        await eventually(
            lambda: any("poisoned v2" in t and "1.2k" in t for t in texts(fake, GROUP)),
            what="the poisoned agent's card updated with the good line",
        )
        publish(good, "good v2")
        await eventually(lambda: shows(fake, PRIVATE, "good v2"), what="good served on")
        assert serve.proc is not None and serve.proc.poll() is None
        assert await serve.aterminate() == 0
    assert "Traceback" not in serve.logs


async def test_a_usage_line_with_no_count_claims_no_tokens(
    tmp_path: Path, fake: FakeTelegram
) -> None:
    serve = setup(tmp_path, fake, ["counts"])
    counts, good = workdir(tmp_path, "counts"), workdir(tmp_path, "good")
    publish(counts, "counts v1")
    # Neither count is one (negative, text, a list, absent): no usage is known.
    activity(counts, "usage", input_tokens=-5, output_tokens="7")
    activity(counts, "usage", input_tokens=[1])
    with serve:
        publish(good, "good v1")
        await eventually(lambda: shows(fake, PRIVATE, "good v1"), what="the healthy card")
        card = await eventually(
            lambda: next((t for t in texts(fake, GROUP) if "counts v1" in t), None),
            what="the card of the agent with the bad usage lines",
        )
        assert "tokens" not in card, card
        assert "activity log: 2 unreadable lines skipped" in card, card
        # A usage line with counts afterwards is shown as usual.
        activity(counts, "usage", input_tokens=1200, output_tokens=300)
        await eventually(lambda: shows(fake, GROUP, "1.2k"), what="the good usage line")
        assert await serve.aterminate() == 0


async def test_an_events_line_longer_than_a_read_is_counted_as_skipped(
    tmp_path: Path, fake: FakeTelegram
) -> None:
    """A single activity line longer than the service reads at once (8 MB) was passed over
    without a word: the card's "unreadable lines skipped" row, which counts a line nested
    too deep, did not count it (probeE F3). It counts as one; the lines after it are read."""
    serve = setup(tmp_path, fake, ["huge"])
    huge, good = workdir(tmp_path, "huge"), workdir(tmp_path, "good")
    publish(huge, "huge v1")
    with serve:
        publish(good, "good v1")
        await eventually(lambda: shows(fake, PRIVATE, "good v1"), what="the healthy card")
        await eventually(lambda: shows(fake, GROUP, "huge v1"), what="the card")
        events = huge / "logs" / "events.jsonl"
        events.parent.mkdir(exist_ok=True)
        with events.open("a") as log:
            log.write('{"ts": "2026-12-06T00:00:00Z", "kind": "text", "text": "')
            log.write("x" * (MAX_READ_BYTES + 1024) + '"}\n')
        activity(huge, "usage", input_tokens=1200, output_tokens=300)
        publish(huge, "huge v2")
        card = await eventually(
            lambda: next((t for t in texts(fake, GROUP) if "huge v2" in t and "1.2k" in t), None),
            what="the card after the huge line",
        )
        assert "activity log: 1 unreadable lines skipped" in card, card
        assert await serve.aterminate() == 0
    assert "Traceback" not in serve.logs


def _ledger_document(task_id: str, **derived: object) -> str:
    fields = {"workflow": "RUNNING", "next_gate": "task completion", **derived}
    return json.dumps({"tasks": {"t": {"task": {"task_id": task_id}, "derived": fields}}})


async def test_ledger_refusals_show_in_status_and_the_log_like_other_files(
    tmp_path: Path, fake: FakeTelegram
) -> None:
    serve = setup(tmp_path, fake, ["piped", "linked"])
    piped, linked, good = (workdir(tmp_path, a) for a in ("piped", "linked", "good"))
    ledger_name = "ledger/long-task-ledger.json"
    fifo(piped / ledger_name)
    outside = tmp_path / "outside" / ledger_name
    outside.parent.mkdir(parents=True)
    outside.write_text(_ledger_document("OUTSIDE1"))
    (linked / "ledger").mkdir()
    (linked / ledger_name).symlink_to(outside)
    # good: a ledger symlinked to a file inside its own workdir is followed.
    (good / "kept").mkdir()
    (good / "kept" / "ledger.json").write_text(_ledger_document("INSIDE7"))
    (good / "ledger").mkdir()
    (good / ledger_name).symlink_to(good / "kept" / "ledger.json")
    publish(piped, "piped v1")
    publish(linked, "linked v1")
    with serve:
        publish(good, "good v1")
        await eventually(lambda: shows(fake, PRIVATE, "ledger INSIDE7: RUNNING"), what="inside")
        problems = await eventually(
            lambda: (s := status_json(serve.config))["piped"] and s["linked"] and s,
            what="the ledger refusals in taskcard status",
        )
        assert any(p.startswith(ledger_name) and "named pipe" in p for p in problems["piped"])
        assert any(p.startswith(ledger_name) and "outside" in p for p in problems["linked"])
        assert problems["good"] == []
        await eventually(
            lambda: (
                f"agent piped: {ledger_name}" in serve.logs
                and f"agent linked: {ledger_name}" in serve.logs
            ),
            what="the refusals in the log",
        )
        # Their cards still go out (the group's limit paces them; a loaded machine slows it).
        await eventually(
            lambda: shows(fake, GROUP, "piped v1") and shows(fake, GROUP, "linked v1"),
            what="the cards of the agents whose ledger was refused",
        )
        assert await serve.aterminate() == 0
    assert "OUTSIDE1" not in every_text(fake)


async def test_absurd_numbers_in_ledger_and_notices_become_unknown(
    tmp_path: Path, fake: FakeTelegram
) -> None:
    serve = setup(tmp_path, fake, ["ledg", "notif"])
    ledg, notif, good = (workdir(tmp_path, a) for a in ("ledg", "notif", "good"))
    huge = 10**4200  # as many digits as json still writes
    (ledg / "ledger").mkdir()
    (ledg / "ledger/long-task-ledger.json").write_text(
        _ledger_document("T1", steps_done=huge, step_count=huge)
    )
    publish(ledg, "ledg v1")
    publish(notif, "notif v1")
    with serve:
        publish(good, "good v1")
        await eventually(lambda: shows(fake, GROUP, "notif v1"), what="notif card")
        await eventually(
            lambda: shows(fake, GROUP, "ledger T1: RUNNING · next: task completion"),
            what="the ledger row without the absurd step counts",
        )
        for ident, budget in (("n1", huge), ("n2", -5), ("n3", 0), ("n4", 40)):
            notify(notif, ident, "limit", max_refreshes=budget)
        await eventually(lambda: shows(fake, GROUP, "after 40 refreshes"), what="the sane one")
        stopped = [t for t in texts(fake, GROUP) if "task card stopped" in t]
        assert len(stopped) == 4, stopped
        assert sum(t.endswith("refresh budget used up.") for t in stopped) == 3, stopped
        assert all(len(t) < 200 for t in stopped)
        await eventually(lambda: shows(fake, PRIVATE, "good v1"), what="the good agent's card")
        assert await serve.aterminate() == 0
    assert "-5 refreshes" not in every_text(fake)
    assert "Traceback" not in serve.logs


async def test_a_ledger_state_that_is_not_text_reads_as_unknown(
    tmp_path: Path, fake: FakeTelegram
) -> None:
    serve = setup(tmp_path, fake, ["ledg"])
    ledg, good = workdir(tmp_path, "ledg"), workdir(tmp_path, "good")
    ledger = ledg / "ledger/long-task-ledger.json"
    ledger.parent.mkdir()
    # A workflow given as a list: no state of the closed vocabulary, so unknown.
    ledger.write_text(_ledger_document("T1", workflow=["RUNNING"]))
    publish(ledg, "ledg v1")
    with serve:
        publish(good, "good v1")
        await eventually(lambda: shows(fake, PRIVATE, "good v1"), what="the healthy card")
        await eventually(
            lambda: any("ledg v1" in t and "ledger T1: unknown" in t for t in texts(fake, GROUP)),
            what="the card with the ledger row saying unknown",
        )
        # Later an object where the state goes, then a good ledger: the row follows.
        atomic_write(ledger, _ledger_document("T2", workflow={"RUNNING": 1}).encode())
        await eventually(lambda: shows(fake, GROUP, "ledger T2: unknown"), what="T2 unknown")
        atomic_write(ledger, _ledger_document("T3").encode())
        await eventually(lambda: shows(fake, GROUP, "ledger T3: RUNNING"), what="T3 running")
        assert await serve.aterminate() == 0
    assert "Traceback" not in serve.logs


async def test_a_ledger_that_is_no_ledger_is_named_with_the_fix(
    tmp_path: Path, fake: FakeTelegram
) -> None:
    """A ledger file that is not JSON, nests too deep or holds no tasks object read as
    "ledger: unknown" with nothing naming the file or why (probeE F3). It is named on the
    card and in `taskcard status` with the fix, the last good row kept, and cleared by a
    good ledger."""
    serve = setup(tmp_path, fake, ["ledg"])
    ledg, good = workdir(tmp_path, "ledg"), workdir(tmp_path, "good")
    ledger = ledg / "ledger/long-task-ledger.json"
    ledger.parent.mkdir()
    ledger.write_text('{"tasks": {"t": ')  # cut short: not JSON
    publish(ledg, "ledg v1")
    name = "ledger/long-task-ledger.json"
    fix = "write it with `taskcard ledger` or the ledger MCP tool, not by hand"
    with serve:
        publish(good, "good v1")
        await eventually(lambda: shows(fake, PRIVATE, "good v1"), what="the healthy card")
        await eventually(
            lambda: shows(fake, GROUP, f"⚠ {name}: is not JSON; {fix}"), what="not JSON named"
        )
        atomic_write(ledger, _ledger_document("T1").encode())
        await eventually(lambda: shows(fake, GROUP, "ledger T1: RUNNING"), what="T1 running")
        for bad, words in (
            (b"[" * 100_000 + b"]" * 100_000, "nests deeper than JSON is read"),
            (b'{"tasks": ["T9"]}', 'has no "tasks" object'),
        ):
            atomic_write(ledger, bad)
            said = f"{name}: {words}; {fix}"
            card = await eventually(
                lambda said=said: next((t for t in texts(fake, GROUP) if said in t), None),
                what=words,
            )
            assert "ledger T1: RUNNING" in card, card  # the last good row stays
            problems = await eventually(
                lambda said=said: said in status_json(serve.config)["ledg"] and True,
                what=f"{words} in taskcard status",
            )
            assert problems
        atomic_write(ledger, _ledger_document("T2").encode())
        await eventually(lambda: shows(fake, GROUP, "ledger T2: RUNNING"), what="T2 running")
        await eventually(lambda: status_json(serve.config)["ledg"] == [], what="cleared")
        assert await serve.aterminate() == 0
    assert "Traceback" not in serve.logs


async def test_a_dangling_symlink_out_of_the_workdir_is_listed_from_the_first_sight(
    tmp_path: Path, fake: FakeTelegram
) -> None:
    """An activity log that is a symlink to a missing file outside is a problem from the
    start (not a plainly missing log), and what later appears at its target is never read."""
    serve = setup(tmp_path, fake, ["dangling"])
    dangling = workdir(tmp_path, "dangling")
    publish(dangling, "dangling card")
    (dangling / "logs").mkdir()
    target = tmp_path / "not-yet" / "events.jsonl"
    (dangling / "logs" / "events.jsonl").symlink_to(target)
    with serve:
        await eventually(lambda: shows(fake, GROUP, "dangling card"), what="the card")
        problems = await eventually(
            lambda: status_json(serve.config)["dangling"], what="the dangling link in status"
        )
        assert any(p.startswith("logs/events.jsonl") for p in problems), problems
        target.parent.mkdir()
        target.write_text(
            json.dumps({"ts": "2030-01-01T00:00:00Z", "kind": "text", "text": "LEAKED-LATER"})
            + "\n"
        )
        publish(dangling, "dangling card again")
        await eventually(lambda: shows(fake, GROUP, "dangling card again"), what="the new card")
        assert await serve.aterminate() == 0
    assert "LEAKED-LATER" not in every_text(fake)


@pytest.mark.parametrize("breakage", ["named pipe", "folder", "symlink out"])
async def test_a_broken_card_body_keeps_its_last_good_text_while_ledger_and_lineage_move(
    tmp_path: Path, fake: FakeTelegram, breakage: str
) -> None:
    """A body that cannot be read is refused (listed in `taskcard status`) and the card keeps
    the last good body; a change of the ledger or of `lineage.json` still reaches the card's
    automatic slot at once, not at the agent's next change."""
    serve = setup(tmp_path, fake, ["broken"])
    broken = workdir(tmp_path, "broken")
    body = CardPaths(broken).body
    with serve.config.open("a") as config:
        config.write("[watch]\nrescan_interval_s = 3600.0\n")  # only events move the card
    with serve:
        publish(broken, "**training** card")
        await eventually(lambda: shows(fake, GROUP, "training"), what="the first card")
        body.unlink()
        if breakage == "named pipe":
            fifo(body)
        elif breakage == "folder":
            body.mkdir()
        else:
            outside = tmp_path / "outside.md"
            outside.write_text("outside text")
            body.symlink_to(outside)
        await eventually(
            lambda: "taskcard/taskcard.md" in "".join(status_json(serve.config)["broken"]),
            what="the refused body in taskcard status",
        )
        ledger = run_cli(
            "ledger",
            "init",
            "train-7",
            "--purpose",
            "Train",
            "--steps",
            "a,b",
            "--workdir",
            str(broken),
        )
        assert ledger.returncode == 0, ledger.stderr
        await eventually(
            lambda: any(
                "training" in t and "ledger train-7: NOT_STARTED" in t for t in texts(fake, GROUP)
            ),
            what="the ledger row beside the last good body",
        )
        await lineage_reaches_card(
            broken, "lead", "split the training", "training", lambda: texts(fake, GROUP)
        )
        assert "outside text" not in every_text(fake)
        assert await serve.aterminate() == 0


@pytest.mark.parametrize("breakage", ["invisible", "huge sparse"])
async def test_a_blank_or_huge_card_body_keeps_the_last_good_text_and_others_move(
    tmp_path: Path, fake: FakeTelegram, breakage: str
) -> None:
    """A body of invisible characters only (NULs, zero-width spaces, white space: blank by
    the renderer contract) replaced the last good body with an empty one, and so did a 100 MB
    sparse body (its first 512 KB of NULs were read and shown as nothing). The card keeps
    the last good body: a blank one is not a body, a huge one is refused and listed in
    `taskcard status` (logged once). The healthy agent beside it is served throughout."""
    serve = setup(tmp_path, fake, ["broken"])
    broken, good = workdir(tmp_path, "broken"), workdir(tmp_path, "good")
    body = CardPaths(broken).body
    with serve:
        publish(broken, "**compiling** card")
        publish(good, "good v1")
        await eventually(lambda: shows(fake, GROUP, "compiling"), what="the first card")
        await eventually(lambda: shows(fake, PRIVATE, "good v1"), what="the healthy card")
        if breakage == "invisible":
            atomic_write(body, "\u200b\x00 \u2060\t\n\u3164\x00\n".encode())
        else:
            with body.open("r+b") as handle:
                handle.truncate(100 * 1024 * 1024)
            await eventually(
                lambda: any(
                    p.startswith("taskcard/taskcard.md") and "larger than" in p
                    for p in status_json(serve.config)["broken"]
                ),
                what="the huge body in taskcard status",
            )
        publish(good, "good v2")
        await eventually(lambda: shows(fake, PRIVATE, "good v2"), what="good served on")
        # The card moves on (a lineage row) and still shows the last good body.
        await lineage_reaches_card(
            broken, "lead", "split the work", "compiling", lambda: texts(fake, GROUP)
        )
        assert all("compiling" in text for text in texts(fake, GROUP)), texts(fake, GROUP)
        assert await serve.aterminate() == 0
    assert serve.logs.count("taskcard/taskcard.md") <= 1, serve.logs
    assert "Traceback" not in serve.logs


async def test_reports_numbered_again_after_reports_is_moved_aside_are_announced_once(
    tmp_path: Path, fake: FakeTelegram
) -> None:
    """The report writer says to move `reports/` aside to number from 1 again; the service
    followed by number and stayed silent about the new series. A copy of old reports put
    back (a new file, old dates) is still not announced twice."""
    serve = setup(tmp_path, fake, ["worker"])
    wd = workdir(tmp_path, "worker")

    def report(summary: str) -> None:
        done = run_cli("report", "--workdir", str(wd), "--ok", "--summary", summary)
        assert done.returncode == 0, done.stderr

    def said(summary: str) -> int:
        return sum(summary in text for text in texts(fake, GROUP))

    publish(wd, "worker v1")
    with serve:
        await eventually(lambda: shows(fake, GROUP, "worker v1"), what="the card")
        report("first round")
        report("second round")
        await eventually(lambda: said("second round"), what="the second report's notice")
        old_lines = (wd / "reports" / "reports.jsonl").read_bytes()
        (wd / "reports").rename(wd / "reports.old")
        report("new series")
        await eventually(lambda: said("new series"), what="the new series' first notice")
        assert shows(fake, GROUP, "worker reported (#1)")
        # Old reports copied back in a new file: nothing old is announced again.
        reports = wd / "reports" / "reports.jsonl"
        atomic_write(reports, old_lines + reports.read_bytes())
        report("after the copy")
        await eventually(lambda: said("after the copy"), what="the next report's notice")
        assert await serve.aterminate() == 0
    counts = {s: said(s) for s in ("first round", "second round", "new series", "after the copy")}
    assert counts == dict.fromkeys(counts, 1), counts


async def test_a_report_series_started_again_while_the_service_was_down_is_announced(
    tmp_path: Path, fake: FakeTelegram
) -> None:
    serve = setup(tmp_path, fake, ["worker"])
    wd = workdir(tmp_path, "worker")

    def report(summary: str) -> None:
        done = run_cli("report", "--workdir", str(wd), "--ok", "--summary", summary)
        assert done.returncode == 0, done.stderr

    publish(wd, "worker v1")
    with serve:
        await eventually(lambda: shows(fake, GROUP, "worker v1"), what="the card")
        report("first round")
        report("second round")
        await eventually(lambda: shows(fake, GROUP, "second round"), what="the second notice")
        assert await serve.aterminate() == 0
    (wd / "reports").rename(wd / "reports.old")
    report("while the service was down")
    with ServeProcess(serve.config, env=serve.env) as again:
        await eventually(
            lambda: shows(fake, GROUP, "while the service was down"), what="the new series"
        )
        report("after the restart")
        await eventually(lambda: shows(fake, GROUP, "after the restart"), what="the next one")
        assert await again.aterminate() == 0
    shown = texts(fake, GROUP)
    for summary in ("first round", "second round", "while the service was down"):
        assert sum(summary in text for text in shown) == 1, (summary, shown)


async def test_a_card_dense_with_markdown_cannot_hold_the_service(
    tmp_path: Path, fake: FakeTelegram
) -> None:
    """A body of thousands of Markdown marks costs milliseconds to compose for Telegram, once
    per chat that follows its agent: followed in many chats and rewritten again and again, it
    held the loop for every card. Now one agent's cards take at most a tenth of the time (one
    warning), the other agents' cards keep moving meanwhile, and the costly card still ends at
    its latest version in every chat."""
    serve = setup(tmp_path, fake, ["dense"])
    # One conversion costs about 8 ms on a quick machine: in 24 chats a projection of this
    # agent costs several times the pacing's floor (50 ms of CPU) on any machine.
    followers = [GROUP - n for n in range(1, 24)]
    with serve.config.open("a") as config:
        for chat in followers:
            config.write(f'[[telegram.routes]]\nchat_id = {chat}\nagents = ["dense"]\n')
    dense = "\n".join(["**w** `x` _y_ ~~z~~ " * 40] * 25)
    with serve:
        publish(workdir(tmp_path, "good"), "good v0")
        publish(workdir(tmp_path, "dense"), f"dense v0\n{dense}")
        await eventually(lambda: shows(fake, PRIVATE, "good v0"), what="the calm card")
        await eventually(lambda: shows(fake, GROUP, "dense v0"), what="the dense card")
        for version in range(1, 6):
            publish(workdir(tmp_path, "dense"), f"dense v{version}\n{dense}")
            publish(workdir(tmp_path, "good"), f"good v{version}")
            await eventually(
                lambda version=version: shows(fake, PRIVATE, f"good v{version}"),
                what="the calm card's change, while the dense one is paced",
            )
        for chat in (GROUP, *followers):
            await eventually(
                lambda chat=chat: shows(fake, chat, "dense v5"), what="the dense card's latest"
            )
        assert await serve.aterminate() == 0
    assert serve.logs.count("agent dense: composing its card took") == 1, serve.logs
    assert "good: composing" not in serve.logs


@pytest.mark.parametrize("platform", ["telegram", "feishu"])
async def test_a_refused_lineage_removed_leaves_the_card_and_status(
    platform: str, tmp_path: Path
) -> None:
    """lineage.json made a folder is named on its agent's card; removed, the row goes, as for
    every other file (it stayed for good: a missing lineage was never looked at again)."""
    async with chat_for(platform, tmp_path, ["builder", "tester"]) as chat:
        builder, tester = tmp_path / "agents" / "builder", tmp_path / "agents" / "tester"
        publish(builder, "**building**")
        publish(tester, "testing step 1")
        with chat.serve:
            await wait_said(chat, "building", "builder's card")
            (builder / "lineage.json").mkdir()
            card = await wait_said(chat, "⚠ lineage.json: is a folder", "the refusal's row")
            assert "building" in card, card
            publish(tester, "testing step 2")
            await wait_said(chat, "testing step 2", "tester's card moving on")
            (builder / "lineage.json").rmdir()
            await eventually(
                lambda: not any("⚠ lineage.json" in t for t in chat.bot_texts()),
                what="the row gone with the folder",
            )
            assert any("building" in t for t in chat.bot_texts())
            assert await chat.serve.aterminate() == 0
        status = run_cli("status", "--config", str(chat.config), "--json")
        assert status.returncode == 0, status.stderr
        agents = {a["agent"]: a for a in json.loads(status.stdout)["agents"]}
        assert agents["builder"]["problems"] == [], agents["builder"]


async def test_each_agent_of_a_numbered_fleet_has_its_refusal_logged(
    tmp_path: Path, fake: FakeTelegram
) -> None:
    """Agents named worker-1, worker-2, ... with the same problem: the log's limit on repeated
    warnings blanked the numbers out of every line, so worker-2's and worker-3's refusals
    were taken for worker-1's and never logged (their cards and `taskcard status` named them,
    the log only the first). Each agent's is logged, once."""
    agents = ["worker-1", "worker-2", "worker-3"]
    serve = setup(tmp_path, fake, agents)
    for agent in agents:
        publish(workdir(tmp_path, agent), f"{agent} v1")
    with serve:
        await eventually(
            lambda: all(shows(fake, GROUP, f"{agent} v1") for agent in agents),
            what="the workers' cards",
        )
        for agent in agents:
            fifo(CardPaths(workdir(tmp_path, agent)).body)
        lines = [f"agent {agent}: taskcard/taskcard.md is a named pipe" for agent in agents]
        await eventually(
            lambda: all(line in serve.logs for line in lines), what="each worker's refusal logged"
        )
        publish(workdir(tmp_path, "good"), "good v1")
        await eventually(lambda: shows(fake, PRIVATE, "good v1"), what="the healthy card")
        assert await serve.aterminate() == 0
    assert all(serve.logs.count(line) == 1 for line in lines), serve.logs


@pytest.mark.parametrize(
    ("bytes_written", "row"),
    [
        (
            b"broken v2 \xff\xfe garbage \xed\xa0\x80",
            "⚠ taskcard/taskcard.md: is not UTF-8 text (byte 0xff at offset 10); write the body"
            " as UTF-8 text",
        ),
        (
            "\u200b\x00 \u2060\t\n".encode(),
            "⚠ taskcard/taskcard.md: shows nothing (only white space or invisible characters)",
        ),
    ],
    ids=["not utf-8", "blank"],
)
async def test_a_body_that_is_not_utf8_text_or_shows_nothing_is_named_and_not_shown(
    tmp_path: Path, fake: FakeTelegram, bytes_written: bytes, row: str
) -> None:
    """Bytes that are not UTF-8 (random bytes, a lone surrogate's bytes) were shown on the
    card as a screenful of replacement marks, and a blank body kept the last one with no
    word: neither said anything in `taskcard status` or the log. The renderer contract
    refuses both; the card keeps its last good body with a row naming the file and the fix,
    until a good body comes."""
    serve = setup(tmp_path, fake, ["broken"])
    broken, good = workdir(tmp_path, "broken"), workdir(tmp_path, "good")
    publish(broken, "broken v1")
    with serve:
        await eventually(lambda: shows(fake, GROUP, "broken v1"), what="the first card")
        atomic_write(CardPaths(broken).body, bytes_written)
        await eventually(lambda: shows(fake, GROUP, row), what="the row naming the body")
        assert all("broken v1" in text for text in texts(fake, GROUP)), texts(fake, GROUP)
        assert "\ufffd" not in every_text(fake)
        problem = row.removeprefix("⚠ ")
        assert any(p.startswith(problem) for p in status_json(serve.config)["broken"])
        publish(good, "good v1")
        await eventually(lambda: shows(fake, PRIVATE, "good v1"), what="the healthy card")
        publish(broken, "broken v3")
        await eventually(
            lambda: any("broken v3" in t and "⚠" not in t for t in texts(fake, GROUP)),
            what="the good body shown and the row gone",
        )
        assert await serve.aterminate() == 0
    logged = f"agent broken: taskcard/taskcard.md {problem.split(': ', 1)[1][:20]}"
    assert serve.logs.count(logged) == 1, serve.logs


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (b"[" * 100_000 + b"]" * 100_000, "nests too deep to be read"),
        (b'{"parent": ["lead"], "reason": {"why": 1}}', "has no parent and reason that show text"),
        (b"\xff lineage", "is not UTF-8 text"),
    ],
    ids=["deep", "wrong types", "not utf-8"],
)
async def test_a_lineage_file_that_is_no_record_is_named_with_the_fix(
    tmp_path: Path, fake: FakeTelegram, content: bytes, problem: str
) -> None:
    """A `lineage.json` that is not a lineage record (nested too deep, its fields of the wrong
    type, not UTF-8) read as no lineage without a word: no row, nothing in `taskcard status`
    or the log. It is named with the fix, and the row goes once a record is written."""
    serve = setup(tmp_path, fake, ["child"])
    child = workdir(tmp_path, "child")
    publish(child, "child v1")
    row = f"⚠ lineage.json: {problem}; write it as `taskcard spawn` does, or remove it"
    with serve:
        await eventually(lambda: shows(fake, GROUP, "child v1"), what="the card")
        atomic_write(child / "lineage.json", content)
        await eventually(lambda: shows(fake, GROUP, row), what="the row naming lineage.json")
        assert any(p.startswith(row[2:]) for p in status_json(serve.config)["child"])
        await lineage_reaches_card(
            child, "lead", "split the work", "child v1", lambda: texts(fake, GROUP)
        )
        await eventually(
            lambda: "⚠" not in texts(fake, GROUP)[-1], what="the row gone with a good record"
        )
        assert await serve.aterminate() == 0
    assert f"agent child: lineage.json {problem}" in serve.logs


async def test_a_body_rewritten_in_place_with_its_mtime_put_back_is_seen(
    tmp_path: Path, fake: FakeTelegram
) -> None:
    """A body rewritten in place at the same size with its old mtime put back (`cp -p`,
    `rsync -t --inplace`, `touch -r`): inode, size and mtime all as before, so the card kept
    the old text for good. The ctime, which no writer sets back, tells the change."""
    serve = setup(tmp_path, fake, ["copied"])
    body = CardPaths(workdir(tmp_path, "copied")).body
    publish(workdir(tmp_path, "copied"), "copied v1")
    with serve:
        await eventually(lambda: shows(fake, GROUP, "copied v1"), what="the card")
        before = os.stat(body)
        with body.open("r+b") as handle:
            handle.write(b"COPIED v1")  # the same size, in place
        os.utime(body, ns=(before.st_atime_ns, before.st_mtime_ns))
        after = os.stat(body)
        assert (after.st_ino, after.st_size, after.st_mtime_ns) == (
            before.st_ino,
            before.st_size,
            before.st_mtime_ns,
        )
        await eventually(lambda: shows(fake, GROUP, "COPIED v1"), what="the rewritten body")
        assert await serve.aterminate() == 0
