"""When a watch ticks: a fixed grid, `origin + k * interval_s`, with overruns skipped.

A tick is due on the grid, never `interval_s` after the previous render ended, so render
time does not add up as drift: the only lateness left is how long the host takes to wake and
launch the renderer. Renders of one watch never overlap, so a render that runs past one or
more grid points makes those ticks impossible; they are skipped (counted, never made up in a
burst) and the next tick waits for the next grid point. A render that ends exactly on a grid
point runs that tick at once. `next_slot` is the whole decision, pure and table-tested.
"""

from __future__ import annotations

import math


def next_slot(origin: float, interval_s: float, last_slot: int, now: float) -> tuple[int, int]:
    """The grid slot of the next tick and how many slots were skipped. Pure.

    `last_slot` is the slot of the tick that just ran (0 for the render at start or resume),
    `now` the moment it ended. The next slot is the first grid point not before `now`, and
    always after `last_slot` (a clock read before the last due time never moves the grid
    back).
    """
    reached = math.ceil((now - origin) / interval_s)
    slot = max(last_slot + 1, reached)
    return slot, slot - last_slot - 1


def slot_due(origin: float, interval_s: float, slot: int) -> float:
    """When `slot` is due; a product, not a running sum, so rounding never accumulates."""
    return origin + slot * interval_s
