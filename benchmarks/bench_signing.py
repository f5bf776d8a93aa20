"""What signing costs per message on the store channel (issue 14).

Times ``RunKey.seal`` + ``RunKey.open`` (HMAC-SHA256 over run id, key name
and body, and the constant-time compare) on the bytes of a typical heartbeat
and of a 64 KB profiled-step summary (the largest message a rank sends), and
the JSON encode + decode the same messages already pay, for scale. Medians of
repeated timeit runs, one process, no store: the figures are the signing's own
cost, which every message now adds once on each side.

    .venv/bin/python benchmarks/bench_signing.py
"""

from __future__ import annotations

import statistics
import time
import timeit

from torchlens.capture.channel import protocol
from torchlens.capture.channel.signing import RunKey


def _median_us(fn, number: int, repeat: int = 7) -> float:
    return statistics.median(timeit.repeat(fn, number=number, repeat=repeat)) / number * 1e6


def heartbeat() -> dict:
    """A heartbeat as a --profile rank sends it five times a second."""
    return {"t": time.time(), "beat": 1234, "phase": "training", "modules": 2143,
            "ops": 918273, "collectives": 4410, "step": 0, "in_collective": False,
            "last": {"index": 4409, "op": "all_reduce", "line": "train.py:88"},
            "steps_done": 812, "phase_calls": 4060, "rss": 1_412_000_000,
            "tensor_bytes": None, "cuda_allocated": None, "cuda_reserved": None}


def summary(size: int = 64 << 10) -> dict:
    """A profiled-step summary padded with top-op rows to ``size`` bytes of JSON."""
    out: dict = {"rank": 1, "step": 9, "trace": "rank1/step00009.pt.trace.json",
                 "step_ms": 70.2, "top_ops": []}
    i = 0
    while len(protocol.encode(out)) < size:
        out["top_ops"].append({"name": f"aten::op_{i}", "calls": 12, "self_us": 1834.5,
                               "total_us": 2011.0, "shapes": "[[64, 512], [512, 512]]"})
        i += 1
    return out


def main() -> None:
    key = RunKey.new()
    print(f"{'message':<28} {'bytes':>7} {'seal+open us':>13} {'json enc+dec us':>16}")
    for label, name, value, number in (
            ("heartbeat", protocol.heartbeat_key(3), heartbeat(), 20_000),
            ("summary (64 KB)", protocol.summary_key(3, 17), summary(), 500)):
        body = protocol.encode(value)
        sealed = key.seal(name, body)
        assert key.open(name, sealed) == body
        sign = _median_us(lambda: key.open(name, key.seal(name, body)), number)  # noqa: B023
        json_us = _median_us(lambda: protocol.decode(protocol.encode(value)), number)  # noqa: B023
        print(f"{label:<28} {len(body):>7} {sign:>13.2f} {json_us:>16.2f}")
    print(f"sealed size: +{len(key.seal('x', b''))} bytes per message (magic + MAC)")


if __name__ == "__main__":
    main()
