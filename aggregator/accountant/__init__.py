"""The shuffle privacy accountant: pure maths, one module per concept.

* :mod:`~aggregator.accountant.clone`: the generic stronger-clone bound (any eps0-LDP
  randomiser; ``epsilon_central_generic``);
* :mod:`~aggregator.accountant.blanket`: the certified mechanism-specific privacy-blanket
  bound for CoCo and Collision (``epsilon_central``);
* :mod:`~aggregator.accountant.composition`: a device's central epsilon over many batches
  (``epsilon_total``), from each batch's privacy loss distribution
  (:mod:`~aggregator.accountant.batch_pld`) composed in extended precision
  (:mod:`~aggregator.accountant.convolution`);
* :mod:`~aggregator.accountant.history`: how a deployment's history is accounted (one
  participation per round, accounting sizes), shared by the ledger, the CLI and calibration;
* :mod:`~aggregator.accountant.calibration`: the local budget that meets a central target
  over a horizon (``coco privacy calibrate``);
* :mod:`~aggregator.accountant.closed_forms`: EFMRTT19 and FMT21, for comparison;
* :mod:`~aggregator.accountant.record`: the per-batch record the service, CLI and demo use.

No I/O, asyncio or logging here.
"""

from aggregator.accountant.batch_pld import blanket_pld
from aggregator.accountant.blanket import (
    BlanketPair,
    blanket_delta,
    blanket_delta_curve,
    blanket_epsilon,
    blanket_pair_for_spec,
)
from aggregator.accountant.calibration import CalibrationTarget, Plan, calibrate
from aggregator.accountant.clone import (
    delta_for,
    epsilon_central,
    generic_clone_probability,
    hockey_stick,
)
from aggregator.accountant.closed_forms import efmrtt19, fmt21
from aggregator.accountant.composition import (
    epsilon_total,
    epsilon_total_batches,
    epsilon_total_counts,
)
from aggregator.accountant.history import accounting_size, epsilon_total_rounds
from aggregator.accountant.record import Amplification, amplify, amplify_spec

__all__ = [
    "Amplification",
    "BlanketPair",
    "CalibrationTarget",
    "Plan",
    "accounting_size",
    "amplify",
    "amplify_spec",
    "blanket_delta",
    "blanket_delta_curve",
    "blanket_epsilon",
    "blanket_pair_for_spec",
    "blanket_pld",
    "calibrate",
    "delta_for",
    "efmrtt19",
    "epsilon_central",
    "epsilon_total",
    "epsilon_total_batches",
    "epsilon_total_counts",
    "epsilon_total_rounds",
    "fmt21",
    "generic_clone_probability",
    "hockey_stick",
]
