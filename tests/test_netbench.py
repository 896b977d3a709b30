"""`planner.ingest.netbench`: a benchmark whose process died fails at once, naming the rank."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from planner.ingest import netbench

pytest.importorskip("torch")


def test_a_dead_rank_fails_the_benchmark_at_once(tmp_path: Path) -> None:
    # a script without a main guard: the spawned ranks re-import it and die while
    # bootstrapping, before any report; the parent used to wait the whole timeout
    script = tmp_path / "no_guard.py"
    script.write_text(
        "from planner.ingest import netbench\n"
        "netbench.bench_allreduce([64], repeats=1, timeout=120)\n"
    )
    root = Path(__file__).resolve().parents[1]
    start = time.monotonic()
    env = {**os.environ, "PYTHONPATH": str(root)}
    command = [sys.executable, str(script)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=100, env=env)
    elapsed = time.monotonic() - start
    assert done.returncode != 0
    last = done.stderr.strip().splitlines()[-1]
    assert "RuntimeError: rank 0 exited with code 1 before the benchmark ended" in last, last
    assert "__main__" in last
    assert elapsed < 60  # the timeout was 120 s


def test_the_benchmark_reports_every_size_in_order() -> None:
    rows = netbench.bench_allreduce([4096, 64], repeats=2, warmup=0)
    assert [r["nbytes"] for r in rows] == [4096, 64]
    assert all(r["repeats"] == 2 and 0 < r["seconds_min"] <= r["seconds"] for r in rows)
