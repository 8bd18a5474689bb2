"""``coco privacy``: the central privacy level of n shuffled reports, offline."""

from __future__ import annotations

import json
from enum import StrEnum
from typing import Annotated, Any

import typer

from aggregator.accountant import amplify, amplify_spec
from edge import CocoError, MechanismSpec


class PrivacyMechanism(StrEnum):
    coco = "coco"
    collision = "collision"
    generic = "generic"


def privacy_rows(
    *,
    mechanism: PrivacyMechanism,
    epsilon: float,
    ns: list[int],
    delta: float,
    s: int | None = None,
    t: int | None = None,
    d: int | None = None,
) -> list[dict[str, Any]]:
    """One JSON-ready row per ``n``; ``epsilon_central`` is always the certified bound."""
    if mechanism is PrivacyMechanism.generic:
        rows = []
        for n in ns:
            row = amplify(n=n, delta=delta, epsilon0=epsilon).to_dict()
            rows.append({"mechanism": "generic", "epsilon_local": epsilon, "t": None, **row})
        return rows
    if s is None:
        raise ValueError(f"--s is required for --mechanism {mechanism.value}")
    if t is None and d is None:
        raise ValueError("give --t, or --d so that the default (MSE-optimal) t can be chosen")
    spec = MechanismSpec(
        mechanism=mechanism.value,  # type: ignore[arg-type]
        d=d if d is not None else s,
        s=s,
        epsilon=epsilon,
        t=t,  # type: ignore[arg-type]  # None selects the default t
    )
    return [
        {
            "mechanism": spec.mechanism,
            "epsilon_local": spec.epsilon,
            "epsilon_local_effective": spec.epsilon_effective,
            "s": spec.s,
            "t": spec.t,
            "d": d,
            **amplify_spec(spec, n=n, delta=delta).to_dict(),
        }
        for n in ns
    ]


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.6g}"


def privacy(
    mechanism: Annotated[PrivacyMechanism, typer.Option(help="Local randomiser.")],
    epsilon: Annotated[float, typer.Option(help="Local budget of one report.")],
    n: Annotated[list[int], typer.Option(help="Shuffled reports in a batch; repeat for a curve.")],
    delta: Annotated[float, typer.Option(help="Target delta.")],
    s: Annotated[int | None, typer.Option(help="Non-zeros per vector (coco, collision).")] = None,
    t: Annotated[
        int | None, typer.Option(help="Output domain size (default: MSE-optimal).")
    ] = None,
    d: Annotated[int | None, typer.Option(help="Dimension (chooses the default t).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Central (epsilon, delta) of n shuffled reports: the certified stronger-clone bound.

    Also shows, for comparison, the paper's mechanism-specific value (not certified: the
    lemma it rests on fails below the generic clone probability; docs/privacy-model.md) and
    the closed forms of Erlingsson et al. 2019 and Feldman et al. 2021.
    """
    try:
        rows = privacy_rows(mechanism=mechanism, epsilon=epsilon, ns=n, delta=delta, s=s, t=t, d=d)
    except (CocoError, ValueError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    if as_json:
        typer.echo(json.dumps(rows[0] if len(rows) == 1 else rows, indent=1))
        return
    head = rows[0]
    typer.echo(f"{head['mechanism']}: epsilon_local={epsilon:g}, t={head['t']}, delta={delta:g}")
    typer.echo(
        f"{'n':>12}  {'epsilon_central':>16}  {'paper (uncert.)':>16}  "
        f"{'EFMRTT19':>10}  {'FMT21':>10}"
    )
    for row in rows:
        typer.echo(
            f"{row['n']:>12}  {row['epsilon_central']:>16.6g}  "
            f"{_fmt(row['epsilon_central_mechanism']):>16}  "
            f"{_fmt(row['efmrtt19']):>10}  {_fmt(row['fmt21']):>10}"
        )
