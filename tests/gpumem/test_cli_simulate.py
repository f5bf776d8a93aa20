"""`torchlens simulate` and `torchlens report` on snapshot files."""

from __future__ import annotations

import subprocess
import sys

from gpumem_fixtures import SNAPSHOTS

from torchlens.frontends.cli import main


def test_simulate_prints_the_comparison(capsys):
    rc = main(["simulate", str(SNAPSHOTS / "eor_nn_with_snapshot_actions.pickle"),
               "--alloc-conf", "expandable_segments:True,max_split_size_mb:128",
               "--capacity", "24GiB"])
    out = capsys.readouterr().out
    assert rc == 0
    for label in ("reserved at end", "allocated at end", "peak reserved", "peak allocated",
                  "inactive_split", "OOMs", "alloc retries"):
        assert label in out
    assert "expandable_segments:True" in out


def test_simulate_and_the_text_view_show_the_same_comparison(capsys):
    """One formatting of real vs simulated: the CLI prints the text view's lines."""
    from torchlens.frontends import kinds
    from torchlens.frontends.api import load_gpumem

    path = str(SNAPSHOTS / "eor_nn_with_snapshot_actions.pickle")
    assert main(["simulate", path, "--capacity", "24GiB"]) == 0
    printed = [ln for ln in capsys.readouterr().out.splitlines() if " real " in ln]
    result = load_gpumem(path, simulate=True, capacity="24GiB")
    text = kinds.text(result.profile, result.analysis())
    assert len(printed) == 7 and printed == [ln for ln in text.splitlines() if " real " in ln]


def test_simulate_small_card_reports_the_oom(capsys):
    rc = main(["simulate", str(SNAPSHOTS / "eor_nn_with_snapshot_actions.pickle"),
               "--capacity", "64MiB"])
    out = capsys.readouterr().out
    assert rc == 0 and "simulated OOM" in out


def test_simulate_bad_input_is_one_line(capsys, tmp_path):
    assert main(["simulate", str(tmp_path / "missing.pickle")]) == 2
    assert main(["simulate", str(SNAPSHOTS / "segments_only.pickle")]) == 2
    assert main(["simulate", str(SNAPSHOTS / "segments_only.pickle"),
                 "--alloc-conf", "nonsense:1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 3 and all(line.startswith("torchlens: error:") for line in err)


def test_report_accepts_a_snapshot(tmp_path, capsys):
    out = tmp_path / "snap.html"
    assert main(["report", str(SNAPSHOTS / "ctx128_forward.pickle"), "-o", str(out)]) == 0
    html = out.read_text()
    assert "Fragmentation" in html and "Top allocation sites" in html
    assert "<script" in html and "cdn.bokeh.org" not in html


def test_simulate_through_python_dash_m():
    """``python -m torchlens.frontends.cli simulate`` knows the command (it once ran
    ``main()`` before ``simulate`` was registered)."""
    proc = subprocess.run([sys.executable, "-m", "torchlens.frontends.cli", "simulate", "--help"],
                          capture_output=True, text=True, check=False, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "--alloc-conf" in proc.stdout
