"""`taskcard config check`, `serve --check` and `serve` on values an operator gets wrong in
ways a type check lets through: a URL where an address goes, a value pasted many times over,
a top-level key written under a table."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.e2e.test_cli import AGENT, console_config, refused_by_every_command


@pytest.mark.parametrize(
    ("listen", "words"),
    [
        (
            "http://127.0.0.1:9464",
            'is a URL; give only host:port, without http:// or a path (e.g. "127.0.0.1:9464")',
        ),
        ("https://[::1]:9464/metrics", 'without https:// or a path (e.g. "[::1]:9464")'),
        ("my host:9464", "'my host' is not an IP address or host name"),
        ("-bad-.example:9464", "'-bad-.example' is not an IP address or host name"),
    ],
    ids=["http-url", "https-url-path", "space-in-host", "bad-label"],
)
def test_a_metrics_address_that_is_no_host_port_is_refused_saying_what_to_write(
    tmp_path: Path, listen: str, words: str
) -> None:
    """A URL in `[metrics] listen` (the address as a browser shows it) was told to put an
    IPv6 address in brackets; a host name no resolver takes passed every check and stopped
    `serve` only at the bind. Both are refused by every command, naming the key."""
    config = console_config(tmp_path, AGENT, f'[metrics]\nlisten = "{listen}"\n')
    (tmp_path / "agents" / "builder").mkdir(parents=True)
    for line, _ in refused_by_every_command(config, "metrics.listen"):
        assert words in line, line
        assert "brackets" not in line, line


TG_ROUTE = '[telegram]\n[[telegram.routes]]\nchat_id = -100123\nagents = ["builder"]\n'


@pytest.mark.parametrize(
    ("tail", "key", "words"),
    [
        (
            AGENT + 'log_level = "DEBUG"\n',
            "agents[0].log_level",
            "'log_level' is a top-level key, but TOML reads every key after a table header as"
            " part of that table (here [[agents]]); move the line above the first [table]",
        ),
        (
            AGENT + '[metrics]\nlisten = "127.0.0.1:9464"\nstate_dir = "state"\n',
            "metrics.state_dir",
            "'state_dir' is a top-level key, but TOML reads every key after a table header as"
            " part of that table (here [metrics])",
        ),
        (
            AGENT + TG_ROUTE + "origin_chats = [-100999]\n",
            "telegram.routes[0].origin_chats",
            "'origin_chats' belongs to [telegram], but TOML reads every key after a table"
            " header as part of that table (here [[telegram.routes]]); move the line up under"
            " [telegram], before its first [[telegram.routes]] header",
        ),
        (
            AGENT + '[feishu]\n[feishu.webhook]\nport = 8080\nevents = "webhook"\n',
            "feishu.webhook.events",
            "'events' belongs to [feishu], but TOML reads every key after a table header as"
            " part of that table (here [feishu.webhook]); move the line up under [feishu],"
            " before its first [feishu.webhook] header",
        ),
    ],
    ids=["top-under-agents", "top-under-metrics", "telegram-under-route", "feishu-under-webhook"],
)
def test_a_key_written_under_the_wrong_table_header_is_refused_saying_where_it_goes(
    tmp_path: Path, tail: str, key: str, words: str
) -> None:
    """A key appended at the end of a file lands in the last table TOML opened there: the
    docs' `log_level` was refused as "unknown key; allowed keys here: id, workdir", which
    reads as a key that does not exist rather than a line in the wrong place."""
    config = console_config(tmp_path, tail)
    for line, _ in refused_by_every_command(config, key):
        assert words in line, line
        assert "allowed keys here" not in line, line
