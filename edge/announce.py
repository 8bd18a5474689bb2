"""The spec announcement: the retained JSON message that tells devices, the shuffler and the
aggregator which mechanism is in force.

The payload is UTF-8 JSON with sorted keys and no whitespace, so that the same announcement
is always the same bytes::

    {"delta":1e-06,"min_batch":1000,"protocol":"coco/v1","round_seconds":60,"spec":{...}}

``spec`` is exactly :meth:`edge.spec.MechanismSpec.to_dict` of the spec it describes: every
field present, the derived ``exp_eps_weight``, ``unit_weight`` and ``fingerprint`` equal to
what the parameters give. ``min_batch`` (an int in ``[1, 2^32)``) is the smallest batch the
shuffler releases and ``delta`` (in ``(0, 1)``) the target of the shuffle accountant.
``round_seconds`` (an int in ``[1, 86400]``) is the length of a round: a device reports in
round ``floor(unix_time / round_seconds)`` (:mod:`edge.rounds`). The optional
``batch_public_key`` (64 lowercase hex digits) is the shuffler's Ed25519 key that signs
every batch (:mod:`edge.batch_auth`); an aggregator may take it from here or pin it in its
own configuration. The optional ``shards`` (a list of one or two layouts,
:mod:`edge.shards`) makes the deployment sharded: its shufflers' keys are then per shard, in
the layouts, and ``batch_public_key`` must be absent. The optional ``participation`` (``q``,
a number in ``(0, 1]``; absent means 1) is the probability with which a device reports in a
round (:mod:`edge.participation`); a ``q`` outside ``(0, 1]`` is refused. The optional pair
``period_seconds`` and ``budget_per_period`` (both or neither) is the deployment's device
period policy (:class:`AnnouncedPeriod`): a device that follows it reports at most
``floor(budget_per_period / epsilon)`` times per aligned period ``[k P, (k + 1) P)``
(:mod:`edge.budget`). Any other key, or any mismatch, raises :class:`~edge.errors.SpecError`.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

from edge.budget import MAX_PERIOD_SECONDS, PeriodPolicy
from edge.codec import U32_MAX
from edge.defaults import DEFAULT_ROUND_SECONDS, check_delta
from edge.errors import SpecError
from edge.participation import check_participation
from edge.rounds import check_round_seconds
from edge.shards import ShardPlan
from edge.spec import MechanismSpec

PROTOCOL = "coco/v1"
_KEYS = frozenset({"protocol", "spec", "min_batch", "delta", "round_seconds"})
_OPTIONAL_KEYS = frozenset(
    {"batch_public_key", "shards", "participation", "period_seconds", "budget_per_period"}
)
PUBLIC_KEY_HEX = 64


def _checked_spec(spec_dict: object) -> dict[str, Any]:
    if not isinstance(spec_dict, dict):
        raise SpecError(f"spec must be a JSON object, got {spec_dict!r}")
    try:
        spec = MechanismSpec.from_dict(spec_dict)
    except SpecError:
        raise
    except (TypeError, ValueError, OverflowError) as exc:  # e.g. epsilon = 10**400
        raise SpecError(f"spec is not valid: {exc}") from exc
    expected = spec.to_dict()
    if spec_dict != expected:
        diff = sorted(
            key
            for key in set(spec_dict) | set(expected)
            if spec_dict.get(key, ...) != expected.get(key, ...)
        )
        raise SpecError(f"spec fields {diff} do not match its parameters (expected {expected})")
    return expected


def _check_min_batch(min_batch: object) -> int:
    if isinstance(min_batch, bool) or not isinstance(min_batch, int):
        raise SpecError(f"min_batch must be an integer, got {min_batch!r}")
    if not 1 <= min_batch <= U32_MAX:
        raise SpecError(f"min_batch must be in [1, {U32_MAX}], got {min_batch}")
    return min_batch


def _check_delta(delta: object) -> float:
    if isinstance(delta, bool) or not isinstance(delta, int | float):
        raise SpecError(f"delta must be a number, got {delta!r}")
    try:
        check_delta(delta)  # no float() of a huge int
    except ValueError as exc:
        raise SpecError(str(exc)) from None
    return float(delta)


def _check_round_seconds(round_seconds: object) -> int:
    try:
        return check_round_seconds(round_seconds)  # type: ignore[arg-type]
    except ValueError as exc:
        raise SpecError(str(exc)) from None


def _check_participation(q: object) -> float:
    try:
        return check_participation(q)
    except ValueError as exc:
        raise SpecError(str(exc)) from None


UNITS = 1 << 32
"""Ledger units per unit of epsilon (libcoco's ledger counts ``2^-32``)."""
MAX_BUDGET_PER_PERIOD = 1 << 31
"""``budget_per_period`` must be below this (libcoco reads decimals below ``2^31``)."""


@dataclass(frozen=True)
class AnnouncedPeriod:
    """The deployment's device period policy: at most ``budget`` local epsilon per aligned
    period of ``seconds`` seconds (protocol 10.5 and 12.1)."""

    seconds: int
    budget: float

    def policy(self) -> PeriodPolicy:
        """The ledger's :class:`~edge.budget.PeriodPolicy` of it."""
        return PeriodPolicy.of(self.budget, self.seconds)

    def reports_per_period(self, epsilon: float) -> int:
        """``floor(budget / epsilon)``, exactly: the most reports a device that follows the
        policy makes in one period."""
        return math.floor(Fraction(self.budget) / Fraction(epsilon))


def _units(value: float, *, up: bool) -> int:
    """The decimal ``value`` is written as (its ``repr``, the text JSON carries) in units of
    ``2^-32``, rounded up or down, exactly (as libcoco reads it)."""
    scaled = Fraction(repr(float(value))) * UNITS
    return math.ceil(scaled) if up else math.floor(scaled)


def _check_period(
    seconds: object, budget: object, *, round_seconds: int, epsilon: float
) -> AnnouncedPeriod:
    """The announced period policy, if ``seconds`` is a whole number of rounds in
    ``[1, 366 d]`` and one report fits ``budget`` in ledger units (the budget rounded down
    to ``2^-32`` at least the epsilon rounded up: libcoco's ledger fits one report then)."""
    if isinstance(seconds, bool) or not isinstance(seconds, int):
        raise SpecError(f"period_seconds must be an integer, got {seconds!r}")
    if not 1 <= seconds <= MAX_PERIOD_SECONDS or seconds % round_seconds:
        raise SpecError(
            f"period_seconds must be a multiple of round_seconds ({round_seconds}) in "
            f"[1, {MAX_PERIOD_SECONDS}], got {seconds}"
        )
    if isinstance(budget, bool) or not isinstance(budget, int | float):
        raise SpecError(f"budget_per_period must be a number, got {budget!r}")
    if not (0 < budget < MAX_BUDGET_PER_PERIOD and math.isfinite(budget)):
        raise SpecError(f"budget_per_period must be in (0, 2^31), got {budget!r}")
    if _units(budget, up=False) < _units(epsilon, up=True):
        raise SpecError(
            f"budget_per_period {budget!r} is below one report's epsilon {epsilon!r}: no "
            "report would ever fit a period"
        )
    return AnnouncedPeriod(seconds, float(budget))


def period_of(announcement: dict[str, Any] | None) -> AnnouncedPeriod | None:
    """The device period policy of a decoded announcement (``None`` when it announces
    none, or when there is no announcement)."""
    if announcement is None or "period_seconds" not in announcement:
        return None
    return AnnouncedPeriod(announcement["period_seconds"], announcement["budget_per_period"])


def participation_of(announcement: dict[str, Any] | None) -> float:
    """The participation probability ``q`` of a decoded announcement (1 when it has none, or
    when there is no announcement)."""
    if announcement is None:
        return 1.0
    return float(announcement.get("participation", 1.0))


def _check_public_key(key: object) -> str:
    if (
        not isinstance(key, str)
        or len(key) != PUBLIC_KEY_HEX
        or any(c not in "0123456789abcdef" for c in key)
    ):
        raise SpecError(
            f"batch_public_key must be {PUBLIC_KEY_HEX} lowercase hex digits, got {key!r}"
        )
    return key


def encode_announcement(
    spec_dict: dict[str, Any],
    *,
    min_batch: int,
    delta: float,
    round_seconds: int = DEFAULT_ROUND_SECONDS,
    batch_public_key: str | None = None,
    shards: ShardPlan | None = None,
    participation: float = 1.0,
    period: AnnouncedPeriod | None = None,
) -> bytes:
    """The announcement payload for ``spec_dict`` (a :meth:`MechanismSpec.to_dict`).

    ``participation`` (``q``) is written only when below 1 and ``period_seconds`` and
    ``budget_per_period`` only with a ``period``, so that an announcement without them
    stays the bytes it always was."""
    message: dict[str, Any] = {
        "protocol": PROTOCOL,
        "spec": _checked_spec(spec_dict),
        "min_batch": _check_min_batch(min_batch),
        "delta": _check_delta(delta),
        "round_seconds": _check_round_seconds(round_seconds),
    }
    if batch_public_key is not None:
        message["batch_public_key"] = _check_public_key(batch_public_key)
    if _check_participation(participation) < 1:
        message["participation"] = float(participation)
    if period is not None:
        checked = _check_period(
            period.seconds,
            period.budget,
            round_seconds=message["round_seconds"],
            epsilon=message["spec"]["epsilon"],
        )
        message["period_seconds"] = checked.seconds
        message["budget_per_period"] = checked.budget
    if shards is not None:
        if batch_public_key is not None:
            raise SpecError(
                "a sharded deployment announces one key per shard (in shards), not batch_public_key"
            )
        message["shards"] = ShardPlan(shards.layouts).to_json()
    return json.dumps(message, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()


def decode_announcement(payload: bytes) -> dict[str, Any]:
    """``{"protocol", "spec", "min_batch", "delta", "round_seconds"}`` (and
    ``"batch_public_key"`` or ``"shards"``, ``"participation"``, and ``"period_seconds"``
    with ``"budget_per_period"``, when announced) of a valid announcement.

    ``spec`` is a checked :meth:`MechanismSpec.to_dict` (``MechanismSpec.from_dict`` turns it
    back into a spec); anything else raises :class:`~edge.errors.SpecError`.
    """
    try:
        message = json.loads(payload.decode("utf-8"))
    except (ValueError, RecursionError) as exc:  # bad UTF-8 or JSON, 5000-digit ints, nesting
        raise SpecError(f"announcement is not UTF-8 JSON: {exc}") from exc
    if not isinstance(message, dict):
        raise SpecError(f"announcement must be a JSON object, got {message!r}")
    if not _KEYS <= set(message) <= _KEYS | _OPTIONAL_KEYS:
        raise SpecError(
            f"announcement must have the keys {sorted(_KEYS)} (optionally "
            f"{sorted(_OPTIONAL_KEYS)}), got {sorted(message)}"
        )
    if message["protocol"] != PROTOCOL:
        raise SpecError(f"protocol {message['protocol']!r} is not {PROTOCOL!r}")
    decoded: dict[str, Any] = {
        "protocol": PROTOCOL,
        "spec": _checked_spec(message["spec"]),
        "min_batch": _check_min_batch(message["min_batch"]),
        "delta": _check_delta(message["delta"]),
        "round_seconds": _check_round_seconds(message["round_seconds"]),
    }
    if "batch_public_key" in message:
        decoded["batch_public_key"] = _check_public_key(message["batch_public_key"])
    if "participation" in message:
        decoded["participation"] = _check_participation(message["participation"])
    if ("period_seconds" in message) != ("budget_per_period" in message):
        raise SpecError("period_seconds and budget_per_period are announced together or not at all")
    if "period_seconds" in message:
        checked = _check_period(
            message["period_seconds"],
            message["budget_per_period"],
            round_seconds=decoded["round_seconds"],
            epsilon=decoded["spec"]["epsilon"],
        )
        decoded["period_seconds"] = checked.seconds
        decoded["budget_per_period"] = checked.budget
    if "shards" in message:
        if "batch_public_key" in message:
            raise SpecError(
                "a sharded announcement has one key per shard (in shards), not batch_public_key"
            )
        decoded["shards"] = ShardPlan.from_json(message["shards"]).to_json()
    return decoded


def shard_plan(announcement: dict[str, Any]) -> ShardPlan | None:
    """The layouts of a decoded announcement (:func:`decode_announcement`), or ``None`` for
    an unsharded deployment."""
    layouts = announcement.get("shards")
    return None if layouts is None else ShardPlan.from_json(layouts)


def read_public_key(value: str | None) -> str | None:
    """A batch public key given as 64 hex digits or as the path of a file holding them
    (the shuffler's ``signing.pub``); :class:`SpecError` naming the file otherwise."""
    if value is None:
        return None
    text = value.strip()
    if len(text) != PUBLIC_KEY_HEX or any(c not in "0123456789abcdef" for c in text):
        try:
            text = Path(value).read_text(encoding="ascii").strip()
        except (OSError, UnicodeDecodeError) as exc:
            raise SpecError(
                f"batch public key {value!r} is neither 64 hex digits nor a readable file: {exc}"
            ) from None
    return _check_public_key(text)


def load_spec_file(path: Path) -> MechanismSpec:
    """The spec in a JSON file: a :meth:`MechanismSpec.to_dict` or a whole announcement
    (checked like a received one); :class:`SpecError` otherwise."""
    return read_spec_file(path)[0]


def read_spec_file(path: Path) -> tuple[MechanismSpec, int | None]:
    """As :func:`load_spec_file`, with the file's ``round_seconds`` when it holds a whole
    announcement (``None`` for a bare spec)."""
    spec, announcement = read_spec_or_announcement(path)
    return spec, None if announcement is None else announcement["round_seconds"]


def read_spec_or_announcement(path: Path) -> tuple[MechanismSpec, dict[str, Any] | None]:
    """The spec in a JSON file, and the whole decoded announcement when the file holds one
    (``None`` for a bare spec); :class:`SpecError` otherwise."""
    try:
        data: Any = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise SpecError(f"cannot read the spec file {path}: {exc}") from exc
    announcement: dict[str, Any] | None = None
    if isinstance(data, dict) and "protocol" in data:
        # ``coco announce --dry-run`` prints the announcement with its ``topic``: a file
        # saved from it is accepted, the topic ignored (the command's --deployment rules).
        data.pop("topic", None)
        announcement = decode_announcement(json.dumps(data).encode())
        data = announcement["spec"]
    if not isinstance(data, dict):
        raise SpecError(f"the spec file {path} must hold a JSON object")
    return MechanismSpec.from_dict(data), announcement
