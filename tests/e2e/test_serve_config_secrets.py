"""A credential written into the config file itself: refused by `config check`,
`serve --check` and `serve`, naming the key to use instead, never echoing the value."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.e2e.test_cli import AGENT, refused_by_every_command

SECRET = "s3cr3tValue0123456789abcdefABCDEF"  # the shape of a Feishu app secret
TOKEN = "123456789:AAHdqTcvCH1vGWJxfSeofSAs0K5PALDsaw"  # the shape of a bot token

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
