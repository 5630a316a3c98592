"""An agent listed twice in one route's `agents`: served once, and warned of.

The repeat was merged without a word, hiding a slip (another agent's name meant). The route
still serves the agent (nothing is lost), and `config check`, `serve --check` and the
service's log name the route and the agent.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.e2e.harness import TOKEN_ENV, ServeProcess, eventually, publish, telegram_config
from tests.e2e.test_cli import AGENT, taskcard
from tests.fakes.telegram_api import FakeTelegram

GROUP = -1004444444444
SECRETS = {"TELEGRAM_BOT_TOKEN": "1:T", "FEISHU_APP_ID": "cli_x", "FEISHU_APP_SECRET": "s"}


def warning_for(section: str, chat: str) -> str:
    return (
        f"{section}.routes[0].agents[2]: 'builder' is already listed at agents[0] of this"
        f" route (chat {chat}); it is served once, list it once"
    )


@pytest.mark.parametrize(
    ("section", "chat", "shown"),
    [("telegram", "-100123", "-100123"), ("feishu", '"oc_1"', "'oc_1'")],
)
def test_config_check_names_the_route_and_the_repeated_agent(
    tmp_path: Path, section: str, chat: str, shown: str
) -> None:
    config = tmp_path / "taskcard.toml"
    config.write_text(
        AGENT
        + '[[agents]]\nid = "tester"\nworkdir = "agents/tester"\n'
        + f'[[{section}.routes]]\nchat_id = {chat}\nagents = ["builder", "tester", "builder"]\n'
    )
    for args in (("config", "check", str(config)), ("serve", "--config", str(config), "--check")):
        result = taskcard(*args, env=SECRETS)
        assert result.returncode == 0, result.stderr
        warned = [line for line in result.stderr.splitlines() if "already listed" in line]
        assert len(warned) == 1, result.stderr
        assert warned[0].startswith("warning: " + warning_for(section, shown)), warned


async def test_serve_logs_the_repeat_and_posts_the_agents_card_once(
    tmp_path: Path, telegram: FakeTelegram
) -> None:
    config = telegram_config(tmp_path, telegram.base_url, GROUP)
    config.write_text(
        config.read_text().replace('agents = ["builder"]', 'agents = ["builder", "x", "builder"]')
        + '[[agents]]\nid = "x"\nworkdir = "agents/x"\n'
    )
    (tmp_path / "agents" / "x").mkdir()
    with ServeProcess(config, env={TOKEN_ENV: telegram.token}) as serve:
        publish(tmp_path / "agents" / "builder", "# Build twice-marker")
        await eventually(
            lambda: any("twice-marker" in m.text for m in telegram.bot_messages(GROUP)),
            what="the card",
        )
        await eventually(lambda: "already listed" in serve.logs, what="the warning")
        assert await serve.aterminate() == 0
    (line,) = [line for line in serve.logs.splitlines() if "already listed" in line]
    assert "WARNING" in line and warning_for("telegram", str(GROUP)) in line, line
    assert len([m for m in telegram.bot_messages(GROUP) if "twice-marker" in m.text]) == 1
