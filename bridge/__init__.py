"""The projection service (`taskcard serve`) and the `taskcard` command line.

It watches many agents' contract files, composes one card per route and keeps one resident
message per route current through `channels`. It imports producers only through their
contract modules (and the CLI registers the producers' own commands by name); it never runs
code from a workdir, and in one it writes only into the agent's `inbox/` (`bridge.inbox`).

May import (its top-level modules: `cli`, `config`): `bridge`, `channels`,
`producers.*.contract`.
"""
