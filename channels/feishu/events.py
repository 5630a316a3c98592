"""Feishu event payloads: decryption, verification, command parsing and duplicate ids.

Pure functions and one small value-holding class, shared by the HTTP callback endpoint and
the long connection, so both paths turn the same event into the same `IncomingCommand`.

Feishu's callback rules we implement:
- an encrypted body is `{"encrypt": base64}`: AES-256-CBC, key = SHA-256 of the encrypt
  key, IV = the first 16 bytes, PKCS#7 padding (lark-oapi's `AESCipher` does this);
- with an encrypt key, every event request carries `X-Lark-Signature` =
  hex SHA-256 of (`X-Lark-Request-Timestamp` + `X-Lark-Request-Nonce` + key + raw body);
- the verification token is in `header.token` (schema 2.0) or `token` (URL verification);
- the same event may be delivered more than once: `header.event_id` identifies it.

In a group, a command counts only when it mentions the bot: with the permission to read all
group messages, every `/taskcard off` typed in the group would reach us, and "@Alice
/taskcard off" is addressed to Alice. Feishu writes each mention into the text as a key
(`@_user_1`) listed in `message.mentions` with the mentioned open_id; we strip only the bot's
key. A private (p2p) chat is with the bot alone and needs no mention.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from lark_oapi.core.utils.decryptor import AESCipher

from channels.base import ChatRef, CursorStore, IncomingCommand

MESSAGE_EVENT = "im.message.receive_v1"
COMMAND = "/taskcard"
PRIVATE_CHAT = "p2p"
USER_MENTION_PREFIX = "@_user_"


class EventRejected(Exception):
    """A callback request that is not from Feishu or cannot be read; answered with 4xx."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


@dataclass(frozen=True)
class DecodedEvent:
    """One readable callback: a URL verification challenge, or an event with its id."""

    challenge: str | None
    event_id: str | None
    event_type: str | None
    document: Mapping[str, Any]


def decrypt_body(raw_body: bytes, encrypt_key: str | None) -> dict[str, Any]:
    """The JSON document of a callback body, decrypted when it is `{"encrypt": ...}`."""
    try:
        outer = json.loads(raw_body)
    except ValueError:
        raise EventRejected(400, "body is not JSON") from None
    if not isinstance(outer, dict):
        raise EventRejected(400, "body is not a JSON object")
    sealed = outer.get("encrypt")
    if sealed is None:
        return outer
    if not encrypt_key:
        raise EventRejected(400, "encrypted event but no encrypt key configured")
    try:
        inner = json.loads(AESCipher(encrypt_key).decrypt_str(str(sealed)))
    except ValueError:
        raise EventRejected(400, "cannot decrypt the event") from None
    if not isinstance(inner, dict):
        raise EventRejected(400, "decrypted event is not a JSON object")
    return inner


def signature(timestamp: str, nonce: str, encrypt_key: str, raw_body: bytes) -> str:
    """The `X-Lark-Signature` Feishu computes for a callback request."""
    return hashlib.sha256((timestamp + nonce + encrypt_key).encode() + raw_body).hexdigest()


def _header(headers: Mapping[str, str], name: str) -> str | None:
    for key, value in headers.items():
        if key.lower() == name.lower():
            return value
    return None


def decode_callback(
    raw_body: bytes,
    headers: Mapping[str, str],
    verification_token: str | None,
    encrypt_key: str | None,
) -> DecodedEvent:
    """Decrypt and verify one callback request, or raise `EventRejected`."""
    document = decrypt_body(raw_body, encrypt_key)
    header = document.get("header")
    header = header if isinstance(header, dict) else {}
    is_challenge = document.get("type") == "url_verification"
    token = document.get("token") if is_challenge else header.get("token")
    if verification_token and not (
        isinstance(token, str) and hmac.compare_digest(token.encode(), verification_token.encode())
    ):
        raise EventRejected(401, "verification token mismatch")
    if is_challenge:
        return DecodedEvent(str(document.get("challenge", "")), None, None, document)
    if encrypt_key:
        stamp = _header(headers, "X-Lark-Request-Timestamp")
        nonce = _header(headers, "X-Lark-Request-Nonce")
        given = _header(headers, "X-Lark-Signature")
        if stamp is None or nonce is None or given is None:
            raise EventRejected(401, "signature headers missing")
        expected = signature(stamp, nonce, encrypt_key, raw_body)
        if not hmac.compare_digest(given.encode(), expected.encode()):
            raise EventRejected(401, "signature mismatch")
    event_id = header.get("event_id")
    event_type = header.get("event_type")
    return DecodedEvent(
        None,
        event_id if isinstance(event_id, str) else None,
        event_type if isinstance(event_type, str) else None,
        document,
    )


def command_args(text: str, mention_key: str | None = None) -> str | None:
    """The arguments of a `/taskcard` command in message text, None when it is not one.

    `mention_key` is the placeholder Feishu wrote for the bot's mention (`@_user_1`); it is
    removed first, so "@_user_1 /taskcard off" is the command `off`. Other mentions stay, so
    a command addressed to someone else ("@_user_2 /taskcard off") is not ours.
    """
    if mention_key:
        # `(?!\d)`: removing `@_user_1` must not eat the start of `@_user_12`.
        text = re.sub(re.escape(mention_key) + r"(?!\d)", " ", text)
    words = text.split()
    if not words:
        return None
    head = words[0]
    if head != COMMAND and not head.startswith(COMMAND + "@"):
        return None
    return " ".join(words[1:])


def bot_mention_key(mentions: object, bot_open_id: str | None) -> str | None:
    """The text key of the bot's mention among `message.mentions`, None when not mentioned.

    With the bot's open_id unknown (it could not be learned at start), any user mention is
    taken as the bot's: a group still needs some mention, never none.
    """
    if not isinstance(mentions, list):
        return None
    for mention in mentions:
        if not isinstance(mention, dict):
            continue
        key = mention.get("key")
        if not isinstance(key, str) or not key.startswith(USER_MENTION_PREFIX):
            continue
        ids = mention.get("id")
        open_id = ids.get("open_id") if isinstance(ids, dict) else None
        if bot_open_id is None or open_id == bot_open_id:
            return key
    return None


def command_from_event(
    document: Mapping[str, Any], bot_open_id: str | None = None
) -> IncomingCommand | None:
    """The command carried by an `im.message.receive_v1` event document, if any.

    `bot_open_id` is our bot's open_id when known; see the module docstring for mentions.
    """
    header = document.get("header")
    if not isinstance(header, dict) or header.get("event_type") != MESSAGE_EVENT:
        return None
    event = document.get("event")
    if not isinstance(event, dict):
        return None
    message = event.get("message")
    if not isinstance(message, dict) or message.get("message_type") != "text":
        return None
    chat_id = message.get("chat_id")
    if not isinstance(chat_id, str) or not chat_id:
        return None
    try:
        content = json.loads(str(message.get("content") or "{}"))
    except ValueError:
        return None
    text = content.get("text") if isinstance(content, dict) else None
    if not isinstance(text, str):
        return None
    mention_key = bot_mention_key(message.get("mentions"), bot_open_id)
    # Anything but a private chat (a group, a topic group, an unknown kind) needs a mention.
    if mention_key is None and message.get("chat_type") != PRIVATE_CHAT:
        return None
    args = command_args(text, mention_key)
    if args is None:
        return None
    sender = event.get("sender")
    sender_ids = sender.get("sender_id") if isinstance(sender, dict) else None
    open_id = sender_ids.get("open_id") if isinstance(sender_ids, dict) else None
    message_id = message.get("message_id")
    return IncomingCommand(
        chat=ChatRef(chat_id),
        args=args,
        user_id=open_id if isinstance(open_id, str) else None,
        message_id=message_id if isinstance(message_id, str) else None,
    )


class SeenEvents:
    """The most recent event ids, so a redelivered event is handled once.

    Kept in memory as an ordered set bounded to `capacity`; when a `CursorStore` is given,
    the ids are also saved there (one JSON list under `key`) so a restart does not replay
    an event Feishu redelivers shortly after.
    """

    def __init__(
        self,
        capacity: int = 512,
        cursor: CursorStore | None = None,
        key: str = "feishu:event_ids",
    ) -> None:
        self._capacity = capacity
        self._cursor = cursor
        self._key = key
        self._ids: OrderedDict[str, None] = OrderedDict()
        if cursor is not None:
            self._load(cursor.get_cursor(key))

    def _load(self, saved: str | None) -> None:
        if not saved:
            return
        try:
            ids = json.loads(saved)
        except ValueError:
            return
        if isinstance(ids, list):
            for event_id in ids[-self._capacity :]:
                if isinstance(event_id, str):
                    self._ids[event_id] = None

    def first_time(self, event_id: str) -> bool:
        """Record `event_id`; True when it had not been seen before."""
        if event_id in self._ids:
            return False
        self._ids[event_id] = None
        while len(self._ids) > self._capacity:
            self._ids.popitem(last=False)
        if self._cursor is not None:
            self._cursor.set_cursor(self._key, json.dumps(list(self._ids)))
        return True
