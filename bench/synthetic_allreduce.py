"""Synthetic data-parallel DAGs shaped like an all-reduce (DDP/Horovod) training step.

A forward chain of layers (each a few parallel branches and a join), a backward
chain mirroring it (each backward layer also reads the forward activation it
mirrors), and per parameter a gradient op and a collective all-reduce as a leaf
(Caramel §1). Times in seconds, sizes lognormal around 256 KiB; seeded.
"""

from __future__ import annotations

import numpy as np

from planner.model.graph import Op, OpGraph, Phase, build_graph


def allreduce_dag(
    n_layers: int, ops_per_layer: int, params_per_layer: int = 1, branches: int = 3, seed: int = 0
) -> tuple[OpGraph, dict[str, float]]:
    """``n_layers * (2 * ops_per_layer + 2 * params_per_layer + 2) + 2`` ops and times."""
    rng = np.random.default_rng(seed)
    ops: list[Op] = []
    edges: list[tuple[str, str]] = []
    time: dict[str, float] = {}
    n_branch = min(branches, ops_per_layer)

    def compute(name: str, phase: Phase) -> str:
        ops.append(Op(name, "compute", "gpu0", phase=phase))
        time[name] = float(rng.lognormal(np.log(50e-6), 0.8))
        return name

    def layer(prefix: str, inputs: list[str], phase: Phase) -> str:
        tails = []
        for b in range(n_branch):
            prev = inputs
            for k in range(b, ops_per_layer, n_branch):
                name = compute(f"{prefix}/op{k}", phase)
                edges.extend((p, name) for p in prev)
                prev = [name]
            tails.append(prev[0])
        join = compute(f"{prefix}/join", phase)
        edges.extend((t, join) for t in tails)
        return join

    previous = compute("input", "forward")
    outputs = []
    for i in range(n_layers):
        previous = layer(f"fw{i}", [previous], "forward")
        outputs.append(previous)
    previous = compute("loss", "backward")
    edges.append((outputs[-1], previous))
    for i in reversed(range(n_layers)):
        previous = layer(f"bw{i}", [previous, outputs[i]], "backward")
        for j in range(params_per_layer):
            grad = compute(f"grad{i}.{j}", "backward")
            edges.extend([(previous, grad), (outputs[i], grad)])
            nbytes = int(rng.lognormal(np.log(256 * 1024), 1.5)) // 4 * 4 + 4
            name = f"allreduce{i}.{j}"
            ops.append(Op(name, "collective", "net", param=f"layer{i}.w{j}", nbytes=nbytes,
                          phase="backward"))  # fmt: skip
            edges.append((grad, name))
    return build_graph(ops, edges), time
