"""The files in deploy/ agree with the command line and with what the service writes.

They are only read by systemd and compose, so nothing else notices when the product moves on
under them: the unit's command must parse with the real CLI, the example configuration must
validate, and every place the service writes (its state directory, each agent's `inbox/`)
must be writable in the unit's sandbox and in the containers' mounts.
"""

from __future__ import annotations

import configparser
import re
import shlex
import tomllib
from pathlib import Path, PurePosixPath

import pytest

from taskcard.bridge.cli import build_parser
from tests.e2e.harness import ROOT, placeholder_secrets, run_cli

DEPLOY = ROOT / "deploy"


def unit() -> configparser.ConfigParser:
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read(DEPLOY / "taskcard.service")
    return parser


def workdirs(config: Path) -> list[PurePosixPath]:
    data = tomllib.loads(config.read_text())
    return [PurePosixPath(agent["workdir"]) for agent in data.get("agents", [])]


def test_the_unit_runs_a_command_the_cli_accepts() -> None:
    command = shlex.split(unit()["Service"]["ExecStart"])
    args = build_parser().parse_args(command[1:])
    assert args.command == "serve" and args.config == "/etc/taskcard/taskcard.toml"


SHIPPED_CONFIGS = sorted([*DEPLOY.glob("*.toml"), *(ROOT / "config").glob("*.toml")])


@pytest.mark.parametrize("config", SHIPPED_CONFIGS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_shipped_configuration_validates(
    config: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each example a reader copies passes both checks an operator runs on it (`serve
    --check` with the secret variables it names set, as they are where it runs), without a
    warning: a copy of it must not start with a complaint about itself."""
    assert len(SHIPPED_CONFIGS) >= 3
    result = run_cli("config", "check", str(config))
    assert result.returncode == 0, result.stderr
    assert "warning" not in result.stderr, result.stderr
    for variable, value in placeholder_secrets(config).items():
        monkeypatch.setenv(variable, value)
    result = run_cli("serve", "--config", str(config), "--check")
    assert result.returncode == 0, result.stderr
    assert "warning" not in result.stderr, result.stderr


def test_the_unit_lets_the_service_write_its_state_and_the_agents_inbox() -> None:
    """`/tell` writes the text into the agent's `inbox/`: under `ProtectSystem=strict` the
    workdirs must be listed in `ReadWritePaths=`, or every /tell answers "failed"."""
    service = unit()["Service"]
    config = tomllib.loads((DEPLOY / "taskcard.toml").read_text())
    assert config["state_dir"] == f"/var/lib/{service['StateDirectory']}"
    writable = [PurePosixPath(p.lstrip("-")) for p in service["ReadWritePaths"].split()]
    for workdir in workdirs(DEPLOY / "taskcard.toml"):
        assert any(workdir.is_relative_to(root) for root in writable), workdir


@pytest.mark.parametrize(
    ("compose", "config"),
    [("compose.yaml", "taskcard.toml"), ("compose.cluster.yaml", "taskcard.cluster.toml")],
)
def test_the_containers_mount_the_agents_writable(compose: str, config: str) -> None:
    mounts = re.findall(
        r"^\s*- (/[^:\s]+):(/[^:\s]+)(:ro)?\s*(?:#.*)?$", (DEPLOY / compose).read_text(), re.M
    )
    assert mounts, compose
    for workdir in workdirs(DEPLOY / config):
        holding = [m for m in mounts if workdir.is_relative_to(PurePosixPath(m[1]))]
        assert holding, f"{compose}: no mount holds {workdir}"
        assert all(not read_only for _host, _inside, read_only in holding), (compose, workdir)


def test_the_image_checks_health_where_the_example_configuration_listens() -> None:
    listen = tomllib.loads((DEPLOY / "taskcard.toml").read_text())["metrics"]["listen"]
    healthcheck = re.search(
        r"urlopen\('http://([^/]+)/healthz'", (DEPLOY / "Containerfile").read_text()
    )
    assert healthcheck is not None and healthcheck.group(1) == listen
