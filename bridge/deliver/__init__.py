"""Deliver: the one registry that builds the configured channels and their routes.

Adding a transport is one package under `channels/` plus one entry here. Secrets are read here,
at the edge, from the environment variables the configuration names.

May import: the standard library, `bridge.config`, `channels.*`.
"""
