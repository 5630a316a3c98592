"""systemd's readiness protocol (`Type=notify`): one datagram to `$NOTIFY_SOCKET`.

The protocol is a single `KEY=VALUE` line per state sent over a unix datagram socket whose
path systemd puts in the environment (a leading `@` names the abstract namespace). Without
the variable (not under systemd, or `Type=simple`) nothing is sent. A failure to notify is
logged and never stops the service: readiness is a courtesy to the supervisor.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Mapping

log = logging.getLogger(__name__)

READY = "READY=1"
STOPPING = "STOPPING=1"


def sd_notify(state: str, env: Mapping[str, str]) -> bool:
    """Send `state` to the socket named by `NOTIFY_SOCKET` in `env`; True when sent."""
    path = env.get("NOTIFY_SOCKET", "")
    if not path:
        return False
    address = "\0" + path[1:] if path.startswith("@") else path
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.connect(address)
            sock.sendall(state.encode())
    except OSError as error:
        log.warning("could not notify systemd (%s): %s", state, error)
        return False
    return True
