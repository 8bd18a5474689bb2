"""What runs on a device: the mechanism spec, hashing, the CoCo and Collision randomisers,
and the encoders that bring sensor readings into their domain.

:mod:`edge.device` is the dependency-free core that firmware reimplements; everything else
here is its CPython/numpy companion for simulation and for the other services.
"""

from typing import TYPE_CHECKING, Any

from edge.errors import CocoError, InputError, ReportError, SpecError
from edge.spec import MechanismSpec

if TYPE_CHECKING:
    from edge._mechanism import LocalMechanism
    from edge.coco import CoCo
    from edge.collision import Collision

_NUMPY_EXPORTS = {
    "LocalMechanism": "edge._mechanism",
    "CoCo": "edge.coco",
    "Collision": "edge.collision",
}


def __getattr__(name: str) -> Any:
    """The randomisers (numpy) are imported on first use: a command's ``--help`` and the
    services' start-up need only the spec and the errors."""
    module = _NUMPY_EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'edge' has no attribute {name!r}")
    import importlib  # noqa: PLC0415

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


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
