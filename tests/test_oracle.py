"""The network model fitted to transfers, and the min-of-runs oracle's fallbacks."""

from __future__ import annotations

import numpy as np
import pytest

from planner.model.oracle import fit_network_model


def test_linear_fit_recovers_latency_and_per_byte_cost():
    sizes = np.array([64, 4096, 65536, 4 << 20], dtype=float)
    model = fit_network_model(sizes, 2e-4 + 1e-9 * sizes)
    assert model.a == pytest.approx(2e-4)
    assert model.b == pytest.approx(1e-9)
    assert model.r2 == pytest.approx(1.0)
    assert model.time(1 << 20) == pytest.approx(2e-4 + 1e-9 * (1 << 20))


def test_negative_coefficients_are_refit_on_the_boundary():
    # The free fit of these points has a negative intercept: the best fit with a = 0
    # is b = sum(xy) / sum(x^2), not the free slope with a clamped away.
    x = np.array([10.0, 20.0, 30.0])
    y = np.array([0.5, 1.9, 3.1])
    model = fit_network_model(x, y)
    assert model.a == 0.0
    assert model.b == pytest.approx(float((x * y).sum() / (x * x).sum()))
    # Cost falling with size: no per-byte cost, the latency is the mean.
    falling = fit_network_model(np.array([1.0, 2.0, 3.0]), np.array([3.0, 2.0, 1.0]))
    assert (falling.a, falling.b) == (2.0, 0.0)


def test_too_few_sizes_give_no_model():
    assert fit_network_model(np.array([8.0, 8.0]), np.array([1.0, 2.0])) is None
    assert fit_network_model(np.array([8.0]), np.array([1.0])) is None
