"""An agent's health: the problems its files or its cards have now, kept in the state.

The service records them per agent under `agent-health:<agent>` (see `Service._guard`), and
`taskcard status`, which runs without the service, reads them back; both sides use these.
"""

from __future__ import annotations

import json

AGENT_HEALTH_PREFIX = "agent-health:"


def agent_health_key(agent_id: str) -> str:
    """The store key under which an agent's current problems are kept for `taskcard status`."""
    return AGENT_HEALTH_PREFIX + agent_id


def parse_agent_health(raw: str | None) -> list[str]:
    """The problems recorded for one agent (the store value), [] when none or unreadable."""
    if not raw:
        return []
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError):
        return []
    if not isinstance(data, list):
        return []
    return [item for item in data if isinstance(item, str)]
