"""Which chats show a board, and which boards must be composed again.

A chat (channel, chat, thread) shows either one resident card per agent ("cards") or one
resident board ("board", see `bridge.compose.board`). The board is an ordinary resident of the
route scheduler, keyed like an agent's route but with `BOARD_AGENT` in the agent's place, a
name no configured agent can take; so it gets the chat's pacing, latest-wins coalescing and
restart safety exactly as cards do.

The chat's view starts as its route's `view` setting; `/taskcard board` and `/taskcard cards`
change it, and the choice is kept in the store's cursors under `view:<chat scope>` (a key
every state store already keeps), so it survives a restart and overrides the config until
changed again in the chat.

What happens to agents' own cards in a board chat (decided here, documented in
docs/operators.md): an agent that needs people (renderer error, refresh limit reached,
waiting for a person) keeps or gets its own card while it does. When it no longer does, its
card is edited one last time to say so and that it is followed on the board, and the route
lets go of that message (`RouteScheduler.submit(release=True)`): the message stays in the
chat's history as a record, and the agent's next need posts a fresh card people will see,
rather than editing one far up the chat. Switching a chat to "board" retires the cards of
agents that need nothing the same way; switching back to "cards" retires the board.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from taskcard.bridge.schedule.scheduler import RouteKey
from taskcard.bridge.store.sqlite import StateStore
from taskcard.channels.base import RouteView

log = logging.getLogger(__name__)

# Not a valid agent id (those start with a letter or digit): a board never meets an agent's key.
BOARD_AGENT = "#board"
VIEWS: tuple[RouteView, ...] = ("cards", "board")


def board_key(key: RouteKey) -> RouteKey:
    """The board resident of the chat (and thread) that `key` belongs to."""
    return RouteKey(key.channel, key.chat, BOARD_AGENT)


def view_cursor(scope: str) -> str:
    """Where a chat's `/taskcard board|cards` choice is kept in the store."""
    return f"view:{scope}"


def parse_view(raw: str | None) -> RouteView | None:
    """A stored view choice, or None for none or an unknown value (the config then decides)."""
    for view in VIEWS:
        if raw == view:
            return view
    return None


class ChatViews:
    """The view of each routed chat, and the chats whose board is out of date."""

    def __init__(self, store: StateStore, defaults: Iterable[tuple[str, RouteView]]) -> None:
        self._store = store
        self._views: dict[str, RouteView] = {}
        for scope, default in defaults:
            stored = parse_view(store.get_cursor(view_cursor(scope)))
            self._views[scope] = default if stored is None else stored
        self._dirty: set[str] = set()

    def add_scope(self, scope: str, default: RouteView) -> bool:
        """A routed chat's view whenever the fleet is applied (a chat that joined, or a
        reload that changed its route's `view`): its stored choice, else `default`. True when
        a chat already known now shows the other view."""
        stored = parse_view(self._store.get_cursor(view_cursor(scope)))
        view = default if stored is None else stored
        changed = scope in self._views and self._views[scope] != view
        self._views[scope] = view
        if changed:
            log.info("chat %s now shows %s (its route's view)", scope, view)
        return changed

    def view(self, scope: str) -> RouteView:
        return self._views.get(scope, "cards")

    def set_view(self, scope: str, view: RouteView) -> bool:
        """Choose the chat's view and persist it; False when it already was that."""
        changed = self._views.get(scope) != view
        self._views[scope] = view
        self._store.set_cursor(view_cursor(scope), view)
        if changed:
            log.info("chat %s now shows %s", scope, view)
        return changed

    def mark(self, scope: str) -> bool:
        """Note that the chat's board must be composed again; True when it was not yet noted
        (the caller then schedules one pass for all the noted chats)."""
        fresh = scope not in self._dirty
        self._dirty.add(scope)
        return fresh and len(self._dirty) == 1

    def take_dirty(self) -> list[str]:
        """The noted chats, each once, in a stable order; the notes are cleared."""
        dirty, self._dirty = sorted(self._dirty), set()
        return dirty
