"""Inbox: text from a chat (or a wake from the service) queued for an agent, and its fate.

The only place the service writes into a workdir (`writer`): `inbox/` and its four folders,
one JSON file per message, atomically, never through a link. Which state people see for a
message (queued, parked, unconfirmed, delivered, failed, cancelled) is a pure function of the
file's fate and the agent's activity (`states`).

May import: the standard library, `channels.base` (shared value types), `producers.*.contract`,
`bridge.track`, `bridge.compose.view`, `bridge.store.sqlite`.
"""
