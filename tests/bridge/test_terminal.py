"""What reaches an operator's terminal from chats and agents cannot act on it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from taskcard.bridge.run.terminal import printable
from taskcard.bridge.store.base import SeenChat
from taskcard.bridge.store.sqlite import STATE_FILE, SqliteStore
from tests.e2e.harness import run_cli


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("Ops room", "Ops room"),
        ("Équipe 运维 🚀", "Équipe 运维 🚀"),
        ("\x1b[2Jgone", "\\x1b[2Jgone"),
        ("two\nlines\r", "two\\nlines\\r"),
        ("\x9b31m", "\\x9b31m"),
        ("abc\u202edcba", "abc\\u202edcba"),
        ("abc\u061cdcba", "abc\\u061cdcba"),
        ("row\u2028row\u2029", "row\\u2028row\\u2029"),
        ("name\udcff", "name\\udcff"),
        ("tab\there", "tab\\there"),
    ],
)
def test_printable(text: str, shown: str) -> None:
    assert printable(text) == shown


def test_chats_shows_a_hostile_title_as_escapes_in_one_row(tmp_path: Path) -> None:
    """A chat member names the chat with a newline and escape sequences: the table keeps one
    row per chat and none of it reaches the terminal raw; `--json` keeps the title as is."""
    title = "Ops\n\x1b]0;owned\x07\x1b[2J\u202eroom\u061c\u2028"
    (tmp_path / "agents" / "a").mkdir(parents=True)
    config = tmp_path / "taskcard.toml"
    config.write_text('state_dir = ".taskcard"\n[[agents]]\nid = "a"\nworkdir = "agents/a"\n')
    (tmp_path / ".taskcard").mkdir()
    store = SqliteStore(tmp_path / ".taskcard" / STATE_FILE)
    try:
        store.record_chat(SeenChat("telegram", "-100", None, title, 1.7e9))
    finally:
        store.close()
    table = run_cli("chats", "--config", str(config))
    assert table.returncode == 0, table.stderr
    assert "\x1b" not in table.stdout and "\x07" not in table.stdout
    assert not {"\u202e", "\u061c", "\u2028"} & set(table.stdout)
    _header, *rows = table.stdout.splitlines()
    assert len(rows) == 1
    assert "Ops\\n\\x1b]0;owned\\x07\\x1b[2J\\u202eroom\\u061c\\u2028" in rows[0]
    listed = run_cli("chats", "--config", str(config), "--json")
    assert listed.returncode == 0, listed.stderr
    assert json.loads(listed.stdout)[0]["title"] == title
