"""The network planner fits from a trace against the rate the link was shaped to: the
lab's DDP MLP traced at 500 and 200 Mbit/s (traces/torch/lab_ddp_mlp/README.md has the
lab's own TCP and bench-network checks of each rate)."""

from __future__ import annotations

import json

import pytest

from tests.conftest import REPO, run_cli

LAB = REPO / "traces" / "torch" / "lab_ddp_mlp"


def _fitted_mbit(rate: str, capsys: pytest.CaptureFixture[str]) -> tuple[float, dict]:
    code, out, err = run_cli(["analyze", LAB / rate, "--json"], capsys)
    assert code == 0, err
    sweep = json.loads(out)["bucket_sweep"]
    assert sweep["network_source"] == "trace"
    network = sweep["network"]
    # a 2-rank all-reduce of d bytes moves d bytes each way over the one shaped class
    return 16 / network["b"] / 1e6, network


def test_the_fit_recovers_the_shaped_rate_at_500_mbit(capsys: pytest.CaptureFixture[str]) -> None:
    mbit, network = _fitted_mbit("500mbit", capsys)
    assert mbit == pytest.approx(500, rel=0.10)  # 523 Mbit/s as recorded
    assert network["a"] < 1e-3  # bench-network's latency there: 0.31 ms


def test_the_fit_at_200_mbit_shares_the_overlap_of_its_buckets(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Issue #44's 10% is not met here: 245 Mbit/s with a 13 ms intercept (the first
    bucket's all-reduce, slowed during the backward pass, overlaps the second, and the
    dedicated time shares the overlap out as if both used the link). Pinned so that a
    change of the fit shows in either direction."""
    mbit, network = _fitted_mbit("200mbit", capsys)
    assert mbit == pytest.approx(245, rel=0.03)
    assert network["a"] == pytest.approx(0.0134, rel=0.1)
