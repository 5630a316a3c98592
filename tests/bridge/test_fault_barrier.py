"""The service's per-agent fault barrier (`Service._guard`): a failing stage stays with its
agent, is listed for `taskcard status` by its type only, is logged once per episode, and is
cleared by the stage's next success; a cancellation is never taken for a fault."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from taskcard.bridge.config import parse_config
from taskcard.bridge.run.service import Service
from taskcard.bridge.store.sqlite import SqliteStore


def test_a_failing_stage_is_listed_logged_once_and_cleared_by_a_success(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config = parse_config(
        {
            "console": {"enabled": False},
            "state_dir": "state",
            "agents": [{"id": "a", "workdir": "a"}],
        },
        base_dir=tmp_path,
    )
    store = SqliteStore.in_dir(config.state_dir)
    try:
        service = Service(config, {}, store)
        caplog.set_level(logging.INFO, logger="taskcard.bridge.run.service")
        for attempt in range(3):
            with service._guard("a", "reading its files"):
                raise ValueError(f"secret-looking detail {attempt}")
        problems = service.agent_problems("a")
        assert problems == ["reading its files failed (ValueError); retried on the next change"]
        failures = [r for r in caplog.records if "reading its files failed" in r.getMessage()]
        assert len(failures) == 1 and failures[0].exc_info is not None  # once, with traceback
        assert all("secret-looking" not in p for p in problems)

        with service._guard("a", "notifying"):
            pass  # another stage's success clears nothing else
        assert len(service.agent_problems("a")) == 1
        with service._guard("a", "reading its files"):
            pass
        assert service.agent_problems("a") == []
        assert any("reading its files works again" in r.getMessage() for r in caplog.records)

        with pytest.raises(asyncio.CancelledError), service._guard("a", "notifying"):
            raise asyncio.CancelledError
        assert service.agent_problems("a") == []
    finally:
        store.close()
