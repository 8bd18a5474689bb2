"""PCKV (Gu, Li, Cheng, Xiong, Cao, USENIX Security 2020): padding-and-sampling of one of
the user's own pairs, then Unary Encoding (PCKV-UE) or Generalized Randomized Response
(PCKV-GRR, and PCKV-AGRR at the sampling-amplified budget) with correlated key-value
perturbation."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from fractions import Fraction
from functools import cached_property

import numpy as np
from numpy.typing import NDArray

from sim.experiments.baselines._common import (
    candidate_weights,
    check_input,
    check_parameters,
    exp_rational,
    pad_and_sample,
)
from sim.experiments.baselines.base import KVEstimate


@dataclass(frozen=True)
class PCKVCounts:
    """Per key ``k`` of the padded domain ``[0, d + ell)``: ``n1[k]`` reports of ``<k, +1>``
    and ``n2[k]`` of ``<k, -1>`` over ``n`` users."""

    n: int
    n1: NDArray[np.int64]
    n2: NDArray[np.int64]


def pckv_estimate(
    counts: PCKVCounts, *, d: int, ell: int, a: float, b: float, p: float
) -> KVEstimate:
    """Gu et al.'s improved estimator (Section 5), for the first ``d`` (real) keys.

    ``[n1_hat, n2_hat] = A^-1 [n1 - n b/2, n2 - n b/2]`` with
    ``A = [[a p - b/2, a (1-p) - b/2], [a (1-p) - b/2, a p - b/2]]`` estimates the number of
    users whose *sampled* pair is ``<k, +1>`` / ``<k, -1>``; sampling has probability
    ``1/ell`` per pair, so ``freq = ell * n_hat / n``. This is linear in the counts and
    exactly unbiased when every user holds at most ``ell`` pairs (their Theorem 4, here with
    item frequencies). ``f_k = freq_+ + freq_-`` is their frequency estimator; the
    unconditional mean ``freq_+ - freq_-`` equals ``f_k * m_k`` for their mean ``m_k``
    without the clipping of ``n_hat`` to ``[0, n f_k / ell]``, which only serves the
    conditional mean (a ratio, biased) and is left to post-processing.
    """
    n = counts.n
    diag, off = a * p - b / 2, a * (1 - p) - b / 2
    r1 = counts.n1[:d] - n * b / 2
    r2 = counts.n2[:d] - n * b / 2
    det = diag * diag - off * off
    n1_hat = (diag * r1 - off * r2) / det
    n2_hat = (diag * r2 - off * r1) / det
    freq = ell * np.stack([n1_hat, n2_hat]) / n
    return KVEstimate(freq=freq, mean=freq[0] - freq[1])


@dataclass(frozen=True, kw_only=True)
class _PaddingAndSampling:
    """What PCKV-UE and PCKV-GRR share: padding to ``ell`` pairs (default ``s``) with dummy
    keys ``d .. d + ell - 1``, one pair sampled uniformly, and the linear estimator
    :func:`pckv_estimate` with each variant's ``a``, ``b`` and ``p``."""

    d: int
    s: int
    epsilon: float
    ell: int | None = None

    def __post_init__(self) -> None:
        check_parameters(self.d, self.s, self.epsilon)
        if self.ell is not None and self.ell < self.s:
            raise ValueError(
                f"ell must be >= s={self.s} (else the estimator is biased), got {self.ell}"
            )

    @property
    def padding(self) -> int:
        return self.s if self.ell is None else self.ell

    @property
    def domain(self) -> int:
        """``d' = d + ell``: real keys then dummy keys."""
        return self.d + self.padding

    @cached_property
    def exp_eps(self) -> Fraction:
        return exp_rational(self.epsilon)

    @property
    def a(self) -> Fraction:
        raise NotImplementedError

    @property
    def b(self) -> Fraction:
        raise NotImplementedError

    @property
    def p(self) -> Fraction:
        raise NotImplementedError

    def estimate(self, counts: PCKVCounts) -> KVEstimate:
        return pckv_estimate(
            counts, d=self.d, ell=self.padding, a=float(self.a), b=float(self.b), p=float(self.p)
        )


@dataclass(frozen=True, kw_only=True)
class PCKVUE(_PaddingAndSampling):
    """PCKV-UE: padding-and-sampling, then correlated Unary Encoding over ``d' = d + ell``
    keys.

    Randomiser: the sampled pair ``<k, v>`` (``v`` in +-1; a dummy's value is uniform +-1) is
    one-hot encoded; bit ``k`` becomes ``v`` w.p. ``a p``, ``-v`` w.p. ``a (1 - p)``, ``0``
    w.p. ``1 - a``; every other bit becomes ``+1`` or ``-1`` w.p. ``b/2`` each, else ``0``.
    Parameters: Gu et al.'s optimal allocation (their Section 6) ``a = 1/2``,
    ``b = 1 / (e^eps1 + 1)`` with ``e^eps1 = (e^eps + 1)/2`` and ``p = e^eps / (e^eps + 1)``
    (``eps2 = eps``). Their Theorem 2 then gives
    ``eps = max(eps2, eps1 + ln(2 / (1 + e^-eps2)))``, both terms equal to ``eps``: the bound
    ``e^eps`` is attained (an input whose ``s`` bits all fire against one with disjoint
    support, when ``d >= 2s`` and ``ell = s``). The sampling does not amplify UE: a user's
    other pairs' bits would each need their own ``b``.

    ``ell`` (padding length) defaults to ``s``: every user holds exactly ``s`` pairs, so no
    dummy is ever sampled; the ``ell`` dummy keys stay in the domain as in the original.

    Estimator: :func:`pckv_estimate` (unbiased). The counts of the ``n`` reports are drawn
    per key: the users whose sampled key is ``k`` go through the sampled-bit law one by one
    and the others' bit ``k`` (i.i.d. ``b/2, b/2, 1 - b``) as one multinomial, which is the
    exact law of the sum of the ``n`` independent ``d'``-bit reports (bits of one report are
    independent given the sampled pair); :meth:`randomise` draws the full reports.
    """

    name: str = field(default="PCKV-UE", init=False)

    @cached_property
    def a(self) -> Fraction:
        return Fraction(1, 2)

    @cached_property
    def b(self) -> Fraction:
        return 1 / ((self.exp_eps + 1) / 2 + 1)

    @cached_property
    def p(self) -> Fraction:
        return self.exp_eps / (self.exp_eps + 1)

    @cached_property
    def ldp_ratio(self) -> Fraction:
        """Exact worst-case ratio ``e^eps`` (attained for ``ell = s``, ``d >= 2s``)."""
        return self.exp_eps

    def _bit_law(self, state: int | None) -> dict[int, Fraction]:
        """Law of one output bit: ``state`` is the sampled value (+-1), 0 for a sampled dummy
        (uniform value) and ``None`` for a key that was not sampled."""
        a, b, p = self.a, self.b, self.p
        if state is None:
            return {1: b / 2, -1: b / 2, 0: 1 - b}
        if state == 0:
            return {1: a / 2, -1: a / 2, 0: 1 - a}
        return {state: a * p, -state: a * (1 - p), 0: 1 - a}

    def exact_distribution(
        self, keys_row: list[int], signs_row: list[int]
    ) -> dict[tuple[int, ...], Fraction]:
        """Exact law of one user's ``d'``-bit report (``3^d'`` outcomes: small ``d`` only)."""
        cands = candidate_weights(keys_row, signs_row, self.d, self.padding)
        idle = self._bit_law(None)
        out: dict[tuple[int, ...], Fraction] = {}
        for y in itertools.product((-1, 0, 1), repeat=self.domain):
            base = Fraction(1)
            for bit in y:
                base *= idle[bit]
            total = Fraction(0)
            for k, v, w in cands:
                total += w * self._bit_law(v)[y[k]] / idle[y[k]]
            out[y] = base * total
        return out

    def randomise(
        self, keys: NDArray[np.int64], signs: NDArray[np.int8], rng: np.random.Generator
    ) -> NDArray[np.int8]:
        """Full reports, shape ``(n, d')`` with entries in {-1, 0, 1} (memory ``n d'``)."""
        keys, signs = check_input(keys, signs, self.d, self.s)
        n = keys.shape[0]
        key, sign = pad_and_sample(keys, signs, self.d, self.padding, rng)
        b = float(self.b)
        u = rng.random((n, self.domain))
        y = np.where(u < b / 2, 1, np.where(u < b, -1, 0)).astype(np.int8)
        rows = np.arange(n)
        y[rows, key] = self._sampled_bits(sign, rng)
        return y

    def _sampled_bits(self, sign: NDArray[np.int8], rng: np.random.Generator) -> NDArray[np.int8]:
        n = sign.shape[0]
        keep = rng.random(n) < float(self.a)
        true = rng.random(n) < float(self.p)
        return (np.where(true, sign, -sign) * keep).astype(np.int8)

    def tally(self, reports: NDArray[np.int8]) -> PCKVCounts:
        return PCKVCounts(
            n=reports.shape[0],
            n1=(reports == 1).sum(axis=0).astype(np.int64),
            n2=(reports == -1).sum(axis=0).astype(np.int64),
        )

    def aggregate(
        self, keys: NDArray[np.int64], signs: NDArray[np.int8], rng: np.random.Generator
    ) -> PCKVCounts:
        """The counts of :meth:`randomise`'s reports, drawn without materialising them."""
        keys, signs = check_input(keys, signs, self.d, self.s)
        n = keys.shape[0]
        key, sign = pad_and_sample(keys, signs, self.d, self.padding, rng)
        bits = self._sampled_bits(sign, rng)
        dom = self.domain
        sampled = np.bincount(key, minlength=dom)
        b = float(self.b)
        idle = rng.multinomial(n - sampled, [b / 2, b / 2, 1 - b])
        n1 = np.bincount(key[bits == 1], minlength=dom) + idle[:, 0]
        n2 = np.bincount(key[bits == -1], minlength=dom) + idle[:, 1]
        return PCKVCounts(n=n, n1=n1.astype(np.int64), n2=n2.astype(np.int64))

    def run(
        self, keys: NDArray[np.int64], signs: NDArray[np.int8], rng: np.random.Generator
    ) -> KVEstimate:
        return self.estimate(self.aggregate(keys, signs, rng))


@dataclass(frozen=True, kw_only=True)
class PCKVGRR(_PaddingAndSampling):
    """PCKV-GRR as the paper's experiments run it: padding-and-sampling, then Generalized
    Randomized Response over the ``2 d'`` pairs ``<k, +-1>`` (``d' = d + ell``) at ``e^eps``.

    Gu et al.'s correlated perturbation (key kept w.p. ``a = e^eps1 / (e^eps1 + d' - 1)``,
    value kept w.p. ``p = e^eps2 / (e^eps2 + 1)`` if the key is kept, uniform otherwise) is
    exactly GRR over the ``2 d'`` pairs with weight ``e^eps2`` when ``e^eps1 = (e^eps2 + 1)/2``:
    ``a p = e^eps2 / Omega`` and ``a (1 - p) = b / 2 = 1 / Omega``, ``Omega = e^eps2 + 2 d' - 1``.
    Their budget allocation for PCKV-GRR (Section 6) credits the sampling:
    ``e^eps2 = ell (e^eps - 1) + 1``. That credited version is :class:`PCKVAGRR`; this class
    uses ``e^eps2 = e^eps`` (the allocation with ``ell = 1``), the paper's "PCKV-GRR".

    Privacy: a report ``<k, v>`` has probability ``(1 + (e^eps - 1) w) / Omega`` with ``w`` the
    probability that ``<k, v>`` was the sampled pair (``1/ell`` for a held pair, 0 for any
    other real pair), so the exact worst-case ratio is ``1 + (e^eps - 1) / ell``, below
    ``e^eps`` for ``ell >= 2``: at budget ``eps`` this mechanism spends only
    ``ln(1 + (e^eps - 1)/ell)``. :attr:`ldp_ratio` is that exact value.

    Estimator: :func:`pckv_estimate` (unbiased).
    """

    name: str = field(default="PCKV-GRR", init=False)

    @cached_property
    def grr_weight(self) -> Fraction:
        """``e^eps2``: the GRR weight of the sampled pair."""
        return self.exp_eps

    @cached_property
    def omega(self) -> Fraction:
        return self.grr_weight + 2 * self.domain - 1

    @cached_property
    def a(self) -> Fraction:
        return (self.grr_weight + 1) / self.omega

    @cached_property
    def b(self) -> Fraction:
        return 2 / self.omega

    @cached_property
    def p(self) -> Fraction:
        return self.grr_weight / (self.grr_weight + 1)

    @cached_property
    def ldp_ratio(self) -> Fraction:
        """Exact worst-case output ratio over any two inputs: ``1 + (e^eps2 - 1) / ell``."""
        return 1 + (self.grr_weight - 1) / self.padding

    def exact_distribution(
        self, keys_row: list[int], signs_row: list[int]
    ) -> dict[tuple[int, int], Fraction]:
        """Exact law of one user's report ``(key, value)`` over the ``2 d'`` pairs."""
        hit: dict[tuple[int, int], Fraction] = {}
        for k, v, w in candidate_weights(keys_row, signs_row, self.d, self.padding):
            for value in (1, -1) if v == 0 else (v,):
                share = w / 2 if v == 0 else w
                hit[(k, value)] = hit.get((k, value), Fraction(0)) + share
        e = self.grr_weight
        return {
            (k, v): (1 + (e - 1) * hit.get((k, v), Fraction(0))) / self.omega
            for k in range(self.domain)
            for v in (1, -1)
        }

    def randomise(
        self, keys: NDArray[np.int64], signs: NDArray[np.int8], rng: np.random.Generator
    ) -> NDArray[np.int64]:
        """One report per user, shape ``(n, 2)``: ``(key, value)``."""
        keys, signs = check_input(keys, signs, self.d, self.s)
        n = keys.shape[0]
        key, sign = pad_and_sample(keys, signs, self.d, self.padding, rng)
        item = 2 * key + (sign < 0)  # <k, +1> -> 2k, <k, -1> -> 2k + 1
        size = 2 * self.domain
        other = np.asarray(rng.integers(0, size - 1, size=n), dtype=np.int64)
        other += other >= item  # uniform over the 2d' - 1 other pairs
        own = rng.random(n) < float(self.grr_weight / self.omega)
        out = np.where(own, item, other)
        return np.stack([out // 2, 1 - 2 * (out % 2)]).T.astype(np.int64)

    def tally(self, reports: NDArray[np.int64]) -> PCKVCounts:
        key, value = reports[:, 0], reports[:, 1]
        return PCKVCounts(
            n=reports.shape[0],
            n1=np.bincount(key[value == 1], minlength=self.domain),
            n2=np.bincount(key[value == -1], minlength=self.domain),
        )

    def run(
        self, keys: NDArray[np.int64], signs: NDArray[np.int8], rng: np.random.Generator
    ) -> KVEstimate:
        return self.estimate(self.tally(self.randomise(keys, signs, rng)))


@dataclass(frozen=True, kw_only=True)
class PCKVAGRR(PCKVGRR):
    """PCKV-AGRR: :class:`PCKVGRR` with the GRR weight ``e^eps' = ell (e^eps - 1) + 1``, i.e.
    GRR at ``eps' = ln(s (e^eps - 1) + 1)`` for ``ell = s`` (the paper's definition; it is
    also Gu et al.'s own optimal PCKV-GRR allocation ``eps2 = ln(ell (e^eps - 1) + 1)``,
    ``eps1 = ln(ell (e^eps - 1)/2 + 1)``).

    Why that budget: the GRR step alone is only ``eps'``-LDP (``eps' > eps``), but it sees
    the pair that padding-and-sampling drew, and each of the user's pairs is drawn with
    probability exactly ``1/ell``. A report's probability is ``(1 + (e^eps' - 1) w)/Omega``
    with ``w`` in ``{0, 1/ell}``, so the worst ratio over any two inputs is
    ``1 + (e^eps' - 1)/ell = e^eps``: the *whole* randomiser (sampling included) is
    ``eps``-LDP per report, exactly and attained (:attr:`ldp_ratio`). Comparing it at ``eps``
    is therefore fair. The guarantee leans on the sampling being private and on every user
    holding at most ``ell`` pairs (padding): a user whose sampled pair were known, or who
    held fewer than ``ell`` pairs without padding, would get only ``eps'``.
    """

    name: str = field(default="PCKV-AGRR", init=False)

    @cached_property
    def grr_weight(self) -> Fraction:
        return self.padding * (self.exp_eps - 1) + 1
