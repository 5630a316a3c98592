"""The `ledger` capability: observed truth for long tasks, a derived state, one monitor action.

A long task keeps a ledger file (default `ledger/long-task-ledger.json` in the workdir).
Owners, executors and external observers append *observations*; each one updates the
`observed` truth of its task, and `derived` is recomputed from that truth alone by one pure
function (`model.derive`). A pure monitor (`monitor.decide`) picks exactly one control action
per task; `supervise` turns actions into typed notifications and retires the task's card.

May import: the standard library, pydantic, `producers.task_card` (its contract, notification
port, runtime, capability and the command line's reading of numbers). Never the service or
a channel.
"""

from taskcard.producers.ledger.model import EVENT_TYPES, FAILURE_KINDS, derive
from taskcard.producers.ledger.monitor import Decision, decide
from taskcard.producers.ledger.store import Ledger, LedgerError

__all__ = ["EVENT_TYPES", "FAILURE_KINDS", "Decision", "Ledger", "LedgerError", "decide", "derive"]
