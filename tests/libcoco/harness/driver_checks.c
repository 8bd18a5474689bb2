/* Checks beyond the protocol's functions: every public entry point with NULL arguments,
 * failing and stuck random sources, randbelow fed every bit pattern, the exact output law by
 * enumerating every draw (builds with -DCOCO_TEST_RANDBELOW=driver_oracle) and the
 * benchmarks of the emulated boards. */
#include "driver.h"

/* Random sources that fail. */
static int fail_fill(void *ctx, unsigned char *buf, size_t len) {
    (void)ctx;
    (void)buf;
    (void)len;
    return 1;
}

static int ones_fill(void *ctx, unsigned char *buf, size_t len) {
    size_t i;
    (void)ctx;
    for (i = 0; i < len; i++) {
        buf[i] = 0xFF;
    }
    return 0;
}

/* A source that delivers value[0], value[1], then zeros. */
static struct {
    uint32_t value[2];
    uint32_t used;
} words;

static int script_fill(void *ctx, unsigned char *buf, size_t len) {
    uint32_t w = words.used < 2 ? words.value[words.used] : 0;
    size_t i;
    (void)ctx;
    words.used++;
    for (i = 0; i < len; i++) {
        buf[i] = (unsigned char)(w >> (24 - 8 * (i % 4)));
    }
    return 0;
}

/* --- exact law by enumeration (builds with -DCOCO_TEST_RANDBELOW=driver_oracle) -------- */

#define LAW_DEPTH 8
static struct {
    uint64_t value[LAW_DEPTH];
    uint64_t n[LAW_DEPTH];
    unsigned len, used;
    int overflow;
} script;

int driver_oracle(uint64_t n, uint64_t *out);
int driver_oracle(uint64_t n, uint64_t *out) {
    if (script.used < script.len) {
        *out = script.value[script.used];
        script.n[script.used++] = n;
        return *out < n ? COCO_OK : COCO_ERR_ARG;
    }
    if (script.used < LAW_DEPTH) {
        script.n[script.used] = n; /* the next draw to enumerate */
    } else {
        script.overflow = 1;
    }
    return COCO_ERR_RNG; /* stops the randomiser here */
}

#ifdef COCO_TEST_RANDBELOW
uint64_t coco__test_unit = COCO_UNIT_WEIGHT;
#endif

/* Every path of randbelow outcomes, depth first: one "leaf z denominator" line per path,
 * where denominator is the product of the n of its draws (its probability is 1 / that). */
static void law_paths(uint64_t unit, uint32_t seed, uint32_t n) {
    uint16_t z;
    int rc;
    script.used = 0;
#ifdef COCO_TEST_RANDBELOW
    coco__test_unit = unit;
#else
    (void)unit;
#endif
    rc = coco_randomise(&spec, keys, signs, n, seed, &rng, &z);
    if (rc == COCO_OK && script.used == script.len) {
        uint64_t denominator = 1;
        unsigned i;
        for (i = 0; i < script.len; i++) {
            denominator *= script.n[i];
        }
        out_word("leaf");
        out_u64(z);
        out_u64(denominator);
        out_end();
    } else if (rc == COCO_ERR_RNG && script.used == script.len && !script.overflow) {
        uint64_t v, count = script.n[script.len];
        script.len++;
        for (v = 0; v < count; v++) {
            script.value[script.len - 1] = v;
            law_paths(unit, seed, n);
        }
        script.len--;
    } else {
        out_err(rc == COCO_OK ? COCO_ERR_ARG : rc);
        out_end();
    }
}

void cmd_nulls(void) {
    /* Every public entry point with a NULL where a pointer is required. */
    uint8_t report[COCO_REPORT_SIZE];
    uint16_t z;
    uint32_t u;
    uint64_t w;
    int h2;
    coco_report r;
    coco_batch_header bh;
    const coco_shard_layout *layout;
    coco_rng null_rng = {0, 0};
    out_word(coco_strerror(coco_spec_check(0)));
    out_word(coco_strerror(coco_spec_fingerprint(0, &u)));
    out_word(coco_strerror(coco_spec_fingerprint(&spec, 0)));
    out_word(coco_strerror(coco_check_input(&spec, 0, signs, spec.s)));
    out_word(coco_strerror(coco_randomise(&spec, keys, signs, spec.s, 0, 0, &z)));
    out_word(coco_strerror(coco_randomise(&spec, keys, signs, spec.s, 0, &null_rng, &z)));
    out_word(coco_strerror(coco_randomise(&spec, keys, signs, spec.s, 0, &rng, 0)));
    out_word(coco_strerror(coco_randomise(&spec, 0, signs, spec.s, 0, &rng, &z)));
    out_word(coco_strerror(coco_random_u32(&null_rng, &u)));
    out_word(coco_strerror(coco_randbelow(&rng, 5, 0)));
    out_word(coco_strerror(coco_ternarise(0, dlo, dhi, 1, 1, 0, &rng, keys, signs)));
    out_word(coco_strerror(coco_ternarise(dv, dlo, dhi, 1, 1, 0, &null_rng, keys, signs)));
    out_word(coco_strerror(coco_ternarise_int(iv, ilo, ihi, 1, 1, 0, &rng, keys, 0)));
    out_word(coco_strerror(coco_pad_key_values(0, dv, 1, 5, 2, 1, &rng, keys, signs)));
    out_word(coco_strerror(coco_encode_report(1, 1, 1, 1, 0)));
    out_word(coco_strerror(coco_decode_report(0, 16, &r)));
    out_word(coco_strerror(coco_decode_batch_header(bytes, 30, 0)));
    out_word(coco_strerror(coco_batch_record(bytes, 30, 0, 0, &z)));
    out_word(coco_strerror(coco_round_of(1800000000, 60, 0)));
    out_word(coco_strerror(coco_seconds_to_next_round(1800000000, 60, 0)));
    out_word(coco_strerror(coco_announcement_parse(0, 3, &announcement)));
    out_word(coco_strerror(coco_announcement_parse(bytes, 3, 0)));
    out_word(coco_strerror(coco_decimal_units(0, 1, 1, &w)));
    out_word(coco_strerror(coco_layout_for_round(0, 1, &layout)));
    out_word(coco_strerror(coco_shard_label(0, 0, 0, 8)));
    out_word(coco_strerror(coco_spec_topic(0, topic_buf, sizeof topic_buf)));
    out_word(coco_strerror(coco_ingress_topic("dep", 0, 0, topic_buf, sizeof topic_buf)));
    out_word(coco_strerror(coco_ingress_topic("dep", "dev", 0, 0, 8)));
    out_word(coco_strerror(
        coco_device_ingress_topic(0, "dep", "dev", 1, topic_buf, sizeof topic_buf)));
    out_word(coco_strerror(coco_ledger_open(0, &mem_io, 1)));
    out_word(coco_strerror(coco_ledger_open(&ledger, 0, 1)));
    out_word(coco_strerror(coco_ledger_charge(0, 1)));
    out_word(coco_strerror(coco_make_report(&spec, 1, keys, signs, spec.s, &rng, 0, 1, report)));
    out_word(coco_strerror(coco_test_stream_fill(0, report, 4) == 0 ? COCO_OK : COCO_ERR_NULL));
    /* functions that return values rather than codes accept NULL where documented */
    coco_coco_hash(1, 2, 3, 0, &h2);
    coco_coco_hash(1, 2, 3, &u, 0);
    out_u64(coco_xxh32(0, 5, 0));
    out_u64(coco_shard_index(0, 0, 0, 4));
    (void)bh;
}

void cmd_rngfail(int stuck) {
    /* A source that fails (or repeats all-ones forever): every drawing function refuses. */
    coco_rng bad = {stuck ? ones_fill : fail_fill, 0};
    uint8_t report[COCO_REPORT_SIZE];
    uint16_t z;
    uint32_t u, i;
    uint64_t w;
    for (i = 0; i < spec.s && i < DRIVER_MAX_ITEMS; i++) { /* a valid input */
        keys[i] = i;
        signs[i] = 1;
    }
    dv[0] = 0.5;
    dlo[0] = 0.0;
    dhi[0] = 1.0;
    out_word(coco_strerror(coco_randbelow(&bad, 3, &w)));
    out_word(coco_strerror(coco_random_u32(&bad, &u)));
    out_word(coco_strerror(coco_randomise(&spec, keys, signs, spec.s, 7, &bad, &z)));
    out_word(coco_strerror(coco_make_report(&spec, 1, keys, signs, spec.s, &bad, &ledger, 1, report)));
    out_word(coco_strerror(coco_ternarise(dv, dlo, dhi, 1, 1, 0, &bad, keys, signs)));
}

/* One measured operation of `bench`: returns a status. */
static int bench_once(const char *kind, size_t kind_len, uint32_t n, size_t ann_len) {
    static const uint32_t round = 29401920;
    uint8_t report[COCO_REPORT_SIZE];
    uint16_t z;
    uint32_t seed;
    int rc;
    if (word_is(kind, kind_len, "report")) { /* seed, randomise, encode */
        rc = coco_random_u32(&rng, &seed);
        if (rc == COCO_OK) {
            rc = coco_randomise(&spec, keys, signs, n, seed, &rng, &z);
        }
        if (rc == COCO_OK) {
            rc = coco_encode_report(spec.fingerprint, round, seed, z, report);
        }
        return rc;
    }
    if (word_is(kind, kind_len, "make")) { /* the same with the ledger charge */
        return coco_make_report(&spec, round, keys, signs, n, &rng, &ledger, 1, report);
    }
    if (word_is(kind, kind_len, "tern")) {
        return coco_ternarise(dv, dlo, dhi, spec.d, spec.s, 0, &rng, keys, signs);
    }
    if (word_is(kind, kind_len, "ternint")) {
        return coco_ternarise_int(iv, ilo, ihi, spec.d, spec.s, 0, &rng, keys, signs);
    }
    if (word_is(kind, kind_len, "ann")) {
        return coco_announcement_parse(bytes, ann_len, &announcement);
    }
    if (word_is(kind, kind_len, "fingerprint")) {
        return coco_spec_verify_fingerprint(&spec);
    }
    return COCO_ERR_ARG;
}

void cmd_bench(line_t *l) {
    /* bench <kind> <repeats> [n keys signs | hex]: SysTick ticks for `repeats` operations
     * (the firmware prints how many instructions a tick is) and the stack they used. */
    const char *kind;
    size_t kind_len, ann_len = 0;
    uint32_t repeats, n = 0, i, before, after, top, used;
    token(l, &kind, &kind_len);
    repeats = get_u32(l);
    if (word_is(kind, kind_len, "report") || word_is(kind, kind_len, "make")) {
        n = get_sparse(l);
    } else if (word_is(kind, kind_len, "ann")) {
        ann_len = get_hex(l, bytes, sizeof bytes);
    }
    if (l->bad || repeats == 0) {
        l->bad = 1;
        return;
    }
    for (i = 0; i < spec.d && i < DRIVER_MAX_ITEMS; i++) { /* readings for the encoders */
        dv[i] = (double)i / (double)spec.d;
        dlo[i] = 0.0;
        dhi[i] = 1.0;
        iv[i] = (int32_t)i;
        ilo[i] = 0;
        ihi[i] = 4095;
    }
    if (!plat_has_bench()) {
        out_word("-");
        return;
    }
    start_stream(1);
    top = plat_sp();
    plat_stack_paint();
    before = plat_instructions();
    for (i = 0; i < repeats; i++) {
        int rc = bench_once(kind, kind_len, n, ann_len);
        if (rc != COCO_OK) {
            out_err(rc);
            return;
        }
    }
    after = plat_instructions();
    used = plat_stack_used(top);
    out_u64((after - before) & 0x00FFFFFFu);
    out_u64(used);
}

void cmd_patterns(line_t *l) {
    /* randbelow(n) fed every k-bit pattern, then zeros: value and words used */
    uint64_t bound = get_u64(l), pattern, m;
    unsigned k = 0;
    for (m = bound - 1; bound > 0 && m > 0; m >>= 1) {
        k++;
    }
    if (k == 0 || k > 16) {
        l->bad = 1;
    }
    for (pattern = 0; !l->bad && pattern < ((uint64_t)1 << k); pattern++) {
        uint64_t r;
        int rc;
        coco_rng scripted = {script_fill, 0};
        words.value[0] = (uint32_t)(pattern << (32 - k)); /* then zeros */
        words.value[1] = 0;
        words.used = 0;
        rc = coco_randbelow(&scripted, bound, &r);
        out_end();
        out_str("> patterns:");
        if (rc != COCO_OK) {
            out_err(rc);
        } else {
            out_u64(pattern);
            out_u64(r);
            out_u64(words.used);
        }
    }
}

void cmd_law(line_t *l) {
    uint64_t unit = get_u64(l);
    uint32_t seed = get_u32(l), count = get_sparse(l);
#ifndef COCO_TEST_RANDBELOW
    l->bad = 1; /* only in builds whose randbelow is the enumerating oracle */
#endif
    if (!l->bad) {
        script.len = 0;
        script.overflow = 0;
        out_end();
        law_paths(unit, seed, count);
        out_str("> law: end");
    }
}
