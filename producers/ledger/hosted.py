"""The ledger's monitor inside the workdir's task card host, so a ledger needs no cron.

The host calls the returned function every few seconds. It does nothing while the workdir
has no ledger at the default path; otherwise it applies supervision (wakes and notices are
idempotent) and retires the host's own card through the `TaskCard` when the work is done.
A broken ledger is logged and skipped: it never stops the host or the card (a broken task
alone is logged and skipped, its file's other tasks are supervised).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from taskcard.producers.ledger.card import retirer_in_host
from taskcard.producers.ledger.notifications import LedgerNotificationPort
from taskcard.producers.ledger.store import DEFAULT_LEDGER, Ledger, LedgerError
from taskcard.producers.ledger.supervise import supervise
from taskcard.producers.task_card.capability import TaskCard

log = logging.getLogger(__name__)


def ledger_supervisor(card: TaskCard) -> Callable[[], None]:
    # Logged for whoever runs the host, who fixes a ledger with the command line.
    ledger = Ledger(card.workdir / DEFAULT_LEDGER, inside=card.workdir, way="cli")
    port = LedgerNotificationPort(card.paths)

    def check() -> None:
        if not ledger.path.is_file():
            return
        skipped: list[str] = []
        try:
            supervise(ledger, port, apply=True, retire_card=retirer_in_host(card), skipped=skipped)
        except LedgerError as exc:
            log.warning("ledger monitor skipped: %s", exc)
        for problem in skipped:
            log.warning("ledger monitor skipped a task: %s", problem)

    return check
