"""Claiming queued messages: directory descriptors, no links, one rename decides.

Every step goes through descriptors opened with `O_NOFOLLOW` below the workdir: `inbox` and
its subfolders must be real directories (a link or a file there is refused with
`InboxUnsafe`, the same rule the service keeps), and message files must be regular files.
A claim is `rename(queued/<id>.json, taken/<id>.json)`; when the service cancelled the
message first, the rename fails with FileNotFoundError and the message is simply not ours.
Only a message whose rename succeeded is acknowledged, with one `write` on `acks.jsonl`.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import stat
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from taskcard.producers.inbox.contract import (
    ACKS_FILE,
    INBOX_DIR,
    MAX_MESSAGE_BYTES,
    MESSAGE_ID,
    QUEUED_DIR,
    SHARED_DIR_MODE,
    TAKEN_DIR,
    VIAS,
    Message,
    MessageError,
    frame,
    parse_message,
    share,
    shared_group,
)
from taskcard.producers.task_card.contract import line_break_first, open_appending, utc_now_iso
from taskcard.producers.task_card.workdir_arg import WorkdirError, given_path

MAX_FILES: Final = 256  # read per call; the rest waits for the next one
_DIR_FLAGS: Final = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS: Final = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC

Clock = Callable[[], str]


class InboxUnsafe(OSError):
    """`inbox` or a subfolder is a link or not a directory: refused, never followed."""


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
            with contextlib.suppress(FileExistsError):
                os.mkdir(name, 0o700, dir_fd=parent_fd)
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                raise InboxUnsafe(
                    f"{shown} is a symlink or not a directory; refusing to follow it "
                    f"(remove {shown}; the service recreates the inbox)"
                ) from None
            raise
    return None


@contextlib.contextmanager
def _inbox(workdir: Path, *, taken: bool) -> Iterator[tuple[int, int, int | None] | None]:
    """(inbox, queued, taken) descriptors, or None when there is nothing queued at all."""
    try:
        folder = given_path(workdir)
    except WorkdirError as exc:
        raise WorkdirError(f"workdir: {exc}") from None
    fds: list[int] = []
    try:
        root = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
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
        if taken:
            taken_fd = _open_dir(
                TAKEN_DIR,
                inbox,
                f"{INBOX_DIR}/{TAKEN_DIR}/",
                create=True,
                group=shared_group(root),
            )
            if taken_fd is not None:
                fds.append(taken_fd)
        yield inbox, queued, taken_fd
    finally:
        for fd in reversed(fds):
            os.close(fd)


def _read(name: str, dir_fd: int) -> tuple[bytes, int] | None:
    """The bytes and inode of a regular file (bounded), or None when it is gone or odd."""
    try:
        fd = os.open(name, _FILE_FLAGS, dir_fd=dir_fd)
    except OSError:
        return None  # claimed or cancelled meanwhile, or a link: not a message
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            return None
        return os.read(fd, MAX_MESSAGE_BYTES + 1), info.st_ino
    except OSError:
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
    names = sorted(n for n in os.listdir(queued_fd) if n.endswith(".json"))[:MAX_FILES]
    found: list[tuple[Message, int]] = []
    problems: list[str] = []
    for name in names:
        ident = name[: -len(".json")]
        if not MESSAGE_ID.fullmatch(ident):
            problems.append(f"inbox/queued/{name[:80]!r}: not a message id; file left alone")
            continue
        read = _read(name, queued_fd)
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


def _ack(inbox_fd: int, message: Message, via: str, clock: Clock) -> None:
    record = {"id": message.id, "state": "delivered", "at": clock(), "via": via}
    line = (json.dumps(record, separators=(",", ":")) + "\n").encode()
    flags = os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = open_appending(ACKS_FILE, flags, dir_fd=inbox_fd)
    try:
        os.write(fd, line_break_first(fd) + line)
    finally:
        os.close(fd)


def claim_all(
    workdir: Path,
    via: str,
    *,
    max_bytes: int | None = None,
    clock: Clock = utc_now_iso,
) -> Batch:
    """Claim the queued messages, oldest first, and acknowledge each one claimed.

    `max_bytes` bounds the framed texts of one delivery: once the next message would pass
    it, the rest stay queued for the next call. The first message is always taken, even a
    larger one, since holding it back would hold it forever.
    """
    if via not in VIAS:
        raise ValueError(f"via: {via!r} is not one of {', '.join(sorted(VIAS))}")
    batch = Batch()
    with _inbox(workdir, taken=True) as fds:
        if fds is None:
            return batch
        inbox_fd, queued_fd, taken_fd = fds
        if taken_fd is None:
            return batch
        found, batch.problems = _scan(queued_fd)
        used = 0
        for message, inode in found:
            size = len(frame(message).encode())
            if max_bytes is not None and batch.messages and used + size > max_bytes:
                break
            name = f"{message.id}.json"
            try:
                os.rename(name, name, src_dir_fd=queued_fd, dst_dir_fd=taken_fd)
            except FileNotFoundError:
                continue  # the service cancelled it, or another host claimed it: not ours
            except OSError as exc:
                # Not claimed, so left queued; the messages claimed before it still go out.
                batch.problems.append(
                    f"inbox/{QUEUED_DIR}/{name}: cannot claim it ({exc.strerror or exc}); "
                    f"left queued (check inbox/{TAKEN_DIR}/{name})"
                )
                continue
            message = _reread_if_replaced(name, taken_fd, inode, message)
            used += size
            batch.messages.append(message)
            try:
                _ack(inbox_fd, message, via, clock)
            except OSError as exc:
                # Claimed is claimed: the message goes to the agent all the same (a full
                # disk, an odd acks.jsonl), or it would sit in taken/ unseen by anyone.
                batch.problems.append(
                    f"inbox/{ACKS_FILE}: cannot record the delivery of {message.id} "
                    f"({exc.strerror or exc}); the agent has it, but the chat will not show "
                    "it delivered"
                )
    return batch


def _reread_if_replaced(name: str, taken_fd: int, inode: int, message: Message) -> Message:
    """The claimed file is the one read, unless it was swapped in between; then read it."""
    with contextlib.suppress(OSError):
        if os.stat(name, dir_fd=taken_fd, follow_symlinks=False).st_ino != inode:
            read = _read(name, taken_fd)
            if read is not None:
                with contextlib.suppress(MessageError):
                    return parse_message(read[0], message.id)
    return message
