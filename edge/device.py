"""Device-side randomisers that need nothing beyond the language itself.

This module is the normative reference for firmware: it runs unchanged on CPython 3.11+ and
on MicroPython (no imports, integer arithmetic only, no floats on the privacy path). Every
function here is specified bit for bit in ``docs/protocol.md``; the hash, the random stream
and the randomisers have published test vectors (``docs/vectors-v1.json``), and the whole
module is run under real MicroPython against CPython in the test-suite.

Privacy rests on two facts that hold for *every* hash seed:

* all output weights are the integers ``U`` (the unit weight) or ``E = floor(e^eps U)`` or a
  redistribution weight between them, so ``P[z | x] / P[z | x'] <= E / U <= e^eps``;
* the normaliser ``Omega`` does not depend on the input.

The hash family only matters for accuracy (the estimators assume ideal hashing), never for
the local privacy guarantee.

Randomness comes from a caller-supplied ``getrandbits(k)`` (``0 < k <= 32``), which must be
a cryptographically strong source on a real device (a hardware RNG or ``os.urandom``).
"""

# Type names exist only for the checker: MicroPython has no typing module and never
# evaluates annotations, so names from typing are quoted (this is not `from __future__
# import annotations`, which MicroPython rejects).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Callable

    GetRandBits = Callable[[int], int]

# Hash family version 1: XXH32 of the key as 4 little-endian bytes, seeded with the 32-bit
# report seed. Constants from the xxHash specification.
HASH_VERSION = 1
_M32 = 0xFFFFFFFF
_PRIME32_2 = 0x85EBCA77
_PRIME32_3 = 0xC2B2AE3D
_PRIME32_4 = 0x27D4EB2F
_PRIME32_5 = 0x165667B1

# Output weights are integers in units of 2^-24: a weight of 1 is UNIT, e^eps is
# floor(e^eps * UNIT) (rounded down so that the ratio can only shrink).
WEIGHT_UNIT = 1 << 24


def xxh32_u32(key: int, seed: int) -> int:
    """XXH32 of the 4-byte little-endian encoding of ``key`` with 32-bit ``seed``.

    Equal to ``xxhash.xxh32_intdigest(struct.pack('<I', key), seed=seed)``.
    """
    h = (seed + _PRIME32_5 + 4) & _M32
    h = (h + key * _PRIME32_3) & _M32
    h = ((((h << 17) | (h >> 15)) & _M32) * _PRIME32_4) & _M32
    h ^= h >> 15
    h = (h * _PRIME32_2) & _M32
    h ^= h >> 13
    h = (h * _PRIME32_3) & _M32
    h ^= h >> 16
    return h


_PRIME32_1 = 0x9E3779B1


def _rotl32(x: int, r: int) -> int:
    return ((x << r) | (x >> (32 - r))) & _M32


def _round32(acc: int, lane: int) -> int:
    acc = (acc + lane * _PRIME32_2) & _M32
    return (_rotl32(acc, 13) * _PRIME32_1) & _M32


def _u32le(data: bytes, i: int) -> int:
    return data[i] | (data[i + 1] << 8) | (data[i + 2] << 16) | (data[i + 3] << 24)


def xxh32(data: bytes, seed: int) -> int:
    """XXH32 of ``data`` (any length) with 32-bit ``seed``: the standard algorithm.

    Equal to ``xxhash.xxh32_intdigest(data, seed=seed)``; :func:`xxh32_u32` is this function
    for 4-byte keys. Used for the shard of a device (:func:`shard_index`).
    """
    n = len(data)
    i = 0
    if n >= 16:
        v1 = (seed + _PRIME32_1 + _PRIME32_2) & _M32
        v2 = (seed + _PRIME32_2) & _M32
        v3 = seed & _M32
        v4 = (seed - _PRIME32_1) & _M32
        while i + 16 <= n:
            v1 = _round32(v1, _u32le(data, i))
            v2 = _round32(v2, _u32le(data, i + 4))
            v3 = _round32(v3, _u32le(data, i + 8))
            v4 = _round32(v4, _u32le(data, i + 12))
            i += 16
        h = (_rotl32(v1, 1) + _rotl32(v2, 7) + _rotl32(v3, 12) + _rotl32(v4, 18)) & _M32
    else:
        h = (seed + _PRIME32_5) & _M32
    h = (h + n) & _M32
    while i + 4 <= n:
        h = (h + _u32le(data, i) * _PRIME32_3) & _M32
        h = (_rotl32(h, 17) * _PRIME32_4) & _M32
        i += 4
    while i < n:
        h = (h + data[i] * _PRIME32_5) & _M32
        h = (_rotl32(h, 11) * _PRIME32_1) & _M32
        i += 1
    h ^= h >> 15
    h = (h * _PRIME32_2) & _M32
    h ^= h >> 13
    h = (h * _PRIME32_3) & _M32
    h ^= h >> 16
    return h


def shard_index(device_id: bytes, seed: int, count: int) -> int:
    """The shard in ``[0, count)`` of the device whose id is ``device_id`` (its UTF-8 bytes)
    in a layout with ``seed`` and ``count`` shards: ``(XXH32(device_id, seed) * count) >> 32``
    (docs/protocol.md, "Sharded deployments")."""
    if count < 1:
        raise ValueError("count must be >= 1")
    return (xxh32(device_id, seed) * count) >> 32


def collision_bucket(key: int, seed: int, t: int) -> int:
    """Collision's hash H(y) in [0, t) of element key ``y`` (``2 j`` for j-, ``2 j + 1`` for j+).

    Multiply-shift range reduction of the 32-bit hash: ``(h * t) >> 32``.
    """
    return (xxh32_u32(key, seed) * t) >> 32


def coco_hash(j: int, seed: int, half: int) -> "tuple[int, bool]":
    """CoCo's pair of hashes for dimension ``j``: ``(H1(j), H2(j) > 0)``.

    One XXH32 per dimension: the low 31 bits give the bucket pair
    ``H1(j) = ((h & 0x7FFFFFFF) * half) >> 31`` in ``[0, half)`` and the top bit the sign
    ``H2(j) = +1`` if set, else ``-1``.
    """
    h = xxh32_u32(j, seed)
    return ((h & 0x7FFFFFFF) * half) >> 31, (h >> 31) == 1


def coco_position(pair: int, h2_positive: bool, sign: int, half: int) -> int:
    """Bucket of element ``j_b``: ``H(j_b) = H1(j) + [b H2(j) = +1] t/2`` (Algorithm 1)."""
    if (sign > 0) == h2_positive:
        return pair + half
    return pair


def _bits_for(n: int) -> int:
    # Number of bits needed to write n - 1 (0 for n == 1); int.bit_length is not on every port.
    k = 0
    m = n - 1
    while m > 0:
        m >>= 1
        k += 1
    return k


def randbelow(n: int, getrandbits: "GetRandBits") -> int:
    """Uniform integer in ``[0, n)`` by rejection from ``ceil(log2 n)`` random bits.

    Bits are drawn in chunks of at most 32, most significant chunk first; a draw ``>= n`` is
    rejected and drawn again. ``n == 1`` consumes no randomness.
    """
    if n < 1:
        raise ValueError("randbelow needs n >= 1, got %d" % n)
    k = _bits_for(n)
    while True:
        r = 0
        left = k
        while left > 0:
            take = 32 if left > 32 else left
            r = (r << take) | getrandbits(take)
            left -= take
        if r < n:
            return r


def check_sparse(keys: "list[int]", signs: "list[int]", d: int, s: int) -> None:
    """Validate a sparse ternary vector: ``s`` distinct keys in ``[0, d)``, signs +1/-1."""
    if len(keys) != s or len(signs) != s:
        raise ValueError(
            "expected exactly s=%d non-zero entries, got %d keys and %d signs"
            % (s, len(keys), len(signs))
        )
    seen: "set[int]" = set()
    for j, b in zip(keys, signs):
        if j < 0 or j >= d:
            raise ValueError("key %d is outside [0, %d)" % (j, d))
        if j in seen:
            raise ValueError("key %d appears twice" % j)
        if b != 1 and b != -1:
            raise ValueError("sign of key %d must be +1 or -1, got %r" % (j, b))
        seen.add(j)


def _nth_free(n: int, used_sorted: "list[int]") -> int:
    # The n-th (0-based) integer not in used_sorted, which is ascending without repeats.
    for u in used_sorted:
        if u <= n:
            n += 1
        else:
            break
    return n


def collision_omega(s: int, t: int, exp_eps_weight: int) -> int:
    """Integer normaliser of Collision: ``Omega = s E + (t - s) U`` (Definition 1)."""
    return s * exp_eps_weight + (t - s) * WEIGHT_UNIT


def coco_omega(s: int, t: int, exp_eps_weight: int) -> int:
    """Integer normaliser of CoCo: ``Omega = s (E + U) + (t - 2 s) U`` (ERRATA item 1)."""
    return s * (exp_eps_weight + WEIGHT_UNIT) + (t - 2 * s) * WEIGHT_UNIT


def randomise_collision(
    keys: "list[int]",
    signs: "list[int]",
    d: int,
    s: int,
    t: int,
    exp_eps_weight: int,
    seed: int,
    getrandbits: "GetRandBits",
) -> int:
    """One Collision report ``z`` in ``[0, t)`` for the sparse ternary input (keys, signs).

    Output law (Definition 1, in integer weights): every bucket hit by an element of the
    input has weight ``E``; the remaining ``Omega - k E`` (``k`` distinct hit buckets) is
    spread evenly over the ``t - k`` other buckets. Sampling, normative for test vectors:

    1. ``r = randbelow(Omega)``.
    2. If ``r < s E``: element ``i = r // E``; with ``c`` elements sharing its bucket, keep
       that bucket if ``c == 1`` or ``randbelow(c) == 0``.
    3. Otherwise return the ``randbelow(t - k)``-th free bucket in ascending order.

    The input is checked first (:func:`check_sparse`): exactly ``s`` distinct keys in
    ``[0, d)`` with signs +1/-1, since a different count would change ``Omega``.
    """
    check_sparse(keys, signs, d, s)
    buckets = [collision_bucket(2 * j + (1 if b > 0 else 0), seed, t) for j, b in zip(keys, signs)]
    r = randbelow(collision_omega(s, t, exp_eps_weight), getrandbits)
    if r < s * exp_eps_weight:
        v = buckets[r // exp_eps_weight]
        c = buckets.count(v)
        if c == 1 or randbelow(c, getrandbits) == 0:
            return v
    used = sorted(set(buckets))
    return _nth_free(randbelow(t - len(used), getrandbits), used)


def randomise_coco(
    keys: "list[int]",
    signs: "list[int]",
    d: int,
    s: int,
    t: int,
    exp_eps_weight: int,
    seed: int,
    getrandbits: "GetRandBits",
) -> int:
    """One CoCo report ``z`` in ``[0, t)`` for the sparse ternary input (keys, signs).

    Output law (Algorithm 1 with its random permutation averaged out): the ``t/2`` bucket
    pairs ``(k, k + t/2)``; the pair of each input dimension carries ``E + U``, split as ``E``
    on ``H(j_b)`` and ``U`` on its partner, where pairs shared by ``c`` dimensions take the
    split of one of them chosen uniformly (the last writer of a random order). The rest,
    ``Omega - m (E + U)`` for ``m`` distinct pairs, is spread evenly over the ``t - 2m``
    buckets of unused pairs. Sampling, normative for test vectors:

    1. ``r = randbelow(Omega)``.
    2. If ``r < s (E + U)``: entry ``i = r // (E + U)``, ``rem = r - i (E + U)``; with ``c``
       entries sharing its pair, keep the pair if ``c == 1`` or ``randbelow(c) == 0`` and
       return ``H(j_b)`` if ``rem < E``, else its partner.
    3. Otherwise draw ``q = randbelow(t - 2m)`` and with ``f = t/2 - m`` free pairs
       (ascending) return free pair ``q`` if ``q < f``, else free pair ``q - f`` plus ``t/2``.

    The input is checked first, as in :func:`randomise_collision`.
    """
    check_sparse(keys, signs, d, s)
    half = t // 2
    pairs: "list[int]" = []
    positions: "list[int]" = []
    for j, b in zip(keys, signs):
        pair, h2_positive = coco_hash(j, seed, half)
        pairs.append(pair)
        positions.append(coco_position(pair, h2_positive, b, half))
    weight_pair = exp_eps_weight + WEIGHT_UNIT
    r = randbelow(coco_omega(s, t, exp_eps_weight), getrandbits)
    if r < s * weight_pair:
        i = r // weight_pair
        c = pairs.count(pairs[i])
        if c == 1 or randbelow(c, getrandbits) == 0:
            if r - i * weight_pair < exp_eps_weight:
                return positions[i]
            return 2 * pairs[i] + half - positions[i]
    used = sorted(set(pairs))
    free_pairs = half - len(used)
    q = randbelow(2 * free_pairs, getrandbits)
    if q < free_pairs:
        return _nth_free(q, used)
    return _nth_free(q - free_pairs, used) + half


def _sample_without_replacement(n: int, k: int, getrandbits: "GetRandBits") -> "list[int]":
    # First k entries of a partial Fisher-Yates shuffle of range(n): a uniform k-subset, in
    # the order drawn.
    pool = list(range(n))
    for i in range(k):
        r = i + randbelow(n - i, getrandbits)
        pool[i], pool[r] = pool[r], pool[i]
    return pool[:k]


def _random_sign(v: float, getrandbits: "GetRandBits") -> int:
    # +1 with probability (1 + v) / 2 for v in [-1, 1], from 32 random bits.
    return 1 if getrandbits(32) < int((1.0 + v) * 2147483648.0) else -1


def _is_finite(v: float) -> bool:
    return v == v and v not in (float("inf"), float("-inf"))  # noqa: PLR0124 (NaN test)


def ternarise(
    values: "list[float]",
    lo: "list[float] | tuple[float, ...]",
    hi: "list[float] | tuple[float, ...]",
    s: int,
    getrandbits: "GetRandBits",
    clip: bool = False,
) -> "tuple[list[int], list[int]]":
    """Sensor vector -> ``s``-sparse ternary vector ``(keys, signs)`` (ERRATA item 6).

    Each reading is min-max normalised to ``v_j = 2 (x_j - lo_j) / (hi_j - lo_j) - 1`` in
    ``[-1, 1]``; ``s`` coordinates are drawn uniformly without replacement and each gets sign
    +1 with probability ``(1 + v_j) / 2``. Then ``E[x_j] = (s / d) v_j``: the aggregate mean of
    ``v_j`` is the estimated mean times ``d / s``. Readings outside ``[lo_j, hi_j]`` raise
    ``ValueError`` unless ``clip`` is set; NaN and infinities always raise.
    """
    d = len(values)
    if len(lo) != d or len(hi) != d:
        raise ValueError(
            "need one (lo, hi) range per channel: %d values, %d lo, %d hi" % (d, len(lo), len(hi))
        )
    if s < 1 or s > d:
        raise ValueError("s must be in [1, %d], got %d" % (d, s))
    normalised = []
    for j in range(d):
        x = values[j]
        if not _is_finite(x):
            raise ValueError("channel %d: reading %r is not a finite number" % (j, x))
        if not lo[j] < hi[j]:
            raise ValueError("channel %d: range [%r, %r] is empty" % (j, lo[j], hi[j]))
        if x < lo[j] or x > hi[j]:
            if not clip:
                raise ValueError(
                    "channel %d: reading %r is outside [%r, %r]" % (j, x, lo[j], hi[j])
                )
            x = lo[j] if x < lo[j] else hi[j]
        v = 2.0 * (x - lo[j]) / (hi[j] - lo[j]) - 1.0
        normalised.append(-1.0 if v < -1.0 else (1.0 if v > 1.0 else v))
    keys = _sample_without_replacement(d, s, getrandbits)
    signs = [_random_sign(normalised[j], getrandbits) for j in keys]
    return keys, signs


def pad_key_values(
    pairs: "list[tuple[int, float]]",
    d: int,
    s: int,
    getrandbits: "GetRandBits",
    sample_overflow: bool = True,
) -> "tuple[list[int], list[int]]":
    """Key-value data -> exactly ``s`` keys in ``[0, d + s)``, PCKV-style (ERRATA item 6).

    ``pairs`` is a list of ``(key, value)`` with distinct keys in ``[0, d)`` and values in
    ``[-1, 1]``. Each value becomes a sign, +1 with probability ``(1 + value) / 2``. With fewer
    than ``s`` pairs the vector is padded with dummy keys drawn uniformly from
    ``[d, d + s)`` with random signs; the mechanism then runs on ``d + s`` dimensions. With more
    than ``s`` pairs, ``s`` of them are sampled uniformly (``sample_overflow``; the estimated
    frequency of a key then counts holders of more than ``s`` keys with weight ``s / k``) or a
    ``ValueError`` is raised.
    """
    seen: "set[int]" = set()
    for key, value in pairs:
        if key < 0 or key >= d:
            raise ValueError("key %r is outside [0, %d)" % (key, d))
        if key in seen:
            raise ValueError("key %r appears twice" % key)
        if not _is_finite(value) or value < -1.0 or value > 1.0:
            raise ValueError("key %r: value %r is not in [-1, 1]" % (key, value))
        seen.add(key)
    k = len(pairs)
    if k > s:
        if not sample_overflow:
            raise ValueError("%d keys exceed s=%d" % (k, s))
        pairs = [pairs[i] for i in _sample_without_replacement(k, s, getrandbits)]
        k = s
    keys = [key for key, _ in pairs]
    signs = [_random_sign(value, getrandbits) for _, value in pairs]
    for i in _sample_without_replacement(s, s - k, getrandbits):
        keys.append(d + i)
        signs.append(1 if getrandbits(1) else -1)
    return keys, signs


def xxh32_stream(stream_seed: int) -> "GetRandBits":
    """Deterministic ``getrandbits`` for test vectors only (never for real reports).

    Word ``i`` of the stream is ``xxh32_u32(i, stream_seed)``; ``getrandbits(k)`` returns the
    top ``k`` bits of the next word.
    """
    state = [0]

    def getrandbits(k: int) -> int:
        word = xxh32_u32(state[0], stream_seed)
        state[0] += 1
        return word >> (32 - k)

    return getrandbits
