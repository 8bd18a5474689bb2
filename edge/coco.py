"""The CoCo (correlated Collision) mechanism (paper, Algorithm 1)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from fractions import Fraction

import numpy as np
from numpy.typing import NDArray

from edge import device, hashing
from edge._mechanism import LocalMechanism, nth_free
from edge.theory import Mechanism


class CoCo(LocalMechanism):
    """``(d, s, eps, t)``-CoCo: Collision with ``j+`` and ``j-`` forced into one bucket pair.

    Input: ``x`` in ``{-1, 0, 1}^d`` with exactly ``s`` non-zeros. The seed picks
    ``H1: [d] -> [0, t/2)`` and ``H2: [d] -> {-1, +1}``; element ``j_b`` lives in bucket
    ``H(j_b) = H1(j) + [b H2(j) = +1] t/2`` and its opposite ``j_-b`` in the partner bucket of
    the same pair. Each non-zero dimension gives its pair weight ``E + U``: ``E`` on
    ``H(j_b)``, ``U`` on the partner (a pair shared by ``c`` dimensions takes one of their
    splits uniformly at random, the paper's random permutation with overwrites). The rest of
    ``Omega = s (E + U) + (t - 2 s) U`` is spread evenly over the buckets of unused pairs.

    Every bucket's weight lies in ``[U, E]`` for every input and seed, so a report is eps-LDP
    (Proposition "coldp"). Because ``P_o < P_f`` the mean estimator's variance is below
    Collision's (Lemma "cocomse"; exact moments in :mod:`edge.theory`). Requires an even
    ``t >= 2 s + 2``.
    """

    mechanism: Mechanism = "coco"

    def _exact(self, keys: Sequence[int], signs: Sequence[int], seed: int) -> list[Fraction]:
        sp = self.spec
        half = sp.t // 2
        omega = sp.omega_weight
        by_pair: dict[int, list[int]] = defaultdict(list)
        for j, b in zip(keys, signs, strict=True):
            pair, h2_positive = device.coco_hash(j, seed, half)
            by_pair[pair].append(device.coco_position(pair, h2_positive, b, half))
        m = len(by_pair)
        free = Fraction(omega - m * (sp.exp_eps_weight + sp.unit_weight), (sp.t - 2 * m) * omega)
        probs = [free] * sp.t
        for pair, positions in by_pair.items():
            c = len(positions)
            probs[pair] = probs[pair + half] = Fraction(0)
            for pos in positions:
                probs[pos] += Fraction(sp.exp_eps_weight, c * omega)
                probs[2 * pair + half - pos] += Fraction(sp.unit_weight, c * omega)
        return probs

    def _batch_z(
        self,
        keys: NDArray[np.int64],
        signs: NDArray[np.int8],
        seeds: NDArray[np.uint32],
        rng: np.random.Generator,
    ) -> NDArray[np.int64]:
        sp = self.spec
        n, s = keys.shape
        half = sp.t // 2
        e_w = sp.exp_eps_weight
        w_pair = e_w + sp.unit_weight
        h = hashing.xxh32(seeds, hashing.key_terms(keys))
        pairs = hashing.fastrange31(h, half)
        high = (signs > 0) == ((h >> np.uint32(31)) == 1)
        positions = pairs + half * high
        rows = np.arange(n)
        # Step 2 of device.randomise_coco: land on entry i, keep its pair w.p. 1/c.
        r = rng.integers(0, sp.omega_weight, size=n, dtype=np.int64)
        i = np.minimum(r // w_pair, s - 1)
        pair_i = pairs[rows, i]
        pos_i = positions[rows, i]
        c = (pairs == pair_i[:, None]).sum(axis=1)
        keep = (r < s * w_pair) & (rng.integers(0, c) == 0)
        z_kept = np.where(r - i * w_pair < e_w, pos_i, 2 * pair_i + half - pos_i)
        # Step 3: a uniformly chosen bucket of an unused pair.
        used = np.sort(pairs, axis=1)
        m = 1 + (np.diff(used, axis=1) != 0).sum(axis=1)
        free_pairs = half - m
        q = rng.integers(0, 2 * free_pairs)
        upper = q >= free_pairs
        z_free = nth_free(np.where(upper, q - free_pairs, q), used) + half * upper
        z: NDArray[np.int64] = np.where(keep, z_kept, z_free)
        return z
