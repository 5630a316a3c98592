"""The command relay's entry format: what an instance reads back is what the poller read."""

from __future__ import annotations

import json

import pytest

from taskcard.bridge.cluster.commands import decode, encode
from taskcard.channels.base import ChatRef, IncomingCommand, SentAs


@pytest.mark.parametrize("sent_as", [None, "admin", "chat"])
def test_who_a_command_was_sent_on_behalf_of_crosses_the_relay(sent_as: SentAs | None) -> None:
    # Lost on the way, an anonymous admin's command was read back as GroupAnonymousBot's
    # (refused where people are listed) and a channel's as a person's.
    command = IncomingCommand(
        ChatRef("-100", "4"),
        "off",
        "1087968824",
        "12",
        "Fleet",
        sent_as=sent_as,
    )
    assert decode(encode(command)) == command


def test_an_entry_naming_an_unknown_sender_kind_is_not_read() -> None:
    entry = json.loads(encode(IncomingCommand(ChatRef("-100"), "off", "7")))
    assert decode(json.dumps(entry)) is not None
    entry["sent_as"] = "someone"
    assert decode(json.dumps(entry)) is None


def test_that_a_command_shows_reordered_crosses_the_relay() -> None:
    # Lost on the way, the instance answering "/taskcard" + an override + "ffo" said "Did
    # you mean /taskcard off?" of the "off" the person sees.
    command = IncomingCommand(ChatRef("-100"), "ffo", "7", reordered=True)
    assert decode(encode(command)) == command
    entry = json.loads(encode(command))
    del entry["reordered"]  # written by an older version
    assert decode(json.dumps(entry)) == IncomingCommand(ChatRef("-100"), "ffo", "7")
    entry["reordered"] = "yes"
    assert decode(json.dumps(entry)) is None
