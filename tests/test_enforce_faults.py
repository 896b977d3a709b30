"""Enforcement fails loudly, on every rank: real 2-process gloo jobs on 127.0.0.1.

Each fault is injected into examples/train_ddp.py (``--fault``), with the DDP hook on
(``good.json``, depth 2: the gated hook) and with a plan equal to DDP's own order
(``own.json``: no hook, DDP applies it; the process group's timeout is bounded by the
gate timeout instead); every surviving rank must end with one line naming the
transfer, well within 60 s, instead of training on alone or waiting for gloo's
30-minute timeout.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("torch.distributed")

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "train_ddp.py"
GATE = 6.0  # the hook's timeout in these runs (s)


@pytest.fixture(scope="module")
def plans(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("plans")
    subprocess.run([sys.executable, str(EXAMPLE), "--write-plans", str(out)], check=True,
                   timeout=60, env={**os.environ, "PYTHONPATH": str(ROOT)})  # fmt: skip
    layers = json.loads((out / "good.json").read_text())["groups"]  # backward order
    own = [{"name": g["name"], "params": g["params"], "depth": 1} for g in layers]
    doc = {"schema": "planner.bucket_plan/1", "algorithm": "ddp-own", "groups": own}
    (out / "own.json").write_text(json.dumps(doc))  # DDP's own buckets: no hook
    return out


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _run(
    tmp: Path, variant: str, fault: str | None, wait_for: int = 0, grace: float = GATE + 10
) -> tuple[dict, float]:
    """Start both ranks; wait until rank `wait_for` exits (60 s at most); kill the rest.

    Returns {rank: (exit status, stderr lines without profiler noise)} and the seconds
    until rank `wait_for` ended (``result["after_fault"]``: from the fault's time).
    """
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(_port()), "WORLD_SIZE": "2", "OMP_NUM_THREADS": "1"}  # fmt: skip
    argv = [sys.executable, str(EXAMPLE), "--variant", variant, "--steps", "6", "--out",
            str(tmp), "--gate-timeout", str(GATE)]  # fmt: skip
    argv += ["--fault", fault] if fault else []
    procs = [
        subprocess.Popen(argv, env={**env, "RANK": str(r)}, stderr=subprocess.PIPE, text=True)
        for r in (0, 1)
    ]
    start = time.monotonic()
    try:
        procs[wait_for].wait(timeout=60)
        took = time.monotonic() - start
        ended = time.time()
        other = procs[1 - wait_for]
        try:
            other.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            other.kill()
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    result = {}
    for r, p in enumerate(procs):
        p.wait()
        lines = [ln for ln in (p.stderr.read() if p.stderr else "").splitlines()
                 if ln.startswith("rank ")]  # fmt: skip
        result[r] = (p.returncode, lines)
    marks = list(tmp.glob("*/fault_rank*"))  # written by the faulty rank just before
    result["after_fault"] = ended - marks[0].stat().st_mtime if marks else None
    return result, took


def test_a_killed_rank_ends_the_survivor_with_the_transfer_named(
    plans: Path, tmp_path: Path
) -> None:
    result, took = _run(tmp_path, f"hook:{plans}/good.json", "kill:1:3")
    assert result[1][0] == -9  # really killed
    code, lines = result[0]
    assert code == 1 and len(lines) == 1, lines
    assert "rank 0: error: transfer 'layer" in lines[0] and "on rank 0" in lines[0]
    assert took < 60


def test_a_stalled_rank_is_detected_within_the_gate_timeout(plans: Path, tmp_path: Path) -> None:
    result, took = _run(tmp_path, f"hook:{plans}/good.json", "stall:1:3", grace=0.1)
    code, lines = result[0]
    assert code == 1 and len(lines) == 1, lines
    assert f"within {GATE:g} s" in lines[0] and "'layer" in lines[0]
    assert took < GATE + 30  # not gloo's 30 minutes


def test_a_bucket_that_never_arrives_ends_the_survivor(plans: Path, tmp_path: Path) -> None:
    result, took = _run(tmp_path, f"hook:{plans}/good.json", "nograd:1:3")  # no DDP buckets
    code, lines = result[0]
    assert code == 1 and len(lines) == 1, lines
    assert "rank 0: error: transfer 'layer" in lines[0] and "within 6 s" in lines[0]
    assert result[1][0] == 1  # and rank 1 fails too (DDP: reduction not finished)
    assert took < 60


def test_ranks_holding_different_plans_are_refused_at_registration(
    plans: Path, tmp_path: Path
) -> None:
    (plans / "0.json").write_text((plans / "good.json").read_text())
    (plans / "1.json").write_text((plans / "bad.json").read_text())
    result, took = _run(tmp_path, f"hook:{plans}/{{rank}}.json", None)
    for rank in (0, 1):
        code, lines = result[rank]
        assert code == 1 and len(lines) == 1, lines
        assert "hold different plans" in lines[0]
        assert "order_index 0 ('layer10'): name 'layer10' here, 'layer0' there" in lines[0] or (
            "order_index 0 ('layer0'): name 'layer0' here, 'layer10' there" in lines[0]
        )
    assert took < 60


# ------------------------------------------------- a plan equal to DDP's order: no hook
# DDP's C++ all-reduce fails at the process group's timeout, bounded by the gate
# timeout at registration; `PlanCommHook.explain` names rank, step and transfers.

NAMES_ALL = (
    "one of the 6 planned transfers 'layer10', 'layer8', 'layer6', 'layer4', ... (DDP "
    "buckets 0 to 5, reduced in that order; without a hook DDP does not tell which)"
)


def _gloo_timeout(line: str) -> bool:
    """gloo's words for the timeout: its own recv's, or the pair closed by another op's."""
    return "Timed out waiting 6000ms" in line or "Application timeout caused pair" in line


def test_no_hook_a_peer_that_hangs_alive_ends_the_survivor_within_the_gate_timeout(
    plans: Path, tmp_path: Path
) -> None:
    result, took = _run(tmp_path, f"hook:{plans}/own.json", "stall:1:3", grace=0.1)
    code, lines = result[0]
    assert code == 1 and len(lines) == 1, lines
    assert lines[0].startswith("rank 0: error: step 3: a planned transfer failed on rank 0: ")
    assert NAMES_ALL in lines[0]
    assert "a peer rank stalled" in lines[0] and _gloo_timeout(lines[0])
    # the gate timeout, not gloo's 30 minutes: rank 1 fell asleep at the fault's time
    assert GATE - 1 < result["after_fault"] < GATE + 4, result["after_fault"]
    assert took < 60


def test_no_hook_a_killed_peer_ends_the_survivor_at_once(plans: Path, tmp_path: Path) -> None:
    result, took = _run(tmp_path, f"hook:{plans}/own.json", "kill:1:3")
    assert result[1][0] == -9  # really killed
    code, lines = result[0]
    assert code == 1 and len(lines) == 1, lines
    assert lines[0].startswith("rank 0: error: step 3: a planned transfer failed on rank 0: ")
    assert NAMES_ALL in lines[0] and "by peer" in lines[0]  # gloo: closed or reset by peer
    assert result["after_fault"] < 4, result["after_fault"]
    assert took < 60


def test_no_hook_a_bucket_that_never_arrives_ends_the_survivor(plans: Path, tmp_path: Path) -> None:
    result, took = _run(tmp_path, f"hook:{plans}/own.json", "nograd:1:3")  # no DDP bucket 5
    code, lines = result[0]
    assert code == 1 and len(lines) == 1, lines
    assert lines[0].startswith("rank 0: error: step 3: a planned transfer failed on rank 0: ")
    assert NAMES_ALL in lines[0] and _gloo_timeout(lines[0])
    assert GATE - 1 < result["after_fault"] < GATE + 4, result["after_fault"]
    assert result[1][0] == 1  # and rank 1 fails too, with one line
    assert len(result[1][1]) == 1 and "a planned transfer failed on rank 1" in result[1][1][0]
    assert took < 60
