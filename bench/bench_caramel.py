"""Whole Caramel pipeline: the largest real trace the ingest reads, and a 200k-op DAG.

    python bench/bench_caramel.py [--ops 200000] [--trace PATH] [--repeats 5] [--tracemalloc]

Prints, for ingest and for the whole of `caramel()` (Stage 1 + Stage 2 + batching +
packing + depth), the median seconds over `--repeats` plain runs (the synthetic DAG: one)
and this process's peak RSS after it. No tracer runs around timed code (tracemalloc
slows this code 6-8x); `--tracemalloc` adds one separate, untimed pass per stage for the
peak traced Python memory. Targets: < 2 s on the real trace, < 60 s on the synthetic DAG.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import sys
import time
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from synthetic_allreduce import allreduce_dag  # noqa: E402

from planner.model.oracle import NetworkModel, TimeOracle  # noqa: E402
from planner.planning.caramel import caramel  # noqa: E402

SHARED = Path(__file__).resolve().parents[2] / "shared" / "traces"
LARGEST = (
    SHARED / "public" / "HolisticTraceAnalysis" / "tests" / "data" / "df_index_resolver"
    / "df_index_resolver.json.gz"
)  # fmt: skip
GLOO = NetworkModel(a=3.1e-4, b=9.8e-10)  # fitted on this machine (bench-network, 2 ranks)


OPTIONS = {"repeats": 5, "tracemalloc": False}


def measure(label: str, fn, repeats: int | None = None):  # noqa: ANN001, ANN201 - a bench helper
    """(result, median seconds) of `repeats` plain runs of fn; memory apart from timing."""
    times = []
    for _ in range(repeats or OPTIONS["repeats"]):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    seconds = statistics.median(times)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    line = f"{label}: median {seconds:.3f} s of {len(times)}, process peak RSS {rss:.0f} MiB"
    if OPTIONS["tracemalloc"]:
        tracemalloc.start()
        fn()
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        line += f", traced peak {peak / 2**20:.0f} MiB (separate untimed pass)"
    print(line)
    return result, seconds


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ops", type=int, default=200_000)
    parser.add_argument("--trace", type=Path, default=LARGEST)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--tracemalloc", action="store_true")
    args = parser.parse_args()
    OPTIONS.update(repeats=args.repeats, tracemalloc=args.tracemalloc)

    if args.trace.exists():
        from planner.ingest.kineto import load_kineto
        from planner.job.analysis import oracles

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
        "build synthetic", lambda: allreduce_dag(layers, 48, params_per_layer=1), repeats=1
    )
    oracle = TimeOracle(times=op_time, network=GLOO)
    plan, seconds = measure(
        f"caramel synthetic: {len(graph)} ops, {graph.dag.number_of_edges()} edges, "
        f"{len(graph.transfers)} params",
        lambda: caramel(graph, oracle),
        repeats=1,
    )
    print(f"  edges {plan.inputs['edges']}, groups {len(plan.inputs['groups'])}, "
          f"threshold {plan.inputs['threshold_bytes']} B, predicted iteration "
          f"{plan.inputs['packing_iteration_time']:.3f} s, target < 60 s: "
          f"{'ok' if seconds < 60 else 'MISSED'}")  # fmt: skip


if __name__ == "__main__":
    main()
