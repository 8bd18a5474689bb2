"""Every mechanism of the accuracy experiments behind one protocol (:class:`KVMechanism`).

Collision and CoCo run the product's own code: the vectorised randomiser of :mod:`edge`
(:meth:`edge.LocalMechanism.randomise_sparse`, bit-identical in law to the device path) and
the aggregator's streaming estimator (:class:`aggregator.estimation.estimators.AggregateState`).
Both estimate the ``2d`` item frequencies as well as the means: from the aggregator's mean ``m_j``
and non-missing frequency ``f_j``, ``f(j+) = (f_j + m_j) / 2`` and ``f(j-) = (f_j - m_j) / 2`` (for
Collision this is exactly the item estimator ``(a_j/n - 1/t) / (p - 1/t)`` of the paper; for CoCo it
is unbiased too, since both ``m_j`` and ``f_j`` are).

``t`` (the output domain size) is by default the product's: the value that minimises the
closed-form mean MSE (:func:`edge.theory.optimal_t`). ``t_rule="paper"`` uses the paper's rule
of thumb instead (:func:`edge.theory.paper_t`: ``floor(s e^eps + 2s - 1)`` for Collision,
``ceil(s e^eps + s + 2)`` rounded up to even for CoCo).

The baselines come from :data:`sim.experiments.baselines.BASELINES`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import partial
from typing import Literal

import numpy as np
from numpy.typing import NDArray

from aggregator.estimation.estimators import AggregateState
from edge import LocalMechanism, MechanismSpec
from edge.theory import Mechanism, paper_t
from sim.experiments.baselines import BASELINES
from sim.experiments.baselines.base import KVEstimate, KVMechanism

TRule = Literal["optimal", "paper"]
Factory = Callable[[int, int, float], KVMechanism]

_NAMES: dict[Mechanism, str] = {"collision": "Collision", "coco": "CoCo"}


class ProductMechanism:
    """Collision or CoCo as in the product: edge randomiser -> aggregator estimator."""

    def __init__(
        self, mechanism: Mechanism, *, d: int, s: int, epsilon: float, t_rule: TRule = "optimal"
    ) -> None:
        if t_rule == "paper":
            t = paper_t(mechanism, s=s, exp_eps=math.exp(epsilon))
            self.spec = MechanismSpec(mechanism=mechanism, d=d, s=s, epsilon=epsilon, t=t)
        else:
            self.spec = MechanismSpec(mechanism=mechanism, d=d, s=s, epsilon=epsilon)
        self._local = LocalMechanism.from_spec(self.spec)
        self.name = _NAMES[mechanism]
        self.d = d
        self.s = s
        self.epsilon = float(epsilon)

    @property
    def t(self) -> int:
        return self.spec.t

    def run(
        self,
        keys: NDArray[np.int64],
        signs: NDArray[np.int8],
        rng: np.random.Generator,
    ) -> KVEstimate:
        """One report per user from ``rng``, aggregated; items and means (module docs)."""
        seeds, z = self._local.randomise_sparse(keys, signs, rng)
        state = AggregateState(self.spec)
        state.add(seeds, z)
        est = state.estimate()
        freq = np.stack([(est.freq + est.mean) / 2, (est.freq - est.mean) / 2])
        return KVEstimate(freq=freq, mean=est.mean)


def _product(mechanism: Mechanism, t_rule: TRule, d: int, s: int, epsilon: float) -> KVMechanism:
    return ProductMechanism(mechanism, d=d, s=s, epsilon=epsilon, t_rule=t_rule)


def registry(t_rule: TRule = "optimal") -> dict[str, Factory]:
    """Factories ``(d, s, epsilon) -> KVMechanism`` by name: Collision, CoCo, the baselines."""
    factories: dict[str, Factory] = {
        "Collision": partial(_product, "collision", t_rule),
        "CoCo": partial(_product, "coco", t_rule),
    }
    factories.update(BASELINES)
    return factories
