"""Run: the service loop and the operator's commands (`serve`, `status`, `demo`).

The edge that wires the data path together: watch, track, compose, notices, schedule, deliver,
with the state store and the configuration.

May import: `bridge`, `channels`, `producers.*.contract`, `producers.task_card.capability`
(only the demo, which plays the agents' part through the producer's Python API), and
`producers.task_card.number_args` (only the demo, whose `--duration` is read as every numeric
option of the command line is).
"""
