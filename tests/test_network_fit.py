"""The network planner fits from a trace against the rate the link was shaped to: the
lab's DDP MLP traced at 500 and 200 Mbit/s (traces/torch/lab_ddp_mlp/README.md has the
lab's own TCP and bench-network checks of each rate), and every shaped run of the lab's
DDP grid (bench/lab/results), each with its bench-network CSV from the same namespace."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from planner.ingest import netbench
from planner.ingest.kineto import load_kineto
from planner.planning import caramel
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


def test_the_fit_at_200_mbit_takes_its_overlapping_buckets_as_one_transfer(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The first bucket's all-reduce still runs when the second starts in every step,
    and the link is busy throughout: the block's bytes over its span, 210 Mbit/s (+5%).
    Sharing the overlap out as if each had half the link read 245 Mbit/s with a 13 ms
    intercept (+22%)."""
    mbit, network = _fitted_mbit("200mbit", capsys)
    assert mbit == pytest.approx(200, rel=0.10)
    assert network["a"] == 0.0  # one size of block: no latency can be told


GRID = REPO / "bench" / "lab" / "results"
SHAPED = sorted(GRID.glob("ddp-*/*/ddp-*/*mbit"))


def _rate(folder: Path) -> float:
    return float(re.fullmatch(r"(\d+)mbit", folder.name)[1])


@pytest.mark.parametrize("run", SHAPED, ids=lambda p: f"{p.parts[-4]}-{p.parts[-2]}-{p.name}")
def test_the_lab_grid_fit_recovers_the_rate(run: Path) -> None:
    """Every shaped run of the lab's DDP grid, held-out set, hook and Caramel runs (130 to
    6000 Mbit/s): the trace's own fit within 10% of the shaped rate and of `planner
    bench-network` run in the same namespace (net.csv)."""
    job = load_kineto(sorted((run / "trace" / "ranks").glob("rank*.json.gz")))
    rank = sorted(job.graphs)[0]
    fitted = caramel.trace_network_model(job.graphs[rank], job.trace.timings)
    assert fitted is not None
    mbit = 16 / fitted.b / 1e6
    bench = 16 / netbench.read_model(run / "net.csv").b / 1e6
    assert mbit == pytest.approx(bench, rel=0.10)
    assert mbit == pytest.approx(_rate(run), rel=0.10)


def test_the_grid_is_there() -> None:
    """The parametrized test above judges 17 runs: a lost folder fails here, not silently."""
    assert len(SHAPED) == 17
