"""A key-value usage model with known ground truth (simulation only): app features used,
liked (+1) or disliked (-1).

There are ``features`` features. Feature ``j`` has a popularity ``p_j`` (the probability
that a device uses it in a round; Zipf-like, ``p_j = min(1, c / (j + 1)^a)`` with ``c`` set
so that a device uses ``expected_keys`` features on average) and a like-rate ``q_j``
(drawn once from ``Beta(2, 2)``): a device that uses feature ``j`` reports ``+1`` with
probability ``q_j`` and ``-1`` otherwise. Devices use features independently, so the number
of used features varies; :class:`~edge.encoders.KeyValueEncoder` pads a device's pairs to
exactly ``s`` keys (or samples ``s`` of them), on ``features + s`` mechanism dimensions.

Randomness: the feature parameters come from ``seed``; each device draws its pairs from its
own generator (:meth:`pairs` takes it), so a device's data do not depend on the fleet size.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray

__all__ = ["KeyValueModel"]

F64 = NDArray[np.float64]


@dataclass(frozen=True, kw_only=True)
class KeyValueModel:
    """``features`` features with Zipf-like popularity and Beta(2, 2) like-rates."""

    features: int
    expected_keys: float = 2.0
    zipf_exponent: float = 1.0
    seed: int = 0
    popularity: F64 = field(init=False, repr=False, compare=False)
    like_rate: F64 = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if isinstance(self.features, bool) or self.features < 1:
            raise ValueError(f"features must be >= 1, got {self.features}")
        if not (math.isfinite(self.expected_keys) and 0 < self.expected_keys <= self.features):
            raise ValueError(
                f"expected_keys must be in (0, features={self.features}], got {self.expected_keys}"
            )
        if not (math.isfinite(self.zipf_exponent) and self.zipf_exponent >= 0):
            raise ValueError(f"zipf_exponent must be >= 0, got {self.zipf_exponent}")
        weights = 1.0 / np.arange(1, self.features + 1, dtype=np.float64) ** self.zipf_exponent
        # Scale so that sum(min(1, c w_j)) = expected_keys (bisection on c; monotone in c).
        lo, hi = 0.0, self.features / float(weights.min())
        for _ in range(100):
            mid = (lo + hi) / 2
            if np.minimum(1.0, mid * weights).sum() < self.expected_keys:
                lo = mid
            else:
                hi = mid
        rng = np.random.default_rng(np.random.SeedSequence(self.seed))
        object.__setattr__(self, "popularity", np.minimum(1.0, hi * weights))
        object.__setattr__(self, "like_rate", rng.beta(2.0, 2.0, size=self.features))

    def pairs(self, rng: np.random.Generator) -> dict[int, float]:
        """One device's pairs of one round: ``{feature: +1.0 (liked) or -1.0 (disliked)}``."""
        used = np.flatnonzero(rng.random(self.features) < self.popularity)
        liked = rng.random(used.size) < self.like_rate[used]
        return {int(j): (1.0 if like else -1.0) for j, like in zip(used, liked, strict=True)}
