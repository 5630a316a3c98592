"""`taskcard config check`, `serve --check` and `serve` on values an operator gets wrong in
ways a type check lets through: a URL where an address goes, a value pasted many times over,
a top-level key written under a table."""

from __future__ import annotations

from pathlib import Path
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import pytest

from tests.e2e.harness import ServeProcess, eventually
from tests.e2e.test_cli import AGENT, console_config, refused_by_every_command, taskcard


@pytest.mark.parametrize(
    ("listen", "words"),
    [
        (
            "http://127.0.0.1:9464",
            'is a URL; give only host:port, without http:// or a path (e.g. "127.0.0.1:9464")',
        ),
        ("https://[::1]:9464/metrics", 'without https:// or a path (e.g. "[::1]:9464")'),
        (
            "http://admin:s3cretpass@metrics.example:9464/metrics",
            'without http:// or a path (e.g. "metrics.example:9464")',
        ),
        ("my host:9464", "'my host' is not an IP address or host name"),
        ("-bad-.example:9464", "'-bad-.example' is not an IP address or host name"),
    ],
    ids=["http-url", "https-url-path", "url-with-password", "space-in-host", "bad-label"],
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
        assert "s3cretpass" not in line, line


@pytest.mark.parametrize(
    "listen", ["localhost:9464", "metrics_proxy:9464", "münchen.example:9464", "[::1]:9464"]
)
def test_a_metrics_address_of_a_host_name_a_resolver_takes_passes_the_check(
    tmp_path: Path, listen: str
) -> None:
    """The host check refuses what no resolver takes, not the names containers are given
    (a compose service `metrics_proxy`), a plain name or an IPv6 address in brackets."""
    config = console_config(tmp_path, AGENT, f'[metrics]\nlisten = "{listen}"\n')
    (tmp_path / "agents" / "builder").mkdir(parents=True)
    done = taskcard("config", "check", str(config))
    assert done.returncode == 0, done.stderr


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


LONG = 5000


@pytest.mark.parametrize(
    ("toml", "key", "words"),
    [
        (
            f'[[agents]]\nid = "{"b" * LONG}"\nworkdir = "agents/builder"\n',
            "agents[0].id",
            "is not a valid agent id; use 1-64 letters",
        ),
        (
            AGENT + f'[console]\ntimezone = "{"Z" * LONG}"\n',
            "console.timezone",
            "is not a known IANA time zone; use a name like 'UTC'",
        ),
        (
            f'log_level = "{"X" * LONG}"\n' + AGENT,
            "log_level",
            "Input should be 'DEBUG', 'INFO', 'WARNING' or 'ERROR' (got 'XXXX",
        ),
        (
            AGENT + TG_ROUTE.replace('"builder"', f'"{"z" * LONG}"'),
            "telegram.routes[0].agents[0]",
            '; use the id of an [[agents]] entry (builder) or "*"',
        ),
        (
            AGENT + f'[metrics]\nlisten = "{"v" * LONG}"\n',
            "metrics.listen",
            'is not host:port; write for example "127.0.0.1:9464"',
        ),
    ],
    ids=["agent-id", "timezone", "log-level", "route-agent", "listen"],
)
def test_a_value_pasted_long_is_quoted_cut_so_the_key_and_the_fix_stay_readable(
    tmp_path: Path, toml: str, key: str, words: str
) -> None:
    """The refusal quoted the value whole: a value pasted many times over (or a file pasted
    into one string) made each line a screen of text in the terminal and the log, with the
    fix at its far end. The value is now cut to its head and tail, saying its length."""
    config = tmp_path / "taskcard.toml"
    config.write_text('state_dir = "state"\n' + toml)
    (tmp_path / "agents" / "builder").mkdir(parents=True)
    for line, _ in refused_by_every_command(config, key):
        assert f"({LONG} characters)" in line, line[:300]
        assert words in line, line[:300]
        assert len(line) < 600, line[:300]


def test_a_long_unknown_key_is_named_by_its_head(tmp_path: Path) -> None:
    config = tmp_path / "taskcard.toml"
    config.write_text(f"{'k' * LONG} = 1\n")
    for line, _ in refused_by_every_command(config, "k" * 64 + f"…({LONG} characters)"):
        assert "unknown key; allowed keys here: agents," in line, line[:300]
        assert len(line) < 600, line[:300]


def test_the_words_of_a_refusal_are_never_cut_as_if_quoted(tmp_path: Path) -> None:
    """Only a quoted value is cut: the apostrophes of the words around it ("chat's") quote
    nothing, however long the line."""
    config = tmp_path / "taskcard.toml"
    config.write_text(AGENT + TG_ROUTE.replace("-100123", f'"@{"v" * LONG}"'))
    (tmp_path / "agents" / "builder").mkdir(parents=True)
    for line, _ in refused_by_every_command(config, "telegram.routes[0].chat_id"):
        assert line.endswith(
            "not a Telegram username: a public chat's username is after the @, 5-32 letters,"
            ' digits or underscores, starting with a letter (e.g. "@build_news"); fix it, or'
            " write the chat's numeric id (negative for groups and channels) as `taskcard"
            " chats` lists it"
        ), line


@pytest.mark.parametrize(
    ("section", "key", "given", "meant"),
    [
        ("[console]\n", "console.timezone", "asia/shanghai", "Asia/Shanghai"),
        (TG_ROUTE, "telegram.routes[0].timezone", "utc", "UTC"),
        (
            '[feishu]\n[[feishu.routes]]\nchat_id = "oc_0123456789abcdef"\nagents = ["builder"]\n',
            "feishu.routes[0].timezone",
            "EUROPE/BERLIN",
            "Europe/Berlin",
        ),
    ],
    ids=["console", "telegram-route", "feishu-route"],
)
def test_a_time_zone_written_in_another_case_is_refused_naming_the_zone_meant(
    tmp_path: Path, section: str, key: str, given: str, meant: str
) -> None:
    """Zone names are looked up case by case: `utc` was refused with examples only."""
    config = console_config(tmp_path, AGENT + section + f'timezone = "{given}"\n')
    for line, _ in refused_by_every_command(config, key):
        assert f"(did you mean {meant!r}? the names are case-sensitive)" in line, line


def test_a_time_zone_of_no_known_name_is_offered_no_guess(tmp_path: Path) -> None:
    """Only a name that differs by its case is offered: a near spelling of another zone
    (`Asia/Beijing`, `Asia/Beirut`) would send the cards' times to the wrong city."""
    config = console_config(tmp_path, AGENT + '[console]\ntimezone = "Asia/Beijing"\n')
    for line, _ in refused_by_every_command(config, "console.timezone"):
        assert "did you mean" not in line, line
        assert "is not a known IANA time zone; use a name like 'UTC'" in line, line


@pytest.mark.parametrize(
    ("section", "key", "words"),
    [
        (
            '[feishu]\n[[feishu.routes]]\nchat_id = "oc_0123456789abcdef"\nagents = ["builder"]\n'
            "thread_id = 42\n",
            "feishu.routes[0].thread_id",
            "unknown key (a Telegram key, which Feishu does not take: remove it)",
        ),
        (
            '[telegram]\nevents = "webhook"\n',
            "telegram.events",
            "unknown key (a Feishu key, which Telegram does not take: remove it)",
        ),
    ],
    ids=["thread-in-feishu-route", "events-in-telegram"],
)
def test_a_key_of_the_other_channel_is_refused_as_such(
    tmp_path: Path, section: str, key: str, words: str
) -> None:
    """A route copied from Telegram to Feishu with its `thread_id` was asked "did you mean
    'chat_id'?", which invites renaming it into the chat id."""
    config = console_config(tmp_path, AGENT + section)
    for line, _ in refused_by_every_command(config, key):
        assert words in line, line
        assert "did you mean" not in line, line


async def test_the_log_level_in_the_file_is_taken_in_any_case_as_on_the_command_line(
    tmp_path: Path,
) -> None:
    """`--log-level debug` and `TASKCARD_LOG_LEVEL=debug` were taken, `log_level = "debug"`
    in the file refused: the same setting, three rules. The file takes any case too."""
    config = console_config(tmp_path, AGENT, 'log_level = "debug"\n')
    (tmp_path / "agents" / "builder").mkdir(parents=True)
    result = taskcard("config", "check", str(config))
    assert result.returncode == 0, result.stderr
    with ServeProcess(config) as serve:
        # DEBUG lines appear only at the level the file set (the default is INFO)
        await eventually(lambda: " DEBUG " in serve.logs, what="a DEBUG line in the log")
        assert await serve.aterminate() == 0


def test_the_hosts_own_zone_is_taken_where_the_zone_database_has_it(tmp_path: Path) -> None:
    """`timezone = "localtime"` worked before and keeps working where the host's zone
    database has the name (Debian's does): refusing it would stop an upgraded service."""
    try:
        ZoneInfo("localtime")
    except (ZoneInfoNotFoundError, ValueError):
        pytest.skip("this host's zone database has no 'localtime'")
    config = console_config(tmp_path, AGENT + '[console]\ntimezone = "localtime"\n')
    result = taskcard("config", "check", str(config))
    assert result.returncode == 0, result.stderr
