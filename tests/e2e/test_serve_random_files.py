"""Property: whatever one agent writes into its contract files, the other agents are served.

One `taskcard serve` runs for the whole property (a subprocess, against the fake Telegram in
this test's loop); each example writes random bytes or random JSON into every contract file of
`chaos`, then publishes a new card for `good` and waits until the chat shows it. At the end
`chaos` gets valid files again and its card must appear: the fault barrier retries.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from taskcard.producers.task_card.contract import EVENT_KINDS, CardPaths, atomic_write
from tests.e2e.harness import eventually, publish
from tests.e2e.test_serve_hostile_files import GROUP, PRIVATE, setup, shows, workdir
from tests.fakes.telegram_api import FakeLimits, FakeTelegram

EXAMPLES = 12

json_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**400), max_value=10**400),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=40),
    st.sampled_from(
        [
            "0001-01-01T00:00:00+05:00",
            "9999-12-31T23:59:59-05:00",
            "2030-01-01T00:00:00Z",
            "active",
            "tc_1",
        ]
    ),
)
json_values = st.recursive(
    json_scalars,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=12), children, max_size=4)
    ),
    max_leaves=12,
)
records = st.fixed_dictionaries(
    {},
    optional={
        "ts": json_values,
        "kind": st.sampled_from(sorted(EVENT_KINDS)) | json_values,
        "id": st.text(max_size=8) | json_values,
        "source": st.sampled_from(["task_card.error", "task_card.limit"]) | json_values,
        "at": json_values,
        "extra": st.fixed_dictionaries(
            {}, optional={"state": st.sampled_from(["error", "recovered", "limit"])}
        )
        | json_values,
        "input_tokens": json_values,
        "output_tokens": json_values,
        "duration_s": json_values,
        "code": json_values,
        "name": json_values,
        "call_id": json_values,
        "text": json_values,
        "watch_id": json_values,
        "title": json_values,
        "lines": json_values,
    },
)


def _dumps(value: Any) -> bytes:
    return json.dumps(value).encode()  # NaN and Infinity stay as the non-standard literals


contents = st.one_of(
    st.binary(max_size=300),
    json_values.map(_dumps),
    records.map(_dumps),
    st.lists(records.map(_dumps) | st.binary(max_size=60), max_size=6).map(
        lambda lines: b"\n".join(lines) + b"\n"
    ),
    st.sampled_from([b"active", b"inactive", b"", b"[" * 50_000]),
)


def contract_files(workdir: Path) -> list[Path]:
    paths = CardPaths(workdir)
    return [
        paths.status,
        paths.body,
        paths.watch,
        paths.settings,
        paths.events,
        paths.events.with_name("events.jsonl.1"),
        paths.notifications,
        paths.notifications.with_name("system.jsonl.1"),
    ]


@pytest.fixture
async def fake() -> AsyncIterator[FakeTelegram]:
    async with FakeTelegram(limits=FakeLimits.unlimited()) as server:
        yield server


@pytest.mark.timeout(300)
async def test_random_contract_files_never_stop_another_agent(
    tmp_path: Path, fake: FakeTelegram
) -> None:
    serve = setup(tmp_path, fake, ["chaos"])
    chaos, good = workdir(tmp_path, "chaos"), workdir(tmp_path, "good")
    for path in contract_files(chaos):
        path.parent.mkdir(parents=True, exist_ok=True)
    counter = [0]

    def wait_for(needle: str) -> None:
        """Runs in a worker thread: the fake answers in the test's loop meanwhile."""
        deadline = time.monotonic() + 60
        while not shows(fake, PRIVATE, needle):
            assert serve.proc is not None and serve.proc.poll() is None, serve.logs[-3000:]
            assert time.monotonic() < deadline, f"good was not served {needle!r} after chaos"
            time.sleep(0.05)

    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(st.lists(contents, min_size=8, max_size=8), st.booleans())
    def chaos_then_good(data: list[bytes], append: bool) -> None:
        for path, content in zip(contract_files(chaos), data, strict=True):
            if append and path.suffix == ".jsonl":
                with path.open("ab") as log:
                    log.write(content)
            else:
                atomic_write(path, content, durable=False)
        counter[0] += 1
        publish(good, f"good round {counter[0]}")
        wait_for(f"good round {counter[0]}")

    with serve:
        publish(good, "good round 0")
        await eventually(lambda: shows(fake, PRIVATE, "good round 0"), what="the first card")
        await asyncio.to_thread(chaos_then_good)
        # Valid files again: the chaos agent's card appears, so its barrier did not stick.
        for path in contract_files(chaos):
            path.unlink(missing_ok=True)
        publish(chaos, "chaos recovered")
        await eventually(lambda: shows(fake, GROUP, "chaos recovered"), what="chaos recovered")
        assert await serve.aterminate() == 0
    assert counter[0] >= EXAMPLES
