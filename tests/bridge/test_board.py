"""The board as tables: ordering, marks, the cut with its count, redaction of first lines,
and its rendering for Telegram (entities, 4096 UTF-16 units) and Feishu (card Markdown, 30 KB)."""

from __future__ import annotations

import html
import json
from datetime import UTC, datetime

import pytest

from taskcard.bridge.compose.board import (
    HEADLINE_MAX_CHARS,
    BoardEntry,
    board_facts,
    board_marks,
    card_headline,
    compose_board,
    compose_facts,
    facts_from_record,
    facts_record,
    fit_board,
    needs_attention,
)
from taskcard.bridge.compose.redact import Redactor
from taskcard.bridge.run.boards import BOARD_AGENT, parse_view
from taskcard.bridge.track.activity import Movement
from taskcard.bridge.track.monitor import ActivitySummary, CardState
from taskcard.channels.base import BoardLine, BoardView, board_plain_text
from taskcard.channels.feishu import card as feishu
from taskcard.channels.telegram import render as telegram

NOW = datetime(2026, 3, 4, 15, 30, tzinfo=UTC)
ACTIVE = CardState(status="active", body="# Build\n**3/10** steps")
ERROR = CardState(status="active", body="stuck", error_code="timeout")
LIMIT = CardState(status="inactive", exhausted=True)
RUNNING = ActivitySummary(
    state="running",
    last_movement=Movement("text", NOW.replace(minute=28), detail="pytest tests/"),
)
IDLE = ActivitySummary(state="idle")
WAITING = ActivitySummary(state="waiting")
EXITED = ActivitySummary(state="exited")


@pytest.mark.parametrize(
    ("card", "activity", "marks"),
    [
        (ACTIVE, RUNNING, ()),
        (ERROR, RUNNING, ("error",)),
        (LIMIT, IDLE, ("limit",)),
        (ACTIVE, WAITING, ("waiting",)),
        (
            CardState(status="active", error_code="x", exhausted=True),
            WAITING,
            ("error", "limit", "waiting"),
        ),
        (CardState(), ActivitySummary(), ()),
    ],
)
def test_marks_say_what_needs_people(
    card: CardState, activity: ActivitySummary, marks: tuple[str, ...]
) -> None:
    assert board_marks(card, activity) == marks
    assert needs_attention(card, activity) == bool(marks)


@pytest.mark.parametrize(
    ("card", "activity", "marks"),
    [
        (ACTIVE, IDLE, ("problems",)),
        (
            CardState(status="active", error_code="x", exhausted=True),
            WAITING,
            ("error", "problems", "limit", "waiting"),
        ),
        (CardState(), ActivitySummary(), ("problems",)),
    ],
)
def test_problems_with_its_files_are_marked_after_an_error(
    card: CardState, activity: ActivitySummary, marks: tuple[str, ...]
) -> None:
    assert board_marks(card, activity, problems=True) == marks
    assert needs_attention(card, activity, problems=True)


def test_a_mark_this_release_does_not_know_leaves_the_line_listed() -> None:
    record = facts_record(board_facts(BoardEntry("b", ERROR, IDLE)))
    record["marks"] = ["error", "a mark from a later release", 7]
    facts = facts_from_record(record)
    assert facts is not None and facts.marks == ("error",)


def test_an_agent_with_problems_comes_before_one_at_its_limit() -> None:
    board = compose_board(
        [
            BoardEntry("a-limit", LIMIT, RUNNING),
            BoardEntry("b-refused", ACTIVE, IDLE, problems=True),
            BoardEntry("c-error", ERROR, IDLE),
        ],
        hidden=False,
        now=NOW,
    )
    assert [line.agent_id for line in board.lines] == ["c-error", "b-refused", "a-limit"]
    assert board.lines[1].marks == ("problems",)
    assert facts_from_record(facts_record(board_facts(BoardEntry("b", ACTIVE, IDLE, True)))) == (
        board_facts(BoardEntry("b", ACTIVE, IDLE, True))
    )


@pytest.mark.parametrize(
    ("body", "headline"),
    [
        ("# Build\n**3/10** steps", "Build"),
        ("\n\n---\n- [x] **lint** passed", "lint passed"),
        ("> quoted `code`   with   spaces", "quoted code with spaces"),
        ("token sk-abcdefghijklmnopqrstuvwx here", "token [redacted] here"),
        ("x" * 200, "x" * (HEADLINE_MAX_CHARS - 1) + "…"),
        ("", None),
        (None, None),
    ],
)
def test_headline_is_the_first_line_plain_redacted_and_bounded(
    body: str | None, headline: str | None
) -> None:
    assert card_headline(body) == headline


def test_a_configured_secret_is_scrubbed_before_the_cut() -> None:
    secret = "Zq9" + "w" * 100  # only its value can find it, and a cut would keep a prefix
    scrub = Redactor([secret])
    headline = card_headline(f"status {secret}", scrub)
    assert headline == "status [redacted]"
    board = compose_board(
        [BoardEntry("a", CardState(status="active", body=f"{secret}"), RUNNING)],
        hidden=False,
        now=NOW,
        scrub=scrub,
    )
    assert "Zq9ww" not in board_plain_text(board)


def test_order_puts_what_needs_people_first_then_moving_agents_then_ids() -> None:
    entries = [
        BoardEntry("z-idle", ACTIVE, IDLE),
        BoardEntry("b-run", ACTIVE, RUNNING),
        BoardEntry("a-run", ACTIVE, RUNNING),
        BoardEntry("y-wait", ACTIVE, WAITING),
        BoardEntry("x-limit", LIMIT, EXITED),
        BoardEntry("w-error", ERROR, IDLE),
        BoardEntry("c-exited", ACTIVE, EXITED),
    ]
    board = compose_board(entries, hidden=False, now=NOW)
    assert [line.agent_id for line in board.lines] == [
        "w-error",
        "x-limit",
        "y-wait",
        "a-run",
        "b-run",
        "z-idle",
        "c-exited",
    ]
    assert board.summary == "7 agents · 3 need people · 2 running · 1 waiting · 2 idle · 2 exited"
    assert board.attention


def test_a_line_carries_state_marks_first_line_and_last_movement() -> None:
    board = compose_board([BoardEntry("builder", ERROR, RUNNING)], hidden=False, now=NOW)
    assert board_plain_text(board).splitlines()[1] == (
        "builder · running · ⚠ error — stuck · last: pytest tests/ (15:28 UTC)"
    )
    stopped = compose_board([BoardEntry("b", LIMIT, IDLE)], hidden=False, now=NOW)
    assert "⛔ refresh limit — card stopped" in board_plain_text(stopped)


def _lines(count: int) -> BoardView:
    return BoardView(
        summary="s", lines=tuple(BoardLine(f"agent{i:02d}", "idle") for i in range(count))
    )


@pytest.mark.parametrize(
    ("count", "max_chars", "kept", "omitted"),
    [
        (5, 10_000, 5, 0),  # fits whole: unchanged
        (10, 130, 3, 7),  # 15 chars a line; the title and the count take 75
        (10, 10, 0, 10),  # not even one line: summary and count only
        (0, 10, 0, 0),
    ],
)
def test_cut_keeps_the_head_and_counts_the_rest(
    count: int, max_chars: int, kept: int, omitted: int
) -> None:
    fitted = fit_board(_lines(count), lambda v: len(board_plain_text(v)) <= max_chars)
    assert (len(fitted.lines), fitted.omitted) == (kept, omitted)
    assert fitted.lines == _lines(count).lines[:kept]
    if omitted and kept:
        assert len(board_plain_text(fitted)) <= max_chars
        assert f"{omitted} more agents not shown" in board_plain_text(fitted)


def _big_board(count: int) -> BoardView:
    entries = [
        BoardEntry(f"agent-{i:04d}", CardState(status="active", body="é" * 300), RUNNING)
        for i in range(count)
    ]
    return compose_board(entries, hidden=False, now=NOW)


def test_telegram_board_fits_4096_utf16_units_with_the_count() -> None:
    board = fit_board(_big_board(300), telegram.board_fits)
    assert 0 < len(board.lines) < 300 and board.omitted == 300 - len(board.lines)
    outgoing = telegram.render_board(board)
    assert telegram.utf16_len(outgoing.text) <= telegram.MAX_MESSAGE_UTF16
    assert f"{board.omitted} more agents not shown" in outgoing.text
    bold = [e for e in outgoing.payload["entities"] if e["type"] == "bold"]
    assert len(bold) == len(board.lines) + 1  # the title and each line's agent and state


def test_feishu_board_fits_30kb_and_escapes_agent_text() -> None:
    board = fit_board(_big_board(3000), feishu.board_fits)
    assert 0 < len(board.lines) < 3000 and board.omitted == 3000 - len(board.lines)
    outgoing = feishu.render_board(board)
    assert feishu.card_request_bytes(outgoing.payload["content"]) <= feishu.CARD_BUDGET_BYTES
    assert f"{board.omitted} more agents not shown" in outgoing.text

    hostile = CardState(status="active", body='<at user_id="all"></at> [x](http://e.vil) **b**')
    card = feishu.board_card_json(
        compose_board([BoardEntry("a", hostile, IDLE)], hidden=False, now=NOW)
    )
    markdown = next(e for e in card["body"]["elements"] if e["tag"] == "markdown")["content"]
    assert "<" not in markdown and "](" not in markdown and "**b" not in markdown
    assert markdown.startswith("**a · idle**")
    assert '<at user_id="all"></at> [x](http://e.vil) b' in html.unescape(markdown)
    assert json.loads(feishu.card_content(card))["header"]["template"] == "blue"


def test_hidden_board_shows_only_the_notice() -> None:
    board = compose_board([BoardEntry("a", ERROR, IDLE)], hidden=True, now=NOW)
    assert fit_board(board, lambda v: False) == board
    assert "hidden" in telegram.render_board(board).text
    assert "hidden" in feishu.render_board(board).text


def test_board_key_and_stored_view_values() -> None:
    from taskcard.bridge.config import AGENT_ID_PATTERN

    assert not AGENT_ID_PATTERN.fullmatch(BOARD_AGENT)
    assert [parse_view(v) for v in ("board", "cards", "", None, "BOARD")] == [
        "board",
        "cards",
        None,
        None,
        None,
    ]


def test_a_line_shared_through_json_composes_the_same_board() -> None:
    # A cluster's instances hand each other their agents' lines as JSON: the board composed
    # from them is the one composed from the agents themselves, time of day included.
    entries = [
        BoardEntry("b", ACTIVE, RUNNING),
        BoardEntry("a", ERROR, WAITING),
        BoardEntry("c", LIMIT, EXITED),
        BoardEntry("d", CardState(), ActivitySummary()),
    ]
    records = [json.loads(json.dumps(facts_record(board_facts(e)))) for e in entries]
    facts = [facts_from_record(record) for record in records]
    assert None not in facts
    shared = compose_facts([f for f in facts if f], hidden=False, now=NOW)
    assert shared == compose_board(entries, hidden=False, now=NOW)
    assert [f.started for f in facts if f] == [True, True, True, False]


@pytest.mark.parametrize(
    "change",
    [
        {"state": "dancing"},
        {"marks": "error"},
        {"headline": 5},
        {"movement_at": "yesterday"},
        {"movement_at": True},
        {"movement_at": 1e300},
        {"started": "yes"},
        {"agent_id": None},
    ],
)
def test_a_shared_line_this_version_cannot_read_is_left_out(change: dict[str, object]) -> None:
    record = facts_record(board_facts(BoardEntry("a", ACTIVE, RUNNING)))
    assert facts_from_record({**record, **change}) is None
    missing = dict(record)
    del missing["state"]
    assert facts_from_record(missing) is None


def test_a_line_no_instance_observes_says_so_alike_on_both_platforms() -> None:
    """A cluster's agent whose instance died stays on the board as it last was, its state
    unknown and its marks gone, saying no instance serves it now."""
    from taskcard.bridge.compose.board import BoardFacts, compose_facts, unobserved
    from taskcard.channels.base import UNOBSERVED_NOTE

    at = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
    facts = BoardFacts("lost", "running", ("waiting",), "headline", "moved", at, True)
    view = compose_facts([unobserved(facts)], hidden=False, now=at)
    (line,) = view.lines
    assert (line.state, line.marks, line.headline) == ("unknown", (), "headline")
    rest = f" · {UNOBSERVED_NOTE} — headline"
    assert f"lost · unknown{rest}" in telegram.render_board(view).text
    card = json.loads(feishu.render_board(view).payload["content"])
    assert f"**lost · unknown**{rest}" in json.dumps(card, ensure_ascii=False)
