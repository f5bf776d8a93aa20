"""`torchlens report`: traces and saved results to HTML; bad input in one line."""

from __future__ import annotations

import gzip
import subprocess
import sys

import pytest

from torchlens.formats.kineto import load_trace
from torchlens.frontends.cli.main import main
from torchlens.model import Profile, save_profile

TRACE = "a100_simple_add.json.gz"


def test_report_from_trace(traces_dir, tmp_path, capsys) -> None:
    out = tmp_path / "r.html"
    assert main(["report", str(traces_dir / TRACE), "-o", str(out)]) == 0
    html = out.read_text()
    assert html.startswith("<!DOCTYPE html>") and "aten::add" in html
    assert str(out) in capsys.readouterr().out


def test_report_from_tlprof_equals_live_profile(traces_dir, tmp_path) -> None:
    from torchlens.frontends.kinds import report_html as render_report

    profile = Profile(kind="trace", title=TRACE, created_at=5.0,
                      traces={"main": load_trace(traces_dir / TRACE)})
    saved = save_profile(profile, tmp_path / "p.tlprof")
    out = tmp_path / "p.html"
    assert main(["report", saved, "-o", str(out)]) == 0
    assert out.read_text() == render_report(profile)


def _bad(tmp_path) -> dict[str, str]:
    notrace = tmp_path / "notrace.json"
    notrace.write_text('{"hello": [1, 2, 3]}')
    good = gzip.compress(b'{"traceEvents": [' + b'{"ph":"X","name":"a","ts":1,"dur":2},' * 200 + b"{}]}")
    truncated = tmp_path / "cut.json.gz"
    truncated.write_bytes(good[: len(good) // 2])
    fake = tmp_path / "fake.tlprof"
    fake.write_text("not a zip")
    return {"missing": str(tmp_path / "nope.json"), "notrace": str(notrace),
            "truncated": str(truncated), "fake_tlprof": str(fake), "folder": str(tmp_path)}


@pytest.mark.parametrize("case", ["missing", "notrace", "truncated", "fake_tlprof", "folder"])
def test_bad_input_is_one_line_exit_2(tmp_path, capsys, case: str) -> None:
    path = _bad(tmp_path)[case]
    assert main(["report", path, "-o", str(tmp_path / "o.html")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("torchlens: error: ") and err.count("\n") == 1
    assert "Traceback" not in err
    assert not (tmp_path / "o.html").exists()


def test_console_script_process(tmp_path) -> None:
    """Through a real process: status 2 and no traceback on stderr."""
    proc = subprocess.run(
        [sys.executable, "-m", "torchlens.frontends.cli.main", "report", str(tmp_path / "x.json")],
        capture_output=True, text=True, check=False,
    )
    assert proc.returncode == 2
    assert proc.stderr.startswith("torchlens: error: ") and "Traceback" not in proc.stderr


def test_usage_errors_exit_2(capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["report"])
    assert exc.value.code == 2


def test_report_help_names_every_input(capsys) -> None:
    with pytest.raises(SystemExit) as stop:
        main(["report", "--help"])
    assert stop.value.code == 0
    out = capsys.readouterr().out
    path_help = out.split("positional arguments:", 1)[1].split("options:", 1)[0]
    for kind in (".tlprof", ".json.gz", ".pickle"):
        assert kind in path_help
