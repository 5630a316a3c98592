"""Benchmarks of taskcard against the fake Telegram Bot API, each beside a polling baseline.

`python -m bench all|SCENARIO [--quick] [--real-limits] [--no-record]` runs the scenarios of
issues 5 and 13, prints a table and appends the figures to `bench/RESULTS.md` (`make bench`:
all of them at full size, about 30 minutes on 2 cores; `make bench-quick`: every scenario at a
reduced size in about 5 minutes, for development, with `--no-record`). Scenarios:

- `latency`: rename-to-edit latency, one agent per private chat (targets p50 <= 8 ms, p99
  <= 20 ms);
- `storm`: 100 agents changing every 200 ms, one group of 100 cards and 20 private chats;
  `board`: the same storm with the group on `view = "board"` (target: the group's p99
  staleness under 10 s, zero 429s);
- `cluster_storm`: the storm's agents split across three `serve` instances sharing one Redis
  (started on loopback; `make redis-server` installs it): zero 429s, every limit held across
  the instances, no resident duplicated;
- `scale`: 10,000 agents in 100 groups of 100, 5% changing every 5 s, no limits (targets:
  CPU <= 5 s/min, peak RSS <= 150 MB, latency p50 <= 20 ms and p99 <= 100 ms, first card on
  every route within 15 s); `scale2k`: the same at 2,000 agents (CPU <= 2 s/min);
- `idle`: 10,000 agents that do not change (CPU < 0.5 s/min);
- `creation`: 10,000 residents in 100 groups under Telegram's real limits (created within
  10% of 10,000 / 30 s, zero 429s, every chat complete within two rounds of the others);
- `producer` (+ `producer_host`): the producer host's own CPU and tick drift (<= 2% of a
  core, drift p99 <= 10 ms).

`python -m bench changecost [--quick]` (not part of `all`, no target) counts instead of
timing: the Python calls, bytecodes and C calls one card change costs in a real `serve`
(`changecost`, with `changecost_probe` running the service under a tracer);
`python -m bench.changecost --mode profile` profiles the same window. For work on the change
path on a machine whose timings are noise.

Modules besides the scenarios:

- `measure`: process CPU and peak RSS from /proc, percentiles, machine facts.
- `harness`: a fleet of workdirs, the card writer with its write log, `serve` and the
  baseline as subprocesses, and what the fake's request log says each chat showed (every
  version tag in a message, so a board shows each agent on it).
- `baseline`: the reference approach (poll each agent once a second, edit on every change,
  no coalescing, `retry_after` ignored), run as its own process.
- `results`: the figures, the table and the RESULTS.md writer.

May import the product packages and `tests.fakes` / `tests.e2e.harness`; nothing imports bench.
"""
