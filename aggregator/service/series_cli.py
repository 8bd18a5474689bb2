"""``coco aggregator series``: the estimates over time as ``/series`` answers them, from a
running service (``--url``) or from a stopped one's checkpoint and series file
(``--checkpoint``, read only), built by the same code as the service's."""

from __future__ import annotations

import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Annotated

import typer

from edge import CocoError

__all__ = ["aggregator_series", "read_series_checkpoint", "read_series_url"]


def aggregator_series(
    url: Annotated[
        str | None,
        typer.Option(envvar="COCO_AGGREGATOR_URL", help="http://host:port of a service."),
    ] = None,
    checkpoint: Annotated[
        Path | None,
        typer.Option(
            help="Or read a stopped service's checkpoint and its series file (read only).",
        ),
    ] = None,
    start: Annotated[
        str | None, typer.Option("--from", help="Unix seconds: rows that end after it.")
    ] = None,
    end: Annotated[
        str | None, typer.Option("--to", help="Unix seconds: rows that end at or before it.")
    ] = None,
    step: Annotated[
        str | None, typer.Option(help="round (default), or a duration: 15m, 1h, 1d.")
    ] = None,
    dims: Annotated[str | None, typer.Option(help="Dimensions, e.g. 0,3,5 (default: all).")] = None,
    form: Annotated[str, typer.Option("--format", help="json or csv.")] = "json",
    timeout: Annotated[float, typer.Option(help="HTTP timeout in seconds.")] = 60.0,
) -> None:
    """Print the estimates over time (GET /series of a running service, or the series a
    stopped one kept beside its checkpoint): one row per round or step, each with its
    estimates and intervals (docs/estimates.md)."""
    query = {
        name: value
        for name, value in (
            ("from", start),
            ("to", end),
            ("step", step),
            ("dims", dims),
            ("format", form),
        )
        if value is not None
    }
    try:
        if (url is None) == (checkpoint is None):
            raise CocoError("give exactly one of --url and --checkpoint")
        if url is not None:
            text = read_series_url(url, query, timeout=timeout)
        else:
            assert checkpoint is not None
            text = read_series_checkpoint(checkpoint, query)
    except (CocoError, ValueError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    typer.echo(text, nl=not text.endswith("\n"))


def read_series_checkpoint(path: Path, query: dict[str, str]) -> str:
    """The ``/series`` answer for ``query`` of the series kept beside the checkpoint at
    ``path`` (:func:`~aggregator.service.series_file.load_series`: read only), built by the
    same code as the service's; one-line errors."""
    import time  # noqa: PLC0415

    from aggregator.series.documents import series_csv, series_json  # noqa: PLC0415
    from aggregator.series.frame import Frame  # noqa: PLC0415
    from aggregator.series.windows import parse_series_query  # noqa: PLC0415
    from aggregator.service.core.checkpoint import CheckpointError  # noqa: PLC0415
    from aggregator.service.series_file import SeriesFileError, load_series  # noqa: PLC0415

    try:
        series = load_series(path)
    except (SeriesFileError, CheckpointError, OSError) as exc:
        raise CocoError(str(exc).splitlines()[0] if str(exc) else repr(exc)) from None
    params = {name: [value] for name, value in query.items()}
    parsed = parse_series_query(params, d=series.spec.d, now=time.time())
    frame = Frame.of(series.rows(parsed.start, parsed.end), series.spec.d)
    if parsed.format == "csv":
        return "".join(series_csv(series.spec, frame, parsed, confidence=0.95))
    pieces = series_json(
        series.spec, frame, parsed, round_seconds=series.round_seconds, confidence=0.95
    )
    return b"".join(pieces).decode()


def read_series_url(url: str, query: dict[str, str], *, timeout: float) -> str:
    """The ``/series`` answer of the service at ``url`` (its base, or ``.../series``) for
    ``query``; :class:`CocoError` (one line) with the service's own line for a 400."""
    if not url.startswith(("http://", "https://")):
        raise CocoError(f"--url must be http(s)://host:port, got {url!r}")
    parts = urllib.parse.urlsplit(url)
    path = parts.path.rstrip("/")
    path = path if path.endswith("/series") else path + "/series"
    full = urllib.parse.urlunsplit(parts._replace(path=path, query=urllib.parse.urlencode(query)))
    try:
        with urllib.request.urlopen(full, timeout=timeout) as response:
            return str(response.read().decode())
    except urllib.error.HTTPError as exc:
        with exc:
            line = exc.read(1000).decode(errors="replace").strip().splitlines()
        raise CocoError(f"{full}: HTTP {exc.code}: {line[0] if line else exc.reason}") from None
    except urllib.error.URLError as exc:
        raise CocoError(f"cannot read {full}: {exc.reason}") from None
