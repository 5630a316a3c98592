"""`TaskCard`: the in-process host of one workdir's card, and the one call agents make.

One object per workdir holds the workdir's host lock, rehydrates a persisted watch, runs the
updater in a background thread it owns, and answers envelopes with result dicts. Locks:
`_lock` guards the watch table and every write to the contract files (short sections only);
each watch's `render_lock` serialises its renders (a tick never overlaps a retry). Renders run
outside `_lock`, so `inspect` and `stop` answer while a renderer is running, and a stopped
watch's late render is discarded instead of resurrecting the card.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import stat
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Final, Literal, TypeVar

from taskcard.producers.task_card.contract import (
    HOST_DIR,
    LOOP_OF_LINKS,
    STATUS_ACTIVE,
    STATUS_INACTIVE,
    CardPaths,
    counted,
    is_inside,
    link_loop,
    parse_status,
    quoted,
    read_bytes,
    shown_path,
    utc_now_iso,
)
from taskcard.producers.task_card.descriptor import (
    DescriptorCorrupt,
    EndedWatch,
    WatchDescriptor,
    adopt_legacy_files,
    allocate_watch_id,
    clear_descriptor,
    clear_ended,
    read_descriptor,
    read_ended,
    watch_number,
    write_descriptor,
    write_ended,
)
from taskcard.producers.task_card.envelope import (
    READ_ONLY_ACTIONS,
    Envelope,
    EnvelopeError,
    StartInput,
    WatchInput,
    parse_envelope,
)
from taskcard.producers.task_card.meta import MetaProjector
from taskcard.producers.task_card.notifications import (
    FileNotificationPort,
    NotificationPort,
    TaskCardErrorNotification,
    TaskCardLimitNotification,
    TaskCardNotification,
    TaskCardRecoveredNotification,
)
from taskcard.producers.task_card.renderer import (
    RENDER_HOST_ENV,
    Rendered,
    RendererPathError,
    RendererRunner,
    RendererUnreadable,
    RenderFailure,
    RunRequest,
    classify,
    end_leftover_renders,
    renderer_environment,
    resolve_renderer,
    run_renderer,
    stdout_limit_for,
)
from taskcard.producers.task_card.runtime import HostLock, chosen_host_paths
from taskcard.producers.task_card.schedule import next_slot, slot_due
from taskcard.producers.task_card.settings import (
    SettingsCache,
    SettingsUnavailable,
    load_settings,
    migrate_legacy,
    settings_or_defaults,
    show_rows,
)
from taskcard.producers.task_card.tally import RefreshTally, read_tally
from taskcard.producers.task_card.tool_failure import HOST_UNAVAILABLE
from taskcard.producers.task_card.turns import add_completed_turn, keep_reminder, reset_turns
from taskcard.producers.task_card.workdir_arg import WorkdirError, given_path
from taskcard.producers.task_card.workdir_lock import boot_id
from taskcard.producers.task_card.written import WrittenFiles

log = logging.getLogger(__name__)
_T = TypeVar("_T")

WatchState = Literal["watching", "error", "stopping", "stop_failed", "stopped", "exhausted"]
LIVE_STATES: Final = frozenset({"watching", "error", "stopping", "stop_failed"})
DEFAULT_QUIESCE_TIMEOUT_S: Final = 15.0
KEPT_FINISHED_WATCHES: Final = 8  # stopped, exhausted or removed watches `inspect` still knows
Result = dict[str, Any]


@dataclass
class _Watch:
    """Mutable runtime state of one watch; only touched under the owner's `_lock`."""

    watch_id: str
    renderer_rel: str  # as the agent named it, relative to the workdir; resolved at every run
    interval_s: float
    timeout_s: float
    max_refreshes: int
    refreshes_used: int
    started_at: str
    error_epoch: int
    state: WatchState = "watching"
    stop_reason: str | None = None
    error: RenderFailure | None = None
    error_at: str | None = None
    stderr_tail: str = ""
    last_body: str | None = None
    last_body_at: str | None = None
    stop_event: threading.Event = field(default_factory=threading.Event)
    render_lock: threading.Lock = field(default_factory=threading.Lock)
    thread: threading.Thread | None = None
    updater_died: bool = False
    tally: RefreshTally | None = None  # where spent refreshes go between descriptor writes
    tally_failed: bool = False
    persisted_epoch: int = 0  # the error_epoch in the last descriptor written
    persisted_open: bool = False  # whether that descriptor recorded an open error episode
    ticks_skipped: int = 0  # grid points passed while a render overran (schedule.py)
    removed: bool = False  # `remove` deleted its card: it never publishes again
    final_retry_used: bool = False  # exhausted, it had its one final retry (`retry`)

    @classmethod
    def of(
        cls,
        descriptor: WatchDescriptor,
        timeout_s: float,
        max_refreshes: int,
        refreshes_used: int,
        **state: Any,
    ) -> _Watch:
        """The watch a descriptor kept, with the ceilings in force now (a resume's, or a
        stopped watch's known again) and `state`'s other fields."""
        return cls(
            watch_id=descriptor.watch_id,
            renderer_rel=descriptor.renderer_path,
            interval_s=descriptor.interval_s,
            timeout_s=timeout_s,
            max_refreshes=max_refreshes,
            refreshes_used=refreshes_used,
            started_at=descriptor.started_at,
            error_epoch=descriptor.error_epoch,
            **state,
        )

    def descriptor(self) -> WatchDescriptor:
        return WatchDescriptor(
            watch_id=self.watch_id,
            renderer_path=self.renderer_rel,
            interval_s=self.interval_s,
            timeout_s=self.timeout_s,
            max_refreshes=self.max_refreshes,
            refreshes_used=self.refreshes_used,
            started_at=self.started_at,
            error_epoch=self.error_epoch,
            error_code=self.error.code if self.error is not None else None,
        )


# The codes of `task_card`'s own refusals, beside the shared ones (`tool_failure`) and the
# renderer's (`renderer_failed`, ...: a failed first render answers its verdict's code).
ALREADY_ACTIVE: Final = "already_active"  # start: one watch per agent runs already
BUSY: Final = "busy"  # another start's first render runs, or the watch is stopping: call again
UNKNOWN_WATCH: Final = "unknown_watch"  # a watch_id this host does not know (or did not resume)
SETTINGS_UNAVAILABLE: Final = "settings_unavailable"  # taskcard/settings.json cannot be read
REFRESHES_EXHAUSTED: Final = "refreshes_exhausted"  # retry: budget and final retry both spent
CANNOT_RENDER: Final = "cannot_render"  # retry: the watch's renderer can no longer be run
TASK_CARD_CODES: Final = (
    ALREADY_ACTIVE,
    BUSY,
    UNKNOWN_WATCH,
    SETTINGS_UNAVAILABLE,
    REFRESHES_EXHAUSTED,
    CANNOT_RENDER,
)


def _failed(code: str, message: str, **extra: Any) -> Result:
    """A refused call: its `code` (one of `TASK_CARD_CODES`, or of the shared ones in
    `tool_failure`) lets a program tell the failures apart without reading the words."""
    return {"status": "failed", "code": code, "message": message, **extra}


def load_manual() -> str:
    """The capability's own manual, shipped as package data."""
    return resources.files("taskcard.producers.task_card").joinpath("SKILL.md").read_text("utf-8")


def settings_result(paths: CardPaths) -> Result:
    """The `settings` action: read-only, so callers need no host to answer it."""
    try:
        effective = load_settings(paths)
        rows = show_rows(effective)
    except SettingsUnavailable as exc:
        return _failed(
            SETTINGS_UNAVAILABLE,
            f"effective settings are unavailable: taskcard/{exc}. No rows are shown; "
            f"{exc.fix}, then call settings again",
        )
    result: Result = {"status": "ok", "settings": rows, "settings_path": str(paths.settings)}
    if effective.problems:
        result["problems"] = list(effective.problems)
    return result


def read_only_answer(parsed: Envelope, paths: CardPaths) -> Result:
    """The whole answer to `manual` or `settings` (`READ_ONLY_ACTIONS`), read from files alone.

    The manual says `manual` "does not enter the watch manager" and SHOW "never creates or
    changes taskcard/taskcard.json" nor migrates: neither needs a host, so `taskcard tool`,
    `card` and MCP answer them in their own process (`client.call_via_host`), starting no host
    and writing nothing in the workdir; a host answers them with this same function."""
    if parsed.action == "settings":
        result: Result = {"action": "settings", **settings_result(paths)}
    else:
        result = {"action": "manual", "status": "ok", "manual": load_manual()}
    if parsed.summarize:
        result["summary"] = _summary(result)
    return result


def refused_answer(parsed: Envelope, message: str, code: str) -> Result:
    """The whole answer a host gives to a call refused before it did anything (`TaskCard.call`
    wraps `_failed` the same way): given by `client.call_via_host` for a refusal it can decide
    without a host, so none is started only to refuse."""
    result: Result = {"action": parsed.action, **_failed(code, message)}
    if parsed.summarize:
        result["summary"] = _summary(result)
    return result


class TaskCard:
    """The task card capability of one workdir. Use as a context manager or call `close()`.

    `served`: True only in `taskcard host`, which serves this card to other processes over
    its socket. The workdir lock's note says so (`workdir_lock.Holder.served`): a `taskcard`
    command or MCP call meeting a workdir held by a program's own TaskCard is refused at once,
    naming the program, instead of waiting for a socket nobody will open."""

    def __init__(
        self,
        workdir: Path | str,
        *,
        runtime_dir: Path | None = None,
        notifier: NotificationPort | None = None,
        runner: RendererRunner = run_renderer,
        environ: Mapping[str, str] | None = None,
        clock: Callable[[], str] = utc_now_iso,
        quiesce_timeout_s: float = DEFAULT_QUIESCE_TIMEOUT_S,
        served: bool = False,
    ) -> None:
        env = os.environ if environ is None else environ
        try:
            named = given_path(workdir)
            self.workdir = named.resolve()
            # Which folder it is: one moved away and another made at its path is not it.
            found = os.stat(self.workdir) if self.workdir.is_dir() else None
        except WorkdirError as exc:
            raise WorkdirError(f"workdir: {exc}") from None
        except (OSError, RuntimeError) as exc:  # a symlink loop, a name too long
            if isinstance(exc, RuntimeError) or exc.errno == errno.ELOOP:
                raise WorkdirError(
                    f"workdir: {shown_path(named)} {link_loop(named) or LOOP_OF_LINKS}; fix the"
                    " links, or give the agent's working directory"
                ) from None
            raise WorkdirError(
                f"workdir: {quoted(str(workdir))} cannot be used ({getattr(exc, 'strerror', exc)});"
                " give the agent's working directory"
            ) from None
        if found is None:
            raise WorkdirError(
                f"workdir: {self.workdir} is not a directory; give the agent's working "
                "directory (create it first)"
            )
        self._workdir_id = (found.st_dev, found.st_ino)
        self._workdir_unseen = False  # a look at it failed (and was logged) once
        self.paths = CardPaths(self.workdir)
        # Checked as the command line checks it: a folder inside the workdir, from the
        # argument or the variable, was taken here while every command refused it.
        self.host_paths = chosen_host_paths(
            runtime_dir, env, self.workdir, option_name="runtime_dir"
        )
        self._notifier: NotificationPort = notifier or FileNotificationPort(self.paths)
        self._runner = runner
        # Every render of this host carries the tag, so a host after us can end what our runs
        # left running if we are killed mid-run (`renderer.end_leftover_renders`).
        render_tag = uuid.uuid4().hex
        self._renderer_env = {**renderer_environment(env), RENDER_HOST_ENV: render_tag}
        self._clock = clock
        self._quiesce_timeout_s = quiesce_timeout_s
        self._lock = threading.RLock()
        self._watches: dict[str, _Watch] = {}
        self._current: _Watch | None = None
        self._starting = False
        self._seen_watch_number = 0
        # The watch a stale watch.json named at boot, and why it was not resumed: an agent
        # asking for it was told only that it is "not a watch of this host".
        self._not_resumed: tuple[str, str] | None = None
        self._closed = False
        self._meta = MetaProjector(self.paths)
        self._written = WrittenFiles()  # status and body as this host last wrote them
        self._settings = SettingsCache(self.paths)  # read per tick, parsed when changed
        self._host_lock = HostLock(self.host_paths, renders=render_tag, served=served)
        self._host_lock.acquire()
        try:
            self._end_leftover_renders()
            adopt_legacy_files(self.paths)
            self._rehydrate()
        except BaseException:
            self._host_lock.release()
            raise

    # ----------------------------------------------------------------- public surface

    def __enter__(self) -> TaskCard:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def call(
        self, envelope: Mapping[str, Any] | str | bytes, *, cancel: threading.Event | None = None
    ) -> Result:
        """Validate and run one envelope; always returns a result dict, never raises for input.

        `cancel`, set when the caller gave up on the call (an MCP client cancelled it): a
        `start` still in its first render stops there and creates no watch (see `start`)."""
        try:
            parsed = parse_envelope(envelope)
        except EnvelopeError as exc:  # transport or schema: the caller's envelope
            return _failed("bad_envelope", str(exc))
        if parsed.action in READ_ONLY_ACTIONS:
            return read_only_answer(parsed, self.paths)
        result: Result
        if self._closed:
            # Its updater is gone and its host lock released (another host may own the
            # workdir now): answering `watching`, or writing the card files, would be false.
            return {
                "action": parsed.action,
                **_failed(
                    HOST_UNAVAILABLE,
                    "this task card host was closed; open a new TaskCard for the workdir "
                    "(it resumes the watch) and call again",
                ),
            }
        if parsed.action == "start":
            assert isinstance(parsed.input, StartInput)
            result = self.start(parsed.input, cancel=cancel)
        elif parsed.action in ("inspect", "retry", "stop"):
            assert isinstance(parsed.input, WatchInput)
            handler = {"inspect": self.inspect, "retry": self.retry, "stop": self.stop}
            result = handler[parsed.action](parsed.input.watch_id)
        else:  # remove: the read-only actions were answered above
            result = self.remove()
        result = {"action": parsed.action, **result}
        if parsed.summarize:
            result["summary"] = _summary(result)
        return result

    def workdir_gone(self) -> bool:
        """True when the workdir this card was made for is no longer at its path: deleted,
        moved away, or moved away with another folder made in its place (`mv w w.old &&
        mkdir w`). The last still reads as a folder, but it is not the one whose lock this
        host holds (the lock moved with the old one), so a watch that went on rendered into
        it and a host that went on answered calls on it for the moved folder. Any other
        failure to look (no permission, an I/O error) is not taken for gone: it is logged
        once and the card goes on; `Path.is_dir` raised it, and an idle host died of it."""
        try:
            found = os.stat(self.workdir)
        except (FileNotFoundError, NotADirectoryError):
            return True
        except OSError as exc:
            if not self._workdir_unseen:
                self._workdir_unseen = True
                log.warning(
                    "cannot look at the workdir %s (%s); taking it as still there",
                    self.workdir,
                    exc.strerror or exc,
                )
            return False
        return (found.st_dev, found.st_ino) != self._workdir_id

    def has_live_watch(self) -> bool:
        with self._lock:
            return self._starting or (
                self._current is not None and self._current.state in LIVE_STATES
            )

    def on_completed_turn(self) -> None:
        """Count a completed text turn; submit a reminder every `reminder-turns` quiet turns.

        The count is the workdir's shared one (`turns.py`), so turns the agent host's hooks
        count while no host runs and turns counted here add up.
        """
        turns = settings_or_defaults(self.paths).reminder_turns
        count = add_completed_turn(self.paths, turns)
        if count is None:
            return
        with self._lock:
            current = self._current.watch_id if self._current is not None else None
        keep_reminder(self.paths, self._notifier.submit_reminder(count, current))

    def meta_update(self) -> dict[str, Any] | None:
        """The `_meta.agent_meta.taskcard` payload when it changed since the last call."""
        return self._meta.poll()

    def meta_payload(self) -> dict[str, Any]:
        """The payload as it is now, regardless of change."""
        return self._meta.current()

    def close(self) -> None:
        """Stop the updater threads without ending the watch (a later host resumes it)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            watches = list(self._watches.values())
        for watch in watches:
            watch.stop_event.set()
        for watch in watches:
            if watch.thread is not None:
                watch.thread.join()
        with self._lock:
            for watch in watches:
                self._drop_tally(watch)
        self._host_lock.release()

    # ----------------------------------------------------------------- actions

    def start(self, request: StartInput, *, cancel: threading.Event | None = None) -> Result:
        """Start the one watch: the first render runs now, and the watch exists once its body
        is published (the commit). `cancel` set before the commit (during the first render,
        which it stops) leaves no watch; once committed, a start stays done, and a retried
        start answers that the watch is active, with its id."""
        try:
            renderer = resolve_renderer(self.workdir, request.renderer_path)
        except RendererPathError as exc:
            return _failed("bad_renderer_path", str(exc))
        except RendererUnreadable as exc:  # a failure, not the caller's mistake: exit 1
            return _failed("renderer_failed", str(exc))
        with self._lock:
            if self._closed:
                return _failed(HOST_UNAVAILABLE, "this task card host is shutting down; call again")
            if self._starting:
                return _failed(
                    BUSY,
                    "another start is in progress (its first render is running); one active "
                    "watch per agent: call start again once it is done, and it answers with "
                    "the watch's id if that start made one",
                )
            current = self._current
            if current is not None and current.state in LIVE_STATES:
                return _failed(
                    ALREADY_ACTIVE,
                    f"watch {current.watch_id} is already active (one card per agent); "
                    "stop or remove it first, or retry it",
                    watch_id=current.watch_id,
                )
            self._starting = True
            # A watch that ended during an error episode (stopped or exhausted, not removed:
            # a removed card is over) has it still open: the new watch's first publication
            # ends it, and the chats are told so, or their last word stays the error.
            failed = (
                current
                if current is not None and current.error is not None and not current.removed
                else None
            )
        try:
            return self._start_locked_out(request, renderer, cancel or threading.Event(), failed)
        finally:
            with self._lock:
                self._starting = False

    def _start_locked_out(
        self,
        request: StartInput,
        renderer: Path,
        cancel: threading.Event,
        failed: _Watch | None,
    ) -> Result:
        try:
            settings = load_settings(self.paths)
        except SettingsUnavailable as exc:
            return _failed(SETTINGS_UNAVAILABLE, f"settings unavailable: taskcard/{exc}; {exc.fix}")
        try:
            migrate_legacy(self.paths, settings)
            seen = max((watch_number(w) for w in self._watches), default=0)
            seen = max(seen, self._seen_watch_number)
            watch_id = allocate_watch_id(self.paths, seen)
        except OSError as exc:
            return _failed("write_failed", self._cannot_write(exc))
        watch = _Watch(
            watch_id=watch_id,
            renderer_rel=self._renderer_name(request.renderer_path, renderer),
            interval_s=request.interval_s or settings.interval_s,
            timeout_s=min(request.timeout_s or settings.timeout_s, settings.timeout_s),
            max_refreshes=min(
                request.max_refreshes or settings.max_refreshes, settings.max_refreshes
            ),
            refreshes_used=0,
            started_at=self._clock(),
            error_epoch=0,
        )
        verdict, stderr_tail = self._render(watch, cancel)
        if verdict is None or cancel.is_set():
            return _failed(
                "cancelled",
                "the start was cancelled by its caller before the card was published; no"
                " watch was created; call start again",
            )
        if isinstance(verdict, RenderFailure):
            return _failed(
                verdict.code,
                f"first render failed, no watch was created: {verdict.message}",
                stderr_tail=stderr_tail,
            )
        with self._lock:
            try:
                changed = self._publish(verdict.body, activate=True)
                write_descriptor(self.paths, watch.descriptor())
                self._forget_ended()  # the watch it kept is replaced: no retry for it
            except OSError as exc:
                # No watch will refresh this card: it must not stay `active` for the chats.
                with contextlib.suppress(OSError):
                    self._write_status(STATUS_INACTIVE)
                return _failed("write_failed", f"publishing failed: {self._cannot_write(exc)}")
            self._restart_tally(watch)
            self._record_success(watch, verdict.body)
            if failed is not None and failed.error is not None:
                self._notify(
                    watch,
                    TaskCardRecoveredNotification(
                        failed.watch_id, failed.error_epoch, replaced_by=watch_id
                    ),
                )
                failed.error = None
            self._watches[watch_id] = watch
            self._current = watch
            self._forget_finished_watches()
            self._spawn_updater(watch)
            log.info("task card watch %s started", watch_id)
            result = {**self._view(watch), "body_changed": changed}
            if settings.problems:
                result["settings_problems"] = list(settings.problems)
            return result

    def _renderer_name(self, given: str, resolved: Path) -> str:
        """The renderer as the agent named it, relative to the workdir, not the file a symlink
        led to at start: every run resolves the name again, so a link the agent points at a
        new version runs that version (and a link that now leads out is refused). An absolute
        name that reaches the workdir through another path keeps the resolved file."""
        path = Path(given)
        if not path.is_absolute():
            return str(path)
        try:
            return str(path.relative_to(self.workdir))
        except ValueError:
            return str(resolved.relative_to(self.workdir))

    def inspect(self, watch_id: str) -> Result:
        with self._lock:
            watch = self._watches.get(watch_id)
            if watch is None:
                return self._unknown(watch_id, "inspect")
            view = self._view(watch)
            body = watch.last_body
            if body is None:
                raw = read_bytes(self.paths.body)
                body = raw.decode("utf-8", errors="replace") if raw else None
            error = None
            if watch.error is not None:
                error = {
                    "code": watch.error.code,
                    "message": watch.error.message,
                    "at": watch.error_at,
                    "stderr_tail": watch.stderr_tail,
                }
            return {
                **view,
                "last_body": body,
                "last_body_at": watch.last_body_at,
                # The Telegram-side manual's name for the same instant; tools written to it read it.
                "last_valid_frame_at": watch.last_body_at,
                "error": error,
                "renderer_path": watch.renderer_rel,
                "interval_s": watch.interval_s,
                "timeout_s": watch.timeout_s,
                "started_at": watch.started_at,
                "ticks_skipped": watch.ticks_skipped,
            }

    def retry(self, watch_id: str) -> Result:
        with self._lock:
            watch = self._watches.get(watch_id)
            if watch is None:
                return self._unknown(watch_id, "retry")
            if watch.state == "exhausted" and watch.final_retry_used:
                return {
                    **self._view(watch),
                    "status": "failed",
                    "code": REFRESHES_EXHAUSTED,
                    "message": f"watch {watch_id} used its whole refresh budget and its one "
                    "final retry; start a new watch to publish the card again",
                }
            if watch.state in ("stopping", "stop_failed"):
                return _failed(BUSY, f"watch {watch_id} is stopping; stop it again or remove it")
            why = self._cannot_render(watch)
            if why is not None:
                return {
                    **self._view(watch),
                    "status": "failed",
                    "code": CANNOT_RENDER,
                    "message": f"watch {watch_id} cannot render any more: {why}",
                }
            # The manual: a watch that expired may `retry` "once more to publish a final
            # state". That render has no budget left to spend: it spends the final retry,
            # whether it succeeds or not, as a refresh spends the budget.
            final = watch.state == "exhausted"
            if final:
                watch.final_retry_used = True
                if watch is self._current:
                    # Recorded before the render: a host killed during it must not give the
                    # final retry a second time.
                    self._record_ended(watch)
        # Every other retry counts against the budget, a stopped watch's included (manual).
        outcome = self._refresh(watch, counted=not final, from_tick=False)
        with self._lock:
            ended = watch.state in ("stopped", "exhausted")
            if ended and not watch.removed and watch is self._current:
                self._record_ended(watch)  # what it spent, for a later host
            thread = watch.thread
            dead = thread is not None and not thread.is_alive() and not watch.stop_event.is_set()
            if dead and watch.state in ("watching", "error") and not self._closed:
                watch.updater_died = False
                self._spawn_updater(watch)  # retry is the documented way back from a crash
            view = self._view(watch)
            if outcome is not None:
                view["refresh_error"] = {"code": outcome.code, "message": outcome.message}
            return view

    def stop(self, watch_id: str) -> Result:
        with self._lock:
            watch = self._watches.get(watch_id)
            if watch is None:
                return self._unknown(watch_id, "stop")
            if watch.state in ("stopped", "exhausted"):
                return self._view(watch)
            self._drop_tally(watch)
            try:
                self._write_status(STATUS_INACTIVE)
                clear_descriptor(self.paths)
            except OSError as exc:
                watch.state = "stop_failed"
                return {
                    **self._view(watch),
                    "code": "write_failed",
                    "message": self._cannot_write(exc),
                }
            watch.state = "stopping"
            watch.stop_reason = "stopped"
            watch.stop_event.set()
        quiet = self._quiesce(watch)
        with self._lock:
            if not quiet:
                watch.state = "stop_failed"
                return {
                    **self._view(watch),
                    "message": "the updater did not quiesce; status is inactive; call stop again",
                }
            watch.state = "stopped"
            self._record_ended(watch)
            log.info("task card watch %s stopped", watch_id)
            return self._view(watch)

    def remove(self) -> Result:
        with self._lock:
            watch = self._current
        if watch is not None and watch.state in LIVE_STATES:
            stopped = self.stop(watch.watch_id)
            if stopped.get("code") == "write_failed":  # not the updater: a card file
                return {
                    **stopped,
                    "status": "remove_failed",
                    "body_removed": False,
                    "message": f"cannot remove the card: {stopped['message']}",
                }
            if stopped["status"] != "stopped":
                return {
                    **stopped,
                    "status": "remove_blocked",
                    "body_removed": False,
                    "message": "the updater did not quiesce, so the body was left in place; "
                    "call remove again",
                }
        with self._lock:
            try:
                self._write_status(STATUS_INACTIVE)
                clear_descriptor(self.paths)
                self._forget_ended()  # a removed card stays removed, also for a later host
                try:
                    self.paths.body.unlink()
                    removed = True
                except FileNotFoundError:
                    removed = False
                if watch is not None:
                    watch.removed = True  # a retry in flight or to come must not bring it back
            except OSError as exc:
                return {
                    "status": "remove_failed",
                    "message": f"cannot remove the card: {self._cannot_write(exc)}",
                    **self._paths_view(),
                }
            return {
                "status": "removed",
                "body_removed": removed,
                "watch_id": watch.watch_id if watch else None,
                **self._paths_view(),
            }

    def settings(self) -> Result:
        return settings_result(self.paths)

    # ----------------------------------------------------------------- internals

    def _forget_finished_watches(self) -> None:
        """Keep the latest few finished watches for `inspect`, not every one since the host
        started: a host serving an agent that starts and removes cards all day kept each
        watch's last body and listed every id in the refusal of an unknown one."""
        finished = [
            watch
            for watch in self._watches.values()
            if watch is not self._current and watch.state not in LIVE_STATES
        ]
        for watch in finished[: max(0, len(finished) - KEPT_FINISHED_WATCHES)]:
            self._seen_watch_number = max(self._seen_watch_number, watch_number(watch.watch_id))
            del self._watches[watch.watch_id]

    def _unknown(self, watch_id: str, action: str) -> Result:
        """The refusal of a `watch_id` this host does not know, with the ids it knows and
        the next step that fits `action`: every action was told to `remove`, which an
        `inspect` of a mistyped id has no use for (and which deletes the card)."""
        if self._not_resumed is not None and self._not_resumed[0] == watch_id:
            return _failed(
                UNKNOWN_WATCH,
                f"watch_id: {watch_id} was not resumed when this host started: "
                f"{self._not_resumed[1]}, so its card was left inactive; start a new watch, "
                "or call remove to clear the card",
            )
        unknown = f"watch_id: {quoted(watch_id)} is not a watch of this host"
        if not self._watches:
            # No id to give: `start` answers one; a card left by no watch goes with `remove`.
            fix = {
                "stop": "nothing runs to stop; call remove to clear a card left without an id",
            }.get(action, f"nothing to {action}; call start, whose result names the watch's id")
            return _failed(UNKNOWN_WATCH, f"{unknown}, which has no watch: {fix}")
        known = ", ".join(self._watches)
        current = self._current
        if action == "inspect":
            fix = "inspect one of those ids (start's result names each)"
        elif action == "retry" and current is not None and not current.removed:
            fix = f"only the latest can be retried: retry {current.watch_id}"
        elif action == "retry":
            fix = "none can be retried, its card was removed: call start for a new watch"
        elif current is not None and current.state in LIVE_STATES:
            fix = f"the running one is {current.watch_id}: stop {current.watch_id}"
        else:
            fix = "none is running, so there is nothing to stop"
        return _failed(UNKNOWN_WATCH, f"{unknown} (known: {known}); {fix}")

    def _paths_view(self) -> Result:
        return {
            "taskcard_dir": str(self.paths.taskcard_dir),
            "status_path": str(self.paths.status),
            "body_path": str(self.paths.body),
            "watch_path": str(self.paths.watch),
            "status_value": parse_status(read_bytes(self.paths.status)),
        }

    def _cannot_render(self, watch: _Watch) -> str | None:
        """Why `retry` may not render `watch` at all, or None. One card per agent: an older
        watch's render would overwrite the card of the watch that replaced it, and a removed
        card must stay removed. Under the lock."""
        current = self._current
        if watch.removed:
            return "its card was removed; start a new watch"
        if current is not None and current is not watch:
            return f"watch {current.watch_id} replaced it; retry {current.watch_id} instead"
        return None

    def _final_retry_available(self, watch: _Watch) -> bool:
        """Whether `retry` would give the exhausted `watch` its one final render now. Under
        the lock."""
        return (
            watch.state == "exhausted"
            and not watch.final_retry_used
            and self._cannot_render(watch) is None
        )

    def _view(self, watch: _Watch) -> Result:
        thread = watch.thread
        if thread is not None and not thread.is_alive() and not watch.stop_event.is_set():
            self._updater_died(watch, "its thread is gone")
        return {
            "status": watch.state,
            "watch_id": watch.watch_id,
            **self._paths_view(),
            "refreshes_used": watch.refreshes_used,
            "max_refreshes": watch.max_refreshes,
            "refreshes_remaining": max(0, watch.max_refreshes - watch.refreshes_used),
            "stop_reason": watch.stop_reason,
            # The one render an exhausted watch still has (the manual's "retry once more to
            # publish a final state"): said only by the refusal of a second one before.
            "final_retry_available": self._final_retry_available(watch),
        }

    def _render(
        self, watch: _Watch, cancel: threading.Event, due: float | None = None
    ) -> tuple[Rendered | RenderFailure | None, str]:
        """The verdict and stderr tail; None when the run was cancelled (it means nothing)."""
        max_chars = self._settings.get().max_body_chars
        try:
            # Checked again at every run, not only at start: the file may have been swapped
            # for a symlink out of the workdir, or removed, since (docs/producer.md,
            # "Decisions"). The one look at the path: a `Path.is_file()` before it raised
            # what it does not take for "no" (EIO, a name too long behind a link) out of the
            # tick, which crashed as `watch_crash` instead of failing with the system's words.
            renderer = resolve_renderer(self.workdir, watch.renderer_rel)
        except (RendererPathError, RendererUnreadable) as exc:
            return RenderFailure("renderer_failed", f"{exc}; the renderer was not run"), ""
        request = RunRequest(
            renderer=renderer,
            workdir=self.workdir,
            timeout_s=watch.timeout_s,
            stdout_limit_bytes=stdout_limit_for(max_chars),
            env=self._renderer_env,
            due=due,
        )
        outcome = self._runner(request, cancel)
        tail = outcome.stderr_tail.decode("utf-8", errors="replace")
        if outcome.cancelled:
            return None, tail
        return classify(outcome, max_chars, watch.timeout_s), tail

    def _write_status(self, value: bytes) -> None:
        if not self._written.holds(self.paths.status, value):
            self._written.write(self.paths.status, value)

    def _publish(self, body: str, *, activate: bool, durable: bool = True) -> bool:
        """Body first, then `active`; identical bytes are left alone. True when the body changed.

        Ticks pass `durable=False`: the body is still replaced atomically (a reader sees the
        old or the new one, and a killed process loses nothing), only a power cut may show an
        earlier body, until the resumed watch's first render (free) replaces it. Files this
        host wrote and nobody touched since are not read back (`written.py`).
        """
        data = body.encode("utf-8")
        changed = not self._written.holds(self.paths.body, data)
        if changed:
            self._written.write(self.paths.body, data, durable=durable)
        if activate:
            self._write_status(STATUS_ACTIVE)
        return changed

    def _record_success(self, watch: _Watch, body: str) -> None:
        watch.last_body = body
        watch.last_body_at = self._clock()
        # Reminders the hooks submitted are known from the turn count's file alone.
        hooks_reminders = self._side_effect(
            watch, "reset the turn count", lambda: reset_turns(self.paths)
        )
        self._side_effect(
            watch,
            "clear the reminder",
            lambda: self._notifier.clear_reminder(hooks_reminders or ()),
        )

    def _record_published(self, watch: _Watch, body: str) -> None:
        """A publication: the success, and the recovery when it ends an error episode."""
        self._record_success(watch, body)
        if watch.error is not None:
            self._notify(watch, TaskCardRecoveredNotification(watch.watch_id, watch.error_epoch))
            watch.error = None
            watch.stderr_tail = ""
            if watch.state == "error":
                watch.state = "watching"

    def _notify(self, watch: _Watch, event: TaskCardNotification) -> None:
        self._side_effect(
            watch, f"write a {type(event).__name__}", lambda: self._notifier.notify(event)
        )

    def _side_effect(self, watch: _Watch, what: str, action: Callable[[], _T]) -> _T | None:
        """Notices and the turn count live in `.notification/`, beside the card, not in it:
        a file there that cannot be written is logged and never stops the card itself."""
        try:
            return action()
        except OSError as exc:
            log.warning("task card watch %s: cannot %s: %s", watch.watch_id, what, exc)
            return None

    def _record_failure(self, watch: _Watch, failure: RenderFailure, tail: str) -> None:
        if watch.error is None:
            watch.error_epoch += 1
            self._notify(
                watch,
                TaskCardErrorNotification(
                    watch.watch_id, watch.error_epoch, failure.code, failure.message
                ),
            )
        watch.error = failure
        watch.error_at = self._clock()
        watch.stderr_tail = tail
        if watch.state == "watching":
            watch.state = "error"
        log.warning("task card watch %s refresh failed: %s", watch.watch_id, failure.code)

    def _refresh(
        self, watch: _Watch, *, counted: bool, from_tick: bool, due: float | None = None
    ) -> RenderFailure | None:
        """One render and its consequences. Returns the failure, if any."""
        with watch.render_lock:
            with self._lock:
                live = watch.state in LIVE_STATES
                if from_tick and (watch.state not in ("watching", "error") or self._closed):
                    return None
            cancel = watch.stop_event if live else threading.Event()
            verdict, tail = self._render(watch, cancel, due)
            if verdict is None:
                return None  # cancelled by stop or host shutdown: no budget, no episode
            with self._lock:
                still_live = watch.state in ("watching", "error")
                if live and not still_live:
                    return None  # stopped meanwhile: a late body must not revive the card
                if watch.removed or watch is not self._current:
                    return None  # removed or replaced meanwhile: the card is no longer its own
                if from_tick and self.workdir_gone():
                    return None  # deleted during the render: a write would create it again
                if counted:
                    watch.refreshes_used += 1
                failure: RenderFailure | None = None
                outside = self._card_folder_outside()
                if outside is not None:
                    failure = RenderFailure("write_failed", outside)
                elif isinstance(verdict, Rendered):
                    try:
                        self._publish(verdict.body, activate=still_live, durable=not from_tick)
                    except OSError as exc:
                        failure = RenderFailure("write_failed", self._cannot_write(exc))
                    else:
                        self._record_published(watch, verdict.body)
                else:
                    failure = verdict
                if failure is not None:
                    self._record_failure(watch, failure, tail)
                spent = counted and watch.refreshes_used >= watch.max_refreshes
                if spent and watch.state in ("watching", "error", "stopped"):
                    self._exhaust(watch)
                elif still_live and outside is None:
                    self._persist_budget(watch)
                return failure

    def _exhaust(self, watch: _Watch) -> None:
        watch.state = "exhausted"
        watch.stop_reason = "max_refreshes"
        watch.stop_event.set()
        self._drop_tally(watch)
        # The notice first: its key makes a repeat harmless, while a host killed after the
        # descriptor is cleared would never send it (nothing resumes the watch).
        self._notify(watch, TaskCardLimitNotification(watch.watch_id, watch.max_refreshes))
        outside = self._card_folder_outside()
        if outside is not None:
            # The same check as every other card write of a tick: nothing goes through it.
            log.error("task card watch %s: cannot write inactive: %s", watch.watch_id, outside)
        else:
            try:
                self._write_status(STATUS_INACTIVE)
            except OSError as exc:
                log.error("task card watch %s: cannot write inactive: %s", watch.watch_id, exc)
            with contextlib.suppress(OSError):
                clear_descriptor(self.paths)
            self._record_ended(watch)
        log.info("task card watch %s exhausted its refresh budget", watch.watch_id)

    def _persist_budget(self, watch: _Watch) -> None:
        """Record one spent refresh: a line in the tally, or the descriptor when it must change.

        Atomic without fsync either way (see `tally.py`); the descriptor is rewritten when its
        other fields moved (an error episode opened or closed), when the tally cannot be used,
        or when it is gone: the manual keeps `watch.json` while a watch is active, and one
        deleted under a running watch (a shell `rm` of the card folder) left a later host
        nothing to resume, and the card `active` with nobody refreshing it. One `lstat`.
        """
        unchanged = (
            watch.error_epoch == watch.persisted_epoch
            and (watch.error is not None) == watch.persisted_open
        )
        if watch.tally is not None and unchanged and os.path.lexists(self.paths.watch):
            try:
                watch.tally.record(watch.refreshes_used)
                return
            except OSError as exc:
                log.warning("task card watch %s: tally unusable: %s", watch.watch_id, exc)
                watch.tally_failed = True
                self._drop_tally(watch)
        with contextlib.suppress(OSError):
            write_descriptor(self.paths, watch.descriptor(), durable=False)
            self._restart_tally(watch)

    def _restart_tally(self, watch: _Watch) -> None:
        """After a descriptor write: the tally restarts from the count just written."""
        watch.persisted_epoch = watch.error_epoch
        watch.persisted_open = watch.error is not None
        if watch.tally_failed:
            return
        try:
            if watch.tally is None:
                watch.tally = RefreshTally(self.paths, watch.watch_id, watch.refreshes_used)
            else:
                watch.tally.restart(watch.refreshes_used)
        except OSError as exc:
            log.warning(
                "task card watch %s: no budget tally (%s); watch.json is rewritten per tick",
                watch.watch_id,
                exc.strerror or exc,
            )
            watch.tally_failed = True
            self._drop_tally(watch)

    def _drop_tally(self, watch: _Watch) -> None:
        if watch.tally is not None:
            watch.tally.close()
            watch.tally = None

    def _quiesce(self, watch: _Watch) -> bool:
        thread = watch.thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(self._quiesce_timeout_s)
            if thread.is_alive():
                return False
        acquired = watch.render_lock.acquire(timeout=self._quiesce_timeout_s)
        if acquired:
            watch.render_lock.release()
        return acquired

    def _spawn_updater(self, watch: _Watch) -> None:
        thread = threading.Thread(
            target=self._updater, args=(watch,), name=f"taskcard-{watch.watch_id}", daemon=True
        )
        watch.thread = thread
        thread.start()

    def _updater(self, watch: _Watch) -> None:
        """The updater thread: ticks, and if the thread itself ends abnormally, says so.

        A tick's own failure is recorded inside the loop and the loop goes on; this outer
        barrier is for what escapes it (a BaseException, a bug in the loop's own arithmetic).
        Without it the thread would vanish while `inspect` kept answering `watching`.
        """
        try:
            self._tick_loop(watch)
        except BaseException as exc:  # the thread is ending either way: record why
            log.exception("task card watch %s updater died", watch.watch_id)
            with self._lock:
                self._updater_died(watch, type(exc).__name__)

    def _updater_died(self, watch: _Watch, why: str) -> None:
        """Turn a dead updater of a live watch into a visible error (and one notification)."""
        if self._closed or watch.updater_died or watch.state not in ("watching", "error"):
            return
        watch.updater_died = True
        failure = RenderFailure(
            "watch_crash",
            f"the updater stopped ({why}); the card is no longer refreshed. "
            "Call retry to restart it, or stop and start a new watch",
        )
        try:
            self._record_failure(watch, failure, "")
        except Exception:  # the notification port failed too; the state below still holds
            log.exception("task card watch %s: cannot record the dead updater", watch.watch_id)
        watch.state = "error"
        watch.error = failure

    def _tick_loop(self, watch: _Watch) -> None:
        """Tick until stopped, exhausted or closed. A crash is recorded, never swallowed.

        Ticks stand on a fixed grid from the updater's start (`schedule.py`): a render that
        overruns one or more grid points skips those ticks, the next waits for its grid point.
        """
        origin = time.monotonic()
        slot = 0
        while True:
            slot, skipped = next_slot(origin, watch.interval_s, slot, time.monotonic())
            if skipped:
                with self._lock:
                    watch.ticks_skipped += skipped
            due = slot_due(origin, watch.interval_s, slot)
            if _wait_until(watch.stop_event, due):
                return
            if self.workdir_gone():
                self._workdir_gone(watch)
                return
            try:
                self._refresh(watch, counted=True, from_tick=True, due=due)
            except Exception:  # the loop must outlive one bad tick; the error is recorded
                log.exception("task card watch %s tick crashed", watch.watch_id)
                with self._lock:
                    self._record_failure(
                        watch, RenderFailure("watch_crash", "the updater hit an internal error"), ""
                    )

    def _workdir_gone(self, watch: _Watch) -> None:
        """The workdir was deleted (or moved away) under a running watch: there is no card
        left to refresh, and writing one would create the folder again, so the watch stops
        instead of failing every tick until its budget runs out (a host then exits once
        idle)."""
        with self._lock:
            if watch.state not in ("watching", "error"):
                return
            watch.state = "stopped"
            watch.stop_reason = "workdir_gone"
            watch.stop_event.set()
            self._drop_tally(watch)
        log.error(
            "task card watch %s stopped: its workdir %s is gone", watch.watch_id, self.workdir
        )

    def _end_leftover_renders(self) -> None:
        """Before anything renders: kill what the runs of a host of this workdir that died
        without ending cleanly (SIGKILL, a crash) left running; see `workdir_lock.py`."""
        boot = boot_id()
        ended: set[str] = set()  # the same note may be in both locks (an upgraded workdir)
        for previous in self._host_lock.previous:
            tag = previous.leftover_tag(self.workdir, boot)
            if tag is None or tag in ended:
                continue
            ended.add(tag)
            try:
                killed = end_leftover_renders(tag)
            except OSError as exc:  # no /proc to read: the card still comes up
                log.warning("task card: cannot look for a killed host's renders (%s)", exc)
                return
            if killed:
                log.warning(
                    "task card: ended %s the renders of a killed host (pid %s) left running in %s",
                    counted(killed, "process", "processes"),
                    previous.pid if previous.pid is not None else "unknown",
                    self.workdir,
                )

    def _rehydrate(self) -> None:
        """Resume the persisted watch, or clear a stale descriptor and leave the card inactive."""
        try:
            descriptor = read_descriptor(self.paths)
        except DescriptorCorrupt as exc:
            self._forget_ended()
            self._retire_stale(f"corrupt watch.json ({exc})")
            return
        if descriptor is None:
            self._restore_ended()
            return
        self._forget_ended()  # a watch was started after the one it kept
        self._seen_watch_number = watch_number(descriptor.watch_id)
        try:
            resolve_renderer(self.workdir, descriptor.renderer_path)
        except RendererPathError as exc:
            # Said as it is: "is gone" of a renderer linked out of the workdir sent the agent
            # looking for a file that was still there.
            self._retire_stale(f"renderer of {descriptor.watch_id} {exc.why}")
            self._not_resumed = (
                descriptor.watch_id,
                f"its renderer {quoted(descriptor.renderer_path)} {exc.why}",
            )
            return
        except RendererUnreadable:
            pass  # no verdict on the path: the watch resumes, and its renders say what fails
        used = descriptor.refreshes_used
        tallied = read_tally(self.paths, descriptor.watch_id, descriptor.max_refreshes)
        if tallied is not None:
            used = max(used, tallied)  # refreshes spent after the descriptor was written
        timeout_s, max_refreshes = self._resume_ceilings(descriptor)
        if used >= max_refreshes:
            # The budget ran out with no host to end the watch (one killed once its last tick
            # spent it), or a ceiling lowered meanwhile took it: cleared and left inactive, as
            # the manual has a boot do with a stale descriptor, never resumed. It is known as
            # exhausted, as the host that saw it run out would have left it, so `inspect`
            # answers for it and the one final `retry` the manual offers a watch that expired
            # is still there; it was "not resumed: start a new watch", the final retry lost.
            self._retire_stale(f"{descriptor.watch_id} has no refresh budget left")
            watch = self._known_ended(descriptor, "exhausted", timeout_s, max_refreshes, used)
            # Its notice, keyed by the watch: a host killed before it sent it never did.
            self._notify(watch, TaskCardLimitNotification(watch.watch_id, watch.max_refreshes))
            self._record_ended(watch)
            return
        watch = _Watch.of(descriptor, timeout_s, max_refreshes, used)
        if descriptor.error_code is not None:
            # Killed mid-episode: the episode goes on, so a renderer still failing sends no
            # second error notice, and one that works again sends the recovery the chats'
            # cards wait for (they show the error until then).
            watch.error = RenderFailure(
                descriptor.error_code,
                "the renderer was failing when the previous host stopped",
            )
            watch.state = "error"
        verdict, tail = self._render(watch, watch.stop_event)
        with self._lock:
            if verdict is None:
                pass  # cannot happen before the updater exists; nothing to record
            elif isinstance(verdict, Rendered):
                # A card file that cannot be written is the watch's error, as on a tick: the
                # host must still come up, or no call (not even remove) could reach it.
                try:
                    self._publish(verdict.body, activate=True)
                except OSError as exc:
                    failure = RenderFailure("write_failed", self._cannot_write(exc))
                    self._record_failure(watch, failure, tail)
                else:
                    self._record_published(watch, verdict.body)
            else:
                self._record_failure(watch, verdict, tail)
            try:
                write_descriptor(self.paths, watch.descriptor())
            except OSError as exc:  # the one on disk still resumes this watch
                log.warning("task card watch %s: %s", watch.watch_id, self._cannot_write(exc))
            self._restart_tally(watch)
            self._watches[watch.watch_id] = watch
            self._current = watch
            self._spawn_updater(watch)
        log.info("task card watch %s resumed", watch.watch_id)

    def _restore_ended(self) -> None:
        """The watch an earlier host stopped (or whose budget ran out), known again, so
        `inspect` and `retry` answer for it as that host would have: a host exits once no
        watch is live, and the manual keeps a stopped watch for a later retry. Nothing is
        rendered and no updater runs; its ceilings are capped as a resume's are."""
        ended = read_ended(self.paths)
        if ended is None:
            return
        descriptor = ended.descriptor
        timeout_s, max_refreshes = self._resume_ceilings(descriptor)
        spent = descriptor.refreshes_used >= max_refreshes
        self._known_ended(
            descriptor,
            "exhausted" if spent else ended.state,
            timeout_s,
            max_refreshes,
            descriptor.refreshes_used,
            last_body_at=ended.last_body_at,
            final_retry_used=ended.final_retry_used,
        )

    def _known_ended(
        self,
        descriptor: WatchDescriptor,
        state: str,
        timeout_s: float,
        max_refreshes: int,
        used: int,
        *,
        last_body_at: str | None = None,
        final_retry_used: bool = False,
    ) -> _Watch:
        """The ended watch `descriptor` kept, made this host's current one: stopped or
        exhausted, with no updater, known to `inspect` and `retry`."""
        watch = _Watch.of(
            descriptor,
            timeout_s,
            max_refreshes,
            used,
            state=state,
            stop_reason="max_refreshes" if state == "exhausted" else "stopped",
            last_body_at=last_body_at,
            final_retry_used=final_retry_used,
        )
        if descriptor.error_code is not None:
            # The episode is still open: a retry that publishes sends its recovery, one that
            # fails opens no second episode (as in the host that stopped it).
            watch.error = RenderFailure(
                descriptor.error_code, "the renderer was failing when the watch ended"
            )
        watch.stop_event.set()
        self._seen_watch_number = max(self._seen_watch_number, watch_number(watch.watch_id))
        self._watches[watch.watch_id] = watch
        self._current = watch
        return watch

    def _record_ended(self, watch: _Watch) -> None:
        """Keep a stopped or exhausted watch for later hosts (`descriptor.write_ended`); a
        record that cannot be written is logged and costs only that."""
        if watch.state not in ("stopped", "exhausted") or self._card_folder_outside():
            return
        ended = EndedWatch(
            watch.descriptor(), watch.state, watch.last_body_at, watch.final_retry_used
        )
        self._side_effect(watch, "record the ended watch", lambda: write_ended(self.paths, ended))

    def _forget_ended(self) -> None:
        with contextlib.suppress(OSError):
            clear_ended(self.paths)

    def _resume_ceilings(self, descriptor: WatchDescriptor) -> tuple[float, int]:
        """The watch's timeout and budget, capped by the ceilings in force now: the manual
        reads `timeout-s` and `max-refreshes` again at every resume, so a ceiling the owner
        lowered while no host ran caps the resumed watch as it would cap a start. A settings
        document that cannot be read caps nothing (a typo never cuts a running card short)."""
        try:
            settings = load_settings(self.paths)
        except SettingsUnavailable:
            return descriptor.timeout_s, descriptor.max_refreshes
        return (
            min(descriptor.timeout_s, settings.timeout_s),
            min(descriptor.max_refreshes, settings.max_refreshes),
        )

    def _retire_stale(self, why: str) -> None:
        log.warning("task card: clearing stale descriptor: %s", why)
        try:
            clear_descriptor(self.paths)
        except OSError as exc:  # a folder planted there: the host still serves, start says why
            log.warning("task card: cannot clear %s (%s)", self.paths.watch, exc.strerror)
        if self.paths.status.exists() or self.paths.body.exists():
            try:
                self._write_status(STATUS_INACTIVE)
            except OSError as exc:  # the host still serves; start and remove say why
                log.warning("task card: %s", self._cannot_write(exc))

    def _card_folder_outside(self) -> str | None:
        """Why `taskcard/` cannot be written now: swapped for a symlink out of the workdir
        since the host started (the start refuses one). One `lstat` when it is a folder."""
        folder = self.paths.taskcard_dir
        try:
            if not stat.S_ISLNK(os.lstat(folder).st_mode):
                return None
        except OSError:
            return None
        if is_inside(str(self.workdir), os.path.realpath(folder)):
            return None
        return (
            "taskcard/ became a symlink that leads out of the workdir; nothing is written "
            "through it, so make it a real folder inside the workdir again"
        )

    def _cannot_write(self, exc: OSError) -> str:
        """Why a card file (or one of the host's own, in its private folder) could not be
        written or removed, naming it and what it must be."""
        target = exc.filename2 if exc.filename2 is not None else exc.filename
        path = Path(os.fsdecode(target)) if target is not None else None
        if path is not None and HOST_DIR in (path.name, path.parent.name):
            where = f"{HOST_DIR}/" if path.name == HOST_DIR else f"{HOST_DIR}/{path.name}"
            for known in (self.paths.watch_seq.name, self.paths.tally.name):
                if path.name.startswith(f".{known}."):  # its temp file
                    where = f"{HOST_DIR}/{known}"
            return (
                f"cannot write {where} ({exc.strerror or exc}); the task card host keeps its "
                f"own files in a writable {HOST_DIR}/ folder of the workdir: create it (or let "
                "the host create it) and move away what is in the way, then call again"
            )
        name = path.name if path is not None else ""
        where = "taskcard/"
        for known in (self.paths.body.name, self.paths.status.name, self.paths.watch.name):
            if name == known or name.startswith(f".{known}."):  # or its temp file
                where = f"taskcard/{known}"
        return (
            f"cannot write {where} ({exc.strerror or exc}); the card files must be regular "
            "files in a writable taskcard/ folder: move away what is in the way, then call again"
        )


MAX_WAIT_STEP_S: Final = 3600.0
"""The longest single wait of the updater. `interval_s` has no ceiling, and one wait longer
than `threading.TIMEOUT_MAX` (about 292 years) raises OverflowError, so a far tick is waited
for in steps; each step re-reads the monotonic clock, so the steps never add up as drift."""


def _wait_until(stop: threading.Event, due: float) -> bool:
    """Wait until the monotonic time `due`; True as soon as `stop` is set."""
    while True:
        remaining = due - time.monotonic()
        if remaining <= 0:
            return stop.is_set()
        if stop.wait(min(remaining, MAX_WAIT_STEP_S)):
            return True


def _summary(result: Result) -> str:
    status = result.get("status")
    watch = result.get("watch_id")
    if status == "failed":
        return f"{result.get('action')} failed: {result.get('message')}"
    if "refreshes_remaining" in result:
        left = counted(result["refreshes_remaining"], "refresh", "refreshes")
        return f"{watch}: {status}, {left} left"
    return f"{result.get('action')}: {status}"
