"""Per-rank series a notebook's kernel publishes, kept for the Jupyter server's ``/metrics``.

``%ddp_check --profile --metrics`` and ``torchlens.watch(..., metrics=True)``
run in the kernel, another process than the server; the kernel POSTs its
run's series to ``torchlens/monitor/metrics`` with the server's own token
(``frontends.shared.rank_channel``: the channel ``%ddp_check`` already uses for the
sidebar; no new port, no new secret), and a scrape of ``/metrics`` yields the
newest batch of every run (``prometheus.MonitorCollector``).

What a kernel may send is checked whole before it is kept, as the rank
samples are: only families of ``family_table`` (their type and help are the
server's), only the labels torchlens writes (``LABELS``), strings of bounded
length, finite numbers, the ``run`` label equal to the batch's run. A run
that has not posted for ``KEEP_S`` goes (an ended run's final figures stay
that long, so Prometheus scrapes how each rank ended); at most ``MAX_RUNS``.
"""

from __future__ import annotations

import math
import threading
import time
from typing import Any

from torchlens.analysis.ranks.metrics import Family
from torchlens.analysis.ranks.notebook_metrics import family_table

LABELS = frozenset(("run", "rank", "node", "host", "phase", "state", "cause", "le"))
SUFFIXES = {"histogram": ("_bucket", "_sum", "_count"), "counter": ("",), "gauge": ("",)}
MAX_TEXT = 200
#: 1,024 ranks of 36 series each fit; more is not a torchlens kernel
MAX_SAMPLES = 64 * 1024
MAX_RUNS = 16
KEEP_S = 600.0


def checked(body: Any) -> tuple[str, list[Family]]:
    """(run, families) of a POSTed batch; ValueError saying what is wrong."""
    if not isinstance(body, dict):
        raise ValueError("expected {'run': str, 'families': [{'name', 'samples'}]}")
    run, families = body.get("run"), body.get("families")
    if not isinstance(run, str) or not run or len(run) > MAX_TEXT:
        raise ValueError("'run' must be a string of 1 to 200 characters")
    if not isinstance(families, list):
        raise ValueError("'families' must be a list")
    table = _table()
    out, count = [], 0
    for f in families:
        name = f.get("name") if isinstance(f, dict) else None
        if name not in table:
            raise ValueError(f"unknown family {str(name)[:80]!r}")
        kind, text = table[f["name"]]
        family = Family(f["name"], kind, text)
        samples = f.get("samples")
        if not isinstance(samples, list):
            raise ValueError(f"{f['name']}: 'samples' must be a list")
        count += len(samples)
        if count > MAX_SAMPLES:
            raise ValueError(f"more than {MAX_SAMPLES} samples")
        for s in samples:
            family.samples.append(_sample(f["name"], kind, run, s))
        out.append(family)
    return run, out


def _sample(name: str, kind: str, run: str, s: Any) -> tuple[str, dict[str, str], float]:
    if not isinstance(s, list) or len(s) != 3:
        raise ValueError(f"{name}: a sample is [suffix, labels, value]")
    suffix, labels, value = s
    if suffix not in SUFFIXES[kind]:
        raise ValueError(f"{name}: suffix {str(suffix)[:20]!r} is not one of a {kind}")
    if not isinstance(labels, dict) or not set(labels) <= LABELS or (
            ("le" in labels) != (suffix == "_bucket")):
        raise ValueError(f"{name}: labels must be among {sorted(LABELS)} (le on buckets only)")
    if any(not isinstance(v, str) or len(v) > MAX_TEXT for v in labels.values()):
        raise ValueError(f"{name}: label values must be strings of at most {MAX_TEXT} characters")
    if labels.get("run") != run:
        raise ValueError(f"{name}: every sample's run label must be the batch's run")
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"{name}: values must be finite numbers")
    return suffix, dict(labels), float(value)


_TABLE: dict[str, tuple[str, str]] | None = None


def _table() -> dict[str, tuple[str, str]]:
    global _TABLE
    if _TABLE is None:
        _TABLE = family_table()
    return _TABLE


class NotebookRuns:
    """The newest batch of each run (a POST replaces its run's whole batch)."""

    def __init__(self, keep_s: float = KEEP_S) -> None:
        self.keep_s = keep_s
        self._runs: dict[str, tuple[float, list[Family]]] = {}
        self._lock = threading.Lock()

    def put(self, body: Any) -> int:
        """Keep a batch (``checked`` first); returns its sample count."""
        run, families = checked(body)
        with self._lock:
            self._runs[run] = (time.monotonic(), families)
            for old in sorted(self._runs, key=lambda r: self._runs[r][0])[:-MAX_RUNS]:
                del self._runs[old]
        return sum(len(f.samples) for f in families)

    def families(self) -> list[Family]:
        """Every kept run's families, one family per name (a scrape's)."""
        now = time.monotonic()
        merged: dict[str, Family] = {}
        with self._lock:
            for run in [r for r, (t, _) in self._runs.items() if now - t > self.keep_s]:
                del self._runs[run]
            batches = [fams for _, fams in self._runs.values()]
        for fams in batches:
            for f in fams:
                into = merged.setdefault(f.name, Family(f.name, f.kind, f.help))
                into.samples.extend(f.samples)
        return list(merged.values())
