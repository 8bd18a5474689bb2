/* A line-oriented command interpreter over libcoco, the same code on the host (commands on
 * stdin) and on an emulated Cortex-M (commands compiled in). Each command prints one line
 * (or a few, for `law` and `patterns`); tests/libcoco/commands.py writes the commands and
 * the lines the Python reference expects. No libc: it runs bare-metal. */
#include "driver.h"

/* --- state -------------------------------------------------------------------------- */

coco_spec spec;
coco_announcement announcement;
coco_test_stream stream;
coco_rng rng = {coco_test_stream_fill, &stream};
uint32_t keys[DRIVER_MAX_ITEMS], keys2[DRIVER_MAX_ITEMS];
int8_t signs[DRIVER_MAX_ITEMS];
double dv[DRIVER_MAX_ITEMS], dlo[DRIVER_MAX_ITEMS], dhi[DRIVER_MAX_ITEMS];
int32_t iv[DRIVER_MAX_ITEMS], ilo[DRIVER_MAX_ITEMS], ihi[DRIVER_MAX_ITEMS];
uint8_t bytes[DRIVER_MAX_BYTES];
char text[COCO_TOPIC_SIZE], text2[COCO_TOPIC_SIZE]; /* names: up to 256 bytes */
char topic_buf[COCO_TOPIC_SIZE];

void start_stream(uint32_t seed) {
    stream.seed = seed;
    stream.index = 0;
}

/* n items of a sparse input: n keys then n signs */
uint32_t get_sparse(line_t *l) {
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
struct storage storage;
coco_ledger ledger;

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

const coco_ledger_io mem_io = {mem_load, mem_store, 0};

static void out_ledger(int rc) {
    if (rc != COCO_OK) {
        out_err(rc);
    } else {
        out_word("ok");
    }
    out_u64(ledger.spent_units);
    out_u64(ledger.reports);
}

static void out_ledger_period(int rc) {
    out_ledger(rc);
    out_u64(ledger.period_seconds);
    out_u64(ledger.period);
    out_u64(ledger.period_spent_units);
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
    out_u64(announcement.participation_units);
    out_u64(announcement.period_seconds);
    out_u64(announcement.budget_per_period_units);
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
        size_t len, i;
        for (i = 0; i < sizeof storage.record; i++) {
            storage.record[i] = 0xFF; /* erased flash after a shorter, older record */
        }
        len = get_hex(&l, storage.record, sizeof storage.record);
        storage.present = len == sizeof storage.record || len == COCO_LEDGER_V1_RECORD_SIZE;
    } else if (word_is(cmd, n, "ledger_fail")) {
        storage.fail_load = (int)get_u32(&l);
        storage.fail_store = (int)get_u32(&l);
    } else if (word_is(cmd, n, "ledger_open")) {
        out_ledger(coco_ledger_open(&ledger, &mem_io, get_u64(&l)));
    } else if (word_is(cmd, n, "part")) {
        /* part <stream seed> <participation units> <count>: rounds reported in, words used */
        uint32_t seed = get_u32(&l), count, i, yes_count = 0;
        int yes = 0, rc = COCO_OK;
        announcement.participation_units = get_u64(&l);
        count = get_u32(&l);
        if (!l.bad) {
            start_stream(seed);
            for (i = 0; i < count && rc == COCO_OK; i++) {
                rc = coco_participates(&announcement, &rng, &yes);
                yes_count += (uint32_t)yes;
            }
            if (rc != COCO_OK) {
                out_err(rc);
            } else {
                out_u64(yes_count);
            }
            out_u64(stream.index);
        }
    } else if (word_is(cmd, n, "ledger_open_period")) {
        uint64_t total = get_u64(&l);
        uint32_t seconds = get_u32(&l);
        uint64_t units = get_u64(&l);
        if (!l.bad) {
            out_ledger_period(coco_ledger_open_period(&ledger, &mem_io, total, seconds, units));
        }
    } else if (word_is(cmd, n, "ledger_at")) {
        uint64_t cost = get_u64(&l);
        int64_t when = get_i64(&l);
        if (!l.bad) {
            out_ledger_period(coco_ledger_charge_at(&ledger, cost, when));
        }
    } else if (word_is(cmd, n, "ledger_renews")) {
        int64_t when = 0;
        int rc = coco_ledger_renews_at(&ledger, &when);
        if (rc != COCO_OK) {
            out_err(rc);
        } else {
            out_i64(when);
        }
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
        cmd_patterns(&l);
    } else if (word_is(cmd, n, "law")) {
        cmd_law(&l);
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
