"""Forum topics' names: Telegram tells a bot a topic's name when it is opened
(`forum_topic_created`) or renamed (`forum_topic_edited`), service messages every bot gets,
and with every message in a topic that replies to nothing else (its `reply_to_message` is the
message that opened the topic, with the name it was opened with).

The names are kept in the cursor store, one row per chat (`telegram:topic_names:<chat>`, a
JSON object of thread id to name, the oldest learnt first, `TOPIC_NAMES_PER_CHAT` at most),
so a restart and every instance of a cluster (whose cursor store is the shared Redis) name
the topics the poll learnt, and `taskcard chats` shows them. A name is a member's text: it is
cleaned when learnt and again when read (a shared store's value is untrusted too). Pure and
free of the client library (`taskcard chats` reads it).

They go when Telegram says the topic or the chat went (`TopicNames.forget`): a topic deleted
(its thread not found), the bot out of the chat (removed, blocked, the chat deleted or not
found). A basic group upgraded to a supergroup keeps its row: a basic group has no topics,
and the supergroup's are learnt under the group's original id (`channels.telegram.moves`).
"""

from __future__ import annotations

import json
import logging
from collections import OrderedDict
from typing import Final

from taskcard.channels.base import CursorStore, without_ignorable

TOPIC_NAMES_PREFIX: Final = "telegram:topic_names:"
# At most this many forum topics' names are kept in memory, and this many per chat in the
# store, the oldest learnt going first; a name at most this many characters (Telegram allows
# 128), cut with "…".
TOPIC_NAMES_KEPT: Final = 4096
TOPIC_NAMES_PER_CHAT: Final = 256
TOPIC_NAME_CHARS: Final = 64

_log = logging.getLogger(__name__)


def cleaned_topic_name(name: object) -> str | None:
    """A forum topic's name (any member with the right may set one: untrusted) as a chat
    is shown it in the service's words: on one line (a control or other character that
    shows as nothing is a space, or nothing when invisible), white space collapsed, at most
    `TOPIC_NAME_CHARS` characters. None for no name, or one that shows nothing."""
    if not isinstance(name, str):
        return None
    bare = without_ignorable(name)
    one_line = " ".join("".join(char if char.isprintable() else " " for char in bare).split())
    if len(one_line) > TOPIC_NAME_CHARS:
        one_line = one_line[: TOPIC_NAME_CHARS - 1].rstrip() + "…"
    return one_line or None


def _key(chat_id: str) -> str:
    return TOPIC_NAMES_PREFIX + chat_id


def _parsed(chat_id: str, raw: str | None) -> OrderedDict[str, str]:
    """The names a stored row holds, cleaned; a row that is not such an object is named
    once in the log and read as empty (the next name learnt in the chat writes it anew)."""
    names: OrderedDict[str, str] = OrderedDict()
    if raw is None:
        return names
    try:
        document = json.loads(raw)
    except (ValueError, RecursionError):  # nested past the parser's depth
        document = None
    if not isinstance(document, dict):
        _log.warning(
            "the stored forum topic names of Telegram chat %s (%s) are not a JSON object of"
            " thread id to name: ignored, and written anew with the next name learnt there;"
            " delete the row to drop it now",
            chat_id,
            _key(chat_id),
        )
        return names
    for thread_id, name in document.items():
        cleaned = cleaned_topic_name(name)
        if thread_id.isdigit() and cleaned is not None:
            names[thread_id] = cleaned
    while len(names) > TOPIC_NAMES_PER_CHAT:
        names.popitem(last=False)
    return names


def stored_topic_names(cursor: CursorStore, chat_id: str) -> dict[str, str]:
    """The names of chat `chat_id`'s topics the store keeps, by thread id, cleaned. Raises
    what the store raises."""
    return dict(_parsed(chat_id, cursor.get_cursor(_key(chat_id))))


class TopicNames:
    """The forum topics' names one channel knows, by (chat id, thread id): kept in the
    cursor store (the module docstring), and in memory for when the store cannot be read
    (`TOPIC_NAMES_KEPT` at most)."""

    def __init__(self, cursor: CursorStore | None = None) -> None:
        self._cursor = cursor
        self._names: OrderedDict[tuple[str, str], str] = OrderedDict()

    def get(self, chat_id: str, thread_id: str) -> str | None:
        """The topic's name: the store's (another instance, or an earlier run, may have
        learnt it, or a newer one), else the one learnt here."""
        if self._cursor is not None:
            try:
                name = stored_topic_names(self._cursor, chat_id).get(thread_id)
            except Exception as error:
                _log.warning(
                    "could not read the forum topic names of Telegram chat %s: %s",
                    chat_id,
                    type(error).__name__,
                )
            else:
                if name is not None:
                    self._remember(chat_id, thread_id, name)
                    return name
        return self._names.get((chat_id, thread_id))

    def learn(self, chat_id: str, thread_id: str, name: object, *, newer: bool) -> None:
        """Learn topic `thread_id`'s `name` (untrusted) in chat `chat_id` (as the service
        names the chat). Not `newer` (the name the topic was opened with, which a message in
        it carries), it does not replace a name known here or kept in the store."""
        cleaned = cleaned_topic_name(name)
        if cleaned is None:
            return
        key = (chat_id, thread_id)
        if not newer and key in self._names:
            return
        if self._cursor is not None and self._store(chat_id, thread_id, cleaned, newer=newer):
            return
        self._remember(chat_id, thread_id, cleaned)

    def forget(self, chat_id: str, thread_id: str | None = None) -> None:
        """Drop the name of topic `thread_id` of chat `chat_id`, or of all of the chat's
        topics when None, here and in the store (the topic was deleted, or the bot is out
        of the chat). A store that fails is named in the log: the names stay until the
        next such answer."""
        for key in [key for key in self._names if key[0] == chat_id]:
            if thread_id is None or key[1] == thread_id:
                del self._names[key]
        if self._cursor is None:
            return
        try:
            if thread_id is None:
                self._cursor.delete_cursors([_key(chat_id)])
                return
            raw = self._cursor.get_cursor(_key(chat_id))
            names = _parsed(chat_id, raw)
            if names.pop(thread_id, None) is None:
                return
            if names:
                self._cursor.set_cursor(_key(chat_id), json.dumps(names, ensure_ascii=False))
            else:
                self._cursor.delete_cursors([_key(chat_id)])
        except Exception as error:
            _log.warning(
                "could not forget the forum topic names of Telegram chat %s: %s",
                chat_id,
                type(error).__name__,  # the store's error text may quote its keys
            )

    def _store(self, chat_id: str, thread_id: str, name: str, *, newer: bool) -> bool:
        """Keep the name in the store; True when the store already had one that stays (then
        remembered here instead of `name`)."""
        assert self._cursor is not None
        try:
            names = _parsed(chat_id, self._cursor.get_cursor(_key(chat_id)))
            known = names.get(thread_id)
            if known is not None and (known == name or not newer):
                self._remember(chat_id, thread_id, known)
                return True
            names.pop(thread_id, None)
            names[thread_id] = name
            while len(names) > TOPIC_NAMES_PER_CHAT:
                names.popitem(last=False)
            self._cursor.set_cursor(_key(chat_id), json.dumps(names, ensure_ascii=False))
        except Exception as error:
            # Polling goes on: the name is kept in memory, and learnt again from the
            # topic's next message after a restart.
            _log.warning(
                "could not keep the name of forum topic %s of Telegram chat %s: %s",
                thread_id,
                chat_id,
                type(error).__name__,
            )
        return False

    def _remember(self, chat_id: str, thread_id: str, name: str) -> None:
        key = (chat_id, thread_id)
        self._names[key] = name
        self._names.move_to_end(key)
        while len(self._names) > TOPIC_NAMES_KEPT:
            self._names.popitem(last=False)
