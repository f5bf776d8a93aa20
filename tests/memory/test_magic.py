"""%%gpumem and %gpumem --load as a user types them: options, errors, loading files."""

from __future__ import annotations

import pickle

import pytest
from gpumem_fixtures import SNAPSHOT_FILES

SNAPSHOT_PARAMS = [pytest.param(p, id=p.stem) for p in SNAPSHOT_FILES]


@pytest.mark.parametrize(
    "line, needle",
    [
        ("--repeat 0", "--repeat"),
        ("--stacks -1", "--stacks"),
        ("--device x", "--device"),
        ("--capacity 24GiB", "--capacity and --alloc-conf only apply with --simulate"),
        ("--simulate --capacity lots", "capacity"),
        ('--simulate --alloc-conf "bogus:1"', "alloc conf"),
        ("--export out.txt", "unknown file type"),
        ("--export s.pickle --export s.tlprof", "--export given 2 times (s.pickle, s.tlprof)"),
        ("--load x.pickle", "--load analyses a file"),
        ("--no-such-option", "unrecognized"),
    ],
)
def test_bad_option_is_a_usage_error_and_nothing_runs(shell, capsys, line, needle):
    shell.user_ns["ran"] = False
    res = shell.run_cell(f"%%gpumem {line}\nran = True")
    err = capsys.readouterr()
    assert not res.success
    assert shell.user_ns["ran"] is False
    assert needle in (err.out + err.err + str(res.error_in_exec))


def test_help_lists_every_option(shell, capsys):
    shell.run_cell("%%gpumem?")
    out = capsys.readouterr().out
    for opt in ("-o", "--device", "--stacks", "--export", "--simulate", "--capacity",
                "--alloc-conf", "--repeat", "--quiet", "--load"):
        assert opt in out


def test_failing_cell_shows_capture_then_reraises_unchanged(shell, capsys):
    res = shell.run_cell("%%gpumem -o r\nbig = torch.ones(50_000)\nraise ValueError('boom')")
    assert isinstance(res.error_in_exec, ValueError) and str(res.error_in_exec) == "boom"
    r = shell.user_ns["r"]
    assert r.profile.error["type"] == "ValueError"
    assert any(s.bytes >= 200_000 for s in r.sites())
    out = capsys.readouterr().out
    assert "torchlens gpumem" in out


def test_oom_in_the_cell_is_diagnosed_and_reraised(shell, capsys):
    cell = ("%%gpumem -o r\nx1 = torch.ones(10_000)\n"
            "raise torch.OutOfMemoryError('CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 "
            "has a total capacity of 23.65 GiB of which 1.50 GiB is free. Of the allocated memory "
            "18.00 GiB is allocated by PyTorch, and 3.80 GiB is reserved by PyTorch but "
            "unallocated.')")
    res = shell.run_cell(cell)
    assert type(res.error_in_exec).__name__ == "OutOfMemoryError"
    d = shell.user_ns["r"].diagnosis()
    assert d is not None and d.requested == 2 * 1024**3
    assert d.source == "error message" and d.cause == "fragmentation"
    assert "[failed] Out of memory (fragmentation): " in capsys.readouterr().out


@pytest.mark.parametrize("path", SNAPSHOT_PARAMS)
def test_load_every_shared_snapshot(shell, path, capsys):
    res = shell.run_cell(f"%gpumem --load {path} -o s")
    assert res.success, res.error_in_exec
    r = shell.user_ns["s"]
    html = r._repr_mimebundle_()["text/html"]
    assert "Fragmentation" in html and "<iframe" in html
    assert r.analysis().frag.reserved > 0
    assert "torchlens gpumem" in capsys.readouterr().out


def test_load_refuses_a_malicious_pickle(shell, tmp_path, capsys):
    marker = tmp_path / "pwned"

    class Evil:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    bad = tmp_path / "evil.pickle"
    bad.write_bytes(pickle.dumps({"segments": [], "x": Evil()}))
    res = shell.run_cell(f"%gpumem --load {bad}")
    out = capsys.readouterr()
    assert not res.success
    assert "refused" in out.err + out.out + str(res.error_in_exec)
    assert not marker.exists()


def test_load_truncated_file_is_a_clear_error(shell, tmp_path, capsys):
    src = SNAPSHOT_FILES[0].read_bytes()
    bad = tmp_path / "cut.pickle"
    bad.write_bytes(src[: len(src) // 2])
    res = shell.run_cell(f"%gpumem --load {bad}")
    out = capsys.readouterr()
    assert not res.success and "truncated" in out.err + out.out + str(res.error_in_exec)


def test_line_form_without_load_is_a_usage_error(shell, capsys):
    res = shell.run_cell("%gpumem")
    assert not res.success
    assert "--load" in capsys.readouterr().err + str(res.error_in_exec)


def test_api_context_manager(shell):
    import torchlens

    with torchlens.gpumem(stacks=8) as r:
        import torch

        kept = [torch.ones(1000) for _ in range(3)]
    assert r.sites() and kept
    assert "torchlens gpumem" in repr(r)


def test_load_and_export_quoted_paths_with_spaces(shell, tmp_path, capsys):
    snap = tmp_path / "my snapshot.pickle"
    snap.write_bytes(SNAPSHOT_FILES[0].read_bytes())
    report = tmp_path / "my report.html"
    res = shell.run_cell(f"%gpumem --load \"{snap}\" --export '{report}' -o s --quiet")
    assert res.success, res.error_in_exec
    assert shell.user_ns["s"].profile.title == "my snapshot.pickle"
    assert report.stat().st_size > 0


def test_cell_with_ipython_syntax_runs_under_gpumem(shell, capfd):
    res = shell.run_cell("%%gpumem -o r --quiet\n%time big = torch.ones(50_000)\n"
                         "!echo shell says hi\nimport asyncio\nawait asyncio.sleep(0)\n"
                         "after = big + 1")
    assert res.success, res.error_in_exec
    out = capfd.readouterr().out
    assert "Wall time" in out and "shell says hi" in out
    assert shell.user_ns["after"].shape == (50_000,)
    assert any(s.bytes >= 200_000 for s in shell.user_ns["r"].sites())


def test_failing_cell_traceback_names_its_cell(shell, capsys):
    import os
    import re

    import torchlens

    for _ in range(2):
        shell.run_cell("pass", store_history=True)
    n = shell.execution_count
    res = shell.run_cell("%%gpumem --quiet\nkeep = torch.ones(10)\nraise ValueError('boom')",
                         store_history=True)
    assert isinstance(res.error_in_exec, ValueError)
    tb = re.sub(r"\x1b\[[0-9;]*m", "", capsys.readouterr().out)
    assert f"Cell In[{n}], line 2" in tb and "In[0]" not in tb
    assert os.path.dirname(torchlens.__file__) not in tb


def test_load_of_a_folder_points_to_the_folder_readers(shell, tmp_path, capsys):
    """The walk: `%gpumem --load ranks` said only "is a directory, not a snapshot file"."""
    folder = tmp_path / "ranks"
    folder.mkdir()
    res = shell.run_cell(f"%gpumem --load {folder}")
    out = capsys.readouterr()
    said = out.err + out.out + str(res.error_in_exec)
    assert not res.success and "is a directory, not a snapshot file" in said
    assert f"torchlens report {folder}" in said and "torchlens.load_snapshots(" in said
