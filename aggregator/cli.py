"""``coco privacy``: the central privacy level of n shuffled reports, offline (the
streaming service's commands are in :mod:`aggregator.service_cli`)."""

from __future__ import annotations

import json
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer

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
    rounds: int | None = None,
) -> list[dict[str, Any]]:
    """One JSON-ready row per ``n`` (the JSON contract of ``coco privacy --json``).

    Every row carries ``epsilon_central`` (certified; the mechanism-specific blanket bound for
    CoCo and Collision, the stronger-clone bound for ``generic``), ``epsilon_central_generic``,
    ``delta`` and ``n``; with ``rounds`` also ``rounds`` and ``epsilon_total``, the composed
    central epsilon of a device present in ``rounds`` batches of ``n`` (CoCo and Collision).
    """
    if rounds is not None and rounds < 1:
        raise ValueError(f"--rounds must be >= 1, got {rounds}")
    # scipy and dp-accounting behind the accountant: not imported for --help
    from aggregator.accountant import (  # noqa: PLC0415
        amplify,
        amplify_spec,
        blanket_pair_for_spec,
        epsilon_total,
    )

    if mechanism is PrivacyMechanism.generic:
        if rounds is not None:
            raise ValueError("--rounds needs --mechanism coco or collision (the blanket pair)")
        return [
            {
                "mechanism": "generic",
                "epsilon_local": epsilon,
                "t": None,
                **amplify(n=n, delta=delta, epsilon0=epsilon).to_dict(),
            }
            for n in ns
        ]
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
    rows = []
    for n in ns:
        row: dict[str, Any] = {
            "mechanism": spec.mechanism,
            "epsilon_local": spec.epsilon,
            "epsilon_local_effective": spec.epsilon_effective,
            "s": spec.s,
            "t": spec.t,
            "d": d,
            **amplify_spec(spec, n=n, delta=delta).to_dict(),
        }
        if rounds is not None:
            pair = blanket_pair_for_spec(spec, n=n)
            row["rounds"] = rounds
            row["epsilon_total"] = epsilon_total(pair, rounds=rounds, delta=delta)
        rows.append(row)
    return rows


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.6g}"


privacy_app = typer.Typer(
    help="Central privacy of shuffled batches (certified bounds); `calibrate` plans epsilon0.",
    invoke_without_command=True,
)


@privacy_app.callback(invoke_without_command=True)
def privacy(
    ctx: typer.Context,
    mechanism: Annotated[
        PrivacyMechanism | None, typer.Option(help="Local randomiser (required).")
    ] = None,
    epsilon: Annotated[
        float | None, typer.Option(help="Local budget of one report (required).")
    ] = None,
    n: Annotated[
        list[int] | None,
        typer.Option(help="Shuffled reports in a batch; repeat for a curve (required)."),
    ] = None,
    delta: Annotated[float | None, typer.Option(help="Target delta (required).")] = None,
    s: Annotated[int | None, typer.Option(help="Non-zeros per vector (coco, collision).")] = None,
    t: Annotated[
        int | None, typer.Option(help="Output domain size (default: MSE-optimal).")
    ] = None,
    d: Annotated[int | None, typer.Option(help="Dimension (chooses the default t).")] = None,
    rounds: Annotated[
        int | None,
        typer.Option(
            help="Batches a device reports in: also print epsilon_total, the composed central "
            "epsilon over that many batches of n (coco, collision)."
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Central (epsilon, delta) of n shuffled reports: certified bounds.

    epsilon_central is the mechanism-specific privacy-blanket bound for coco and collision
    (docs/privacy-model.md) and the stronger-clone bound for generic; the generic value and
    the closed forms of Erlingsson et al. 2019 and Feldman et al. 2021 are shown beside it.
    """
    if ctx.invoked_subcommand is not None:
        return
    if mechanism is None or epsilon is None or not n or delta is None:
        given = {"--mechanism": mechanism, "--epsilon": epsilon, "--n": n, "--delta": delta}
        missing = ", ".join(name for name, value in given.items() if value is None or value == [])
        typer.echo(f"error: missing option(s) {missing}", err=True)
        raise typer.Exit(2)
    try:
        rows = privacy_rows(
            mechanism=mechanism, epsilon=epsilon, ns=n, delta=delta, s=s, t=t, d=d, rounds=rounds
        )
    except (CocoError, ValueError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    if as_json:
        typer.echo(json.dumps(rows[0] if len(rows) == 1 else rows, indent=1))
        return
    head = rows[0]
    typer.echo(f"{head['mechanism']}: epsilon_local={epsilon:g}, t={head['t']}, delta={delta:g}")
    total = f"  {'epsilon_total (' + str(rounds) + ' rounds)':>26}" if rounds is not None else ""
    typer.echo(
        f"{'n':>12}  {'epsilon_central':>16}  {'generic':>12}  {'EFMRTT19':>10}  {'FMT21':>10}"
        + total
    )
    for row in rows:
        typer.echo(
            f"{row['n']:>12}  {row['epsilon_central']:>16.6g}  "
            f"{row['epsilon_central_generic']:>12.6g}  "
            f"{_fmt(row['efmrtt19']):>10}  {_fmt(row['fmt21']):>10}"
            + (f"  {row['epsilon_total']:>26.6g}" if rounds is not None else "")
        )


class CalibrateMechanism(StrEnum):
    coco = "coco"
    collision = "collision"


@privacy_app.command("calibrate")
def privacy_calibrate(
    mechanism: Annotated[CalibrateMechanism, typer.Option(help="Local randomiser.")],
    d: Annotated[int, typer.Option(help="Dimension.")],
    s: Annotated[int, typer.Option(help="Non-zeros per vector.")],
    n: Annotated[int, typer.Option(help="Reports per shuffled batch (the fleet).")],
    rounds: Annotated[int, typer.Option(help="Batches a device reports in over the horizon.")],
    epsilon_total: Annotated[
        float, typer.Option(help="Target composed central epsilon over the horizon.")
    ],
    delta: Annotated[float, typer.Option(help="Target delta over the horizon.")],
    t: Annotated[
        int | None, typer.Option(help="Fix the output domain (default: MSE-optimal per eps0).")
    ] = None,
    spec_out: Annotated[
        Path | None,
        typer.Option(help="Also write the plan's spec JSON here (for `coco announce --spec`)."),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """The local epsilon0 (and t) with the smallest closed-form MSE that meets a target
    (epsilon_total, delta) over a horizon of rounds batches of n reports."""
    from aggregator.accountant import CalibrationTarget, calibrate  # noqa: PLC0415 (not for --help)

    try:
        target = CalibrationTarget(
            mechanism=mechanism.value,
            d=d,
            s=s,
            n=n,
            rounds=rounds,
            epsilon_total=epsilon_total,
            delta=delta,
            t=t,
        )
        plan = calibrate(target)
    except (CocoError, ValueError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    data = plan.to_dict()
    if spec_out is not None:
        spec_out.write_text(json.dumps(data["spec"], indent=1) + "\n", encoding="utf-8")
    if as_json:
        typer.echo(json.dumps(data, indent=1))
        return
    typer.echo(
        f"plan: {data['mechanism']} d={d} s={s} t={data['t']} epsilon0={data['epsilon0']:.6g} "
        f"(spec {data['spec']['fingerprint']})"
    )
    typer.echo(
        f"  per batch of n={n}: epsilon_central={data['epsilon_central']:.6g} "
        f"(generic {data['epsilon_central_generic']:.6g}), delta={delta:g}"
    )
    typer.echo(
        f"  over {rounds} batches: epsilon_total={data['epsilon_total']:.6g} "
        f"(target {epsilon_total:g})"
    )
    typer.echo(
        f"  expected MSE per batch (sum over dimensions): mean {data['mse_mean']:.6g}, "
        f"frequency {data['mse_freq']:.6g}"
    )
    typer.echo(
        f"  device ledgers: {data['ledger_epsilon_per_report']:.6g} per report, "
        f"{data['ledger_epsilon_total']:.6g} over the horizon (local, basic composition)"
    )
