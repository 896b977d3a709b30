"""The README's demo, `demo-lab`: planner's advice on the lab's DDP trace at 1500 Mbit/s
pays, measured (issue #44 point 5). The demo is that lab run's trace and benchmark, and
the measurements are the same run's (bench/lab/results/ddp-heldout/mlp/lab.json)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from conftest import REPO, run_cli

from bench.lab import stats

LAB = REPO / "bench" / "lab" / "results" / "ddp-heldout" / "mlp"
RUN = LAB / "ddp-mlp" / "1500mbit"
DEMO_LAB = REPO / "traces" / "demo_lab"


def _measured() -> dict:
    runs = json.loads((LAB / "lab.json").read_text())["runs"]
    (run,) = [r for r in runs if r["job"] == "ddp-mlp" and r["rate"] == "1500mbit"]
    return run


def _steps(run: dict, label: str) -> tuple[list[float], list[int]]:
    """A configuration's step times over both repeats and their blocks, as the lab pools
    them (`bench.lab.run.summarize`)."""
    times: list[float] = []
    blocks: list[int] = []
    for k, repeat in enumerate(run["repeats"]):
        times += repeat["times"][label]
        blocks += [1000 * k + b for b in repeat["blocks"][label]]
    return times, blocks


def test_the_demo_is_the_lab_runs_trace_and_benchmark() -> None:
    for rank in ("rank0.json.gz", "rank1.json.gz"):
        ours = gzip.decompress((DEMO_LAB / rank).read_bytes())
        assert ours == gzip.decompress((RUN / "trace" / "ranks" / rank).read_bytes())
    assert (DEMO_LAB / "network.csv").read_bytes() == (RUN / "net.csv").read_bytes()
    untraced = _measured()["trace"]["untraced_s"]
    assert f"--untraced-step-time {untraced:.4f}" in (REPO / "README.md").read_text()


def test_the_demos_advice_is_measured_faster(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The recommended cap: faster than DDP's default beyond the measured interval,
    within the interval of the fastest cap measured, and its predicted step within 5% of
    the measured median."""
    run = _measured()
    args = ["analyze", "demo-lab", "--network", "demo-lab/network.csv",
            "--untraced-step-time", f"{run['trace']['untraced_s']:.4f}", "--json"]  # fmt: skip
    code, out, err = run_cli(args, capsys)
    assert code == 0, err
    report = json.loads(out)
    verdict = report["verdict"]
    assert verdict["action"] == "set_bucket_cap"
    cap = verdict["bucket_cap_mb"]
    rows = run["summary"]["rows"]
    chosen = rows[f"cap{cap:g}"]
    steps = _steps(run, f"cap{cap:g}")
    assert stats.ratio_interval(steps, _steps(run, "plain"))[2] < 1.0  # measurably faster
    measured = [label for label in rows if label.startswith("cap")]
    fastest = min(measured, key=lambda label: rows[label]["median_s"])
    _, low, _ = stats.ratio_interval(steps, _steps(run, fastest))
    assert low <= 1.0  # the fastest measured cap is inside the recommended one's interval
    caps = report["bucket_sweep"]["caps"]
    predicted = {c["bucket_cap_mb"]: c["predicted_step_time"] for c in caps}
    assert abs(predicted[cap] / chosen["median_s"] - 1) < 0.05
    readme = (REPO / "README.md").read_text()
    assert f"bucket_cap_mb={cap:g}`" in readme and f"{(1 - chosen['ratio']):.1%}" in readme
