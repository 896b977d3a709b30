"""Record the traces of this folder on one GPU: `python record.py OUT`.

`single()`: a one-process CNN, torch.profiler with CPU and CUDA activities and
record_shapes, a schedule of two windows (a file per window). `ddp()`: two gloo ranks
sharing cuda:0 (recorded once, not kept: see README.md).
"""

import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

ACTIVITIES = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]


def cnn() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 64, 3, padding=1), nn.ReLU(),
        nn.Conv2d(64, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(64, 128, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
        nn.Flatten(), nn.Linear(128, 10),
    )  # fmt: skip


def record(step, out: str, name: str) -> None:
    """16 steps: per window 2 waited, 2 warmed up, 3 recorded; two windows."""
    windows = iter(range(2))

    def ready(prof: torch.profiler.profile) -> None:
        prof.export_chrome_trace(os.path.join(out, f"{name}.w{next(windows)}.json"))

    schedule = torch.profiler.schedule(wait=2, warmup=2, active=3, repeat=2)
    with torch.profiler.profile(
        activities=ACTIVITIES, schedule=schedule, on_trace_ready=ready, record_shapes=True
    ) as prof:
        for _ in range(16):
            step()
            prof.step()
    torch.cuda.synchronize()


def single(out: str) -> None:
    model = cnn().cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(64, 3, 64, 64, device="cuda")
    y = torch.randint(0, 10, (64,), device="cuda")

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()

    for _ in range(5):
        step()
    record(step, out, "cnn_1gpu")


def ddp(rank: int, port: int, out: str) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    torch.cuda.set_device(0)
    layers = [nn.Sequential(nn.Linear(1024, 1024), nn.ReLU()) for _ in range(12)]
    model = nn.parallel.DistributedDataParallel(
        nn.Sequential(*layers).cuda(), device_ids=[0], bucket_cap_mb=4
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(256, 1024, device="cuda")

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        model(x).pow(2).mean().backward()
        opt.step()

    for _ in range(5):
        step()
    record(step, out, f"mlp_ddp_gloo_cuda.rank{rank}")
    dist.destroy_process_group()


if __name__ == "__main__":
    target = sys.argv[1]
    os.makedirs(target, exist_ok=True)
    single(target)
    mp.spawn(ddp, args=(29517, target), nprocs=2, join=True)
