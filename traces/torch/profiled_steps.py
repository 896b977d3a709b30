"""The training loop the CPU recordings of this folder share (`fsdp/record.py`,
`tp_dp_2x2/record.py`): 6 steps under `torch.profiler` (CPU activity,
``record_shapes=True``, ``schedule(wait=1, warmup=1, active=3, repeat=1)``: steps 2..4
recorded), each step in ``record_function`` ranges ``train_step``, ``forward``,
``backward`` and ``optimizer_step``; the trace written gzipped as ``PATH.gz``."""

import gzip
import os
import shutil

import torch
from torch import nn
from torch.profiler import record_function


def profile_steps(model: nn.Module, opt: torch.optim.Optimizer, x, y, path: str) -> None:  # noqa: ANN001
    """Train `model` on (`x`, `y`) with MSE for 6 steps, the profile written to `path`.gz."""
    with torch.profiler.profile(
        activities=[torch.profiler.ProfilerActivity.CPU],
        schedule=torch.profiler.schedule(wait=1, warmup=1, active=3, repeat=1),
        on_trace_ready=lambda p: p.export_chrome_trace(path),
        record_shapes=True,
    ) as prof:
        for _ in range(6):
            with record_function("train_step"):
                opt.zero_grad(set_to_none=True)
                with record_function("forward"):
                    loss = nn.functional.mse_loss(model(x), y)
                with record_function("backward"):
                    loss.backward()
                with record_function("optimizer_step"):
                    opt.step()
            prof.step()


def gzip_trace(path: str) -> None:
    """`path` compressed to `path`.gz (level 9) and removed."""
    with open(path, "rb") as src, gzip.open(path + ".gz", "wb", compresslevel=9) as dst:
        shutil.copyfileobj(src, dst)
    os.remove(path)
