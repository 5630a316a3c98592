"""`taskcard ledger render`: a ready task card renderer that tells only what the ledger knows.

It prints Markdown: the purpose, time since the recorded start, the last movement and what
moved, step k of n, the truth state, pending external work and its age, the blocker and the
next gate. Where the ledger holds no truth the card says `unknown` instead of guessing.
Relative times are rounded to minutes so the card changes when something changed, not every
second. The derived state is recomputed from the truth, never read back from the file.
"""

from __future__ import annotations

import contextlib
import re
from datetime import datetime
from pathlib import Path
from typing import Final

from taskcard.producers.ledger.model import TaskRecord, derive, moved_at
from taskcard.producers.ledger.monitor import FUTURE_SKEW_S
from taskcard.producers.task_card.contract import one_line

UNKNOWN: Final = "unknown"
RENDERER_FILE: Final = "ledger_renderer.py"

# What Markdown may read as markup inside a line: the agent's own words (a purpose, a
# reason) are shown as written, so `*.py` keeps its star and `**x**` does not close the
# purpose's bold early. A backslash before ASCII punctuation is CommonMark's escape, which
# both channels' renderers read.
_MARKUP: Final = re.compile(r"[\\`*_\[\]<>~|&!#]")


def as_text(words: str) -> str:
    """`words` on one line (white space collapsed), every Markdown mark in it shown as the
    character it is, without controls or bidirectional formatting (`one_line`): the writers
    take a purpose or a reason holding an escape sequence or a right-to-left override, and
    the card wrote them raw into `taskcard.md`, for every reader of the file to act on."""
    return _MARKUP.sub(lambda mark: "\\" + mark.group(), one_line(words))


def format_age(since: datetime | None, now: datetime) -> str:
    """`3h 05m`, `12m`, `<1m`; `unknown` without a time or for one dated ahead of the clock
    by more than the monitor allows (it is no age; `<1m` would call it fresh)."""
    if since is None or (since - now).total_seconds() > FUTURE_SKEW_S:
        return UNKNOWN
    minutes = max(0, int((now - since).total_seconds() // 60))
    if minutes < 1:
        return "<1m"
    hours, minutes = divmod(minutes, 60)
    if hours >= 24:
        days, hours = divmod(hours, 24)
        return f"{days}d {hours:02d}h"
    return f"{hours}h {minutes:02d}m" if hours else f"{minutes}m"


def _ago(since: datetime | None, now: datetime) -> str:
    age = format_age(since, now)
    return age if age == UNKNOWN else f"{age} ago"


def render_markdown(record: TaskRecord, now: datetime) -> str:
    """The card body for one task at `now`. Pure."""
    observed = record.observed
    derived = derive(observed)
    purpose = as_text(record.task.purpose) or UNKNOWN
    lines = [f"**{purpose}**", f"task `{record.task.task_id}`"]
    lines.append(f"started: {_ago(observed.started_at, now)}")
    last_moved = moved_at(observed)
    ahead = last_moved is not None and (last_moved - now).total_seconds() > FUTURE_SKEW_S
    if last_moved is not None and not ahead:
        source = (observed.last_delta_source or UNKNOWN).replace("_", " ").lower()
        lines.append(f"last movement: {_ago(last_moved, now)} ({source})")
    elif ahead:
        # What the monitor answers TRUTH_INCONSISTENT for: not "<1m ago", a fresh movement.
        lines.append(f"last movement: {UNKNOWN} (dated ahead of the clock)")
    else:
        lines.append(f"last movement: {UNKNOWN}")
    if derived.step_count == 0:
        lines.append(f"step: {UNKNOWN}")
    elif derived.current_step is None:
        lines.append(f"step: all {derived.step_count} done")
    else:
        lines.append(
            f"step: {derived.step_index} of {derived.step_count} (`{derived.current_step}`, "
            f"{derived.step_states[derived.current_step].lower()})"
        )
    state = derived.workflow if derived.truth_state != "NO_TRUTH" else UNKNOWN
    lines.append(f"state: {state} · truth: {derived.truth_state.replace('_', ' ').lower()}")
    pending = [j for j in observed.external_jobs if j.job_id in derived.pending_external]
    if pending:
        lines.append(
            "waiting on: "
            + ", ".join(
                f"`{j.job_id}` {j.status} for {format_age(j.status_changed_at, now)}"
                for j in pending
            )
        )
    block = observed.block
    if block is not None and block.active:
        where = f" at `{block.step}`" if block.step else ""
        lines.append(f"blocked{where}: {block.kind}: {as_text(block.reason)}")
    else:
        lines.append("blocker: none")
    lines.append(f"next gate: {derived.next_gate}")
    warnings = [i.detail for i in derived.inconsistencies]
    if ahead:
        warnings.insert(0, "the last movement is dated ahead of the clock")
    for warning in warnings[:3]:
        lines.append(f"⚠ {warning}")
    return "\n".join(lines) + "\n"


def renderer_source(ledger_rel: str, task_id: str) -> str:
    """The tiny renderer `ledger init` writes into the workdir for `taskcard card start`."""
    return (
        '"""Task card renderer for the long task ledger (written by `taskcard ledger init`)."""\n'
        "import sys\n\n"
        "from taskcard.producers.ledger.cli import main\n\n"
        f"sys.exit(main(['render', '--ledger', {ledger_rel!r}, {task_id!r}]))\n"
    )


def write_renderer(workdir: Path, ledger_path: Path, task_id: str) -> bool:
    """Write `RENDERER_FILE` for `task_id` into `workdir` (an existing one, or a link at its
    name, is kept): what `ledger init` does from the command line and from MCP alike. False
    when the ledger lies outside the workdir, which a renderer run there could not name
    relatively."""
    if not ledger_path.is_relative_to(workdir):
        return False
    rel = str(ledger_path.relative_to(workdir))
    # Created only where nothing is (`x`: O_EXCL, which a link at the name also fails): a
    # dangling link there was followed, and the renderer written wherever it led, outside
    # the workdir.
    with (
        contextlib.suppress(FileExistsError),
        (workdir / RENDERER_FILE).open("x", encoding="utf-8") as renderer,
    ):
        renderer.write(renderer_source(rel, task_id))
    return True
