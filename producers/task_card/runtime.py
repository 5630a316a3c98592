"""Where a workdir's host lives: its lock and socket, outside the workdir.

The folder is `$TASKCARD_RUNTIME_DIR`, else `$XDG_RUNTIME_DIR/taskcard`, else
`/tmp/taskcard-<uid>`, created 0700. Files are named by a hash of the resolved workdir so
that a path of any length maps to a socket path under the 108-byte limit. The lock is an
`flock` the kernel releases when the holder dies, so a SIGKILLed host never blocks its
successor.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path


class HostAlreadyRunning(RuntimeError):
    """Another host holds this workdir's lock."""


def default_runtime_dir(environ: Mapping[str, str]) -> Path:
    explicit = environ.get("TASKCARD_RUNTIME_DIR")
    if explicit:
        return Path(explicit)
    xdg = environ.get("XDG_RUNTIME_DIR")
    if xdg:
        return Path(xdg) / "taskcard"
    return Path(f"/tmp/taskcard-{os.getuid()}")


@dataclass(frozen=True)
class HostPaths:
    """The lock, socket and log of one workdir's host."""

    runtime_dir: Path
    workdir: Path

    @property
    def key(self) -> str:
        return hashlib.sha256(str(self.workdir.resolve()).encode()).hexdigest()[:20]

    @property
    def lock(self) -> Path:
        return self.runtime_dir / f"{self.key}.lock"

    @property
    def socket(self) -> Path:
        return self.runtime_dir / f"{self.key}.sock"

    @property
    def log(self) -> Path:
        return self.runtime_dir / f"{self.key}.log"

    def ensure_dir(self) -> None:
        self.runtime_dir.mkdir(mode=0o700, parents=True, exist_ok=True)


class HostLock:
    """The exclusive right to run watches for one workdir."""

    def __init__(self, paths: HostPaths) -> None:
        self._paths = paths
        self._fd: int | None = None

    def acquire(self) -> None:
        self._paths.ensure_dir()
        fd = os.open(self._paths.lock, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 32).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise HostAlreadyRunning(
                f"a task_card host already runs for {self._paths.workdir} (pid {holder}); "
                "use it (taskcard tool/card talk to it) or stop it first"
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode())
        self._fd = fd

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)
