"""Closed-form amplification bounds for a generic eps0-LDP randomiser (comparison only)."""

from __future__ import annotations

import math

from aggregator.accountant._checks import check_delta, check_epsilon0, check_n

__all__ = ["efmrtt19", "fmt21"]


def efmrtt19(*, epsilon0: float, n: int, delta: float) -> float | None:
    """Erlingsson et al. (SODA 2019) closed form ``eps0 sqrt(144 log(1/delta) / n)``.

    The constants hold only in that theorem's regime, encoded as in the reference
    implementation of Balle et al. ("The Privacy Blanket of the Shuffle Model", 2019,
    ``shuffleddp.amplification_bounds.Erlingsson``): ``eps0 <= 1/2``, ``n >= 1000``,
    ``delta <= 1/100``, and the result must not exceed ``eps0`` (no amplification claimed
    beyond the local guarantee). Returns ``None`` outside it; this reproduces exactly the NA
    entries of ``shared/reference/amplification.tsv``.
    """
    epsilon0 = check_epsilon0(epsilon0)
    n = check_n(n)
    delta = check_delta(delta)
    if not (0 < epsilon0 <= 0.5 and n >= 1000 and delta <= 0.01):
        return None
    eps = epsilon0 * math.sqrt(144.0 * math.log(1.0 / delta) / n)
    return eps if eps <= epsilon0 else None


def fmt21(*, epsilon0: float, n: int, delta: float) -> float | None:
    """Feldman, McMillan, Talwar (FOCS 2021) closed form for eps0-LDP reports.

    ``log(1 + (e^eps0 - 1)/(e^eps0 + 1) (8 sqrt(e^eps0 log(4/delta)) / sqrt(n) + 8 e^eps0 / n))``,
    valid for ``eps0 <= log(n / (16 log(2/delta)))``; ``None`` outside that range (which also
    covers ``n <= 16 log(2/delta)``).
    """
    epsilon0 = check_epsilon0(epsilon0)
    n = check_n(n)
    delta = check_delta(delta)
    threshold = n / (16.0 * math.log(2.0 / delta))
    if threshold <= 0 or epsilon0 > math.log(threshold):
        return None
    p = math.exp(epsilon0)
    inner = 8.0 * math.sqrt(p * math.log(4.0 / delta)) / math.sqrt(n) + 8.0 * p / n
    return math.log1p(math.tanh(0.5 * epsilon0) * inner)
