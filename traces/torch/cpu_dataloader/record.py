"""Record the traces of this folder on the CPU: `python record.py OUT`.

A small MLP trained from a multi-process DataLoader (2 workers) whose dataset takes
1–12 ms per sample, varying, like a slow disk: some batches are ready when the loop
asks for them, some are not, so the step's wait for its batch (the DataLoader's
``enumerate(DataLoader)#...__next__`` range) runs from under 0.1 ms to tens of ms.

- ``loop.json.gz``: 12 iterations, no ``prof.step()``: no ``ProfilerStep#N``, the loop
  is marked only by the DataLoader's and the optimizer's ranges.
- ``steps.json.gz``: the same loop with a schedule and ``prof.step()`` (``ProfilerStep#N``
  around each iteration, the DataLoader's range inside it).
"""

import gzip
import os
import random
import shutil
import sys
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset


class SlowDisk(Dataset):
    """Samples that take 1–12 ms each to read (a seeded draw per index)."""

    def __len__(self) -> int:
        return 4096

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        time.sleep(random.Random(i).uniform(0.001, 0.012))
        return torch.randn(256), i % 10


def loader() -> DataLoader:
    torch.manual_seed(0)
    return DataLoader(SlowDisk(), batch_size=16, num_workers=2, shuffle=False)


def train(on_step) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(*(m for _ in range(6) for m in (nn.Linear(256, 256), nn.ReLU())))
    model.append(nn.Linear(256, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for i, (x, y) in enumerate(loader()):
        if i == 12:
            break
        opt.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        on_step()


def export(prof: torch.profiler.profile, path: str) -> None:
    """The profile as gzipped Chrome trace JSON at `path` (.gz added)."""
    prof.export_chrome_trace(path)
    with open(path, "rb") as raw, gzip.open(path + ".gz", "wb") as packed:
        shutil.copyfileobj(raw, packed)
    os.remove(path)


def main(out: str) -> None:
    torch.set_num_threads(1)
    cpu = [torch.profiler.ProfilerActivity.CPU]
    with torch.profiler.profile(activities=cpu) as prof:
        train(lambda: None)
    export(prof, os.path.join(out, "loop.json"))

    def ready(p: torch.profiler.profile) -> None:
        export(p, os.path.join(out, "steps.json"))

    schedule = torch.profiler.schedule(wait=1, warmup=1, active=10)
    with torch.profiler.profile(activities=cpu, schedule=schedule, on_trace_ready=ready) as prof:
        train(prof.step)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else ".")
