"""Feishu event payloads: decryption, verification, command parsing and duplicate ids.

Pure functions and one small value-holding class, shared by the HTTP callback endpoint and
the long connection, so both paths turn the same event into the same `IncomingCommand`.

Feishu's callback rules we implement:
- an encrypted body is `{"encrypt": base64}`: AES-256-CBC, key = SHA-256 of the encrypt
  key, IV = the first 16 bytes, PKCS#7 padding (lark-oapi's `AESCipher` does this);
- with an encrypt key, every event request carries `X-Lark-Signature` =
  hex SHA-256 of (`X-Lark-Request-Timestamp` + `X-Lark-Request-Nonce` + key + raw body);
- the verification token is in `header.token` (schema 2.0) or `token` (URL verification,
  schema 1.0 events);
- the same event may be delivered more than once: `header.event_id` identifies it.

Replays: a captured signed request stays valid forever as far as the signature goes, so the
signed `X-Lark-Request-Timestamp` must lie within a window of now (`check_request_age`), and
every event is remembered for a duration, not a count (`SeenEvents`, persisted): a replay
inside the age window is a duplicate, one outside it is stale. An event without
`header.event_id` is identified by its schema 1.0 `uuid`, else by a hash of its decrypted
document, and de-duplicated the same way (`duplicate_key`).

In a group, a command counts only when it mentions the bot: with the permission to read all
group messages, every `/taskcard off` typed in the group would reach us, and "@Alice
/taskcard off" is addressed to Alice. Feishu writes each mention into the text as a key
(`@_user_1`) listed in `message.mentions` with the mentioned open_id; we strip only the bot's
key. A private (p2p) chat is with the bot alone and needs no mention.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import logging
import math
import re
import time
import unicodedata
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from lark_oapi.core.utils.decryptor import AESCipher

from taskcard.channels.base import (
    TASKCARD_WORDS,
    ChatRef,
    CommandName,
    CursorStore,
    IncomingCommand,
    command_arguments,
    command_readings,
    command_to_mentioned,
    drop_leading,
    first_word,
    folded,
    folding_pattern,
    other_bots_command,
    shown,
    shows_reordered,
)
from taskcard.channels.feishu.content import ALL_MENTION_KEY, MessageText, message_text

MESSAGE_EVENT = "im.message.receive_v1"
COMMAND = "/taskcard"
FULL_WIDTH_SLASH = "\uff0f"  # ／
TELL = "/tell"
PRIVATE_CHAT = "p2p"
APP_SENDER = "app"  # `sender.sender_type` of a message an app (a bot) sent
USER_MENTION_PREFIX = "@_user_"
# How a mention of everyone in the chat reads when Feishu gives it no name (the Chinese
# client shows "@所有人", which is its name when it is listed).
ALL_MENTION_SHOWN = "@all"
# An `X-Lark-Request-Timestamp` above this is milliseconds: as seconds it would be past the
# year 5000, as milliseconds it is any time after 1973.
MILLISECOND_STAMPS_ABOVE = 1e11

log = logging.getLogger(__name__)


class EventNotRecorded(Exception):
    """An event that could not be recorded as seen (the state store failed); nothing of it
    was kept. It must not be acknowledged: Feishu delivers an event again until it is."""


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


def read_json_object(raw: bytes, what: str = "body") -> dict[str, Any]:
    """The JSON object `raw` holds, or `EventRejected` (400) saying what is wrong with it.

    Feishu sends UTF-8 JSON objects only. Everything else is refused here, once, for every
    path an event comes in by: bytes that are not UTF-8, text that is not JSON or nests
    deeper than the parser goes, a JSON value that is not an object, and a `\\u` escape of a
    lone surrogate (valid JSON, but no text: it cannot be encoded again, so the token check,
    the duplicate hash and every later write of the text would fail on it).
    """
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise EventRejected(400, f"{what} is not UTF-8 text") from None
    try:
        document = json.loads(text)
    except RecursionError:
        raise EventRejected(400, f"{what} nests JSON too deeply") from None
    except ValueError:
        raise EventRejected(400, f"{what} is not JSON") from None
    if not isinstance(document, dict):
        raise EventRejected(400, f"{what} is not a JSON object")
    try:
        json.dumps(document, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        raise EventRejected(400, f"{what} holds an escaped lone surrogate (not text)") from None
    except RecursionError:
        raise EventRejected(400, f"{what} nests JSON too deeply") from None
    return document


def decrypt_body(raw_body: bytes, encrypt_key: str | None) -> dict[str, Any]:
    """The JSON document of a callback body, decrypted when it is `{"encrypt": ...}`."""
    outer = read_json_object(raw_body)
    sealed = outer.get("encrypt")
    if sealed is None:
        return outer
    if not encrypt_key:
        raise EventRejected(400, "encrypted event but no encrypt key configured")
    if not isinstance(sealed, str):
        raise EventRejected(400, "cannot decrypt the event: `encrypt` is not a string")
    try:
        plain = AESCipher(encrypt_key).decrypt(base64.b64decode(sealed))
    except ValueError:
        raise EventRejected(400, "cannot decrypt the event") from None
    return read_json_object(plain, "decrypted event")


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
    # Schema 2.0 events carry the token in their header; the URL verification and events of
    # schema 1.0 (no `schema` field, an `uuid`, the event's fields under `event`) at the top.
    legacy = "schema" not in document
    token = document.get("token") if is_challenge or legacy else header.get("token")
    if verification_token and not (
        isinstance(token, str) and hmac.compare_digest(token.encode(), verification_token.encode())
    ):
        raise EventRejected(401, "verification token mismatch")
    if is_challenge:
        challenge = document.get("challenge", "")
        if not isinstance(challenge, str):
            raise EventRejected(400, "url_verification: `challenge` is not a string")
        return DecodedEvent(challenge, None, None, document)
    if encrypt_key:
        stamp = _header(headers, "X-Lark-Request-Timestamp")
        nonce = _header(headers, "X-Lark-Request-Nonce")
        given = _header(headers, "X-Lark-Signature")
        if stamp is None or nonce is None or given is None:
            raise EventRejected(401, "signature headers missing")
        # Feishu writes them in ASCII; the server hands other bytes on as surrogates, which
        # cannot be hashed (the check answered 500 and logged a traceback).
        if not (stamp.isascii() and nonce.isascii() and given.isascii()):
            raise EventRejected(401, "signature headers are not ASCII")
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


def check_request_age(stamp: str | None, now_s: float, max_age_s: float, skew_s: float) -> None:
    """Raise `EventRejected` unless `stamp` (epoch seconds, or milliseconds: see
    `MILLISECOND_STAMPS_ABOVE`) is at most `max_age_s` old and at most `skew_s` in the
    future, with `skew_s` of slack on the old side too (clocks differ)."""
    if stamp is None:
        raise EventRejected(401, "request timestamp missing")
    # ASCII digits only: `float` also reads other scripts' digits ("١٧٠٠٠٠٠٠٠٠").
    if not stamp.isascii():
        raise EventRejected(401, "request timestamp is not a number")
    try:
        sent_s = float(stamp.strip())
    except ValueError:
        raise EventRejected(401, "request timestamp is not a number") from None
    if not math.isfinite(sent_s):
        raise EventRejected(401, "request timestamp is not a number")
    if sent_s > MILLISECOND_STAMPS_ABOVE:
        # Feishu's pages name the header but not its unit: seconds as Feishu sends it, and
        # milliseconds as its events' own `create_time` are written, told apart by size.
        sent_s /= 1000.0
    age_s = now_s - sent_s
    if age_s > max_age_s + skew_s:
        raise EventRejected(401, "request timestamp too old (replayed or delayed)")
    if age_s < -skew_s:
        raise EventRejected(401, "request timestamp in the future")


def duplicate_key(decoded: DecodedEvent) -> str:
    """What identifies one event for de-duplication: its event id, the schema 1.0 `uuid`,
    or else a hash of the decrypted document (a redelivery carries the same document)."""
    if decoded.event_id:
        return decoded.event_id
    uuid = decoded.document.get("uuid")
    if isinstance(uuid, str) and uuid:
        return "uuid:" + uuid
    canonical = json.dumps(decoded.document, sort_keys=True, ensure_ascii=False)
    # `surrogatepass`: a document `read_json_object` did not vet must not fail here either.
    return "sha256:" + hashlib.sha256(canonical.encode("utf-8", "surrogatepass")).hexdigest()


# A mention of one user or app (not of everyone): after a leading one of the bot is taken
# out, one leading a command addresses someone else.
_USER_PLACEHOLDER = re.compile(f"{re.escape(USER_MENTION_PREFIX)}[0-9]+")
# Feishu's placeholder for a mention in a message's text: of a user or a bot (`@_user_2`,
# whether or not the mention carries an open_id), or of everyone (`@_all`).
_PLACEHOLDER = re.compile(f"(?:{re.escape(USER_MENTION_PREFIX)}[0-9]+|{ALL_MENTION_KEY})(?!\\w)")


def mentions_pattern(keys: tuple[str, ...]) -> re.Pattern[str] | None:
    """The placeholders `keys` (`@_user_1`) as one pattern, None for none. `(?!\\d)`:
    removing `@_user_1` must not eat the start of `@_user_12`."""
    if not keys:
        return None
    alternatives = "|".join(re.escape(key) for key in sorted(keys, key=len, reverse=True))
    # Several glued together ("@_user_1@_user_2", both the bot's) are one run of them.
    return re.compile(f"(?:(?:{alternatives})(?!\\d))+")


def _name_typed(bot_name: str | None) -> tuple[str, bool] | None:
    """The app's name typed after an `@` (a pattern's source, see `typed_name_of`) with
    nothing after it, and whether it ends in a CJK character (wide or full-width), after
    which a person glues the next word; None without a name."""
    words = shown(bot_name or "").split()
    if not words:
        return None
    name = "(?i:@" + "\\s+".join(re.escape(word) for word in words) + ")"
    return name, unicodedata.east_asian_width(words[-1][-1]) in ("W", "F")


def typed_name_of(bot_name: str | None) -> str | None:
    """The app's name typed after an `@` (a pattern's source), as a person writes it without
    picking the mention from the list: then Feishu lists no mention and the text keeps the
    name as typed. Any case, its words apart by any white space (`@task  card` for "Task
    Card"), and not the start of a longer word (`@Task Cards` names another app). None
    without a name.

    A name ending in a CJK character (`任务卡片`) is also read with an option of `/taskcard`
    glued after it (`/taskcard@任务卡片off`, `TASKCARD_WORDS`): Chinese and Japanese text
    has no spaces, so a person types none there. The option is read as every option is
    (`folded`: `任务卡片ＯＦＦ` typed full-width is `off`). Only an option, a whole word: a
    longer name (`任务卡片助手`, `任务卡片Pro`, `任务卡片Ｐｒｏ`) is still another app's. (An
    agent's name glued after it is read by `tell_glued_to_name`.)"""
    typed = _name_typed(bot_name)
    if typed is None:
        return None
    name, cjk = typed
    if not cjk:
        return name + "(?!\\w)"
    options = "|".join(folding_pattern(word) for word in sorted(TASKCARD_WORDS, key=len)[::-1])
    return name + f"(?:(?!\\w)|(?=(?:{options})(?!\\w)))"


# An agent's name as `folded` reads it (`bridge.config.AGENT_ID_PATTERN`, case folded): what
# may follow a CJK app's name glued in a `/tell` (`tell_glued_to_name`).
_FOLDED_AGENT = re.compile(r"[a-z0-9][a-z0-9_.-]{0,63}")


def tell_glued_to_name(
    text: str, mention_keys: tuple[str, ...], bot_name: str | None
) -> str | None:
    """The arguments of `/tell@NAMEAGENT TEXT`, where NAME is the app's name ending in a CJK
    character and AGENT a word glued after it that could be an agent's name (`folded`, it is
    one: ASCII letters, digits, `_`, `.`, `-`, typed full-width too): `/tell@任务卡片builder
    hi` is `builder hi`, as Chinese text has no space after the name. None for any other
    text. It may as well be a command to another app whose name is longer than ours
    (`任务卡片Pro`): the command says so (`IncomingCommand.agent_glued`), and the service
    takes it only when AGENT names an agent of the chat."""
    typed = _name_typed(bot_name)
    if typed is None or not typed[1]:
        return None
    mention = addressing_pattern(mention_keys, bot_name)
    if mention is not None:
        text = drop_leading(text, mention)
    name = re.compile(typed[0])
    for command, glued, rest in command_readings(text, "/" + FULL_WIDTH_SLASH):
        if "/" + command.lower() != TELL:
            continue
        after = glued + rest
        found = name.match(after)
        if found is None or found.end() == len(after) or after[found.end()].isspace():
            continue
        after = after[found.end() :]
        agent = first_word(after)[0].partition("@")[0]  # "builder@任务卡片": the bot again
        if _FOLDED_AGENT.fullmatch(folded(agent)) is None:
            continue
        return command_arguments(after, tell=True, bot=mention)
    return None


def addressing_pattern(keys: tuple[str, ...], bot_name: str | None) -> re.Pattern[str] | None:
    """The bot's mentions, picked (their placeholders `keys`, see `mentions_pattern`) or its
    name typed (`typed_name_of`), once or more, glued or not: what addresses a command to
    this app, as Telegram reads `@ThisBot` typed. None for neither."""
    picked = mentions_pattern(keys)
    typed = typed_name_of(bot_name)
    alternatives = [found for found in (picked and picked.pattern, typed) if found]
    if not alternatives:
        return None
    return re.compile("(?:" + "|".join(f"(?:{one})" for one in alternatives) + ")+")


def command_args(
    text: str,
    mention_key: str | tuple[str, ...] | None = None,
    command: str = COMMAND,
    bot_name: str | None = None,
) -> str | None:
    """The arguments of a `/taskcard` command in message text, None when it is not one.

    `mention_key` is the placeholder Feishu wrote for the bot's mention (`@_user_1`), or
    those of each time the message mentions the bot (each mention has its own); they are
    removed first, so "@_user_1 /taskcard off @_user_2" is the command `off` when both
    name the bot. Other mentions stay, so
    a command addressed to someone else ("@_user_2 /taskcard off", "/taskcard@_user_2 off",
    "/taskcard@OtherBot off") is not ours. `/taskcard@Name` names us when Name is the app's
    name `bot_name` (case-insensitive, as Telegram compares usernames; with its spaces when it
    has some, `/taskcard@Task Card off`), or is the bot's mention picked after the `@`.
    In a `/tell` only the mention that addresses it goes (leading the message, right after
    the command word, or glued to it, `/tell@_user_1`); one inside the text for the agent
    stays, for `named_mentions` to write as the bot's name.
    """
    tell = command == TELL
    keys = (mention_key,) if isinstance(mention_key, str) else mention_key or ()
    # The app's name typed after an `@` addresses the command as its picked mention does.
    mention = addressing_pattern(keys, bot_name)
    if mention is not None:
        text = drop_leading(text, mention) if tell else mention.sub(" ", text)
    # The command reads as it shows: invisible characters a client pasted around or between
    # its words change nothing, and one glued to the command word ends it
    # (`channels.base.command_readings`). A full-width slash is the slash a Chinese input
    # method types in full-width mode; Feishu marks no commands of its own, so it opens one
    # here (not on Telegram, which marks no command there). "/TaskCard" too, as on
    # Telegram, and the command word ends where Telegram ends one
    # (`channels.base.command_word`): "/tell😀 builder" is `/tell`, "/taskcard,off" is
    # `/taskcard` with ",off", which the service answers as an unknown option.
    for name, glued, rest in command_readings(text, "/" + FULL_WIDTH_SLASH):
        if "/" + name.lower() != command:
            continue
        # "/taskcard@" with no name after the sign is no command (`command_word`), as
        # Telegram marks none there.
        if not glued.startswith("@"):
            rest = glued + rest
        else:
            # "/taskcard@OtherBot" (or the command glued to another mention,
            # "/taskcard@_user_2") is addressed to someone else, as on Telegram; our own
            # mention was removed above.
            after = _addressed(glued, rest, keys, bot_name)
            if after is None:
                continue
            rest = after
        if mention is not None and tell:
            rest = _without_glued(drop_leading(rest, mention), mention)
        if not tell:
            # A mention is one wherever it was typed, also glued to the word before it
            # ("off@_user_2"): an option with a mention is answered as such, never as an
            # unknown option. The text for an agent keeps it as typed.
            rest = _PLACEHOLDER.sub(lambda found: f" {found.group(0)} ", rest)
        # The text for the agent keeps its line breaks: only the command word goes, and
        # the bot's mention glued to the agent's name ("builder@_user_1").
        return command_arguments(rest, tell=tell, bot=mention)
    return None


def _without_glued(rest: str, mention: re.Pattern[str]) -> str:
    """`rest` (a `/tell`'s agent name and text) without the bot's mention glued to the end
    of the agent's name (`builder@_user_1 hi`, or the name typed, `builder@Task Card hi`,
    whose words `command_arguments`, reading the first word alone, would not see). No
    agent's id holds an `@`: the name ends at the first one."""
    name = re.match(r"\s*[^\s@]+", rest)
    if name is None or (glued := mention.match(rest, name.end())) is None:
        return rest
    return rest[: name.end()] + rest[glued.end() :]


def _addressed(glued: str, rest: str, keys: tuple[str, ...], bot_name: str | None) -> str | None:
    """What follows `/command@NAME...` (`glued`, the part of the first word from the `@`,
    then `rest`) when NAME is this bot (one of its mention's `keys`, or its name, see
    `_after_bot_name`); None when it names someone else. The bot named again right after,
    glued or after white space (`/tell@_user_1@_user_2`, both its mentions, `/taskcard@Name
    @Name`, or a name with spaces typed twice, `/taskcard@Task Card@Task Card`), goes too, as
    Telegram reads `/taskcard@ThisBot @ThisBot off`; someone else named after it stays in the
    arguments, answered there as a mention, as Telegram marks `/taskcard@ThisBot@Other` a
    command to this bot."""
    named = False
    while True:
        pieces = glued[1:].split("@")
        count = 0
        after_name = rest
        for index, piece in enumerate(pieces):
            addressee, last = shown(piece), index == len(pieces) - 1
            if "@" + addressee in keys:
                count += 1
                continue
            # A name with spaces ("Task Card") goes on in the next words: only the last piece.
            after = _after_bot_name(addressee, rest if last else "", bot_name)
            if after is None or not (last or after == ""):
                break
            count += 1
            if last:
                after_name = after
        if count == 0:
            return (glued + rest) if named else None
        named = True
        left = pieces[count:]
        if left:
            return "@" + "@".join(left) + after_name
        # The name's last word glued to another `@` ("Card@Task Card"), or the bot named
        # again as the next word: read that as an address too, else the text as it is.
        word, then = first_word(after_name)
        if not word.startswith("@"):
            return after_name
        glued, rest = word, then


def _after_bot_name(addressee: str, rest: str, bot_name: str | None) -> str | None:
    """What follows `/taskcard@NAME` when NAME is the app's name `bot_name`, else None.

    An app's name may hold spaces ("Task Card"), which a person types as they show: then its
    later words are the next words of the text ("/taskcard@Task Card off"). Compared as the
    words show, case-insensitively. The name's last word may be glued to another `@` ("Card@
    Task Card" of the app named twice): what follows starts there.
    """
    if bot_name is None:
        return None
    wanted = shown(bot_name).casefold().split()
    if not wanted or addressee.casefold() != wanted[0]:
        return None
    for index, word in enumerate(wanted[1:], start=2):
        typed, rest = first_word(rest)
        if typed.casefold() == word:
            continue
        head, at, tail = typed.partition("@")
        if index == len(wanted) and at and head.casefold() == word:
            return at + tail + rest
        return None
    return rest


def _for_another_bot(text: str, bot_name: str | None) -> bool:
    """Whether `text` starts with a command addressed to someone else (`/start@OtherBot`,
    `/help@_user_2`): written as a reply to one of our messages, it is still not for us."""
    head, rest = first_word(text)
    return other_bots_command(head, lambda name: _after_bot_name(name, rest, bot_name) is not None)


def _with_title(written: MessageText, name: CommandName, args: str) -> str:
    """The arguments of a `/tell` or a reply with a post's title put back as the first line
    of the text for the agent (the title is part of what the person wrote, only not of the
    command): after the agent's name in a `/tell`, which the service reads first."""
    if name != "tell":
        return written.with_title(args)
    agent, *text = args.split(maxsplit=1) or [""]
    if not agent or not written.title.strip():
        return args  # no agent named (the service answers how to write it), or no title
    return f"{agent} {written.with_title(text[0] if text else '')}".rstrip()


def named_mentions(text: str, mentions: object) -> str:
    """`text` with each mention's placeholder written as `@` and the name Feishu gives for
    it, as the person saw it typed: `@_user_2` as `@Alice`, and the mention of everyone,
    `@_all`, as its name when listed (`@所有人`) and `@all` when not (Feishu does not always
    list it); a user mention without a name stays as is.

    For the text an agent reads (`/tell`, a reply): a Telegram text keeps `@alice` as typed,
    and a placeholder means nothing to the agent.
    """
    if USER_MENTION_PREFIX not in text and ALL_MENTION_KEY not in text:
        return text
    names: dict[str, str] = {ALL_MENTION_KEY: ALL_MENTION_SHOWN}
    for mention in mentions if isinstance(mentions, list) else ():
        if not isinstance(mention, dict):
            continue
        key, name = mention.get("key"), mention.get("name")
        named = isinstance(key, str) and key.startswith(USER_MENTION_PREFIX)
        if (named or key == ALL_MENTION_KEY) and isinstance(name, str):
            shown = " ".join(name.split())[:64]
            if shown:
                names[str(key)] = "@" + shown.removeprefix("@")
    pattern = "|".join(re.escape(key) for key in sorted(names, key=len, reverse=True))
    # A placeholder is a whole ASCII token: `@_user_1` must not match the start of
    # `@_user_12`, nor `@_all` the start of a typed `@_allison`; text in other scripts may
    # follow it directly (`@_all请看`).
    return re.sub(f"(?:{pattern})(?![0-9A-Za-z_])", lambda found: names[found.group(0)], text)


def bot_mention_key(mentions: object, bot_open_id: str | None) -> str | None:
    """The text key of the bot's (first) mention among `message.mentions`, None when not
    mentioned (see `bot_mention_keys`)."""
    keys = bot_mention_keys(mentions, bot_open_id)
    return keys[0] if keys else None


def bot_mention_keys(mentions: object, bot_open_id: str | None) -> tuple[str, ...]:
    """The text keys of the bot's mentions among `message.mentions` (Feishu gives each
    mention its own, also a second one of the same bot: "@bot /taskcard off @bot"), none
    when not mentioned.

    With the bot's open_id unknown (it could not be learned at start), the first user
    mention is taken as the bot's, and so is every other mention of the same open_id (the
    bot mentioned twice, "@Task Card @Task Card /taskcard off"): a group still needs some
    mention, never none. A first mention without an open_id stands alone.
    """
    keys: list[str] = []
    if not isinstance(mentions, list):
        return ()
    for mention in mentions:
        if not isinstance(mention, dict):
            continue
        key = mention.get("key")
        if not isinstance(key, str) or not key.startswith(USER_MENTION_PREFIX):
            continue
        ids = mention.get("id")
        open_id = ids.get("open_id") if isinstance(ids, dict) else None
        if bot_open_id is None:
            if not isinstance(open_id, str) or not open_id:
                return (key,)
            bot_open_id = open_id
        if open_id == bot_open_id:
            keys.append(key)
    return tuple(keys)


def replied_message(message: Mapping[str, Any]) -> tuple[str, ...]:
    """The message `message` replies to, as a 1-tuple (empty when it replies to none).

    That is `parent_id`. `root_id` names the first message of the reply chain: a reply to
    someone's reply to the bot's card has the card as its root, yet answers that person, as
    on Telegram, where it names the person's message. Inside a topic both name the topic's
    root. `root_id` stands in only when `parent_id` is missing.
    """
    for key in ("parent_id", "root_id"):
        value = message.get(key)
        if isinstance(value, str) and value:
            return (value,)
    return ()


def command_from_event(
    document: Mapping[str, Any], bot_open_id: str | None = None, bot_name: str | None = None
) -> IncomingCommand | None:
    """The command carried by an `im.message.receive_v1` event document, if any.

    `bot_open_id` and `bot_name` are our bot's open_id and name when known; see the module
    docstring for mentions.
    """
    header = document.get("header")
    if not isinstance(header, dict) or header.get("event_type") != MESSAGE_EVENT:
        return None
    event = document.get("event")
    if not isinstance(event, dict):
        event = {}
    message = event.get("message")
    if not isinstance(message, dict):
        _missing("event.message", "an object")
        return None
    chat_id = message.get("chat_id")
    if not isinstance(chat_id, str) or not chat_id:
        _missing("event.message.chat_id", "a chat id")
        return None
    sender = event.get("sender")
    if isinstance(sender, dict) and sender.get("sender_type") == APP_SENDER:
        # Another app's bot is no one's command, as on Telegram, where bots never see each
        # other's messages: its "/tell" must not reach an agent.
        return None
    # Plain and rich (`post`) messages alike: a command typed in the rich editor counts. It
    # is read from the body, as a person sees it: a post's title is a heading above it.
    written = message_text(message.get("message_type"), message.get("content"))
    if written is None:
        # A picture, sticker or file (no words): only as a reply can it be to an agent,
        # which gets no text from it, so the person is told (as on Telegram).
        if not replied_message(message) or not isinstance(message.get("message_type"), str):
            return None
        written = MessageText("")
    text = written.body
    mention_keys = bot_mention_keys(message.get("mentions"), bot_open_id)
    name: CommandName = "taskcard"
    reply_to = replied_message(message)
    # Anything but a private chat (a group, a topic group, an unknown kind) needs a mention
    # for a command, picked or the app's name typed (`@Task Card /taskcard off`, which
    # Feishu lists as no mention); a reply names the message it answers, which the
    # service matches.
    typed = typed_name_of(bot_name)
    addressed = (
        bool(mention_keys)
        or (typed is not None and re.search(typed, text) is not None)
        or message.get("chat_type") == PRIVATE_CHAT
    )
    # A reply addresses the message it answers: a command written as a reply to one of the
    # bot's messages is the bot's, as on Telegram (the service checks that the message
    # replied to is one of its own, and ignores the command otherwise).
    commanded = addressed or bool(reply_to)
    args = command_args(text, mention_keys, COMMAND, bot_name) if commanded else None
    if args is None and commanded:
        name, args = "tell", command_args(text, mention_keys, TELL, bot_name)
    # "/tell@任务卡片builder hi": the name typed addresses it, with the agent's glued after.
    agent_glued = False
    if args is None and (glued := tell_glued_to_name(text, mention_keys, bot_name)) is not None:
        name, args, agent_glued, addressed = "tell", glued, True, True
    if args is None:
        if not reply_to:
            return None
        name = "reply"
        # Only a mention leading the reply addresses it; one in the text is the person's.
        if (mention := addressing_pattern(mention_keys, bot_name)) is not None:
            text = drop_leading(text, mention)
        args = text.strip()
        if _for_another_bot(args, bot_name) or command_to_mentioned(args, _USER_PLACEHOLDER):
            return None  # "/start@OtherBot", "@OtherApp /taskcard off": someone else's
    if name != "taskcard":
        args = named_mentions(_with_title(written, name, args), message.get("mentions"))
    sender_ids = sender.get("sender_id") if isinstance(sender, dict) else None
    open_id = sender_ids.get("open_id") if isinstance(sender_ids, dict) else None
    message_id = message.get("message_id")
    # A message in a topic (of a topic group) or in a reply thread carries the thread's id;
    # its answers are posted as replies in that thread (Telegram: the forum topic).
    thread_id = message.get("thread_id")
    in_thread = isinstance(thread_id, str) and bool(thread_id)
    return IncomingCommand(
        chat=ChatRef(chat_id),
        args=args,
        user_id=open_id if isinstance(open_id, str) else None,
        message_id=message_id if isinstance(message_id, str) and message_id else None,
        command=name,
        reply_to=reply_to if name == "reply" or not addressed else (),
        message_thread=thread_id if in_thread else None,
        in_thread=in_thread and bool(reply_to) and _threads_root(message) == reply_to[0],
        reordered=name != "reply" and shows_reordered(text),
        agent_glued=agent_glued,
    )


def _missing(field: str, kind: str) -> None:
    """Say that a message event came without `field`: Feishu always sends it, so the event
    is malformed (a changed format, or a request that is not Feishu's) and cannot be
    answered. Worded alike for every such event, with nothing of the request in it (no id,
    no text, no token), so the log's repeat limit holds a flood back."""
    log.warning(
        "feishu message event without %s (%s): ignored; Feishu sends one with every message,"
        " so the event is not in the format this version reads",
        field,
        kind,
    )


def _threads_root(message: Mapping[str, Any]) -> str | None:
    """The root a message written in a thread names when it replies to no message of the
    thread in particular: Feishu then gives the root as both `parent_id` and `root_id`
    (quoting a message of the thread names that one as `parent_id`). None otherwise."""
    parent, root = message.get("parent_id"), message.get("root_id")
    if isinstance(root, str) and root and parent in (root, "", None):
        return root
    return None


class SeenEvents:
    """Events seen within the last `window_s`, so a redelivered or replayed event is handled once.

    Kept by time, not by count: a burst of other events cannot push an id out early. With a
    `CursorStore` the ids are saved in buckets of `BUCKET_S` seconds (one JSON object of
    id -> first-seen epoch per bucket), so a write rewrites only the current bucket and a
    restart still knows the whole window. `max_entries` only bounds memory against a flood:
    beyond it the oldest ids go first, which the request-age check already makes stale unless
    that many events arrived within its window.
    """

    BUCKET_S = 600

    def __init__(
        self,
        window_s: float = 86_400.0,
        cursor: CursorStore | None = None,
        key: str = "feishu:seen_events",
        *,
        clock: Callable[[], float] = time.time,
        max_entries: int = 200_000,
    ) -> None:
        self._window_s = window_s
        self._cursor = cursor
        self._key = key
        self._clock = clock
        self._max_entries = max_entries
        self._seen: OrderedDict[str, float] = OrderedDict()
        self._bucket: tuple[int, dict[str, float]] | None = None
        if cursor is not None:
            self._load(cursor)

    def _bucket_key(self, bucket: int) -> str:
        return f"{self._key}:{bucket}"

    def _buckets_in_window(self, now_s: float) -> range:
        last = int(now_s // self.BUCKET_S)
        return range(last - math.ceil(self._window_s / self.BUCKET_S), last + 1)

    def _load(self, cursor: CursorStore) -> None:
        now_s = self._clock()
        loaded: dict[str, float] = {}
        for bucket in self._buckets_in_window(now_s):
            saved = cursor.get_cursor(self._bucket_key(bucket))
            try:
                entries = json.loads(saved) if saved else {}
            except (ValueError, RecursionError):
                log.warning("ignoring an unreadable saved Feishu event bucket")
                continue
            if not isinstance(entries, dict):
                continue
            for event_key, seen_s in entries.items():
                if isinstance(seen_s, int | float) and now_s - seen_s <= self._window_s:
                    loaded[event_key] = float(seen_s)
        for event_key, seen_s in sorted(loaded.items(), key=lambda item: item[1]):
            self._seen[event_key] = seen_s

    def _forget_expired(self, now_s: float) -> None:
        while self._seen:
            oldest_key, oldest_s = next(iter(self._seen.items()))
            if now_s - oldest_s <= self._window_s and len(self._seen) <= self._max_entries:
                return
            del self._seen[oldest_key]

    def _save(self, event_key: str, now_s: float) -> None:
        if self._cursor is None:
            return
        bucket = int(now_s // self.BUCKET_S)
        if self._bucket is None or self._bucket[0] != bucket:
            saved = self._cursor.get_cursor(self._bucket_key(bucket))
            try:
                entries = json.loads(saved) if saved else {}
            except (ValueError, RecursionError):
                entries = {}
            self._bucket = (bucket, entries if isinstance(entries, dict) else {})
            # The bucket that just left the window is no longer needed.
            expired = self._buckets_in_window(now_s).start - 1
            if self._cursor.get_cursor(self._bucket_key(expired)):
                self._cursor.set_cursor(self._bucket_key(expired), "")
        entries = self._bucket[1]
        entries[event_key] = now_s
        self._cursor.set_cursor(self._bucket_key(bucket), json.dumps(entries))

    def first_time(self, event_key: str) -> bool:
        """Record `event_key`; True when it was not seen within the window.

        `EventNotRecorded` when the store cannot save it: it is then forgotten here too, so
        Feishu's redelivery of it is taken as new (it was kept as seen, and the redelivery
        of an event never handled was dropped as a duplicate)."""
        now_s = self._clock()
        self._forget_expired(now_s)
        if event_key in self._seen:
            return False
        self._seen[event_key] = now_s
        try:
            self._save(event_key, now_s)
        except Exception as error:
            del self._seen[event_key]
            if self._bucket is not None:
                self._bucket[1].pop(event_key, None)
            raise EventNotRecorded(
                f"feishu event {event_key[:80]} could not be recorded as seen"
                f" ({type(error).__name__}); it is not acknowledged, so Feishu delivers it again"
            ) from None
        return True
