"""The projection service (`taskcard serve`) and the `taskcard` command line.

It watches many agents' contract files, composes one card per route and keeps one resident
message per route current through `channels`. It imports producers only through their
contract modules (and the CLI registers the producer's own commands); it never runs code
from a workdir and never writes into one (except `taskcard activity`, which is the agent's
own tool for its own log).

May import (its top-level modules: `cli`, `config`, `activity`): `bridge`, `channels`,
`producers.*.contract`.
"""
