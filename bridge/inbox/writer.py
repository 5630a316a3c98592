"""Writing into an agent's `inbox/`: narrow, atomic, refusing links.

Every step goes through directory descriptors opened with `O_NOFOLLOW | O_DIRECTORY`, starting
from the resolved workdir, so a symlink planted at `inbox` or at one of its folders is refused
(`InboxRefused`, naming the path and the fix) instead of followed out of the workdir. A message
is written to `inbox/tmp/` under a name of that write's own (`.<id>.<random>.tmp`) and renamed
into `inbox/queued/<id>.json` (readers never see half a file; two writers of the same message,
two instances of a cluster or a retry, never touch each other's file, and a file a write cut
short left in `tmp/` is deleted by a later write once it is an hour old: the first write of
each writer looks, then one an hour); a cancel is a rename
from `queued/` to `cancelled/` that races the agent side's claim (rename to `taken/`):
whichever rename happens first wins, and the loser sees `FileNotFoundError`. Folders are
created with mode 0700.

An agent may run as another user than the service. When the workdir grants its group full
access (rwx: the owner shares it with a group the service and the agent are in), the inbox
is shared the same way: the folders the service owns get that group and mode 2770 (the
setgid bit gives what is created inside the same group), and message files mode 0640 with
that group, so the agent's user can read and claim them. Otherwise they stay private (0700
and 0600), as before. See docs/operators.md, "An agent run by another user".
"""

from __future__ import annotations

import errno
import json
import logging
import math
import os
import re
import secrets
import stat
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any, Literal

from taskcard.producers.inbox.contract import (
    CANCELLED_DIR,
    INBOX_DIR,
    MESSAGE_ID,
    QUEUED_DIR,
    SHARED_DIR_MODE,
    SHARED_FILE_MODE,
    TAKEN_DIR,
    TMP_DIR,
    share,
    shared_group,
)
from taskcard.producers.reports.contract import (
    INBOX_SUBDIRS,
    MAX_INBOX_MESSAGE_BYTES,
)
from taskcard.producers.task_card.contract import write_all

log = logging.getLogger(__name__)

Location = Literal["queued", "taken", "cancelled", "missing"]
# A file a write cut short left in `tmp/` is deleted by a later write into the same inbox
# once it is this old (`_clear_leftovers`); a write takes milliseconds. A writer looks at
# `tmp/` at its first write and then at most once this often.
LEFTOVER_AGE_S = 3600.0
# More entries than this in `tmp/` (the service leaves none there but a write's own, for
# milliseconds) are named in the log: something else fills it.
LEFTOVER_LOOK = 256
# A look at `tmp/` stops after this many entries (a few milliseconds): the folder is the
# agent's to fill, and a look through millions of entries held the service's loop, every
# agent's cards with it, for seconds. The log names such a folder; leftovers past this many
# entries stay until someone empties it.
LEFTOVER_SCAN = 20_000
# What the service writes in `tmp/`: `.<id>.<random>.tmp`, and `<id>.json` as versions
# before per-write names wrote it.
_LEFTOVER = re.compile(
    r"\A(?:\.[A-Za-z0-9_-]{1,64}\.[0-9a-f]{16}\.tmp|[A-Za-z0-9_-]{1,64}\.json)\Z"
)
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def encode_message(message: dict[str, Any]) -> bytes:
    """A message file's bytes, as `queue` writes them (compare with MAX_INBOX_MESSAGE_BYTES)."""
    return json.dumps(message, ensure_ascii=False, separators=(",", ":")).encode()


class InboxRefused(Exception):
    """The inbox cannot be written safely; the message says what and how to fix it."""


def refusal(what: str, error: OSError, folder: str) -> InboxRefused:
    """`what` failed with `error`: the refusal that says so and how to fix it, by the
    error's kind; `folder` is the one the service must write (or search) for `what`, as
    people name it. A bare `(Permission denied)` left the person reading the agent's card
    to guess which folder, and for whom."""
    reason = error.strerror or type(error).__name__
    code = error.errno
    if code in (errno.EACCES, errno.EPERM):
        fix = f"make {folder} writable by the user running taskcard serve (uid {os.geteuid()})"
    elif code in (errno.ENOSPC, errno.EDQUOT):
        fix = "free space (or quota) on the disk of the agent's workdir"
    elif code == errno.EROFS:
        fix = "the agent's workdir is on a read-only mount: mount it read-write"
    elif code == errno.EEXIST:
        fix = "remove that file, which is in the way"
    elif code in (errno.ELOOP, errno.ENOTDIR, errno.EISDIR):
        fix = f"remove what is in the way in {folder}, so the service can write a real file"
    else:
        fix = f"check {folder} and the disk it is on"
    return InboxRefused(f"{what} ({reason}); {fix}")


def why_refused(error: InboxRefused | OSError) -> str:
    """What a failed write into an inbox tells people: the refusal's words, or for another
    error on the way (setting a file's group, say) the same kind of words by its kind."""
    if isinstance(error, InboxRefused):
        return str(error)
    return str(refusal("the inbox cannot be written", error, "inbox"))


def _open_dir(
    name: str, parent_fd: int, shown: str, parent: str, *, create: bool, group: int | None = None
) -> int:
    """`parent`: the folder holding `name`, as people name it."""
    if create:
        try:
            os.mkdir(name, 0o700, dir_fd=parent_fd)
        except FileExistsError:
            pass
        except OSError as error:
            raise refusal(f"{shown} could not be created", error, parent) from None
    try:
        fd = os.open(name, _DIR_FLAGS, dir_fd=parent_fd)
    except OSError as error:
        if error.errno in (errno.ELOOP, errno.ENOTDIR):
            raise InboxRefused(
                f"{shown} is a symlink or not a directory; remove it so the service can"
                " create a real folder"
            ) from None
        raise refusal(f"{shown} cannot be opened", error, shown) from None
    if create:
        share(fd, group, SHARED_DIR_MODE)
    return fd


def _clear_leftovers(tmp_fd: int) -> int:
    """Delete from `tmp/` (its descriptor) the files a write cut short left there (the
    service stopped, or died, between a write and its rename) once they are older than
    `LEFTOVER_AGE_S`: no write takes that long, so none is another writer's still on its
    way. Only names the service writes (`_LEFTOVER`), only regular files, no link
    followed. Up to `LEFTOVER_SCAN` entries are looked at (the caller does so once an hour:
    `InboxWriter.queue`); looking at the first 256 of each write, a `tmp/` someone filled
    kept the leftovers past them for good. Best effort: what cannot be deleted stays.
    Returns how many entries were seen (`LEFTOVER_SCAN` + 1: more than were looked at)."""
    now, seen = time.time(), 0
    with suppress(OSError), os.scandir(tmp_fd) as entries:
        for entry in entries:
            seen += 1
            if seen > LEFTOVER_SCAN:
                break
            if not _LEFTOVER.match(entry.name):
                continue
            with suppress(OSError):
                info = entry.stat(follow_symlinks=False)
                if stat.S_ISREG(info.st_mode) and now - info.st_mtime > LEFTOVER_AGE_S:
                    os.unlink(entry.name, dir_fd=tmp_fd)
    return seen


def _create(name: str, folder_fd: int) -> int:
    """A new file `name` in the folder, for writing; never through a link, never one there."""
    return os.open(
        name,
        os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
        0o600,
        dir_fd=folder_fd,
    )


class InboxWriter:
    """One agent's inbox as the service sees it."""

    # One per agent, made when the agent joins the fleet: no per-instance dict (~100 bytes).
    __slots__ = ("_cleaned_s", "workdir")

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self._cleaned_s = -math.inf  # when `tmp/` was last cleared (monotonic seconds)

    @contextmanager
    def _folders(self, *, create: bool) -> Iterator[dict[str, int]]:
        """Descriptors of the inbox folders by name (`""`: inbox itself)."""
        try:
            root = os.open(self.workdir.resolve(), _DIR_FLAGS)
        except OSError as error:
            if error.errno == errno.ENOENT:  # sending the same again cannot help: say why
                raise InboxRefused(
                    "the agent's workdir does not exist yet (the agent was never started"
                    " there), so nothing could read it"
                ) from None
            raise refusal("the workdir cannot be opened", error, "the agent's workdir") from None
        fds: dict[str, int] = {}
        try:
            group = shared_group(root) if create else None
            inbox = _open_dir(
                INBOX_DIR, root, INBOX_DIR, "the agent's workdir", create=create, group=group
            )
            fds[""] = inbox
            for sub in INBOX_SUBDIRS:
                fds[sub] = _open_dir(
                    sub, inbox, f"{INBOX_DIR}/{sub}", INBOX_DIR, create=create, group=group
                )
            yield fds
        finally:
            for fd in fds.values():
                os.close(fd)
            os.close(root)

    def queue(self, message: dict[str, Any]) -> None:
        """Write `message` (its `id` a valid message id) into `queued/`, atomically."""
        ident = str(message.get("id"))
        if not MESSAGE_ID.fullmatch(ident):
            raise InboxRefused("the message id is not valid")
        data = encode_message(message)
        if len(data) > MAX_INBOX_MESSAGE_BYTES:
            raise InboxRefused(f"the message is over {MAX_INBOX_MESSAGE_BYTES // 1024} KiB")
        name = f"{ident}.json"
        with self._folders(create=True) as fds:
            if not 0 <= time.monotonic() - self._cleaned_s < LEFTOVER_AGE_S:
                self._cleaned_s = time.monotonic()
                if (seen := _clear_leftovers(fds[TMP_DIR])) > LEFTOVER_LOOK:
                    log.warning(
                        "%s/%s holds %s entries (the service leaves none there): remove"
                        " what is not the service's",
                        self.workdir / INBOX_DIR,
                        TMP_DIR,
                        f"more than {LEFTOVER_SCAN}" if seen > LEFTOVER_SCAN else seen,
                    )
            # A name of this write's own: another writer of the same message (a second
            # instance, a retry) never replaces, nor renames away, this one's file, and a
            # leftover of either is never in the way.
            own = f".{ident}.{secrets.token_hex(8)}.tmp"
            try:
                fd = _create(own, fds[TMP_DIR])
            except OSError as error:
                raise refusal(f"inbox/tmp cannot take {name}", error, "inbox/tmp") from None
            inbox = os.fstat(fds[""])
            if stat.S_IMODE(inbox.st_mode) == SHARED_DIR_MODE:  # shared: see the docstring
                share(fd, inbox.st_gid, SHARED_FILE_MODE)
            try:
                write_all(fd, data)  # one write may take only a part (a full disk)
                os.fsync(fd)
            except OSError as error:
                os.close(fd)
                with suppress(OSError):
                    os.unlink(own, dir_fd=fds[TMP_DIR])
                raise refusal(f"inbox/tmp cannot take {name}", error, "inbox/tmp") from None
            os.close(fd)
            try:
                os.rename(own, name, src_dir_fd=fds[TMP_DIR], dst_dir_fd=fds[QUEUED_DIR])
            except OSError as error:
                with suppress(OSError):
                    os.unlink(own, dir_fd=fds[TMP_DIR])
                raise refusal(
                    f"inbox/queued/{name} cannot be moved in", error, "inbox/queued"
                ) from None

    def cancel(self, ident: str) -> bool:
        """Withdraw a queued message; False when the agent side claimed it first (or gone)."""
        return self._move(ident, QUEUED_DIR, CANCELLED_DIR, "cannot be withdrawn")

    def restore(self, ident: str) -> bool:
        """Move a message this writer withdrew (`cancel`) back into `queued/`, as it was;
        False when it is not in `cancelled/`."""
        return self._move(ident, CANCELLED_DIR, QUEUED_DIR, "cannot be moved back")

    def _move(self, ident: str, source: str, target: str, failed: str) -> bool:
        """Move message `ident` from folder `source` to `target` of the inbox; False when it
        is not in `source` (or `ident` is no message id). A refusal names the message in
        `source` and what `failed`, with the fix for `inbox/queued`."""
        if not MESSAGE_ID.fullmatch(ident):
            return False
        name = f"{ident}.json"
        with self._folders(create=False) as fds:
            try:
                os.rename(name, name, src_dir_fd=fds[source], dst_dir_fd=fds[target])
            except FileNotFoundError:
                return False
            except OSError as error:
                raise refusal(f"inbox/{source}/{name} {failed}", error, "inbox/queued") from None
        return True

    def discard_cancelled(self, ident: str) -> None:
        """Delete a message this writer withdrew (`cancel`) and nobody will ask about: a
        wake whose text a newer wake carries. Nothing when it is not there."""
        if not MESSAGE_ID.fullmatch(ident):
            return
        with self._folders(create=False) as fds:
            try:
                os.unlink(f"{ident}.json", dir_fd=fds[CANCELLED_DIR])
            except FileNotFoundError:
                pass
            except OSError as error:
                raise refusal(
                    f"inbox/cancelled/{ident}.json cannot be deleted", error, "inbox/cancelled"
                ) from None

    def location(self, ident: str) -> Location:
        """Which folder holds the message now ("missing" also when the inbox is unusable)."""
        if not MESSAGE_ID.fullmatch(ident):
            return "missing"
        name = f"{ident}.json"
        try:
            with self._folders(create=False) as fds:
                for folder in (QUEUED_DIR, TAKEN_DIR, CANCELLED_DIR):
                    try:
                        os.stat(name, dir_fd=fds[folder], follow_symlinks=False)
                    except FileNotFoundError:
                        continue
                    return (
                        "queued"
                        if folder == QUEUED_DIR
                        else "taken"
                        if folder == TAKEN_DIR
                        else "cancelled"
                    )
        except InboxRefused:
            pass
        return "missing"
