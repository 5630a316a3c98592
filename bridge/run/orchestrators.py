"""Each chat's orchestrator mark: the agent the other agents of the chat wake.

The reports-and-signals spec pushes a signal's pointer to "the card that spawned it, or the
last directive sent, or the board's orchestrator mark". A parent agent is woken by its
children already (`InboxDesk.wake`); an agent that coordinates others it did not spawn
(started by people, or on another host) is the chat's orchestrator instead: the signals of
the chat's other agents that no parent is woken by wake it through its inbox, with the same
wake the parent gets.

The mark starts as the route's `orchestrator` setting; `/taskcard orchestrator AGENT` and
`/taskcard orchestrator off` change it, and the choice is kept in the store's cursors under
`orchestrator:<chat scope>`, as the chat's view is (`bridge.run.boards`): it survives a
restart and wins over the config until changed again in the chat. `off` is a choice too (no
orchestrator here, whatever the config names). A choice naming an agent the chat no longer
follows is set aside while it does not (the config's mark applies, and the chat's answer and
`taskcard status` say so); it applies again once the agent is followed again, and one naming
an agent forgotten as departed is dropped.
"""

from __future__ import annotations

import json
import logging
import shlex
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

from taskcard.bridge.store.sqlite import StateStore

log = logging.getLogger(__name__)


CURSOR_PREFIX = "orchestrator:"


@dataclass(frozen=True)
class ChatMarks:
    """What decides a chat's orchestrator besides its choice: the agents it follows and its
    routes' `orchestrator` setting (clustered, those of every live instance)."""

    followed: frozenset[str]
    configured: str | None


def orchestrator_cursor(scope: str) -> str:
    """Where a chat's `/taskcard orchestrator` choice is kept in the store."""
    return CURSOR_PREFIX + scope


@dataclass(frozen=True)
class Choice:
    """What a chat chose with `/taskcard orchestrator`: `agent`, or None for `off`."""

    agent: str | None


def encode_choice(choice: Choice) -> str:
    return json.dumps({"agent": choice.agent}, ensure_ascii=False)


def parse_choice(raw: str | None) -> Choice | None:
    """A stored choice, or None for none or a value this version does not write (the config
    then decides)."""
    if not raw:
        return None
    try:
        data = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(data, dict) or "agent" not in data:
        return None
    agent = data["agent"]
    return Choice(agent) if agent is None or isinstance(agent, str) else None


def unfollowed_choice(choice: Choice | None, followed: Collection[str]) -> str | None:
    """The agent the chat chose that it no longer follows (a reload or a departure took its
    route away), or None: such a choice is set aside while the agent is not followed."""
    if choice is None or choice.agent is None or choice.agent in followed:
        return None
    return choice.agent


def chat_orchestrator(
    choice: Choice | None, configured: str | None, followed: Collection[str]
) -> str | None:
    """The chat's orchestrator: its choice, else its route's setting; only an agent the chat
    follows (`followed`) is one. A choice of an agent the chat no longer follows is set aside
    (`unfollowed_choice`), the route's setting applying meanwhile: it marked nobody and kept
    the setting from applying until someone in the chat changed it, though nobody had."""
    chosen = choice is not None and unfollowed_choice(choice, followed) is None
    name = choice.agent if chosen and choice is not None else configured
    return name if name is not None and name in followed else None


def orchestrator_pointer(agent_id: str, workdir: Path, report_seq: int | None) -> str:
    """The line a wake of the orchestrator adds to the signal's text: how to read the
    agent's reports (the CLI, or the MCP `reports` tool, whose `child_workdir` takes any
    absolute folder). From typed values only: the id, the configured or discovered folder,
    the report's number."""
    where = shlex.quote(str(workdir))  # for a shell
    named = json.dumps(str(workdir), ensure_ascii=False)  # for a tool's JSON arguments
    if report_seq is None:
        return (
            f"You are woken as the orchestrator of a chat that follows {agent_id}. Its latest"
            f" report, if any: taskcard reports --workdir {where} (or the reports MCP tool with"
            f" child_workdir {named})."
        )
    after = report_seq - 1
    return (
        f"You are woken as the orchestrator of a chat that follows {agent_id}. Read report"
        f" #{report_seq}: taskcard reports --workdir {where} --after {after} (or the reports"
        f" MCP tool with child_workdir {named} and after {after})."
    )


class ChatOrchestrators:
    """The stored `/taskcard orchestrator` choice of each chat, read once and kept."""

    def __init__(self, store: StateStore) -> None:
        self._store = store
        self._choices: dict[str, Choice | None] = {}

    def choice(self, scope: str) -> Choice | None:
        if scope not in self._choices:
            self._choices[scope] = parse_choice(self._store.get_cursor(orchestrator_cursor(scope)))
        return self._choices[scope]

    def choose(self, scope: str, agent: str | None) -> None:
        """Keep the chat's choice (`None`: off) and persist it."""
        choice = Choice(agent)
        self._store.set_cursor(orchestrator_cursor(scope), encode_choice(choice))
        self._choices[scope] = choice
        log.info("chat %s: orchestrator %s", scope, agent or "off")

    def forget_agent(self, agent_id: str) -> None:
        """Drop every chat's choice of `agent_id`, an agent forgotten as departed: back later
        it is a new agent, which a choice made of the old one must not mark (and wake with
        the chat's signals). The route's `orchestrator` decides there again."""
        keys = self._store.cursor_keys(CURSOR_PREFIX)
        named = [
            key
            for key, raw in self._store.get_cursors(keys).items()
            if (choice := parse_choice(raw)) is not None and choice.agent == agent_id
        ]
        if not named:
            return
        self._store.delete_cursors(named)
        for key in named:
            self._choices.pop(key.removeprefix(CURSOR_PREFIX), None)
            log.info(
                "chat %s: orchestrator %s forgotten", key.removeprefix(CURSOR_PREFIX), agent_id
            )
