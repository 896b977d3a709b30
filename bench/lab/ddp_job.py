"""One rank of the lab's PyTorch DDP job (CPU, gloo), run inside the shaped namespace.

    ip netns exec NS python bench/lab/ddp_job.py SPEC.json RANK

SPEC (written by the lab) names the model shape (an MLP of ``layers`` Linear layers of
``width``, batch ``batch``), the world size and the rendezvous port, and a ``mode``:

- ``trace``: the plain job as a user runs it, traced: ``warmup`` steps, ``untraced``
  timed steps, a torch.profiler window of ``traced`` steps (one warm-up step first;
  ``record_shapes=True``, steps ``ProfilerStep#N``) written to ``trace_dir/rank<R>.json``
  (the ``PLANNER_TRACE_DIR`` contract of examples/closed_loop.py), then ``untraced``
  timed steps again: their median is the untraced step time `planner analyze` is told.
- ``measure``: every configuration in ``configs`` (``label``, ``cap``: bucket_cap_mb or
  null for DDP's default, ``plan``: a plan file registered with
  `planner.enforce.torch_ddp.register_plan_hook`, or null; ``hook: "own"``: DDP's own
  buckets at ``cap`` as the plan's groups, through the hook with ``ddp_order=False``, so
  that only the hook's cost differs from the same cap without it) gets its own copy of the model
  and its own DDP wrapper on a process group of its own, ``warmup`` untimed steps, and
  then the blocks of ``order`` run in turn, ``block`` timed steps each: the same
  shuffled order on every rank.

Each step starts after a barrier. Writes ``out/rank<R>.json``: per label the step times
(s) with their block number, each block's monotonic start and end (for the foreign-load
accounting), and what applied each plan (``hook.applied_by``).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn


def make_model(width: int, layers: int) -> nn.Module:
    """An MLP of `layers` Linear(width, width) layers with ReLUs between them."""
    torch.manual_seed(0)
    mods: list[nn.Module] = []
    for _ in range(layers):
        mods += [nn.Linear(width, width), nn.ReLU()]
    return nn.Sequential(*mods[:-1])


def wrap(model: nn.Module, cap: float | None, group: object) -> nn.Module:
    """DDP as the configuration asks: DDP's default cap when `cap` is None."""
    kwargs = {} if cap is None else {"bucket_cap_mb": float(cap)}
    return nn.parallel.DistributedDataParallel(model, process_group=group, **kwargs)


def step(ddp: nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor) -> None:
    """One training step, its phases named for the profiler."""
    record = torch.profiler.record_function
    opt.zero_grad(set_to_none=True)
    with record("forward"):
        loss = nn.functional.mse_loss(ddp(x), y)
    with record("backward"):
        loss.backward()
    with record("optimizer_step"):
        opt.step()


def own_buckets(model: nn.Module, cap: float) -> list[list[str]]:
    """The parameter names of each of DDP's buckets at `cap` (MiB), in bucket order: the
    gradients in ready order (the parameters reversed), cut as DDP cuts them, the first
    bucket at the cap too (PyTorch 2.13 with an explicit cap)."""
    from planner.planning.bucket_replay import MIB, ddp_buckets

    params = list(reversed([(n, p) for n, p in model.named_parameters() if p.requires_grad]))
    limit = int(cap * MIB)
    ids = ddp_buckets([p.numel() * p.element_size() for _, p in params], limit, limit)
    groups: list[list[str]] = [[] for _ in range(max(ids) + 1)]
    for (name, _), bucket in zip(params, ids, strict=True):
        groups[bucket].append(name)
    return groups


def timed(ddp: nn.Module, opt: torch.optim.Optimizer, x, y, n: int, after=None) -> list[float]:
    """`n` steps, each after a barrier; their times (s)."""
    times = []
    for _ in range(n):
        dist.barrier()
        start = time.perf_counter()
        step(ddp, opt, x, y)
        times.append(time.perf_counter() - start)
        if after is not None:
            after()
    return times


def trace(spec: dict, rank: int, ddp: nn.Module, opt, x, y) -> dict:
    """The plain job traced; untraced steps before and after the window."""
    where = Path(spec["trace_dir"])
    where.mkdir(parents=True, exist_ok=True)
    timed(ddp, opt, x, y, spec["warmup"])
    before = timed(ddp, opt, x, y, spec["untraced"])
    prof = torch.profiler.profile(
        activities=[torch.profiler.ProfilerActivity.CPU],
        schedule=torch.profiler.schedule(wait=0, warmup=1, active=spec["traced"], repeat=1),
        record_shapes=True,
        on_trace_ready=lambda p: p.export_chrome_trace(str(where / f"rank{rank}.json")),
    )
    with prof:
        traced = timed(ddp, opt, x, y, spec["traced"] + 1, after=prof.step)[1:]
    after = timed(ddp, opt, x, y, spec["untraced"])
    return {"untraced": before + after, "traced": traced}


def measure(spec: dict, rank: int, shape: dict, x, y) -> dict:
    """Every configuration warmed up, then the shuffled blocks timed."""
    from planner.enforce import load_plan, plan_from_groups
    from planner.enforce.torch_ddp import register_plan_hook

    runs, hooks = {}, {}
    for config in spec["configs"]:
        model = make_model(shape["width"], shape["layers"])
        ddp = wrap(model, config["cap"], dist.new_group())
        if config.get("plan"):
            plan = load_plan(config["plan"], rank=f"rank{rank}")
            hooks[config["label"]] = register_plan_hook(ddp, plan, timeout=120)
        elif config.get("hook") == "own":  # DDP's own order, through the hook all the same
            own = plan_from_groups(own_buckets(model, config["cap"]))
            hooks[config["label"]] = register_plan_hook(ddp, own, timeout=120, ddp_order=False)
        runs[config["label"]] = (ddp, torch.optim.SGD(model.parameters(), lr=0.01))
    for ddp, opt in runs.values():  # DDP rebuilds its buckets after the first step
        timed(ddp, opt, x, y, spec["warmup"])
    times: dict[str, list[float]] = {label: [] for label in runs}
    blocks: dict[str, list[int]] = {label: [] for label in runs}
    spans = []
    for number, label in enumerate(spec["order"]):
        ddp, opt = runs[label]
        dist.barrier()
        start = time.monotonic()
        got = timed(ddp, opt, x, y, spec["block"])
        spans.append({"label": label, "start": start, "end": time.monotonic()})
        times[label] += got
        blocks[label] += [number] * len(got)
    applied = {label: hook.applied_by for label, hook in hooks.items()}
    return {"times": times, "blocks": blocks, "spans": spans, "applied_by": applied}


def main() -> None:
    spec = json.loads(Path(sys.argv[1]).read_text())
    rank = int(sys.argv[2])
    shape = spec["shape"]
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{spec['port']}",
        rank=rank,
        world_size=spec["world"],
    )
    data = torch.Generator().manual_seed(1000 + rank)
    x = torch.randn(shape["batch"], shape["width"], generator=data)
    y = torch.randn(shape["batch"], shape["width"], generator=data)
    start = time.monotonic()
    if spec["mode"] == "trace":
        model = make_model(shape["width"], shape["layers"])
        ddp = wrap(model, spec.get("cap"), None)
        result = trace(spec, rank, ddp, torch.optim.SGD(model.parameters(), lr=0.01), x, y)
    else:
        result = measure(spec, rank, shape, x, y)
    result |= {"rank": rank, "start": start, "end": time.monotonic()}
    out = Path(spec["out"])
    out.mkdir(parents=True, exist_ok=True)
    (out / f"rank{rank}.json").write_text(json.dumps(result) + "\n")
    dist.barrier()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
    # Both ranks' results are written and past the barrier. torch 2.13's teardown after a
    # profiled run sometimes aborts ("terminate called without an active exception",
    # exit -6, 2 of about 25 traced lab jobs, results already on disk): skip it.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
