"""The `task_card` capability: one truthful, self-refreshing task card per agent.

An agent hands an LTP-v2 envelope to `TaskCard.call` (directly, through `taskcard tool|card`,
or through the `taskcard mcp` server); a per-workdir host runs the agent's renderer on an
interval and publishes the body through the file contract in `contract.py`.

May import: the standard library, pydantic, mcp (only `mcp_server`), and `producers.ledger`
(only where the MCP server lists its tool and the host wires its monitor in), `producers.inbox`
and `producers.reports` (only where the MCP server lists their tools and writes its
answers). Never `bridge` or `channels`.
"""

from taskcard.producers.task_card.capability import TaskCard
from taskcard.producers.task_card.envelope import (
    ACTIONS,
    EnvelopeError,
    envelope_json_schema,
    parse_envelope,
)
from taskcard.producers.task_card.meta import MetaProjector, project_meta
from taskcard.producers.task_card.runtime import HostAlreadyRunning
from taskcard.producers.task_card.workdir_arg import WorkdirError

__all__ = [
    "ACTIONS",
    "EnvelopeError",
    "HostAlreadyRunning",
    "MetaProjector",
    "TaskCard",
    "WorkdirError",
    "envelope_json_schema",
    "parse_envelope",
    "project_meta",
]
