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


SCENARIOS = {  # name: (variant, fault, seconds the other rank gets after rank 0 ended)
    "hook_kill": ("hook:{plans}/good.json", "kill:1:3", GATE + 10),
    "hook_stall": ("hook:{plans}/good.json", "stall:1:3", 0.1),
    "hook_nograd": ("hook:{plans}/good.json", "nograd:1:3", GATE + 10),
    "plans_differ": ("hook:{plans}/{{rank}}.json", None, GATE + 10),
    "own_stall": ("hook:{plans}/own.json", "stall:1:3", 0.1),
    "own_kill": ("hook:{plans}/own.json", "kill:1:3", GATE + 10),
    "own_nograd": ("hook:{plans}/own.json", "nograd:1:3", GATE + 10),
}
"""The faults, `AT_ONCE` jobs at a time (each on its own port): a job mostly waits (a
timeout, a stalled peer), so the file takes about half the sum of them."""
AT_ONCE = 3


def _start(tmp: Path, variant: str, fault: str | None) -> list[subprocess.Popen]:
    """Both ranks of one job, stderr to ``tmp/stderr<rank>``."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(_port()), "WORLD_SIZE": "2", "OMP_NUM_THREADS": "1"}  # fmt: skip
    argv = [sys.executable, str(EXAMPLE), "--variant", variant, "--steps", "6", "--out",
            str(tmp), "--gate-timeout", str(GATE)]  # fmt: skip
    argv += ["--fault", fault] if fault else []
    return [
        subprocess.Popen(
            argv, env={**env, "RANK": str(r)}, stderr=(tmp / f"stderr{r}").open("w")
        )  # fmt: skip
        for r in (0, 1)
    ]


@pytest.fixture(scope="module")
def runs(plans: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[dict, float]]:
    """Every scenario, `AT_ONCE` jobs at a time: until rank 0 exits (60 s at most), then
    its grace for rank 1.

    Per scenario: {rank: (exit status, stderr lines starting ``rank ``)}, with
    ``"after_fault"``: the seconds from the fault (its ``fault_rank1`` file) to rank 0's
    end, and the seconds from the job's start to rank 0's end.
    """
    (plans / "0.json").write_text((plans / "good.json").read_text())
    (plans / "1.json").write_text((plans / "bad.json").read_text())
    dirs = {name: tmp_path_factory.mktemp(name) for name in SCENARIOS}
    waiting = list(SCENARIOS)
    jobs: dict[str, tuple[float, list[subprocess.Popen]]] = {}  # started: start, ranks
    ended: dict[str, tuple[float, float]] = {}  # rank 0's end: monotonic, wall clock
    try:
        while waiting or any(n not in ended or ps[1].poll() is None for n, (_, ps) in jobs.items()):
            running = [n for n, (_, ps) in jobs.items() if any(p.poll() is None for p in ps)]
            while waiting and len(running) < AT_ONCE:
                name = waiting.pop(0)
                variant, fault, _ = SCENARIOS[name]
                jobs[name] = (time.monotonic(), _start(dirs[name], variant.format(plans=plans),
                                                       fault))  # fmt: skip
                running.append(name)
            now = time.monotonic()
            for name, (begun, (first, other)) in jobs.items():
                if name not in ended and first.poll() is not None:
                    ended[name] = (now, time.time())
                late = name in ended and now > ended[name][0] + SCENARIOS[name][2]
                if other.poll() is None and (late or now > begun + 60):
                    other.kill()
                if first.poll() is None and now > begun + 60:
                    first.kill()
            time.sleep(0.02)
    finally:
        for _, procs in jobs.values():
            for p in procs:
                if p.poll() is None:
                    p.kill()
                p.wait()
    out = {}
    for name, (begun, procs) in jobs.items():
        result: dict = {}
        for r, p in enumerate(procs):
            text = (dirs[name] / f"stderr{r}").read_text()
            result[r] = (p.returncode, [ln for ln in text.splitlines() if ln.startswith("rank ")])
        marks = list(dirs[name].glob("*/fault_rank*"))  # written just before the fault
        result["after_fault"] = ended[name][1] - marks[0].stat().st_mtime if marks else None
        out[name] = (result, ended[name][0] - begun)
    return out


def test_a_killed_rank_ends_the_survivor_with_the_transfer_named(runs: dict) -> None:
    result, took = runs["hook_kill"]
    assert result[1][0] == -9  # really killed
    code, lines = result[0]
    assert code == 1 and len(lines) == 1, lines
    assert "rank 0: error: transfer 'layer" in lines[0] and "on rank 0" in lines[0]
    assert took < 60


def test_a_stalled_rank_is_detected_within_the_gate_timeout(runs: dict) -> None:
    result, took = runs["hook_stall"]
    code, lines = result[0]
    assert code == 1 and len(lines) == 1, lines
    assert f"within {GATE:g} s" in lines[0] and "'layer" in lines[0]
    assert took < GATE + 30  # not gloo's 30 minutes


def test_a_bucket_that_never_arrives_ends_the_survivor(runs: dict) -> None:
    result, took = runs["hook_nograd"]  # no DDP buckets
    code, lines = result[0]
    assert code == 1 and len(lines) == 1, lines
    assert "rank 0: error: transfer 'layer" in lines[0] and "within 6 s" in lines[0]
    assert result[1][0] == 1  # and rank 1 fails too (DDP: reduction not finished)
    assert took < 60


def test_ranks_holding_different_plans_are_refused_at_registration(runs: dict) -> None:
    result, took = runs["plans_differ"]
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
    runs: dict,
) -> None:
    result, took = runs["own_stall"]
    code, lines = result[0]
    assert code == 1 and len(lines) == 1, lines
    assert lines[0].startswith("rank 0: error: step 3: a planned transfer failed on rank 0: ")
    assert NAMES_ALL in lines[0]
    assert "a peer rank stalled" in lines[0] and _gloo_timeout(lines[0])
    # the gate timeout, not gloo's 30 minutes: rank 1 fell asleep at the fault's time
    assert GATE - 1 < result["after_fault"] < GATE + 4, result["after_fault"]
    assert took < 60


def test_no_hook_a_killed_peer_ends_the_survivor_at_once(runs: dict) -> None:
    result, took = runs["own_kill"]
    assert result[1][0] == -9  # really killed
    code, lines = result[0]
    assert code == 1 and len(lines) == 1, lines
    assert lines[0].startswith("rank 0: error: step 3: a planned transfer failed on rank 0: ")
    assert NAMES_ALL in lines[0] and "by peer" in lines[0]  # gloo: closed or reset by peer
    assert result["after_fault"] < 4, result["after_fault"]
    assert took < 60


def test_no_hook_a_bucket_that_never_arrives_ends_the_survivor(runs: dict) -> None:
    result, took = runs["own_nograd"]  # no DDP bucket 5
    code, lines = result[0]
    assert code == 1 and len(lines) == 1, lines
    assert lines[0].startswith("rank 0: error: step 3: a planned transfer failed on rank 0: ")
    assert NAMES_ALL in lines[0] and _gloo_timeout(lines[0])
    assert GATE - 1 < result["after_fault"] < GATE + 4, result["after_fault"]
    assert result[1][0] == 1  # and rank 1 fails too, with one line
    assert len(result[1][1]) == 1 and "a planned transfer failed on rank 1" in result[1][1][0]
    assert took < 60
