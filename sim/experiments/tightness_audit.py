"""The empirical tightness audit of the shuffle amplification bounds: for each audited
``(n, s, eps0)`` (:data:`SETTINGS`), the certified deltas, the paper's and the exact and
simulated divergences of the worst case (:mod:`sim.experiments.tightness`) on a grid of eps,
and the epsilons of each at the setting's delta."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from aggregator.accountant import (
    BlanketPair,
    blanket_delta,
    blanket_epsilon,
    epsilon_central,
    generic_clone_probability,
    hockey_stick,
)
from edge.theory import paper_t
from sim.experiments.tightness import (
    MonteCarlo,
    WorstCase,
    epsilon_at,
    exact_divergences,
    monte_carlo,
)

__all__ = [
    "LEVEL",
    "SETTINGS",
    "AuditPoint",
    "EpsilonComparison",
    "Setting",
    "audit_setting",
    "epsilon_grid",
]

LEVEL = 0.999
"""Confidence level of the Monte Carlo bounds."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Setting:
    """One audited ``(n, s, eps0)`` with the figure's ``t* = floor(s e^eps0 + 2s - 1)``."""

    n: int
    s: int
    epsilon0: float

    @property
    def t(self) -> int:
        return paper_t("collision", s=self.s, exp_eps=math.exp(self.epsilon0))

    @property
    def worst_case(self) -> WorstCase:
        return WorstCase.for_collision(n=self.n, s=self.s, t=self.t, epsilon0=self.epsilon0)

    @property
    def delta(self) -> float:
        """Target delta for the epsilon comparison: ``min(1e-2, n^-1.1)``."""
        return min(1e-2, float(self.n ** (-1.1)))

    @property
    def label(self) -> str:
        return f"n={self.n} s={self.s} t={self.t} eps0={self.epsilon0:g}"


SETTINGS: tuple[Setting, ...] = (
    Setting(n=5, s=4, epsilon0=2.0),
    Setting(n=20, s=4, epsilon0=3.0),
    Setting(n=1_000, s=4, epsilon0=1.0),
    Setting(n=10_000, s=64, epsilon0=2.0),
)
"""Two small settings where the excess of the view over the paper's bound is large enough
for Monte Carlo to resolve, and two at deployment scale where only the exact sums can."""


@dataclass(frozen=True, kw_only=True, slots=True)
class AuditPoint:
    """Every number of one ``(setting, eps)`` point (CSV row)."""

    setting: Setting
    epsilon: float
    certified: float
    blanket: float
    mechanism: float
    pair_exact: float
    view_exact: float
    pair_mc: MonteCarlo
    view_mc: MonteCarlo

    def row(self) -> dict[str, int | float | str | bool]:
        st, wc = self.setting, self.setting.worst_case
        excess = (
            (self.view_exact - self.pair_exact) / self.pair_exact if self.pair_exact > 0 else 0.0
        )
        return {
            "setting": st.label,
            "n": st.n,
            "s": st.s,
            "t": st.t,
            "epsilon0": st.epsilon0,
            "clone_probability": wc.clone_probability,
            "epsilon": self.epsilon,
            "delta_certified_generic": self.certified,
            "delta_certified_blanket": self.blanket,
            "delta_mechanism_uncertified": self.mechanism,
            "divergence_pair_exact": self.pair_exact,
            "divergence_view_exact": self.view_exact,
            "view_excess_over_pair": excess,
            "certified_holds": self.certified >= self.view_exact,
            "blanket_holds": self.blanket >= self.view_exact,
            "mc_runs": self.view_mc.runs,
            "mc_level": self.view_mc.level,
            "mc_view_estimate": self.view_mc.estimate,
            "mc_view_stderr": self.view_mc.stderr,
            "mc_view_lower": self.view_mc.lower,
            "mc_view_upper": self.view_mc.upper,
            "mc_pair_estimate": self.pair_mc.estimate,
            "mc_pair_stderr": self.pair_mc.stderr,
            "mc_pair_lower": self.pair_mc.lower,
            "mc_pair_upper": self.pair_mc.upper,
            "mc_view_lower_above_mechanism": self.view_mc.lower > self.mechanism,
        }


@dataclass(frozen=True, kw_only=True, slots=True)
class EpsilonComparison:
    """Epsilons at ``setting.delta``: certified (generic and blanket), the paper's, and the
    construction's own (a certified lower bound)."""

    setting: Setting
    delta: float
    generic: float
    blanket: float
    mechanism: float
    view: float


def epsilon_grid(setting: Setting, *, points: int) -> list[float]:
    """``points`` values of eps up to where the certified delta falls to ~1e-9 (or 0.96 eps0)."""
    eps0 = setting.epsilon0
    g = generic_clone_probability(eps0)
    top = min(
        0.96 * eps0,
        epsilon_central(n=setting.n, delta=1e-9, epsilon0=eps0, clone_probability=g, tol=1e-6),
    )
    return [float(x) for x in np.linspace(top / points, top, points)]


def audit_setting(
    setting: Setting, *, points: int, runs: int, rng: np.random.Generator
) -> tuple[list[AuditPoint], EpsilonComparison]:
    """Exact, simulated and bound divergences on the grid, and the epsilons at the delta."""
    wc = setting.worst_case
    eps0 = wc.epsilon0  # = setting.epsilon0 up to rounding of log(exp(.))
    generic = generic_clone_probability(eps0)
    grid = epsilon_grid(setting, points=points)
    pair_b = BlanketPair(n=wc.n, exp_epsilon0=wc.exp_epsilon0, s=setting.s, t=setting.t)
    pair_mc, view_mc = monte_carlo(wc, grid, runs=runs, rng=rng, level=LEVEL)
    out = []
    for eps, pmc, vmc in zip(grid, pair_mc, view_mc, strict=True):
        pair, view = exact_divergences(wc, eps)
        out.append(
            AuditPoint(
                setting=setting,
                epsilon=eps,
                certified=hockey_stick(eps, n=wc.n, epsilon0=eps0, clone_probability=generic),
                blanket=blanket_delta(pair_b, epsilon=eps),
                mechanism=hockey_stick(
                    eps, n=wc.n, epsilon0=eps0, clone_probability=wc.clone_probability
                ),
                pair_exact=pair,
                view_exact=view,
                pair_mc=pmc,
                view_mc=vmc,
            )
        )
    delta = setting.delta
    comparison = EpsilonComparison(
        setting=setting,
        delta=delta,
        generic=epsilon_central(n=wc.n, delta=delta, epsilon0=eps0, clone_probability=generic),
        blanket=blanket_epsilon(pair_b, delta=delta, rtol=1e-8),
        mechanism=epsilon_central(
            n=wc.n, delta=delta, epsilon0=eps0, clone_probability=wc.clone_probability
        ),
        view=epsilon_at(lambda e: exact_divergences(wc, e)[1], epsilon0=eps0, delta=delta),
    )
    return out, comparison
