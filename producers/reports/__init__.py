"""Reports and lineage: results that outlive the agent, and who created whom.

`Reports(workdir).add(...)` appends a numbered report to `reports/reports.jsonl` (the seq
only grows, across restarts and concurrent writers); `after(seq)` reads the next one, and
`skipped_lines()` then names the broken lines it read past (as `taskcard reports` says them).
`spawn(child, parent=..., reason=...)` records a child agent's lineage in
`<child>/lineage.json` under a depth cap. The same calls are `taskcard report|reports|spawn`
and the `report`, `reports` and `spawn` MCP tools. `contract` holds the paths and total parsers the
service reads (and the inbox message it writes); the file contracts are in docs/reports.md.

May import: the standard library, `producers.task_card.contract`, `producers.inbox.contract`,
`producers.ledger.contract` (only `lineage`, for the folder a child may not sit in),
`producers.task_card.runtime` (only `mcp_tool`, for its type),
`producers.task_card.workdir_arg` (how a command or tool reads a workdir),
`producers.task_card.tool_failure` (the codes of a failed tool call, which its errors carry),
`producers.task_card.number_args` (how a command reads a number),
`producers.task_card.stdin_json` (how a command reads what is piped to it, bounded and with a
time limit). Never `bridge` or `channels`.
"""

from taskcard.producers.reports.lineage import (
    LineageError,
    LineageWriteFailed,
    read_lineage,
    spawn,
)
from taskcard.producers.reports.store import ReportError, Reports

__all__ = [
    "LineageError",
    "LineageWriteFailed",
    "ReportError",
    "Reports",
    "read_lineage",
    "spawn",
]
