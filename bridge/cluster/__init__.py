"""Cluster: several `taskcard serve` instances sharing bots and state through one Redis.

Off unless `[cluster]` names a Redis. Then the rate windows and 429 pauses are shared (a Lua
script checks and takes a slot in one step), the state store lives in Redis, one instance per
bot holds the polling lease (fenced when it commits the update offset) and publishes commands
to a stream every instance reads, and each agent is served by the one instance holding its
lease. Everything here is an implementation of a seam the embedded service already has
(`Limiter`, `StateStore`, the command sink), so the data path does not know about Redis.

May import: the standard library, redis, pydantic, `bridge.store`, `bridge.schedule.ratelimit`,
`channels.base`.
"""
