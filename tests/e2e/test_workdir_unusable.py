"""A configured agent's workdir that cannot be one (a regular file, a loop of symbolic links)
is that agent's problem alone, through the CLI in a subprocess and `taskcard serve` with a
config file against the fake Bot API.

The folder is the agent's, which may replace it at any moment: once it did, `taskcard
status` refused the whole configuration and showed no agent, a restart of `serve` refused
to start (the whole fleet dark) and so did a SIGHUP reload. They carry on with every other
agent now, naming the agent, its key, the path, what is wrong and the fix, and pick the
agent up once its workdir is a folder. `config check` and `serve --check`, the operator's
pre-flight, still refuse it."""

from __future__ import annotations

import json
import shutil
import signal
from pathlib import Path

from tests.e2e.harness import (
    TOKEN_ENV,
    ServeProcess,
    agents_lines,
    eventually,
    publish,
    run_cli,
)
from tests.fakes.telegram_api import FakeTelegram

CHAT = -1001234500000


def write_config(tmp_path: Path, base_url: str, extra: tuple[str, ...] = ()) -> Path:
    """Agents good (its workdir made), wdfile (`agents/wdfile`) and looper (`loop`) and the
    agents `extra` (made), all routed to `CHAT`."""
    lines = agents_lines(tmp_path, ["good", *extra])
    lines += ["[[agents]]", 'id = "wdfile"', 'workdir = "agents/wdfile"']
    lines += ["[[agents]]", 'id = "looper"', 'workdir = "loop"']
    lines += [
        "[telegram]",
        f'token_env = "{TOKEN_ENV}"',
        f'api_base_url = "{base_url}"',
        "poll_timeout_s = 1",
        "[[telegram.routes]]",
        f"chat_id = {CHAT}",
        'agents = ["*"]',
    ]
    config = tmp_path / "taskcard.toml"
    config.write_text("\n".join(lines) + "\n")
    return config


def break_workdirs(tmp_path: Path) -> None:
    """wdfile's workdir replaced by a regular file, looper's a link to itself."""
    wdfile = tmp_path / "agents" / "wdfile"
    if wdfile.is_dir():
        shutil.rmtree(wdfile)
    wdfile.write_text("not a folder\n")
    loop = tmp_path / "loop"
    if loop.is_dir() and not loop.is_symlink():
        shutil.rmtree(loop)
    loop.symlink_to("loop")


def problem_lines(tmp_path: Path, index: dict[str, int] | None = None) -> dict[str, str]:
    """The line said of each broken agent (`index`: its position in `[[agents]]`)."""
    at = index or {"wdfile": 1, "looper": 2}
    served = (
        "the agent is served all the same and its files are read once its workdir is a folder"
        " (the other agents are not affected)"
    )
    return {
        "wdfile": f"agent wdfile: agents[{at['wdfile']}].workdir: {tmp_path}/agents/wdfile"
        " exists and is not a directory; point it at the agent's working directory;"
        f" {served}",
        "looper": f"agent looper: agents[{at['looper']}].workdir: {tmp_path}/loop goes round a"
        " loop of symbolic links (following them leads back to where they start); fix the"
        f" link or point workdir at the agent's folder; {served}",
    }


def shown(telegram: FakeTelegram, text: str) -> bool:
    return any(text in m.text for m in telegram.bot_messages(CHAT))


async def test_serve_and_status_carry_on_past_an_agent_whose_workdir_is_a_file_or_a_loop(
    tmp_path: Path, telegram: FakeTelegram
) -> None:
    config = write_config(tmp_path, telegram.base_url)
    break_workdirs(tmp_path)
    lines = problem_lines(tmp_path)
    with ServeProcess(config, env={TOKEN_ENV: telegram.token}) as serve:
        for line in lines.values():
            await eventually(lambda line=line: line in serve.logs, what=line)
        assert all(
            "WARNING" in logged
            for logged in serve.logs.splitlines()
            if any(line in logged for line in lines.values())
        ), serve.logs
        publish(tmp_path / "agents" / "good", "good v1")
        await eventually(lambda: shown(telegram, "good v1"), what="the good agent's card")
        # `taskcard status` lists every agent, the broken ones with their line.
        status = run_cli("status", "--config", str(config))
        assert status.returncode == 0, status.stderr
        for line in lines.values():
            assert line in status.stdout.splitlines(), status.stdout
        assert "agent good: " in status.stdout, status.stdout
        as_json = run_cli("status", "--config", str(config), "--json")
        assert as_json.returncode == 0, as_json.stderr
        agents = {a["agent"]: a for a in json.loads(as_json.stdout)["agents"]}
        assert set(agents) == {"good", "wdfile", "looper"}
        assert agents["good"]["workdir_problem"] is None
        assert agents["wdfile"]["workdir_problem"] == lines["wdfile"]
        assert agents["looper"]["workdir_problem"] == lines["looper"]
        assert agents["looper"]["workdir_exists"] is True  # not "does not exist yet"
        # Made folders again: picked up, their cards shown.
        (tmp_path / "agents" / "wdfile").unlink()
        (tmp_path / "agents" / "wdfile").mkdir()
        publish(tmp_path / "agents" / "wdfile", "wdfile v1")
        (tmp_path / "loop").unlink()
        (tmp_path / "loop").mkdir()
        publish(tmp_path / "loop", "looper v1")
        await eventually(lambda: shown(telegram, "wdfile v1"), what="wdfile's card")
        await eventually(lambda: shown(telegram, "looper v1"), what="looper's card")
        healed = run_cli("status", "--config", str(config))
        assert healed.returncode == 0, healed.stderr
        assert "workdir" not in healed.stdout, healed.stdout
        assert await serve.aterminate() == 0
    assert "Traceback" not in serve.logs, serve.logs
    # The operator's pre-flight stays strict: it names both and exits 2.
    break_workdirs(tmp_path)
    for args in (("config", "check", str(config)), ("serve", "--config", str(config), "--check")):
        checked = run_cli(*args)
        assert checked.returncode == 2, (args, checked.stdout, checked.stderr)
        assert "agents[1].workdir: " in checked.stderr and "exists and is not a directory" in (
            checked.stderr
        ), checked.stderr
        assert "agents[2].workdir: " in checked.stderr and "loop of symbolic links" in (
            checked.stderr
        ), checked.stderr


async def test_a_reload_and_a_restart_carry_on_past_a_workdir_broken_while_serving(
    tmp_path: Path, telegram: FakeTelegram
) -> None:
    """The workdirs broken while serving: a SIGHUP that adds an agent is taken (it was
    refused for the whole file), and a restart serves the fleet (it refused to start)."""
    config = write_config(tmp_path, telegram.base_url)
    for folder in (tmp_path / "agents" / "wdfile", tmp_path / "loop"):
        folder.mkdir()
    with ServeProcess(config, env={TOKEN_ENV: telegram.token}) as serve:
        assert serve.proc is not None
        publish(tmp_path / "agents" / "good", "good v1")
        await eventually(lambda: shown(telegram, "good v1"), what="the good agent's card")
        break_workdirs(tmp_path)
        config = write_config(tmp_path, telegram.base_url, ("late",))
        serve.proc.send_signal(signal.SIGHUP)
        await eventually(lambda: "config reloaded" in serve.logs, what="the reload")
        # `late` comes first in `[[agents]]` after `good`: the others moved down one.
        lines = problem_lines(tmp_path, {"wdfile": 2, "looper": 3})
        for line in lines.values():
            await eventually(lambda line=line: line in serve.logs, what=line)
        publish(tmp_path / "agents" / "late", "late v1")
        await eventually(lambda: shown(telegram, "late v1"), what="the added agent's card")
        assert "config reload refused" not in serve.logs, serve.logs
        assert await serve.aterminate() == 0
    with ServeProcess(config, env={TOKEN_ENV: telegram.token}) as again:
        for line in lines.values():
            await eventually(lambda line=line: line in again.logs, what=line)
        publish(tmp_path / "agents" / "good", "good v2")
        await eventually(lambda: shown(telegram, "good v2"), what="the restarted card")
        assert await again.aterminate() == 0
    assert "Traceback" not in serve.logs + again.logs
