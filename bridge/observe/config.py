"""The `[metrics]` section: where the metrics and health listener binds, if anywhere."""

from __future__ import annotations

import ipaddress
import re

from pydantic import BaseModel, ConfigDict, Field, field_validator

# Letters, digits, hyphens inside, and underscores: container and compose service names
# (`metrics_proxy`) carry them and the resolvers of those networks answer for them.
_HOST_LABEL = re.compile(r"(?!-)[A-Za-z0-9_-]{1,63}(?<!-)")


def _ascii_host(host: str) -> str:
    """`host` as the resolver is asked for it (a name in another script, `münchen.example`, in
    its IDNA form), without a final dot; empty when it has no such form."""
    try:
        return host.removesuffix(".").encode("idna").decode("ascii")
    except UnicodeError:
        return ""


def _is_ipv4(host: str) -> bool:
    try:
        ipaddress.IPv4Address(host)
    except ValueError:
        return False
    return True


def parse_listen(value: str) -> tuple[str, int]:
    """`host:port` (`[v6]:port` for IPv6) as a (host, port) pair; ValueError names the fix.

    A URL (`http://127.0.0.1:9464`, the address as a browser shows it) was told to put an
    IPv6 address in brackets, and a host no resolver takes (`my host:9464`) passed the check
    and stopped `serve` at the bind instead: both are refused here with what to write.
    """
    scheme, sep, rest = value.partition("://")
    if sep:
        address = rest.split("/", 1)[0].rpartition("@")[2]  # never a user:password@
        example = address if address and not address.startswith(":") else "127.0.0.1:9464"
        raise ValueError(
            f"{value!r} is a URL; give only host:port, without {scheme}:// or a path"
            f' (e.g. "{example}"): the listener serves /metrics and /healthz there'
        )
    if "@" in value:
        # `user:password@host:port`: never quoted back, the part before the @ may be a
        # password (it was, whole, in "put an IPv6 address in brackets").
        address = value.rpartition("@")[2] or "127.0.0.1:9464"
        raise ValueError(
            "holds a user or password (before an @), which a listen address does not take;"
            f' give only host:port (e.g. "{address}"); the listener asks no password, so'
            " bind it to loopback or guard the port"
        )
    host, sep, port_text = value.rpartition(":")
    if not sep or not host:
        raise ValueError(f'{value!r} is not host:port; write for example "127.0.0.1:9464"')
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise ValueError(f"{value!r}: {host!r} is not an IPv6 address") from None
    elif ":" in host:
        raise ValueError(f'{value!r}: put an IPv6 address in brackets, as "[::1]:9464"')
    elif not all(_HOST_LABEL.fullmatch(label) for label in _ascii_host(host).split(".")):
        raise ValueError(
            f"{value!r}: {host!r} is not an IP address or host name; write for example"
            ' "127.0.0.1:9464" (this machine only) or "0.0.0.0:9464" (every address)'
        )
    elif _ascii_host(host).split(".")[-1].isdigit() and not _is_ipv4(host):
        # `"5:9464"`, `"127.1:9464"`: no host name ends in a number; the resolver reads them
        # as the IPv4 shorthand (0.0.0.5), so they passed and failed only at the bind.
        raise ValueError(
            f"{value!r}: {host!r} is not a full IPv4 address (no host name ends in a number);"
            ' write all four numbers, e.g. "127.0.0.1:9464" (this machine only) or'
            ' "0.0.0.0:9464" (every address)'
        )
    if not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
        raise ValueError(f"{value!r}: the port must be a number from 1 to 65535")
    return host, int(port_text)


class MetricsConfig(BaseModel):
    """Opt-in: without `listen`, the service opens no port for metrics."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)

    listen: str | None = Field(
        default=None,
        description=(
            'host:port serving Prometheus /metrics and /healthz (e.g. "127.0.0.1:9464"); '
            "unset: no listener. Bind to loopback unless a firewall guards the port."
        ),
    )

    @field_validator("listen")
    @classmethod
    def _check_listen(cls, value: str | None) -> str | None:
        if value is not None:
            parse_listen(value)
        return value

    @property
    def address(self) -> tuple[str, int] | None:
        return None if self.listen is None else parse_listen(self.listen)
