"""Observe: what an operator's tools read about a running service.

Prometheus metrics and a health answer on an opt-in listener, and the systemd readiness
notification. The service reports through a narrow interface: channels are wrapped once at the
edge (so every request is counted without touching the scheduler), and everything that is a
current level (pauses, queues, notices, faulted agents) is read from a snapshot callback at
scrape time, never pushed from the hot path.

May import: the standard library, prometheus_client, aiohttp, pydantic, `channels.base`,
`channels.errors`.
"""
