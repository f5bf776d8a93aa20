"""Start-up of %ddp_check --nnodes (issue 14): time to the first live point, against bare torchrun.

Run: ``python benchmarks/bench_nnodes_startup.py [--repeat 3]``.

Two figures per repeat, the four runs alternating so the shared machine's
load hits each alike:

- two nodes, world 4: ``run_check`` (what ``ddp_check(..., nnodes=2,
  nproc_per_node=2)`` runs once its options are checked) with node 1's
  agent started by this script the moment the printed command arrives;
  timed from the call to (a) the first heartbeat of any rank (the first live
  point) and (b) every rank past ``init_process_group`` (its heartbeat phase
  leaves ``starting``/``init``). Against: two bare ``torchrun`` agents (the
  same c10d rendezvous) whose ranks only init the process group and run one
  all_reduce, timed from start to the last rank's all_reduce done.
- one node, world 2: today's launcher (``--world-size 2``: one
  ``python -m worker`` per rank) vs the agent (``--nnodes 1
  --nproc-per-node 2``), both to every rank past ``init_process_group``.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time

from torchlens.model.messages import DdpHeartbeat

BARE = r"""
import os, sys, time
import torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.ones(4)
dist.all_reduce(t)
with open(os.path.join(sys.argv[1], f"rank{os.environ['RANK']}"), "w") as fh:
    fh.write(repr(time.time()))
dist.destroy_process_group()
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def job_fn(rank, world_size):
    import torch
    import torch.distributed as dist

    dist.all_reduce(torch.ones(4))


class FirstPoints:
    """A launcher sink (a ``RankFeed``) that notes when the first heartbeat came and
    when every rank was up."""

    def __init__(self, n: int) -> None:
        self.n, self.first, self.all_up, self.up = n, None, None, set()

    def start(self) -> None:
        pass

    def push(self, hb: DdpHeartbeat) -> None:
        now = time.perf_counter()
        self.first = self.first or now
        if hb.phase not in ("starting", "init"):
            self.up.add(hb.rank)
            if len(self.up) == self.n and self.all_up is None:
                self.all_up = now

    def rank_ended(self, rank: int, reason: str, t: float | None) -> None:
        # a one-step rank on a quiet machine can end before a heartbeat past
        # init reaches the sink: its end says it was up (at the latest now)
        self.push(DdpHeartbeat(rank=rank, phase="ended"))

    def push_steps(self, rank: int, records: list) -> None:
        pass

    def push_summary(self, rank: int, summary: dict) -> None:
        pass

    def flush(self, force: bool = False) -> None:
        pass

    def close(self) -> None:
        pass


def torchlens_run(nnodes: int | None, nproc: int) -> tuple[float, float]:
    import cloudpickle

    from torchlens.capture.ddp import DdpOptions, run_check
    from torchlens.capture.ddp.elastic import ElasticSpec
    from torchlens.capture.ddp.options import DdpJob

    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    others: list[subprocess.Popen[bytes]] = []

    def start_other(argv: list[str], env: dict[str, str]) -> None:
        others.append(subprocess.Popen(argv, env={**os.environ, **env},
                                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                       start_new_session=True))

    spec = (ElasticSpec(nnodes, nproc, f"127.0.0.1:{free_port()}")
            if nnodes is not None else None)
    n = nproc * (nnodes or 1)
    job = DdpJob(kind="function", fn=job_fn, backend="gloo", strict=False, timeout_s=30.0,
                 steps=1, seed=0)
    opts = DdpOptions(world_size=n, backend="gloo", steps=1, elastic=spec,
                      on_other_nodes=start_other if nnodes and nnodes > 1 else None)
    sink = FirstPoints(n)
    t0 = time.perf_counter()
    stderr, sys.stderr = sys.stderr, open(os.devnull, "w")  # noqa: SIM115 - the printed hint
    try:
        rec = run_check(job, opts, sink)
    finally:
        sys.stderr.close()
        sys.stderr = stderr
        for p in others:
            p.wait(timeout=60)
    assert rec.run.outcome == "finished", rec.run.outcome
    return sink.first - t0, sink.all_up - t0


def bare_torchrun(nnodes: int, nproc: int) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        script = os.path.join(tmp, "bare.py")
        with open(script, "w") as fh:
            fh.write(BARE)
        endpoint = f"127.0.0.1:{free_port()}"
        argv = [sys.executable, "-m", "torch.distributed.run", "--nnodes", str(nnodes),
                "--nproc-per-node", str(nproc), "--rdzv-backend", "c10d",
                "--rdzv-endpoint", endpoint, "--rdzv-id", "bare", "--monitor-interval", "0.1",
                script, tmp]
        t0 = time.time()
        procs = [subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                 for _ in range(nnodes)]
        for p in procs:
            assert p.wait(timeout=120) == 0
        done = [float(open(os.path.join(tmp, f"rank{r}")).read())
                for r in range(nnodes * nproc)]
        return max(done) - t0


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    rows: dict[str, list[float]] = {k: [] for k in (
        "2 nodes: first heartbeat", "2 nodes: every rank in the group", "2 nodes: bare torchrun",
        "1 node: launcher", "1 node: agent")}
    for i in range(args.repeat):
        first, up = torchlens_run(2, 2)
        rows["2 nodes: first heartbeat"].append(first)
        rows["2 nodes: every rank in the group"].append(up)
        rows["2 nodes: bare torchrun"].append(bare_torchrun(2, 2))
        rows["1 node: launcher"].append(torchlens_run(None, 2)[1])
        rows["1 node: agent"].append(torchlens_run(1, 2)[1])
        print(f"repeat {i}: " + ", ".join(f"{k} {v[-1]:.2f}s" for k, v in rows.items()),
              flush=True)
    print("\n| figure | median s | runs s |\n| --- | --- | --- |")
    for k, v in rows.items():
        print(f"| {k} | {statistics.median(v):.2f} | {', '.join(f'{x:.2f}' for x in v)} |")


if __name__ == "__main__":
    main()
