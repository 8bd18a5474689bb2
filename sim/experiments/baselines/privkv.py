"""PrivKV (Ye, Hu, Meng, Zheng, IEEE S&P 2019): sample one key of the whole domain, then
randomised response on presence and on the value."""

from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction
from functools import cached_property

import numpy as np
from numpy.typing import NDArray

from sim.experiments.baselines._common import check_input, check_parameters, exp_rational
from sim.experiments.baselines.base import KVEstimate

#: PrivKV's three outputs for the sampled key: (presence bit, value).
OUTPUTS: tuple[tuple[int, int], ...] = ((1, 1), (1, -1), (0, 0))


@dataclass(frozen=True)
class PrivKVCounts:
    """What the server tallies: per key ``j``, the size ``n_j`` of the group of users who
    sampled ``j`` and how many of them reported ``<1, +1>`` and ``<1, -1>``."""

    n: int
    group: NDArray[np.int64]
    plus: NDArray[np.int64]
    minus: NDArray[np.int64]


@dataclass(frozen=True, kw_only=True)
class PrivKV:
    """PrivKV's local perturbation protocol (LPP) and its estimators, for ``s``-sparse
    ternary vectors.

    Randomiser (one report per user): sample ``j`` uniformly from ``[d]`` and report
    ``(j, z)``. If ``x_j != 0`` the value ``x_j`` (already discretised: values are +-1) goes
    through the value perturbation primitive, kept with probability
    ``p2 = e^eps2 / (1 + e^eps2)``, and the pair is reported as ``<1, v>`` with probability
    ``p1 = e^eps1 / (1 + e^eps1)``, else ``<0, 0>``. If ``x_j = 0`` the user reports ``<0, 0>``
    with probability ``p1``, else ``<1, v>`` with ``v`` uniform in +-1 (the original draws a
    fake value uniformly from ``[-1, 1]`` and discretises it: the same law).

    Privacy: the worst ratio is ``max(e^eps1, e^eps2, e^eps1 * 2 e^eps2 / (1 + e^eps2))``
    (present +1 against absent on ``<1, +1>``), strictly below ``e^(eps1 + eps2) = e^eps``:
    the sequential split spends less than its nominal budget. :attr:`ldp_ratio` is that exact
    value; ``epsilon1 = epsilon2 = epsilon / 2`` by default (``split`` is ``epsilon1 /
    epsilon``), the even split of the original's evaluation.

    Estimators (the server knows every report's ``j``, so it knows the group sizes ``n_j``):
    the original's key frequency ``f_j = (N_j / n_j - (1 - p1)) / (2 p1 - 1)`` with ``N_j``
    the ``<1, .>`` reports (unbiased, the original's claim), and the unconditional mean
    ``(c_+ - c_-) / (n_j p1 (2 p2 - 1))``: the original's calibrated value counts
    ``n1' - n2' = (c_+ - c_-) / (2 p2 - 1)`` divided by the expected number ``p1 n_j`` of
    presence reports from holders, not by the observed ``N_j``. The observed ``N_j``
    includes fake presences, which is why the original's conditional mean is biased (the
    reason for PrivKVM's iterations); :meth:`original_estimate` keeps it for comparison.
    ``freq = ((f_j + mean_j) / 2, (f_j - mean_j) / 2)``; both are unbiased given
    ``n_j > 0``. A key no user sampled (``n_j = 0``, probability ``(1 - 1/d)^n``) gets 0.
    """

    d: int
    s: int
    epsilon: float
    split: float = 0.5
    name: str = field(default="PrivKV", init=False)

    def __post_init__(self) -> None:
        check_parameters(self.d, self.s, self.epsilon)
        if not 0 < self.split < 1:
            raise ValueError(f"split must be in (0, 1), got {self.split}")

    # -- exact parameters ------------------------------------------------------------------

    @cached_property
    def exp_eps1(self) -> Fraction:
        """Rational ``e^eps1 <= e^(split * epsilon)`` (key / presence budget)."""
        return exp_rational(self.split * self.epsilon)

    @cached_property
    def exp_eps2(self) -> Fraction:
        """Rational ``e^eps2 <= e^((1 - split) * epsilon)`` (value budget)."""
        return exp_rational((1 - self.split) * self.epsilon)

    @cached_property
    def p1(self) -> Fraction:
        return self.exp_eps1 / (1 + self.exp_eps1)

    @cached_property
    def p2(self) -> Fraction:
        return self.exp_eps2 / (1 + self.exp_eps2)

    @cached_property
    def ldp_ratio(self) -> Fraction:
        """The exact worst-case output ratio over any two inputs (at most ``e^epsilon``)."""
        e1, e2 = self.exp_eps1, self.exp_eps2
        return max(e1, e2, e1 * 2 * e2 / (1 + e2))

    def _law(self, x: int) -> dict[tuple[int, int], Fraction]:
        """Law of ``(bit, value)`` for a sampled key holding ``x`` in {-1, 0, 1}."""
        p1, p2 = self.p1, self.p2
        if x == 0:
            return {(1, 1): (1 - p1) / 2, (1, -1): (1 - p1) / 2, (0, 0): p1}
        return {(1, x): p1 * p2, (1, -x): p1 * (1 - p2), (0, 0): 1 - p1}

    def exact_distribution(
        self, keys_row: list[int], signs_row: list[int]
    ) -> dict[tuple[int, int, int], Fraction]:
        """Exact law of one user's report ``(j, bit, value)``."""
        x = dict(zip(keys_row, signs_row, strict=True))
        out: dict[tuple[int, int, int], Fraction] = {}
        for j in range(self.d):
            for (bit, v), pr in self._law(x.get(j, 0)).items():
                out[(j, bit, v)] = pr / self.d
        return out

    # -- sampling --------------------------------------------------------------------------

    def randomise(
        self, keys: NDArray[np.int64], signs: NDArray[np.int8], rng: np.random.Generator
    ) -> NDArray[np.int64]:
        """One report per user, shape ``(n, 3)``: ``(j, bit, value)``."""
        keys, signs = check_input(keys, signs, self.d, self.s)
        n = keys.shape[0]
        j = np.asarray(rng.integers(0, self.d, size=n), dtype=np.int64)
        match = keys == j[:, None]
        present = match.any(axis=1)
        held = (signs * match).sum(axis=1)  # x_j: +-1 when present, else 0
        u = rng.random(n)
        bit = np.where(present, u < float(self.p1), u < float(1 - self.p1))
        kept = np.where(rng.random(n) < float(self.p2), 1, -1)
        fake = 2 * rng.integers(0, 2, size=n) - 1
        value = np.where(present, held * kept, fake) * bit
        return np.stack([j, bit.astype(np.int64), value]).T.astype(np.int64)

    def tally(self, reports: NDArray[np.int64]) -> PrivKVCounts:
        j, bit, value = reports[:, 0], reports[:, 1], reports[:, 2]
        d = self.d
        return PrivKVCounts(
            n=reports.shape[0],
            group=np.bincount(j, minlength=d),
            plus=np.bincount(j[(bit == 1) & (value == 1)], minlength=d),
            minus=np.bincount(j[(bit == 1) & (value == -1)], minlength=d),
        )

    # -- estimation ------------------------------------------------------------------------

    def estimate(self, counts: PrivKVCounts) -> KVEstimate:
        p1, p2 = float(self.p1), float(self.p2)
        with np.errstate(divide="ignore", invalid="ignore"):
            group = counts.group.astype(np.float64)
            reported = (counts.plus + counts.minus) / group
            key_freq = (reported - (1 - p1)) / (2 * p1 - 1)
            mean = (counts.plus - counts.minus) / (group * p1 * (2 * p2 - 1))
        key_freq = np.where(counts.group > 0, key_freq, 0.0)
        mean = np.where(counts.group > 0, mean, 0.0)
        freq = np.stack([(key_freq + mean) / 2, (key_freq - mean) / 2])
        return KVEstimate(freq=freq, mean=mean)

    def original_estimate(self, counts: PrivKVCounts) -> KVEstimate:
        """The original's estimates mapped as they stand: ``f_j`` times the conditional mean
        ``m_j = (n1' - n2') / N_j`` with ``n1', n2'`` clipped to ``[0, N_j]``. Biased (fake
        presences dilute ``m_j``); kept to show what the unbiased mapping changes."""
        p1, p2 = float(self.p1), float(self.p2)
        group = np.maximum(counts.group, 1).astype(np.float64)
        present = (counts.plus + counts.minus).astype(np.float64)
        key_freq = np.where(counts.group > 0, (present / group - (1 - p1)) / (2 * p1 - 1), 0.0)
        n1 = np.clip((present * (p2 - 1) + counts.plus) / (2 * p2 - 1), 0, present)
        n2 = np.clip((present * (p2 - 1) + counts.minus) / (2 * p2 - 1), 0, present)
        cond = (n1 - n2) / np.maximum(present, 1)
        mean = key_freq * cond
        return KVEstimate(
            freq=np.stack([key_freq * (1 + cond) / 2, key_freq * (1 - cond) / 2]), mean=mean
        )

    def run(
        self, keys: NDArray[np.int64], signs: NDArray[np.int8], rng: np.random.Generator
    ) -> KVEstimate:
        return self.estimate(self.tally(self.randomise(keys, signs, rng)))
