"""The plain text of a received Feishu message, whatever form the person's client sent.

A message typed in the plain box arrives as `text` (`{"text": "@_user_1 /taskcard off"}`);
one written with any formatting (bold, a link, a code block, a title, several paragraphs from
the rich editor) arrives as `post`: `{"title": ..., "content": [[element, ...], ...]}`, one
list of elements per paragraph, where a mention is an `at` element whose `user_id` is the
same placeholder key (`@_user_1`) the plain form writes into its text. Both become one text
here, so a `/taskcard` command or a `/tell` written in the rich editor is read like a typed
one, and a rich reply reaches the agent as text. Pictures, files and emoji carry no text and
are left out. A received post sometimes nests its body under a locale (`{"zh_cn": {...}}`);
the first locale with a body is read.

Total: any other shape gives None (the message is not a command), never an exception.
"""

from __future__ import annotations

import json
from typing import Any

# Elements whose `text` is what the person wrote.
_TEXT_TAGS = frozenset({"text", "a", "code_block", "md"})


def message_text(message_type: object, content: object) -> str | None:
    """The text of a `text` or `post` message from its `content` JSON string, else None."""
    if not isinstance(content, str):
        return None
    try:
        document = json.loads(content or "{}")
    except (ValueError, RecursionError):
        return None
    if not isinstance(document, dict):
        return None
    if message_type == "text":
        text = document.get("text")
        return text if isinstance(text, str) else None
    if message_type == "post":
        return _post_text(document)
    return None


def _post_text(document: dict[str, Any]) -> str | None:
    body = _post_body(document)
    if body is None:
        return None
    paragraphs: list[str] = []
    title = body.get("title")
    if isinstance(title, str) and title.strip():
        paragraphs.append(title)
    content = body.get("content")
    if not isinstance(content, list):
        return None
    for paragraph in content:
        if isinstance(paragraph, list):
            paragraphs.append(_paragraph_text(paragraph))
    return "\n".join(paragraphs)


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
            text += key if isinstance(key, str) else ""
            apart = True
            continue
        piece = _element_text(element)
        if piece and apart and not piece[0].isspace():
            text += " "
        text += piece
        apart = apart and not piece
    return text


def _post_body(document: dict[str, Any]) -> dict[str, Any] | None:
    if "content" in document:
        return document
    for value in document.values():  # {"zh_cn": {"title": ..., "content": [...]}}
        if isinstance(value, dict) and isinstance(value.get("content"), list):
            return value
    return None


def _element_text(element: object) -> str:
    if not isinstance(element, dict):
        return ""
    tag = element.get("tag")
    text = element.get("text")
    if isinstance(tag, str) and tag in _TEXT_TAGS and isinstance(text, str):
        return text
    return ""
