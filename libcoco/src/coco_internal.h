/* libcoco internals shared by its .c files; not part of the public API. */
#ifndef COCO_INTERNAL_H
#define COCO_INTERNAL_H

#include "coco.h"

#if COCO_MAX_S < 1 || COCO_MAX_S > 4096
#error "COCO_MAX_S must be in [1, 4096]"
#endif

#define COCO_U64(x) ((uint64_t)(x))
/* Every weight and random integer on the privacy path stays below 2^53 (protocol 2.3). */
#define COCO_OMEGA_LIMIT (COCO_U64(1) << 53)

/* getrandbits(k), 1 <= k <= 32: the top k bits of one fresh 32-bit word. */
int coco__getrandbits(const coco_rng *rng, unsigned k, uint32_t *out);

/* The sampler of protocol 6.2: k distinct values of [0, n) in draw order into out[0..k),
 * k <= COCO_MAX_S, k <= n. Keeps only the displaced pool positions (at most k). */
int coco__sample(uint32_t n, uint32_t k, const coco_rng *rng, uint32_t *out);

/* Test seam (tests/libcoco only, see coco_random.c): a build with
 * -DCOCO_TEST_RANDBELOW=fn takes every outcome of coco_randbelow from
 * int fn(uint64_t n, uint64_t *out) and the unit weight from uint64_t coco__test_unit. */

/* Big-endian loads and stores. */
static inline void coco__put32(uint8_t *p, uint32_t v) {
    p[0] = (uint8_t)(v >> 24);
    p[1] = (uint8_t)(v >> 16);
    p[2] = (uint8_t)(v >> 8);
    p[3] = (uint8_t)v;
}
static inline uint32_t coco__get32(const uint8_t *p) {
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) |
           (uint32_t)p[3];
}

/* The end of the JSON number that starts at p (NULL if none); *is_int when it has neither
 * a fraction nor an exponent. */
const uint8_t *coco__json_number(const uint8_t *p, const uint8_t *end, int *is_int);

/* Whether epsilon (in units of 2^-32, rounded up and down) matches E = exp_eps_weight. */
int coco__epsilon_matches(uint64_t e, uint64_t eps_up, uint64_t eps_down);

/* Appends the decimal digits of v at buf[*pos..] if they fit below cap; returns 0 or -1. */
int coco__put_decimal(char *buf, size_t cap, size_t *pos, uint64_t v);

/* SHA-256 of len bytes into out[32]. */
void coco__sha256(const uint8_t *data, size_t len, uint8_t out[32]);

#endif
