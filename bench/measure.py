"""Measurements that need no third-party package: /proc for processes, plain percentiles."""

from __future__ import annotations

import math
import os
import platform
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

_CLOCK_TICKS_PER_S = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class CpuSample:
    """CPU seconds a process used itself (`own_s`) and reaped from its children."""

    own_s: float
    children_s: float


def cpu_of(pid: int) -> CpuSample:
    """utime+stime and cutime+cstime of `pid` (fields 14-17 of /proc/<pid>/stat)."""
    raw = Path(f"/proc/{pid}/stat").read_text()
    # The command name may contain spaces; the fields after its closing parenthesis do not.
    fields = raw[raw.rindex(")") + 2 :].split()
    utime, stime, cutime, cstime = (int(value) for value in fields[11:15])
    return CpuSample((utime + stime) / _CLOCK_TICKS_PER_S, (cutime + cstime) / _CLOCK_TICKS_PER_S)


def memory_of(pid: int) -> tuple[float, float]:
    """(current RSS, peak RSS) of `pid` in MB, from VmRSS and VmHWM."""
    values: dict[str, float] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            values[key] = int(rest.split()[0]) / 1024  # kB to MB
    return values.get("VmRSS", math.nan), values.get("VmHWM", math.nan)


def percentile(values: Sequence[float], fraction: float) -> float:
    """The nearest-rank percentile (`fraction` in 0..1); NaN for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(1, math.ceil(fraction * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


@dataclass(frozen=True)
class Machine:
    cores: int
    memory_gb: float
    python: str
    load_1m: float
    # The interpreter's own executable (a venv's base), because the CPU figures depend on how
    # that interpreter was built: one without profile-guided and link-time optimisation runs
    # the same service about a quarter slower (RESULTS.md, 2026-12-03).
    interpreter: str = ""

    def describe(self) -> str:
        built = f" ({self.interpreter})" if self.interpreter else ""
        return (
            f"{self.cores} cores, {self.memory_gb:.1f} GB memory, Python {self.python}{built}, "
            f"load average {self.load_1m:.2f} at the start"
        )


def machine() -> Machine:
    memory_kb = 0
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            memory_kb = int(line.split()[1])
    return Machine(
        cores=os.cpu_count() or 1,
        memory_gb=memory_kb / 1024 / 1024,
        python=platform.python_version(),
        load_1m=os.getloadavg()[0],
        interpreter=os.path.realpath(getattr(sys, "_base_executable", sys.executable)),
    )


def git_revision(root: Path) -> str:
    """The short revision of `root`, marked `+dirty` when the tree has local changes."""
    try:
        rev = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=root,
            capture_output=True,
            text=True,
            check=True,
            timeout=10,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=root,
            capture_output=True,
            text=True,
            check=True,
            timeout=10,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return f"{rev}+dirty" if dirty else rev
