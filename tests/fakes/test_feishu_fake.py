"""The fake Feishu itself: how it reads a sent message's mention of everyone, which the
end-to-end tests rely on to say that nothing pinged the whole chat."""

from __future__ import annotations

import json

import pytest

from tests.fakes.feishu_api import FakeMessage


def _card(tag: str, content: str) -> str:
    return json.dumps({"schema": "2.0", "body": {"elements": [{"tag": tag, "content": content}]}})


@pytest.mark.parametrize(
    ("msg_type", "content", "pings"),
    [
        ("text", json.dumps({"text": 'hi <at user_id="all"></at>'}), True),
        ("text", json.dumps({"text": "hi <AT  user_id = all>x</at>"}), True),
        ("text", json.dumps({"text": 'hi \uff1cat user_id="all"\uff1e @_all @all'}), False),
        ("interactive", _card("markdown", "see <at id=all></at>"), True),
        ("interactive", _card("markdown", "see <at ids=ou_1,all></at>"), True),
        ("interactive", _card("markdown", "see &lt;at id=all&gt;"), False),
        ("interactive", _card("markdown", "see <\u200bat id=all>"), False),
        ("interactive", _card("plain_text", "see <at id=all></at>"), False),
        ("post", json.dumps({"zh_cn": {"content": [[{"tag": "at", "user_id": "all"}]]}}), True),
    ],
)
def test_a_mention_of_everyone_is_read_as_feishu_reads_it(
    msg_type: str, content: str, pings: bool
) -> None:
    message = FakeMessage("om_1", "oc_1", msg_type, [content], 0.0)
    assert message.mentions_everyone is pings
