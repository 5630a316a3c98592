"""Origin routes in a cluster whose instances list different `origin_chats`, end to end: two
`taskcard serve` instances, each with an agent of its own and a chat of its own in
`origin_chats`, share the fake Bot API (or the fake Feishu Open API) and a real
`redis-server`. A turn of each agent from its instance's chat opens a route there. The other
instance writing, reloading and restarting leaves that route open (its `origin_chats` does not
list the chat, but it does not serve the agent); taking the chat out of the agent's own
instance's `origin_chats`, by a reload or while it is stopped, still closes it."""

from __future__ import annotations

import json
import signal
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import pytest

from taskcard.bridge.follow.tail import TAIL_BYTES
from tests.e2e.harness import ServeProcess, activity, eventually, publish, run_cli
from tests.e2e.test_cluster import cluster_lines
from tests.e2e.test_reload_routes import UNROUTED, WAIT_S, card_of
from tests.fakes.feishu_api import FakeFeishu
from tests.fakes.telegram_api import FakeTelegram

AGENT = {"m0": "ada", "m1": "bob"}


@dataclass(frozen=True)
class Platform:
    """The chat platform both instances post on, and its chats: each instance's chat in its
    `origin_chats` (the other's lists only its own), and one its agent is routed to."""

    name: str
    fake: FakeTelegram | FakeFeishu
    origin: dict[str, int | str]
    routed: int | str

    def channel_lines(self, origin_chats: list[int | str]) -> list[str]:
        if isinstance(self.fake, FakeTelegram):
            return [
                "[telegram]",
                'token_env = "TC_TEST_TOKEN"',
                f'api_base_url = "{self.fake.base_url}"',
                "poll_timeout_s = 1",
                f"origin_chats = {json.dumps(origin_chats)}",
            ]
        return [
            "[feishu]",
            'app_id_env = "TC_FS_APP_ID"',
            'app_secret_env = "TC_FS_APP_SECRET"',
            f'domain = "{self.fake.base_url}"',
            'events = "none"',
            f"origin_chats = {json.dumps(origin_chats)}",
        ]

    def env(self) -> dict[str, str]:
        if isinstance(self.fake, FakeTelegram):
            return {"TC_TEST_TOKEN": self.fake.token}
        return {"TC_FS_APP_ID": self.fake.app_id, "TC_FS_APP_SECRET": self.fake.app_secret}

    def card(self, name: str) -> tuple[str, str]:
        """(message id, text) of `name`'s agent's one card in its instance's chat, or
        ("", "") while it has none (or more than one)."""
        return card_of(self.fake, self.origin[name], AGENT[name]) or ("", "")


def platform_of(platform: str, telegram: FakeTelegram, feishu: FakeFeishu) -> Platform:
    if platform == "telegram":
        return Platform(
            platform, telegram, {"m0": -1008888888888, "m1": -1009999999999}, -1007777777777
        )
    return Platform(platform, feishu, {"m0": "oc_origin_m0", "m1": "oc_origin_m1"}, "oc_routed")


def write_member(
    tmp_path: Path,
    name: str,
    chats: Platform,
    prefix: str,
    *,
    listed: bool = True,
    like: str | None = None,
) -> Path:
    """Instance `name`'s config (its own folder and state): its agent routed to the routed
    chat, and its chat in `origin_chats` while `listed`; `like` another instance, that
    instance's agent and chat instead (a standby)."""
    folder = tmp_path / name
    folder.mkdir(exist_ok=True)
    agent = AGENT[like or name]
    workdir = tmp_path / "agents" / agent
    workdir.mkdir(parents=True, exist_ok=True)
    lines = [
        f'state_dir = "{folder / "state"}"',
        "[[agents]]",
        f'id = "{agent}"',
        f'workdir = "{workdir}"',
        *chats.channel_lines([chats.origin[like or name]] if listed else []),
        f"[[{chats.name}.routes]]",
        f"chat_id = {json.dumps(chats.routed)}",
        f"agents = {json.dumps([agent])}",
        *cluster_lines(name, prefix),
    ]
    config = folder / "taskcard.toml"
    config.write_text("\n".join(lines) + "\n")
    return config


def turn(tmp_path: Path, name: str, chats: Platform, step: str) -> None:
    """A step of `name`'s agent in a turn that came from its instance's chat."""
    workdir = tmp_path / "agents" / AGENT[name]
    publish(workdir, f"{AGENT[name]} {step}")
    activity(workdir, "turn.start", origin=f"{chats.name}:{chats.origin[name]}")


async def shows(chats: Platform, name: str, step: str) -> None:
    """The one card of `name`'s agent in its instance's chat shows `step`."""
    await eventually(
        lambda: f"{AGENT[name]} {step}" in chats.card(name)[1],
        timeout_s=WAIT_S,
        what=f"{AGENT[name]}'s card at {step} in the chat its turns came from",
    )


async def says_unfollowed(chats: Platform, name: str, after: str) -> None:
    await eventually(
        lambda: UNROUTED in chats.card(name)[1],
        timeout_s=WAIT_S,
        what=f"{AGENT[name]}'s card saying its chat no longer follows it, after {after}",
    )


def serves(serve: ServeProcess, name: str) -> bool:
    return f"agent {AGENT[name]}: this instance serves it now" in serve.logs


def origin_route_open(config: Path, name: str, chats: Platform) -> bool:
    """`taskcard status` on instance `name`'s config lists its agent's route to its chat
    as opened by a turn origin (read from the shared state)."""
    status = run_cli("status", "--config", str(config))
    assert status.returncode == 0, status.stderr
    route = f"{chats.name}:{chats.origin[name]}::{AGENT[name]}"
    return f"{route} (opened by a turn origin)" in status.stdout


@pytest.mark.parametrize("platform", ["telegram", "feishu"])
async def test_an_instance_leaves_open_the_origin_routes_of_chats_only_another_allows(
    tmp_path: Path,
    platform: str,
    telegram: FakeTelegram,
    feishu: FakeFeishu,
    redis_url: str,
    prefix: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    chats = platform_of(platform, telegram, feishu)
    monkeypatch.setenv("TC_REDIS_URL", redis_url)  # for `taskcard status`
    env = {**chats.env(), "TC_REDIS_URL": redis_url}
    configs = {name: write_member(tmp_path, name, chats, prefix) for name in AGENT}
    bob = ServeProcess(configs["m1"], env=env)
    with ServeProcess(configs["m0"], env=env) as ada, bob:
        await eventually(
            lambda: serves(ada, "m0") and serves(bob, "m1"), timeout_s=WAIT_S, what="both serving"
        )
        # bob's route opens after m0 read the shared routes at its start; then m0 opens one.
        turn(tmp_path, "m1", chats, "step 1")
        await shows(chats, "m1", "step 1")
        turn(tmp_path, "m0", chats, "step 1")
        await shows(chats, "m0", "step 1")
        opened = chats.card("m1")[0]
        # m0 wrote its route into the shared origin routes, and kept bob's there.
        assert origin_route_open(configs["m0"], "m0", chats)
        assert origin_route_open(configs["m1"], "m1", chats), "m0's write dropped bob's route"

        # m0 reloads, then restarts: neither closes bob's route.
        assert ada.proc is not None
        ada.proc.send_signal(signal.SIGHUP)
        await eventually(
            lambda: "config reloaded" in ada.logs, timeout_s=WAIT_S, what="m0's reload"
        )
        assert await ada.aterminate() == 0
        with ServeProcess(configs["m0"], env=env) as ada_again:
            await eventually(
                lambda: serves(ada_again, "m0"), timeout_s=WAIT_S, what="m0 serving again"
            )
            turn(tmp_path, "m0", chats, "step 2")
            await shows(chats, "m0", "step 2")
            assert "closed: its chat is no longer in" not in ada_again.logs
            assert origin_route_open(configs["m1"], "m1", chats), "m0's start closed bob's"

            # bob's instance restarts: its route is still open, on the same card.
            assert await bob.aterminate() == 0
            with ServeProcess(configs["m1"], env=env) as bob_again:
                await eventually(
                    lambda: serves(bob_again, "m1"), timeout_s=WAIT_S, what="m1 serving again"
                )
                publish(tmp_path / "agents" / AGENT["m1"], "bob step 2")
                await shows(chats, "m1", "step 2")
                assert chats.card("m1")[0] == opened

                # A reload of m1 that takes the chat out closes bob's route; listed again,
                # bob's next turn from there opens it on the same card.
                assert bob_again.proc is not None
                write_member(tmp_path, "m1", chats, prefix, listed=False)
                bob_again.proc.send_signal(signal.SIGHUP)
                await says_unfollowed(chats, "m1", "m1's reload")
                write_member(tmp_path, "m1", chats, prefix)
                bob_again.proc.send_signal(signal.SIGHUP)
                await eventually(
                    lambda: bob_again.logs.count("config reloaded") == 2,
                    timeout_s=WAIT_S,
                    what="m1's reload",
                )
                turn(tmp_path, "m1", chats, "step 3")
                await shows(chats, "m1", "step 3")
                assert chats.card("m1")[0] == opened
                assert await bob_again.aterminate() == 0

            # Taken out of m1's `origin_chats` while it was stopped: m1 closes bob's route,
            # its card saying so, and leaves ada's open.
            write_member(tmp_path, "m1", chats, prefix, listed=False)
            with ServeProcess(configs["m1"], env=env) as bob_unlisted:
                await says_unfollowed(chats, "m1", "m1's start")
                closed = f"closed: its chat is no longer in {platform}.origin_chats"
                assert closed in bob_unlisted.logs
                publish(tmp_path / "agents" / AGENT["m0"], "ada step 3")
                await shows(chats, "m0", "step 3")
                assert await bob_unlisted.aterminate() == 0
            assert await ada_again.aterminate() == 0
    assert chats.card("m1")[0] == opened, "no second card"


@pytest.mark.parametrize("platform", ["telegram", "feishu"])
async def test_a_standby_taking_an_agent_over_serves_the_origin_routes_opened_since_its_start(
    tmp_path: Path,
    platform: str,
    telegram: FakeTelegram,
    feishu: FakeFeishu,
    redis_url: str,
    prefix: str,
) -> None:
    """Both instances are configured with the same agent and the same `origin_chats`; one
    serves the agent and opens its route from a turn after the standby started. The owner
    stops: the standby takes the agent over with that route. It read the shared routes at
    its start only, and unless the turn's origin was in the tail of events it reads at its
    first sight of the agent, went on without the route: the card there stayed as the owner
    left it."""
    chats = platform_of(platform, telegram, feishu)
    # Both serve bob (m1's agent), listing m1's chat: bob's lease goes to one of them.
    configs = {name: write_member(tmp_path, name, chats, prefix, like="m1") for name in AGENT}
    env = {**chats.env(), "TC_REDIS_URL": redis_url}
    with ExitStack() as fleet:
        serve = {n: fleet.enter_context(ServeProcess(configs[n], env=env)) for n in AGENT}
        await eventually(
            lambda: (
                all("serving 1 agent" in s.logs for s in serve.values())
                and any(serves(s, "m1") for s in serve.values())
            ),
            timeout_s=WAIT_S,
            what="both running, bob served by one",
        )
        [owner] = [n for n, s in serve.items() if serves(s, "m1")]
        [standby] = [n for n in AGENT if n != owner]
        turn(tmp_path, "m1", chats, "step 1")
        await shows(chats, "m1", "step 1")
        opened = chats.card("m1")[0]
        # The turn goes on past the tail of the events a first sight of the agent reads
        # (which would show the standby the turn's origin again).
        workdir = tmp_path / "agents" / AGENT["m1"]
        for n in range(TAIL_BYTES // 200 + 100):
            activity(workdir, "text", text=f"{n:>5} " + "x" * 200)
        publish(workdir, "bob step 1b")
        await shows(chats, "m1", "step 1b")
        assert await serve[owner].aterminate() == 0
        await eventually(
            lambda: serves(serve[standby], "m1"), timeout_s=WAIT_S, what="the take-over"
        )
        publish(tmp_path / "agents" / AGENT["m1"], "bob step 2")
        await shows(chats, "m1", "step 2")
        assert chats.card("m1")[0] == opened
        assert await serve[standby].aterminate() == 0
