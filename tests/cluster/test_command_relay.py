"""The command relay's entry format: what an instance reads back is what the poller read."""

from __future__ import annotations

import dataclasses
import json

import pytest

from taskcard.bridge.cluster.commands import RELAYED, decode, encode
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


def test_every_field_but_the_instances_own_crosses_the_relay() -> None:
    # `in_thread` was left out of the entry: a remark merely written in a Feishu thread on
    # the board was answered with how to reach an agent by the instance that read it back.
    # Every field of the dataclass is relayed (`reply` is each instance's own), so a field
    # added to it cannot be dropped on the way.
    relayed = {f.name for f in dataclasses.fields(IncomingCommand)} - {"chat", "reply"}
    assert set(RELAYED) == relayed
    command = IncomingCommand(
        ChatRef("oc_1", "t1"), "words", "ou_7", "om_2", "Fleet", command="reply",
        reply_to=("om_1", "om_0"), message_thread="omt_1", in_thread=True, sent_as="admin",
        reordered=True, replied_author_unknown=True, author_name="Ann", author_signature="Ann",
        sent_as_chat="-1009", agent_glued=True,
    )  # fmt: skip
    changed = [f.name for f in dataclasses.fields(command) if getattr(command, f.name) == f.default]
    assert changed == ["reply"]  # every other field differs from its default, and is checked
    assert decode(encode(command)) == command
    entry = json.loads(encode(command))
    del entry["in_thread"]  # written by an older version
    assert decode(json.dumps(entry)) == dataclasses.replace(command, in_thread=False)
    entry["in_thread"] = "yes"
    assert decode(json.dumps(entry)) is None


def test_a_signature_an_older_version_relayed_as_the_name_alone_is_read_back() -> None:
    # A version before `author_signature` was relayed wrote a channel post's signature only
    # as its `author_name` (else the channel's title): read back without it, every signer
    # shared one /tell rate and one /taskcard cancel during a rolling upgrade.
    signed = IncomingCommand(
        ChatRef("-100"), "builder hi", None, "12", "Release desk", command="tell",
        sent_as="admin", author_name="Ann", author_signature="Ann",
    )  # fmt: skip
    unsigned = dataclasses.replace(signed, author_name="Release desk", author_signature=None)
    for command in (signed, unsigned):
        entry = json.loads(encode(command))
        del entry["author_signature"]  # written by an older version
        assert decode(json.dumps(entry)) == command
    # Said to be unsigned by a version that relays it: the name stays a name.
    entry = json.loads(encode(dataclasses.replace(signed, author_signature=None)))
    assert decode(json.dumps(entry)).author_signature is None  # type: ignore[union-attr]
    # A person's message never has its name read as a signature.
    person = dataclasses.replace(signed, user_id="7", author_name="Ann", author_signature=None)
    entry = json.loads(encode(person))
    del entry["author_signature"]
    assert decode(json.dumps(entry)) == person


def test_an_anonymous_admin_an_older_version_relayed_as_the_placeholder_is_the_groups() -> None:
    # A version before anonymous admins were writers of their own gave the message
    # GroupAnonymousBot's id as its user id, and no name: read back so, it was that
    # placeholder's, in every group.
    admin = IncomingCommand(
        ChatRef("-100"), "builder hi", None, "12", "Fleet", command="tell", sent_as="admin",
        author_name="Fleet",
    )  # fmt: skip
    entry = json.loads(encode(admin))
    entry.update(user_id="1087968824", author_name=None)
    del entry["author_signature"]  # written by an older version
    read = decode(json.dumps(entry))
    assert read == admin and read.writer == "chat:-100"
    # Only the placeholder, only sent as the group: a person's id stays the person's.
    person = decode(json.dumps({**entry, "user_id": "7"}))
    assert person is not None and (person.user_id, person.author_name) == ("7", None)
    unmarked = decode(json.dumps({**entry, "sent_as": None}))
    assert unmarked is not None and unmarked.user_id == "1087968824"
