"""The plain text of a received Feishu message, whatever form the person's client sent.

A message typed in the plain box arrives as `text` (`{"text": "@_user_1 /taskcard off"}`);
one written with any formatting (bold, a link, a code block, a title, several paragraphs from
the rich editor) arrives as `post`: `{"title": ..., "content": [[element, ...], ...]}`, one
list of elements per paragraph, where a mention is an `at` element whose `user_id` is the
same placeholder key (`@_user_1`) the plain form writes into its text. Both become one text
here, so a `/taskcard` command or a `/tell` written in the rich editor is read like a typed
one, and a rich reply reaches the agent as text. Pictures, files and emoji carry no text and
are left out. A received post sometimes nests its body under a locale (`{"zh_cn": {...}}`,
`{"en_us": {...}}`, once more under `"post"` in older shapes); the first locale with a body
is read.

A post's title is a heading the client shows above the body, never part of what the person
typed in it: it is kept apart (`MessageText.title`), so the command is read from the body as
a person sees it ("Deploy" over "@bot /taskcard off" is the command `off`), and text for an
agent gets the title as its first line, so nothing written is lost.

Total: any other shape gives None (the message is not a command), never an exception.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

# Elements whose `text` is what the person wrote.
_TEXT_TAGS = frozenset({"text", "a", "code_block", "md"})
# The placeholder a mention of everyone in the chat is written as, in a text and in an `at`
# element (which may also name it "all", as a post that is sent does).
ALL_MENTION_KEY = "@_all"


@dataclass(frozen=True)
class MessageText:
    """The text of a received message: its body, and a rich post's title ("" when none)."""

    body: str
    title: str = ""

    def with_title(self, text: str) -> str:
        """`text` (taken from the body) with the title as its first line, when there is one:
        the text an agent reads of a message whose command was in the body."""
        if not self.title.strip():
            return text
        return f"{self.title}\n{text}" if text else self.title


def message_text(message_type: object, content: object) -> MessageText | None:
    """The text of a `text` or `post` message from its `content` JSON string, else None."""
    if not isinstance(content, str):
        return None
    try:
        document = json.loads(content or "{}")
        # A `\u` escape of a lone surrogate is valid JSON but no text: nothing can write it
        # (an agent's inbox failed with a traceback and the person got no answer), so such
        # content reads as none. A Feishu client never sends one.
        json.dumps(document, ensure_ascii=False).encode()
    except (ValueError, RecursionError):
        return None
    if not isinstance(document, dict):
        return None
    if message_type == "text":
        text = document.get("text")
        return MessageText(text) if isinstance(text, str) else None
    if message_type == "post":
        return _post_text(document)
    return None


def _post_text(document: dict[str, Any]) -> MessageText | None:
    body = _post_body(document)
    if body is None:
        return None
    title = body.get("title")
    paragraphs = [_paragraph_text(p) for p in body["content"] if isinstance(p, list)]
    return MessageText("\n".join(paragraphs), title if isinstance(title, str) else "")


def _paragraph_text(elements: list[Any]) -> str:
    """One paragraph's text; a mention (its placeholder key, so the bot's own is found and
    removed as in `text`) is kept apart from the words beside it by one space, never more:
    "ask @_user_2 why" as typed, not "ask  @_user_2  why"."""
    text = ""
    apart = False  # the last piece was a mention: the next words start after a space
    for element in elements:
        if isinstance(element, dict) and element.get("tag") == "at":
            key = element.get("user_id")
            if text and not text[-1].isspace():
                text += " "
            text += ALL_MENTION_KEY if key == "all" else key if isinstance(key, str) else ""
            apart = True
            continue
        piece = _element_text(element)
        if piece and apart and not piece[0].isspace():
            text += " "
        text += piece
        apart = apart and not piece
    return text


def _post_body(document: dict[str, Any], depth: int = 0) -> dict[str, Any] | None:
    """The `{"title", "content"}` object of a post: the document itself, or the first locale
    under it with paragraphs (one with an empty body only when no locale has more)."""
    if "content" in document:
        return document if isinstance(document.get("content"), list) else None
    if depth >= 2:  # {"post": {"zh_cn": {...}}} at most
        return None
    found: list[dict[str, Any]] = []
    for value in document.values():  # {"zh_cn": {"title": ..., "content": [...]}}
        if isinstance(value, dict):
            body = _post_body(value, depth + 1)
            if body is not None and body["content"]:
                return body
            if body is not None:
                found.append(body)
    return found[0] if found else None


def _element_text(element: object) -> str:
    if not isinstance(element, dict):
        return ""
    tag = element.get("tag")
    text = element.get("text")
    if isinstance(tag, str) and tag in _TEXT_TAGS and isinstance(text, str):
        return text
    return ""
