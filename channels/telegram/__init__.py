"""Telegram transport: python-telegram-bot against the Bot API (or a local server / fake).

`channel` holds `TelegramChannel` (the `Channel` implementation), `render` the pure
card-to-text-and-entities rendering, `errors` the one translation of PTB exceptions,
`commands` the getUpdates long poll for `/taskcard`, `request` the HTTP transport that reads
429s, `config` the `[telegram]` settings. May import: `channels.base`, `channels.errors`,
`channels.aio`, python-telegram-bot and telegramify-markdown; this `__init__` imports
nothing so that loading the config does not load the client library.
"""
