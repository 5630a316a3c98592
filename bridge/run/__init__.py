"""Run: the service loop and the operator's commands (`serve`, `status`, `demo`).

The edge that wires the data path together: watch, track, compose, notices, schedule, deliver,
with the state store and the configuration.

May import: anything in `bridge`, `channels` and the producers' contract modules.
"""
