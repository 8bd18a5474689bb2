"""The paper's baselines for key-value / sparse ternary vector aggregation under eps-LDP.

:data:`BASELINES` maps each baseline's name (as the paper's figures label it) to a factory
``(d, s, epsilon) -> KVMechanism`` with the defaults of ``docs/baselines.md``: PrivKV
(:mod:`~sim.experiments.baselines.privkv`), PCKV-UE/GRR/AGRR
(:mod:`~sim.experiments.baselines.pckv`) and SUCCINCT
(:mod:`~sim.experiments.baselines.succinct`), each behind the protocol of
:mod:`~sim.experiments.baselines.base`.

Imports: numpy and :mod:`edge` (exact ``e^eps`` weights) only, so that each baseline stands
apart from the product it is compared with.
"""

from __future__ import annotations

from collections.abc import Callable

from sim.experiments.baselines.base import KVEstimate, KVMechanism
from sim.experiments.baselines.pckv import PCKVAGRR, PCKVGRR, PCKVUE, PCKVCounts
from sim.experiments.baselines.privkv import PrivKV, PrivKVCounts
from sim.experiments.baselines.succinct import Succinct

__all__ = [
    "BASELINES",
    "PCKVAGRR",
    "PCKVGRR",
    "PCKVUE",
    "KVEstimate",
    "KVMechanism",
    "PCKVCounts",
    "PrivKV",
    "PrivKVCounts",
    "Succinct",
]


def _privkv(d: int, s: int, epsilon: float) -> KVMechanism:
    return PrivKV(d=d, s=s, epsilon=epsilon)


def _pckv_ue(d: int, s: int, epsilon: float) -> KVMechanism:
    return PCKVUE(d=d, s=s, epsilon=epsilon)


def _pckv_grr(d: int, s: int, epsilon: float) -> KVMechanism:
    return PCKVGRR(d=d, s=s, epsilon=epsilon)


def _pckv_agrr(d: int, s: int, epsilon: float) -> KVMechanism:
    return PCKVAGRR(d=d, s=s, epsilon=epsilon)


def _succinct(d: int, s: int, epsilon: float) -> KVMechanism:
    return Succinct(d=d, s=s, epsilon=epsilon)


BASELINES: dict[str, Callable[[int, int, float], KVMechanism]] = {
    "PrivKV": _privkv,
    "PCKV-UE": _pckv_ue,
    "PCKV-GRR": _pckv_grr,
    "PCKV-AGRR": _pckv_agrr,
    "SUCCINCT": _succinct,
}
