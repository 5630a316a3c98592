"""Receiving `/taskcard` commands by long polling `getUpdates`.

The offset is persisted in the cursor store after each batch has been handed to the sink,
so a restart confirms what was handled and never replays it (Telegram keeps unconfirmed
updates for 24 hours). Only new messages count: an edited message is never a command, and
`allowed_updates=["message", "channel_post"]` keeps edits from even arriving. A channel's
posts come as `channel_post` (only its administrators post there, signed by the channel):
a routed channel is commanded like a group. Its posts name no author, the bot's cards
included: a reply there to a post of the channel is passed on as a reply whose replied-to
author is unknown, which the service matches against its own message ids; the post's
signature (else the channel's title) comes as its author's name, never as a user id.
Routing and permissions are the service's decisions, not ours.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import re
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from telegram import Bot, Chat, Message, MessageEntity, Update
from telegram import error as tg
from telegram.request import BaseRequest

from taskcard.channels.aio import Backoff
from taskcard.channels.base import (
    ChatRef,
    CommandName,
    CommandSink,
    CursorStore,
    IncomingCommand,
    PollGate,
    SentAs,
    command_arguments,
    command_readings,
    command_to_mentioned,
    drop_leading,
    ends_command,
    first_word,
    other_bots_command,
    shows_reordered,
)
from taskcard.channels.telegram.http11 import LeanRequest
from taskcard.channels.telegram.moves import ChatMoves, qualified
from taskcard.channels.telegram.request import FloodAwareRequest, FloodWait
from taskcard.channels.telegram.topics import TopicNames

OFFSET_CURSOR_KEY = "telegram:update_offset"
COMMAND = "taskcard"
TELL = "tell"
# The longest getUpdates flood wait honoured: commands are never shut out for longer.
MAX_FLOOD_WAIT_S = 3600.0
# New messages of groups and private chats, and new posts of channels; never their edits.
ALLOWED_UPDATES = ["message", "channel_post"]

_log = logging.getLogger(__name__)


def readable_updates(answer: Any) -> Any:
    """A getUpdates answer in which every update PTB cannot read is reduced to its bare
    `update_id` (an update of no kind we handle), and one without a usable id is left out.

    PTB reads the whole batch at once: one malformed update would make `get_updates` raise
    (not a `TelegramError`) for the batch, every time it is fetched again, so no later
    command would ever arrive. Keeping the id confirms it with the others.
    """
    if not isinstance(answer, dict) or not isinstance(answer.get("result"), list):
        return answer
    readable: list[Any] = []
    for update in answer["result"]:
        try:
            Update.de_json(copy.deepcopy(update), None)
        except Exception as exc:
            update_id = update.get("update_id") if isinstance(update, dict) else None
            if isinstance(update_id, int) and not isinstance(update_id, bool):
                _log.warning(
                    "skipping Telegram update %d that cannot be read (%s)",
                    update_id,
                    type(exc).__name__,
                )
                readable.append({"update_id": update_id})
            else:
                _log.warning("skipping a Telegram update without a usable id")
            continue
        readable.append(update)
    return {**answer, "result": readable}


class LeanPollRequest(LeanRequest):
    """The getUpdates transport: `LeanRequest` whose answers pass `readable_updates`."""

    @staticmethod
    def parse_json_payload(payload: bytes) -> Any:
        return readable_updates(BaseRequest.parse_json_payload(payload))


class FloodAwarePollRequest(FloodAwareRequest):
    """The getUpdates transport behind a proxy: answers pass `readable_updates`."""

    @staticmethod
    def parse_json_payload(payload: bytes) -> Any:
        return readable_updates(BaseRequest.parse_json_payload(payload))


# The bot a command is addressed to, glued to it: `@` and a username (letters, digits, `_`).
_ADDRESSEE = re.compile(r"@([A-Za-z0-9_]*)")
# A mention of someone by username (`@OtherBot`), or one `with_mentions_marked` marked.
_SOMEONES_MENTION = re.compile(r"@[A-Za-z0-9_]+")
# How long the name after a command's `@` may be for Telegram to mark the command at all
# (tdlib's `match_bot_commands`): `/taskcard@`, with none, or `/taskcard@ab` is no command.
USERNAME_LENGTHS = (3, 32)


def mention_of(bot_username: str) -> re.Pattern[str]:
    """The bot's mention as a word of its own (`@ThisBot`, any case, as usernames compare),
    also typed more than once glued together (`@ThisBot@ThisBot`, one word naming the bot)."""
    return re.compile(f"(?<!\\S)(?:@{re.escape(bot_username)})+(?!\\w)", flags=re.I)


def glued_mention_of(bot_username: str) -> re.Pattern[str]:
    """The bot's mention wherever it stands, glued to a word before it or not."""
    return re.compile(f"@{re.escape(bot_username)}(?!\\w)", flags=re.I)


def parse_command(text: str, bot_username: str, command: str = COMMAND) -> str | None:
    """The arguments of a `/taskcard` (or `command`) command addressed to this bot, or None.

    `/taskcard@OtherBot` is someone else's command in a group and is ignored; the mention
    of this bot is matched case-insensitively, as Telegram usernames are. The command reads
    as it shows: invisible characters a client pasted around or between its words change
    nothing, and one glued to the command word ends it (`channels.base.command_readings`).
    The command word is what Telegram marks as one (`channels.base.command_word`): it ends
    at white space or at any character that is not a letter, digit, `_`, `/`, `<` or `>`
    (`/tell😀 builder hi` is `/tell` with "😀 builder hi"), and what follows it is its
    arguments, glued or not. A command glued to `@` is one only with 3 to 32 name
    characters after the sign, as Telegram marks it: `/taskcard@ off` is none. A mention
    of this bot addresses the command, as on Feishu: "@ThisBot /taskcard off", "/taskcard
    off @ThisBot" and "/taskcard off@ThisBot" are `off`, and so is the command addressed
    twice, "/taskcard@ThisBot@ThisBot off" (an option never holds an `@`); one to someone
    else after it, "/taskcard@ThisBot@Other off", is ours (Telegram marks the command up to
    the first name), with a mention among its options. In a `/tell` only the mention that
    addresses it goes (leading the message, or right after the command word, once or more):
    "/tell builder ask @ThisBot why" reaches the agent as written.
    """
    tell = command == TELL
    ours = mention_of(bot_username)
    if bot_username and not tell:
        text = glued_mention_of(bot_username).sub(" ", text)
    elif bot_username:
        text = drop_leading(text, ours)
    # The command ends at the first white space of any kind ("/tell\nbuilder ..."), or at
    # any other character Telegram ends one at ("/tell😀 builder", "/taskcard,off"); what
    # follows it is its arguments.
    for name, glued, rest in command_readings(text):
        if name.lower() != command:
            continue
        if (addressee := _ADDRESSEE.match(glued)) is not None:
            mention, glued = addressee.group(1), glued[addressee.end() :]
            if glued and not ends_command(glued[0]):
                continue  # "/taskcard@OurBotté" names no bot Telegram knows
            if not USERNAME_LENGTHS[0] <= len(mention) <= USERNAME_LENGTHS[1]:
                continue  # "/taskcard@ off", "/taskcard@ab": Telegram marks no command
            if mention.lower() != bot_username.lower():
                continue
        rest = glued + rest
        if bot_username and tell:
            rest = drop_leading(rest, ours)
        # Text for an agent keeps its line breaks; the bot's name glued to the agent's
        # ("builder@ThisBot") goes.
        glued_bot = re.compile(f"(?:@{re.escape(bot_username)})+", flags=re.I)
        return command_arguments(rest, tell=tell, bot=glued_bot if bot_username else None)
    return None


def command_from_update(update: Update, bot_username: str) -> IncomingCommand | None:
    """The command in a new message or channel post of `update`, or None (edits are never
    commands)."""
    message = update.message or update.channel_post
    # A picture or file sent with a caption is commanded by its caption, as a Feishu rich
    # message with a picture is by its text: "/tell builder see this" under a screenshot.
    if message is None:
        return None
    if message.forum_topic_reopened is not None:
        return reopened_command(message)
    if not typed_here(message):
        return None
    text = message.text or message.caption
    if not isinstance(text, str):
        # A picture, sticker or file without words: only as a reply to this bot's message
        # is it anything to us (text for an agent that has none, so the person is told).
        # The other pictures of an album come one update each, with the reply but not the
        # caption: only the one with the words is anything to us.
        if message.reply_to_message is None or message.media_group_id is not None:
            return None
        text = ""
    name: CommandName = "taskcard"
    reply_to: tuple[str, ...] = ()
    entities = message.entities if message.text is not None else message.caption_entities
    marked = with_mentions_marked(text, entities)
    ours = mention_of(bot_username)
    args = parse_command(marked, bot_username)
    if args is None:
        name, args = "tell", parse_command(text, bot_username, TELL)
    if args is not None and for_another_bot(message, bot_username):
        return None
    unknown_author = False
    if args is None:
        # A reply to one of this bot's messages (privacy mode still delivers those): text
        # for the agent whose message it answers, when the service knows that message.
        replied = message.reply_to_message
        if replied is None:
            return None
        author = replied.from_user
        unknown_author = author is None and channels_own(message, replied)
        if not unknown_author and (author is None or not author.is_bot):
            return None
        if author is not None and (author.username or "").lower() != bot_username.lower():
            return None
        head, _ = first_word(text)
        if other_bots_command(head, lambda name: name.lower() == bot_username.lower()):
            return None  # "/start@OtherBot" replying to our card is the other bot's
        unaddressed = drop_leading(marked, ours) if bot_username else marked
        if command_to_mentioned(unaddressed, _SOMEONES_MENTION):
            return None  # "@OtherBot /start" replying to our card is for whom it mentions
        # A mention of this bot leading the reply addresses it, as on Feishu; one inside
        # the text is the person's and reaches the agent as written.
        if bot_username and (dropped := drop_leading(text, ours)) != text:
            text = dropped.strip()
        name, args, reply_to = "reply", text, (str(replied.message_id),)
    thread = message.message_thread_id if message.is_topic_message else None
    return IncomingCommand(
        chat=ChatRef(str(message.chat.id), None if thread is None else str(thread)),
        args=args,
        user_id=person_id(message),
        message_id=str(message.message_id),
        chat_title=message.chat.effective_name,
        command=name,
        reply_to=reply_to,
        sent_as=on_behalf_of(message),
        reordered=name != "reply" and shows_reordered(text),
        replied_author_unknown=unknown_author,
        author_name=post_author(message),
        author_signature=post_author(message, signed=True),
        sent_as_chat=sent_as_chat(message),
    )


def channels_own(message: Message, replied: Message) -> bool:
    """Whether `message` is a channel's post replying to another post of the same channel.

    Telegram names no author of a channel's posts (no `from`): the bot's own card there is
    the channel's post as much as an administrator's is, so a reply to one may answer the
    bot; the service tells by the message's id (`IncomingCommand.replied_author_unknown`).
    """
    if message.chat.type != Chat.CHANNEL:
        return False
    sender = replied.sender_chat
    return sender is None or sender.id == message.chat.id


def person_id(message: Message) -> str | None:
    """The id of the person who wrote `message` (`IncomingCommand.user_id`), None when it
    names none: a channel's post (no `from`), a message an administrator of the group
    posted anonymously, whose `from` is the GroupAnonymousBot placeholder, one id for every
    such administrator of every group, and one a member sent as a channel, whose `from` is
    the Channel_Bot placeholder, one id for every channel."""
    if message.from_user is None or on_behalf_of(message) is not None:
        return None
    return str(message.from_user.id)


def post_author(message: Message, *, signed: bool = False) -> str | None:
    """The name a message that names no person shows as its author (a channel's post, an
    anonymous administrator's message in a group, or one sent there as a channel): its
    signature when it has one (the channel signs its posts; the administrator's custom
    title), else the title of the chat that speaks (the channel it was sent as, else the
    chat itself), so the agent reads who wrote a text, not "someone". None for every other
    message. A name anyone may choose, never a user id (`IncomingCommand.author_name`).
    `signed`: the signature alone, None for a message without one
    (`IncomingCommand.author_signature`): what tells one signer from another for the
    `/tell` rate and `/taskcard cancel`."""
    channel_post = message.from_user is None and message.chat.type == Chat.CHANNEL
    sent_as = on_behalf_of(message)
    if not channel_post and sent_as is None:
        return None
    if signed:
        return message.author_signature or None
    speaker = message.sender_chat if sent_as == "chat" else message.chat
    return message.author_signature or (speaker or message.chat).effective_name


def for_another_bot(message: Message, bot_username: str) -> bool:
    """Whether a command in `message` is another bot's because it replies to that bot's
    message without naming this bot (`/taskcard@ThisBot`, or a mention of it).

    Telegram delivers a command written as a reply to a bot's message to that bot: in a chat
    with two card services, "/taskcard off" replying to the other's card hides that one's
    cards, not ours. Feishu takes a command replying to another app's message, without our
    mention, as not ours alike. A message a bot sent on behalf of a chat (an anonymous
    administrator's GroupAnonymousBot) is a person's, and a command replying to it is ours.
    """
    replied = chosen_reply(message)
    author = None if replied is None else replied.from_user
    if replied is None or author is None or not author.is_bot or replied.sender_chat:
        return False
    if (author.username or "").lower() == bot_username.lower() or not bot_username:
        return False
    named = re.compile(f"@{re.escape(bot_username)}(?![A-Za-z0-9_])", flags=re.I)
    return named.search(message.text or message.caption or "") is None


def chosen_reply(message: Message) -> Message | None:
    """The message `message` replies to by its author's choice, None when none.

    In a forum topic Telegram gives every message that replies to nothing else the topic's
    first message (the service message that opened it) as `reply_to_message`: a command in
    a topic another bot opened is no reply to that bot.
    """
    replied = message.reply_to_message
    if replied is None:
        return None
    if message.is_topic_message and replied.message_id == message.message_thread_id:
        return None
    return replied


# What a mention of a person without a username stands as in `/taskcard`'s arguments: a
# mention, as `@alice` is, which the service answers as one without naming anyone.
MARKED_MENTION = "@_mention"


def with_mentions_marked(text: str, entities: Sequence[MessageEntity]) -> str:
    """`text` with each mention of a person who has no username (a `text_mention` entity:
    its text is the person's name, as the client showed it) written as `MARKED_MENTION`.

    For the options of `/taskcard`, none of which takes a mention: "/taskcard off Alice
    Smith" is answered as "/taskcard off @alice" is, naming no one, not as an unknown option.
    A `/tell` or a reply keeps the name as typed. The offsets count UTF-16 units
    (`mention_spans`); formatting entities, nested in a mention or around it, count for
    nothing. A mention over the command word makes the message no command, as Telegram marks
    none inside a mention.
    """
    units = text.encode("utf-16-le", "surrogatepass")
    spans = mention_spans(units, entities)
    if not spans:
        return text
    pieces: list[bytes] = []
    at = 0
    for start, end in spans:
        pieces += [units[2 * at : 2 * start], f" {MARKED_MENTION} ".encode("utf-16-le")]
        at = end
    pieces.append(units[2 * at :])
    return b"".join(pieces).decode("utf-16-le", "surrogatepass")


def mention_spans(units: bytes, entities: Sequence[MessageEntity]) -> list[tuple[int, int]]:
    """The (start, end) of each `text_mention` entity in the UTF-16 `units` of a text, in
    order, mentions that overlap joined into one (a mention of what they cover together).

    Telegram sends neither overlapping mentions nor offsets outside the text, but a client
    chooses its entities: each one that is not a span of the text (empty or negative, past
    its end, an edge between the halves of a surrogate pair, offsets that are no integers)
    is left out on its own, and the others still count.
    """
    size = len(units) // 2

    def unit(at: int) -> int:
        return int.from_bytes(units[2 * at : 2 * at + 2], "little")

    def inside_pair(at: int) -> bool:  # `at` falls between a high and a low surrogate
        return 0 < at < size and 0xD800 <= unit(at - 1) < 0xDC00 <= unit(at) < 0xE000

    spans: list[tuple[int, int]] = []
    for entity in entities:
        start, length = entity.offset, entity.length
        if entity.type != MessageEntity.TEXT_MENTION:
            continue
        if not all(isinstance(n, int) and not isinstance(n, bool) for n in (start, length)):
            continue
        end = start + length
        if 0 <= start < end <= size and not inside_pair(start) and not inside_pair(end):
            spans.append((start, end))
    joined: list[tuple[int, int]] = []
    for start, end in sorted(spans):
        if joined and start < joined[-1][1]:
            joined[-1] = (joined[-1][0], max(end, joined[-1][1]))
        else:
            joined.append((start, end))
    return joined


def on_behalf_of(message: Message) -> SentAs | None:
    """Whom `message` was sent on behalf of, when not a person (`IncomingCommand.sent_as`).

    Telegram marks a message an administrator posts anonymously with `sender_chat` = the group
    itself (its `from` is the placeholder GroupAnonymousBot, the same for every such admin),
    and a channel's own post with the channel; only the chat's administrators can send
    either. A `sender_chat` naming another chat (the linked channel, or a channel a member
    picked under "Send as") is that chat speaking: it names no person. Compared before a
    supergroup's id is read back as its group's (`as_original`): both ids are the new one.
    """
    sender = message.sender_chat
    if sender is None:
        return None
    return "admin" if sender.id == message.chat.id else "chat"


def sent_as_chat(message: Message) -> str | None:
    """The id of the other chat `message` was sent on behalf of (`on_behalf_of` "chat": a
    channel a member sends as, the linked channel), None for any other message
    (`IncomingCommand.sent_as_chat`)."""
    sender = message.sender_chat
    if sender is None or on_behalf_of(message) != "chat":
        return None
    return str(sender.id)


def typed_here(message: Message) -> bool:
    """Whether `message` was written in its chat by a person (or a chat's administrator
    signing as the chat), the only messages that command us or reach an agent.

    A forwarded message quotes someone else's words from elsewhere: its "/taskcard off" or
    "/tell builder ..." was never addressed to this chat's bot. That includes a post Telegram
    itself forwards from a linked channel into its discussion group, which would otherwise
    be the channel's command twice, and the group's too. A message from another bot (one not
    signing for a chat, as an anonymous administrator's GroupAnonymousBot does) is no one's
    command: Feishu, where bots never address each other, ignores its apps alike.
    """
    if message.forward_origin is not None or message.is_automatic_forward:
        return False
    sender = message.from_user
    return sender is None or not sender.is_bot or message.sender_chat is not None


def reopened_command(message: Message) -> IncomingCommand:
    """What the service is told when a forum topic was reopened (the service message every
    bot gets, privacy mode or not): the routes its closing disabled come back."""
    thread = message.message_thread_id if message.is_topic_message else None
    return IncomingCommand(
        chat=ChatRef(str(message.chat.id), None if thread is None else str(thread)),
        args="",
        user_id=None,
        message_id=str(message.message_id),
        command="reopened",
    )


def moved_command(old: str, new: str) -> IncomingCommand:
    """What the service is told when group `old` became supergroup `new`: its routes keep
    their id (`channels.telegram.moves`), and their cards are shown again there."""
    return IncomingCommand(chat=ChatRef(old), args=new, user_id=None, command="moved")


def move_in(update: Update) -> tuple[str, str] | None:
    """(old, new) from the service message of a group's upgrade, either half of the pair:
    `migrate_to_chat_id` in the old group, `migrate_from_chat_id` in the new supergroup."""
    message = update.message
    if message is None:
        return None
    if message.migrate_to_chat_id:
        return str(message.chat.id), str(message.migrate_to_chat_id)
    if message.migrate_from_chat_id:
        return str(message.migrate_from_chat_id), str(message.chat.id)
    return None


def as_original(command: IncomingCommand, moves: ChatMoves) -> IncomingCommand:
    """A command from a supergroup that a routed group became, as from that group (its
    routes and settings are kept under the group's id). A reply names its message by the
    qualified id alone: the plain number is that of a message of the supergroup, and the
    service's records of the group (a notice kept 30 days) hold the group's numbers plainly,
    so the plain one could name another message the service posted there."""
    new = command.chat.chat_id
    old = moves.original(new)
    if old is None:
        return command
    return replace(
        command,
        chat=ChatRef(old, command.chat.thread_id),
        reply_to=tuple(qualified(r, new) for r in command.reply_to),
    )


def learn_topic_name(topics: TopicNames, message: Message, chat_id: str) -> None:
    """Learn the forum topic's name `message` (of chat `chat_id`, as the service names the
    chat) tells, if it tells one: opened or renamed (newer than any known), or the message
    that opened the topic, which a message in it that replies to nothing else carries (the
    name it was opened with: one learnt otherwise is newer, and stays)."""
    if not message.is_topic_message or message.message_thread_id is None:
        return
    thread_id = str(message.message_thread_id)
    if message.forum_topic_created is not None:
        topics.learn(chat_id, thread_id, message.forum_topic_created.name, newer=True)
    elif message.forum_topic_edited is not None:
        topics.learn(chat_id, thread_id, message.forum_topic_edited.name, newer=True)
    elif (opened := message.reply_to_message) is not None and (
        opened.forum_topic_created is not None and opened.message_id == message.message_thread_id
    ):
        topics.learn(chat_id, thread_id, opened.forum_topic_created.name, newer=False)


def poll_backoff() -> Backoff:
    """Between failed polls (so an outage is not a busy loop): 0.5 s doubling to 30 s."""
    return Backoff(initial_s=0.5, max_s=30.0)


class CommandPoller:
    """Long-polls updates for one bot and hands `/taskcard` commands to a sink."""

    def __init__(
        self,
        bot: Bot,
        bot_username: str,
        cursor: CursorStore,
        sink: CommandSink,
        poll_timeout_s: int,
        backoff: Backoff | None = None,
        gate: PollGate | None = None,
        moves: ChatMoves | None = None,
        topics: TopicNames | None = None,
    ) -> None:
        self._bot = bot
        self._username = bot_username
        self._cursor = cursor
        self._sink = sink
        self._poll_timeout_s = poll_timeout_s
        self._backoff = backoff or poll_backoff()
        self._gate = gate
        self._moves = moves
        self._topics = topics

    def _stored_offset(self) -> int | None:
        raw = self._cursor.get_cursor(OFFSET_CURSOR_KEY)
        if raw is None:
            return None
        try:
            return int(raw)
        except ValueError:
            _log.warning("ignoring a malformed stored Telegram update offset")
            return None

    async def run(self) -> None:
        """Poll until cancelled. Errors back off and never end the loop."""
        offset = self._stored_offset()
        backoff = self._backoff
        token_refused = False
        while True:
            if self._gate is not None and await self._gate.wait_turn():
                # Another instance polled meanwhile: go on from what it committed.
                offset = self._stored_offset()
            try:
                updates = await self._bot.get_updates(
                    offset=offset,
                    timeout=self._poll_timeout_s,
                    allowed_updates=ALLOWED_UPDATES,
                )
            except tg.Conflict as exc:
                if "webhook" in str(exc).lower():
                    # A webhook left on the bot blocks polling for good; we own this bot's
                    # updates, so remove it (pending updates are kept) and poll again.
                    _log.warning("a webhook is set on this bot; removing it to poll commands")
                    try:
                        await self._bot.delete_webhook(drop_pending_updates=False)
                        continue
                    except tg.TelegramError as delete_error:
                        _log.error("could not remove the webhook: %s", delete_error)
                else:
                    _log.error(
                        "Telegram getUpdates conflict: another poller uses this bot; "
                        "commands are not received until it stops. If it is another "
                        "taskcard serve, each of the two also keeps its own card in every "
                        "chat: stop one, or run them as one cluster ([cluster] in both "
                        "configs, see docs/operators.md)"
                    )
                await backoff.asleep()
                continue
            except FloodWait as exc:
                _log.warning("Telegram getUpdates rate limited for %gs", exc.retry_after_s)
                wait_s = min(exc.retry_after_s, MAX_FLOOD_WAIT_S)  # the hint is untrusted
                await asyncio.sleep(max(wait_s, backoff.next_delay_s()))
                continue
            except tg.InvalidToken:
                # Revoked while serving: every poll is refused until a restart with a new
                # token, so it is said once, and polls go on at the slowest pace.
                if not token_refused:
                    token_refused = True
                    _log.error(
                        "Telegram rejected the bot token (invalid or revoked): commands are"
                        " not received; set a valid token and restart the service"
                    )
                await backoff.asleep()
                continue
            except tg.TelegramError as exc:
                _log.warning("Telegram getUpdates failed (%s); retrying", type(exc).__name__)
                await backoff.asleep()
                continue
            except Exception as exc:
                # An answer PTB cannot read at all (`readable_updates` mends single updates):
                # the poll goes on, as after any other failure.
                _log.warning(
                    "Telegram getUpdates answer unreadable (%s); retrying", type(exc).__name__
                )
                await backoff.asleep()
                continue
            backoff.reset()
            if not updates:
                continue
            for update in updates:
                try:
                    command = self._command_in(update)
                except Exception:
                    # One update we cannot make sense of must not stop the ones after it.
                    _log.exception("skipping Telegram update %d", update.update_id)
                    command = None
                if command is not None:
                    await self._deliver(command)
                    # Confirm each handled command at once: a stop mid-batch replays none.
                    self._confirm(update.update_id + 1)
            offset = updates[-1].update_id + 1
            self._confirm(offset)

    def _command_in(self, update: Update) -> IncomingCommand | None:
        """The command `update` brings, seen from the group a supergroup was (if it was)."""
        command = command_from_update(update, self._username)
        message = update.message
        if self._topics is not None and message is not None:
            chat_id = str(message.chat.id)
            original = self._moves.original(chat_id) if self._moves is not None else None
            learn_topic_name(self._topics, message, original or chat_id)
        if self._moves is not None:
            move = move_in(update)
            if move is not None and self._moves.learn(*move):
                command = moved_command(*move)
            elif command is not None:
                command = as_original(command, self._moves)
        return command

    def _confirm(self, offset: int) -> None:
        """Persist the offset; a failing store is one line (its error says why: a state
        store that cannot write, a poll lease that lapsed while the store was away), and
        polling goes on regardless: the commands before it were handed to the sink, and a
        poll from an older offset fetches them again (in a cluster, the relay drops them as
        duplicates)."""
        try:
            self._cursor.set_cursor(OFFSET_CURSOR_KEY, str(offset))
        except Exception as error:
            _log.warning(
                "could not record the Telegram update offset (%s: %s); polling on",
                type(error).__name__,
                " ".join(str(error).split())[:300],
            )

    async def _deliver(self, command: IncomingCommand) -> None:
        try:
            await self._sink(command)
        except asyncio.CancelledError:
            raise
        except Exception:
            # One failing command must not stop commands for every chat; the sink owns
            # its errors, we only make sure the failure is visible.
            _log.exception("handling a /taskcard command from chat %s failed", command.chat)
