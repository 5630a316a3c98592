"""Store: the service's durable state (resident ids, preferences, notices, offsets, pauses).

`StateStore` is the interface; `SqliteStore` the embedded default (one file, WAL).

May import: the standard library and `channels.aio` (the shared backoff).
"""
