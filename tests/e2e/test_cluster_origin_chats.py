"""Origin routes in a cluster whose instances list different `origin_chats`, end to end: two
`taskcard serve` instances, each with an agent of its own and a chat of its own in
`origin_chats`, share the fake Bot API and a real `redis-server`. A turn of each agent from its
instance's chat opens a route there. The other instance writing, reloading and restarting
leaves that route open (its `origin_chats` does not list the chat, but it does not serve the
agent); taking the chat out of the agent's own instance's `origin_chats`, by a reload or while
it is stopped, still closes it."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest

from tests.e2e.harness import ServeProcess, activity, eventually, publish, run_cli
from tests.e2e.test_cluster import cluster_lines
from tests.e2e.test_cluster_routes_gone import card_of
from tests.e2e.test_reload_routes import UNROUTED, WAIT_S
from tests.fakes.telegram_api import FakeTelegram

ROUTED = -1007777777777
# Each instance's chat in its `origin_chats` (the other's lists only its own).
ORIGIN = {"m0": -1008888888888, "m1": -1009999999999}
AGENT = {"m0": "ada", "m1": "bob"}


def write_member(
    tmp_path: Path, name: str, fake: FakeTelegram, prefix: str, *, listed: bool = True
) -> Path:
    """Instance `name`'s config (its own folder and state): its agent routed to `ROUTED`, and
    its chat in `origin_chats` while `listed`."""
    folder = tmp_path / name
    folder.mkdir(exist_ok=True)
    agent = AGENT[name]
    workdir = tmp_path / "agents" / agent
    workdir.mkdir(parents=True, exist_ok=True)
    lines = [
        f'state_dir = "{folder / "state"}"',
        "[[agents]]",
        f'id = "{agent}"',
        f'workdir = "{workdir}"',
        "[telegram]",
        'token_env = "TC_TEST_TOKEN"',
        f'api_base_url = "{fake.base_url}"',
        "poll_timeout_s = 1",
        f"origin_chats = {json.dumps([ORIGIN[name]] if listed else [])}",
        "[[telegram.routes]]",
        f"chat_id = {ROUTED}",
        f"agents = {json.dumps([agent])}",
        *cluster_lines(name, prefix),
    ]
    config = folder / "taskcard.toml"
    config.write_text("\n".join(lines) + "\n")
    return config


def turn(tmp_path: Path, name: str, step: str) -> None:
    """A step of `name`'s agent in a turn that came from its instance's chat."""
    workdir = tmp_path / "agents" / AGENT[name]
    publish(workdir, f"{AGENT[name]} {step}")
    activity(workdir, "turn.start", origin=f"telegram:{ORIGIN[name]}")


async def shows(fake: FakeTelegram, name: str, step: str) -> None:
    """The one card of `name`'s agent in its instance's chat shows `step`."""
    chat, agent = ORIGIN[name], AGENT[name]
    await eventually(
        lambda: f"{agent} {step}" in (card_of(fake, chat, agent) or (0, ""))[1],
        timeout_s=WAIT_S,
        what=f"{agent}'s card at {step} in the chat its turns came from",
    )


def serves(serve: ServeProcess, name: str) -> bool:
    return f"agent {AGENT[name]}: this instance serves it now" in serve.logs


def origin_route_open(config: Path, name: str) -> bool:
    """`taskcard status` on instance `name`'s config lists its agent's route to its chat
    as opened by a turn origin (read from the shared state)."""
    status = run_cli("status", "--config", str(config))
    assert status.returncode == 0, status.stderr
    route = f"telegram:{ORIGIN[name]}::{AGENT[name]}"
    return f"{route} (opened by a turn origin)" in status.stdout


async def test_an_instance_leaves_open_the_origin_routes_of_chats_only_another_allows(
    tmp_path: Path,
    telegram: FakeTelegram,
    redis_url: str,
    prefix: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake = telegram
    monkeypatch.setenv("TC_REDIS_URL", redis_url)  # for `taskcard status`
    env = {"TC_TEST_TOKEN": fake.token, "TC_REDIS_URL": redis_url}
    configs = {name: write_member(tmp_path, name, fake, prefix) for name in AGENT}
    bob = ServeProcess(configs["m1"], env=env)
    with ServeProcess(configs["m0"], env=env) as ada, bob:
        await eventually(lambda: serves(ada, "m0") and serves(bob, "m1"), what="both serving")
        # bob's route opens after m0 read the shared routes at its start; then m0 opens one.
        turn(tmp_path, "m1", "step 1")
        await shows(fake, "m1", "step 1")
        turn(tmp_path, "m0", "step 1")
        await shows(fake, "m0", "step 1")
        opened = card_of(fake, ORIGIN["m1"], AGENT["m1"])
        assert opened is not None
        # m0 wrote its route into the shared origin routes, and kept bob's there.
        assert origin_route_open(configs["m0"], "m0")
        assert origin_route_open(configs["m1"], "m1"), "m0's write dropped bob's route"

        # m0 reloads, then restarts: neither closes bob's route.
        assert ada.proc is not None
        ada.proc.send_signal(signal.SIGHUP)
        await eventually(lambda: "config reloaded" in ada.logs, what="m0's reload")
        assert await ada.aterminate() == 0
        with ServeProcess(configs["m0"], env=env) as ada_again:
            await eventually(lambda: serves(ada_again, "m0"), what="m0 serving again")
            turn(tmp_path, "m0", "step 2")
            await shows(fake, "m0", "step 2")
            assert "closed: its chat is no longer in" not in ada_again.logs
            assert origin_route_open(configs["m1"], "m1"), "m0's start closed bob's route"

            # bob's instance restarts: its route is still open, on the same card.
            assert await bob.aterminate() == 0
            with ServeProcess(configs["m1"], env=env) as bob_again:
                await eventually(lambda: serves(bob_again, "m1"), what="m1 serving again")
                publish(tmp_path / "agents" / AGENT["m1"], "bob step 2")
                await shows(fake, "m1", "step 2")
                assert (card_of(fake, ORIGIN["m1"], AGENT["m1"]) or (0, ""))[0] == opened[0]

                # A reload of m1 that takes the chat out closes bob's route; listed again,
                # bob's next turn from there opens it on the same card.
                assert bob_again.proc is not None
                write_member(tmp_path, "m1", fake, prefix, listed=False)
                bob_again.proc.send_signal(signal.SIGHUP)
                await eventually(
                    lambda: UNROUTED in (card_of(fake, ORIGIN["m1"], AGENT["m1"]) or (0, ""))[1],
                    timeout_s=WAIT_S,
                    what="bob's card saying its chat no longer follows bob, after m1's reload",
                )
                write_member(tmp_path, "m1", fake, prefix)
                bob_again.proc.send_signal(signal.SIGHUP)
                await eventually(
                    lambda: bob_again.logs.count("config reloaded") == 2, what="m1's reload"
                )
                turn(tmp_path, "m1", "step 3")
                await shows(fake, "m1", "step 3")
                assert (card_of(fake, ORIGIN["m1"], AGENT["m1"]) or (0, ""))[0] == opened[0]
                assert await bob_again.aterminate() == 0

            # Taken out of m1's `origin_chats` while it was stopped: m1 closes bob's route,
            # its card saying so, and leaves ada's open.
            write_member(tmp_path, "m1", fake, prefix, listed=False)
            with ServeProcess(configs["m1"], env=env) as bob_unlisted:
                await eventually(
                    lambda: UNROUTED in (card_of(fake, ORIGIN["m1"], AGENT["m1"]) or (0, ""))[1],
                    timeout_s=WAIT_S,
                    what="bob's card saying its chat no longer follows bob",
                )
                assert "closed: its chat is no longer in telegram.origin_chats" in (
                    bob_unlisted.logs
                )
                publish(tmp_path / "agents" / AGENT["m0"], "ada step 3")
                await shows(fake, "m0", "step 3")
                assert await bob_unlisted.aterminate() == 0
            assert await ada_again.aterminate() == 0
    assert card_of(fake, ORIGIN["m1"], AGENT["m1"]) is not None, "no second card"
