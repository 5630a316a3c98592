"""Store: the service's durable state (resident ids, preferences, notices, offsets, pauses).

`StateStore` (in `base`) is the interface; `SqliteStore` the embedded default (one file, WAL);
`RedisStore` the shared one for several instances (`[cluster]`).

May import: the standard library, `channels.aio` (the shared backoff), `channels.base` (for
`counted`, the one way the service's texts count things), and redis.
"""
