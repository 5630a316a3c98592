"""`python -m bench.changecost_probe MODE OUT -- PYTHON -m taskcard.bridge.cli serve ARGS...`:
run `taskcard serve` in this process (the e2e harness's command, given this as its prefix) and
count the interpreter's work between two SIGUSR2 (for `bench.changecost`).

MODE `trace`: Python frames entered (calls, coroutine and generator resumptions included),
bytecodes executed and calls into C functions, on the main thread (where the event loop, the
watcher and every request run); written to OUT as JSON. MODE `profile`: cProfile over the
same window, its stats written to OUT (read them with `pstats`).

The first SIGUSR2 starts counting, the second stops it and writes OUT. Nothing in the service
or its libraries uses SIGUSR2 (SIGUSR1 is its stack dump).
"""

from __future__ import annotations

import cProfile
import json
import signal
import sys
from types import CodeType, FrameType
from typing import Any


class Counter:
    """Counts through `sys.settrace` (frames, bytecodes) and `sys.setprofile` (C calls)."""

    def __init__(self) -> None:
        self.calls = 0
        self.bytecodes = 0
        self.c_calls = 0
        # Own bytecodes and calls per function: "file:line(name)" -> [calls, bytecodes].
        self.per_code: dict[CodeType, list[int]] = {}
        self.callers: dict[CodeType, str] = {}

    def _local(self, frame: FrameType, event: str, arg: Any) -> Any:
        if event == "opcode":
            self.bytecodes += 1
            self.per_code[frame.f_code][1] += 1
        return self._local

    def _global(self, frame: FrameType, event: str, arg: Any) -> Any:
        self.calls += 1
        entry = self.per_code.get(frame.f_code)
        if entry is None:
            entry = self.per_code[frame.f_code] = [0, 0]
        entry[0] += 1
        if frame.f_code.co_filename == "<string>" and frame.f_back is not None:
            back = frame.f_back.f_code
            self.callers[frame.f_code] = f"{back.co_filename}:{back.co_qualname}"
        frame.f_trace_opcodes = True
        return self._local

    def _profile(self, frame: FrameType, event: str, arg: Any) -> None:
        if event == "c_call":
            self.c_calls += 1

    def start(self) -> None:
        sys.settrace(self._global)
        sys.setprofile(self._profile)

    def stop(self) -> dict[str, Any]:
        sys.setprofile(None)
        sys.settrace(None)
        functions: dict[str, list[int]] = {}
        for code, (calls, bytecodes) in self.per_code.items():
            name = f"{code.co_filename}:{code.co_firstlineno}({code.co_qualname})"
            if code.co_filename == "<string>":  # generated (a dataclass's __eq__): by caller
                name += f" from {self.callers.get(code, '?')}"
            total = functions.setdefault(name, [0, 0])
            total[0] += calls
            total[1] += bytecodes
        return {
            "calls": self.calls,
            "bytecodes": self.bytecodes,
            "c_calls": self.c_calls,
            "functions": functions,
        }


def main(argv: list[str]) -> int:
    mode, out, separator, *command = argv
    if "taskcard.bridge.cli" in command:  # what follows the interpreter and `-m module`
        command = command[command.index("taskcard.bridge.cli") + 1 :]
    if mode not in ("trace", "profile") or separator != "--" or command[:1] != ["serve"]:
        print(__doc__, file=sys.stderr)
        return 2
    counter = Counter()
    profiler = cProfile.Profile()
    state = {"running": False}

    def toggle(signum: int, frame: FrameType | None) -> None:
        if not state["running"]:
            state["running"] = True
            if mode == "trace":
                counter.start()
            else:
                profiler.enable()
            return
        if mode == "trace":
            counts = counter.stop()
            with open(out, "w") as file:
                json.dump(counts, file)
        else:
            profiler.disable()
            profiler.dump_stats(out)

    signal.signal(signal.SIGUSR2, toggle)
    from taskcard.bridge.cli import main as taskcard_main

    return taskcard_main(command)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
