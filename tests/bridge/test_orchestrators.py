"""A chat's orchestrator mark as tables: what `/taskcard orchestrator` reads, the stored choice,
which agent a chat's mark names, the pointer a wake adds, and the board line that says it."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from taskcard.bridge.compose.board import BoardEntry, compose_board
from taskcard.bridge.run.commands import TaskcardCommand, parse_taskcard, suggestion
from taskcard.bridge.run.orchestrators import (
    ChatOrchestrators,
    Choice,
    chat_orchestrator,
    encode_choice,
    orchestrator_cursor,
    orchestrator_pointer,
    parse_choice,
    unfollowed_choice,
)
from taskcard.bridge.store.sqlite import SqliteStore
from taskcard.bridge.track.monitor import ActivitySummary, CardState
from taskcard.channels.base import ORCHESTRATOR_NOTE, board_line_parts, board_plain_text
from taskcard.channels.feishu import card as feishu
from taskcard.channels.telegram import render as telegram

NOW = datetime(2026, 3, 4, 15, 30, tzinfo=UTC)


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        ("orchestrator", TaskcardCommand("orchestrator")),
        (" Orchestrator ", TaskcardCommand("orchestrator")),
        ("orchestrator planner", TaskcardCommand("orchestrator", agent="planner")),
        # The name keeps its case (ids are matched exactly first); `off` in any case.
        ("ORCHESTRATOR Planner", TaskcardCommand("orchestrator", agent="Planner")),
        ("orchestrator off", TaskcardCommand("orchestrator", agent="off")),
        ("orchestrator OFF", TaskcardCommand("orchestrator", agent="off")),
        ("orchestrator a b", TaskcardCommand("unknown")),
        ("planner orchestrator", TaskcardCommand("unknown")),
    ],
)
def test_what_orchestrator_commands_read_as(args: str, expected: TaskcardCommand) -> None:
    assert parse_taskcard(args) == expected


def test_a_misspelt_orchestrator_is_suggested_without_the_typed_text() -> None:
    assert suggestion("orchestator") == "/taskcard orchestrator"
    assert suggestion("orchestrator planner extra") == "/taskcard orchestrator"


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (None, None),
        ("", None),
        (encode_choice(Choice("planner")), Choice("planner")),
        (encode_choice(Choice(None)), Choice(None)),
        ("planner", None),  # not what this version writes: the config decides
        ('{"agent": 3}', None),
        ("[]", None),
        ("{}", None),
    ],
)
def test_stored_choices(raw: str | None, expected: Choice | None) -> None:
    assert parse_choice(raw) == expected


@pytest.mark.parametrize(
    ("choice", "configured", "expected"),
    [
        (None, None, None),
        (None, "lead", "lead"),
        (Choice("boss"), "lead", "boss"),  # the chat's choice wins
        (Choice(None), "lead", None),  # off in the chat wins too
        # A choice of an agent the chat no longer follows is set aside: the config applies.
        (Choice("gone"), "lead", "lead"),
        (Choice("gone"), None, None),
        (None, "gone", None),
    ],
)
def test_which_agent_a_chat_marks(
    choice: Choice | None, configured: str | None, expected: str | None
) -> None:
    assert chat_orchestrator(choice, configured, {"lead", "boss", "worker"}) == expected


@pytest.mark.parametrize(
    ("choice", "expected"),
    [(None, None), (Choice(None), None), (Choice("lead"), None), (Choice("gone"), "gone")],
)
def test_which_choice_is_set_aside(choice: Choice | None, expected: str | None) -> None:
    assert unfollowed_choice(choice, {"lead", "worker"}) == expected


def test_a_choice_persists_in_the_store(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "state.sqlite3")
    try:
        ChatOrchestrators(store).choose("telegram:-100:", "lead")
        assert ChatOrchestrators(store).choice("telegram:-100:") == Choice("lead")
        assert store.get_cursor(orchestrator_cursor("telegram:-100:")) is not None
        ChatOrchestrators(store).choose("telegram:-100:", None)
        assert ChatOrchestrators(store).choice("telegram:-100:") == Choice(None)
        assert ChatOrchestrators(store).choice("telegram:-200:") is None
    finally:
        store.close()


def test_the_pointer_says_how_to_read_the_report_from_typed_values() -> None:
    folder = Path("/srv/agents/my worker")
    pointer = orchestrator_pointer("worker", folder, 4)
    assert "orchestrator" in pointer and "worker" in pointer
    assert "taskcard reports --workdir '/srv/agents/my worker' --after 3" in pointer
    assert 'child_workdir "/srv/agents/my worker" and after 3' in pointer
    other = orchestrator_pointer("worker", folder, None)
    assert "--after" not in other and "taskcard reports --workdir" in other


def test_the_orchestrators_board_line_says_so_alike_on_both_platforms() -> None:
    entries = [
        BoardEntry(
            agent, CardState(status="active", body=f"{agent} at work"), ActivitySummary("running")
        )
        for agent in ("lead", "worker")
    ]
    board = compose_board(entries, hidden=False, now=NOW, orchestrator="lead")
    lead, worker = board.lines
    assert lead.orchestrator and not worker.orchestrator
    assert board_line_parts(lead) == ("lead · running", f" · {ORCHESTRATOR_NOTE} — lead at work")
    assert ORCHESTRATOR_NOTE not in "".join(board_line_parts(worker))
    for text in (
        board_plain_text(board),
        telegram.render_board(board).text,
        feishu.render_board(board).text,
    ):
        [line] = [line for line in text.splitlines() if "lead · running" in line]
        assert ORCHESTRATOR_NOTE in line, text
        assert text.count(ORCHESTRATOR_NOTE) == 1
    assert not any(
        line.orchestrator for line in compose_board(entries, hidden=False, now=NOW).lines
    )
