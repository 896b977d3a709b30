"""Synthetic layered DAGs shaped like the worker partition of a data-parallel model.

A forward chain of layers, each reading its parameter recvs (through a small read
op) in a few parallel branches; a backward chain mirroring it, each backward op also
reading the forward activation it mirrors; per parameter a gradient op and a send of
the gradient as a leaf. All recvs are roots and all sends are leaves (TicTac §2.2).
Used by the scheduler and simulator benchmarks; times are seconds, seeded.
"""

from __future__ import annotations

import numpy as np

from planner.model.graph import Op, OpGraph, OpKind, Phase, build_graph

LINK_BYTES_PER_S = 1.25e9  # 10 Gb/s
LINK_LATENCY_S = 50e-6


def layered_dag(
    n_layers: int,
    ops_per_layer: int,
    recvs_per_layer: int = 1,
    branches: int = 3,
    n_ps: int = 2,
    seed: int = 0,
) -> tuple[OpGraph, dict[str, float]]:
    """A layered model DAG and its time oracle (op name -> seconds).

    Per layer: `recvs_per_layer` recvs and read ops, `ops_per_layer` forward compute
    ops in up to `branches` parallel chains plus a join, the same in backward, and a
    gradient op and a send per parameter: ``4 * recvs_per_layer + 2 * ops_per_layer + 2``
    ops, plus an input and a loss op. Transfers alternate over `n_ps` PS channels.
    """
    if n_layers < 1 or ops_per_layer < 1 or recvs_per_layer < 1 or branches < 1:
        raise ValueError("n_layers, ops_per_layer, recvs_per_layer and branches must be >= 1")
    rng = np.random.default_rng(seed)
    ops: list[Op] = []
    edges: list[tuple[str, str]] = []
    time: dict[str, float] = {}
    n_branch = min(branches, ops_per_layer)
    layer_scale = rng.lognormal(0.0, 0.5, size=n_layers)

    def compute(name: str, phase: Phase, scale: float) -> str:
        ops.append(Op(name, "compute", "gpu0", phase=phase))
        time[name] = float(scale * rng.lognormal(np.log(50e-6), 0.8))
        return name

    def transfer(name: str, kind: OpKind, ps: int, param: str, nbytes: int, phase: Phase) -> str:
        channel = f"worker0<-ps{ps}" if kind == "recv" else f"worker0->ps{ps}"
        ops.append(Op(name, kind, channel, param=param, nbytes=nbytes, phase=phase))
        time[name] = LINK_LATENCY_S + nbytes / LINK_BYTES_PER_S
        return name

    param_bytes: list[list[int]] = []
    previous = compute("input", "forward", 1.0)
    forward_ops: list[list[list[str]]] = []
    reads: list[list[str]] = []
    for layer in range(n_layers):
        scale = float(layer_scale[layer])
        layer_reads = []
        sizes = (rng.lognormal(np.log(2e5), 1.5, size=recvs_per_layer) + 64).astype(int)
        param_bytes.append([int(x) for x in sizes])
        for j in range(recvs_per_layer):
            ps = (layer * recvs_per_layer + j) % n_ps
            recv = transfer(
                f"L{layer}/recv{j}", "recv", ps, f"L{layer}/w{j}", int(sizes[j]), "forward"
            )
            read = compute(f"L{layer}/read{j}", "forward", 0.1)
            edges.append((recv, read))
            layer_reads.append(read)
        reads.append(layer_reads)
        chains: list[list[str]] = [[] for _ in range(n_branch)]
        for k in range(ops_per_layer):
            chains[k % n_branch].append(f"L{layer}/fwd{k}")
        for b, chain in enumerate(chains):
            for i, name in enumerate(chain):
                compute(name, "forward", scale)
                edges.append((previous if i == 0 else chain[i - 1], name))
            for j in range(b, recvs_per_layer, n_branch):
                edges.append((layer_reads[j], chain[0]))
        join = compute(f"L{layer}/fwd_join", "forward", 0.2)
        edges.extend((chain[-1], join) for chain in chains)
        edges.append((previous, join))  # residual connection
        forward_ops.append(chains)
        previous = join
    loss = compute("loss", "backward", 1.0)
    edges.append((previous, loss))
    previous = loss
    for layer in reversed(range(n_layers)):
        scale = float(layer_scale[layer])
        chains = forward_ops[layer]
        ends = []
        for b, chain in enumerate(chains):
            last = previous
            for i, fwd in enumerate(reversed(chain)):
                name = compute(f"L{layer}/bwd{b}_{i}", "backward", 2.0 * scale)
                edges.append((last, name))
                edges.append((fwd, name))
                last = name
            ends.append(last)
        for j, read in enumerate(reads[layer]):
            grad = compute(f"L{layer}/grad{j}", "backward", 0.5 * scale)
            edges.append((ends[j % n_branch], grad))
            edges.append((read, grad))
            ps = (layer * recvs_per_layer + j) % n_ps
            nbytes = param_bytes[layer][j]
            send = transfer(f"L{layer}/send{j}", "send", ps, f"L{layer}/w{j}", nbytes, "backward")
            edges.append((grad, send))
        join = compute(f"L{layer}/bwd_join", "backward", 0.2)
        edges.extend((end, join) for end in ends)
        previous = join
    return build_graph(ops, edges), time
