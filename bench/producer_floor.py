"""The system calls a tick cannot do without, alone, for the producer benchmark (a subprocess).

What any producer host keeping the contract must do per tick, and nothing else: spawn the
renderer as a new process in its own session (`os.posix_spawn`, the cheapest spawn Python
has), one pipe for its stdout, wait for its exit on a pidfd, read the output, reap it, and
replace the body atomically (temporary file, rename). No stderr pipe, no working directory,
no priority, no fence, no budget, no status check: the product does all of these on top.
The same renderer, the same number of watches and the same interval as `bench.producer_host`,
one thread per watch, the grids spread over the first interval.

With `--no-publish` the body is not written: the difference is what the atomic replace costs.

Protocol: prints `ready` once every watch has started, runs for `--hold-s` seconds, then
stops the threads and exits. The caller reads this process's CPU from /proc meanwhile.
"""

from __future__ import annotations

import os
import select
import sys
import threading
import time
from pathlib import Path

from bench.producer_host import RENDERER, watch_arguments


def _tick(renderer: str, body: str, env: dict[str, str], publish: bool) -> None:
    out_r, out_w = os.pipe()
    try:
        pid = os.posix_spawn(
            sys.executable,
            [sys.executable, renderer],
            env,
            file_actions=[(os.POSIX_SPAWN_DUP2, out_w, 1), (os.POSIX_SPAWN_CLOSE, out_r)],
            setsid=True,
        )
    finally:
        os.close(out_w)
    pidfd = os.pidfd_open(pid)
    try:
        poller = select.poll()
        poller.register(pidfd, select.POLLIN)
        poller.poll(10_000)
        data = os.read(out_r, 65536)
    finally:
        os.close(pidfd)
        os.close(out_r)
    os.waitpid(pid, 0)
    if not publish:
        return
    temp = f"{body}.tmp"
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)
    os.replace(temp, body)


def _watch(workdir: Path, interval_s: float, publish: bool, stop: threading.Event) -> None:
    (workdir / "taskcard").mkdir(parents=True, exist_ok=True)
    renderer = workdir / "r.py"
    renderer.write_text(RENDERER)
    body = str(workdir / "taskcard" / "taskcard.md")
    env = {"PATH": os.environ.get("PATH", os.defpath), "PYTHONUTF8": "1"}
    origin = time.monotonic()
    slot = 0
    while True:
        slot += 1
        if stop.wait(max(0.0, origin + slot * interval_s - time.monotonic())):
            return
        _tick(str(renderer), body, env, publish)


def main(argv: list[str]) -> int:
    parser = watch_arguments(__doc__)
    parser.add_argument(
        "--no-publish", action="store_true", help="leave out the atomic replace of the body"
    )
    args = parser.parse_args(argv)
    stop = threading.Event()
    threads = []
    for index in range(args.watches):
        thread = threading.Thread(
            target=_watch,
            args=(args.root / f"w{index:02d}", args.interval_s, not args.no_publish, stop),
            daemon=True,
        )
        thread.start()
        threads.append(thread)
        time.sleep(args.interval_s / args.watches)
    print("ready", flush=True)
    time.sleep(args.hold_s)
    stop.set()
    for thread in threads:
        thread.join(30)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
