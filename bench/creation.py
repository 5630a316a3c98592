"""Creation: a cold fleet's residents created under Telegram's real limits, fairly.

10,000 agents routed to 100 groups of 100 (quick: 100 groups of 10); every card exists before
`serve` starts, so every resident is created in one go. The fake enforces Telegram's limits
(30 requests a second per bot, 20 a minute per group, 1 a second per private chat) and the
service is configured with the same ones. 100 groups at 20 a minute could take 33 a second,
so the bot's 30 a second is the binding limit (quick mode keeps 100 groups for this reason:
with fewer than 90 the groups, not the bot, would set the pace).

Figures:
- creation time, from the first request the fake counts against the bot's budget to the
  last resident created, against 10,000 / 30 s + 10% (quick: 1,000 / 30 s + 10%). Every
  request the service makes in that time counts (edits, pins, notices, deletes: the note
  lists them by method), since they share the bot's budget;
- 429 answers (target 0);
- fairness: the spread of completion times, from the first chat to have all its residents
  to the last, against two rounds of the bot across the chats (2 x groups / 30 s, 6.7 s).
  Why this definition: a chat's last card is what its people wait for, and the figure fails
  for every way of serving some chats first: in chat order, or letting each group spend its
  20-a-minute burst before the next gets a turn, finishes early chats tens of seconds ahead
  (under 20 a minute a group cannot finish in under four minutes, so a work-conserving but
  unfair scheduler spreads completions over up to 90 s). Round-robin across chats finishes
  them within one round. Unlike a figure taken at every moment, it does not blame the
  scheduler for the order in which the service reads 10,000 cards at start-up (the first
  chats have work seconds before the last), as long as late chats are let to catch up;
- the lead, as a second view without a target: at any moment, how many residents the most
  advanced chat has beyond the least advanced chat that is still incomplete (what a person
  in the slowest chat sees). It includes the start-up skew;
- time until every chat shows its first card (from the start of `serve`).

The polling baseline does not run here: it ignores `retry_after`, so under real limits it
measures nothing but 429s (the storm scenario compares that), and polling 10,000 agents would
load the machine the service is measured on.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from bench.harness import (
    CardWriter,
    Limits,
    ProcessMeter,
    Progress,
    agent_ids,
    chat_routes,
    make_fleet,
    side_by_side,
    wait_all_shown,
)
from bench.results import Figure, ScenarioResult
from tests.fakes.telegram_api import BOT_LIMITED_METHODS

FIRST_GROUP = -1006000000000
GROUPS = 100
ROUNDS = 2  # the completion spread allowed, in rounds of the bot across the chats
SLACK = 1.10  # "at most 10% over" the bot-bound time


def max_lead(
    created: Sequence[tuple[float, int]], residents: Mapping[int, int]
) -> tuple[int, float]:
    """The largest lead of any chat over the least advanced incomplete chat, and when.

    `created`: (time, chat) of each resident created, in any order; `residents`: how many
    residents each chat has in all. Measured after each creation; chats not yet complete
    with nothing created count as 0. Returns (0, nan) when nothing was created.
    """
    counts = dict.fromkeys(residents, 0)
    best, best_at = 0, float("nan")
    for at, chat in sorted(created):
        counts[chat] = counts.get(chat, 0) + 1
        incomplete = [n for c, n in counts.items() if n < residents.get(c, 0)]
        if not incomplete:
            break
        lead = max(counts.values()) - min(incomplete)
        if lead > best:
            best, best_at = lead, at
    return best, best_at


def completion_spread(created: Sequence[tuple[float, int]], residents: Mapping[int, int]) -> float:
    """Seconds between the first and the last chat to have all its residents (nan: none
    complete)."""
    counts: dict[int, int] = {}
    done: list[float] = []
    for at, chat in sorted(created):
        counts[chat] = counts.get(chat, 0) + 1
        if counts[chat] == residents.get(chat):
            done.append(at)
    return done[-1] - done[0] if done else float("nan")


async def run(
    workspace: Path, *, quick: bool, per_group: int | None = None, groups: int = GROUPS
) -> ScenarioResult:
    """`per_group` and `groups` override the mode's sizes (for a smoke run)."""
    per_group = per_group or (10 if quick else 100)
    count = groups * per_group
    ids = agent_ids(count)
    routes = chat_routes(ids, per_group, FIRST_GROUP, -1)
    limits = Limits()
    assert limits.bot is not None
    bot_rate = limits.bot.max_calls / limits.bot.period_s
    bound_s = count / bot_rate * SLACK
    fleet = make_fleet(workspace / "creation", ids, routes)
    writer = CardWriter(fleet)
    writer.activate_all()
    started = time.monotonic()
    progress = Progress("creation")
    async with side_by_side(
        fleet, limits.fake(), limits, with_baseline=False, progress=progress
    ) as run:
        meter = ProcessMeter(run.serve.proc.pid if run.serve.proc else 0)
        meter.begin()
        serve_started = time.monotonic()
        progress(f"serve started; {count} residents to create (bound {bound_s:.0f} s)")
        await wait_all_shown(run.shown_ours, run.keys, writer.versions, bound_s * 3 + 120)
        meter.end()
        progress("every resident created; stopping")
        fake = run.ours
        shown = run.shown_ours
        keys = run.keys
    created = [(shown.timeline[key][0][0], key[0]) for key in keys if shown.timeline.get(key)]
    residents = {route.chat_id: len(route.agents) for route in routes}
    budgeted = [r for r in fake.requests if r.method in BOT_LIMITED_METHODS]
    first_s = min((r.at_s for r in budgeted), default=float("nan"))
    last_s = max((at for at, _ in created), default=float("nan"))
    creation_s = last_s - first_s
    by_method: dict[str, int] = {}
    for request in budgeted:
        if request.at_s <= last_s:
            by_method[request.method] = by_method.get(request.method, 0) + 1
    others: dict[str, int] = {}
    for request in fake.requests:
        if request.method not in BOT_LIMITED_METHODS and request.at_s <= last_s:
            others[request.method] = others.get(request.method, 0) + 1
    lead, lead_at = max_lead(created, residents)
    spread_s = completion_spread(created, residents)
    spread_bound_s = ROUNDS * groups / bot_rate
    first_per_chat: dict[int, float] = {}
    for at, chat in created:
        first_per_chat[chat] = min(at, first_per_chat.get(chat, at))
    every_chat_s = max(first_per_chat.values(), default=float("nan")) - serve_started
    rate_limited = len(fake.rate_limited)
    result = ScenarioResult(
        "creation",
        f"{count} residents in {groups} groups of {per_group}, every card written before serve "
        f"starts; Telegram's real limits in the fake and the service (30/s per bot, 20 per "
        f"60 s per group, 1/s per private chat); taskcard alone.",
        wall_s=time.monotonic() - started,
    )
    result.figures += [
        Figure(
            "creation time",
            creation_s,
            "s",
            f"<= {bound_s:.0f}",
            creation_s <= bound_s,
            note=f"first budgeted request to last resident; {count} / {bot_rate:g} per s "
            f"+ {(SLACK - 1) * 100:.0f}% = {bound_s:.0f} s",
        ),
        Figure(
            "bot budget used",
            sum(by_method.values()) / (creation_s * bot_rate) * 100 if creation_s else 0.0,
            "%",
            note="requests counted against the bot's 30/s during creation, by method: "
            + ", ".join(f"{method} {n}" for method, n in sorted(by_method.items())),
        ),
        Figure("429 answers", float(rate_limited), "", "0", rate_limited == 0),
        Figure(
            "completion spread",
            spread_s,
            "s",
            f"<= {spread_bound_s:.1f}",
            spread_s <= spread_bound_s,
            note=f"last chat complete - first chat complete; bound: {ROUNDS} rounds of the bot "
            f"across {groups} chats",
        ),
        Figure(
            "largest lead of a chat",
            float(lead),
            "residents",
            note="most advanced chat minus least advanced incomplete chat, at any moment"
            + (f" (largest {lead_at - first_s:.0f} s into creation)" if lead else ""),
        ),
        Figure("every chat shows a first card", every_chat_s, "s", note="from serve's start"),
        Figure("serve CPU during creation", meter.cpu_s_per_min, "s/min"),
    ]
    result.notes.append(
        "requests outside the bot's message budget until the last resident (the fake, like "
        "Telegram, does not count them): "
        + (", ".join(f"{method} {n}" for method, n in sorted(others.items())) or "none")
    )
    return result
