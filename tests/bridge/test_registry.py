"""Which bot tokens the Telegram channel is built with: BotFather's form, and the other URL-safe
tokens a local Bot API server or a test double may use; never one that would break the
request's path (it is part of every request URL)."""

from __future__ import annotations

from pathlib import Path

import pytest

from taskcard.bridge.config import parse_config
from taskcard.bridge.deliver.registry import SecretMissing, build_channels
from taskcard.bridge.store.sqlite import SqliteStore


def _built(tmp_path: Path, token: str) -> None:
    config = parse_config(
        {
            "state_dir": "state",
            "console": {"enabled": False},
            "agents": [{"id": "a", "workdir": "a"}],
            "telegram": {
                "token_env": "TC_TOKEN",
                "api_base_url": "http://127.0.0.1:9",
                "routes": [{"chat_id": -100, "agents": ["a"]}],
            },
        },
        base_dir=tmp_path,
    )
    store = SqliteStore.in_dir(config.state_dir)
    try:
        assert "telegram" in build_channels(config, store, {"TC_TOKEN": token})
    finally:
        store.close()


@pytest.mark.parametrize("token", ["123456:AAE-def_GHI", "test-token", "fake:token.1"])
def test_tokens_that_fit_in_a_url_path_are_taken(tmp_path: Path, token: str) -> None:
    _built(tmp_path, token)


@pytest.mark.parametrize("token", ["123456:SECRÉT", '"123:x"', "123:a b", "12/3", "a?b", "a%b"])
def test_a_token_that_would_break_the_request_path_is_refused_unquoted(
    tmp_path: Path, token: str
) -> None:
    with pytest.raises(SecretMissing) as refused:
        _built(tmp_path, token)
    assert "TC_TOKEN" in str(refused.value) and token not in str(refused.value)
