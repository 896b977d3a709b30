"""Bucket advice against real runs: predicted vs measured step time per bucket_cap_mb.

1. Trains a communication-heavy MLP with DDP (gloo, 2 ranks on 127.0.0.1) at
   bucket_cap_mb=25 and profiles a few steps (torch.profiler, record_shapes).
2. `planner.analysis.bucket_sweep` on that trace predicts the step time of every cap;
   the bench takes the recommended cap (else the best predicted), the default 25 MB and
   the worst predicted cap.
3. Trains again at those three caps, interleaved (rounds of --steps steps per cap, a new
   DDP wrapper each time, the first steps after each wrap dropped: DDP rebuilds its
   buckets after its first iteration), and prints the median measured step time beside
   the prediction, the error, and whether the ranking by prediction matches.

    python bench/bench_ddp_buckets.py [--rounds 3] [--steps 12] [--network net.csv]

Needs torch (CPU is enough). Figures depend on the machine's load: run it on a quiet one.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

WIDTH, LAYERS, BATCH = 1536, 6, 16
DROP = 2  # steps dropped after each wrap (bucket rebuild, warm caches)


def _model() -> nn.Module:
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for _ in range(LAYERS):
        layers += [nn.Linear(WIDTH, WIDTH), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(WIDTH, 10))


def _step(ddp: nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor) -> None:
    record = torch.profiler.record_function
    opt.zero_grad(set_to_none=True)
    with record("forward"):
        loss = nn.functional.cross_entropy(ddp(x), y)
    with record("backward"):
        loss.backward()
    with record("optimizer_step"):
        opt.step()


def _worker(rank: int, port: int, out: str, caps: list[float], rounds: int, steps: int) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    model = _model()
    x, y = torch.randn(BATCH, WIDTH), torch.randint(0, 10, (BATCH,))
    if not caps:  # the profiling run at the default cap
        ddp = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=25)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
        path = os.path.join(out, f"rank{rank}.json")
        with torch.profiler.profile(
            activities=[torch.profiler.ProfilerActivity.CPU],
            schedule=torch.profiler.schedule(wait=1, warmup=1, active=5),
            on_trace_ready=lambda p: p.export_chrome_trace(path),
            record_shapes=True,
        ) as prof:
            for _ in range(8):
                _step(ddp, opt, x, y)
                prof.step()
    else:
        times: dict[float, list[float]] = {c: [] for c in caps}
        for _ in range(rounds):
            for cap in caps:
                ddp = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=cap)
                opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
                for i in range(steps + DROP):
                    dist.barrier()
                    t0 = time.perf_counter()
                    _step(ddp, opt, x, y)
                    if i >= DROP:
                        times[cap].append(time.perf_counter() - t0)
        if rank == 0:
            with open(os.path.join(out, "times.txt"), "w") as handle:
                for cap, values in times.items():
                    handle.write(f"{cap} {' '.join(map(str, values))}\n")
    dist.destroy_process_group()


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _run(out: str, caps: list[float], rounds: int, steps: int) -> None:
    mp.spawn(_worker, args=(_port(), out, caps, rounds, steps), nprocs=2, join=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--network", type=Path, help="benchmark model (bench-network CSV)")
    args = parser.parse_args()
    from planner import analysis, netbench
    from planner.ingest.kineto import load_kineto

    with tempfile.TemporaryDirectory() as out:
        _run(out, [], 0, 0)
        job = load_kineto([Path(out) / "rank0.json", Path(out) / "rank1.json"])
        network = netbench.read_model(args.network) if args.network else None
        sweep = analysis.bucket_sweep(job, network)
        if sweep is None:
            print("no bucket sweep: the trace has no gradient-ready times", file=sys.stderr)
            return 1
        predicted = {c["bucket_cap_mb"]: c["predicted_step_time"] for c in sweep["caps"]}
        best = sweep["recommended_cap_mb"] or min(predicted, key=predicted.get)
        worst = max(predicted, key=lambda c: (predicted[c], c))
        caps = list(dict.fromkeys([best, 25, worst]))
        print(f"trace at 25 MB: measured {sweep['measured_step_time'] * 1e3:.1f} ms, "
              f"replay error {sweep['replay_error']:+.1%}; {sweep['reason']}")  # fmt: skip
        _run(out, caps, args.rounds, args.steps)
        measured = {}
        for line in (Path(out) / "times.txt").read_text().splitlines():
            cap, *values = line.split()
            measured[float(cap)] = statistics.median(map(float, values))
            count = len(values)
    print(
        f"\n{'cap MB':>7} {'role':>12} {'predicted':>10} {'measured':>10} {'error':>7}  (n={count})"
    )
    roles = {best: "recommended", 25: "default", worst: "bad"}
    for cap in caps:
        p, m = predicted[cap], measured[cap]
        print(f"{cap:7g} {roles[cap]:>12} {p * 1e3:8.1f}ms {m * 1e3:8.1f}ms {p / m - 1:+7.1%}")
    by_prediction = sorted(caps, key=lambda c: predicted[c])
    by_measurement = sorted(caps, key=lambda c: measured[c])
    print(f"ranking by prediction {by_prediction}, by measurement {by_measurement}: "
          f"{'match' if by_prediction == by_measurement else 'NO MATCH'}")  # fmt: skip
    worst_error = max(abs(predicted[c] / measured[c] - 1) for c in caps)
    print(f"worst |error| {worst_error:.1%} (target <= 10%)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
