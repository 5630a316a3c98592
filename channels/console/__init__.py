"""Console transport: the terminal shows every agent's composed card, live (no credentials).

May import: `channels.base`, `channels.errors`.
"""
