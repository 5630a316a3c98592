"""The file contract between the `task_card` producer and every consumer of its files.

This module is the only thing the projection service imports from the producer. It names the
paths, the status values and the wire shapes, and gives small, dependency-free readers and an
atomic writer. Any program that writes these files the same way is projected the same way.

Layout under an agent's working directory::

    taskcard/taskcard.md          the card body, UTF-8, replaced atomically
    taskcard/status               exactly b"active" or b"inactive", no newline
    taskcard/watch.json           the restart descriptor of the active watch
    taskcard/taskcard.json        the owner document of the five settings
    .notification/system.jsonl    typed notifications, one JSON object per line
    logs/events.jsonl             the agent's activity log, one JSON object per line

`taskcard/` holds nothing else of ours: the manual gives the capability exactly those files.
The producer host's own bookkeeping (its workdir lock, the watch id counter, the refresh tally,
the record of a stopped or exhausted watch) lives in a private folder beside it,
`.taskcard-host/`, which no consumer reads or watches (`CardPaths.host_dir`; docs/producer.md,
"The host's private folder").
"""

from __future__ import annotations

import contextlib
import errno
import functools
import itertools
import json
import math
import os
import re
import stat
import tempfile
import threading
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import cached_property
from pathlib import Path
from typing import Any, BinaryIO, Final, Literal

TASKCARD_DIR: Final = "taskcard"
BODY_FILE: Final = "taskcard.md"
STATUS_FILE: Final = "status"
WATCH_FILE: Final = "watch.json"
SETTINGS_FILE: Final = "taskcard.json"
# The producer host's private folder in the workdir, and its files; no reader but the host.
HOST_DIR: Final = ".taskcard-host"
HOST_LOCK_FILE: Final = "lock"  # the host's workdir lock (`workdir_lock.py`)
WATCH_SEQ_FILE: Final = "watch-seq"  # the never-reused watch id counter (`descriptor.py`)
TALLY_FILE: Final = "refreshes"  # spent refreshes since `watch.json` (`tally.py`)
ENDED_FILE: Final = "ended.json"  # a stopped or exhausted watch, for later hosts (`descriptor.py`)
# Where earlier versions kept the lock, the counter and the tally, inside `taskcard/`: read when
# the new ones are missing, removed once the new ones are written (and the old lock taken while
# it exists).
LEGACY_HOST_LOCK_FILE: Final = ".host.lock"
LEGACY_WATCH_SEQ_FILE: Final = ".watch-seq"
LEGACY_TALLY_FILE: Final = ".refreshes"
NOTIFICATION_DIR: Final = ".notification"
NOTIFICATION_FILE: Final = "system.jsonl"
# Taken by every writer of `system.jsonl` around its dedupe, rotation and append.
NOTIFICATION_LOCK_FILE: Final = ".system.jsonl.lock"
LOGS_DIR: Final = "logs"
EVENTS_FILE: Final = "events.jsonl"

STATUS_ACTIVE: Final = b"active"
STATUS_INACTIVE: Final = b"inactive"

# Notification sources the task card writes (the wire names of the reference system).
SOURCE_ERROR: Final = "task_card.error"  # carries both error and recovered (see extra.state)
SOURCE_LIMIT: Final = "task_card.limit"
SOURCE_REMINDER: Final = "task_card.reminder"

# Bound of the notification file before it is rotated to `system.jsonl.1`.
NOTIFICATION_ROTATE_BYTES: Final = 1_000_000

# Activity log kinds (docs/architecture.md, "File contracts").
EVENT_KINDS: Final = frozenset(
    {
        "agent.start",
        "agent.exit",
        "turn.start",
        "turn.end",
        "turn.origin",
        "tool.start",
        "tool.end",
        "text",
        "usage",
        "wait.start",
        "wait.end",
    }
)

CardStatus = Literal["active", "inactive", "unknown"]


@dataclass(frozen=True)
class CardPaths:
    """Every contract path of one working directory, and the host's private ones (each built
    once: a tick asks often)."""

    workdir: Path

    @cached_property
    def taskcard_dir(self) -> Path:
        return self.workdir / TASKCARD_DIR

    @cached_property
    def body(self) -> Path:
        return self.taskcard_dir / BODY_FILE

    @cached_property
    def status(self) -> Path:
        return self.taskcard_dir / STATUS_FILE

    @cached_property
    def watch(self) -> Path:
        return self.taskcard_dir / WATCH_FILE

    @cached_property
    def settings(self) -> Path:
        return self.taskcard_dir / SETTINGS_FILE

    @cached_property
    def host_dir(self) -> Path:
        """The producer host's private folder (not part of the contract; see the top)."""
        return self.workdir / HOST_DIR

    @cached_property
    def watch_seq(self) -> Path:
        return self.host_dir / WATCH_SEQ_FILE

    @cached_property
    def tally(self) -> Path:
        return self.host_dir / TALLY_FILE

    @cached_property
    def ended(self) -> Path:
        return self.host_dir / ENDED_FILE

    @cached_property
    def legacy_watch_seq(self) -> Path:
        return self.taskcard_dir / LEGACY_WATCH_SEQ_FILE

    @cached_property
    def legacy_tally(self) -> Path:
        return self.taskcard_dir / LEGACY_TALLY_FILE

    @cached_property
    def notification_dir(self) -> Path:
        return self.workdir / NOTIFICATION_DIR

    @cached_property
    def notifications(self) -> Path:
        return self.notification_dir / NOTIFICATION_FILE

    @cached_property
    def logs_dir(self) -> Path:
        return self.workdir / LOGS_DIR

    @cached_property
    def events(self) -> Path:
        return self.logs_dir / EVENTS_FILE

    @cached_property
    def legacy_telegram_settings(self) -> Path:
        return self.workdir / "telegram" / SETTINGS_FILE


def body_chars(body: str) -> int:
    """The length of a body as `max-body-chars` counts it: characters, without one final newline.

    A renderer prints its card, and `print` ends it with a newline that is the end of the last
    line, not part of the card; `print("x" * 2000)` is a 2000-character body. Only that one
    terminator (`\n` or `\r\n`) is left out, and the body is still published verbatim. Pure.
    """
    if body.endswith("\r\n"):
        return len(body) - 2
    if body.endswith("\n"):
        return len(body) - 1
    return len(body)


def parse_status(raw: bytes | None) -> CardStatus:
    """Exactly `active` or `inactive`; anything else (missing, partial, other) is `unknown`."""
    if raw == STATUS_ACTIVE:
        return "active"
    if raw == STATUS_INACTIVE:
        return "inactive"
    return "unknown"


_READ_FLAGS: Final = (
    os.O_RDONLY
    | getattr(os, "O_NONBLOCK", 0)
    | getattr(os, "O_CLOEXEC", 0)
    | getattr(os, "O_NOCTTY", 0)
)


class NotRegularFile(OSError):
    """A path that is a named pipe, device, socket or folder: never read, never waited on."""


def file_kind(mode: int) -> str:
    """What a non-regular file is, in words an operator knows."""
    if stat.S_ISFIFO(mode):
        return "a named pipe"
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "not a regular file"


def expand_home(text: str) -> Path | None:
    """`text` with a leading `~` or `~name` expanded, as a shell would have (an option given
    as `--opt=~/x`, or a path in quotes, reaches a command unexpanded); None when `~name`
    names no known user. The callers word that refusal for their own option."""
    try:
        return Path(text).expanduser()
    except RuntimeError:
        return None


def broken_link(path: Path) -> tuple[Path, str, bool] | None:
    """The first symbolic link on `path` (the path itself or a folder above it) that leads
    nowhere: (the link, where it points as written, whether it goes round a loop rather than
    to a missing name), or None. A dangling link was either written through, its target
    created somewhere the user never looks, or refused as "no such file" about a name that
    is there."""
    absolute = Path(os.path.abspath(path))
    for candidate in (*reversed(absolute.parents), absolute):
        try:
            if not stat.S_ISLNK(os.lstat(candidate).st_mode):
                continue
        except OSError:
            return None  # nothing further down exists: no link there to name
        try:
            os.stat(candidate)
        except OSError as exc:
            if exc.errno not in (errno.ENOENT, errno.ELOOP, errno.ENOTDIR):
                return None
            try:
                points_to = os.readlink(candidate)
            except OSError:
                return None
            return candidate, points_to, exc.errno == errno.ELOOP
    return None


def file_on_path(path: Path) -> Path | None:
    """The file among the folders `path` goes through (`notes.txt` of `notes.txt/r.py`), as
    an absolute path, or None: the first name on the way, from the root down, that is there
    and is not a folder (links followed). What ENOTDIR means, and where "no such file" or
    "cannot be created" about a name below it sent people looking at the wrong name. The one
    walk for every path option, the renderer's path and the service's configuration."""
    for folder in reversed(Path(os.path.abspath(path)).parents):
        try:
            mode = os.stat(folder).st_mode
        except OSError:
            return None  # nothing further down is there
        if not stat.S_ISDIR(mode):
            return folder
    return None


# The longest path Linux opens (`PATH_MAX`).
PATH_MAX: Final = 4096


def shown_path(path: object) -> str:
    """A path as a one-line error shows it: as given when every character of it prints, else
    quoted with its controls escaped. A name holding a line break or an escape sequence was
    printed raw, breaking the one-line error in two and acting on the terminal that showed
    it; one ending in an invisible character read as the name that exists. Whole up to the
    longest path the system opens (cut as `quoted` cuts past that), since the end of a path is
    often its mistake."""
    text = str(path)
    if len(text) > PATH_MAX:  # printable or not: a 100 KB name came back whole
        return quoted(text)
    return text if text.isprintable() else repr(text)


def dangling_link(
    path: Path, lead: str = "", *, yet: bool = False, inside: Path | None = None
) -> str | None:
    """The words, after the name, for a `path` whose own name or a folder link on its way is
    a symbolic link that leads nowhere (`broken_link`), one wording for every command and
    the service's notes: "is a symbolic link that leads nowhere (to T, which does not
    exist)", or `lead` and "the symbolic link L on its path leads nowhere (to T, which does
    not exist)"; None when there is no such link (a loop of links is not one). `yet` says
    "does not exist yet", of a folder that is picked up once made. "Does not exist" or "is a
    symlink" about a name `ls` shows sent people looking at the wrong end of the link. A
    link to another link that leads nowhere says so, not that the second does not exist.
    `inside`: a folder link under it is named from there (a renderer path is read from the
    workdir, so its links are named as the agent sees them)."""
    broken = broken_link(path)
    if broken is None or broken[2]:
        return None
    link, points_to, _ = broken
    # A link to a link: its target is there (`ls` shows it), and leads nowhere in its turn.
    missing = (
        "itself a symbolic link that leads nowhere"
        if os.path.islink(link.parent / points_to)
        else f"which does not exist{' yet' * yet}"
    )
    nowhere = f"leads nowhere (to {shown_path(points_to)}, {missing})"
    return _link_words(path, link, nowhere, lead, inside)


# What a loop of symbolic links does, in every producer's words (`link_loop`); said alone
# when no one link on the path shows the loop (mended since the error, or a chain of more
# links than the system follows).
LOOP_OF_LINKS: Final = "goes round a loop of symbolic links"


def link_loop(path: Path, lead: str = "", *, inside: Path | None = None) -> str | None:
    """The words, after the name, for a `path` whose own name or a folder link on its way is
    a symbolic link that goes round a loop (`broken_link`), as `dangling_link` says one that
    leads nowhere: "is a symbolic link that goes round a loop of symbolic links (to T)", or
    `lead` and "the symbolic link L on its path goes round a loop of symbolic links (to T)";
    None when there is no such link. One wording for the renderer path, `--workdir`, the
    runtime folder, a ledger or payload file and the files `init` writes: they said it three
    ways ("in a loop of links", "goes round a loop of links", "goes round a loop of symbolic
    links"), and some named no link. The fix is the caller's (what to give instead)."""
    broken = broken_link(path)
    if broken is None or not broken[2]:
        return None
    link, points_to, _ = broken
    return _link_words(path, link, f"{LOOP_OF_LINKS} (to {shown_path(points_to)})", lead, inside)


def _link_words(path: Path, link: Path, what: str, lead: str, inside: Path | None) -> str:
    """`what` a link does, said of `path` itself or of the folder link `link` on its way."""
    if link == Path(os.path.abspath(path)):
        return f"is a symbolic link that {what}"
    shown = link.relative_to(inside) if inside is not None and link.is_relative_to(inside) else link
    return f"{lead}the symbolic link {shown_path(shown)} on its path {what}"


def _open_read(path: Path, flags: int, inside: Path | None) -> int:
    """`os.open` of `path` for reading; with `inside`, only a file that lies inside that
    folder once symlinks are resolved (as `open_append` checks a file it appends to)."""
    if inside is None:
        return os.open(path, flags)
    root, target = _resolved_inside(path, inside, "read")
    fd = os.open(target, flags | getattr(os, "O_NOFOLLOW", 0))
    _opened_inside(fd, root, path, "read")
    return fd


def open_regular(path: Path, *, inside: Path | None = None) -> BinaryIO:
    """`path` opened for binary reading when it is a regular file (symlinks followed).

    Anyone may put a named pipe or a symlink to `/dev/zero` at a path in a workdir: a plain
    `open` of a pipe waits for a writer forever (holding whatever lock the caller holds, deaf
    to SIGTERM), and reading a device never ends. So the open is non-blocking, and what was
    opened is checked with `fstat` before a byte is read. Raises `FileNotFoundError` when
    missing and `NotRegularFile` (an `OSError` whose `strerror` says what it is) otherwise.
    With `inside` (the workdir), a `path` that leads out of it through a symlink, at the file
    or at a folder on its way, raises `OutsideWorkdir` and nothing is read.
    """
    fd = _open_read(path, _READ_FLAGS, inside)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise NotRegularFile(
                errno.EINVAL, f"{file_kind(mode)}, not a regular file; replace it with a file"
            )
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_regular(
    path: Path, limit: int, *, follow: bool = True, inside: Path | None = None
) -> bytes:
    """At most `limit` bytes of the regular file at `path`; raises as `open_regular` does
    (`inside` as there too).

    `follow=False` refuses a symbolic link as the last component (`OSError`, ELOOP): for files
    only the host creates, where a link can only have been planted.

    Read straight from the descriptor in pieces sized by `fstat` (plus one byte, so growth is
    seen), never through a buffer of `limit` bytes: asking a buffered reader for 4 MB to read
    a 7-byte status file allocated and faulted in the whole 4 MB on every call.
    """
    fd = _open_read(
        path, _READ_FLAGS if follow else _READ_FLAGS | getattr(os, "O_NOFOLLOW", 0), inside
    )
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise NotRegularFile(
                errno.EINVAL,
                f"{file_kind(info.st_mode)}, not a regular file; replace it with a file",
            )
        piece = max(info.st_size + 1, 4096)
        chunks: list[bytes] = []
        got = 0
        while got < limit:
            chunk = os.read(fd, min(piece, limit - got))
            if not chunk:
                break
            chunks.append(chunk)
            got += len(chunk)
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)
    finally:
        os.close(fd)


def read_bytes(path: Path, limit: int = 4_000_000) -> bytes | None:
    """The file's bytes, or None when it is missing, unreadable or not a regular file. Reads
    at most `limit`."""
    try:
        return read_regular(path, limit)
    except OSError:
        return None


_TEMP_FLAGS: Final = (
    os.O_WRONLY
    | os.O_CREAT
    | os.O_EXCL
    | getattr(os, "O_NOFOLLOW", 0)
    | getattr(os, "O_CLOEXEC", 0)
)
_temp_serial = itertools.count()


def _create_temp(path: Path) -> tuple[int, str]:
    """A new, exclusive temporary file beside `path`: (fd, name).

    Named by process, thread and a counter, so the first try nearly always succeeds (the
    random names of `tempfile` cost more than the write they prepare); a leftover of a
    crashed process with a reused pid only sends us to `tempfile`.
    """
    tmp = (
        f"{path.parent}/.{path.name}.{os.getpid()}.{threading.get_ident()}.{next(_temp_serial)}.tmp"
    )
    try:
        return os.open(tmp, _TEMP_FLAGS, 0o600), tmp
    except FileExistsError:
        return tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)


def atomic_write(
    path: Path, data: bytes, *, durable: bool = True, mode: int = 0o644
) -> os.stat_result:
    """Replace `path` with `data`: temp file in the same folder, fsync, rename, fsync folder.
    The new file gets `mode` (default 0644, whatever the umask).

    Readers never see a partial file either way; `durable=False` skips the two fsyncs for
    bookkeeping that is rewritten every tick (the crash of a process loses nothing, only a
    power cut may roll it back to an earlier complete version). Returns the stat of what was
    written (inode, size, mtime survive the rename), for `WrittenFiles`.
    """
    try:
        fd, tmp = _create_temp(path)
    except FileNotFoundError:  # the folder is created on first use only
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = _create_temp(path)
    try:
        try:
            # Created 0600 whatever the umask; the projection service may run as another user.
            os.fchmod(fd, mode)
            if data and not durable:
                # Blocks allocated up front: ext4 then has no delayed allocation to flush when
                # the rename replaces an existing file (about a third of the write's CPU).
                with contextlib.suppress(OSError):
                    os.posix_fallocate(fd, 0, len(data))
            write_all(fd, data)
            if durable:
                os.fsync(fd)
            written = os.fstat(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    if not durable:
        return written
    with contextlib.suppress(OSError):
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    return written


def utc_now_iso() -> str:
    """The current UTC time as ISO-8601 with a trailing `Z`, millisecond precision."""
    return iso_utc(datetime.now(UTC))


def iso_utc(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


# Times outside this range are "unknown": far enough from both ends of `datetime` that adding
# any accepted duration, or a time zone offset, can never overflow.
EARLIEST_TIME: Final = datetime(1970, 1, 1, tzinfo=UTC)
LATEST_TIME: Final = datetime(9000, 1, 1, tzinfo=UTC)
# The largest count (tokens, exit codes) and duration taken from an agent file; larger is
# "unknown". Both are far beyond anything real and far below float overflow.
MAX_COUNT: Final = 10**15
MAX_DURATION_S: Final = 100 * 365 * 86_400.0
_ISO_MAX_CHARS: Final = 64


def parse_iso(value: object) -> datetime | None:
    """An aware UTC datetime from an ISO-8601 string, or None when it is not a usable one.

    Total: any value gives a result. Year 1 with a positive offset, or year 9999 with a
    negative one, overflows in the conversion to UTC; such times and anything outside
    `EARLIEST_TIME`..`LATEST_TIME` are None (unknown), never an exception.
    """
    if not isinstance(value, str) or len(value) > _ISO_MAX_CHARS:
        return None
    try:
        moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=UTC)
        moment = moment.astimezone(UTC)
    except (ValueError, OverflowError):
        return None
    return moment if EARLIEST_TIME <= moment < LATEST_TIME else None


# A `\uD800`-`\uDFFF` escape, or a surrogate itself in a `str` given (as "surrogatepass"
# encodes it): how a lone surrogate can come out of `json.loads`.
_SURROGATE_ESCAPE: Final = re.compile(rb"\\u[dD][89a-fA-F]|\xed[\xa0-\xbf]")
_LONE_SURROGATE: Final = re.compile("[\ud800-\udfff]")


def parse_json(raw: bytes | str) -> Any:
    """The JSON value of `raw`, or None when it is not JSON this service can use.

    Total: invalid UTF-8 or JSON, integers with too many digits and nesting deep enough to
    exhaust the parser's recursion all give None. `NaN` and `Infinity` parse as floats; the
    field readers below turn them into "unknown". A lone surrogate as in `load_json`.
    """
    try:
        return load_json(raw)
    except (ValueError, RecursionError):
        return None


# A JSON string (with its escapes), or a bracket that opens or closes an array or object. The
# closing quote is optional: required, a string left open (not JSON) was scanned to the end
# again from each quote in it, which took minutes on a text of a megabyte.
_STRING_OR_BRACKET = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"?|[\[\]{}]', re.DOTALL)


def cut_deep(text: str, max_depth: int, stand_in: str) -> str | None:
    """`text` with each array or object that opens deeper than `max_depth` levels replaced,
    whole, by `stand_in` as a JSON string (brackets inside strings are not counted); None when
    nothing nests that deep. One pass without recursing, so at any depth, for the readers of
    hook payloads and MCP messages, which must answer a document too deep for `json`. What is
    not JSON stays not JSON, except inside a part that is left out (it is not read)."""
    if text.count("[") + text.count("{") <= max_depth:
        return None  # too few brackets to nest that deep: the common case, at C speed
    kept: list[str] = []
    depth = 0
    copied = 0  # `text` up to here is in `kept`, or left out
    deep_from: int | None = None  # where the part being left out opens
    for match in _STRING_OR_BRACKET.finditer(text):
        token = match.group()
        if token in ("[", "{"):
            depth += 1
            if depth == max_depth + 1:
                deep_from = match.start()
        elif token in ("]", "}"):
            if depth == max_depth + 1 and deep_from is not None:
                kept += [text[copied:deep_from], json.dumps(stand_in)]
                copied, deep_from = match.end(), None
            depth -= 1
    if not kept:
        return None
    kept.append(text[copied:])
    return "".join(kept)


def load_json(raw: bytes | str, *, parse_int: Callable[[str], Any] | None = None) -> Any:
    """`json.loads(raw)`, raising as it does, except that a lone surrogate (`"\\ud800"`:
    valid JSON, but no UTF-8 can carry it, so every write of it to a file, the store or a
    platform would fail, on every retry) becomes U+FFFD in every string and key."""
    value = json.loads(raw, parse_int=parse_int)
    data = raw if isinstance(raw, bytes) else raw.encode("utf-8", "surrogatepass")
    return _without_surrogates(value) if _SURROGATE_ESCAPE.search(data) else value


def int_or_digits(text: str) -> int | str:
    """A JSON whole number as `int`, or as its digits (a string) when it is longer than
    Python converts (4,300 digits): one such number in a field never used (a tool's input)
    made the whole document "not JSON". A field that needs a number then refuses the string
    by name, as it refuses any other text."""
    try:
        return int(text)
    except ValueError:
        return text


def _without_surrogates(value: Any) -> Any:
    if isinstance(value, str):
        return _LONE_SURROGATE.sub("\ufffd", value)
    if isinstance(value, list):
        return [_without_surrogates(item) for item in value]
    if isinstance(value, dict):
        return {_without_surrogates(k): _without_surrogates(v) for k, v in value.items()}
    return value


# Characters that act on how the text around them is shown instead of showing anything.
# Bidirectional formatting (the marks, among them the Arabic letter mark U+061C, the
# embeddings, overrides and isolates): an override in an agent's text would make the
# service's words after it read in another order, or spell `rennalp` so that it reads as
# another agent's name.
BIDI_CHARS: Final = r"\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069"
# C0 and C1 controls and DEL (a terminal's escape sequences start with one), and the Unicode
# line and paragraph separators (a line break in a one-line field forges a line).
BREAK_CHARS: Final = r"\x00-\x1f\x7f-\x9f\u2028\u2029"
STEERING_CHARS: Final = BREAK_CHARS + BIDI_CHARS
# Taken out of a one-line quote with the bidirectional formatting: the Unicode tag
# characters, invisible everywhere, which spell hidden ASCII that a model reading the chat or
# a wake in its inbox still reads ("ASCII smuggling"). Their one use is kept: the three
# subdivision flags Unicode recommends (England, Scotland, Wales: a black flag, `gb` and the
# region in tag letters, a cancel tag), whose letters are fixed and spell nothing else.
_SUBDIVISION_FLAG: Final = "\U0001f3f4\U000e0067\U000e0062(?:{})\U000e007f".format(
    "|".join(
        "".join(chr(0xE0000 + ord(letter)) for letter in region) for region in ("eng", "sct", "wls")
    )
)
_UNSHOWN_IN_LINE: Final = re.compile(
    f"({_SUBDIVISION_FLAG})|[{BIDI_CHARS}\\U000e0000-\\U000e007f]+"
)
_HIDDEN_TAGS: Final = re.compile(f"({_SUBDIVISION_FLAG})|[\\U000e0000-\\U000e007f]+")
_BREAKS: Final = re.compile(f"[{BREAK_CHARS}]+")
_CONTROLS: Final = re.compile(f"[{BREAK_CHARS}]")
# General categories a reader does not see as text on their own: controls, format characters
# (zero-width space and joiners, word joiner, byte-order mark, ...), surrogates, white space
# and separators, and combining marks (they only decorate the character before them).
_UNSEEN_CATEGORIES: Final = frozenset({"Cc", "Cf", "Cs", "Zs", "Zl", "Zp", "Mn", "Me"})
# Letters that are drawn as blank space: the Hangul fillers and the blank braille pattern.
_BLANK_LETTERS: Final = frozenset("\u115f\u1160\u3164\uffa0\u2800")
# Combining marks kept on one character: enough for every script's stacked diacritics; a
# longer stack is drawn over the lines above and below it, hiding the service's words there.
MAX_STACKED_MARKS: Final = 4


# Every way of breaking a line: CR LF, a lone CR, NEL and the Unicode separators.
_LINE_BREAKS: Final = re.compile("\r\n?|[\x85\u2028\u2029]")


def json_cut_short(exc: json.JSONDecodeError) -> bool:
    """Whether the text ended before the JSON did (a truncated document, not a wrong one)."""
    return exc.msg.startswith("Unterminated string") or exc.pos >= len(exc.doc.rstrip())


def json_error_place(exc: json.JSONDecodeError) -> str:
    """What is wrong and where, for a person to fix it (`invalid control character at line 1,
    column 9`): Python words one error with a trailing "at" of its own, which read "at at"."""
    what = exc.msg.lower().removesuffix(" at")
    return f"{what} at line {exc.lineno}, column {exc.colno}"


def json_kind(value: object) -> str:
    """What a JSON value is, in words (`an array`, `null`), for an error about its type."""
    if isinstance(value, list | tuple):
        return "an array"
    if isinstance(value, str):
        return "a string"
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, dict):
        return "an object"
    return f"a {type(value).__name__}"  # only the Python API can pass other objects


def escape_controls(text: str) -> str:
    """`text` with its line breaks made `\\n` and its other controls (tab kept) written as
    escapes (`\\x1b`): for a person's text quoted to an agent, whose reader may be a
    terminal that would act on an escape sequence. (A CR LF text read `\\r` at every line's
    end when the breaks were escaped too.)"""
    return _CONTROLS.sub(
        lambda found: (
            found.group()
            if found.group() in "\t\n"
            else found.group().encode("unicode_escape").decode("ascii")
        ),
        _LINE_BREAKS.sub("\n", text),
    )


# What JSON leaves as it is although it acts on a terminal: DEL, the C1 controls (0x9b is a
# one-byte escape sequence introducer), bidirectional formatting, line and paragraph separators.
_RAW_IN_JSON: Final = re.compile(f"[\\x7f-\\x9f\\u2028\\u2029{BIDI_CHARS}]")


def terminal_json(value: Any, **options: Any) -> str:
    """`json.dumps(value, ensure_ascii=False, **options)` with every character that could act
    on the terminal printing it written as a `\\uXXXX` escape (the same JSON value): agent and
    chat text in a CLI's JSON output could otherwise reorder the line or start an escape."""
    text = json.dumps(value, ensure_ascii=False, **options)
    return _RAW_IN_JSON.sub(lambda found: f"\\u{ord(found.group()):04x}", text)


_SURROGATE: Final = re.compile("[\ud800-\udfff]")


def _byte_or_mark(found: re.Match[str]) -> str:
    code = ord(found.group())
    return f"\\x{code - 0xDC00:02x}" if 0xDC80 <= code <= 0xDCFF else "\ufffd"


def utf8_encodable(value: Any) -> Any:
    """`value` with every text in it (keys too, at any depth) encodable as UTF-8: a byte of a
    file name that is not UTF-8 (a surrogate escape) as `\\xff`, as Python shows it, any other
    lone surrogate as U+FFFD. For answers that must be UTF-8 on the wire (MCP): a workdir whose
    name is not UTF-8 put such escapes in every result's paths, and the SDK's writer, unable
    to encode them, ended the server."""
    if isinstance(value, str):
        return _SURROGATE.sub(_byte_or_mark, value) if _SURROGATE.search(value) else value
    if isinstance(value, dict):
        return {utf8_encodable(key): utf8_encodable(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [utf8_encodable(item) for item in value]
    return value


# The most characters of a caller's value an error message quotes back.
MAX_QUOTED_CHARS: Final = 80


def counted(count: int, one: str, many: str) -> str:
    """`1 refresh`, `3 refreshes`: a count with the noun that agrees with it, for every text
    the producers write for agents and operators (the service's own texts use
    `channels.base.counted`, which the producers may not import)."""
    return f"{count} {one if count == 1 else many}"


def quoted(value: object) -> str:
    """`value` as an error message quotes it back (`repr`), cut to `MAX_QUOTED_CHARS` with its
    full length said: a 200 KB id or path given by mistake came back whole, twice in an MCP
    result, filling the agent's context with the echo of its own mistake."""
    text = repr(value)
    if len(text) <= MAX_QUOTED_CHARS:
        return text
    size = f" ({len(value)} characters)" if isinstance(value, str) else ""
    return f"{text[:MAX_QUOTED_CHARS]}...{size}"


def shown_field(name: str) -> str:
    """A field's name as a refusal names it: as given when it is a short line that prints,
    else `quoted` (escaped, cut). A caller's unknown key came back raw and whole: empty, with
    an escape sequence or a line break in it, or of 100,000 characters."""
    if name and name.isprintable() and len(name) <= MAX_QUOTED_CHARS:
        return name
    return quoted(name)


def shows_text(text: str) -> bool:
    """Whether `text` shows a reader anything: False for text of white space, controls,
    zero-width and other format characters, lone combining marks or blank-looking letters
    only. What a field that must not be blank (a reason, a summary, a name) is checked with:
    `str.strip` keeps a zero-width space, so a "reason" of one looked given and showed nothing.
    """
    return any(
        unicodedata.category(char) not in _UNSEEN_CATEGORIES and char not in _BLANK_LETTERS
        for char in text
    )


def limit_mark_stacks(text: str) -> str:
    """`text` with at most `MAX_STACKED_MARKS` combining marks after any one character."""
    if text.isascii():
        return text
    kept: list[str] = []
    stacked = 0
    for char in text:
        if unicodedata.category(char) in ("Mn", "Me"):
            stacked += 1
            if stacked > MAX_STACKED_MARKS:
                continue
        else:
            stacked = 0
        kept.append(char)
    return "".join(kept)


# After the line breaks: the controls a body has no use for (tab and line feed stay).
_BODY_CONTROLS: Final = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]+")


@functools.lru_cache(maxsize=256)
def shown_body(body: str) -> str:
    """A card body as chats and consoles are given it: its Markdown untouched, line breaks
    made `\\n` (CR LF, a lone CR, NEL and the Unicode separators too), every other control
    taken out (an escape sequence in a body reached the console channel's terminal and acted
    on it; taken out rather than shown, so a secret with a control inside is joined again for
    the redaction), mark stacks bounded. Cached: a body is shown on every route it has."""
    return limit_mark_stacks(_BODY_CONTROLS.sub("", _LINE_BREAKS.sub("\n", body)))


def _kept_flag(found: re.Match[str]) -> str:
    return found.group(1) or ""


def drop_hidden_tags(text: str) -> str:
    """`text` without the Unicode tag characters (invisible text a model still reads), the
    subdivision flags kept; lines, controls and direction marks are left as they are."""
    return _HIDDEN_TAGS.sub(_kept_flag, text)


def one_line(text: str) -> str:
    """Agent- or person-written `text` for one line among the service's own words: controls,
    bidirectional formatting and line breaks gone, white space runs one space, mark stacks
    bounded, trimmed; "" when nothing in it shows (see `shows_text`)."""
    flat = " ".join(_BREAKS.sub(" ", _UNSHOWN_IN_LINE.sub(_kept_flag, text)).split())
    return limit_mark_stacks(flat) if shows_text(flat) else ""


def one_line_cut(text: str, limit: int) -> str:
    """`one_line(text)` cut to at most `limit` characters, a cut one ending in "…": an
    agent-written value in one line of a list (a name, a summary, a reason), so that the
    line stays one line of a bearable length whatever the agent wrote."""
    return cut_line(one_line(text), limit)


def cut_line(flat: str, limit: int) -> str:
    """`flat`, a text `one_line` made already (and redacted since: redaction adds no line
    break), cut to at most `limit` characters as `one_line_cut` cuts: for the rows composed
    on every change, which need not flatten the text twice."""
    return flat if len(flat) <= limit else flat[: max(0, limit - 1)].rstrip() + "…"


def count_field(value: object) -> int | None:
    """A non-negative whole count (tokens, an exit code's size), or None when unusable.

    Floats are accepted when whole and finite (`12.0`); booleans, NaN, infinities, negative
    and absurd values (over `MAX_COUNT`) are unknown.
    """
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if 0 <= value <= MAX_COUNT else None
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return int(value) if 0 <= value <= MAX_COUNT else None
    return None


def int_field(value: object) -> int | None:
    """A whole number within +-`MAX_COUNT` (an exit code may be negative), else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        value = int(value)
    if isinstance(value, int) and -MAX_COUNT <= value <= MAX_COUNT:
        return value
    return None


def duration_field(value: object) -> float | None:
    """A duration in seconds, finite and between 0 and `MAX_DURATION_S`, else None."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if isinstance(value, int) and not -(10**18) < value < 10**18:
        return None
    seconds = float(value)
    return seconds if math.isfinite(seconds) and 0 <= seconds <= MAX_DURATION_S else None


def open_appending(path: str | os.PathLike[str], flags: int, *, dir_fd: int | None = None) -> int:
    """`os.open` of `path` with `flags` (`O_APPEND` and the rest, no access mode), for reading
    too when the caller may read it (`line_break_first` looks at its last byte); a file the
    caller may write but not read (mode 0220, say) is appended to as it always was."""
    try:
        return os.open(path, os.O_RDWR | flags, 0o644, dir_fd=dir_fd)
    except PermissionError:
        return os.open(path, os.O_WRONLY | flags, 0o644, dir_fd=dir_fd)


def write_all(fd: int, data: bytes) -> None:
    """Write all of `data` to `fd`, or raise. One `write` may take only a part: on a full
    disk, or past the process's file size limit, the kernel writes what fits and refuses
    only the next write, so a caller that wrote once and went on reported a torn record as
    written."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def append_whole(fd: int, data: bytes) -> None:
    """Append `data` to the regular file behind `fd` (open with `O_APPEND`) whole, or not
    at all: when the system refuses the rest of it (a full disk, a file size limit), the
    part that went in is cut off again, so no reader sees a torn line, and the error is
    raised, for the caller to say that nothing was recorded.

    These files have other writers that take no lock (hook processes and the host share
    `logs/events.jsonl`), so only our own bytes are ever cut, and only while they are still
    the end of the file: each write's end is where it left the descriptor's offset, and the
    cut is made only when the file's size is still that end. A size taken before the write
    proved nothing: a line appended between it and the write was cut off with ours (our
    record long, theirs short), or hid our torn part (theirs longer than our record). Our
    part that another line was appended after stays: cutting it would cut theirs."""
    ours = 0  # our bytes that end the file as far as we know, ending at `end`
    end = -1
    view = memoryview(data)
    try:
        while view:
            count = os.write(fd, view)
            view = view[count:]
            after = os.lseek(fd, 0, os.SEEK_CUR)
            # Pieces of one record are one run only when nothing came between them.
            ours = ours + count if after - count == end else count
            end = after
    except OSError:
        with contextlib.suppress(OSError):
            if ours and os.fstat(fd).st_size == end:
                os.ftruncate(fd, end - ours)
        raise


def line_break_first(fd: int) -> bytes:
    """`b"\\n"` when the regular file behind `fd` (open for reading and appending) ends inside
    a line, else `b""`: a line appended there would be glued onto the torn one (a writer
    that died mid-line, a tool that writes in pieces) and both would be lost to every reader.
    Starting a new line first leaves only the torn one unreadable."""
    size = os.fstat(fd).st_size
    try:
        last = os.pread(fd, 1, size - 1) if size else b"\n"
    except OSError:  # not readable: nothing to go on, append as before
        return b""
    return b"" if last == b"\n" else b"\n"


class OutsideWorkdir(OSError):
    """A workdir path whose file (after symlinks) lies outside the workdir: not written."""


def is_inside(root: str, path: str) -> bool:
    """Whether the absolute `path` is `root` or below it (both already resolved)."""
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def _outside(
    path: Path,
    verb: str = "written",
    inside: Path | None = None,
    *,
    folder: bool = False,
) -> OutsideWorkdir:
    """The refusal of `path`, naming the link below the workdir `inside` that leads out of it
    when it is a folder on the way: "replace the link with a regular file" was said for a
    linked `logs/` too, where a file would break every writer of the folder."""
    link = _link_out(path, inside) if inside is not None else None
    if link is None or link == os.path.abspath(path):
        where, fix = "", "a folder" if folder else "a regular file"
    else:
        where, fix = f" at {link}", "a folder"
    return OutsideWorkdir(
        errno.EXDEV,
        f"{path} leads out of the workdir (a symlink{where}); nothing is {verb} outside it, so "
        f"replace the link with {fix}",
    )


def _link_out(path: Path, inside: Path) -> str | None:
    """The first symbolic link on the way from the workdir `inside` (as given) down to
    `path` that leads out of it, else None. Only what lies below the workdir counts: a link
    above it (`/tmp` on macOS, a linked home) is how the workdir is reached, not the fault."""
    base, whole = os.path.abspath(inside), os.path.abspath(path)
    if not whole.startswith(base.rstrip(os.sep) + os.sep):
        return None
    root = os.path.realpath(base)
    step = base
    for part in Path(os.path.relpath(whole, base)).parts:
        step = os.path.join(step, part)
        if os.path.islink(step) and not is_inside(root, os.path.realpath(step)):
            return step
    return None


def _resolved_inside(
    path: Path, inside: Path, verb: str, *, folder: bool = False
) -> tuple[str, str]:
    """(resolved `inside`, resolved `path`) when the second lies inside the first; raises
    `OutsideWorkdir` otherwise (`verb`: what is not done outside, for its message)."""
    root = os.path.realpath(inside)
    target = os.path.realpath(path)
    if not is_inside(root, target):
        raise _outside(path, verb, inside, folder=folder)
    return root, target


def _opened_inside(fd: int, root: str, path: Path, verb: str) -> None:
    """On Linux, the kernel's path of the descriptor just opened must lie inside `root` (a
    folder on the way swapped for a link after it was resolved); else `fd` is closed and
    `OutsideWorkdir` raised. Without /proc the resolved path checked before is what we have."""
    try:
        opened = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return
    if not is_inside(root, opened):
        os.close(fd)
        raise _outside(path, verb)


def open_append(path: Path, *, inside: Path | None = None) -> int:
    """An `O_APPEND` descriptor of `path` (see `open_appending`), created when missing; with
    `inside`, only onto a file that lies inside that folder once symlinks are resolved
    (checked before anything is created, and on the descriptor itself after opening)."""
    # O_NONBLOCK: a named pipe at `path` fails (no reader) or is refused, never waited on.
    flags = os.O_APPEND | os.O_CREAT | os.O_NONBLOCK | os.O_CLOEXEC
    if inside is None:
        return open_appending(path, flags)
    root, target = _resolved_inside(path, inside, "written")
    fd = open_appending(target, flags | os.O_NOFOLLOW)
    _opened_inside(fd, root, path, "written")
    return fd


def make_folder(folder: Path, *, inside: Path) -> None:
    """`folder` and its missing parents created, only when it lies inside `inside` once
    symlinks are resolved; `OutsideWorkdir` otherwise, and nothing is created."""
    _resolved_inside(folder, inside, "written", folder=True)
    folder.mkdir(parents=True, exist_ok=True)


def open_lock(path: Path, *, inside: Path | None = None) -> int:
    """A descriptor of the lock file at `path` for `flock`, created when missing.

    Only this code creates lock files, so a symlink at the name can only have been planted:
    without `inside` it is refused (`OSError`, ELOOP), never followed to create or lock a file
    elsewhere; a named pipe or a folder there is refused too (`NotRegularFile`), never waited
    on. With `inside` (the workdir), the lock and its folder must lie inside it once links
    are resolved (`OutsideWorkdir` otherwise, before anything is created): the files a lock
    guards sit beside it, so a side folder such as `.notification/` linked out of the workdir
    gets nothing written into it.
    """
    flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        if inside is None:
            fd = os.open(path, flags, 0o644)
        else:
            root, target = _resolved_inside(path, inside, "written")
            fd = os.open(target, flags, 0o644)
            _opened_inside(fd, root, path, "written")
    except IsADirectoryError:
        # A folder at the name is the same fault as a named pipe there, and is said so: it
        # was a "cannot write ... (Is a directory)" of another exit code and advice.
        # The system's words and the path kept, for the callers that word an OSError.
        raise NotRegularFile(errno.EISDIR, os.strerror(errno.EISDIR), os.fspath(path)) from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise NotRegularFile(
            errno.EINVAL, f"{path}: {file_kind(mode)}, not a regular file; remove it"
        )
    return fd


def append_jsonl_line(path: Path, record: dict[str, Any], *, inside: Path | None = None) -> None:
    """Append one whole JSON line with a single `write` on an `O_APPEND` descriptor, on a line
    of its own even after a torn last line (`line_break_first`).

    With `inside` (the workdir), a `path` that leads out of it through a symlink, at the
    file or at a folder on its way, raises `OutsideWorkdir` and nothing is written."""
    path.parent.mkdir(parents=True, exist_ok=True)
    line = (json.dumps(record, ensure_ascii=False, separators=(",", ":")) + "\n").encode()
    fd = open_append(path, inside=inside)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            # The path goes with it: a caller's message said "cannot write the ledger" for a
            # named pipe at `.notification/system.jsonl`, naming the wrong file.
            raise NotRegularFile(
                errno.EINVAL,
                f"{file_kind(mode)}, not a regular file; replace it with a file",
                str(path),
            )
        append_whole(fd, line_break_first(fd) + line)
    finally:
        os.close(fd)


@dataclass(frozen=True)
class Notification:
    """One line of `.notification/system.jsonl` as consumers see it.

    Wire shape: `{"id", "source", "channel": "system", "ref_id", "priority", "header", "body",
    "extra", "at"}`. For the task card, `extra` carries `state` ("error" | "recovered" |
    "limit"), `code` (a stable error code, for errors) and `max_refreshes` (for limits).
    Consumers must build people-facing text from these typed fields, never from header/body.
    """

    id: str
    source: str
    ref_id: str
    priority: str
    header: str
    body: str
    extra: dict[str, Any]
    at: datetime | None


def _text_field(value: object, default: str) -> str:
    """A text field: strings and plain numbers as text, anything else (lists, objects) unset."""
    if isinstance(value, str):
        return value or default
    if isinstance(value, int) and not isinstance(value, bool):
        # Compared as a whole number: `math.isfinite` of one past the largest float raised
        # OverflowError, out of a reader that must never raise.
        return repr(value) if abs(value) < 10**18 else default
    if isinstance(value, float):
        return repr(value) if math.isfinite(value) and abs(value) < 1e18 else default
    return default


def parse_notification(line: bytes) -> Notification | None:
    """A notification from one line, or None when the line is not a well-formed one."""
    data = parse_json(line)
    if not isinstance(data, dict):
        return None
    ident, source = data.get("id"), data.get("source")
    if not isinstance(ident, str) or not ident or not isinstance(source, str):
        return None
    extra = data.get("extra")
    return Notification(
        id=ident,
        source=source,
        ref_id=_text_field(data.get("ref_id"), ""),
        priority=_text_field(data.get("priority"), "normal"),
        header=_text_field(data.get("header"), ""),
        body=_text_field(data.get("body"), ""),
        extra=extra if isinstance(extra, dict) else {},
        at=parse_iso(data.get("at")),
    )


@dataclass(frozen=True)
class ActivityEvent:
    """One line of `logs/events.jsonl`: a known kind, its UTC time and its fields."""

    kind: str
    ts: datetime
    fields: dict[str, Any]


def parse_event(line: bytes) -> ActivityEvent | None:
    """An event from one line, or None for malformed lines, unknown kinds and unusable times.

    The fields are passed on as parsed; readers take values out of them only through the
    total field readers above (`count_field`, `duration_field`, `int_field`).
    """
    data = parse_json(line)
    if not isinstance(data, dict):
        return None
    kind = data.get("kind")
    ts = parse_iso(data.get("ts"))
    # A kind that is not text (a list, an object) is no kind: testing it against the set
    # would raise (unhashable) and stop the read at that line for good.
    if not isinstance(kind, str) or kind not in EVENT_KINDS or ts is None:
        return None
    fields = {k: v for k, v in data.items() if k not in ("kind", "ts")}
    return ActivityEvent(kind=kind, ts=ts, fields=fields)


# A turn's origin: the chat a turn came from, `<channel>:<chat_id>[:<thread_id>]`.
ORIGIN_CHANNELS: Final = ("telegram", "feishu")
ORIGIN_FORMS: Final = "telegram:<chat id>[:<topic id>] or feishu:<chat id>"
_TELEGRAM_CHAT = re.compile(r"-?[0-9]{1,16}")
_TELEGRAM_THREAD = re.compile(r"[1-9][0-9]{0,9}")
_FEISHU_CHAT = re.compile(r"[A-Za-z0-9_-]{1,128}")


@dataclass(frozen=True)
class Origin:
    """The chat (and forum topic) a turn came from; `str()` gives the written form back."""

    channel: str
    chat_id: str
    thread_id: str | None = None

    def __str__(self) -> str:
        tail = f":{self.thread_id}" if self.thread_id is not None else ""
        return f"{self.channel}:{self.chat_id}{tail}"


# A `turn.end` `error`: one category word (`rate_limit`, `interrupted`). Anything longer or
# freer is not a category: writers do not write it, and readers never show it.
_ERROR_WORD: Final = re.compile(r"[A-Za-z0-9_.-]{1,40}")


def turn_error_word(value: object) -> str | None:
    """`value` when it is a `turn.end` error category word, else None."""
    return value if isinstance(value, str) and _ERROR_WORD.fullmatch(value) else None


def parse_origin(value: object) -> Origin | str:
    """The origin written in `value`, or why it is not one (a sentence ending in the fix).

    Strict: the channel is one with chats (telegram or feishu), a Telegram chat id is an
    integer within the Bot API's range with an optional positive topic id, a Feishu chat id is
    one token of letters, digits, `_` and `-` (Feishu has no topics here).
    """
    if not isinstance(value, str):
        return f"must be text written {ORIGIN_FORMS}"
    shown = value if len(value) <= 80 else value[:77] + "..."
    channel, _, rest = value.partition(":")
    if channel not in ORIGIN_CHANNELS:
        # The writers add the forms themselves (`(forms: ...)`); saying them here twice
        # made their messages repeat the same text.
        return f"{shown!r} names no known channel; use telegram or feishu"
    parts = rest.split(":")
    if channel == "telegram":
        if len(parts) > 2 or not _TELEGRAM_CHAT.fullmatch(parts[0]):
            return f"{shown!r} is not telegram:<chat id>[:<topic id>] with integer ids"
        if abs(int(parts[0])) > 2**53 - 1 or int(parts[0]) == 0:
            return f"{shown!r}: the chat id is out of range; copy the chat id Telegram gives"
        thread = parts[1] if len(parts) == 2 else None
        if thread is not None and (
            not _TELEGRAM_THREAD.fullmatch(thread) or int(thread) > 2**31 - 1
        ):
            return f"{shown!r}: the topic id must be a positive integer; drop it or fix it"
        return Origin(channel, parts[0], thread)
    if len(parts) != 1 or not _FEISHU_CHAT.fullmatch(parts[0]):
        return f"{shown!r} is not feishu:<chat id> (one id such as oc_abc123, no topic)"
    return Origin(channel, parts[0])


def cannot_write(where: object, exc: OSError) -> str:
    """One line for a write the system refused, for an agent's command or tool call: the
    path, why, and the fix (what usually stands in the way is a file or folder of the wrong
    kind, or missing write access). The path is shown nearly as `shown_path` shows
    one: escaped when it holds a control (a line break split the line, an escape sequence acted
    on the terminal), cut when longer than any path the system opens (it came back whole)."""
    name = str(where)
    shown = name if name.isprintable() and len(name) <= PATH_MAX else quoted(name)
    return (
        f"cannot write {shown} ({exc.strerror or exc}); move what is in the way aside or make"
        " it writable"
    )


def cannot_read(exc: OSError) -> str:
    """The words, after a file's name, for a read the system failed or refused, one wording
    for every agent-side reader (the ledger, reports, the inbox, lineage): the system's words
    with the errno, and the fix: "cannot read it (Input/output error, EIO); nothing is wrong
    with the name: call again, and if it keeps failing, check the file system that holds it"
    (for EACCES and EPERM: give yourself read access)."""
    name = errno.errorcode.get(exc.errno or 0)
    why = f"{exc.strerror}, {name}" if name else str(exc.strerror or exc)
    fix = (
        "give yourself read access to it and to the folders above it"
        if exc.errno in (errno.EACCES, errno.EPERM)
        else "nothing is wrong with the name: call again, and if it keeps failing, check"
        " the file system that holds it"
    )
    return f"cannot read it ({why}); {fix}"
