"""The `inbox` MCP tool: claim the chat's queued texts (acknowledged with via `mcp`).

For hosts without hooks: the agent calls it to read what people wrote to it. One result
carries at most `MAX_RESULT_BYTES` of framed text; `more_queued` says to call again.

`call_inbox` claims; the server settles the claim with `settle_inbox` once it knows whether
the client read the answer: acknowledged as delivered, or put back in the queue (an answer
that could not be written, a client gone before reading it, a cancelled call).
"""

from __future__ import annotations

import sys
from typing import Any, Final

from taskcard.producers.inbox.claim import (
    InboxReadFailed,
    InboxUnsafe,
    InboxWriteFailed,
    acknowledge,
    claim,
    peek,
    release,
)
from taskcard.producers.inbox.contract import INBOX_DIR
from taskcard.producers.task_card.runtime import HostPaths
from taskcard.producers.task_card.tool_failure import (
    BAD_ARGUMENTS,
    READ_FAILED,
    UNUSABLE_FILE,
    WORKDIR_GONE,
    WRITE_FAILED,
    failed,
)
from taskcard.producers.task_card.workdir_arg import WorkdirError

TOOL_NAME: Final = "inbox"
VIA: Final = "mcp"
MAX_RESULT_BYTES: Final = 8 * 1024
TOOL_DESCRIPTION: Final = (
    "Read the messages people sent you from a chat (and taskcard's notices, such as a "
    "child agent's report). Claims them: each is returned once. peek=true lists without "
    "claiming. When more_queued is true, call again."
)


def input_schema() -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {
            "peek": {"type": "boolean", "description": "list only, claim nothing"},
        },
    }


def output_schema() -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {
            "status": {"type": "string", "description": "ok, or failed with a message"},
            "messages": {
                "type": "array",
                "items": {"type": "object"},
                "description": "oldest first; `framed` is the text as you should read it",
            },
            "more_queued": {"type": "boolean"},
            "problems": {
                "type": "array",
                "items": {"type": "string"},
                "description": "files of the inbox left alone or not recorded, and why",
            },
            "message": {"type": "string", "description": "Why a call failed, and the fix."},
        },
        "required": ["status"],
    }


def call_inbox(paths: HostPaths, arguments: dict[str, Any]) -> dict[str, Any]:
    """Claim (or peek at) the workdir's queued messages; a result dict, never an exception."""
    only_peek = arguments.get("peek", False)
    if not isinstance(only_peek, bool):
        return failed(BAD_ARGUMENTS, "peek: must be true or false")
    try:
        if only_peek:
            batch = peek(paths.workdir)
            more = False
        else:
            batch = claim(paths.workdir, VIA, max_bytes=MAX_RESULT_BYTES)
            more = bool(peek(paths.workdir).messages)
    except InboxUnsafe as exc:  # a folder of the inbox that is a link or no folder
        return failed(UNUSABLE_FILE, str(exc))
    except InboxReadFailed as exc:  # the system failed a read: the folder, errno and fix
        return failed(READ_FAILED, str(exc))
    except InboxWriteFailed as exc:  # a folder a claim needs could not be created
        return failed(WRITE_FAILED, str(exc))
    except WorkdirError as exc:  # the workdir inside a loop of links since the server began
        return failed(WORKDIR_GONE, str(exc))
    except OSError as exc:  # none known: said as a failed read of the inbox, as the others
        return failed(READ_FAILED, str(InboxReadFailed(f"{INBOX_DIR}/", exc)))
    result: dict[str, Any] = {
        "status": "ok",
        "messages": [message.summary() for message in batch.messages],
        "more_queued": more,
    }
    if batch.problems:  # as the CLI prints them: the caller learns what was left alone
        result["problems"] = list(batch.problems)
    return result


def settle_inbox(
    paths: HostPaths, arguments: dict[str, Any], result: dict[str, Any], delivered: bool
) -> None:
    """Acknowledge the messages `call_inbox` claimed for `result` once the client read it;
    otherwise put them back in the queue. Problems go to stderr (the client's log)."""
    if arguments.get("peek") is True or result.get("status") != "ok":
        return
    ids = [message["id"] for message in result.get("messages", [])]
    problems = acknowledge(paths.workdir, ids, VIA) if delivered else release(paths.workdir, ids)
    for problem in problems:
        print(f"taskcard mcp: inbox: {problem}", file=sys.stderr, flush=True)
