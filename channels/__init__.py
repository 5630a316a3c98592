"""Chat transports, one package per platform behind one interface (`channels.base.Channel`).

`base` holds the channel-neutral view of a card and the interface; `errors` the small error
tree every channel translates its platform's errors into, once, at its edge; `aio` the one
backoff and the one "wait for the first of these events" helper, shared with the service. A
channel imports only `channels.base`, `channels.errors`, `channels.aio` and its platform's
client library: never the service (`bridge`) nor a producer.

May import (`base`, `errors`, `aio`): `channels.base`, `channels.errors`, `channels.aio`.
"""
