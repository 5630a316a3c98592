"""Configuration values an operator writes by mistake that passed without a word or were
called the wrong thing: a repeated id, a loop of symbolic links, a listen address that is
no address, a config file reached through a link, secrets in their variables written
carelessly. Driven through the CLI (`config check`, `serve --check`) as an operator runs it."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from tests.e2e.harness import ServeProcess, eventually
from tests.e2e.test_cli import (
    AGENT,
    console_config,
    refused_by_every_command,
    taskcard,
    warned_by_serve,
)
from tests.e2e.test_reload_routes import FEISHU_CHATS, TELEGRAM_CHATS, WAIT_S, write_config
from tests.fakes.feishu_api import FakeFeishu
from tests.fakes.telegram_api import FakeTelegram


def test_a_repeated_origin_chat_or_allowed_user_is_warned_of_with_both_positions(
    tmp_path: Path,
) -> None:
    """`origin_chats` and `allowed_user_ids` are sets: a repeat changes nothing, so it is
    taken, but it is likely a slip for the id meant (a chat or a person left out), and it
    passed silently. Each repeat is warned of once, naming the key, both positions and the
    fix, on both platforms, without quoting the id."""
    extra = (
        "[telegram]\norigin_chats = [-1001, -1002, -1001]\n"
        '[[telegram.routes]]\nchat_id = -1003\nagents = ["*"]\n'
        "allowed_user_ids = [11, 12, 11, 11]\n"
        '[feishu]\norigin_chats = ["oc_aaa", "oc_aaa"]\n'
        '[[feishu.routes]]\nchat_id = "oc_bbb"\nagents = ["*"]\n'
        'allowed_user_ids = ["ou_ccc", "ou_ddd", "ou_ccc"]\n'
    )
    config = console_config(tmp_path, AGENT, extra=extra)
    result = taskcard("config", "check", str(config))
    assert result.returncode == 0, result.stderr
    warnings = [line for line in result.stderr.splitlines() if "the same id as" in line]
    fix = "it is taken once, so remove the repeat (or write the id you meant there)"
    assert warnings == [
        f"warning: telegram.origin_chats[2]: the same id as telegram.origin_chats[0]; {fix}",
        "warning: telegram.routes[0].allowed_user_ids[2]: the same id as"
        f" telegram.routes[0].allowed_user_ids[0]; {fix}",
        "warning: telegram.routes[0].allowed_user_ids[3]: the same id as"
        f" telegram.routes[0].allowed_user_ids[0]; {fix}",
        f"warning: feishu.origin_chats[1]: the same id as feishu.origin_chats[0]; {fix}",
        "warning: feishu.routes[0].allowed_user_ids[2]: the same id as"
        f" feishu.routes[0].allowed_user_ids[0]; {fix}",
    ], result.stderr
    assert "oc_aaa" not in result.stderr and "ou_ccc" not in result.stderr


@pytest.mark.parametrize("key", ["state_dir", "agents[0].workdir", "discover.roots[0]"])
def test_a_path_that_is_a_loop_of_links_is_called_a_loop(tmp_path: Path, key: str) -> None:
    """A path key naming a symbolic link to itself (or two links to each other) was "a
    dangling symlink" (state_dir) or a workdir or root "not made yet", a note, served as if
    the folder might still come. It never can until the links change: refused as a loop,
    naming the link, by every command; but for a workdir only by the pre-flight two, and
    `serve` warns of it and serves the other agents (the folder is the agent's, which may
    become such a loop at any moment, and the whole fleet stayed dark: see
    test_workdir_unusable.py)."""
    loop = tmp_path / "loop"
    loop.symlink_to("loop")
    if key == "state_dir":
        config = tmp_path / "taskcard.toml"
        config.write_text('state_dir = "loop/state"\n' + AGENT)
    elif key == "agents[0].workdir":
        config = console_config(tmp_path, '[[agents]]\nid = "builder"\nworkdir = "loop"\n')
    else:
        config = console_config(tmp_path, extra='[discover]\nroots = ["loop"]\n')
    workdir = key == "agents[0].workdir"
    said = [line for line, _ in refused_by_every_command(config, key, serve=not workdir)]
    if workdir:
        served = (
            "; the agent is served all the same and its files are read once its workdir is a"
            " folder (the other agents are not affected)"
        )
        warned = warned_by_serve(config, key)
        assert warned.endswith(served), warned
        said.append(warned.removesuffix(served))
    for line in said:
        if key == "state_dir":
            assert f"{loop}/state goes round a loop of symbolic links at {loop} (" in line, line
        else:
            assert f"{loop} goes round a loop of symbolic links (" in line, line
        assert "dangling" not in line and "does not exist yet" not in line, line
        assert line.endswith(
            (
                "fix the link or choose another state_dir",
                "fix the link or point workdir at the agent's folder",
                "fix the link or choose another root",
            )
        ), line


def test_relative_paths_of_a_config_reached_through_a_link_start_beside_the_link(
    tmp_path: Path,
) -> None:
    """A config file linked into place (/etc/taskcard/taskcard.toml -> a release folder)
    had its relative paths resolved beside the link's target: its state and workdirs moved
    with each release. They start at the folder of the path the operator gave."""
    release = tmp_path / "release"
    release.mkdir()
    (release / "taskcard.toml").write_text('state_dir = ".taskcard"\n' + AGENT)
    etc = tmp_path / "etc"
    etc.mkdir()
    link = etc / "taskcard.toml"
    link.symlink_to(os.path.relpath(release / "taskcard.toml", etc))
    result = taskcard("config", "check", str(link))
    assert result.returncode == 0, result.stderr
    assert (
        f"note: agent builder: workdir {etc}/agents/builder does not exist yet" in result.stdout
    ), result.stdout
    assert str(release / "agents") not in result.stdout


WEBHOOK = AGENT + '[feishu]\nevents = "webhook"\n[[feishu.routes]]\nchat_id = "oc_aaa"\n'
WEBHOOK += 'agents = ["*"]\n[feishu.webhook]\n'


@pytest.mark.parametrize(
    ("body", "key", "words"),
    [
        (
            WEBHOOK + 'host = "5"\n',
            "feishu.webhook.host",
            "'5' is not a full IPv4 address (no host name ends in a number, and the resolver"
            ' reads it as 0.0.0.5); write all four numbers, e.g. "127.0.0.1"',
        ),
        (
            WEBHOOK + 'host = "127.1"\n',
            "feishu.webhook.host",
            "'127.1' is not a full IPv4 address (no host name ends in a number, and the"
            " resolver reads it as 127.0.0.1)",
        ),
        (
            WEBHOOK + 'host = "0.0.0.0:8088"\n',
            "feishu.webhook.host",
            "'0.0.0.0:8088' holds a port; write the address alone here, as '0.0.0.0', and the"
            " port in feishu.webhook.port",
        ),
        (
            WEBHOOK + 'host = "[::1]"\n',
            "feishu.webhook.host",
            "'[::1]' is in brackets; write the IPv6 address alone, as '::1'",
        ),
        (
            '[metrics]\nlisten = "5:9464"\n' + AGENT,
            "metrics.listen",
            "'5:9464': '5' is not a full IPv4 address (no host name ends in a number)",
        ),
        (
            WEBHOOK + "port = 65536\n",
            "feishu.webhook.port",
            "Input should be less than or equal to 65535 (got 65536)",
        ),
        (
            WEBHOOK + 'port = "8088"\n',
            "feishu.webhook.port",
            "Input should be a valid integer (got a string); write the number without quotes",
        ),
    ],
    ids=[
        "a-number",
        "ipv4-shorthand",
        "with-its-port",
        "ipv6-in-brackets",
        "listen",
        "65536",
        "text",
    ],
)
def test_a_listen_address_that_is_no_address_is_refused_saying_what_to_write(
    tmp_path: Path, body: str, key: str, words: str
) -> None:
    """`feishu.webhook.host = "5"` (or `"127.1"`, `metrics.listen = "5:9464"`) passed as a
    host name, yet no host name ends in a number: the resolver reads the IPv4 shorthand, so
    the webhook bound 0.0.0.5, and failed, only at the start. An address given with its
    port, or an IPv6 address in brackets as a URL writes it, was "not an IP address or host
    name" without the fix. A port out of range or in quotes stays refused."""
    config = console_config(tmp_path, extra=body)
    result = taskcard("config", "check", str(config))
    assert result.returncode == 2, result.stdout + result.stderr
    line = next(line for line in result.stderr.splitlines() if f" {key}: " in line)
    assert line.split(f" {key}: ", 1)[1].startswith(words), line


def test_a_webhook_on_port_0_is_warned_of(tmp_path: Path) -> None:
    """Port 0 binds whatever port is free at each start: valid to bind, but the proxy in
    front and the callback URL set in Feishu cannot follow it. It passed without a word."""
    config = console_config(tmp_path, extra=WEBHOOK + "port = 0\n")
    result = taskcard("config", "check", str(config))
    assert result.returncode == 0, result.stderr
    assert (
        "warning: feishu.webhook.port: 0 binds whatever port is free at each start, so the"
        " proxy in front and the callback URL set in Feishu cannot know it; give the port they"
        " forward to (e.g. 8088)"
    ) in result.stderr.splitlines(), result.stderr


SECRETS = {
    "TC_G_TOKEN": "123456:AAHdqTcvCH1vGWJxfSeofSAs0K5PALDsaw",
    "TC_G_APP_ID": "cli_a1b2c3d4e5f6a7b8",
    "TC_G_SECRET": "Zx8yQe3vT1uWb7LmZx8yQe3vT1uWb7Lm",
    "TC_G_VERIFY": "vErIfYtOkEn1234567",
    "TC_G_ENCRYPT": "eNcRyPtKeY4567890",
}
SECRET_CONFIG = (
    '[telegram]\ntoken_env = "TC_G_TOKEN"\n'
    '[[telegram.routes]]\nchat_id = -100123\nagents = ["*"]\n'
    '[feishu]\napp_id_env = "TC_G_APP_ID"\napp_secret_env = "TC_G_SECRET"\nevents = "webhook"\n'
    '[feishu.webhook]\nverification_token_env = "TC_G_VERIFY"\n'
    'encrypt_key_env = "TC_G_ENCRYPT"\n'
    '[[feishu.routes]]\nchat_id = "oc_aaa"\nagents = ["*"]\n'
)


def _secret_check(tmp_path: Path, env: dict[str, str]) -> tuple[int, str, str]:
    (tmp_path / "agents" / "builder").mkdir(parents=True, exist_ok=True)
    config = console_config(tmp_path, AGENT, extra=SECRET_CONFIG)
    result = taskcard("serve", "--config", str(config), "--check", env={**SECRETS, **env})
    assert "Traceback" not in result.stderr, result.stderr
    return result.returncode, result.stdout, result.stderr


@pytest.mark.parametrize(
    ("variable", "value", "setting", "words"),
    [
        (
            "TC_G_TOKEN",
            f'"{SECRETS["TC_G_TOKEN"]}"',
            "telegram.token_env",
            "does not hold a bot token: the bot token is in quotes, which are kept as part of"
            " the value",
        ),
        (
            "TC_G_SECRET",
            f"'{SECRETS['TC_G_SECRET']}'",
            "feishu.app_secret_env",
            "does not hold an app secret: the app secret is in quotes",
        ),
        (
            "TC_G_VERIFY",
            f"Bearer {SECRETS['TC_G_VERIFY']}",
            "feishu.webhook.verification_token_env",
            "does not hold an event verification token: it starts with 'Bearer ', a request"
            " header's word, not part of the event verification token; give the event"
            " verification token alone",
        ),
        (
            "TC_G_TOKEN",
            f"Bearer {SECRETS['TC_G_TOKEN']}",
            "telegram.token_env",
            "does not hold a bot token: it starts with 'Bearer '",
        ),
        (
            "TC_G_ENCRYPT",
            f"{SECRETS['TC_G_ENCRYPT']}\n{SECRETS['TC_G_ENCRYPT']}",
            "feishu.webhook.encrypt_key_env",
            "does not hold an encrypt key: it has white space inside",
        ),
        (
            "TC_G_APP_ID",
            SECRETS["TC_G_TOKEN"],
            "feishu.app_id_env",
            "does not hold an app id: it has a Telegram bot token's form (the bot's id, a"
            " colon, then letters); point feishu.app_id_env at the variable that holds the"
            " Feishu app id",
        ),
        (
            "TC_G_TOKEN",
            SECRETS["TC_G_APP_ID"],
            "telegram.token_env",
            "does not hold a bot token: it is a Feishu app id (cli_...); point"
            " telegram.token_env at the variable that holds the bot token from @BotFather",
        ),
        (
            "TC_G_SECRET",
            SECRETS["TC_G_APP_ID"],
            "feishu.app_secret_env",
            "does not hold an app secret: it is an app id (cli_...); the variables of"
            " feishu.app_id_env and feishu.app_secret_env may be swapped",
        ),
        (
            "TC_G_TOKEN",
            SECRETS["TC_G_SECRET"],
            "telegram.token_env",
            "does not hold a bot token: it has no colon, which every token from @BotFather has"
            " (the bot's id, a colon, then letters), and has a Feishu app secret's form (32"
            " letters and digits); point telegram.token_env at the variable that holds the bot"
            " token (one without a colon is taken only with telegram.api_base_url naming a"
            " local Bot API server)",
        ),
        (
            "TC_G_TOKEN",
            SECRETS["TC_G_TOKEN"].split(":")[1],
            "telegram.token_env",
            "does not hold a bot token: it has no colon, which every token from @BotFather has"
            " (the bot's id, a colon, then letters); point telegram.token_env",
        ),
    ],
    ids=[
        "token-in-quotes",
        "secret-in-single-quotes",
        "verify-bearer",
        "token-bearer",
        "encrypt-key-two-lines",
        "telegram-token-as-app-id",
        "app-id-as-telegram-token",
        "app-id-as-secret",
        "app-secret-as-telegram-token",
        "token-without-its-bot-id",
    ],
)
def test_a_secret_variable_written_carelessly_is_refused_naming_the_variable_not_the_value(
    tmp_path: Path, variable: str, value: str, setting: str, words: str
) -> None:
    """A secret's variable holding the secret in quotes (kept by `docker run --env-file`),
    after `Bearer `, as two lines, or holding the other platform's credential (or the app id
    where the secret belongs) was taken: the channel started and every request was refused
    by the platform, or, for a quoted or `Bearer ` bot token, refused as a token with "a
    space, a quote, ..." without saying which. Each is refused by `serve --check` (and
    `serve`), naming the setting and the variable and the slip, never the value."""
    code, stdout, stderr = _secret_check(tmp_path, {variable: value})
    assert code == 2, stdout + stderr
    [line] = [line for line in stderr.splitlines() if line.startswith(f"  - {setting}: ")]
    assert line.startswith(f"  - {setting}: the environment variable {variable} {words}"), line
    assert value.strip("'\"").split()[-1] not in stdout + stderr


@pytest.mark.parametrize(
    "root", ["http://127.0.0.1:8081", "http://localhost:8081/", "https://bots.example.org"]
)
def test_a_token_without_a_colon_is_taken_for_another_bot_api_root(
    tmp_path: Path, root: str
) -> None:
    """A local Bot API server or a test double may take tokens of its own form: a token
    without a colon is refused only for Telegram's own Bot API, which takes none."""
    config = console_config(
        tmp_path,
        AGENT,
        extra=f'[telegram]\ntoken_env = "TC_G_TOKEN"\napi_base_url = "{root}"\n'
        '[[telegram.routes]]\nchat_id = -100123\nagents = ["*"]\n',
    )
    (tmp_path / "agents" / "builder").mkdir(parents=True)
    result = taskcard(
        "serve", "--config", str(config), "--check", env={"TC_G_TOKEN": SECRETS["TC_G_SECRET"]}
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"{config}: valid; "), result.stdout


def test_a_secret_or_a_taskcard_variable_with_a_line_break_or_spaces_around_is_taken(
    tmp_path: Path,
) -> None:
    """White space around a value is no mistake: a file read into a variable, an env file,
    `echo` leave a line break at its end. The secrets are taken as they were; a
    TASKCARD_CONFIG ending in a line break was "no such file" about a name with the break
    in it, and a TASKCARD_LOG_LEVEL of "info" and a line break a usage error."""
    padded = {name: f" {value}\n" for name, value in SECRETS.items()}
    code, stdout, stderr = _secret_check(tmp_path, padded)
    assert code == 0 and ": valid; " in stdout, stderr
    config = tmp_path / "taskcard.toml"
    result = taskcard(
        "serve",
        "--check",
        env={
            **SECRETS,
            "TASKCARD_CONFIG": f"{config}\n",
            "TASKCARD_LOG_LEVEL": "info\n",
            "TASKCARD_LOG_FORMAT": " json\n",
        },
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"{config}: valid; "), result.stdout
    result = taskcard("config", "check", env={"TASKCARD_CONFIG": f"{config}\r\n"})
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"{config}: valid;"), result.stdout


@pytest.mark.parametrize(
    ("command", "argument"),
    [
        (("serve",), "--config/-c"),
        (("serve", "--check"), "--config/-c"),
        (("status",), "--config/-c"),
        (("chats",), "--config/-c"),
        (("config", "check"), "FILE"),
    ],
    ids=["serve", "serve-check", "status", "chats", "config-check"],
)
@pytest.mark.parametrize("blank", [" ", "   ", "\t "], ids=["space", "spaces", "tab"])
def test_a_taskcard_config_of_white_space_only_is_refused_naming_the_variable(
    command: tuple[str, ...], argument: str, blank: str
) -> None:
    """A TASKCARD_CONFIG of spaces (an env file's `TASKCARD_CONFIG= `) was refused as
    "argument --config/-c: is empty; give the path", about an argument the user never
    typed. The line names the variable and the fix, exit 2; a --config given wins."""
    result = taskcard(*command, env={"TASKCARD_CONFIG": blank})
    prog = "taskcard " + " ".join(word for word in command if not word.startswith("-"))
    assert (result.returncode, result.stdout) == (2, ""), result.stderr
    assert result.stderr == (
        f"{prog}: argument {argument}: its default, TASKCARD_CONFIG, is blank; set"
        " TASKCARD_CONFIG to the path of the TOML configuration file, or unset it; see"
        f" `{prog} --help`\n"
    )


def test_a_blank_taskcard_config_is_no_matter_beside_a_config_given(tmp_path: Path) -> None:
    config = console_config(tmp_path, AGENT)
    result = taskcard("serve", "--config", str(config), "--check", env={"TASKCARD_CONFIG": "  "})
    assert result.returncode == 0, result.stderr


def test_a_redis_url_in_quotes_is_refused_as_quoted_not_as_another_scheme(
    tmp_path: Path,
) -> None:
    """A quoted Redis URL was told it "must start with redis://", which it seems to; the
    quotes are named, and the URL (it may hold a password) is not quoted back."""
    config = console_config(tmp_path, AGENT, extra='[cluster]\nredis_url_env = "TC_G_REDIS"\n')
    url = "redis://:Pa55w0rd-x@127.0.0.1:6379/0"
    result = taskcard("serve", "--config", str(config), "--check", env={"TC_G_REDIS": f"'{url}'"})
    assert result.returncode == 2, result.stderr
    assert (
        "  - cluster.redis_url_env: the environment variable TC_G_REDIS does not hold a usable"
        " Redis URL: the Redis URL is in quotes, which are kept as part of the value"
    ) in result.stderr, result.stderr
    assert "Pa55w0rd" not in result.stderr + result.stdout


@pytest.mark.parametrize("platform", ["telegram", "feishu"])
async def test_a_reload_warns_of_a_repeated_id_and_of_a_workdir_that_loops(
    tmp_path: Path, platform: str, telegram: FakeTelegram, feishu: FakeFeishu
) -> None:
    """What `config check` says, a running service says at a SIGHUP: a repeated origin chat
    is taken with the warning, and so is a new agent whose workdir is a loop of links, with
    a warning naming the loop (it was taken as a folder not made yet). Such a workdir
    refused the whole reload, which kept every other change of the file out too; it is
    that agent's problem alone now (test_workdir_unusable.py)."""
    fake: FakeTelegram | FakeFeishu = telegram if platform == "telegram" else feishu
    chat, origin = TELEGRAM_CHATS if platform == "telegram" else FEISHU_CHATS
    config, env = write_config(tmp_path, fake, [(chat, ["alpha"])])
    with ServeProcess(config, env={**env, "TASKCARD_LOG_LEVEL": "INFO"}) as serve:
        assert serve.proc is not None
        await eventually(
            lambda: f"channel {platform} ready" in serve.logs, timeout_s=WAIT_S, what="the start"
        )
        write_config(tmp_path, fake, [(chat, ["alpha"])], origin_chats=(origin, origin))
        serve.proc.send_signal(signal.SIGHUP)
        warning = (
            f"{platform}.origin_chats[1]: the same id as {platform}.origin_chats[0]; it is"
            " taken once, so remove the repeat (or write the id you meant there)"
        )
        await eventually(lambda: warning in serve.logs, timeout_s=WAIT_S, what="the warning")
        (tmp_path / "loop").symlink_to("loop")
        loop_agent = ("[[agents]]", 'id = "gamma"', 'workdir = "loop"')
        write_config(tmp_path, fake, [(chat, ["alpha"])], loop_agent)
        serve.proc.send_signal(signal.SIGHUP)
        await eventually(
            lambda: serve.logs.count("config reloaded") == 2, timeout_s=WAIT_S, what="the reload"
        )
        await eventually(
            lambda: (
                f"agent gamma: agents[2].workdir: {tmp_path}/loop goes round a loop of"
                " symbolic links" in serve.logs
            ),
            timeout_s=WAIT_S,
            what="the loop named",
        )
        assert await serve.aterminate() == 0
    assert "config reload refused" not in serve.logs, serve.logs
    assert "Traceback" not in serve.logs, serve.logs
