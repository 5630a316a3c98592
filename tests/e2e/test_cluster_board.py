"""A chat's board in a cluster, end to end: instances sharing one real Redis, each serving
some of the chat's agents, against the fake Bot API and the fake Feishu Open API. One board
per chat, listing every agent whichever instance serves it, sent by one instance."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest

from tests.e2e.harness import eventually, publish
from tests.e2e.test_cluster import instance
from tests.e2e.test_serve_board import BOARD_TITLE
from tests.e2e.test_serve_telegram import GROUP
from tests.fakes.telegram_api import FakeTelegram, StoredMessage


@pytest.fixture
def prefix() -> str:
    return f"e2e-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def fleet() -> Iterator[ExitStack]:
    with ExitStack() as stack:
        yield stack


def boards(fake: FakeTelegram) -> list[StoredMessage]:
    """The board messages of the group, as Telegram formats them (a title mark, then the
    title)."""
    return [m for m in fake.bot_messages(GROUP) if m.text[2:].startswith(BOARD_TITLE)]


def board_text(fake: FakeTelegram) -> str:
    found = boards(fake)
    return found[0].text if len(found) == 1 else ""


async def test_a_clustered_board_keeps_the_platforms_formatting(
    tmp_path: Path, telegram: FakeTelegram, redis_url: str, prefix: str, fleet: ExitStack
) -> None:
    # The relay that wraps each channel in a cluster used to fall back to the plain-text
    # board of the base class: no title mark, no bold, on Telegram.
    fleet.enter_context(
        instance(tmp_path, "i0", telegram, ["alpha"], redis_url=redis_url, prefix=prefix,
                 view="board")
    )  # fmt: skip
    publish(tmp_path / "agents" / "alpha", "**alpha** step 1")
    await eventually(lambda: "alpha step 1" in board_text(telegram), what="the board")
    (board,) = boards(telegram)
    assert any(e["type"] == "bold" for e in board.entities)
