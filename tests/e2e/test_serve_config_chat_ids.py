"""Route and origin chat ids in the wrong shape for their platform: `config check`,
`serve --check` and `serve` refuse each with one line naming the key and the fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.e2e.harness import placeholder_secrets
from tests.e2e.test_cli import AGENT, taskcard

TELEGRAM = '[telegram]\n[[telegram.routes]]\nchat_id = {value}\nagents = ["builder"]\n'
TELEGRAM_ORIGIN = "[telegram]\norigin_chats = [{value}]\n"
FEISHU = '[feishu]\n[[feishu.routes]]\nchat_id = {value}\nagents = ["builder"]\n'
FEISHU_ORIGIN = "[feishu]\norigin_chats = [{value}]\n"
FEISHU_PEOPLE = (
    '[feishu]\n[[feishu.routes]]\nchat_id = "oc_0123456789abcdef"\nagents = ["builder"]\n'
    "allowed_user_ids = [{value}]\n"
)
KEY_PEOPLE = "feishu.routes[0].allowed_user_ids[0]"
# Set, so that a refusal is the chat id's and not a missing secret's.
SECRETS = {
    "TELEGRAM_BOT_TOKEN": "123456:placeholder-token",
    "FEISHU_APP_ID": "cli_placeholder",
    "FEISHU_APP_SECRET": "placeholder-secret",
}


@pytest.mark.parametrize(
    ("section", "value", "key", "words"),
    [
        # A public channel's username: the fix was "write the number without quotes". A
        # route takes one (tests/e2e/test_serve_chat_usernames.py), an origin chat does not.
        (
            TELEGRAM_ORIGIN,
            '"@build_news"',
            "telegram.origin_chats[0]",
            "a @username is taken only in a route's chat_id",
        ),
        # A Feishu chat id in a Telegram route: the same unfollowable fix.
        (TELEGRAM, '"oc_0123456789abcdef"', "telegram.routes[0].chat_id", "not a Telegram chat"),
        # The number quoted: the fix is to drop the quotes, as before.
        (TELEGRAM, '"-1001234567890"', "telegram.routes[0].chat_id", "without quotes"),
        (TELEGRAM, "0", "telegram.routes[0].chat_id", "0 is no Telegram chat"),
        # The link Telegram shows for a public chat: its username is meant.
        (TELEGRAM, '"https://t.me/deploy_feed"', "telegram.routes[0].chat_id", '"@deploy_feed"'),
        # Ids of another kind than a chat passed, and every send failed at runtime.
        (FEISHU, '"ou_0123456789abcdef"', "feishu.routes[0].chat_id", "a person's open_id"),
        (FEISHU, '"om_0123456789abcdef"', "feishu.routes[0].chat_id", "a message id"),
        (FEISHU, '"cli_a1b2c3d4e5f6"', "feishu.routes[0].chat_id", "an app id"),
        # Telegram's form of a public chat's name: Feishu chats have none.
        (FEISHU, '"@build_news"', "feishu.routes[0].chat_id", "Feishu chats have no usernames"),
        (FEISHU_ORIGIN, '"@build_news"', "feishu.origin_chats[0]", "Feishu chats have no"),
        (FEISHU, '"oc_"', "feishu.routes[0].chat_id", "only the prefix of a chat id"),
        # A Telegram id in Feishu: "write it in double quotes", and quoted it was taken.
        (FEISHU, "-1001234567890", "feishu.routes[0].chat_id", "a number is no Feishu chat id"),
        (FEISHU, '"-1001234567890"', "feishu.routes[0].chat_id", "a number is no Feishu chat"),
        (FEISHU_ORIGIN, "-100123", "feishu.origin_chats[0]", "a number is no Feishu chat id"),
        # Ids listed for people that no sender's open_id can match: no one was let in.
        (FEISHU_PEOPLE, "123456789", KEY_PEOPLE, "a number is no Feishu open_id"),
        (FEISHU_PEOPLE, '"oc_0123456789abcdef"', KEY_PEOPLE, "is a chat id (oc_...), not a"),
        (FEISHU_PEOPLE, '"on_0123456789abcdef"', KEY_PEOPLE, "is a person's union_id"),
        (FEISHU_PEOPLE, '"@alice_dev"', KEY_PEOPLE, "names a person on Telegram only"),
        (FEISHU_ORIGIN, '"ou_0123456789abcdef"', "feishu.origin_chats[0]", "a person's open_id"),
    ],
    ids=[
        "telegram-origin-username",
        "telegram-feishu-id",
        "telegram-quoted-number",
        "telegram-zero",
        "telegram-link",
        "feishu-open-id",
        "feishu-message-id",
        "feishu-app-id",
        "feishu-username",
        "feishu-origin-username",
        "feishu-bare-prefix",
        "feishu-number",
        "feishu-quoted-number",
        "feishu-origin-number",
        "feishu-person-number",
        "feishu-person-chat-id",
        "feishu-person-union-id",
        "feishu-person-username",
        "feishu-origin-open-id",
    ],
)
def test_a_chat_id_of_the_wrong_shape_is_refused_naming_the_key_and_fix(
    tmp_path: Path, section: str, value: str, key: str, words: str
) -> None:
    config = tmp_path / "taskcard.toml"
    config.write_text('state_dir = "state"\n' + AGENT + section.format(value=value))
    env = SECRETS
    for args in (
        ("config", "check", str(config)),
        ("serve", "--config", str(config), "--check"),
        ("serve", "--config", str(config)),
    ):
        result = taskcard(*args, env=env)
        assert result.returncode == 2, (args, result.stderr)
        assert "Traceback" not in result.stderr, result.stderr
        lines = [line for line in result.stderr.splitlines() if f" {key}: " in line]
        assert len(lines) == 1, result.stderr
        assert words in lines[0], lines
        fixes = (
            "taskcard chats",
            "quotes",
            "0 is no",
            "give the person's open_id (ou_...)",
            "write the chat's username",
        )
        assert any(fix in lines[0] for fix in fixes), lines
    assert not (tmp_path / "state").exists()  # nothing started


@pytest.mark.parametrize(
    "section",
    [
        "[telegram]\norigin_chats = [-100555]\n"
        '[[telegram.routes]]\nchat_id = -1001234567890\nagents = ["builder"]\n',
        '[telegram]\n[[telegram.routes]]\nchat_id = 123456789\nagents = ["builder"]\n',
        '[feishu]\norigin_chats = ["oc_a"]\n'
        '[[feishu.routes]]\nchat_id = "oc_0123456789abcdef"\nagents = ["builder"]\n',
    ],
    ids=["telegram-group", "telegram-private", "feishu"],
)
def test_chat_ids_of_the_right_shape_pass(tmp_path: Path, section: str) -> None:
    config = tmp_path / "taskcard.toml"
    config.write_text('state_dir = "state"\n' + AGENT + section)
    result = taskcard("serve", "--config", str(config), "--check", env=placeholder_secrets(config))
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize(
    ("section", "key"),
    [
        (FEISHU.format(value='"general"'), "feishu.routes[0].chat_id"),
        (
            FEISHU.format(value='"oc_0123456789abcdef"').replace(
                "[feishu]\n", '[feishu]\norigin_chats = ["oc_a", "group-7"]\n'
            ),
            "feishu.origin_chats[1]",
        ),
    ],
    ids=["word", "origin"],
)
def test_a_feishu_chat_id_of_an_unknown_shape_is_taken_with_a_warning(
    tmp_path: Path, section: str, key: str
) -> None:
    """An id that is no known other kind but lacks oc_ may still be what the platform (or a
    tenant) hands out, as `taskcard chats` lists it: taken, and warned of once."""
    config = tmp_path / "taskcard.toml"
    config.write_text('state_dir = "state"\n' + AGENT + section)
    for args in (("config", "check", str(config)), ("serve", "--config", str(config), "--check")):
        result = taskcard(*args, env=SECRETS)
        assert result.returncode == 0, result.stderr
        warned = [line for line in result.stderr.splitlines() if "oc_" in line]
        assert warned == [
            f"warning: {key}: does not start with oc_ as Feishu chat ids do;"
            " if sends to it fail, use the chat's id as `taskcard chats` lists it"
        ]
