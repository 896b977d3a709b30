"""How the traces here were recorded (PyTorch 2.13.0+cpu, gloo, 2 ranks on 127.0.0.1).

    python record.py OUT

The repo's CPU DDP example model (`examples/train_ddp.make_model(64, 4)`), batch 16,
``bucket_cap_mb=0.01``, one intra-op thread per rank, 12 steps. One profiling session
per rank with ``schedule(wait=1, warmup=1, active=2, repeat=3)``: three windows of two
recorded steps, each written to its own file (``rank<r>.w<k>.json``) as a schedule with
``repeat`` does; between the windows two untraced steps run with the profiler idle.
"""

import itertools
import os
import socket
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "examples"))
from train_ddp import make_model  # noqa: E402


def worker(rank: int, port: int, out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    ddp = nn.parallel.DistributedDataParallel(make_model(64, 4), bucket_cap_mb=0.01)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    x, y = torch.randn(16, 64), torch.randn(16, 64)
    cycles = itertools.count()
    with torch.profiler.profile(
        activities=[torch.profiler.ProfilerActivity.CPU],
        schedule=torch.profiler.schedule(wait=1, warmup=1, active=2, repeat=3),
        on_trace_ready=lambda p: p.export_chrome_trace(
            os.path.join(out, f"rank{rank}.w{next(cycles)}.json")
        ),
        record_shapes=True,
    ) as prof:
        for _ in range(3):
            for _ in range(2):  # untraced: the profiler idle between windows
                opt.zero_grad(set_to_none=True)
                nn.functional.mse_loss(ddp(x), y).backward()
                opt.step()
            for _ in range(4):  # wait, warmup, 2 recorded
                opt.zero_grad(set_to_none=True)
                nn.functional.mse_loss(ddp(x), y).backward()
                opt.step()
                prof.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.makedirs(sys.argv[1], exist_ok=True)
    mp.spawn(worker, args=(port, sys.argv[1]), nprocs=2, join=True)
