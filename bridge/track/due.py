"""The agents whose state changes with the passage of time alone, by when.

An agent that is running turns into "no output" when it stays silent long enough; nothing
on disk changes at that moment, so the service must look again at a given time. With
thousands of agents, finding those whose time has come by scanning all of them every second
would cost in proportion to the fleet even when nothing happens. A heap costs in
proportion to the agents actually due: `pop_due` looks at the due entries and one more.

Each agent has at most one due time; setting a new one supersedes the old entry, which
stays in the heap until it surfaces and is then skipped (lazy deletion keeps `set` at
O(log n) without searching the heap). The heap is compacted when stale entries outnumber
live ones, so it never holds more than about twice the agents with a due time.
"""

from __future__ import annotations

import heapq


class DueAgents:
    """Agent ids by due time (seconds on any clock, the same for every call)."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, str]] = []
        self._live: dict[str, tuple[float, int]] = {}  # agent -> its current (when, sequence)
        self._sequence = 0

    def __len__(self) -> int:
        return len(self._live)

    def __contains__(self, agent_id: object) -> bool:
        return agent_id in self._live

    def set(self, agent_id: str, when: float) -> None:
        """`agent_id` is due at `when` (replacing any earlier due time)."""
        current = self._live.get(agent_id)
        if current is not None and current[0] == when:
            return  # unchanged: the same moment again adds nothing to the heap
        self._sequence += 1
        self._live[agent_id] = (when, self._sequence)
        heapq.heappush(self._heap, (when, self._sequence, agent_id))
        if len(self._heap) > 2 * len(self._live) + 16:
            self._compact()

    def set_earliest(self, agent_id: str, when: float) -> None:
        """`agent_id` is due at `when` unless it is due sooner already."""
        current = self._live.get(agent_id)
        if current is None or when < current[0]:
            self.set(agent_id, when)

    def discard(self, agent_id: str) -> None:
        self._live.pop(agent_id, None)

    def next_due(self) -> float | None:
        """The earliest live due time, or None when no agent waits for one."""
        self._drop_stale_head()
        return self._heap[0][0] if self._heap else None

    def pop_due(self, now: float, limit: int | None = None) -> list[str]:
        """The agents due at or before `now`, earliest first, at most `limit` of them; they
        are removed (those beyond the limit stay due)."""
        due: list[str] = []
        while limit is None or len(due) < limit:
            self._drop_stale_head()
            if not self._heap or now < self._heap[0][0]:
                return due
            _, _, agent_id = heapq.heappop(self._heap)
            del self._live[agent_id]
            due.append(agent_id)
        return due

    def _drop_stale_head(self) -> None:
        while self._heap:
            _, sequence, agent_id = self._heap[0]
            live = self._live.get(agent_id)
            if live is not None and live[1] == sequence:
                return
            heapq.heappop(self._heap)

    def _compact(self) -> None:
        self._heap = [(when, seq, agent) for agent, (when, seq) in self._live.items()]
        heapq.heapify(self._heap)
