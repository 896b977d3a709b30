"""Profile many steps of a real 2-rank DDP job (gloo on 127.0.0.1, CPU) into Kineto traces.

The "large trace" of the ingest benchmark: what `torch.profiler` writes for a long
run, not copied events. Writes ``rank<r>.<ts>.pt.trace.json.gz`` per rank through
``tensorboard_trace_handler`` under OUT (default: bench/_data/ddp_large, git-ignored).

Usage: python bench/make_large_trace.py [--steps 150] [--out DIR]
"""

from __future__ import annotations

import argparse
import os
import socket
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.profiler import (
    ProfilerActivity,
    profile,
    record_function,
    schedule,
    tensorboard_trace_handler,
)

DEFAULT_OUT = Path(__file__).resolve().parent / "_data" / "ddp_large"


def _model() -> nn.Module:
    """A small conv + MLP net: a few hundred ops per step, several DDP buckets."""
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1),
        nn.BatchNorm2d(16),
        nn.ReLU(),
        nn.Conv2d(16, 32, 3, padding=1, stride=2),
        nn.BatchNorm2d(32),
        nn.ReLU(),
        nn.Conv2d(32, 32, 3, padding=1, stride=2),
        nn.ReLU(),
        nn.Flatten(),
        nn.Linear(32 * 8 * 8, 512),
        nn.ReLU(),
        nn.Linear(512, 512),
        nn.ReLU(),
        nn.Linear(512, 256),
        nn.ReLU(),
        nn.Linear(256, 10),
    )


def _worker(rank: int, world: int, port: int, steps: int, out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)  # fmt: skip
    torch.manual_seed(0)
    model = DDP(_model(), bucket_cap_mb=1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    x = torch.randn(16, 3, 32, 32)
    y = torch.randint(0, 10, (16,))
    with profile(
        activities=[ProfilerActivity.CPU],
        schedule=schedule(wait=1, warmup=1, active=steps, repeat=1),
        on_trace_ready=tensorboard_trace_handler(out, worker_name=f"rank{rank}", use_gzip=True),
        record_shapes=True,
    ) as prof:
        for _ in range(steps + 2):
            with record_function("forward"):
                loss = loss_fn(model(x), y)
            with record_function("backward"):
                loss.backward()
            with record_function("optimizer"):
                opt.step()
                opt.zero_grad(set_to_none=True)
            prof.step()
    dist.barrier()
    dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=150, help="profiled (active) steps")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    for old in args.out.glob("*.pt.trace.json*"):
        old.unlink()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    t0 = time.perf_counter()
    mp.spawn(_worker, args=(2, _free_port(), args.steps, str(args.out)), nprocs=2, join=True)
    files = sorted(args.out.glob("*.pt.trace.json*"))
    size = sum(p.stat().st_size for p in files) / 2**20
    took = time.perf_counter() - t0
    print(f"{len(files)} traces, {size:.1f} MiB gzip, in {args.out} ({took:.0f} s)")


if __name__ == "__main__":
    main()
