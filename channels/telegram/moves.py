"""Basic groups upgraded to supergroups: Telegram gives the chat a new id and refuses the old
one for good (HTTP 400 with `parameters.migrate_to_chat_id`; the updates carry the pair as
the service messages `migrate_to_chat_id` and `migrate_from_chat_id`).

The service keeps keying the chat's routes, preferences and notices by the id they were first
known under (the *original* id), so everything it remembers for the chat carries over with
no copying; this module translates at the channel's edge: requests for the original id go to
the new one, and commands from the new chat arrive under the original id. Each move is kept
in the cursor store (shared by a cluster's instances), both ways: `moved_to` for requests and
`taskcard status`, `moved_from` for commands and for a configuration that already names the
new id, which then keys the same state as before, with no second resident.

Messages posted in the new chat have ids qualified with it (`MESSAGE@CHAT`): a message id is
only unique within its chat, and a resident id from the old group must never be taken for a
message of the supergroup. Pure and free of the client library (`taskcard status` reads it).
"""

from __future__ import annotations

import logging
from typing import Final

from taskcard.channels.base import ChatRef, CursorStore

MOVED_TO_PREFIX: Final = "telegram:chat_moved_to:"
MOVED_FROM_PREFIX: Final = "telegram:chat_moved_from:"
_QUALIFIER: Final = "@"

_log = logging.getLogger(__name__)


def moved_to(cursor: CursorStore, chat_id: str) -> str | None:
    """The supergroup the group `chat_id` became, when that is known."""
    return cursor.get_cursor(MOVED_TO_PREFIX + chat_id)


def moved_from(cursor: CursorStore, chat_id: str) -> str | None:
    """The group the supergroup `chat_id` was upgraded from, when that is known."""
    return cursor.get_cursor(MOVED_FROM_PREFIX + chat_id)


def original_chat(cursor: CursorStore, chat: ChatRef) -> ChatRef:
    """The chat under which the service keys `chat` (its id before an upgrade, if any)."""
    old = moved_from(cursor, chat.chat_id)
    return chat if old is None else ChatRef(old, chat.thread_id)


def qualified(message_id: str, chat_id: str) -> str:
    """The id of a message posted in `chat_id`, the supergroup a routed group became."""
    return f"{message_id}{_QUALIFIER}{chat_id}"


def split_message_id(message_id: str) -> tuple[str, str | None]:
    """(message, chat): the chat a qualified id names, None for a plain id."""
    number, _, chat_id = message_id.partition(_QUALIFIER)
    return number, (chat_id or None)


class ChatMoves:
    """The moves one channel knows: learned from Telegram, remembered in the cursor store.

    Requests are translated from memory only (a store read per edit would cost more than the
    edit's own work); a move another instance learned is learned here again from the first
    request Telegram refuses. Commands are rare, so their chat is looked up in the store.
    """

    def __init__(self, cursor: CursorStore) -> None:
        self._cursor = cursor
        self._to: dict[str, str] = {}
        self._from: dict[str, str] = {}

    def learn(self, old: str, new: str) -> bool:
        """Record that group `old` is now supergroup `new`; True when it was news here."""
        if self._to.get(old) == new:
            return False
        self._to[old], self._from[new] = new, old
        try:
            if moved_to(self._cursor, old) != new:
                self._cursor.set_cursor(MOVED_TO_PREFIX + old, new)
                self._cursor.set_cursor(MOVED_FROM_PREFIX + new, old)
        except Exception as error:
            # Followed from memory meanwhile; after a restart Telegram's refusal teaches it again.
            _log.warning("could not record the upgrade of group %s: %s", old, error)
        _log.warning(
            "Telegram group %s was upgraded to a supergroup with id %s: its cards, commands"
            " and settings continue there without a restart; set chat_id = %s in the config"
            " when convenient",
            old,
            new,
            new,
        )
        return True

    def load(self, chat_id: str) -> None:
        """Remember what the store knows of a configured chat (by its old id or its new one),
        before the first request."""
        try:
            new = moved_to(self._cursor, chat_id)
            old = moved_from(self._cursor, chat_id)
        except Exception as error:
            _log.warning("could not read whether group %s was upgraded: %s", chat_id, error)
            return
        if new is not None:
            self._to[chat_id], self._from[new] = new, chat_id
            _log.warning(
                "the config names Telegram group %s, which was upgraded to a supergroup with"
                " id %s: cards and commands go there; set chat_id = %s in the config",
                chat_id,
                new,
                new,
            )
        if old is not None:
            self._to[old], self._from[chat_id] = chat_id, old

    def target(self, chat_id: str) -> str | None:
        """Where requests for `chat_id` go now, when the group was upgraded."""
        return self._to.get(chat_id)

    def original(self, chat_id: str) -> str | None:
        """The routed group a command's supergroup `chat_id` was upgraded from, if any."""
        old = self._from.get(chat_id)
        if old is None:
            try:
                old = moved_from(self._cursor, chat_id)
            except Exception as error:
                # Polling must go on: the command is handed over as it came.
                _log.warning("could not read whether chat %s was a group: %s", chat_id, error)
                return None
            if old is not None:
                self._to[old], self._from[chat_id] = chat_id, old
        return old
