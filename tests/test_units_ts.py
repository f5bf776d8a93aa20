"""The sidebar writes a figure as the Python views do: jupyter_ext/src/units.ts,
run under node, gives the same string as ``model/units.py`` for every value of
one table (bytes, durations in µs, ms and s, shares, counts, missing figures).

The TypeScript is compiled on the fly with the extension's own TypeScript
(jupyter_ext/node_modules, there once the extension is built), else the
compiled jupyter_ext/lib/units.js is run. Without node, or with neither, the
test skips, except under CI=true, where it fails.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from torchlens.model import units

EXT = Path(__file__).resolve().parents[1] / "jupyter_ext"
NAN = float("nan")
INF = float("inf")

# the same figures through both: (Python function, figure, keyword arguments)
BYTES = [0, 1, 16, 0.5, 1.5, 2.5, 1023, 1023.4, 1023.5, 1023.6, 1024, 1280, 1536, 2**20 - 52,
         1024 * 1023.96, 10**6, 4 * 2**20, 1000 * 2**20, 1.5 * 2**30, 2.25 * 2**30, 2**40,
         2**50, 1e40, -1, -2048, -1536, -1280, -0.0, -(2**30) * 3, INF, None, NAN]
US = [0, 0.04, 0.05, 0.25, 12.3, 999.9, 999.94, 999.95, 1000, 1250, 12_345.6, 999_949,
      999_950, 1_000_000, 3_250_000, 1.2e9, -500, -1250, -0.0, None, NAN]
MS = [0, 0.05, 0.25, 12.3, 12.35, 999.95, 1234.25, 1_234_567.8, -3.45, None, NAN]
SECONDS = [0, 0.25, 3.2, 59.95, 3600.5, None, NAN]
PERCENT = [0, 0.4, 0.5, 1.5, 7.3, 12.5, 99.6, 100, -0.4, -12.5, None, NAN]
COUNTS = [0, 1, 2.9, 999, 1000, 1234567, -0.5, -1234.9, 2**40, None, NAN]

CASES: list[tuple[str, Any, dict[str, Any]]] = [
    *[("format_bytes", n, {}) for n in BYTES],
    *[("format_bytes", n, {"signed": True}) for n in (0, 4 * 2**20, -1536, 1280)],
    ("format_bytes", None, {"missing": "-"}),
    *[("format_duration", us, {}) for us in US],
    *[("format_duration", us, {"signed": True}) for us in (0, 1250, -950)],
    ("format_duration", NAN, {"missing": "-"}),
    *[("format_us", us, {}) for us in US],
    *[("format_us_as_ms", us, {}) for us in US],
    *[("format_ms", ms, {}) for ms in MS],
    *[("format_ms", ms, {"unit": False}) for ms in MS],
    ("format_ms", None, {"unit": False, "missing": "-"}),
    ("format_ms", 2.5, {"signed": True}),
    *[("format_seconds", s, {}) for s in SECONDS],
    *[("format_percent", p, {}) for p in PERCENT],
    ("format_percent", 3, {"signed": True}),
    *[("format_count", n, {}) for n in COUNTS],
]

# units.ts's name of each Python function
JS_NAMES = {
    "format_bytes": "formatBytes", "format_duration": "formatDuration", "format_us": "formatUs",
    "format_us_as_ms": "formatUsAsMs", "format_ms": "formatMs", "format_seconds": "formatSeconds",
    "format_percent": "formatPercent", "format_count": "formatCount",
}

# reads [[name, figure, options], ...] on stdin, writes the strings as JSON;
# JSON has no NaN or infinity, so those travel as strings
DRIVER = r"""
const fs = require('fs');
async function load(path) {
  if (path.endsWith('.ts')) {
    const ts = require(process.env.TL_TYPESCRIPT);
    const js = ts.transpileModule(fs.readFileSync(path, 'utf8'), {
      compilerOptions: { module: ts.ModuleKind.CommonJS, target: ts.ScriptTarget.ES2020 }
    }).outputText;
    const mod = { exports: {} };
    new Function('module', 'exports', 'require', js)(mod, mod.exports, require);
    return mod.exports;
  }
  return import(require('url').pathToFileURL(path).href);
}
const SPECIAL = { NaN: NaN, Infinity: Infinity, '-Infinity': -Infinity };
(async () => {
  const units = await load(process.env.TL_UNITS);
  const cases = JSON.parse(fs.readFileSync(0, 'utf8'));
  const out = cases.map(([name, v, options]) => {
    const figure = typeof v === 'string' ? SPECIAL[v] : v;
    return name === 'formatCount' ? units[name](figure) : units[name](figure, options);
  });
  process.stdout.write(JSON.stringify(out));
})().catch(err => { console.error(err); process.exit(1); });
"""


def _unavailable(why: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(f"{why} (CI must run this test)")
    pytest.skip(why)


def _module(tmp: Path) -> tuple[Path, dict[str, str]]:
    """units.ts with the extension's TypeScript to compile it, else the compiled
    lib/units.js (as an ES module: copied to a .mjs file)."""
    typescript = EXT / "node_modules" / "typescript"
    if (typescript / "package.json").exists():
        return EXT / "src" / "units.ts", {"TL_TYPESCRIPT": str(typescript)}
    built = EXT / "lib" / "units.js"
    if built.exists():
        copy = tmp / "units.mjs"
        shutil.copyfile(built, copy)
        return copy, {}
    _unavailable("the sidebar is not built: neither jupyter_ext/node_modules/typescript nor "
                 "jupyter_ext/lib/units.js (pip install -e . builds it)")
    raise AssertionError  # not reached


def _wire(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return "NaN" if math.isnan(v) else ("Infinity" if v > 0 else "-Infinity")
    return v


def test_sidebar_units_read_as_python(tmp_path: Path) -> None:
    node = shutil.which("node")
    if node is None:
        _unavailable("node is not installed: the sidebar's units.ts cannot be run")
    module, env = _module(tmp_path)
    driver = tmp_path / "driver.cjs"
    driver.write_text(DRIVER)
    wire = [[JS_NAMES[name], _wire(v), kwargs] for name, v, kwargs in CASES]
    done = subprocess.run([node, str(driver)], input=json.dumps(wire), capture_output=True,
                          text=True, timeout=60, env={**os.environ, **env, "TL_UNITS": str(module)})
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout)
    expected = [getattr(units, name)(v, **kwargs) for name, v, kwargs in CASES]
    assert len(got) == len(CASES)
    differ = [(name, v, kwargs, py, ts)
              for (name, v, kwargs), py, ts in zip(CASES, expected, got, strict=True) if py != ts]
    assert not differ, "\n".join(f"{name}({v!r}, {kwargs}): Python {py!r}, TypeScript {ts!r}"
                                 for name, v, kwargs, py, ts in differ)
    # the table reaches what a sidebar reader sees: each unit, a tie, a missing figure
    assert {"1.2 KiB", "1.5 KiB", "1.5 GiB", "1.2 ms", "12.3 µs", "n/a", "-", "12%"} <= set(got)
