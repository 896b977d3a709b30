"""Smoke test of the shaped-network lab (bench/lab): one small rate end to end.

Needs root, `ip` and `tc` (htb, u32), and torch for the DDP job; skips naming what is
missing otherwise. Gates on signs and rankings only (a 2-core CI machine is noisy): the
shaped rate is measured within 10% by a timed TCP transfer, per-source classes shape
what leaves their address, the DDP job at a low rate is network-bound in both the
measurement and planner's prediction, and no namespace or process is left behind after
a run, a SIGTERM, a SIGKILL of the lab, or a rank killed mid-job.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _missing() -> str | None:
    if os.geteuid() != 0:
        return "needs root (network namespaces and tc)"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"needs `{tool}` on PATH"
    probe = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True)
    if probe.returncode != 0:
        return f"`ip netns` does not work here: {probe.stderr.strip()}"
    return None


needs_lab = pytest.mark.skipif(_missing() is not None, reason=str(_missing()))
needs_torch = pytest.mark.skipif(
    importlib.util.find_spec("torch") is None, reason="needs torch (the DDP job)"
)
sys.path.insert(0, str(REPO))
LAB = [sys.executable, "-m", "bench.lab"]


def _lab_namespaces(pid: int) -> list[str]:
    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return [n.split()[0] for n in names.splitlines() if n.startswith(f"planner-lab-{pid}-")]


def _wait(predicate, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return predicate()


def _left_over(marker: str) -> list[int]:
    """Live processes whose command line names `marker` (the run's output folder)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                if marker in (entry / "cmdline").read_bytes().decode(errors="replace"):
                    found.append(int(entry.name))
            except OSError:
                pass
    return found


def test_rates_and_statistics() -> None:
    """The pure parts, everywhere: rate parsing, the ratio's interval, Spearman."""
    import numpy as np

    from bench.lab import netns, stats

    assert netns.parse_rate("1500mbit") == 1.5e9 and netns.parse_rate("unshaped") is None
    with pytest.raises(ValueError):
        netns.parse_rate("fast")
    rng = np.random.default_rng(1)
    base = list(0.1 + 0.002 * rng.standard_normal(40))
    slower = [1.1 * t for t in base[::-1]]
    blocks = [i // 4 for i in range(40)]
    ratio, low, high = stats.ratio_interval((slower, blocks), (base, blocks))
    assert low <= ratio <= high and low > 1.0 and abs(ratio - 1.1) < 0.02
    _, low, high = stats.ratio_interval((base[::-1], blocks), (base, blocks))
    assert low < 1.0 < high
    assert stats.spearman([1, 2, 3, 4], [10, 20, 40, 30]) == pytest.approx(0.8)
    assert stats.spearman([1, 2], [2, 1]) is None


@needs_lab
def test_shaped_rate_and_per_source_classes() -> None:
    from bench.lab import netns
    from bench.lab.run import check_rate

    with netns.shaped_namespace("100mbit", sources=["127.0.0.3"]) as ns:
        shared = check_rate(ns, 5, tries=3)  # the fastest of 3: a loaded CI machine
        own = check_rate(ns, 5, address="127.0.0.3", tries=3)
        classes = netns.qdisc_stats(ns)
    assert ns not in netns.namespaces()
    assert abs(shared["mbit_s"] / 100 - 1) < 0.10, shared
    assert abs(own["mbit_s"] / 100 - 1) < 0.10, own
    sent = {  # bytes per class: the per-source class carried its address's transfer
        line.split()[2]: int(nxt.split()[1])
        for line, nxt in zip(classes.splitlines(), classes.splitlines()[1:], strict=False)
        if line.startswith("class htb")
    }
    assert sent["1:11"] > 4e6 and sent["1:10"] > 4e6, classes


@needs_lab
@needs_torch
def test_ddp_end_to_end(tmp_path: Path) -> None:
    out = tmp_path / "lab"
    argv = [*LAB, "--job", "ddp-tiny", "--rate", "50mbit", "--steps", "4", "--block", "2",
            "--repeats", "1", "--untraced-steps", "3", "--traced-steps", "3",
            "--net-repeats", "3", "--check-mb", "5", "--no-trace-fit", "--no-aa",
            "--out", str(out)]  # fmt: skip
    done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "| plain (as traced) |" in done.stdout
    run = json.loads((out / "lab.json").read_text())["runs"][0]
    assert run["namespace"] not in subprocess.run(["ip", "netns", "list"], capture_output=True,
                                                  text=True).stdout  # fmt: skip
    assert abs(run["check"]["mbit_s"] / 50 - 1) < 0.10
    # at 50 Mbit/s the tiny job is network-bound: each step moves twice its gradients
    wire = 2 * run["gradient_bytes"] * 8 / 50e6
    rows = run["summary"]["rows"]
    assert rows["plain"]["median_s"] > 0.8 * wire, (rows["plain"], wire)
    assert rows["plain"]["predicted_s"] > 0.8 * wire, (rows["plain"], wire)
    for phase in run["phases"].values():
        assert phase["foreign_cores"] >= 0 and phase["own_cores"] > 0
    assert run["summary"]["blocks"] == len(run["repeats"][0]["block_foreign_cores"]) > 0


@needs_lab
@pytest.mark.parametrize("how", ["SIGTERM", "SIGKILL"])
def test_namespace_gone_when_the_lab_is_killed(tmp_path: Path, how: str) -> None:
    out = tmp_path / "lab"  # a 10 Mbit/s check of 100 MB runs for 80 s: killed in it
    argv = [*LAB, "--check-rate", "--rate", "10mbit", "--check-mb", "100", "--out", str(out)]
    lab = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        assert _wait(lambda: _lab_namespaces(lab.pid), 30), "the lab made no namespace"
        (name,) = _lab_namespaces(lab.pid)
        assert _wait(lambda: subprocess.run(["ip", "netns", "pids", name], capture_output=True,
                                            text=True).stdout.strip(), 30)  # fmt: skip
        lab.send_signal(getattr(signal, how))
        lab.wait(timeout=30)
        assert _wait(lambda: not _lab_namespaces(lab.pid), 15), f"{name} left after {how}"
        assert _wait(lambda: not _left_over("ratecheck.py"), 10), "processes left in it"
    finally:
        if lab.poll() is None:
            lab.kill()
            lab.wait()
    if how == "SIGTERM":
        assert lab.returncode == 128 + signal.SIGTERM


@needs_lab
@needs_torch
def test_namespace_gone_when_a_rank_dies(tmp_path: Path) -> None:
    out = tmp_path / "lab"
    argv = [*LAB, "--job", "ddp-tiny", "--rate", "50mbit", "--untraced-steps", "100000",
            "--no-bench-network", "--check-mb", "2", "--out", str(out)]  # fmt: skip
    lab = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        log = out / "ddp-tiny" / "50mbit" / "trace" / "rank1.log"
        assert _wait(log.exists, 60), "the job did not start"
        (name,) = _lab_namespaces(lab.pid)
        ranks = _left_over(str(out / "ddp-tiny" / "50mbit" / "trace" / "spec.json"))
        assert ranks
        time.sleep(1.0)
        os.kill(max(ranks), signal.SIGKILL)
        _, err = lab.communicate(timeout=90)
        assert lab.returncode != 0
        assert b"DDP job (trace) failed" in err, err[-2000:]
        assert not _lab_namespaces(lab.pid), f"{name} left after a rank died"
        assert _wait(lambda: not _left_over(str(out)), 10), "ranks left running"
    finally:
        if lab.poll() is None:
            lab.kill()
            lab.wait()
