"""What the README and docs/ give a reader to copy works as written.

Nothing else runs these lines: a name that moves or a step that is left out fails here,
not for the first person who pastes it.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import itertools
import json
import os
import re
import shlex
import subprocess
import sys
import textwrap
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from taskcard.producers.task_card.client import request_host
from taskcard.producers.task_card.runtime import HostPaths
from tests.e2e.harness import ROOT, placeholder_secrets, run_cli

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

# `taskcard.producers.ledger.Ledger(path)`: a name the reader is told to call from Python.
PYTHON_CALL = re.compile(r"`(taskcard(?:\.[A-Za-z_]\w*)+)\(")


def test_every_python_call_the_docs_name_imports_outside_the_checkout(tmp_path: Path) -> None:
    """The README said `producers.task_card.capability.TaskCard(...)`: only the `taskcard`
    package is installed, so that import fails anywhere but the repository's root."""
    names = sorted({m.group(1) for doc in DOCS for m in PYTHON_CALL.finditer(doc.read_text())})
    assert len(names) >= 3, names
    script = (
        "import importlib, sys\n"
        "for name in sys.argv[1:]:\n"
        "    module, _, attribute = name.rpartition('.')\n"
        "    getattr(importlib.import_module(module), attribute)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, *names],
        cwd=tmp_path,  # not the checkout: its top-level folders are not importable there
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    bare = [
        m for doc in DOCS for m in re.findall(r"From Python:?\s+`(producers\.\S+)", doc.read_text())
    ]
    assert bare == [], "write the installed name, taskcard.producers..."


def test_the_operators_first_card_runs_as_written(tmp_path: Path, runtime_dir: Path) -> None:
    """docs/operators.md, "Prepare one agent to watch": it started a renderer.py that no
    step had written."""
    text = (ROOT / "docs" / "operators.md").read_text()
    block = text.split("Prepare one agent to watch", 1)[1].split("```sh\n", 1)[1]
    block = block.split("```", 1)[0].replace(".venv/bin/taskcard", "taskcard")
    runtime = runtime_dir
    bin_dir = Path(sys.executable).parent
    env = {
        **os.environ,
        "HOME": str(tmp_path),
        "TASKCARD_RUNTIME_DIR": str(runtime),
        "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
    }
    workdir = tmp_path / "agents" / "builder"
    try:
        done = subprocess.run(
            ["sh", "-ec", block], env=env, capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0, done.stdout + done.stderr
        assert (workdir / "taskcard" / "status").read_text() == "active"
        assert (workdir / "taskcard" / "taskcard.md").read_text().startswith("# Build")
    finally:
        subprocess.run(
            ["taskcard", "card", "remove", "--workdir", str(workdir)],
            env=env,
            capture_output=True,
            timeout=120,
            check=False,
        )
        with contextlib.suppress(OSError, ValueError):  # the host started by `card start`
            request_host(HostPaths(runtime, workdir.resolve()), {"op": "shutdown"}, 5.0)


ARCHITECTURE = ROOT / "docs" / "architecture.md"
PACKAGES = ("bridge", "channels", "producers")
_TABLE_ROW = re.compile(r"^\| *(`[^|]+`) *\| *([^|]+) \|", re.M)
_NAME = re.compile(r"`([^`]+)`")


def _table_rows(heading: str, doc: Path = ARCHITECTURE) -> list[tuple[list[str], str]]:
    """The rows of the first table after `heading` in `doc`: the names in backticks of the
    first cell, and the second cell's text."""
    section = doc.read_text().split(heading, 1)[1].split("\n\n|", 1)[1]
    table = "|" + section.split("\n\n", 1)[0]
    return [(_NAME.findall(first), second) for first, second in _TABLE_ROW.findall(table)]


def test_the_data_path_table_names_every_module_of_each_step() -> None:
    """docs/architecture.md's table of `bridge/` is the newcomer's map: it left out
    `track/files.py`, `observe/config.py`, `run/heap.py` and `run/stackdump.py`."""
    _assert_the_table_maps("one subpackage per step:", "bridge")


def _assert_the_table_maps(heading: str, top: str, *, mapped_elsewhere: str = "") -> None:
    """The table under `heading` has a row per package of `top/` naming all its modules."""
    rows = _table_rows(heading)
    packages = {names[0]: set(_NAME.findall(modules)) for names, modules in rows}
    on_disk = {p.name for p in (ROOT / top).iterdir() if (p / "__init__.py").exists()}
    assert set(packages) == on_disk
    for package, named in packages.items():
        if package == mapped_elsewhere:
            continue
        modules = {p.name for p in (ROOT / top / package).glob("*.py")} - {"__init__.py"}
        assert named == modules, f"{top}/{package}: the table says {sorted(named)}"


def test_the_channel_table_names_every_module_of_each_transport() -> None:
    """docs/architecture.md mapped every module of `bridge/` and none of `channels/`: a
    newcomer looking for where Feishu's rich posts are read (`content.py`) or Telegram's
    rate scopes are built (`scopes.py`) found no row."""
    _assert_the_table_maps("### The channels", "channels")


def test_the_producer_table_names_every_module_of_each_package() -> None:
    """Only `producers/task_card/` had a map of its modules (docs/producer.md); the ledger's,
    the reports', the inbox's and the hooks' were named nowhere in the docs."""
    # task_card's own table is docs/producer.md's, checked below
    _assert_the_table_maps("### The producers", "producers", mapped_elsewhere="task_card")


def test_the_layering_table_states_each_package_rule() -> None:
    """The table promised `channels.aio` to the Feishu channel, whose rule (the one
    tests/test_layering.py enforces) does not allow it."""
    from tests.test_layering import _rule_of

    checked = 0
    for names, allowed in _table_rows("### Layers and what each may import"):
        stated = {name for name in _NAME.findall(allowed) if "." in name or name in PACKAGES}
        if not stated or any("*" in name for name in names):
            continue  # "each other", `producers.*`: said in words
        for name in names:
            folder = ROOT.joinpath(*name.split("."))
            rule = _rule_of(folder if folder.is_dir() else folder.parent)
            assert rule is not None, name
            assert set(rule) == stated, f"{name}: the table says {sorted(stated)}"
            checked += 1
    assert checked >= 15, checked


def test_the_producer_module_table_names_every_module() -> None:
    """docs/producer.md's table of `producers/task_card/` left out `contract.py`, the module
    the service reads through, and `workdir_arg.py`."""
    named = {
        name
        for names, _ in _table_rows("## Modules", ROOT / "docs" / "producer.md")
        for name in names
    }
    modules = {p.name for p in (ROOT / "producers" / "task_card").glob("*.py")} - {"__init__.py"}
    assert named == modules


def test_every_list_of_acknowledgement_vias_is_whole() -> None:
    """docs/reports.md listed the `via` values of `inbox/acks.jsonl` without Codex's three."""
    from taskcard.producers.inbox.contract import VIAS

    lists = [
        (doc, block)
        for doc in DOCS
        for block in re.findall(r"claude-code:PostToolUse.*?\bmcp\b", doc.read_text(), re.S)
    ]
    assert len(lists) >= 3, lists
    for doc, block in lists:
        named = re.findall(r"(?:claude-code|codex):\w+|inbox-cli|mcp", block)
        assert set(named) == VIAS, doc.name


def test_the_readme_lists_every_codex_hook_init_registers(tmp_path: Path) -> None:
    """README named six of the eight lifecycle hooks `init codex` writes."""
    home, workdir = tmp_path / "codex", tmp_path / "agent"
    home.mkdir()
    workdir.mkdir()
    done = subprocess.run(
        [sys.executable, "-m", "taskcard.bridge.cli", "init", "codex", "--workdir", str(workdir)],
        env={**os.environ, "CODEX_HOME": str(home)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    written = set(json.loads((home / "hooks.json").read_text())["hooks"])
    text = (ROOT / "README.md").read_text()
    listed = text.split("Its lifecycle hooks go", 1)[1].split(";", 1)[0]
    assert {name for name in _NAME.findall(listed) if "." not in name} == written


def test_every_runtime_dir_option_says_its_default() -> None:
    """README: every command's --help shows each option's default; `ledger supervise`'s
    `--runtime-dir` said only "where task card hosts live"."""
    import argparse

    from taskcard.bridge.cli import build_parser
    from taskcard.producers.task_card.runtime import RUNTIME_DIR_HELP

    found: list[str | None] = []

    def walk(parser: argparse.ArgumentParser) -> None:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub in action.choices.values():
                    walk(sub)
            elif "--runtime-dir" in action.option_strings:
                found.append(action.help)

    walk(build_parser())
    assert len(found) >= 10 and set(found) == {RUNTIME_DIR_HELP}, found


# Named in the docs but made by a command or by the operator, not shipped.
NOT_SHIPPED = {"ledger_renderer.py", "deploy/.env"}


def test_every_file_the_docs_name_exists() -> None:
    """A module or test the docs point a newcomer to must be there to read."""
    python_files = [
        p.relative_to(ROOT).as_posix()
        for folder in ("bridge", "channels", "producers", "tests", "bench")
        for p in (ROOT / folder).rglob("*.py")
    ]
    missing = []
    for doc in DOCS:
        for name in re.findall(
            r"`([\w./-]+\.py|(?:bridge|channels|producers|tests|deploy|config)/[\w./-]+)(?:::\w+)?`",
            doc.read_text(),
        ):
            if name in NOT_SHIPPED:
                continue
            if "/" in name:
                found = (ROOT / name).exists() or any(p.endswith("/" + name) for p in python_files)
            else:
                found = any(p.rsplit("/", 1)[-1] == name for p in python_files)
            if not found:
                missing.append(f"{doc.name}: {name}")
        for path, test in re.findall(r"`(tests/[\w/]+\.py)::(\w+)`", doc.read_text()):
            if f"def {test}(" not in (ROOT / path).read_text():
                missing.append(f"{doc.name}: {path}::{test}")
    assert missing == []


def test_the_spawn_depth_cap_range_is_the_one_enforced() -> None:
    """docs/reports.md gave the cap's default only; a --max-depth past 32 is refused."""
    from taskcard.producers.reports.lineage import DEFAULT_MAX_DEPTH, MAX_DEPTH_LIMIT

    text = " ".join((ROOT / "docs" / "reports.md").read_text().split())
    assert f"`--max-depth`, 1 to {MAX_DEPTH_LIMIT}, default {DEFAULT_MAX_DEPTH}" in text


def test_reports_md_gives_the_summary_limit_enforced() -> None:
    from taskcard.producers.reports.store import MAX_SUMMARY_CHARS

    text = " ".join((ROOT / "docs" / "reports.md").read_text().split())
    assert f"`summary` is at most {MAX_SUMMARY_CHARS} characters" in text


def test_ledger_md_gives_the_id_and_text_limits_enforced() -> None:
    from taskcard.producers.ledger.model import MAX_NOTE_CHARS, Ident

    text = " ".join((ROOT / "docs" / "ledger.md").read_text().split())
    assert f"are at most {MAX_NOTE_CHARS} characters" in text
    pattern = Ident.__metadata__[0].pattern
    assert pattern == r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,63}$", "then say the new rule in ledger.md"
    assert "1-64 letters, digits, `_`, `.`, `:` or `-`, starting with a letter or digit" in text


def test_producer_md_gives_the_mcp_line_limit_enforced() -> None:
    from taskcard.producers.task_card.mcp_wire import MAX_LINE_BYTES

    text = " ".join((ROOT / "docs" / "producer.md").read_text().split())
    assert f"at most 2 MiB (`mcp_wire.MAX_LINE_BYTES`, {MAX_LINE_BYTES:,} bytes" in text
    assert MAX_LINE_BYTES == 2 * 1024 * 1024


MAKE_TARGET = re.compile(r"`make ([a-z][\w-]*)")


def test_every_make_target_the_docs_or_phony_name_has_a_recipe() -> None:
    """`.PHONY` named `lint` and `typecheck` without a rule: `make lint` said "Nothing to be
    done" and checked nothing. Each phony target and each `make X` in the docs must do work."""
    makefile = (ROOT / "Makefile").read_text()
    phony = re.search(r"^\.PHONY:(.*)$", makefile, re.M)
    assert phony is not None
    named = {m.group(1) for doc in DOCS for m in MAKE_TARGET.finditer(doc.read_text())}
    targets = sorted(set(phony.group(1).split()) | named)
    assert {"run", "test", "lint", "typecheck"} <= set(targets), targets
    for target in targets:
        rule = re.search(rf"^{re.escape(target)}:(.*)\n((?:\t.*\n)*)", makefile, re.M)
        assert rule is not None, f"the Makefile has no rule for {target}"
        assert rule.group(1).strip() or rule.group(2), f"the rule for {target} does nothing"
    dry = subprocess.run(["make", "-n", "lint"], cwd=ROOT, capture_output=True, text=True)
    assert "ruff check" in dry.stdout, dry.stdout + dry.stderr


def test_a_single_file_run_has_the_timeout_of_make_test() -> None:
    """The README's one-file command (`.venv/bin/pytest FILE`) reads pyproject's timeout
    (120 s) while `make test`, and so `.ci/run`, passed `--timeout=300`: a test the loaded CI
    machine finished in 200 s timed out when run alone. The timeout lives in pyproject only;
    any command that names one names the same."""
    ini = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    for runner in (ROOT / "Makefile", ROOT / ".ci" / "run"):
        for given in re.findall(r"--timeout[= ](\d+)", runner.read_text()):
            assert int(given) == ini["timeout"], (runner.name, given, ini["timeout"])
    ci = (ROOT / ".ci" / "run").read_text()
    assert "make test" in ci, ci  # .ci/run is `make test`, whose pytest lines are read above


FILE_NAME = re.compile(r"\.(json|jsonl|py|md|toml|lock)$")  # `watch.json`, `signals.py`


def _config_node(prop: dict[str, Any], definitions: dict[str, Any]) -> dict[str, Any]:
    """The schema object a property of the config leads to (a table, or an array of tables),
    or an empty one for a plain value."""
    for node in [prop, *prop.get("anyOf", []), prop.get("items", {})]:
        for candidate in (node, node.get("items", {})):
            if "$ref" in candidate:
                found: dict[str, Any] = definitions[candidate["$ref"].rsplit("/", 1)[1]]
                return found
    return {}


def _is_config_key(path: list[str]) -> bool:
    from taskcard.bridge.config import config_json_schema

    schema = config_json_schema()
    node: dict[str, Any] = schema
    for part in path:
        properties = node.get("properties", {})
        if part not in properties:
            return False
        node = _config_node(properties[part], schema["$defs"])
    return True


def _toml_keys(value: object, path: list[str]) -> list[list[str]]:
    if isinstance(value, list):
        return [key for item in value for key in _toml_keys(item, path)]
    if not isinstance(value, dict):
        return []
    return [key for k, v in value.items() for key in [[*path, k], *_toml_keys(v, [*path, k])]]


def test_every_config_key_the_docs_name_is_a_key_of_the_file() -> None:
    """A key the docs tell an operator to set (`inbox.unconfirmed_after_s`, `[metrics] listen`,
    a TOML snippet) must be one the configuration takes: an unknown key stops the service."""
    from taskcard.bridge.config import config_json_schema

    sections = set(config_json_schema()["properties"])
    named: list[tuple[str, list[str]]] = []
    for doc in DOCS:
        text = doc.read_text()
        for dotted in re.findall(r"`([a-z_]+(?:\.[a-z_]+)+)`", text):
            if dotted.split(".")[0] in sections and not FILE_NAME.search(dotted):
                named.append((doc.name, dotted.split(".")))
        for table, key in re.findall(r"`\[([a-z_.]+)\]\s+([a-z_]+)", text):
            if table.split(".")[0] in sections:  # not Codex's `[features] hooks`
                named.append((doc.name, [*table.split("."), key]))
        for block in re.findall(r"```toml\n(.*?)```", text, re.S):
            named += [(doc.name, key) for key in _toml_keys(tomllib.loads(block), [])]
    assert len(named) >= 50, len(named)
    unknown = [f"{doc}: {'.'.join(path)}" for doc, path in named if not _is_config_key(path)]
    assert unknown == []


TOML_BLOCKS = [
    (doc, textwrap.dedent(block))
    for doc in DOCS
    for block in re.findall(r"```toml\n(.*?)```", doc.read_text(), re.S)
]


@pytest.mark.parametrize(
    "block",
    [block for _doc, block in TOML_BLOCKS],
    ids=[f"{doc.name}-{n}" for n, (doc, _block) in enumerate(TOML_BLOCKS)],
)
def test_every_toml_block_of_the_docs_passes_both_checks(
    block: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A snippet an operator copies into a file of its own (the minimal configurations, the
    `[metrics]`, `[discover]`, `origin_chats` and `[cluster]` tables) must be a configuration
    the service takes: `config check` and `serve --check`, its secret variables set, as the
    docs tell the operator to run them. The key test above reads only the keys' names."""
    assert len(TOML_BLOCKS) >= 6
    config = tmp_path / "taskcard.toml"
    config.write_text(block)
    result = run_cli("config", "check", str(config))
    assert result.returncode == 0, result.stderr
    for variable, value in placeholder_secrets(config).items():
        monkeypatch.setenv(variable, value)
    result = run_cli("serve", "--config", str(config), "--check")
    assert result.returncode == 0, result.stderr


def test_the_activity_log_contract_lists_each_kind_with_its_fields() -> None:
    """docs/architecture.md is where a script writing `logs/events.jsonl` by hand learns each
    kind's fields (`{origin?}` optional); `taskcard activity` refuses what it leaves out."""
    from taskcard.producers.task_card.activity_log import OPTIONAL_FIELDS, REQUIRED_FIELDS

    section = ARCHITECTURE.read_text().split("### `<workdir>/logs/events.jsonl`", 1)[1]
    section = section.split("\n### ", 1)[0]
    listed: dict[str, set[str]] = {}
    for first, second, fields in re.findall(
        r"`([a-z]+(?:\.[a-z]+)?)`(?: / `([a-z]+\.[a-z]+)`)? \{([^}]*)\}", section
    ):
        for kind in filter(None, (first, second)):
            listed[kind] = {field.strip() for field in fields.split(",")}
    expected = {
        kind: {*required, *(f"{name}?" for name in OPTIONAL_FIELDS.get(kind, {}))}
        for kind, required in REQUIRED_FIELDS.items()
    }
    assert listed == expected


def test_every_agent_file_the_service_reads_has_its_contract_in_architecture() -> None:
    """docs/architecture.md's "File contracts" left out `reports/reports.jsonl` and
    `lineage.json`, which the service follows for the report and wake signals."""
    from taskcard.bridge.track import files
    from taskcard.producers.ledger.contract import LEDGER_DIR, LEDGER_FILE

    read = [getattr(files, name) for name in dir(files) if name.endswith("_NAME")]
    assert len(read) >= 8, read
    contracts = ARCHITECTURE.read_text().split("\n## File contracts", 1)[1].split("\n## ", 1)[0]
    sections = [
        ({name.removeprefix("<workdir>/") for name in _NAME.findall(heading)}, body)
        for heading, body in re.findall(r"\n### ([^\n]+)\n((?:(?!\n### ).)*)", contracts, re.S)
    ]
    missing = []
    for path in [*read, f"{LEDGER_DIR}/{LEDGER_FILE}"]:
        folder, _, name = path.rpartition("/")
        if not any(
            path in named or (f"{folder}/" in named and re.search(f"`({folder}/)?{name}`", body))
            for named, body in sections
        ):
            missing.append(path)
    assert missing == []


def test_ledger_md_lists_the_event_types_and_failure_kinds_enforced() -> None:
    """The event types a checkpoint takes and the failure kinds, retried first or escalated at
    once, are what an agent or operator writes by hand from docs/ledger.md."""
    from taskcard.producers.ledger.model import EVENT_TYPES, FAILURE_KINDS, RETRYABLE_KINDS

    text = " ".join((ROOT / "docs" / "ledger.md").read_text().split())
    listed = text.split("`checkpoint --event-type` takes exactly ", 1)[1].split(";", 1)[0]
    assert set(re.findall(r"[A-Z_]{4,}", listed)) == set(EVENT_TYPES)
    kinds = text.split("Failure kinds: ", 1)[1].split(" (escalated at once)", 1)[0]
    retried, escalated = kinds.split(" (retried first), and ")
    assert set(re.findall(r"[A-Z_]{4,}", retried)) == RETRYABLE_KINDS
    assert set(re.findall(r"[A-Z_]{4,}", escalated)) == set(FAILURE_KINDS) - RETRYABLE_KINDS


# A command line the docs show: a line of a ```sh block whose command (at its start, or
# after `|`, `&&` or `;`) is taskcard, or a `taskcard ...` in backticks.
_SHELL_BREAKS = frozenset({"|", "||", "&&", ";", ">", ">>", "<", "2>", "&"})
# A word that stands for what the reader writes: `W`, `TASK`, `<workdir>`, `...`, `[TASK]`.
_PLACEHOLDER = re.compile(r"^(\.\.\.|[A-Z][A-Z0-9_-]*|<[^>]*>|\$\w+)$")


def _is_taskcard(word: str) -> bool:
    return word == "taskcard" or word.endswith("/bin/taskcard")


def _docs_shell_lines() -> list[tuple[str, list[str]]]:
    """Each taskcard command of a ```sh block of the docs (what a reader pastes), as the
    words after `taskcard`."""
    found: list[tuple[str, list[str]]] = []
    for doc in DOCS:
        for block in re.findall(r"```sh\n(.*?)```", doc.read_text(), re.S):
            for line in textwrap.dedent(block).replace("\\\n", " ").splitlines():
                words = shlex.split(line, comments=True)
                starts = [0] + [n + 1 for n, word in enumerate(words) if word in _SHELL_BREAKS]
                found += [
                    (doc.name, words[n + 1 :])
                    for n, word in enumerate(words)
                    # a path to the command is one wherever it stands (`systemd-run ... PATH`)
                    if (n in starts and word == "taskcard") or word.endswith("/bin/taskcard")
                ]
    return found


def _docs_command_lines() -> list[tuple[str, list[str]]]:
    """Each taskcard command line of the docs, as the words after `taskcard`: those of the
    ```sh blocks and each `taskcard ...` in backticks in the prose."""
    found = _docs_shell_lines()
    for doc in DOCS:
        prose = re.sub(r"```.*?```", "", doc.read_text(), flags=re.S)
        for span in re.findall(r"`([^`]+)`", prose):
            # an error message quoted from the CLI (`taskcard card start: argument ...`)
            if ": argument " in span:
                continue
            first = span.split(maxsplit=1)[0] if span.strip() else ""
            if _is_taskcard(first) and not span.startswith("/taskcard"):
                found.append((doc.name, shlex.split(span.replace("\\|", "|"))[1:]))
    return found


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    return {
        name: sub
        for action in parser._actions
        if isinstance(action, argparse._SubParsersAction)
        for name, sub in action.choices.items()
    }


def _options(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {option: action for action in parser._actions for option in action.option_strings}


def _command_line_mistakes(parser: argparse.ArgumentParser, words: list[str]) -> list[str]:
    """What in `words` (after `taskcard`) the parser does not know: a command, an option of
    the command it is given to, a value that is not one of the option's choices. Optional
    parts in brackets and alternatives (`init|checkpoint`) are checked each; placeholders
    pass."""
    mistakes: list[str] = []
    positionals = [a for a in parser._actions if not a.option_strings and a.choices]
    words = [w for word in words for w in [word.strip("[]")] if w]
    n = 0
    while n < len(words):
        word = words[n]
        n += 1
        if word in _SHELL_BREAKS:
            break
        if _PLACEHOLDER.match(word):
            continue
        if word.startswith("-") and word != "-":
            name, equals, value = word.partition("=")
            action = _options(parser).get(name)
            if action is None:
                mistakes.append(f"{parser.prog} has no option {name}")
                continue
            if action.nargs == 0:
                continue
            if not equals and n < len(words):
                value = words[n]
                n += 1
            choices = [str(choice) for choice in action.choices or ()]
            known = {choice.lower() for choice in choices}  # `--log-level DEBUG`: any case
            for one in value.split("|"):
                # a choice is often in capitals (`--kind TRANSIENT_NETWORK`): only the
                # option's own metavar stands for one
                stands_for = one in ("...", action.metavar, action.dest.upper())
                if known and not stands_for and one.lower() not in known:
                    mistakes.append(f"{parser.prog} {name}: {one} is not one of {choices}")
            continue
        commands = _subcommands(parser)
        if commands:
            alternatives = [one for one in word.split("|") if one != "..."]
            unknown = [one for one in alternatives if one not in commands]
            if unknown:
                mistakes.append(f"{parser.prog} has no command {' or '.join(unknown)}")
                break
            if len(alternatives) > 1:
                break  # `ledger init|checkpoint|...`: each is a command; no options follow
            parser = commands[word]
            positionals = [a for a in parser._actions if not a.option_strings and a.choices]
            continue
        if positionals:
            choices = [str(choice) for choice in positionals.pop(0).choices or ()]
            if word not in choices:
                mistakes.append(f"{parser.prog}: {word} is not one of {choices}")
    return mistakes


def test_every_command_line_the_docs_show_names_commands_and_options_that_exist() -> None:
    """A reader copies `taskcard ledger supervise --apply-supervision` or `taskcard reports
    --after 3` from the docs: a command renamed, an option dropped or a choice that changed
    would be a usage error for the first person who pastes it. Each line is read against
    the command line's own parser."""
    from taskcard.bridge.cli import build_parser

    parser = build_parser()
    lines = _docs_command_lines()
    assert len(lines) >= 100, len(lines)
    assert {words[0] for _doc, words in lines if words} >= {"serve", "card", "ledger", "inbox"}
    mistakes = [
        f"{doc}: taskcard {' '.join(words)}: {mistake}"
        for doc, words in lines
        for mistake in _command_line_mistakes(parser, words)
    ]
    assert mistakes == []


def _json_table_fields(cell: str) -> set[str]:
    """The field names a cell of the `status --json` table gives: each `name` before the
    first colon of a `;`-separated part (`route`, `channel`: strings; `opened_by`: ...)."""
    return {name for part in cell.split(";") for name in _NAME.findall(part.split(":", 1)[0])}


def test_the_status_json_table_names_every_field_status_prints(tmp_path: Path) -> None:
    """docs/operators.md's table of `taskcard status --json` is what a script reads it by: it
    left out the routes' `chat_view`, `chat_orchestrator`, `orchestrator` and `retired`,
    named only in passing in later sections."""
    section = (ROOT / "docs" / "operators.md").read_text().split("`--json` for scripts", 1)[1]
    lines = section.split("\n\n", 1)[1].splitlines()  # the table, indented in its list item
    rows = [line.strip() for line in lines[: next(n for n, x in enumerate(lines) if "|" not in x)]]
    table = {
        first.strip(" `").removesuffix("[]"): cell
        for first, cell in (row.strip("|").split("|", 1) for row in rows[2:])
    }
    (tmp_path / "agents" / "builder").mkdir(parents=True)
    config = tmp_path / "taskcard.toml"
    config.write_text(
        'state_dir = ".taskcard"\n'
        '[[agents]]\nid = "builder"\nworkdir = "agents/builder"\n'
        '[[agents]]\nid = "planner"\nworkdir = "agents/planner"\n'  # not made yet
    )
    result = run_cli("status", "--config", str(config), "--json")
    assert result.returncode == 0, result.stderr
    printed = json.loads(result.stdout)
    assert set(table) == set(printed)
    assert {len(printed["routes"]), len(printed["agents"])} == {2}
    for part in ("routes", "agents"):
        for item in printed[part]:
            assert _json_table_fields(table[part]) == set(item), part


def test_every_command_line_of_a_docs_shell_block_parses_whole(tmp_path: Path) -> None:
    """A line of a ```sh block is pasted as it stands: besides its names (above), its
    required arguments must be there and each value of the form its option reads. The
    agent's folder a line names (`~/agent`, `W`) stands for one that exists; lines with
    optional parts in brackets show a form, not a line to paste."""
    from taskcard.bridge.cli import build_parser

    parser = build_parser()
    folders = {
        option
        for action in _all_actions(parser)
        if action.dest.endswith("workdir") or action.dest == "only_in"
        for option in action.option_strings
    }
    lines = [(doc, words) for doc, words in _docs_shell_lines() if "[" not in " ".join(words)]
    assert len(lines) >= 30, len(lines)
    refused = []
    for doc, words in lines:
        given = list(itertools.takewhile(lambda word: word not in _SHELL_BREAKS, words))
        given = [
            str(tmp_path) if n and given[n - 1] in folders else word for n, word in enumerate(given)
        ]
        said = io.StringIO()
        try:
            with contextlib.redirect_stderr(said), contextlib.redirect_stdout(io.StringIO()):
                parser.parse_args(given)
        except SystemExit as stop:
            if stop.code:
                refused.append(f"{doc}: taskcard {' '.join(words)}: {said.getvalue().strip()}")
    assert refused == []


def _all_actions(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return [
        *parser._actions,
        *(action for sub in _subcommands(parser).values() for action in _all_actions(sub)),
    ]


# The docs show these as typed wrong on purpose: answered with the option likely meant.
MISTYPED_CHAT_COMMANDS = {"borad", "off please"}


def test_every_chat_command_the_docs_show_is_one_the_service_reads() -> None:
    """`/taskcard off|on|N`, `/taskcard orchestrator AGENT|off`: an option the docs give
    people to type must be one `/taskcard` takes, or it is answered as unknown. Each
    alternative is read (`N` as 1 and as 10, `AGENT` as a name)."""
    from taskcard.bridge.run.commands import parse_taskcard, suggestion, without_mentions

    shown = []
    for doc in DOCS:
        prose = re.sub(r"```.*?```", "", doc.read_text(), flags=re.S)
        shown += [
            (doc.name, " ".join(span.split()[1:]))
            for span in re.findall(r"`([^`]+)`", prose)
            if span.split()[0] == "/taskcard"
        ]
    assert len(shown) >= 60, len(shown)
    stand_in = {"N": ["1", "10"], "AGENT": ["planner"]}
    unread = []
    for doc, args in shown:
        if args in MISTYPED_CHAT_COMMANDS:
            assert parse_taskcard(args).action == "unknown" and suggestion(args), args
            continue
        if (kept := without_mentions(args)) is not None:  # shown answered as a mention
            assert parse_taskcard(kept).action != "unknown", args
            continue
        choices = [
            [one for word in alternatives.split("|") for one in stand_in.get(word, [word])]
            for alternatives in args.split()
        ]
        unread += [
            f"{doc}: /taskcard {' '.join(words)}"
            for words in itertools.product(*choices)
            if parse_taskcard(" ".join(words)).action == "unknown"
        ]
    assert unread == []


def test_a_redis_user_granted_the_operators_list_passes_the_start_and_serves(
    redis_url: str, prefix: str
) -> None:
    """docs/operators.md lists the Redis commands a cluster's ACL user needs. The list left
    out `HVALS` (every read of `/metrics`) and `EXISTS` (a Feishu reply checked against the
    messages the cluster posted), which such a user met only later, as NOPERM; then
    `UNWATCH`, which a change of the shared route book sends when the book has no version
    yet, so every origin route change failed."""
    import redis

    from taskcard.bridge.cluster.runtime import refused_permissions
    from taskcard.bridge.store.redis import RedisStore

    with operators_redis_user(redis_url, prefix) as user_url:
        client = redis.Redis.from_url(user_url, decode_responses=True)
        try:
            store = RedisStore(client, prefix)
            assert refused_permissions(store, "docs") == []
            assert store.notice_counts() == {}
            assert store.sent_any("feishu", ["om_1"], 0.0) is False
            for _ in range(2):  # a cursor with no version yet, then with one
                store.change_cursor("docs-book", lambda value: (value or "") + "x")
            assert store.get_cursor("docs-book") == "xx"
            assert store.cursor_keys("docs-") == ["docs-book"]  # HSCAN
            assert store.offset_agents() == set()  # HKEYS
        finally:
            client.close()


@contextlib.contextmanager
def operators_redis_user(redis_url: str, prefix: str) -> Iterator[str]:
    """The URL of a Redis user granted exactly the commands docs/operators.md lists for a
    cluster, on the keys and channels of `prefix`; the user is deleted at the end."""
    import redis

    text = " ".join((ROOT / "docs" / "operators.md").read_text().split())
    listed = text.split("and these commands: ", 1)[1].split(". Each start", 1)[0]
    commands = [name.lower() for name in re.findall(r"`([A-Z]+(?: [A-Z]+)?)`", listed)]
    assert {"ping", "incr", "script load"} <= set(commands), commands
    user, password = f"docs-{prefix}", "Pa55-docs"
    admin = redis.Redis.from_url(redis_url)
    try:
        grants = [f"+{name.replace(' ', '|')}" for name in commands]
        admin.execute_command(
            "ACL", "SETUSER", user, "on", f">{password}", "resetkeys", f"~{prefix}:*",
            "resetchannels", f"&{prefix}:*", "-@all", *grants,
        )  # fmt: skip
        yield redis_url.replace("redis://", f"redis://{user}:{password}@")
    finally:
        admin.execute_command("ACL", "DELUSER", user)
        admin.close()


def test_ledger_md_names_every_difference_of_the_mcp_tool_from_the_commands() -> None:
    """docs/ledger.md: the `ledger` tool takes the command line's options as fields, `_`
    for `-`, "with these differences". It left out `task_id` (the TASK argument) and
    `--runtime-dir`, which has no field."""
    from taskcard.bridge.cli import build_parser
    from taskcard.producers.ledger.mcp_tool import input_schema

    text = " ".join((ROOT / "docs" / "ledger.md").read_text().split())
    paragraph = text.split("serves a `ledger` tool", 1)[1].split("## The monitor", 1)[0]
    named = set(_NAME.findall(paragraph))
    fields = set(input_schema()["properties"])
    ledger = _subcommands(build_parser())["ledger"]
    options = {
        option
        for command in _subcommands(ledger).values()
        for action in command._actions
        for option in action.option_strings
        if option.startswith("--") and option != "--help"
    }
    as_fields = {option[2:].replace("-", "_") for option in options}
    unsaid = sorted(
        [option for option in options if option[2:].replace("-", "_") not in fields]
        + [field for field in fields - as_fields if field != "command"]
    )
    assert [name for name in unsaid if not any(name in said for said in named)] == []


def test_the_ledger_commands_run_as_written_and_the_card_knows_the_start(tmp_path: Path) -> None:
    """docs/ledger.md's block of commands, pasted in order in an agent's folder (each
    `[optional part]` left out, the owner's reply `A`): every one is taken, and the card of
    the task says how long ago it started. The block began with `init`, which records no
    start, so a reader who followed it had a card saying `started: unknown` for good."""
    block = re.search(r"```sh\n(.*?)```", (ROOT / "docs" / "ledger.md").read_text(), re.S)
    assert block is not None
    lines = [re.sub(r"\s*\[[^\]]*\]", "", line) for line in block[1].splitlines()]
    commands = [shlex.split(line.replace("A|B|C|D|E", "A"), comments=True) for line in lines]
    workdir = tmp_path / "agent"
    workdir.mkdir()
    for words in commands:
        assert words[0] == "taskcard", words
        done = run_cli(*words[1:3], "--workdir", str(workdir), *words[3:])
        assert done.returncode == 0, (words, done.stderr)
    card = run_cli("ledger", "render", "--workdir", str(workdir), "TASK")
    assert card.returncode == 0, card.stderr
    started = [line for line in card.stdout.splitlines() if line.startswith("started: ")]
    assert started and started != ["started: unknown"], card.stdout
