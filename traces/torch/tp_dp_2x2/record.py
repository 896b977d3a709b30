"""Record the 2x2 data x tensor parallel traces of this folder on the CPU:
`python record.py OUT`.

PyTorch 2.13.0+cpu, gloo, 4 ranks on 127.0.0.1 (``torch.multiprocessing.spawn``), one
intra-op thread per rank. Rank ``r`` is data-parallel replica ``r // 2`` and
tensor-parallel shard ``r % 2``: the tensor-parallel groups are ranks {0, 1} and {2, 3}
(``dist.new_group(..., group_desc="tp")``), the data-parallel groups {0, 2} and {1, 3}
(``group_desc="dp"``); every rank creates all four, in that order.

The model: two Megatron-style tensor-parallel MLP blocks (``Linear(64, 128)`` split by
columns, ``ReLU``, ``Linear(128, 64)`` split by rows, each rank holding half of both):
the row-parallel output is all-reduced over the TP group in the forward (Megatron's
``g``), and the gradient of each block's input in the backward (Megatron's ``f``); then
a ``Linear(64, 16)`` head replicated in the TP group. DistributedDataParallel over the
DP group (``process_group=dp``, ``bucket_cap_mb=0.02``: three gradient buckets)
all-reduces the gradients. Batch 32 per replica, SGD, 6 steps under ``torch.profiler``
(CPU activity, ``record_shapes=True``; ``record_function`` ranges ``train_step``,
``forward``, ``backward``, ``optimizer_step``) with
``schedule(wait=1, warmup=1, active=3, repeat=1)``: ``ProfilerStep#2``..``#4``, one
``rank<r>.json.gz`` per rank.
"""

import os
import socket
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from profiled_steps import gzip_trace, profile_steps  # noqa: E402

WORLD, TP = 4, 2
HIDDEN, INNER, OUT, BATCH = 64, 128, 16, 32


class _ReduceForward(torch.autograd.Function):
    """Megatron's ``g``: all-reduce in the forward, identity in the backward."""

    @staticmethod
    def forward(ctx, x, group):
        x = x.clone()
        dist.all_reduce(x, group=group)
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class _ReduceBackward(torch.autograd.Function):
    """Megatron's ``f``: identity in the forward, all-reduce of the gradient in the backward."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x

    @staticmethod
    def backward(ctx, grad):
        grad = grad.clone()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


class TPBlock(nn.Module):
    """``Linear(HIDDEN, INNER)`` by columns, ReLU, ``Linear(INNER, HIDDEN)`` by rows."""

    def __init__(self, group) -> None:
        super().__init__()
        self.group = group
        self.up = nn.Linear(HIDDEN, INNER // TP)
        self.down = nn.Linear(INNER // TP, HIDDEN, bias=False)

    def forward(self, x):
        x = _ReduceBackward.apply(x, self.group)
        x = self.down(torch.relu(self.up(x)))
        return _ReduceForward.apply(x, self.group)


def worker(rank: int, port: int, out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD
    )
    groups = {}
    for ranks, desc in (([0, 1], "tp"), ([2, 3], "tp"), ([0, 2], "dp"), ([1, 3], "dp")):
        group = dist.new_group(ranks, group_desc=desc)
        if rank in ranks:
            groups[desc] = group
    torch.manual_seed(rank % TP)  # the TP shards differ, the DP replicas agree
    model = nn.Sequential(TPBlock(groups["tp"]), TPBlock(groups["tp"]), nn.Linear(HIDDEN, OUT))
    model = DDP(model, process_group=groups["dp"], bucket_cap_mb=0.02)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    torch.manual_seed(100 + rank // TP)  # each replica its own batch, the TP pair the same
    x, y = torch.randn(BATCH, HIDDEN), torch.randn(BATCH, OUT)
    path = os.path.join(out, f"rank{rank}.json")
    profile_steps(model, opt, x, y, path)
    dist.barrier()
    dist.destroy_process_group()
    gzip_trace(path)


if __name__ == "__main__":
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.makedirs(sys.argv[1], exist_ok=True)
    mp.spawn(worker, args=(port, sys.argv[1]), nprocs=WORLD, join=True)
