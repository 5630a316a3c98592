"""Claiming queued messages: directory descriptors, no links, one rename decides.

Every step goes through descriptors opened with `O_NOFOLLOW` below the workdir: `inbox` and
its subfolders must be real directories (a link or a file there is refused with
`InboxUnsafe`, the same rule the service keeps), and message files must be regular files.
A claim is `rename(queued/<id>.json, taken/<id>.json)`; when the service cancelled the
message first, the rename fails with FileNotFoundError and the message is simply not ours.
Only a message whose rename succeeded is acknowledged, with one `write` on `acks.jsonl`, and
only once its reader has it: `claiming` holds a claim while the caller hands the messages
over, and puts back in `queued/` (`release`) whatever was not marked delivered.

A reader killed before it settled its claim (SIGKILL, a crash) cannot put anything back
itself, so each claim is recorded first in `inbox/claims/<id>.json` with who holds it
(`holders.py`); the next reader's claim puts the messages of a holder that is gone back in
`queued/` (unless acknowledged) before it reads the queue. Claiming, putting back and that
recovery hold an exclusive `flock` on `inbox/claims/`, so a message a live reader holds is
never put back by another one.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import stat
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from taskcard.producers.inbox.contract import (
    ACKS_FILE,
    CLAIMS_DIR,
    INBOX_DIR,
    MAX_MESSAGE_BYTES,
    MESSAGE_ID,
    QUEUED_DIR,
    SHARED_DIR_MODE,
    SHARED_FILE_MODE,
    TAKEN_DIR,
    VIAS,
    Message,
    MessageError,
    frame,
    parse_message,
    share,
    shared_group,
)
from taskcard.producers.inbox.holders import judge, record_bytes
from taskcard.producers.task_card.contract import (
    LOOP_OF_LINKS,
    append_whole,
    cannot_read,
    cannot_write,
    line_break_first,
    link_loop,
    open_appending,
    quoted,
    utc_now_iso,
)
from taskcard.producers.task_card.workdir_arg import (
    WORKDIR_FIX,
    WorkdirError,
    given_path,
    not_a_directory,
    shown_path,
)

MAX_FILES: Final = 256  # read per call; the rest waits for the next one
_DIR_FLAGS: Final = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS: Final = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC

Clock = Callable[[], str]


class InboxUnsafe(OSError):
    """`inbox` or a subfolder is a link or not a directory: refused, never followed."""


class InboxReadFailed(OSError):
    """The system failed a read of the inbox's folders (an I/O error): the text names the
    folder, the errno and the fix (`contract.cannot_read`); it said "cannot read the inbox:
    Input/output error", naming neither."""

    def __init__(self, shown: str, exc: OSError) -> None:
        super().__init__(exc.errno, f"{shown}: {cannot_read(exc)}")

    def __str__(self) -> str:
        return str(self.strerror)


class InboxWriteFailed(OSError):
    """The system refused to create a folder of the inbox a claim needs (`taken/`, `claims/`:
    no room, a read-only disk, no write access): the text names the folder, why and the fix
    (`contract.cannot_write`). It said "cannot read the inbox: [Errno 28] No space left on
    device: 'taken'"."""

    def __init__(self, shown: str, exc: OSError) -> None:
        super().__init__(exc.errno, cannot_write(shown, exc))

    def __str__(self) -> str:
        return str(self.strerror)


@dataclass
class Batch:
    """What one read of the inbox found: messages (claimed or peeked) and bad files."""

    messages: list[Message] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


def _open_dir(
    name: str, parent_fd: int, shown: str, *, create: bool, group: int | None = None
) -> int | None:
    """A descriptor of the real directory `name` under `parent_fd`; None when missing. One
    this call creates is shared with the workdir's `group` as the service's are."""
    for attempt in (1, 2):
        try:
            fd = os.open(name, _DIR_FLAGS, dir_fd=parent_fd)
            if attempt == 2:
                share(fd, group, SHARED_DIR_MODE)
            return fd
        except FileNotFoundError:
            if not create or attempt == 2:
                return None
            try:
                os.mkdir(name, 0o700, dir_fd=parent_fd)
            except FileExistsError:
                pass
            except OSError as exc:
                raise InboxWriteFailed(shown, exc) from None
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                raise InboxUnsafe(
                    f"{shown} is a symlink or not a directory; refusing to follow it "
                    f"(remove {shown}; the service recreates the inbox)"
                ) from None
            raise InboxReadFailed(shown, exc) from None
    return None


def _open_workdir(folder: Path) -> int:
    """A descriptor of the workdir itself (links on its name followed, as for any workdir);
    one inside a loop of symbolic links raises `WorkdirError` naming the link, in the words
    every reader uses (`contract.link_loop`), and one missing or a file raises it naming the
    path and the fix: both were the system's bare OSError."""
    try:
        return os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except (FileNotFoundError, NotADirectoryError):
        # The system's bare words named neither the field nor the fix.
        raise WorkdirError(
            f"workdir: {shown_path(folder)} {not_a_directory(str(folder))}; {WORKDIR_FIX}"
        ) from None
    except OSError as exc:
        if exc.errno != errno.ELOOP:
            # The system failed or refused the read (an I/O error, no access): the workdir,
            # the errno and the fix, as for a folder of the inbox.
            raise InboxReadFailed(shown_path(folder), exc) from None
        loop = link_loop(folder) or LOOP_OF_LINKS
        raise WorkdirError(
            f"workdir: {shown_path(folder)} {loop}; fix the links, or give the folder itself"
        ) from None


@contextlib.contextmanager
def _inbox(
    workdir: Path, *, taken: bool
) -> Iterator[tuple[int, int, int | None, int | None] | None]:
    """(inbox, queued, taken) descriptors and the workdir's shared group, or None when there
    is nothing queued at all."""
    try:
        folder = given_path(workdir)
    except WorkdirError as exc:
        raise WorkdirError(f"workdir: {exc}") from None
    fds: list[int] = []
    try:
        root = _open_workdir(folder)
        fds.append(root)
        inbox = _open_dir(INBOX_DIR, root, f"{INBOX_DIR}/", create=False)
        if inbox is None:
            yield None
            return
        fds.append(inbox)
        queued = _open_dir(QUEUED_DIR, inbox, f"{INBOX_DIR}/{QUEUED_DIR}/", create=False)
        if queued is None:
            yield None
            return
        fds.append(queued)
        taken_fd = None
        group = shared_group(root)
        if taken:
            taken_fd = _open_dir(
                TAKEN_DIR, inbox, f"{INBOX_DIR}/{TAKEN_DIR}/", create=True, group=group
            )
            if taken_fd is not None:
                fds.append(taken_fd)
        yield inbox, queued, taken_fd, group
    finally:
        for fd in reversed(fds):
            os.close(fd)


# What opening a message file meets when it is gone (claimed or cancelled meanwhile) or is
# a link (`O_NOFOLLOW`): no message, and nothing the system failed.
_NOT_A_MESSAGE: Final = (errno.ENOENT, errno.ELOOP, errno.ENOTDIR, errno.ENXIO)


def _read(name: str, dir_fd: int, failed: list[OSError] | None = None) -> tuple[bytes, int] | None:
    """The bytes and inode of a regular file (bounded), or None when it is gone or odd, or
    its read failed (then added to `failed`, when given)."""
    try:
        fd = os.open(name, _FILE_FLAGS, dir_fd=dir_fd)
    except OSError as exc:
        if failed is not None and exc.errno not in _NOT_A_MESSAGE:
            failed.append(exc)
        return None  # claimed or cancelled meanwhile, or a link: not a message
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            return None
        return os.read(fd, MAX_MESSAGE_BYTES + 1), info.st_ino
    except OSError as exc:
        if failed is not None:
            failed.append(exc)
        return None
    finally:
        os.close(fd)


def _odd_entry(name: str, dir_fd: int) -> str | None:
    """What stands under a message's name when it is not a regular file (a link, a named
    pipe, a folder), never following or opening it; None when it is gone (claimed or
    cancelled meanwhile) or a regular file after all."""
    try:
        mode = os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode
    except OSError:
        return None
    if stat.S_ISREG(mode):
        return None
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    if stat.S_ISFIFO(mode):
        return "a named pipe"
    if stat.S_ISDIR(mode):
        return "a folder"
    return "not a regular file"


def _scan(queued_fd: int) -> tuple[list[tuple[Message, int]], list[str]]:
    """Every valid queued message with its inode, oldest first, and what was wrong."""
    try:
        listed = os.listdir(queued_fd)
    except OSError as exc:
        raise InboxReadFailed(f"{INBOX_DIR}/{QUEUED_DIR}/", exc) from None
    names = sorted(n for n in listed if n.endswith(".json"))[:MAX_FILES]
    found: list[tuple[Message, int]] = []
    problems: list[str] = []
    for name in names:
        ident = name[: -len(".json")]
        if not MESSAGE_ID.fullmatch(ident):
            problems.append(f"inbox/queued/{name[:80]!r}: not a message id; file left alone")
            continue
        failed: list[OSError] = []
        read = _read(name, queued_fd, failed)
        if failed:  # the system's failure: the message stays queued for the next read
            problems.append(f"inbox/queued/{name}: {cannot_read(failed[0])}; it stays queued")
            continue
        if read is None:
            odd = _odd_entry(name, queued_fd)
            if odd is not None:
                problems.append(f"inbox/queued/{name}: {odd}, not a message file; left alone")
            continue
        try:
            found.append((parse_message(read[0], ident), read[1]))
        except MessageError as exc:
            problems.append(f"inbox/queued/{name}: {exc}; file left alone")
    found.sort(key=lambda item: (item[0].queued_at, item[0].id))
    return found, problems


def peek(workdir: Path) -> Batch:
    """The queued messages, oldest first, without claiming any."""
    with _inbox(workdir, taken=False) as fds:
        if fds is None:
            return Batch()
        found, problems = _scan(fds[1])
    return Batch([message for message, _ in found], problems)


def _ack(inbox_fd: int, ident: str, via: str, clock: Clock) -> None:
    record = {"id": ident, "state": "delivered", "at": clock(), "via": via}
    line = (json.dumps(record, separators=(",", ":")) + "\n").encode()
    flags = os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = open_appending(ACKS_FILE, flags, dir_fd=inbox_fd)
    try:
        append_whole(fd, line_break_first(fd) + line)
    finally:
        os.close(fd)


@contextlib.contextmanager
def _claims(inbox_fd: int, *, create: bool, group: int | None) -> Iterator[int | None]:
    """The `claims/` folder, locked (exclusive `flock`) while the block runs; None when it
    does not exist (and `create` is False). The kernel drops the lock when its holder dies."""
    fd = _open_dir(CLAIMS_DIR, inbox_fd, f"{INBOX_DIR}/{CLAIMS_DIR}/", create=create, group=group)
    if fd is None:
        yield None
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError as exc:
            raise InboxReadFailed(f"{INBOX_DIR}/{CLAIMS_DIR}/", exc) from None
        yield fd
    finally:
        os.close(fd)  # releases the lock


def _record(claims_fd: int, ident: str, via: str, group: int | None) -> str | None:
    """Write who holds `ident` (this process) before claiming it; a problem when it cannot
    be written (the message is claimed all the same: delivering it matters more)."""
    name = f"{ident}.json"
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    data = record_bytes(via)
    try:
        fd = os.open(name, flags, 0o600, dir_fd=claims_fd)
        try:
            share(fd, group, SHARED_FILE_MODE)
            if os.write(fd, data) != len(data):
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        finally:
            os.close(fd)
    except OSError as exc:
        _forget(claims_fd, ident)
        return (
            f"inbox/{CLAIMS_DIR}/{name}: cannot record who holds the message "
            f"({exc.strerror or exc}); if this reader is killed before delivering it, move "
            f"inbox/{TAKEN_DIR}/{name} back to inbox/{QUEUED_DIR}/ by hand"
        )
    return None


def _forget(claims_fd: int | None, ident: str) -> None:
    if claims_fd is not None:
        with contextlib.suppress(OSError):
            os.unlink(f"{ident}.json", dir_fd=claims_fd)


def _acked_ids(inbox_fd: int) -> set[str] | None:
    """The ids `acks.jsonl` records as delivered (read only when a holder died); None when
    it cannot be read, so nothing is known to be undelivered."""
    ids: set[str] = set()
    try:
        fd = os.open(ACKS_FILE, _FILE_FLAGS, dir_fd=inbox_fd)
    except FileNotFoundError:
        return ids
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        with os.fdopen(os.dup(fd), "rb") as file:
            for line in file:
                with contextlib.suppress(ValueError, RecursionError):
                    record = json.loads(line)
                    if isinstance(record, dict) and isinstance(record.get("id"), str):
                        ids.add(record["id"])
    except OSError:
        return None
    finally:
        os.close(fd)
    return ids


def _recover(inbox_fd: int, queued_fd: int, taken_fd: int, claims_fd: int) -> list[str]:
    """Put back in `queued/` every message whose holder is gone without settling it (not
    acknowledged), once: its record goes with it. Run with `claims/` locked."""
    problems: list[str] = []
    acked: set[str] | bool | None = False  # read once, when first needed
    try:
        listed = os.listdir(claims_fd)
    except OSError as exc:
        raise InboxReadFailed(f"{INBOX_DIR}/{CLAIMS_DIR}/", exc) from None
    names = sorted(n for n in listed if n.endswith(".json"))[:MAX_FILES]
    for name in names:
        ident = name[: -len(".json")]
        if not MESSAGE_ID.fullmatch(ident):
            continue
        read = _read(name, claims_fd)
        if read is None or judge(read[0]) != "gone":
            continue  # held by a live reader, or a holder this reader cannot judge
        try:
            held = stat.S_ISREG(os.stat(name, dir_fd=taken_fd, follow_symlinks=False).st_mode)
        except FileNotFoundError:
            held = False  # the holder died before its claim, or after putting it back
        except OSError:
            continue
        if held:
            if acked is False:
                acked = _acked_ids(inbox_fd)
            if not isinstance(acked, set):
                problems.append(
                    f"inbox/{TAKEN_DIR}/{name}: its reader is gone, but inbox/{ACKS_FILE} "
                    "cannot be read to tell whether it was delivered; left alone"
                )
                continue
            if ident not in acked:
                try:
                    os.rename(name, name, src_dir_fd=taken_fd, dst_dir_fd=queued_fd)
                except FileNotFoundError:
                    pass
                except OSError as exc:
                    problems.append(
                        f"inbox/{TAKEN_DIR}/{name}: its reader is gone without delivering it, "
                        f"but it cannot be queued again ({exc.strerror or exc}); move it back "
                        f"to inbox/{QUEUED_DIR}/ by hand"
                    )
                    continue
        _forget(claims_fd, ident)
    return problems


def _check_reader(via: object, max_bytes: object) -> None:
    """Refuse a `via` or `max_bytes` a caller got wrong, naming the parameter: a number
    passed second (`claim_all(wd, 5)`, read as a count of messages) is no reader's name, and
    a `max_bytes` below one bounded nothing a caller could mean, without a word."""
    readers = ", ".join(sorted(VIAS))
    if not isinstance(via, str):
        raise TypeError(
            f"via (the second argument: who reads the messages) must be one of {readers},"
            f" not {type(via).__name__} {quoted(via)}"
        )
    if via not in VIAS:
        raise ValueError(f"via: {quoted(via)} is not one of {readers}")
    if max_bytes is None:
        return
    if isinstance(max_bytes, bool) or not isinstance(max_bytes, int):
        raise TypeError(
            f"max_bytes must be a whole number of bytes or None (no bound), not"
            f" {type(max_bytes).__name__} {quoted(max_bytes)}"
        )
    if max_bytes < 1:
        raise ValueError(
            f"max_bytes: {max_bytes} is below 1; give the bytes one delivery may hold, or None"
            " for no bound"
        )


def claim(workdir: Path, via: str, *, max_bytes: int | None = None) -> Batch:
    """Claim the queued messages, oldest first, without acknowledging any (see `claiming`).

    `max_bytes` bounds the framed texts of one delivery: once the next message would pass
    it, the rest stay queued for the next call. The first message is always taken, even a
    larger one, since holding it back would hold it forever. Each message returned sits in
    `taken/` until `acknowledge` (delivered) or `release` (queued again) settles it; its
    record in `claims/` says this process holds it, so should the process die first, the
    next claim (by any reader) queues it again.
    """
    _check_reader(via, max_bytes)
    batch = Batch()
    with _inbox(workdir, taken=True) as fds:
        if fds is None:
            return batch
        inbox_fd, queued_fd, taken_fd, group = fds
        if taken_fd is None:
            return batch
        with contextlib.ExitStack() as stack:
            claims_fd = stack.enter_context(_claims(inbox_fd, create=False, group=group))
            if claims_fd is not None:
                batch.problems.extend(_recover(inbox_fd, queued_fd, taken_fd, claims_fd))
            found, problems = _scan(queued_fd)
            if found and claims_fd is None:
                try:
                    claims_fd = stack.enter_context(_claims(inbox_fd, create=True, group=group))
                except InboxUnsafe:
                    raise
                except OSError as exc:
                    batch.problems.append(
                        f"inbox/{CLAIMS_DIR}/: cannot record who holds the messages "
                        f"({exc.strerror or exc}); a reader killed before delivering them "
                        f"leaves them in inbox/{TAKEN_DIR}/ (move them back by hand)"
                    )
                if claims_fd is not None:
                    # That read came before the lock: another reader may have claimed since,
                    # and recording over its claim would leave its message without a holder.
                    batch.problems.extend(_recover(inbox_fd, queued_fd, taken_fd, claims_fd))
                    found, problems = _scan(queued_fd)
            batch.problems.extend(problems)
            _claim_found(batch, found, via, max_bytes, (queued_fd, taken_fd, claims_fd), group)
    return batch


def _claim_found(
    batch: Batch,
    found: list[tuple[Message, int]],
    via: str,
    max_bytes: int | None,
    fds: tuple[int, int, int | None],
    group: int | None,
) -> None:
    queued_fd, taken_fd, claims_fd = fds
    used = 0
    for message, inode in found:
        size = len(frame(message).encode())
        if max_bytes is not None and batch.messages and used + size > max_bytes:
            break
        name = f"{message.id}.json"
        if claims_fd is not None:
            problem = _record(claims_fd, message.id, via, group)
            if problem is not None:
                batch.problems.append(problem)
        try:
            os.rename(name, name, src_dir_fd=queued_fd, dst_dir_fd=taken_fd)
        except FileNotFoundError:
            _forget(claims_fd, message.id)
            continue  # the service cancelled it, or an older reader claimed it: not ours
        except OSError as exc:
            _forget(claims_fd, message.id)
            # Not claimed, so left queued; the messages claimed before it still go out.
            batch.problems.append(
                f"inbox/{QUEUED_DIR}/{name}: cannot claim it ({exc.strerror or exc}); "
                f"left queued (check inbox/{TAKEN_DIR}/{name})"
            )
            continue
        used += size
        batch.messages.append(_reread_if_replaced(name, taken_fd, inode, message))


def acknowledge(
    workdir: Path, ids: Iterable[str], via: str, *, clock: Clock = utc_now_iso
) -> list[str]:
    """Record claimed messages as delivered (one `acks.jsonl` line each); the problems.

    A line that cannot be written (a full disk, an odd `acks.jsonl`) is a problem, not an
    error: the reader has the message, and the chat shows it unconfirmed, not delivered.
    """
    if via not in VIAS:
        raise ValueError(f"via: {via!r} is not one of {', '.join(sorted(VIAS))}")
    problems: list[str] = []
    wanted = list(ids)
    if not wanted:
        return problems
    try:
        with _inbox(workdir, taken=False) as fds:
            if fds is None:
                raise FileNotFoundError(errno.ENOENT, "inbox/queued/ is gone")
            for ident in wanted:
                try:
                    _ack(fds[0], ident, via, clock)
                except OSError as exc:
                    problems.append(_unrecorded(ident, exc))
            # Settled either way (the reader has it): no later reader may queue it again.
            # Nobody else writes these records while this process holds the messages.
            claims_fd = _open_dir(CLAIMS_DIR, fds[0], f"{INBOX_DIR}/{CLAIMS_DIR}/", create=False)
            try:
                for ident in wanted:
                    _forget(claims_fd, ident)
            finally:
                if claims_fd is not None:
                    os.close(claims_fd)
    except (OSError, WorkdirError) as exc:  # the inbox or workdir is gone or a link meanwhile
        problems.extend(_unrecorded(ident, exc) for ident in wanted)
    return problems


def _unrecorded(ident: str, exc: OSError | WorkdirError) -> str:
    why = getattr(exc, "strerror", None) or exc
    return (
        f"inbox/{ACKS_FILE}: cannot record the delivery of {ident} "
        f"({why}); the agent has it, but the chat will not show it delivered"
    )


def release(workdir: Path, ids: Iterable[str]) -> list[str]:
    """Put claimed messages that were never delivered back in `queued/`; the problems.

    Each keeps its file, id and `queued_at`, so the next read offers it first again, and the
    service can cancel it again. One that cannot be moved back stays in `taken/`, named.
    """
    problems: list[str] = []
    wanted = list(ids)
    if not wanted:
        return problems

    def stuck(ident: str, why: str) -> str:
        return (
            f"inbox/{TAKEN_DIR}/{ident}.json: was not delivered and cannot be queued again "
            f"({why}); move it back to inbox/{QUEUED_DIR}/ by hand"
        )

    try:
        with _inbox(workdir, taken=True) as fds:
            if fds is None or fds[2] is None:
                raise FileNotFoundError(errno.ENOENT, "inbox/queued/ is gone")
            inbox_fd, queued_fd, taken_fd, group = fds
            # Locked: once back in `queued/` another reader may claim it and record itself,
            # so this record must go before any other reader can claim.
            with _claims(inbox_fd, create=False, group=group) as claims_fd:
                for ident in wanted:
                    name = f"{ident}.json"
                    try:
                        os.rename(name, name, src_dir_fd=taken_fd, dst_dir_fd=queued_fd)
                    except FileNotFoundError as exc:
                        problems.append(stuck(ident, exc.strerror or str(exc)))
                    except OSError as exc:  # still held: the next reader tries once it ends
                        problems.append(stuck(ident, exc.strerror or str(exc)))
                        continue
                    _forget(claims_fd, ident)
    except (OSError, WorkdirError) as exc:  # the workdir inside a loop of links meanwhile
        problems.extend(
            stuck(ident, getattr(exc, "strerror", None) or str(exc)) for ident in wanted
        )
    return problems


def claim_all(
    workdir: Path,
    via: str,
    *,
    max_bytes: int | None = None,
    clock: Clock = utc_now_iso,
) -> Batch:
    """Claim the queued messages, oldest first, and acknowledge each one claimed.

    For a reader that has the messages once this returns (a hook whose output is the
    delivery uses `claiming` instead). `max_bytes` as in `claim`; ack problems are added to
    the batch's problems.
    """
    batch = claim(workdir, via, max_bytes=max_bytes)
    batch.problems.extend(
        acknowledge(workdir, [message.id for message in batch.messages], via, clock=clock)
    )
    return batch


@dataclass
class Claim:
    """Messages claimed for one delivery (see `claiming`): mark each one the reader got."""

    workdir: Path
    via: str
    clock: Clock
    messages: list[Message] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    settled: set[str] = field(default_factory=set)

    def delivered(self, *messages: Message) -> None:
        """The reader has these: acknowledge them now (problems go to `problems`)."""
        ids = [m.id for m in messages if m.id not in self.settled]
        self.settled.update(ids)
        self.problems.extend(acknowledge(self.workdir, ids, self.via, clock=self.clock))

    def unsettled(self) -> list[Message]:
        return [m for m in self.messages if m.id not in self.settled]

    def release_rest(self) -> None:
        """Queue again every message not marked delivered."""
        ids = [m.id for m in self.unsettled()]
        self.settled.update(ids)
        self.problems.extend(release(self.workdir, ids))


@contextlib.contextmanager
def claiming(
    workdir: Path,
    via: str,
    *,
    max_bytes: int | None = None,
    clock: Clock = utc_now_iso,
) -> Iterator[Claim]:
    """Claim the queued messages for a delivery that may fail halfway: at-least-once.

    Inside the block, hand each message to its reader and call `claim.delivered(message)`
    once the reader has it. Every message not marked so when the block ends (normally or by
    an exception) goes back to `queued/` for the next read, so a reader that goes away
    mid-way loses nothing; a message that was handed over but not yet marked when it did
    goes out again (the one duplicate this allows).
    """
    batch = claim(workdir, via, max_bytes=max_bytes)
    held = Claim(workdir, via, clock, batch.messages, batch.problems)
    try:
        yield held
    finally:
        held.release_rest()


def _reread_if_replaced(name: str, taken_fd: int, inode: int, message: Message) -> Message:
    """The claimed file is the one read, unless it was swapped in between; then read it."""
    with contextlib.suppress(OSError):
        if os.stat(name, dir_fd=taken_fd, follow_symlinks=False).st_ino != inode:
            read = _read(name, taken_fd)
            if read is not None:
                with contextlib.suppress(MessageError):
                    return parse_message(read[0], message.id)
    return message
