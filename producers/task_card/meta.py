"""The `_meta.agent_meta.taskcard` payload a host attaches to the agent's turns.

Four shapes: absent (with a hint to consider a card), active (with the body), refused (the
body on disk is over the limit) and unreadable. Unreadable is deliberately not absent: an
agent told "no card" would start a duplicate. `MetaProjector` gates on change so the same
body is not re-injected every turn.
"""

from __future__ import annotations

import threading
from typing import Any, Final

from taskcard.producers.task_card.contract import (
    CardPaths,
    body_chars,
    open_regular,
    parse_status,
    shows_text,
)
from taskcard.producers.task_card.settings import settings_or_defaults

ABSENT_HINT: Final = "no taskcard present, consider maintaining one, see task_card manual"
REFUSED_HINT: Final = (
    "the task card body is over max-body-chars and is not shown; shorten the renderer output"
)
UNREADABLE_HINT: Final = (
    "the task card files cannot be read; inspect the watch before starting another one"
)
_READ_LIMIT_BYTES: Final = 4_000_000


def _read(path: Any, workdir: Any) -> bytes | None:
    """Bytes, None when missing; raises OSError when present but unreadable, or when it lies
    outside the workdir (a link out, at the file or at `taskcard/`: the service does not show
    that file either, so the agent must not take it for its card)."""
    try:
        with open_regular(path, inside=workdir) as handle:
            data: bytes = handle.read(_READ_LIMIT_BYTES)
            return data
    except FileNotFoundError:
        return None


def project_meta(paths: CardPaths, max_body_chars: int) -> dict[str, Any]:
    """The payload for the card as it is on disk now."""
    try:
        status_raw = _read(paths.status, paths.workdir)
        body_raw = _read(paths.body, paths.workdir)
    except OSError:
        return {"present": True, "status": "unreadable", "hint": UNREADABLE_HINT}
    status = parse_status(status_raw)
    if status_raw is None or status == "inactive":
        return {"present": False, "hint": ABSENT_HINT}
    if status == "unknown":
        return {"present": True, "status": "unreadable", "hint": UNREADABLE_HINT}
    if body_raw is None:
        return {"present": False, "hint": ABSENT_HINT}
    try:
        body = body_raw.decode("utf-8")
    except UnicodeDecodeError:
        return {"present": True, "status": "unreadable", "hint": UNREADABLE_HINT}
    if not shows_text(body):
        return {"present": False, "hint": ABSENT_HINT}
    if body_chars(body) > max_body_chars:
        return {"present": True, "status": "refused", "hint": REFUSED_HINT}
    return {"present": True, "status": "active", "body": body}


class MetaProjector:
    """Change-gated projection: `poll()` returns a payload only when it differs from the last."""

    def __init__(self, paths: CardPaths) -> None:
        self._paths = paths
        self._last: dict[str, Any] | None = None
        self._lock = threading.Lock()

    def current(self) -> dict[str, Any]:
        return project_meta(self._paths, settings_or_defaults(self._paths).max_body_chars)

    def poll(self) -> dict[str, Any] | None:
        payload = self.current()
        with self._lock:
            if payload == self._last:
                return None
            self._last = payload
            return payload
