"""The `task_card` capability: one truthful, self-refreshing task card per agent.

An agent hands an LTP-v2 envelope to `TaskCard.call` (directly, through `taskcard tool|card`,
or through the `taskcard mcp` server); a per-workdir host runs the agent's renderer on an
interval and publishes the body through the file contract in `contract.py`.

May import: the standard library, pydantic, mcp (only `mcp_server`), and `producers.ledger`
(only where the MCP server lists its tool and the host wires its monitor in), `producers.inbox`
and `producers.reports` (only where the MCP server lists their tools and writes its
answers). Never `bridge` or `channels`.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
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

# Where each name lives, imported on first use: a hook's run imports `contract` alone, and
# the capability (pydantic models and all) cost it a tenth of a second of CPU on every call.
_HOMES = {
    "TaskCard": "capability",
    "ACTIONS": "envelope",
    "EnvelopeError": "envelope",
    "envelope_json_schema": "envelope",
    "parse_envelope": "envelope",
    "MetaProjector": "meta",
    "project_meta": "meta",
    "HostAlreadyRunning": "runtime",
    "WorkdirError": "workdir_arg",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(f"{__name__}.{home}"), name)


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
