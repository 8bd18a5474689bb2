"""The reference tables of docs/reference.md, computed by the project's own accountant.

Run from the repository root as ``.venv/bin/python docs/gen_reference.py`` (about a minute on
an idle machine); it writes ``docs/reference/amplification.tsv``,
``docs/reference/amplification-blanket.tsv`` and ``docs/reference/composition-blanket.tsv``.
``--check`` recomputes every row and compares it with the files instead (exit status 1 on a
difference). Values carry ten significant digits; the searches run to a relative precision
of 1e-9 (generic bound: an absolute 1e-11), so the printed digits are the bounds'.

The settings are those of an independent set of reference values (an implementation written
separately from the mathematics); ``tests/aggregator/test_reference_tables.py`` compares these
files with it where it is available next to the repository.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

from aggregator.accountant import (
    BlanketPair,
    blanket_epsilon,
    efmrtt19,
    epsilon_central,
    epsilon_total,
    fmt21,
    generic_clone_probability,
)
from sim.experiments.tightness import WorstCase, epsilon_at, exact_divergences

OUT = Path(__file__).resolve().parent / "reference"

Row = dict[str, str]

AMPLIFICATION_COLUMNS = (
    "mechanism", "eps0", "n", "delta", "eps_c_stronger_clone", "eps_c_fmt21_closed_form",
    "eps_c_efmrtt19", "alpha_clone",
)  # fmt: skip
BLANKET_COLUMNS = (
    "mechanism", "eps0", "s", "t", "n", "delta", "eps_c_blanket", "eps_c_generic", "eps_c_lower",
)  # fmt: skip
COMPOSITION_COLUMNS = ("eps0", "s", "t", "n", "delta", "rounds", "eps_total")

BLANKET_SETTINGS: tuple[tuple[str, float, int, int], ...] = (
    ("collision", 0.5, 1, 2), ("collision", 0.5, 4, 13), ("collision", 1.0, 1, 3),
    ("collision", 1.0, 4, 17), ("collision", 2.0, 1, 8), ("collision", 2.0, 4, 36),
    ("collision", 4.0, 1, 55), ("collision", 4.0, 4, 225),
    ("coco", 0.5, 1, 6), ("coco", 0.5, 4, 14), ("coco", 1.0, 1, 6), ("coco", 1.0, 4, 18),
    ("coco", 2.0, 1, 12), ("coco", 2.0, 4, 36), ("coco", 4.0, 1, 58), ("coco", 4.0, 4, 226),
)  # fmt: skip
"""``(mechanism, eps0, s, t)`` of the blanket table, each at n = 1e3 and 1e5, delta = 1e-6."""

COMPOSITION_SETTINGS: tuple[tuple[float, int, int, int], ...] = ((1.0, 2, 8, 150), (0.5, 1, 4, 200))
"""``(eps0, s, t, n)`` of the composition table, each over 1, 10 and 100 rounds, delta 1e-6."""


def fmt(value: float | None) -> str:
    return "NA" if value is None else f"{value:.10g}"


def amplification_rows() -> Iterator[Row]:
    """The generic stronger-clone bound and the closed forms: eps0 0.1..5 (step 0.1) at
    n = 1e4 and 1e5, and eps0 0.5, 1, 2, 3, 4, 5 at n = 1e3 and 1e6, each at delta = n^-1.1
    and 1e-6."""
    grid = [(n, e / 10) for n in (10_000, 100_000) for e in range(1, 51)]
    grid += [(n, e) for n in (1_000, 1_000_000) for e in (0.5, 1.0, 2.0, 3.0, 4.0, 5.0)]
    for n, eps0 in grid:
        for delta in (n**-1.1, 1e-6):
            alpha = generic_clone_probability(eps0)
            eps = epsilon_central(
                n=n, delta=delta, epsilon0=eps0, clone_probability=alpha, tol=1e-11
            )
            yield {
                "mechanism": "generic",
                "eps0": f"{eps0:g}",
                "n": str(n),
                "delta": fmt(delta),
                "eps_c_stronger_clone": fmt(eps),
                "eps_c_fmt21_closed_form": fmt(fmt21(epsilon0=eps0, n=n, delta=delta)),
                "eps_c_efmrtt19": fmt(efmrtt19(epsilon0=eps0, n=n, delta=delta)),
                "alpha_clone": fmt(alpha),
            }


def lower_bound(wc: WorstCase, delta: float) -> float:
    """The epsilon of the worst-case datasets' exact divergence at ``delta``."""

    def divergence(epsilon: float) -> float:
        return exact_divergences(wc, epsilon)[1]

    return epsilon_at(divergence, epsilon0=wc.epsilon0, delta=delta)


def blanket_rows() -> Iterator[Row]:
    """The certified blanket bound beside the generic one, and a certified lower bound (the
    exact divergence of the paper's worst-case datasets) where that construction applies
    and is quick to search (Collision, ``t >= 3s``, n = 1e3; NA elsewhere)."""
    delta = 1e-6
    for mechanism, eps0, s, t in BLANKET_SETTINGS:
        for n in (1_000, 100_000):
            p = math.exp(eps0)
            blanket = blanket_epsilon(BlanketPair(n=n, exp_epsilon0=p, s=s, t=t), delta=delta,
                                      rtol=1e-9)  # fmt: skip
            generic = epsilon_central(
                n=n, delta=delta, epsilon0=eps0, clone_probability=generic_clone_probability(eps0)
            )
            lower = None
            if mechanism == "collision" and t >= 3 * s and n <= 1_000:  # 10 s per eps at 1e5
                lower = lower_bound(WorstCase.for_collision(n=n, s=s, t=t, epsilon0=eps0), delta)
            yield {
                "mechanism": mechanism,
                "eps0": f"{eps0:g}",
                "s": str(s),
                "t": str(t),
                "n": str(n),
                "delta": fmt(delta),
                "eps_c_blanket": fmt(blanket),
                "eps_c_generic": fmt(generic),
                "eps_c_lower": fmt(lower),
            }


def composition_rows() -> Iterator[Row]:
    """``epsilon_total`` of a device in 1, 10 and 100 batches of n."""
    for eps0, s, t, n in COMPOSITION_SETTINGS:
        pair = BlanketPair(n=n, exp_epsilon0=math.exp(eps0), s=s, t=t)
        for rounds in (1, 10, 100):
            yield {
                "eps0": f"{eps0:g}",
                "s": str(s),
                "t": str(t),
                "n": str(n),
                "delta": fmt(1e-6),
                "rounds": str(rounds),
                "eps_total": fmt(epsilon_total(pair, rounds=rounds, delta=1e-6)),
            }


TABLES: dict[str, tuple[tuple[str, ...], Callable[[], Iterator[Row]]]] = {
    "amplification.tsv": (AMPLIFICATION_COLUMNS, amplification_rows),
    "amplification-blanket.tsv": (BLANKET_COLUMNS, blanket_rows),
    "composition-blanket.tsv": (COMPOSITION_COLUMNS, composition_rows),
}


def render(columns: tuple[str, ...], rows: Iterator[Row]) -> str:
    lines = ["\t".join(columns)]
    lines += ["\t".join(row[c] for c in columns) for row in rows]
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare instead of writing")
    args = parser.parse_args(argv)
    status = 0
    for name, (columns, rows) in TABLES.items():
        text = render(columns, rows())
        path = OUT / name
        if args.check:
            if not path.is_file() or path.read_text() != text:
                print(f"{path} differs from what the accountant computes", file=sys.stderr)
                status = 1
        else:
            OUT.mkdir(exist_ok=True)
            path.write_text(text)
            print(f"wrote {path}")
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
