"""Routes opened by a turn's origin, persisted so that they survive a restart.

An origin route is open from the origin event that opened it until its card is removed or
people turn it off with `/taskcard off` in that chat. A closed route remembers when it closed:
only an origin written after that moment opens it again, so replaying an old tail of the
activity log (after a restart, or when an agent is seen for the first time) never reopens a
route that people closed.

Kept as one JSON document under one store cursor, whichever store backs it. Clustered, the
document is shared by every instance, and each writes only the routes it changed into it: it
changes the document as stored (`StateStore.change_cursor`), keeping the other entries as they
are there, in one atomic step of the store (a compare-and-set in Redis, one transaction in
SQLite), so two instances changing routes at the same moment both keep their change. Read,
then written in two steps, the second write dropped the first's change. Only the instance
serving an agent opens or closes that agent's routes (see `Service._close_unlisted_origins`),
so one instance's write never undoes another's; writing back the whole document it read at
its start, an instance dropped the routes others had opened since and opened again those they
had closed.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, replace
from typing import Final

from taskcard.bridge.schedule.scheduler import RouteKey
from taskcard.bridge.store.sqlite import StateStore
from taskcard.channels.base import ChatRef

log = logging.getLogger(__name__)

ORIGIN_ROUTES_CURSOR: Final = "origin-routes"
# Closed routes kept (for their closing time); the oldest are forgotten first.
MAX_REMEMBERED: Final = 5_000


@dataclass
class _Entry:
    key: RouteKey
    opened_at: float
    closed_at: float | None = None


class OriginBook:
    """Open and closed origin routes, saved on every change.

    `shared`: other instances write the same document (clustered), so a change is merged
    into the stored document rather than replacing it."""

    def __init__(self, store: StateStore, *, shared: bool = False) -> None:
        self._store = store
        self._shared = shared
        self._entries = _by_key(_parse(store.get_cursor(ORIGIN_ROUTES_CURSOR)))

    def reread(self) -> None:
        """Shared: take the stored document as it is now (other instances wrote to it since
        it was read)."""
        if self._shared:
            self._entries = _by_key(_parse(self._store.get_cursor(ORIGIN_ROUTES_CURSOR)))

    def open_routes(self) -> list[RouteKey]:
        return [e.key for e in self._entries.values() if e.closed_at is None]

    def opened_at(self, key: RouteKey) -> float | None:
        entry = self._entries.get(key)
        return entry.opened_at if entry is not None and entry.closed_at is None else None

    def open(self, key: RouteKey, at: float) -> bool:
        """Open `key` for an origin written at `at`; whether it was not open before."""
        entry = self._entries.get(key)
        if entry is not None and (entry.closed_at is None or at <= entry.closed_at):
            return False
        self._entries.pop(key, None)
        self._entries[key] = _Entry(key, at)
        self._save([key])
        return True

    def close(self, key: RouteKey, at: float) -> None:
        entry = self._entries.get(key)
        if entry is None or entry.closed_at is not None:
            return
        entry.closed_at = at
        self._save([key])

    def forget_agent(self, agent_id: str) -> bool:
        """Forget the routes of an agent that left the fleet for good, open or closed (a
        later origin from it opens its route afresh); whether there were any."""
        gone = [key for key in self._entries if key.agent_id == agent_id]
        for key in gone:
            del self._entries[key]
        if gone:
            self._save(gone)
        return bool(gone)

    def _save(self, changed: list[RouteKey]) -> None:
        if not self._shared:
            _forget_oldest(self._entries)
            self._store.set_cursor(ORIGIN_ROUTES_CURSOR, _document(self._entries))
            return
        # Ours (`changed`) as we have them now, copied: the change may run again later.
        ours = {key: _copy(self._entries.get(key)) for key in changed}
        merged = self._entries

        def merge(raw: str | None) -> str:
            """The others' entries as they are stored now; ours in place of theirs."""
            nonlocal merged
            stored = _by_key(_parse(raw))
            for key, entry in ours.items():
                stored.pop(key, None)
                if entry is not None:
                    stored[key] = replace(entry)
            _forget_oldest(stored)
            merged = stored
            return _document(stored)

        self._store.change_cursor(ORIGIN_ROUTES_CURSOR, merge)
        self._entries = merged


def _copy(entry: _Entry | None) -> _Entry | None:
    return None if entry is None else replace(entry)


def _forget_oldest(entries: dict[RouteKey, _Entry]) -> None:
    """Drop the oldest closed entries past `MAX_REMEMBERED` (open ones are kept)."""
    while len(entries) > MAX_REMEMBERED:
        oldest = next((k for k, e in entries.items() if e.closed_at is not None), None)
        if oldest is None:
            break
        del entries[oldest]


def _document(entries: dict[RouteKey, _Entry]) -> str:
    return json.dumps(
        [
            {
                "channel": e.key.channel,
                "chat_id": e.key.chat.chat_id,
                "thread_id": e.key.chat.thread_id,
                "agent": e.key.agent_id,
                "opened_at": e.opened_at,
                "closed_at": e.closed_at,
            }
            for e in entries.values()
        ]
    )


def _by_key(entries: list[_Entry]) -> dict[RouteKey, _Entry]:
    return {entry.key: entry for entry in entries}


def _parse(raw: str | None) -> list[_Entry]:
    """The saved entries; unusable ones are dropped (the store is ours, but be total)."""
    if not raw:
        return []
    try:
        data = json.loads(raw)
    except ValueError:
        log.warning("the saved origin routes are unreadable; starting without them")
        return []
    entries: list[_Entry] = []
    for item in data if isinstance(data, list) else []:
        if not isinstance(item, dict):
            continue
        channel, chat_id, thread_id = (
            item.get("channel"),
            item.get("chat_id"),
            item.get("thread_id"),
        )
        agent, opened, closed = item.get("agent"), item.get("opened_at"), item.get("closed_at")
        if not all(isinstance(v, str) for v in (channel, chat_id, agent)):
            continue
        if thread_id is not None and not isinstance(thread_id, str):
            continue
        if not isinstance(opened, int | float) or not (
            closed is None or isinstance(closed, int | float)
        ):
            continue
        key = RouteKey(str(channel), ChatRef(str(chat_id), thread_id), str(agent))
        entries.append(_Entry(key, float(opened), None if closed is None else float(closed)))
    return entries
