"""A credential written into the config file itself: refused by `config check`,
`serve --check` and `serve`, naming the key to use instead, never echoing the value."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.test_cli import AGENT, refused_by_every_command

SECRET = "s3cr3tValue0123456789abcdefABCDEF"  # the shape of a Feishu app secret
TOKEN = "123456789:AAHdqTcvCH1vGWJxfSeofSAs0K5PALDsaw"  # the shape of a bot token

TASKCARD = str(Path(sys.executable).parent / "taskcard")

TG = '[[telegram.routes]]\nchat_id = -100123\nagents = ["builder"]\n'
FS = '[[feishu.routes]]\nchat_id = "oc_0123456789abcdef"\nagents = ["builder"]\n'


@pytest.mark.parametrize(
    ("section", "key", "instead"),
    [
        (f'[telegram]\ntoken = "{TOKEN}"\n' + TG, "telegram.token", "telegram.token_env"),
        (f'[telegram]\nbot_token = "{TOKEN}"\n' + TG, "telegram.bot_token", "telegram.token_env"),
        (f'[feishu]\napp_secret = "{SECRET}"\n' + FS, "feishu.app_secret", "feishu.app_secret_env"),
        (f'[feishu]\nsecret = "{SECRET}"\n' + FS, "feishu.secret", "feishu.app_secret_env"),
        (f'[feishu]\napp_id = "{SECRET}"\n' + FS, "feishu.app_id", "feishu.app_id_env"),
        (
            f'[feishu]\nevents = "webhook"\n[feishu.webhook]\nencrypt_key = "{SECRET}"\n' + FS,
            "feishu.webhook.encrypt_key",
            "feishu.webhook.encrypt_key_env",
        ),
        (
            f'[feishu]\nevents = "webhook"\n[feishu.webhook]\nverification_token = "{SECRET}"\n'
            + FS,
            "feishu.webhook.verification_token",
            "feishu.webhook.verification_token_env",
        ),
    ],
    ids=[
        "tg-token",
        "tg-bot-token",
        "fs-secret",
        "fs-secret-short",
        "fs-app-id",
        "fs-encrypt",
        "fs-verify",
    ],
)
def test_a_credential_in_the_file_is_refused_pointing_at_the_env_key(
    tmp_path: Path, section: str, key: str, instead: str
) -> None:
    """It was refused as an unknown key "(did you mean 'token_env'?)", which reads as a
    rename and would leave the secret in the file under the variable-name key. The line now
    says that credentials are read only from the environment, and which key names the
    variable (docs/operators.md: secrets only ever come from environment variables)."""
    config = tmp_path / "taskcard.toml"
    config.write_text('state_dir = "state"\n' + AGENT + section)
    for line, result in refused_by_every_command(config, key):
        assert "credentials are never read from this file" in line, line
        assert f"NAME in {instead}" in line, line
        assert SECRET not in result.stderr + result.stdout
        assert TOKEN not in result.stderr + result.stdout


def serve_once(config: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """`taskcard serve --config CONFIG` with `env`, expected to stop on its own."""
    return subprocess.run(
        [TASKCARD, "serve", "--config", str(config)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_a_secret_variable_not_set_stops_serve_before_the_state_is_touched(
    tmp_path: Path,
) -> None:
    """`serve` with the variable of a secret unset (or empty) exits 2 naming every such
    variable and the fix, before anything is made: it used to take the serve lock and create
    the state database first, so a mistyped variable left a state folder behind."""
    (tmp_path / "agents" / "builder").mkdir(parents=True)
    config = tmp_path / "taskcard.toml"
    config.write_text(
        'state_dir = "state"\n[[agents]]\nid = "builder"\nworkdir = "agents/builder"\n'
        '[telegram]\ntoken_env = "TC_PROBE_UNSET_TOKEN"\n'
        'api_base_url = "http://127.0.0.1:9"\n'
        + TG
        + '[feishu]\napp_id_env = "TC_PROBE_APP_ID"\napp_secret_env = "TC_PROBE_UNSET_SECRET"\n'
        + FS
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("TC_PROBE_")}
    env["TC_PROBE_APP_ID"] = "cli_probe"
    env["TC_PROBE_UNSET_SECRET"] = "  "
    done = serve_once(config, env)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.splitlines()
    assert any(
        "telegram.token_env" in line and "TC_PROBE_UNSET_TOKEN is not set" in line for line in lines
    ), done.stderr
    assert any(
        "feishu.app_secret_env" in line and "TC_PROBE_UNSET_SECRET is empty" in line
        for line in lines
    ), done.stderr
    assert not (tmp_path / "state").exists()


def test_a_cluster_without_its_redis_url_variable_stops_serve_before_the_state_is_touched(
    tmp_path: Path,
) -> None:
    (tmp_path / "agents" / "builder").mkdir(parents=True)
    config = tmp_path / "taskcard.toml"
    config.write_text(
        'state_dir = "state"\n[[agents]]\nid = "builder"\nworkdir = "agents/builder"\n'
        '[cluster]\nredis_url_env = "TC_PROBE_UNSET_REDIS_URL"\n'
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("TC_PROBE_")}
    done = serve_once(config, env)
    assert done.returncode == 2, done.stderr
    assert "cluster.redis_url_env" in done.stderr, done.stderr
    assert "TC_PROBE_UNSET_REDIS_URL is not set" in done.stderr, done.stderr
    assert not (tmp_path / "state").exists()


@pytest.mark.parametrize(
    ("section", "said"),
    [
        # Refused once the lock was taken, before the SQLite file is opened.
        ('[cluster]\nredis_url = "redis://127.0.0.1:9/0"\n', "cannot reach the Redis"),
        # Refused after the state file was made.
        ('[metrics]\nlisten = "192.0.2.1:9100"\n', "is not one of this machine's"),
    ],
    ids=["redis unreachable", "metrics address not here"],
)
def test_a_start_refused_after_the_lock_takes_away_the_state_folder_it_made(
    tmp_path: Path, section: str, said: str
) -> None:
    """A refusal once the serve lock was taken (or the state file made) left the state folder
    behind with its lock file (and an empty database); a folder that was there stays."""
    (tmp_path / "agents" / "builder").mkdir(parents=True)
    config = tmp_path / "taskcard.toml"
    config.write_text(
        'state_dir = "state/deep"\n[[agents]]\nid = "builder"\nworkdir = "agents/builder"\n'
        + section
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("TASKCARD_")}
    done = serve_once(config, env)
    assert done.returncode == 2, done.stderr
    assert said in done.stderr, done.stderr
    assert not (tmp_path / "state").exists()
    kept = tmp_path / "state" / "deep" / "notes.txt"
    kept.parent.mkdir(parents=True)
    kept.write_text("the operator's")
    again = serve_once(config, env)
    assert again.returncode == 2, again.stderr
    assert kept.read_text() == "the operator's"


def test_a_refused_start_through_dot_dot_keeps_the_state_of_the_folder_it_names(
    tmp_path: Path,
) -> None:
    """`state_dir = "nothing/../kept"` names the folder `kept`, which was there: the refused
    start read the path as one it had made (`nothing` did not exist) and deleted `kept`'s
    state file."""
    (tmp_path / "agents" / "builder").mkdir(parents=True)
    (tmp_path / "kept").mkdir()
    config = tmp_path / "taskcard.toml"
    agent = '[[agents]]\nid = "builder"\nworkdir = "agents/builder"\n'
    refused = '[metrics]\nlisten = "192.0.2.1:9100"\n'
    env = {k: v for k, v in os.environ.items() if not k.startswith("TASKCARD_")}
    config.write_text('state_dir = "kept"\n' + agent + refused)
    first = serve_once(config, env)
    assert first.returncode == 2, first.stderr
    state = tmp_path / "kept" / "state.sqlite3"
    assert state.is_file()  # the folder was there, so what the start made in it stays
    config.write_text('state_dir = "nothing/../kept"\n' + agent + refused)
    again = serve_once(config, env)
    assert again.returncode == 2, again.stderr
    assert "is not one of this machine's" in again.stderr, again.stderr
    assert state.is_file()
