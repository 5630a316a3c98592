"""Running an agent's renderer safely, and naming what went wrong.

The renderer is agent code, so every run is fenced: its own process group (a timeout kills
the renderer and whatever it spawned), a minimal environment, a bounded read of stdout (a
renderer printing gigabytes costs us a few kilobytes), and a bounded tail of stderr kept for
`inspect`. What the run *means* is decided by `classify`, a pure function of the outcome's
typed fields, never by matching message text.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Literal, Protocol

STDERR_TAIL_BYTES: Final = 4096
_READ_CHUNK: Final = 65536
_POLL_S: Final = 0.05
ENV_KEEP: Final = ("PATH", "HOME", "USER", "LOGNAME", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "TMPDIR")

ErrorCode = Literal[
    "renderer_timeout",
    "renderer_nonzero_exit",
    "renderer_failed",
    "renderer_blank_output",
    "renderer_invalid_utf8",
    "body_too_large",
    "write_failed",
    "watch_crash",
]


class RendererPathError(ValueError):
    """The renderer path is not a regular file inside the workdir."""


def resolve_renderer(workdir: Path, renderer_path: str) -> Path:
    """The resolved renderer file; symlinks are followed before the inside-workdir check."""
    root = workdir.resolve()
    candidate = Path(renderer_path)
    if not candidate.is_absolute():
        candidate = root / candidate
    try:
        resolved = candidate.resolve(strict=True)
    except (OSError, RuntimeError):
        raise RendererPathError(
            f"renderer_path: {renderer_path!r} does not exist (relative paths start at the workdir)"
        ) from None
    if not resolved.is_relative_to(root):
        raise RendererPathError(
            f"renderer_path: {renderer_path!r} resolves outside the workdir; keep it inside {root}"
        )
    if not resolved.is_file():
        raise RendererPathError(f"renderer_path: {renderer_path!r} is not a regular file")
    return resolved


def renderer_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """Only what a renderer plausibly needs; secrets in the host's environment stay there."""
    env = {key: environ[key] for key in ENV_KEEP if key in environ}
    env["PYTHONIOENCODING"] = "utf-8"
    env["PYTHONUTF8"] = "1"
    env.setdefault("PATH", os.defpath)
    return env


@dataclass(frozen=True)
class RunRequest:
    renderer: Path
    workdir: Path
    timeout_s: float
    stdout_limit_bytes: int
    env: Mapping[str, str]


@dataclass(frozen=True)
class RunOutcome:
    """What happened, as facts; `classify` decides what it means."""

    exit_code: int | None
    timed_out: bool
    cancelled: bool
    stdout: bytes
    stdout_overflow: bool
    stderr_tail: bytes
    spawn_error: str | None
    duration_s: float


class RendererRunner(Protocol):
    """Runs one renderer; `cancel` set means stop now (the watch is being stopped)."""

    def __call__(self, request: RunRequest, cancel: threading.Event) -> RunOutcome: ...


def stdout_limit_for(max_body_chars: int) -> int:
    """A UTF-8 character is at most 4 bytes; the slack leaves room to report the real size."""
    return max_body_chars * 4 + 4096


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def run_renderer(request: RunRequest, cancel: threading.Event) -> RunOutcome:
    """Run `[sys.executable, renderer]` in its own session with every bound enforced."""
    started = time.monotonic()
    try:
        proc = subprocess.Popen(
            [sys.executable, str(request.renderer)],
            cwd=request.workdir,
            env=dict(request.env),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
            close_fds=True,
        )
    except OSError as exc:
        return RunOutcome(None, False, False, b"", False, b"", exc.strerror or "spawn failed", 0.0)
    assert proc.stdout is not None and proc.stderr is not None
    deadline = started + request.timeout_s
    out = bytearray()
    err = bytearray()
    overflow = timed_out = cancelled = False
    selector = selectors.DefaultSelector()
    selector.register(proc.stdout, selectors.EVENT_READ, "out")
    selector.register(proc.stderr, selectors.EVENT_READ, "err")
    try:
        while selector.get_map():
            now = time.monotonic()
            if now >= deadline:
                timed_out = True
                break
            if cancel.is_set():
                cancelled = True
                break
            for key, _ in selector.select(timeout=min(_POLL_S, deadline - now)):
                chunk = os.read(key.fd, _READ_CHUNK)
                if not chunk:
                    selector.unregister(key.fileobj)
                elif key.data == "out":
                    out += chunk
                    if len(out) > request.stdout_limit_bytes:
                        overflow = True
                else:
                    err += chunk
                    del err[:-STDERR_TAIL_BYTES]
            if overflow:
                break
            if proc.poll() is not None:
                # The leader is gone: drain what is buffered, then stop waiting for pipes that
                # a leftover child might hold open forever.
                _kill_group(proc.pid)
    finally:
        selector.close()
        _kill_group(proc.pid)
        proc.stdout.close()
        proc.stderr.close()
        exit_code = proc.wait()
    return RunOutcome(
        exit_code=None if (timed_out or cancelled or overflow) else exit_code,
        timed_out=timed_out,
        cancelled=cancelled,
        stdout=bytes(out[: request.stdout_limit_bytes]),
        stdout_overflow=overflow,
        stderr_tail=bytes(err),
        spawn_error=None,
        duration_s=time.monotonic() - started,
    )


@dataclass(frozen=True)
class Rendered:
    body: str


@dataclass(frozen=True)
class RenderFailure:
    code: ErrorCode
    message: str


def classify(
    outcome: RunOutcome, max_body_chars: int, timeout_s: float
) -> Rendered | RenderFailure:
    """What a run means. Pure: the same outcome always gets the same verdict."""
    if outcome.spawn_error is not None:
        return RenderFailure(
            "renderer_failed", f"the renderer could not start: {outcome.spawn_error}"
        )
    if outcome.cancelled:
        return RenderFailure("renderer_failed", "the run was cancelled because the watch stopped")
    if outcome.timed_out:
        return RenderFailure(
            "renderer_timeout", f"the renderer ran longer than {timeout_s:g} s and was killed"
        )
    if outcome.stdout_overflow:
        return RenderFailure(
            "body_too_large",
            f"the renderer printed far more than max-body-chars ({max_body_chars}); refused",
        )
    if outcome.exit_code != 0:
        return RenderFailure(
            "renderer_nonzero_exit", f"the renderer exited with code {outcome.exit_code}"
        )
    try:
        body = outcome.stdout.decode("utf-8")
    except UnicodeDecodeError as exc:
        return RenderFailure(
            "renderer_invalid_utf8", f"stdout is not valid UTF-8 (byte offset {exc.start})"
        )
    if not body.strip():
        return RenderFailure("renderer_blank_output", "the renderer printed nothing but whitespace")
    if len(body) > max_body_chars:
        return RenderFailure(
            "body_too_large",
            f"the body has {len(body)} characters, over max-body-chars ({max_body_chars}); "
            "refused, not truncated: keep the card short and link details",
        )
    return Rendered(body)
