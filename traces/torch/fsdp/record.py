"""Record the FSDP traces of this folder on the CPU: `python record.py OUT [VARIANT ...]`.

PyTorch 2.13.0+cpu, gloo, 2 ranks on 127.0.0.1 (``torch.multiprocessing.spawn``), one
intra-op thread per rank. The model is an MLP of five blocks of different widths (each
block ``Linear -> ReLU``; 64 -> 96 -> 160 -> 128 -> 64 -> 32 features), each block its
own FSDP unit and the root the sixth (it holds no parameters of its own in FSDP2; the
blocks' units are wrapped first). Batch 32, SGD, 6 steps under ``torch.profiler``
(CPU activity, ``record_shapes=True``; ``record_function`` ranges ``train_step``,
``forward``, ``backward``, ``optimizer_step`` in each step) with
``schedule(wait=1, warmup=1, active=3, repeat=1)``: ``ProfilerStep#2``..``#4`` are
recorded, one ``rank<r>.json.gz`` per rank and variant.

Variants (a folder each):

- ``fsdp2_reshard``: FSDP2 ``fully_shard`` on every block then the root,
  ``reshard_after_forward=True`` (the default): parameters all-gathered again in the
  backward; FSDP2's implicit prefetch.
- ``fsdp2_noreshard``: the same with ``reshard_after_forward=False``: no all-gather in
  the backward.
- ``fsdp2_prefetch``: ``reshard_after_forward=True`` and explicit prefetching two units
  ahead (``set_modules_to_forward_prefetch`` / ``set_modules_to_backward_prefetch``).
- ``fsdp2_units2``: as ``fsdp2_reshard`` with two units of the blocks (the model a
  ``Sequential`` of two: blocks 0-2 and blocks 3-4) instead of five.
- ``fsdp1_prefetch``: FSDP1 ``FullyShardedDataParallel`` (``FULL_SHARD``,
  ``use_orig_params=True``) with a ``ModuleWrapPolicy`` on the blocks,
  ``backward_prefetch=BACKWARD_PRE``, ``forward_prefetch=True``.
- ``fsdp1_noprefetch``: the same with ``backward_prefetch=None``, ``forward_prefetch=False``.
- ``fsdp1_grad_op``: FSDP1 ``SHARD_GRAD_OP`` (no resharding after the forward, FSDP1's
  ``reshard_after_forward=False``), default backward prefetch.
"""

import os
import socket
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from profiled_steps import gzip_trace, profile_steps  # noqa: E402

WIDTHS = (64, 96, 160, 128, 64, 32)
VARIANTS = (
    "fsdp2_reshard", "fsdp2_noreshard", "fsdp2_prefetch", "fsdp2_units2",
    "fsdp1_prefetch", "fsdp1_noprefetch", "fsdp1_grad_op",
)  # fmt: skip


def make_model(variant: str) -> nn.Sequential:
    torch.manual_seed(0)
    pairs = zip(WIDTHS[:-1], WIDTHS[1:], strict=True)
    blocks = [nn.Sequential(nn.Linear(a, b), nn.ReLU()) for a, b in pairs]
    if variant == "fsdp2_units2":
        return nn.Sequential(nn.Sequential(*blocks[:3]), nn.Sequential(*blocks[3:]))
    return nn.Sequential(*blocks)


def fsdp2(model: nn.Sequential, variant: str) -> nn.Module:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (2,))
    reshard = variant != "fsdp2_noreshard"
    for unit in model:
        fully_shard(unit, mesh=mesh, reshard_after_forward=reshard)
    fully_shard(model, mesh=mesh, reshard_after_forward=reshard)
    if variant == "fsdp2_prefetch":
        blocks = list(model)
        for i, block in enumerate(blocks):
            block.set_modules_to_forward_prefetch(blocks[i + 1 : i + 3])
            block.set_modules_to_backward_prefetch(blocks[max(0, i - 2) : i][::-1])
    return model


def fsdp1(model: nn.Sequential, variant: str) -> nn.Module:
    from torch.distributed.fsdp import BackwardPrefetch, ShardingStrategy
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    on = variant != "fsdp1_noprefetch"
    return FSDP(
        model,
        auto_wrap_policy=ModuleWrapPolicy({nn.Sequential}),
        sharding_strategy=(
            ShardingStrategy.SHARD_GRAD_OP
            if variant == "fsdp1_grad_op"
            else ShardingStrategy.FULL_SHARD
        ),  # fmt: skip
        backward_prefetch=BackwardPrefetch.BACKWARD_PRE if on else None,
        forward_prefetch=on and variant == "fsdp1_prefetch",
        use_orig_params=True,
        device_id=torch.device("cpu"),  # FSDP1 finds no accelerator otherwise
    )


def worker(rank: int, port: int, out: str, variant: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    model = make_model(variant)
    model = fsdp2(model, variant) if variant.startswith("fsdp2") else fsdp1(model, variant)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    torch.manual_seed(1 + rank)
    x, y = torch.randn(32, WIDTHS[0]), torch.randn(32, WIDTHS[-1])
    path = os.path.join(out, variant, f"rank{rank}.json")
    profile_steps(model, opt, x, y, path)
    dist.barrier()
    dist.destroy_process_group()
    gzip_trace(path)


if __name__ == "__main__":
    for variant in sys.argv[2:] or VARIANTS:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        os.makedirs(os.path.join(sys.argv[1], variant), exist_ok=True)
        mp.spawn(worker, args=(port, sys.argv[1], variant), nprocs=2, join=True)
