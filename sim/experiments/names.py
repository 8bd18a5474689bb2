"""The names of the paper's mechanisms, apart from their code (numpy), so that the command
line can list them in its help without importing the experiments."""

from __future__ import annotations

__all__ = ["PAPER_ORDER"]

PAPER_ORDER: tuple[str, ...] = (
    "Collision",
    "CoCo",
    "PrivKV",
    "PCKV-UE",
    "PCKV-GRR",
    "PCKV-AGRR",
    "SUCCINCT",
)
"""Every mechanism of the paper's experiments, in the order of its legend."""
