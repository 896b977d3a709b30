"""Omnivore's compute groups (Omnivore §IV-B, §IV-C, §V-B; Appendices D-E).

The hardware-efficiency model ``HE(g) = max{t_fc, (t_conv(k) + t_fc) / g}``, implicit
momentum ``1 - 1/g`` and the optimizer's starting point, the smallest g that saturates
the FC phase. A model of its own beside the PS / P2P / ring one
(`planner.planning.ps_p2p_ring`): it shares only the calibration.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from planner.errors import InputError
from planner.planning.ps_p2p_ring import TIE_TOLERANCE, Calibration


def t_conv(
    k: int, t_conv_compute1: float, t_conv_network1: float, overlapped: bool = True
) -> float:
    """t_conv(k) from Tc,c = t_conv,compute(1) and Tn,c = t_conv,network(1) (Appendix D).

    Compute speeds up linearly (Tc,c / k), the conv model's network time slows down
    linearly (Tn,c * k); overlapped (the paper's choice) takes their max, else the sum.
    """
    compute, network = t_conv_compute1 / k, t_conv_network1 * k
    return max(compute, network) if overlapped else compute + network


def hardware_efficiency(g: int, t_conv_k: float, t_fc: float) -> float:
    """HE(g) = max{t_fc, (t_conv(k) + t_fc) / g}: predicted time per iteration (§IV-B)."""
    return max(t_fc, (t_conv_k + t_fc) / g)


def fc_saturated(g: int, t_conv_k: float, t_fc: float) -> bool:
    """The FC phase is saturated when t_conv(k) + t_fc <= g * t_fc (boundary included)."""
    return t_conv_k + t_fc <= g * t_fc * (1 + TIE_TOLERANCE)


def implicit_momentum(g: int) -> float:
    """Theorem 1: g asynchronous groups add implicit momentum 1 - 1/g."""
    return 1.0 - 1.0 / g


def explicit_momentum(g: int, target: float) -> float:
    """The explicit momentum that keeps explicit + implicit at `target` (§IV-C, App. E).

    0 when the implicit momentum alone reaches the target: then asynchrony costs
    statistical efficiency, and the optimizer lowers g.
    """
    return max(0.0, target - implicit_momentum(g))


@dataclass(frozen=True)
class GroupPoint:
    """One execution strategy: g compute groups of k devices."""

    groups: int
    group_size: int
    t_conv: float
    hardware_efficiency: float
    fc_saturated: bool
    implicit_momentum: float
    explicit_momentum: float


OMNIVORE_ASSUMPTIONS: tuple[str, ...] = (
    "N conv devices in g equal groups of k = N/g, plus one merged FC server (Omnivore §V-A)",
    "the FC server serves one group at a time (§IV-B); t_fc includes its small network time",
    "conv compute scales linearly with k (Tc,c/k); conv model traffic grows linearly (Tn,c*k)",
    "t_conv(k) = max(compute, network): the two overlap layer by layer (Appendix D)",
    "Tc,c and t_fc split the trace's processing time by conv vs matmul op time",
    "Tn,c = 2 f(conv model bytes): the conv model forward and its gradients back",
    "total momentum = explicit + implicit (1 - 1/g); Theorem 1 assumes batches drawn "
    "uniformly and exponentially distributed, independent step times (A0-A2)",
    "the suggested g is the optimizer's start (§V-B): the smallest g that saturates the FC "
    "phase; Algorithm 1 then halves g while the tuned explicit momentum is 0",
)


@dataclass(frozen=True)
class Omnivore:
    """Omnivore's model for N devices: every divisor g, and the suggested g."""

    devices: int
    t_conv_compute1: float
    t_conv_network1: float
    t_fc: float
    target_momentum: float
    groups: tuple[GroupPoint, ...]
    suggested_groups: int
    suggestion_saturates: bool
    assumptions: tuple[str, ...] = field(default=OMNIVORE_ASSUMPTIONS)


def omnivore(
    devices: int,
    t_conv_compute1: float,
    t_conv_network1: float,
    t_fc: float,
    target_momentum: float = 0.9,
) -> Omnivore:
    """HE(g) and momentum for every g dividing `devices`; suggest the smallest saturating g.

    When no g saturates the FC phase, the suggestion is g = N (fastest iterations) and
    `suggestion_saturates` is False.
    """
    if devices < 1:
        raise InputError(None, f"Omnivore needs at least one device, got {devices}")
    pts = []
    for g in (d for d in range(1, devices + 1) if devices % d == 0):
        k = devices // g
        tc = t_conv(k, t_conv_compute1, t_conv_network1)
        pts.append(
            GroupPoint(
                groups=g,
                group_size=k,
                t_conv=tc,
                hardware_efficiency=hardware_efficiency(g, tc, t_fc),
                fc_saturated=fc_saturated(g, tc, t_fc),
                implicit_momentum=implicit_momentum(g),
                explicit_momentum=explicit_momentum(g, target_momentum),
            )
        )
    saturating = [p for p in pts if p.fc_saturated]
    suggested = saturating[0] if saturating else pts[-1]
    return Omnivore(
        devices=devices,
        t_conv_compute1=t_conv_compute1,
        t_conv_network1=t_conv_network1,
        t_fc=t_fc,
        target_momentum=target_momentum,
        groups=tuple(pts),
        suggested_groups=suggested.groups,
        suggestion_saturates=bool(saturating),
    )


def omnivore_from_calibration(
    cal: Calibration, devices: int, target_momentum: float = 0.9
) -> Omnivore | None:
    """Omnivore's inputs from a calibration; None when no conv/FC op types were seen."""
    if cal.conv_fraction is None:
        return None
    tcc = cal.processing_time * cal.conv_fraction
    tfc = cal.processing_time - tcc
    tnc = 2 * cal.network.time(cal.conv_bytes) if cal.conv_bytes > 0 else 0.0
    return omnivore(devices, tcc, tnc, tfc, target_momentum)
