/* Encoders (protocol section 6): sensor readings and key-value data -> s-sparse ternary
 * vectors. The only floating point in libcoco is here, in the reading -> sign probability
 * step of coco_ternarise and coco_pad_key_values (IEEE double, as the reference computes it);
 * coco_ternarise_int does the same for integer readings with integers only.
 *
 * Bit-exact doubles need each operation rounded on its own: a compiler that fuses a multiply
 * and an add into one FMA rounds once instead of twice. GCC does so by default in its GNU C
 * modes (-std=gnu*, Arduino's) wherever the FPU has an FMA: a Cortex-M7 with a double FPU,
 * ARMv8, x86-64 with -mfma. The library's builds pass -ffp-contract=off, but the arithmetic
 * does not depend on it: no product here feeds a sum or a difference (2 (x - lo) is divided,
 * (1 + v) multiplied by a power of two), so there is nothing to fuse, and
 * tests/libcoco/test_build_systems.py checks that every source compiles to the same
 * instructions with contraction on and off. Clang, which fuses within an expression by
 * default, is told the standard's way as well; GCC ignores that pragma (with a warning). */
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#endif
#include "coco_internal.h"

int coco__sample(uint32_t n, uint32_t k, const coco_rng *rng, uint32_t *out) {
    /* Partial Fisher-Yates over the virtual pool [0, n): only displaced positions are kept
     * (pos[m] holds val[m]); position i is final once drawn, so at most k entries. */
    uint32_t pos[COCO_MAX_S], val[COCO_MAX_S];
    uint32_t used = 0, i, m;
    if (k > n || k > COCO_MAX_S) {
        return COCO_ERR_ARG;
    }
    for (i = 0; i < k; i++) {
        uint64_t r;
        uint32_t p, vi = i, vp;
        int rc = coco_randbelow(rng, COCO_U64(n - i), &r);
        if (rc != COCO_OK) {
            return rc;
        }
        p = i + (uint32_t)r;
        vp = p;
        for (m = 0; m < used; m++) {
            if (pos[m] == i) {
                vi = val[m];
            }
            if (pos[m] == p) {
                vp = val[m];
            }
        }
        out[i] = vp; /* swap pool[i] and pool[p]; pool[i] is final */
        if (p != i) {
            for (m = 0; m < used && pos[m] != p; m++) {
            }
            if (m == used) {
                pos[used++] = p;
            }
            val[m] = vi;
        }
    }
    return COCO_OK;
}

static int is_finite(double x) { return x == x && x - x == 0.0; }

/* random_sign(v) of protocol 6.1: +1 with probability floor((1 + v) 2^31) / 2^32; one 32-bit
 * draw in every case. v is finite and in [-1, 1], so the threshold is in [0, 2^32] and its
 * conversion to uint64_t is defined. */
static int random_sign(double v, const coco_rng *rng, int8_t *sign) {
    uint64_t threshold = (uint64_t)((1.0 + v) * 2147483648.0);
    uint32_t bits;
    int rc = coco__getrandbits(rng, 32u, &bits);
    if (rc == COCO_OK) {
        *sign = (int8_t)(COCO_U64(bits) < threshold ? 1 : -1);
    }
    return rc;
}

static int check_sizes(uint32_t channels, uint32_t s, const coco_rng *rng, const void *keys,
                       const void *signs) {
    if (rng == NULL || rng->fill == NULL || keys == NULL || signs == NULL) {
        return COCO_ERR_NULL;
    }
    if (channels < 1u) {
        return COCO_ERR_SPEC_D;
    }
    if (s < 1u || s > channels) {
        return COCO_ERR_SPEC_S;
    }
    if (s > COCO_MAX_S) {
        return COCO_ERR_SPEC_S_MAX;
    }
    return COCO_OK;
}

int coco_ternarise(const double *values, const double *lo, const double *hi,
                   uint32_t channels, uint32_t s, int clip, const coco_rng *rng,
                   uint32_t *keys, int8_t *signs) {
    uint32_t i;
    int rc;
    if (values == NULL || lo == NULL || hi == NULL) {
        return COCO_ERR_NULL;
    }
    rc = check_sizes(channels, s, rng, keys, signs);
    for (i = 0; rc == COCO_OK && i < channels; i++) { /* validate everything before drawing */
        double x = values[i];
        if (!is_finite(x)) {
            rc = COCO_ERR_READING;
        } else if (!(lo[i] < hi[i]) || !is_finite(hi[i] - lo[i])) {
            rc = COCO_ERR_RANGE; /* also a span too wide to normalise in double */
        } else if ((x < lo[i] || x > hi[i]) && !clip) {
            rc = COCO_ERR_READING;
        }
    }
    if (rc == COCO_OK) {
        rc = coco__sample(channels, s, rng, keys);
    }
    for (i = 0; rc == COCO_OK && i < s; i++) {
        uint32_t j = keys[i];
        double x = values[j], v;
        if (x < lo[j]) {
            x = lo[j];
        } else if (x > hi[j]) {
            x = hi[j];
        }
        v = 2.0 * (x - lo[j]) / (hi[j] - lo[j]) - 1.0; /* the reference's order of operations */
        v = v < -1.0 ? -1.0 : (v > 1.0 ? 1.0 : v);
        rc = random_sign(v, rng, &signs[i]);
    }
    return rc;
}

int coco_ternarise_int(const int32_t *values, const int32_t *lo, const int32_t *hi,
                       uint32_t channels, uint32_t s, int clip, const coco_rng *rng,
                       uint32_t *keys, int8_t *signs) {
    uint32_t i;
    int rc;
    if (values == NULL || lo == NULL || hi == NULL) {
        return COCO_ERR_NULL;
    }
    rc = check_sizes(channels, s, rng, keys, signs);
    for (i = 0; rc == COCO_OK && i < channels; i++) {
        if (!(lo[i] < hi[i])) {
            rc = COCO_ERR_RANGE;
        } else if ((values[i] < lo[i] || values[i] > hi[i]) && !clip) {
            rc = COCO_ERR_READING;
        }
    }
    if (rc == COCO_OK) {
        rc = coco__sample(channels, s, rng, keys);
    }
    for (i = 0; rc == COCO_OK && i < s; i++) {
        uint32_t j = keys[i], bits;
        int64_t x = values[j] < lo[j] ? lo[j] : (values[j] > hi[j] ? hi[j] : values[j]);
        uint64_t a = (uint64_t)(x - lo[j]);     /* in [0, span] */
        uint64_t span = (uint64_t)((int64_t)hi[j] - lo[j]); /* in [1, 2^32 - 1] */
        rc = coco__getrandbits(rng, 32u, &bits);
        /* bits < floor(2^32 a / span)  <=>  (bits + 1) span <= 2^32 a: no division, and both
         * sides stay below 2^64. */
        if (rc == COCO_OK) {
            signs[i] = (int8_t)((COCO_U64(bits) + 1) * span <= (a << 32) ? 1 : -1);
        }
    }
    return rc;
}

int coco_pad_key_values(const uint32_t *pair_keys, const double *pair_values, uint32_t k,
                        uint32_t d, uint32_t s, int sample_overflow, const coco_rng *rng,
                        uint32_t *keys, int8_t *signs) {
    uint32_t i, j, kept;
    int rc;
    if ((k > 0 && (pair_keys == NULL || pair_values == NULL)) || rng == NULL ||
        rng->fill == NULL || keys == NULL || signs == NULL) {
        return COCO_ERR_NULL;
    }
    if (d < 1u || d > (1u << 30) || s > (1u << 30) - d) {
        return COCO_ERR_SPEC_D; /* the mechanism runs on d + s <= 2^30 dimensions */
    }
    if (s < 1u) {
        return COCO_ERR_SPEC_S;
    }
    if (s > COCO_MAX_S) {
        return COCO_ERR_SPEC_S_MAX;
    }
    for (i = 0; i < k; i++) { /* validate first: keys distinct in [0, d), values in [-1, 1] */
        double v = pair_values[i];
        if (pair_keys[i] >= d) {
            return COCO_ERR_INPUT;
        }
        for (j = 0; j < i; j++) {
            if (pair_keys[j] == pair_keys[i]) {
                return COCO_ERR_INPUT;
            }
        }
        if (!is_finite(v) || v < -1.0 || v > 1.0) {
            return COCO_ERR_READING;
        }
    }
    if (k > s) { /* overflow: keep a uniform s-subset of the pairs, in draw order */
        if (!sample_overflow) {
            return COCO_ERR_OVERFLOW;
        }
        rc = coco__sample(k, s, rng, keys);
        if (rc != COCO_OK) {
            return rc;
        }
        kept = s;
    } else {
        for (i = 0; i < k; i++) {
            keys[i] = i;
        }
        kept = k;
    }
    for (i = 0; i < kept; i++) { /* keys[i] holds a pair's index until here */
        uint32_t p = keys[i];
        rc = random_sign(pair_values[p], rng, &signs[i]);
        if (rc != COCO_OK) {
            return rc;
        }
        keys[i] = pair_keys[p];
    }
    rc = coco__sample(s, s - kept, rng, keys + kept); /* padding with dummy keys [d, d + s) */
    for (i = kept; rc == COCO_OK && i < s; i++) {
        uint32_t bit;
        keys[i] += d;
        rc = coco__getrandbits(rng, 1u, &bit);
        if (rc == COCO_OK) {
            signs[i] = (int8_t)(bit ? 1 : -1);
        }
    }
    return rc;
}
