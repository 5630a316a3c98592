"""The import rules that the packages' docstrings state, enforced by reading the imports.

Each package's `__init__` docstring has one sentence `May import: ...` naming, in backticks,
the project modules its code may import (a `*` matches one dotted part). The rule covers the
package's own modules and every subpackage without a rule of its own; a package may always
import itself. Imports of the standard library and third-party packages are not checked here.
Without this test the layering would drift silently: nothing else fails when, say, the
scheduler starts importing the service.
"""

from __future__ import annotations

import ast
import fnmatch
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PROJECT_PACKAGES = ("bridge", "channels", "producers")
_RULE = re.compile(r"May import[^:]*:(.*?)(?:\.\s|\.$)", re.DOTALL)
_TOKEN = re.compile(r"`([a-z_*][a-z_.*]*)`")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _rule_of(package_dir: Path) -> tuple[str, ...] | None:
    init = package_dir / "__init__.py"
    if not init.exists():
        return None
    docstring = ast.get_docstring(ast.parse(init.read_text(encoding="utf-8"))) or ""
    match = _RULE.search(docstring)
    if match is None:
        return None
    return tuple(
        token for token in _TOKEN.findall(match.group(1)) if token.split(".")[0] in PROJECT_PACKAGES
    )


def _governing_rule(path: Path) -> tuple[str, tuple[str, ...]]:
    """The nearest package (upwards) that states a rule, and the rule."""
    folder = path.parent
    while folder != ROOT:
        rule = _rule_of(folder)
        if rule is not None:
            return _module_name(folder / "__init__.py"), rule
        folder = folder.parent
    raise AssertionError(f"{path.relative_to(ROOT)}: no package above it states `May import:`")


def _imports(path: Path) -> list[tuple[int, str]]:
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module))
    project = [(line, name.removeprefix("taskcard.")) for line, name in found]
    return [(line, name) for line, name in project if name.split(".")[0] in PROJECT_PACKAGES]


def _allowed(name: str, package: str, rule: tuple[str, ...]) -> bool:
    for pattern in (package, *rule):
        if fnmatch.fnmatchcase(name, pattern) or fnmatch.fnmatchcase(name, pattern + ".*"):
            return True
    return False


def _project_modules() -> list[Path]:
    return sorted(p for package in PROJECT_PACKAGES for p in (ROOT / package).rglob("*.py"))


@pytest.mark.parametrize("path", _project_modules(), ids=lambda p: str(p.relative_to(ROOT)))
def test_imports_follow_the_package_rule(path: Path) -> None:
    package, rule = _governing_rule(path)
    wrong = [
        f"line {line}: {name}" for line, name in _imports(path) if not _allowed(name, package, rule)
    ]
    assert not wrong, f"{package} may import only {rule or '(nothing else)'}; found {wrong}"


def test_the_rule_parser_reads_what_a_docstring_states(tmp_path: Path) -> None:
    """The checker itself: a rule is read up to the sentence's end, and breaking it fails."""
    assert _RULE.search("May import: `bridge.store.sqlite`, `channels.base`. Never `bridge.run`.")
    match = _RULE.search("May import: `bridge.store.sqlite`, `channels.base`. Never `bridge.run`.")
    assert match is not None
    assert _TOKEN.findall(match.group(1)) == ["bridge.store.sqlite", "channels.base"]
    assert _allowed("producers.task_card.contract", "bridge.watch", ("producers.*.contract",))
    assert not _allowed("producers.task_card.host", "bridge.watch", ("producers.*.contract",))
    assert not _allowed("bridge.run.service", "bridge.schedule", ("bridge.store.sqlite",))
    assert _allowed("bridge.schedule.ratelimit", "bridge.schedule", ("bridge.store.sqlite",))


def _import_graph() -> dict[str, set[str]]:
    """Project module -> project modules it imports (at any depth of its code)."""
    modules = {_module_name(path): path for path in _project_modules()}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        targets: set[str] = set()
        for _, imported in _imports(path):
            # `from a.b import c` may name the module a.b.c or a name in a.b.
            while imported and imported not in modules:
                imported = imported.rpartition(".")[0]
            if imported and imported != name:
                targets.add(imported)
        graph[name] = targets
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected group of more than one module (Tarjan), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph.get(node, ()):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            group: list[str] = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_module_imports_itself_through_others() -> None:
    """An import cycle (demo -> serve_cli -> demo, once) makes the load order matter and the
    two modules one: each module's imports must form a tree over the others."""
    package_inits = {name for name in _import_graph() if "." not in name}
    graph = {
        name: {t for t in targets if t not in package_inits}
        for name, targets in _import_graph().items()
    }
    assert _cycles(graph) == []


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []
