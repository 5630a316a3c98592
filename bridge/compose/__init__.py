"""Compose: what one route should show, as a channel-neutral view.

Pure functions from a tracked agent (card state, activity) and the route's preferences to a
`CardView`; the one place where text that people read is worded, times are formatted and agent
text is redacted.

May import: the standard library, `channels.base`, `bridge.track`, `bridge.notices.text`,
`producers.*.contract`.
"""
