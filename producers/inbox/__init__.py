"""The agent side of the chat -> agent inbox: claim queued texts, acknowledge them.

The service queues a person's text (or a typed wake) as `inbox/queued/<id>.json` in the
agent's workdir; whatever host reads the agent (the Claude Code hooks, `taskcard inbox`, the
`inbox` MCP tool) claims it by renaming it to `inbox/taken/`, which races safely against the
service's cancel rename to `inbox/cancelled/`, then, once its reader has it, appends one line
to `inbox/acks.jsonl`; a claimed message that never reached its reader goes back to
`inbox/queued/` (`claiming`, `output.py`). Each claim names its holder in `inbox/claims/`
(`holders.py`), so the next claim queues again what a killed reader held.
The file contract is in `contract.py` and docs/producer.md; nothing here follows a link.

May import: the standard library, `producers.task_card.contract`,
`producers.task_card.runtime` and `producers.task_card.tool_failure` (only `mcp_tool`, for
its type and the codes of its failures),
`producers.task_card.workdir_arg` (how the command reads a workdir). Never `bridge` or
`channels`.
"""

from taskcard.producers.inbox.claim import (
    Claim,
    InboxReadFailed,
    InboxUnsafe,
    InboxWriteFailed,
    claim_all,
    claiming,
    peek,
)
from taskcard.producers.inbox.contract import Message, frame

__all__ = [
    "Claim",
    "InboxReadFailed",
    "InboxUnsafe",
    "InboxWriteFailed",
    "Message",
    "claim_all",
    "claiming",
    "frame",
    "peek",
]
