"""``coco aggregator rejected list | replay``: the verified batches and manifests the
aggregator keeps, refused for a reason an operator can fix (:mod:`aggregator.service.rejected`).

``list`` reads ``<checkpoint>.quarantine`` offline (read only; a running service's file is
as of its last checkpoint). ``replay`` asks for a replay: it creates
``<checkpoint>.quarantine.replay``, which a running service picks up within seconds (and
removes); a stopped service replays everything at its next start anyway. A replay applies
what now passes the checks (once: the batch ids see to that) and keeps the rest.
"""

from __future__ import annotations

import datetime
from pathlib import Path
from typing import Annotated

import typer

from edge import CocoError

__all__ = ["rejected_app"]

rejected_app = typer.Typer(
    help="Verified batches kept after a refusal an operator can fix.",
    no_args_is_help=True,
    add_completion=False,
)

CheckpointOption = Annotated[
    Path, typer.Option(envvar="COCO_CHECKPOINT", help="The aggregator's checkpoint file.")
]


@rejected_app.command("list")
def rejected_list(checkpoint: CheckpointOption) -> None:
    """Print the kept messages: counts by reason, then one line each (oldest first)."""
    from aggregator.service.core.quarantine import KEPT_REASONS  # noqa: PLC0415
    from aggregator.service.quarantine_file import quarantine_path, read_quarantine  # noqa: PLC0415

    try:
        loaded = read_quarantine(checkpoint, None)
    except CocoError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    if loaded is None:
        typer.echo(f"nothing kept ({quarantine_path(checkpoint)} does not exist)")
        return
    counts = dict.fromkeys(KEPT_REASONS, 0)
    for entry in loaded.entries:
        counts[entry.reason] += 1
    typer.echo(
        f"kept: {len(loaded.entries)} ("
        + ", ".join(f"{reason} {count}" for reason, count in counts.items())
        + f"); applied, until two checkpoints hold them: {len(loaded.applied)}; dropped: "
        f"{loaded.dropped} to the bounds, {loaded.discarded} no longer verifiable, "
        f"{loaded.damaged} damaged"
    )
    for entry in loaded.entries:
        at = datetime.datetime.fromtimestamp(entry.at, datetime.UTC).isoformat(timespec="seconds")
        typer.echo(
            f"{entry.key[:16]}  {entry.kind:8}  {entry.shard or '-':8}  {entry.reason:13}  "
            f"{at}  {len(entry.payload)} bytes"
        )


@rejected_app.command("replay")
def rejected_replay(checkpoint: CheckpointOption) -> None:
    """Ask the service to replay what it keeps (now if it runs, else at its next start)."""
    from aggregator.service.quarantine_file import replay_request_path  # noqa: PLC0415

    request = replay_request_path(checkpoint)
    try:
        request.parent.mkdir(parents=True, exist_ok=True)
        request.touch()
    except OSError as exc:
        typer.echo(f"error: cannot create {request}: {exc}", err=True)
        raise typer.Exit(1) from None
    typer.echo(
        f"replay requested ({request}): a running service replays within seconds, a "
        "stopped one at its next start; `coco aggregator rejected list` shows what stays kept"
    )
