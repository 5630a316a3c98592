"""`json_chunks`: the JSON a card's fingerprint and a request's body are made of, written as
`json.dumps` writes it with the same settings, with the C encoder or without it."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from taskcard.channels.base import json_chunks

SETTINGS: list[dict[str, Any]] = [
    {"sort_keys": True, "ensure_ascii": False},  # the fingerprint's
    {"separators": (",", ":")},  # the lean transport's body
    {},
]

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=20,
)


@pytest.mark.parametrize("kind", SETTINGS)
@settings(max_examples=300, deadline=None)
@given(value=json_values)
def test_written_as_json_dumps_writes_it(kind: dict[str, Any], value: Any) -> None:
    chunks = json_chunks(**kind)
    assert "".join(chunks([value, {"text": "é😀", "entities": [value]}], 0)) == json.dumps(
        [value, {"text": "é😀", "entities": [value]}], **kind
    )


@pytest.mark.parametrize("kind", SETTINGS)
def test_without_the_c_encoder_the_same(
    kind: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    value = {"b": [1, 2.5, None, True, "é\n"], "a": {"x": "😀"}}
    with_c = "".join(json_chunks(**kind)(value, 0))
    monkeypatch.setattr(json.encoder, "c_make_encoder", None)
    assert "".join(json_chunks(**kind)(value, 0)) == with_c == json.dumps(value, **kind)


def test_a_value_json_cannot_write_is_refused_as_by_json_dumps() -> None:
    with pytest.raises(TypeError, match="not JSON serializable"):
        json_chunks()({"a": object()}, 0)
