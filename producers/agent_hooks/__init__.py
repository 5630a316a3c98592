"""Adapters from agent hosts (Claude Code hooks, Codex `notify`) to the task card's files.

`taskcard hook claude-code|codex` turns one host event into activity log lines, counts
completed turns for reminders and hands undelivered task card wakes back to the agent;
`taskcard init claude-code|codex` wires a project to them. A hook runs inside the agent's
loop, so it never fails its agent: errors go to `logs/taskcard-hook.log` and it exits 0.

May import: the standard library, tomlkit (only `install`), `producers.task_card` modules
that do not start a host, `producers.inbox` (queued chat texts for the hooks). Never
`bridge` or `channels`.
"""
