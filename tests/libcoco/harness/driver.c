/* A line-oriented command interpreter over libcoco, the same code on the host (commands on
 * stdin) and on an emulated Cortex-M (commands compiled in). Each command prints one line
 * (or a few, for `law` and `patterns`); tests/libcoco/commands.py writes the commands and
 * the lines the Python reference expects. No libc: it runs bare-metal. */
#include "platform.h"

#include "coco.h"

#ifndef DRIVER_MAX_ITEMS
#define DRIVER_MAX_ITEMS 256
#endif
#ifndef DRIVER_MAX_BYTES
#define DRIVER_MAX_BYTES 65536
#endif
#define OUT_SIZE 256

/* --- output ------------------------------------------------------------------------- */

static char out_buf[OUT_SIZE];
static size_t out_len;

static void out_flush(void) {
    if (out_len > 0) {
        plat_write(out_buf, out_len);
        out_len = 0;
    }
}

static void out_ch(char c) {
    if (out_len == OUT_SIZE) {
        out_flush();
    }
    out_buf[out_len++] = c;
}

static void out_str(const char *s) {
    while (*s != 0) {
        out_ch(*s++);
    }
}

static void out_sep(void) {
    if (out_len > 0 && out_buf[out_len - 1] != ' ') {
        out_ch(' ');
    }
}

static void out_digits(uint64_t v) {
    char digits[20];
    int n = 0;
    do {
        digits[n++] = (char)('0' + (int)(v % 10u));
        v /= 10u;
    } while (v > 0);
    while (n > 0) {
        out_ch(digits[--n]);
    }
}

static void out_u64(uint64_t v) {
    out_sep();
    out_digits(v);
}

static void out_i64(int64_t v) {
    out_sep();
    if (v < 0) {
        out_ch('-');
    }
    out_digits(v < 0 ? (uint64_t)0 - (uint64_t)v : (uint64_t)v);
}

static void out_word(const char *s) {
    out_sep();
    out_str(s);
}

static void out_hex(const uint8_t *p, size_t n) {
    static const char hex[] = "0123456789abcdef";
    size_t i;
    out_sep();
    if (n == 0) {
        out_ch('-');
    }
    for (i = 0; i < n; i++) {
        out_ch(hex[p[i] >> 4]);
        out_ch(hex[p[i] & 15]);
    }
}

static void out_err(int rc) {
    out_word("err");
    out_word(coco_strerror(rc));
}

static void out_end(void) {
    out_ch('\n');
    out_flush();
}

/* --- input -------------------------------------------------------------------------- */

typedef struct {
    const char *p;
    const char *end;
    int bad;
} line_t;

static int token(line_t *l, const char **s, size_t *n) {
    while (l->p < l->end && *l->p == ' ') {
        l->p++;
    }
    *s = l->p;
    while (l->p < l->end && *l->p != ' ') {
        l->p++;
    }
    *n = (size_t)(l->p - *s);
    if (*n == 0) {
        l->bad = 1;
    }
    return *n > 0;
}

static uint64_t get_u64(line_t *l) {
    const char *s;
    size_t n, i;
    uint64_t v = 0;
    if (!token(l, &s, &n)) {
        return 0;
    }
    for (i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9') {
            l->bad = 1;
            return 0;
        }
        v = v * 10u + (uint64_t)(s[i] - '0');
    }
    return v;
}

static uint32_t get_u32(line_t *l) { return (uint32_t)get_u64(l); }

static int64_t get_i64(line_t *l) {
    const char *s;
    size_t n, i = 0;
    uint64_t v = 0;
    int neg = 0;
    if (!token(l, &s, &n)) {
        return 0;
    }
    if (s[0] == '-') {
        neg = 1;
        i = 1;
    }
    for (; i < n; i++) {
        if (s[i] < '0' || s[i] > '9') {
            l->bad = 1;
            return 0;
        }
        v = v * 10u + (uint64_t)(s[i] - '0');
    }
    return neg ? (int64_t)(0 - v) : (int64_t)v;
}

static int hex_digit(char c) {
    if (c >= '0' && c <= '9') {
        return c - '0';
    }
    if (c >= 'a' && c <= 'f') {
        return c - 'a' + 10;
    }
    return -1;
}

/* Hex bytes ("-" for none) into buf; returns the count. */
static size_t get_hex(line_t *l, uint8_t *buf, size_t cap) {
    const char *s;
    size_t n, i;
    if (!token(l, &s, &n)) {
        return 0;
    }
    if (n == 1 && s[0] == '-') {
        return 0;
    }
    if (n % 2 != 0 || n / 2 > cap) {
        l->bad = 1;
        return 0;
    }
    for (i = 0; i < n / 2; i++) {
        int hi = hex_digit(s[2 * i]), lo = hex_digit(s[2 * i + 1]);
        if (hi < 0 || lo < 0) {
            l->bad = 1;
            return 0;
        }
        buf[i] = (uint8_t)(hi * 16 + lo);
    }
    return n / 2;
}

/* An IEEE double given as the 16 hex digits of its bits. */
static double get_double(line_t *l) {
    uint8_t b[8];
    union {
        uint64_t bits;
        double value;
    } u;
    size_t i;
    u.bits = 0;
    if (get_hex(l, b, 8) != 8) {
        l->bad = 1;
        return 0.0;
    }
    for (i = 0; i < 8; i++) {
        u.bits = (u.bits << 8) | b[i];
    }
    return u.value;
}

static int word_is(const char *s, size_t n, const char *w) {
    size_t i;
    for (i = 0; i < n; i++) {
        if (w[i] != s[i]) {
            return 0;
        }
    }
    return w[n] == '\0';
}

/* --- state -------------------------------------------------------------------------- */

static coco_spec spec;
static coco_announcement announcement;
static coco_test_stream stream;
static coco_rng rng = {coco_test_stream_fill, &stream};
static uint32_t keys[DRIVER_MAX_ITEMS], keys2[DRIVER_MAX_ITEMS];
static int8_t signs[DRIVER_MAX_ITEMS];
static double dv[DRIVER_MAX_ITEMS], dlo[DRIVER_MAX_ITEMS], dhi[DRIVER_MAX_ITEMS];
static int32_t iv[DRIVER_MAX_ITEMS], ilo[DRIVER_MAX_ITEMS], ihi[DRIVER_MAX_ITEMS];
static uint8_t bytes[DRIVER_MAX_BYTES];
static char text[COCO_TOPIC_SIZE], text2[COCO_TOPIC_SIZE]; /* names: up to 256 bytes */
static char topic_buf[COCO_TOPIC_SIZE];

static void start_stream(uint32_t seed) {
    stream.seed = seed;
    stream.index = 0;
}

/* n items of a sparse input: n keys then n signs */
static uint32_t get_sparse(line_t *l) {
    uint32_t n = get_u32(l), i;
    if (n > DRIVER_MAX_ITEMS) {
        l->bad = 1;
        return 0;
    }
    for (i = 0; i < n; i++) {
        keys[i] = get_u32(l);
    }
    for (i = 0; i < n; i++) {
        signs[i] = (int8_t)get_i64(l);
    }
    return n;
}

static void out_sparse(uint32_t n) {
    uint32_t i;
    for (i = 0; i < n; i++) {
        out_u64(keys[i]);
    }
    out_word("|");
    for (i = 0; i < n; i++) {
        out_i64(signs[i]);
    }
    out_word("|");
    out_u64(stream.index);
}

/* The ledger's storage, in memory. */
static struct {
    uint8_t record[COCO_LEDGER_RECORD_SIZE];
    int present, fail_load, fail_store;
} storage;
static coco_ledger ledger;

static int mem_load(void *ctx, uint8_t record[COCO_LEDGER_RECORD_SIZE]) {
    int i;
    (void)ctx;
    if (storage.fail_load) {
        return -1;
    }
    if (!storage.present) {
        return 1;
    }
    for (i = 0; i < COCO_LEDGER_RECORD_SIZE; i++) {
        record[i] = storage.record[i];
    }
    return 0;
}

static int mem_store(void *ctx, const uint8_t record[COCO_LEDGER_RECORD_SIZE]) {
    int i;
    (void)ctx;
    if (storage.fail_store) {
        return -1;
    }
    for (i = 0; i < COCO_LEDGER_RECORD_SIZE; i++) {
        storage.record[i] = record[i];
    }
    storage.present = 1;
    return 0;
}

static const coco_ledger_io mem_io = {mem_load, mem_store, 0};

static void out_ledger(int rc) {
    if (rc != COCO_OK) {
        out_err(rc);
    } else {
        out_word("ok");
    }
    out_u64(ledger.spent_units);
    out_u64(ledger.reports);
}

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

/* --- commands ----------------------------------------------------------------------- */

static void cmd_spec(line_t *l) {
    uint32_t fp;
    int rc;
    spec.mechanism = get_u32(l);
    spec.d = get_u32(l);
    spec.s = get_u32(l);
    spec.t = get_u32(l);
    spec.exp_eps_weight = get_u64(l);
    spec.hash_version = get_u32(l);
    spec.fingerprint = get_u32(l);
    if (l->bad) {
        return;
    }
    rc = coco_spec_check(&spec);
    out_word(coco_strerror(rc));
    rc = coco_spec_fingerprint(&spec, &fp);
    if (rc == COCO_OK) {
        out_u64(fp);
        out_word(coco_spec_verify_fingerprint(&spec) == COCO_OK ? "match" : "mismatch");
    } else {
        out_err(rc);
    }
}

static void cmd_rand(line_t *l) {
    uint32_t stream_seed = get_u32(l), seed = get_u32(l), draws = get_u32(l), n, i;
    n = get_sparse(l);
    if (l->bad) {
        return;
    }
    start_stream(stream_seed);
    for (i = 0; i < draws; i++) {
        uint16_t z;
        int rc = coco_randomise(&spec, keys, signs, n, seed, &rng, &z);
        if (rc != COCO_OK) {
            out_err(rc);
            return;
        }
        out_u64(z);
    }
    out_word("|");
    out_u64(stream.index);
}

static void cmd_make(line_t *l) {
    uint32_t stream_seed = get_u32(l), round = get_u32(l), n;
    uint64_t cost = get_u64(l);
    uint8_t report[COCO_REPORT_SIZE];
    int rc;
    n = get_sparse(l);
    if (l->bad) {
        return;
    }
    start_stream(stream_seed);
    rc = coco_make_report(&spec, round, keys, signs, n, &rng, &ledger, cost, report);
    if (rc != COCO_OK) {
        out_err(rc);
        out_u64(stream.index);
        return;
    }
    out_hex(report, sizeof report);
    out_u64(stream.index);
}

static void cmd_tern(line_t *l, int integer) {
    uint32_t stream_seed = get_u32(l), clip = get_u32(l), d = get_u32(l), s = get_u32(l), i;
    int rc;
    if (d > DRIVER_MAX_ITEMS || s > DRIVER_MAX_ITEMS) {
        l->bad = 1;
        return;
    }
    for (i = 0; i < d; i++) {
        if (integer) {
            iv[i] = (int32_t)get_i64(l);
        } else {
            dv[i] = get_double(l);
        }
    }
    for (i = 0; i < d; i++) {
        if (integer) {
            ilo[i] = (int32_t)get_i64(l);
        } else {
            dlo[i] = get_double(l);
        }
    }
    for (i = 0; i < d; i++) {
        if (integer) {
            ihi[i] = (int32_t)get_i64(l);
        } else {
            dhi[i] = get_double(l);
        }
    }
    if (l->bad) {
        return;
    }
    start_stream(stream_seed);
    rc = integer ? coco_ternarise_int(iv, ilo, ihi, d, s, (int)clip, &rng, keys, signs)
                 : coco_ternarise(dv, dlo, dhi, d, s, (int)clip, &rng, keys, signs);
    if (rc != COCO_OK) {
        out_err(rc);
        return;
    }
    out_sparse(s);
}

static void cmd_pad(line_t *l) {
    uint32_t stream_seed = get_u32(l), overflow = get_u32(l), d = get_u32(l), s = get_u32(l);
    uint32_t k = get_u32(l), i;
    int rc;
    if (k > DRIVER_MAX_ITEMS || s > DRIVER_MAX_ITEMS) {
        l->bad = 1;
        return;
    }
    for (i = 0; i < k; i++) {
        keys2[i] = get_u32(l);
    }
    for (i = 0; i < k; i++) {
        dv[i] = get_double(l);
    }
    if (l->bad) {
        return;
    }
    start_stream(stream_seed);
    rc = coco_pad_key_values(keys2, dv, k, d, s, (int)overflow, &rng, keys, signs);
    if (rc != COCO_OK) {
        out_err(rc);
        return;
    }
    out_sparse(s);
}

static void cmd_decbatch(line_t *l) {
    size_t n = get_hex(l, bytes, sizeof bytes);
    coco_batch_header h;
    uint32_t i, seed;
    uint16_t z;
    int rc;
    if (l->bad) {
        return;
    }
    rc = coco_decode_batch_header(bytes, n, &h);
    if (rc != COCO_OK) {
        out_err(rc);
        return;
    }
    out_u64(h.fingerprint);
    out_u64(h.round);
    out_hex(h.batch_id, sizeof h.batch_id);
    out_u64(h.count);
    for (i = 0; i < h.count; i++) {
        coco_batch_record(bytes, n, i, &seed, &z);
        out_u64(seed);
        out_u64(z);
    }
}

static void cmd_batch(line_t *l) {
    uint32_t fp = get_u32(l), round = get_u32(l), count, i;
    uint8_t id[COCO_BATCH_ID_SIZE];
    size_t pos = COCO_BATCH_HEADER_SIZE;
    int rc;
    if (get_hex(l, id, sizeof id) != sizeof id) {
        l->bad = 1;
    }
    count = get_u32(l);
    if (l->bad || COCO_BATCH_HEADER_SIZE + 6u * (uint64_t)count > sizeof bytes) {
        l->bad = 1;
        return;
    }
    rc = coco_encode_batch_header(fp, round, id, count, bytes);
    for (i = 0; rc == COCO_OK && i < count; i++) {
        uint32_t seed = get_u32(l), z = get_u32(l);
        rc = coco_encode_record(seed, z, bytes + pos);
        pos += COCO_RECORD_SIZE;
    }
    if (l->bad) {
        return;
    }
    if (rc != COCO_OK) {
        out_err(rc);
        return;
    }
    out_hex(bytes, pos);
}

static void cmd_ann(line_t *l) {
    size_t n = get_hex(l, bytes, sizeof bytes);
    int rc, i;
    if (l->bad) {
        return;
    }
    rc = coco_announcement_parse(bytes, n, &announcement);
    if (rc != COCO_OK) {
        out_err(rc);
        return;
    }
    out_word("ok");
    out_u64(announcement.spec.mechanism);
    out_u64(announcement.spec.d);
    out_u64(announcement.spec.s);
    out_u64(announcement.spec.t);
    out_u64(announcement.spec.exp_eps_weight);
    out_u64(announcement.spec.hash_version);
    out_u64(announcement.spec.fingerprint);
    out_u64(announcement.round_seconds);
    out_u64(announcement.min_batch);
    out_u64(announcement.epsilon_units);
    if (announcement.has_batch_public_key) {
        out_hex(announcement.batch_public_key, COCO_PUBLIC_KEY_SIZE);
    } else {
        out_word("-");
    }
    out_u64(announcement.layout_count);
    for (i = 0; i < announcement.layout_count; i++) {
        out_u64(announcement.layouts[i].count);
        out_u64(announcement.layouts[i].from_round);
        out_u64(announcement.layouts[i].generation);
        out_u64(announcement.layouts[i].seed);
    }
}

/* A NUL-terminated name from hex (names with any byte but NUL). */
static const char *get_name(line_t *l, char *buf) {
    size_t n = get_hex(l, bytes, COCO_TOPIC_SIZE - 1), i;
    for (i = 0; i < n; i++) {
        buf[i] = (char)bytes[i];
    }
    buf[n] = '\0';
    return buf;
}

static void out_topic(int rc) { /* in hex: a topic level may hold any character but NUL */
    if (rc != COCO_OK) {
        out_err(rc);
    } else {
        size_t n = 0;
        while (topic_buf[n] != '\0') {
            n++;
        }
        out_hex((const uint8_t *)topic_buf, n);
    }
}

static void cmd_topic(line_t *l) {
    const char *dep = get_name(l, text), *dev = get_name(l, text2), *label;
    const char *s;
    size_t n;
    char lab[16];
    if (!token(l, &s, &n) || n >= sizeof lab) {
        l->bad = 1;
        return;
    }
    if (n == 1 && s[0] == '-') {
        label = 0;
    } else {
        size_t i;
        for (i = 0; i < n; i++) {
            lab[i] = s[i];
        }
        lab[n] = '\0';
        label = lab;
    }
    if (!l->bad) {
        out_topic(coco_ingress_topic(dep, dev, label, topic_buf, sizeof topic_buf));
    }
}

static void cmd_nulls(void) {
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

static void cmd_rngfail(int stuck) {
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

static void cmd_bench(line_t *l) {
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

static int run_line(const char *p, const char *end) {
    line_t l;
    const char *cmd;
    size_t n;
    l.p = p;
    l.end = end;
    l.bad = 0;
    if (!token(&l, &cmd, &n)) {
        return 0; /* empty line */
    }
    out_str("> ");
    {
        size_t i;
        for (i = 0; i < n; i++) {
            out_ch(cmd[i]);
        }
    }
    out_ch(':');
    if (word_is(cmd, n, "xxh32")) {
        uint32_t key = get_u32(&l), seed = get_u32(&l), pair;
        int h2;
        coco_coco_hash(key, seed, 11, &pair, &h2);
        out_u64(coco_xxh32_u32(key, seed));
        out_u64(coco_collision_bucket(key, seed, 13));
        out_u64(pair);
        out_i64(h2);
    } else if (word_is(cmd, n, "xxh32b")) {
        uint32_t seed = get_u32(&l);
        size_t len = get_hex(&l, bytes, sizeof bytes);
        out_u64(coco_xxh32(bytes, len, seed));
    } else if (word_is(cmd, n, "stream")) {
        uint32_t seed = get_u32(&l), count = get_u32(&l), i, word;
        start_stream(seed);
        for (i = 0; i < count; i++) {
            coco_random_u32(&rng, &word);
            out_u64(word);
        }
    } else if (word_is(cmd, n, "randbelow")) {
        uint32_t seed = get_u32(&l);
        uint64_t bound = get_u64(&l), r;
        int rc;
        start_stream(seed);
        rc = coco_randbelow(&rng, bound, &r);
        if (rc != COCO_OK) {
            out_err(rc);
        } else {
            out_u64(r);
            out_u64(stream.index);
        }
    } else if (word_is(cmd, n, "spec")) {
        cmd_spec(&l);
    } else if (word_is(cmd, n, "rand")) {
        cmd_rand(&l);
    } else if (word_is(cmd, n, "make")) {
        cmd_make(&l);
    } else if (word_is(cmd, n, "tern")) {
        cmd_tern(&l, 0);
    } else if (word_is(cmd, n, "ternint")) {
        cmd_tern(&l, 1);
    } else if (word_is(cmd, n, "pad")) {
        cmd_pad(&l);
    } else if (word_is(cmd, n, "report")) {
        uint32_t fp = get_u32(&l), round = get_u32(&l), seed = get_u32(&l), z = get_u32(&l);
        uint8_t report[COCO_REPORT_SIZE];
        int rc = coco_encode_report(fp, round, seed, z, report);
        if (rc != COCO_OK) {
            out_err(rc);
        } else {
            out_hex(report, sizeof report);
        }
    } else if (word_is(cmd, n, "decrep")) {
        size_t len = get_hex(&l, bytes, sizeof bytes);
        coco_report r;
        int rc = coco_decode_report(bytes, len, &r);
        if (rc != COCO_OK) {
            out_err(rc);
        } else {
            out_u64(r.fingerprint);
            out_u64(r.round);
            out_u64(r.seed);
            out_u64(r.z);
        }
    } else if (word_is(cmd, n, "batch")) {
        cmd_batch(&l);
    } else if (word_is(cmd, n, "decbatch")) {
        cmd_decbatch(&l);
    } else if (word_is(cmd, n, "round")) {
        int64_t now = get_i64(&l);
        uint32_t length = get_u32(&l), round = 0, next = 0;
        int rc = coco_round_of(now, length, &round);
        if (rc == COCO_OK) {
            rc = coco_seconds_to_next_round(now, length, &next);
        }
        if (rc != COCO_OK) {
            out_err(rc);
        } else {
            out_u64(round);
            out_u64(next);
        }
    } else if (word_is(cmd, n, "ann")) {
        cmd_ann(&l);
    } else if (word_is(cmd, n, "units")) {
        const char *s;
        size_t len;
        uint64_t units;
        int rc, up;
        token(&l, &s, &len);
        up = (int)get_u32(&l);
        rc = l.bad ? COCO_OK : coco_decimal_units(s, len, up, &units);
        if (rc != COCO_OK) {
            out_err(rc);
        } else {
            out_u64(units);
        }
    } else if (word_is(cmd, n, "shard")) {
        uint32_t seed = get_u32(&l), count = get_u32(&l);
        size_t len = get_hex(&l, bytes, sizeof bytes);
        out_u64(coco_shard_index((const char *)bytes, len, seed, count));
    } else if (word_is(cmd, n, "label")) {
        uint32_t g = get_u32(&l), i = get_u32(&l), cap = get_u32(&l);
        int rc = coco_shard_label(g, i, topic_buf, cap < sizeof topic_buf ? cap : 0);
        out_topic(rc);
    } else if (word_is(cmd, n, "topic")) {
        cmd_topic(&l);
    } else if (word_is(cmd, n, "spectopic")) {
        const char *dep = get_name(&l, text);
        out_topic(coco_spec_topic(dep, topic_buf, sizeof topic_buf));
    } else if (word_is(cmd, n, "devtopic")) {
        const char *dep = get_name(&l, text), *dev = get_name(&l, text2);
        uint32_t round = get_u32(&l);
        out_topic(coco_device_ingress_topic(&announcement, dep, dev, round, topic_buf,
                                            sizeof topic_buf));
    } else if (word_is(cmd, n, "ledger_new")) {
        storage.present = storage.fail_load = storage.fail_store = 0;
    } else if (word_is(cmd, n, "ledger_set")) {
        size_t len = get_hex(&l, storage.record, sizeof storage.record);
        storage.present = len == sizeof storage.record;
    } else if (word_is(cmd, n, "ledger_fail")) {
        storage.fail_load = (int)get_u32(&l);
        storage.fail_store = (int)get_u32(&l);
    } else if (word_is(cmd, n, "ledger_open")) {
        out_ledger(coco_ledger_open(&ledger, &mem_io, get_u64(&l)));
    } else if (word_is(cmd, n, "ledger_charge")) {
        out_ledger(coco_ledger_charge(&ledger, get_u64(&l)));
    } else if (word_is(cmd, n, "ledger_record")) {
        if (storage.present) {
            out_hex(storage.record, sizeof storage.record);
        } else {
            out_word("none");
        }
    } else if (word_is(cmd, n, "nulls")) {
        cmd_nulls();
    } else if (word_is(cmd, n, "rngfail")) {
        cmd_rngfail(0);
    } else if (word_is(cmd, n, "rngstuck")) {
        cmd_rngfail(1);
    } else if (word_is(cmd, n, "patterns")) {
        /* randbelow(n) fed every k-bit pattern, then zeros: value and words used */
        uint64_t bound = get_u64(&l), pattern, m;
        unsigned k = 0;
        for (m = bound - 1; bound > 0 && m > 0; m >>= 1) {
            k++;
        }
        if (k == 0 || k > 16) {
            l.bad = 1;
        }
        for (pattern = 0; !l.bad && pattern < ((uint64_t)1 << k); pattern++) {
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
    } else if (word_is(cmd, n, "law")) {
        uint64_t unit = get_u64(&l);
        uint32_t seed = get_u32(&l), count = get_sparse(&l);
#ifndef COCO_TEST_RANDBELOW
        l.bad = 1; /* only in builds whose randbelow is the enumerating oracle */
#endif
        if (!l.bad) {
            script.len = 0;
            script.overflow = 0;
            out_end();
            law_paths(unit, seed, count);
            out_str("> law: end");
        }
    } else if (word_is(cmd, n, "bench")) {
        cmd_bench(&l);
    } else {
        l.bad = 1;
    }
    if (l.bad) {
        out_word("parse-error");
    }
    out_end();
    return l.bad;
}

int driver_run(const char *script_text, size_t len) {
    const char *p = script_text, *end = script_text + len;
    int bad = 0;
    while (p < end) {
        const char *eol = p;
        while (eol < end && *eol != '\n') {
            eol++;
        }
        bad += run_line(p, eol);
        p = eol + 1;
    }
    return bad;
}
