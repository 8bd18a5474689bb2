/* Randomness (protocol section 4), spec checks (section 2) and the two randomisers
 * (section 5). Integer arithmetic only and no division: the quotient r / W of step 2 is
 * below s, so it is found by at most s - 1 subtractions. Written for small stack frames on
 * Cortex-M0 (few live 64-bit values). */
#include "coco_internal.h"

/* Rejection-sampling attempts before randbelow gives up on a stuck source. Each attempt is
 * accepted with probability above 1/2, so a working source never gets here (< 2^-128). */
#define COCO_MAX_ATTEMPTS 128

#ifdef COCO_TEST_RANDBELOW
/* Test builds only (tests/libcoco): every outcome of coco_randbelow comes from an
 * enumerating oracle, and the unit weight is the test's (small, so that randbelow(Omega) has
 * few outcomes), to compare the randomisers' output law with the exact one. */
int COCO_TEST_RANDBELOW(uint64_t n, uint64_t *out);
extern uint64_t coco__test_unit;
#define UNIT coco__test_unit
#else
#define UNIT COCO_U64(COCO_UNIT_WEIGHT)
#endif

int coco__getrandbits(const coco_rng *rng, unsigned k, uint32_t *out) {
    unsigned char b[4];
    if (rng == NULL || rng->fill == NULL) {
        return COCO_ERR_NULL;
    }
    if (rng->fill(rng->ctx, b, sizeof b) != 0) {
        return COCO_ERR_RNG;
    }
    *out = (((uint32_t)b[0] << 24) | ((uint32_t)b[1] << 16) | ((uint32_t)b[2] << 8) |
            (uint32_t)b[3]) >>
           (32u - k); /* 1 <= k <= 32 at every call site */
    return COCO_OK;
}

int coco_random_u32(const coco_rng *rng, uint32_t *out) {
    if (out == NULL) {
        return COCO_ERR_NULL;
    }
    return coco__getrandbits(rng, 32u, out);
}

#ifndef COCO_TEST_RANDBELOW
static unsigned bits32(uint32_t m) {
    unsigned k = 0;
    while (m > 0) {
        m >>= 1;
        k++;
    }
    return k;
}
#endif

int coco_randbelow(const coco_rng *rng, uint64_t n, uint64_t *out) {
#ifndef COCO_TEST_RANDBELOW
    unsigned k;
    int attempt;
#endif
    if (rng == NULL || rng->fill == NULL || out == NULL) {
        return COCO_ERR_NULL;
    }
    if (n == 0) {
        return COCO_ERR_ARG;
    }
#ifdef COCO_TEST_RANDBELOW
    return COCO_TEST_RANDBELOW(n, out);
#else
    /* k = bits of n - 1; at most two chunks: 32 bits, then the other k - 32 (protocol 4.2) */
    k = (n - 1) >> 32 ? 32u + bits32((uint32_t)((n - 1) >> 32)) : bits32((uint32_t)(n - 1));
    if (k == 0) {
        *out = 0; /* n == 1 draws nothing */
        return COCO_OK;
    }
    for (attempt = 0; attempt < COCO_MAX_ATTEMPTS; attempt++) {
        uint32_t first, second = 0;
        uint64_t r;
        int rc = coco__getrandbits(rng, k > 32u ? 32u : k, &first);
        if (rc == COCO_OK && k > 32u) {
            rc = coco__getrandbits(rng, k - 32u, &second);
        }
        if (rc != COCO_OK) {
            return rc;
        }
        r = k > 32u ? ((uint64_t)first << (k - 32u)) | second : first;
        if (r < n) {
            *out = r;
            return COCO_OK;
        }
    }
    return COCO_ERR_RNG;
#endif
}

int coco_spec_check(const coco_spec *spec) {
    const uint64_t unit = UNIT;
    uint64_t e;
    if (spec == NULL) {
        return COCO_ERR_NULL;
    }
    if (spec->mechanism != COCO_COCO && spec->mechanism != COCO_COLLISION) {
        return COCO_ERR_SPEC_MECHANISM;
    }
    if (spec->hash_version != COCO_HASH_VERSION) {
        return COCO_ERR_SPEC_HASH_VERSION;
    }
    if (spec->d < 1u || spec->d > (1u << 30)) {
        return COCO_ERR_SPEC_D;
    }
    if (spec->s < 1u || spec->s > spec->d) {
        return COCO_ERR_SPEC_S;
    }
    if (spec->t > 65535u) {
        return COCO_ERR_SPEC_T;
    }
    if (spec->mechanism == COCO_COCO) {
        if ((spec->t & 1u) != 0 || COCO_U64(spec->t) < 2 * COCO_U64(spec->s) + 2) {
            return COCO_ERR_SPEC_T;
        }
    } else if (COCO_U64(spec->t) < COCO_U64(spec->s) + 1) {
        return COCO_ERR_SPEC_T;
    }
    e = spec->exp_eps_weight;
    /* E > U, and Omega = s E + (t - s) U < 2^53 (the same for both mechanisms), without
     * overflow or division: here s < t <= 65535, so s (E >> 32) < 2^21 bounds s E below
     * 2^54, which a uint64_t holds, before the sum is compared. */
    if (unit < 1 || unit > COCO_UNIT_WEIGHT || e <= unit || e >= COCO_OMEGA_LIMIT ||
        COCO_U64(spec->s) * (e >> 32) >= (COCO_U64(1) << 21) ||
        COCO_U64(spec->s) * e + COCO_U64(spec->t - spec->s) * unit >= COCO_OMEGA_LIMIT) {
        return COCO_ERR_SPEC_WEIGHT;
    }
    if (spec->s > COCO_MAX_S) {
        return COCO_ERR_SPEC_S_MAX;
    }
    return COCO_OK;
}

int coco_check_input(const coco_spec *spec, const uint32_t *keys, const int8_t *signs,
                     uint32_t n) {
    uint32_t i, j;
    if (spec == NULL || keys == NULL || signs == NULL) {
        return COCO_ERR_NULL;
    }
    if (n != spec->s) {
        return COCO_ERR_INPUT;
    }
    for (i = 0; i < n; i++) {
        if (keys[i] >= spec->d || (signs[i] != 1 && signs[i] != -1)) {
            return COCO_ERR_INPUT;
        }
        for (j = 0; j < i; j++) {
            if (keys[j] == keys[i]) {
                return COCO_ERR_INPUT;
            }
        }
    }
    return COCO_OK;
}

/* The q-th (0-based) integer not among the distinct values v[i] & mask (protocol 4.3),
 * walking the distinct values in ascending order without a sorted copy. */
static uint32_t nth_free(uint32_t q, const uint16_t *v, uint32_t s, uint16_t mask) {
    uint32_t lower = 0; /* the next used value is the smallest one >= lower */
    for (;;) {
        uint32_t best = 0x10000u, i;
        for (i = 0; i < s; i++) {
            uint32_t x = v[i] & mask;
            if (x >= lower && x < best) {
                best = x;
            }
        }
        if (best == 0x10000u || best > q) {
            return q;
        }
        q++;
        lower = best + 1;
    }
}

/* The number of distinct values among v[i] & mask. */
static uint32_t distinct(const uint16_t *v, uint32_t s, uint16_t mask) {
    uint32_t k = 0, i, j;
    for (i = 0; i < s; i++) {
        uint32_t first = 1;
        for (j = 0; j < i && first; j++) {
            first = (v[j] & mask) != (v[i] & mask);
        }
        k += first;
    }
    return k;
}

/* Steps 1-3 of protocol 5.2 (Collision) and 5.4 (CoCo) on the entries' hashes v[0..s).
 * Collision: v[i] is entry i's bucket; W = E per entry; step 3 picks one of the t - k free
 * buckets. CoCo: v[i] is entry i's pair (15 bits) with bit 15 set when H(j_b) is the upper
 * bucket of the pair; W = E + U per entry (E on H(j_b), U on its partner); step 3 picks one
 * of the 2 f buckets of the f = t/2 - m free pairs, lower buckets first. */
static int sample(const coco_spec *spec, const uint16_t *v, const coco_rng *rng, uint16_t *z) {
    const int coco = spec->mechanism == COCO_COCO;
    const uint32_t s = spec->s, half = spec->t / 2u;
    const uint16_t mask = coco ? 0x7FFFu : 0xFFFFu;
    const uint64_t e = spec->exp_eps_weight, w = coco ? e + UNIT : e;
    uint64_t r;
    uint32_t free_slots;
    int rc = coco_randbelow(rng, s * w + (spec->t - (coco ? 2u : 1u) * s) * UNIT, &r); /* 1 */
    if (rc != COCO_OK) {
        return rc;
    }
    if (r < s * w) { /* step 2: entry i = r / W, r becomes r - i W */
        uint32_t i = 0, c = 0, k;
        uint64_t keep = 0;
        while (r >= w) {
            r -= w;
            i++;
        }
        for (k = 0; k < s; k++) {
            c += (uint32_t)((v[k] & mask) == (v[i] & mask));
        }
        if (c > 1) { /* the keep test draws only when entries share the bucket (pair) */
            rc = coco_randbelow(rng, c, &keep);
            if (rc != COCO_OK) {
                return rc;
            }
        }
        if (keep == 0) {
            if (!coco) {
                *z = v[i];
            } else {
                uint32_t pair = v[i] & 0x7FFFu, pos = pair + ((v[i] & 0x8000u) ? half : 0u);
                *z = (uint16_t)(r < e ? pos : 2u * pair + half - pos);
            }
            return COCO_OK;
        }
    }
    /* step 3: uniformly one of the free buckets (Collision) or free pairs' buckets (CoCo) */
    free_slots = (coco ? half : spec->t) - distinct(v, s, mask);
    rc = coco_randbelow(rng, (coco ? 2u : 1u) * (uint64_t)free_slots, &r);
    if (rc == COCO_OK) {
        uint32_t q = (uint32_t)r, upper = q >= free_slots;
        *z = (uint16_t)(nth_free(upper ? q - free_slots : q, v, s, mask) + (upper ? half : 0u));
    }
    return rc;
}

int coco_randomise(const coco_spec *spec, const uint32_t *keys, const int8_t *signs,
                   uint32_t n, uint32_t seed, const coco_rng *rng, uint16_t *z) {
    uint16_t v[COCO_MAX_S];
    uint32_t i;
    int rc;
    if (z == NULL || rng == NULL || rng->fill == NULL) {
        return COCO_ERR_NULL;
    }
    rc = coco_spec_check(spec);
    if (rc == COCO_OK) {
        rc = coco_check_input(spec, keys, signs, n);
    }
    if (rc != COCO_OK) {
        return rc;
    }
    for (i = 0; i < n; i++) {
        if (spec->mechanism == COCO_COLLISION) { /* element key: j- -> 2j, j+ -> 2j + 1 */
            v[i] = (uint16_t)coco_collision_bucket(2u * keys[i] + (signs[i] > 0), seed, spec->t);
        } else {
            uint32_t pair;
            int h2;
            coco_coco_hash(keys[i], seed, spec->t / 2u, &pair, &h2);
            v[i] = (uint16_t)(pair | ((signs[i] > 0) == (h2 > 0) ? 0x8000u : 0u));
        }
    }
    return sample(spec, v, rng, z);
}

int coco_make_report(const coco_spec *spec, uint32_t round, const uint32_t *keys,
                     const int8_t *signs, uint32_t n, const coco_rng *rng,
                     coco_ledger *ledger, uint64_t cost_units,
                     uint8_t out[COCO_REPORT_SIZE]) {
    uint32_t seed;
    uint16_t z;
    int rc;
    if (ledger == NULL || out == NULL || rng == NULL || rng->fill == NULL) {
        return COCO_ERR_NULL;
    }
    rc = coco_spec_check(spec);
    if (rc == COCO_OK) {
        rc = coco_check_input(spec, keys, signs, n);
    }
    if (rc == COCO_OK) {
        rc = coco_ledger_charge(ledger, cost_units); /* durable before anything is drawn */
    }
    if (rc == COCO_OK) {
        rc = coco_random_u32(rng, &seed);
    }
    if (rc == COCO_OK) {
        rc = coco_randomise(spec, keys, signs, n, seed, rng, &z);
    }
    if (rc == COCO_OK) {
        rc = coco_encode_report(spec->fingerprint, round, seed, z, out);
    }
    return rc;
}

int coco_participates(const coco_announcement *a, const coco_rng *rng, int *yes) {
    uint32_t word;
    int rc;
    if (a == NULL || rng == NULL || rng->fill == NULL || yes == NULL) {
        return COCO_ERR_NULL;
    }
    if (a->participation_units >= (COCO_U64(1) << 32)) {
        *yes = 1; /* q = 1: no draw */
        return COCO_OK;
    }
    rc = coco_random_u32(rng, &word);
    if (rc == COCO_OK) {
        *yes = word < a->participation_units;
    }
    return rc;
}
