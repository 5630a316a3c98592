"""`[cluster]` validation: a URL with a password in the file is refused, errors never quote
the URL, and the variable named by `redis_url_env` is checked when the service starts."""

from __future__ import annotations

from pathlib import Path

import pytest

from taskcard.bridge.cluster.config import ClusterConfig, ClusterUrlMissing, resolve_redis_url
from taskcard.bridge.config import ConfigError, parse_config


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"redis_url": "http://h:6379"}, "must start with redis://"),
        ({"redis_url": "redis://:hunter2@h:6379/0"}, "carries a password"),
        ({"redis_url": "redis:///0"}, "has no host"),
        ({"redis_url": "redis://h:99999/0"}, "port"),
        ({"redis_url": "redis://h:6379/1x"}, "database that is not a number"),
        ({"redis_url": "rediss://h/0/1"}, "database that is not a number"),
        ({"redis_url_env": "1BAD"}, "environment variable name"),
        ({"redis_url_env": "TC_REDIS\n"}, "holds a control character (U+000A)"),
        ({"redis_url_env": "A", "redis_url": "redis://h"}, "not both"),
        ({"redis_url": "redis://h", "lease_ttl_s": 0.5}, "greater than or equal to 1"),
        ({"redis_url": "redis://h", "instance": "a b"}, "A-Z a-z 0-9"),
    ],
)
def test_bad_cluster_sections_name_the_fix(
    tmp_path: Path, fields: dict[str, object], message: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config({"cluster": fields}, base_dir=tmp_path)
    text = "\n".join(caught.value.messages)
    assert message in text and "cluster" in text
    assert "hunter2" not in text


def test_the_url_comes_from_the_named_variable_and_is_never_quoted() -> None:
    config = ClusterConfig(redis_url_env="TC_REDIS")
    assert config.enabled and not ClusterConfig().enabled
    assert resolve_redis_url(config, {"TC_REDIS": "redis://:pw@h:1/0"}) == "redis://:pw@h:1/0"
    with pytest.raises(ClusterUrlMissing, match="TC_REDIS is not set"):
        resolve_redis_url(config, {})
    with pytest.raises(ClusterUrlMissing) as caught:
        resolve_redis_url(config, {"TC_REDIS": "http://:secretpw@h"})
    assert "secretpw" not in str(caught.value)
