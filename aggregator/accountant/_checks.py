"""Argument validation shared by the accountant's modules (messages name the value)."""

from __future__ import annotations

import math

import numpy as np


def check_real(name: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{name} must be a real number, got {value!r}")
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value}")
    return value


def check_n(n: int) -> int:
    if isinstance(n, bool) or not isinstance(n, int | np.integer):
        raise TypeError(f"n must be an integer, got {n!r}")
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    return int(n)


def check_epsilon0(epsilon0: float) -> float:
    epsilon0 = check_real("epsilon0", epsilon0)
    if epsilon0 < 0:
        raise ValueError(f"epsilon0 must be >= 0, got {epsilon0}")
    return epsilon0


def check_delta(delta: float) -> float:
    delta = check_real("delta", delta)
    if not 0 < delta <= 1:
        raise ValueError(f"delta must be in (0, 1], got {delta}")
    return delta
