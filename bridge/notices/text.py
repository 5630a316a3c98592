"""People-facing notices built from the typed fields of a producer notification.

A notification's `header` and `body` are written for the agent and may quote renderer output,
paths or provider errors; none of that may reach a chat. So the text here is assembled only
from fields with a closed vocabulary: the source, `extra.state`, the stable `extra.code`,
`extra.max_refreshes` and the watch id (`ref_id`, a short producer-assigned name).
Reminders and unknown sources stay agent-side (`None`).
"""

from __future__ import annotations

import re
from typing import Final

from producers.ledger.contract import (
    FAILURE_KIND_NAMES,
    OUTCOMES,
    SOURCE_BLOCKED,
    SOURCE_COMPLETED,
    safe_id,
)
from producers.task_card.contract import SOURCE_ERROR, SOURCE_LIMIT, Notification

# Plain descriptions of the producer's stable error codes.
ERROR_DESCRIPTIONS: Final[dict[str, str]] = {
    "renderer_timeout": "the renderer took longer than its time limit",
    "renderer_nonzero_exit": "the renderer exited with an error",
    "renderer_failed": "the renderer could not be run or printed no usable card",
    "body_too_large": "the renderer's card was too large to publish",
    "write_failed": "the card could not be written to disk",
    "watch_crash": "the card's refresh loop crashed",
    "renderer_blank_output": "the renderer printed an empty card",
    "renderer_invalid_utf8": "the renderer printed text that is not valid UTF-8",
}
_GENERIC_ERROR: Final = "the card could not be refreshed"

# Watch ids are producer-assigned (`tc_1`); anything else is left out rather than echoed.
_SAFE_WATCH_ID: Final = re.compile(r"[A-Za-z0-9_.-]{1,32}")


def safe_error_code(code: object) -> str:
    """A producer error code fit for a chat: one of the known codes, else `unknown`.

    Any program may write the notification file, so a free-form code could carry a path or
    a secret into a chat; only the closed vocabulary passes.
    """
    return code if isinstance(code, str) and code in ERROR_DESCRIPTIONS else "unknown"


def _watch_suffix(notification: Notification) -> str:
    watch_id = notification.ref_id or str(notification.extra.get("watch_id") or "")
    return f" (watch {watch_id})" if _SAFE_WATCH_ID.fullmatch(watch_id) else ""


def notice_text(agent_id: str, notification: Notification) -> str | None:
    """The short message for people about `notification`, or None when it stays agent-side."""
    if notification.source in (SOURCE_BLOCKED, SOURCE_COMPLETED):
        return _ledger_notice(agent_id, notification)
    state = notification.extra.get("state")
    suffix = _watch_suffix(notification)
    if notification.source == SOURCE_ERROR and state == "error":
        code = notification.extra.get("code")
        description = (
            ERROR_DESCRIPTIONS.get(code, _GENERIC_ERROR)
            if isinstance(code, str)
            else (_GENERIC_ERROR)
        )
        shown_code = f" [{code}]" if isinstance(code, str) and code in ERROR_DESCRIPTIONS else ""
        return (
            f"⚠️ {agent_id}: task card error{suffix}: {description}{shown_code}."
            " The last good card stays shown."
        )
    if notification.source == SOURCE_ERROR and state == "recovered":
        return f"✅ {agent_id}: task card recovered{suffix}; it is refreshing again."
    if notification.source == SOURCE_LIMIT or (
        notification.source == SOURCE_ERROR and state == "limit"
    ):
        limit = notification.extra.get("max_refreshes")
        budget = (
            f" after {limit} refreshes"
            if isinstance(limit, int) and not isinstance(limit, bool)
            else ""
        )
        return f"⏹ {agent_id}: task card stopped{suffix}: refresh budget used up{budget}."
    return None


def _ledger_notice(agent_id: str, notification: Notification) -> str:
    """A ledger block or completion, from the task id, failure kind and outcome only."""
    extra = notification.extra
    task_id = safe_id(extra.get("task_id"))
    task = f" task {task_id}" if task_id else " a task"
    if notification.source == SOURCE_BLOCKED:
        kind = extra.get("kind")
        shown = kind if isinstance(kind, str) and kind in FAILURE_KIND_NAMES else "unknown"
        step = safe_id(extra.get("step"))
        where = f" at step {step}" if step else ""
        return f"⛔ {agent_id}:{task} is blocked{where} ({shown}); it needs a person to decide."
    outcome = extra.get("outcome")
    shown = outcome if isinstance(outcome, str) and outcome in OUTCOMES else "unknown"
    return f"🏁 {agent_id}:{task} completed (outcome {shown}); its card is retired."
