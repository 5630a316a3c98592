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
