"""Schedule: one resident message per route, paced within the platforms' limits.

The route scheduler (lanes per chat, latest-wins coalescing, fair turns), the admission queue
that lets chats sharing a scope (the bot's budget) take turns, and the sliding-window rate
limiter it admits requests through. Talks to channels only through `channels.base`.

May import: the standard library, `channels.base`, `channels.errors`, `channels.aio`,
`bridge.store.sqlite`, `bridge.notices.outbox` (the lanes pull notices from it).
"""
