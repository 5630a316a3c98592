"""The whole path a user sees: an agent starts a watch from the shell, the background host
refreshes it, `taskcard serve` projects it to Telegram, people are told when it breaks,
recovers and runs out, and `remove` leaves the card saying it stopped."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.e2e.harness import ServeProcess, eventually, run_cli
from tests.fakes.telegram_api import FakeTelegram

CHAT = 777
RENDERER = """\
from pathlib import Path
state = Path("state.txt").read_text().strip()
if state == "fail":
    raise SystemExit(3)
print(f"**deploy** state: {state}")
"""


@pytest.fixture
async def fake() -> AsyncIterator[FakeTelegram]:
    async with FakeTelegram() as server:
        yield server


def card(workdir: Path, runtime: Path, *args: str) -> dict[str, object]:
    result = run_cli(
        "card",
        *args,
        "--workdir",
        str(workdir),
        "--runtime-dir",
        str(runtime),
        "--idle-grace-s",
        "2",
        "--json",
    )
    parsed: dict[str, object] = json.loads(result.stdout)
    return parsed


def texts(fake: FakeTelegram) -> list[str]:
    return [m.text for m in fake.bot_messages(CHAT)]


async def test_watch_from_the_shell_reaches_the_chat_with_notices(
    tmp_path: Path, runtime_dir: Path, fake: FakeTelegram
) -> None:
    workdir = tmp_path / "agents" / "deployer"
    workdir.mkdir(parents=True)
    runtime = runtime_dir
    (workdir / "render.py").write_text(RENDERER)
    (workdir / "state.txt").write_text("building")
    config = tmp_path / "taskcard.toml"
    config.write_text(
        '[[agents]]\nid = "deployer"\nworkdir = "agents/deployer"\n'
        f'[telegram]\ntoken_env = "TC_TEST_TOKEN"\napi_base_url = "{fake.base_url}"\n'
        "poll_timeout_s = 1\n"
        f'[[telegram.routes]]\nchat_id = {CHAT}\nagents = ["*"]\n'
    )
    with ServeProcess(config, env={"TC_TEST_TOKEN": fake.token}) as serve:
        started = card(
            workdir, runtime, "start", "render.py", "--interval-s", "1", "--max-refreshes", "40"
        )
        assert started["status"] == "watching", started
        await eventually(lambda: any("state: building" in t for t in texts(fake)), what="card")
        resident = fake.bot_messages(CHAT)[0].message_id

        (workdir / "state.txt").write_text("fail")
        await eventually(lambda: len(texts(fake)) >= 2, what="the error notice")
        notice = texts(fake)[1]
        assert "deployer" in notice
        assert "render.py" not in notice and str(workdir) not in notice

        (workdir / "state.txt").write_text("deployed")
        await eventually(lambda: len(texts(fake)) >= 3, what="the recovery notice")
        await eventually(
            lambda: "state: deployed" in (fake.message(CHAT, resident) or _Empty).text,
            what="the recovered card",
        )

        removed = card(workdir, runtime, "remove")
        assert removed["status"] == "removed"
        await eventually(
            lambda: "stopped" in (fake.message(CHAT, resident) or _Empty).text.lower(),
            what="the card saying it stopped",
        )
        assert len([t for t in texts(fake)]) == 3, texts(fake)
        assert await serve.aterminate() == 0


class _Empty:
    text = ""
