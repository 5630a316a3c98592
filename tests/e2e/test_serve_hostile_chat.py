"""One chat the platform refuses (or never answers) while `taskcard serve` runs from a
config file: the other chats keep being served, and the failure is reported clearly, once."""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Callable
from datetime import datetime
from pathlib import Path

import pytest

from taskcard.bridge.run.logs import REPEAT_INTERVAL_S
from tests.e2e.harness import ServeProcess, eventually, publish
from tests.fakes.feishu_api import FakeFeishu
from tests.fakes.telegram_api import FakeLimits, FakeTelegram

BAD = -1005550002222
GOOD = -1005550003333
PRIVATE = 424242


@pytest.fixture
async def fake() -> AsyncIterator[FakeTelegram]:
    async with FakeTelegram(limits=FakeLimits.unlimited()) as server:
        yield server


def _config(tmp_path: Path, fake: FakeTelegram) -> Path:
    (tmp_path / "agents" / "builder").mkdir(parents=True)
    config = tmp_path / "taskcard.toml"
    config.write_text(
        'state_dir = "state"\n[[agents]]\nid = "builder"\nworkdir = "agents/builder"\n'
        f'[telegram]\ntoken_env = "TC_TEST_TOKEN"\napi_base_url = "{fake.base_url}"\n'
        "poll_timeout_s = 1\nrequest_timeout_s = 2.0\nsend_timeout_s = 5.0\n"
        + "".join(
            f'[[telegram.routes]]\nchat_id = {chat}\nagents = ["builder"]\n'
            for chat in (BAD, GOOD, PRIVATE)
        )
    )
    return config


def _shown(fake: FakeTelegram, chat: int, text: str) -> bool:
    return any(text in m.text for m in fake.bot_messages(chat))


HOSTILE: dict[str, tuple[Callable[[FakeTelegram], None], str]] = {
    "chat-not-found": (
        lambda f: f.fail_chat(BAD, 400, "Bad Request: chat not found"),
        "disabled: chat not found: the bot is not in this chat, or the chat id is wrong",
    ),
    "blocked": (
        lambda f: f.fail_chat(BAD, 403, "Forbidden: bot was blocked by the user"),
        "disabled: bot was blocked by the user",
    ),
    "kicked": (
        lambda f: f.fail_chat(BAD, 403, "Forbidden: bot was kicked from the group chat"),
        "disabled: bot was kicked from the chat",
    ),
    "flood": (
        lambda f: f.fail_chat(BAD, 429, "Too Many Requests: retry after 30", {"retry_after": 30}),
        f"pausing scope telegram:chat:{BAD} for 30",
    ),
    "server-error": (
        lambda f: f.fail_chat(BAD, 500, "Internal Server Error"),
        "transient failure (Telegram unreachable or failing: Internal Server Error)",
    ),
    "bad-gateway": (
        lambda f: f.fail_chat(BAD, 502, "Bad Gateway"),
        "transient failure (Telegram unreachable or failing: Bad Gateway)",
    ),
    "timeout": (
        lambda f: f.hang_chat(BAD, 20.0),
        "transient failure (Telegram may have performed the request",
    ),
}


@pytest.mark.parametrize("kind", list(HOSTILE))
async def test_one_hostile_chat_leaves_the_others_served_and_is_reported_once(
    tmp_path: Path, fake: FakeTelegram, kind: str
) -> None:
    """One route's chat answers with an error (or never) from the first send on: the other
    two chats of the same agent get every version of the card, the one chat's failure is
    one log line naming its route and what Telegram said (not one per retry or per card
    change; a lasting one again at most once a minute), no traceback, no token, and nothing
    lands in that chat."""
    hostile, words = HOSTILE[kind]
    hostile(fake)
    workdir = tmp_path / "agents" / "builder"
    with ServeProcess(_config(tmp_path, fake), env={"TC_TEST_TOKEN": fake.token}) as serve:
        for version in ("v1", "v2", "v3"):
            publish(workdir, f"body {version}")
            for chat in (GOOD, PRIVATE):
                await eventually(
                    lambda chat=chat, version=version: _shown(fake, chat, f"body {version}"),
                    timeout_s=60,
                    what=f"{version} in {chat} while {BAD} is {kind}",
                )
        await eventually(lambda: words in serve.logs, timeout_s=60, what=f"the {kind} line")
        assert await serve.aterminate() == 0
    _said_once_per_window(serve.logs, str(BAD), f"telegram:{BAD}::builder", words)
    assert fake.token not in serve.logs
    assert not fake.bot_messages(BAD)


def _said_once_per_window(logs: str, chat: str, route: str, words: str) -> None:
    """The failing chat is said in the log naming its route and what went wrong, and a
    failure that lasts at most once per the log's repeat window (a slow run can pass it):
    never once per retry or per card change."""
    about_bad = [line for line in logs.splitlines() if chat in line]
    assert about_bad, logs
    assert route in about_bad[0] and words in about_bad[0], about_bad
    times = [datetime.fromisoformat(line.split(" ", 1)[0]) for line in about_bad]
    for before, after in itertools.pairwise(times):
        assert (after - before).total_seconds() >= REPEAT_INTERVAL_S - 1, about_bad
    assert "Traceback" not in logs


FS_BAD = "oc_hostile_chat"
FS_GOOD = ("oc_good_group", "oc_good_p2p")


@pytest.fixture
async def feishu() -> AsyncIterator[FakeFeishu]:
    async with FakeFeishu() as server:
        yield server


def _feishu_config(tmp_path: Path, fake: FakeFeishu) -> Path:
    (tmp_path / "agents" / "builder").mkdir(parents=True)
    config = tmp_path / "taskcard.toml"
    config.write_text(
        'state_dir = "state"\n[[agents]]\nid = "builder"\nworkdir = "agents/builder"\n'
        '[feishu]\napp_id_env = "TC_FS_APP_ID"\napp_secret_env = "TC_FS_APP_SECRET"\n'
        f'domain = "{fake.base_url}"\nevents = "none"\nrequest_timeout_s = 2.0\n'
        + "".join(
            f'[[feishu.routes]]\nchat_id = "{chat}"\nagents = ["builder"]\n'
            for chat in (FS_BAD, *FS_GOOD)
        )
    )
    return config


def _feishu_shown(fake: FakeFeishu, chat: str, text: str) -> bool:
    return any(text in m.text for m in fake.chat(chat) if m.msg_type == "interactive")


FEISHU_HOSTILE: dict[str, tuple[Callable[[FakeFeishu], None], str]] = {
    "bot-not-in-chat": (
        lambda f: f.fail_chat(FS_BAD, 230002, msg="The bot is not in the chat."),
        "230002",
    ),
    "chat-dissolved": (lambda f: f.dissolve_chat(FS_BAD), "232009"),
    "no-permission": (
        lambda f: f.fail_chat(FS_BAD, 230027, msg="Lack of necessary permissions"),
        "230027",
    ),
    "chat-throttled": (
        lambda f: f.fail_chat(FS_BAD, 230020, msg="This operation triggers the frequency limit"),
        f"pausing scope feishu:chat:{FS_BAD}",
    ),
    "server-error": (
        lambda f: f.fail_chat(FS_BAD, 1500, http_status=500, msg="internal error"),
        "500",
    ),
    "timeout": (lambda f: f.hang_chat(FS_BAD, 20.0), "transient failure"),
}


@pytest.mark.parametrize("kind", list(FEISHU_HOSTILE))
async def test_one_hostile_feishu_chat_leaves_the_others_served_and_is_reported_once(
    tmp_path: Path, feishu: FakeFeishu, kind: str
) -> None:
    """The same on Feishu, with the codes it documents for a chat the bot cannot reach, a
    missing permission and a chat's throttle, a server error and a send that is never
    answered. (Its 99991400 is the whole app's limit, rightly pausing every chat: not a
    one-chat failure.)"""
    hostile, words = FEISHU_HOSTILE[kind]
    hostile(feishu)
    workdir = tmp_path / "agents" / "builder"
    env = {"TC_FS_APP_ID": feishu.app_id, "TC_FS_APP_SECRET": feishu.app_secret}
    with ServeProcess(_feishu_config(tmp_path, feishu), env=env) as serve:
        for version in ("v1", "v2", "v3"):
            publish(workdir, f"body {version}")
            for chat in FS_GOOD:
                await eventually(
                    lambda chat=chat, version=version: _feishu_shown(
                        feishu, chat, f"body {version}"
                    ),
                    timeout_s=60,
                    what=f"{version} in {chat} while {FS_BAD} is {kind}",
                )
        await eventually(
            lambda: any(FS_BAD in line for line in serve.logs.splitlines()),
            timeout_s=60,
            what=f"the {kind} line",
        )
        assert await serve.aterminate() == 0
    _said_once_per_window(serve.logs, FS_BAD, f"feishu:{FS_BAD}::builder", words)
    assert feishu.app_secret not in serve.logs
    assert not feishu.chat(FS_BAD)
