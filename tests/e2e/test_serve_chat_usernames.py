"""Telegram routes naming a public channel or supergroup by its `@username`.

`config check` takes a username of the right shape and says it is resolved at the start;
`taskcard serve` asks the Bot API (getChat, through python-telegram-bot, against the fake)
for each chat's numeric id and serves the route under that id: the card is posted there, a
command from that chat acts on the route, and the state keeps the numeric id. A username
Telegram does not resolve costs its route alone, with one error line naming both.
"""

from __future__ import annotations

import json
import re
import signal
from pathlib import Path

import pytest

from tests.e2e.harness import (
    TOKEN_ENV,
    ServeProcess,
    agents_lines,
    eventually,
    publish,
    run_cli,
)
from tests.e2e.test_cli import AGENT, taskcard
from tests.fakes.telegram_api import FakeTelegram

NEWS = -1001111111111  # the public supergroup @Build_News
PLAIN = -1002222222222  # a chat named by its numeric id
LEFT = -1003333333333  # the public channel @left_channel, which the bot is not in


def username_config(tmp_path: Path, telegram: FakeTelegram) -> Path:
    lines = [
        *agents_lines(tmp_path, ["builder"]),
        "[telegram]",
        f'token_env = "{TOKEN_ENV}"',
        f'api_base_url = "{telegram.base_url}"',
        "poll_timeout_s = 1",
        "[[telegram.routes]]",
        'chat_id = "@build_news"',  # cased otherwise than the chat's own: the same chat
        'agents = ["builder"]',
        "[[telegram.routes]]",
        'chat_id = "@no_such_chat"',
        'agents = ["builder"]',
        "[[telegram.routes]]",
        f"chat_id = {PLAIN}",
        'agents = ["builder"]',
        "[[telegram.routes]]",
        'chat_id = "@left_channel"',
        'agents = ["builder"]',
    ]
    config = tmp_path / "taskcard.toml"
    config.write_text("\n".join(lines) + "\n")
    return config


def numeric_route_only(config: Path, *telegram_keys: str) -> tuple[str, str]:
    """Rewrite `username_config`'s file to one numeric route (the news chat) and return its
    two parts, the head (agents and `[telegram]`, plus `telegram_keys`) and that route, for a
    test to append a username route to later."""
    head, _, _ = config.read_text().partition('[[telegram.routes]]\nchat_id = "@build_news"')
    for key in telegram_keys:
        head = head.replace("poll_timeout_s = 1", f"poll_timeout_s = 1\n{key}")
    plain = f'[[telegram.routes]]\nchat_id = {NEWS}\nagents = ["builder"]\n'
    config.write_text(head + plain)
    return head, plain


def error_lines(serve: ServeProcess, key: str) -> list[str]:
    return [line for line in serve.logs.splitlines() if f"{key}: " in line]


async def test_a_route_named_by_username_is_served_under_the_chats_numeric_id(
    tmp_path: Path, telegram: FakeTelegram
) -> None:
    telegram.add_public_chat("Build_News", NEWS)
    telegram.add_public_chat("left_channel", LEFT, kind="channel", member=False)
    config = username_config(tmp_path, telegram)
    check = taskcard("config", "check", str(config))
    assert check.returncode == 0, check.stderr
    assert (
        "note: telegram.routes[0].chat_id: @build_news is resolved to the chat's numeric id"
        " when `taskcard serve` starts" in check.stdout
    ), check.stdout
    with ServeProcess(config, env={TOKEN_ENV: telegram.token}) as serve:
        publish(tmp_path / "agents" / "builder", "# Build username-marker")
        for chat in (NEWS, PLAIN):
            await eventually(
                lambda chat=chat: any(
                    "username-marker" in m.text for m in telegram.bot_messages(chat)
                ),
                what=f"the card in chat {chat}",
            )
        # A command from the chat the username named acts on that route.
        telegram.inject_command(NEWS, "/taskcard")
        await eventually(
            lambda: any("Task cards here" in m.text for m in telegram.bot_messages(NEWS)),
            what="the answer to /taskcard in the chat named by username",
        )
        for key, username, why in (
            ("telegram.routes[1].chat_id", "@no_such_chat", "chat not found"),
            ("telegram.routes[3].chat_id", "@left_channel", "not a member"),
        ):
            await eventually(lambda key=key: error_lines(serve, key), what=f"{key}'s error")
            (line,) = error_lines(serve, key)
            assert "ERROR" in line and username in line and why in line, line
            assert "this route is not served, the others are" in line, line
        assert await serve.aterminate() == 0
    # Each username asked for once, by name; every other request names a chat by its id.
    assert telegram.count("getChat") == 3
    named = [r for r in telegram.requests if r.method != "getChat" and "chat_id" in r.params]
    assert named and all(str(r.params["chat_id"]).lstrip("-").isdigit() for r in named)
    assert telegram.bot_messages(LEFT) == []
    # The state keeps the chat by its numeric id: the resident was written under it.
    state = run_cli("status", "--config", str(config), "--json")
    assert state.returncode == 0, state.stderr
    assert f"telegram:{NEWS}::builder" in state.stdout, state.stdout
    # `taskcard chats` lists the chat the command came from as routed by this file.
    chats = run_cli("chats", "--config", str(config), "--json")
    assert chats.returncode == 0, chats.stderr
    (news,) = [row for row in json.loads(chats.stdout) if row["chat_id"] == str(NEWS)]
    assert news["routed"] is True, news


@pytest.mark.parametrize(
    ("value", "words"),
    [
        ('"@abc"', "after the @, 5-32 letters, digits or underscores, starting with a letter"),
        ('"@1build_news"', "after the @, 5-32 letters, digits or underscores, starting with"),
        ('"@build-news"', "after the @, 5-32 letters, digits or underscores, starting with"),
        ('"@' + "a" * 33 + '"', "after the @, 5-32 letters, digits or underscores"),
    ],
    ids=["short", "digit-first", "hyphen", "long"],
)
def test_a_username_of_the_wrong_shape_is_refused_with_the_rule(
    tmp_path: Path, value: str, words: str
) -> None:
    config = tmp_path / "taskcard.toml"
    config.write_text(
        AGENT + f'[telegram]\n[[telegram.routes]]\nchat_id = {value}\nagents = ["builder"]\n'
    )
    for args in (("config", "check", str(config)), ("serve", "--config", str(config))):
        result = taskcard(*args, env={"TELEGRAM_BOT_TOKEN": "1:T"})
        assert result.returncode == 2, result.stderr
        lines = [
            line for line in result.stderr.splitlines() if "telegram.routes[0].chat_id: " in line
        ]
        assert len(lines) == 1 and words in lines[0], result.stderr
        assert value.strip('"') not in lines[0]  # not quoted back


def test_two_routes_naming_one_username_are_refused_as_one_chat(tmp_path: Path) -> None:
    config = tmp_path / "taskcard.toml"
    route = '[[telegram.routes]]\nchat_id = "{}"\nagents = ["builder"]\n'
    config.write_text(
        AGENT + "[telegram]\n" + route.format("@build_news") + route.format("@Build_News")
    )
    result = taskcard("config", "check", str(config))
    assert result.returncode == 2, result.stderr
    assert "telegram.routes[1]: the same chat (and thread) as telegram.routes[0]" in result.stderr


async def test_a_reload_resolves_a_username_new_to_the_service(
    tmp_path: Path, telegram: FakeTelegram
) -> None:
    """SIGHUP with a route named by a username the start did not know: asked of Telegram
    then, and served under the chat's id; the one resolved at the start is not asked again."""
    telegram.add_public_chat("build_news", NEWS)
    telegram.add_public_chat("ops_room", PLAIN)
    config = username_config(tmp_path, telegram)
    text = config.read_text()
    head, _, _ = text.partition('[[telegram.routes]]\nchat_id = "@no_such_chat"')
    config.write_text(head)  # only the @build_news route
    with ServeProcess(config, env={TOKEN_ENV: telegram.token}) as serve:
        publish(tmp_path / "agents" / "builder", "# Build reload-marker")
        await eventually(
            lambda: any("reload-marker" in m.text for m in telegram.bot_messages(NEWS)),
            what="the card in the chat named at the start",
        )
        config.write_text(
            head
            + '[[telegram.routes]]\nchat_id = "@ops_room"\nagents = ["builder"]\n'
            + '[[telegram.routes]]\nchat_id = "@nobody_here"\nagents = ["builder"]\n'
        )
        assert serve.proc is not None
        serve.proc.send_signal(signal.SIGHUP)
        await eventually(
            lambda: any("reload-marker" in m.text for m in telegram.bot_messages(PLAIN)),
            what="the card in the chat the reload named by username",
        )
        await eventually(
            lambda: error_lines(serve, "telegram.routes[2].chat_id"), what="the error line"
        )
        assert await serve.aterminate() == 0
    (line,) = error_lines(serve, "telegram.routes[2].chat_id")
    assert "@nobody_here" in line and "chat not found" in line, line
    asked = [r.params["chat_id"] for r in telegram.requests if r.method == "getChat"]
    assert sorted(asked) == ["@build_news", "@nobody_here", "@ops_room"]
    assert len([m for m in telegram.bot_messages(NEWS) if "reload-marker" in m.text]) == 1


async def test_a_username_telegram_could_not_be_asked_about_is_asked_again(
    tmp_path: Path, telegram: FakeTelegram
) -> None:
    """Telegram failing (a 5xx) when the start asks for a username: the route waits, with one
    error line saying so, and is served once a later ask resolves it, without a reload."""
    telegram.add_public_chat("build_news", NEWS)
    config = username_config(tmp_path, telegram)
    head, _, _ = config.read_text().partition('[[telegram.routes]]\nchat_id = "@no_such_chat"')
    config.write_text(head.replace("@build_news", "@Build_NEWS"))  # any case: the same chat
    telegram.fail_next("getChat", 500, "Internal Server Error")
    with ServeProcess(config, env={TOKEN_ENV: telegram.token}) as serve:
        publish(tmp_path / "agents" / "builder", "# Build retry-marker")
        await eventually(
            lambda: error_lines(serve, "telegram.routes[0].chat_id"), what="the waiting line"
        )
        await eventually(
            lambda: any("retry-marker" in m.text for m in telegram.bot_messages(NEWS)),
            timeout_s=90,
            what="the card once the username is resolved",
        )
        assert await serve.aterminate() == 0
    (line, resolved) = error_lines(serve, "telegram.routes[0].chat_id")
    assert "ERROR" in line and "@Build_NEWS could not be resolved for now" in line, line
    assert "asked again shortly" in line, line
    assert f"@Build_NEWS is chat {NEWS}" in resolved, resolved
    assert telegram.count("getChat") == 2


async def test_a_restart_with_telegram_failing_uses_the_id_resolved_last_time(
    tmp_path: Path, telegram: FakeTelegram
) -> None:
    telegram.add_public_chat("build_news", NEWS)
    config = username_config(tmp_path, telegram)
    head, _, _ = config.read_text().partition('[[telegram.routes]]\nchat_id = "@no_such_chat"')
    config.write_text(head)
    workdir = tmp_path / "agents" / "builder"
    with ServeProcess(config, env={TOKEN_ENV: telegram.token}) as serve:
        publish(workdir, "# Build first-marker")
        await eventually(
            lambda: any("first-marker" in m.text for m in telegram.bot_messages(NEWS)),
            what="the first run's card",
        )
        assert await serve.aterminate() == 0
    (card,) = telegram.bot_messages(NEWS)
    telegram.fail_next("getChat", 502, "Bad Gateway")
    with ServeProcess(config, env={TOKEN_ENV: telegram.token}) as serve:
        publish(workdir, "# Build second-marker")
        await eventually(
            lambda: "second-marker" in (telegram.message(NEWS, card.message_id) or card).text,
            what="the same card edited by the second run",
        )
        assert await serve.aterminate() == 0
    (line,) = error_lines(serve, "telegram.routes[0].chat_id")
    assert "WARNING" in line and f"the chat it named last time, {NEWS}, is used" in line, line
    assert len(telegram.bot_messages(NEWS)) == 1


async def test_a_reload_waiting_for_telegram_does_not_undo_a_later_reload(
    tmp_path: Path, telegram: FakeTelegram
) -> None:
    """SIGHUP naming a new username whose lookup is slow, then SIGHUP with that route removed
    again: the later file wins when the slow lookup ends."""
    telegram.add_public_chat("ops_room", PLAIN)
    config = username_config(tmp_path, telegram)
    head, plain = numeric_route_only(config)
    with ServeProcess(config, env={TOKEN_ENV: telegram.token}) as serve:
        publish(tmp_path / "agents" / "builder", "# Build order-marker")
        await eventually(
            lambda: any("order-marker" in m.text for m in telegram.bot_messages(NEWS)),
            what="the card",
        )
        telegram.hold_answers("getChat")
        config.write_text(
            head + plain + '[[telegram.routes]]\nchat_id = "@ops_room"\nagents = ["builder"]\n'
        )
        assert serve.proc is not None
        serve.proc.send_signal(signal.SIGHUP)
        await eventually(lambda: telegram.count("getChat") == 1, what="the lookup")
        config.write_text(head + plain)
        serve.proc.send_signal(signal.SIGHUP)
        await eventually(lambda: "config reloaded" in serve.logs, what="the second reload")
        telegram.release_answers("getChat")
        await eventually(lambda: "superseded by a later reload" in serve.logs, what="the drop")
        assert await serve.aterminate() == 0
    assert telegram.bot_messages(PLAIN) == []


async def test_a_429_to_the_lookup_pauses_the_bot_and_a_restart_asks_nothing_inside_it(
    tmp_path: Path, telegram: FakeTelegram
) -> None:
    telegram.add_public_chat("build_news", NEWS)
    config = username_config(tmp_path, telegram)
    head, _, _ = config.read_text().partition('[[telegram.routes]]\nchat_id = "@no_such_chat"')
    config.write_text(head)
    telegram.fail_next("getChat", 429, "Too Many Requests: retry after 600", {"retry_after": 600})
    with ServeProcess(config, env={TOKEN_ENV: telegram.token}) as serve:
        await eventually(
            lambda: error_lines(serve, "telegram.routes[0].chat_id"), what="the waiting line"
        )
        assert await serve.aterminate() == 0
    (line,) = error_lines(serve, "telegram.routes[0].chat_id")
    assert "could not be resolved for now" in line and "retry after 600" in line, line
    state = run_cli("status", "--config", str(config))
    assert "rate-limit pause: telegram:bot" in state.stdout, state.stdout
    asked = telegram.count("getChat")
    with ServeProcess(config, env={TOKEN_ENV: telegram.token}) as again:
        await eventually(
            lambda: error_lines(again, "telegram.routes[0].chat_id"), what="the second start"
        )
        assert await again.aterminate() == 0
    (second,) = error_lines(again, "telegram.routes[0].chat_id")
    assert "a pause of the bot is running" in second, second
    assert telegram.count("getChat") == asked


def _served(serve: ServeProcess) -> bool:
    """The service runs (its loop takes SIGHUP from here on: one sent during the start,
    the username lookup included, is dropped by design)."""
    return re.search(r"serving \d+ agents? on \d+ routes?", serve.logs) is not None


def _asked_for(telegram: FakeTelegram, username: str) -> bool:
    return any(
        r.method == "getChat" and r.params.get("chat_id") == username for r in telegram.requests
    )


@pytest.mark.parametrize("keeps_route", [True, False], ids=["file-keeps-it", "file-drops-it"])
async def test_a_refused_reload_does_not_keep_a_waiting_username_from_being_served(
    tmp_path: Path, telegram: FakeTelegram, keeps_route: bool
) -> None:
    """While a username waits for Telegram, a reload the service refuses (a key that needs
    a restart changed): the running configuration stays, and its route is served once the
    username resolves, whether the refused file still named it (its lookup resolved it) or
    not (the background retry does). The refused file's own new route is never served."""
    telegram.add_public_chat("build_news", NEWS)
    telegram.add_public_chat("ops_room", PLAIN)
    config = username_config(tmp_path, telegram)
    head, _, _ = config.read_text().partition('[[telegram.routes]]\nchat_id = "@no_such_chat"')
    head = head.replace("poll_timeout_s = 1", "poll_timeout_s = 1\nrequest_timeout_s = 5")
    config.write_text(head)
    # No getChat is answered until released: the start's lookup and the retry's time out,
    # so the username waits until the reload's lookup is under way, however slow the host.
    telegram.hold_answers("getChat")
    with ServeProcess(config, env={TOKEN_ENV: telegram.token}) as serve:
        publish(tmp_path / "agents" / "builder", "# Build refused-marker")
        await eventually(
            lambda: error_lines(serve, "telegram.routes[0].chat_id"), what="the waiting line"
        )
        await eventually(lambda: _served(serve), timeout_s=60, what="the service running")
        refused = head.replace("poll_timeout_s = 1", "poll_timeout_s = 2")
        if not keeps_route:
            refused = refused.partition("[[telegram.routes]]")[0]
        config.write_text(
            refused + '[[telegram.routes]]\nchat_id = "@ops_room"\nagents = ["builder"]\n'
        )
        assert serve.proc is not None
        serve.proc.send_signal(signal.SIGHUP)
        await eventually(
            lambda: _asked_for(telegram, "@ops_room"), timeout_s=60, what="the reload's lookup"
        )
        telegram.release_answers("getChat")
        await eventually(lambda: "config reload refused" in serve.logs, what="the refusal")
        await eventually(
            lambda: any("refused-marker" in m.text for m in telegram.bot_messages(NEWS)),
            timeout_s=120,
            what="the card once the username is resolved",
        )
        assert await serve.aterminate() == 0
    assert telegram.bot_messages(PLAIN) == []
    assert len(telegram.bot_messages(NEWS)) == 1


async def test_a_username_a_reload_adds_while_another_waits_is_asked_again_too(
    tmp_path: Path, telegram: FakeTelegram
) -> None:
    """Telegram not answering: the start's username waits and is asked again in the
    background; a reload adds a second one, whose lookup fails at once while the retry's
    still waits. Both are served once Telegram answers, without a second SIGHUP (the retry,
    ending last, used to erase the reload's username from what waits)."""
    telegram.add_public_chat("build_news", NEWS)
    telegram.add_public_chat("ops_room", PLAIN)
    config = username_config(tmp_path, telegram)
    head, _, _ = config.read_text().partition('[[telegram.routes]]\nchat_id = "@no_such_chat"')
    head = head.replace("poll_timeout_s = 1", "poll_timeout_s = 1\nrequest_timeout_s = 60")
    config.write_text(head)
    telegram.fail_next("getMe", 500, "Internal Server Error")  # the start's lookup
    with ServeProcess(config, env={TOKEN_ENV: telegram.token}) as serve:
        publish(tmp_path / "agents" / "builder", "# Build both-marker")
        await eventually(lambda: _served(serve), timeout_s=60, what="the service running")
        telegram.hold_answers("getChat")
        await eventually(
            lambda: telegram.count("getChat") == 1, timeout_s=60, what="the retry asking"
        )
        # The reload's lookup fails at once (its client cannot start), before the retry's.
        asked_me = telegram.count("getMe")
        telegram.fail_next("getMe", 500, "Internal Server Error")
        ops = '[[telegram.routes]]\nchat_id = "@ops_room"\nagents = ["builder"]\n'
        config.write_text(head + ops)
        assert serve.proc is not None
        serve.proc.send_signal(signal.SIGHUP)
        await eventually(
            lambda: telegram.count("getMe") > asked_me or "this one waits for it" in serve.logs,
            what="the reload's lookup failing, or waiting for the retry's",
        )
        telegram.release_answers("getChat")
        for chat in (NEWS, PLAIN):
            await eventually(
                lambda chat=chat: any("both-marker" in m.text for m in telegram.bot_messages(chat)),
                timeout_s=120,
                what=f"the card in chat {chat}",
            )
        assert await serve.aterminate() == 0
    (line, *_) = error_lines(serve, "telegram.routes[1].chat_id")
    assert "@ops_room could not be resolved for now" in line, line


async def test_a_refused_reload_puts_back_the_running_file_not_a_superseded_one(
    tmp_path: Path, telegram: FakeTelegram
) -> None:
    """SIGHUP adding a username while Telegram does not answer, then SIGHUP with a file the
    service refuses before the first reload ran: the running file stays, and the first
    reload's file, never applied, is not applied once Telegram answers."""
    telegram.add_public_chat("build_news", NEWS)
    telegram.add_public_chat("ops_room", PLAIN)
    config = username_config(tmp_path, telegram)
    head, _, _ = config.read_text().partition('[[telegram.routes]]\nchat_id = "@no_such_chat"')
    head = head.replace("poll_timeout_s = 1", "poll_timeout_s = 1\nrequest_timeout_s = 60")
    config.write_text(head)
    telegram.fail_next("getMe", 500, "Internal Server Error")  # @build_news waits
    with ServeProcess(config, env={TOKEN_ENV: telegram.token}) as serve:
        publish(tmp_path / "agents" / "builder", "# Build superseded-marker")
        await eventually(lambda: _served(serve), timeout_s=60, what="the service running")
        telegram.hold_answers("getChat")
        ops = '[[telegram.routes]]\nchat_id = "@ops_room"\nagents = ["builder"]\n'
        config.write_text(head + ops)
        assert serve.proc is not None
        serve.proc.send_signal(signal.SIGHUP)
        await eventually(lambda: "@ops_room first" in serve.logs, what="the first reload")
        config.write_text(head.replace("poll_timeout_s = 1", "poll_timeout_s = 2"))
        serve.proc.send_signal(signal.SIGHUP)
        await eventually(lambda: serve.logs.count("chat ids of") == 2, what="the second reload")
        telegram.release_answers("getChat")
        await eventually(lambda: "config reload refused" in serve.logs, what="the refusal")
        await eventually(
            lambda: any("superseded-marker" in m.text for m in telegram.bot_messages(NEWS)),
            timeout_s=120,
            what="the card of the running file's route",
        )
        assert await serve.aterminate() == 0
    after = serve.logs.partition("config reload refused")[2]
    assert "@ops_room" not in after, after
    assert telegram.bot_messages(PLAIN) == []


async def test_a_sighup_while_the_start_looks_up_usernames_is_read_once_serving(
    tmp_path: Path, telegram: FakeTelegram
) -> None:
    """The start's lookup can take up to `request_timeout_s`; a SIGHUP meanwhile used to be
    dropped without a word. It is read once the service runs."""
    telegram.add_public_chat("build_news", NEWS)
    config = username_config(tmp_path, telegram)
    head, _, _ = config.read_text().partition('[[telegram.routes]]\nchat_id = "@no_such_chat"')
    head = head.replace("poll_timeout_s = 1", "poll_timeout_s = 1\nrequest_timeout_s = 60")
    config.write_text(head)
    telegram.hold_answers("getChat")
    with ServeProcess(config, env={TOKEN_ENV: telegram.token}) as serve:
        publish(tmp_path / "agents" / "builder", "# Build start-marker")
        await eventually(lambda: telegram.count("getChat") == 1, what="the start's lookup")
        config.write_text(head + f'[[telegram.routes]]\nchat_id = {PLAIN}\nagents = ["builder"]\n')
        assert serve.proc is not None
        serve.proc.send_signal(signal.SIGHUP)
        telegram.release_answers("getChat")
        for chat in (NEWS, PLAIN):
            await eventually(
                lambda chat=chat: any(
                    "start-marker" in m.text for m in telegram.bot_messages(chat)
                ),
                what=f"the card in chat {chat}",
            )
        assert await serve.aterminate() == 0


async def test_a_refused_reload_is_not_tried_again_when_the_start_named_no_username(
    tmp_path: Path, telegram: FakeTelegram
) -> None:
    """A start with numeric routes only, then a refused reload adding a username Telegram
    does not answer: the refused file is not what the retry asks for and applies again."""
    telegram.add_public_chat("ops_room", PLAIN)
    config = username_config(tmp_path, telegram)
    head, plain = numeric_route_only(config, "request_timeout_s = 3")
    with ServeProcess(config, env={TOKEN_ENV: telegram.token}) as serve:
        publish(tmp_path / "agents" / "builder", "# Build numeric-marker")
        await eventually(
            lambda: any("numeric-marker" in m.text for m in telegram.bot_messages(NEWS)),
            what="the card",
        )
        telegram.hold_answers("getChat")  # the reload's lookup times out: @ops_room waits
        ops = '[[telegram.routes]]\nchat_id = "@ops_room"\nagents = ["builder"]\n'
        config.write_text(head.replace("poll_timeout_s = 1", "poll_timeout_s = 2") + plain + ops)
        assert serve.proc is not None
        serve.proc.send_signal(signal.SIGHUP)
        await eventually(lambda: "config reload refused" in serve.logs, what="the refusal")
        telegram.release_answers("getChat")
        # Ten long polls of a second each: longer than the retry's first wait (5 s at most,
        # measured by the service), whatever the load.
        polls = telegram.count("getUpdates")
        await eventually(
            lambda: telegram.count("getUpdates") >= polls + 10, timeout_s=120, what="ten polls"
        )
        assert await serve.aterminate() == 0
    assert serve.logs.count("config reload refused") == 1, serve.logs
    assert len([r for r in telegram.requests if r.method == "getChat"]) == 1
    assert telegram.bot_messages(PLAIN) == []


async def test_a_burst_of_reloads_asks_telegram_once(
    tmp_path: Path, telegram: FakeTelegram
) -> None:
    """SIGHUP four times while the first reload's lookup waits for Telegram: one lookup at a
    time, and a reload superseded before its turn asks nothing (each used to ask at once)."""
    telegram.add_public_chat("ops_room", PLAIN)
    config = username_config(tmp_path, telegram)
    head, plain = numeric_route_only(config, "request_timeout_s = 120")
    asking = "config reload: asking Telegram for the chat ids of @ops_room first"
    with ServeProcess(config, env={TOKEN_ENV: telegram.token}) as serve:
        publish(tmp_path / "agents" / "builder", "# Build burst-marker")
        await eventually(
            lambda: any("burst-marker" in m.text for m in telegram.bot_messages(NEWS)),
            what="the card",
        )
        telegram.hold_answers("getChat")
        config.write_text(
            head + plain + '[[telegram.routes]]\nchat_id = "@ops_room"\nagents = ["builder"]\n'
        )
        assert serve.proc is not None
        for count in range(1, 5):
            serve.proc.send_signal(signal.SIGHUP)
            await eventually(
                lambda count=count: serve.logs.count(asking) == count, what=f"reload {count}"
            )
        await eventually(lambda: telegram.count("getChat") == 1, what="the first lookup")
        telegram.release_answers("getChat")
        await eventually(
            lambda: any("burst-marker" in m.text for m in telegram.bot_messages(PLAIN)),
            what="the card in the chat the reloads named",
        )
        await eventually(
            lambda: serve.logs.count("superseded by a later reload") == 3, what="the drops"
        )
        assert await serve.aterminate() == 0
    assert telegram.count("getChat") == 1
    assert len(telegram.bot_messages(PLAIN)) == 1


async def test_a_username_naming_a_person_or_a_chat_already_routed_is_not_served(
    tmp_path: Path, telegram: FakeTelegram
) -> None:
    """A person's username resolves to their private chat: the fleet's cards never go there.
    A username naming the chat a numeric route already names: that route keeps it, alone."""
    telegram.add_public_chat("some_person", 424242, kind="private")
    telegram.add_public_chat("build_news", NEWS)
    route = '[[telegram.routes]]\nchat_id = {}\nagents = ["builder"]\n'
    config = username_config(tmp_path, telegram)
    head, _, _ = config.read_text().partition("[[telegram.routes]]")
    config.write_text(
        head
        + route.format('"@some_person"')
        + route.format('"@build_news"')
        + route.format(NEWS)
        + route.format(PLAIN)
    )
    with ServeProcess(config, env={TOKEN_ENV: telegram.token}) as serve:
        publish(tmp_path / "agents" / "builder", "# Build person-marker")
        for chat in (NEWS, PLAIN):
            await eventually(
                lambda chat=chat: any(
                    "person-marker" in m.text for m in telegram.bot_messages(chat)
                ),
                what=f"the card in chat {chat}",
            )
        for key in ("telegram.routes[0].chat_id", "telegram.routes[1].chat_id"):
            await eventually(lambda key=key: error_lines(serve, key), what=f"{key}'s error")
        assert await serve.aterminate() == 0
    (person,) = error_lines(serve, "telegram.routes[0].chat_id")
    assert "ERROR" in person and "@some_person" in person, person
    assert "names a private chat, not a public channel or supergroup" in person, person
    (twice,) = error_lines(serve, "telegram.routes[1].chat_id")
    assert f"@build_news is chat {NEWS}, which another route already names" in twice, twice
    assert telegram.bot_messages(424242) == []
    assert len(telegram.bot_messages(NEWS)) == 1
    state = run_cli("status", "--config", str(config), "--json")
    assert state.returncode == 0, state.stderr
    assert state.stdout.count(f"telegram:{NEWS}::builder") == 1, state.stdout
