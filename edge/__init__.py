"""What runs on a device: the mechanism spec, hashing, the CoCo and Collision randomisers,
and the encoders that bring sensor readings into their domain.

:mod:`edge.device` is the dependency-free core that firmware reimplements; everything else
here is its CPython/numpy companion for simulation and for the other services.
"""

from edge._mechanism import LocalMechanism
from edge.coco import CoCo
from edge.collision import Collision
from edge.errors import CocoError, InputError, ReportError, SpecError
from edge.spec import MechanismSpec

__all__ = [
    "CoCo",
    "CocoError",
    "Collision",
    "InputError",
    "LocalMechanism",
    "MechanismSpec",
    "ReportError",
    "SpecError",
]
