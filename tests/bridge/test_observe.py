"""The metrics listener's address, the systemd notification and the request outcome labels."""

from __future__ import annotations

import socket
import uuid
from pathlib import Path

import pytest

from taskcard.bridge.config import ConfigError, parse_config
from taskcard.bridge.observe.config import parse_listen
from taskcard.bridge.observe.metrics import ServiceMetrics, ServiceSnapshot, outcome_of
from taskcard.bridge.observe.sdnotify import READY, STOPPING, sd_notify
from taskcard.channels.errors import (
    Forbidden,
    MessageGone,
    NotModified,
    OutcomeUnknown,
    Permanent,
    RateLimited,
    Transient,
)


@pytest.mark.parametrize(
    ("text", "address"),
    [
        ("127.0.0.1:9464", ("127.0.0.1", 9464)),
        ("0.0.0.0:1", ("0.0.0.0", 1)),
        ("localhost:65535", ("localhost", 65535)),
        ("[::1]:9464", ("::1", 9464)),
    ],
)
def test_listen_addresses_that_parse(text: str, address: tuple[str, int]) -> None:
    assert parse_listen(text) == address


@pytest.mark.parametrize(
    ("text", "hint"),
    [
        ("9464", "host:port"),
        (":9464", "host:port"),
        ("127.0.0.1:", "port"),
        ("127.0.0.1:0", "1 to 65535"),
        ("127.0.0.1:70000", "1 to 65535"),
        ("::1:9464", "brackets"),
        ("[nope]:9464", "IPv6"),
    ],
)
def test_a_bad_listen_address_is_a_config_error_naming_the_key(text: str, hint: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config({"metrics": {"listen": text}}, base_dir=Path("/"))
    (message,) = caught.value.messages
    assert "metrics.listen" in message and hint in message


def test_metrics_are_off_unless_listen_is_set() -> None:
    assert parse_config({}, base_dir=Path("/")).metrics.address is None


@pytest.mark.parametrize(
    ("error", "label"),
    [
        (None, "ok"),
        (NotModified("same"), "not_modified"),
        (RateLimited(3.0, "telegram:bot"), "rate_limited"),
        (MessageGone("gone"), "gone"),
        (Forbidden("kicked"), "forbidden"),
        (OutcomeUnknown("lost"), "unknown"),
        (Transient("502"), "transient"),
        (Permanent("400"), "permanent"),
        (ValueError("bug"), "error"),
    ],
)
def test_request_outcome_labels(error: BaseException | None, label: str) -> None:
    assert outcome_of(error) == label


def test_a_429_counts_as_a_request_and_as_rate_limited_in_its_own_registry() -> None:
    first, second = ServiceMetrics(wall=lambda: 1000.0), ServiceMetrics()
    first.record("telegram", "edit", RateLimited(3.0, "telegram:bot"))
    first.record("telegram", "edit", None)
    text = first.exposition().decode()
    assert 'taskcard_rate_limited_total{channel="telegram",operation="edit"} 1.0' in text
    assert 'taskcard_last_delivery_timestamp_seconds{channel="telegram"} 1000.0' in text
    assert "taskcard_rate_limited_total{" not in second.exposition().decode()


def test_health_needs_a_running_loop_and_a_ready_channel() -> None:
    metrics = ServiceMetrics()
    assert metrics.health()[0] is False
    state = {"running": True, "ready": ()}

    def snapshot() -> ServiceSnapshot:
        return ServiceSnapshot(
            running=bool(state["running"]),
            channels=("telegram", "feishu"),
            ready_channels=tuple(state["ready"]),  # type: ignore[arg-type]
            agents_watched=2,
            agents_faulted=1,
            active_pauses=0,
            lane_depths={("telegram", "-100"): 2},
            notices={"pending": 1},
        )

    metrics.bind(snapshot)
    healthy, answer = metrics.health()
    assert not healthy and answer["reason"] == "no channel ready (telegram, feishu)"
    state["ready"] = ("feishu",)
    assert metrics.health() == (True, {"status": "ok", "ready_channels": ["feishu"]})
    state["running"] = False
    assert metrics.health()[0] is False
    text = metrics.exposition().decode()
    assert 'taskcard_queue_depth{channel="telegram",chat="-100"} 2.0' in text
    assert 'taskcard_notices{state="pending"} 1.0' in text
    assert "taskcard_agents_faulted 1.0" in text


def test_sd_notify_sends_one_datagram_to_the_socket(tmp_path: Path) -> None:
    path = tmp_path / "notify"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as server:
        server.bind(str(path))
        server.settimeout(30)
        assert sd_notify(READY, {"NOTIFY_SOCKET": str(path)})
        assert server.recv(256) == b"READY=1"


def test_sd_notify_reaches_an_abstract_socket() -> None:
    name = f"taskcard-test-{uuid.uuid4().hex}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as server:
        server.bind("\0" + name)
        server.settimeout(30)
        assert sd_notify(STOPPING, {"NOTIFY_SOCKET": "@" + name})
        assert server.recv(256) == b"STOPPING=1"


def test_sd_notify_without_systemd_sends_nothing_and_a_dead_socket_is_not_fatal(
    tmp_path: Path,
) -> None:
    assert sd_notify(READY, {}) is False
    assert sd_notify(READY, {"NOTIFY_SOCKET": str(tmp_path / "nobody")}) is False
