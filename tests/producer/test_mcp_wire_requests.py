"""Requests the MCP server's wire took wrongly, driven as raw JSON-RPC lines on its stdin (the
SDK's client cannot send them: it always initializes first, gives good ids and sends only
whole surrogate pairs).

- A request whose id is not text or a whole number (1.5, true, [1], an object, null) got no
  answer at all: the SDK read it as a notification, so a ping was never answered and a
  tools/call neither run nor answered.
- Half a surrogate pair escaped in a tools/call's arguments was a parse error of the whole
  line, where bytes that are not UTF-8 in the same place were refused naming the field.
- A tools/list or tools/call before initialize was answered "Invalid request parameters",
  naming nothing.
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.conftest import INITIALIZE

from .conftest import INITIALIZED, CliHost, mcp_answers, report_summaries, tool_call


def test_a_request_whose_id_is_not_one_is_answered_as_invalid_and_not_run(
    workdir: Path, cli: CliHost
) -> None:
    report = '{"name":"report","arguments":{"ok":true,"summary":"bad id"}}'
    bad = {
        '1.5': "a number with a fraction or exponent",
        'true': "true or false",
        '[1]': "a list",
        '{"a":1}': "an object",
        'null': "not allowed",
    }  # fmt: skip
    lines = [json.dumps(INITIALIZE), INITIALIZED]
    lines += [f'{{"jsonrpc":"2.0","id":{ident},"method":"ping"}}' for ident in bad]
    calls = ["1.5", "null"]
    lines += [
        f'{{"jsonrpc":"2.0","id":{ident},"method":"tools/call","params":{report}}}'
        for ident in calls
    ]
    lines.append('{"jsonrpc":"2.0","id":9,"method":"ping"}')
    answers = mcp_answers(cli, lines)
    assert answers[0]["id"] == 1 and "result" in answers[0]
    assert answers[-1] == {"jsonrpc": "2.0", "id": 9, "result": {}}
    refused = answers[1:-1]
    expected = [*bad.items(), *((ident, bad[ident]) for ident in calls)]
    assert len(refused) == len(expected), answers
    for answer, (ident, kind) in zip(refused, expected, strict=True):
        assert answer["id"] is None, answer
        assert answer["error"]["code"] == -32600, answer
        message = answer["error"]["message"]
        assert message.startswith(f"Invalid Request: id {json.dumps(json.loads(ident))} is {kind}")
        assert "a request's id is text or a whole number" in message, message
    assert report_summaries(workdir) == []  # neither tools/call ran


def test_an_id_too_long_for_a_float_is_named_as_written_cut_short(
    workdir: Path, cli: CliHost
) -> None:
    """An id with a fraction or exponent too large for a float (1e400, 400 digits and a
    fraction) was named "Infinity", a number no client sent; it is named as written, cut
    short to 40 characters."""
    digits = "9" * 400 + ".5"
    lines = [json.dumps(INITIALIZE), INITIALIZED]
    lines += [f'{{"jsonrpc":"2.0","id":{ident},"method":"ping"}}' for ident in ("1e400", digits)]
    answers = mcp_answers(cli, lines)
    shown = [answer["error"]["message"] for answer in answers[1:]]
    assert len(shown) == 2, answers
    kind = "is a number with a fraction or exponent, so the request was not run"
    assert shown[0].startswith(f"Invalid Request: id 1e400 {kind}"), shown
    assert shown[1].startswith(f"Invalid Request: id {'9' * 37}... {kind}"), shown
    assert not any("Infinity" in message for message in shown), shown


def test_half_a_surrogate_pair_in_a_tool_call_is_refused_naming_the_field(
    workdir: Path, cli: CliHost
) -> None:
    lines = [
        json.dumps(INITIALIZE),
        INITIALIZED,
        tool_call(2, r'{"name":"report","arguments":{"ok":true,"summary":"cut \ud83d"}}'),
        tool_call(3, r'{"name":"report","arguments":{"ok":true,"r\udc00le":"x"}}'),
        tool_call(4, r'{"name":"report","arguments":{"ok":true,"summary":"whole \ud83d\ude00"}}'),
    ]
    by_id = {answer["id"]: answer for answer in mcp_answers(cli, lines)}
    for ident, field in {2: "summary", 3: "r\ufffdle"}.items():
        result = by_id[ident]["result"]
        assert result["isError"] is True, result
        content = result["structuredContent"]
        assert content["code"] == "bad_envelope", content
        assert content["message"].startswith(f"{field}: holds half a surrogate pair"), content
        assert "send both halves" in content["message"], content
    assert by_id[4]["result"]["isError"] is False, by_id[4]
    assert report_summaries(workdir) == ["whole \U0001f600"]


def test_tools_before_initialize_are_answered_naming_what_to_send_first(
    workdir: Path, cli: CliHost
) -> None:
    lines = [
        '{"jsonrpc":"2.0","id":1,"method":"tools/list"}',
        tool_call(2, '{"name":"report","arguments":{"ok":true,"summary":"early"}}'),
        '{"jsonrpc":"2.0","id":3,"method":"ping"}',
    ]
    by_id = {answer["id"]: answer for answer in mcp_answers(cli, lines)}
    for ident, method in {1: "tools/list", 2: "tools/call"}.items():
        error = by_id[ident]["error"]
        assert error["code"] == -32602, error  # the SDK's code: the MCP spec names none
        assert error["message"].startswith(f"Invalid params: {method} before initialize"), error
        assert "send initialize first" in error["message"], error
    assert by_id[3]["result"] == {}
    assert report_summaries(workdir) == []
