"""The `[cluster]` section: where the shared Redis is, and how leases are timed."""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Mapping
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from taskcard.channels.base import EnvName, env_name_shown, secret_value_problem

_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")
_SCHEMES = ("redis", "rediss", "unix")


def redis_url_problem(value: str) -> str | None:
    """Why `value` is not a usable Redis URL (None: it is); never quotes the URL itself,
    which may carry a password."""
    try:
        parts = urlsplit(value)
    except ValueError:
        return "is not a URL; write redis://host:6379/0"
    if parts.scheme not in _SCHEMES:
        return "must start with redis://, rediss:// or unix:// (e.g. redis://127.0.0.1:6379/0)"
    if parts.scheme != "unix" and not parts.hostname:
        return "has no host; write redis://host:6379/0"
    try:
        parts.port  # noqa: B018 - a bad port raises here
    except ValueError:
        return "has a port that is not a number from 0 to 65535"
    # redis-py skips a path it cannot read as a number: a typo there (`/1x`) silently used
    # database 0, where another fleet may keep its keys.
    database = parts.path.strip("/")
    if parts.scheme != "unix" and database and not (database.isascii() and database.isdigit()):
        return "has a database that is not a number (after the port); write redis://host:6379/0"
    return None


class ClusterConfig(BaseModel):
    """Opt-in: without a Redis URL the service runs alone on its SQLite state."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)

    redis_url_env: EnvName | None = Field(
        default=None,
        description=(
            "Name of the environment variable holding the Redis URL (preferred: the URL may"
            " carry a password)."
        ),
    )
    redis_url: str | None = Field(
        default=None,
        description=(
            "The Redis URL (redis://host:6379/0); only for a Redis without a password, else"
            " use redis_url_env."
        ),
    )
    instance: str = Field(
        default="",
        description=(
            "This instance's name in leases and logs (1-64 of [A-Za-z0-9_.-]); empty: the"
            " host name and process id."
        ),
    )
    key_prefix: str = Field(
        default="taskcard",
        description="Prefix of every Redis key (1-64 of [A-Za-z0-9_.-]); one per fleet.",
    )
    lease_ttl_s: float = Field(
        default=6.0,
        ge=1.0,
        le=60.0,
        description=(
            "Lifetime of the polling and agent leases (1-60 s); a dead instance's work moves"
            " to another within this time, renewed every third of it."
        ),
    )

    @field_validator("redis_url")
    @classmethod
    def _check_url(cls, value: str | None) -> str | None:
        if value is not None:
            problem = redis_url_problem(value)
            if problem:
                raise ValueError(f"the Redis URL {problem}")
            if urlsplit(value).password:
                raise ValueError(
                    "the Redis URL carries a password: put the URL in an environment variable"
                    " and name it in cluster.redis_url_env instead"
                )
        return value

    @field_validator("instance", "key_prefix")
    @classmethod
    def _check_name(cls, value: str, info: ValidationInfo) -> str:
        if not value and info.field_name == "key_prefix":
            # Every Redis key starts with it: empty, the fleet's keys would share a namespace
            # with whatever else the Redis holds.
            raise ValueError(
                "is empty; write a name of 1-64 of the characters A-Z a-z 0-9 _ . -, one per"
                ' fleet (or leave the key out for the default "taskcard")'
            )
        if value and not _NAME.fullmatch(value):
            raise ValueError("use 1-64 of the characters A-Z a-z 0-9 _ . -")
        return value

    @model_validator(mode="after")
    def _one_source(self) -> ClusterConfig:
        if self.redis_url is not None and self.redis_url_env is not None:
            raise ValueError("set either cluster.redis_url_env or cluster.redis_url, not both")
        return self

    @property
    def enabled(self) -> bool:
        return self.redis_url is not None or self.redis_url_env is not None

    def instance_name(self) -> str:
        return self.instance or f"{socket.gethostname()[:40]}-{os.getpid()}"


class ClusterUrlMissing(Exception):
    """The environment variable named by `cluster.redis_url_env` is unset or not a URL."""


def resolve_redis_url(config: ClusterConfig, env: Mapping[str, str]) -> str:
    """The Redis URL to connect to; `ClusterUrlMissing` (naming the variable, never its
    value) when the variable is unset or malformed."""
    if config.redis_url is not None:
        return config.redis_url
    assert config.redis_url_env is not None
    value = env.get(config.redis_url_env, "").strip()
    if not value:
        raise ClusterUrlMissing(
            f"cluster.redis_url_env: the environment variable"
            f" {env_name_shown(config.redis_url_env)} is not"
            " set; export the Redis URL there (redis://:password@host:6379/0)"
        )
    form = secret_value_problem(value, "Redis URL")
    if form is not None:
        raise ClusterUrlMissing(
            f"cluster.redis_url_env: the environment variable"
            f" {env_name_shown(config.redis_url_env)} does not hold a usable Redis URL: {form}"
        )
    problem = redis_url_problem(value)
    if problem:
        raise ClusterUrlMissing(
            f"cluster.redis_url_env: the value of the variable"
            f" {env_name_shown(config.redis_url_env)} {problem}"
        )
    return value
