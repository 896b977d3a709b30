"""How the traces here were recorded (PyTorch 2.13.0+cpu, gloo, 2 ranks on 127.0.0.1).

    python record.py OUT 0.001,1,4,default,100 3 10

Per round and cap (interleaved): a new DDP wrapper (``bucket_cap_mb`` = the cap, or
unset for ``default``), 2 warm-up steps, then 10 timed steps (barrier, perf_counter);
in the last round 5 more steps are profiled (record_shapes) into ``OUT/cap<cap>/``.
The model is the repo's CPU DDP example (`examples/train_ddp.make_model(512, 24)`),
batch 64, MSE loss, SGD, one intra-op thread per rank.
"""

import json
import os
import socket
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "examples"))
from train_ddp import make_model  # noqa: E402

WIDTH, LAYERS, BATCH = 512, 24, 64


def step(ddp: nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor) -> None:
    rf = torch.profiler.record_function
    opt.zero_grad(set_to_none=True)
    with rf("forward"):
        loss = nn.functional.mse_loss(ddp(x), y)
    with rf("backward"):
        loss.backward()
    with rf("optimizer_step"):
        opt.step()


def worker(rank: int, port: int, out: str, caps: list[str], rounds: int, steps: int) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    model = make_model(WIDTH, LAYERS)
    x, y = torch.randn(BATCH, WIDTH), torch.randn(BATCH, WIDTH)
    times: dict[str, list[float]] = {}
    for rnd in range(rounds):
        for cap in caps:
            kw = {} if cap == "default" else {"bucket_cap_mb": float(cap)}
            ddp = nn.parallel.DistributedDataParallel(model, **kw)
            opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
            for i in range(steps + 2):
                dist.barrier()
                t0 = time.perf_counter()
                step(ddp, opt, x, y)
                if i >= 2:
                    times.setdefault(cap, []).append(time.perf_counter() - t0)
            if rnd == rounds - 1:
                path = os.path.join(out, f"cap{cap}", f"rank{rank}.json")
                os.makedirs(os.path.dirname(path), exist_ok=True)
                with torch.profiler.profile(
                    activities=[torch.profiler.ProfilerActivity.CPU],
                    schedule=torch.profiler.schedule(wait=0, warmup=1, active=5, repeat=1),
                    on_trace_ready=lambda p, path=path: p.export_chrome_trace(path),
                    record_shapes=True,
                ) as prof:
                    for _ in range(6):
                        dist.barrier()
                        step(ddp, opt, x, y)
                        prof.step()
    if rank == 0:
        Path(out, "times.json").write_text(json.dumps(times))
    dist.destroy_process_group()


if __name__ == "__main__":
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out, caps, rounds, steps = sys.argv[1], sys.argv[2].split(","), *map(int, sys.argv[3:5])
    mp.spawn(worker, args=(port, out, caps, rounds, steps), nprocs=2, join=True)
