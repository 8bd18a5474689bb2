"""The mechanism specification that devices, the shuffler and the aggregator agree on."""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field
from decimal import ROUND_FLOOR, Decimal, localcontext
from typing import Any, get_args

from edge import device
from edge.errors import SpecError
from edge.theory import MAX_T, Mechanism, ReportMoments, moments, optimal_t, valid_t_range

MECHANISMS: tuple[str, ...] = get_args(Mechanism)
MAX_D = 1 << 30
"""Collision's element keys ``2 j + 1`` must fit the 32-bit hash input."""
MAX_WEIGHT = 1 << 53
"""Integer normalisers stay exact in IEEE doubles (and in JavaScript firmware)."""


def exp_eps_weight(epsilon: float) -> int:
    """``E = floor(e^epsilon * U)``: the integer weight of ``e^epsilon`` (``U = 2^24``).

    Computed with 50-digit decimal arithmetic (correctly rounded ``exp``) and rounded *down*,
    so ``E / U <= e^epsilon`` holds exactly and the realised local privacy level
    ``ln(E / U)`` never exceeds the nominal one.
    """
    with localcontext() as ctx:
        ctx.prec = 50
        scaled = Decimal(epsilon).exp() * device.WEIGHT_UNIT
        return int(scaled.to_integral_value(rounding=ROUND_FLOOR))


def log_upper(x: float) -> float:
    """An upper bound on ``ln x`` (``x >= 1``), for a privacy level derived from a ratio:
    ``math.log`` is within one ulp of the exact value (glibc and every libm CPython is
    built on document better), so two steps up are above it; ``ln 1 = 0`` exactly."""
    if x == 1.0:
        return 0.0
    value = math.log(x)
    return math.nextafter(math.nextafter(value, math.inf), math.inf)


@dataclass(frozen=True, kw_only=True)
class MechanismSpec:
    """Parameters of one deployment's local randomiser.

    ``mechanism`` is ``"coco"`` or ``"collision"``; inputs are ``d``-dimensional ternary
    vectors with exactly ``s`` non-zero entries; ``epsilon`` is the local budget of one
    report; ``t`` is the output domain size (``None`` picks the ``t`` that minimises the
    closed-form mean MSE, see :func:`edge.theory.optimal_t`); ``hash_version`` names the hash
    family of ``docs/protocol.md``.

    The spec validates itself and has a stable :attr:`fingerprint` that every report carries.
    """

    mechanism: Mechanism
    d: int
    s: int
    epsilon: float
    t: int = None  # type: ignore[assignment]  # resolved in __post_init__
    hash_version: int = device.HASH_VERSION
    _weight: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self._check_parameters()
        weight = exp_eps_weight(float(self.epsilon))
        if weight <= device.WEIGHT_UNIT:
            raise SpecError(
                f"epsilon={self.epsilon} is too small to represent (e^eps * 2^24 < 2^24 + 1)"
            )
        object.__setattr__(self, "epsilon", float(self.epsilon))
        object.__setattr__(self, "_weight", weight)
        if self.t is None:
            t = optimal_t(
                self.mechanism, d=self.d, s=self.s, exp_eps_weight=weight, unit=device.WEIGHT_UNIT
            )
            object.__setattr__(self, "t", t)
        self._check_t()

    def _check_parameters(self) -> None:
        if self.mechanism not in MECHANISMS:
            raise SpecError(f"mechanism must be one of {MECHANISMS}, got {self.mechanism!r}")
        for name in ("d", "s", "hash_version"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise SpecError(f"{name} must be an integer, got {value!r}")
        if not 1 <= self.d <= MAX_D:
            raise SpecError(f"d must be in [1, {MAX_D}], got {self.d}")
        if not 1 <= self.s <= self.d:
            raise SpecError(f"s must be in [1, d={self.d}], got {self.s}")
        if isinstance(self.epsilon, bool) or not isinstance(self.epsilon, int | float):
            raise SpecError(f"epsilon must be a number, got {self.epsilon!r}")
        if not (0 < self.epsilon <= 20 and math.isfinite(self.epsilon)):
            raise SpecError(f"epsilon must be in (0, 20], got {self.epsilon}")
        if self.hash_version != device.HASH_VERSION:
            raise SpecError(
                f"hash_version {self.hash_version} is not supported "
                f"(this build implements {device.HASH_VERSION})"
            )

    def _check_t(self) -> None:
        t = self.t
        if isinstance(t, bool) or not isinstance(t, int):
            raise SpecError(f"t must be an integer, got {t!r}")
        t_min, step = valid_t_range(self.mechanism, self.s)
        if t < t_min or (t - t_min) % step:
            rule = "an even t >= 2s + 2" if step == 2 else "t > s"
            raise SpecError(f"{self.mechanism} needs {rule} (s={self.s}), got t={t}")
        if t > MAX_T:
            raise SpecError(f"t must be at most {MAX_T}, got {t}")
        if self.omega_weight >= MAX_WEIGHT:
            raise SpecError(
                f"integer weights overflow 2^53 (s={self.s}, t={t}, epsilon={self.epsilon}); "
                "reduce s, t or epsilon"
            )

    @property
    def exp_eps_weight(self) -> int:
        """``E``, the integer weight of ``e^epsilon`` in units of ``U = 2^24``."""
        return self._weight

    @property
    def unit_weight(self) -> int:
        """``U = 2^24``, the integer weight of 1."""
        return device.WEIGHT_UNIT

    @property
    def exp_epsilon(self) -> float:
        """The realised ``e^eps = E / U <= e^epsilon``: the exact worst-case output ratio."""
        return self._weight / device.WEIGHT_UNIT

    @property
    def epsilon_effective(self) -> float:
        """``ln(E / U)``: the local privacy level the integer weights actually give,
        rounded up (:func:`log_upper`; never above ``epsilon``, which bounds it exactly)."""
        return min(log_upper(self.exp_epsilon), self.epsilon)

    @property
    def omega_weight(self) -> int:
        """The integer normaliser ``Omega`` (the same for every input and seed)."""
        if self.mechanism == "coco":
            return device.coco_omega(self.s, self.t, self._weight)
        return device.collision_omega(self.s, self.t, self._weight)

    @property
    def clone_probability(self) -> float:
        """Clone probability for the stronger-clone shuffle bound (ERRATA item 4).

        ``s U / Omega = s / (s e^eps + t - s)`` for both mechanisms (Lemma "mixture"), which
        is a valid clone probability only while it is at most ``1 / (e^eps + 1)``, i.e. for
        ``t >= 2 s``; otherwise the generic ``1 / (e^eps + 1)`` of any eps-LDP randomiser is
        used. Both use the realised ``e^eps = E / U``.
        """
        specific = self.s * device.WEIGHT_UNIT / self.omega_weight
        generic = device.WEIGHT_UNIT / (self._weight + device.WEIGHT_UNIT)
        return min(specific, generic)

    @property
    def moments(self) -> ReportMoments:
        """Closed-form per-report moments behind the estimators (:mod:`edge.theory`)."""
        return moments(
            self.mechanism,
            s=self.s,
            t=self.t,
            exp_eps_weight=self._weight,
            unit=device.WEIGHT_UNIT,
        )

    def canonical(self) -> str:
        """The canonical text the fingerprint is computed from (see docs/protocol.md)."""
        return (
            f"coco-fleet/spec/v1;mechanism={self.mechanism};d={self.d};s={self.s};t={self.t};"
            f"E={self._weight};U={device.WEIGHT_UNIT};hash={self.hash_version}"
        )

    @property
    def fingerprint_int(self) -> int:
        """First 4 bytes (big-endian) of SHA-256 of :meth:`canonical`."""
        return int.from_bytes(hashlib.sha256(self.canonical().encode()).digest()[:4], "big")

    @property
    def fingerprint(self) -> str:
        """:attr:`fingerprint_int` as 8 lowercase hex digits."""
        return f"{self.fingerprint_int:08x}"

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready description, including the derived integer weights."""
        return {
            "mechanism": self.mechanism,
            "d": self.d,
            "s": self.s,
            "epsilon": self.epsilon,
            "t": self.t,
            "hash_version": self.hash_version,
            "exp_eps_weight": self._weight,
            "unit_weight": device.WEIGHT_UNIT,
            "fingerprint": self.fingerprint,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> MechanismSpec:
        """Inverse of :meth:`to_dict`; checks the derived fields and the fingerprint."""
        try:
            spec = cls(
                mechanism=data["mechanism"],
                d=data["d"],
                s=data["s"],
                epsilon=data["epsilon"],
                t=data["t"],
                hash_version=data.get("hash_version", device.HASH_VERSION),
            )
        except KeyError as exc:
            raise SpecError(f"spec is missing the field {exc.args[0]!r}") from exc
        for key in ("exp_eps_weight", "fingerprint"):
            if key in data and data[key] != spec.to_dict()[key]:
                raise SpecError(f"spec field {key}={data[key]!r} does not match the parameters")
        return spec
