"""``torchlens run`` over a job that torchrun's agent restarts once, for real (CPU, gloo).

Rank 1 raises at step 5 of its first start (``TL_FAIL_ONCE_AT``); the agent
(``--max-restarts 1``) restarts both workers and the second start runs to
the end. Expected figures come from the run folder's files read with json.

The test does not set ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE``: ``torchlens
run`` sets it to 1 for the command. With torch 2.13's default, the restarted
gloo workers meet in the same rendezvous store as the first ones and read
their stale addresses; on this machine 3 of 4 bare torchrun restarts (no
torchlens involved) then failed in ``connectFullMesh`` or hung.
docs/MULTINODE.md says so.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import signal
import subprocess
from pathlib import Path

import pytest

import torchlens

from .helpers import (
    REPO,
    Collector,
    env,
    free_port,
    other_node_env,
    processes_of_run,
    report,
    torchrun_args,
)

pytestmark = pytest.mark.timeout(300)

STEPS, FAIL_AT = 12, 5
#: the two-node test: enough steps after the restart for the interval to be agreed
STEPS_2 = 30


def _steps(run_dir: Path, rank: int) -> list[dict]:
    """The rank's steps in its steps.jsonl, without set-up window records (a
    rank attaches at start; every reader of torchlens leaves them out)."""
    with open(run_dir / f"rank{rank}" / "steps.jsonl", encoding="utf-8") as fh:
        return [rec for line in fh if not (rec := json.loads(line)).get("window")]


def test_a_restarted_job_is_one_restart_in_the_summary_manifest_and_report(tmp_path: Path) -> None:
    out = tmp_path / "run"
    command = torchrun_args(1, 2, free_port())
    command[-1:-1] = ["--max-restarts", "1", "--monitor-interval", "0.1"]
    c = Collector(out, command, TL_STEPS=str(STEPS), TL_FAIL_ONCE_AT=str(FAIL_AT),
                  TL_SLOW_S="0.0")
    try:
        run_id = re.search(r"run (\w+),", c.wait_line("torchlens run: run")).group(1)
        assert c.wait() == 0, c.output
    finally:
        c.kill()
    # the terminal: one restart of the job (not one per rank), who failed, where, why
    said = [line for line in c.lines if line.startswith("restart ")]
    assert len(said) == 1, c.output
    assert said[0].startswith("restart 1: the elastic agent restarted all 2 workers at ")
    assert (f"after rank 1 failed at step {FAIL_AT} (RuntimeError: rank 1 fails on purpose"
            in said[0]), said[0]
    assert "torchlens run: finished after 1 restart by the elastic agent" in c.output
    # the manifest says the same, with the steps each rank's first start did
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["exit_code"] == 0
    assert manifest["stopped"].startswith("finished after 1 restart")
    [restart] = manifest["restarts"]
    assert restart["ranks"] == [0, 1] and restart["cause"] == "failed"
    assert restart["cause_rank"] == 1 and restart["cause_step"] == FAIL_AT
    assert restart["error"].startswith("RuntimeError: rank 1 fails on purpose")
    assert {b["rank"]: b["steps"] for b in restart["before"]} == {0: FAIL_AT, 1: FAIL_AT}
    assert restart["t"] <= restart["resumed_t"]
    assert [r["state"] for r in manifest["ranks"]] == ["finished", "finished"]
    # every rank's records of both starts, told apart by "restart"
    for rank in (0, 1):
        records = _steps(out, rank)
        first = [r["step"] for r in records if r["restart"] == 0]
        second = [r["step"] for r in records if r["restart"] == 1]
        assert first == list(range(FAIL_AT)) and second == list(range(STEPS)), rank
    # the report names the restart and marks it on the chart of every step
    _, page = report(out, tmp_path)
    assert "restart 1: the elastic agent restarted all 2 workers" in page
    assert "Every step over time" in page and "restart 1: rank 1 failed" in page
    assert not processes_of_run(run_id), [p.cmdline() for p in processes_of_run(run_id)]
    # torchlens.watch of the folder (its live feed replayed): the second start's
    # steps are drawn after the first's, the restart marked where they begin,
    # and its sentence is in the status block
    w = torchlens.watch(str(out), timeout=30)
    try:
        assert w.wait(60) and w.state == "ended", (w.state, w.message)
        panels = w.view.profile.panels
        for rank in (0, 1):
            assert list(panels.steps[rank].data["step"]) == list(range(FAIL_AT + STEPS))
        assert list(panels.restarts.data["step"]) == [FAIL_AT]
        assert panels.restarts.data["text"] == ["restart 1: rank 1 failed"]
        # the first start's failures (rank 1's, and rank 0's in gloo after it)
        # are marked at their last step, not where the run ended
        ends = list(zip(panels.ended.data["text"], panels.ended.data["step"], strict=True))
        # rank 0 reads as the consequence: "stopped when rank 1 went away"
        failed = [(t.split(":")[0], s) for t, s in ends
                  if "failed" in t or "stopped when rank 1 went away" in t]
        assert ("rank 1", FAIL_AT - 1) in failed and {s for _, s in failed} == {FAIL_AT - 1}, ends
        assert len(failed) == len(ends), ends  # the ranks that finished get no x
        header = w.widget.children[0].value
        assert "restart 1: the elastic agent restarted all 2 workers" in header
    finally:
        w.stop()


def test_two_nodes_whose_agents_count_restarts_differently_still_agree(tmp_path: Path) -> None:
    """Rank 1 (node 1) fails once while rank 0 is outside any collective (as
    an NCCL rank hangs rather than fails when its peer dies): node 1's agent
    counts a restart; node 0's, which restarts rank 0 because node 1 came
    back to the rendezvous, does not. The ranks still agree on their
    profiling interval at once; keyed by the restart count, each waited 10 s
    for a proposal under the other's count."""
    out = tmp_path / "run"
    command = torchrun_args(2, 1, free_port())
    command[-1:-1] = ["--max-restarts", "1", "--monitor-interval", "0.1"]
    extra = dict(TL_STEPS=str(STEPS_2), TL_FAIL_ONCE_AT="3", TL_FAIL_RANK="1", TL_SLOW_S="0.0",
                 TL_HOLD_S="60", TL_HOLD_MARK=str(tmp_path / "held"))
    c = Collector(out, command, **extra)
    second = None
    try:
        other_env, printed = other_node_env(c.wait_line("TORCHLENS_COLLECTOR="))
        second = subprocess.Popen(printed, cwd=REPO, env=env(**other_env, **extra),
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                  start_new_session=True)
        assert c.wait() == 0, c.output
        assert second.wait(timeout=60) == 0
    finally:
        c.kill()
        if second is not None and second.poll() is None:
            os.killpg(second.pid, signal.SIGKILL)
    manifest = json.loads((out / "manifest.json").read_text())
    [restart] = manifest["restarts"]
    # the scenario: the two agents' counts differ after the restart
    assert {b["rank"]: b["restart_count"] for b in restart["before"]} == {0: 0, 1: 1}
    after = {r: [x for x in _steps(out, r) if x["restart"] == 1] for r in (0, 1)}
    assert [x["step"] for x in after[0]] == [x["step"] for x in after[1]] == list(range(STEPS_2))
    # both ranks profiled the same steps, and no step waited for a proposal
    profiled = [[x["step"] for x in after[r] if x.get("profiled")] for r in (0, 1)]
    assert profiled[0] == profiled[1] and len(profiled[0]) >= 2, profiled
    for r in (0, 1):
        gaps = [b["t0"] - a["t0"] for a, b in itertools.pairwise(after[r])]
        assert max(gaps) < 5.0, (r, max(gaps))
