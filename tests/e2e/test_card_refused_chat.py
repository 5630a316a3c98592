"""A card the platform refuses for good is said in the chat, not only in `taskcard status`.

Telegram's "message is too long" and Feishu's PATCH code 230025 left the chat on the card
before, which read as the agent's latest: people saw an older truth and nothing said so. Now
a short card (the agent, its state, one note) replaces it, once per refusal run, and the next
card that goes through replaces that. Driven through `taskcard serve` against the fake Bot
API and the fake Feishu.
"""

from __future__ import annotations

from pathlib import Path

from tests.e2e.harness import ServeProcess, activity, eventually, publish, run_cli
from tests.e2e.test_serve_feishu import CHAT, Setup
from tests.e2e.test_serve_telegram import GROUP, agent_dir, setup
from tests.fakes.feishu_api import FakeFeishu
from tests.fakes.telegram_api import FakeTelegram

MARKER = "The latest card could not be shown here"


async def test_a_telegram_card_refused_for_good_is_said_in_the_chat_once_per_run(
    tmp_path: Path, telegram: FakeTelegram
) -> None:
    serve = setup(tmp_path, telegram, ["builder"], [(GROUP, ["builder"])])
    workdir = agent_dir(tmp_path, "builder")

    def resident() -> str:
        messages = telegram.bot_messages(GROUP)
        return messages[0].text if messages else ""

    with serve:
        publish(workdir, "step 1: building")
        await eventually(lambda: "step 1" in resident(), what="step 1")
        telegram.fail_next("editMessageText", 400, "Bad Request: message is too long")
        publish(workdir, "step 2: FAILED, rolling back")
        await eventually(lambda: MARKER in resident(), what="the chat told of the refusal")
        assert "step 1" not in resident() and "step 2" not in resident()
        assert "builder" in resident()
        # Refused again within the run: the chat was told already.
        telegram.fail_next("editMessageText", 400, "Bad Request: message is too long")
        publish(workdir, "step 2: FAILED, rolled back")
        await eventually(
            lambda: any(
                r.method == "editMessageText" and "rolled back" in str(r.params.get("text"))
                for r in telegram.requests
            ),
            what="the second refusal",
        )
        publish(workdir, "step 3: fixed")
        await eventually(lambda: "step 3" in resident(), what="the next card")
        assert MARKER not in resident()
        assert await serve.aterminate() == 0
    history = telegram.edit_history(GROUP, telegram.bot_messages(GROUP)[0].message_id)
    assert sum(MARKER in text for text in history) == 1, history
    assert len(telegram.bot_messages(GROUP)) == 1  # no notice: the card itself says it


async def test_a_restart_in_a_run_of_refusals_does_not_tell_the_chat_again(
    tmp_path: Path, telegram: FakeTelegram
) -> None:
    """Whether the chat was told is kept with the refusal in the state: a service started
    again while the platform goes on refusing the card showed the short card once more.
    `taskcard status` says that the chat shows the short card, not the last card."""
    serve = setup(tmp_path, telegram, ["builder"], [(GROUP, ["builder"])])
    workdir = agent_dir(tmp_path, "builder")
    too_long = "Bad Request: message is too long"

    def resident() -> str:
        messages = telegram.bot_messages(GROUP)
        return messages[0].text if messages else ""

    def marker_edits() -> int:
        return sum(
            r.method == "editMessageText" and MARKER in str(r.params.get("text"))
            for r in telegram.requests
        )

    def refused_edits() -> int:
        return sum(
            r.method == "editMessageText" and "rolling back" in str(r.params.get("text"))
            for r in telegram.requests
        )

    with serve:
        publish(workdir, "step 1: building")
        await eventually(lambda: "step 1" in resident(), what="step 1")
        telegram.fail_next("editMessageText", 400, too_long)
        publish(workdir, "step 2: FAILED, rolling back")
        await eventually(lambda: MARKER in resident(), what="the chat told of the refusal")
        assert await serve.aterminate() == 0
    status = run_cli("status", "--config", str(serve.config))
    assert "the chat shows a short card saying that the latest could not be shown" in (
        status.stdout
    ), status.stdout
    # Meanwhile the agent went on (a short card now would read otherwise); started again,
    # the service tries its card once more, and the platform refuses it again.
    activity(workdir, "tool.start", call_id="c1", name="rollback_database")
    publish(workdir, "step 2: FAILED, rolling back the database")
    telegram.fail_next("editMessageText", 400, too_long)
    tried = refused_edits()
    with ServeProcess(serve.config, env={"TC_TEST_TOKEN": telegram.token}) as again:
        await eventually(lambda: refused_edits() > tried, what="the card refused again")
        publish(workdir, "step 3: fixed")
        await eventually(lambda: "step 3" in resident(), what="the next card")
        assert await again.aterminate() == 0
    assert marker_edits() == 1


async def test_a_feishu_card_refused_for_good_is_said_in_the_chat(
    tmp_path: Path, feishu: FakeFeishu
) -> None:
    setup_ = Setup(tmp_path, feishu, ["builder"])
    workdir = tmp_path / "agents" / "builder"

    def resident() -> str:
        cards = [m for m in feishu.chat(CHAT) if m.msg_type == "interactive" and m.visible]
        return cards[0].text if cards else ""

    with setup_.serve() as serve:
        publish(workdir, "step 1: building")
        await eventually(lambda: "step 1" in resident(), what="step 1")
        feishu.script_error(
            "patch", 230025, msg="The message content exceeds the length limit.", times=1
        )
        publish(workdir, "step 2: FAILED, rolling back")
        await eventually(lambda: MARKER in resident(), what="the chat told of the refusal")
        assert "step 1" not in resident() and "step 2" not in resident()
        publish(workdir, "step 3: fixed")
        await eventually(lambda: "step 3" in resident(), what="the next card")
        assert MARKER not in resident()
        assert await serve.aterminate() == 0
    assert len([m for m in feishu.chat(CHAT) if m.visible]) == 1
