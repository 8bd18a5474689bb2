"""``coco device``: publish one eps-LDP report per CSV row of sensor readings.

Thin by design: options -> :class:`~edge.publisher.PublisherConfig` and a
:class:`~edge.ledger.BudgetLedger` -> :class:`~edge.publisher.DevicePublisher`. Input is
CSV from ``--input`` or stdin, one vector of ``d`` readings per line; blank lines are
skipped. A first line that is not numeric and has one cell per channel (as many as
``--lo``) is a header: it is skipped, and stderr says so (``note: line 1 ... header``);
a first line that is not numeric with another number of cells is a bad row like any other.

Rounds come from the clock (docs/protocol.md, "Rounds"): each data row is published in the
round ``floor(unix_time / round_seconds)`` in which it is sent, at most one row per round (a
row read while this run already reported in the current round waits for the next round).
``round_seconds`` is the announced one; ``--round-seconds`` gives it when there is no
retained announcement (with ``--spec``), and must match the announcement when there is one.
A clock that is not set (before 2025-01-01) stops the run with a one-line error before any
budget is charged. A device restarted within a round may report in it again; the shuffler
rejects that second report as a duplicate.

Outcome: a one-line summary ``published P, refused by ledger R, failed F``. Rows that
cannot be parsed or encoded are counted as failed and skipped. A broker or spec failure
stops the run. Exit status (:data:`EXIT_FAILED`, :data:`EXIT_BUDGET_SPENT`):

* 0: every row was published;
* 1: a row failed or the run stopped on an error (a one-line ``error:`` on stderr, no
  traceback);
* 4: nothing failed, but the ledger's lifetime cap (``--budget``) refused at least one row:
  the device's budget is spent (``error: the privacy budget is spent ...`` on stderr). The
  ledger is never reset by the tool, so every later run of this device exits 4 too.

Budget: ``--budget`` is a lifetime cap, ``--budget-per-period`` with ``--period`` (default
``1d``) a cap per period of Unix time (period ``k`` is ``[k P, (k + 1) P)``); either or both
(:mod:`edge.budget`). A row that the period cap refuses waits for the next period: stderr
says so in one line naming when it starts (``note: privacy budget of this period spent: ...;
the next period starts at 2025-08-01T00:00:00Z: waiting for it``), and the row is published
then. A clock set back does not renew a period's budget. A device that should run for years
uses a period cap (``--budget-per-period 1 --period 1d``), with or without a lifetime cap.

The deployment's period policy: an announcement (retained, or the ``--spec`` file's when none
is retained) may carry ``period_seconds`` and ``budget_per_period`` (docs/protocol.md 10.5).
Without ``--budget-per-period`` the device then runs with the announced period cap (beside
``--budget``, if given; with neither option and no announced policy the run is refused). A
``--budget-per-period``/``--period`` of the operator's is kept when it is no looser than the
announced one: it must not let more reports into any announced period than
``floor(budget_per_period / epsilon)`` (:func:`edge.budget.within_announced`); a looser one
is refused in one line (exit 1) before anything is charged, since the aggregator states its
per-period guarantee on the announced policy. The policy is read once, when the run starts;
the ledger file is checked before connecting when a cap is given on the command line, and
once the announcement is read otherwise.
"""

from __future__ import annotations

import csv
import logging
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TextIO

import typer

from edge.announce import period_of, read_spec_or_announcement
from edge.budget import PeriodPolicy, exact_epsilon, within_announced
from edge.cli_options import (
    DEFAULT_BROKER,
    DEFAULT_MQTT_VERSION,
    BrokerOption,
    CaFileOption,
    DeploymentOption,
    MqttVersionOption,
    PasswordFileOption,
    PasswordOption,
    SpecFileOption,
    UsernameOption,
    resolve_password,
)
from edge.errors import CocoError, InputError
from edge.mqtt_version import check_mqtt_version
from edge.rounds import ClockError

if TYPE_CHECKING:
    from edge.ledger import BudgetLedger
    from edge.publisher import LedgerOpener

logger = logging.getLogger(__name__)

EXIT_FAILED = 1
"""A row failed, or the run stopped on an error."""
EXIT_BUDGET_SPENT = 4
"""Nothing failed, but the ledger refused a row: the device's budget is spent."""


def _floats(option: str, text: str) -> tuple[float, ...]:
    try:
        return tuple(float(v) for v in text.split(","))
    except ValueError:
        raise typer.BadParameter(
            f"must be comma-separated numbers, got {text!r}", param_hint=option
        ) from None


def _period_policy(per_period: float | None, period: str) -> PeriodPolicy | None:
    """The period cap of the options (``None`` without ``--budget-per-period``)."""
    if per_period is None:
        return None
    try:
        return PeriodPolicy.of(per_period, period)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--budget-per-period/--period") from None


def _ledger_opener(
    path: Path,
    budget: float | None,
    own: PeriodPolicy | None,
    from_file: dict[str, Any] | None,
) -> LedgerOpener:
    """Opens the device's ledger once the publisher resolved the announcement (or found none:
    then the ``--spec`` file's, if it holds one): the lifetime cap ``budget`` and the period
    cap of :func:`edge.budget.within_announced` (module doc)."""
    from edge.ledger import BudgetLedger  # noqa: PLC0415

    def open_ledger(announcement: dict[str, Any] | None, epsilon: float) -> BudgetLedger:
        announced = period_of(announcement if announcement is not None else from_file)
        cap = within_announced(
            own,
            None if announced is None else announced.policy(),
            exact_epsilon("epsilon", epsilon, allow_zero=False),
        )
        if budget is None and cap is None:
            raise ValueError(
                "give --budget (a lifetime cap), --budget-per-period (a period cap) or both: "
                "the deployment announces no period policy"
            )
        return BudgetLedger(path, total_epsilon=budget, period=cap)

    return open_ledger


def _rows(stream: TextIO, channels: int) -> Iterator[tuple[int, list[str]]]:
    """``(line_number, cells)`` of the non-blank lines, a header skipped (and said so): a
    first line that is not numeric and has ``channels`` cells."""
    for number, cells in enumerate(csv.reader(stream), start=1):
        if not cells or all(not c.strip() for c in cells):
            continue
        if number == 1 and len(cells) == channels and not _numeric(cells):
            typer.echo(
                f"note: line 1 is not numeric: read as a header of {channels} columns and skipped",
                err=True,
            )
            continue
        yield number, cells


def _row_values(cells: list[str], number: int) -> list[float]:
    try:
        return [float(c) for c in cells]
    except ValueError:
        raise InputError(f"line {number} is not a row of numbers: {cells!r}") from None


def _numeric(cells: list[str]) -> bool:
    try:
        for c in cells:
            float(c)
    except ValueError:
        return False
    return True


def device(
    deployment: DeploymentOption,
    device_id: Annotated[
        str, typer.Option(envvar="COCO_DEVICE_ID", help="This device's id (topic only).")
    ],
    lo: Annotated[
        str, typer.Option(envvar="COCO_LO", help="Lower bounds of the channels, comma-separated.")
    ],
    hi: Annotated[
        str, typer.Option(envvar="COCO_HI", help="Upper bounds of the channels, comma-separated.")
    ],
    ledger: Annotated[
        Path, typer.Option(envvar="COCO_LEDGER", help="Privacy-budget ledger file (JSON).")
    ],
    budget: Annotated[
        float | None,
        typer.Option(
            envvar="COCO_BUDGET",
            help="Lifetime cap: the total local epsilon of this device (once spent, the "
            "device stops for good).",
        ),
    ] = None,
    budget_per_period: Annotated[
        float | None,
        typer.Option(
            envvar="COCO_BUDGET_PER_PERIOD",
            help="Period cap: the local epsilon this device may spend per --period (once "
            "spent, it waits for the next period).",
        ),
    ] = None,
    period: Annotated[
        str,
        typer.Option(
            envvar="COCO_PERIOD",
            help="Length of a period of --budget-per-period: 1h, 1d, 7d ... (periods are "
            "aligned on Unix time).",
        ),
    ] = "1d",
    broker: BrokerOption = DEFAULT_BROKER,
    spec: SpecFileOption = None,
    clip: Annotated[
        bool, typer.Option(envvar="COCO_CLIP", help="Clip readings to the range from --lo to --hi.")
    ] = False,
    input_file: Annotated[
        Path | None,
        typer.Option("--input", envvar="COCO_INPUT", help="CSV of readings (default: stdin)."),
    ] = None,
    round_seconds: Annotated[
        int | None,
        typer.Option(
            envvar="COCO_ROUND_SECONDS",
            help="Round length in seconds when no announcement is retained (default: the "
            "announced one, or the --spec file's if it holds a whole announcement).",
        ),
    ] = None,
    clock_offset: Annotated[
        float,
        typer.Option(hidden=True, help="Test only: seconds added to the clock."),
    ] = 0.0,
    username: UsernameOption = None,
    password: PasswordOption = None,
    password_file: PasswordFileOption = None,
    ca_file: CaFileOption = None,
    cert_file: Annotated[
        Path | None,
        typer.Option(envvar="COCO_CERT_FILE", help="Client certificate (PEM) for mqtts://."),
    ] = None,
    key_file: Annotated[
        Path | None,
        typer.Option(envvar="COCO_KEY_FILE", help="Private key (PEM) of --cert-file."),
    ] = None,
    qos: Annotated[int, typer.Option(envvar="COCO_QOS", help="MQTT QoS of reports.")] = 1,
    mqtt_version: MqttVersionOption = DEFAULT_MQTT_VERSION,
    mqtt_v311: Annotated[
        bool,
        typer.Option("--mqtt-v311", envvar="COCO_MQTT_V311", help="Same as --mqtt-version 3.1.1."),
    ] = False,
    timeout: Annotated[
        float,
        typer.Option(envvar="COCO_TIMEOUT", help="Seconds for connect, spec and each PUBACK."),
    ] = 10.0,
) -> None:
    """Publish one eps-LDP report per CSV row of sensor readings, in the current wall-clock
    round, after charging the device's privacy-budget ledger."""
    # not for --help: the publisher brings paho and numpy
    from edge.ledger import BudgetLedger  # noqa: PLC0415
    from edge.publisher import DevicePublisher, PublisherConfig  # noqa: PLC0415

    lo_values = _floats("--lo", lo)
    hi_values = _floats("--hi", hi)
    policy = _period_policy(budget_per_period, period)
    published = refused = failed = 0
    error: str | None = None
    publisher: DevicePublisher | None = None
    try:
        config = PublisherConfig(
            broker=broker,
            deployment=deployment,
            device_id=device_id,
            username=username,
            password=resolve_password(password, password_file),
            ca_file=ca_file,
            cert_file=None if cert_file is None else str(cert_file),
            key_file=None if key_file is None else str(key_file),
            qos=qos,
            protocol="3.1.1" if mqtt_v311 else check_mqtt_version(mqtt_version),
            connect_timeout=timeout,
            publish_timeout=timeout,
            spec_timeout=timeout,
        )
        given, from_file = (None, None) if spec is None else read_spec_or_announcement(spec)
        file_round_seconds = None if from_file is None else from_file["round_seconds"]
        if budget is not None or policy is not None:  # a bad ledger file fails before connecting
            BudgetLedger(ledger, total_epsilon=budget, period=policy)

        publisher = DevicePublisher(
            config,
            ledger=_ledger_opener(ledger, budget, policy, from_file),
            spec=given,
            lo=lo_values,
            hi=hi_values,
            clip=clip,
            round_seconds=file_round_seconds if round_seconds is None else round_seconds,
            clock=(lambda: time.time() + clock_offset) if clock_offset else time.time,
            on_wait=lambda line: typer.echo(f"note: {line}", err=True),
        )
        with publisher, _Input(input_file) as stream:
            for number, cells in _rows(stream, len(lo_values)):
                try:
                    values = _row_values(cells, number)
                    ok = publisher.publish_vector(values)
                except InputError as exc:  # bad row: skip it (a SpecError stops the run)
                    failed += 1
                    logger.warning("line %d skipped: %s", number, exc)
                    continue
                if ok:
                    published += 1
                else:
                    refused += 1
    except ClockError as exc:
        error = f"{exc}; not reporting (set the clock, e.g. by NTP, first)"
    except (CocoError, ValueError, OSError) as exc:
        error = str(exc)
    sat_out = 0 if publisher is None else publisher.sat_out
    book = None if publisher is None else publisher.opened_ledger
    published -= sat_out
    not_sampled = f", not sampled {sat_out}" if sat_out else ""
    typer.echo(f"published {published}, refused by ledger {refused}, failed {failed}{not_sampled}")
    if error is not None:
        typer.echo(f"error: {error}", err=True)
        raise typer.Exit(EXIT_FAILED)
    if failed:
        raise typer.Exit(EXIT_FAILED)
    if refused:
        cap = None if book is None else book.period
        per_period = "?" if cap is None else f"{float(cap.epsilon):g}"
        why = (
            f"lifetime budget {budget:g}, {book.remaining if book else 0:g} left"
            if budget is not None
            else f"a report costs more than the budget per period {per_period}"
        )
        typer.echo(
            f"error: the privacy budget is spent: the ledger {ledger} refused {refused} "
            f"row(s) ({why})",
            err=True,
        )
        raise typer.Exit(EXIT_BUDGET_SPENT)


class _Input:
    """``--input`` or stdin as a context manager (stdin is not closed)."""

    def __init__(self, path: Path | None) -> None:
        self._path = path
        self._fh: TextIO | None = None

    def __enter__(self) -> TextIO:
        if self._path is None:
            return sys.stdin
        self._fh = self._path.open(encoding="utf-8", newline="")
        return self._fh

    def __exit__(self, *exc: object) -> None:
        if self._fh is not None:
            self._fh.close()
