"""The cyclic garbage collector's settings for a long-running service with a large fleet.

Why: nearly everything the service allocates while starting (the configuration, one monitor,
follower and route per agent, the first card of every route) lives as long as the service,
and almost none of it is cyclic garbage. With CPython's default thresholds (a young collection
every 700 net allocations, a full one every 100 young ones after that) a cold start at 10,000
agents ran about 1,500 collections (8 full, each walking every object) for about a second of
CPU before the first cards, only to find the same survivors again and again.

So: while starting, young collections run every `START_YOUNG` allocations; once the first
sight of every agent is taken, one full collection frees the cycles left so far, and the
objects alive are moved out of the collector's view
(`gc.freeze`: they are never scanned again, and a frozen object that later becomes garbage
is still freed by reference counting, as almost all of ours are) and the serving threshold
applies. Cycles still get collected, only in larger batches: the memory that waits for a
collection is bounded by the threshold times a small object's size (well under a megabyte).
"""

from __future__ import annotations

import gc
from typing import Final

# Young collections while starting: rare enough that a cold start at 10,000 agents runs a few
# dozen instead of ~1,500, small enough that garbage cycles waiting for one stay a few MB.
START_YOUNG: Final = 50_000
# Young collections while serving: fewer than the default 700 (per-change work allocates and
# frees in bursts of a few thousand objects), the older generations at their defaults.
SERVE_YOUNG: Final = 5_000


def starting() -> None:
    """Collect rarely while the fleet is loaded and first seen."""
    _, middle, old = gc.get_threshold()
    gc.set_threshold(START_YOUNG, middle, old)


def settled() -> None:
    """The first sight is taken: keep what is alive out of later collections, serve on.

    One full collection first: a cycle that is already garbage would, once frozen, never be
    collected at all (it costs one walk of the heap, once, a fraction of a second at 10,000
    agents)."""
    gc.collect()
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(SERVE_YOUNG, middle, old)
