"""Agents that leave the fleet, end to end: what the state keeps of them, and for how long.

`taskcard serve` runs with a discovery root and a route following every agent, against the
stateful fakes of Telegram and Feishu. Agents come and go by their folders; the test reads the
state file as an operator would (`sqlite3`), and the chat as people see it.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import sqlite3
from contextlib import ExitStack, closing
from pathlib import Path

import pytest
import redis

from tests.e2e.harness import ServeProcess, eventually, notify, publish
from tests.fakes.feishu_api import FakeFeishu
from tests.fakes.telegram_api import FakeLimits, FakeTelegram

GROUP = -1001234567890
FEISHU_CHAT = "oc_churn_group"
RETIRED = "Agent retired"
# Generous: polled, never a timing assertion (a loaded machine runs two suites at once).
WAIT_S = 90.0


def config(tmp_path: Path, fake: FakeTelegram | FakeFeishu, keep_s: float) -> dict[str, str]:
    """`tmp_path/taskcard.toml`: discovery root `fleet`, one route following every agent,
    departed agents forgotten after `keep_s`; returns the secrets' environment."""
    lines = [
        'state_dir = ".taskcard"',
        f"forget_departed_after_s = {keep_s!r}",
        "[discover]",
        'roots = ["fleet"]',
    ]
    if isinstance(fake, FakeTelegram):
        lines += [
            "[telegram]",
            'token_env = "TC_TEST_TOKEN"',
            f'api_base_url = "{fake.base_url}"',
            "poll_timeout_s = 1",
            "[[telegram.routes]]",
            f"chat_id = {GROUP}",
            'agents = ["*"]',
        ]
        env = {"TC_TEST_TOKEN": fake.token}
    else:
        lines += [
            "[feishu]",
            'app_id_env = "TC_FS_APP_ID"',
            'app_secret_env = "TC_FS_APP_SECRET"',
            f'domain = "{fake.base_url}"',
            'events = "none"',
            "[[feishu.routes]]",
            f'chat_id = "{FEISHU_CHAT}"',
            'agents = ["*"]',
        ]
        env = {"TC_FS_APP_ID": fake.app_id, "TC_FS_APP_SECRET": fake.app_secret}
    (tmp_path / "taskcard.toml").write_text("\n".join(lines) + "\n")
    (tmp_path / "fleet").mkdir(exist_ok=True)
    return env


def cards(fake: FakeTelegram | FakeFeishu) -> dict[str, str]:
    """The bot's messages in the chat, by id: their text as it reads now."""
    if isinstance(fake, FakeTelegram):
        return {str(m.message_id): m.text for m in fake.bot_messages(GROUP)}
    return {m.message_id: m.text for m in fake.chat(FEISHU_CHAT) if m.msg_type == "interactive"}


def showing(fake: FakeTelegram | FakeFeishu, words: str) -> list[str]:
    """The ids of the bot's messages whose text holds `words`."""
    return [ident for ident, text in cards(fake).items() if words in text]


def kept(tmp_path: Path, agent: str) -> dict[str, int]:
    """How many rows the state file keeps for `agent`, by table (zeros left out)."""
    suffix = f"%:{agent}"
    queries = {
        "residents": ("SELECT COUNT(*) FROM residents WHERE route LIKE ?", suffix),
        "notices": ("SELECT COUNT(*) FROM notices WHERE route LIKE ?", suffix),
        "offsets": ("SELECT COUNT(*) FROM offsets WHERE agent_id = ?", agent),
        "cursors": ("SELECT COUNT(*) FROM cursors WHERE key LIKE ?", suffix),
        "owed wakes": ("SELECT COUNT(*) FROM cursors WHERE key LIKE ?", f'owed-wake:["{agent}",%'),
    }
    with closing(sqlite3.connect(tmp_path / ".taskcard" / "state.sqlite3")) as db:
        counts = {
            name: int(db.execute(sql, (arg,)).fetchone()[0]) for name, (sql, arg) in queries.items()
        }
    return {name: count for name, count in counts.items() if count}


def departed(tmp_path: Path, agent: str) -> bool:
    """Whether the state file records that `agent` left (and waits to forget it)."""
    with closing(sqlite3.connect(tmp_path / ".taskcard" / "state.sqlite3")) as db:
        query = "SELECT 1 FROM cursors WHERE key = ?"
        return db.execute(query, (f"departed:{agent}",)).fetchone() is not None


@pytest.mark.parametrize("platform", ["telegram", "feishu"])
async def test_a_departed_agent_is_forgotten_after_the_time_kept_and_a_quick_return_keeps_its_card(
    platform: str, tmp_path: Path
) -> None:
    fake: FakeTelegram | FakeFeishu
    async with FakeTelegram() if platform == "telegram" else FakeFeishu() as fake:
        await _churn(fake, tmp_path)


async def _churn(fake: FakeTelegram | FakeFeishu, tmp_path: Path) -> None:
    scout, stay = tmp_path / "fleet" / "scout", tmp_path / "fleet" / "stay"
    env = config(tmp_path, fake, keep_s=86_400.0)
    for folder, body in ((scout, "scout card"), (stay, "stay card")):
        folder.mkdir(parents=True)
        publish(folder, body)

    # Kept for a day: the agent leaves, comes back, and its card goes on in the same message.
    with ServeProcess(tmp_path / "taskcard.toml", env=env) as serve:
        await eventually(
            lambda: showing(fake, "scout card") and showing(fake, "stay card"),
            timeout_s=WAIT_S,
            what="both cards",
        )
        [first] = showing(fake, "scout card")
        notify(scout, "n-1", "error", code="renderer_failed")
        await eventually(
            lambda: kept(tmp_path, "scout").get("notices"), timeout_s=WAIT_S, what="a notice"
        )
        shutil.rmtree(scout)
        await eventually(
            lambda: RETIRED in cards(fake)[first], timeout_s=WAIT_S, what="the retired card"
        )
        await eventually(
            lambda: departed(tmp_path, "scout"), timeout_s=WAIT_S, what="the departure recorded"
        )
        assert {"residents", "offsets", "notices"} <= kept(tmp_path, "scout").keys()

        scout.mkdir()
        publish(scout, "scout is back")
        await eventually(
            lambda: "scout is back" in cards(fake)[first], timeout_s=WAIT_S, what="the same card"
        )
        await eventually(
            lambda: not departed(tmp_path, "scout"), timeout_s=WAIT_S, what="the return recorded"
        )
        assert showing(fake, "scout is back") == [first], "no second card for a quick return"
        assert showing(fake, "scout card") == []
        assert await serve.aterminate() == 0

    # Kept for 2 s. The scout leaves while the service is stopped: found at the next start.
    # It was owed a wake its inbox could not take: that goes with the rest of it.
    shutil.rmtree(scout)
    owed = {
        'owed-wake:["scout", "stay:signal:exit:1"]': json.dumps(
            {"child": "stay", "episode": "signal:exit:1", "text": "stay exited", "report": False}
            | {"withdrawn": None, "seq": 0}
        ),
        "owed-wake-tries:scout": json.dumps({"tries": 2, "due_s": 0}),
    }
    with closing(sqlite3.connect(tmp_path / ".taskcard" / "state.sqlite3")) as db, db:
        db.executemany("INSERT INTO cursors (key, value) VALUES (?, ?)", owed.items())
    assert kept(tmp_path, "scout")["owed wakes"] == 1
    env = config(tmp_path, fake, keep_s=2.0)
    with ServeProcess(tmp_path / "taskcard.toml", env=env) as serve:
        await eventually(
            lambda: kept(tmp_path, "scout") == {}, timeout_s=WAIT_S, what="the scout forgotten"
        )
        # Logged just after the write: the line may reach the pipe a moment later.
        await eventually(lambda: "forgot agent scout" in serve.logs, what="the log line")
        assert {"residents", "offsets"} <= kept(tmp_path, "stay").keys(), "a served agent keeps"

        # One that leaves while served: its card says so, then its state goes.
        [stay_card] = showing(fake, "stay card")
        shutil.rmtree(stay)
        await eventually(
            lambda: RETIRED in cards(fake)[stay_card], timeout_s=WAIT_S, what="stay retired"
        )
        await eventually(
            lambda: kept(tmp_path, "stay") == {}, timeout_s=WAIT_S, what="stay forgotten"
        )

        # Back after the time kept: a new card; the old message stays as it was.
        scout.mkdir()
        publish(scout, "scout returns late")
        await eventually(
            lambda: showing(fake, "scout returns late"), timeout_s=WAIT_S, what="a new card"
        )
        assert showing(fake, "scout returns late") != [first]
        # It left while the service was stopped: its card was marked retired at the start.
        assert RETIRED in cards(fake)[first]
        await eventually(
            lambda: kept(tmp_path, "scout").get("residents") == 1,
            timeout_s=WAIT_S,
            what="its one new resident",
        )
        assert await serve.aterminate() == 0


@pytest.mark.parametrize("platform", ["telegram", "feishu"])
async def test_an_agent_that_left_while_stopped_has_its_card_marked_retired_at_the_next_start(
    platform: str, tmp_path: Path
) -> None:
    """An agent whose folder went while the service was stopped: the next start edits its
    card to say it retired, as a departure while serving does, leaves the other agent's card
    alone, and forgets the agent `forget_departed_after_s` later (after that edit). A further
    restart does not edit the retired card again."""
    fake: FakeTelegram | FakeFeishu
    async with FakeTelegram() if platform == "telegram" else FakeFeishu() as fake:
        gone, stay = tmp_path / "fleet" / "gone", tmp_path / "fleet" / "stay"
        env = config(tmp_path, fake, keep_s=2.0)
        for folder, body in ((gone, "gone card"), (stay, "stay card")):
            folder.mkdir(parents=True)
            publish(folder, body)
        with ServeProcess(tmp_path / "taskcard.toml", env=env) as serve:
            await eventually(
                lambda: showing(fake, "gone card") and showing(fake, "stay card"),
                timeout_s=WAIT_S,
                what="both cards",
            )
            assert await serve.aterminate() == 0
        [card] = showing(fake, "gone card")
        [stay_card] = showing(fake, "stay card")
        assert RETIRED not in cards(fake)[card]

        shutil.rmtree(gone)
        with ServeProcess(tmp_path / "taskcard.toml", env=env) as serve:
            await eventually(
                lambda: RETIRED in cards(fake)[card], timeout_s=WAIT_S, what="the retired card"
            )
            assert "gone card" not in cards(fake)[card], "its body is gone with its files"
            await eventually(
                lambda: kept(tmp_path, "gone") == {}, timeout_s=WAIT_S, what="gone forgotten"
            )
            await eventually(lambda: "forgot agent gone" in serve.logs, what="the log line")
            publish(stay, "stay card v2")
            await eventually(
                lambda: "stay card v2" in cards(fake)[stay_card],
                timeout_s=WAIT_S,
                what="the other agent served on",
            )
            assert RETIRED not in cards(fake)[stay_card]
            assert len(cards(fake)) == 2, "no new message"
            assert await serve.aterminate() == 0
        shown = cards(fake)[card]

        with ServeProcess(tmp_path / "taskcard.toml", env=env) as serve:
            publish(stay, "stay card v3")
            await eventually(
                lambda: "stay card v3" in cards(fake)[stay_card],
                timeout_s=WAIT_S,
                what="served again",
            )
            assert cards(fake)[card] == shown
            assert await serve.aterminate() == 0


async def test_a_start_marks_at_most_ten_cards_a_chat_of_agents_that_left_while_stopped(
    tmp_path: Path,
) -> None:
    """Twelve agents of one group leave while the service is stopped (a root not mounted
    yet, say): the start marks the ten cards edited last as retired and leaves the other two
    as they are, said in the log, so the chat's budget goes to its live cards; the live
    agent's card is edited as usual."""
    names = [f"crew{n:02d}" for n in range(12)]
    async with FakeTelegram(limits=FakeLimits.unlimited()) as fake:
        env = config(tmp_path, fake, keep_s=86_400.0)
        toml = tmp_path / "taskcard.toml"
        toml.write_text(
            toml.read_text()
            + "[telegram.limits.group_chat]\nmax_calls = 1000\nperiod_s = 1.0\n"
            + "[telegram.limits.bot]\nmax_calls = 1000\nperiod_s = 1.0\n"
        )
        live = tmp_path / "fleet" / "live"
        for name in [*names, "live"]:
            (tmp_path / "fleet" / name).mkdir()
            publish(tmp_path / "fleet" / name, f"{name} card")
        with ServeProcess(toml, env=env) as serve:
            await eventually(
                lambda: all(showing(fake, f"{n} card") for n in [*names, "live"]),
                timeout_s=WAIT_S,
                what="every card",
            )
            # crew00 and crew01 are edited first, so they are the two edited longest ago.
            for name in names:
                publish(tmp_path / "fleet" / name, f"{name} card v2")
                await eventually(
                    lambda n=name: showing(fake, f"{n} card v2"), timeout_s=WAIT_S, what=name
                )
            assert await serve.aterminate() == 0
        ids = {name: showing(fake, f"{name} card v2")[0] for name in names}
        for name in names:
            shutil.rmtree(tmp_path / "fleet" / name)

        with ServeProcess(toml, env=env) as serve:
            await eventually(
                lambda: sum(RETIRED in cards(fake)[ids[n]] for n in names) == 10,
                timeout_s=WAIT_S,
                what="ten cards retired",
            )
            publish(live, "live card v2")
            await eventually(
                lambda: showing(fake, "live card v2"), timeout_s=WAIT_S, what="the live card"
            )
            assert [n for n in names if RETIRED not in cards(fake)[ids[n]]] == names[:2]
            assert "2 cards of agents that left while the service was stopped are left" in (
                serve.logs
            )
            assert await serve.aterminate() == 0


def redis_kept(redis_url: str, prefix: str, agent: str) -> dict[str, int]:
    """How many entries the cluster's Redis keeps for `agent`, by kind (zeros left out)."""
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    try:
        counts = {
            "residents": sum(
                r.endswith(f":{agent}") for r in client.smembers(f"{prefix}:residents")
            ),
            "resident keys": len(list(client.scan_iter(f"{prefix}:res:*:{agent}"))),
            "notices": sum(
                json.loads(m)[0].endswith(f":{agent}") for m in client.hkeys(f"{prefix}:n:text")
            ),
            "offsets": sum(json.loads(f)[0] == agent for f in client.hkeys(f"{prefix}:offsets")),
            "cursors": sum(k.endswith(f":{agent}") for k in client.hkeys(f"{prefix}:cursors")),
            "lease fence": int(client.exists(f"{prefix}:lease:agent:{agent}:fence")),
        }
    finally:
        client.close()
    return {name: count for name, count in counts.items() if count}


def keep_for(serve: ServeProcess, keep_s: float) -> None:
    """Set the instance's `forget_departed_after_s` (before it starts)."""
    serve.config.write_text(f"forget_departed_after_s = {keep_s!r}\n" + serve.config.read_text())


async def test_in_a_cluster_nothing_of_a_departed_agent_is_forgotten(
    tmp_path: Path, redis_url: str, prefix: str, fleet: ExitStack
) -> None:
    """Two instances share one Redis with one second kept. An agent whose discovered folder
    goes from one instance's fleet may still be in the other's while that one is stopped
    (its lease lapsed), which the shared state cannot tell: its resident, offsets and lease
    counter stay in Redis long after the time kept, and a return edits the same message."""
    from tests.e2e.test_cluster import instance, shown

    async with FakeTelegram() as fake:
        root = tmp_path / "fleet"
        (root / "scout").mkdir(parents=True)
        serves = {
            name: instance(tmp_path, name, fake, [f"{name}own"], redis_url=redis_url, prefix=prefix)
            for name in ("i0", "i1")
        }
        for serve in serves.values():
            keep_for(serve, 1.0)
        i0 = serves["i0"]
        i0.config.write_text(
            i0.config.read_text().replace('agents = ["i0own"]', 'agents = ["*"]')
            + f'[discover]\nroots = ["{root}"]\n'
        )
        for serve in serves.values():
            fleet.enter_context(serve)
        publish(root / "scout", "scout card")
        await eventually(
            lambda: any("scout card" in t for t in shown(fake, GROUP)),
            timeout_s=WAIT_S,
            what="the scout's card",
        )
        assert {"residents", "offsets", "lease fence"} <= redis_kept(
            redis_url, prefix, "scout"
        ).keys()
        shutil.rmtree(root / "scout")
        await eventually(
            lambda: any("scout" in t and RETIRED in t for t in shown(fake, GROUP)),
            timeout_s=WAIT_S,
            what="the scout's card retired",
        )
        # Proving that nothing happens takes a wait: three times the time kept (a slow
        # machine only makes this test miss a regression, never fail), then one of i0's own
        # edits, which goes out after its timer has run past the scout's time.
        await asyncio.sleep(3.0)
        publish(tmp_path / "agents" / "i0own", "i0own later")
        await eventually(
            lambda: any("i0own later" in t for t in shown(fake, GROUP)),
            timeout_s=WAIT_S,
            what="i0's later edit",
        )
        assert "forgot agent scout" not in i0.logs
        assert "agent scout left this instance's fleet: clustered, its state is kept" in i0.logs
        assert {"residents", "offsets", "lease fence"} <= redis_kept(
            redis_url, prefix, "scout"
        ).keys()
        (root / "scout").mkdir()
        publish(root / "scout", "scout is back")
        await eventually(
            lambda: any("scout is back" in t for t in shown(fake, GROUP)),
            timeout_s=WAIT_S,
            what="the scout back",
        )
        assert sum("scout" in t for t in shown(fake, GROUP)) == 1, "one resident, edited"
        for serve in serves.values():
            assert await serve.aterminate() == 0


async def test_agents_that_left_together_are_forgotten_a_few_a_second(tmp_path: Path) -> None:
    """25 agents leave while the service is stopped, so at the next start they all come due
    in the same second. The timer forgets at most ten a second (so cards and commands are
    not held up behind them), says so while more wait, and forgets every one in the end.
    Counted in agents per tick from the log, never timed. The agents published no card, so
    no retiring edit holds their forgetting back (a group's 20 edits a minute would)."""
    names = [f"crew{n:02d}" for n in range(25)]
    async with FakeTelegram() as fake:
        env = config(tmp_path, fake, keep_s=1.0)
        for name in names:
            (tmp_path / "fleet" / name).mkdir()
        with ServeProcess(tmp_path / "taskcard.toml", env=env) as serve:
            await eventually(
                lambda: (
                    (tmp_path / ".taskcard" / "state.sqlite3").exists()
                    and all("offsets" in kept(tmp_path, name) for name in names)
                ),
                timeout_s=WAIT_S,
                what="every agent's files read",
            )
            assert await serve.aterminate() == 0
        for name in names:
            shutil.rmtree(tmp_path / "fleet" / name)

        with ServeProcess(tmp_path / "taskcard.toml", env=env) as serve:
            await eventually(
                lambda: all(kept(tmp_path, name) == {} for name in names),
                timeout_s=WAIT_S,
                what="every agent forgotten",
            )
            await eventually(
                lambda: serve.logs.count("forgot agent crew") == len(names),
                timeout_s=WAIT_S,
                what="the log lines",
            )
            # Each tick's forgets come before its line saying that more are due.
            ticks = serve.logs.split("departed agents handled this second")
            per_tick = [tick.count("forgot agent crew") for tick in ticks]
            assert per_tick == [10, 10, 5], per_tick
            assert await serve.aterminate() == 0
