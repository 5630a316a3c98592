"""`taskcard status` shows the whole fleet `serve` runs, not only the configured part.

Routes opened by a turn's origin and agents found under `[discover] roots` are served without
a line of their own in the configuration; an operator reading `status` must see them too, in
the human output and in `--json`, while the service runs and after it stopped (the origin
routes are kept in the state).
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from tests.e2e.harness import ServeProcess, agents_lines, eventually, publish, run_cli
from tests.e2e.test_origin_fleet import GROUP, TOPIC, hook, ready, telegram_config, texts
from tests.fakes.telegram_api import FakeTelegram


def status(config: Path, *extra: str) -> str:
    result = run_cli("status", "--config", str(config), *extra)
    assert result.returncode == 0, result.stderr
    return result.stdout


async def test_status_lists_origin_routes_and_discovered_agents(
    tmp_path: Path, telegram: FakeTelegram
) -> None:
    config = telegram_config(
        tmp_path,
        telegram,
        extra=f'[[telegram.routes]]\nchat_id = {GROUP}\nagents = ["*"]',
    )
    coder = tmp_path / "fleet" / "coder"
    idle = tmp_path / "fleet" / "idle"
    origin_route = f"telegram:{GROUP}:{TOPIC}:coder"
    with ServeProcess(config, env={"TC_TEST_TOKEN": telegram.token}) as serve:
        await ready(serve, "telegram")
        coder.mkdir()
        idle.mkdir()
        hook("01_session_start.json", coder)
        hook("02_user_prompt_submit.json", coder, f"telegram:{GROUP}:{TOPIC}")
        publish(coder, "coder at work")
        await eventually(
            lambda: any("coder at work" in t for t in texts(telegram, GROUP, TOPIC)),
            timeout_s=60,
            what="the card in the origin topic",
        )
        running = status(config)
        assert await serve.aterminate() == 0
    stopped = status(config)
    for text in (running, stopped):
        assert f"{origin_route} (opened by a turn origin)" in text, text
        assert f"agent idle: discovered at {idle}" in text, text
        assert f"agent coder: discovered at {coder}" in text, text
    report: dict[str, Any] = json.loads(status(config, "--json"))
    assert report["state"]["store"] == "sqlite"
    assert report["state"]["file"] == report["state_file"]
    assert report["state_file"].endswith("state.sqlite3")
    routes = {route["route"]: route for route in report["routes"]}
    assert routes[origin_route]["opened_by"] == "origin"
    assert routes[origin_route]["message_id"] is not None, "the resident in the topic"
    # The configured ["*"] route covers the discovered agents too.
    assert routes[f"telegram:{GROUP}::idle"]["opened_by"] == "config"
    assert routes[f"telegram:{GROUP}::coder"]["opened_by"] == "config"
    agents = {agent["agent"]: agent for agent in report["agents"]}
    assert agents["idle"]["found_by"] == "discovered"
    assert agents["idle"]["workdir"] == str(idle)
    assert agents["coder"]["found_by"] == "discovered"


def test_status_tells_each_agents_state_and_latest_report(tmp_path: Path) -> None:
    """The reports-and-signals spec: query the state, then read the report. Only a chat could
    ask for them (`/taskcard`); `status`, the one command a script or an operator has, named
    each agent's workdir and problems but neither its state nor its latest report."""
    config = tmp_path / "taskcard.toml"
    lines = agents_lines(tmp_path, ["reviewer", "coder", "gone", "silent"])
    lines += ["[[agents]]", 'id = "later"', 'workdir = "agents/later"']
    config.write_text("\n".join(lines) + "\n")
    agents = tmp_path / "agents"

    def cli(*args: str) -> None:
        done = run_cli(*args)
        assert done.returncode == 0, done.stderr

    for kind in ("agent.start", "turn.start", "turn.end"):
        cli("activity", "--workdir", str(agents / "reviewer"), kind)
    cli("report", "--workdir", str(agents / "reviewer"), "--failed", "--summary", "first round")
    cli("report", "--workdir", str(agents / "reviewer"), "--ok", "--verdict", "aprovado",
        "--role", "reviewer", "--summary", "second round")  # fmt: skip
    for kind in ("agent.start", "turn.start"):
        cli("activity", "--workdir", str(agents / "coder"), kind)
    for kind in ("agent.start", "agent.exit"):
        cli("activity", "--workdir", str(agents / "gone"), kind)
    cli("report", "--workdir", str(agents / "gone"), "--failed")

    report: dict[str, Any] = json.loads(status(config, "--json"))
    found = {agent["agent"]: (agent["state"], agent["latest_report"]) for agent in report["agents"]}
    reviewed = found["reviewer"][1]
    assert found["reviewer"][0] == "idle"
    assert reviewed is not None and reviewed["at"].endswith("Z")
    assert {k: v for k, v in reviewed.items() if k != "at"} == {
        "seq": 2,
        "ok": True,
        "verdict": "approved",
        "role": "reviewer",
    }
    assert found["coder"] == ("running", None)
    assert found["gone"][0] == "exited"
    assert found["gone"][1] is not None and found["gone"][1]["ok"] is False
    assert found["silent"] == ("unknown", None)
    assert found["later"] == (None, None), "a workdir not made yet has no state"

    text = status(config)
    assert f"agent reviewer: idle; latest report #2 ({reviewed['at']}): ok, verdict approved," \
        " as reviewer." in text, text  # fmt: skip
    assert "agent coder: running; no report" in text, text
    assert "agent gone: exited; latest report #1 (" in text and "): failed." in text, text
    assert "agent silent: unknown; no report" in text, text
    assert "agent later:" in text and "agent later: None" not in text, text


def test_status_json_names_the_states_as_the_spec_does(tmp_path: Path) -> None:
    """The reports-and-signals table names the states `at-prompt` and `no-output`; `--json`,
    which scripts read, gave them with a space ("at prompt", "no output"), as people read
    them. The text keeps the words people read."""
    config = tmp_path / "taskcard.toml"
    config.write_text("\n".join(agents_lines(tmp_path, ["shell", "mute"])) + "\n")
    agents = tmp_path / "agents"
    for kind in ("agent.start", "text"):  # spoke, never had a turn: a shell at its prompt
        done = run_cli("activity", "--workdir", str(agents / "shell"), kind, "text=$ ")
        assert done.returncode == 0, done.stderr
    logs = agents / "mute" / "logs"
    logs.mkdir(parents=True)
    started = (datetime.now(UTC) - timedelta(minutes=10)).isoformat().replace("+00:00", "Z")
    (logs / "events.jsonl").write_text(json.dumps({"ts": started, "kind": "agent.start"}) + "\n")
    report: dict[str, Any] = json.loads(status(config, "--json"))
    found = {agent["agent"]: agent["state"] for agent in report["agents"]}
    assert found == {"shell": "at-prompt", "mute": "no-output"}
    text = status(config)
    assert "agent shell: at prompt; no report" in text, text
    assert "agent mute: no output; no report" in text, text
