"""The configuration file written carelessly, as an operator meets it: `taskcard config
check` and a reload of a running `taskcard serve` refuse it with one line naming the key (as
written in the file) or the place, and the fix; a reload keeps the running configuration."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from tests.e2e.harness import ServeProcess, eventually
from tests.e2e.test_cli import AGENT, console_config, taskcard

# A bot token's shape: a value given twice must never be quoted back.
TOKEN = "123456789:AAHdqTcvCH1vGWJxfSeofSAs0K5PALDsaw"


def refusal(config: Path) -> str:
    """The one problem line `config check` gives for `config` (exit 2, no traceback)."""
    result = taskcard("config", "check", str(config))
    assert result.returncode == 2, result.stdout + result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.splitlines()[1:]
    assert len(lines) == 1, result.stderr
    return lines[0].removeprefix(f"  - {config}: ")


@pytest.mark.parametrize(
    ("body", "words"),
    [
        (
            AGENT + '[telegram]\ntoken_env = "A"\ncommands = true\ntoken_env = "{token}"\n',
            "line 8: telegram.token_env is given twice (first at line 6)",
        ),
        (
            '[telegram]\n[[telegram.routes]]\nchat_id = 1\nagents = ["*"]\n'
            '[[telegram.routes]]\nchat_id = 2\nagents = ["*"]\npin = true\n'
            "pin = [\n  false,\n]",
            "line 10: telegram.routes[1].pin is given twice (first at line 9)",
        ),
        (
            'log_level = "INFO"\nlog_level = "{token}"\n\n# the end\n',
            "line 3: log_level is given twice (first at line 2)",
        ),
        (
            "[watch]\ndebounce_ms = 5\n[display]\n[watch]\n",
            "line 5: the table [watch] is declared twice",
        ),
    ],
    ids=["in-a-table", "in-an-array-of-tables", "at-the-end", "a-table"],
)
def test_a_key_given_twice_is_named_with_its_lines(tmp_path: Path, body: str, words: str) -> None:
    """tomllib says "Cannot overwrite a value (at line 7, column 19)" (or "at end of
    document") without the key, and names a table given twice as a Python tuple; the key was
    hunted through the file. It is named as the other problems name keys, with both lines,
    and the value (here a token) is not quoted back."""
    config = console_config(tmp_path, extra=body.format(token=TOKEN))
    line = refusal(config)
    assert line.startswith(words), line
    assert "TOML takes each" in line, line
    assert TOKEN not in line and "Cannot" not in line, line


@pytest.mark.parametrize(
    ("encoding", "bom", "words"),
    [
        ("utf-16", "", "is UTF-16 text (it starts with that byte order mark)"),
        ("utf-32", "", "is UTF-32 text (it starts with that byte order mark)"),
        ("utf-16-le", "", "holds a NUL byte (line 1, column 2)"),
        ("utf-16-be", "", "holds a NUL byte (line 1, column 1)"),
        ("utf-8", "\x00", "holds a NUL byte (line 3, column 15)"),
    ],
    ids=["utf-16", "utf-32", "utf-16-le-without-mark", "utf-16-be-without-mark", "a-nul"],
)
def test_a_file_saved_as_utf16_or_holding_a_nul_is_said_so(
    tmp_path: Path, encoding: str, bom: str, words: str
) -> None:
    """A file saved as UTF-16 was "not UTF-8 text (byte 0xff at line 1, column 1)", or,
    without its byte order mark, a TOML syntax error at line 1 (every ASCII letter has a NUL
    beside it, which is valid UTF-8); a NUL byte in a UTF-8 file was "Expected newline or end
    of document after a statement". Each is said as what it is, with the fix."""
    config = tmp_path / "taskcard.toml"
    text = 'state_dir = ".taskcard"\n' + AGENT.replace('"builder"\n', '"builder"' + bom + "\n")
    config.write_bytes(text.encode(encoding))
    line = refusal(config)
    assert line.startswith(words), line
    assert line.endswith(("save it as UTF-8", "save it as UTF-8 text")), line


@pytest.mark.parametrize(
    ("body", "words"),
    [
        ("[watch]\ndebounce_ms = 1e300\n", "watch.debounce_ms:"),
        ("[telegram]\npoll_timeout_s = 51.0\n", "telegram.poll_timeout_s:"),
        ("[telegram.limits.bot]\nmax_calls = -2.0\nperiod_s = 1.0\n", "max_calls:"),
    ],
    ids=["huge", "above", "below"],
)
def test_an_integer_key_given_a_float_out_of_its_range_is_told_the_range(
    tmp_path: Path, body: str, words: str
) -> None:
    """An integer key given a whole float is told to write it as an integer, the integer
    shown; for `1e300` that was its 301 digits, out of the key's range anyway (and `51.0`
    was told to write 51, refused next as above 50). The range is said instead."""
    config = console_config(tmp_path, AGENT, extra=body)
    line = refusal(config)
    assert words in line, line
    bound = {"huge": "of at most 10000", "above": "of at most 50", "below": "of at least 1"}
    assert any(f"write a whole number {b}," in line for b in bound.values()), line
    assert "1000000000" not in line and ": 51" not in line and ": -2" not in line, line


async def test_a_file_emptied_or_broken_while_serving_keeps_the_running_configuration(
    tmp_path: Path,
) -> None:
    """SIGHUP after the file was emptied (an editor's truncation caught before its write, a
    `> file` by mistake): it was taken as a valid configuration of no agents, and every
    agent served was retired. It is refused like an invalid file, one line saying why, and so
    are a key given twice and a file saved as UTF-16; the agents stay served, and the file
    written back applies."""
    (tmp_path / "agents" / "builder").mkdir(parents=True)
    (tmp_path / "agents" / "other").mkdir(parents=True)
    config = console_config(tmp_path, AGENT, extra="[console]\nenabled = true\n")
    good = config.read_text()
    broken = [
        (b"", "holds no settings (it is empty, or only comments and blank lines)"),
        (b"\n  \n# all gone\n", "holds no settings"),
        ((good + 'id = "x"\n').encode(), "line 7: agents[0].id is given twice (first at line 5)"),
        (good.encode("utf-16"), "is UTF-16 text"),
    ]
    with ServeProcess(config, env={"TASKCARD_LOG_LEVEL": "INFO"}) as serve:
        await eventually(lambda: "channel console ready" in serve.logs, what="the start")
        assert serve.proc is not None
        for count, (content, words) in enumerate(broken, 1):
            config.write_bytes(content)
            serve.proc.send_signal(signal.SIGHUP)
            await eventually(
                lambda n=count: serve.logs.count("config reload refused") == n,
                what=f"refusal {count}",
            )
            await eventually(lambda w=words: w in serve.logs, what=words)
        config.write_text(good + '[[agents]]\nid = "other"\nworkdir = "agents/other"\n')
        serve.proc.send_signal(signal.SIGHUP)
        await eventually(lambda: "config reloaded: 2 agents" in serve.logs, what="the fix")
        assert await serve.aterminate() == 0
    assert "retired" not in serve.logs, serve.logs
    assert "config reloaded: 0 agents" not in serve.logs, serve.logs
    assert "Traceback" not in serve.logs, serve.logs


@pytest.mark.parametrize(
    ("body", "key", "env_key"),
    [
        (f'[telegram]\napi_token = "{TOKEN}"\n', "telegram.api_token", "telegram.token_env"),
        (
            '[telegram]\nTELEGRAM_BOT_TOKEN = "AAHdqTcvCH1vGWJxfSeofSAs"\n',
            "telegram.TELEGRAM_BOT_TOKEN",
            "telegram.token_env",
        ),
        (
            '[feishu]\nappsecret = "Zx8yQe3vT1uWb7LmNp2KdR5sHj9Fc4Ga"\n',
            "feishu.appsecret",
            "feishu.app_secret_env",
        ),
        (
            '[feishu.webhook]\nverify_token = "Zx8yQe3vT1uWb7Lm"\n',
            "feishu.webhook.verify_token",
            "feishu.webhook.verification_token_env",
        ),
    ],
    ids=["telegram-token-shape", "telegram-variable-as-key", "feishu-secret", "webhook-token"],
)
def test_an_unknown_key_holding_a_credential_is_refused_as_one(
    tmp_path: Path, body: str, key: str, env_key: str
) -> None:
    """A credential under a key of the writer's own (`api_token`, the variable's name as the
    key) was refused as an unknown key, with the allowed keys or "did you mean
    'app_secret_env'?": the fix read as "rename the key", leaving the secret in the file.
    It is refused as a credential, naming the key for its variable, and never quoted."""
    secret = body.split('"')[1]
    config = console_config(tmp_path, AGENT, extra=body)
    line = refusal(config)
    assert line.startswith(f"{key}: unknown key, and its value looks like a credential"), line
    assert env_key in line and "did you mean" not in line, line
    serve = taskcard("serve", "--config", str(config))
    assert serve.returncode == 2, serve.stderr
    for output in (line, serve.stdout, serve.stderr):
        assert secret not in output, output


def test_an_unknown_key_naming_a_variable_is_still_offered_the_key_meant(tmp_path: Path) -> None:
    """A typo of a `*_env` key holds a variable's name, no secret: the nearest key is named."""
    config = console_config(tmp_path, AGENT, extra='[telegram]\ntoken_enc = "TG_TOKEN"\n')
    line = refusal(config)
    assert line.startswith("telegram.token_enc: unknown key (did you mean 'token_env'?)"), line


def test_a_config_path_whose_tilde_no_shell_expanded_says_so(tmp_path: Path) -> None:
    """`--config=~/taskcard.toml` (or the path in quotes, or a unit's ExecStart) reaches the
    command with its ~: "no such file; create it" sent the operator to create a file that
    exists. The line says the ~ was not expanded and shows the full path."""
    (tmp_path / "taskcard.toml").write_text(AGENT)
    for args in (
        ("config", "check", "~/taskcard.toml"),
        ("serve", "--config=~/taskcard.toml"),
        ("status", "--config=~/taskcard.toml"),
    ):
        result = taskcard(*args, env={"HOME": str(tmp_path)})
        assert result.returncode == 2, (args, result.stderr)
        assert "Traceback" not in result.stderr, result.stderr
        assert (
            "~/taskcard.toml: no such file: the ~ was not expanded (only a shell does, and not"
            f" in quotes or after --config=); write the full path, e.g. {tmp_path}/taskcard.toml"
        ) in result.stderr, result.stderr


async def test_a_discovery_root_that_does_not_exist_yet_is_noted_as_a_workdir_is(
    tmp_path: Path,
) -> None:
    """A root with a slip in its path (`fleet` for `fleets`) showed nothing anywhere: no
    agent, `config check` valid without a word, nothing in the log. It is noted by `config
    check` and the start, once each, as a workdir that does not exist yet is; the root made
    later is still watched."""
    (tmp_path / "agents").mkdir()
    config = console_config(
        tmp_path, extra='[console]\nenabled = true\n[discover]\nroots = ["agents", "fleet"]\n'
    )
    words = f"discover.roots[1]: {tmp_path}/fleet does not exist yet"
    check = taskcard("config", "check", str(config))
    assert check.returncode == 0, check.stderr
    assert check.stdout.count(f"note: {words}") == 1, check.stdout
    assert "discover.roots[0]" not in check.stdout, check.stdout
    with ServeProcess(config, env={"TASKCARD_LOG_LEVEL": "INFO"}) as serve:
        await eventually(lambda: "channel console ready" in serve.logs, what="the start")
        (tmp_path / "fleet" / "builder").mkdir(parents=True)
        await eventually(
            lambda: "now serving agent builder" in serve.logs, what="the agent found in the root"
        )
        assert await serve.aterminate() == 0
    assert serve.logs.count(words) == 1, serve.logs


@pytest.mark.parametrize(
    ("body", "line_start"),
    [
        (
            '[metrics]\nlisten = "admin:hunter2pw@127.0.0.1:9464"\n',
            "metrics.listen: holds a user or password (before an @)",
        ),
        ('[metrics]\nlisten = "hunter2pw@127.0.0.1:9464"\n', "metrics.listen: holds a user"),
        (
            '[feishu]\nevents = "webhook"\n[feishu.webhook]\nhost = "admin:hunter2pw@0.0.0.0"\n',
            "feishu.webhook.host: '***@0.0.0.0' is not an IP address or host name",
        ),
        (
            '[feishu]\nevents = "webhook"\n[feishu.webhook]\npath = "/events?token=hunter2pw"\n',
            "feishu.webhook.path: '/events?***' is not a request path",
        ),
    ],
    ids=["listen-user-password", "listen-user", "webhook-host", "webhook-path-query"],
)
def test_a_listen_address_or_path_holding_a_password_is_refused_without_it(
    tmp_path: Path, body: str, line_start: str
) -> None:
    """`metrics.listen = "admin:pw@127.0.0.1:9464"` was told to put an IPv6 address in
    brackets, quoting the password; a webhook host or path holding one was quoted whole. Each
    is refused naming the key, without what may be a secret."""
    config = console_config(tmp_path, AGENT, extra=body)
    line = refusal(config)
    assert line.startswith(line_start), line
    serve = taskcard("serve", "--config", str(config))
    assert serve.returncode == 2, serve.stderr
    for output in (line, serve.stdout, serve.stderr):
        assert "hunter2pw" not in output, output


@pytest.mark.parametrize(
    ("body", "words"),
    [
        ("[watch]\ndebounce_ms = " + "9" * 5000 + "\n", "line 3: a number of 5000 digits"),
        ("[discover]\nroots = " + "[" * 2000 + "]" * 2000 + "\n", "line 3: arrays or inline"),
        ("[watch]\nx = " + "{a=" * 2000 + "1" + "}" * 2000 + "\n", "line 3: arrays or inline"),
    ],
    ids=["number-of-5000-digits", "arrays-nested-deep", "inline-tables-nested-deep"],
)
def test_a_value_python_cannot_read_is_refused_saying_where(
    tmp_path: Path, body: str, words: str
) -> None:
    """An integer of more digits than Python converts (4300), or arrays or inline tables
    nested some hundreds deep, ended `config check`, `serve` and a reload in a traceback
    (ValueError, RecursionError) from the TOML reader. Each is refused naming the line."""
    config = console_config(tmp_path, AGENT, extra=body)
    line = refusal(config)
    assert line.startswith(words) and line.endswith("fix the value"), line
    serve = taskcard("serve", "--config", str(config))
    assert serve.returncode == 2 and "Traceback" not in serve.stderr, serve.stderr
    assert words in serve.stderr, serve.stderr


@pytest.mark.parametrize("char", ["\u200b", "\u00a0", "\u202e"], ids=["zwsp", "nbsp", "rlo"])
async def test_a_workdir_with_an_invisible_character_is_noted_with_it_escaped(
    tmp_path: Path, char: str
) -> None:
    """`workdir = "agents/builder\u200b"` (a zero-width or no-break space pasted from a chat
    or a document) names a folder that does not exist: the note said so printing the path
    raw, reading exactly as the folder that exists (a right-to-left override reordered it).
    `config check` and the start show it quoted, the character escaped."""
    (tmp_path / "agents" / "builder").mkdir(parents=True)
    agent = '[[agents]]\nid = "builder"\nworkdir = "agents/builder{char}"\n'
    config = console_config(tmp_path, agent.format(char=char), "[console]\nenabled = true\n")
    escaped = char.encode("unicode_escape").decode("ascii")
    if escaped == char:  # `unicode_escape` leaves Latin-1 alone: repr writes it as \xa0
        escaped = f"\\x{ord(char):02x}"
    words = f"workdir '{tmp_path}/agents/builder{escaped}' does not exist yet"
    check = taskcard("config", "check", str(config))
    assert check.returncode == 0, check.stderr
    assert f"note: agent builder: {words}" in check.stdout, check.stdout
    with ServeProcess(config, env={"TASKCARD_LOG_LEVEL": "INFO"}) as serve:
        await eventually(lambda: "channel console ready" in serve.logs, what="the start")
        assert await serve.aterminate() == 0
    assert words in serve.logs, serve.logs
    assert char not in check.stdout + serve.logs


@pytest.mark.parametrize(
    ("body", "key"),
    [
        ('[metrics]\nlisten = ""\n', "metrics.listen"),
        ('[cluster]\nredis_url = "none"\n', "cluster.redis_url"),
        ('[cluster]\nredis_url_env = ""\n', "cluster.redis_url_env"),
        (
            '[telegram]\n[[telegram.routes]]\nchat_id = -100\nagents = ["*"]\nthread_id = 0\n',
            "telegram.routes[0].thread_id",
        ),
        (
            '[feishu]\n[[feishu.routes]]\nchat_id = "oc_a"\nagents = ["*"]\n'
            'allowed_user_ids = ""\n',
            "feishu.routes[0].allowed_user_ids",
        ),
    ],
    ids=["listen-empty", "redis-none", "redis-env-empty", "thread-zero", "allowed-empty"],
)
def test_a_null_like_value_of_a_key_unset_when_left_out_says_to_remove_the_line(
    tmp_path: Path, body: str, key: str
) -> None:
    """TOML has no null, so "no listener", "no thread" or "no Redis" is written `""`,
    `"none"` or `0`; each was refused with a value to write instead (`"127.0.0.1:9464"`, a
    thread of at least 1), which is not what was meant. The line also says how to leave the
    key unset: remove it."""
    line = refusal(console_config(tmp_path, AGENT, extra=body))
    assert line.startswith(f"{key}: "), line
    assert line.endswith(f"; TOML has no null: to leave {key} unset, remove its line"), line


def test_a_key_that_cannot_be_left_unset_is_not_told_to_remove_its_line(tmp_path: Path) -> None:
    line = refusal(console_config(tmp_path, AGENT, extra='log_level = ""\n'))
    assert line.startswith("log_level: ") and "TOML has no null" not in line, line
