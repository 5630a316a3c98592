"""The channel-neutral card view and the `Channel` interface every transport implements.

The service composes a `CardView` per route (pure data, no platform syntax); the channel
renders it into its own format (`render_card`), guaranteeing the result fits the platform's
bound by shrinking the automatic slot first and then cutting the body with a visible marker
(`fit_view`). Requests go through `send`/`edit`/`delete`/`pin`, which raise only
`channels.errors` types. The service's route scheduler owns pacing: a channel declares which
rate scopes a request consumes (`rate_scopes`) and never sleeps or retries on its own.
"""

from __future__ import annotations

import asyncio
import errno
import functools
import hashlib
import json
import re
import unicodedata
import urllib.parse
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Annotated, Any, Final, Literal, Protocol
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError, available_timezones

import pyromark
from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from taskcard.channels.aio import wait_first
from taskcard.channels.errors import RateLimited as RateLimited  # for the wrappers

AgentState = Literal["running", "idle", "at prompt", "waiting", "exited", "no output", "unknown"]


def state_id(state: AgentState) -> str:
    """`state` as the reports-and-signals table names it, for scripts (`at-prompt`,
    `no-output`); people read it with a space, on cards and in the commands' text."""
    return state.replace(" ", "-")


Operation = Literal["send", "edit", "delete", "pin"]

BODY_CUT_MARKER = "\n\n… (card cut to fit this chat; the full card is in taskcard/taskcard.md)"

# The one kind of link target a message keeps as a link: a web address. Any other scheme
# (`javascript:`, `data:`, `file:`, `tg:` (Telegram's mention), an app's own) may run code,
# show a page made of the link itself or open another app, from one tap on words an agent
# chose; such a link keeps its words, not its target.
_WEB_LINK = re.compile(r"\s*https?://", re.IGNORECASE)


def web_link(url: str) -> bool:
    """Whether `url` is a web address (`http://` or `https://` and a host), the only link a
    card keeps. One without a host (`https://`, `http:///path`) leads nowhere, and Telegram
    refuses the whole message for it ("entity URL ... is invalid: URL host is empty")."""
    if _WEB_LINK.match(url) is None:
        return False
    try:
        return bool(urllib.parse.urlsplit(url.strip()).hostname)
    except ValueError:  # an address the parser cannot split (`http://[`) leads nowhere too
        return False


# A code block's language as every channel shows it: a plain name, nothing else.
_LANGUAGE = re.compile(r"[A-Za-z0-9_+.#-]+")


def code_language(info: str) -> str:
    """The language of a fenced code block from its info string, the same on every channel:
    its first word (`python` of `python title=x`) when that is a plain name, else "" (none).
    Feishu's card Markdown keeps a fence as code only with a plain word after it."""
    words = info.split()
    return words[0] if words and _LANGUAGE.fullmatch(words[0]) else ""


# White space as the maths extension counts it (ASCII only).
_MATHS_SPACE = frozenset(" \t\n\r\f\v")


def may_hold_maths(text: str) -> bool:
    """Whether CommonMark's maths extension could find maths in `text` (`$x$`, `$$x$$`): a
    `$` with no space after it and no backslash escaping it, and a later one with no space
    before it. Cheap (it looks at each `$` only), and never false for text that holds maths;
    most cards (`$5`, `$ make`, `$HOME` alone, and a body whose maths marks were escaped to
    read them as text) skip the parse that reads maths as text on every channel."""
    at = text.find("$")
    while at >= 0:  # the first `$` that may open
        after = text[at + 1 : at + 2]
        if after and after not in _MATHS_SPACE:
            before = at
            while before > 0 and text[before - 1] == "\\":
                before -= 1
            if (at - before) % 2 == 0:  # not escaped
                break
        at = text.find("$", at + 1)
    else:
        return False
    at = text.find("$", at + 2)
    while at >= 0:  # a later `$` that may close
        if text[at - 1] not in _MATHS_SPACE:
            return True
        at = text.find("$", at + 1)
    return False


# How a task list item's box shows on every channel: Telegram's converter has ticked-looking
# boxes for both (☑ for an open item), and Feishu's card Markdown knows no task lists at all.
TASK_OPEN = "\N{BALLOT BOX}"  # ☐
TASK_DONE = "\N{BALLOT BOX WITH CHECK}"  # ☑
# Where a task list marker may be: a box (CommonMark takes any white space for the open
# one), after a list item's marker. Only gates for the parse: the box alone first, which a
# search finds quickly by its leading bracket.
_MAY_BE_BOX = re.compile(r"\[(?:\s|[xX])\]")
_MAY_BE_TASK = re.compile(r"(?:[-+*]|\d{1,9}[.)])\s+\[(?:\s|[xX])\]")
# The CommonMark extensions both channels read a body with (tables, strikethrough, task
# lists, maths), as Telegram's converter reads it.
_TASK_PARSE = (
    pyromark.Options.ENABLE_TABLES
    | pyromark.Options.ENABLE_STRIKETHROUGH
    | pyromark.Options.ENABLE_TASKLISTS
    | pyromark.Options.ENABLE_MATH
)


@functools.lru_cache(maxsize=256)
def task_boxes_as_text(markdown: str) -> str:
    """`markdown` with each task list marker (`[ ]`, `[x]`, `[X]` opening a list item, as
    CommonMark's task list extension reads it) written as a box that shows whether it is
    ticked: `- [ ] todo` becomes `- ☐ todo`, `1. [x] done` becomes `1. ☑ done`.

    Every channel shows the item as a list item with the box as its first word, so an open
    and a done item read apart and the same on Telegram and Feishu, nested, numbered and in
    quotes alike. A `[ ]` anywhere else (later in the item, in code, outside a list) is not
    a marker and stays as written. Cached: a body is rendered once per route it has."""
    if _MAY_BE_BOX.search(markdown) is None or _MAY_BE_TASK.search(markdown) is None:
        return markdown
    source = markdown.encode()
    parts: list[bytes] = []
    last = 0
    for event, span in pyromark.events_with_range(markdown, options=_TASK_PARSE):
        if isinstance(event, dict) and "TaskListMarker" in event:
            box = TASK_DONE if event["TaskListMarker"] else TASK_OPEN
            parts += [source[last : span["start"]], box.encode()]
            last = span["end"]
    if not parts:
        return markdown
    parts.append(source[last:])
    return b"".join(parts).decode()


@dataclass(frozen=True)
class ChatRef:
    """Where a message goes: a chat and, on Telegram, an optional forum topic."""

    chat_id: str
    thread_id: str | None = None

    def __str__(self) -> str:
        return self.chat_id if self.thread_id is None else f"{self.chat_id}/{self.thread_id}"


@dataclass(frozen=True)
class CardView:
    """What one resident message should show, channel-neutral.

    `auto_rows` is the automatic slot as plain-text lines, most important first (shrinking
    drops rows from the end, down to the first `kept_rows`: the state and what is wrong with
    the agent's files, which a long card must still say; down to one only when those alone
    do not fit). `body` is the programmable slot as Markdown, already redacted;
    None when there is no card to show. `body_note` is a one-line note about the card itself
    (for example that it stopped). `hidden` renders the one-line hidden notice instead.
    """

    agent_id: str
    state: AgentState
    auto_rows: tuple[str, ...] = ()
    body: str | None = None
    body_note: str | None = None
    hidden: bool = False
    body_cut: bool = False
    kept_rows: int = 1

    def shown_part(self) -> CardView:
        """The part of the view a rendering reads: all of it, or for a hidden view its agent
        and state alone. A chat that hid its cards shows one line whatever the body says, so
        a channel never converts (nor measures) the body of a hidden card: a dense body costs
        tens of milliseconds per change, for nothing anyone sees."""
        if not self.hidden:
            return self
        return CardView(agent_id=self.agent_id, state=self.state, hidden=True)


# How a chat shows its agents: a resident card each, or one board (see `BoardView`).
RouteView = Literal["cards", "board"]
ROUTE_VIEW_HELP = (
    '"cards": one resident card per agent; "board": one resident board with a line per agent,'
    " plus a card for each agent while it needs people. /taskcard board|cards switches it."
)
ROUTE_ORCHESTRATOR_HELP = (
    "One of the route's agents, woken through its inbox by the signals (a report, an exit or"
    " idle without one, no output) of the other agents of this chat that no parent wakes."
    " /taskcard orchestrator AGENT|off changes it from the chat."
)
BoardMark = Literal["error", "problems", "limit", "waiting"]
# The board line of the chat's orchestrator (see `BoardLine`).
ORCHESTRATOR_NOTE = "🎯 orchestrator"
# A cluster's board line whose agent no running instance serves now (see `BoardLine`).
UNOBSERVED_NOTE = "👻 not observed now: no instance serves it"
# How each mark reads on a board line, in the order people should act on them.
BOARD_MARKS: dict[BoardMark, str] = {
    "error": "⚠ error",
    "problems": "⚠ problems with its files: see its card",
    "limit": "⛔ refresh limit",
    "waiting": "✋ waiting for a person",
}


@dataclass(frozen=True)
class BoardLine:
    """One agent's line on a chat's board (plain text parts, already redacted and bounded)."""

    agent_id: str
    state: AgentState
    marks: tuple[BoardMark, ...] = ()
    headline: str | None = None  # the first line of the agent's card
    movement: str | None = None  # the last movement with its time
    # A cluster's agent that no instance serves now (its instance died): its last line,
    # kept so that it does not silently leave the board, says so.
    unobserved: bool = False
    orchestrator: bool = False  # the chat's orchestrator mark (see `bridge.run.orchestrators`)


@dataclass(frozen=True)
class BoardView:
    """One resident message for a whole chat: a line per agent, the ones needing people
    first. `omitted` counts the agents cut off so the message fits the platform."""

    summary: str
    lines: tuple[BoardLine, ...] = ()
    omitted: int = 0
    hidden: bool = False

    @property
    def attention(self) -> bool:
        return any(line.marks for line in self.lines)


BOARD_TITLE = "Task board"
BOARD_HIDDEN_NOTICE = "Task board hidden in this chat. Send /taskcard on to show it again."


def board_line_parts(line: BoardLine) -> tuple[str, str]:
    """A board line as (lead, rest): the lead (agent and state) is emphasised where the
    platform can; both channels word a line the same way."""
    lead = f"{line.agent_id} · {line.state}"
    rest = f" · {ORCHESTRATOR_NOTE}" if line.orchestrator else ""
    rest += "".join(f" · {BOARD_MARKS[mark]}" for mark in line.marks)
    if line.unobserved:
        rest += f" · {UNOBSERVED_NOTE}"
    if line.headline:
        rest += f" — {line.headline}"
    if line.movement:
        rest += f" · {line.movement}"
    return lead, rest


def counted(count: int, one: str, many: str) -> str:
    """`1 agent`, `3 agents`: a count with the noun that agrees with it (every text the
    service writes counts things this one way)."""
    return f"{count} {one if count == 1 else many}"


def board_omitted_text(omitted: int) -> str:
    more = counted(omitted, "more agent", "more agents")
    return f"… {more} not shown: the board is cut to fit this chat"


JsonChunks = Callable[[Any, int], list[str]]


def json_chunks(
    *,
    sort_keys: bool = False,
    ensure_ascii: bool = True,
    separators: tuple[str, str] = (", ", ": "),
) -> JsonChunks:
    """`chunks(value, 0)`: the JSON of `value` in pieces to join, as `json.JSONEncoder(...)
    .encode(value)` writes it (without its check for a value that contains itself: the
    payloads encoded here are made of fresh dicts, lists and strings, never circular).

    `JSONEncoder.encode` makes a new C encoder on every call, in about 120 bytecodes of
    Python around it; a card change encodes twice (its fingerprint, the request's body).
    The C encoder the standard library makes there (`json.encoder.c_make_encoder`, not
    documented) is made once here; where there is none, the encoder's own `encode` is used.
    """
    encoder = json.JSONEncoder(
        sort_keys=sort_keys, ensure_ascii=ensure_ascii, separators=separators, check_circular=False
    )
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:
        return lambda value, _level: [encoder.encode(value)]
    encode_text = (
        json.encoder.encode_basestring_ascii if ensure_ascii else json.encoder.encode_basestring
    )
    chunks: JsonChunks = make(
        None,  # no markers: no check for circular values (see above)
        encoder.default,
        encode_text,
        None,  # no indent
        encoder.key_separator,
        encoder.item_separator,
        encoder.sort_keys,
        encoder.skipkeys,
        encoder.allow_nan,
    )
    return chunks


# `json.dumps(..., sort_keys=True)` builds a new encoder for every call; one serves them all.
_FINGERPRINT_JSON = json_chunks(sort_keys=True, ensure_ascii=False)


@dataclass(frozen=True)
class Outgoing:
    """A rendered message: plain text (fallback, console, logs-free), the platform payload,
    and a fingerprint that changes exactly when what the chat would show changes."""

    text: str
    payload: Mapping[str, Any] = field(default_factory=dict)
    fingerprint: str = ""

    @staticmethod
    def build(text: str, payload: Mapping[str, Any]) -> Outgoing:
        fingerprinted = "".join(_FINGERPRINT_JSON([text, payload], 0))
        digest = hashlib.sha256(fingerprinted.encode()).hexdigest()
        return Outgoing(text=text, payload=payload, fingerprint=digest)


@dataclass(frozen=True)
class RateScope:
    """A rate-limit bucket: at most `max_calls` requests in any `period_s` window."""

    key: str
    max_calls: int
    period_s: float


CommandName = Literal["taskcard", "tell", "reply", "moved", "reopened"]
# Who wrote a command that no person signed (Telegram's `sender_chat`; see `IncomingCommand`).
SentAs = Literal["admin", "chat"]


@dataclass(frozen=True)
class ReplyTo:
    """The chat message an answer replies to (the command it answers).

    `thread_id` is the thread the command was written in when `ChatRef` does not name it (a
    Feishu topic or reply thread): the answer must be posted as a reply in that thread. A
    channel whose threads are part of `ChatRef` (Telegram's forum topics) leaves it None.
    """

    message_id: str
    thread_id: str | None = None


@dataclass(frozen=True)
class IncomingCommand:
    """A command from a chat, already stripped of the bot mention.

    `command` "taskcard" and "tell" are `/taskcard ARGS` and `/tell AGENT TEXT` (`args` holds
    what follows the command); "reply" is a message written as a reply to one of the bot's
    messages: `args` is its text and `reply_to` the ids it answers (the replied-to message
    and, on Feishu, the thread's root), for the service to match against its own messages.
    A "taskcard" or "tell" command with `reply_to` was addressed only by replying (a Feishu
    group without a mention of the bot): it is the bot's only when it replies to one of the
    bot's messages.
    "moved" is no one's text but the platform's word that `chat` now lives under another id
    (`args`, Telegram's group upgraded to a supergroup): the channel sends there from now on,
    and the service shows the chat's residents again.
    "reopened" is the platform's word that `chat` (a Telegram forum topic) was reopened: the
    routes a closed topic disabled are brought back.

    `sent_as` says the message was sent on behalf of a chat rather than signed by a person
    (only Telegram has this): "admin" when that chat is `chat` itself (an administrator of the
    group posting anonymously, or a channel's own post; the platform lets only the chat's
    administrators do either), "chat" when it is another chat (a linked channel, a channel a
    member chose to post as), whose post names no person. None: `user_id` is the person.

    `user_id` is always a platform's id of a person, or None. `author_name` is the name a
    message shows instead when it names no person (only on Telegram: a channel's post, its
    signature, else the channel's title; an anonymous administrator's message in a group,
    their custom title, else the group's title): a name, not an id, so anyone may be named
    so, and nothing keyed on a person (a rate limit, who queued a text) may read it as one.
    `author_signature` is that signature or title alone, when there is one: what tells one
    signer of a channel, or one anonymous administrator, from another (`writer`).
    `sent_as_chat` is the id of the other chat a message was sent on behalf of (`sent_as`
    "chat": a channel a member posts as in a group, whose `from` is the Channel_Bot
    placeholder, one id for every such channel): the writer is that chat, not the group.
    """

    chat: ChatRef
    args: str
    user_id: str | None
    message_id: str | None = None
    chat_title: str | None = None  # the group's title (or a person's name), when sent along
    # False when another instance of a cluster answers this command (each still applies it).
    reply: bool = True
    command: CommandName = "taskcard"
    reply_to: tuple[str, ...] = ()
    # The thread the message was written in when `chat` does not name it (see `ReplyTo`).
    message_thread: str | None = None
    # True when `reply_to` names only the root of the thread the message was written in, not
    # a message its author chose to reply to: Feishu makes every message of a thread (a
    # topic, a reply thread) a reply to the thread's root. Such a "reply" to an agent's card
    # still reaches the agent (people discussing under a card talk to it); one to any other
    # message of the service is not answered with how to reach an agent.
    in_thread: bool = False
    sent_as: SentAs | None = None
    author_name: str | None = None
    author_signature: str | None = None
    sent_as_chat: str | None = None
    # True when the platform did not say who wrote the message `reply_to` names (every post
    # of a Telegram channel, the bot's too, is signed by the channel alone): a "reply" is
    # then one to the service's message only as far as the service's own ids tell (an
    # agent's card, a status message, a notice, the board), never taken for one by default.
    replied_author_unknown: bool = False
    # True when the message holds a right-to-left control (`shows_reordered`): its words may
    # show in another order than typed ("/taskcard", an override and "ffo" shows as "off").
    # The arguments are read as typed; an answer that they name nothing says so.
    reordered: bool = False
    # True when the agent's name of a `/tell` was glued right after the app's name typed
    # (Feishu, `/tell@任务卡片builder hi`: Chinese text has no space there). It may as well
    # be a command to another app whose name is ours and more (`任务卡片Pro`): the service
    # takes it only when the name is one of the chat's agents, and answers nothing else.
    agent_glued: bool = False

    @property
    def writer(self) -> str | None:
        """Who wrote the message, for what is counted per person (the `/tell` rate) or is
        theirs alone (`/taskcard cancel`): the person's id; for a message that names no
        person (a Telegram channel's post, an anonymous administrator's message, a message
        sent as a channel), `name:`, the chat that speaks (`sent_as_chat`, else `chat`) and
        its signature when it is signed, so that each signer is one writer and a signature
        ("7") is never some person's id (none starts so), else `chat:` and that chat, every
        unsigned one being the chat's; None when the message names no one."""
        if self.user_id is not None:
            return self.user_id
        speaker = self.sent_as_chat or self.chat.chat_id
        if self.author_signature is not None:
            return f"name:{speaker}:{self.author_signature}"
        if self.author_name is not None:
            return f"chat:{speaker}"
        return None

    @property
    def answer_to(self) -> ReplyTo | None:
        """Where an answer to this command replies, when the message is known."""
        if self.message_id is None:
            return None
        return ReplyTo(self.message_id, self.message_thread)


CommandSink = Callable[[IncomingCommand], Awaitable[None]]

# Characters a chat shows as nothing, which chat clients paste around what people type: the
# soft hyphen, the combining grapheme joiner, the Arabic letter mark, the Khmer inherent
# vowels, the Mongolian variation selectors and vowel separator, the zero-width space and
# joiners, the directional marks, embeddings, overrides and isolates, the word joiner, the
# invisible operators and deprecated format controls, the byte-order mark, the shorthand and
# musical format controls and the tag characters (Unicode's default-ignorable code points,
# but for the Hangul fillers, which Telegram reads as letters, and the variation selectors of
# emoji). In a command's arguments they count as not typed: `/taskcard off` followed by a
# zero-width space is `off`, and so is `/taskcard o` + one + `ff`. Right after the command
# word one ends the word, as Telegram ends a command there (`command_word`).
_UNSHOWN_CHARS = (
    "\u00ad\u034f\u061c\u17b4\u17b5\u180b-\u180f\u200b-\u200f\u202a-\u202e"
    "\u2060-\u2064\u2066-\u206f\ufeff\U0001bca0-\U0001bca3\U0001d173-\U0001d17a"
    "\U000e0000-\U000e0fff"
)
_UNSHOWN = re.compile(f"[{_UNSHOWN_CHARS}]")
# Every default-ignorable code point (Unicode's DerivedCoreProperties.txt; the standard
# library's `unicodedata` does not give the property, hence the list): `_UNSHOWN`'s, the
# Hangul fillers, the variation selectors (U+FE00..U+FE0F; those of the supplement are among
# the tag block's), the unassigned U+2065 and U+FFF0..U+FFF8.
_IGNORABLE = re.compile(
    f"[{_UNSHOWN_CHARS}\u115f\u1160\u2065\u3164\ufe00-\ufe0f\uffa0\ufff0-\ufff8]"
)
# The control characters Telegram's servers turn into spaces in every text a person sends
# (tdlib's `clean_input_string`): all below the space but the line break and the carriage
# return (which they drop). Feishu passes them on; in a command's words (its name, its
# options, the agent a `/tell` names) they count as white space on both platforms, so a NUL
# or an escape pasted into `/taskcard off` is `off` there too. A `/tell`'s text keeps them
# as sent (`taskcard inbox` shows them escaped).
_CONTROLS = "\x00-\x09\x0b\x0c\x0e-\x1f"
_FIRST_WORD = re.compile(f"[\\s{_CONTROLS}]*([^\\s{_CONTROLS}]+)")
_CONTROL = re.compile(f"[{_CONTROLS}]")


def shown(text: str) -> str:
    """`text` without the characters a chat shows as nothing (see `_UNSHOWN`)."""
    return _UNSHOWN.sub("", text)


def without_ignorable(name: str) -> str:
    """`name` without Unicode's default-ignorable code points (`_IGNORABLE`), which a name
    copied from a chat often carries (an emoji's variation selector U+FE0F, a Hangul filler,
    a zero-width joiner): a name a person typed, compared with an agent's id, which never
    holds one (letters, digits, `_`, `.`, `-`), so two agents never become one by it. Not for
    text an agent reads: there a variation selector or a joiner is part of an emoji."""
    return _IGNORABLE.sub("", name)


def folded(text: str) -> str:
    """`text` as a person means it, the one rule for every word a chat member types that is
    compared with one of ours: an option of `/taskcard` (the subcommand, `orchestrator`'s
    `off`, an option glued after a Feishu app's CJK name, `typed_name_of`), its numbers and
    an agent's name. Without the invisible characters pasted with it (`without_ignorable`),
    in its compatibility form (NFKC: a phone keyboard's full-width `ＯＦＦ` is `off`, `５` is
    `5`, a Kelvin sign a `K`), case folded and composed again (a folded letter may decompose:
    `ǰ`), which is Unicode's identifier caseless match. A digit of another script
    (Arabic-Indic `٣`) has no compatibility form: it stays itself."""
    bare = unicodedata.normalize("NFKC", without_ignorable(text))
    return unicodedata.normalize("NFKC", bare.casefold())


# Where every character lies that `folded` reads as ASCII letters and digits alone (`o`, `Ｏ`,
# `ᵒ`, `ﬀ`, `№`, ...), as whole blocks of 256 code points: Latin and its extensions, modifier
# and phonetic letters, letterlike symbols and Roman numerals, enclosed alphanumerics,
# squared abbreviations, ligatures, full-width forms, mathematical alphanumerics.
# `_folding_to` folds only these (about 5,000 code points, not all 1.1 million: that cost a
# third of a second on first use); tests/channels/test_folding.py checks against every code
# point of the running Python's Unicode that none lies elsewhere.
FOLDING_BLOCKS: Final = (
    (0x0000, 0x02FF),
    (0x1D00, 0x1EFF),
    (0x2000, 0x21FF),
    (0x2400, 0x24FF),
    (0x2C00, 0x2CFF),
    (0x3200, 0x33FF),
    (0xA700, 0xA7FF),
    (0xFB00, 0xFBFF),
    (0xFF00, 0xFFFF),
    (0x10700, 0x107FF),
    (0x1D400, 0x1D7FF),
    (0x1F100, 0x1F1FF),
    (0x1FB00, 0x1FBFF),
)


def folding_table() -> dict[str, str]:
    """Each run of ASCII letters and digits that `folded` reads a single character as, with
    every such character: `o` with `oOｏＯᵒ...`, `ff` with `ﬀ`. From `FOLDING_BLOCKS`."""
    found: dict[str, list[str]] = {}
    for first, last in FOLDING_BLOCKS:
        for code in range(first, last + 1):
            read = folded(chr(code))
            if read.isascii() and read.isalnum():
                found.setdefault(read, []).append(chr(code))
    return {read: "".join(chars) for read, chars in found.items()}


@functools.cache
def _folding_to() -> dict[str, str]:
    """`folding_table` as regular expressions' character classes, escaped: built once, on
    first use."""
    return {
        read: "[" + "".join(map(re.escape, chars)) + "]" for read, chars in folding_table().items()
    }


def folding_pattern(word: str) -> str:
    """A regular expression's source matching the text that `folded` reads as `word` (ASCII
    letters and digits, lower case): `off` typed `ＯＦＦ`, `Off` or `oﬀ` (a ligature reads as
    the letters it joins). For a word that must be found in a text as typed (a pattern
    cannot fold it first)."""
    classes = _folding_to()

    @functools.cache
    def rest(at: int) -> str:
        if at == len(word):
            return ""
        ways = [
            classes.get(word[at:end], re.escape(word[at:end]) if end == at + 1 else "") + rest(end)
            for end in range(at + 1, len(word) + 1)
            if end == at + 1 or word[at:end] in classes
        ]
        return ways[0] if len(ways) == 1 else "(?:" + "|".join(ways) + ")"

    return rest(0)


# The words `/taskcard` takes as its option (`bridge.run.commands` reads them; a Feishu
# app's CJK name typed with one glued after it addresses the command, `typed_name_of`).
TASKCARD_WORDS: Final = (
    "status",
    "state",
    "off",
    "on",
    "cancel",
    "board",
    "cards",
    "orchestrator",
    "help",
)


def first_word(text: str) -> tuple[str, str]:
    """The first word of `text` as it shows, and the text after it (starting at the white
    space that ended it); ("", "") when `text` shows no word. White space of any kind ends a
    word (a line break, a no-break space); a "word" of invisible characters alone is none."""
    at = 0  # matched in place: slicing the rest at each invisible "word" was quadratic
    while (match := _FIRST_WORD.match(text, at)) is not None:
        word = shown(match.group(1))
        at = match.end()
        if word:
            return word, text[at:]
    return "", ""


def first_word_as_typed(text: str) -> tuple[str, str]:
    """The first word of `text` that shows (as `first_word` finds it) as typed: without the
    invisible characters before it, with those inside it and after it; and the text after
    it. For a command word, which Telegram ends at an invisible character (`command_word`):
    `/taskcard` + a word joiner + `off` is the command `/taskcard` with `off`."""
    at = 0
    while (match := _FIRST_WORD.match(text, at)) is not None:
        word = match.group(1)
        at = match.end()
        start = 0
        while start < len(word) and _UNSHOWN.match(word[start]):
            start += 1
        if start < len(word):
            return word[start:], text[at:]
    return "", ""


# How many leading matches `drop_leading` takes out at most: the bot named a few times
# over ("@ThisBot @ThisBot /tell ..."); each is read from a copy of the text after it.
LEADING_DROPS = 16


def drop_leading(text: str, word: re.Pattern[str]) -> str:
    """`text` without the leading matches of `word` (each after any white space and
    invisible characters, at most `LEADING_DROPS`), replaced by a space; `text` as it was
    when it does not start with one. For the mention of the bot that addresses a command:
    the one leading the message or right after the command word, also typed more than once
    ("@ThisBot @ThisBot /tell builder hi"), never one inside the text a person wrote for an
    agent."""
    start = 0
    for _ in range(LEADING_DROPS):
        at = start
        while at < len(text) and (text[at].isspace() or _UNSHOWN.match(text[at])):
            at += 1
        found = word.match(text[at:])  # sliced: a look-behind in `word` sees the start
        if found is None or not found.end():
            break
        start = at + found.end()
    return text if not start else " " + text[start:]


_COMMAND_WORD = re.compile(r"/[A-Za-z0-9_]{1,64}")


def ends_command(char: str) -> bool:
    """Whether `char`, right after a command word, ends it, as Telegram marks commands (a
    `bot_command` entity, tdlib's `match_bot_commands`): anything but a letter or digit of
    any script, `_`, `/`, `<` or `>`. So `/tell😀` and `/taskcard,off` hold the commands
    `/tell` and `/taskcard`, while `/taskcardé`, `/taskcard/off` and `/home/me` hold none."""
    return not (char.isalnum() or char in "_/<>")


def command_word(head: str) -> tuple[str, str] | None:
    """The command the first word `head` of a message starts with, as Telegram marks one:
    `/` and 1 to 64 ASCII letters, digits or underscores, ended by the word's end, by `@` and
    a name (the bot it is addressed to, which each channel reads its own way; `@` with no
    name after it addresses nobody, and Telegram marks no command there) or by any character
    that `ends_command`, an invisible one too. Returns the command's name (no slash, as
    typed) and the rest of the word after it (`"😀"` of `/tell😀`, `"@OurBot"` of
    `/taskcard@OurBot`, a word joiner and `"off"` of `/taskcard` + one + `off`); None when
    the word starts with no command. The name is ASCII, so a look-alike (a Kelvin sign for
    the `k`, which `lower()` folds to `k`) is never taken for a command. `command_readings`
    reads a word both as it shows and as typed."""
    found = _COMMAND_WORD.match(head)
    if found is None:
        return None
    glued = head[found.end() :]
    if glued[:1] == "@":
        addressee = shown(glued[1:])
        if not addressee or not (addressee[0].isalnum() or addressee[0] == "_"):
            return None  # "/taskcard@ off", "/taskcard@,off": addressed to nobody
    elif glued and not ends_command(glued[0]):
        return None
    return found.group(0)[1:], glued


def command_readings(text: str, slashes: str = "/") -> list[tuple[str, str, str]]:
    """The command the first word of `text` starts with, read two ways: as the word shows
    (the invisible characters inside it not typed: `/`, a zero-width space and `taskcard`,
    as the service quotes a command so it is none, pasted back into the chat is `/taskcard`),
    then as typed, where an invisible character ends the command word as Telegram ends one
    there (`/taskcard`, a word joiner and `off`, which shows as `/taskcardoff`, is `/taskcard`
    with `off`). Each reading is (name, glued, rest) as `command_word` gives the first two,
    with the text after the word; none when the word starts with no command. A channel takes
    the first reading that is a command of its own. `slashes`: the characters that open a
    command, each read as `/`."""
    typed, rest = first_word_as_typed(text)
    if typed and typed[0] in slashes:
        typed = "/" + typed[1:]
    readings: list[tuple[str, str, str]] = []
    for head in dict.fromkeys((shown(typed), typed)):
        if (found := command_word(head)) is not None:
            readings.append((*found, rest))
    return readings


def other_bots_command(head: str, ours: Callable[[str], bool]) -> bool:
    """Whether the first word `head` is a command addressed to someone else: `/word@NAME`
    (a command word as Telegram reads one: 1-64 ASCII letters, digits or underscores) where
    `ours(NAME)` is False. A path such as `/home/me@host` is no command, and neither is
    `/start@` with no name after the sign (`command_word`)."""
    name, at, addressee = head.partition("@")
    if not at or _COMMAND_WORD.fullmatch(name) is None:
        return False
    return command_word(head) is not None and not ours(addressee)


def command_to_mentioned(text: str, mention: re.Pattern[str]) -> bool:
    """Whether `text` is a command written to whom its leading mention names ("@OtherBot
    /start", on Feishu "@_user_2 /taskcard off"): `mention` matches a mention of someone
    else (the bot's own leading mention taken out first). Written as a reply to one of the
    bot's messages, such a command is still theirs, as `/start@OtherBot` is, and no text for
    the agent whose message it answers."""
    head, rest = first_word(text)
    if mention.fullmatch(head) is None:
        return False
    after, _ = first_word(rest)
    return command_word(after) is not None


# The characters that show the letters or words after them right to left whatever they are:
# the right-to-left embedding, override and isolate. Latin letters in an override show
# reversed ("ffo" as "off"); words in an embedding or isolate show in reverse order.
_RIGHT_TO_LEFT = re.compile("[\u202b\u202e\u2067]")


def shows_reordered(text: str) -> bool:
    """Whether `text` holds a right-to-left control, so its words may show in another order
    than they were typed in (`IncomingCommand.reordered`)."""
    return _RIGHT_TO_LEFT.search(text) is not None


_PLAIN_WORDS = re.compile(r"[A-Za-z0-9][A-Za-z0-9 .,:-]{0,39}")


def typed_form(words: str) -> str | None:
    """`words` (a command's arguments, read as typed) to quote in an answer, when they are
    plain enough to show as they are: ASCII letters, digits, spaces and `.,:-`, at most 40
    characters. Nothing a chat could take for a mention, a link or markup; None otherwise."""
    if _PLAIN_WORDS.fullmatch(words) is None:
        return None
    return words


def command_arguments(rest: str, tell: bool, bot: re.Pattern[str] | None = None) -> str:
    """The arguments of a command read from `rest` (what followed the command word): for
    `/tell`, the agent's name as it shows, a space and the text for the agent as typed (its
    line breaks and invisible characters kept, a directional mark or a flag's tag characters
    at its ends too; only white space trimmed at its ends), none when it shows nothing (a
    zero-width space a client pasted after the name); otherwise the words as they show,
    joined by single spaces.

    `bot` matches the bot's mention (once or more, glued): glued to the end of the agent's
    name it goes, as the name is the bot's agent (`builder@ThisBot`, which a Telegram
    client completes a name to; on Feishu, the bot picked right after the name). No agent's
    id holds an `@`, so the name is read up to it; one naming someone else stays, and the
    service answers that no agent has that name."""
    if not tell:
        return " ".join(shown(_CONTROL.sub(" ", rest)).split())
    name, text = first_word(rest)
    at = name.find("@")
    if bot is not None and at > 0 and bot.fullmatch(name, at) is not None:
        name = name[:at]
    body = text.strip()
    if not name or not shown(body).strip():
        return name
    # The white space that ended the name stays as typed: "builder\nstop now".
    gap = "".join(char for char in text[: text.index(body)] if char.isspace()) or " "
    return name + gap + body


class PollGate(Protocol):
    """Who may receive a bot's updates now, when several instances share the bot."""

    async def wait_turn(self) -> bool:
        """Return once this instance may poll; True when it had to wait (or the turn is a
        new one), so the poller re-reads the committed offset first."""
        ...


class CursorStore(Protocol):
    """Durable small values a channel needs across restarts (for example an update offset)."""

    def get_cursor(self, key: str) -> str | None: ...

    def set_cursor(self, key: str, value: str) -> None: ...

    def delete_cursors(self, keys: Iterable[str]) -> None:
        """Forget these values (`get_cursor` gives None for them after); unknown keys are
        ignored."""
        ...


class Channel(ABC):
    """One chat transport. Lifecycle: `start(on_command)` then requests, then `stop()`.

    `stop()` is idempotent. Requests raise only `channels.errors` types; `edit` raises
    `NotModified` when the chat already shows that content, `MessageGone` when the message
    cannot be edited any more.
    """

    name: str
    # None: a send whose answer was lost can be retried freely (the platform deduplicates it
    # by the idempotency key, or the outcome is never in doubt). A number: the platform may
    # have posted a copy for every such send, so the scheduler retries one at most and then
    # holds further sends of that resident for this many seconds.
    ambiguous_send_hold_s: float | None = None
    # Set when instances share the bot: the channel receives updates only while it passes.
    poll_gate: PollGate | None = None
    # False: what this channel shows ends with the process (a terminal), so a resident id an
    # earlier run stored names nothing; each resident is sent anew instead of edited.
    messages_outlive_process: bool = True
    # False: a message written as a reply names only the message it answers, not who wrote
    # it (Feishu's `parent_id`), so the service keeps the ids of the messages it posts here
    # to tell a command replying to one of them (addressed to the bot) from one replying to
    # someone else's; Telegram's update says who wrote the message replied to.
    replies_name_author: bool = True

    @abstractmethod
    async def start(self, on_command: CommandSink) -> None:
        """Verify credentials, then begin receiving commands in owned background tasks."""

    @abstractmethod
    async def stop(self) -> None:
        """Stop receiving, cancel and await background work, release connections."""

    def topic_name(self, chat: ChatRef) -> str | None:
        """The name of the topic `chat` names (its `thread_id`), when the platform told it
        and the channel has learnt it (kept across restarts, and shared by a cluster's
        instances, where the channel keeps it): untrusted text (any member may name a
        topic), cleaned for the service to quote in its own words, never markup, a mention
        or a command. None otherwise: then the topic is named by its thread id. Only
        Telegram's forum topics have names; a Feishu thread has none."""
        del chat
        return None

    @abstractmethod
    def render_card(self, view: CardView) -> Outgoing:
        """The resident message for `view`, always within the platform's bound."""

    def render_board(self, view: BoardView) -> Outgoing:
        """The board message for `view`, always within the platform's bound (the lines that
        do not fit are cut off by `board_fits` beforehand; this is the last safeguard).

        The default is plain text; chat channels override it with their own formatting.
        """
        return self.render_text(board_plain_text(view))

    def board_fits(self, view: BoardView) -> bool:
        """Whether `view` rendered whole stays within the platform's bound."""
        return len(board_plain_text(view)) <= 4096

    @abstractmethod
    def render_text(self, text: str) -> Outgoing:
        """A short plain message (notices and command replies)."""

    def render_own_text(self, text: str) -> Outgoing:
        """`render_text` for a message of the service's own words alone (a command's help, an
        acknowledgement: nothing an agent or a person wrote), whose commands a platform may
        keep as commands (Telegram: tappable)."""
        return self.render_text(text)

    @abstractmethod
    def rate_scopes(
        self, chat: ChatRef, operation: Operation, message_id: str | None
    ) -> tuple[RateScope, ...]:
        """The buckets one request consumes, from the narrowest to the widest."""

    # A scope's key is built by the channel that defines it (in `rate_scopes`, and in the
    # `RateLimited` errors it raises) and read back only by that channel, through these two.

    @classmethod
    def scope_covers(cls, scope: str, chat: ChatRef, message_id: str | None) -> bool:
        """Whether a pause of `scope` holds up a route in `chat` with resident `message_id`."""
        return False

    def start_scopes(self) -> tuple[str, ...]:
        """The scopes whose pause holds up the requests `start` makes itself (verifying the
        credentials, learning the bot): the bot's or the app's as a whole. The service
        starts the channel only once no pause over them runs, a stored one included, and
        records a `RateLimited` that `start` raises as a pause like any other. Empty: the
        start makes no request a pause could cover."""
        return ()

    def start_put_off(self) -> RateLimited | None:
        """The 429 answered to a request `start` can do without (the Telegram command menu,
        the Feishu bot's identity), once, or None. `start` does not fail on it: it goes on
        without that request, which is owed. The service records the pause it names (like a
        lane's) and calls `finish_start` once neither it nor a pause over `start_scopes`
        runs; the cards are held only by what the pause itself covers."""
        return None

    async def finish_start(self) -> RateLimited | None:
        """Make the request a 429 put off at the start (`start_put_off`) once more: None when
        nothing is owed any more (done, or failed otherwise: logged, and given up as at the
        start), else the new 429 (the request stays owed; the service waits it out and
        calls again, a bounded number of times)."""
        return None

    @classmethod
    def describe_scope(cls, scope: str) -> str | None:
        """The scope for people (`taskcard status`); None when it is not this channel's."""
        return None

    @abstractmethod
    async def send(
        self,
        chat: ChatRef,
        message: Outgoing,
        *,
        idempotency_key: str | None = None,
        reply_to: ReplyTo | None = None,
    ) -> str:
        """Post a new message and return its id.

        `idempotency_key` is the same for every retry of one intended message; a platform that
        can deduplicate sends by such a key (Feishu's `uuid`) uses it, so a retried send after a
        timeout does not post a second copy.

        `reply_to` is the command this message answers: a channel that answers with a reply
        posts it as one (in the command's thread when it was written in one), and posts it
        to `chat` as usual when that message is gone. Channels whose threads are in `chat`
        may ignore it.
        """

    @abstractmethod
    async def edit(self, chat: ChatRef, message_id: str, message: Outgoing) -> None:
        """Replace the content of an existing message in place."""

    @abstractmethod
    async def delete(self, chat: ChatRef, message_id: str) -> None:
        """Delete a message; a message already gone is not an error."""

    @abstractmethod
    async def pin(self, chat: ChatRef, message_id: str) -> None:
        """Pin a message quietly."""

    def posted_after_move(self, chat: ChatRef, message_id: str) -> bool:
        """Whether the message lives where its chat moved (posted there after the move: the
        supergroup a Telegram group became), so that no news of that move, however late,
        can mean it was left behind. Read from the id, without a request; False when not
        known so (chats of most platforms never move).

        The scheduler asks when a move is announced while a request of the route is on its
        way (`RouteScheduler.reshow`): only a request that went where the chat is now may
        count its card as shown."""
        del chat, message_id
        return False


# How many characters of Markdown source per unit of a platform's size limit are kept before
# fitting (`precut_body`).
SOURCE_BUDGET_FACTOR: Final = 4


def precut_body(view: CardView, budget: int) -> CardView:
    """`view` with a huge Markdown body cut to its first `budget` characters, marked, before
    fitting, so that fitting converts no more than can be shown.

    Visible text is rarely much shorter than its source, so a source of
    `SOURCE_BUDGET_FACTOR` times the platform's limit loses nothing that could be shown,
    except in bodies made mostly of link addresses (then the card is cut a little earlier
    than necessary, still with the visible marker).
    """
    if view.body is None or len(view.body) <= budget:
        return view
    return replace(view, body=view.body[:budget].rstrip(), body_cut=True)


def fit_view(view: CardView, size: Callable[[CardView], int], limit: int) -> CardView:
    """Shrink `view` until `size(view) <= limit`: drop automatic rows from the end (keeping
    the first `kept_rows`), then cut the body to the longest prefix that fits, marked with
    `body_cut`; when even the kept rows without body do not fit, keep the first row alone.

    `size` measures a rendering in the platform's unit (UTF-16 units, bytes, ...). The result
    always fits when the view without body and with one automatic row fits.
    """
    if size(view) <= limit:
        return view
    rows = list(view.auto_rows)
    while len(rows) > max(1, view.kept_rows):
        rows.pop()
        candidate = replace(view, auto_rows=tuple(rows))
        if size(candidate) <= limit:
            return candidate
    shrunk = replace(view, auto_rows=tuple(rows))
    body = view.body or ""
    low, high = 0, len(body)
    best = replace(shrunk, body=None, body_cut=bool(body))
    while low <= high:
        middle = (low + high) // 2
        candidate = replace(shrunk, body=body[:middle].rstrip(), body_cut=True)
        if size(candidate) <= limit:
            best, low = candidate, middle + 1
        else:
            high = middle - 1
    if len(rows) > 1 and size(best) > limit:  # the kept rows alone are too long
        return fit_view(replace(view, kept_rows=1), size, limit)
    return best


def board_plain_text(view: BoardView) -> str:
    """The board as plain text: the title and summary, a line per agent, the cut count."""
    if view.hidden:
        return BOARD_HIDDEN_NOTICE
    lines = [f"{BOARD_TITLE} · {view.summary}"]
    lines += ["".join(board_line_parts(line)) for line in view.lines]
    if view.omitted:
        lines.append(board_omitted_text(view.omitted))
    return "\n".join(lines)


def check_timezone(name: str) -> str:
    """An IANA time zone name the system knows (`Europe/Berlin`, `UTC`), else a fixable error.
    Where the zone database has `localtime` (a link to the host's own setting), it is taken
    as before, following the host; the README advises an IANA name for clusters."""
    try:
        ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        # The names are looked up case by case on Linux: `utc` or `asia/shanghai` was refused
        # with examples only, leaving the operator to spot that the case was all that differed.
        folded = {zone.lower(): zone for zone in available_timezones()}.get(name.lower())
        hint = f" (did you mean {folded!r}? the names are case-sensitive)" if folded else ""
        raise ValueError(
            f"{name!r} is not a known IANA time zone{hint}; use a name like 'UTC',"
            " 'Europe/Berlin' or 'Asia/Shanghai'"
        ) from None
    return name


# A route's `timezone`: every time on its cards is shown in this zone.
TimeZoneName = Annotated[str, AfterValidator(check_timezone)]
TIMEZONE_HELP = "IANA time zone of the times shown on this route's cards, e.g. Europe/Berlin."


def bind_problem(error: OSError) -> str:
    """Why a listener configured by the user could not bind, and the fix, in one line (the
    exception's own text is a paragraph with the errno and the address as a tuple)."""
    if error.errno == errno.EADDRINUSE:
        return (
            "the port is already in use (another service, or a taskcard still stopping); "
            "stop what holds it, or choose another port"
        )
    if error.errno == errno.EACCES:
        return "not allowed to bind that port (below 1024 needs privileges); choose 1024 or above"
    if error.errno == errno.EADDRNOTAVAIL:
        return "the address is not one of this machine's; use one it has, such as 127.0.0.1"
    return f"cannot listen there ({error.strerror or type(error).__name__}); fix the address"


# A listener's port in use is tried again for this long, every `BIND_RETRY_EVERY_S`: a holder
# that lets go within it (a previous instance still closing, a client's passing connection on
# that port) is waited out instead of failing the start.
BIND_RETRY_S = 30.0
BIND_RETRY_EVERY_S = 0.25


async def bind_retrying(
    start: Callable[[], Awaitable[None]],
    busy: Callable[[], None],
    *,
    stop: asyncio.Event | None = None,
    for_s: float = BIND_RETRY_S,
    every_s: float = BIND_RETRY_EVERY_S,
) -> bool:
    """Await `start()` (a listener's bind) until it succeeds: True.

    A port in use (EADDRINUSE) is tried again every `every_s` for `for_s`, with `busy()`
    called once, at the first refusal (the caller's warning, naming its setting); any other
    error, or the port still in use when the time is up, is raised for the caller to word
    (`bind_problem`). False when `stop` is set while the port is waited for."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + for_s
    told = False
    while True:
        try:
            await start()
        except OSError as error:
            if error.errno != errno.EADDRINUSE or loop.time() >= deadline:
                raise
            if not told:
                told = True
                busy()
        else:
            return True
        if await wait_first(*(() if stop is None else (stop,)), timeout_s=every_s):
            return False


_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
# 24 or more letters and digits with no `_` and at least one digit, not all upper case: the
# shape of a generated secret (a Feishu app secret, a token) pasted where a variable's name
# belongs, rarely a name someone chose.
_SECRET_SHAPED = re.compile(r"(?=[A-Za-z0-9]*[0-9])[A-Za-z0-9]{24,}")


def secret_value_problem(value: str, what: str) -> str | None:
    """Why the value of a secret's variable, white space around it already removed, cannot
    be `what` whatever the platform (None: it may be): the slips of writing a variable by
    hand. Each reason is said without the value, which is a secret.

    Quotes around it are kept as part of the value by `docker run --env-file`, a Kubernetes
    secret or a unit's `Environment=` quoted twice; a `Bearer ` prefix is an HTTP header's
    word copied along; white space inside is two values pasted together, or a line break
    inside the secret. (A trailing line break, as `echo` and files add, is taken: the
    reader strips white space around the value.)"""
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
        return (
            f"the {what} is in quotes, which are kept as part of the value (as"
            " `docker run --env-file` and a Kubernetes secret keep them); remove the quotes"
        )
    if value[:7].lower() == "bearer ":
        return (
            f"it starts with 'Bearer ', a request header's word, not part of the {what};"
            f" give the {what} alone"
        )
    if any(char.isspace() for char in value):
        return (
            f"it has white space inside (a line break, or two values pasted together); copy"
            f" the {what} again, alone"
        )
    return None


def check_env_name(name: str) -> str:
    """A usable environment variable name for a `*_env` key, else a fixable error.

    The value is never quoted back: a common slip is to paste the secret itself here.
    """
    if not _ENV_NAME.fullmatch(name):
        raise ValueError(
            "not an environment variable name; give the NAME of the variable that holds the"
            " secret (letters, digits and _, not starting with a digit, e.g."
            " TELEGRAM_BOT_TOKEN), never the secret itself"
        )
    return name


def env_name_shown(name: str) -> str:
    """How a message names the variable `name`: as written, unless it has a secret's shape
    (a secret pasted where the name belongs, which a message must not repeat). Such a name
    is still used as given: a variable of that name may well exist."""
    if _SECRET_SHAPED.fullmatch(name) and not name.isupper():
        return (
            "named there (not shown: the name looks like a secret itself; put the secret in"
            " a variable such as FEISHU_APP_SECRET and give that variable's NAME)"
        )
    return name


# A `*_env` key: the name of the environment variable a secret is read from.
EnvName = Annotated[str, AfterValidator(check_env_name)]


class RateLimit(BaseModel):
    """A configurable limit: at most `max_calls` requests in any window of `period_s`."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)

    max_calls: int = Field(
        ge=1, le=100_000, description="Requests allowed in any window of period_s (1-100000)."
    )
    period_s: float = Field(
        ge=0.01, le=86_400, description="Length of the sliding window in seconds (0.01-86400)."
    )

    def scope(self, key: str) -> RateScope:
        return RateScope(key=key, max_calls=self.max_calls, period_s=self.period_s)
