"""The Makefile's venv, as a newcomer's first `make run` and a later `make` find it.

pip itself is a stand-in here (a script at `.venv/bin/pip` that records its arguments and
passes on build backend warnings the way pip does for a local folder): a real install needs
the package index, and what is checked is what `make` hands pip and shows of it.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

from tests.e2e.harness import ROOT

STAND_IN_PIP = """\
#!{python}
import json, os, pathlib, shutil, sys, warnings

class BuildBackendWarning(UserWarning):
    pass

with open({log!r}, "a") as log:
    log.write(json.dumps(sys.argv[1:]) + "\\n")
# What setuptools warns on every editable install, and one other warning, passed on by pip
# as it does for a local folder (warnings.warn_explicit with the backend's file and line).
warnings.warn_explicit(
    "Editable installation.\\n!!\\nPlease be careful with folders in your working directory"
    " with the same name as your package as they may take precedence during imports.",
    BuildBackendWarning, "setuptools/command/editable_wheel.py", 354,
)
warnings.warn_explicit("a backend's other warning", BuildBackendWarning, "backend.py", 1)
# An editable install takes the place of a copy installed before.
for copy in pathlib.Path(".venv/lib").glob("python*/site-packages/taskcard"):
    shutil.rmtree(copy)
"""


def _checkout(tmp_path: Path) -> tuple[Path, Path]:
    """A folder with the checkout's Makefile and pyproject.toml, a `.venv` whose pip is the
    stand-in, both stamps up to date; and the stand-in's log."""
    folder = tmp_path / "checkout"
    (folder / ".venv" / "bin").mkdir(parents=True)
    for name in ("Makefile", "pyproject.toml"):
        shutil.copy(ROOT / name, folder / name)
    log = tmp_path / "pip.log"
    pip = folder / ".venv" / "bin" / "pip"
    pip.write_text(STAND_IN_PIP.format(python=sys.executable, log=str(log)))
    pip.chmod(0o755)
    for stamp in (".installed-run", ".installed-dev"):
        (folder / ".venv" / stamp).touch()
    return folder, log


def _make(folder: Path, target: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["make", "--no-print-directory", "-C", str(folder), target],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _pip_calls(log: Path) -> list[list[str]]:
    if not log.exists():
        return []
    return [json.loads(line) for line in log.read_text().splitlines()]


def test_the_first_install_shows_pip_warnings_but_not_the_editable_one(tmp_path: Path) -> None:
    """The first `make run` printed setuptools' "Editable installation ... Please be careful
    with folders in your working directory with the same name as your package" (the folder is
    the package itself here). It is left out by its words; any other warning still shows."""
    folder, log = _checkout(tmp_path)
    (folder / ".venv" / ".installed-run").unlink()
    done = _make(folder, ".venv/.installed-run")
    assert done.returncode == 0, done.stdout + done.stderr
    assert _pip_calls(log) == [["install", "--quiet", "-e", "."]]
    assert "a backend's other warning" in done.stderr
    assert "Editable installation" not in done.stderr  # stdout: the command make echoes
    assert "same name as your package" not in done.stdout + done.stderr


def test_a_copy_installed_into_the_venv_is_replaced_by_the_editable_install(
    tmp_path: Path,
) -> None:
    """docs/operators.md once installed with `pip install .` into the checkout's `.venv`: after
    `make run` that left a copy of the package which no later edit reached, while the stamp
    said the venv was set up, so `make` never installed again. The next target now finds the
    copy, says so, and installs the checkout editable; after that it has nothing to do."""
    folder, log = _checkout(tmp_path)
    assert _make(folder, ".venv/.installed-run").returncode == 0
    assert _pip_calls(log) == []  # set up: nothing to do

    copy = folder / ".venv" / "lib" / "python3.11" / "site-packages" / "taskcard"
    copy.mkdir(parents=True)
    (copy / "__init__.py").write_text("")
    done = _make(folder, ".venv/.installed-run")
    assert done.returncode == 0, done.stdout + done.stderr
    assert ".venv holds a copy of taskcard, not this checkout" in done.stdout
    assert _pip_calls(log) == [["install", "--quiet", "-e", "."]]

    again = _make(folder, ".venv/.installed-run")
    assert again.returncode == 0, again.stdout + again.stderr
    assert "holds a copy" not in again.stdout
    assert len(_pip_calls(log)) == 1

    copy.mkdir(parents=True)  # and for the development tools' target alike
    (copy / "__init__.py").write_text("")
    dev = _make(folder, ".venv/.installed-dev")
    assert dev.returncode == 0, dev.stdout + dev.stderr
    assert _pip_calls(log)[-1] == ["install", "--quiet", "-e", ".[dev]"]
