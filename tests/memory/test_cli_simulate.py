"""`torchlens simulate` and `torchlens report` on snapshot files."""

from __future__ import annotations

import subprocess
import sys

from gpumem_fixtures import SNAPSHOTS

from torchlens.frontends.cli.main import main


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
    from torchlens.frontends.memory.api import load_gpumem

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
    """``python -m torchlens.frontends.cli.main simulate`` knows the command (it once ran
    ``main()`` before ``simulate`` was registered)."""
    proc = subprocess.run([sys.executable, "-m", "torchlens.frontends.cli.main", "simulate", "--help"],
                          capture_output=True, text=True, check=False, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "--alloc-conf" in proc.stdout


# ---- what-ifs that cannot mean what they seem say so

def _window_after_last_segment(tmp_path, name: str):
    """The shared snapshot cut to the events after its last ``segment_alloc``: a window
    whose memory was all reserved before it."""
    import pickle

    from torchlens.model.snapshot import load_snapshot

    snap = load_snapshot(SNAPSHOTS / f"{name}.pickle")
    trace = snap.device_traces[0]
    last = max(i for i, e in enumerate(trace) if e.action == "segment_alloc")
    snap.device_traces = [trace[last + 1:]]
    path = tmp_path / f"{name}_window.pickle"
    path.write_bytes(pickle.dumps(snap.to_torch()))
    return path


def test_simulate_capacity_below_the_starting_reserved_says_so(capsys):
    """ctx128_forward's window starts with 12.82 GiB reserved; an 8 GiB card cannot
    hold that, and the report used to show reserved above the capacity without a word."""
    assert main(["simulate", str(SNAPSHOTS / "ctx128_forward.pickle"),
                 "--capacity", "8GiB"]) == 0
    out = capsys.readouterr().out
    assert ("note: the window starts with 12.8 GiB reserved, above the 8.0 GiB capacity"
            in out)


def test_simulate_capacity_below_the_start_with_no_new_segment(tmp_path, capsys):
    """No OOM can happen (no segment is made): the note is the only sign."""
    path = _window_after_last_segment(tmp_path, "eor_nn_with_snapshot_actions")
    assert main(["simulate", str(path), "--capacity", "64MiB"]) == 0
    out = capsys.readouterr().out
    assert "note: the window starts with 128.0 MiB reserved, above the 64.0 MiB capacity" in out


def test_simulate_never_reports_reserved_above_capacity_silently():
    from torchlens.frontends.memory.api import load_gpumem

    for name, cap in (("ctx128_forward", "8GiB"), ("ftcourse_older_format", "2GiB"),
                      ("eor_nn_with_snapshot_actions", "64MiB")):
        a = load_gpumem(str(SNAPSHOTS / f"{name}.pickle"), simulate=True,
                        capacity=cap).analysis()
        sim = {row[0]: row[2] for row in a.comparison}
        cap_bytes = a.simulated.capacity
        over = sim["reserved at end"] > cap_bytes or sim["peak reserved"] > cap_bytes
        assert not over or any("capacity" in n for n in a.notes), (name, a.notes)


def test_expandable_segments_on_a_window_with_no_new_segment_says_it_cannot_act(
        tmp_path, capsys):
    from torchlens.frontends.memory.api import load_gpumem

    path = _window_after_last_segment(tmp_path, "eor_nn_with_snapshot_actions")
    assert main(["simulate", str(path), "--alloc-conf", "expandable_segments:True"]) == 0
    out = capsys.readouterr().out
    assert "note: the window makes no new segment" in out
    assert "expandable_segments applies only to segments made after the setting" in out
    a = load_gpumem(str(path), simulate=True, alloc_conf="expandable_segments:True").analysis()
    assert any(n.startswith("the window makes no new segment") for n in a.notes)
    # the whole recording does make segments: no such note there
    whole = load_gpumem(str(SNAPSHOTS / "eor_nn_with_snapshot_actions.pickle"), simulate=True,
                        alloc_conf="expandable_segments:True").analysis()
    assert not any("makes no new segment" in n for n in whole.notes)
