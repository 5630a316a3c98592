"""What agents and chat members write never carries a secret or a platform mention out.

Issue 8, items 4 and 5, end to end through `taskcard serve` and the fake chat APIs:
- the exact values of the service's own configured secrets are removed from cards in every
  spelling an agent might print them (plain, inside a Bot API URL, inside Markdown, split by
  Markdown so that only the rendered text joins them);
- a chat member's `/taskcard` arguments are never echoed back as markup or mentions.
"""

from __future__ import annotations

import html
import json
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from taskcard.producers.task_card.contract import CardPaths, atomic_write
from tests.e2e.harness import (
    TOKEN_ENV,
    ServeProcess,
    activity,
    eventually,
    publish,
    run_cli,
    set_status,
    telegram_config,
)
from tests.e2e.test_serve_feishu import CHAT, ENCRYPT, VERIFY, Setup, card_texts
from tests.fakes.feishu_api import FakeFeishu
from tests.fakes.telegram_api import FakeTelegram

GROUP = -1001234567890
# Deliberately not shaped like a real bot token (too short for the token pattern): only the
# configured-value layer can find it.
TOKEN = "987654:Conf1guredValue-xyz"


def body_spelling(secret: str) -> str:
    return "\n".join(
        [
            "# build 3/7 visible-marker",
            f"env dump: {secret}",
            f"calling https://api.telegram.org/bot{secret}/getMe",
            f"**{secret}** and `{secret}` and _{secret}_",
            f"[status](https://example.com/hook?k={secret})",
            f"```\nexport X={secret}\n```",
        ]
    )


def split_by_markdown(secret: str) -> str:
    """The secret cut in two by emphasis: only the rendered text joins the halves."""
    return f"split-marker {secret[:4]}**{secret[4:]}**"


@pytest.fixture
async def telegram() -> AsyncIterator[FakeTelegram]:
    async with FakeTelegram(token=TOKEN) as server:
        yield server


def telegram_serve(tmp_path: Path, fake: FakeTelegram) -> ServeProcess:
    config = telegram_config(tmp_path, fake.base_url, GROUP)
    return ServeProcess(config, env={TOKEN_ENV: TOKEN})


def telegram_everything(fake: FakeTelegram) -> str:
    """Every version of every bot message, with its entities (link URLs included)."""
    parts: list[str] = []
    for message in fake.bot_messages(GROUP):
        for text, entities in [*message.history, (message.text, message.entities)]:
            parts += [text, json.dumps(entities)]
    return "\n".join(parts)


def feishu_everything(fake: FakeFeishu) -> str:
    return "\n".join(c for m in fake.messages.values() for c in m.contents)


async def test_configured_bot_token_never_reaches_telegram(
    tmp_path: Path, telegram: FakeTelegram
) -> None:
    workdir = tmp_path / "agents" / "builder"
    with telegram_serve(tmp_path, telegram) as serve:
        publish(workdir, body_spelling(TOKEN))
        await eventually(lambda: "visible-marker" in telegram_everything(telegram), what="the card")
        publish(workdir, split_by_markdown(TOKEN))
        await eventually(lambda: "withheld" in telegram_everything(telegram), what="withheld")
        assert await serve.aterminate() == 0
    everything = telegram_everything(telegram)
    assert "[redacted]" in everything
    assert TOKEN not in everything
    assert TOKEN.split(":", 1)[1] not in everything
    assert TOKEN not in serve.logs


async def test_configured_feishu_secrets_never_reach_feishu(
    tmp_path: Path, feishu: FakeFeishu
) -> None:
    setup = Setup(tmp_path, feishu, ["builder"])
    workdir = tmp_path / "agents" / "builder"
    secrets = [feishu.app_secret, ENCRYPT, VERIFY]
    with setup.serve() as serve:
        publish(workdir, "\n".join(body_spelling(secret) for secret in secrets))
        await eventually(lambda: any("visible-marker" in t for t in card_texts(feishu)))
        publish(workdir, split_by_markdown(feishu.app_secret))
        await eventually(lambda: any("withheld" in t for t in card_texts(feishu)))
        assert await serve.aterminate() == 0
    everything = feishu_everything(feishu)
    assert "[redacted]" in everything
    for secret in secrets:
        assert secret not in everything


HOSTILE_ARGS = '<at user_id="all"></at> <b>bold</b> *star* [x](tg://user?id=1) @all'


async def test_telegram_reply_does_not_echo_user_markup(
    tmp_path: Path, telegram: FakeTelegram
) -> None:
    workdir = tmp_path / "agents" / "builder"
    with telegram_serve(tmp_path, telegram) as serve:
        publish(workdir, "body")
        await eventually(lambda: telegram.bot_messages(GROUP), what="the card")
        telegram.inject_command(GROUP, f"/taskcard {HOSTILE_ARGS}")
        await eventually(
            lambda: any("Unknown option" in m.text for m in telegram.bot_messages(GROUP)),
            what="the reply",
        )
        assert await serve.aterminate() == 0
    reply = next(m for m in telegram.bot_messages(GROUP) if "Unknown option" in m.text)
    assert reply.entities == []
    for fragment in ("<at", "<b>", "*star*", "tg://", "@all"):
        assert fragment not in reply.text


async def test_feishu_reply_does_not_echo_a_mention_of_everyone(
    tmp_path: Path, feishu: FakeFeishu
) -> None:
    setup = Setup(tmp_path, feishu, ["builder"])
    workdir = tmp_path / "agents" / "builder"
    with setup.serve() as serve:
        publish(workdir, "body")
        await eventually(lambda: card_texts(feishu), what="the card")
        answer = await feishu.deliver_command(
            setup.url,
            CHAT,
            f"/taskcard {HOSTILE_ARGS}",
            verification_token=VERIFY,
            encrypt_key=ENCRYPT,
        )
        assert answer.status == 200
        await eventually(lambda: any("Unknown option" in t for t in feishu.texts(CHAT)))
        assert await serve.aterminate() == 0
    for text in feishu.texts(CHAT):
        assert "<at" not in text and "<b>" not in text and "@all" not in text


def invisible_spellings(secret: str) -> str:
    """The secret with something a chat shows as nothing, or as a line break, inside it."""
    return "\n".join(
        [
            "invisible-marker",
            f"shy {secret[:7]}\u00ad{secret[7:]}",
            f"sep {secret[:9]}\u2063{secret[9:]}",
            f"cgj {secret[:5]}\u034f{secret[5:]}",
            f"wrapped {secret[:8]}",
            f"{secret[8:]} end",
            f"spaced {secret[:10]} {secret[10:]}",
            # Controls a body loses before it is shown: the halves then meet.
            f"controls {secret[:6]}\x1f\x1b{secret[6:]}",
        ]
    )


def joined(text: str) -> str:
    """What a reader sees: invisible characters, breaks and escapes gone."""
    for gone in ("\u00ad", "\u2063", "\u034f", "\\n", "\n", " ", "\\u00ad", "\\u2063", "\\u034f",
                 "\x1f", "\x1b", "\\x1f", "\\x1b", "\\u001f", "\\u001b"):  # fmt: skip
        text = text.replace(gone, "")
    return text


async def test_a_bot_token_with_invisible_characters_inside_never_reaches_telegram(
    tmp_path: Path, telegram: FakeTelegram
) -> None:
    workdir = tmp_path / "agents" / "builder"
    with telegram_serve(tmp_path, telegram) as serve:
        publish(workdir, invisible_spellings(TOKEN))
        activity(workdir, "tool.start", call_id="c1", name=f"{TOKEN[:6]}\u00ad{TOKEN[6:]}")
        await eventually(
            lambda: (
                "invisible-marker" in telegram_everything(telegram)
                and "[redacted]" in telegram_everything(telegram).split("invisible-marker")[-1]
            ),
            what="the card",
        )
        assert await serve.aterminate() == 0
    everything = joined(telegram_everything(telegram))
    assert TOKEN not in everything
    assert TOKEN.split(":", 1)[1] not in everything


async def test_feishu_secrets_with_invisible_characters_inside_never_reach_feishu(
    tmp_path: Path, feishu: FakeFeishu
) -> None:
    setup = Setup(tmp_path, feishu, ["builder"])
    workdir = tmp_path / "agents" / "builder"
    secrets = [feishu.app_secret, ENCRYPT, VERIFY]
    with setup.serve() as serve:
        publish(workdir, "\n".join(invisible_spellings(secret) for secret in secrets))
        activity(workdir, "tool.start", call_id="c1", name=f"{ENCRYPT[:6]}\u00ad{ENCRYPT[6:]}")
        await eventually(lambda: any("invisible-marker" in t for t in card_texts(feishu)))
        assert await serve.aterminate() == 0
    everything = joined(feishu_everything(feishu))
    assert "[redacted]" in everything
    for secret in secrets:
        assert secret not in everything


def fence_games() -> str:
    """A mention of everyone hidden where a fence might (or might not) make it code."""
    at, ticks = '<at id="all"></at>', "`" * 3
    return "\n".join(
        [
            "fence-marker",
            "~~~",
            f"{at} tilde fence",
            "~~~",
            f"{ticks}{at}",
            ticks,
            f"    {ticks}",
            f"{at} indented fence",
            f"    {ticks}",
            f"{ticks}`",
            ticks,
            f"{at} four ticks",
            f"{ticks}`",
            ticks,
            f"{at} in plain code",
            ticks,
        ]
    )


async def test_no_fence_lets_a_mention_of_everyone_into_a_feishu_card(
    tmp_path: Path, feishu: FakeFeishu
) -> None:
    setup = Setup(tmp_path, feishu, ["builder"])
    with setup.serve() as serve:
        publish(tmp_path / "agents" / "builder", fence_games())
        await eventually(lambda: any("fence-marker" in t for t in card_texts(feishu)))
        assert await serve.aterminate() == 0
    everything = feishu_everything(feishu).lower().replace(" ", "")
    assert "four ticks" in feishu_everything(feishu)
    assert "<at" not in everything and "\\u003cat" not in everything


async def report_notice(telegram: FakeTelegram, workdir: Path, summary: str) -> None:
    """The agent reports with `summary`; the service's notice of it reaches the group."""
    done = run_cli("report", "--workdir", str(workdir), "--ok", "--summary", summary)
    assert done.returncode == 0, done.stderr
    await eventually(
        lambda: "builder reported" in telegram_everything(telegram), what="the report notice"
    )


async def test_the_services_own_answers_keep_their_commands_tappable(
    tmp_path: Path, telegram: FakeTelegram
) -> None:
    """The help that answers a typo, and the other answers made only of the service's own
    words, name commands a person taps on Telegram; defusing agents' commands had made them
    plain text too. The state's answer quotes an agent's report: its command stays defused."""
    workdir = tmp_path / "agents" / "builder"
    with telegram_serve(tmp_path, telegram) as serve:
        publish(workdir, "# build own-words-marker")
        await eventually(lambda: "own-words-marker" in telegram_everything(telegram), what="card")
        await report_notice(telegram, workdir, "done; /taskcard off now")

        def answer(words: str) -> str | None:
            return next((m.text for m in telegram.bot_messages(GROUP) if words in m.text), None)

        telegram.inject_message(GROUP, "/taskcard offx")
        await eventually(lambda: answer("Unknown option"), what="the help")
        telegram.inject_message(GROUP, "/tell nobody hello")
        await eventually(lambda: answer("AGENT is one of"), what="the /tell refusal")
        telegram.inject_message(GROUP, "/taskcard")
        await eventually(lambda: answer("latest report"), what="the state")
        assert await serve.aterminate() == 0
    help_text, refusal, state = (
        answer(words) or "" for words in ("Unknown option", "AGENT is one of", "latest report")
    )
    assert "/taskcard off: hide the cards" in help_text and "/tell AGENT" in help_text
    assert "\u200b" not in help_text and refusal.startswith("/tell AGENT TEXT")
    assert "/\u200btaskcard off now" in state and "/taskcard off" not in state


async def test_no_card_or_notice_mentions_a_telegram_user(
    tmp_path: Path, telegram: FakeTelegram
) -> None:
    """`@name` in any text a bot sends is a mention Telegram detects by itself and notifies,
    and a `tg://user?id=` link is an inline mention: an agent's card or report summary could
    page anyone in the group. Both are defused; a `@` inside code and an e-mail address stay."""
    workdir = tmp_path / "agents" / "builder"
    with telegram_serve(tmp_path, telegram) as serve:
        publish(
            workdir,
            "# build 3/7 mention-marker\n"
            "ping @boss_man, then **@ops_team** and [the boss](tg://user?id=42)\n"
            "mail a@b.example, run `ssh deploy@host`",
        )
        await eventually(lambda: "mention-marker" in telegram_everything(telegram), what="the card")
        await report_notice(telegram, workdir, "@ceo_person approve now")
        assert await serve.aterminate() == 0
    card = next(m for m in telegram.bot_messages(GROUP) if "mention-marker" in m.text)
    notice = next(m for m in telegram.bot_messages(GROUP) if "builder reported" in m.text)
    for name in ("boss_man", "ops_team", "ceo_person"):
        assert f"@{name}" not in card.text + notice.text
    assert "@\u200bboss_man" in card.text and "@\u200bceo_person" in notice.text
    assert "a@b.example" in card.text and "ssh deploy@host" in card.text
    assert "tg://" not in json.dumps(card.entities) and "the boss" in card.text
    units = card.text.encode("utf-16-le")  # entity offsets count UTF-16 code units
    bold = [
        units[2 * e["offset"] : 2 * (e["offset"] + e["length"])].decode("utf-16-le")
        for e in card.entities
        if e["type"] == "bold"
    ]
    assert "@\u200bops_team" in bold


async def test_a_link_with_an_at_sign_reaches_telegram_whole(
    tmp_path: Path, telegram: FakeTelegram
) -> None:
    """Telegram finds a link before any mention inside it, so `?by=@name` in a URL pages no
    one; defusing it there put a zero-width space in the link and cut it short, in a card
    and in a notice. A mention beside the link is still defused."""
    workdir = tmp_path / "agents" / "builder"
    link = "https://ci.example/runs?by=@release_bot"
    bare = "example.com/?who=@alice_ops"
    with telegram_serve(tmp_path, telegram) as serve:
        publish(workdir, f"# build 3/7 link-marker\nlog: {link} and {bare}, ask @boss_man")
        await eventually(lambda: "link-marker" in telegram_everything(telegram), what="the card")
        await report_notice(telegram, workdir, f"see {link}")
        assert await serve.aterminate() == 0
    card = next(m for m in telegram.bot_messages(GROUP) if "link-marker" in m.text)
    notice = next(m for m in telegram.bot_messages(GROUP) if "builder reported" in m.text)
    assert link in card.text and bare in card.text and link in notice.text
    assert "@\u200bboss_man" in card.text


async def test_no_card_or_notice_carries_a_tappable_telegram_command(
    tmp_path: Path, telegram: FakeTelegram
) -> None:
    """Telegram makes a word-initial `/command` in any text a bot sends a bot command: one
    tap by a person sends it to the group. An agent's "/taskcard off" in its card or report
    summary would hide everyone's cards; it is defused as a mention is. Code, a path, a link
    and a `/` inside a word stay as written."""
    workdir = tmp_path / "agents" / "builder"
    link = "https://ci.example/runs?next=/taskcard"
    with telegram_serve(tmp_path, telegram) as serve:
        publish(
            workdir,
            "# build 3/7 command-marker\n"
            "tap /taskcard off, or **/tell builder stop** (/start@SomeBot)\n"
            f"run `/taskcard on`, see /tmp/out/x.log and a/b and {link}",
        )
        await eventually(lambda: "command-marker" in telegram_everything(telegram), what="the card")
        await report_notice(telegram, workdir, "done; /taskcard off now")
        assert await serve.aterminate() == 0
    card = next(m for m in telegram.bot_messages(GROUP) if "command-marker" in m.text)
    notice = next(m for m in telegram.bot_messages(GROUP) if "builder reported" in m.text)
    assert "tap /\u200btaskcard off" in card.text and "/\u200btaskcard off now" in notice.text
    assert "(/\u200bstart@SomeBot)" in card.text
    assert "tap /taskcard" not in card.text and "/tell" not in card.text
    assert "/taskcard" not in notice.text
    assert "`" not in card.text and "/taskcard on" in card.text  # the code span, as written
    assert "/tmp/out/x.log" in card.text and "a/b" in card.text and link in card.text
    units = card.text.encode("utf-16-le")  # entity offsets count UTF-16 code units
    bold = [
        units[2 * e["offset"] : 2 * (e["offset"] + e["length"])].decode("utf-16-le")
        for e in card.entities
        if e["type"] == "bold"
    ]
    assert "/\u200btell builder stop" in bold


def entity_texts(text: str, entities: list[dict[str, Any]], kind: str) -> list[str]:
    """What the chat shows under the entities of `kind` (their offsets count UTF-16 units)."""
    units = text.encode("utf-16-le")
    return [
        units[2 * e["offset"] : 2 * (e["offset"] + e["length"])].decode("utf-16-le")
        for e in entities
        if e["type"] == kind
    ]


async def test_a_card_of_more_entities_than_telegram_applies_pages_no_one(
    tmp_path: Path, telegram: FakeTelegram
) -> None:
    """Telegram applies the first 100 entities of a message and ignores the rest. A card
    with more lost their formatting, and a `@name` or `/command` the agent wrote as code,
    left as written there, was live past the hundredth: it paged the person or was tappable.
    Styles give way first and every word stays; past those, code shows as plain text,
    defused; a card of more links than that is cut, with the visible marker."""
    workdir = tmp_path / "agents" / "builder"
    styled = " ".join(f"**w{i}**" for i in range(120))
    coded = " ".join(f"`@boss_{i}` `/stop_{i}`" for i in range(60))
    linked = " ".join(f"[l{i}](https://ci.example/{i})" for i in range(120))
    with telegram_serve(tmp_path, telegram) as serve:
        publish(workdir, f"# entities-marker\n{styled}\n{coded}\nlinks-marker")
        await eventually(lambda: "links-marker" in telegram_everything(telegram), what="card")
        publish(workdir, f"# entities-marker\n{linked}\nlinks-end")
        await eventually(lambda: "l0 l1" in telegram_everything(telegram), what="the links")
        assert await serve.aterminate() == 0
    card = next(m for m in telegram.bot_messages(GROUP) if "entities-marker" in m.text)
    versions = [*card.history, (card.text, card.entities)]
    text, entities = next(version for version in versions if "links-marker" in version[0])
    code = entity_texts(text, entities, "code")
    assert all(f"w{i}" in text for i in range(120)) and "card cut" not in text
    for i in range(60):
        assert f"@boss_{i}" in code or f"@\u200bboss_{i}" in text
        assert f"/stop_{i}" in code or f"/\u200bstop_{i}" in text
    assert "@boss_59" not in code  # the last code spans gave way
    links = entity_texts(card.text, card.entities, "text_link")
    assert "links-end" not in card.text and "card cut to fit this chat" in card.text
    assert "card updated" in card.text  # the automatic rows stay
    assert links == [f"l{i}" for i in range(len(links))] and 90 < len(links) <= 100


UNSAFE_LINKS = (
    "# links-marker\n"
    "[run](javascript:alert(1)) [page](data:text/html,hi) [disk](file:///etc/passwd) "
    "[app](lark://applink/x) [boss](tg://user?id=42) <javascript:go()> "
    "[deeper](javascript:f((1))) [docs](https://docs.example/a_(b)) `[code](file:///x)`\n"
    "## see [head](javascript:h()) now"
)


async def test_a_card_links_only_to_web_addresses_on_telegram(
    tmp_path: Path, telegram: FakeTelegram
) -> None:
    """A card's link to anything but a web address (`javascript:`, `data:`, `file:`, an
    app's scheme) opened it from one tap on words the agent chose; only `tg:` links were
    taken out. Such a link keeps its words, not its target; a web link stays."""
    workdir = tmp_path / "agents" / "builder"
    with telegram_serve(tmp_path, telegram) as serve:
        publish(workdir, UNSAFE_LINKS)
        await eventually(lambda: "links-marker" in telegram_everything(telegram), what="card")
        assert await serve.aterminate() == 0
    card = next(m for m in telegram.bot_messages(GROUP) if "links-marker" in m.text)
    urls = [e["url"] for e in card.entities if e["type"] == "text_link"]
    assert urls == ["https://docs.example/a_(b)"]
    words = "run page disk app boss javascript:go() deeper docs [code](file:///x)"
    assert words in card.text and "see head now" in card.text


async def test_a_card_links_only_to_web_addresses_on_feishu(
    tmp_path: Path, feishu: FakeFeishu
) -> None:
    """As on Telegram: a Feishu card's Markdown link to anything but a web address shows its
    words; one whose target the converter cannot take apart shows as typed, opening nothing;
    code shows as written."""
    setup = Setup(tmp_path, feishu, ["builder"])
    with setup.serve() as serve:
        publish(tmp_path / "agents" / "builder", UNSAFE_LINKS)
        await eventually(lambda: any("links-marker" in t for t in card_texts(feishu)))
        assert await serve.aterminate() == 0
    card = next(c for c in feishu.cards(CHAT) if "links-marker" in json.dumps(c))
    markdown = next(e["content"] for e in card["body"]["elements"] if e["tag"] == "markdown")
    targets = re.findall(r"\]\(\s*(?:&lt;)?\s*([a-z]+:)", markdown, re.IGNORECASE)
    assert targets == ["https:", "file:"]  # the web link, and the one in code as typed
    assert "run page disk app boss &lt;javascript:go()&gt; [deeper]&#40;javascript" in markdown
    assert "`[code](file:///x)`" in markdown and "**see head now**" in markdown


LITERALS = (
    "# literals-marker\n"
    "AT&amp;T &lt;b&gt; &#42;not bold&#42; \\*nor this\\* \\_x\\_ &copy; &#x1F600; &nosuch;"
    " a\\\\b\n"
    "`&amp; kept` &#60;at id=all&#62;\n"
    "make || make retry || true"
)
LITERALS_SHOWN = "AT&T <b> *not bold* *nor this* _x_ © 😀 &nosuch; a\\b"


async def test_character_references_and_escapes_show_alike_on_telegram_and_feishu(
    tmp_path: Path, telegram: FakeTelegram, feishu: FakeFeishu
) -> None:
    """A character reference (`&amp;`, `&#42;`) or a backslash escape (`\\*`) in a card is
    one character in Markdown: Telegram showed `AT&T`, Feishu `AT&amp;T` and `\\*`. Both
    show the character now, markup characters never as markup, code as written, and a
    mention tag written with references stays text. A shell line's `||` showed as typed on
    Feishu, but was read as a Telegram spoiler there: the pipes went, the middle hidden."""
    with telegram_serve(tmp_path / "t", telegram) as serve:
        publish(tmp_path / "t" / "agents" / "builder", LITERALS)
        await eventually(lambda: "literals-marker" in telegram_everything(telegram))
        assert await serve.aterminate() == 0
    setup = Setup(tmp_path / "f", feishu, ["builder"])
    with setup.serve() as serve:
        publish(tmp_path / "f" / "agents" / "builder", LITERALS)
        await eventually(lambda: any("literals-marker" in t for t in card_texts(feishu)))
        assert await serve.aterminate() == 0
    message = next(m for m in telegram.bot_messages(GROUP) if "literals-marker" in m.text)
    assert LITERALS_SHOWN in message.text and "&amp; kept <at id=all>" in message.text
    styled = [
        *entity_texts(message.text, message.entities, "bold"),
        *entity_texts(message.text, message.entities, "italic"),
    ]
    assert not any("not bold" in text or "nor this" in text or text == "x" for text in styled)
    assert "make || make retry || true" in message.text
    assert not [e for e in message.entities if e["type"] == "spoiler"]
    card = next(c for c in feishu.cards(CHAT) if "literals-marker" in json.dumps(c))
    markdown = next(e["content"] for e in card["body"]["elements"] if e["tag"] == "markdown")
    assert html.unescape(markdown.split("\n")[1]) == LITERALS_SHOWN
    assert "`&amp;amp; kept` &lt;at id=all&gt;" in markdown
    assert "*" not in markdown.split("\n")[1] and "_" not in markdown.split("\n")[1]
    assert markdown.split("\n")[3] == "make || make retry || true"


async def test_a_card_sent_again_without_its_entities_pages_no_one(
    tmp_path: Path, telegram: FakeTelegram
) -> None:
    """When Telegram refuses a card's entities the card goes again as plain text. A `@name`
    or `/command` written as code had been left as written (code shows it so), and the plain
    copy, with nothing marking it as code, paged the person and was tappable."""
    workdir = tmp_path / "agents" / "builder"
    refused = "Bad Request: can't parse entities: unsupported entity at byte offset 3"
    with telegram_serve(tmp_path, telegram) as serve:
        telegram.fail_next("sendMessage", 400, refused)
        publish(workdir, "# plain-marker\nrun `ssh @boss_man` then `/taskcard off`")
        await eventually(lambda: "plain-marker" in telegram_everything(telegram), what="card")
        assert await serve.aterminate() == 0
    card = next(m for m in telegram.bot_messages(GROUP) if "plain-marker" in m.text)
    assert card.entities == []
    assert "ssh @\u200bboss_man" in card.text and "/\u200btaskcard off" in card.text


async def test_angle_brackets_in_a_card_show_as_typed_on_telegram(
    tmp_path: Path, telegram: FakeTelegram
) -> None:
    """Markdown reads `<String>` or a line of `<div>` as raw HTML, which the Telegram
    conversion dropped: `Vec<String>` showed as `Vec`, `<T>` and a comment not at all, while
    Feishu shows them as typed. They show as typed on Telegram too; code stays code."""
    workdir = tmp_path / "agents" / "builder"
    body = (
        "# html-marker\n"
        "returns Vec<String>, not Option<T>; see <issue-42> <!-- keep me -->\n"
        "\n<div>\nblock <b>words</b>\n</div>\n\n"
        "run `make <target>` and <tg-spoiler>open</tg-spoiler>\n"
        "\n<details>\n<summary>log</summary>\n```\nif a<b: Vec<u8>\n<b>\n```\n</details>\n"
        "\n<table>\n" + "<tr><td>row</td></tr>\n" * 12 + "</table>"
    )
    with telegram_serve(tmp_path, telegram) as serve:
        publish(workdir, body)
        await eventually(lambda: "html-marker" in telegram_everything(telegram), what="the card")
        assert await serve.aterminate() == 0
    card = next(m for m in telegram.bot_messages(GROUP) if "html-marker" in m.text)
    assert "returns Vec<String>, not Option<T>; see <issue-42> <!-- keep me -->" in card.text
    assert "<div>\nblock <b>words</b>\n</div>" in card.text
    assert "<tg-spoiler>open</tg-spoiler>" in card.text
    assert entity_texts(card.text, card.entities, "code") == ["make <target>"]
    assert not [e for e in card.entities if e["type"] == "spoiler"]
    # Code inside a block of HTML stays as written (no escape shows in it), and every row
    # of a long block shows.
    assert entity_texts(card.text, card.entities, "pre") == ["if a<b: Vec<u8>\n<b>"]
    assert "<details>\n<summary>log</summary>" in card.text
    assert card.text.count("<tr><td>row</td></tr>") == 12
    assert "\\" not in card.text


async def test_a_card_body_starting_with_a_byte_order_mark_reads_as_without(
    tmp_path: Path, telegram: FakeTelegram
) -> None:
    """A renderer writing UTF-8 with a signature starts its body with a byte-order mark,
    which was kept as text: the heading on the first line showed as `# ...` (on the board
    line too), and a legacy `{title, lines}` frame showed as its raw JSON."""
    workdir = tmp_path / "agents" / "builder"
    with telegram_serve(tmp_path, telegram) as serve:
        atomic_write(CardPaths(workdir).body, "\ufeff# bom-marker\r\nnext line\r\n".encode())
        set_status(workdir, "active")
        await eventually(lambda: "bom-marker" in telegram_everything(telegram), what="the card")
        frame = {"title": "frame-marker", "lines": ["one line"]}
        atomic_write(CardPaths(workdir).body, b"\xef\xbb\xbf" + json.dumps(frame).encode())
        await eventually(lambda: "frame-marker" in telegram_everything(telegram), what="frame")
        assert await serve.aterminate() == 0
    card = next(m for m in telegram.bot_messages(GROUP) if "frame-marker" in m.text)
    first = next(text for text, _ in card.history if "bom-marker" in text)
    assert "\ufeff" not in first and "#" not in first and "bom-marker\nnext line" in first
    assert "\ufeff" not in card.text and "{" not in card.text
    assert "frame-marker\none line" in card.text


async def test_a_custom_emoji_in_a_card_keeps_the_cards_formatting(
    tmp_path: Path, telegram: FakeTelegram
) -> None:
    """A custom emoji (`![👍](tg://emoji?id=...)`) became a `custom_emoji` entity without
    the emoji's id, which Telegram refuses: the whole card went as plain text, its code and
    bold gone. It goes as its plain emoji now; the rest keeps its formatting."""
    workdir = tmp_path / "agents" / "builder"
    body = "# emoji-marker\n![👍](tg://emoji?id=5368324170671202286) **done**, `make all`"
    with telegram_serve(tmp_path, telegram) as serve:
        publish(workdir, body)
        await eventually(lambda: "emoji-marker" in telegram_everything(telegram), what="card")
        assert await serve.aterminate() == 0
    card = next(m for m in telegram.bot_messages(GROUP) if "emoji-marker" in m.text)
    assert "👍 done, make all" in card.text
    assert entity_texts(card.text, card.entities, "code") == ["make all"]
    assert "done" in entity_texts(card.text, card.entities, "bold")
    assert all(e["type"] != "custom_emoji" for e in card.entities)


async def test_a_quote_inside_a_quote_keeps_the_cards_formatting(
    tmp_path: Path, telegram: FakeTelegram
) -> None:
    """Telegram's formatting rules allow no quote inside a quote; a card with `> > x` went
    out with nested quotes, against the rules (the fake refuses such a message), and fell
    back to plain text, its code and bold gone. Only the outer quote goes now."""
    workdir = tmp_path / "agents" / "builder"
    body = "# quote-marker\n> said\n> > earlier\n> > > first\n\n**done**, `make all`"
    with telegram_serve(tmp_path, telegram) as serve:
        publish(workdir, body)
        await eventually(lambda: "quote-marker" in telegram_everything(telegram), what="card")
        assert await serve.aterminate() == 0
    card = next(m for m in telegram.bot_messages(GROUP) if "quote-marker" in m.text)
    assert entity_texts(card.text, card.entities, "blockquote") == ["said\nearlier\nfirst"]
    assert entity_texts(card.text, card.entities, "code") == ["make all"]
