"""Text from chats and agents made safe to print on an operator's terminal.

A chat title is whatever a chat member named the chat, and an agent's problem names its own
files: an escape sequence in either would move the cursor, clear the screen or recolour the
rest of `taskcard chats` / `taskcard status`, a newline would break a table row, a
right-to-left override would reorder it, and a lone surrogate (a file name that is not UTF-8)
would make `print` raise. Such characters are shown as escapes instead (`\\x1b`, `\\u202e`).
The `--json` outputs need none of this: JSON escapes control characters itself.
"""

from __future__ import annotations

import re
from typing import Final

from taskcard.producers.task_card.contract import STEERING_CHARS

# The characters that steer how text is shown (C0 and C1 controls and DEL, every bidirectional
# formatting character, the Unicode line and paragraph separators), and lone surrogates.
_UNSAFE: Final = re.compile(f"[{STEERING_CHARS}\\ud800-\\udfff]")


def printable(text: str) -> str:
    """`text` with every character that could act on a terminal written as its escape."""
    return _UNSAFE.sub(lambda found: found.group().encode("unicode_escape").decode("ascii"), text)
