"""The summary record of one shuffled batch: :class:`Amplification`, :func:`amplify_spec`.

``epsilon_central`` is what the product reports: for CoCo and Collision the certified
mechanism-specific blanket bound (:mod:`aggregator.accountant.blanket`), for a generic
eps0-LDP randomiser the certified stronger-clone bound (:mod:`aggregator.accountant.clone`).
``epsilon_central_generic`` is always the latter. The paper's mechanism-specific pair is
not an upper bound and is not part of this record.
"""

from __future__ import annotations

from dataclasses import dataclass

from aggregator.accountant._checks import check_delta, check_epsilon0, check_n
from aggregator.accountant.blanket import blanket_epsilon, blanket_pair_for_spec
from aggregator.accountant.clone import epsilon_central, generic_clone_probability
from aggregator.accountant.closed_forms import efmrtt19, fmt21
from edge.spec import MechanismSpec

__all__ = ["Amplification", "amplify", "amplify_spec"]


@dataclass(frozen=True, kw_only=True, slots=True)
class Amplification:
    """Central privacy of one shuffled batch of ``n`` reports, at ``delta``.

    * ``epsilon_central``: the certified central epsilon to report. ``bound`` names it:
      ``"blanket"`` (CoCo / Collision: the privacy-blanket dominating pair, proof in
      docs/privacy-model.md, exhaustively checked in the test-suite) or
      ``"stronger-clone"`` (a generic eps0-LDP randomiser);
    * ``epsilon_central_generic``: the stronger-clone bound with the generic clone
      probability ``clone_probability = 1/(e^eps0 + 1)``, certified for every eps0-LDP
      randomiser and never below ``epsilon_central``;
    * ``efmrtt19`` and ``fmt21``: closed forms for comparison, ``None`` outside their
      regimes.
    """

    n: int
    delta: float
    epsilon0: float
    mechanism: str
    bound: str
    epsilon_central: float
    epsilon_central_generic: float
    clone_probability: float
    efmrtt19: float | None
    fmt21: float | None

    def __post_init__(self) -> None:
        check_n(self.n)
        check_delta(self.delta)
        check_epsilon0(self.epsilon0)
        if self.bound not in ("blanket", "stronger-clone"):
            raise ValueError(f"bound must be 'blanket' or 'stronger-clone', got {self.bound!r}")
        for name in ("epsilon_central", "epsilon_central_generic"):
            value = getattr(self, name)
            if not 0.0 <= value <= self.epsilon0:
                raise ValueError(f"{name} must be in [0, epsilon0={self.epsilon0}], got {value}")

    def to_dict(self) -> dict[str, int | float | str | bool | None]:
        """JSON-ready values (``None`` where a closed form does not apply)."""
        return {
            "n": self.n,
            "delta": self.delta,
            "epsilon0": self.epsilon0,
            "mechanism": self.mechanism,
            "bound": self.bound,
            "epsilon_central": self.epsilon_central,
            "certified": True,
            "epsilon_central_generic": self.epsilon_central_generic,
            "clone_probability": self.clone_probability,
            "efmrtt19": self.efmrtt19,
            "fmt21": self.fmt21,
        }


def amplify(*, n: int, delta: float, epsilon0: float) -> Amplification:
    """The record for ``n`` shuffled reports of an arbitrary eps0-LDP randomiser.

    Only the generic stronger-clone bound applies: ``epsilon_central`` equals
    ``epsilon_central_generic``.
    """
    n = check_n(n)
    delta = check_delta(delta)
    epsilon0 = check_epsilon0(epsilon0)
    alpha = generic_clone_probability(epsilon0)
    eps_g = epsilon_central(n=n, delta=delta, epsilon0=epsilon0, clone_probability=alpha)
    return Amplification(
        n=n,
        delta=delta,
        epsilon0=epsilon0,
        mechanism="generic",
        bound="stronger-clone",
        epsilon_central=eps_g,
        epsilon_central_generic=eps_g,
        clone_probability=alpha,
        efmrtt19=efmrtt19(epsilon0=epsilon0, n=n, delta=delta),
        fmt21=fmt21(epsilon0=epsilon0, n=n, delta=delta),
    )


def amplify_spec(spec: MechanismSpec, *, n: int, delta: float) -> Amplification:
    """The record for ``n`` shuffled reports of a deployment (CoCo or Collision).

    ``epsilon0`` is the realised local level ``ln(E/U) <= spec.epsilon``;
    ``epsilon_central`` is the certified blanket bound for ``spec.s`` and ``spec.t``.
    """
    generic = amplify(n=n, delta=delta, epsilon0=spec.epsilon_effective)
    blanket = blanket_epsilon(blanket_pair_for_spec(spec, n=generic.n), delta=generic.delta)
    return Amplification(
        n=generic.n,
        delta=generic.delta,
        epsilon0=generic.epsilon0,
        mechanism=spec.mechanism,
        bound="blanket",
        epsilon_central=min(blanket, generic.epsilon0),
        epsilon_central_generic=generic.epsilon_central_generic,
        clone_probability=generic.clone_probability,
        efmrtt19=generic.efmrtt19,
        fmt21=generic.fmt21,
    )
