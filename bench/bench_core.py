"""Throughput and accuracy of coco-fleet's CoCo/Collision against pure-ldp's local hashing.

One run measures, on the same synthetic s-sparse ternary data (``sim.models.synthetic``):

* coco-fleet CoCo and Collision: vectorised randomise (``randomise_sparse``) and
  aggregate+estimate (``AggregateState.add`` + ``estimate``) of ``n`` reports;
* pure-ldp 1.2.0 optimal local hashing (OLH, ``LHClient``/``LHServer`` with ``use_olh=True``)
  on a subsample, because its server hashes every domain item in Python for every report;
* pure-ldp's fast heuristic variant (``FastLHClient``/``FastLHServer``, ``k`` hash functions)
  on the full ``n``.

OLH is a single-item frequency oracle over the ``2d`` items ``2j`` (``x_j = -1``) and
``2j + 1`` (``x_j = +1``): each user samples one of its ``s`` items uniformly and reports it,
and the server estimates ``mean_j = s (f(2j+1) - f(2j))``. The error of every mean estimate is
the sum over dimensions of its squared deviation from the true mean, next to its closed-form
expectation. Timed steps use :func:`time.perf_counter`, come after an untimed warm-up on a
small batch, and are repeated (median reported) for the methods that run on the full ``n``.

Run from the repository root::

    .venv/bin/python bench/bench_core.py [--n 1000000] [--d 512] [--s 16] [--epsilon 1.0]
        [--seed 0] [--json PATH]
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import random
import sys
import time
import types
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
from numpy.typing import NDArray

_ROOT = Path(__file__).resolve().parents[1]
if str(_ROOT) not in sys.path:  # run as a script from a checkout without `pip install -e .`
    sys.path.insert(0, str(_ROOT))

from core_report import Result, fmt_rate, machine, ratios, table  # noqa: E402

from aggregator.estimation.estimators import AggregateState  # noqa: E402
from edge import CoCo, Collision, LocalMechanism  # noqa: E402
from sim.models.synthetic import random_sparse, sparse_totals  # noqa: E402

F64 = NDArray[np.float64]
WARMUP_N = 2_000
OLH_WARMUP_N = 200


@dataclass(frozen=True)
class Data:
    """A batch of sparse inputs and its true per-dimension mean."""

    keys: NDArray[np.int64]
    signs: NDArray[np.int8]
    mean: F64

    @classmethod
    def of(cls, keys: NDArray[np.int64], signs: NDArray[np.int8], d: int) -> Data:
        total, _ = sparse_totals(keys, signs, d)
        return cls(keys, signs, total / keys.shape[0])

    @property
    def n(self) -> int:
        return int(self.keys.shape[0])

    def head(self, n: int) -> Data:
        d = self.mean.size
        return Data.of(self.keys[:n], self.signs[:n], d)


def squared_error(est: F64, truth: F64) -> float:
    return float(np.sum((est - truth) ** 2))


# -- coco-fleet --------------------------------------------------------------------------------


def coco_fleet_once(
    mech: LocalMechanism, data: Data, rng: np.random.Generator
) -> tuple[float, float, float]:
    """``(randomise seconds, aggregate+estimate seconds, squared error)`` of one pass."""
    t0 = time.perf_counter()
    seeds, z = mech.randomise_sparse(data.keys, data.signs, rng)
    t1 = time.perf_counter()
    state = AggregateState(mech.spec)
    state.add(seeds, z)
    est = state.estimate()
    t2 = time.perf_counter()
    return t1 - t0, t2 - t1, squared_error(est.mean, data.mean)


def bench_coco_fleet(
    mech: LocalMechanism, data: Data, warm: Data, rng: np.random.Generator, repeats: int
) -> Result:
    t0 = time.perf_counter()
    AggregateState(mech.spec)
    setup = time.perf_counter() - t0
    coco_fleet_once(mech, warm, rng)  # warm-up, untimed
    res = Result(
        method=f"coco-fleet {type(mech).__name__} (t={mech.t})",
        n=data.n,
        setup_s=setup,
        expected_mse=mech.spec.moments.mean_mse(mech.d, mech.s) / data.n,
        note="vectorised batch randomiser (randomise_sparse); AggregateState.add + estimate",
    )
    for _ in range(repeats):
        r, a, err = coco_fleet_once(mech, data, rng)
        res.randomise_s.append(r)
        res.aggregate_s.append(a)
        res.mse.append(err)
    return res


def bench_device_path(mech: LocalMechanism, data: Data, seed: int) -> dict[str, Any]:
    """Rate of coco-fleet's one-report-at-a-time stdlib randomiser (what firmware runs).

    pure-ldp's clients are also one report per Python call, so this is the like-for-like
    client-side comparison; the headline rows use coco-fleet's vectorised batch path.
    """
    rnd = random.Random(seed)
    rows = list(zip(data.keys.tolist(), data.signs.tolist(), strict=True))
    for keys, signs in rows[: min(len(rows), OLH_WARMUP_N)]:  # warm-up
        mech.randomise_keys(keys, signs, getrandbits=rnd.getrandbits)
    t0 = time.perf_counter()
    for keys, signs in rows:
        mech.randomise_keys(keys, signs, getrandbits=rnd.getrandbits)
    elapsed = time.perf_counter() - t0
    return {
        "method": f"coco-fleet {type(mech).__name__} device path (randomise_keys)",
        "n": len(rows),
        "randomise_s": elapsed,
        "randomise_reports_per_s": len(rows) / elapsed,
    }


# -- pure-ldp ----------------------------------------------------------------------------------


class LHClientLike(Protocol):
    g: int
    p: float

    def privatise(self, data: int) -> tuple[int, int]: ...


class LHServerLike(Protocol):
    n: int

    def aggregate(self, priv_data: tuple[int, int]) -> None: ...

    def estimate_all(self, data_list: Sequence[int], suppress_warnings: bool = ...) -> Any: ...

    def reset(self) -> None: ...


class _XXHashStrCompat:
    """``xxhash`` as pure-ldp 1.2.0 expects it: ``xxh32`` accepting ``str``.

    xxhash >= 4.0 raises ``TypeError: Strings must be encoded before hashing`` for ``str``
    input; 3.x encoded it as UTF-8 internally, so encoding here gives the same digests.
    """

    def __init__(self, real: types.ModuleType) -> None:
        self._xxh32: Callable[..., Any] = real.xxh32

    def xxh32(self, data: str | bytes, seed: int = 0) -> Any:
        return self._xxh32(data.encode() if isinstance(data, str) else data, seed=seed)


def load_pure_ldp_lh() -> tuple[types.ModuleType, list[str]]:
    """Import ``pure_ldp.frequency_oracles.local_hashing`` and patch what this env needs.

    Returns the module and a list of the workarounds applied.
    """
    notes: list[str] = []
    parent = "pure_ldp.frequency_oracles"
    if parent not in sys.modules:
        try:
            importlib.import_module(parent)
        except ImportError as exc:
            # The package __init__ imports every oracle, and RAPPOR's server needs
            # scikit-learn and statsmodels, which pure-ldp does not declare. Local hashing
            # needs neither: register the package without running its __init__.
            for name in [m for m in sys.modules if m.startswith(parent)]:
                del sys.modules[name]
            import pure_ldp  # noqa: PLC0415

            stub = types.ModuleType(parent)
            stub.__path__ = [str(Path(pure_ldp.__file__).parent / "frequency_oracles")]
            sys.modules[parent] = stub
            notes.append(
                f"pure_ldp.frequency_oracles/__init__ fails ({exc}); imported the "
                "local_hashing subpackage without it"
            )
    lh = importlib.import_module(f"{parent}.local_hashing")
    import xxhash  # noqa: PLC0415

    xxh32: Callable[..., Any] = xxhash.xxh32  # pure-ldp passes str, which xxhash 4 types out
    try:
        xxh32("0", seed=0)
    except TypeError:
        compat = _XXHashStrCompat(xxhash)
        for sub in ("lh_client", "lh_server", "fast_lh_server"):
            module = importlib.import_module(f"{parent}.local_hashing.{sub}")
            module.xxhash = compat  # type: ignore[attr-defined]
        notes.append(
            f"xxhash {xxhash.VERSION} rejects str input, which pure-ldp hashes "
            "(xxh32(str(item), seed)); patched pure-ldp's xxhash with a UTF-8-encoding shim "
            "(same digests as xxhash 3.x, one extra Python call per hash)"
        )
    return lh, notes


def identity(x: int) -> int:
    """pure-ldp's default index_mapper is ``x - 1`` (1-based items); ours are 0-based."""
    return x


def olh_expected_mse(*, d: int, s: int, g: int, p: float, n: int) -> float:
    """Sum over dims of the variance of ``s (f(2j+1) - f(2j))`` with item sampling and OLH.

    Per report, with ``A = [H(j+) = y]``, ``B = [H(j-) = y]`` and ``c = s g / (p g - 1)``, the
    estimate of ``x_j`` is ``c (A - B)``. For ``x_j = 0``: ``E[(A-B)^2] = 2/g - 2/g^2``. For
    ``x_j != 0`` the held item is the sampled one w.p. ``1/s``, and then
    ``E[(A-B)^2] = p + 1/g - 2p/g``. Assumes ideal random hashing.
    """
    c2 = (s * g / (p * g - 1)) ** 2
    off = 2 / g - 2 / g**2
    v_zero = c2 * off
    v_nonzero = c2 * ((p + 1 / g - 2 * p / g) / s + (1 - 1 / s) * off) - 1
    return (s * v_nonzero + (d - s) * v_zero) / n


def sample_items(data: Data, rng: np.random.Generator) -> list[int]:
    """Each user's one reported item: a uniform choice among its ``s`` (PCKV-style)."""
    rows = np.arange(data.n)
    col = rng.integers(0, data.keys.shape[1], size=data.n)
    items = 2 * data.keys[rows, col] + (data.signs[rows, col] > 0)
    out: list[int] = items.tolist()
    return out


def lh_once(
    client: LHClientLike, server: LHServerLike, data: Data, s: int, rng: np.random.Generator
) -> tuple[float, float, float]:
    """One OLH pass: sample + privatise every report, then aggregate and estimate all items."""
    d = data.mean.size
    t0 = time.perf_counter()
    items = sample_items(data, rng)
    reports = [client.privatise(item) for item in items]
    t1 = time.perf_counter()
    for rep in reports:
        server.aggregate(rep)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # "small n" / "high privacy" notices
        counts = np.asarray(server.estimate_all(range(2 * d), suppress_warnings=True), dtype=float)
    freq = counts / data.n  # LHServer.estimate returns estimated counts, not frequencies
    mean = s * (freq[1::2] - freq[0::2])
    t2 = time.perf_counter()
    return t1 - t0, t2 - t1, squared_error(mean, data.mean)


def reset_server(server: LHServerLike) -> None:
    server.reset()
    counts = getattr(server, "hash_counts", None)
    if counts is not None:  # FastLHServer.reset() leaves its (k, g) count table as it was
        counts[...] = 0


def seed_pure_ldp(seed: int) -> None:
    """pure-ldp draws from the stdlib ``random`` and numpy's legacy global state."""
    random.seed(seed)
    np.random.seed(seed)  # noqa: NPY002 (pure-ldp uses the global state)


def bench_lh(
    *,
    method: str,
    make: Callable[[], tuple[LHClientLike, LHServerLike]],
    data: Data,
    warm: Data,
    s: int,
    rng: np.random.Generator,
    repeats: int,
    seed: int,
    note: str,
) -> Result:
    seed_pure_ldp(seed)
    t0 = time.perf_counter()
    client, server = make()
    setup = time.perf_counter() - t0
    lh_once(client, server, warm, s, rng)  # warm-up, untimed
    d = data.mean.size
    res = Result(
        method=method,
        n=data.n,
        setup_s=setup,
        expected_mse=olh_expected_mse(d=d, s=s, g=client.g, p=client.p, n=data.n),
        note=note,
    )
    for _ in range(repeats):
        reset_server(server)
        r, a, err = lh_once(client, server, data, s, rng)
        res.randomise_s.append(r)
        res.aggregate_s.append(a)
        res.mse.append(err)
    return res


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--n", type=int, default=1_000_000, help="reports (default 10^6)")
    ap.add_argument("--d", type=int, default=512)
    ap.add_argument("--s", type=int, default=16)
    ap.add_argument("--epsilon", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeats", type=int, default=3, help="timed runs at full n (median)")
    ap.add_argument(
        "--olh-n", type=int, default=20_000, help="subsample for plain OLH (aggregate is O(d))"
    )
    ap.add_argument("--olh-repeats", type=int, default=1)
    ap.add_argument("--flh-k", type=int, default=10_000, help="FastLH hash functions")
    ap.add_argument("--json", type=Path, default=None, help="write all numbers here")
    return ap.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.perf_counter()
    n, d, s, eps = args.n, args.d, args.s, args.epsilon
    root = np.random.default_rng(args.seed)
    g_data, g_warm, g_coco, g_coll, g_olh, g_flh = root.spawn(6)
    keys, signs = random_sparse(n, d, s, g_data)
    data = Data.of(keys, signs, d)
    wk, ws = random_sparse(min(WARMUP_N, n), d, s, g_warm)
    warm = Data.of(wk, ws, d)
    olh_data = data.head(min(args.olh_n, n))
    print(f"n={n:,} d={d} s={s} epsilon={eps} seed={args.seed}; data ready", flush=True)

    results: dict[str, Result] = {}
    results["coco"] = bench_coco_fleet(
        CoCo(d=d, s=s, epsilon=eps), data, warm, g_coco, args.repeats
    )
    print("coco-fleet CoCo done", flush=True)
    results["collision"] = bench_coco_fleet(
        Collision(d=d, s=s, epsilon=eps), data, warm, g_coll, args.repeats
    )
    print("coco-fleet Collision done", flush=True)

    lh, compat_notes = load_pure_ldp_lh()
    dom = 2 * d

    def make_olh() -> tuple[LHClientLike, LHServerLike]:
        client = lh.LHClient(eps, dom, use_olh=True, index_mapper=identity)
        server = lh.LHServer(eps, dom, use_olh=True, index_mapper=identity)
        return client, server

    def make_flh() -> tuple[LHClientLike, LHServerLike]:
        # FastLHClient defaults to use_olh=False (g=2) while FastLHServer defaults to True:
        # set it on both or they disagree on g.
        client = lh.FastLHClient(eps, dom, args.flh_k, use_olh=True, index_mapper=identity)
        server = lh.FastLHServer(eps, dom, args.flh_k, use_olh=True, index_mapper=identity)
        return client, server

    results["olh"] = bench_lh(
        method=f"pure-ldp OLH (subsample n={olh_data.n:,})",
        make=make_olh,
        data=olh_data,
        warm=warm.head(min(OLH_WARMUP_N, warm.n)),
        s=s,
        rng=g_olh,
        repeats=args.olh_repeats,
        seed=args.seed,
        note="LHClient/LHServer(use_olh=True); rates measured on the subsample only",
    )
    print("pure-ldp OLH done", flush=True)
    results["fastlh"] = bench_lh(
        method=f"pure-ldp FastLH (k={args.flh_k:,})",
        make=make_flh,
        data=data,
        warm=warm,
        s=s,
        rng=g_flh,
        repeats=args.repeats,
        seed=args.seed + 1,
        note="FastLHClient/FastLHServer(use_olh=True); setup = hash matrix built in Python",
    )
    print("pure-ldp FastLH done", flush=True)
    device = [
        bench_device_path(CoCo(d=d, s=s, epsilon=eps), olh_data, args.seed),
        bench_device_path(Collision(d=d, s=s, epsilon=eps), olh_data, args.seed),
    ]
    total = time.perf_counter() - started

    rat = ratios(results)
    print()
    print(table(list(results.values())))
    print()
    print("Ratios (rates are medians of the timed repeats; OLH's are from its subsample):")
    for key, val in rat.items():
        print(f"  {key:<40} {val:10.3g}")
    print()
    print("coco-fleet one-report-at-a-time device path (stdlib, like pure-ldp's clients):")
    for dev in device:
        print(
            f"  {dev['method']:<58} n={dev['n']:,}: "
            f"{fmt_rate(dev['randomise_reports_per_s'])} randomise r/s"
        )
    print()
    print(
        f"Timed steps: median of {args.repeats} repeats at full n for coco-fleet and FastLH, "
        f"{args.olh_repeats} for OLH on its subsample, each after an untimed warm-up. "
        "'setup s' (server construction) is excluded from the rates."
    )
    print("mean MSE = sum over dims of (estimate - true mean)^2, averaged over repeats;")
    print("n*MSE compares methods measured at different n.")
    for note in compat_notes:
        print(f"pure-ldp workaround: {note}")
    print(f"total runtime {total:.1f} s on {os.cpu_count()} cores")

    if args.json is not None:
        payload = {
            "config": {
                "n": n,
                "d": d,
                "s": s,
                "epsilon": eps,
                "seed": args.seed,
                "repeats": args.repeats,
                "olh_n": olh_data.n,
                "olh_repeats": args.olh_repeats,
                "flh_k": args.flh_k,
                "warmup_n": warm.n,
            },
            "machine": machine(),
            "results": {k: v.to_dict() for k, v in results.items()},
            "ratios": rat,
            "device_path": device,
            "pure_ldp_workarounds": compat_notes,
            "total_runtime_s": total,
        }
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(payload, indent=2) + "\n")
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
