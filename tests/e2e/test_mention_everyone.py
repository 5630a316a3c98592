"""A mention of everyone, both ways, through `taskcard serve` and the fake chat APIs.

In: Feishu writes a person's mention of everyone as the placeholder `@_all`; the agent reads
it as the chat showed it (`@所有人`, or `@all` when Feishu does not name it), as it reads a
user's mention as `@Name`. Out: nothing an agent writes (its card, its report quoted in a
notice and in the `/taskcard` answer) pings everyone: Feishu's `<at user_id="all">` and
`<at id=all>` are shown as typed, never read as tags; Telegram has no mention of everyone,
and `@channel`-like words stay plain words there.
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.e2e.harness import eventually, publish
from tests.e2e.test_talk_and_signals import (
    FS_CHAT,
    FS_PERSON,
    FS_VERIFY,
    GROUP,
    FeishuChat,
    TelegramChat,
    chat_for,
    platform,  # noqa: F401 (the fixture, used by name)
    queued,
    report,
    running_agent,
    running_card_shown,
    wait_said,
    workdir,
)

EVERYONE = (
    '<at user_id="all"></at> <at id=all></at> < AT ids=ou_1,all > @_all '
    "@channel @everyone @here @all"
)


async def test_a_feishu_mention_of_everyone_reaches_the_agent_as_the_chat_showed_it(
    tmp_path: Path,
) -> None:
    async with chat_for("feishu", tmp_path, ["builder"]) as chat:
        assert isinstance(chat, FeishuChat)
        running_agent(tmp_path)
        with chat.serve:
            await running_card_shown(chat)
            for text, options in (
                ("/tell builder @_all the build is red", {}),
                ("/tell builder ask @_all now", {"everyone_listed": False}),
                ("/tell builder rich @_all too", {"message_type": "post"}),
            ):
                document = chat.fake.command_event(
                    FS_CHAT, text, open_id=FS_PERSON, verification_token=FS_VERIFY, **options
                )
                assert (await chat.fake.deliver_event(chat.url, document)).status == 200
            await eventually(lambda: len(queued(tmp_path)) == 3, what="the three texts")
            texts = {json.loads(m.read_text())["text"] for m in queued(tmp_path)}
            assert texts == {"@所有人 the build is red", "ask @all now", "rich @所有人 too"}
            assert await chat.serve.aterminate() == 0


async def test_an_agents_text_never_pings_everyone(
    platform: str,  # noqa: F811 (the imported fixture)
    tmp_path: Path,
) -> None:
    async with chat_for(platform, tmp_path, ["builder"]) as chat:
        assert isinstance(chat, TelegramChat | FeishuChat)
        running_agent(tmp_path)
        wd = workdir(tmp_path)
        with chat.serve:
            await running_card_shown(chat)
            publish(wd, f"**ping** {EVERYONE}\n\n```\n{EVERYONE}\n```")
            await wait_said(chat, "ping", "the card naming everyone")
            report(wd, 1, ok=True, summary=f"done {EVERYONE}")
            await wait_said(chat, "builder reported", "the report's notice")
            await chat.say("/taskcard")
            await wait_said(chat, "done ", "the state quoting the report")
            assert await chat.serve.aterminate() == 0
        if isinstance(chat, FeishuChat):
            sent = chat.fake.chat(FS_CHAT)
            assert sent and not [m.message_id for m in sent if m.mentions_everyone]
            assert any("@_all @channel" in m.text for m in sent)  # shown as typed
        else:
            sent_tg = chat.fake.bot_messages(GROUP)
            versions = [v for m in sent_tg for v in [*m.history, (m.text, m.entities)]]
            kinds = {entity["type"] for _, entities in versions for entity in entities}
            assert not kinds & {"mention", "text_mention"}
            assert any("@channel @everyone @here @all" in m.text for m in sent_tg)
