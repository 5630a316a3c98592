"""Secret redaction for everything the service shows to people.

Card bodies and activity rows are written by agents and renderers we do not control; a
renderer that prints an environment dump must not post a bot token into a group chat. The
patterns aim at shapes that are secrets with near certainty (vendor prefixes, JWT structure,
`key=value` assignments with a secret-sounding key, credentials inside URLs), so ordinary prose
and file paths pass unchanged. Each hit is replaced by a visible marker so readers know
something was removed.
"""

from __future__ import annotations

import re
from typing import Final

MARKER: Final = "[redacted]"

# Ordered: the specific vendor shapes first, so a token inside `token=...` is still one marker.
_PATTERNS: Final[tuple[re.Pattern[str], ...]] = (
    # Telegram bot token: numeric bot id, a colon, 35 url-safe characters.
    re.compile(r"\b\d{6,12}:[A-Za-z0-9_-]{30,}"),
    # OpenAI and Anthropic style keys: sk-..., sk-proj-..., sk-ant-...
    re.compile(r"\bsk-[A-Za-z0-9_-]{16,}"),
    # GitHub tokens: classic (ghp_, gho_, ghu_, ghs_, ghr_) and fine-grained.
    re.compile(r"\bgh[pousr]_[A-Za-z0-9]{20,}"),
    re.compile(r"\bgithub_pat_[A-Za-z0-9_]{20,}"),
    # Slack tokens: xoxb-, xoxp-, xoxa-, xoxs-, xoxr-...
    re.compile(r"\bxox[a-z]-[A-Za-z0-9-]{10,}"),
    # AWS access key ids.
    re.compile(r"\b(?:AKIA|ASIA)[A-Z0-9]{16}\b"),
    # Google API keys.
    re.compile(r"\bAIza[A-Za-z0-9_-]{35}"),
    # JSON Web Tokens: three base64url parts, the first two starting with `{"` encoded.
    re.compile(r"\beyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}"),
)

# `Authorization: Bearer abc...`: keep the scheme word, hide the credential.
_BEARER: Final = re.compile(r"(?i)\b(bearer)\s+[A-Za-z0-9._~+/=-]{8,}")

# `password=...`, `api_key: ...`, `"token": "..."`: keep the key, hide the value.
_ASSIGNMENT: Final = re.compile(
    r"""(?ix)
    \b(
        (?:[a-z0-9_-]*[_-])?
        (?:password|passwd|pwd|secret|token|api[_-]?key|access[_-]?key|private[_-]?key
           |client[_-]?secret|auth)
    )
    (["']?\s*[:=]\s*["']?)
    (?!\[redacted\])
    ([^\s"',;&]{3,})
    """
)

# `scheme://user:password@host`: keep the scheme, user and host.
_URL_CREDENTIALS: Final = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://[^\s/:@]+):[^\s/@]+@")


def redact(text: str) -> str:
    """`text` with every recognised secret replaced by `[redacted]`."""
    for pattern in _PATTERNS:
        text = pattern.sub(MARKER, text)
    text = _URL_CREDENTIALS.sub(rf"\1:{MARKER}@", text)
    text = _BEARER.sub(rf"\1 {MARKER}", text)
    return _ASSIGNMENT.sub(rf"\1\2{MARKER}", text)
