"""Speed and fidelity of the simulator.

- op events per second of the list-scheduling loop on a ~200k-op layered DAG
  (target >= 1M/s), one sample and a batch of samples;
- 1000 baseline (random-order) samples of a ~5k-op DAG (target < 10 s);
- the replay error (predicted / measured - 1 of each traced step replayed with its
  own op times and observed order) over every trace in ../shared/traces/generated:
  median and largest magnitude.

Every speed figure is a median over ``--repeats`` runs, beside a baseline timed in the
same run on the same arrays, interleaved with it: the uncompiled Python loop (what runs
without numba, and for small work, see `planner.prediction._simkernel.SMALL_WORK`).

Run: ``nice python bench/bench_simulate.py`` from the repo root.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.synthetic import layered_dag  # noqa: E402
from planner.errors import InputError  # noqa: E402
from planner.ingest import detect  # noqa: E402
from planner.prediction import _simkernel, event_loop  # noqa: E402
from planner.prediction import compiled as graphs  # noqa: E402
from planner.prediction.replay import replay  # noqa: E402

LARGE = {"n_layers": 500, "recvs_per_layer": 4, "ops_per_layer": 191}  # ~200k ops
SMALL = {"n_layers": 130, "recvs_per_layer": 3, "ops_per_layer": 13}  # ~5k ops
TARGET_EVENTS = 1e6
TARGET_SAMPLES_S = 10.0
GENERATED = ROOT.parent / "shared" / "traces" / "generated"


def generated_runs() -> list[tuple[str, list[Path]]]:
    """Each generated job: a directory of traces, or the per-worker dirs of one TF job."""
    runs = []
    for framework in sorted(p for p in GENERATED.iterdir() if p.is_dir()):
        for job in sorted(p for p in framework.iterdir() if p.is_dir()):
            workers = sorted(p for p in job.iterdir() if p.is_dir())
            runs.append((f"{framework.name}/{job.name}", workers or [job]))
    return runs


def events_per_second(graph, oracle, samples: int, seed: int) -> tuple[float, float, float]:
    """(compile s, loop s, events/s) of `samples` baseline samples."""
    start = time.perf_counter()
    compiled = graphs.compile_graph(graph)
    seconds = graphs.op_seconds(compiled, oracle)
    compile_s = time.perf_counter() - start
    event_loop.run(compiled, seconds, samples=1, seed=seed)  # warm (JIT compile / load cache)
    times = []
    for _ in range(3):
        start = time.perf_counter()
        event_loop.run(compiled, seconds, samples=samples, seed=seed)
        times.append(time.perf_counter() - start)
    loop_s = statistics.median(times)
    return compile_s, loop_s, samples * len(graph) / loop_s


def loops_interleaved(graph, oracle, samples: int, repeats: int) -> tuple[float, float]:
    """Median seconds of the compiled and of the Python loop on the same arrays and draws,
    run alternately (compiled, Python, compiled, ...) so that machine load hits both."""
    c = graphs.compile_graph(graph)
    ticks = graphs.to_ticks(graphs.op_seconds(c, oracle))
    arrays = event_loop._arrays(c, None, (), graphs.capacities(c))
    rand = event_loop._draws(0, range(samples), len(graph))
    loops = {"compiled": _simkernel.compiled(), "python": _simkernel.python_list_schedule}
    times: dict[str, list[float]] = {name: [] for name in loops}
    out = [np.zeros((1, 1), np.int64), np.zeros((1, 1), np.int64)]
    loops["compiled"](ticks, *arrays, rand, False, *out, *np.zeros((2, samples), np.int64))
    for _ in range(repeats):
        for name, loop in loops.items():
            spans, done = np.zeros(samples, np.int64), np.zeros(samples, np.int64)
            start = time.perf_counter()
            loop(ticks, *arrays, rand, False, *out, spans, done)
            times[name].append(time.perf_counter() - start)
    return statistics.median(times["compiled"]), statistics.median(times["python"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    missed = False
    print(f"loop: {'numba' if _simkernel.ACCELERATED else 'pure Python (numba not installed)'}")

    start = time.perf_counter()
    graph, oracle = layered_dag(**LARGE, seed=args.seed)
    print(f"large: {len(graph)} ops, {graph.dag.number_of_edges()} edges "
          f"(built in {time.perf_counter() - start:.1f} s)")  # fmt: skip
    for samples in (1, 10):
        compile_s, loop_s, rate = events_per_second(graph, oracle, samples, args.seed)
        ok = rate >= TARGET_EVENTS
        missed |= not ok
        print(
            f"  {samples:>2} sample(s), median of 3: {loop_s:.3f} s -> "
            f"{rate / 1e6:.2f} M op events/s "
            f"(target >= 1 M/s: {'ok' if ok else 'MISSED'}); arrays built in {compile_s:.2f} s"
        )

    graph, oracle = layered_dag(**SMALL, seed=args.seed)
    compiled = graphs.compile_graph(graph)
    seconds = graphs.op_seconds(compiled, oracle)
    event_loop.run(compiled, seconds, samples=1)
    start = time.perf_counter()
    result = event_loop.run(compiled, seconds, samples=1000, seed=args.seed)
    took = time.perf_counter() - start
    ok = took < TARGET_SAMPLES_S
    missed |= not ok
    p5, p50, p95 = np.percentile(result.makespan, [5, 50, 95])
    print(
        f"small: {len(graph)} ops, 1000 baseline samples in {took:.2f} s "
        f"(target < {TARGET_SAMPLES_S:g} s: {'ok' if ok else 'MISSED'}); "
        f"makespan mean {result.makespan.mean() * 1e3:.2f} ms, p5 {p5 * 1e3:.2f}, "
        f"p50 {p50 * 1e3:.2f}, p95 {p95 * 1e3:.2f}"
    )
    if _simkernel.ACCELERATED:
        for layers, samples in ((20, 5), (130, 2)):
            g, o = layered_dag(layers, 12, recvs_per_layer=3, seed=args.seed)
            fast, slow = loops_interleaved(g, o, samples, args.repeats)
            n = samples * len(g)
            print(
                f"same-run baseline, {len(g)} ops x {samples} samples, median of "
                f"{args.repeats} interleaved: compiled {fast * 1e3:.2f} ms "
                f"({n / fast / 1e6:.2f} M events/s), Python loop {slow * 1e3:.1f} ms "
                f"({n / slow / 1e3:.0f} k events/s): {slow / fast:.0f}x"
            )

    errors = []
    for name, paths in generated_runs():
        try:
            job = detect.load(paths)
        except InputError as exc:
            print(f"replay {name}: not readable ({exc})")
            continue
        document = replay(job, seed=args.seed)
        steps = [(r["rank"], s) for r in document["ranks"] for s in r["steps"]]
        errs = np.array([s["replay_error"] for _, s in steps])
        errors.extend(errs.tolist())
        rank, worst = max(steps, key=lambda x: abs(x[1]["replay_error"]))
        print(
            f"replay {name}: {len(steps)} steps, median {np.median(errs) * 100:+.2f}%, "
            f"worst {worst['replay_error'] * 100:+.2f}% ({rank} step {worst['iteration']})"
        )
    if errors:
        e = np.array(errors)
        print(
            f"replay error over {len(e)} steps of all generated traces: median "
            f"{np.median(e) * 100:+.2f}%, median |e| {np.median(np.abs(e)) * 100:.2f}%, "
            f"max |e| {np.abs(e).max() * 100:.2f}% (signed {e[np.argmax(np.abs(e))] * 100:+.2f}%)"
        )
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
