"""Participation sampling: a device reports in a round with probability ``q``, decided on
the device (protocol 10.5 and 12.2).

The announcement may carry ``participation`` (``q``, a number in ``(0, 1]``; absent means 1).
At the start of each round a device with ``q < 1`` draws one 32-bit word ``u`` from its CSPRNG
(``getrandbits(32)``, protocol 4.1) and reports in the round only if ``u < threshold(q)``,
where ``threshold(q) = floor(q * 2^32)`` for ``q`` the announced decimal number, exactly. The
probability of reporting is therefore ``threshold(q) / 2^32``: ``q`` rounded down to
``2^-32``, never above it. With ``q = 1`` nothing is drawn and every round is reported in, as
before sampling existed. A device that sits a round out charges no budget and sends nothing.

The word must come from the same CSPRNG as the report's randomness (``secrets`` in Python, the
``coco_rng`` callback in libcoco): a decision the network could predict would tell it which
rounds a device is absent from. Like :mod:`edge.codec` this module imports nothing beyond
the standard library.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from fractions import Fraction

WORD = 1 << 32
"""``2^32``: the threshold of ``q = 1`` (every word is below it)."""


def check_participation(q: object) -> float:
    """``q`` if it is a number in ``(0, 1]`` (not a bool, not NaN); :class:`ValueError`
    otherwise."""
    if isinstance(q, bool) or not isinstance(q, int | float):
        raise ValueError(f"participation must be a number in (0, 1], got {q!r}")
    if not (0 < q <= 1 and math.isfinite(q)):  # also false for NaN; no float() of a huge int
        raise ValueError(f"participation must be in (0, 1], got {q!r}")
    return float(q)


def threshold(q: float) -> int:
    """``floor(q * 2^32)`` of the decimal number ``q`` is written as (its shortest ``repr``,
    the text JSON carries), exactly: libcoco computes the same from the announcement's text."""
    return math.floor(Fraction(repr(check_participation(q))) * WORD)


def participates(q: float, getrandbits: Callable[[int], int]) -> bool:
    """Whether the device reports in this round: ``getrandbits(32) < threshold(q)``, with no
    draw at all when ``q == 1``."""
    limit = threshold(q)
    if limit >= WORD:
        return True
    return getrandbits(32) < limit
