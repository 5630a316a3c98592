"""How a delivery on a local socket learns that its reader went away without reading it."""

from __future__ import annotations

import os
import socket

from taskcard.producers.inbox.output import Output


def test_a_peer_that_closed_with_our_bytes_unread_is_told_from_one_that_read_them() -> None:
    """A socket's unread count drops to 0 when the peer closes, so a peer closing between
    the look for a hang-up and the look at the count read as a delivery (the MCP answer's
    messages were then lost; seen on a loaded machine). The reset the peer leaves tells."""
    ours, theirs = socket.socketpair()
    with ours:
        os.write(ours.fileno(), b"answer\n")
        theirs.close()  # unread
        assert Output(ours.fileno())._reset_by_peer()
    ours, theirs = socket.socketpair()
    with ours:
        os.write(ours.fileno(), b"answer\n")
        assert theirs.recv(100) == b"answer\n"
        theirs.close()  # read first
        assert not Output(ours.fileno())._reset_by_peer()
        assert Output(ours.fileno()).deliver(b"") is False  # gone: nothing more reaches it


def test_a_pipe_has_no_reset_to_tell() -> None:
    read_end, write_end = os.pipe()
    try:
        os.close(read_end)
        assert not Output(write_end)._reset_by_peer()
    finally:
        os.close(write_end)
