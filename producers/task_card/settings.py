"""The five numeric settings owned by `taskcard/taskcard.json`, and their read-only SHOW.

Each field is validated on its own and falls back to its built-in default on its own, so one
typo never silently resets the others. A document that cannot be read as a JSON object at all
means the effective values are unknown: SHOW then fails as a whole (no partial rows) and
`start` refuses, rather than guessing. The one legacy source, a customised
`telegram/taskcard.json` `max_refreshes`, is previewed by SHOW and written once by the first
`start`, and only while the intrinsic document does not exist yet; a legacy value the
intrinsic document would refuse is not migrated, and named among the problems as one there is.

Every setting has a floor, and all but `interval_s` a ceiling (`BOUNDS`). Ceilings exist
because each value sizes something real: `max_body_chars` sizes the stdout buffer of every
run, `timeout_s` becomes the socket timeout of a start (which waits for the first render),
`max_refreshes` and `reminder_turns` are budgets nobody can mean at a billion. `interval_s`
sizes nothing: the manual gives it no ceiling (a slower card is a safer one), and the updater
waits for a far tick in bounded steps. A value out of range is refused for that field alone,
with its range in the message; the other fields keep their values.
"""

from __future__ import annotations

import difflib
import json
import math
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final, TypeGuard

from taskcard.producers.task_card.contract import (
    CardPaths,
    atomic_write,
    json_cut_short,
    json_error_place,
    json_kind,
    read_regular,
)

DEFAULT_INTERVAL_S: Final = 5.0
DEFAULT_TIMEOUT_S: Final = 10.0
DEFAULT_MAX_REFRESHES: Final = 2000
DEFAULT_REMINDER_TURNS: Final = 10
DEFAULT_MAX_BODY_CHARS: Final = 2000
LEGACY_UNTOUCHED_MAX_REFRESHES: Final = 1000
MAX_SETTINGS_FILE_BYTES: Final = 1_000_000
_FLOAT_MAX: Final = int(sys.float_info.max)


@dataclass(frozen=True)
class Bound:
    """The accepted range of one setting, inclusive; `integer` refuses fractions."""

    floor: float
    ceiling: float
    integer: bool

    def describe(self) -> str:
        kind = "an integer" if self.integer else "a number"
        if math.isinf(self.ceiling):
            return f"a finite {kind[kind.index(' ') + 1 :]} of at least {_plain(self.floor)}"
        return f"{kind} from {_plain(self.floor)} to {_plain(self.ceiling)}"


def _plain(number: float) -> str:
    """`1000000`, not `1e+06`: the range as it would be typed into the JSON file."""
    return str(int(number)) if float(number).is_integer() else f"{number:g}"


def _as_json(value: object) -> str:
    """A value as the JSON file spells it (`true`, `null`, `"5"`), for messages about it."""
    try:
        text = json.dumps(value, allow_nan=True)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= 80 else f"{text[:77]}..."


BOUNDS: Final[dict[str, Bound]] = {
    "interval_s": Bound(1, math.inf, integer=False),  # no ceiling: slower is always allowed
    "timeout_s": Bound(0.1, 300, integer=False),  # a start waits for the first render
    "max_refreshes": Bound(1, 1_000_000, integer=True),
    "reminder_turns": Bound(1, 10_000, integer=True),
    "max_body_chars": Bound(100, 100_000, integer=True),  # stdout is bounded at 4x this
}


class _GivenTwice:
    """The value of a key an object names twice: JSON leaves open which one counts."""


GIVEN_TWICE: Final = _GivenTwice()


def setting_problem(key: str, value: object) -> str | None:
    """Why `value` is not acceptable for setting `key`, naming the range; None when it is. Pure."""
    if value is GIVEN_TWICE:
        return f"{key}: given twice in one object (readers differ on which counts); keep one"
    bound = BOUNDS[key]
    number_ok = _is_int(value) if bound.integer else _is_number(value)
    if number_ok and bound.floor <= value <= bound.ceiling:  # type: ignore[operator]
        return None
    return f"{key}: {_as_json(value)} is not allowed; use {bound.describe()}"


class SettingsUnavailable(RuntimeError):
    """The owner document exists but its effective values cannot be determined; `fix` says
    what the owner does about it."""

    def __init__(self, message: str, fix: str = "fix or delete taskcard/taskcard.json") -> None:
        super().__init__(message)
        self.fix = fix


@dataclass(frozen=True)
class EffectiveSettings:
    """The values in force, plus where `max_refreshes` came from (for SHOW's comment)."""

    interval_s: float
    timeout_s: float
    max_refreshes: int
    reminder_turns: int
    max_body_chars: int
    sources: dict[str, str]
    pending_migration: int | None
    problems: tuple[str, ...] = ()


def _is_number(value: object) -> TypeGuard[float]:
    """A JSON number that is not a boolean, NaN or an infinity. A whole number is finite at
    any size (`math.isfinite` of one past the largest float raised OverflowError: a document
    written with 400 digits made SHOW a traceback and every tick of a running watch a crash)."""
    if isinstance(value, bool):
        return False
    return isinstance(value, int) or (isinstance(value, float) and math.isfinite(value))


def _as_float(value: float) -> float:
    """A setting as a float; a whole number past the largest float as that float (as a
    `start` input is read), a cadence too slow to tell from it."""
    if isinstance(value, int) and value > _FLOAT_MAX:
        return sys.float_info.max
    return float(value)


def _is_int(value: object) -> TypeGuard[int]:
    """A whole JSON number, in either form: `300` or `300.0` (JSON Schema's integer, which a
    `start` input takes too, `number_args.whole_numbers`; this document refused it). Never a
    boolean, a fraction, NaN or an infinity. The caller takes it as `int`."""
    if isinstance(value, float):
        return math.isfinite(value) and value.is_integer()
    return isinstance(value, int) and not isinstance(value, bool)


def _mark_repeated(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """An `object_pairs_hook`: a key named twice gets `GIVEN_TWICE`, not the last value, so
    the field is refused on its own (an owner reading the first value got the last)."""
    data: dict[str, Any] = {}
    for key, value in pairs:
        data[key] = GIVEN_TWICE if key in data else value
    return data


def _read_object(path: Any) -> dict[str, Any] | None:
    """The JSON object at `path`, None when absent; raises SettingsUnavailable otherwise.
    A key the object names twice has the value `GIVEN_TWICE`."""
    try:
        raw = read_regular(path, MAX_SETTINGS_FILE_BYTES + 1)
    except FileNotFoundError:
        return None
    except NotADirectoryError:
        # A file where the folder belongs: "fix or delete taskcard.json" named a file that
        # cannot exist, and not what is in the way.
        folder = path.parent.name
        raise SettingsUnavailable(
            f"{path.name} cannot be read: {folder} is a file, not a folder",
            f"move the file {folder} out of the way (the card's folder goes there)",
        ) from None
    except OSError as exc:
        raise SettingsUnavailable(f"{path.name} cannot be read ({exc.strerror})") from None
    if len(raw) > MAX_SETTINGS_FILE_BYTES:
        raise SettingsUnavailable(f"{path.name} is larger than {MAX_SETTINGS_FILE_BYTES} bytes")
    try:
        data = json.loads(raw, object_pairs_hook=_mark_repeated)
    except (ValueError, RecursionError) as exc:
        raise SettingsUnavailable(f"{path.name} {_not_json(raw, exc)}") from None
    if not isinstance(data, dict):
        raise SettingsUnavailable(
            f"{path.name} is not a JSON object (the top level is {json_kind(data)})"
        )
    return data


def _not_json(raw: bytes, exc: ValueError | RecursionError) -> str:
    """Why the document is not a JSON object one can read, and where: "is not valid JSON"
    alone was said of an empty file, bytes that are not UTF-8, a NUL, a 5,000-digit number
    and a document nested too deeply, and the owner had to guess which."""
    if not raw.strip():
        return "is empty; write a JSON object (such as {})"
    if isinstance(exc, UnicodeDecodeError):
        return f"is not UTF-8 (byte {exc.start + 1}, counting from 1); save it as UTF-8"
    if isinstance(exc, RecursionError):
        return "nests too deeply to read"
    if not isinstance(exc, json.JSONDecodeError):  # Python's cap on a number's digits
        cap = sys.get_int_max_str_digits()
        return f"holds a number of over {cap} digits, more than can be read; shorten it"
    if json_cut_short(exc):
        return "is not valid JSON: it ends before the object is complete"
    return f"is not valid JSON: {json_error_place(exc)}"


def _legacy_max_refreshes(paths: CardPaths) -> tuple[int | None, str | None]:
    """(a genuinely customised legacy ceiling, why the legacy value cannot be taken). An
    unreadable or absent legacy file, or its untouched default, is neither. A value the
    intrinsic document would refuse (past 1,000,000, not a positive integer) is not migrated
    either, and the owner is told why: it used to be dropped without a word."""
    try:
        data = _read_object(paths.legacy_telegram_settings)
    except SettingsUnavailable:
        return None, None
    if data is None or "max_refreshes" not in data:
        return None, None
    value = data["max_refreshes"]
    problem = setting_problem("max_refreshes", value)
    if problem is not None:
        return None, problem
    if value == LEGACY_UNTOUCHED_MAX_REFRESHES:
        return None, None
    return int(value), None


def _fold(key: str) -> str:
    """A key with case, `-`, `_`, spaces and dots left out: `Interval-S` reads `intervals`."""
    return "".join(char for char in key.casefold() if char.isalnum())


def _other_keys(data: dict[str, Any]) -> dict[str, str]:
    """The document's keys that are no setting (and short enough to be a spelling of one),
    by their folded form: built once per document, for `_spelt_almost`."""
    folded: dict[str, str] = {}
    for name in data:
        if name not in BOUNDS and len(name) <= _NEAR_KEY_CHARS:
            folded.setdefault(_fold(name), name)
    return folded


def _spelt_almost(key: str, others: dict[str, str]) -> str | None:
    """The key of `others` (see `_other_keys`) that names setting `key` in another spelling
    (`interval-s`, `intervalS`, `Interval_S`) or with a slip (`intervl_s`)."""
    wanted = _fold(key)
    if wanted in others:
        return others[wanted]
    if len(others) > _NEAR_KEYS_COMPARED:
        return None  # no hand-kept settings file: a slip is not looked for in so many keys
    close = difflib.get_close_matches(wanted, list(others), n=1, cutoff=0.85)
    return others[close[0]] if close else None


# Past these, a key is no spelling of a setting, and a document no hand-kept settings file.
_NEAR_KEY_CHARS: Final = 64
_NEAR_KEYS_COMPARED: Final = 256


def load_settings(paths: CardPaths) -> EffectiveSettings:
    """Effective values with per-field fallback. Raises `SettingsUnavailable`."""
    document = _read_object(paths.settings)
    data = document or {}
    sources: dict[str, str] = {}

    problems: list[str] = []
    others = _other_keys(data) if not BOUNDS.keys() <= data.keys() else {}

    def pick(key: str, default: Any) -> Any:
        if key not in data:
            near = _spelt_almost(key, others)
            if near is None:
                sources[key] = "default"
            else:
                # `interval-s` (as SHOW's rows name it) or `intervalS`: the owner meant this
                # setting, and silence left them believing it was in force.
                unread = f"{_as_json(near)} is not read; the key is {key}"
                sources[key] = f"default; taskcard.json {unread}"
                problems.append(f"taskcard.json {unread}; the default {default:g} is in force")
            return default
        problem = setting_problem(key, data[key])
        if problem is None:
            sources[key] = "taskcard.json"
            return data[key]
        sources[key] = f"refused value in taskcard.json ({problem}), default"
        problems.append(f"taskcard.json {problem}; the default {default:g} is in force")
        return default

    interval_s = _as_float(pick("interval_s", DEFAULT_INTERVAL_S))
    timeout_s = _as_float(pick("timeout_s", DEFAULT_TIMEOUT_S))
    max_refreshes = int(pick("max_refreshes", DEFAULT_MAX_REFRESHES))
    reminder_turns = int(pick("reminder_turns", DEFAULT_REMINDER_TURNS))
    max_body_chars = int(pick("max_body_chars", DEFAULT_MAX_BODY_CHARS))
    pending: int | None = None
    if document is None:
        pending, refused = _legacy_max_refreshes(paths)
        if pending is not None:
            max_refreshes = pending
            sources["max_refreshes"] = "legacy telegram/taskcard.json (migrated at first start)"
        elif refused is not None:
            sources["max_refreshes"] = (
                f"refused value in legacy telegram/taskcard.json ({refused}), default"
            )
            problems.append(
                f"telegram/taskcard.json {refused} (there, or as max_refreshes in"
                f" taskcard/taskcard.json); it is not migrated and the default"
                f" {DEFAULT_MAX_REFRESHES} is in force"
            )
    return EffectiveSettings(
        interval_s=interval_s,
        timeout_s=timeout_s,
        max_refreshes=max_refreshes,
        reminder_turns=reminder_turns,
        max_body_chars=max_body_chars,
        sources=sources,
        pending_migration=pending,
        problems=tuple(problems),
    )


def _defaults() -> EffectiveSettings:
    return EffectiveSettings(
        interval_s=DEFAULT_INTERVAL_S,
        timeout_s=DEFAULT_TIMEOUT_S,
        max_refreshes=DEFAULT_MAX_REFRESHES,
        reminder_turns=DEFAULT_REMINDER_TURNS,
        max_body_chars=DEFAULT_MAX_BODY_CHARS,
        sources={},
        pending_migration=None,
    )


def settings_or_defaults(paths: CardPaths) -> EffectiveSettings:
    """For per-publication and per-turn reads: a broken document must not stop a running card."""
    try:
        return load_settings(paths)
    except SettingsUnavailable:
        return _defaults()


def migrate_legacy(paths: CardPaths, settings: EffectiveSettings) -> bool:
    """Perform the one-time migration at the first start. Returns True when it wrote."""
    if settings.pending_migration is None or paths.settings.exists():
        return False
    document = {"max_refreshes": settings.pending_migration}
    atomic_write(paths.settings, (json.dumps(document, indent=2) + "\n").encode())
    return True


_ROWS: Final = (
    ("interval-s", "interval_s", DEFAULT_INTERVAL_S, "Default seconds between refreshes"),
    ("timeout-s", "timeout_s", DEFAULT_TIMEOUT_S, "Ceiling in seconds of one renderer run"),
    ("max-refreshes", "max_refreshes", DEFAULT_MAX_REFRESHES, "Refresh budget ceiling of a watch"),
    ("reminder-turns", "reminder_turns", DEFAULT_REMINDER_TURNS, "Turns between reminders"),
    ("max-body-chars", "max_body_chars", DEFAULT_MAX_BODY_CHARS, "Longest body accepted"),
)


def show_rows(settings: EffectiveSettings) -> list[dict[str, Any]]:
    """The five SHOW rows, each exactly key, current, default, configurable, comment."""
    rows = []
    for key, attr, default, meaning in _ROWS:
        source = settings.sources.get(attr, "default")
        rows.append(
            {
                "key": key,
                "current": getattr(settings, attr),
                "default": default,
                "configurable": True,
                "comment": f"{meaning} (source: {source}); see the manual, section {key}.",
            }
        )
    return rows


_FRESH_NS: Final = 2_000_000_000  # a file changed this recently may change again unseen


_StatKey = tuple[int, int, int, int, int]


def _stat_key(path: Any) -> _StatKey | None:
    try:
        info = os.stat(path)
    except OSError:
        return None
    return (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns)


class SettingsCache:
    """`settings_or_defaults` for a running watch: the document re-read only when it changed.

    Every tick needs `max_body_chars`; reading and parsing the document each time cost an
    open, a read and a JSON parse per tick for a value that changes a few times a year. The
    effective settings are kept with the stat of both source files (the document and the
    legacy one) and reused while both stats are unchanged. A file modified within the last
    two seconds is re-read every time: a second edit within the file system's timestamp
    granularity, of the same size, would otherwise go unseen. A broken document is never
    kept: its defaults are recomputed (and its problem re-detected) on every call.
    """

    def __init__(self, paths: CardPaths, clock_ns: Callable[[], int] = time.time_ns) -> None:
        self._paths = paths
        self._clock_ns = clock_ns
        # One attribute, replaced whole: threads calling `get` at once never mix two entries.
        self._entry: tuple[tuple[_StatKey | None, _StatKey | None], EffectiveSettings] | None = None

    def get(self) -> EffectiveSettings:
        key = (_stat_key(self._paths.settings), _stat_key(self._paths.legacy_telegram_settings))
        entry = self._entry
        if entry is not None and entry[0] == key:
            return entry[1]
        self._entry = None
        try:
            value = load_settings(self._paths)
        except SettingsUnavailable:
            return _defaults()  # not `settings_or_defaults`: that would read the file again
        now = self._clock_ns()
        if all(part is None or now - part[3] >= _FRESH_NS for part in key):
            self._entry = (key, value)
        return value
