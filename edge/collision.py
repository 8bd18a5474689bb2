"""The Collision mechanism (paper, Definition 1)."""

from __future__ import annotations

from collections.abc import Sequence
from fractions import Fraction

import numpy as np
from numpy.typing import NDArray

from edge import device, hashing
from edge._mechanism import LocalMechanism, nth_free
from edge.theory import Mechanism


class Collision(LocalMechanism):
    """``(d, s, eps, t)``-Collision: an eps-LDP randomiser of s-sparse ternary vectors.

    Input: ``x`` in ``{-1, 0, 1}^d`` with exactly ``s`` non-zeros, seen as the set ``Y_x`` of
    ``s`` elements ``j+``/``j-`` of a domain of size ``2d``. A report is ``(seed, z)``: the seed
    picks a hash ``H: elements -> [0, t)`` and ``z`` follows

    ``P[z | x] = E / Omega`` if ``z`` is in ``H(Y_x)``, else ``(Omega - k E) / ((t - k) Omega)``

    with ``k = |H(Y_x)|`` and ``Omega = s E + (t - s) U`` (integer weights, ``E/U <= e^eps``).
    Every probability lies in ``[U/Omega, E/Omega]`` for every seed, so the report is eps-LDP
    for any two inputs (replacement neighbours). Unbiased estimators and their exact
    variances: :mod:`edge.theory`. Requires ``t > s``.
    """

    mechanism: Mechanism = "collision"

    def _buckets(self, keys: Sequence[int], signs: Sequence[int], seed: int) -> list[int]:
        return [
            device.collision_bucket(2 * j + (1 if b > 0 else 0), seed, self.t)
            for j, b in zip(keys, signs, strict=True)
        ]

    def _exact(self, keys: Sequence[int], signs: Sequence[int], seed: int) -> list[Fraction]:
        sp = self.spec
        omega = sp.omega_weight
        hit = set(self._buckets(keys, signs, seed))
        k = len(hit)
        on = Fraction(sp.exp_eps_weight, omega)
        off = Fraction(omega - k * sp.exp_eps_weight, (sp.t - k) * omega)
        return [on if z in hit else off for z in range(sp.t)]

    def _batch_z(
        self,
        keys: NDArray[np.int64],
        signs: NDArray[np.int8],
        seeds: NDArray[np.uint32],
        rng: np.random.Generator,
    ) -> NDArray[np.int64]:
        sp = self.spec
        n, s = keys.shape
        e_w = sp.exp_eps_weight
        elements = 2 * keys + (signs > 0)
        buckets = hashing.fastrange(hashing.xxh32(seeds, hashing.key_terms(elements)), sp.t)
        rows = np.arange(n)
        # Step 2 of device.randomise_collision: land on element i, keep its bucket w.p. 1/c.
        r = rng.integers(0, sp.omega_weight, size=n, dtype=np.int64)
        i = np.minimum(r // e_w, s - 1)
        v = buckets[rows, i]
        c = (buckets == v[:, None]).sum(axis=1)
        keep = (r < s * e_w) & (rng.integers(0, c) == 0)
        # Step 3: a uniformly chosen free bucket.
        used = np.sort(buckets, axis=1)
        k = 1 + (np.diff(used, axis=1) != 0).sum(axis=1)
        free = nth_free(rng.integers(0, sp.t - k), used)
        z: NDArray[np.int64] = np.where(keep, v, free)
        return z
