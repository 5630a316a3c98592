"""The inbox's file contract (shared with the service) and total parsing of one message.

Layout under the agent's workdir, all folders real directories (never links)::

    inbox/tmp/.<id>.<random>.tmp  the service writes a message here first (its own)
    inbox/queued/<id>.json     then renames it here (atomic): waiting for the agent
    inbox/taken/<id>.json      the agent side claimed it (its rename won)
    inbox/cancelled/<id>.json  the service withdrew it (its rename won)
    inbox/acks.jsonl           one line per claimed message, appended by the agent side
    inbox/claims/<id>.json     who holds a claimed message not yet settled (agent side only)

A message is one UTF-8 JSON object of at most 16 KiB: `{"v": 1, "id", "kind": "message" |
"wake", "text", "from": {"channel", "chat_id", "thread_id", "user", "name"}, "origin",
"queued_at"}`. `from.user` is the platform's id of the person who wrote it, or null;
`from.name` (optional, added within v1: a reader that does not know it ignores it) is the
name a message that names no person shows instead (a Telegram channel's post: its
signature, else the channel's title), never an id, written as `shown_name` makes it.
Everything in it is untrusted text: `parse_message` checks every field and says which one is
wrong; `frame` quotes the text so that it can never pose as the frame around it.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import stat
from dataclasses import dataclass
from typing import Any, Final, Literal

from taskcard.producers.task_card.contract import (
    BIDI_CHARS,
    drop_hidden_tags,
    escape_controls,
    one_line_cut,
    shows_text,
)

INBOX_DIR: Final = "inbox"
QUEUED_DIR: Final = "queued"
TAKEN_DIR: Final = "taken"
CANCELLED_DIR: Final = "cancelled"
TMP_DIR: Final = "tmp"
CLAIMS_DIR: Final = "claims"  # the agent side's own: the service never reads it

# An inbox shared with an agent run by another user (docs/operators.md): folders and files.
SHARED_DIR_MODE: Final = 0o2770
SHARED_FILE_MODE: Final = 0o640


def shared_group(workdir_fd: int) -> int | None:
    """The workdir's group when the workdir grants it full access (rwx), else None."""
    info = os.fstat(workdir_fd)
    return info.st_gid if info.st_mode & stat.S_IRWXG == stat.S_IRWXG else None


def share(fd: int, group: int | None, mode: int) -> None:
    """Give what `fd` names (ours) the workdir's `group` and `mode`; nothing when `group` is
    None or the file is not ours. Best effort: the kernel refuses a group the caller is not
    in, and the inbox then stays private to the user who made it."""
    if group is None:
        return
    info = os.fstat(fd)
    if info.st_uid != os.geteuid():
        return
    with contextlib.suppress(PermissionError):
        if info.st_gid != group:
            os.fchown(fd, -1, group)
        if stat.S_IMODE(info.st_mode) != mode:
            os.fchmod(fd, mode)


ACKS_FILE: Final = "acks.jsonl"
MAX_MESSAGE_BYTES: Final = 16 * 1024
VERSION: Final = 1
KINDS: Final = ("message", "wake")
VIAS: Final = frozenset(
    {
        "claude-code:PostToolUse",
        "claude-code:Stop",
        "claude-code:UserPromptSubmit",
        "codex:PostToolUse",
        "codex:Stop",
        "codex:UserPromptSubmit",
        "inbox-cli",
        "mcp",
    }
)
# A message's id, checked whole with `fullmatch` wherever one comes from a file or the store
# (an anchored pattern checked with `match` took an id ending in a line break).
MESSAGE_ID: Final = re.compile(r"[A-Za-z0-9_-]{1,64}")
# `<channel>:<chat_id>[:<thread_id>]`; the service checks the channel's own id rules.
ORIGIN: Final = re.compile(
    r"[a-z][a-z0-9_-]{0,31}:-?[A-Za-z0-9_.@-]{1,128}(:[A-Za-z0-9_.@-]{1,64})?"
)
_LABEL_CHARS: Final = 64
NAME_CHARS: Final = 64  # `from.name` as the service writes it (`shown_name`)
_BIDI: Final = re.compile(f"[{BIDI_CHARS}]")

Kind = Literal["message", "wake"]


@dataclass(frozen=True)
class Message:
    """One queued text, as parsed from its file."""

    id: str
    kind: Kind
    text: str
    channel: str | None
    chat_id: str | None
    thread_id: str | None
    user: str | None
    origin: str | None
    queued_at: str
    name: str | None = None  # `from.name`: a name the message shows, never an id

    def summary(self) -> dict[str, Any]:
        """The JSON shape `taskcard inbox --json` and the `inbox` MCP tool answer with (the
        text, the user and the name without their tag characters, direction characters
        shown as code points, as `frame` quotes the text: another program may have queued
        anything)."""
        return {
            "id": self.id,
            "kind": self.kind,
            "text": show_bidi(drop_hidden_tags(self.text)),
            "from": {
                "channel": self.channel,
                "chat_id": self.chat_id,
                "thread_id": self.thread_id,
                "user": None if self.user is None else show_bidi(drop_hidden_tags(self.user)),
                "name": None if self.name is None else shown_name(self.name),
            },
            "origin": self.origin,
            "queued_at": self.queued_at,
            "framed": frame(self),
        }


class MessageError(ValueError):
    """A message file that does not follow the contract; the text names the field."""


def _optional_str(data: dict[str, Any], key: str, where: str) -> str | None:
    value = data.get(key)
    if value is None or (isinstance(value, str) and len(value) <= 256):
        return value
    raise MessageError(f"{where}{key}: must be text of at most 256 characters or null")


def parse_message(raw: bytes, expected_id: str) -> Message:
    """The message in `raw` (the file named `<expected_id>.json`); raises `MessageError`."""
    if len(raw) > MAX_MESSAGE_BYTES:
        raise MessageError(f"over {MAX_MESSAGE_BYTES} bytes; the service never writes that")
    try:
        data = json.loads(raw.decode("utf-8"))
        # A `\ud800` escape is valid JSON but no UTF-8: framing or printing it would fail.
        json.dumps(data, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:  # a ValueError too: caught first
        raise MessageError("holds a lone surrogate escape (\\ud800), not UTF-8 text") from None
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise MessageError("not UTF-8 JSON") from None
    if not isinstance(data, dict):
        raise MessageError("not a JSON object")
    if data.get("v") != VERSION:
        raise MessageError(f"v: must be {VERSION}, got {data.get('v')!r}")
    ident = data.get("id")
    if ident != expected_id:
        raise MessageError("id: must equal the file name without .json")
    kind = data.get("kind")
    if kind not in KINDS:
        raise MessageError(f"kind: must be one of {', '.join(KINDS)}")
    text = data.get("text")
    if not isinstance(text, str) or not shows_text(text):
        raise MessageError("text: must show text (not only white space or invisible characters)")
    sender = data.get("from")
    if sender is None and kind == "wake":
        sender = {}
    if not isinstance(sender, dict):
        raise MessageError("from: must be an object with channel, chat_id, thread_id, user")
    channel = _optional_str(sender, "channel", "from.")
    chat_id = _optional_str(sender, "chat_id", "from.")
    if kind == "message" and (channel is None or chat_id is None):
        raise MessageError("from.channel, from.chat_id: required for a person's message")
    origin = data.get("origin")
    if origin is not None and not (isinstance(origin, str) and ORIGIN.fullmatch(origin)):
        raise MessageError("origin: must be <channel>:<chat_id>[:<thread_id>] or null")
    queued_at = data.get("queued_at")
    if not isinstance(queued_at, str) or len(queued_at) > 64:
        raise MessageError("queued_at: must be an ISO-8601 UTC time")
    return Message(
        id=expected_id,
        kind=kind,
        text=text,
        channel=channel,
        chat_id=chat_id,
        thread_id=_optional_str(sender, "thread_id", "from."),
        user=_optional_str(sender, "user", "from."),
        origin=origin,
        queued_at=queued_at,
        name=_optional_str(sender, "name", "from."),
    )


def show_bidi(text: str) -> str:
    """`text` with each bidirectional formatting character (the embeddings, overrides and
    isolates U+202A..U+202E and U+2066..U+2069, the marks U+200E, U+200F and U+061C) written
    as its code point, `<U+202E>`, and everything else as written. Invisible in the text a
    person sent, they would reorder what the agent reads around them: the frame's words
    ("from ... in ...") after an override, or the text itself (`txt.exe` shown as `exe.txt`).
    The service writes a person's text so (a file another program queued, or an older
    service, is shown so by `frame`); the agent still sees that they were there."""
    return _BIDI.sub(lambda found: f"<U+{ord(found.group()):04X}>", text)


def shown_name(name: str) -> str:
    """`name`, a name a chat member chose (a channel post's signature), as `from.name`
    holds it: cleaned as the text is (tag characters left out, direction characters shown
    as code points, `show_bidi`) and cut to `NAME_CHARS` characters, a cut one ending in
    "…", never inside a code point's `<U+202E>`."""
    shown = [show_bidi(char) for char in drop_hidden_tags(name)]
    if sum(map(len, shown)) <= NAME_CHARS:
        return "".join(shown)
    kept: list[str] = []
    room = NAME_CHARS - 1
    for part in shown:
        if len(part) > room:
            break
        kept.append(part)
        room -= len(part)
    return "".join(kept) + "…"


def label(value: str | None, fallback: str) -> str:
    """A one-line, bounded name for the frame: no control or direction characters."""
    return one_line_cut(value or "", _LABEL_CHARS) or fallback


def frame(message: Message) -> str:
    """The text as the agent reads it: who sent it, from where, then the text quoted.

    Every line of the text starts with `> `, so a text cannot end the quote and pose as a
    second frame or as an instruction of the agent's own operator. Unicode tag characters
    are left out: invisible to the person who pasted the text, they spell words the model
    reads ("ASCII smuggling"); bidirectional formatting is shown as code points
    (`show_bidi`).
    """
    lines = escape_controls(show_bidi(drop_hidden_tags(message.text))).splitlines() or [""]
    quoted = "\n".join(f"> {line}" for line in lines)
    if message.kind == "wake":
        when = label(message.queued_at, "?")
        return f"Notice from taskcard (the service, not a person), queued {when}:\n{quoted}"
    if message.user:
        who = label(message.user, "someone")
    elif message.name and (shown := label(shown_name(message.name), "")):
        # A name is no id: said to be one, so that a post signed "5551234" does not read
        # as the person with that id.
        who = f'"{shown}" (a name the message shows, not a user id)'
    else:
        who = "someone"
    where = f"{label(message.channel, 'a')} chat {label(message.chat_id, '?')}"
    if message.thread_id:
        where += f" (thread {label(message.thread_id, '?')})"
    return f"Message from {who} in {where}, sent to you through taskcard:\n{quoted}"
