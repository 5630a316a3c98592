"""Retiring the workdir's task card once the ledger's work is done (STOP_AND_DELETE).

A final render first, so the card shows the completion people should see last, then a stop:
the watch ends and the card says it stopped. Nothing is deleted: the ledger, its truth and
the artifacts stay. Inside the host the `TaskCard` is called directly; from the command line
(cron) the call goes to the workdir's host, and only when a watch exists at all: without one
there is no card to retire, and the completion notice does not say it was retired.
"""

from __future__ import annotations

from collections.abc import Callable

from taskcard.producers.task_card.capability import TaskCard
from taskcard.producers.task_card.client import call_via_host
from taskcard.producers.task_card.contract import CardPaths
from taskcard.producers.task_card.descriptor import DescriptorCorrupt, read_descriptor
from taskcard.producers.task_card.runtime import HostPaths

REASONING = "the ledger's task completed: final render, then retire the card"


def _watch_id(paths: CardPaths) -> str | None:
    try:
        descriptor = read_descriptor(paths)
    except DescriptorCorrupt:
        return None
    return descriptor.watch_id if descriptor is not None else None


def retirer_in_host(card: TaskCard) -> Callable[[], None] | None:
    """What retires the host's own card, or None when the workdir has no watch: there is no
    card to retire, and the completion notice must not say there was."""
    watch_id = _watch_id(card.paths)
    if watch_id is None:
        return None

    def retire() -> None:
        card.retry(watch_id)
        card.stop(watch_id)

    return retire


def retirer_via_host(paths: HostPaths) -> Callable[[], None] | None:
    """What retires the workdir's card through its host (from the command line or MCP), or
    None when the workdir has no watch (see `retirer_in_host`)."""
    watch_id = _watch_id(CardPaths(paths.workdir))
    if watch_id is None:
        return None

    def retire() -> None:
        for action in ("retry", "stop"):
            call_via_host(
                paths, {"action": action, "input": {"watch_id": watch_id}, "reasoning": REASONING}
            )

    return retire
