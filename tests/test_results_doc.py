"""benchmarks/RESULTS.md opens with one table of the current figure of every benchmark.

A reader looking for "how fast is X" finds it in the first screen, with what
it was measured by, on which machine, when and at which commit; the history
lives in benchmarks/HISTORY.md.
"""

from __future__ import annotations

import re
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"
RESULTS = BENCH / "RESULTS.md"
COLUMNS = ("benchmark", "command", "machine", "date", "commit")


def _first_table(text: str) -> tuple[list[str], list[list[str]], int]:
    """(header cells, row cells, line number of the header) of the document's first table."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("|"))
    table = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        table.append([c.strip() for c in line.strip().strip("|").split("|")])
    header, rule, *rows = table
    assert all(set(c) <= set("-: ") for c in rule), f"line {start + 2} is not a table rule"
    return [c.lower() for c in header], rows, start


def _column(header: list[str], name: str) -> int:
    found = [i for i, c in enumerate(header) if c.startswith(name)]
    assert found, f"RESULTS.md's first table has no {name!r} column: {header}"
    return found[0]


def test_every_benchmark_script_has_a_current_figure_at_the_top() -> None:
    text = RESULTS.read_text(encoding="utf-8")
    header, rows, start = _first_table(text)
    assert start < 30, f"the figures table starts on line {start + 1}, not at the top"
    first_col = _column(header, "benchmark")
    named = {m for row in rows for m in re.findall(r"bench_\w+\.py", row[first_col])}
    scripts = {p.name for p in BENCH.glob("bench_*.py")}
    assert scripts, "no benchmarks/bench_*.py found"
    assert not scripts - named, f"benchmarks with no row in RESULTS.md's table: {sorted(scripts - named)}"
    assert not named - scripts, f"rows naming scripts that do not exist: {sorted(named - scripts)}"


def test_every_row_says_how_where_and_when() -> None:
    header, rows, _ = _first_table(RESULTS.read_text(encoding="utf-8"))
    at = {name: _column(header, name) for name in COLUMNS}
    for row in rows:
        assert len(row) == len(header), f"row has {len(row)} cells, header {len(header)}: {row}"
        what = row[at["benchmark"]]
        command, machine = row[at["command"]], row[at["machine"]]
        assert re.search(r"`[^`]*(benchmarks|scripts)/[\w-]+(\.py)?", command), (what, command)
        for path in re.findall(r"((?:benchmarks|scripts)/[\w-]+(?:\.py)?)", command):
            assert (BENCH.parent / path).exists(), f"{what}: the command names {path}, not in the tree"
        assert len(machine) > 3, (what, machine)
        assert re.search(r"\b20\d\d-\d\d-\d\d\b", row[at["date"]]), (what, row[at["date"]])
        assert re.fullmatch(r"`?[0-9a-f]{7,40}`?", row[at["commit"]]), (what, row[at["commit"]])


def test_the_history_is_one_link_away() -> None:
    head = RESULTS.read_text(encoding="utf-8").splitlines()[:8]
    assert any("HISTORY.md" in line for line in head), "RESULTS.md does not point at HISTORY.md"
    assert (BENCH / "HISTORY.md").exists()
