"""The chat's queued texts in a Claude Code or Codex session: when each hook hands them over.

Both hosts read the same hook output at these events (Codex documents `additionalContext`
at `UserPromptSubmit` and `PostToolUse`, and a blocked stop's `reason`, as Claude Code does).

- `UserPromptSubmit`: the texts join the prompt as `additionalContext`, and the turn's
  `turn.start` carries the first text's `origin` (the turn now also answers that chat). When
  `TASKCARD_ORIGIN` names another origin for the session, the message's origin wins for
  this turn: it is the concrete reason for the turn, the variable only a default.
- `PostToolUse`: the texts reach the model in the middle of its turn (`additionalContext`);
  one `turn.origin` per distinct origin marks the running turn as steered by that chat.
- `Stop` (not `stop_hook_active`): queued texts BLOCK the stop, `{"decision": "block",
  "reason": ...}`, so the model handles them in this turn instead of leaving them parked;
  `turn.origin` as above, and no `turn.end` (the turn goes on; the turn's usage so far is
  still written, since the next stop counts only what follows the block). The session is
  marked, so that its next `Stop`, which comes with `stop_hook_active`, ends the turn as a
  plain stop would (`usage`, `turn.end`, a completed turn) and never blocks again. A
  `StopFailure` or an interrupt (the held turn ended without a stop) drops the mark.

An idle session runs no hook, so its texts stay in `inbox/queued/` (parked) until the next
turn. The texts of one output are bounded (`MAX_TEXT_BYTES`; one larger message goes
alone); the rest waits for the next hook. Texts are framed as messages from people in a
chat, wakes as notices (`producers.inbox.contract.frame`).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Final

from taskcard.producers.agent_hooks.claude_code import (
    HookDecision,
    ends_turn_without_stop,
    hook_output,
)
from taskcard.producers.inbox import InboxUnsafe, Message, frame
from taskcard.producers.inbox.claim import acknowledge, claim, release
from taskcard.producers.task_card.contract import (
    CardPaths,
    Origin,
    atomic_write,
    make_folder,
    open_lock,
    parse_origin,
    read_regular,
)

MAX_TEXT_BYTES: Final = 5 * 1024  # plus at most ten short task card wakes: about 8 KiB
BLOCKED_FILE: Final = ".taskcard-hook-blocked.json"
MAX_BLOCKED_SESSIONS: Final = 64
DELIVERING_EVENTS: Final = frozenset({"UserPromptSubmit", "PostToolUse", "Stop"})
STOP_PREFACE: Final = (
    "Before you stop: these arrived for you through taskcard while you worked. Handle them "
    "in this turn (answer, adjust your work, or say why not)."
)


@dataclass(frozen=True)
class Delivery:
    """What this hook claimed from the inbox, and whether it ends a turn it had blocked."""

    messages: list[Message] = field(default_factory=list)
    ends_blocked_turn: bool = False
    # A stop that found nothing, while another copy of the hook at the same stop (another
    # config layer) blocked it: the turn goes on.
    held_elsewhere: bool = False


def origins(messages: list[Message]) -> list[str]:
    """The distinct origins of the messages, in order, as the activity log takes them."""
    seen: list[str] = []
    for message in messages:
        origin = activity_origin(message.origin)
        if origin is not None and origin not in seen:
            seen.append(origin)
    return seen


def activity_origin(origin: str | None) -> str | None:
    """A message's origin in the activity log's form, or None when it has none.

    The inbox contract allows `<channel>:<chat_id>[:<thread_id>]` for any channel, while the
    activity log takes only the chats a route can name: one it refused made the hook's whole
    write fail, losing the prompt's `turn.start`. A Feishu origin names the chat only (its
    routes have no threads), so a topic's `feishu:<chat>:<thread>` is kept as its chat; any
    other that is no origin here is left out, and the turn's events are written without it."""
    if origin is None:
        return None
    parsed = parse_origin(origin)
    if not isinstance(parsed, Origin) and origin.startswith("feishu:"):
        parsed = parse_origin(origin.rpartition(":")[0])
    return str(parsed) if isinstance(parsed, Origin) else None


def steer(name: object, decision: HookDecision, messages: list[Message]) -> HookDecision:
    """The hook's events once the claimed messages are part of the turn (pure)."""
    if not messages:
        return decision
    found = origins(messages)
    marks = [("turn.origin", {"origin": origin}) for origin in found]
    if name == "UserPromptSubmit":
        if not found:
            return decision
        events = [
            (kind, {**fields, "origin": found[0]} if kind == "turn.start" else fields)
            for kind, fields in decision.events
        ]
        return replace(decision, events=events)
    if name == "PostToolUse":
        return replace(decision, events=[*decision.events, *marks])
    if name == "Stop":
        kept = [(kind, fields) for kind, fields in decision.events if kind != "turn.end"]
        return replace(decision, events=[*kept, *marks], completed_turn=False)
    return decision


def output(name: object, wakes: list[str], messages: list[Message]) -> dict[str, Any] | None:
    """The JSON for Claude Code's stdout: a blocked stop, a context, or nothing (pure)."""
    texts = [frame(message) for message in messages]
    if name == "Stop":
        if not texts:
            return None
        return {"decision": "block", "reason": "\n\n".join([STOP_PREFACE, *texts])}
    return hook_output(name, ["\n\n".join(texts), *wakes] if texts else wakes)


def take(
    paths: CardPaths,
    name: object,
    payload: Mapping[str, Any],
    session: str,
    log: Callable[[str], None],
    host: str = "claude-code",
    handover: Handover | None = None,
) -> Delivery:
    """Claim what this hook delivers, and settle the session's blocked stop; never raises.
    `host` names the agent host in the claim (`claude-code`, `codex`). The messages claimed
    are held in `handover`, to be acknowledged once the output is written (without one,
    acknowledged at once)."""
    delivery = _take(paths, name, payload, session, log, host)
    if delivery.messages:
        held = handover if handover is not None else Handover()
        held.hold(paths, f"{host}:{name}", session, delivery.messages, log)
        if handover is None:
            held.settle(written=True)
    return delivery


def _take(
    paths: CardPaths,
    name: object,
    payload: Mapping[str, Any],
    session: str,
    log: Callable[[str], None],
    host: str,
) -> Delivery:
    if ends_turn_without_stop(payload):
        _forget_blocked(paths, session, log)  # the turn is over: no stop of it comes now
    if name not in DELIVERING_EVENTS:
        return Delivery()
    try:
        if name == "Stop" and payload.get("stop_hook_active") is True:
            with _blocked_sessions(paths) as blocked:
                ended = session in blocked
                if ended:
                    blocked.remove(session)
            return Delivery(ends_blocked_turn=ended)
        if name == "Stop":
            return _take_at_stop(paths, session, log, f"{host}:{name}")
        return Delivery(messages=_claim(paths, f"{host}:{name}", log))
    except InboxUnsafe as exc:
        log(f"inbox: {exc}")
    except OSError as exc:
        log(f"inbox: cannot read: {exc.__class__.__name__}: {exc.strerror}")
    return Delivery()


def _take_at_stop(paths: CardPaths, session: str, log: Callable[[str], None], via: str) -> Delivery:
    """Claim at a stop, and remember that the session's stop was blocked when something
    was claimed, under one lock: a copy of the hook at the same stop (Codex runs the copies
    in each config layer at once) then finds either the texts or the mark, never neither.
    The claimed messages go out even when the mark cannot be written (only the turn's end
    is then not seen)."""
    taken: list[Message] | None = None
    try:
        with _blocked_sessions(paths) as blocked:
            taken = _claim(paths, via, log)
            if taken and session not in blocked:
                blocked.append(session)
            held = not taken and session in blocked
    except OSError as exc:
        if taken is None:  # the marks cannot be kept: the texts go all the same
            taken = _claim(paths, via, log)
        elif not taken:
            raise
        if taken:
            log(
                f"inbox: cannot mark the blocked stop in {BLOCKED_FILE}: "
                f"{exc.__class__.__name__}: {exc.strerror}; the messages were delivered"
            )
        return Delivery(messages=taken)
    return Delivery(messages=taken, held_elsewhere=held)


def _claim(paths: CardPaths, via: str, log: Callable[[str], None]) -> list[Message]:
    """Claim without acknowledging: `Handover.settle` does, once the output is written."""
    batch = claim(paths.workdir, via, max_bytes=MAX_TEXT_BYTES)
    for problem in batch.problems:
        log(f"inbox: {problem}")
    return batch.messages


@dataclass
class Handover:
    """The messages a hook claimed, settled once its output was written or failed to be.

    The output is the delivery: a hook whose stdout is closed, or whose write fails (the
    host gone, a broken pipe, a full disk), hands nothing over, so its messages go back to
    `queued/` for the next hook or read; they were acknowledged at the claim and lost while
    the chat read "delivered". A hook killed before it settles leaves them to the next
    claim's recovery (their holder is gone)."""

    paths: CardPaths | None = None
    via: str = ""
    session: str = ""
    messages: list[Message] = field(default_factory=list)
    log: Callable[[str], None] = lambda line: None

    def hold(
        self,
        paths: CardPaths,
        via: str,
        session: str,
        messages: list[Message],
        log: Callable[[str], None],
    ) -> None:
        self.paths, self.via, self.session, self.log = paths, via, session, log
        self.messages = list(messages)

    def settle(self, written: bool) -> None:
        """Acknowledge the messages (`written`) or queue them again; never raises."""
        paths, ids = self.paths, [message.id for message in self.messages]
        self.messages = []
        if paths is None or not ids:
            return
        try:
            if written:
                problems = acknowledge(paths.workdir, ids, self.via)
            else:
                problems = release(paths.workdir, ids)
                self.log(
                    f"inbox: the hook's output could not be written (stdout closed or "
                    f"broken), so {len(ids)} message(s) went back to inbox/queued/ for the "
                    "next hook or read"
                )
                if self.via.endswith(":Stop"):
                    _forget_blocked(paths, self.session, self.log)  # the stop was not held
            for problem in problems:
                self.log(f"inbox: {problem}")
        except Exception as exc:  # a hook must never fail its agent
            self.log(f"inbox: cannot settle the claim: {exc.__class__.__name__}: {exc}")


def _forget_blocked(paths: CardPaths, session: str, log: Callable[[str], None]) -> None:
    """Drop the session's blocked-stop mark (its turn ended some other way)."""
    if not (paths.logs_dir / BLOCKED_FILE).exists():
        return
    try:
        with _blocked_sessions(paths) as blocked:
            if session in blocked:
                blocked.remove(session)
    except OSError as exc:
        log(f"inbox: cannot update {BLOCKED_FILE}: {exc.__class__.__name__}: {exc.strerror}")


@contextlib.contextmanager
def _blocked_sessions(paths: CardPaths) -> Iterator[list[str]]:
    """The sessions whose stop this hook blocked, read and written back under a lock."""
    make_folder(paths.logs_dir, inside=paths.workdir)
    path = paths.logs_dir / BLOCKED_FILE
    fd = open_lock(path.with_name(path.name + ".lock"), inside=paths.workdir)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            data = json.loads(read_regular(path, 65536))
        except (OSError, ValueError, RecursionError):
            data = []
        sessions = [s for s in data if isinstance(s, str)] if isinstance(data, list) else []
        before = list(sessions)
        yield sessions
        if sessions != before:
            kept = sessions[-MAX_BLOCKED_SESSIONS:]
            atomic_write(path, json.dumps(kept).encode(), durable=False)
    finally:
        os.close(fd)
