"""Track: per agent, the last good reading of its contract files.

Turns what `watch` says may have changed into a card state (the programmable slot), an activity
summary (the automatic slot's facts) and new notifications, reading every file as untrusted
input. Facts only: formatting text for people is `compose`'s job.

May import: the standard library, `channels.base` (shared value types), `producers.*.contract`,
`bridge.follow`. Never `schedule`, `deliver`, `run` or a channel
implementation.
"""
