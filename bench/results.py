"""Figures, the printed table, and the append-only record in `bench/RESULTS.md`."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from bench.measure import Machine

RESULTS_PATH = Path(__file__).resolve().parent / "RESULTS.md"


@dataclass(frozen=True)
class Figure:
    """One measured figure, its target (if any) and the polling baseline's figure.

    `passed` is None when the figure has no target of its own. `ratio` is ours divided by the
    baseline's: below 1 is better for every figure where less is better.
    """

    name: str
    value: float | None
    unit: str
    target: str = ""
    passed: bool | None = None
    baseline: float | None = None
    note: str = ""

    @property
    def ratio(self) -> float | None:
        if self.value is None or self.baseline is None or math.isnan(self.baseline):
            return None
        if self.baseline == 0:
            return None if self.value != 0 else 1.0
        return self.value / self.baseline


@dataclass
class ScenarioResult:
    scenario: str
    setup: str
    figures: list[Figure] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    wall_s: float = 0.0


def _number(value: float | None) -> str:
    if value is None:
        return "-"
    if math.isnan(value):
        return "n/a"
    if math.isinf(value):
        return "∞"
    if value == int(value) and abs(value) < 1e9:
        return f"{int(value)}"
    if abs(value) >= 100:
        return f"{value:.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    return f"{value:.3g}"


def _verdict(figure: Figure) -> str:
    if figure.passed is None:
        return ""
    return "pass" if figure.passed else "MISS"


def _ratio(figure: Figure) -> str:
    ratio = figure.ratio
    if ratio is None:
        return "-"
    return f"×{ratio:.2g}" if ratio < 10 else f"×{ratio:.0f}"


def rows(result: ScenarioResult) -> list[list[str]]:
    return [
        [
            result.scenario,
            f.name,
            f"{_number(f.value)} {f.unit}".strip(),
            f.target,
            _verdict(f),
            f"{_number(f.baseline)} {f.unit}".strip() if f.baseline is not None else "-",
            _ratio(f),
        ]
        for f in result.figures
    ]


HEADER = ["scenario", "figure", "taskcard", "target", "", "baseline", "ratio"]


def table(results: Sequence[ScenarioResult]) -> str:
    """A plain-text table for the terminal."""
    body = [HEADER] + [row for result in results for row in rows(result)]
    widths = [max(len(row[i]) for row in body) for i in range(len(HEADER))]
    lines = [
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True))
        for row in body
    ]
    lines.insert(1, "  ".join("-" * width for width in widths))
    return "\n".join(lines)


def markdown(
    results: Sequence[ScenarioResult],
    *,
    when: datetime,
    host: Machine,
    revision: str,
    mode: str,
    command: str,
) -> str:
    lines = [
        f"## {when.astimezone(UTC):%Y-%m-%d %H:%M} UTC · {mode} · revision {revision}",
        "",
        f"- Machine: {host.describe()}.",
        f"- Command: `{command}`; ratio = taskcard / polling baseline (below 1 is better "
        "where less is better).",
        "",
        "| " + " | ".join(h or "verdict" for h in HEADER) + " |",
        "|" + "---|" * len(HEADER),
    ]
    for result in results:
        for row in rows(result):
            lines.append("| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |")
    lines.append("")
    for result in results:
        lines.append(f"**{result.scenario}** ({result.wall_s:.0f} s): {result.setup}")
        lines.extend(f"- {note}" for note in result.notes)
        lines.extend(f"- {f.name}: {f.note}" for f in result.figures if f.note)
        lines.append("")
    return "\n".join(lines) + "\n"


def append_results(text: str, path: Path = RESULTS_PATH) -> None:
    if not path.exists():
        path.write_text(
            "# Benchmark results\n\n"
            "Appended by `python -m bench` (`make bench`); newest last. How each figure is "
            "measured: `bench/__init__.py` and each scenario module's docstring.\n\n"
        )
    with path.open("a", encoding="utf-8") as out:
        out.write(text)
