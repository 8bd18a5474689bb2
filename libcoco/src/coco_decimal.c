/* Decimal numbers without floating point: JSON's number grammar, a number's exact value in
 * units of 2^-32 (epsilon and delta of the announcement, the ledger's totals), and the check
 * of epsilon against E = exp_eps_weight with an integer logarithm. */
#include "coco_internal.h"

static int digit_at(const uint8_t *p, const uint8_t *end) { return p < end && *p >= '0' && *p <= '9'; }

const uint8_t *coco__json_number(const uint8_t *p, const uint8_t *end, int *is_int) {
    /* -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)? */
    *is_int = 1;
    if (p < end && *p == '-') {
        p++;
    }
    if (!digit_at(p, end)) {
        return NULL;
    }
    if (*p++ != '0') {
        while (digit_at(p, end)) {
            p++;
        }
    }
    if (p < end && *p == '.') {
        p++;
        *is_int = 0;
        if (!digit_at(p, end)) {
            return NULL;
        }
        while (digit_at(p, end)) {
            p++;
        }
    }
    if (p < end && (*p == 'e' || *p == 'E')) {
        p++;
        *is_int = 0;
        if (p < end && (*p == '+' || *p == '-')) {
            p++;
        }
        if (!digit_at(p, end)) {
            return NULL;
        }
        while (digit_at(p, end)) {
            p++;
        }
    }
    return p;
}

int coco_decimal_units(const char *text, size_t len, int round_up, uint64_t *units) {
    /* value = integer part (exact, < 2^31) + fraction. 2^-32 = 5^32 10^-32, so value 2^32
     * = (first 32 fractional digits) 2^32 + (the rest) 2^32, where the first term's
     * fractional part is a multiple of 5^-32 and the second is below 10^-32 2^32 = 5^-32:
     * the floor depends on the first 32 fractional digits only, and the value is a multiple
     * of 2^-32 only if all further digits are zero. Exact, in fixed memory. */
    uint8_t frac[32];
    const uint8_t *after;
    int is_int;
    uint64_t whole = 0;
    uint32_t fbits = 0;
    long exp10, dot = -1, ndigits = 0, pos, exp_value = 0;
    int sticky = 0, negative = 0, rest = 0, exp_negative = 0;
    size_t i, e;
    unsigned b;
    if (text == NULL || units == NULL) {
        return COCO_ERR_NULL;
    }
    after = coco__json_number((const uint8_t *)text, (const uint8_t *)text + len, &is_int);
    if (after != (const uint8_t *)text + len) {
        return COCO_ERR_ARG; /* not exactly one JSON number */
    }
    for (i = 0; i < sizeof frac; i++) {
        frac[i] = 0;
    }
    i = 0;
    if (text[0] == '-') {
        negative = 1;
        i = 1;
    }
    /* the exponent (clamped: beyond 10^6 everything is far out of range or below 2^-32) */
    for (e = i; e < len && text[e] != 'e' && text[e] != 'E'; e++) {
    }
    if (e < len) {
        size_t k = e + 1;
        if (text[k] == '+' || text[k] == '-') {
            exp_negative = text[k] == '-';
            k++;
        }
        for (; k < len; k++) {
            if (exp_value < 1000000L) {
                exp_value = exp_value * 10 + (text[k] - '0');
            }
        }
    }
    exp10 = exp_negative ? -exp_value : exp_value;
    len = e;
    /* digit number k (from 0) of the mantissa counts 10^(before - 1 - k + exp10), where
     * `before` is the number of digits before the point */
    for (pos = (long)i; pos < (long)len; pos++) {
        if (text[pos] == '.') {
            dot = ndigits;
        } else {
            ndigits++;
        }
    }
    if (dot < 0) {
        dot = ndigits;
    }
    for (pos = (long)i; pos < (long)len; pos++) {
        long k, place;
        int digit;
        if (text[pos] == '.') {
            continue;
        }
        digit = text[pos] - '0';
        if (digit == 0) {
            continue;
        }
        if (negative) {
            return COCO_ERR_ARG;
        }
        k = (pos - (long)i) - (pos > (long)i + dot ? 1 : 0);
        place = dot - 1 - k + exp10;
        if (place >= 10) {
            return COCO_ERR_ARG; /* >= 10^10 > 2^31 */
        }
        if (place >= 0) {
            uint64_t p = 1;
            long q;
            for (q = 0; q < place; q++) {
                p *= 10u;
            }
            whole += (uint64_t)digit * p;
        } else if (place >= -32) {
            frac[-place - 1] = (uint8_t)digit;
        } else {
            sticky = 1;
        }
    }
    if (whole >= (COCO_U64(1) << 31)) {
        return COCO_ERR_ARG;
    }
    /* floor(fraction 2^32): double the 32 decimal digits 32 times, collecting the carries */
    for (b = 0; b < 32; b++) {
        unsigned carry = 0;
        int k;
        for (k = 31; k >= 0; k--) {
            unsigned x = 2u * frac[k] + carry;
            carry = x >= 10u;
            frac[k] = (uint8_t)(x - 10u * carry);
        }
        fbits = (fbits << 1) | carry;
    }
    for (i = 0; i < sizeof frac; i++) {
        rest |= frac[i] != 0;
    }
    *units = (whole << 32) + fbits + (uint64_t)(round_up && (rest || sticky));
    return COCO_OK;
}

/* ln(x / 2^24) in units of 2^-32 for 2^24 < x < 2^53, within a few units: log2 bit by bit
 * (square, compare with 2, halve) on a 31-bit fraction, times ln 2. Integer arithmetic. */
static uint64_t ln_units(uint64_t x) {
    const uint64_t ln2 = 2977044472u; /* ln 2 * 2^32, rounded */
    uint32_t n = 0, frac = 0, bit;
    uint64_t y;
    while ((x >> n) > 1u) {
        n++; /* n = floor(log2 x) >= 24 */
    }
    y = n >= 31u ? x >> (n - 31u) : x << (31u - n); /* x / 2^n in [1, 2) as Q1.31 */
    for (bit = 0; bit < 32; bit++) {
        y = (y * y) >> 31; /* < 2^33 */
        frac <<= 1;
        if (y >= (COCO_U64(1) << 32)) {
            frac |= 1u;
            y >>= 1;
        }
    }
    return (uint64_t)(n - 24u) * ln2 + ((COCO_U64(frac) * ln2) >> 32);
}

/* The announced epsilon matches E = floor(e^epsilon 2^24): ln(E/U) <= epsilon <
 * ln((E+1)/U), checked with a slack of 2^-16 for the integer logarithm's error. The
 * fingerprint covers E but not epsilon, and the ledger charges epsilon: a device must not
 * charge less than the level its E realises. */
#define LN_SLACK (COCO_U64(1) << 16)
int coco__epsilon_matches(uint64_t e, uint64_t eps_up, uint64_t eps_down) {
    if (e <= COCO_UNIT_WEIGHT || e >= COCO_OMEGA_LIMIT - 1) {
        return 1; /* coco_spec_check() refuses this E itself */
    }
    return ln_units(e) <= eps_up + LN_SLACK && eps_down <= ln_units(e + 1) + LN_SLACK;
}
