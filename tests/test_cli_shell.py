"""The shell, as a new user meets it.

- a reader that closes the pipe early (``torchlens analyze RUN --json | head``)
  ends the command quietly, not with "torchlens: error: Broken pipe" and the
  usage-error status;
- ``torchlens diff A MISSING`` names MISSING, not the folder it would be in;
- ``torchlens.load`` reads what ``torchlens report`` reads (one loader);
- a folder's files that are not traces are named as ignored.
"""

from __future__ import annotations

import io
import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

import torchlens
from torchlens.frontends.cli.main import main

REPO = Path(__file__).resolve().parents[1]
PIPE_STATUS = 141  # 128 + SIGPIPE: what a shell reports for a writer whose reader left


def _trace(rank: int = 0, world: int = 1) -> dict:
    """A small Kineto trace: two steps of one op, this rank of ``world``."""
    events = []
    for step in range(2):
        t = 1000 * step
        events += [{"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{step}",
                    "ts": t, "dur": 500, "pid": 1, "tid": 1},
                   {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": t + 10,
                    "dur": 200, "pid": 1, "tid": 1}]
    return {"schemaVersion": 1, "distributedInfo": {"rank": rank, "world_size": world},
            "traceEvents": events}


def _run_folder(root: Path, ranks: int = 2) -> Path:
    root.mkdir(parents=True)
    for r in range(ranks):
        (root / f"rank{r}.json").write_text(json.dumps(_trace(r, ranks)))
    return root


def _snapshot(path: Path) -> Path:
    """A tiny allocator snapshot: one 4 KiB block allocated and freed."""
    frames = [{"filename": "train.py", "line": 3, "name": "step"}]
    trace = [{"action": a, "addr": 1 << 20, "size": 4096, "stream": 0, "frames": frames,
              "time_us": t} for a, t in (("alloc", 1), ("free_requested", 2),
                                          ("free_completed", 3))]
    path.write_bytes(pickle.dumps({"segments": [], "device_traces": [trace]}))
    return path


def _env() -> dict[str, str]:
    import os

    return {**os.environ, "PYTHONPATH": os.environ.get("PYTHONPATH", str(REPO))}


# ---- item 11: a closed pipe ends quietly ------------------------------------------

@pytest.mark.parametrize("words", [["analyze", "{run}", "--json"], ["analyze", "{run}"],
                                   ["report", "{run}", "-o", "{html}"]],
                         ids=["analyze-json", "analyze-text", "report"])
def test_a_reader_that_closes_the_pipe_early_ends_the_command_quietly(
        tmp_path: Path, words: list[str]) -> None:
    run = _run_folder(tmp_path / "run")
    argv = [w.format(run=run, html=tmp_path / "r.html") for w in words]
    proc = subprocess.Popen([sys.executable, "-m", "torchlens", *argv], cwd=tmp_path,
                            env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()  # the reader is gone before the command writes a byte
    _, err = proc.communicate(timeout=180)
    assert err.decode() == ""
    # as other Unix tools end on SIGPIPE; 2 is for unusable input (README)
    assert proc.returncode in (0, PIPE_STATUS)


def test_a_real_pipe_into_head_ends_quietly(tmp_path: Path) -> None:
    """``torchlens analyze RUN --json | head -n 2`` through a shell, with more output
    than a pipe holds, so the command is still writing when head leaves."""
    run = _run_folder(tmp_path / "run", ranks=64)  # about 300 KB of --json
    done = subprocess.run(
        ["bash", "-c", f"{sys.executable} -m torchlens analyze {run} --json --workers 2 "
                       "| head -n 2; echo \"status ${PIPESTATUS[0]}\" >&2"],
        cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=300)
    assert done.stdout == '{\n "schema": 2,\n'
    assert done.stderr.strip() in ("status 0", f"status {PIPE_STATUS}")


def test_main_returns_the_pipe_status_and_prints_nothing_when_stdout_is_closed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    class Closed(io.StringIO):
        def write(self, s: str) -> int:
            raise BrokenPipeError(32, "Broken pipe")

    run = _run_folder(tmp_path / "run")
    monkeypatch.setattr(sys, "stdout", Closed())
    assert main(["analyze", str(run), "--json"]) == PIPE_STATUS
    assert capsys.readouterr().err == ""


# ---- item 13: the missing path is named -------------------------------------------

@pytest.mark.parametrize("side", ["A", "B"])
def test_diff_names_the_missing_path_itself(tmp_path: Path, capsys: pytest.CaptureFixture,
                                            side: str) -> None:
    run = _run_folder(tmp_path / "runs" / "a")
    nope = tmp_path / "runs" / "nope"
    args = [str(nope), str(run)] if side == "A" else [str(run), str(nope)]
    assert main(["diff", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"torchlens: error: {nope}: no such file or folder. Check the path."


# ---- item 14: one loader; what a folder held that was not read --------------------

def test_load_reads_an_allocator_snapshot_as_report_does(tmp_path: Path) -> None:
    snap = _snapshot(tmp_path / "x.pickle")
    result = torchlens.load(snap)
    assert result.profile.kind == "gpumem"
    assert len(result.analysis().trace) == 3
    assert "peak 4.0 KiB allocated" in repr(result)
    assert main(["report", str(snap), "-o", str(tmp_path / "x.html")]) == 0
    # a snapshot saved under another name is still one (its first bytes say so)
    other = tmp_path / "snapshot.bin"
    other.write_bytes(snap.read_bytes())
    assert torchlens.load(other).profile.kind == "gpumem"


def test_the_command_line_and_torchlens_load_share_one_loader(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from torchlens.frontends import loading
    from torchlens.frontends.cli import main as cli
    seen: list[str] = []
    real = loading.load

    def spy(path, **kw):
        seen.append(str(path))
        return real(path, **kw)

    monkeypatch.setattr(loading, "load", spy)
    snap = _snapshot(tmp_path / "x.pickle")
    torchlens.load(snap)
    cli.load_input(str(snap))
    assert seen == [str(snap), str(snap)]


def test_load_of_a_missing_path_is_one_clear_error(tmp_path: Path) -> None:
    with pytest.raises(torchlens.InputError, match="nope: no such file or folder"):
        torchlens.load(tmp_path / "nope")


@pytest.mark.parametrize("path", ["nope", "nope/run1"])
def test_load_of_a_missing_path_in_a_notebook_is_a_short_file_not_found(path: str) -> None:
    """``torchlens.load('nope')`` in a notebook: a FileNotFoundError whose one
    line says the path does not exist and what torchlens reads, raised one
    frame below the user's line (IPython shows every frame it passed)."""
    import traceback

    with pytest.raises(FileNotFoundError) as info:
        torchlens.load(path)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(f"{path}: no such file or folder")
    for accepted in ("run folder", ".json.gz", ".tlprof", ".pickle"):
        assert accepted in message
    frames = traceback.extract_tb(info.value.__traceback__)
    package = os.path.dirname(torchlens.__file__) + os.sep  # not the clone's tests/
    ours = [f for f in frames if f.filename.startswith(package)]
    assert len(ours) == 1, [f"{f.filename}:{f.lineno}" for f in ours]
    assert info.value.__cause__ is None and info.value.__context__ is None


def test_a_file_in_a_trace_folder_that_is_not_a_trace_is_named_as_ignored(
        tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    run = _run_folder(tmp_path / "run")
    (run / "notes.txt").write_text("lr 0.1\n")
    # a torchlens run folder's own files are read elsewhere: not "ignored"
    (run / "rank0").mkdir()
    (run / "rank0" / "steps.jsonl").write_text("")
    result = torchlens.load(run)
    assert result.ranks == [0, 1]
    assert result.ignored == [str(run / "notes.txt")]
    said = ("ignored 1 file that is not a trace (only *.json and *.json.gz are read): "
            "notes.txt")
    assert said in result.findings()
    assert result.to_json()["ignored"] == [str(run / "notes.txt")]
    # the command line says it too: analyze's text, and report on stderr
    assert main(["analyze", str(run)]) == 0
    assert f"- {said}" in capsys.readouterr().out
    html = tmp_path / "r.html"
    assert main(["report", str(run), "-o", str(html)]) == 0
    assert f"torchlens: {said}" in capsys.readouterr().err
    assert "notes.txt" in html.read_text(encoding="utf-8")
