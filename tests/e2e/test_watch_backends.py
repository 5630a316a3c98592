"""Both file watchers behind `taskcard serve`: `[watch] backend` picks one, and either way a
card change, and a workdir that only appears while serving, reach Telegram and Feishu.

The rescan is set to an hour, so what arrives came through the watcher.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from tests.e2e.harness import ServeProcess, eventually, lineage_reaches_card, publish
from tests.e2e.test_serve_feishu import Setup, card_texts
from tests.e2e.test_serve_telegram import GROUP, setup, shown
from tests.fakes.feishu_api import FakeFeishu
from tests.fakes.telegram_api import FakeTelegram

BACKENDS = ["inotify", "watchfiles"]
FELL_BACK = "watching with watchfiles instead"  # inotify's fallback, logged when it happens


def watch_section(backend: str) -> str:
    return f'[watch]\nbackend = "{backend}"\nrescan_interval_s = 3600.0\n'


@pytest.mark.parametrize("backend", BACKENDS)
async def test_telegram_cards_follow_renames_and_late_workdirs(
    tmp_path: Path, telegram: FakeTelegram, backend: str
) -> None:
    serve = setup(tmp_path, telegram, ["early", "late"], [(GROUP, ["early", "late"])])
    late = tmp_path / "agents" / "late"
    late.rmdir()  # appears only while serving
    with serve.config.open("a") as config:
        config.write(watch_section(backend))
    with serve:
        early = tmp_path / "agents" / "early"
        publish(early, "step 1")
        await eventually(lambda: any("step 1" in t for t in shown(telegram, GROUP)), what="card")
        publish(early, "step 2")
        await eventually(lambda: any("step 2" in t for t in shown(telegram, GROUP)), what="edit")
        publish(late, "late card")
        await eventually(
            lambda: any("late card" in t for t in shown(telegram, GROUP)), what="late card"
        )
        assert await serve.aterminate() == 0
        assert FELL_BACK not in serve.logs, "the backend asked for is the one that ran"


@pytest.mark.parametrize("backend", BACKENDS)
async def test_feishu_cards_follow_renames_and_late_workdirs(
    tmp_path: Path, feishu: FakeFeishu, backend: str
) -> None:
    setup_ = Setup(tmp_path, feishu, ["early", "late"])
    late = tmp_path / "agents" / "late"
    late.rmdir()
    with setup_.config.open("a") as config:
        config.write(watch_section(backend))
    with setup_.serve() as serve:
        early = tmp_path / "agents" / "early"
        publish(early, "step 1")
        await eventually(lambda: any("step 1" in t for t in card_texts(feishu)), what="card")
        publish(early, "step 2")
        await eventually(lambda: any("step 2" in t for t in card_texts(feishu)), what="patch")
        publish(late, "late card")
        await eventually(lambda: any("late card" in t for t in card_texts(feishu)), what="late")
        assert await serve.aterminate() == 0
        assert FELL_BACK not in serve.logs, "the backend asked for is the one that ran"


@pytest.mark.parametrize("backend", BACKENDS)
async def test_a_nested_workdirs_lineage_reaches_its_own_card_at_once(
    tmp_path: Path, telegram: FakeTelegram, backend: str
) -> None:
    """A reviewer works inside the lead's workdir, in a folder named like one of the lead's
    contract folders (`reports/`): its `lineage.json` is the reviewer's, the innermost
    workdir's, and shows on the reviewer's card without waiting for the hour's rescan."""
    serve = setup(tmp_path, telegram, ["lead"], [(GROUP, ["lead", "reviewer"])])
    lead = tmp_path / "agents" / "lead"
    reviewer = lead / "reports"
    reviewer.mkdir()
    with serve.config.open("a") as config:
        config.write(f'[[agents]]\nid = "reviewer"\nworkdir = "{reviewer}"\n')
        config.write(watch_section(backend))
    with serve:
        publish(lead, "leading")
        publish(reviewer, "reviewing")
        await eventually(
            lambda: (
                sum(t.count("leading") + t.count("reviewing") for t in shown(telegram, GROUP)) == 2
            ),
            what="both cards",
        )
        await lineage_reaches_card(
            reviewer, "lead", "review the plan", "reviewing", lambda: shown(telegram, GROUP)
        )
        assert not any("leading" in t and "spawned" in t for t in shown(telegram, GROUP))
        assert await serve.aterminate() == 0


INSTANCES = "/proc/sys/user/max_inotify_instances"


def _set_instances(pid: int, limit: int) -> None:
    """Set the inotify instance limit of the user namespace `pid` runs in."""
    command = ["nsenter", "-U", "-t", str(pid), "sh", "-c", f"echo {limit} > {INSTANCES}"]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr


def _user_namespace_limits() -> bool:
    """Whether a user namespace with its own inotify limits can be made here."""
    if shutil.which("unshare") is None or shutil.which("nsenter") is None:
        return False
    probe = subprocess.run(
        ["unshare", "-U", "-r", "sh", "-c", f"echo 0 > {INSTANCES}"],
        capture_output=True,
        check=False,
    )
    return probe.returncode == 0


async def test_no_inotify_instance_left_polls_and_says_which_limit(
    tmp_path: Path, telegram: FakeTelegram
) -> None:
    """A user out of inotify instances (fs.inotify.max_user_instances, taken by editors and
    other watchers): the service fell back to watchfiles, which needs one too, and logged a
    traceback every few seconds without naming the cause. One line names the limit, every
    agent is re-read every 2 s meanwhile, and once the limit is raised the agents are watched.
    The limit is set in a user namespace of the service's own (the machine's is untouched)."""
    if not _user_namespace_limits():
        pytest.skip("needs unshare and nsenter with user namespaces")
    serve = setup(tmp_path, telegram, ["builder"], [(GROUP, ["builder"])])
    with serve.config.open("a") as config:
        config.write(watch_section("inotify"))
    limited = ServeProcess(
        serve.config,
        env=serve.env,
        prefix=["unshare", "-U", "-r", "sh", "-c", f'echo 0 > {INSTANCES} && exec "$0" "$@"'],
    )
    workdir = tmp_path / "agents" / "builder"
    with limited:
        assert limited.proc is not None
        publish(workdir, "step 1")
        await eventually(lambda: any("step 1" in t for t in shown(telegram, GROUP)), what="card")
        publish(workdir, "step 2")
        await eventually(lambda: any("step 2" in t for t in shown(telegram, GROUP)), what="edit")
        assert "fs.inotify.max_user_instances" in limited.logs, limited.logs
        _set_instances(limited.proc.pid, 128)  # the operator raises the limit
        await eventually(lambda: "available again" in limited.logs, what="the watch back")
        publish(workdir, "step 3")
        await eventually(lambda: any("step 3" in t for t in shown(telegram, GROUP)), what="edit")
        assert await limited.aterminate() == 0
    assert "Traceback" not in limited.logs, limited.logs
    assert len([line for line in limited.stderr if "max_user_instances" in line]) == 1
