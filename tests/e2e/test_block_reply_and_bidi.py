"""What people send an agent from a chat, end to end through `taskcard serve` against the fake
Telegram Bot API and the fake Feishu Open API: the notice of a blocked task says that a reply
to it reaches the agent, and one does; direction characters in a person's text reach the
agent's inbox shown as code points, so they cannot reorder what the agent reads."""

from __future__ import annotations

import json
from pathlib import Path

from tests.e2e.harness import eventually, run_cli
from tests.e2e.test_ledger_to_chat import ledger
from tests.e2e.test_talk_and_signals import (
    platform,  # noqa: F401 (the fixture, used by name)
    queued,
    running_card,
    wait_said,
    wait_status,
    workdir,
)

# The block notice's last line.
REPLY_LINE = "Reply to this message to answer: your reply reaches the agent."


def queued_texts(tmp_path: Path) -> list[str]:
    return sorted(json.loads(path.read_text())["text"] for path in queued(tmp_path))


async def test_a_block_notice_says_a_reply_reaches_the_agent_and_a_reply_does(
    platform: str,  # noqa: F811 (the imported fixture)
    tmp_path: Path,
) -> None:
    """The ledger's monitor escalates a block: the chat's notice asks a person to decide,
    and now says how (it did not, though a reply to it is the way: the reply is queued in
    the agent's inbox as one to its card)."""
    async with running_card(platform, tmp_path) as chat:
        wd = workdir(tmp_path)
        ledger(wd, "init", "train-7", "--purpose", "Train", "--steps", "prep,train")
        ledger(wd, "checkpoint", "train-7", "--event-type", "STARTED")
        ledger(
            wd, "block", "train-7", "--kind", "MISSING_ACCESS", "--step", "train", "--reason", "key"
        )
        ledger(wd, "supervise", "--apply-supervision")
        notice = await wait_said(chat, "is blocked", "the block notice")
        assert notice.endswith(f"it needs a person to decide.\n{REPLY_LINE}"), notice
        notice_id = chat.message_id_with("is blocked")
        assert notice_id is not None
        await chat.say("use the read-only key", reply_to=notice_id)
        await eventually(lambda: queued_texts(tmp_path), timeout_s=60, what="the reply queued")
        assert queued_texts(tmp_path) == ["use the read-only key"]
        await wait_status(chat, "queued")


async def test_direction_characters_a_person_sends_reach_the_agent_as_code_points(
    platform: str,  # noqa: F811 (the imported fixture)
    tmp_path: Path,
) -> None:
    """A `/tell` and a reply to the card holding bidirectional formatting (a right-to-left
    override that shows `gnp.exe` as `exe.png`, an isolate, marks): the inbox has each as
    its code point, `<U+202E>`, and the rest of the text as written; the agent reads them
    so. They reached the inbox as written, and could make the frame around the text ("from
    <person> in <chat>: ...") read in another order."""
    async with running_card(platform, tmp_path) as chat:
        await chat.say("/tell builder rename \u202egnp.exe\u202c now")
        await wait_status(chat, "queued")
        card = chat.message_id_with("compile")
        assert card is not None
        await chat.say("and \u2067this\u2069 \u200fone \u061c\u200e", reply_to=card)
        await eventually(
            lambda: len(queued(tmp_path)) == 2, timeout_s=60, what="the reply queued too"
        )
        assert queued_texts(tmp_path) == [
            "and <U+2067>this<U+2069> <U+200F>one <U+061C><U+200E>",
            "rename <U+202E>gnp.exe<U+202C> now",
        ]
        read = run_cli("inbox", "--workdir", str(workdir(tmp_path)), "--peek")
        assert read.returncode == 0, read.stderr
        assert "> rename <U+202E>gnp.exe<U+202C> now" in read.stdout
        assert not set(read.stdout) & {"\u202e", "\u2067", "\u200f", "\u061c", "\u200e"}


async def test_invisible_characters_at_the_ends_of_a_tell_reach_the_agent(
    platform: str,  # noqa: F811 (the imported fixture)
    tmp_path: Path,
) -> None:
    """A `/tell` text starting with an isolate and ending with a direction mark, and one
    ending in a flag of tag characters (Scotland's: a black flag and the tags that make it
    Scotland's), reach the agent with those ends, the direction characters as code points.
    The ends were trimmed of every invisible character: the isolate and the mark were gone
    and the flag was a bare black flag. A text that is nothing but invisible characters is
    still nothing to send."""
    scotland = "\U0001f3f4\U000e0067\U000e0062\U000e0073\U000e0063\U000e0074\U000e007f"
    async with running_card(platform, tmp_path) as chat:
        await chat.say("/tell builder \u200b\u00a0")
        await wait_said(chat, "Nothing to send", "the answer to an invisible text")
        await chat.say("/tell builder \u2067rtl\u2069 first\u200e ")
        await chat.say(f"/tell builder\u00a0go {scotland}\n")
        await eventually(lambda: len(queued(tmp_path)) == 2, timeout_s=60, what="both texts queued")
        assert queued_texts(tmp_path) == [
            "<U+2067>rtl<U+2069> first<U+200E>",
            f"go {scotland}",
        ]
