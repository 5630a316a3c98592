"""The `[telegram]` section of the service configuration."""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, field_validator

from taskcard.channels.base import (
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
            "a @username is not taken: cards, commands and chat settings are kept by the"
            f" chat's numeric id, which stays when the username changes; {_ID_FIX}"
        )
    raise ValueError(f"not a Telegram chat id; {_ID_FIX}")


_ChatId = Annotated[
    int,
    Field(ge=-(2**53 - 1), le=2**53 - 1),
    BeforeValidator(_chat_id_text),
    AfterValidator(_check_chat_id),
]


class TelegramRoute(BaseModel):
    """One chat (optionally one forum topic) and the agents whose cards it shows."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)

    chat_id: int = Field(
        ge=-(2**53 - 1),
        le=2**53 - 1,
        description="Chat id; negative for groups and channels (at most 2**53 - 1 either way).",
    )
    thread_id: int | None = Field(
        default=None, ge=1, le=2**31 - 1, description="Forum topic (message_thread_id)."
    )
    agents: list[str] = Field(min_length=1, description='Agent ids, or ["*"] for all agents.')
    pin: bool = Field(default=False, description="Pin the resident message (needs admin).")
    timezone: TimeZoneName = Field(default="UTC", description=TIMEZONE_HELP)
    view: RouteView = Field(default="cards", description=ROUTE_VIEW_HELP)
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
        return _chat_id_text(value)

    @field_validator("chat_id")
    @classmethod
    def _nonzero_chat(cls, value: int) -> int:
        return _check_chat_id(value)


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
