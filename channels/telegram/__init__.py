"""Telegram transport: python-telegram-bot against the Bot API (or a local server / fake).

`channel` holds `TelegramChannel` (the `Channel` implementation), `render` the pure
card-to-text-and-entities rendering, `errors` the one translation of PTB exceptions,
`commands` the getUpdates long poll for `/taskcard`, `http11` the lean keep-alive HTTP
transport under PTB, `request` the 429 and lost-answer signals (and PTB's httpx transport
with them, used when a proxy is configured), `moves` the groups upgraded to supergroups,
`topics` the forum topics' names, `config` the `[telegram]` settings, `usernames` the
lookup of the public chats a route names by `@username`, `scopes` the rate scopes' keys.
May import:
`channels.base`, `channels.errors`, `channels.aio`, python-telegram-bot, httpx, certifi and
telegramify-markdown; this `__init__` imports nothing so that loading the config does not
load the client library (`import_client_library` loads it, the service's way).
"""

from __future__ import annotations

import sys


def import_client_library() -> None:
    """Import python-telegram-bot without the `cryptography` package it would also load.

    PTB imports `cryptography` whenever it is installed (another dependency brings it), only
    to offer the decryption of Telegram Passport data, which taskcard never asks for: about
    7.5 MB of resident memory for the whole life of a service (a tenth of the 10,000-agent
    budget). PTB reads a failed import as "not installed" (`CRYPTO_INSTALLED = False`), so a
    `None` entry in `sys.modules` while `telegram` is first imported keeps it out; the entry
    is removed right after, so anything else may still import `cryptography`.

    Call it before the first import of a module of this package that imports `telegram`
    (the service does: `bridge.deliver.registry`, `bridge.run.chat_names`,
    `bridge.run.cluster_serve`). Once `telegram` is loaded, it does nothing.
    """
    if "telegram" in sys.modules:
        return
    blocked = "cryptography" not in sys.modules
    if blocked:
        sys.modules["cryptography"] = None  # type: ignore[assignment]  # ImportError while set
    try:
        import telegram  # noqa: F401
    finally:
        if blocked and "cryptography" in sys.modules and sys.modules["cryptography"] is None:
            del sys.modules["cryptography"]
