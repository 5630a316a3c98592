"""`taskcard serve` run as a user that may not enter a folder of an agent's workdir.

A `chmod 0` on `taskcard/` (or on the workdir itself) left the service unable to look at the
files inside: each was named "is not readable by the service (permission denied); grant read
access", though the file itself was readable and granting it changed nothing. The folder the
service may not enter is named, with the fix that works. Needs root, to run the service as
another user (`setpriv`): root enters any folder.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from taskcard.producers.task_card.contract import CardPaths
from tests.e2e.harness import ServeProcess, eventually, publish, run_cli
from tests.fakes.telegram_api import FakeLimits, FakeTelegram

GROUP = -1001234567890
SERVICE_UID = SERVICE_GID = 4243  # a user and group no one else on the machine uses

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("setpriv") is None,
    reason="running the service as another user needs root and setpriv",
)


@pytest.fixture
async def fake() -> AsyncIterator[FakeTelegram]:
    async with FakeTelegram(limits=FakeLimits.unlimited()) as server:
        yield server


@pytest.fixture
def base() -> Iterator[Path]:
    """A folder the service's user can reach (pytest's own are private to root), with a
    state folder it owns."""
    folder = Path(tempfile.mkdtemp(prefix="tc-svc-"))
    try:
        folder.chmod(0o755)
        (folder / ".taskcard").mkdir()
        os.chown(folder / ".taskcard", SERVICE_UID, SERVICE_GID)
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def problems(config: Path) -> dict[str, list[str]]:
    result = run_cli("status", "--config", str(config), "--json")
    assert result.returncode == 0, result.stderr
    return {a["agent"]: a["problems"] for a in json.loads(result.stdout)["agents"]}


async def test_a_folder_the_service_may_not_enter_is_named_with_the_fix(
    base: Path, fake: FakeTelegram
) -> None:
    lines = ['state_dir = ".taskcard"']
    for agent in ("locked", "good"):
        (base / agent).mkdir()
        publish(base / agent, f"{agent} v1")
        lines += ["[[agents]]", f'id = "{agent}"', f'workdir = "{agent}"']
    lines += [
        "[telegram]",
        'token_env = "TC_TEST_TOKEN"',
        f'api_base_url = "{fake.base_url}"',
        "poll_timeout_s = 1",
        "[[telegram.routes]]",
        f"chat_id = {GROUP}",
        'agents = ["locked", "good"]',
    ]
    config = base / "taskcard.toml"
    config.write_text("\n".join(lines) + "\n")
    user = [f"--reuid={SERVICE_UID}", f"--regid={SERVICE_GID}", "--clear-groups"]
    serve = ServeProcess(
        config, env={"TC_TEST_TOKEN": fake.token, "HOME": "/nonexistent"}, prefix=["setpriv", *user]
    )

    def texts() -> list[str]:
        return [m.text for m in fake.bot_messages(GROUP)]

    folder = CardPaths(base / "locked").taskcard_dir
    row = (
        "⚠ taskcard/status: is in the folder taskcard/, which the service may not enter"
        " (permission denied); let the service's user enter it (search permission: chmod o+x,"
        " or a group both share)"
    )
    with serve:
        await eventually(
            lambda: any("locked v1" in t for t in texts()) and any("good v1" in t for t in texts()),
            what="both cards",
        )
        folder.chmod(0)
        publish(base / "locked", "locked v2")  # root writes in; the service cannot look
        await eventually(lambda: any(row in t for t in texts()), what="the folder named")
        assert "grant read access" not in "".join(problems(config)["locked"])
        publish(base / "good", "good v2")
        await eventually(lambda: any("good v2" in t for t in texts()), what="good served on")
        (base / "locked").chmod(0)  # the workdir itself
        publish(base / "locked", "locked v3")
        await eventually(
            lambda: any(
                "is in the workdir itself, which the service" in p
                for p in problems(config)["locked"]
            ),
            what="the workdir named",
        )
        (base / "locked").chmod(0o755)
        folder.chmod(0o755)
        publish(base / "locked", "locked v4")
        await eventually(
            lambda: any("locked v4" in t and "⚠" not in t for t in texts()),
            what="the card once the folders open",
        )
        assert await serve.aterminate() == 0
