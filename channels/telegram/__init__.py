"""Telegram transport: python-telegram-bot against the Bot API (or a local server / fake).

`channel` holds `TelegramChannel` (the `Channel` implementation), `render` the pure
card-to-text-and-entities rendering, `errors` the one translation of PTB exceptions,
`commands` the getUpdates long poll for `/taskcard`, `http11` the lean keep-alive HTTP
transport under PTB, `request` the 429 and lost-answer signals (and PTB's httpx transport
with them, used when a proxy is configured), `moves` the groups upgraded to supergroups,
`config` the `[telegram]` settings, `usernames` the lookup of the public chats a route
names by `@username`. May import:
`channels.base`, `channels.errors`, `channels.aio`, python-telegram-bot, httpx, certifi and
telegramify-markdown; this `__init__` imports nothing so that loading the config does not
load the client library.
"""
