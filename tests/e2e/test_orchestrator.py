"""A chat's orchestrator mark, through `taskcard serve` against the fake Bot API and Feishu.

The reports-and-signals spec wakes "the card that spawned it, or the last directive sent, or
the board's orchestrator mark". An agent that coordinates others it did not spawn is marked
in the route's config (`orchestrator = "lead"`) or from the chat (`/taskcard orchestrator
lead`, `/taskcard orchestrator off`); the signals of the chat's other agents that no parent
is woken by then wake it through its inbox, as a parent's wake does. The agent side is
played as the contracts say (`reports/reports.jsonl`, `lineage.json`, `inbox/queued/`).
"""

from __future__ import annotations

import json
import signal
import time
from contextlib import ExitStack
from pathlib import Path

import pytest

from taskcard.producers.task_card.contract import atomic_write, utc_now_iso
from tests.e2e.harness import ServeProcess, activity, eventually, publish, run_cli
from tests.e2e.test_cluster import instance
from tests.e2e.test_talk_and_signals import (
    FS_CHAT,
    GROUP,
    SIGNALS,
    chat_for,
    queued,
    report,
    wait_said,
    workdir,
)
from tests.fakes.feishu_api import FakeFeishu
from tests.fakes.telegram_api import FakeTelegram


@pytest.fixture(params=["telegram", "feishu"])
def platform(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def wakes_about(tmp_path: Path, woken: str, about: str) -> list[dict[str, object]]:
    """The wakes queued in `woken`'s inbox about agent `about` (in the order queued)."""
    found = []
    for path in queued(tmp_path, woken):
        entry = json.loads(path.read_text())
        if entry.get("kind") == "wake" and entry.get("from", {}).get("chat_id") == about:
            found.append(dict(entry))
    return found


def wake_texts(tmp_path: Path, woken: str, about: str, words: str = "") -> list[str]:
    """The texts of `wakes_about`, those holding `words`: an idle spell on a loaded machine
    (past the 5 s floor) may wake the orchestrator too, and the tests look for one signal."""
    texts = [str(entry["text"]) for entry in wakes_about(tmp_path, woken, about)]
    return [text for text in texts if words in text]


def spawned_by(child: Path, parent: str) -> None:
    lineage = {"parent": parent, "reason": "split", "depth": 1, "created_at": utc_now_iso()}
    atomic_write(child / "lineage.json", json.dumps(lineage).encode())


async def test_the_configured_orchestrator_is_woken_by_the_other_agents_reports(
    platform: str, tmp_path: Path
) -> None:
    """`orchestrator = "lead"`: worker's report wakes lead, with a pointer to read it; kid,
    spawned by worker, wakes its parent only; lead's own report wakes nobody."""
    async with chat_for(platform, tmp_path, ["lead", "worker", "kid"], SIGNALS) as chat:
        with chat.config.open("a") as config:  # the route's table is the file's last
            config.write('orchestrator = "lead"\n')
        lead, worker, kid = (workdir(tmp_path, a) for a in ("lead", "worker", "kid"))
        spawned_by(kid, "worker")
        publish(worker, "**migrating**")
        publish(lead, "**leading**")
        publish(kid, "**helping**")
        with chat.serve:
            await wait_said(chat, "migrating", "worker card")
            await wait_said(chat, "helping", "kid card")
            report(worker, 1, ok=True, role="reviewer", summary="suite green")
            await wait_said(chat, "worker reported (#1)", "worker's report in the chat")
            # A quiet spell on a loaded machine (idle, past the floor) may wake lead first.
            text = await eventually(
                lambda: next(
                    (t for t in wake_texts(tmp_path, "lead", "worker") if "reported" in t), None
                ),
                what="lead's wake about the report",
            )
            assert "worker reported (#1): ok, as reviewer." in text, text
            assert "suite green" in text, text
            assert "orchestrator" in text, text
            assert f"taskcard reports --workdir {worker} --after 0" in text, text
            assert f'child_workdir "{worker}" and after 0' in text, text
            # The service's pointer comes before the agent-written summary, which could end
            # with a look-alike of it.
            assert text.index("taskcard reports --workdir") < text.index("suite green"), text
            # A child of worker: its parent is woken, the orchestrator is not.
            report(kid, 1, ok=False, summary="stuck")
            await wait_said(chat, "kid reported (#1)", "kid's report in the chat")
            await eventually(
                lambda: wakes_about(tmp_path, "worker", "kid"), what="worker's wake by kid"
            )
            # The orchestrator's own report wakes nobody, itself included.
            report(lead, 1, ok=True, summary="plan ready")
            await wait_said(chat, "lead reported (#1)", "lead's report in the chat")
            assert wakes_about(tmp_path, "lead", "kid") == []
            assert wakes_about(tmp_path, "lead", "lead") == []
            # Idle without a report is a signal too: it wakes the orchestrator.
            activity(worker, "turn.start")
            activity(worker, "turn.end")
            await wait_said(chat, "declared its turn finished", "worker's idle notice")
            await eventually(
                lambda: any(
                    "declared its turn finished" in t
                    for t in wake_texts(tmp_path, "lead", "worker")
                ),
                what="lead's wake about worker's idle turn",
            )
            assert await chat.serve.aterminate() == 0


async def test_the_chat_marks_its_orchestrator_and_the_mark_survives_a_restart(
    platform: str, tmp_path: Path
) -> None:
    """`/taskcard orchestrator lead` marks lead (the board says so, `taskcard status` too),
    kept across a restart; `/taskcard orchestrator off` ends it, over the config's mark."""
    async with chat_for(platform, tmp_path, ["lead", "worker"], SIGNALS) as chat:
        lead, worker = workdir(tmp_path, "lead"), workdir(tmp_path, "worker")
        publish(worker, "**migrating**")
        publish(lead, "**leading**")
        with chat.serve:
            await wait_said(chat, "migrating", "worker card")
            await chat.say("/taskcard orchestrator")
            await wait_said(chat, "This chat has no orchestrator", "the answer without one")
            await chat.say("/taskcard orchestrator nobody")
            refused = await wait_said(chat, "AGENT is one of", "the refusal of an unknown name")
            assert "lead, worker" in refused and "nobody" not in refused, refused
            await chat.say("/taskcard orchestrator lead")
            await wait_said(chat, "lead is now this chat's orchestrator", "the mark's answer")
            await chat.say("/taskcard board")
            board = await eventually(
                lambda: next(
                    (t for t in chat.bot_texts() if "Task board" in t and "🎯" in t), None
                ),
                timeout_s=60,
                what="the board marking lead",
            )
            [lead_line] = [line for line in board.splitlines() if "🎯 orchestrator" in line]
            assert "lead" in lead_line and "worker" not in lead_line, board
            assert await chat.serve.aterminate() == 0
        status = run_cli("status", "--config", str(chat.config), "--json")
        assert status.returncode == 0, status.stderr
        routes = {r["agent"]: r for r in json.loads(status.stdout)["routes"]}
        assert routes["lead"]["chat_orchestrator"] == "lead"
        assert routes["lead"]["orchestrator"] is True
        assert routes["worker"]["orchestrator"] is False
        text = run_cli("status", "--config", str(chat.config))
        assert "the chat's orchestrator: the other agents' reports" in text.stdout, text.stdout
        with chat.restart():
            await eventually(lambda: "ready" in chat.serve.logs, timeout_s=60, what="restart")
            report(worker, 1, ok=True, summary="part 1 done")
            await wait_said(chat, "worker reported (#1)", "report 1 in the chat")
            await eventually(
                lambda: wake_texts(tmp_path, "lead", "worker", "part 1 done"),
                what="lead woken after the restart",
            )
            await chat.say("/taskcard orchestrator")
            await wait_said(chat, "This chat's orchestrator is lead", "the mark, asked")
            await chat.say("/taskcard orchestrator off")
            await wait_said(chat, "This chat has no orchestrator now", "the answer to off")
            report(worker, 2, ok=True, summary="part 2 done")
            await wait_said(chat, "worker reported (#2)", "report 2 in the chat")
            texts = wake_texts(tmp_path, "lead", "worker")
            assert not any("part 2 done" in text for text in texts), texts
            assert await chat.serve.aterminate() == 0
        status = run_cli("status", "--config", str(chat.config), "--json")
        routes = {r["agent"]: r for r in json.loads(status.stdout)["routes"]}
        assert routes["lead"]["chat_orchestrator"] is None


async def test_off_in_the_chat_wins_over_the_configured_orchestrator(tmp_path: Path) -> None:
    async with chat_for("telegram", tmp_path, ["lead", "worker"], SIGNALS) as chat:
        with chat.config.open("a") as config:
            config.write('orchestrator = "lead"\n')
        worker = workdir(tmp_path, "worker")
        publish(worker, "**migrating**")
        with chat.serve:
            await wait_said(chat, "migrating", "worker card")
            await chat.say("/taskcard orchestrator OFF")
            await wait_said(chat, "This chat has no orchestrator now", "the answer to off")
            report(worker, 1, ok=True, summary="part 1 done")
            await wait_said(chat, "worker reported (#1)", "report 1 in the chat")
            assert wake_texts(tmp_path, "lead", "worker", "reported") == []
            await chat.say("/taskcard orchestrator LEAD")  # names are matched in any case
            await wait_said(chat, "lead is now this chat's orchestrator", "the mark's answer")
            report(worker, 2, ok=True, summary="part 2 done")
            await eventually(
                lambda: wake_texts(tmp_path, "lead", "worker", "part 2 done"),
                what="lead woken again",
            )
            assert await chat.serve.aterminate() == 0


async def test_a_burst_of_reports_wakes_the_orchestrator_once_also_across_a_restart(
    tmp_path: Path,
) -> None:
    """The orchestrator's wake is the parent's: reports it has not taken yet travel in one
    wake, each with its pointer, also when the service restarts between two of them."""
    async with chat_for("telegram", tmp_path, ["lead", "worker"], SIGNALS) as chat:
        with chat.config.open("a") as config:
            config.write('orchestrator = "lead"\n')
        worker = workdir(tmp_path, "worker")
        publish(worker, "**migrating**")
        with chat.serve:
            await wait_said(chat, "migrating", "worker card")
            for seq in (1, 2):
                report(worker, seq, ok=True, summary=f"part {seq} done")
            await wait_said(chat, "worker reported (#2)", "report 2 in the chat")
            await eventually(
                lambda: wake_texts(tmp_path, "lead", "worker", "part 2 done"), what="the wake"
            )
            assert await chat.serve.aterminate() == 0
        with chat.restart():
            await eventually(lambda: "ready" in chat.serve.logs, timeout_s=60, what="restart")
            report(worker, 3, ok=True, summary="part 3 done")
            await wait_said(chat, "worker reported (#3)", "report 3 in the chat")
            await eventually(
                lambda: wake_texts(tmp_path, "lead", "worker", "part 3 done"), what="the wake"
            )
            [wake] = wake_texts(tmp_path, "lead", "worker", "reported")
            for seq in (1, 2, 3):
                assert f"(#{seq})" in wake and f"--after {seq - 1}" in wake, wake
            assert await chat.serve.aterminate() == 0


async def test_an_agent_followed_in_two_chats_wakes_each_orchestrator_once(
    tmp_path: Path,
) -> None:
    """worker is followed in two chats marking lead and boss, and in a third marking lead
    again: each is woken once per report."""
    async with FakeTelegram() as telegram:
        lines = ['state_dir = ".taskcard"', SIGNALS]
        for agent in ("lead", "boss", "worker"):
            workdir(tmp_path, agent).mkdir(parents=True)
            lines += ["[[agents]]", f'id = "{agent}"', f'workdir = "agents/{agent}"']
        lines += [
            "[telegram]",
            'token_env = "TC_TEST_TOKEN"',
            f'api_base_url = "{telegram.base_url}"',
            "poll_timeout_s = 1",
        ]
        chats = (GROUP, GROUP - 1, GROUP - 2)
        for chat_id, orchestrator in zip(chats, ("lead", "boss", "lead"), strict=True):
            lines += [
                "[[telegram.routes]]",
                f"chat_id = {chat_id}",
                'agents = ["lead", "boss", "worker"]',
                f'orchestrator = "{orchestrator}"',
            ]
        config = tmp_path / "taskcard.toml"
        config.write_text("\n".join(lines) + "\n")
        worker = workdir(tmp_path, "worker")
        publish(worker, "**migrating**")
        serve = ServeProcess(config, env={"TC_TEST_TOKEN": telegram.token})
        with serve:

            def shown(words: str) -> int:
                return sum(any(words in m.text for m in telegram.bot_messages(c)) for c in chats)

            await eventually(lambda: shown("migrating") == 3, timeout_s=60, what="three cards")
            report(worker, 1, ok=True, summary="done")
            await eventually(
                lambda: shown("worker reported") == 3, timeout_s=60, what="the three notices"
            )
            await eventually(
                lambda: wake_texts(tmp_path, "boss", "worker", "reported"), what="boss's wake"
            )
            assert len(wake_texts(tmp_path, "lead", "worker", "reported")) == 1
            assert len(wake_texts(tmp_path, "boss", "worker", "reported")) == 1
            assert await serve.aterminate() == 0


async def test_clustered_the_orchestrator_is_woken_once(
    tmp_path: Path, telegram: FakeTelegram, redis_url: str, prefix: str, fleet: ExitStack
) -> None:
    """Two instances share Redis and both route lead and worker (each serves one): the mark
    given in the chat reaches both, and worker's report wakes lead once."""
    agents = ["lead", "worker"]
    serves = [
        fleet.enter_context(
            instance(tmp_path, name, telegram, agents, redis_url=redis_url, prefix=prefix)
        )
        for name in ("i0", "i1")
    ]
    lead, worker = workdir(tmp_path, "lead"), workdir(tmp_path, "worker")
    publish(lead, "**leading**")
    publish(worker, "**migrating**")

    def said(words: str) -> list[str]:
        return [m.text for m in telegram.bot_messages(GROUP) if words in m.text]

    await eventually(lambda: said("migrating") and said("leading"), timeout_s=60, what="cards")
    telegram.inject_message(GROUP, "/taskcard orchestrator lead", user_id=7)
    await eventually(
        lambda: said("lead is now this chat's orchestrator"), timeout_s=60, what="the answer"
    )
    report(worker, 1, ok=True, summary="part 1 done")
    await eventually(lambda: said("worker reported (#1)"), timeout_s=60, what="the notice")
    await eventually(
        lambda: wake_texts(tmp_path, "lead", "worker", "part 1 done"), what="lead's wake"
    )
    assert len(said("lead is now this chat's orchestrator")) == 1
    assert len(wake_texts(tmp_path, "lead", "worker", "part 1 done")) == 1
    for serve in serves:
        assert await serve.aterminate() == 0
    assert len(wake_texts(tmp_path, "lead", "worker", "part 1 done")) == 1


async def test_clustered_an_orchestrator_another_instance_serves_is_woken_through_redis(
    tmp_path: Path, telegram: FakeTelegram, redis_url: str, prefix: str, fleet: ExitStack
) -> None:
    """i0 routes only worker, i1 only lead, its route marking lead: worker's report, seen by
    i0, wakes lead through Redis, once, with the pointer i1 builds. With i1 stopped, the next
    report waits in Redis, and joins the first (not taken yet) in one wake once i1 is back."""
    from redis import Redis

    i0 = fleet.enter_context(
        instance(tmp_path, "i0", telegram, ["worker"], redis_url=redis_url, prefix=prefix)
    )
    i1 = fleet.enter_context(
        instance(
            tmp_path, "i1", telegram, ["lead"], redis_url=redis_url, prefix=prefix,
            limits='orchestrator = "lead"',
        )
    )  # fmt: skip
    lead, worker = workdir(tmp_path, "lead"), workdir(tmp_path, "worker")
    publish(lead, "**leading**")
    publish(worker, "**migrating**")

    def said(words: str) -> list[str]:
        return [m.text for m in telegram.bot_messages(GROUP) if words in m.text]

    def reports_woken() -> list[str]:
        return wake_texts(tmp_path, "lead", "worker", "reported")

    await eventually(lambda: said("migrating") and said("leading"), timeout_s=60, what="cards")
    with Redis.from_url(redis_url, decode_responses=True) as client:
        # i1 notes at its lease renewals that it serves the chat's orchestrator.
        await eventually(
            lambda: client.keys(f"{prefix}:orchestrated:*"), timeout_s=60, what="lead served"
        )
    report(worker, 1, ok=True, summary="part 1 done")
    await eventually(lambda: said("worker reported (#1)"), timeout_s=60, what="the notice")
    [text] = await eventually(reports_woken, timeout_s=60, what="lead's wake through Redis")
    assert "part 1 done" in text, text
    assert f"taskcard reports --workdir {worker} --after 0" in text, text
    assert text.index("taskcard reports --workdir") < text.index("part 1 done"), text
    assert wake_texts(tmp_path, "worker", "lead") == []
    assert await i1.aterminate() == 0
    report(worker, 2, ok=True, summary="part 2 done")
    await eventually(lambda: said("worker reported (#2)"), timeout_s=60, what="the notice")
    assert reports_woken() == [text]  # nobody serves lead: the wake waits in Redis
    again = fleet.enter_context(ServeProcess(i1.config, env=i1.env))
    await eventually(
        lambda: any("part 2 done" in t for t in reports_woken()),
        timeout_s=60,
        what="lead woken once its instance is back",
    )
    [both] = reports_woken()  # one wake carries both reports lead has not taken yet
    for seq in (1, 2):
        assert f"(#{seq})" in both and f"--after {seq - 1}" in both, both
    for serve in (i0, again):
        assert await serve.aterminate() == 0
    assert reports_woken() == [both]


async def test_clustered_another_instances_route_mark_wakes_the_agent_served_here(
    tmp_path: Path, telegram: FakeTelegram, redis_url: str, prefix: str, fleet: ExitStack
) -> None:
    """i0 routes its agents (worker, and any it discovers) to the chat, its route marking
    lead, an agent only i1 has (and routes there, with no mark of its own). i0 keeps
    worker's wake in Redis for the chat's orchestrator; i1 counted only its own routes'
    marks, so it never took it, and lead was never woken though `/taskcard` named it. Now
    i1 takes the other instances' route marks into account: lead is woken through Redis."""
    from redis import Redis

    i0 = instance(
        tmp_path, "i0", telegram, ["worker"], redis_url=redis_url, prefix=prefix,
        limits='orchestrator = "lead"',
    )  # fmt: skip
    # i0 discovers agents (none under its root) and routes them all: its route may name an
    # agent it does not know.
    found = tmp_path / "i0" / "found"
    found.mkdir()
    text = i0.config.read_text().replace('agents = ["worker"]', 'agents = ["*"]')
    i0.config.write_text(f"{text}[discover]\nroots = [{json.dumps(str(found))}]\n")
    fleet.enter_context(i0)
    fleet.enter_context(
        instance(tmp_path, "i1", telegram, ["lead"], redis_url=redis_url, prefix=prefix)
    )
    lead, worker = workdir(tmp_path, "lead"), workdir(tmp_path, "worker")
    publish(lead, "**leading**")
    publish(worker, "**migrating**")

    def said(words: str) -> list[str]:
        return [m.text for m in telegram.bot_messages(GROUP) if words in m.text]

    await eventually(lambda: said("migrating") and said("leading"), timeout_s=60, what="cards")
    with Redis.from_url(redis_url, decode_responses=True) as client:
        # i1 notes at its lease renewals that it serves the chat's orchestrator.
        await eventually(
            lambda: client.keys(f"{prefix}:orchestrated:*"), timeout_s=60, what="lead served"
        )
    report(worker, 1, ok=True, summary="part 1 done")
    await eventually(lambda: said("worker reported (#1)"), timeout_s=60, what="the notice")
    [text] = await eventually(
        lambda: wake_texts(tmp_path, "lead", "worker", "part 1 done"),
        timeout_s=60,
        what="lead's wake through Redis",
    )
    assert f"taskcard reports --workdir {worker} --after 0" in text, text


async def test_clustered_status_gives_the_clusters_orchestrator(
    tmp_path: Path, telegram: FakeTelegram, redis_url: str, prefix: str, fleet: ExitStack,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """i0 routes i0agent, i1 routes i1agent, its route marking it. `taskcard status` with
    i0's config worked the chat's orchestrator out from that config alone: none, though
    the chat's answers (and i1) say i1agent. Now, the config naming Redis, it reads the
    live instances' routes there, as the answers do."""
    from redis import Redis

    serves = [
        fleet.enter_context(
            instance(
                tmp_path, name, telegram, [f"{name}agent"], redis_url=redis_url, prefix=prefix,
                limits='orchestrator = "i1agent"' if name == "i1" else "",
            )
        )
        for name in ("i0", "i1")
    ]  # fmt: skip
    with Redis.from_url(redis_url, decode_responses=True) as client:
        await eventually(
            lambda: len(client.keys(f"{prefix}:routed:*")) == 2, timeout_s=60, what="routes"
        )
    monkeypatch.setenv("TC_REDIS_URL", redis_url)
    status = run_cli("status", "--config", str(serves[0].config), "--json")
    assert status.returncode == 0, status.stderr
    [route] = [r for r in json.loads(status.stdout)["routes"] if r["agent"] == "i0agent"]
    assert route["chat_orchestrator"] == "i1agent", route
    assert route["orchestrator"] is False
    assert route["orchestrator_choice_set_aside"] is None
    # The chat's choice of i1agent, which i0's routes do not follow, is not set aside.
    telegram.inject_message(GROUP, "/taskcard orchestrator off", user_id=7)
    telegram.inject_message(GROUP, "/taskcard orchestrator i1agent", user_id=7)
    await eventually(
        lambda: [
            m for m in telegram.bot_messages(GROUP) if "now this chat's orchestrator" in m.text
        ],
        timeout_s=60,
        what="the choice answered",
    )
    status = run_cli("status", "--config", str(serves[0].config), "--json")
    [route] = [r for r in json.loads(status.stdout)["routes"] if r["agent"] == "i0agent"]
    assert route["chat_orchestrator"] == "i1agent", route
    assert route["orchestrator_choice_set_aside"] is None, route


async def test_clustered_a_choice_of_another_instances_agent_is_not_set_aside(
    tmp_path: Path, telegram: FakeTelegram, redis_url: str, prefix: str, fleet: ExitStack
) -> None:
    """i0 routes worker and helper, its route marking helper; i1 routes lead, which the chat
    chooses. i0 follows no lead, and set the choice aside as if the chat no longer followed
    it: worker's report woke helper, while the answers and the board said lead."""
    from redis import Redis

    i0 = fleet.enter_context(
        instance(
            tmp_path, "i0", telegram, ["worker", "helper"], redis_url=redis_url, prefix=prefix,
            limits='orchestrator = "helper"',
        )
    )  # fmt: skip
    i1 = fleet.enter_context(
        instance(tmp_path, "i1", telegram, ["lead"], redis_url=redis_url, prefix=prefix)
    )
    for agent in ("lead", "worker", "helper"):
        publish(workdir(tmp_path, agent), f"**{agent} card**")

    def said(words: str) -> list[str]:
        return [m.text for m in telegram.bot_messages(GROUP) if words in m.text]

    await eventually(
        lambda: all(said(f"{agent} card") for agent in ("lead", "worker", "helper")),
        timeout_s=60,
        what="cards",
    )
    # Both instances know lead is routed in the cluster before the chat chooses it.
    with Redis.from_url(redis_url, decode_responses=True) as client:
        await eventually(
            lambda: len(client.keys(f"{prefix}:routed:*")) == 2, timeout_s=60, what="routes"
        )
        telegram.inject_message(GROUP, "/taskcard orchestrator lead", user_id=7)
        await eventually(
            lambda: said("lead is now this chat's orchestrator"), timeout_s=60, what="answer"
        )
        await eventually(
            lambda: client.keys(f"{prefix}:orchestrated:*"), timeout_s=60, what="lead served"
        )
    report(workdir(tmp_path, "worker"), 1, ok=True, summary="part 1 done")
    await eventually(lambda: said("worker reported (#1)"), timeout_s=60, what="the notice")
    await eventually(
        lambda: wake_texts(tmp_path, "lead", "worker", "part 1 done"),
        timeout_s=60,
        what="lead's wake through Redis",
    )
    assert wake_texts(tmp_path, "helper", "worker") == []
    for serve in (i0, i1):
        assert await serve.aterminate() == 0
    assert wake_texts(tmp_path, "helper", "worker") == []


@pytest.mark.parametrize(
    ("channel", "route"),
    [
        ("telegram", f"[[telegram.routes]]\nchat_id = {GROUP}"),
        ("feishu", '[[feishu.routes]]\nchat_id = "oc_fleet_group"'),
    ],
)
def test_an_orchestrator_the_route_does_not_follow_is_refused_naming_the_field(
    channel: str, route: str, tmp_path: Path
) -> None:
    section = (
        '[telegram]\ntoken_env = "TC_TEST_TOKEN"'
        if channel == "telegram"
        else '[feishu]\nevents = "none"'
    )
    lines = ['state_dir = ".taskcard"']
    for agent in ("lead", "worker", "other"):
        workdir(tmp_path, agent).mkdir(parents=True)
        lines += ["[[agents]]", f'id = "{agent}"', f'workdir = "agents/{agent}"']
    lines += [section, route, 'agents = ["lead", "worker"]', 'orchestrator = "other"']
    config = tmp_path / "taskcard.toml"
    config.write_text("\n".join(lines) + "\n")
    checked = run_cli("config", "check", str(config))
    assert checked.returncode == 2, checked.stdout
    assert f"{channel}.routes[0].orchestrator" in checked.stderr, checked.stderr
    assert "'other' is not one of the route's agents ('lead', 'worker')" in checked.stderr
    served = run_cli("serve", "--config", str(config))
    assert served.returncode == 2, served.stdout
    assert f"{channel}.routes[0].orchestrator" in served.stderr, served.stderr
    # Under "*", any configured agent; an unknown one is named.
    config.write_text(config.read_text().replace('["lead", "worker"]', '["*"]'))
    assert run_cli("config", "check", str(config)).returncode == 0
    config.write_text(config.read_text().replace('r = "other"', 'r = "ghost"'))
    checked = run_cli("config", "check", str(config))
    assert checked.returncode == 2
    assert f"{channel}.routes[0].orchestrator: unknown agent 'ghost'" in checked.stderr


async def test_only_a_person_allowed_on_every_route_of_the_chat_changes_its_orchestrator(
    platform: str, tmp_path: Path
) -> None:
    """The chat's route lets only PERSON command lead and worker; a turn from the chat opened
    helper's route there, which anyone may command. A member not on `allowed_user_ids` is
    let in by helper's route alone: the mark is the whole chat's, so they may ask which
    agent it is but not change it (`off`, or helper, whom worker's reports would then wake)."""
    async with chat_for(platform, tmp_path, ["lead", "worker", "helper"], SIGNALS) as chat:
        text = chat.config.read_text()
        text = text.replace('agents = ["lead", "worker", "helper"]', 'agents = ["lead", "worker"]')
        chat_id = GROUP if platform == "telegram" else FS_CHAT
        section = "poll_timeout_s = 1\n" if platform == "telegram" else 'events = "webhook"\n'
        shown = json.dumps([chat_id])
        text = text.replace(section, f"{section}origin_chats = {shown}\n")
        chat.config.write_text(text + 'orchestrator = "lead"\n')
        worker, helper = workdir(tmp_path, "worker"), workdir(tmp_path, "helper")
        publish(worker, "**migrating**")
        publish(helper, "**helping**")
        activity(helper, "turn.start", origin=f"{platform}:{chat_id}")
        with chat.serve:
            await wait_said(chat, "migrating", "worker card")
            await wait_said(chat, "helping", "helper card, its route opened by a turn")
            stranger = 99
            await chat.say("/taskcard orchestrator helper", user=stranger)
            await chat.say("/taskcard orchestrator off", user=stranger)
            await wait_said(chat, "Only a person allowed to command every agent", "refusal")
            await chat.say("/taskcard orchestrator", user=stranger)
            await wait_said(chat, "This chat's orchestrator is lead", "the mark, asked")
            texts = chat.bot_texts()
            assert not any("now this chat's orchestrator" in t for t in texts), texts
            assert not any("no orchestrator now" in t for t in texts), texts
            report(worker, 1, ok=True, summary="part 1 done")
            await eventually(
                lambda: wake_texts(tmp_path, "lead", "worker", "part 1 done"),
                what="lead still woken",
            )
            assert wake_texts(tmp_path, "helper", "worker") == []
            assert await chat.serve.aterminate() == 0


async def test_an_orchestrator_forgotten_as_departed_is_not_marked_when_it_returns(
    tmp_path: Path,
) -> None:
    """The chat marks lead; lead leaves the fleet and is forgotten (`forget_departed_after_s`):
    back later it is a new agent, whom the chat's old choice must not mark again, so
    worker's reports do not wake it (they did, and the board marked it, though `/taskcard
    orchestrator` had said the chat had none while lead was away)."""
    async with chat_for("telegram", tmp_path, ["lead", "worker"], SIGNALS) as chat:
        full = "forget_departed_after_s = 2\n" + chat.config.read_text()
        chat.config.write_text(full)
        lead_entry = '[[agents]]\nid = "lead"\nworkdir = "agents/lead"\n'
        without_lead = full.replace(lead_entry, "").replace(
            'agents = ["lead", "worker"]', 'agents = ["worker"]'
        )
        assert without_lead != full and lead_entry not in without_lead
        publish(workdir(tmp_path, "worker"), "**migrating**")
        with chat.serve:
            await wait_said(chat, "migrating", "worker card")
            await chat.say("/taskcard orchestrator lead")
            await wait_said(chat, "lead is now this chat's orchestrator", "the mark's answer")
            chat.config.write_text(without_lead)
            chat.serve.proc.send_signal(signal.SIGHUP)
            await eventually(lambda: "forgot agent lead" in chat.serve.logs, what="lead forgotten")
            chat.config.write_text(full)
            chat.serve.proc.send_signal(signal.SIGHUP)
            publish(workdir(tmp_path, "lead"), "**back anew**")
            await wait_said(chat, "back anew", "lead's new card")
            report(workdir(tmp_path, "worker"), 1, ok=True, summary="part 1 done")
            await wait_said(chat, "worker reported (#1)", "the report in the chat")
            await chat.say("/taskcard orchestrator")
            await wait_said(chat, "This chat has no orchestrator.", "the mark, asked")
            assert wake_texts(tmp_path, "lead", "worker") == []
            assert await chat.serve.aterminate() == 0


async def test_a_choice_of_an_agent_the_chat_no_longer_follows_lets_the_config_mark_apply(
    platform: str, tmp_path: Path
) -> None:
    """The route marks lead; the chat chooses helper; a reload takes helper's route away.
    The choice is set aside while the chat does not follow helper: lead is the orchestrator
    again (the chat's answer and `taskcard status` say why), woken by worker's report; the
    choice marked nobody and kept the route's mark from applying. helper routed again (the
    first file, at a restart), the chat's choice applies again."""
    async with chat_for(platform, tmp_path, ["lead", "worker", "helper"], SIGNALS) as chat:
        full = chat.config.read_text() + 'orchestrator = "lead"\n'
        chat.config.write_text(full)
        without_helper = full.replace(
            'agents = ["lead", "worker", "helper"]', 'agents = ["lead", "worker"]'
        )
        assert without_helper != full
        worker = workdir(tmp_path, "worker")
        publish(worker, "**migrating**")
        with chat.serve:
            await wait_said(chat, "migrating", "worker card")
            await chat.say("/taskcard orchestrator helper")
            await wait_said(chat, "helper is now this chat's orchestrator", "the mark's answer")
            chat.config.write_text(without_helper)
            chat.serve.proc.send_signal(signal.SIGHUP)
            await eventually(
                lambda: chat.serve.logs.count("config reloaded") == 1, what="the reload"
            )
            await chat.say("/taskcard orchestrator")
            answer = await wait_said(chat, "This chat's orchestrator is lead", "the mark, asked")
            assert "The chat chose helper, which it no longer follows" in answer, answer
            report(worker, 1, ok=True, summary="part 1 done")
            await eventually(
                lambda: wake_texts(tmp_path, "lead", "worker", "part 1 done"),
                what="lead woken by the route's mark",
            )
            assert await chat.serve.aterminate() == 0
        status = run_cli("status", "--config", str(chat.config), "--json")
        assert status.returncode == 0, status.stderr
        routes = {r["agent"]: r for r in json.loads(status.stdout)["routes"]}
        assert routes["lead"]["chat_orchestrator"] == "lead"
        assert routes["lead"]["orchestrator_choice_set_aside"] == "helper"
        text = run_cli("status", "--config", str(chat.config)).stdout
        assert text.count("the chat chose helper as its orchestrator") == 1, text
        assert "the route's orchestrator setting applying" in text, text
        chat.config.write_text(full)
        with chat.restart():
            await eventually(lambda: "ready" in chat.serve.logs, timeout_s=60, what="restart")
            await chat.say("/taskcard orchestrator")
            await wait_said(chat, "This chat's orchestrator is helper", "the choice again")
            report(worker, 2, ok=True, summary="part 2 done")
            await eventually(
                lambda: wake_texts(tmp_path, "helper", "worker", "part 2 done"),
                what="helper woken again",
            )
            assert wake_texts(tmp_path, "lead", "worker", "part 2 done") == []
            assert await chat.serve.aterminate() == 0


async def test_clustered_the_answers_name_agents_and_marks_other_instances_route(
    platform: str, telegram: FakeTelegram, feishu: FakeFeishu, tmp_path: Path, redis_url: str,
    prefix: str, fleet: ExitStack,
) -> None:  # fmt: skip
    """i0 routes only i0agent, i1 only i1agent, its route marking i1agent; i0 answers every
    command (its claim on their replies is taken for it in Redis). It answered from its own
    routes alone: no orchestrator, a state without i1agent, and `/taskcard orchestrator
    i1agent` refused listing i0agent only. Now it answers for the whole cluster, and the
    choice reaches i1 too; a `/tell` to i1agent reaches it, one to nobody lists both."""
    from redis import Redis

    stream, first = f"{prefix}:cmd:{platform}", 9_000_000_000_000
    with Redis.from_url(redis_url, decode_responses=True) as client:
        # An entry from before the start (never read) fixes the ids of the commands.
        client.xadd(stream, {"command": "{}"}, id=f"{first}-0")
    mark = 'orchestrator = "i1agent"'
    if platform == "telegram":
        for name, limits in (("i0", ""), ("i1", mark)):
            fleet.enter_context(
                instance(
                    tmp_path, name, telegram, [f"{name}agent"], redis_url=redis_url,
                    prefix=prefix, limits=limits,
                )
            )  # fmt: skip
        folders = {name: tmp_path / "agents" / f"{name}agent" for name in ("i0", "i1")}

        def texts() -> list[str]:
            return [m.text for m in telegram.bot_messages(GROUP)]

        async def say(text: str) -> None:
            telegram.inject_message(GROUP, text, user_id=7)

    else:
        from tests.e2e.test_cluster import feishu_instance
        from tests.e2e.test_serve_feishu import CHAT, ENCRYPT, VERIFY

        setups = [
            feishu_instance(tmp_path, name, feishu, redis_url=redis_url, prefix=prefix)
            for name in ("i0", "i1")
        ]
        routed = 'agents = ["*"]'
        setups[1].config.write_text(
            setups[1].config.read_text().replace(routed, f"{routed}\n{mark}")
        )
        for setup in setups:
            fleet.enter_context(setup.serve())
        folders = {name: tmp_path / name / "agents" / f"{name}agent" for name in ("i0", "i1")}

        def texts() -> list[str]:
            return [m.text for m in feishu.chat(CHAT)]

        async def say(text: str) -> None:
            event = feishu.command_event(CHAT, text, verification_token=VERIFY)
            delivered = await feishu.deliver_event(setups[0].url, event, encrypt_key=ENCRYPT)
            assert delivered.status == 200

    for name, folder in folders.items():
        publish(folder, f"card of {name}")

    def said(words: str) -> list[str]:
        return [text for text in texts() if words in text]

    await eventually(lambda: said("card of i0") and said("card of i1"), timeout_s=60, what="cards")
    with Redis.from_url(redis_url, decode_responses=True) as client:
        owners = await eventually(
            lambda: (found := client.zrange(f"{prefix}:instances", 0, -1)) and len(found) == 2
            and found,
            timeout_s=60,
            what="both instances listed",
        )  # fmt: skip
        [i0, i1] = sorted(owners)
        # What i1 routes (and marks) is shared at its lease renewals.
        await eventually(
            lambda: client.exists(f"{prefix}:routed:{i1}"), timeout_s=60, what="i1's routes"
        )
        for seq in range(1, 8):
            client.set(f"{prefix}:reply:{platform}:{first}-{seq}", i0, ex=600)

    async def ask(text: str, answer: str) -> str:
        before = len(said(answer))
        await say(text)
        found = await eventually(
            lambda: said(answer)[before:], timeout_s=60, what=f"{text!r} answered"
        )
        return str(found[0])

    asked = await ask("/taskcard orchestrator", "orchestrator is i1agent")
    assert "set aside" not in asked, asked
    state = await ask("/taskcard", "• i1agent (orchestrator): served by another instance")
    assert "• i0agent:" in state, state
    await ask("/taskcard orchestrator off", "no orchestrator now")
    await ask("/taskcard orchestrator I1AGENT", "i1agent is now this chat's orchestrator")
    asked = await ask("/taskcard orchestrator", "orchestrator is i1agent")
    assert "set aside" not in asked, asked
    await ask("/tell nobody hello", "AGENT is one of i0agent, i1agent")
    await say("/tell i1agent look at the logs")
    inbox = folders["i1"] / "inbox" / "queued"
    [queued] = await eventually(lambda: list(inbox.glob("*.json")), what="the text in i1's inbox")
    assert "look at the logs" in queued.read_text()
    await eventually(lambda: said("✉ Message to i1agent"), what="its status message")
    assert not said("has no orchestrator.") and not said("AGENT is one of i0agent."), texts()
    assert len(said("orchestrator is i1agent")) == 2, texts()  # answered once each
    assert len(said("now this chat's orchestrator")) == 1, texts()


async def test_clustered_the_board_marks_an_orchestrator_another_instance_serves(
    platform: str, telegram: FakeTelegram, feishu: FakeFeishu, tmp_path: Path, redis_url: str,
    prefix: str, fleet: ExitStack,
) -> None:  # fmt: skip
    """The chat shows one board, sent by i0 (started first, it holds the board's lease); i1
    routes i1agent there, its route marking i1agent. i0's board marks i1agent's line, as
    the route says, and again once `/taskcard orchestrator i1agent` chose it after `off`:
    i0 knew no route setting, and took the choice for one of an agent the chat no longer
    follows, marking nobody."""
    marks = {"i0": "", "i1": 'orchestrator = "i1agent"'}
    if platform == "telegram":

        def start(name: str) -> Path:
            fleet.enter_context(
                instance(
                    tmp_path, name, telegram, [f"{name}agent"], redis_url=redis_url,
                    prefix=prefix, view="board", limits=marks[name],
                )
            )  # fmt: skip
            return tmp_path / "agents" / f"{name}agent"

        def boards() -> list[str]:
            return [m.text for m in telegram.bot_messages(GROUP) if "i0agent" in m.text]

        async def say(text: str) -> None:
            telegram.inject_message(GROUP, text, user_id=7)

    else:
        from tests.e2e.test_cluster import feishu_instance
        from tests.e2e.test_serve_feishu import CHAT, ENCRYPT, VERIFY, card_texts

        urls: list[str] = []

        def start(name: str) -> Path:
            setup = feishu_instance(tmp_path, name, feishu, redis_url=redis_url, prefix=prefix)
            routed = 'agents = ["*"]'
            setup.config.write_text(
                setup.config.read_text().replace(routed, f'{routed}\nview = "board"\n{marks[name]}')
            )
            fleet.enter_context(setup.serve())
            urls.append(setup.url)
            return tmp_path / name / "agents" / f"{name}agent"

        def boards() -> list[str]:
            return [text for text in card_texts(feishu) if "i0agent" in text]

        async def say(text: str) -> None:
            event = feishu.command_event(CHAT, text, verification_token=VERIFY)
            delivered = await feishu.deliver_event(urls[0], event, encrypt_key=ENCRYPT)
            assert delivered.status == 200

    publish(start("i0"), "card of i0")
    await eventually(boards, timeout_s=60, what="i0's board")
    publish(start("i1"), "card of i1")
    await eventually(
        lambda: any("card of i1" in board for board in boards()), timeout_s=60, what="i1's line"
    )

    def marked() -> list[str]:
        return [
            line for board in boards() for line in board.splitlines() if "🎯 orchestrator" in line
        ]

    found = await eventually(marked, timeout_s=60, what="i1agent's line marked, as configured")
    assert all("i1agent" in line for line in found), found
    await say("/taskcard orchestrator off")
    await eventually(lambda: not marked(), timeout_s=60, what="no line marked")
    await say("/taskcard orchestrator i1agent")
    found = await eventually(marked, timeout_s=60, what="i1agent's line marked, as chosen")
    assert all("i1agent" in line for line in found), found


async def test_clustered_routes_an_older_instance_rewrites_are_followed_on_the_board(
    telegram: FakeTelegram, tmp_path: Path, redis_url: str, prefix: str, fleet: ExitStack
) -> None:
    """During a rolling update an instance of an older release is live beside i0 (played
    here by hand: listed live, its routed record written as that release writes it, without
    moving `P:routes-changed` nor saying it would). i0 followed its record only when the live
    instances changed: the 🎯 its first record put on i0agent's line stayed there after it
    rewrote its routes marking nobody. Now, while such an instance is live, i0 reads the
    records at every renewal, and the mark goes."""
    from redis import Redis

    fleet.enter_context(
        instance(tmp_path, "i0", telegram, ["i0agent"], redis_url=redis_url, prefix=prefix,
                 view="board")
    )  # fmt: skip
    publish(tmp_path / "agents" / "i0agent", "card of i0")

    def marked() -> list[str]:
        return [
            line
            for m in telegram.bot_messages(GROUP)
            if "card of i0" in m.text
            for line in m.text.splitlines()
            if "🎯 orchestrator" in line
        ]

    await eventually(
        lambda: [m for m in telegram.bot_messages(GROUP) if "card of i0" in m.text],
        timeout_s=60,
        what="i0's board",
    )
    older, chat = "old#0000", str(GROUP)
    routes = {"telegram": {chat: {"": ["i0agent"]}}}
    with Redis.from_url(redis_url, decode_responses=True) as client:
        client.zadd(f"{prefix}:instances", {older: int(time.time() * 1000) + 3_600_000})
        marking = {**routes, "@orchestrators": {"telegram": {chat: {"": "i0agent"}}}}
        client.set(f"{prefix}:routed:{older}", json.dumps(marking))
        found = await eventually(marked, timeout_s=60, what="i0agent's line marked")
        assert all("i0agent" in line for line in found), found
        client.set(f"{prefix}:routed:{older}", json.dumps(routes))  # a reload, not counted
        await eventually(lambda: not marked(), timeout_s=60, what="the mark gone")
