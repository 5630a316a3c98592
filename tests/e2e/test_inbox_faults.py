"""Every way an agent's inbox cannot be written says what is wrong and how to fix it, through
`taskcard serve` against the fake Bot API and Feishu: a person's `/tell` fails with the
reason in its status message, and the agent's card shows the same words in its `⚠ inbox:`
row at once (as for a failed wake), though the agent's own files do not change.

The disks are real: a full or read-only one is a small tmpfs mounted on the workdir (root
only), and a folder the service may not write is one the service's user cannot write (the
service run as root without the capabilities that pass over permissions); skipped where
that cannot be set up.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.e2e.harness import ServeProcess, publish
from tests.e2e.test_state_disk import _mount_tmpfs, _umount, fill
from tests.e2e.test_talk_and_signals import chat_for, wait_said, wait_status, workdir

# Runs the service as root without the capabilities that pass over file permissions.
NO_OVERRIDE = ["setpriv", "--bounding-set", "-dac_override,-dac_read_search,-fowner"]


def _mounted(wd: Path, mounts: list[Path]) -> None:
    if not _mount_tmpfs(wd, "1m"):
        pytest.skip("needs root and tmpfs mounts for a real disk")
    mounts.append(wd)


def not_a_folder(wd: Path, mounts: list[Path]) -> None:
    (wd / "inbox").write_text("not a folder\n")


def a_fifo(wd: Path, mounts: list[Path]) -> None:
    os.mkfifo(wd / "inbox")


def a_link_out(wd: Path, mounts: list[Path]) -> None:
    outside = wd.parent.parent / "outside"
    outside.mkdir()
    (wd / "inbox").symlink_to(outside, target_is_directory=True)


def read_only(wd: Path, mounts: list[Path]) -> None:
    _mounted(wd, mounts)
    publish(wd, "**building**")
    remount = subprocess.run(
        ["mount", "-o", "remount,ro", str(wd)], capture_output=True, check=False
    )
    if remount.returncode != 0:
        pytest.skip("cannot remount read-only here")


def full(wd: Path, mounts: list[Path]) -> None:
    _mounted(wd, mounts)
    publish(wd, "**building**")
    (wd / "inbox").mkdir()
    fill(wd)


def not_writable(wd: Path, mounts: list[Path]) -> None:
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv to run the service without permission overrides")
    wd.chmod(0o500)


# fault -> (how it is made, the words of what is wrong, the words of the fix)
FAULTS: dict[str, tuple[Callable[[Path, list[Path]], None], str, str]] = {
    "not-a-folder": (
        not_a_folder,
        "inbox is a symlink or not a directory",
        "remove it so the service can create a real folder",
    ),
    "fifo": (
        a_fifo,
        "inbox is a symlink or not a directory",
        "remove it so the service can create a real folder",
    ),
    "link-out": (
        a_link_out,
        "inbox is a symlink or not a directory",
        "remove it so the service can create a real folder",
    ),
    "read-only": (
        read_only,
        "inbox could not be created (Read-only file system)",
        "the agent's workdir is on a read-only mount: mount it read-write",
    ),
    "full": (
        full,
        "(No space left on device)",
        "free space (or quota) on the disk of the agent's workdir",
    ),
    "not-writable": (
        not_writable,
        "inbox could not be created (Permission denied)",
        f"make the agent's workdir writable by the user running taskcard serve"
        f" (uid {os.geteuid()})",
    ),
}


@pytest.fixture(params=["telegram", "feishu"])
def platform(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def mounts() -> Iterator[list[Path]]:
    made: list[Path] = []
    yield made
    for where in made:
        _umount(where)


@pytest.mark.parametrize("fault", list(FAULTS))
async def test_an_inbox_that_cannot_be_written_says_what_and_how_to_fix_it(
    platform: str, fault: str, tmp_path: Path, mounts: list[Path]
) -> None:
    make, what, fix = FAULTS[fault]
    async with chat_for(platform, tmp_path, ["builder"]) as chat:
        wd = workdir(tmp_path)
        publish(wd, "**building**")
        make(wd, mounts)
        if fault == "not-writable":
            chat.serve = ServeProcess(chat.serve.config, env=chat.serve.env, prefix=NO_OVERRIDE)
        with chat.serve:
            await wait_said(chat, "building", "the card")
            await chat.say("/tell builder hello")
            status = await wait_status(chat, "failed:")
            assert what in status and fix in status, status
            # The card says so too, though the agent's own files do not change.
            card = await wait_said(chat, "⚠ inbox:", "builder's card naming its inbox")
            assert fix in card, card
            if fault == "link-out":
                assert list((tmp_path / "outside").iterdir()) == []
            assert await chat.serve.aterminate() == 0
