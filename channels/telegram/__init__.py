"""Telegram transport: python-telegram-bot against the Bot API (or a local server / fake)."""
