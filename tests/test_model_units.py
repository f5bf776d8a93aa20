"""The one rule per unit of ``model/units.py``: every view
writes a size, a duration, a share or a rate through these."""

from __future__ import annotations

import numpy as np
import pytest

from torchlens.model.units import (
    format_bytes,
    format_count,
    format_duration,
    format_durations,
    format_flop_rate,
    format_flops,
    format_gbps,
    format_ms,
    format_percent,
    format_seconds,
    format_us,
    format_us_as_ms,
    plural,
)

NAN = float("nan")


def test_counts() -> None:
    assert format_count(1234567) == "1,234,567" and format_count(3.0) == "3"
    assert plural(1, "sync") == "1 sync" and plural(1200, "sync") == "1,200 syncs"
    assert plural(2, "process", "processes") == "2 processes"


@pytest.mark.parametrize(("n", "text"), [
    (16, "16 B"), (1023, "1023 B"), (1000 * 2**20, "1000.0 MiB"), (1023.6, "1.0 KiB"), (1536, "1.5 KiB"),
    (4 * 2**20, "4.0 MiB"), (1.5 * 2**30, "1.5 GiB"), (2**40, "1024.0 GiB"),
    (-2048, "-2.0 KiB"), (1024 * 1023.96, "1.0 MiB"),
])
def test_bytes(n: float, text: str) -> None:
    assert format_bytes(n) == text


@pytest.mark.parametrize(("us", "text"), [
    (0.4, "0.4 µs"), (950, "950.0 µs"), (999.96, "1.0 ms"), (12_300, "12.3 ms"),
    (999_960, "1.0 s"), (1_250_000, "1.2 s"), (3_600e6, "3,600.0 s"), (-12_300, "-12.3 ms"),
])
def test_a_duration_picks_its_unit(us: float, text: str) -> None:
    assert format_duration(us) == text


def test_a_column_of_durations_reads_as_each_one_alone() -> None:
    """A timeline's hover labels (thousands per report) go through the batch form."""
    rng = np.random.default_rng(0)
    values = np.concatenate([rng.exponential(scale, 2000) for scale in (10, 1e3, 1e6, 1e9)])
    edges = [0.0, -0.0, 999.94, 999.95, 999.96, 999_949.9, 999_950, -12_300, 3_600e6,
             float("inf"), NAN]
    values = np.concatenate([values, -values[:50], edges]).astype(np.float64)
    assert format_durations(values) == [format_duration(v) for v in values]
    assert format_durations([None, 1.5]) == ["n/a", "1.5 µs"]


def test_fixed_units_and_signs() -> None:
    assert format_us(12_300) == "12,300.0 µs" and format_ms(12.34) == "12.3 ms"
    assert format_us_as_ms(12_340) == "12.3 ms" and format_seconds(0.96) == "1.0 s"
    assert format_ms(1234.5, unit=False) == "1,234.5"
    assert format_ms(0.0, signed=True) == "+0.0 ms" and format_ms(-2, signed=True) == "-2.0 ms"
    assert format_duration(30, signed=True) == "+30.0 µs"
    assert format_bytes(4 * 2**20, signed=True) == "+4.0 MiB"
    assert format_percent(3.2, signed=True) == "+3%"


def test_shares_and_rates() -> None:
    assert format_percent(12.5) == "12%" and format_percent(100) == "100%"
    assert [format_gbps(v) for v in (0.018, 0.485, 12.34, 123.4, 999.7, 12_345.6)] == [
        "0.018 GB/s", "0.485 GB/s", "12.3 GB/s", "123 GB/s", "1,000 GB/s", "12,346 GB/s"]
    assert format_flops(3e12) == "3.00 TFLOP" and format_flops(512) == "512 FLOP"
    assert format_flop_rate(1.25e9) == "1.25 GFLOP/s"
    # torch records no FLOP estimate for most ops: no figure, no text
    assert format_flops(0) == format_flops(NAN) == format_flops(None) == format_flop_rate(0) == ""


@pytest.mark.parametrize("fmt", [format_count, format_bytes, format_us, format_ms,
                                 format_us_as_ms, format_seconds, format_duration,
                                 format_percent, format_gbps])
def test_a_missing_figure_is_n_a(fmt) -> None:
    assert fmt(None) == fmt(NAN) == fmt(np.float32("nan")) == "n/a"
