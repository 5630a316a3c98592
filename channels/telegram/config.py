"""The `[telegram]` section of the service configuration."""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, field_validator

from taskcard.channels.base import (
    ROUTE_ORCHESTRATOR_HELP,
    ROUTE_VIEW_HELP,
    TIMEZONE_HELP,
    EnvName,
    RateLimit,
    RouteView,
    TimeZoneName,
)


class TelegramLimits(BaseModel):
    """Telegram publishes no exact flood numbers; these are the Bots FAQ observations."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)

    private_chat: RateLimit = Field(
        default=RateLimit(max_calls=1, period_s=1.0),
        description="Messages (sends and edits) per private chat.",
    )
    group_chat: RateLimit = Field(
        default=RateLimit(max_calls=20, period_s=60.0),
        description="Messages (sends and edits) per group or channel.",
    )
    bot: RateLimit = Field(
        default=RateLimit(max_calls=30, period_s=1.0),
        description="Requests across all chats of the bot.",
    )


def _check_chat_id(value: int) -> int:
    if value == 0:
        raise ValueError("0 is no Telegram chat; use the chat's id (negative for groups)")
    return value


_NUMERIC_ID = re.compile(r"[+-]?[0-9]+")
_ID_FIX = (
    "write the chat's numeric id (negative for groups and channels) as `taskcard chats` lists it"
)


def _chat_id_text(value: object) -> object:
    """A chat id written as text: the number quoted passes to the usual type message ("write
    the number without quotes"); a channel's @username or anything else is said as what it
    is. Its fix was "write the number without quotes" too, which cannot be followed."""
    if not isinstance(value, str) or _NUMERIC_ID.fullmatch(value.strip()):
        return value
    if value.startswith("@"):
        raise ValueError(
            "a @username is taken only in a route's chat_id (resolved when the service"
            " starts); a turn's origin names the chat by its numeric id, so list that here;"
            f" {_ID_FIX}"
        )
    raise ValueError(f"not a Telegram chat id; {_ID_FIX}")


_MAX_CHAT_ID = 2**53 - 1
# A public channel's or public supergroup's username, as the Bot API takes it for `chat_id`.
USERNAME_PATTERN = re.compile(r"@[A-Za-z][A-Za-z0-9_]{4,31}")
# The pattern in words, for the message that refuses one.
USERNAME_RULE = "after the @, 5-32 letters, digits or underscores, starting with a letter"


# A public chat's link as Telegram shows it (`https://t.me/build_news`, `t.me/build_news`).
_CHAT_LINK = re.compile(
    r"(?:https?://)?(?:www\.)?(?:t|telegram)\.me/([A-Za-z][A-Za-z0-9_]{4,31})/?"
)


def _route_chat_text(value: object) -> object:
    """A route's chat id written as text: a public chat's `@username` (checked for its
    shape, resolved to the numeric id when `serve` starts), else as `_chat_id_text` says.
    The number quoted is refused here: the route's key also takes text, so it would pass."""
    if isinstance(value, bool) or not isinstance(value, int | str):
        # Said here: pydantic would give one line per member of `int | str`.
        if isinstance(value, bool):
            got = "true" if value else "false"
        elif isinstance(value, float):
            got = repr(value)
        elif isinstance(value, list):
            got = "an array"
        else:
            got = "a table" if isinstance(value, dict) else "a date or time"
        raise ValueError(
            f"got {got}; write the chat's numeric id as a whole number without quotes, or a"
            ' public chat\'s @username in double quotes (e.g. "@build_news")'
        )
    if isinstance(value, int):
        if abs(value) > _MAX_CHAT_ID:
            raise ValueError(
                f"{value} is out of range; Telegram chat ids are at most {_MAX_CHAT_ID} either"
                " way: copy the id again as `taskcard chats` lists it"
            )
        return value
    if _NUMERIC_ID.fullmatch(value.strip()):
        raise ValueError("the chat id is a number in quotes; write the number without quotes")
    if value.startswith("@"):
        # Not quoted back: a value pasted under the wrong key may be a secret.
        if not USERNAME_PATTERN.fullmatch(value):
            raise ValueError(
                f"not a Telegram username: a public chat's username is {USERNAME_RULE}"
                f' (e.g. "@build_news"); fix it, or {_ID_FIX}'
            )
        return value
    link = _CHAT_LINK.fullmatch(value)
    if link is not None:
        # The public link Telegram shows for the chat: its username, written as a link.
        raise ValueError(
            f'a t.me link, not a chat id; write the chat\'s username: "@{link.group(1)}"'
        )
    raise ValueError(
        "not a Telegram chat id; write the chat's numeric id (negative for groups and"
        " channels) as `taskcard chats` lists it, or a public channel's or supergroup's"
        ' @username (e.g. "@build_news")'
    )


def _route_chat_number(value: int | str) -> int | str:
    return value if isinstance(value, str) else _check_chat_id(value)


_ChatId = Annotated[
    int,
    Field(ge=-(2**53 - 1), le=2**53 - 1),
    BeforeValidator(_chat_id_text),
    AfterValidator(_check_chat_id),
]


class TelegramRoute(BaseModel):
    """One chat (optionally one forum topic) and the agents whose cards it shows."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)

    chat_id: Annotated[int, Field(ge=-(2**53 - 1), le=2**53 - 1)] | str = Field(
        description=(
            "Chat id; negative for groups and channels (at most 2**53 - 1 either way). Or a"
            " public channel's or supergroup's \"@username\" (after the @, 5-32 letters,"
            " digits or underscores, a letter first), resolved to the numeric id when the"
            " service starts."
        ),
    )
    thread_id: int | None = Field(
        default=None, ge=1, le=2**31 - 1, description="Forum topic (message_thread_id)."
    )
    agents: list[str] = Field(min_length=1, description='Agent ids, or ["*"] for all agents.')
    pin: bool = Field(default=False, description="Pin the resident message (needs admin).")
    timezone: TimeZoneName = Field(default="UTC", description=TIMEZONE_HELP)
    view: RouteView = Field(default="cards", description=ROUTE_VIEW_HELP)
    orchestrator: str | None = Field(default=None, description=ROUTE_ORCHESTRATOR_HELP)
    allowed_user_ids: list[Annotated[int, Field(ge=1, le=2**53 - 1)]] | None = Field(
        default=None,
        description=(
            "Only these users may run /taskcard, /tell or reply to a card here; all when"
            " absent. Anyone else is told so, with their id. The chat's administrators"
            " posting anonymously (and a channel's own posts) are let in too; a message sent"
            " on behalf of another chat is refused with an answer asking to send it as"
            " oneself."
        ),
    )

    @field_validator("chat_id", mode="before")
    @classmethod
    def _chat_as_text(cls, value: object) -> object:
        return _route_chat_text(value)

    @field_validator("chat_id")
    @classmethod
    def _nonzero_chat(cls, value: int | str) -> int | str:
        return _route_chat_number(value)

    @property
    def chat_username(self) -> str | None:
        """The `@username` this route names its chat by, until the service resolves it."""
        return self.chat_id if isinstance(self.chat_id, str) else None


class TelegramConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)

    token_env: EnvName = Field(
        default="TELEGRAM_BOT_TOKEN",
        description="Name of the environment variable holding the bot token.",
    )
    api_base_url: str = Field(
        default="https://api.telegram.org",
        description="Bot API root: the public API, a local Bot API server, or a test fake.",
    )
    routes: list[TelegramRoute] = Field(default_factory=list)
    origin_chats: list[_ChatId] = Field(
        default_factory=list,
        max_length=1000,
        description=(
            "Chat ids where a turn's origin (telegram:<chat id>[:<topic id>]) may open a route"
            " for that agent; empty: origins are ignored."
        ),
    )
    limits: TelegramLimits = Field(default_factory=TelegramLimits)
    commands: bool = Field(default=True, description="Receive /taskcard commands by polling.")
    poll_timeout_s: int = Field(default=25, ge=0, le=50, description="getUpdates long poll.")
    request_timeout_s: float = Field(
        default=15.0,
        ge=0.1,
        le=300,
        description="Per-request timeout of edits, deletes, pins (s).",
    )
    send_timeout_s: float = Field(
        default=30.0,
        ge=5,
        le=300,
        description=(
            "How long a sendMessage answer is awaited. Generous on purpose: a send given up on "
            "may still have posted, and the Bot API cannot deduplicate a retry; 5-300 s."
        ),
    )
    ambiguous_send_hold_s: float = Field(
        default=600.0,
        ge=0,
        le=86400,
        description=(
            "After two sends of one resident ended without an answer (each may have posted a "
            "copy), no further send for it is tried for this many seconds."
        ),
    )
