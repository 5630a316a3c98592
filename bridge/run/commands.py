"""`/taskcard` arguments read as a typed command, and what each does to a chat's preferences.

Pure, so the table of what people may type is tested on its own; the service dispatches the
typed command (replies, suppressing notices, projecting the routes again). The arguments are a
chat member's text: anything not understood is `unknown`, and is never echoed back.
"""

from __future__ import annotations

import difflib
import re
import unicodedata
from dataclasses import dataclass
from typing import Final, Literal

from taskcard.bridge.store.sqlite import ChatPrefs
from taskcard.channels.base import TASKCARD_WORDS, folded

MIN_ROWS: Final = 1
MAX_ROWS: Final = 10
_ROWS_ARG: Final = re.compile(r"[0-9]{1,2}")  # ASCII digits only, not "٣"

TaskcardAction = Literal[
    "state",
    "off",
    "on",
    "rows",
    "cancel",
    "board",
    "cards",
    "orchestrator",
    "help",
    "unknown",
]
ORCHESTRATOR_WORD: Final = "orchestrator"
ORCHESTRATOR_OFF: Final = "off"


@dataclass(frozen=True)
class TaskcardCommand:
    """What `/taskcard ARGS` asks for; `rows` only with `action == "rows"`; `agent` only
    with `action == "orchestrator"`: the name as typed (a chat member's text, never echoed),
    `off`, or None when only asked which agent it is."""

    action: TaskcardAction
    rows: int | None = None
    agent: str | None = None


def _words(args: str) -> list[tuple[str, str]]:
    """The words of `args`, each as typed and `folded`; a word that folds to nothing (an
    invisible character alone) is none."""
    return [(word, read) for word in args.split() if (read := folded(word))]


def parse_taskcard(args: str) -> TaskcardCommand:
    """`""`/`status`/`state`: show the state; `off`/`on`: hide/show the cards; `1`-`10`: that
    many activity rows; `cancel`: withdraw the author's latest message still queued for an
    agent; `board`/`cards`: one board for the chat, or one card per agent; `orchestrator
    [AGENT|off]`: the chat's orchestrator (`off`: none; the agent's name keeps its case); `help`
    (or `?`): what may be typed; anything else is unknown (case and surrounding space
    ignored)."""
    words = _words(args)
    if words and words[0][1] == ORCHESTRATOR_WORD and len(words) <= 2:
        if len(words) == 1:
            return TaskcardCommand("orchestrator")
        named, read = words[1]
        return TaskcardCommand(
            "orchestrator", agent=ORCHESTRATOR_OFF if read == ORCHESTRATOR_OFF else named
        )
    if len(words) > 1:
        return TaskcardCommand("unknown")
    word = words[0][1] if words else ""
    if word in ("", "status", "state"):
        return TaskcardCommand("state")
    if word == "off":
        return TaskcardCommand("off")
    if word == "on":
        return TaskcardCommand("on")
    if word == "cancel":
        return TaskcardCommand("cancel")
    if word in ("board", "cards"):
        return TaskcardCommand("board" if word == "board" else "cards")
    if word in ("help", "?"):
        return TaskcardCommand("help")
    if _ROWS_ARG.fullmatch(word) and MIN_ROWS <= int(word) <= MAX_ROWS:
        return TaskcardCommand("rows", int(word))
    return TaskcardCommand("unknown")


_SIGNED_NUMBER: Final = re.compile(r"[+-]?[0-9]+")


def _in_ascii_digits(word: str) -> str:
    """`word` (`folded`) with each decimal digit of another script (Arabic-Indic `٣`,
    Devanagari `३`) written as the ASCII one it stands for: only to say what a number
    meant (`suggestion`, `rows_out_of_range`), never to take it as typed."""
    return "".join(str(unicodedata.decimal(c)) if c.isdecimal() else c for c in word)


def _row_count(word: str) -> int | None:
    """A whole number written `word` (`_SIGNED_NUMBER`) when it could be a count of rows,
    else None. Its leading zeros go first and a number of more than four digits is none:
    `int` refuses a string of more than 4,300 digits (the text of a Feishu message can be
    that long), which failed the command with no answer."""
    digits = word.lstrip("+-").lstrip("0")
    if len(digits) > 4:
        return None
    value = int(digits or "0")
    return -value if word.startswith("-") else value


# The option words a misspelt one is compared with (the numbers are said by the help; "state"
# is "status" said another way).
_OPTION_WORDS: Final = tuple(word for word in TASKCARD_WORDS if word != "state")


def suggestion(args: str) -> str | None:
    """The command an unknown `/taskcard ARGS` most likely meant, written out
    (`/taskcard off`), or None when nothing is close. Only ever one of the options, never the
    typed text: "of" and "offf" mean off, "borad" board, "off please" off, a full-width
    "ｏｆｆ" or "５" off and 5; "on off" names two and is left to the help."""
    words = [_in_ascii_digits(read) for _, read in _words(args)]
    if not words:
        return None
    known = [word for word in words if parse_taskcard(word).action != "unknown"]
    if len(known) > 1:
        return None
    if len(known) == 1:
        return f"/taskcard {known[0]}"
    if len(words) == 1 and _SIGNED_NUMBER.fullmatch(words[0]):
        rows = _row_count(words[0])  # `+5`, `005`: the count written another way
        return f"/taskcard {rows}" if rows is not None and MIN_ROWS <= rows <= MAX_ROWS else None
    close = difflib.get_close_matches(words[0], _OPTION_WORDS, n=1, cutoff=0.6)
    return f"/taskcard {close[0]}" if len(words) == 1 and close else None


def without_mentions(args: str) -> str | None:
    """`args` without the words that mention someone (a Telegram `@alice`, a Feishu mention's
    placeholder `@_user_2` or `@_all`), None when they mention no one. No option takes a
    mention: `/taskcard off @alice` is answered as such, never as an unknown option, whose
    "Did you mean /taskcard off?" read as if `off` had not been typed."""
    words = args.split()
    kept = [word for word in words if not (word.startswith("@") and len(word) > 1)]
    return None if len(kept) == len(words) else " ".join(kept)


def rows_out_of_range(args: str) -> bool:
    """Whether an unknown `/taskcard ARGS` is a whole number outside 1 to 10 (`0`, `11`,
    `-3`, a full-width `１２`): a count of activity rows the chat cannot have, answered with
    the range rather than as an unknown option."""
    word = _in_ascii_digits(folded(args).strip())
    if not _SIGNED_NUMBER.fullmatch(word):
        return False
    rows = _row_count(word)
    return rows is None or not MIN_ROWS <= rows <= MAX_ROWS


def apply_to_prefs(command: TaskcardCommand, prefs: ChatPrefs) -> ChatPrefs:
    """The chat's preferences after `command` (unchanged for one that only asks)."""
    if command.action == "off":
        return ChatPrefs(hidden=True, activity_rows=prefs.activity_rows)
    if command.action == "on":
        return ChatPrefs(hidden=False, activity_rows=prefs.activity_rows)
    if command.action == "rows":
        return ChatPrefs(hidden=prefs.hidden, activity_rows=command.rows)
    return prefs
