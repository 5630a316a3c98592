"""The kept wake's fields (`bridge.cluster.wakes`): only typed values are acted on."""

from __future__ import annotations

import json

import pytest

from taskcard.bridge.cluster.wakes import RelayedWake, decode_wake, encode_wake
from taskcard.bridge.config import AGENT_ID_PATTERN

WAKE = RelayedWake("worker", "/srv/agents/worker", "report:3", 3, True, "worker reported (#3)")


def fields(**changed: object) -> str:
    data = json.loads(encode_wake(WAKE))
    data.update(changed)
    return json.dumps(data)


def test_a_kept_wake_reads_back_as_written() -> None:
    assert decode_wake(encode_wake(WAKE), AGENT_ID_PATTERN.fullmatch) == WAKE


@pytest.mark.parametrize(
    "raw",
    [
        "not json",
        "[1, 2]",
        fields(agent="../lead"),
        fields(agent=7),
        fields(workdir="agents/worker"),
        fields(workdir="/srv/\0/worker"),
        fields(episode=""),
        fields(report_seq="3"),
        fields(report_seq=True),
        fields(report_seq=0),
        fields(report="yes"),
        fields(text=None),
        fields(text="x" * 20_000),
    ],
)
def test_a_member_that_is_not_a_wake_of_this_version_is_not_acted_on(raw: str) -> None:
    assert decode_wake(raw, AGENT_ID_PATTERN.fullmatch) is None
