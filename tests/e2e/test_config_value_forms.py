"""Every integer key and every enumerated word of the configuration file, found by walking
the file's schema (a key added later is covered without editing this test), written in a
form the key does not take and checked with `taskcard config check` in a subprocess.

TOML keeps integers and floats apart, so an integer key given `2.0` is refused saying to
write it without the decimal point (and `true` saying to write a whole number), naming the
key. An enumerated word is spelt exactly: one written in another case (`events =
"Webhook"`, `view = "BOARD"`) is refused naming the spelling meant, as a time zone is. The
log level alone is taken in any case, on the command line, in the environment and here
alike (README)."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import tomlkit

from taskcard.bridge.config import ServiceConfig

from .test_cli import taskcard

Key = tuple[str | int, ...]
SCHEMA = ServiceConfig.model_json_schema()
# Keys whose refusal says what they take in words of their own (a chat id or a @username).
OWN_WORDS = {"telegram.routes[0].chat_id": "write the chat's numeric id as a whole number"}


def _kinds(node: dict[str, Any]) -> Iterator[dict[str, Any]]:
    if "$ref" in node:
        node = SCHEMA["$defs"][node["$ref"].split("/")[-1]]
    for option in node.get("anyOf", [node]):
        yield from ([option] if option is node else _kinds(option))


def leaves(node: dict[str, Any] = SCHEMA, key: Key = ()) -> Iterator[tuple[Key, dict[str, Any]]]:
    """Each key that takes a value of one kind (array items as index 0), with its schema."""
    for kind in _kinds(node):
        if kind.get("type") == "object" and "properties" in kind:
            for name, child in kind["properties"].items():
                yield from leaves(child, (*key, name))
        elif kind.get("type") == "array" and "items" in kind:
            yield from leaves(kind["items"], (*key, 0))
        else:
            yield key, kind


def dotted(key: Key) -> str:
    return "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in key)[1:]


def put(document: dict[str, Any], key: Key, value: object) -> None:
    """`value` at `key` in `document`, making the tables and arrays of tables on the way (an
    array of values holds `value` alone)."""
    if isinstance(key[-1], int):
        key, value = key[:-1], [value]
    node: Any = document
    for part, after in itertools.pairwise(key):
        if isinstance(part, int):
            node = node[0]
            continue
        node = node.setdefault(part, [{}] if isinstance(after, int) else {})
    node[key[-1]] = value


def refusals(tmp_path: Path, values: dict[Key, object]) -> dict[str, str]:
    """`config check`'s refusal of a file holding `values`, one line per key named."""
    document: dict[str, Any] = {}
    for key, value in values.items():
        put(document, key, value)
    config = tmp_path / "taskcard.toml"
    config.write_text(tomlkit.dumps(document))
    result = taskcard("config", "check", str(config))
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    lines = [line.removeprefix(f"  - {config}: ") for line in result.stderr.splitlines()[1:]]
    return {line.split(": ", 1)[0]: line for line in lines}


INTEGERS = [key for key, kind in leaves() if kind.get("type") == "integer"]
WORDS = [
    (key, kind.get("enum", [kind.get("const")]))
    for key, kind in leaves()
    if "enum" in kind or "const" in kind
]


def test_the_walk_finds_the_keys() -> None:
    assert {"watch.debounce_ms", "feishu.webhook.port", "telegram.routes[0].chat_id"} <= {
        dotted(key) for key in INTEGERS
    }
    assert {"feishu.events", "telegram.routes[0].view", "feishu.routes[0].view"} <= {
        dotted(key) for key, _ in WORDS
    }


@pytest.mark.parametrize(
    ("value", "fix"),
    [
        (2.0, "(got 2.0); write it as an integer, without a decimal point or exponent: 2"),
        (True, "(got true); write a whole number"),
    ],
)
def test_every_integer_key_refuses_a_float_or_a_boolean_naming_itself(
    tmp_path: Path, value: object, fix: str
) -> None:
    said = refusals(tmp_path, dict.fromkeys(INTEGERS, value))
    for key in map(dotted, INTEGERS):
        assert key in said, (key, said)
        assert said[key].endswith(fix) or OWN_WORDS.get(key, fix) in said[key], said[key]


def test_every_enumerated_word_in_another_case_is_refused_naming_the_spelling(
    tmp_path: Path,
) -> None:
    given: dict[Key, object] = {}
    meant: dict[str, str] = {}
    for key, choices in WORDS:
        if dotted(key) == "log_level":
            continue
        word = str(choices[-1])
        given[key] = word.upper() if word != word.upper() else word.title()
        meant[dotted(key)] = word
    said = refusals(tmp_path, given)
    assert len(meant) >= 5, meant
    for key, word in meant.items():
        assert f"did you mean {word!r}? the values are case-sensitive" in said[key], said[key]
    # A word that is none of them in any case gets the list.
    assert (
        "use one of these" in refusals(tmp_path, {("feishu", "events"): "webhok"})["feishu.events"]
    )


def test_the_log_level_is_taken_in_any_case(tmp_path: Path) -> None:
    config = tmp_path / "taskcard.toml"
    config.write_text('log_level = "Debug"\n')
    result = taskcard("config", "check", str(config))
    assert result.returncode == 0, result.stderr
