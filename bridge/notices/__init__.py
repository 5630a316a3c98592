"""Notices: short, content-safe messages to people about an agent's card.

Built only from typed fields of the producer's notifications, never from renderer output
(`text`); `outbox` owns a notice's whole life, from its record in the store to its outcome,
and holds the queues the scheduler's lanes pull notices from.

May import: the standard library, `producers.*.contract`, `channels.base`,
`bridge.store.sqlite`, `bridge.schedule.routes`, `bridge.compose.redact`.
"""
