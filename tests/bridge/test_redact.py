"""Secrets never reach a chat; ordinary prose and paths pass unchanged."""

from __future__ import annotations

import enum
import re
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from taskcard.bridge.compose import redact as redact_module
from taskcard.bridge.compose.redact import (
    MARKER,
    Redactor,
    _folded_text,
    fold,
    redact,
    redact_every_shape,
    strings_in,
)

SECRET_CASES = [
    ("bot 123456789:AAHdqTcvCH1vGWJxfSeofSAs0K5PALDsaw0 ok", "123456789:AAHdqTcv"),
    ("key sk-proj-abcdefghijklmnop1234567890 used", "sk-proj-abc"),
    ("OPENAI sk-ant-api03-abcdefghijklmnopqrst", "sk-ant-api03"),
    ("push with ghp_abcdefghijklmnopqrstuvwxyz0123456789", "ghp_abcdef"),
    ("github_pat_11ABCDEFG0123456789_abcdefghijklmnop", "github_pat_11ABC"),
    ("slack xoxb-123456789012-abcdefghijkl", "xoxb-1234"),
    ("aws AKIAIOSFODNN7EXAMPLE here", "AKIAIOSFODNN7EXAMPLE"),
    ("g AIzaSyA1234567890abcdefghijklmnopqrstuv", "AIzaSyA123"),
    ("Authorization: Bearer abc.def-ghi_jkl012345", "abc.def-ghi"),
    (
        "jwt eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0"
        ".dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U",
        "eyJzdWIi",
    ),
    ("password=hunter22 in the env", "hunter22"),
    ("DB_PASSWORD: s3cr3t-value", "s3cr3t-value"),
    ('{"api_key": "abcd1234efgh"}', "abcd1234efgh"),
    ("token=zzz999yyy", "zzz999yyy"),
    ("client_secret=verysecretvalue", "verysecretvalue"),
    ("clone https://alice:pa55word@example.com/repo.git", "pa55word"),
    ("db postgres://svc:Tr0ub4dor@db.internal:5432/app", "Tr0ub4dor"),
]


@pytest.mark.parametrize(("text", "secret"), SECRET_CASES)
def test_secrets_are_replaced_by_a_visible_marker(text: str, secret: str) -> None:
    result = redact(text)
    assert secret not in result
    assert MARKER in result


def test_context_around_a_secret_is_kept() -> None:
    assert redact("clone https://alice:pa55@example.com/x") == (
        f"clone https://alice:{MARKER}@example.com/x"
    )
    assert redact("password=hunter22 done") == f"password={MARKER} done"
    assert redact("Authorization: Bearer abcdefghijk") == f"Authorization: Bearer {MARKER}"


PLAIN_CASES = [
    "Running pytest on tests/bridge/test_agent.py (42 passed)",
    "/home/user/project/src/tokenizer.py:120: refactor the token counter",
    "The password policy needs review; see docs/security.md",
    "Deploying to https://example.com/app/v2 at 14:02 UTC",
    "tokens this turn: 12.3k in, 4.5k out",
    "commit 3f2a9c1d4e5b6a7c8d9e0f1a2b3c4d5e6f7a8b9c merged",
    "skip-the-secret-handling step is done",
    "ratio 12:34 and time 10:15:00",
    "Use `make check` before pushing; ask the author.",
]


@pytest.mark.parametrize("text", PLAIN_CASES)
def test_ordinary_prose_and_paths_are_unchanged(text: str) -> None:
    assert redact(text) == text


def test_redaction_is_idempotent() -> None:
    once = redact("token=abc123456 and sk-abcdefghijklmnopqrstu")
    assert redact(once) == once


URL_AND_KEY_FORMS = [
    # The Bot API URL form: the token is glued to `/bot`, no word boundary before it.
    ("GET https://api.telegram.org/bot123456789:AAHdqTcvCH1vGWJxfSeofSAs0K5PALDsaw/getMe", "AAHdq"),
    ("proxy http://10.0.0.2:8081/bot987654321:AAF-abcdefghijklmnopqrstuvwxyz01234/send", "AAF-ab"),
    ("encoded bot123456789%3AAAHdqTcvCH1vGWJxfSeofSAs0K5PALDsaw", "AAHdq"),
    ('{"encrypt_key": "9f8e7d6c5b4a"}', "9f8e7d6c5b4a"),
    ('{\\"encrypt_key\\": \\"9f8e7d6c5b4a\\"}', "9f8e7d6c5b4a"),
    ('encrypt_key = "with spaces inside"', "spaces inside"),
    ("encrypt_key: 9f8e7d6c5b4a", "9f8e7d6c5b4a"),
    ("FEISHU_ENCRYPT_KEY=9f8e7d6c5b4a", "9f8e7d6c5b4a"),
    ("verification_token=vt-0a1b2c3d", "vt-0a1b2c3d"),
    ("app_secret: 'Ab12Cd34Ef56'", "Ab12Cd34Ef56"),
    ("appSecret=Ab12Cd34Ef56", "Ab12Cd34Ef56"),
    ("signing-key = Zx98Yw76", "Zx98Yw76"),
    ("Authorization: Basic dXNlcjpwYXNzd29yZA==", "dXNlcjpw"),
]


@pytest.mark.parametrize(("text", "secret"), URL_AND_KEY_FORMS)
def test_url_and_key_value_forms_are_redacted(text: str, secret: str) -> None:
    result = redact(text)
    assert secret not in result
    assert MARKER in result


def test_a_quoted_value_keeps_its_quotes() -> None:
    assert redact('encrypt_key = "a b"') == f'encrypt_key = "{MARKER}"'


CONFIGURED = "Xq7Vb2Ln9Rt4Wm8Kc3Pz"  # an app secret has no recognisable shape


@pytest.mark.parametrize(
    "text",
    [
        f"dump: {CONFIGURED}",
        f"the value `{CONFIGURED}` in code",
        f"url https://api.example.com/bot{CONFIGURED}/getMe",
        f'json {{"x": "{CONFIGURED}"}}',
        f"glued{CONFIGURED}glued",
    ],
)
def test_configured_secret_values_are_removed_wherever_they_appear(text: str) -> None:
    redactor = Redactor([CONFIGURED])
    result = redactor(text)
    assert CONFIGURED not in result
    assert MARKER in result
    assert not redactor.leaks(result)


def test_configured_secret_spellings_cover_encodings() -> None:
    secret = 'a/b:c"d<e'
    redactor = Redactor([secret])
    for spelling in ("a%2Fb%3Ac%22d%3Ce", 'a/b:c\\"d<e', "a/b:c&quot;d&lt;e", secret):
        assert redactor.scrub(f"x {spelling} y") == f"x {MARKER} y"


def test_very_short_configured_values_are_not_searched() -> None:
    assert Redactor(["abc"])("abc abc") == "abc abc"


@pytest.mark.parametrize(
    "shown",
    [
        f"{CONFIGURED[:5]}**{CONFIGURED[5:]}**",
        f"`{CONFIGURED[:3]}`{CONFIGURED[3:]}",
        f"{CONFIGURED[:4]}~~{CONFIGURED[4:]}~~",
    ],
)
def test_a_secret_split_by_markup_still_counts_as_shown(shown: str) -> None:
    redactor = Redactor([CONFIGURED])
    assert redactor.scrub(shown) == shown  # the halves alone are not the secret...
    assert redactor.leaks(shown)  # ...but a chat shows them joined


def test_text_without_a_configured_secret_does_not_leak() -> None:
    assert not Redactor([CONFIGURED]).leaks("an ordinary card **with** `code`")


def test_a_text_shorter_than_every_secret_is_passed_only_when_folding_cannot_lengthen_it() -> None:
    """The pre-check that spares a payload's short strings (keys, entity types) holds for
    ASCII only: a compatibility glyph folds into several letters."""
    redactor = Redactor(["fifi"])
    assert redactor.leaks("fifi") and redactor.scrub("fifi") == MARKER  # exactly as long
    assert not redactor.leaks("fif") and redactor.scrub("fif") == "fif"
    assert redactor.leaks("\ufb01\ufb01")  # two ligatures, each shown as "fi"
    assert redactor.scrub("\ufb01\ufb01") == MARKER
    assert not Redactor([]).leaks(CONFIGURED)  # nothing configured: nothing to find


INVISIBLE_INSIDE = ["\u00ad", "\u2063", "\u034f", "\u200b", "\ufeff", "\u180e", "\ufe0f",
                    "\U000e0041", "\u3164", "\n", "\r\n", " ", "\t", "\u00a0",
                    "\u3000"]  # fmt: skip


@pytest.mark.parametrize(
    "gap", INVISIBLE_INSIDE, ids=[f"U+{ord(g[0]):04X}" for g in INVISIBLE_INSIDE]
)
@pytest.mark.parametrize("at", [1, 5, 11])
def test_a_secret_with_an_invisible_character_or_break_inside_is_removed(gap: str, at: int) -> None:
    redactor = Redactor([CONFIGURED])
    shown = f"before {CONFIGURED[:at]}{gap}{CONFIGURED[at:]} after"
    assert redactor.leaks(shown)
    result = redactor.scrub(shown)
    assert result == f"before {MARKER} after"
    assert not redactor.leaks(result)


def test_a_secret_in_compatibility_characters_is_removed() -> None:
    fullwidth = {ord(c): ord(c) + 0xFEE0 for c in "0123456789ABCDEFabcdef"}
    redactor = Redactor([CONFIGURED])
    shown = f"x {CONFIGURED.translate(fullwidth)} y"
    assert redactor.scrub(shown) == f"x {MARKER} y"


def test_folding_keeps_ordinary_text_apart() -> None:
    redactor = Redactor([CONFIGURED])
    assert redactor.scrub("an ordinary card with spaces") == "an ordinary card with spaces"


@given(st.text(max_size=200), st.booleans())
@settings(max_examples=300, deadline=None)
def test_the_fast_fold_sees_the_same_text_as_the_full_fold(text: str, markup: bool) -> None:
    """The check every card passes before it is sent folds by stretches and cached glyphs;
    it must see exactly what the character-by-character fold sees, for any text."""
    assert _folded_text(text, markup=markup) == fold(text, markup=markup)[0]


@pytest.mark.parametrize(
    "text",
    ["ok · 3/4 done — ✅", "\uff0a\uff0abold\uff0a\uff0a", "a\u00a0b\u200bc", "e\u0301 ﬁ ①"],
)
@pytest.mark.parametrize("markup", [False, True])
def test_the_fast_fold_agrees_on_glyphs_cards_use(text: str, markup: bool) -> None:
    assert _folded_text(text, markup=markup) == fold(text, markup=markup)[0]


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.sampled_from(
            [CONFIGURED, CONFIGURED[:5], CONFIGURED[5:], *INVISIBLE_INSIDE, *"*`~\\ﬁ１x", '"']
        ),
        max_size=6,
    ).map("".join),
    st.text(max_size=8),
    st.text(max_size=8),
)
def test_a_leak_in_a_text_is_a_leak_in_any_text_around_it(
    text: str, before: str, after: str
) -> None:
    """What the service relies on to check a payload that carries the text verbatim once,
    not the text again: both checks look for substrings of the text and of a fold made
    character by character, so wrapping a text never hides what it shows."""
    redactor = Redactor([CONFIGURED])
    if redactor.leaks(text):
        assert redactor.leaks(f"{before}{text}{after}")


# Pieces that make (or nearly make) every shape, in both cases, with the characters a
# case-insensitive pattern folds to ASCII letters: `redact` skips a pattern only when the
# text lacks a literal the pattern needs, so it must agree with running them all.
_SHAPE_PIECES = [
    *(text for text, _ in SECRET_CASES),
    "123456789", ":", "%3A", "%3a", "sk-", "gh", "p_", "github_pat_", "xoxb-", "AKIA", "ASIA",
    "AIza", "eyJ", ".", "://", "@", "user", "Bearer ", "BASIC ", "bearer", "Token", "PASSWORD",
    "api_key", "Api-Key", "secret", "cookie", "auth", "credentials", "=", ": ", '"', "'",
    "\\\"", " ", "\n", "[redacted]", "\u0130", "\u0131", "\u017f", "\u212a", "\u00b7",
    "AbCdEfGhIjKlMnOpQrStUvWxYz0123456789_-",
]  # fmt: skip


@settings(max_examples=600, deadline=None)
@given(st.lists(st.sampled_from(_SHAPE_PIECES) | st.text(max_size=3), max_size=14))
def test_the_prechecked_redaction_agrees_with_every_pattern(pieces: list[str]) -> None:
    text = "".join(pieces)
    assert redact(text) == redact_every_shape(text)


@pytest.mark.parametrize("text", [text for text, _ in SECRET_CASES] + PLAIN_CASES)
def test_the_prechecked_redaction_agrees_on_the_table(text: str) -> None:
    assert redact(text) == redact_every_shape(text)


# Texts each of which only one literal or one fold character of the pre-checks lets through
# to its pattern: dropping that literal (or character) from `redact` makes its case fail, which
# the random pieces above rarely combine (a bot token URL-encoded in a text without any `:`).
_PRECHECK_EDGES = [
    "123456789%3AAbCdEfGhIjKlMnOpQrStUvWxYz0123456789_-",
    "123456789%3aAbCdEfGhIjKlMnOpQrStUvWxYz0123456789_-",
    "header Basic dXNlcjpwYXNzd29yZA==",
    "header ba\u017fic dXNlcjpwYXNzd29yZA==",
    "header bas\u0131c dXNlcjpwYXNzd29yZA==",
    "header bas\u0130c dXNlcjpwYXNzd29yZA==",
    "credent\u0131als=abcdef",
    "pa\u017f\u017fword=hunter22",
    "api_\u212aey=abcdef123",
    "api_key=abcdef123",
    "sk-abcdefghijklmnopqrst",
    "ghp_abcdefghijklmnopqrstuvwxyz",
]


@pytest.mark.parametrize("text", _PRECHECK_EDGES)
def test_the_prechecked_redaction_agrees_at_each_literal_and_fold(text: str) -> None:
    assert redact(text) != text
    assert redact(text) == redact_every_shape(text)


def test_every_string_of_a_payload_is_found_for_the_leak_check() -> None:
    """The final check before a send looks at each string a platform receives: a secret in
    an entity's link or deep in a card's elements is found, numbers are not strings."""
    secret = "Conf1guredValue-xyz-42"
    payload = {
        "text": "all good",
        "entities": [
            {"type": "text_link", "offset": 0, "length": 3, "url": f"https://x.test/?k={secret}"}
        ],
        "card": {"elements": ({"tag": "div", "content": ["a", ("b", 7)]},)},
        "flag": True,
    }
    found = strings_in(payload)
    assert found == {
        "text", "all good", "entities", "type", "text_link", "offset", "length", "url",
        f"https://x.test/?k={secret}", "card", "elements", "tag", "div", "content", "a", "b",
        "flag",
    }  # fmt: skip
    redactor = Redactor([secret])
    assert [text for text in found if redactor.leaks(text)] == [f"https://x.test/?k={secret}"]


def test_ordinary_prose_runs_no_shape_pattern(monkeypatch: pytest.MonkeyPatch) -> None:
    """A card body is redacted twice per change, and each pattern that runs scans the whole
    text: prose holding a pattern's first letters (`through`, `task-card`, a time `12:04`, a
    link, the word `key`) lets none of them run, and still comes out unchanged."""
    ran: list[str] = []

    class Counted:
        def __init__(self, name: str, pattern: re.Pattern[str]) -> None:
            self.name, self.pattern = name, pattern

        def sub(self, *args: Any) -> str:
            ran.append(self.name)
            return self.pattern.sub(*args)

    shapes = tuple(
        (Counted(f"shape {index}", pattern), hint)
        for index, (pattern, hint) in enumerate(redact_module._PRECHECKED)
    )
    monkeypatch.setattr(redact_module, "_PRECHECKED", shapes)
    for name in ("_ASSIGNMENT", "_URL_CREDENTIALS", "_BEARER"):
        monkeypatch.setattr(redact_module, name, Counted(name, getattr(redact_module, name)))
    prose = (
        "## Migrating the orders table\n- [x] copied through shard 3 at 12:04 (task-card v2)\n"
        "- [ ] the key step: switch reads, see https://example.com/runbook#step-4\n"
        "tokens this turn: 12k in"
    )
    assert redact(prose) == prose
    assert ran == []
    assert redact(f"{prose}\ntoken=zzz999yyy") == f"{prose}\ntoken={MARKER}"
    assert ran == ["_ASSIGNMENT"]


class _Unasked:
    """A pre-check that fails the test if `redact` looks at a text with it."""

    def search(self, text: str) -> None:
        raise AssertionError(f"looked at {text!r} again")


def test_a_text_redact_gave_back_unchanged_is_answered_at_once_the_very_same_object_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The body's second pass (in the service's `Redactor`, after `compose_view`'s) costs
    nothing when the first found nothing: that very string is given back without a look. A
    text equal to it but another object, or another text, is looked at as ever."""
    body = "## Migrating\n- [x] copied through shard 3 at 12:04"
    assert redact(body) is body
    monkeypatch.setattr(redact_module, "_PRECHECKED", ((None, _Unasked()),))
    assert redact(body) is body
    with pytest.raises(AssertionError, match="looked at"):
        redact("".join([body[:5], body[5:]]))


def test_a_text_whose_redaction_shows_another_shape_is_redacted_again_by_the_service() -> None:
    """One pass of `redact` is not always final: a key hidden gives the key glued after it
    a word boundary. The service's `Redactor` passes a composed body (already redacted once)
    through `redact` again, and a changed text is never taken as finished."""
    glued = "g AIzaSyA1234567890abcdefghijklmnopqrstuvgithub_pat_11ABCDEFG0123456789_abcdefghijk"
    once = redact(glued)
    assert once == f"g {MARKER}github_pat_11ABCDEFG0123456789_abcdefghijk"
    assert redact(once) == f"g {MARKER}{MARKER}"
    assert Redactor(["configured-secret"])(redact(glued)) == f"g {MARKER}{MARKER}"
    tail = "\n" + "x" * 600  # past the redactor's memo of short texts: the other way in
    long = glued + tail
    assert Redactor(["configured-secret"])(redact(long)) == f"g {MARKER}{MARKER}{tail}"


def test_the_leak_walk_asks_no_abstract_class_question_of_plain_json(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every payload is walked before it is sent: its numbers, dicts and lists are told by
    their type, and only a value of another kind is asked whether it is a `Mapping`."""
    asked: list[object] = []

    class CountingMeta(type):
        def __instancecheck__(cls, instance: object) -> bool:
            asked.append(instance)
            return isinstance(instance, Mapping)

    class CountedMapping(metaclass=CountingMeta):
        pass

    monkeypatch.setattr(redact_module, "Mapping", CountedMapping)
    entity = {"type": "bold", "offset": 0, "length": 4, "flag": True, "none": None, "x": 1.5}
    payload = {"text": "card", "entities": [entity] * 10, "options": ({"is_disabled": True},)}
    assert strings_in(payload) == {
        "text", "card", "entities", "type", "bold", "offset", "length", "flag", "none", "x",
        "options", "is_disabled",
    }  # fmt: skip
    assert asked == []
    view = MappingProxyType({"key": ["value", 3]})
    assert strings_in({"other": view}) == {"other", "key", "value"}
    assert asked == [view]


def test_the_leak_check_of_a_payload_finds_what_each_of_its_strings_shows() -> None:
    """`leaks_in` (the check before every send) walks the payload without collecting its
    strings first, passing over the ones too short to hold a secret: it finds a secret
    wherever `leaks` of one of `strings_in` would, in a link, a key, deep in a card, in a
    string of ligatures shorter than the secret that a chat shows as it, or in the plain
    text given beside the payload; and a payload without one is clean."""
    secret = "Conf1guredValue-xyz-42"
    redactor = Redactor([secret])
    entity = {"type": "text_link", "offset": 0, "length": 3, "url": "https://x.test/"}
    clean = {
        "text": "all good",
        "entities": [entity, {"type": "bold", "offset": 1, "length": 2}],
        "card": {"elements": ({"tag": "div", "content": ["a", ("b", 7)]},)},
        "view": MappingProxyType({"key": ["value", 3]}),
        "flag": True,
        "none": None,
    }
    assert not redactor.leaks_in(clean, "all good")
    assert not Redactor([]).leaks_in({"text": secret}, secret)  # nothing configured
    leaking = [
        {**clean, "entities": [{**entity, "url": f"https://x.test/?k={secret}"}]},
        {**clean, secret: 1},
        {**clean, "card": {"elements": ({"content": ["a", ("b", f"x {secret} y")]},)}},
        {**clean, "view": MappingProxyType({"key": [f"[{secret}]"]})},
    ]
    for payload in leaking:
        assert any(redactor.leaks(text) for text in strings_in(payload)), payload
        assert redactor.leaks_in(payload), payload
    ligatures = Redactor(["fifi"])
    assert ligatures.leaks_in({"t": "\ufb01\ufb01"})  # two characters, shown as "fifi"
    assert not ligatures.leaks_in({"t": "fif"})
    assert redactor.leaks_in(clean, f"the plain text: {secret}")


def test_the_leak_check_remembers_short_keys_without_passing_over_anything_else() -> None:
    """The keys of a dict that are all short names met before are passed over in one look;
    a dict with any other key, and every value beside such keys, is still looked at, also
    a value of a subclass of `str`, a key spelled in ligatures, or a number-like wrapper."""

    class Text(str):
        pass

    class Level(enum.IntEnum):
        HIGH = 1

    secret = "Conf1guredValue-xyz-42"
    redactor = Redactor([secret])
    known = {"type": "bold", "offset": 1, "length": 2, "flag": True, "none": None}
    for _ in range(2):  # learnt, then known
        assert not redactor.leaks_in({"entities": [known, {"level": Level.HIGH}]})
    assert redactor.leaks_in({"entities": [{**known, "url": f"https://x.test/{secret}"}]})
    assert redactor.leaks_in({"entities": [{**known, "type": Text(secret)}]})
    assert redactor.leaks_in({"entities": [{**known, Text(secret): 0}]})
    assert redactor.leaks_in({"entities": [{**known, "level": Level.HIGH, "x": [secret]}]})
    # A list of such dicts (a card's entities) is passed over at once only when the walk
    # would pass over each of them: a long string, a key, a nested or wrapped value, or an
    # item that is not a dict anywhere in it, and the list is walked.
    many = [dict(known, offset=n) for n in range(60)]
    assert not redactor.leaks_in({"entities": many})
    assert redactor.leaks_in({"entities": [*many, {**known, "url": f"https://x.test/{secret}"}]})
    assert redactor.leaks_in({"entities": (*many, {**known, "type": Text(secret)})})
    assert redactor.leaks_in({"entities": [*many, {**known, "x": [secret]}]})
    assert redactor.leaks_in({"entities": [*many, {**known, "x": {"y": secret}}]})
    assert redactor.leaks_in({"entities": [*many, secret]})
    assert redactor.leaks_in({"entities": [*many, {**known, secret: 1}]})
    assert not redactor.leaks_in({"entities": [*many, {**known, "url": "https://x.test/"}]})
    ligatures = Redactor(["fifi"])
    assert not ligatures.leaks_in({"type": "bold", "t": "fif"})
    assert ligatures.leaks_in({"type": "bold", "\ufb01\ufb01": 1})  # a key shown as "fifi"
    assert not ligatures.leaks_in({"e": [{"type": "bold", "t": "fif"}] * 3})
    assert ligatures.leaks_in({"e": [{"type": "bold", "t": "fif"}, {"t": "\ufb01\ufb01"}]})
