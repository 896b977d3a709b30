"""Whole Caramel pipeline: the largest real trace the ingest reads, and a 200k-op DAG.

    python bench/bench_caramel.py [--ops 200000] [--trace PATH]

Prints seconds and peak traced Python memory (tracemalloc) for each stage of
`caramel()` (Stage 1 + Stage 2 + batching + packing + depth); ingest is timed apart.
Targets: < 2 s on the real trace, < 60 s on the synthetic DAG.
"""

from __future__ import annotations

import argparse
import sys
import time
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from synthetic_allreduce import allreduce_dag  # noqa: E402

from planner.oracle import NetworkModel, TimeOracle  # noqa: E402
from planner.schedule.caramel import caramel  # noqa: E402

SHARED = Path(__file__).resolve().parents[2] / "shared" / "traces"
LARGEST = (
    SHARED / "public" / "HolisticTraceAnalysis" / "tests" / "data" / "df_index_resolver"
    / "df_index_resolver.json.gz"
)  # fmt: skip
GLOO = NetworkModel(a=3.1e-4, b=9.8e-10)  # fitted on this machine (bench-network, 2 ranks)


def measure(label: str, fn):  # noqa: ANN001, ANN201 - a bench helper
    tracemalloc.start()
    start = time.perf_counter()
    result = fn()
    seconds = time.perf_counter() - start
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    print(f"{label}: {seconds:.2f} s, peak {peak / 2**20:.0f} MiB")
    return result, seconds


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ops", type=int, default=200_000)
    parser.add_argument("--trace", type=Path, default=LARGEST)
    args = parser.parse_args()

    if args.trace.exists():
        from planner.analysis import oracles
        from planner.ingest.kineto import load_kineto

        job, _ = measure(f"ingest {args.trace.name}", lambda: load_kineto([args.trace]))
        times = oracles(job)
        for rank, graph in job.graphs.items():
            plan, seconds = measure(
                f"caramel {rank}: {len(graph)} ops, {graph.dag.number_of_edges()} edges",
                lambda g=graph, r=rank: caramel(g, times[r], rank=r),
            )
            print(f"  params {plan.inputs['n_params']}, edges {plan.inputs['edges']}, "
                  f"groups {len(plan.inputs['groups'])}, target < 2 s: "
                  f"{'ok' if seconds < 2 else 'MISSED'}")  # fmt: skip
    else:
        print(f"skipped real trace: {args.trace} not found")

    per_layer = 100  # 2 * 48 compute + join pair + grad + collective
    layers = max(1, args.ops // per_layer)
    (graph, op_time), _ = measure(
        "build synthetic", lambda: allreduce_dag(layers, 48, params_per_layer=1)
    )
    oracle = TimeOracle(times=op_time, network=GLOO)
    plan, seconds = measure(
        f"caramel synthetic: {len(graph)} ops, {graph.dag.number_of_edges()} edges, "
        f"{len(graph.transfers)} params",
        lambda: caramel(graph, oracle),
    )
    print(f"  edges {plan.inputs['edges']}, groups {len(plan.inputs['groups'])}, "
          f"threshold {plan.inputs['threshold_bytes']} B, predicted iteration "
          f"{plan.inputs['packing_iteration_time']:.3f} s, target < 60 s: "
          f"{'ok' if seconds < 60 else 'MISSED'}")  # fmt: skip


if __name__ == "__main__":
    main()
