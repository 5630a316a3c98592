"""An agent run by another user than the service claims what people send it.

The workdir belongs to the agent's user and shares it with a group (mode 2770, the usual way
to let a service in). The service used to create `inbox/` and its folders 0700 and message
files 0600 as its own user, so the agent's user could not even list its inbox. Needs root,
to run the agent side as another user (`setpriv`).
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from tests.e2e.harness import ROOT, ServeProcess, activity, eventually, publish
from tests.fakes.telegram_api import FakeLimits, FakeTelegram

GROUP = -1001234567890
PERSON = 7
AGENT_UID = AGENT_GID = 4242  # a user and group no one else on the machine uses

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("setpriv") is None,
    reason="running the agent as another user needs root and setpriv",
)


@pytest.fixture
async def fake() -> AsyncIterator[FakeTelegram]:
    async with FakeTelegram(limits=FakeLimits.unlimited()) as server:
        yield server


@pytest.fixture
def shared_workdir() -> Iterator[Path]:
    """A workdir owned by the agent's user, shared with its group (2770), reachable by it
    (pytest's own temporary folders are private to the user running the tests)."""
    base = Path(tempfile.mkdtemp(prefix="tc-agent-"))
    try:
        base.chmod(0o711)
        workdir = base / "builder"
        workdir.mkdir()
        os.chown(workdir, AGENT_UID, AGENT_GID)
        workdir.chmod(0o2770)
        yield workdir
    finally:
        shutil.rmtree(base, ignore_errors=True)


def as_agent(*args: str) -> subprocess.CompletedProcess[str]:
    """`taskcard ARGS` run by the agent's user, as its host or hook would run it."""
    user = [f"--reuid={AGENT_UID}", f"--regid={AGENT_GID}", "--clear-groups"]
    return subprocess.run(
        ["setpriv", *user, sys.executable, "-m", "taskcard.bridge.cli", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "HOME": "/nonexistent"},
    )


async def test_an_agent_of_another_user_claims_its_messages_through_the_workdirs_group(
    tmp_path: Path, fake: FakeTelegram, shared_workdir: Path
) -> None:
    config = tmp_path / "taskcard.toml"
    config.write_text(
        "\n".join(
            [
                'state_dir = ".taskcard"',
                "[[agents]]",
                'id = "builder"',
                f"workdir = {json.dumps(str(shared_workdir))}",
                "[telegram]",
                'token_env = "TC_TEST_TOKEN"',
                f'api_base_url = "{fake.base_url}"',
                "poll_timeout_s = 1",
                "[[telegram.routes]]",
                f"chat_id = {GROUP}",
                'agents = ["builder"]',
                f"allowed_user_ids = [{PERSON}]",
            ]
        )
        + "\n"
    )
    activity(shared_workdir, "agent.start")
    activity(shared_workdir, "turn.start")
    publish(shared_workdir, "**compile** 1/3")

    def said(words: str) -> str | None:
        return next((m.text for m in fake.bot_messages(GROUP) if words in m.text), None)

    with ServeProcess(config, env={"TC_TEST_TOKEN": fake.token}) as serve:
        await eventually(lambda: said("compile"), what="the card")
        fake.inject_message(GROUP, "/tell builder run the slow tests too", user_id=PERSON)
        queued = shared_workdir / "inbox" / "queued"
        await eventually(
            lambda: queued.is_dir() and any(queued.glob("*.json")), what="the queued message"
        )
        for folder in ("", "queued", "taken", "cancelled", "tmp"):
            info = (shared_workdir / "inbox" / folder).stat()
            assert (stat.S_IMODE(info.st_mode), info.st_gid) == (0o2770, AGENT_GID), folder
        [message] = queued.glob("*.json")
        info = message.stat()
        assert (stat.S_IMODE(info.st_mode), info.st_gid) == (0o640, AGENT_GID)
        done = as_agent("inbox", "--workdir", str(shared_workdir), "--json")
        assert done.returncode == 0, done.stderr
        assert "run the slow tests too" in done.stdout
        await eventually(lambda: said("via inbox-cli"), what="the delivered status")
        assert await serve.aterminate() == 0


def test_an_agent_appends_to_a_log_it_may_write_but_not_read(shared_workdir: Path) -> None:
    """An activity log the agent's user may append to but not read (mode 0220, the service's
    user reading it): `taskcard activity` appended to it before the torn-line check opened it
    for reading too, then failed with "Permission denied". It appends as before."""
    logs = shared_workdir / "logs"
    logs.mkdir()
    os.chown(logs, AGENT_UID, AGENT_GID)
    events = logs / "events.jsonl"
    events.write_text('{"kind":"agent.start","at":"2026-01-01T00:00:00Z"}\n')
    os.chown(events, 0, AGENT_GID)
    events.chmod(0o220)
    done = as_agent("activity", "--workdir", str(shared_workdir), "turn.start")
    assert done.returncode == 0, done.stderr
    lines = events.read_text().splitlines()
    assert len(lines) == 2 and json.loads(lines[1])["kind"] == "turn.start"
