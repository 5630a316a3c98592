"""Notices: short, content-safe messages to people about an agent's card.

Built only from typed fields of the producer's notifications, never from renderer output.

May import: the standard library, `producers.*.contract`, `bridge.compose.redact`.
"""
