"""Overhead of the DDP hook on the 2-rank CPU job of examples/train_ddp.py (gloo).

Two DDP replicas of the same model train side by side in the same two processes: plain
DDP, and DDP with `register_plan_hook` and a plan equal to DDP's own order (one group
per bucket, in bucket order, depth 1). Steps alternate between them (which goes first
alternates too), so both see the same machine load; the median step time of each, per
rank, and the hook's overhead are printed, with the time spent in the hook's Python
code per step (the launch path).

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
    in_hook = []
    for label in ("none", "hook"):
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
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        replicas[label] = (ddp, opt, model[0].in_features)
    data = torch.Generator().manual_seed(1000 + rank)
    times: dict[str, list[float]] = {"none": [], "hook": []}
    for number in range(warmup + steps):
        labels = ("none", "hook") if number % 2 == 0 else ("hook", "none")
        for label in labels:
            ddp, opt, width = replicas[label]
            x = torch.randn(64, width, generator=data)
            y = torch.randn(64, width, generator=data)
            dist.barrier()
            start = time.perf_counter()
            nn.functional.mse_loss(ddp(x), y).backward()
            opt.step()
            opt.zero_grad(set_to_none=False)
            if number >= warmup:
                times[label].append(time.perf_counter() - start)
    hook_per_step = sum(in_hook[-steps * 6 :]) / steps if in_hook else 0.0
    print(json.dumps({"rank": rank, "times": times, "hook_python_per_step": hook_per_step}))
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
    procs = [subprocess.Popen(argv, env={**env, "RANK": str(r)}, stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, text=True) for r in (0, 1)]  # fmt: skip
    outs = [p.communicate(timeout=900)[0] for p in procs]
    print(f"DDP, 6 x 1 MiB buckets, gloo on 127.0.0.1, {args.steps} interleaved steps per "
          "variant after warm-up; plan = DDP's own bucket order")  # fmt: skip
    for text in outs:
        doc = json.loads(text.strip().splitlines()[-1])
        none = statistics.median(doc["times"]["none"]) * 1e3
        hook = statistics.median(doc["times"]["hook"]) * 1e3
        print(f"rank{doc['rank']}: median step  no hook {none:7.2f} ms   hook {hook:7.2f} ms   "
              f"overhead {hook / none - 1:+.1%}   hook Python per step "
              f"{doc['hook_python_per_step'] * 1e3:.3f} ms")  # fmt: skip


if __name__ == "__main__":
    main()
