"""The `[feishu]` section of the service configuration."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Annotated, Final, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    field_validator,
    model_validator,
)

from taskcard.channels.base import (
    ROUTE_ORCHESTRATOR_HELP,
    ROUTE_VIEW_HELP,
    TIMEZONE_HELP,
    EnvName,
    RateLimit,
    RouteView,
    TimeZoneName,
)


class FeishuLimits(BaseModel):
    """Client-side pacing at Feishu's documented limits; a request counts in both app windows."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)

    message_update: RateLimit = Field(
        default=RateLimit(max_calls=5, period_s=1.0), description="PATCHes per message."
    )
    chat_send: RateLimit = Field(
        default=RateLimit(max_calls=5, period_s=1.0), description="New messages per chat."
    )
    app: RateLimit = Field(
        default=RateLimit(max_calls=50, period_s=1.0),
        description="Requests per app, the short window (Feishu: 50 per second).",
    )
    app_minute: RateLimit = Field(
        default=RateLimit(max_calls=1000, period_s=60.0),
        description=(
            "Requests per app, the long window (Feishu: 1000 per minute for message create"
            " and update). Applies together with `app`: 50/s alone would allow 3000/min."
        ),
    )


class FeishuWebhook(BaseModel):
    """The HTTP callback endpoint, used when `events = "webhook"`."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)

    host: str = Field(default="127.0.0.1", description="Listen address.")
    port: int = Field(default=8088, ge=0, le=65535, description="Listen port (0: any free).")
    path: str = Field(default="/feishu/events", description="Request path of the callback.")
    verification_token_env: EnvName = Field(
        default="FEISHU_VERIFICATION_TOKEN",
        description="Environment variable with the event verification token.",
    )
    encrypt_key_env: EnvName = Field(
        default="FEISHU_ENCRYPT_KEY",
        description="Environment variable with the encrypt key (unset: plain payloads).",
    )
    max_request_age_s: float = Field(
        default=300.0,
        gt=0,
        le=3600,
        description=(
            "Refuse a request whose signed X-Lark-Request-Timestamp is older than this"
            " (replays); at most 3600."
        ),
    )
    clock_skew_s: float = Field(
        default=30.0,
        ge=0,
        le=300,
        description=(
            "Clock difference tolerated with Feishu, both ways: a timestamp up to this far in"
            " the future is accepted, and max_request_age_s gets this much slack; at most 300."
        ),
    )


def _usable_id(value: str) -> bool:
    """Feishu ids (oc_..., ou_...) are short and never contain white space: a padded or empty
    one in the config would never match, silently."""
    return bool(value) and len(value) <= 128 and not any(c.isspace() for c in value)


def _usable(kind: str, fix: str) -> Callable[[str], str]:
    """A validator refusing what `_usable_id` refuses, naming the kind of id and the fix."""

    def check(value: str) -> str:
        if not _usable_id(value):
            raise ValueError(f"not a Feishu {kind} id (empty, too long or with spaces); {fix}")
        return value

    return check


_NUMBER = re.compile(r"[+-]?[0-9]+")


def _numeric_id(kind: str, fix: str) -> Callable[[object], object]:
    """A validator refusing an id written as a number, or as a number in quotes: Telegram's
    chat and user ids are numbers, Feishu's never are. The number was refused with "write it
    in double quotes", and quoted it was taken (a chat with a warning, a person without a
    word) while no send or command could ever match it."""

    def check(value: object) -> object:
        if isinstance(value, bool):
            return value  # refused by the type check, as "a valid string"
        if isinstance(value, int) or (isinstance(value, str) and _NUMBER.fullmatch(value)):
            raise ValueError(
                f"a number is no Feishu {kind} (it looks like a Telegram id, which are"
                f" numbers); {fix}"
            )
        return value

    return check


def _refuse_other_kind(value: str, kinds: Mapping[str, str], wanted: str, fix: str) -> None:
    """Refuse `value` when its prefix (a key of `kinds`) marks an id of another kind."""
    for prefix, kind in kinds.items():
        if value.startswith(prefix):
            raise ValueError(f"is {kind} ({prefix}...), not {wanted}; {fix}")


_USER_FIX = "give the person's open_id (ou_...), as the refusal of their command tells it"
_check_usable_user = _usable("user", _USER_FIX)

# What an id listed for a person is instead, by its prefix. Only a sender's open_id is
# compared with the list, so any of these lets no one in, without a word.
_NOT_PEOPLE: Final = {
    "oc_": "a chat id",
    "om_": "a message id",
    "cli_": "an app id",
    "on_": "a person's union_id, which the service never sees",
}


def _check_user_id(value: str) -> str:
    """A person's open_id: usable, and not an id of another kind (the route's own chat id,
    say) nor a Telegram @username, each of which was taken while no command from the chat
    matched it, so no one there could run /taskcard or /tell."""
    _check_usable_user(value)
    _refuse_other_kind(value, _NOT_PEOPLE, "a person's open_id", _USER_FIX)
    if value.startswith("@"):
        raise ValueError(
            "a @username names a person on Telegram only: Feishu lists people by their"
            f" open_id; {_USER_FIX}"
        )
    return value


_user_not_a_number = _numeric_id("open_id", _USER_FIX)
_UserId = Annotated[
    str,
    Field(min_length=1, max_length=128),
    BeforeValidator(_user_not_a_number),
    AfterValidator(_check_user_id),
]

_CHAT_FIX = "use the chat's id (oc_...) as `taskcard chats` lists it"
_check_usable_chat = _usable("chat", _CHAT_FIX)

# What an id of another kind is, by its prefix: the ids Feishu hands out beside chat ids,
# likely pasted into a route from the same API explorer or event.
_OTHER_IDS: Final = {
    "ou_": "a person's open_id",
    "on_": "a person's union_id",
    "om_": "a message id",
    "cli_": "an app id",
}


def _check_chat_id(value: str) -> str:
    """A Feishu chat id: usable, and not an id of another kind (a person's open_id, say),
    which passed the check while every send to it was refused at runtime, or went to that
    person's private chat instead of the group named. An id of a shape not known here is
    taken (`taskcard chats` lists what the platform sent) and warned of by `config check`
    and the start (`unusual_chat_id`)."""
    _check_usable_chat(value)
    _refuse_other_kind(value, _OTHER_IDS, "a chat id", _CHAT_FIX)
    if value == "oc_":
        raise ValueError(f"is only the prefix of a chat id; {_CHAT_FIX}")
    if value.startswith("@"):
        # Telegram's form of a public chat's name: Feishu chats have no usernames, and
        # the id was taken with a warning while every send to it failed.
        raise ValueError(
            "a @username names a chat on Telegram only: Feishu chats have no usernames;"
            f" {_CHAT_FIX}"
        )
    return value


def unusual_chat_id(value: str) -> bool:
    """Whether `value` lacks the `oc_` prefix every Feishu chat id seen so far has."""
    return not value.startswith("oc_")


_chat_not_a_number = _numeric_id("chat id", _CHAT_FIX)
_ChatId = Annotated[
    str,
    Field(min_length=1, max_length=128),
    BeforeValidator(_chat_not_a_number),
    AfterValidator(_check_chat_id),
]


class FeishuRoute(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)

    chat_id: str = Field(description="Chat id (oc_...).")

    @field_validator("chat_id", mode="before")
    @classmethod
    def _chat_as_text(cls, value: object) -> object:
        return _chat_not_a_number(value)

    @field_validator("chat_id")
    @classmethod
    def _usable_chat(cls, value: str) -> str:
        return _check_chat_id(value)

    agents: list[str] = Field(min_length=1, description='Agent ids, or ["*"] for all agents.')
    pin: bool = Field(default=False, description="Pin the resident card.")
    timezone: TimeZoneName = Field(default="UTC", description=TIMEZONE_HELP)
    view: RouteView = Field(default="cards", description=ROUTE_VIEW_HELP)
    orchestrator: str | None = Field(default=None, description=ROUTE_ORCHESTRATOR_HELP)
    allowed_user_ids: list[_UserId] | None = Field(
        default=None,
        description=(
            "Only these open_ids may run /taskcard, /tell or reply to a card here; all when"
            " absent. Anyone else is told so, with their open_id."
        ),
    )


class FeishuConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)

    app_id_env: EnvName = Field(default="FEISHU_APP_ID", description="Env var with the app id.")
    app_secret_env: EnvName = Field(
        default="FEISHU_APP_SECRET", description="Env var with the app secret."
    )
    domain: str = Field(
        default="https://open.feishu.cn",
        description="Open API root: Feishu, Lark (https://open.larksuite.com) or a test fake.",
    )
    events: Literal["websocket", "webhook", "none"] = Field(
        default="websocket", description="How commands arrive."
    )
    webhook: FeishuWebhook = Field(default_factory=FeishuWebhook)
    event_dedup_window_s: float = Field(
        default=86_400.0,
        ge=3600,
        le=7 * 86_400,
        description=(
            "How long a handled event id is remembered (persisted), so a redelivery or replay"
            " is ignored; 1 hour to 7 days."
        ),
    )
    routes: list[FeishuRoute] = Field(default_factory=list)
    origin_chats: list[_ChatId] = Field(
        default_factory=list,
        max_length=1000,
        description=(
            "Chat ids (oc_...) where a turn's origin (feishu:<chat id>) may open a route for"
            " that agent; empty: origins are ignored."
        ),
    )
    limits: FeishuLimits = Field(default_factory=FeishuLimits)
    request_timeout_s: float = Field(
        default=15.0, ge=1, le=300, description="Per-request timeout (1-300 s)."
    )

    @model_validator(mode="after")
    def _replay_window(self) -> FeishuConfig:
        """A signed request is accepted until it is `max_request_age_s + clock_skew_s` old; an
        id forgotten sooner than that lets a captured request be replayed and run again."""
        needed = self.webhook.max_request_age_s + self.webhook.clock_skew_s
        if self.event_dedup_window_s < needed:
            raise ValueError(
                f"event_dedup_window_s = {self.event_dedup_window_s:g} is shorter than"
                f" webhook.max_request_age_s + webhook.clock_skew_s = {needed:g}: a replayed"
                " request would be accepted after its id is forgotten; raise"
                f" event_dedup_window_s to at least {needed:g} or lower max_request_age_s"
            )
        return self

    def replay_window_s(self) -> float:
        """How long handled event ids are kept: the configured window, and never less than
        the longest a request can be replayed (its age limit plus skew both ways)."""
        webhook = self.webhook
        return max(self.event_dedup_window_s, webhook.max_request_age_s + 2 * webhook.clock_skew_s)
