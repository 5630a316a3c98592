"""The config file: fixed keys, path resolution, error messages, example file and schema."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from taskcard.bridge.config import (
    EXAMPLE_PATH,
    SCHEMA_PATH,
    ConfigError,
    ServiceConfig,
    config_json_schema,
    load_config,
)
from tests.e2e.harness import placeholder_secrets

ISSUE_EXAMPLE = """
state_dir = ".taskcard"                 # relative to the config file; SQLite lives here

[[agents]]
id = "builder"                          # shown in cards and logs
workdir = "agents/builder"              # relative to the config file

[telegram]
token_env = "TELEGRAM_BOT_TOKEN"        # the token is read from this environment variable
api_base_url = "https://api.telegram.org"   # a local Bot API server, or a test fake

[[telegram.routes]]
chat_id = -1001234567890
thread_id = 42                          # optional: a forum topic
agents = ["builder"]                    # or ["*"] for every agent
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "conf" / "taskcard.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def errors_of(tmp_path: Path, text: str) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        load_config(write(tmp_path, text))
    return caught.value.messages


def test_the_issue_keys_load_exactly_as_written(tmp_path: Path) -> None:
    path = write(tmp_path, ISSUE_EXAMPLE)
    config = load_config(path)
    base = path.parent.resolve()
    assert config.state_dir == base / ".taskcard"
    assert [(a.id, a.workdir) for a in config.agents] == [("builder", base / "agents/builder")]
    assert config.telegram is not None
    assert config.telegram.token_env == "TELEGRAM_BOT_TOKEN"
    assert config.telegram.api_base_url == "https://api.telegram.org"
    route = config.telegram.routes[0]
    assert (route.chat_id, route.thread_id, route.agents) == (-1001234567890, 42, ["builder"])
    assert config.feishu is None
    assert config.console_enabled is False


def test_defaults_and_console_auto(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, '[[agents]]\nid = "a"\nworkdir = "/abs/a"\n'))
    assert config.agents[0].workdir == Path("/abs/a")
    assert config.console_enabled is True
    assert config.watch.debounce_ms == 50
    assert config.watch.rescan_interval_s == 300.0
    assert config.display.activity_rows == 3
    assert config.display.no_output_after_s == 300.0
    assert config.log_level == "INFO"
    forced = load_config(write(tmp_path, "[console]\nenabled = false\n"))
    assert forced.console_enabled is False


def test_models_are_frozen(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, ISSUE_EXAMPLE))
    with pytest.raises(ValueError):
        config.log_level = "DEBUG"


def test_missing_file_names_the_fix(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(tmp_path / "nope.toml")
    (message,) = caught.value.messages
    assert "nope.toml: no such file" in message
    assert "taskcard.example.toml" in message


def test_toml_syntax_error_names_the_line(tmp_path: Path) -> None:
    (message,) = errors_of(tmp_path, 'state_dir = ".x"\n[[agents]\nid = "a"\n')
    assert "TOML syntax error" in message
    assert "line 2" in message


SECRET_LIKE = "123456:AAExampleBotTokenPastedIntoTheWrongKey"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            ISSUE_EXAMPLE.replace("chat_id = -1001234567890", 'chat_id = "general"'),
            "telegram.routes[0].chat_id: not a Telegram chat id; write the chat's numeric id",
        ),
        (
            ISSUE_EXAMPLE.replace("thread_id = 42", "thread = 42"),
            "telegram.routes[0].thread: unknown key (did you mean 'thread_id'?); allowed keys"
            " here: agents,"
            " allowed_user_ids, chat_id, orchestrator, pin, thread_id",
        ),
        (ISSUE_EXAMPLE + "\n[display]\nactivity_rows = 11\n", "display.activity_rows:"),
        (ISSUE_EXAMPLE.replace('id = "builder"', 'id = "has space"'), "agents[0].id:"),
        (
            ISSUE_EXAMPLE.replace('agents = ["builder"]', 'agents = ["builder", "ghost"]'),
            "telegram.routes[0].agents[1]: unknown agent 'ghost'; use the id of an [[agents]]"
            ' entry (builder) or "*"',
        ),
        (
            ISSUE_EXAMPLE.replace('workdir = "agents/builder"', ""),
            "agents[0].workdir: required key is missing; add it",
        ),
        (
            ISSUE_EXAMPLE + '\n[[agents]]\nid = "builder"\nworkdir = "b"\n',
            "agents[1].id: 'builder' is already used by agents[0]",
        ),
        ("statedir = 'x'\n", "statedir: unknown key (did you mean 'state_dir'?)"),
        ("[console]\nenabled = 'yes'\n", "console.enabled: got 'yes'; use \"auto\", true or false"),
        (
            ISSUE_EXAMPLE + "\n[[telegram.routes]]\nchat_id = -1001234567890\nthread_id = 42\n"
            'agents = ["*"]\n',
            "telegram.routes[1]: the same chat (and thread) as telegram.routes[0]",
        ),
        # `*_env` keys hold a variable's name (never the secret, which is not quoted back);
        # Feishu ids are neither empty nor padded.
        ('[telegram]\ntoken_env = ""\n', "telegram.token_env: not an environment variable name"),
        (f'[telegram]\ntoken_env = "{SECRET_LIKE}"\n', "telegram.token_env: not an environment"),
        ('[feishu]\napp_id_env = "app id"\n', "feishu.app_id_env: not an environment"),
        ('[feishu]\napp_secret_env = "9LIVES"\n', "feishu.app_secret_env: not an environment"),
        (
            '[feishu.webhook]\nverification_token_env = "X-Y"\n',
            "feishu.webhook.verification_token_env: not an environment",
        ),
        ('[feishu.webhook]\nencrypt_key_env = ""\n', "feishu.webhook.encrypt_key_env: not an"),
        (
            '[[feishu.routes]]\nchat_id = ""\nagents = ["*"]\n',
            "feishu.routes[0].chat_id: not a Feishu chat id",
        ),
        (
            '[[feishu.routes]]\nchat_id = " oc_1"\nagents = ["*"]\n',
            "use the chat's id (oc_...) as `taskcard chats` lists it",
        ),
        (
            '[[feishu.routes]]\nchat_id = "oc_1"\nagents = ["*"]\nallowed_user_ids = [""]\n',
            "feishu.routes[0].allowed_user_ids[0]",
        ),
        (
            '[[feishu.routes]]\nchat_id = "oc_1"\nagents = ["*"]\nallowed_user_ids = ["ou_1 "]\n',
            "feishu.routes[0].allowed_user_ids[0]: not a Feishu user id",
        ),
        # A value out of its bounds says what to write instead, not only the bound.
        (
            ISSUE_EXAMPLE.replace("thread_id = 42", "thread_id = 0"),
            "telegram.routes[0].thread_id: Input should be greater than or equal to 1 (got 0);"
            " use a number of at least 1",
        ),
        (
            ISSUE_EXAMPLE.replace('agents = ["builder"]', "agents = []"),
            "telegram.routes[0].agents: List should have at least 1 item after validation, not"
            " 0; give at least 1 entry",
        ),
        ("[limits]\nmax_pause_s = inf\n", "write a finite number (not nan or inf)"),
        # An origin chat that can never match is refused like a route's chat id.
        ("[telegram]\norigin_chats = [0]\n", "telegram.origin_chats[0]: 0 is no Telegram chat"),
        (
            '[feishu]\norigin_chats = ["oc_1 "]\n',
            "feishu.origin_chats[0]: not a Feishu chat id",
        ),
        (
            '[[telegram.routes]]\nchat_id = -100\nagents = ["*"]\nview = "grid"\n',
            "telegram.routes[0].view: Input should be 'cards' or 'board' (got 'grid'); use one",
        ),
    ],
)
def test_invalid_values_name_the_key_path_and_the_fix(
    tmp_path: Path, text: str, expected: str
) -> None:
    messages = errors_of(tmp_path, text)
    assert any(expected in message for message in messages), messages
    assert all(message.startswith(str(tmp_path)) for message in messages)
    assert not any(SECRET_LIKE in message for message in messages), messages


def test_several_problems_are_reported_together(tmp_path: Path) -> None:
    text = ISSUE_EXAMPLE.replace("chat_id = -1001234567890", 'chat_id = "x"') + "\nbogus = 1\n"
    messages = errors_of(tmp_path, text)
    assert len(messages) == 2


def test_wildcard_routes_and_feishu_agents_are_checked(tmp_path: Path) -> None:
    text = (
        '[[agents]]\nid = "a"\nworkdir = "a"\n'
        '[feishu]\n[[feishu.routes]]\nchat_id = "oc_1"\nagents = ["*"]\n'
        '[[feishu.routes]]\nchat_id = "oc_2"\nagents = ["b"]\n'
    )
    messages = errors_of(tmp_path, text)
    assert messages == [
        f"{tmp_path / 'conf' / 'taskcard.toml'}: feishu.routes[1].agents[0]: unknown agent 'b';"
        ' use the id of an [[agents]] entry (a) or "*"'
    ]


def test_the_example_file_documents_every_key_and_loads() -> None:
    config = load_config(EXAMPLE_PATH)
    assert config.telegram is not None and config.feishu is not None
    text = EXAMPLE_PATH.read_text(encoding="utf-8")
    for key in _all_keys(config_json_schema()):
        assert key in text, f"{key} is not documented in {EXAMPLE_PATH.name}"


def _example_blocks(key: str) -> list[str]:
    """Each line of the example that sets `key` (commented out or not), with the comment lines
    that continue it."""
    lines = EXAMPLE_PATH.read_text(encoding="utf-8").splitlines()
    blocks = []
    for at, line in enumerate(lines):
        if re.match(rf"\s*#?\s*{re.escape(key)}\s*=", line):
            block = [line]
            for following in lines[at + 1 :]:
                if not re.match(r"\s+#", following):
                    break
                block.append(following)
            blocks.append("\n".join(block))
    return blocks


def test_the_example_gives_the_upper_bound_of_every_bounded_number() -> None:
    """The example promises "the range given beside" each number; ambiguous_send_hold_s had
    none, and a value past its 86400 was refused without the file saying so."""
    # Documented once, above their tables: the limits' bounds; a chat id is the platform's.
    elsewhere = {
        ("RateLimit", "max_calls"),
        ("RateLimit", "period_s"),
        ("TelegramRoute", "chat_id"),
    }
    schema = config_json_schema()
    definitions = schema["$defs"]
    assert isinstance(definitions, dict)
    checked = 0
    for model, node in [("ServiceConfig", schema), *definitions.items()]:
        for key, field in node.get("properties", {}).items():
            for variant in [field, *field.get("anyOf", [])]:
                if "maximum" not in variant or (model, key) in elsewhere:
                    continue
                bound = float(variant["maximum"])
                shown = str(int(bound)) if bound.is_integer() else str(bound)
                blocks = [block.replace(",", "") for block in _example_blocks(key)]
                assert any(shown in block for block in blocks), f"{model}.{key}: {shown}"
                checked += 1
    assert checked > 15


def test_the_example_sets_every_key_of_a_single_table_to_its_default(tmp_path: Path) -> None:
    """The example says every key is shown with its default: a key set in `[telegram]`,
    `[watch]` or another single table (not an example route or agent) must read the same when
    the line is left out, so an operator copying the file changes nothing by accident."""
    import tomllib

    import tomlkit

    data = tomllib.loads(EXAMPLE_PATH.read_text(encoding="utf-8"))
    set_keys: list[list[str]] = []

    def strip(table: dict[str, object], path: list[str]) -> None:
        for key, value in list(table.items()):
            if isinstance(value, dict):
                strip(value, [*path, key])
                if path and not value:  # `[telegram.limits.bot]` left empty: use the defaults
                    del table[key]
            elif not (isinstance(value, list) and value and isinstance(value[0], dict)):
                set_keys.append([*path, key])
                del table[key]

    strip(data, [])
    assert len(set_keys) >= 40, set_keys
    defaults_path = tmp_path / "defaults.toml"
    defaults_path.write_text(tomlkit.dumps(data), encoding="utf-8")
    example, defaults = load_config(EXAMPLE_PATH), load_config(defaults_path)

    def value(config: object, path: list[str], folder: Path) -> object:
        for part in path:
            config = getattr(config, part)
        return config.relative_to(folder) if isinstance(config, Path) else config

    differ = [
        ".".join(path)
        for path in set_keys
        if value(example, path, EXAMPLE_PATH.parent) != value(defaults, path, tmp_path)
    ]
    assert differ == []


def _all_keys(schema: dict[str, object]) -> set[str]:
    keys: set[str] = set()
    definitions = schema.get("$defs", {})
    assert isinstance(definitions, dict)
    for node in [schema, *definitions.values()]:
        assert isinstance(node, dict)
        properties = node.get("properties", {})
        assert isinstance(properties, dict)
        keys.update(properties)
    return keys


def test_the_committed_schema_matches_the_models() -> None:
    committed = json.loads(SCHEMA_PATH.read_text(encoding="utf-8"))
    assert committed == config_json_schema(), (
        "config/taskcard.schema.json is stale: run python -m taskcard.bridge.config --write-schema"
    )


def test_check_command_exits_2_with_messages(tmp_path: Path) -> None:
    path = write(tmp_path, "bogus = 1\n")
    result = subprocess.run(
        [sys.executable, "-m", "taskcard.bridge.config", "--check", str(path)],
        capture_output=True,
        text=True,
        check=False,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert result.returncode == 2
    assert "bogus: unknown key" in result.stderr


def test_constructed_directly_paths_stay_as_given() -> None:
    config = ServiceConfig.model_validate({"agents": [{"id": "a", "workdir": "rel"}]})
    assert config.agents[0].workdir == Path("rel")


def test_default_state_dir_is_relative_to_the_config_file(tmp_path: Path) -> None:
    from taskcard.bridge.config import load_config

    config_file = tmp_path / "deep" / "taskcard.toml"
    config_file.parent.mkdir()
    config_file.write_text('[[agents]]\nid = "a"\nworkdir = "a"\n')
    assert load_config(config_file).state_dir == tmp_path / "deep" / ".taskcard"


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("[display]\nno_output_after_s = 1e12\n", "display.no_output_after_s"),
        ("[display]\nno_output_after_s = nan\n", "display.no_output_after_s"),
        ("[watch]\nrescan_interval_s = inf\n", "watch.rescan_interval_s"),
        ("[limits]\nmax_pause_s = 1e9\n", "limits.max_pause_s"),
        ("[limits]\nmax_pause_s = 0\n", "limits.max_pause_s"),
        ('[feishu]\ndomain = "open.feishu.cn"\n', "feishu.domain"),
        ('[feishu]\ndomain = "ftp://open.feishu.cn"\n', "feishu.domain"),
        ('[feishu]\ndomain = "http://open.feishu.cn"\n', "feishu.domain"),
        ('[feishu]\ndomain = "https://"\n', "feishu.domain"),
        ('[feishu]\ndomain = "https://user:pw@open.feishu.cn"\n', "feishu.domain"),
        ('[feishu]\ndomain = "https://open.feishu.cn:99999"\n', "feishu.domain"),
        ('[feishu.webhook]\npath = "events"\n', "feishu.webhook.path"),
        ('[feishu.webhook]\nhost = "not a host"\n', "feishu.webhook.host"),
        ("[feishu]\nrequest_timeout_s = 1e9\n", "feishu.request_timeout_s"),
        ('[telegram]\napi_base_url = "api.telegram.org"\n', "telegram.api_base_url"),
        ('[telegram]\napi_base_url = "https://api.telegram.org?x=1"\n', "telegram.api_base_url"),
        ("[telegram]\nrequest_timeout_s = 0.0001\n", "telegram.request_timeout_s"),
        ("[telegram.limits.bot]\nmax_calls = 30\nperiod_s = 1e12\n", "telegram.limits.bot"),
        ('[[telegram.routes]]\nchat_id = 1\nthread_id = 0\nagents = ["*"]\n', "thread_id"),
        ("[notices]\nmax_per_minute = true\n", "notices.max_per_minute"),
        ('[limits]\nmax_pause_s = "3600"\n', "limits.max_pause_s"),
        ("[watch]\ndebounce_ms = 200.0\n", "watch.debounce_ms"),
        (
            "[display]\nno_output_after_s = nan\n",
            "display.no_output_after_s: Input should be a finite",
        ),
        ("[limits]\nmax_pause_s = inf\n", "limits.max_pause_s: Input should be a finite number"),
        ("[limits]\nmax_pause_s = -inf\n", "limits.max_pause_s: Input should be a finite number"),
        ('[limits]\nmax_pause_s = "NaN"\n', "limits.max_pause_s"),
        ("[telegram]\nsend_timeout_s = 0.01\n", "telegram.send_timeout_s"),
        ("[telegram]\npoll_timeout_s = false\n", "telegram.poll_timeout_s"),
        (
            '[[telegram.routes]]\nchat_id = 0\nagents = ["*"]\n',
            "telegram.routes[0].chat_id: 0 is no",
        ),
        ('[[telegram.routes]]\nchat_id = "-100"\nagents = ["*"]\n', "telegram.routes[0].chat_id"),
        ("[telegram.limits.bot]\nmax_calls = true\nperiod_s = 1.0\n", "telegram.limits.bot"),
        ("[feishu.webhook]\nport = 80.0\n", "feishu.webhook.port"),
        ("[feishu]\nrequest_timeout_s = nan\n", "feishu.request_timeout_s"),
        ('[[feishu.routes]]\nchat_id = "oc_1"\nagents = ["*"]\npin = 1\n', "feishu.routes[0].pin"),
        (
            "[feishu]\nevent_dedup_window_s = 3600\n"
            "[feishu.webhook]\nmax_request_age_s = 3600\nclock_skew_s = 300\n",
            "feishu: event_dedup_window_s = 3600 is shorter than webhook.max_request_age_s"
            " + webhook.clock_skew_s = 3900",
        ),
        (
            "[feishu]\nevent_dedup_window_s = 3700\n"
            "[feishu.webhook]\nmax_request_age_s = 3500\nclock_skew_s = 201\n",
            "raise event_dedup_window_s to at least 3701",
        ),
    ],
)
def test_out_of_range_numbers_and_malformed_urls_name_the_key(
    tmp_path: Path, text: str, key: str
) -> None:
    messages = errors_of(tmp_path, text)
    assert any(key in message for message in messages), messages


def test_loopback_http_is_allowed_for_fakes_and_local_servers(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        '[telegram]\napi_base_url = "http://127.0.0.1:8081"\n'
        '[feishu]\ndomain = "http://localhost:9000"\n',
    )
    config = load_config(path)
    assert config.feishu is not None and config.feishu.domain == "http://localhost:9000"


@pytest.mark.parametrize("where", ["file", "under_a_file", "workdir_file"])
def test_unusable_paths_are_refused_by_serve_check_and_at_start(tmp_path: Path, where: str) -> None:
    (tmp_path / "conf").mkdir()
    (tmp_path / "conf" / "occupied").write_text("not a directory")
    lines = {
        "file": ('state_dir = "occupied"\n', "state_dir"),
        "under_a_file": ('state_dir = "occupied/state"\n', "state_dir"),
        "workdir_file": (
            '[[agents]]\nid = "a"\nworkdir = "occupied"\n[console]\nenabled = true\n',
            "agents[0].workdir",
        ),
    }
    text, key = lines[where]
    path = write(tmp_path, text)
    starts = [["serve", "--config", str(path)]]
    if where == "workdir_file":
        # An agent's workdir that is a file is that agent's problem alone: `serve` starts
        # and warns of it (test_workdir_unusable.py); the pre-flight still refuses it.
        starts = []
    for args in (["serve", "--config", str(path), "--check"], *starts):
        result = subprocess.run(
            [sys.executable, "-m", "taskcard.bridge.cli", *args],
            capture_output=True,
            text=True,
            check=False,
            timeout=60,
            cwd=Path(__file__).resolve().parents[2],
        )
        assert result.returncode == 2, result.stderr
        assert f"{key}:" in result.stderr and "Traceback" not in result.stderr, result.stderr


def test_serve_check_accepts_the_example(tmp_path: Path) -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "taskcard.bridge.cli",
            "serve",
            "--config",
            str(EXAMPLE_PATH),
            "--check",
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
        cwd=Path(__file__).resolve().parents[2],
        env={**os.environ, **placeholder_secrets(EXAMPLE_PATH)},
    )
    assert result.returncode == 0, result.stderr
    assert "valid" in result.stdout


def test_a_large_fleet_holds_each_agent_id_once_and_no_set_per_agent(tmp_path: Path) -> None:
    """Memory at 10,000 agents: routes reuse the configured id strings; agents share one
    fields-set record (pydantic keeps one per model instance otherwise)."""
    ids = [f"agent-{i:03}" for i in range(50)]
    agents = "".join(f'[[agents]]\nid = "{a}"\nworkdir = "/w/{a}"\n' for a in ids)
    text = (
        agents
        + '[telegram]\ntoken_env = "T"\n[[telegram.routes]]\nchat_id = -100\n'
        + f"agents = {json.dumps(ids)}\n"
        + '[feishu]\napp_id_env = "I"\napp_secret_env = "S"\n[[feishu.routes]]\n'
        + f'chat_id = "oc_1"\nagents = {json.dumps(ids[:3])}\n'
    )
    config = load_config(write(tmp_path, text))
    assert config.telegram is not None and config.feishu is not None
    by_id = {agent.id: agent.id for agent in config.agents}
    assert config.telegram.routes[0].agents == ids
    assert all(name is by_id[name] for name in config.telegram.routes[0].agents)
    assert all(name is by_id[name] for name in config.feishu.routes[0].agents)
    first, second = config.agents[0], config.agents[1]
    assert first.__pydantic_fields_set__ is second.__pydantic_fields_set__
    assert first.model_fields_set == {"id", "workdir"}
    moved = first.model_copy(update={"workdir": Path("/elsewhere")})
    assert moved.workdir == Path("/elsewhere") and first.workdir == Path("/w/agent-000")
    assert second.model_fields_set == {"id", "workdir"}, "a copy never changes the shared set"


def test_usual_env_names_and_chat_ids_are_accepted(tmp_path: Path) -> None:
    text = (
        '[telegram]\ntoken_env = "_TC_TOKEN2"\n'
        '[feishu]\napp_id_env = "fs_app"\n[feishu.webhook]\nencrypt_key_env = "KEY"\n'
        '[[feishu.routes]]\nchat_id = "oc_a1b2"\nagents = ["*"]\nallowed_user_ids = ["ou_1"]\n'
    )
    config = load_config(write(tmp_path, text))
    assert config.telegram is not None and config.telegram.token_env == "_TC_TOKEN2"
    assert config.feishu is not None and config.feishu.routes[0].chat_id == "oc_a1b2"


def test_the_bot_root_warning_shows_no_credentials_of_the_url() -> None:
    # The warning's example root was built from the URL whole, user and password included.
    from taskcard.bridge.config import bot_root_doubt

    said = bot_root_doubt("https://user:S3CRET-PASS@gw.example:8443/tg/bot/")
    assert said is not None and "'https://gw.example:8443/tg'" in said, said
    assert "S3CRET" not in said and "user" not in said, said
