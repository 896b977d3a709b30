"""A real CPU data-parallel training job (gloo on 127.0.0.1) with the plan enforced.

Variants (``--variant``, repeatable; run one after another in the same processes):

- ``none``: plain DistributedDataParallel;
- ``hook:PLAN``: DDP with `planner.enforce.torch_ddp.register_plan_hook` (gated order,
  planned depth);
- ``gradsync:PLAN``: no DDP; `GradSync` all-reduces exactly the plan's groups.

A PLAN path may hold ``{rank}`` (each rank reads its own file). Each variant writes
under ``--out/<label>/``: ``rank<r>.json`` (torch.profiler trace, steps ``ProfilerStep#N``,
with input shapes so that `planner analyze` can tell the parameters apart),
``params_rank<r>.pt`` (final parameters) and ``steps_rank<r>.json`` (wall time and
launch order of each step, and what applied the plan: ``hook``; ``ddp`` for a plan that
is DDP's own order, which DDP applies itself; ``pending`` before DDP's buckets are final).

``--fault KIND:RANK:STEP`` injects a fault on one rank (for the fault tests): ``kill``
(the process dies after the forward pass), ``stall`` (it sleeps before the backward
pass), ``nograd`` (the first layer gets no gradient, so its bucket never arrives).
An error ends a rank with one line on stderr and exit status 1 (a failed transfer
named by the hook's `explain`). A faulty rank writes ``fault_rank<r>`` under the
variant's directory just before the fault (its time: the fault tests time the survivors
from it).

Without ``--variant``, the environment decides (the contract of
``examples/closed_loop.py``): ``PLANNER_PLAN`` set: the hook with that plan, else plain
DDP; traces under ``PLANNER_TRACE_DIR``.

    python examples/train_ddp.py --write-plans plans/
    python examples/train_ddp.py --nproc 2 --variant none --variant hook:plans/good.json \
        --steps 8 --out runs/
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from planner.enforce.needs import missing

_MISSING = missing("torch", "examples/train_ddp.py")
if _MISSING:  # one line, not a traceback
    print(f"error: {_MISSING}", file=sys.stderr)
    sys.exit(2)

import torch  # noqa: E402 (after the check above)
import torch.distributed as dist  # noqa: E402
from torch import nn  # noqa: E402

from planner.enforce import load_plan  # noqa: E402
from planner.enforce.torch_ddp import GradSync, groups_of_model, register_plan_hook  # noqa: E402


def make_model(width: int = 512, layers: int = 6) -> nn.Module:
    """An MLP with `layers` Linear layers (1 MiB of weights each at width 512)."""
    torch.manual_seed(0)
    mods: list[nn.Module] = []
    for _ in range(layers):
        mods += [nn.Linear(width, width), nn.ReLU()]
    return nn.Sequential(*mods[:-1])


def write_plans(out: Path, depth_bytes: int = 512 * 1024) -> None:
    """good.json: groups in gradient-ready (backward) order; bad.json: forward order, so
    every transfer waits for the last gradient. Depth 2 for groups over `depth_bytes`."""
    model = make_model()
    sizes = {n: p.numel() * p.element_size() for n, p in model.named_parameters()}
    out.mkdir(parents=True, exist_ok=True)
    for label, reverse in (("good", True), ("bad", False)):
        groups = groups_of_model(model, reverse=reverse)
        doc = {
            "schema": "planner.bucket_plan/1",
            "algorithm": f"layer-{label}",
            "groups": [
                {
                    "name": f"layer{g[0].rsplit('.', 1)[0]}",
                    "params": g,
                    "bytes": sum(sizes[p] for p in g),
                    "depth": 2 if sum(sizes[p] for p in g) > depth_bytes else 1,
                }
                for g in groups
            ],
        }
        (out / f"{label}.json").write_text(json.dumps(doc, indent=2) + "\n")


def train(
    variant: str,
    steps: int,
    out: Path,
    batch: int = 64,
    gate_timeout: float = 60.0,
    fault: str | None = None,
) -> None:
    """Train `steps` steps of one variant on this rank; profile steps 2.. of them."""
    rank = dist.get_rank()
    mode, _, plan_path = variant.partition(":")
    label = mode if not plan_path else f"{mode}-{Path(plan_path).stem}".replace("{rank}", "")
    plan_path = plan_path.replace("{rank}", str(rank))
    kind, fault_rank, fault_step = fault.split(":") if fault else ("", "-1", "-1")
    where = out / label
    where.mkdir(parents=True, exist_ok=True)
    model = make_model()
    sync = hook = None
    global HOOK
    HOOK = None
    if mode == "gradsync":
        sync = GradSync(model, load_plan(plan_path), timeout=gate_timeout)
        sync.broadcast_parameters()
        net: nn.Module = model
    else:
        net = nn.parallel.DistributedDataParallel(
            model, bucket_cap_mb=1, gradient_as_bucket_view=True
        )
        plan = load_plan(plan_path) if plan_path else None
        hook = register_plan_hook(net, plan, timeout=gate_timeout) if plan else None
        HOOK = hook
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    if sync is not None:
        sync.attach(opt)
    data = torch.Generator().manual_seed(1000 + rank)
    width = model[0].in_features
    records = []
    prof = torch.profiler.profile(
        activities=[torch.profiler.ProfilerActivity.CPU],
        schedule=torch.profiler.schedule(wait=1, warmup=1, active=max(1, steps - 2)),
        record_shapes=True,
        on_trace_ready=lambda p: p.export_chrome_trace(str(where / f"rank{rank}.json")),
    )
    with prof:
        for number in range(steps):
            x = torch.randn(batch, width, generator=data)
            y = torch.randn(batch, width, generator=data)
            dist.barrier()
            faulty = rank == int(fault_rank) and number == int(fault_step)
            start = time.perf_counter()
            with torch.profiler.record_function("forward"):
                if faulty and kind == "nograd":
                    x = model[1](model[0](x).detach())
                    for layer in list(model)[2:]:
                        x = layer(x)
                    loss = nn.functional.mse_loss(x, y)
                else:
                    loss = nn.functional.mse_loss(net(x), y)
            if faulty:  # its time, for the fault tests
                (where / f"fault_rank{rank}").write_text(f"{kind} at step {number}\n")
            if faulty and kind == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            if faulty and kind == "stall":
                time.sleep(3600)
            with torch.profiler.record_function("backward"):
                loss.backward()
            with torch.profiler.record_function("optimizer_step"):
                opt.step()
                opt.zero_grad(set_to_none=False)
            order = sync.last_order if sync else (hook.launched_last if hook else ())
            records.append({"time": time.perf_counter() - start, "order": list(order),
                            "applied_by": hook.applied_by if hook else None})  # fmt: skip
            prof.step()
    if sync is not None:
        sync.close()
    torch.save({n: p.detach().clone() for n, p in model.named_parameters()},
               where / f"params_rank{rank}.pt")  # fmt: skip
    (where / f"steps_rank{rank}.json").write_text(json.dumps(records) + "\n")


HOOK = None  # the hook of the variant running (`explain` names a failed transfer)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def launch(nproc: int, argv: list[str], timeout: float) -> int:
    """Start `nproc` ranks of this script on 127.0.0.1; kill them all on failure/timeout."""
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()),
           "WORLD_SIZE": str(nproc), "OMP_NUM_THREADS": "1"}  # fmt: skip
    procs = [
        subprocess.Popen([sys.executable, __file__, *argv], env={**env, "RANK": str(r)})
        for r in range(nproc)
    ]
    deadline = time.monotonic() + timeout
    try:
        while any(p.poll() is None for p in procs):
            if time.monotonic() > deadline or any(p.returncode not in (None, 0) for p in procs):
                break
            time.sleep(0.05)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()
    codes = [p.returncode for p in procs]
    return 0 if all(c == 0 for c in codes) else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--variant", action="append", default=[])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--out", type=Path, default=Path("runs"))
    parser.add_argument("--write-plans", type=Path, help="write good.json / bad.json here")
    parser.add_argument("--nproc", type=int, default=0, help="launch this many local ranks")
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--gate-timeout", type=float, default=60.0, help="hook/GradSync timeout")
    parser.add_argument("--fault", help="KIND:RANK:STEP, KIND in kill, stall, nograd")
    args = parser.parse_args()
    if args.write_plans:
        write_plans(args.write_plans)
    if not args.variant and os.environ.get("PLANNER_TRACE_DIR"):
        plan = os.environ.get("PLANNER_PLAN")
        args.variant = [f"hook:{plan}" if plan else "none"]
        args.out = Path(os.environ["PLANNER_TRACE_DIR"])
    if not args.variant:
        return 0
    if args.nproc:
        rest = [a for v in args.variant for a in ("--variant", v)]
        rest += ["--steps", str(args.steps), "--out", str(args.out)]
        rest += ["--gate-timeout", str(args.gate_timeout)] + (
            ["--fault", args.fault] * bool(args.fault)
        )
        return launch(args.nproc, rest, args.timeout)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="env://")
    try:
        for variant in args.variant:
            train(variant, args.steps, args.out, gate_timeout=args.gate_timeout, fault=args.fault)
    except Exception as exc:  # one line, then out: a hung collective must not keep us
        failure = HOOK.explain(exc) if HOOK is not None else None  # names the transfer
        line = (str(failure or exc).strip().splitlines() or [type(exc).__name__])[0]
        print(f"rank {dist.get_rank()}: error: {line}", file=sys.stderr, flush=True)
        os._exit(1)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
