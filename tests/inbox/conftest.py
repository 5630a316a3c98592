"""Helpers for the inbox tests: queue a message exactly as the service's contract says."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

SUBFOLDERS = ("queued", "taken", "cancelled", "tmp")


def queue(
    workdir: Path,
    ident: str,
    text: str,
    *,
    kind: str = "message",
    origin: str | None = "telegram:-1001:7",
    user: str | None = "ana",
    queued_at: str = "2026-01-01T00:00:00.000Z",
) -> Path:
    """Write `inbox/tmp/<id>.json`, then rename it into `inbox/queued/` (the service's way)."""
    inbox = workdir / "inbox"
    for name in SUBFOLDERS:
        (inbox / name).mkdir(parents=True, exist_ok=True, mode=0o700)
    message: dict[str, Any] = {
        "v": 1,
        "id": ident,
        "kind": kind,
        "text": text,
        "from": {"channel": "telegram", "chat_id": "-1001", "thread_id": "7", "user": user},
        "origin": origin,
        "queued_at": queued_at,
    }
    tmp = inbox / "tmp" / f"{ident}.json"
    tmp.write_text(json.dumps(message))
    target = inbox / "queued" / f"{ident}.json"
    os.rename(tmp, target)
    return target


def acks(workdir: Path) -> list[dict[str, Any]]:
    path = workdir / "inbox" / "acks.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines()]


def names(workdir: Path, folder: str) -> list[str]:
    path = workdir / "inbox" / folder
    return sorted(p.name for p in path.iterdir()) if path.is_dir() else []


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    """An agent's workdir: it has the task card's folder, so a hook writes into it by cwd."""
    path = tmp_path / "agent"
    (path / "taskcard").mkdir(parents=True)
    return path
