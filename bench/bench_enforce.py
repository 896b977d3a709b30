"""Overhead of the DDP hook on the 2-rank CPU job of examples/train_ddp.py (gloo).

Three DDP replicas of the same model train side by side in the same two processes: plain
DDP; DDP with `register_plan_hook` and a plan equal to DDP's own order (one group per
bucket, in bucket order, depth 1); and DDP with PyTorch's own Python all-reduce hook
(``default_hooks.allreduce_hook``: the floor for any Python hook). Steps rotate between
them (which goes first rotates too), so all see the same machine load. Printed per rank:
the median step time of each, its overhead against plain DDP (ratio of medians, and the
median of the per-round ratios), and the wall time spent inside each hook per step (the
launch path, GIL waits included).

    nice python bench/bench_enforce.py --steps 40
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LABELS = ("none", "hook", "pyhook")
EXAMPLE = ROOT / "examples" / "train_ddp.py"


def worker(steps: int, warmup: int) -> None:
    """One rank: interleaved steps of plain DDP and hooked DDP; prints JSON times."""
    import runpy

    import torch
    import torch.distributed as dist
    from torch import nn

    from planner.enforce import plan_from_groups
    from planner.enforce.torch_ddp import PlanCommHook, _hook, groups_of_model

    make_model = runpy.run_path(str(EXAMPLE))["make_model"]
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="env://")
    rank = dist.get_rank()
    replicas = {}
    in_hook: list[float] = []
    in_default: list[float] = []
    for label in LABELS:
        model = make_model()
        ddp = nn.parallel.DistributedDataParallel(
            model, bucket_cap_mb=1, gradient_as_bucket_view=True
        )
        if label == "hook":
            plan = plan_from_groups(groups_of_model(model, reverse=True))  # DDP's own order
            state = PlanCommHook(ddp, plan, group=ddp.process_group, timeout=120)

            def timed(state: PlanCommHook, bucket: object) -> object:
                start = time.perf_counter()
                try:
                    return state(bucket)
                finally:
                    in_hook.append(time.perf_counter() - start)

            timed.__annotations__ = dict(_hook.__annotations__)  # DDP checks them
            ddp.register_comm_hook(state, timed)
        if label == "pyhook":  # PyTorch's own Python all-reduce hook: the floor for any
            from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

            def timed_default(state: object, bucket: object) -> object:
                start = time.perf_counter()
                try:
                    return default_hooks.allreduce_hook(state, bucket)
                finally:
                    in_default.append(time.perf_counter() - start)

            timed_default.__annotations__ = dict(default_hooks.allreduce_hook.__annotations__)
            ddp.register_comm_hook(None, timed_default)
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        replicas[label] = (ddp, opt, model[0].in_features)
    data = torch.Generator().manual_seed(1000 + rank)
    times: dict[str, list[float]] = {label: [] for label in LABELS}
    profile = None
    if os.environ.get("BENCH_PROFILE") and rank == 0:  # where the hook's time goes
        import cProfile

        profile = cProfile.Profile()
    for number in range(warmup + steps):
        for label in LABELS[number % len(LABELS) :] + LABELS[: number % len(LABELS)]:
            ddp, opt, width = replicas[label]
            x = torch.randn(64, width, generator=data)
            y = torch.randn(64, width, generator=data)
            dist.barrier()
            start = time.perf_counter()
            if profile is not None and label == "hook" and number >= warmup:
                profile.enable()
            nn.functional.mse_loss(ddp(x), y).backward()
            if profile is not None:
                profile.disable()
            opt.step()
            opt.zero_grad(set_to_none=False)
            if number >= warmup:
                times[label].append(time.perf_counter() - start)
    if profile is not None:
        import pstats

        pstats.Stats(profile, stream=sys.stderr).sort_stats("tottime").print_stats(15)
    hook_per_step = sum(in_hook[-steps * 6 :]) / steps if in_hook else 0.0
    default_per_step = sum(in_default[-steps * 6 :]) / steps if in_default else 0.0
    print(json.dumps({"rank": rank, "times": times, "hook_python_per_step": hook_per_step,
                      "default_python_per_step": default_per_step}))  # fmt: skip
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=40, help="measured steps per variant")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.steps, args.warmup)
        return
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
           "WORLD_SIZE": "2", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}  # fmt: skip
    argv = [sys.executable, __file__, "--worker", "--steps", str(args.steps),
            "--warmup", str(args.warmup)]  # fmt: skip
    err = None if os.environ.get("BENCH_PROFILE") else subprocess.DEVNULL
    procs = [subprocess.Popen(argv, env={**env, "RANK": str(r)}, stdout=subprocess.PIPE,
                              stderr=err, text=True) for r in (0, 1)]  # fmt: skip
    outs = [p.communicate(timeout=900)[0] for p in procs]
    print(f"DDP, 6 x 1 MiB buckets, gloo on 127.0.0.1, {args.steps} interleaved steps per "
          "variant after warm-up; plan = DDP's own bucket order")  # fmt: skip
    for text in outs:
        doc = json.loads(text.strip().splitlines()[-1])
        med = {k: statistics.median(v) * 1e3 for k, v in doc["times"].items()}
        t = doc["times"]
        paired = {k: statistics.median(a / b - 1 for a, b in zip(t[k], t["none"], strict=True))
                  for k in ("hook", "pyhook")}  # fmt: skip
        print(f"rank{doc['rank']}: median step ms: no hook {med['none']:.2f}, plan hook "
              f"{med['hook']:.2f} ({med['hook'] / med['none'] - 1:+.1%}; paired per round "
              f"{paired['hook']:+.1%}), PyTorch's Python allreduce_hook {med['pyhook']:.2f} "
              f"({med['pyhook'] / med['none'] - 1:+.1%}; paired {paired['pyhook']:+.1%}); "
              f"time inside the hook per step: plan {doc['hook_python_per_step'] * 1e3:.2f} ms, "
              f"PyTorch's {doc['default_python_per_step'] * 1e3:.2f} ms")  # fmt: skip


if __name__ == "__main__":
    main()
