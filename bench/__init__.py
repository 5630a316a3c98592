"""Benchmarks of taskcard against the fake Telegram Bot API, each beside a polling baseline.

`python -m bench all|latency|storm|scale|producer [--quick]` runs the scenarios of issue 5,
prints a table and appends the figures to `bench/RESULTS.md`. Modules:

- `measure`: process CPU and peak RSS from /proc, percentiles, machine facts.
- `harness`: a fleet of workdirs, the card writer with its write log, `serve` and the
  baseline as subprocesses, and what the fake's request log says each chat showed.
- `baseline`: the reference approach (poll each agent once a second, edit on every change,
  no coalescing, `retry_after` ignored), run as its own process.
- `latency`, `storm`, `scale`, `producer` (+ `producer_host`): one scenario each.
- `results`: the figures, the table and the RESULTS.md writer.

May import the product packages and `tests.fakes` / `tests.e2e.harness`; nothing imports bench.
"""
