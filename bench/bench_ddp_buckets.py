"""Bucket advice against real runs: predicted vs measured step time per bucket_cap_mb.

1. The network model, unless `--network FILE` is given: gloo all-reduce timed on this
   machine by the `planner bench-network` code (`planner.ingest.netbench`), before the training,
   as a user runs it. With `--network-between-steps` the same passes over the sizes
   (`netbench.allreduce_pass`) run in the training processes instead, in blocks of their
   own shuffled among the caps' blocks below (as many passes per round as a cap has
   steps), so that the network is measured in the machine states the steps see (what
   that shows: docs/algorithms.md, "The network measured between the steps").
2. Trains the repo's CPU DDP example model (`examples/train_ddp.make_model`, an MLP of
   `--layers` Linear layers of width `--width`; gloo, 2 ranks on 127.0.0.1) at every cap
   of the sweep and with `bucket_cap_mb` unset (DDP's default: 25 MiB after a 1 MiB
   first bucket), interleaved: each cap has its own copy of the model; every round wraps
   each copy in a new DDP wrapper and runs its first `DROP` steps untimed (DDP rebuilds
   its buckets after its first iteration), then runs blocks of `--block` timed steps of
   every cap (`--steps` per cap and round) and one traced window, in a new order each
   round (the same on both ranks). The traced window runs the job at `--trace-cap` for
   `--window` recorded steps (torch.profiler, record_shapes), one step waited and one
   warmed up first: one profiling session over the whole run whose schedule has
   ``repeat`` = rounds, idle while the other caps run, writing a file per window and
   rank; planner joins a rank's windows. Those steps are timed too (the profiler's own
   cost against the same cap untraced). With `--reference-cap` (100 MB by default: one
   bucket, whose all-reduce runs after the backward pass) a second configuration is
   traced the same way, each round: the reference trace.
3. `planner.job.stages.bucket_sweep` on that trace predicts the step time of every cap,
   told the traced cap's untraced step time, as a user reads it from the training log
   (`planner analyze --untraced-step-time`): the profiler's own cost is taken out of the
   traced steps; with the reference trace (and its untraced step time) the backward
   pass's own contention factor is measured from it (`planner.planning.buckets.backward_factor`).
   The bench takes the recommended cap (else the best predicted), the default and the
   worst predicted cap, and prints the median measured step time beside each
   prediction, the error, and whether the ranking by prediction matches: caps whose
   predictions differ by less than `TIE` are a tie (no order is claimed); every other
   pair must be measured in the predicted order. The strict order is printed too.

Short blocks of every cap in a shuffled order, not a long stretch of each, make every
cap and the traced steps sample the machine's states (its load, other VMs on the host)
alike: on this 2-core VM stretches of 10 steps measured caps with the same buckets up to
20% apart, and a single 5-step traced stretch ran up to 29% off the same cap's measured
steps. The default traced cap is 1 MB: its 24 buckets overlap the backward pass enough
for the contention factor `kappa` to be calibrated (a 4 MB trace often cannot tell it).

    python bench/bench_ddp_buckets.py [--rounds 5] [--steps 10] [--block 2]
                                       [--trace-cap 1] [--reference-cap 100] [--window 2]

Needs torch (CPU is enough). Figures depend on the machine's load: run it on a quiet one.
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import socket
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
from train_ddp import make_model  # noqa: E402  (the repo's CPU DDP example)

DROP = 2  # steps dropped after each wrap (bucket rebuild, warm caches)
TIE = 0.05  # predictions closer than this claim no order
DEFAULT = "default"  # bucket_cap_mb unset
NETWORK = "network"  # a block of the network benchmark


def _step(ddp: nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor) -> None:
    record = torch.profiler.record_function
    opt.zero_grad(set_to_none=True)
    with record("forward"):
        loss = nn.functional.mse_loss(ddp(x), y)
    with record("backward"):
        loss.backward()
    with record("optimizer_step"):
        opt.step()


def _wrap(model: nn.Module, cap: float | str) -> nn.Module:
    kwargs = {} if cap == DEFAULT else {"bucket_cap_mb": float(cap)}
    return nn.parallel.DistributedDataParallel(model, **kwargs)


def _worker(
    rank: int,
    port: int,
    out: str,
    shape: dict,
    caps: list,
    traced_caps: list[float],
    runs: tuple,
    net_sizes: list[int],
) -> None:
    from planner.ingest import netbench

    rounds, steps, window, block = runs
    warnings.filterwarnings("ignore", ".*Profiler clears events")  # one file per window: wanted
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    traced_keys = [f"{c}/profiled" for c in traced_caps]
    keys = [str(c) for c in caps] + traced_keys
    models = {key: make_model(shape["width"], shape["layers"]) for key in keys}
    x, y = torch.randn(shape["batch"], shape["width"]), torch.randn(shape["batch"], shape["width"])
    times: dict[str, list[float]] = {}
    # the network benchmark: passes over the sizes in blocks of their own among the caps'
    tensors = [torch.ones(n // 4) for n in net_sizes]
    net_samples: list[list[float]] = [[] for _ in net_sizes]
    turns = itertools.count()
    if tensors:
        netbench.allreduce_pass(tensors)  # warm-up, not kept
    cycles = {key: itertools.count() for key in traced_keys}
    folders = {key: _trace_folder(c) for key, c in zip(traced_keys, traced_caps, strict=True)}
    tracing = [traced_keys[0]]  # the traced configuration whose window runs now

    def export(p: torch.profiler.profile) -> None:
        folder = Path(out, folders[tracing[0]])
        folder.mkdir(exist_ok=True)
        p.export_chrome_trace(str(folder / f"rank{rank}.w{next(cycles[tracing[0]]):03d}.json"))

    # one profiling session over the whole run: per round and traced configuration a
    # window of `window` steps (one step waited, one warmed up first), idle while the
    # other caps run; a file per window, in a folder per traced configuration
    prof = torch.profiler.profile(
        activities=[torch.profiler.ProfilerActivity.CPU],
        schedule=torch.profiler.schedule(
            wait=1, warmup=1, active=window, repeat=rounds * len(traced_keys)
        ),
        on_trace_ready=export,
        record_shapes=True,
    )
    with prof:
        for number in range(rounds):
            # a new DDP wrapper per cap and round, each warmed up (DDP rebuilds its buckets
            # after its first iteration); then blocks of `block` steps of every cap and one
            # traced window, in a new order each round, the same on both ranks: every cap
            # samples the machine's states alike, none keeps a fixed neighbour
            wrapped = {}
            for key, cap in zip(keys, [*caps, *traced_caps], strict=True):
                ddp = _wrap(models[key], cap)
                opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
                for _ in range(DROP):
                    dist.barrier()
                    _step(ddp, opt, x, y)
                wrapped[key] = (ddp, opt)
            order = [str(c) for c in caps for _ in range(steps // block)] + traced_keys
            order += [NETWORK] * (steps // block if tensors else 0)
            random.Random(number).shuffle(order)
            for key in order:
                if key == NETWORK:
                    for _ in range(block):
                        elapsed = netbench.allreduce_pass(tensors, next(turns))
                        for kept, seconds in zip(net_samples, elapsed, strict=True):
                            kept.append(seconds)
                    continue
                ddp, opt = wrapped[key]
                traced = key in traced_keys
                tracing[0] = key if traced else tracing[0]
                dist.barrier()
                for i in range(window + 2 if traced else block):
                    if not traced:
                        dist.barrier()  # a traced step runs as in training: no barrier
                    t0 = time.perf_counter()
                    _step(ddp, opt, x, y)
                    elapsed = time.perf_counter() - t0
                    if traced:
                        prof.step()
                    if not traced or i >= 2:  # traced: the recorded steps only
                        times.setdefault(key, []).append(elapsed)
            del wrapped, ddp, opt
    if rank == 0:
        Path(out, "times.json").write_text(json.dumps(times))
        if tensors:
            samples = list(zip(net_sizes, net_samples, strict=True))
            Path(out, "net.csv").write_text(netbench.to_csv(netbench.rows_of(samples, 2)))
            Path(out, "net_samples.json").write_text(json.dumps(dict(samples)))
    dist.destroy_process_group()


def _trace_folder(cap: float) -> str:
    return f"trace_{cap:g}"


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _run(
    out: str, shape: dict, caps: list, traced: list[float], runs: tuple[int, ...], net_sizes: list
) -> None:
    args = (_port(), out, shape, caps, traced, runs, net_sizes)
    mp.spawn(_worker, args=args, nprocs=2, join=True)


def _network(path: Path | None, out: str, shape: dict):
    """The network model: the file given, else a fresh gloo all-reduce benchmark."""
    from planner.ingest import netbench

    if path is not None:
        return netbench.read_model(path), str(path)
    sizes = _net_sizes(shape)
    rows = netbench.bench_allreduce(sizes, repeats=30)
    csv_path = Path(out, "net.csv")
    csv_path.write_text(netbench.to_csv(rows))
    return netbench.read_model(csv_path), f"bench-network now ({len(sizes)} sizes)"


def _net_sizes(shape: dict) -> list[int]:
    """The benchmark's message sizes: small ones for the latency, one layer, four layers
    and the whole model (one bucket) for the per-byte cost."""
    layer = shape["width"] * (shape["width"] + 1) * 4
    return sorted({2048, 65536, layer, 4 * layer, layer * shape["layers"]})


def _ranking(caps: list[str], predicted: dict, measured: dict) -> tuple[bool, list[str]]:
    """Every pair predicted apart by more than TIE is measured in the predicted order."""
    ok, lines = True, []
    for a, b in itertools.combinations(caps, 2):
        gap = predicted[b] / predicted[a] - 1
        if abs(gap) < TIE:
            lines.append(f"{a} vs {b}: predicted within {TIE:.0%} ({gap:+.1%}): a tie")
            continue
        faster, slower = (a, b) if gap > 0 else (b, a)
        agree = measured[faster] < measured[slower]
        ok &= agree
        lines.append(
            f"{faster} predicted faster than {slower} by {abs(gap):.1%}: measured "
            f"{measured[slower] / measured[faster] - 1:+.1%} ({'agrees' if agree else 'DISAGREES'})"
        )
    return ok, lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--trace-cap", type=float, default=1.0, help="bucket_cap_mb traced")
    parser.add_argument(
        "--reference-cap",
        type=float,
        default=100.0,
        help="bucket_cap_mb of the reference trace (one bucket); 0: none",
    )
    parser.add_argument("--window", type=int, default=2, help="steps traced in every round")
    parser.add_argument("--block", type=int, default=2, help="consecutive steps of one cap")
    parser.add_argument("--keep", type=Path, help="copy the traces and step times here")
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--layers", type=int, default=24)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--network", type=Path, help="benchmark model (bench-network CSV)")
    parser.add_argument(
        "--network-between-steps",
        action="store_true",
        help="time the network in the training processes, between the caps' steps",
    )
    args = parser.parse_args()
    from planner.ingest import netbench
    from planner.ingest.kineto import load_kineto
    from planner.job import stages
    from planner.planning import buckets

    shape = {"width": args.width, "layers": args.layers, "batch": args.batch}
    caps = [float(c) for c in buckets.DEFAULT_CAPS_MB] + [DEFAULT]
    between = args.network_between_steps and not args.network
    net_sizes = _net_sizes(shape) if between else []
    with tempfile.TemporaryDirectory() as out:
        if not between:
            network, source = _network(args.network, out, shape)
        runs = (args.rounds, args.steps, args.window, args.block)
        traced_caps = [args.trace_cap] + ([args.reference_cap] if args.reference_cap else [])
        _run(out, shape, caps, traced_caps, runs, net_sizes)
        times = json.loads((Path(out) / "times.json").read_text())
        if between:
            network = netbench.read_model(Path(out, "net.csv"))
            repeats = args.rounds * (args.steps // args.block) * args.block
            source = (
                f"gloo all-reduce timed between the steps ({len(net_sizes)} sizes, "
                f"{repeats} each, in blocks of their own among the caps')"
            )
        jobs = [  # windows, rank by rank
            load_kineto(sorted(Path(out, _trace_folder(c)).glob("rank*.w*.json")))
            for c in traced_caps
        ]
        if args.keep:
            import shutil

            shutil.copytree(out, args.keep, dirs_exist_ok=True)
    name = {str(c): f"{c:g}" for c in caps if c != DEFAULT} | {DEFAULT: DEFAULT}
    measured = {name[k]: statistics.median(v) for k, v in times.items() if k in name}
    traced = f"{args.trace_cap:g}"
    reference = f"{args.reference_cap:g}" if args.reference_cap else None
    sweep = stages.bucket_sweep(
        jobs[0], network, untraced_step_time=measured[traced],
        reference=jobs[1] if reference else None,
        reference_untraced_step_time=measured[reference] if reference else None,
    )  # fmt: skip
    if sweep is None:
        print("no bucket sweep: the trace has no gradient-ready times", file=sys.stderr)
        return 1
    profiled = statistics.median(times[f"{args.trace_cap}/profiled"])
    count = min(len(v) for k, v in times.items() if k in name)
    predicted = {f"{c['bucket_cap_mb']:g}": c["predicted_step_time"] for c in sweep["caps"]}
    predicted[DEFAULT] = sweep["default_configuration"]["predicted_step_time"]
    explicit = {k: v for k, v in predicted.items() if k != DEFAULT}
    rec = sweep["recommended_cap_mb"]
    best = f"{rec:g}" if rec is not None else min(explicit, key=explicit.get)
    worst = max(explicit, key=lambda c: (explicit[c], -float(c)))
    roles = {best: "recommended" if rec is not None else "best predicted"}
    roles.setdefault(DEFAULT, "default (unset)")
    roles.setdefault(worst, "bad")
    print(
        f"network: {source}: a={network.a * 1e6:.0f} us, b={network.b * 1e9:.3f} ns/B "
        f"(R2 {network.r2:.3f})\n"
        f"trace at bucket_cap_mb={traced}: {sweep['steps']} steps in {args.rounds} windows, "
        f"{sweep['traced_step_time'] * 1e3:.1f} ms per traced step (trace spans); timed "
        f"{profiled * 1e3:.1f} ms, the same cap untraced {measured[traced] * 1e3:.1f} ms "
        f"(profiler cost {profiled / measured[traced] - 1:+.1%})\n"
        f"profiler's cost taken out: {sweep['profiler_cost']:+.1%} of the untraced step "
        f"(--untraced-step-time {measured[traced]:.4f}); DDP's copy back into the gradients "
        f"{sweep['copy_rate'] * 1e9:.3f} ns/B\n"
        f"replay of the traced buckets {sweep['replay_error']:+.1%} (worst step "
        f"{sweep['replay_error_worst']:.1%}); kappa {sweep['kappa']} "
        f"({sweep['kappa_source']}); first bucket rule {sweep['first_bucket_rule']}\n"
        f"backward pass's factor {sweep['kappa_backward']} ({sweep['kappa_backward_source']})"
        + (f", from the trace at bucket_cap_mb={reference}" if reference else "")
        + "\n"
        f"advice: {sweep['reason']}"
    )
    print(
        f"\n{'cap MB':>8} {'buckets':>7} {'role':>16} {'predicted':>10} {'measured':>10} "
        f"{'error':>7}  (n={count} steps each, interleaved)"
    )
    rows = sweep["caps"] + [sweep["default_configuration"] | {"bucket_cap_mb": DEFAULT}]
    for row in rows:
        cap = (
            row["bucket_cap_mb"] if row["bucket_cap_mb"] == DEFAULT else f"{row['bucket_cap_mb']:g}"
        )
        p, m = predicted[cap], measured[cap]
        role = roles.get(cap, {traced: "traced", reference: "reference"}.get(cap, ""))
        print(
            f"{cap:>8} {row['buckets']:>7} {role:>16} {p * 1e3:8.1f}ms {m * 1e3:8.1f}ms "
            f"{p / m - 1:+7.1%}"
        )
    groups: dict[int, list[float]] = {}
    for row in sweep["caps"]:  # explicit caps with as many buckets hold the same buckets
        groups.setdefault(row["buckets"], []).append(measured[f"{row['bucket_cap_mb']:g}"])
    spread = max((max(v) / min(v) - 1 for v in groups.values() if len(v) > 1), default=0.0)
    print(f"noise floor: caps with the same buckets measured up to {spread:.1%} apart")
    chosen = list(roles)
    ok, lines = _ranking(chosen, predicted, measured)
    print(f"ranking of {', '.join(chosen)} by prediction vs measurement: "
          f"{'match' if ok else 'NO MATCH'}")  # fmt: skip
    for line in lines:
        print(f"  {line}")
    strict = sorted(chosen, key=predicted.get) == sorted(chosen, key=measured.get)
    print(
        f"strict order, ties included: predicted {' < '.join(sorted(chosen, key=predicted.get))}"
        f"; measured {' < '.join(sorted(chosen, key=measured.get))} "
        f"({'same' if strict else 'different'})"
    )
    worst_error = max(abs(predicted[c] / measured[c] - 1) for c in chosen)
    all_error = max(abs(predicted[c] / measured[c] - 1) for c in predicted)
    print(
        f"worst |error| of those: {worst_error:.1%} (target <= 10%); of every cap: {all_error:.1%}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
