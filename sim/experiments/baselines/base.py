"""What every mechanism in the experiments provides (CoCo and Collision adapt to it too).

Data: ``n`` users, each holding an ``s``-sparse ternary vector of dimension ``d``, given as
``keys`` (shape ``(n, s)``, int64, distinct within a row, values in ``[0, d)``) and ``signs``
(shape ``(n, s)``, int8, each ``+1`` or ``-1``): user ``i`` has ``x[i, keys[i, k]] =
signs[i, k]`` and zero elsewhere. The 2d items of the paper are ``j_+`` and ``j_-``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np
from numpy.typing import NDArray


@dataclass(frozen=True)
class KVEstimate:
    """Estimates from one run of a mechanism over a population.

    ``freq``: shape ``(2, d)``; row 0 estimates the share of users with ``x_j = +1``, row 1
    the share with ``x_j = -1`` (``None`` for a mechanism that does not estimate them).
    ``mean``: shape ``(d,)``, estimates ``(1/n) sum_i x_ij``.
    """

    freq: NDArray[np.float64] | None
    mean: NDArray[np.float64]


class KVMechanism(Protocol):
    """One eps-LDP mechanism with its server-side estimator, vectorised over users.

    The attributes are read-only members, so frozen dataclasses implement the protocol as
    well as classes with plain (settable) attributes.
    """

    @property
    def name(self) -> str: ...

    @property
    def d(self) -> int: ...

    @property
    def s(self) -> int: ...

    @property
    def epsilon(self) -> float: ...

    def run(
        self,
        keys: NDArray[np.int64],
        signs: NDArray[np.int8],
        rng: np.random.Generator,
    ) -> KVEstimate:
        """Randomise every user's vector with ``rng`` and estimate from the reports."""
        ...
