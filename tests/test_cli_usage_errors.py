"""What the command line says for a mistyped option or a missing input.

- ``torchlens analyze RUN --josn``: the usage of ``analyze`` (not the top
  level's ``torchlens [-h] COMMAND ...``), the option named, ``--json``
  suggested, exit status 2; the same for every subcommand;
- ``torchlens analyze /no/such/path``: one line, on stderr, exit status 2.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from torchlens.frontends.cli.main import main

TOP_USAGE = "usage: torchlens [-h] COMMAND"


def _usage_error(argv: list[str], capsys: pytest.CaptureFixture) -> str:
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    out, err = capsys.readouterr()
    assert out == ""
    return err


@pytest.mark.parametrize("argv, usage, bad, meant", [
    (["analyze", "RUN", "--josn"], "usage: torchlens analyze", "--josn", "--json"),
    (["report", "x.json", "--ouput", "o.html"], "usage: torchlens report", "--ouput",
     "--output"),
    (["diff", "a", "b", "--fail-if-slowr", "5"], "usage: torchlens diff", "--fail-if-slowr",
     "--fail-if-slower"),
    (["simulate", "s.pickle", "--alloc-cnf", "x"], "usage: torchlens simulate", "--alloc-cnf",
     "--alloc-conf"),
    (["run", "--otu", "d", "--", "true"], "usage: torchlens run", "--otu", "--out"),
    (["demo", "--stesp", "3"], "usage: torchlens demo", "--stesp", "--steps"),
    (["analyze", "RUN", "--josn=1"], "usage: torchlens analyze", "--josn=1", "--json"),
], ids=["analyze", "report", "diff", "simulate", "run", "demo", "with-value"])
def test_a_mistyped_option_gets_the_subcommands_usage_and_a_suggestion(
        argv, usage, bad, meant, capsys) -> None:
    err = _usage_error(argv, capsys)
    assert err.startswith(usage), err
    assert TOP_USAGE not in err
    last = err.strip().splitlines()[-1]
    assert last.startswith(f"torchlens {argv[0]}: error: unrecognized arguments: {bad}"), last
    assert f"did you mean {meant}?" in last, last


@pytest.mark.parametrize("word,meant", [("dif", "diff"), ("reprot", "report"),
                                        ("analyse", "analyze"), ("rn", "run")])
def test_a_mistyped_subcommand_gets_a_suggestion(word, meant, capsys) -> None:
    # "torchlens dif A B" gave argparse's "invalid choice" with no suggestion,
    # while a mistyped option already got one
    err = _usage_error([word, "a", "b"], capsys)
    assert err.startswith(TOP_USAGE), err
    last = err.strip().splitlines()[-1]
    assert last.startswith(f"torchlens: error: argument COMMAND: invalid choice: '{word}'"), last
    assert last.endswith(f"did you mean {meant}?"), last


def test_a_word_like_no_subcommand_gets_no_suggestion(capsys) -> None:
    err = _usage_error(["frobnicate", "a"], capsys)
    assert "invalid choice: 'frobnicate'" in err and "did you mean" not in err


@pytest.mark.parametrize("argv", [["report", "A", "--diff", "B"], ["analyze", "A", "--diff", "B"],
                                  ["report", "A", "--diff=B"]])
def test_diff_asked_of_report_points_to_the_diff_command(argv, capsys) -> None:
    err = _usage_error(argv, capsys)
    assert err.startswith(f"usage: torchlens {argv[0]}"), err
    last = err.strip().splitlines()[-1]
    assert "unrecognized arguments: --diff" in last, last
    assert last.endswith("to compare two runs: torchlens diff A B"), last


def test_an_option_like_no_other_gets_no_suggestion(capsys) -> None:
    err = _usage_error(["analyze", "RUN", "--frobnicate"], capsys)
    assert err.startswith("usage: torchlens analyze")
    assert "unrecognized arguments: --frobnicate" in err and "did you mean" not in err


def test_an_extra_word_is_named_under_the_subcommands_usage(capsys) -> None:
    err = _usage_error(["report", "a.json", "b.json"], capsys)
    assert err.startswith("usage: torchlens report")
    assert "unrecognized arguments: b.json" in err and "did you mean" not in err


def test_a_mistyped_option_before_the_subcommand_gets_the_top_usage(capsys) -> None:
    err = _usage_error(["--josn", "analyze", "RUN"], capsys)
    assert err.startswith(TOP_USAGE) and "unrecognized arguments: --josn" in err


def test_the_commands_own_options_still_reach_it(tmp_path: Path, capsys) -> None:
    """``torchlens run -- torchrun --josn``: everything after ``--`` is the command's."""
    from torchlens.frontends.cli.main import build_parser

    args, extras = build_parser().parse_known_args(["run", "--", "torchrun", "--josn"])
    assert extras == [] and args.command[-2:] == ["torchrun", "--josn"]


def test_a_missing_path_is_said_once_on_stderr(capsys) -> None:
    assert main(["analyze", "/no/such/path"]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("torchlens: error: /no/such/path: no such file"), lines


def test_a_folder_with_nothing_usable_is_said_on_stderr_only(tmp_path: Path, capsys) -> None:
    (tmp_path / "a.json").write_text("[1, 2")
    assert main(["analyze", str(tmp_path), "--workers", "1"]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    lines = err.strip().splitlines()
    assert lines[0].startswith("torchlens: error: ") and "a.json" in lines[0], err
    assert len(lines) == 1, err


def test_json_keeps_its_document_on_stdout_and_the_error_on_stderr(capsys) -> None:
    import json

    assert main(["analyze", "/no/such/path", "--json"]) == 2
    out, err = capsys.readouterr()
    assert json.loads(out)["problems"], out
    assert err.strip().splitlines() == [err.strip()] and "/no/such/path" in err


def test_report_of_a_script_says_it_is_not_a_file_torchlens_reads(tmp_path, capsys):
    """The walk: `torchlens report train.py` said the JSON "may be cut short"."""
    from torchlens.frontends.cli.main import main

    script = tmp_path / "train.py"
    script.write_text("import torch\nprint('hello')\n")
    assert main(["report", str(script)]) == 2
    err = capsys.readouterr().err
    assert "train.py: not a file torchlens reads" in err and "cut short" not in err
    assert ".tlprof" in err and ".pickle" in err and "run folder" in err


def test_a_runs_step_records_named_alone_point_to_their_run_folder(tmp_path: Path,
                                                                   capsys) -> None:
    steps = tmp_path / "run" / "rank0" / "steps.jsonl"
    steps.parent.mkdir(parents=True)
    steps.write_text('{"step": 0, "t0": 1.0, "t1": 1.1}\n')
    assert main(["report", str(steps)]) == 2
    _, err = capsys.readouterr()
    assert "not a trace" in err and f"torchlens report {tmp_path / 'run'}" in err, err
    assert "cut short" not in err


def test_report_to_standard_output_with_dash(traces_dir: Path, capsys, tmp_path: Path,
                                             monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["report", str(traces_dir / "a100_simple_add.json.gz"), "-o", "-"]) == 0
    out, _ = capsys.readouterr()
    assert out.lstrip().lower().startswith("<!doctype html") and "wrote" not in out[-200:]
    assert not (tmp_path / "-").exists()
