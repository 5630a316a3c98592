"""Secret redaction for everything the service shows to people.

Card bodies and activity rows are written by agents and renderers we do not control; a
renderer that prints an environment dump must not post a bot token into a group chat. Two
layers:

- patterns aim at shapes that are secrets with near certainty (vendor prefixes, a bot token
  even when glued into a Bot API URL path, JWT structure, `key=value` / `"key": "value"` /
  `key = "value"` assignments with a secret-sounding key, credentials inside URLs), so
  ordinary prose and file paths pass unchanged;
- a `Redactor` also knows the exact values of the service's own configured secrets (handed
  over once at start, never read from the environment here) and removes them wherever they
  appear, including their URL-encoded, JSON-escaped and HTML-escaped spellings: an app secret
  has no recognisable shape, so only its value can find it.

Each hit is replaced by a visible marker so readers know something was removed.
"""

from __future__ import annotations

import functools
import html
import itertools
import json
import re
import unicodedata
from collections.abc import Iterable, Mapping
from typing import Any, Final
from urllib.parse import quote

MARKER: Final = "[redacted]"

# A configured value shorter than this is not searched for: scrubbing every "abc" in every
# card would mangle prose, and a secret that short protects nothing anyway.
MIN_SECRET_CHARS: Final = 4
# `Redactor` remembers this many of its results for texts up to this long.
_MEMO_ENTRIES: Final = 2048
# How many distinct short dict keys `Redactor.leaks_in` remembers as passed over.
_PASSED_KEYS: Final = 1024
# The item types `leaks_in` tells apart, as tuples made once (`int | float` in an
# `isinstance` makes a union each time it runs); the exact classes of the values it does not
# walk into where it meets them in a dict: strings, checked there, and scalars (anything
# else is looked at as an item of its own).
_NUMBERS: Final = (int, float)
_SEQUENCES: Final = (list, tuple)
_PLAIN_VALUES: Final = frozenset({str, int, float, bool, type(None)})
# `isinstance(value, str)` as a function of one value, for `filter` (no Python frame).
_is_str: Final = str.__instancecheck__
# The exact class of the items of a list of plain dicts (a payload's entities).
_DICTS: Final = frozenset({dict})
_values_of: Final = dict.values
_MEMO_CHARS: Final = 512

# Ordered: the specific vendor shapes first, so a token inside `token=...` is still one marker.
_PATTERNS: Final[tuple[re.Pattern[str], ...]] = (
    # Telegram bot token: numeric bot id, a colon (maybe URL-encoded), 30+ url-safe characters.
    # No word boundary before it: in the Bot API URL form it is glued to `/bot`.
    re.compile(r"(?<!\d)\d{6,12}(?::|%3[Aa])[A-Za-z0-9_-]{30,}"),
    # OpenAI and Anthropic style keys: sk-..., sk-proj-..., sk-ant-...
    re.compile(r"\bsk-[A-Za-z0-9_-]{16,}"),
    # GitHub tokens: classic (ghp_, gho_, ghu_, ghs_, ghr_) and fine-grained.
    re.compile(r"\bgh[pousr]_[A-Za-z0-9]{20,}"),
    re.compile(r"\bgithub_pat_[A-Za-z0-9_]{20,}"),
    # Slack tokens: xoxb-, xoxp-, xoxa-, xoxs-, xoxr-...
    re.compile(r"\bxox[a-z]-[A-Za-z0-9-]{10,}"),
    # AWS access key ids.
    re.compile(r"\b(?:AKIA|ASIA)[A-Z0-9]{16}\b"),
    # Google API keys.
    re.compile(r"\bAIza[A-Za-z0-9_-]{35}"),
    # JSON Web Tokens: three base64url parts, the first two starting with `{"` encoded.
    re.compile(r"\beyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}"),
)

# `Authorization: Bearer abc...` (or Basic): keep the scheme word, hide the credential.
_BEARER: Final = re.compile(r"(?i)\b(bearer|basic)\s+[A-Za-z0-9._~+/=-]{8,}")

# Key names whose value is a secret: `password`, `api_key`, `FEISHU_ENCRYPT_KEY`,
# `verification_token`, `app_secret`, `client-secret`... A bare `key` is not one (`sort key`).
_SECRET_KEY: Final = r"""
    (?:[a-z0-9_-]*[_-])?
    (?:password|passwd|pwd|secret|token|auth|credentials?|cookie
       |(?:api|access|private|secret|encrypt|encryption|signing|master|session|app|client)
        [_-]?(?:key|secret)
    )
"""

# `password=...`, `api_key: ...`, `"token": "..."`, `encrypt_key = "..."`, and the same inside
# a JSON string (`\"token\": \"...\"`): keep the key, hide the value. A quoted value is hidden
# up to its closing quote, spaces included.
_ASSIGNMENT: Final = re.compile(
    rf"""(?ix)
    \b({_SECRET_KEY})
    (\\?["']?\s*[:=]\s*)
    (?!\\?["']?\[redacted\])
    (
        \\?"(?:[^"\\\n]|\\[^"\n])+\\?"
      | '[^'\n]+'
      | [^\s"',;&]{{3,}}
    )
    """
)

# `scheme://user:password@host`: keep the scheme, user and host.
_URL_CREDENTIALS: Final = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://[^\s/:@]+):[^\s/@]+@")


def _hide_value(match: re.Match[str]) -> str:
    key, separator, value = match.group(1), match.group(2), match.group(3)
    if value.startswith(('"', '\\"', "'")):
        quote_mark = '\\"' if value.startswith('\\"') else value[0]
        return f"{key}{separator}{quote_mark}{MARKER}{quote_mark}"
    return f"{key}{separator}{MARKER}"


def redact_tokens(text: str) -> str:
    """`text` with the secret shapes that need no key word hidden (tokens, keys, URL
    credentials, bearer values), but not `key: value` assignments: for the service's own
    messages, which name keys such as `telegram.token` themselves."""
    for pattern in _PATTERNS:
        text = pattern.sub(MARKER, text)
    text = _URL_CREDENTIALS.sub(rf"\1:{MARKER}@", text)
    return _BEARER.sub(rf"\1 {MARKER}", text)


def redact_every_shape(text: str) -> str:
    """`redact` without the literal pre-checks: every pattern runs over the text."""
    return _ASSIGNMENT.sub(_hide_value, redact_tokens(text))


# The non-ASCII characters a case-insensitive pattern takes for an ASCII letter (dotted and
# dotless i, long s, Kelvin sign); `str.lower` turns only the last into one. A text with any
# of them skips the pre-checks below.
_FOLDS_TO_ASCII: Final = ("\u0130", "\u0131", "\u017f", "\u212a")

# Each shape pattern (all case-sensitive) with a search that finds every text the pattern can
# match in: the pattern without its leading assertion (`\b`, `(?<!\d)`). The engine then
# looks for the first characters alone instead of trying the assertion at every position,
# and ordinary prose (`through`, `task-card`, `12:04`) no longer lets a pattern run for a
# literal it happens to contain.
_PRECHECKED: Final[tuple[tuple[re.Pattern[str], re.Pattern[str]], ...]] = (
    (_PATTERNS[0], re.compile(r"(?::|%3[Aa])[A-Za-z0-9_-]{30}")),
    (_PATTERNS[1], re.compile(r"sk-[A-Za-z0-9_-]{16}")),
    (_PATTERNS[2], re.compile(r"gh[pousr]_[A-Za-z0-9]{20}")),
    (_PATTERNS[3], re.compile(r"github_pat_[A-Za-z0-9_]{20}")),
    (_PATTERNS[4], re.compile(r"xox[a-z]-[A-Za-z0-9-]{10}")),
    (_PATTERNS[5], re.compile(r"(?:AKIA|ASIA)[A-Z0-9]{16}")),
    (_PATTERNS[6], re.compile(r"AIza[A-Za-z0-9_-]{35}")),
    (_PATTERNS[7], re.compile(r"eyJ[A-Za-z0-9_-]{8,}\.eyJ")),
)
assert len(_PRECHECKED) == len(_PATTERNS)
# What every match of `_ASSIGNMENT` holds, in a lowered text: a key ends in one of these
# words, then comes its separator.
_ASSIGNMENT_HINT: Final = re.compile(
    r"""(?:password|passwd|pwd|secret|token|auth|credentials?|cookie|key)\\?["']?\s*[:=]"""
)
_ANY_FOLDING: Final = re.compile(f"[{''.join(_FOLDS_TO_ASCII)}]")


def redact(text: str) -> str:
    """`text` with every recognised secret shape replaced by `[redacted]`.

    Every card text passes here several times per change, and a dozen regular expression
    scans cost more than the rest of the redaction: a pattern runs only when the text holds
    what it cannot match without (`sk-` and 16 key characters for `sk-...` keys, `://` and
    `@` for URL credentials, a key word and its `:` or `=` for assignments). The checks look
    at the text as it is when the pattern's turn comes, so the result is
    `redact_every_shape`'s (`tests/bridge/test_redact.py` compares them).
    """
    global _last_unchanged
    if text is _last_unchanged:
        return text
    if not text.isascii() and _ANY_FOLDING.search(text):
        return redact_every_shape(text)
    given = text
    for pattern, hint in _PRECHECKED:
        if hint.search(text):
            text = pattern.sub(MARKER, text)
    if "://" in text and "@" in text:
        text = _URL_CREDENTIALS.sub(rf"\1:{MARKER}@", text)
    lowered = text.lower()
    if "bearer" in lowered or "basic" in lowered:
        text = _BEARER.sub(rf"\1 {MARKER}", text)
        lowered = text.lower()
    if _ASSIGNMENT_HINT.search(lowered):
        text = _ASSIGNMENT.sub(_hide_value, text)
    if text == given:
        _last_unchanged = text
    return text


# The last text `redact` gave back unchanged (one string, the function's own). A card's body
# is redacted where its view is composed and again inside the service's `Redactor`, just
# after (`Service._render_card`): when the first pass found no shape and the configured
# secrets none either, the second is handed the very same string, which is answered at
# once. Only that very object is: a text with a shape hidden may show another shape once
# redacted (a marker gives a key glued to the one before it a word boundary), so a
# changed text is always looked at again.
_last_unchanged: str | None = None


def secret_spellings(secret: str) -> frozenset[str]:
    """The ways one secret value may be written in text: as is, URL-encoded, JSON-escaped
    and HTML-escaped (a renderer quoting a config file, a URL or a JSON dump)."""
    return frozenset(
        {
            secret,
            quote(secret, safe=""),
            quote(secret, safe="/:"),
            json.dumps(secret)[1:-1],
            html.escape(secret),
        }
    )


class Redactor:
    """Redaction with the exact values of the service's configured secrets.

    Built once at start from the values the configuration names (bot tokens, app secrets,
    encrypt keys, verification tokens) and passed down; it never reads the environment.
    """

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        spellings: set[str] = set()
        for secret in secrets:
            if len(secret) >= MIN_SECRET_CHARS:
                spellings |= secret_spellings(secret)
        # Longest first, so a secret that contains another is removed whole.
        self._spellings: tuple[str, ...] = tuple(sorted(spellings, key=len, reverse=True))
        folded = {fold(spelling)[0] for spelling in spellings}
        self._folded = tuple(
            sorted((f for f in folded if len(f) >= MIN_SECRET_CHARS), key=len, reverse=True)
        )
        bare_spellings = (fold(spelling, markup=True)[0] for spelling in spellings)
        self._bare = frozenset(b for b in bare_spellings if len(b) >= MIN_SECRET_CHARS)
        # Folding an ASCII text only drops characters, so one shorter than every spelling and
        # every folded secret cannot show any (most strings of a payload: keys, entity types).
        lengths = [len(s) for s in (*self._spellings, *self._folded, *self._bare)]
        self._shortest = min(lengths, default=0)
        # A card's automatic rows are mostly the same from one change to the next: short
        # texts are remembered (bodies, long and new each time, are not).
        self._short = functools.lru_cache(maxsize=_MEMO_ENTRIES)(self._redacted)
        # Dict keys met in payloads and found too short to hold a secret (and ASCII): a
        # payload's keys are a few dozen names, so a dict whose keys are all among them is
        # passed over in one look rather than key by key (`leaks_in`).
        self._passed_keys: set[str] = set()

    def scrub(self, text: str) -> str:
        """`text` without any spelling of a configured secret (no pattern matching).

        Also found where invisible characters, line breaks or spaces were put inside a value,
        or its characters were written in compatibility forms (full-width digits): a chat
        shows those joined, so the whole stretch they span is replaced.
        """
        if not self._shortest or (len(text) < self._shortest and text.isascii()):
            return text
        for spelling in self._spellings:
            if spelling in text:
                text = text.replace(spelling, MARKER)
        if not self._folded:
            return text
        folded_text = _folded_text(text)  # once, not once per secret spelling
        # `any` over `map` of the text's own `__contains__`: the looks run in C, with no
        # generator frame (this and the two in `leaks` run on every card).
        if not any(map(folded_text.__contains__, self._folded)):
            return text  # the common case, without building the index map
        folded, origin = fold(text)
        spans: list[tuple[int, int]] = []
        for secret in self._folded:
            at = folded.find(secret)
            while at >= 0:
                end = at + len(secret)
                spans.append((origin[at], origin[end - 1] + 1))
                at = folded.find(secret, end)
        for start, end in _merged(spans)[::-1]:
            text = text[:start] + MARKER + text[end:]
        return text

    def __call__(self, text: str) -> str:
        """`text` without configured secrets and without recognised secret shapes."""
        if len(text) <= _MEMO_CHARS:
            return self._short(text)
        return redact(self.scrub(text))

    def _redacted(self, text: str) -> str:
        return redact(self.scrub(text))

    def leaks(self, text: str) -> bool:
        """Whether `text` still shows a configured secret: a final check on what is sent.

        Compared after folding both sides (NFKC, invisible characters and all whitespace
        dropped) and ignoring markup characters, because a chat joins `Xq7V**b2Ln**` or a
        value with a soft hyphen inside into one word on screen.
        """
        if not self._shortest or (len(text) < self._shortest and text.isascii()):
            return False
        if any(map(text.__contains__, self._spellings)):
            return True
        bare = _folded_text(text, markup=True)
        return any(map(bare.__contains__, self._bare))

    def leaks_in(self, value: object, text: str | None = None) -> bool:
        """Whether any string of a JSON-like value (dict keys and values, list and tuple
        items), or `text`, still shows a configured secret: `leaks` of each, as
        `strings_in` finds them, but without collecting them first.

        Every payload passes here before it is sent. Most of its strings are keys, entity
        types and short links that cannot hold a secret (ASCII and shorter than every
        spelling): they are passed over where they are met, and only the others are checked,
        each once. Numbers are passed over, and dicts, lists and tuples told apart by their
        exact class, before anything is asked whether it is a `Mapping` (an abstract-class
        check). A dict whose keys are all short names met before (`_passed_keys`: each was
        found ASCII and too short once) is passed over key by key in one set look; its
        values are looked at one by one, as always.
        """
        shortest = self._shortest
        if not shortest:
            return False
        checked: set[str] = set()

        def leaking(item: str) -> bool:  # a string that may hold a secret (see above)
            if item in checked:
                return False
            checked.add(item)
            return self.leaks(item)

        if text is not None and (len(text) >= shortest or not text.isascii()) and leaking(text):
            return True
        pending: list[Any] = [value]  # told apart by class below, which mypy cannot follow
        passed_keys = self._passed_keys
        while pending:
            item = pending.pop()
            kind = item.__class__
            if kind is list or kind is tuple:
                if (
                    item
                    and _DICTS.issuperset(map(type, item))
                    and _short_plain(item, passed_keys, shortest)
                ):
                    continue
                pending.extend(item)
                continue
            if kind is not dict:  # the other kinds in order, the `Mapping` ABC last
                if isinstance(item, str):
                    if (len(item) >= shortest or not item.isascii()) and leaking(item):
                        return True
                    continue
                if item is None or isinstance(item, _NUMBERS):
                    continue
                if isinstance(item, _SEQUENCES):
                    pending.extend(item)
                    continue
                if not isinstance(item, Mapping):
                    continue
            if not passed_keys.issuperset(item):  # all keys known to be passed over: none
                for key in item:
                    if isinstance(key, str) and (len(key) >= shortest or not key.isascii()):
                        if leaking(key):
                            return True
                    elif key.__class__ is str and len(passed_keys) < _PASSED_KEYS:
                        passed_keys.add(key)
            # Its strings picked out in C (`filter`), then anything but strings and scalars
            # (a nested list or dict, rare) left for the walk: most values are an entity's
            # type, offset and length, which cost a few bytecodes each this way.
            values = item.values()
            for nested in filter(_is_str, values):
                if (len(nested) >= shortest or not nested.isascii()) and leaking(nested):
                    return True
            if not _PLAIN_VALUES.issuperset(map(type, values)):
                for nested in values:
                    if type(nested) not in _PLAIN_VALUES:
                        pending.append(nested)
        return False


def _short_plain(
    dicts: list[dict[Any, Any]] | tuple[dict[Any, Any], ...], passed_keys: set[str], shortest: int
) -> bool:
    """Whether the walk of `Redactor.leaks_in` would pass over each of `dicts` (plain dicts)
    without a look at any string: all their keys passed over before, their values strings
    and scalars alone, every string ASCII and shorter than `shortest`. A payload's entities
    are such a list, each a dozen bytecodes of the walk per entity; asked of the whole list
    at once, in C, this costs the same for two entities or a hundred. Anything else (a key
    met for the first time, a long or non-ASCII string, a nested value) is left to the walk.
    """
    if not passed_keys.issuperset(itertools.chain.from_iterable(dicts)):
        return False
    values = list(itertools.chain.from_iterable(map(_values_of, dicts)))
    if not _PLAIN_VALUES.issuperset(map(type, values)):
        return False
    strings = list(filter(_is_str, values))
    return max(map(len, strings), default=0) < shortest and "".join(strings).isascii()


def strings_in(value: object) -> set[str]:
    """Every distinct string in a JSON-like value: dict keys and values, list and tuple items.

    Walked with a stack, not recursive generators: every payload passes here before it is
    sent, and a card's entities are a dozen small dicts (one generator frame per value cost
    more than the rest of the walk). Numbers are passed over, and dicts, lists and tuples
    told apart, before anything is asked whether it is a `Mapping`: that question is an
    abstract-class check, and it was asked of every entity's offset and length.
    """
    found: set[str] = set()
    pending = [value]
    while pending:
        item = pending.pop()
        if isinstance(item, str):
            found.add(item)
        elif item is None or isinstance(item, int | float):
            continue
        elif isinstance(item, dict):
            for key, nested in item.items():
                if isinstance(key, str):
                    found.add(key)
                pending.append(nested)
        elif isinstance(item, list | tuple):
            pending.extend(item)
        elif isinstance(item, Mapping):
            for key, nested in item.items():
                if isinstance(key, str):
                    found.add(key)
                pending.append(nested)
    return found


def _merged(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    merged: list[tuple[int, int]] = []
    for start, end in sorted(spans):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(end, merged[-1][1]))
        else:
            merged.append((start, end))
    return merged


# Unicode's default-ignorable code points that are not format (Cf) characters: the combining
# grapheme joiner, Hangul fillers, Mongolian and variation selectors, tags' neighbours.
_IGNORABLE_RANGES: Final = (
    (0x034F, 0x034F),
    (0x115F, 0x1160),
    (0x17B4, 0x17B5),
    (0x180B, 0x180F),
    (0x2060, 0x206F),
    (0x3164, 0x3164),
    (0xFE00, 0xFE0F),
    (0xFFA0, 0xFFA0),
    (0xFFF0, 0xFFF8),
    (0xE0000, 0xE0FFF),
)

_MARKUP_CHARS: Final = frozenset("*_~`\\")


def _invisible(char: str) -> bool:
    """Whether a chat shows `char` as nothing (or as a gap a reader skips)."""
    if char.isspace() or unicodedata.category(char) == "Cf":
        return True
    point = ord(char)
    return any(low <= point <= high for low, high in _IGNORABLE_RANGES)


_ASCII_GAP_CHARS: Final = " \t\n\r\x0b\x0c\x1c\x1d\x1e\x1f"
_ASCII_GAPS: Final = re.compile(f"[{re.escape(_ASCII_GAP_CHARS)}]+")
_ASCII_GAPS_AND_MARKUP: Final = re.compile(
    f"[{re.escape(_ASCII_GAP_CHARS + ''.join(sorted(_MARKUP_CHARS)))}]+"
)


_NON_ASCII: Final = re.compile(r"[^\x00-\x7f]+")
_RUN_CACHED_CHARS: Final = 16  # longer runs (prose in another script) are folded per character


@functools.lru_cache(maxsize=4096)
def _fold_char(char: str, markup: bool) -> str:
    """What `fold` keeps of one non-ASCII character (cached: a card repeats a few glyphs)."""
    return "".join(
        piece
        for piece in unicodedata.normalize("NFKC", char)
        if not _invisible(piece) and not (markup and piece in _MARKUP_CHARS)
    )


@functools.lru_cache(maxsize=1024)
def _fold_short_run(run: str, markup: bool) -> str:
    """`_fold_run` of a short run, cached: a card's glyphs come in the same few runs (a
    status mark, a rule of box-drawing dashes)."""
    return "".join(_fold_char(char, markup) for char in run)


def _fold_run(run: str, markup: bool) -> str:
    """What `fold` keeps of a run of non-ASCII characters."""
    if len(run) <= _RUN_CACHED_CHARS:
        return _fold_short_run(run, markup)
    return "".join(_fold_char(char, markup) for char in run)


def _folded_text(text: str, *, markup: bool = False) -> str:
    """`fold(text)[0]`, without the per-character loop: every card is checked before it is
    sent, and most are ASCII with a few glyphs (a bullet, a dash, a status mark).

    ASCII gaps (and marks) go with one regular-expression pass, which `str.translate` with
    a table is several times slower at once a text holds a non-ASCII character; then each
    run of non-ASCII characters is replaced by its (cached) fold. What a fold leaves of one
    is never an ASCII gap or mark, so the order of the two passes does not matter.
    """
    text = (_ASCII_GAPS_AND_MARKUP if markup else _ASCII_GAPS).sub("", text)
    if text.isascii():
        return text
    return _NON_ASCII.sub(_fold_found_markup if markup else _fold_found, text)


def _fold_found(found: re.Match[str]) -> str:
    """`_fold_run(found.group(), False)`, as `_folded_text`'s callback for each run it
    finds (a card has a few: its status mark, a rule, a bullet), with no frame between."""
    run = found.group()
    if len(run) <= _RUN_CACHED_CHARS:
        return _fold_short_run(run, False)
    return _fold_run(run, False)


def _fold_found_markup(found: re.Match[str]) -> str:
    """`_fold_found` with `markup`."""
    run = found.group()
    if len(run) <= _RUN_CACHED_CHARS:
        return _fold_short_run(run, True)
    return _fold_run(run, True)


def fold(text: str, *, markup: bool = False) -> tuple[str, list[int]]:
    """`text` as a reader sees it joined, and for each folded character its index in `text`.

    Each character is NFKC-normalised; whitespace, format (Cf) and other default-ignorable
    characters are dropped, and with `markup` also emphasis, code and escape marks.
    """
    out: list[str] = []
    origin: list[int] = []
    for index, char in enumerate(text):
        if char.isascii():
            if char.isspace() or (markup and char in _MARKUP_CHARS):
                continue
            out.append(char)
            origin.append(index)
            continue
        for piece in unicodedata.normalize("NFKC", char):
            if not _invisible(piece) and not (markup and piece in _MARKUP_CHARS):
                out.append(piece)
                origin.append(index)
    return "".join(out), origin
