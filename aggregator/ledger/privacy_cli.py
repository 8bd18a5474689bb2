"""``coco privacy``: the central privacy level of shuffled releases, offline; ``coco privacy
calibrate``: the local budget that meets a target; both answer how many shards a
deployment can afford (:mod:`aggregator.accountant.shards`)."""

from __future__ import annotations

import json
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer

from edge import CocoError, MechanismSpec
from edge.budget import parse_period
from edge.cli_options import check_output_file, delta_option

__all__ = ["CalibrateMechanism", "PrivacyMechanism", "privacy_app", "privacy_rows"]


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
    central epsilon of a device in ``rounds`` rounds whose smallest release holds ``n``
    reports, as the aggregator's ledger accounts it (CoCo and Collision).
    """
    if rounds is not None and rounds < 1:
        raise ValueError(f"--rounds must be >= 1, got {rounds}")
    # scipy behind the accountant: not imported for --help
    from aggregator.accountant import amplify, amplify_spec, epsilon_total_rounds  # noqa: PLC0415

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
    spec = _spec(mechanism, epsilon=epsilon, s=s, t=t, d=d)
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
            row["rounds"] = rounds
            row["epsilon_total"] = epsilon_total_rounds(spec, {n: rounds}, delta=delta)
        rows.append(row)
    return rows


def _spec(
    mechanism: PrivacyMechanism, *, epsilon: float, s: int | None, t: int | None, d: int | None
) -> MechanismSpec:
    if mechanism is PrivacyMechanism.generic:
        raise ValueError("this needs --mechanism coco or collision (the blanket pair)")
    if s is None:
        raise ValueError(f"--s is required for --mechanism {mechanism.value}")
    if t is None and d is None:
        raise ValueError("give --t, or --d so that the default (MSE-optimal) t can be chosen")
    return MechanismSpec(
        mechanism=mechanism.value,  # type: ignore[arg-type]
        d=d if d is not None else s,
        s=s,
        epsilon=epsilon,
        t=t,  # type: ignore[arg-type]  # None selects the default t
    )


def shards_document(
    *,
    mechanism: PrivacyMechanism,
    epsilon: float,
    devices: int,
    delta: float,
    s: int | None,
    t: int | None,
    d: int | None,
    rounds: int | None,
    target_epsilon_central: float | None,
    target_epsilon_total: float | None,
    imbalance: float,
    max_shards: int,
) -> dict[str, Any]:
    """``coco privacy --devices N``'s JSON: the shard plan of
    :func:`aggregator.accountant.shards.shard_plan` with the spec it is for."""
    from aggregator.accountant.shards import shard_plan  # noqa: PLC0415

    spec = _spec(mechanism, epsilon=epsilon, s=s, t=t, d=d)
    plan = shard_plan(
        spec,
        devices=devices,
        delta=delta,
        target_epsilon_central=target_epsilon_central,
        target_epsilon_total=target_epsilon_total,
        rounds=rounds,
        imbalance=imbalance,
        max_shards=max_shards,
    )
    return {
        "mechanism": spec.mechanism,
        "epsilon_local": spec.epsilon,
        "s": spec.s,
        "t": spec.t,
        "d": d,
        **plan.to_dict(),
    }


def _print_shards(document: dict[str, Any]) -> None:
    target = (
        f"epsilon_central <= {document['target_epsilon_central']:g} per round"
        if document["target_epsilon_total"] is None
        else f"epsilon_total <= {document['target_epsilon_total']:g} over {document['rounds']} "
        "rounds"
    )
    typer.echo(
        f"{document['mechanism']}: epsilon_local={document['epsilon_local']:g}, "
        f"t={document['t']}, delta={document['delta']:g}, {document['devices']} reports per "
        f"round, worst shard at probability 1 - {document['imbalance']:g}; target {target}"
    )
    typer.echo(
        f"{'shards':>7}  {'worst shard':>12}  {'epsilon_central':>16}  {'epsilon_total':>14}"
    )
    for row in document["shards"]:
        typer.echo(
            f"{row['shards']:>7}  {row['shard_size']:>12}  {_fmt(row['epsilon_central']):>16}  "
            f"{_fmt(row['epsilon_total']):>14}  {'meets' if row['meets'] else 'misses'}"
        )
    typer.echo(
        f"largest affordable shard count: {document['max_affordable_shards']} "
        f"(of at most {document['max_shards']} tried)"
    )


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.6g}"


privacy_app = typer.Typer(
    help="Central privacy of shuffled batches (certified bounds); `calibrate` plans epsilon0.",
    invoke_without_command=True,
    add_completion=False,
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
        typer.Option(
            help="Shuffled reports in a release (a round's pool of one shard); repeat for a "
            "curve (required unless --devices)."
        ),
    ] = None,
    delta: Annotated[
        float | None,
        typer.Option(callback=delta_option, help="Target delta in (0, 1) (required)."),
    ] = None,
    s: Annotated[int | None, typer.Option(help="Non-zeros per vector (coco, collision).")] = None,
    t: Annotated[
        int | None, typer.Option(help="Output domain size (default: MSE-optimal).")
    ] = None,
    d: Annotated[int | None, typer.Option(help="Dimension (chooses the default t).")] = None,
    rounds: Annotated[
        int | None,
        typer.Option(
            help="Rounds a device reports in: also print epsilon_total, the composed central "
            "epsilon over that many rounds of n, as the aggregator's ledger accounts it "
            "(coco, collision)."
        ),
    ] = None,
    period: Annotated[
        str | None,
        typer.Option(
            help="Instead of --rounds: the rounds of one period (1d, 7d) of --round-seconds, "
            "so epsilon_total is the level per period the aggregator reports "
            "(epsilon_total_period, a device in every round of it).",
        ),
    ] = None,
    round_seconds: Annotated[
        int | None, typer.Option(help="The round length, with --period.")
    ] = None,
    devices: Annotated[
        int | None,
        typer.Option(
            help="Shards mode: reports per round over all shards. Prints, for 1, 2, ... "
            "shards, the worst shard's size and epsilon, and the largest shard count that "
            "meets --target-epsilon-central or --target-epsilon-total (with --rounds).",
            rich_help_panel="How many shards can I afford",
        ),
    ] = None,
    target_epsilon_central: Annotated[
        float | None,
        typer.Option(
            help="Shards mode: the per-round epsilon_central every shard must meet.",
            rich_help_panel="How many shards can I afford",
        ),
    ] = None,
    target_epsilon_total: Annotated[
        float | None,
        typer.Option(
            help="Shards mode: the epsilon_total over --rounds rounds every shard must meet.",
            rich_help_panel="How many shards can I afford",
        ),
    ] = None,
    shard_imbalance: Annotated[
        float,
        typer.Option(
            help="Shards mode: the worst shard is the size every shard reaches with "
            "probability 1 - this in a round (binomial shard sizes, union bound over the "
            "shards); 0 assumes a perfectly even split, floor(devices / shards).",
            rich_help_panel="How many shards can I afford",
        ),
    ] = 1e-6,
    max_shards: Annotated[
        int,
        typer.Option(
            help="Shards mode: try at most this many shards (the protocol allows 256).",
            rich_help_panel="How many shards can I afford",
        ),
    ] = 64,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Central (epsilon, delta) of n shuffled reports: certified bounds.

    epsilon_central is the mechanism-specific privacy-blanket bound for coco and collision
    (docs/privacy-model.md) and the stronger-clone bound for generic; the generic value and
    the closed forms of Erlingsson et al. 2019 and Feldman et al. 2021 are shown beside it.
    """
    if ctx.invoked_subcommand is not None:
        return
    given: dict[str, object] = {"--mechanism": mechanism, "--epsilon": epsilon, "--delta": delta}
    if devices is None:
        given["--n"] = n
    missing = ", ".join(name for name, value in given.items() if value is None or value == [])
    if missing:
        typer.echo(f"error: missing option(s) {missing}", err=True)
        raise typer.Exit(2)
    assert mechanism is not None
    assert epsilon is not None
    assert delta is not None
    try:
        if period is not None or round_seconds is not None:
            rounds = _horizon(rounds, period, round_seconds)
    except ValueError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    if devices is not None:
        try:
            document = shards_document(
                mechanism=mechanism,
                epsilon=epsilon,
                devices=devices,
                delta=delta,
                s=s,
                t=t,
                d=d,
                rounds=rounds,
                target_epsilon_central=target_epsilon_central,
                target_epsilon_total=target_epsilon_total,
                imbalance=shard_imbalance,
                max_shards=max_shards,
            )
        except (CocoError, ValueError) as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(1) from None
        if as_json:
            typer.echo(json.dumps(document, indent=1))
        else:
            _print_shards(document)
        return
    assert n
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


def _horizon(rounds: int | None, period: str | None, round_seconds: int | None) -> int:
    """The rounds of the horizon: ``--rounds``, or one ``--period`` of ``--round-seconds``."""
    if (rounds is None) == (period is None):
        raise ValueError("give exactly one of --rounds and --period")
    if period is None:
        assert rounds is not None
        return rounds
    if round_seconds is None or round_seconds < 1:
        raise ValueError("--period needs --round-seconds (>= 1)")
    seconds = parse_period(period)
    if seconds % round_seconds:
        raise ValueError(f"--period {period} is not a whole number of {round_seconds}-s rounds")
    return seconds // round_seconds


@privacy_app.command("calibrate")
def privacy_calibrate(
    mechanism: Annotated[CalibrateMechanism, typer.Option(help="Local randomiser.")],
    d: Annotated[int, typer.Option(help="Dimension.")],
    s: Annotated[int, typer.Option(help="Non-zeros per vector.")],
    epsilon_total: Annotated[
        float, typer.Option(help="Target composed central epsilon over the horizon.")
    ],
    delta: Annotated[
        float,
        typer.Option(callback=delta_option, help="Target delta over the horizon, in (0, 1)."),
    ],
    rounds: Annotated[
        int | None,
        typer.Option(help="Rounds a device reports in over the horizon; or give --period."),
    ] = None,
    period: Annotated[
        str | None,
        typer.Option(
            help="Plan 'at most --epsilon-total per period': the horizon is one period (1d, "
            "24h, 7d) of rounds of --round-seconds, a device in every one of them.",
            rich_help_panel="Per period",
        ),
    ] = None,
    round_seconds: Annotated[
        int | None,
        typer.Option(help="The round length, with --period.", rich_help_panel="Per period"),
    ] = None,
    participation: Annotated[
        float,
        typer.Option(
            help="q: each device reports in a round with this probability (needs --devices): "
            "releases hold about q x devices reports, planned at the size they reach with "
            "probability 1 - --shard-imbalance. The accountant takes no credit for "
            "sampling: a device is planned in every round.",
            rich_help_panel="Per period",
        ),
    ] = 1.0,
    n: Annotated[
        int | None,
        typer.Option(
            help="Reports per round (a round's smallest release); or give --devices (and --shards)."
        ),
    ] = None,
    t: Annotated[
        int | None, typer.Option(help="Fix the output domain (default: MSE-optimal per eps0).")
    ] = None,
    spec_out: Annotated[
        Path | None,
        typer.Option(help="Also write the plan's spec JSON here (for `coco announce --spec`)."),
    ] = None,
    devices: Annotated[
        int | None,
        typer.Option(
            help="Reports per round over all shards: plan for the worst of --shards shards.",
            rich_help_panel="How many shards can I afford",
        ),
    ] = None,
    shards: Annotated[
        int,
        typer.Option(
            help="Shufflers (shards) the --devices reports are split over.",
            rich_help_panel="How many shards can I afford",
        ),
    ] = 1,
    shard_imbalance: Annotated[
        float,
        typer.Option(
            help="The worst shard is the size every shard reaches with probability 1 - this "
            "in a round; 0 assumes a perfectly even split.",
            rich_help_panel="How many shards can I afford",
        ),
    ] = 1e-6,
    max_shards: Annotated[
        int | None,
        typer.Option(
            help="Table: plan for 1, 2, ... shards (up to this many) and report the largest "
            "shard count whose plan keeps epsilon0 >= --min-epsilon0 (needs --devices).",
            rich_help_panel="How many shards can I afford",
        ),
    ] = None,
    min_epsilon0: Annotated[
        float | None,
        typer.Option(
            help="Table: the smallest local budget the estimates can live with.",
            rich_help_panel="How many shards can I afford",
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """The local epsilon0 (and t) with the smallest closed-form MSE that meets a target
    (epsilon_total, delta) over a horizon of rounds rounds of n reports, planned with exactly
    the accounting the aggregator's ledger applies. With --devices and --shards, n is the
    worst shard; with --max-shards and --min-epsilon0, how many shards are affordable."""
    from aggregator.accountant import CalibrationTarget, calibrate  # noqa: PLC0415 (not for --help)
    from aggregator.accountant.shards import calibrate_shards, worst_shard_size  # noqa: PLC0415

    try:
        if spec_out is not None:
            check_output_file(spec_out, "--spec-out")
        if (n is None) == (devices is None):
            raise ValueError("give exactly one of --n and --devices")
        rounds = _horizon(rounds, period, round_seconds)
        if participation != 1.0 and devices is None:
            raise ValueError("--participation needs --devices (the population it samples)")
        if max_shards is not None and (devices is None or min_epsilon0 is None):
            raise ValueError("--max-shards needs --devices and --min-epsilon0")
        if devices is None:
            assert n is not None
            size = n
        else:
            size = worst_shard_size(
                devices, shards, imbalance=shard_imbalance, participation=participation
            )
        if size < 1:
            raise ValueError(f"{shards} shards of {devices} reports leave a shard empty")
        target = CalibrationTarget(
            mechanism=mechanism.value,
            d=d,
            s=s,
            n=size,
            rounds=rounds,
            epsilon_total=epsilon_total,
            delta=delta,
            t=t,
        )
        if max_shards is not None:
            assert devices is not None
            assert min_epsilon0 is not None
            affordable, table = calibrate_shards(
                target,
                devices=devices,
                imbalance=shard_imbalance,
                max_shards=max_shards,
                min_epsilon0=min_epsilon0,
            )
            _print_shard_plans(
                {
                    "devices": devices,
                    "shard_imbalance": shard_imbalance,
                    "min_epsilon0": min_epsilon0,
                    "max_shards": max_shards,
                    "max_affordable_shards": affordable,
                    "shards": [row.to_dict() for row in table],
                },
                as_json=as_json,
            )
            return
        plan = calibrate(target)
    except (CocoError, ValueError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    data = plan.to_dict()
    data.update(
        participation=participation,
        ledger_epsilon_expected=data["ledger_epsilon_total"] * participation,
        **({} if devices is None else {"devices": devices, "shards": shards}),
        **({} if devices is None else {"shard_imbalance": shard_imbalance}),
        **({} if period is None else {"period": period, "round_seconds": round_seconds}),
    )
    if spec_out is not None:
        spec_out.write_text(json.dumps(data["spec"], indent=1) + "\n", encoding="utf-8")
    if as_json:
        typer.echo(json.dumps(data, indent=1))
        return
    typer.echo(
        f"plan: {data['mechanism']} d={d} s={s} t={data['t']} epsilon0={data['epsilon0']:.6g} "
        f"(spec {data['spec']['fingerprint']})"
    )
    where = "" if devices is None else f" (the worst of {shards} shards of {devices})"
    typer.echo(
        f"  per round of n={size}{where}: epsilon_central={data['epsilon_central']:.6g} "
        f"(generic {data['epsilon_central_generic']:.6g}), delta={delta:g}"
    )
    horizon = f"{rounds} rounds" if period is None else f"a period of {period} ({rounds} rounds)"
    typer.echo(
        f"  over {horizon}: epsilon_total={data['epsilon_total']:.6g} "
        f"(target {epsilon_total:g}; the ledger's accounting, a device in every round)"
    )
    typer.echo(
        f"  expected MSE per round (sum over dimensions): mean {data['mse_mean']:.6g}, "
        f"frequency {data['mse_freq']:.6g}"
    )
    typer.echo(
        f"  device ledgers: {data['ledger_epsilon_per_report']:.6g} per report, "
        f"{data['ledger_epsilon_total']:.6g} over the horizon (local, basic composition)"
        + (
            ""
            if participation == 1.0
            else f", about {data['ledger_epsilon_expected']:.6g} at participation {participation:g}"
        )
    )


def _print_shard_plans(document: dict[str, Any], *, as_json: bool) -> None:
    if as_json:
        typer.echo(json.dumps(document, indent=1))
        return
    typer.echo(
        f"{document['devices']} reports per round, worst shard at probability "
        f"1 - {document['shard_imbalance']:g}; affordable: epsilon0 >= "
        f"{document['min_epsilon0']:g}"
    )
    typer.echo(f"{'shards':>7}  {'worst shard':>12}  {'epsilon0':>10}  {'t':>5}  {'mse_mean':>12}")
    for row in document["shards"]:
        plan = row["plan"]
        if plan is None:
            typer.echo(f"{row['shards']:>7}  {row['shard_size']:>12}  target out of reach")
            continue
        typer.echo(
            f"{row['shards']:>7}  {row['shard_size']:>12}  {plan['epsilon0']:>10.6g}  "
            f"{plan['t']:>5}  {plan['mse_mean']:>12.6g}  {'meets' if row['meets'] else 'misses'}"
        )
    typer.echo(
        f"largest affordable shard count: {document['max_affordable_shards']} "
        f"(of at most {document['max_shards']} tried)"
    )
