"""Speed of TIC/TAC on synthetic layered DAGs: ResNet-152 scale and 200k ops / 2k recvs.

Run: ``python bench/bench_tictac.py`` (from the repo root, or with the package
installed). ``--skip-reference`` leaves out the slow literal TAC.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.synthetic import layered_dag  # noqa: E402
from planner.planning.tictac import tac, tac_reference, tic, tic_reference  # noqa: E402

T = TypeVar("T")

SMALL = {"n_layers": 121, "recvs_per_layer": 3, "ops_per_layer": 12}  # ~4.6k ops, 363 recvs
LARGE = {"n_layers": 500, "recvs_per_layer": 4, "ops_per_layer": 191}  # ~200k ops, 2k recvs
TARGET_SMALL_S = 0.1
TARGET_LARGE_S = 30.0


def timed(fn: Callable[[], T], repeat: int = 1) -> tuple[float, T]:
    """Best wall time of `repeat` runs, and the last result."""
    best = float("inf")
    result: T
    for _ in range(repeat):
        start = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - start)
    return best, result


def verdict(seconds: float, target: float) -> str:
    return f"(target < {target:g} s: {'ok' if seconds < target else 'MISSED'})"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--skip-reference", action="store_true")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    missed = False
    for label, shape, target in (
        ("small", SMALL, TARGET_SMALL_S),
        ("large", LARGE, TARGET_LARGE_S),
    ):
        build_s, (graph, oracle) = timed(lambda shape=shape: layered_dag(**shape, seed=args.seed))
        n_recv = len(graph.recvs)
        print(f"{label}: {len(graph)} ops, {n_recv} recvs (built in {build_s:.2f} s)")
        repeat = 5 if label == "small" else 1
        tac_s, tac_plan = timed(lambda g=graph, o=oracle: tac(g, o), repeat)
        tic_s, tic_plan = timed(lambda g=graph: tic(g), repeat)
        missed |= tac_s >= target or tic_s >= target
        print(f"  TAC fast       {tac_s:9.4f} s  {verdict(tac_s, target)}")
        print(f"  TIC fast       {tic_s:9.4f} s  {verdict(tic_s, target)}")
        if label == "small" and not args.skip_reference:
            ref_s, ref_plan = timed(lambda g=graph, o=oracle: tac_reference(g, o))
            ref_tic_s, ref_tic_plan = timed(lambda g=graph: tic_reference(g))
            same = ref_plan == tac_plan and ref_tic_plan == tic_plan
            print(f"  TAC reference  {ref_s:9.4f} s  (reference/fast = {ref_s / tac_s:,.0f}x)")
            print(
                f"  TIC reference  {ref_tic_s:9.4f} s  (reference/fast = {ref_tic_s / tic_s:,.0f}x)"
            )
            print(f"  plans identical to the reference: {same}")
            missed |= not same
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
