"""Same inputs, byte-identical output files: across runs and with PYTHONHASHSEED varied.

`planner analyze -o DIR` runs in fresh interpreters (so set and dict orders of str keys
really change with the hash seed); every file of the two output folders must match byte
for byte. The outputs carry no timestamp, so nothing is masked.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import DEMO, SHARED, need

REPO = Path(__file__).resolve().parents[1]
TORCH_SMALL = REPO / "traces" / "torch" / "hta_trace_compare_base.json.gz"
RESNET = SHARED / "generated" / "torch" / "resnet_ddp_bucket1mb"
MLP = SHARED / "generated" / "tf" / "mlp_ps_betweengraph_sync"

INPUTS = {
    "tf-demo": lambda: [DEMO],
    "tf-two-workers": lambda: [need(MLP / "worker0"), MLP / "worker1"],
    "torch-hta": lambda: [TORCH_SMALL],
    "torch-ddp-two-ranks": lambda: [need(RESNET / "rank0.json.gz"), RESNET / "rank1.json.gz"],
}


def _start(inputs: list[Path], output: Path, seed: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-c", "from planner_cli.main import main; main()", "analyze"]
        + [str(p) for p in inputs]
        + ["-o", str(output)],
        env={**os.environ, "PYTHONHASHSEED": seed},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))}


@pytest.mark.parametrize("label", sorted(INPUTS))
def test_analyze_outputs_are_byte_identical_across_hash_seeds(label: str, tmp_path: Path) -> None:
    inputs = INPUTS[label]()
    seeds = ("0", "4242")
    runs = {seed: _start(inputs, tmp_path / f"seed{seed}", seed) for seed in seeds}
    for seed, proc in runs.items():
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, (seed, err.decode())
    first, second = (_files(tmp_path / f"seed{s}") for s in seeds)
    assert "report.json" in first and any(name.startswith("priorities_") for name in first)
    assert sorted(first) == sorted(second)
    differing = [name for name in first if first[name] != second[name]]
    assert not differing, differing
