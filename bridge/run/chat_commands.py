"""What people say in a chat: the `/taskcard` commands, and the text they send an agent.

A channel hands every command it reads to `_on_command`: `/taskcard` and its options (the
state here, off, on, rows, cancel, board, cards, orchestrator, help), `/tell AGENT TEXT`, a
reply to an agent's card, to the status message of a text sent to it or to a notice about
it (`_text_for_agent`, queued in the agent's inbox through the desk), and the platform's
own news of a chat (a Telegram group given a new id, a forum topic reopened). A sender the
chat's routes do not let command it is refused (`may_command`, `refusal`), once in a while;
a command from a forum topic no route follows is told where the cards are
(`no_cards_here`); a reply that reaches no agent is told how to reach one. Clustered, a
command one instance cannot answer alone looks at what the other instances route there
(`_ours_in_cluster`, `_named_agent`, `_cancel_in_cluster`, `_states_elsewhere`). Every
answer is the service's own words or typed fields: never the person's text, nor the agent
name they typed.

Parsing `/taskcard`'s arguments: `bridge.run.commands`; the inbox and status messages:
`bridge.run.inbox_desk`.

A mixin of `Service`, not a collaborator: a command reads and changes the chat's routes,
preferences, view and orchestrator, re-projects its cards and board, and answers through
the service's scheduler and renderers, so a separate object would need a reference to most
of the service. Its state (`_refused`, `_hinted`, `_unread_told`, `_cluster_names`) is made
in `Service.__init__` with the rest; what it uses of the service is declared below, for the
type checker.
"""

from __future__ import annotations

import logging
import unicodedata
from collections.abc import Awaitable, Callable, Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Final, TypeVar

from taskcard.bridge.compose.board import facts_from_record
from taskcard.bridge.compose.redact import Redactor
from taskcard.bridge.compose.view import compose_view, format_at
from taskcard.bridge.config import AGENT_ID_PATTERN, ServiceConfig
from taskcard.bridge.notices.outbox import NoticeOutbox
from taskcard.bridge.notices.signals import report_outcome, report_summary
from taskcard.bridge.run.boards import ChatViews, board_key
from taskcard.bridge.run.commands import (
    MAX_ROWS,
    MIN_ROWS,
    ORCHESTRATOR_OFF,
    apply_to_prefs,
    parse_taskcard,
    rows_out_of_range,
    suggestion,
    without_mentions,
)
from taskcard.bridge.run.fleet import Route
from taskcard.bridge.run.inbox_desk import NOTHING_TO_CANCEL, InboxDesk, latest_written
from taskcard.bridge.run.orchestrators import ChatMarks, ChatOrchestrators, unfollowed_choice
from taskcard.bridge.run.origins import OriginBook
from taskcard.bridge.schedule.scheduler import RouteKey, RouteScheduler
from taskcard.bridge.store.sqlite import ChatPrefs, SeenChat, StateStore
from taskcard.bridge.track.monitor import AgentMonitor
from taskcard.bridge.track.reports import AgentSide
from taskcard.channels.base import (
    CardView,
    Channel,
    ChatRef,
    IncomingCommand,
    Outgoing,
    RouteView,
    counted,
    folded,
    typed_form,
    without_ignorable,
)
from taskcard.producers.task_card.contract import one_line_cut, shows_text

if TYPE_CHECKING:
    from taskcard.bridge.cluster.boards import SharedBoards

log = logging.getLogger(__name__)
# What a write into an inbox returns, passed through `Service._showing_inbox`.
_T = TypeVar("_T")
# Clustered: the agents the whole cluster routes to a chat (None when Redis did not answer).
ClusterNames = Callable[[str, ChatRef], Awaitable[list[str] | None]]


HELP_TEXT = (
    "/taskcard: show the state here · /taskcard off: hide the cards · "
    "/taskcard on: show them · /taskcard N: show N activity rows (1-10) · "
    "/tell AGENT TEXT (or a reply to an agent's card or notice): send it text · "
    "/taskcard cancel: withdraw your latest queued text · "
    "/taskcard board: one board for all agents · /taskcard cards: one card per agent · "
    "/taskcard orchestrator AGENT|off: the agent the others' reports and signals wake"
)
# The answer to a reply to the chat's board, before the agents a `/tell` may name.
BOARD_REPLY = (
    "A reply to the task board reaches no agent: reply to an agent's card or notice, or write"
    " /tell AGENT TEXT."
)
# The answer to a reply to another message of the service's that is about no one agent (the
# `/taskcard` answer, the help, a refusal, the card of an agent no longer served there),
# before the agents a `/tell` may name when they fit in `HINT_NAMES_CHARS`.
NO_AGENT_REPLY = (
    "A reply to this message reaches no agent: reply to an agent's card or to a notice about"
    " it, or write /tell AGENT TEXT."
)
# The answer to a reply to one of the service's messages when the state could not be read
# to tell whether that message was a notice about an agent: nothing reached an agent, and the
# hint above could be wrong (the message may be a notice), so the person is told to try again.
UNREAD_REPLY = (
    "Your reply was not delivered: the task card service could not read its state just now."
    " Send it again in a minute, or write /tell AGENT TEXT."
)
HINT_NAMES_CHARS: Final = 200
# The answers to a command its sender may not give where only listed people command (see
# `refusal`): sent on behalf of another chat, or by a person not on the list.
SENT_AS_CHAT = (
    "Only the people listed for this chat can use task cards here, and this message was sent"
    " on behalf of a channel or another chat, which names no person. Send it again as"
    ' yourself (choose your own name under "Send as").'
)
NOT_LISTED = (
    "Only the people listed for this chat can use task cards here. To be added, give whoever"
    " runs the task card service your user id: {user_id}"
)
# A sender refused in a chat is not answered again there for this long; at most this many
# senders are remembered (the oldest forgotten first).
REFUSAL_QUIET_S = 600.0
REFUSED_KEPT = 10_000
# A report summary in the `/taskcard` answer: a glance at each agent, one line each (the
# "report available" notice carries the longer one).
LISTED_SUMMARY_CHARS: Final = 120
# How long a cluster keeps which message a `/taskcard cancel` withdraws: an instance reads
# the command stream seconds behind the others at most (a day covers a Redis outage).
CANCEL_DECISION_KEEP_S = 86_400.0
# The `/taskcard` answer is built to fit the smallest platform's message (Telegram's 4096
# UTF-16 units) with room for redaction, so every chat gets the same answer and an agent that
# does not fit is counted in its last line rather than cut off unseen by the platform's cut.
STATE_TEXT_UTF16: Final = 3800


def may_command(route: Route, command: IncomingCommand) -> bool:
    """Whether `command`'s sender may command `route` (and talk to its agents).

    Without `allowed_user_ids` anyone in the chat may. With it, a person must be on the list;
    an administrator of the chat posting anonymously (or a channel's own post) is let in as
    the chat's administrator, the platform's word being that only they can send it; a message
    sent on behalf of another chat (a linked channel) names no person, so it is not let in."""
    if route.allowed_user_ids is None or command.sent_as == "admin":
        return True
    return command.sent_as is None and command.user_id in route.allowed_user_ids


def cards_where(command: IncomingCommand, routes: list[Route]) -> str:
    """Where the cards of `routes` are, as an answer to `command` names it: "here" when
    that is where the command was written. A command from a Telegram forum topic that has
    no route of its own acts on the routes of the whole chat, whose cards are in the
    General topic, not in the topic the answer goes to; Feishu's routes are always the
    whole chat's, and a command written in a topic or a reply thread is answered there,
    while the cards are the chat's, posted outside it. Saying "here" then was untrue."""
    if command.chat.thread_id is not None and all(r.key.chat.thread_id is None for r in routes):
        return "in this chat's General topic"
    if command.message_thread is not None:
        return "in this chat"
    return "here"


# At most this many topics are named by an answer from a topic that no route follows.
NAMED_TOPICS = 8


def no_cards_here(
    command: IncomingCommand,
    routes: list[Route],
    topic_name: Callable[[ChatRef], str | None] = lambda chat: None,
) -> str:
    """The answer to a command from the part of a Telegram forum chat that no route follows
    (a topic with no route of its own, or the General topic) while `routes`, the chat's
    other routes, follow topics of it: the chat is one the service serves, so the command is
    answered rather than ignored as one from a chat it does not know. It names the topics
    that have cards by their names where the channel has seen them (`topic_name`,
    `Channel.topic_name`: cleaned, quoted), else by thread id, and the route that would give
    this part of the chat cards of its own (by its thread id, which the route takes)."""
    topics = sorted({r.key.chat.thread_id or "" for r in routes} - {""}, key=lambda t: (len(t), t))
    chat, thread = command.chat.chat_id, command.chat.thread_id
    names = {topic: topic_name(ChatRef(chat, topic)) for topic in topics[:NAMED_TOPICS]}
    named = [f'topic "{name}"' if name else f"topic {topic}" for topic, name in names.items()]
    if len(topics) > NAMED_TOPICS:
        named.append(counted(len(topics) - NAMED_TOPICS, "other topic", "other topics"))
    places = named[0] if len(named) == 1 else f"{', '.join(named[:-1])} and {named[-1]}"
    if not any(names.values()):
        places += " (by thread id)"
    if thread is None:
        return (
            f"No task cards in this chat's General topic: this chat's are in {places}. For"
            f" cards here, whoever runs the task card service adds a route for chat {chat}"
            " without a thread_id (it also serves every topic without a route of its own)."
        )
    return (
        f"No task cards in this topic: this chat's are in {places}. For cards here, whoever"
        f" runs the task card service adds a route for chat {chat} with thread_id = {thread}."
    )


def _sender(command: IncomingCommand) -> str | None:
    """Who gave `command`, for what is told per sender (an answer replacing only the same
    sender's unsent one, a refusal said once in a while): its writer (`IncomingCommand
    .writer`: the person, or each signer of a Telegram channel's posts and each anonymous
    administrator's title, who all share one sender id), else the chat it was sent on
    behalf of."""
    return command.writer or command.sent_as


def _answer_key(command: IncomingCommand) -> str:
    """What an answer to `command` replaces while unsent (`RouteScheduler.send_reply`): an
    earlier answer to the same sender's same command (`/taskcard` or `/tell`), never
    another person's, nor one that says a `/tell` went nowhere."""
    return f"{command.command}:{_sender(command) or ''}"


def refusal(command: IncomingCommand) -> str | None:
    """The answer to `command` from a sender `may_command` refused, None for none.

    A message sent on behalf of another chat is told to come from a person. A person not on
    the list is told so, with the id the operator would add, for a `/taskcard` or a `/tell`;
    a reply to a card is left unanswered, as it may be people talking about the card among
    themselves."""
    if command.sent_as == "chat":
        return SENT_AS_CHAT
    if command.command not in ("taskcard", "tell") or not command.user_id:
        return None
    return NOT_LISTED.format(user_id=command.user_id)


class ChatCommands:
    """The chat commands of `Service` (see the module docstring)."""

    # Made by `Service.__init__`.
    _config: ServiceConfig
    _channels: dict[str, Channel]
    _store: StateStore
    _clock: Callable[[], datetime]
    _redact: Redactor
    _owned: set[str] | None
    _cluster_names: ClusterNames | None
    _origins: OriginBook
    _origin_allowed: Mapping[str, frozenset[str]] | None
    _refused: dict[tuple[str, str, str | None, str], float]
    _hinted: dict[tuple[str, str, str | None, str], float]
    _unread_told: dict[tuple[str, str, str | None, str], float]
    _outbox: NoticeOutbox
    _scheduler: RouteScheduler
    _routes: list[Route]
    _routes_by_scope: dict[str, list[Route]]
    _monitors: dict[str, AgentMonitor]
    _sides: dict[str, AgentSide]
    _desk: InboxDesk
    _prefs: dict[str, ChatPrefs]
    _views: ChatViews
    _orchestrators: ChatOrchestrators
    _shared_boards: SharedBoards | None

    if TYPE_CHECKING:  # the service's, used here

        def _serves(self, agent_id: str) -> bool: ...
        def _routes_in(self, channel: str, chat: ChatRef) -> list[Route]: ...
        def _chat_prefs(self, scope: str) -> ChatPrefs: ...
        def _project_route(self, route: Route) -> None: ...
        def _close_route(self, route: Route, final: Outgoing | None) -> None: ...
        def _render_card(self, channel: Channel, view: CardView) -> Outgoing: ...
        def _render_text(self, channel: Channel, text: str, *, own: bool = False) -> Outgoing: ...
        def _mark_board(self, scope: str) -> None: ...
        def _orchestrator_of(self, scope: str, marks: ChatMarks | None = None) -> str | None: ...
        def _showing_inbox(self, agent_id: str, write: Callable[[], _T]) -> _T: ...
        async def _chat_marks(
            self, channel_name: str, command: IncomingCommand, scope: str, named: str | None = None
        ) -> ChatMarks: ...

    async def _on_command(self, channel_name: str, command: IncomingCommand) -> None:
        chat = command.chat
        if command.command == "moved":
            self._chat_moved(channel_name, chat)
            return
        if command.command == "reopened":
            self._topic_reopened(channel_name, chat)
            return
        self._store.record_chat(  # routed or not: `taskcard chats` lists it for the operator
            SeenChat(
                channel_name,
                chat.chat_id,
                chat.thread_id,
                command.chat_title,
                self._clock().timestamp(),
            )
        )
        routes = self._routes_in(channel_name, command.chat)
        if not routes:
            if not self._no_route_here(channel_name, command):
                log.info(
                    "ignoring /taskcard from an unrouted chat %s:%s", channel_name, command.chat
                )
            return
        replying = command.command != "reply" and bool(command.reply_to)
        ours = not replying or self._ours(routes, command)
        if not ours and not await self._ours_in_cluster(channel_name, command):
            return  # a command replying to someone else's message, without the bot's mention
        allowed = [r for r in routes if may_command(r, command)]
        if not allowed:
            log.info("refusing /taskcard from a user not allowed in %s", routes[0].key.chat_scope)
            self._refuse(channel_name, command)
            return
        for route in allowed:
            self._scheduler.enable(route.key)  # the bot can read this chat: it is back
        scope = allowed[0].key.chat_scope
        # Answered where it was asked: a forum topic of a chat routed as a whole gets the
        # answer in that topic, not in the General topic where the cards are, and the
        # answer names where they are (`cards_where`).
        reply_chat = command.chat
        where = cards_where(command, allowed)
        channel = self._channels[channel_name]
        if command.command != "taskcard":
            answer = await self._text_for_agent(channel_name, command, allowed)
            if answer is not None:
                # Refusals of the service's own words (they never quote the person's text).
                outgoing = self._render_text(channel, answer, own=True)
                self._answer(channel_name, reply_chat, outgoing, command)
            return
        parsed = parse_taskcard(command.args)
        prefs = apply_to_prefs(parsed, self._chat_prefs(scope))
        if parsed.action == "state":
            marks = await self._chat_marks(channel_name, command, scope)
            reply = self._state_text(
                allowed, prefs, marks, await self._states_elsewhere(scope, marks), where
            )
        elif parsed.action == "off":
            self._outbox.suppress(route.key for route in allowed)
            reply = f"Task cards hidden {where}. /taskcard on shows them again."
            if any(route.origin for route in allowed):
                self._close_origin_routes([r for r in allowed if r.origin], scope)
                allowed = [r for r in allowed if not r.origin]
                if not allowed:
                    reply = (
                        f"Task cards from turns of this chat are off {where} until its next turn."
                    )
                    prefs = self._chat_prefs(scope)  # nothing left here to hide
        elif parsed.action == "on":
            reply = f"Task cards shown {where}."
        elif parsed.action == "rows" and parsed.rows is not None:
            rows = counted(parsed.rows, "activity row", "activity rows")
            reply = f"Task cards {where} now show {rows}."
        elif parsed.action == "cancel" and self._owned is not None:
            answer = self._cancel_in_cluster(channel_name, command)
            if answer is not None:
                outgoing = self._render_text(channel, answer, own=True)
                self._answer(channel_name, reply_chat, outgoing, command)
            return
        elif parsed.action == "cancel":
            reply = self._desk.cancel_latest(
                channel_name, command.chat, command.writer, command.message_thread
            )
        elif parsed.action in ("board", "cards"):
            reply = self._switch_view(allowed, "board" if parsed.action == "board" else "cards")
        elif parsed.action == "orchestrator":
            marks = await self._chat_marks(channel_name, command, scope, parsed.agent)
            reply = self._orchestrator_command(
                allowed, parsed.agent, len(allowed) < len(routes), marks, command.reordered
            )
        elif parsed.action == "help":
            reply = f"Task card commands here: {HELP_TEXT}"
        else:
            # Never echoed: the arguments are a chat member's text, and a reply quoting them
            # could carry a platform mention (Feishu `<at user_id="all">`) or markup.
            # A suggestion is one of the options written out, never the typed text.
            meant = suggestion(command.args)
            hint = f" Did you mean {meant}?" if meant else ""
            reply = f"Unknown option.{hint} {HELP_TEXT}"
            unmentioned = without_mentions(command.args)
            if unmentioned is not None:
                # Named as a mention, never quoted: a Feishu placeholder means nothing to
                # the person, and a Telegram username is theirs to know.
                # The option written out, but for an agent's name (a person's text).
                action = parse_taskcard(unmentioned).action
                alone = "/taskcard" if not unmentioned else suggestion(unmentioned)
                if action == "unknown":
                    reply = f"Unknown option: /taskcard takes no mention. {HELP_TEXT}"
                elif action == "orchestrator" or alone is None:
                    reply = "/taskcard takes no mention: send it without the mention."
                else:
                    reply = f"/taskcard takes no mention: send {alone} without it."
            elif command.reordered:
                reply = f"Unknown option: {_reordered('the option', command.args)} {HELP_TEXT}"
            elif rows_out_of_range(command.args):
                reply = (
                    f"A card shows {MIN_ROWS} to {MAX_ROWS} activity rows: /taskcard {MAX_ROWS}"
                    f" shows the most, /taskcard {MIN_ROWS} the fewest."
                )
        if prefs != self._chat_prefs(scope):
            self._store.set_prefs(scope, prefs)
            self._prefs[scope] = prefs
            for route in allowed:
                self._project_route(route)
            self._mark_board(scope)
        if not command.reply:
            return  # clustered: another instance that routes this chat answers
        # Every answer but the state's (which quotes the agents' reports) is the service's own.
        outgoing = self._render_text(channel, reply, own=parsed.action != "state")
        self._answer(channel_name, reply_chat, outgoing, command)

    def _no_route_here(self, channel_name: str, command: IncomingCommand) -> bool:
        """Answer a command from a forum topic (or the General topic) that no route follows
        in a chat whose other topics have routes (`no_cards_here`); False when the chat has
        no route at all, which stays unanswered. A command that replies to another message,
        and a reply, are not the service's to answer. Its sender must be one the chat's
        routes let command them (else refused, as in a routed chat), and is told once in
        `REFUSAL_QUIET_S` per topic, like the other hints, so that repeating it does not
        spend the chat's send budget on answers."""
        chat_routes = [
            r
            for r in self._routes
            if r.key.channel == channel_name and r.key.chat.chat_id == command.chat.chat_id
        ]
        if not chat_routes:
            return False
        if command.command not in ("taskcard", "tell") or command.reply_to or command.agent_glued:
            return True
        if not any(may_command(r, command) for r in chat_routes):
            self._refuse(channel_name, command)
            return True
        if not command.reply or self._told_lately(self._hinted, channel_name, command):
            return True
        text = no_cards_here(command, chat_routes, self._channels[channel_name].topic_name)
        outgoing = self._render_text(self._channels[channel_name], text, own=True)
        self._answer(channel_name, command.chat, outgoing, command)
        return True

    def _answer(
        self, channel_name: str, chat: ChatRef, outgoing: Outgoing, command: IncomingCommand
    ) -> None:
        """Queue `outgoing` as the answer to `command` in `chat`: posted as a reply to it, and
        replacing only an unsent answer to the same sender's same command (`_answer_key`)."""
        self._scheduler.send_reply(
            channel_name, chat, outgoing, command.answer_to, collapse_key=_answer_key(command)
        )

    def _refuse(self, channel_name: str, command: IncomingCommand) -> None:
        """Answer a command its sender may not give (`refusal`), at most once per sender and
        chat in `REFUSAL_QUIET_S`: a member who repeats it must not spend the chat's send
        budget, which the cards share, on answers."""
        text = refusal(command)
        if text is None or not command.reply:
            return
        if self._told_lately(self._refused, channel_name, command):
            return
        # Not `own`: the answer may carry the sender's id, a value the platform gave.
        outgoing = self._render_text(self._channels[channel_name], text)
        self._answer(channel_name, command.chat, outgoing, command)

    def _told_lately(
        self,
        told: dict[tuple[str, str, str | None, str], float],
        channel_name: str,
        command: IncomingCommand,
    ) -> bool:
        """Whether `command`'s sender was told (`told`: when each sender was) in its chat
        within `REFUSAL_QUIET_S`; if not, they are counted as told now. At most
        `REFUSED_KEPT` senders are remembered, the oldest forgotten first."""
        now_s = self._clock().timestamp()
        sender = _sender(command) or ""
        key = (channel_name, command.chat.chat_id, command.chat.thread_id, sender)
        last_s = told.get(key)
        if last_s is not None and 0 <= now_s - last_s < REFUSAL_QUIET_S:
            return True
        if len(told) >= REFUSED_KEPT:
            for old in [k for k, at in told.items() if not 0 <= now_s - at < REFUSAL_QUIET_S]:
                del told[old]
            while len(told) >= REFUSED_KEPT:
                del told[next(iter(told))]
        told[key] = now_s
        return False

    def _ours(self, routes: list[Route], command: IncomingCommand) -> bool:
        """Whether `command` replies to one of this service's messages in the chat: a card,
        the chat's board, the status message of a text sent to an agent, or, where a reply
        does not say who wrote the message replied to, any message the service (any
        instance of a cluster) posted there: a notice, an answer, another instance's card."""
        keys = [r.key for r in routes] + [board_key(r.key) for r in routes]
        mine = {self._shown_id(key) for key in keys}
        if not mine.isdisjoint(command.reply_to):
            return True
        channel = routes[0].key.channel
        if self._desk.shows_status(channel, command.reply_to):
            return True
        if self._channels[channel].replies_name_author:
            return False
        return self._store.sent_any(channel, command.reply_to, self._clock().timestamp())

    async def _ours_in_cluster(self, channel_name: str, command: IncomingCommand) -> bool:
        """Clustered: whether `command` replies to the card of an agent another instance
        routes to the chat (its id is in the shared store). Asked only of a command that
        replies to a message this instance does not know."""
        if self._cluster_names is None:
            return False
        names = await self._cluster_names(channel_name, command.chat)
        chats = {command.chat, ChatRef(command.chat.chat_id)}
        for name in names or ():
            for chat in chats:
                if self._shown_id(RouteKey(channel_name, chat, name)) in command.reply_to:
                    return True
        return False

    def _shown_id(self, key: RouteKey) -> str | None:
        """The message id of the route's resident. Clustered, a resident another instance
        sends (another instance's agent, a board sent elsewhere) is known from the shared
        store only: a command replying to it is the bot's all the same."""
        found = self._scheduler.message_id(key)
        if found is None and self._owned is not None:
            record = self._store.resident(key.store_key)
            found = None if record is None else record.message_id
        return found

    def _chat_moved(self, channel_name: str, chat: ChatRef) -> None:
        """The platform gave `chat` a new id (a Telegram group upgraded to a supergroup). Its
        routes keep their keys, and with them the residents' history, the chat's settings and
        its notices; the channel sends to the new id. What the old chat shows stays there,
        read-only, so each resident is shown again now: its edit finds the message gone and
        posts exactly one replacement in the new chat."""
        self._origin_allowed = None
        routes = [
            r
            for r in self._routes
            if r.key.channel == channel_name and r.key.chat.chat_id == chat.chat_id
        ]
        for route in routes:
            self._scheduler.reshow(route.key)
            self._project_route(route)
        for board in {board_key(route.key) for route in routes}:
            self._scheduler.reshow(board)
            self._mark_board(board.chat_scope)

    def _topic_reopened(self, channel_name: str, chat: ChatRef) -> None:
        """A forum topic was reopened: its routes, disabled while it was closed, post again
        (a route of another reason comes back too; if that reason holds, it is disabled
        again by the next refusal)."""
        for route in self._routes:
            if route.key.channel == channel_name and route.key.chat == chat:
                if self._scheduler.disabled_reason(route.key) is not None:
                    log.info("route %s enabled again: its forum topic was reopened", route.key)
                self._scheduler.enable(route.key)

    def _close_origin_routes(self, routes: list[Route], scope: str) -> None:
        """`/taskcard off` where turns opened routes: each resident says hidden, then closes."""
        prefs = self._chat_prefs(scope)
        for route in routes:
            channel = self._channels[route.key.channel]
            final = None
            monitor = self._monitors.get(route.key.agent_id)
            if monitor is not None and self._scheduler.has_message(route.key):
                view = compose_view(
                    route.key.agent_id,
                    monitor.card,
                    monitor.activity,
                    hidden=True,
                    activity_rows=prefs.activity_rows or self._config.display.activity_rows,
                    now=self._clock(),
                    zone=route.zone,
                )
                final = self._render_card(channel, view)
            self._origins.close(route.key, self._clock().timestamp())
            log.info("route %s closed by /taskcard off", route.key)
            self._close_route(route, final)

    async def _text_for_agent(
        self, channel_name: str, command: IncomingCommand, routes: list[Route]
    ) -> str | None:
        """`/tell AGENT TEXT` or a reply to an agent's resident, to the status message of a
        text sent to it, or to a notice about it: queue the text in its inbox.

        Returns the answer this instance gives (a refusal; it never quotes the person's text
        or the agent name they typed), None when it gives none: the text was queued (its
        status message answers), or, clustered, another instance answers for it.
        """
        if command.command == "reply":
            blank = not shows_text(command.args)  # a picture, sticker or file: no words
            agent_id = next(
                (
                    r.key.agent_id
                    for r in routes
                    if self._scheduler.message_id(r.key) in command.reply_to
                ),
                None,
            )
            if agent_id is None:
                # The status message of a text sent to an agent of this chat reads like its
                # card (the agent's line heads it): a reply to it was silently dropped.
                agent_id = self._desk.status_agent(channel_name, command.chat, command.reply_to)
                read = True
                if agent_id is None:
                    # A notice (an error, a refresh budget used up, a report, an exit...) is
                    # about one agent: a reply to it is for that agent, as one to its card.
                    read, agent_id = self._notice_agent(channel_name, command)
                if agent_id is None:
                    if blank:
                        return None  # a picture answering anything else is not for us
                    return self._not_for_an_agent(channel_name, command, routes, read=read)
                if agent_id not in {r.key.agent_id for r in routes}:
                    return None  # its agent left, or its sender may not talk to it here
            text = command.args
            if blank:
                # Nothing to queue. Told once in a while per person, as the other hints are:
                # stickers answering a card, or pictures in a Feishu thread under it, are
                # common talk, and every answer spends the chat's message budget.
                if self._told_lately(self._hinted, channel_name, command):
                    return None
                return (
                    f"Only text reaches {agent_id}: write your words in the reply"
                    " (pictures, stickers and files are not sent)."
                )
        else:
            # The agent's name ends at any white space: "/tell builder\nline one" is common.
            name, text = [*command.args.split(maxsplit=1), "", ""][:2]
            here = sorted({r.key.agent_id for r in routes})
            found = await self._named_agent(channel_name, command, name, here)
            if isinstance(found, str) or found is None:
                return found
            agent_id = found[0]
        if not self._serves(agent_id) or not self._desk.accepts(agent_id):
            return None  # a standby of a cluster: the owner queues it, once
        return self._showing_inbox(
            agent_id,
            lambda: self._desk.queue(
                channel_name,
                command.chat,
                agent_id,
                command.user_id,
                text,
                command.answer_to,
                author_name=command.author_name,
                writer=command.writer,
            ),
        )

    def _not_for_an_agent(
        self, channel_name: str, command: IncomingCommand, routes: list[Route], *, read: bool
    ) -> str | None:
        """The answer to a reply that is to no agent's card, status message or notice (None:
        no answer): one to the board or to another message of the service is told how to
        reach an agent; one to someone else's message is theirs, not the service's. Not
        `read`: whether the message replied to was a notice could not be looked up, so one
        to a message of the service is told that it was not delivered, not where to reply.

        Each person is told once in `REFUSAL_QUIET_S` (`_told_lately`), and a message that
        is merely written in a thread (`IncomingCommand.in_thread`: Feishu makes every
        message of a thread a reply to its root) is told nothing: people talking in a thread
        opened on an answer or the board did not try to reach an agent."""
        if not command.reply:
            return None  # clustered: another instance answers
        if command.in_thread:
            return None  # merely written in a thread on the message: no one was addressed
        if self._replies_to_board(routes, command):
            # The board speaks for every agent of the chat: which one the text is for cannot
            # be told, and it used to go nowhere without a word.
            if self._told_lately(self._hinted, channel_name, command):
                return None
            here = sorted({r.key.agent_id for r in routes})
            return f"{BOARD_REPLY} {_unknown_agent(here)}"
        if not self._replies_to_service(channel_name, command):
            return None
        if not read:
            if self._told_lately(self._unread_told, channel_name, command):
                return None
            return UNREAD_REPLY
        return self._no_agent(channel_name, command, routes)

    def _replies_to_service(self, channel_name: str, command: IncomingCommand) -> bool:
        """Whether the reply `command`, about no agent's card, status message or notice,
        answers another message the service posted (where replies do not say who wrote the
        message replied to, one it remembers posting). Not the card of an agent of the chat
        its sender may not talk to (left unanswered, see `refusal`). Alone: clustered,
        another instance's status message is one this instance cannot tell from an answer,
        so there such a reply stays unanswered."""
        if self._owned is not None:
            return False
        chat_routes = self._routes_in(channel_name, command.chat)
        if any(self._shown_id(r.key) in command.reply_to for r in chat_routes):
            return False
        if self._channels[channel_name].replies_name_author and not command.replied_author_unknown:
            return True  # the channel passes on only replies to the bot's own messages
        try:
            return self._store.sent_any(channel_name, command.reply_to, self._clock().timestamp())
        except Exception as error:
            log.warning(
                "%s: could not look up whether a reply answers one of the service's messages (%s)",
                channel_name,
                type(error).__name__,
            )
            return False

    def _no_agent(
        self, channel_name: str, command: IncomingCommand, routes: list[Route]
    ) -> str | None:
        """The answer to a reply to one of the service's messages that is about no agent
        served in the chat (the `/taskcard` answer, the help, a refusal, a retired card): how
        to reach one. Once per sender and chat in `REFUSAL_QUIET_S`, as a refusal, so that
        people talking in a thread under an answer do not spend the chat's send budget."""
        if self._told_lately(self._hinted, channel_name, command):
            return None
        return no_agent_hint(sorted({r.key.agent_id for r in routes}))

    def _notice_agent(self, channel_name: str, command: IncomingCommand) -> tuple[bool, str | None]:
        """Whether the state could be read, and the agent a notice `command` replies to was
        about (None when it is none). When the state cannot be read now, (False, None): the
        reply is told it was not delivered (`_not_for_an_agent`); the error's own text may
        quote a key, so only its kind is logged."""
        try:
            found = self._store.notice_agent(
                channel_name, command.chat.chat_id, command.reply_to, self._clock().timestamp()
            )
        except Exception as error:
            log.warning(
                "%s: could not look up whether a reply answers a notice (%s)",
                channel_name,
                type(error).__name__,
            )
            return False, None
        return True, found

    def _replies_to_board(self, routes: list[Route], command: IncomingCommand) -> bool:
        """Whether `command` replies to the chat's board (of any instance, clustered)."""
        # One board per chat and thread, however many routes: its id read once each (a read
        # of the shared state is a round trip when clustered).
        boards = {self._shown_id(key) for key in {board_key(r.key) for r in routes}}
        return not boards.isdisjoint(command.reply_to)

    async def _named_agent(
        self, channel_name: str, command: IncomingCommand, name: str, here: list[str]
    ) -> tuple[str] | str | None:
        """The agent a `/tell` names, as a 1-tuple; else the refusal this instance gives
        (an unknown name, or one several agents share but for case), or None when it gives
        none (clustered: another instance answers).

        A name is matched exactly first, else folded (case, width: `matching_agents`).
        Clustered, a name not exactly one of this instance's is looked up among the agents
        every instance routes to the chat: another instance's agent may be the exact one,
        or one more that differs only in case; the instance that claimed the reply refuses.
        """
        if name in here:
            return (name,)
        if self._owned is not None:
            if self._cluster_names is None:
                return None
            names = await self._cluster_names(channel_name, command.chat)
            if names is None:
                return None  # Redis did not answer: logged; better no answer than a wrong one
            if name in names:
                return None  # another instance's agent: its owner queues it
            here = sorted({*names, *here})
        matches = matching_agents(name, here)
        if len(matches) == 1:
            return (matches[0],)
        if not matches and command.agent_glued:
            return None  # "/tell@任务卡片Pro hi": another app's name, not an agent of ours
        if self._owned is not None and not command.reply:
            return None  # clustered: the instance that claimed the reply refuses it, once
        if matches:
            return _same_but_case(matches)
        if command.reordered:
            return f"{_reordered('The name', name)} {_unknown_agent(here)}"
        if name.startswith("@") and len(name) > 1:
            # A mention where the agent's name goes ("/tell@OurBot@Other builder hi",
            # "/tell @alice builder hi"): said so, never quoting whom it names.
            return f"/tell takes no mention before the agent's name. {_unknown_agent(here)}"
        return _unknown_agent(here)

    def _cancel_in_cluster(self, channel_name: str, command: IncomingCommand) -> str | None:
        """Clustered `/taskcard cancel`: the author's latest queued text is found among every
        instance's (the shared store), and only the instance serving its agent withdraws it
        and answers; with none, the instance that claimed the reply says so. Each instance
        withdrew its own agent's latest, and the claimer answered from what it alone knew."""
        records = self._store.inbox_messages(self._clock().timestamp())
        latest = latest_written(
            records, channel_name, command.chat, command.writer, command.message_thread
        )
        if command.message_id is not None:
            # Decided once, by the first instance to read the command: one that read it after
            # the owner had withdrawn the latest would otherwise find the one before it the
            # latest, and withdraw that too.
            chosen = self._store.first_claim(
                f"cancel:{channel_name}:{command.chat.chat_id}:{command.message_id}",
                "" if latest is None else latest.message_id,
                CANCEL_DECISION_KEEP_S,
            )
            if chosen:
                # Not among the open ones: its owner withdrew it already (and answered).
                latest = next(
                    (r for r in records if r.message_id == chosen and r.outcome == "open"), None
                )
                if latest is None:
                    return None
            else:
                latest = None
        if latest is None:
            return NOTHING_TO_CANCEL if command.reply else None
        if not self._serves(latest.agent_id) or not self._desk.accepts(latest.agent_id):
            return None  # its agent's owner withdraws it and answers
        return self._showing_inbox(latest.agent_id, lambda: self._desk.cancel(latest))

    def _switch_view(self, routes: list[Route], view: RouteView) -> str:
        """`/taskcard board` or `/taskcard cards`: persist the chat's choice, then re-project
        every agent of the chat (cards are retired or return) and the board."""
        scope = routes[0].key.chat_scope
        self._views.set_view(scope, view)
        for route in routes:
            self._project_route(route)
        self._mark_board(scope)
        if view == "board":
            return (
                "This chat now shows one task board, plus a card for each agent that needs"
                " people. /taskcard cards shows one card per agent again."
            )
        return "This chat now shows one task card per agent. /taskcard board shows one board."

    def _orchestrator_command(
        self,
        routes: list[Route],
        named: str | None,
        partly: bool,
        marks: ChatMarks,
        reordered: bool = False,
    ) -> str:
        """`/taskcard orchestrator [AGENT|off]`: say the chat's orchestrator, or choose one
        (or none) for the chat and persist it (`bridge.run.orchestrators`); the board's
        lines say it again. `named` is a chat member's text: never echoed. `partly`: the
        sender may command only some of the chat's routes (`routes`), such as those a turn
        opened, which anyone may; the mark is the whole chat's (every agent's signals go to
        it), so they may ask for it but not change it. `marks`: the chat's agents and route
        setting (clustered, every instance's: another may route the agent named);
        `reordered`: the message shows in another order than typed (`_reordered`)."""
        scope = routes[0].key.chat_scope
        here = sorted({r.key.agent_id for r in routes} | (marks.followed - self._followed(scope)))
        usage = "/taskcard orchestrator AGENT marks one, /taskcard orchestrator off none"
        if named is None:
            current = self._orchestrator_of(scope, marks)
            gone = unfollowed_choice(self._orchestrators.choice(scope), marks.followed)
            aside = ""
            if gone is not None and AGENT_ID_PATTERN.fullmatch(gone):  # else not ours to show
                applying = ", the route's setting applying meanwhile" if current else ""
                aside = (
                    f" The chat chose {gone}, which it no longer follows: that choice is set"
                    f" aside until it does{applying}."
                )
            if current is None:
                return f"This chat has no orchestrator.{aside} {usage}."
            return (
                f"This chat's orchestrator is {current}: the reports and signals of the other"
                f" agents here wake it through its inbox.{aside} {usage}."
            )
        if partly:
            return (
                "Only a person allowed to command every agent of this chat (its routes'"
                " allowed_user_ids) changes its orchestrator."
            )
        if named == ORCHESTRATOR_OFF:
            self._orchestrators.choose(scope, None)
            self._mark_board(scope)
            return (
                "This chat has no orchestrator now: the signals of its agents wake only their"
                " parents. /taskcard orchestrator AGENT marks one."
            )
        # Read as a `/tell` reads the name: case and width do not matter (`ｂｕｉｌｄｅｒ`).
        matches = matching_agents(named, here)
        agent_id = matches[0] if len(matches) == 1 else None
        if matches and agent_id is None:
            return _same_but_case(matches, "/taskcard orchestrator AGENT")
        if agent_id is None:
            head = f"{_reordered('The name', named)} " if reordered else ""
            listed = f"{head}/taskcard orchestrator AGENT: AGENT is one of {', '.join(here)}."
            if _utf16_len(listed) <= STATE_TEXT_UTF16:
                return listed
            return _fit_entries(f"{head}/taskcard orchestrator AGENT: AGENT is one of:", here)
        self._orchestrators.choose(scope, agent_id)
        self._mark_board(scope)
        return (
            f"{agent_id} is now this chat's orchestrator: the reports and signals of the other"
            " agents here (those no parent agent is woken by) wake it through its inbox."
            " /taskcard orchestrator off stops it."
        )

    def _followed(self, scope: str) -> set[str]:
        """The agents the routes here follow in chat `scope`."""
        return {r.key.agent_id for r in self._routes_by_scope.get(scope, ())}

    def _served_here(self, scope: str) -> set[str]:
        """The agents of `_followed` whose cards this instance keeps: clustered, those whose
        lease it holds (a standby's other agents are another instance's, whose card it
        neither reads nor sends, so what it knows of them is no answer)."""
        return {agent for agent in self._followed(scope) if self._serves(agent)}

    async def _states_elsewhere(self, scope: str, marks: ChatMarks) -> dict[str, str]:
        """Clustered, a chat showing the board: the state of each agent another instance
        serves there, as its board line says (read when `/taskcard` asks, never
        periodically: lines are shared only while the chat shows the board). Empty when
        Redis does not answer: the answer names those agents without it."""
        if self._shared_boards is None or self._views.view(scope) != "board":
            return {}
        if not marks.followed - self._served_here(scope):
            return {}
        lines = await self._shared_boards.peek(scope) or {}
        return {
            agent: facts.state
            for agent, line in lines.items()
            if (facts := facts_from_record(line)) is not None and facts.agent_id == agent
        }

    def _state_text(
        self,
        routes: list[Route],
        prefs: ChatPrefs,
        marks: ChatMarks,
        elsewhere: Mapping[str, str] | None = None,
        where: str = "here",
    ) -> str:
        rows = prefs.activity_rows or self._config.display.activity_rows
        shown = (
            "hidden" if prefs.hidden else f"shown, {counted(rows, 'activity row', 'activity rows')}"
        )
        if self._views.view(routes[0].key.chat_scope) == "board":
            shown += ", one board"
        lines = [f"Task cards {where}: {shown}."]
        entries: list[str] = []
        scope = routes[0].key.chat_scope
        orchestrator = self._orchestrator_of(scope, marks)
        served = self._served_here(scope)
        for route in routes:
            monitor = self._monitors.get(route.key.agent_id)
            if monitor is None or route.key.agent_id not in served:
                continue  # clustered, a standby's: listed below as another instance's
            card = monitor.card
            card_text = {
                "active": "card active",
                "inactive": "card stopped",
                "none": "no card published",
            }[card.status]
            if card.exhausted:
                card_text += ", refreshes exhausted"
            if card.error_code:
                # No code, as on the card: only an episode's first error is heard.
                card_text += ", renderer error"
            disabled = self._scheduler.disabled_reason(route.key)
            # The platform's words: one line, as every value in an entry.
            extra = f" — delivery disabled: {one_line_cut(disabled, 200)}" if disabled else ""
            role = " (orchestrator)" if route.key.agent_id == orchestrator else ""
            entry = [f"• {route.key.agent_id}{role}: {monitor.activity.state}; {card_text}{extra}"]
            report = self._sides[route.key.agent_id].latest_report
            if report is not None:
                when = format_at(report.at, self._clock(), route.zone)
                said = report_outcome(report, self._redact)
                summary = report_summary(report, LISTED_SUMMARY_CHARS, self._redact)
                entry.append(f"  latest report ({when}): {said} {summary}".rstrip())
            entries.append("\n".join(entry))
        for agent_id in sorted(marks.followed - served):
            # Clustered: an agent another instance serves here, whose state that one knows.
            role = " (orchestrator)" if agent_id == orchestrator else ""
            state = (elsewhere or {}).get(agent_id)
            said = "" if state is None else f"{state}; "
            entries.append(f"• {agent_id}{role}: {said}served by another instance of the cluster")
        return _fit_entries(lines[0], entries)


def _utf16_len(text: str) -> int:
    return len(text.encode("utf-16-le", "surrogatepass")) // 2


def matching_agents(name: str, agents: list[str]) -> list[str]:
    """The agents a typed `name` may mean: itself when it is one, else (without a trailing
    `:` or `,`, as in "builder: hi") every one that equals it once both are `folded` (the
    one rule of every word typed): a person does not expect case to matter in a name,
    nor the width a phone's keyboard typed it in (`ｂｕｉｌｄｅｒ`), nor the invisible
    characters pasted with it (an emoji's variation selector). A look-alike from another
    script (a Cyrillic "е" for an "e") folds to itself and names no agent."""
    if name in agents:
        return [name]
    # "builder: hi" addresses builder; no id holds either mark. In its compatibility form
    # first, so that a full-width "：" is a ":" and the exact name still wins over a fold;
    # without the invisible characters a pasted name carries (`without_ignorable`: a
    # variation selector, a Hangul filler), which no id holds either.
    name = unicodedata.normalize("NFKC", without_ignorable(name)).rstrip(":,")
    if name in agents:
        return [name]
    read = folded(name)
    return [agent for agent in agents if folded(agent) == read]


def _same_but_case(names: list[str], usage: str = "/tell AGENT TEXT") -> str:
    """The refusal of a name (of a `/tell`, or `usage`'s) that several agents of the chat
    share but for case."""
    return (
        f"{usage}: the agents {', '.join(names)} differ only in case; write the exact name"
        " of the one you mean."
    )


def no_agent_hint(names: list[str]) -> str:
    """The answer to a reply to a message of the service about no one agent of the chat:
    how to reach one, with the agents a `/tell` may name when they fit `HINT_NAMES_CHARS`."""
    listed = ", ".join(names)
    if names and len(listed) <= HINT_NAMES_CHARS:
        return f"{NO_AGENT_REPLY} AGENT is one of {listed}."
    return f"{NO_AGENT_REPLY} /taskcard lists the agents here."


def _reordered(what: str, typed: str) -> str:
    """That `what` of a command (read as typed) shows in another order than typed, and what
    was typed when it can be shown as it is (`typed_form`): never the direction controls,
    which would show it reordered again ("off" for "ffo")."""
    form = typed_form(typed)
    as_typed = f' (typed: "{form}")' if form else ""
    return (
        f"{what} shows in another order than it was typed{as_typed}: the message holds a"
        " right-to-left control character. Type it again without one."
    )


def _unknown_agent(names: list[str]) -> str:
    """The refusal of a `/tell` naming no agent of the chat, with the names it routes."""
    listed = f"/tell AGENT TEXT: AGENT is one of {', '.join(names)}."
    if _utf16_len(listed) <= STATE_TEXT_UTF16:
        return listed
    # A large fleet: whole names as far as they fit, alike on every platform (Telegram cut
    # the list in the middle of a name at its 4096 units).
    return _fit_entries("/tell AGENT TEXT: AGENT is one of:", names)


def _fit_entries(head: str, entries: list[str]) -> str:
    """`head` and as many whole `entries` as fit `STATE_TEXT_UTF16`, then how many did not."""
    kept = [head]
    used = _utf16_len(head)
    for index, entry in enumerate(entries):
        left = len(entries) - index - 1
        room = STATE_TEXT_UTF16 - (80 if left else 0)  # keep room for the count line
        if used + 1 + _utf16_len(entry) > room:
            missing = len(entries) - index
            kept.append(
                f"… and {counted(missing, 'more agent', 'more agents')}, not listed:"
                " too many for one message."
            )
            break
        kept.append(entry)
        used += 1 + _utf16_len(entry)
    return "\n".join(kept)
