"""One card, the same structure in Telegram and Feishu, end to end.

`taskcard serve` with a Telegram and a Feishu route to the same agent, against the fake
servers: the agent's card mixes every kind of code block (tilde and backtick fences, an info
string, an indented block, one in a quote, one left open), dollars, emphasis, a link, a list
and a quote. Telegram gets its code blocks as `pre` entities, Feishu as clean triple-backtick
blocks, with the same languages and contents; the dollars show as typed on both; the styles
are the same.
"""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any

from tests.channels.test_same_structure import feishu_code_blocks
from tests.e2e.harness import TOKEN_ENV, ServeProcess, eventually, publish, telegram_config
from tests.e2e.test_serve_feishu import CHAT, ENCRYPT, VERIFY
from tests.fakes.feishu_api import FakeFeishu
from tests.fakes.telegram_api import FakeTelegram

GROUP = -1001234567890
AT = '<at id="all"></at>'
BODY = "\n".join(
    [
        "# Build alike-marker",
        "~~~python title=build.py",
        f"print('{AT} *not emphasis*')",
        "~~~",
        "```sh",
        "make test",
        "```",
        "    indented code",
        "",
        "cd $HOME/$USER, then **bold** _it_ ~~struck~~ `inline` [docs](https://example.com/d)",
        "",
        "- one",
        "- two",
        "",
        "> quoted",
        "> ```html",
        "> <font color='red'>quoted code</font> & more",
        "> ```",
        "",
        "````",
        "left open",
    ]
)
BLOCKS = [
    ("python", f"print('{AT} *not emphasis*')"),
    ("sh", "make test"),
    ("", "indented code"),
    ("html", "<font color='red'>quoted code</font> & more"),
    ("", "left open"),
]


def serve_both(tmp_path: Path, telegram: FakeTelegram, feishu: FakeFeishu) -> ServeProcess:
    feishu_lines = [
        "[feishu]",
        'app_id_env = "TC_FS_APP_ID"',
        'app_secret_env = "TC_FS_APP_SECRET"',
        f'domain = "{feishu.base_url}"',
        'events = "none"',
        "[[feishu.routes]]",
        f'chat_id = "{CHAT}"',
        'agents = ["*"]',
    ]
    config = telegram_config(tmp_path, telegram.base_url, GROUP, extra=feishu_lines)
    env = {
        TOKEN_ENV: telegram.token,
        "TC_FS_APP_ID": feishu.app_id,
        "TC_FS_APP_SECRET": feishu.app_secret,
        "TC_FS_VERIFY": VERIFY,
        "TC_FS_ENCRYPT": ENCRYPT,
    }
    return ServeProcess(config, env=env)


def telegram_card(telegram: FakeTelegram) -> tuple[str, list[dict[str, Any]]]:
    cards = [m for m in telegram.bot_messages(GROUP) if "alike-marker" in m.text]
    return (cards[-1].text, cards[-1].entities) if cards else ("", [])


def feishu_markdown_shown(feishu: FakeFeishu) -> str:
    for card in feishu.cards(CHAT):
        for element in card["body"]["elements"]:
            if element["tag"] == "markdown" and "alike-marker" in element["content"]:
                return str(element["content"])
    return ""


def utf16_slice(text: str, offset: int, length: int) -> str:
    data = text.encode("utf-16-le")
    return data[2 * offset : 2 * (offset + length)].decode("utf-16-le")


async def test_one_card_shows_the_same_structure_on_telegram_and_feishu(
    tmp_path: Path, telegram: FakeTelegram, feishu: FakeFeishu
) -> None:
    with serve_both(tmp_path, telegram, feishu) as serve:
        publish(tmp_path / "agents" / "builder", BODY)
        await eventually(lambda: telegram_card(telegram)[0] != "", what="the Telegram card")
        await eventually(lambda: feishu_markdown_shown(feishu) != "", what="the Feishu card")
        assert await serve.aterminate() == 0
    text, entities = telegram_card(telegram)
    shown = {
        (entity["type"], utf16_slice(text, entity["offset"], entity["length"]))
        for entity in entities
    }
    pre = [
        (str(entity.get("language", "")), utf16_slice(text, entity["offset"], entity["length"]))
        for entity in entities
        if entity["type"] == "pre"
    ]
    assert pre == BLOCKS
    markdown = feishu_markdown_shown(feishu)
    assert feishu_code_blocks(markdown) == BLOCKS
    # Dollars as typed on both, and the same styles.
    assert "cd $HOME/$USER," in text and "cd $HOME/$USER," in markdown
    assert {("bold", "bold"), ("italic", "it"), ("strikethrough", "struck")} <= shown
    assert {("code", "inline"), ("text_link", "docs")} <= shown
    assert "**bold** *it* ~~struck~~ `inline` [docs](https://example.com/d)" in markdown
    assert not any(message.mentions_everyone for message in feishu.chat(CHAT))
    # Code in a quote: escaped for Feishu, which may not read it as code there.
    assert "<font" not in markdown and "&lt;font color='red'&gt;quoted code" in markdown


TASKS = "\n".join(
    [
        "tasks-marker",
        "",
        "- [ ] open dash",
        "- [x] done dash",
        "* [ ] open star",
        "+ [X] done plus",
        "1. [ ] open numbered",
        "2. [x] done numbered",
        "- parent",
        "  - [ ] open nested",
        "  - [x] done nested",
        "- text then [ ] not a box",
        "",
        "```",
        "- [ ] in code",
        "```",
    ]
)
# What each item reads as, on both platforms: its box, then its words.
TASK_LINES = [
    "☐ open dash",
    "☑ done dash",
    "☐ open star",
    "☑ done plus",
    "☐ open numbered",
    "☑ done numbered",
    "☐ open nested",
    "☑ done nested",
]


async def test_task_list_boxes_read_open_or_done_alike_on_telegram_and_feishu(
    tmp_path: Path, telegram: FakeTelegram, feishu: FakeFeishu
) -> None:
    """An open task item used to show as ☑ on Telegram, like a done one, and as `[ ]` on
    Feishu: both now show ☐ for open and ☑ for done, numbers and nesting kept; a `[ ]` later
    in an item or in code is not a box and shows as typed."""

    def telegram_tasks() -> str:
        cards = [m for m in telegram.bot_messages(GROUP) if "tasks-marker" in m.text]
        return cards[-1].text if cards else ""

    def feishu_tasks() -> str:
        for card in feishu.cards(CHAT):
            for element in card["body"]["elements"]:
                if element["tag"] == "markdown" and "tasks-marker" in element["content"]:
                    return str(element["content"])
        return ""

    with serve_both(tmp_path, telegram, feishu) as serve:
        publish(tmp_path / "agents" / "builder", TASKS)
        await eventually(lambda: telegram_tasks() != "", what="the Telegram card")
        await eventually(lambda: feishu_tasks() != "", what="the Feishu card")
        assert await serve.aterminate() == 0
    for shown in (telegram_tasks(), feishu_tasks()):
        for line in TASK_LINES:
            assert line in shown, (line, shown)
        assert "1. ☐ open numbered" in shown and "2. ☑ done numbered" in shown
        assert "text then [ ] not a box" in shown
        assert "- [ ] in code" in shown
        assert "☑ open" not in shown and "☐ done" not in shown


ESCAPED = "escaped-marker: run \\`make test\\` then `deploy` \\\\ done"


async def test_an_escaped_backtick_is_a_backtick_on_telegram_and_feishu(
    tmp_path: Path, telegram: FakeTelegram, feishu: FakeFeishu
) -> None:
    """A backtick written `\\`` shows as a backtick, as CommonMark says. Telegram showed it
    so; Feishu's card took it for the start of inline code (on a line with a backslash), so
    "\\`make test\\`" went out as code with its backslashes showing."""

    def feishu_line() -> str:
        for card in feishu.cards(CHAT):
            for element in card["body"]["elements"]:
                if element["tag"] == "markdown" and "escaped-marker" in element["content"]:
                    return str(element["content"])
        return ""

    with serve_both(tmp_path, telegram, feishu) as serve:
        publish(tmp_path / "agents" / "builder", ESCAPED)
        await eventually(lambda: feishu_line() != "", what="the Feishu card")
        await eventually(
            lambda: any("escaped-marker" in m.text for m in telegram.bot_messages(GROUP)),
            what="the Telegram card",
        )
        assert await serve.aterminate() == 0
    [card] = [m for m in telegram.bot_messages(GROUP) if "escaped-marker" in m.text]
    codes = [
        utf16_slice(card.text, e["offset"], e["length"])
        for e in card.entities
        if e["type"] == "code"
    ]
    assert "run `make test` then deploy \\ done" in card.text and codes == ["deploy"]
    line = feishu_line()
    assert line == "escaped-marker: run &#96;make test&#96; then `deploy` &#92; done"
    assert html.unescape(line.replace("`deploy`", "deploy")) in card.text
