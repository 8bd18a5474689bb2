"""``coco aggregator plot``: the per-round series as a PNG (the figure is
:func:`aggregator.page.series_plot.series_figure`; this shell reads the documents and
writes the file). matplotlib is imported when the command runs, not for ``--help``."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Annotated, Any

import typer

from edge import CocoError

__all__ = ["aggregator_plot", "fetch_json", "read_truth_file"]


def fetch_json(url: str, *, timeout: float, missing_ok: bool = False) -> dict[str, Any] | None:
    """The JSON object at ``url``; ``None`` for a 404 with ``missing_ok``; a one-line
    :class:`CocoError` for anything else that is not one."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            body = response.read()
    except urllib.error.HTTPError as exc:
        if missing_ok and exc.code == 404:
            return None
        detail = exc.read(200).decode("utf-8", "replace").strip().splitlines()
        why = f": {detail[0]}" if detail else ""
        raise CocoError(f"cannot read {url}: HTTP {exc.code} {exc.reason}{why}") from None
    except urllib.error.URLError as exc:
        raise CocoError(f"cannot read {url}: {exc.reason}") from None
    try:
        document = json.loads(body)
    except ValueError:
        document = None
    if not isinstance(document, dict):
        raise CocoError(f"{url} did not answer a JSON object")
    return document


def read_truth_file(path: Path, *, dims: list[int], now: float) -> dict[str, Any]:
    """The ``/truth`` document of a ground-truth file (``coco fleet --ground-truth``)."""
    from aggregator.page.truth import TruthError, TruthQuery, parse_truth  # noqa: PLC0415

    try:
        table = parse_truth(json.loads(path.read_text(encoding="utf-8")))
        return table.select(TruthQuery(0.0, now, tuple(dims)))
    except (OSError, UnicodeDecodeError, ValueError) as exc:  # TruthError, JSON errors
        kind = "" if isinstance(exc, TruthError | OSError) else "not JSON: "
        raise CocoError(f"--truth {path}: {kind}{exc}") from None


def _dims(text: str) -> list[int]:
    parts = text.split(",")
    if not all(p.strip().isdigit() for p in parts):
        raise CocoError(f"--dims must be comma-separated dimension indices, got {text!r}")
    return [int(p) for p in parts]


def _series_url(url: str, query: dict[str, str], path: str) -> str:
    if not url.startswith(("http://", "https://")):
        raise CocoError(f"--url must be http(s)://host:port of an aggregator, got {url!r}")
    parts = urllib.parse.urlsplit(url)
    return urllib.parse.urlunsplit(
        parts._replace(path=path, query=urllib.parse.urlencode(query), fragment="")
    )


def aggregator_plot(
    output: Annotated[Path, typer.Option("--output", "-o", help="The PNG file to write.")],
    url: Annotated[
        str | None,
        typer.Option(envvar="COCO_AGGREGATOR_URL", help="http://host:port of a running service."),
    ] = None,
    series: Annotated[
        Path | None, typer.Option(help="A /series JSON document in a file, instead of --url.")
    ] = None,
    dims: Annotated[str, typer.Option(help="Dimensions to plot, e.g. 0,1 (one panel each).")] = (
        "0"
    ),
    truth: Annotated[
        Path | None,
        typer.Option(
            help="SIMULATION ONLY: a fleet's --ground-truth file, drawn as 'simulation truth' "
            "(with --url and no --truth: the service's /truth, if it serves one)."
        ),
    ] = None,
    from_: Annotated[
        float | None, typer.Option("--from", help="With --url: from this Unix time.")
    ] = None,
    to: Annotated[float | None, typer.Option(help="With --url: up to this Unix time.")] = None,
    step: Annotated[str, typer.Option(help="With --url: round, or a duration (1h).")] = "round",
    timeout: Annotated[float, typer.Option(help="HTTP timeout in seconds.")] = 10.0,
) -> None:
    """Write the per-round (or per-step) estimate of the chosen dimensions, with its interval
    band over clock time, as a PNG; the simulation's truth beside it when given."""
    if (url is None) == (series is None):
        typer.echo("error: give exactly one of --url and --series", err=True)
        raise typer.Exit(1)
    try:
        from aggregator.page.series_plot import series_figure  # noqa: PLC0415 (matplotlib)

        chosen = _dims(dims)
        truth_doc: dict[str, Any] | None = None
        if url is not None:
            query = {"dims": ",".join(map(str, chosen)), "step": step}
            query |= {} if from_ is None else {"from": repr(from_)}
            query |= {} if to is None else {"to": repr(to)}
            doc = fetch_json(_series_url(url, query, "/series"), timeout=timeout)
            if truth is None:
                query.pop("step")
                truth_doc = fetch_json(
                    _series_url(url, query, "/truth"), timeout=timeout, missing_ok=True
                )
        else:
            assert series is not None
            try:
                doc = json.loads(series.read_text(encoding="utf-8"))
            except (OSError, UnicodeDecodeError, ValueError) as exc:
                raise CocoError(f"--series {series}: {exc}") from None
        if truth is not None:
            truth_doc = read_truth_file(truth, dims=chosen, now=time.time())
        assert doc is not None
        names = _channel_names(doc)
        figure = series_figure(doc, chosen, truth_doc, names=names)
        figure.savefig(output, format="png", dpi=100)
    except (CocoError, OSError, ValueError) as exc:  # SeriesPlotError is a ValueError
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    rows = doc.get("rows")
    typer.echo(
        f"wrote {output}: {len(rows) if isinstance(rows, list) else 0} rows, dims "
        f"{','.join(map(str, chosen))}" + (", with the simulation truth" if truth_doc else "")
    )


def _channel_names(doc: dict[str, Any]) -> dict[int, str] | None:
    """Channel names by dimension where the document carries ``channels``."""
    channels = doc.get("channels")
    if not isinstance(channels, list):
        return None
    return {
        j: c["name"]
        for j, c in enumerate(channels)
        if isinstance(c, dict) and isinstance(c.get("name"), str)
    }
