"""Feishu / Lark transport: interactive cards through lark-oapi (or a test fake).

`channel` (the `Channel`), `card` (card JSON 2.0 rendering, pure), `errors` (answer
translation, pure), `transport` and `token` (lark-oapi request models over one pooled HTTP
client, tenant token), `events` (callback decoding, command parsing, duplicate ids),
`webhook` (HTTP callback server), `longconn` (`lark_oapi.ws.Client` in its own thread),
`content` (the plain text of a received text or rich post), `scopes` (the rate scopes' keys),
`config` (the `[feishu]` settings).
May import: `channels.base`, `channels.errors`, lark-oapi, httpx and aiohttp.
"""
