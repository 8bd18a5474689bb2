/* The announcement (protocol 10.5, with the optional shards layouts): a schema-directed JSON
 * parser in constant memory. No recursion, no malloc: the announcement has a fixed shape
 * (root object -> spec object; shards list -> layout objects -> key lists), and an unknown
 * key is an error, so nothing of unknown shape ever has to be skipped. Its decimal numbers
 * are read by coco_decimal.c. */
#include "coco_internal.h"

typedef struct {
    const uint8_t *p;
    const uint8_t *end;
} cursor;

typedef struct {
    const uint8_t *text;
    size_t len;
    int is_int;
} number;

#define STRING_CAP 72 /* the longest value of interest is a 64-hex-digit key */

static int peek(cursor *c) {
    while (c->p < c->end && (*c->p == ' ' || *c->p == '\t' || *c->p == '\n' || *c->p == '\r')) {
        c->p++;
    }
    return c->p < c->end ? *c->p : -1;
}

static int eat(cursor *c, int ch) {
    if (peek(c) != ch) {
        return 0;
    }
    c->p++;
    return 1;
}

/* At a value of the wrong type: COCO_ERR_ANNOUNCEMENT if it starts like some JSON value
 * (the first problem found is then the type), COCO_ERR_JSON otherwise. */
static int wrong_type(cursor *c) {
    int ch = peek(c);
    return (ch == '"' || ch == '{' || ch == '[' || ch == 't' || ch == 'f' || ch == 'n' ||
            ch == '-' || (ch >= '0' && ch <= '9'))
               ? COCO_ERR_ANNOUNCEMENT
               : COCO_ERR_JSON;
}

static int hex_value(int ch) {
    if (ch >= '0' && ch <= '9') {
        return ch - '0';
    }
    if (ch >= 'a' && ch <= 'f') {
        return ch - 'a' + 10;
    }
    if (ch >= 'A' && ch <= 'F') {
        return ch - 'A' + 10;
    }
    return -1;
}

/* A JSON string, decoded into buf[0..cap); *n is its decoded length, which may exceed cap
 * (then only the first cap bytes are kept: such a value never matches). A \u escape of a
 * non-ASCII character decodes to the byte 0xFF, which matches nothing a device expects. */
static int string(cursor *c, char *buf, size_t cap, size_t *n) {
    size_t len = 0;
    if (!eat(c, '"')) {
        return wrong_type(c);
    }
    for (;;) {
        unsigned ch;
        if (c->p >= c->end) {
            return COCO_ERR_JSON;
        }
        ch = *c->p++;
        if (ch == '"') {
            break;
        }
        if (ch < 0x20u) {
            return COCO_ERR_JSON;
        }
        if (ch == '\\') {
            if (c->p >= c->end) {
                return COCO_ERR_JSON;
            }
            ch = *c->p++;
            switch (ch) {
            case '"':
            case '\\':
            case '/':
                break;
            case 'b':
                ch = 8;
                break;
            case 'f':
                ch = 12;
                break;
            case 'n':
                ch = 10;
                break;
            case 'r':
                ch = 13;
                break;
            case 't':
                ch = 9;
                break;
            case 'u': {
                unsigned cp = 0, i;
                for (i = 0; i < 4; i++) {
                    int h = c->p < c->end ? hex_value(*c->p++) : -1;
                    if (h < 0) {
                        return COCO_ERR_JSON;
                    }
                    cp = (cp << 4) | (unsigned)h;
                }
                ch = cp < 0x80u ? cp : 0xFFu;
                break;
            }
            default:
                return COCO_ERR_JSON;
            }
        }
        if (len < cap) {
            buf[len] = (char)ch;
        }
        len++;
    }
    *n = len;
    return COCO_OK;
}

/* A JSON number at the cursor (its span and whether it is an integer). */
static int scan_number(cursor *c, number *out) {
    int ch = peek(c);
    const uint8_t *after;
    out->text = c->p; /* set on every path: GCC -O3 cannot prove callers read it only on OK */
    out->len = 0;
    out->is_int = 0;
    if (ch != '-' && !(ch >= '0' && ch <= '9')) {
        return wrong_type(c);
    }
    after = coco__json_number(c->p, c->end, &out->is_int);
    if (after == NULL) {
        return COCO_ERR_JSON;
    }
    out->len = (size_t)(after - c->p);
    c->p = after;
    return COCO_OK;
}

/* A JSON integer (no fraction or exponent; "-0" is 0) in [0, max], max < 2^63. */
static int uint_value(cursor *c, uint64_t max, uint64_t *out) {
    number num;
    uint64_t v = 0;
    size_t i = 0;
    int rc = scan_number(c, &num);
    if (rc != COCO_OK) {
        return rc;
    }
    if (!num.is_int) {
        return COCO_ERR_ANNOUNCEMENT;
    }
    if (num.text[0] == '-') {
        i = 1;
    }
    if (num.len - i > 19) {
        return COCO_ERR_ANNOUNCEMENT; /* no leading zeros: 20 digits are >= 10^19 > max */
    }
    for (; i < num.len; i++) {
        v = v * 10u + (uint64_t)(num.text[i] - '0'); /* < 10^19: no overflow */
    }
    if (v > max || (num.text[0] == '-' && v != 0)) {
        return COCO_ERR_ANNOUNCEMENT;
    }
    *out = v;
    return COCO_OK;
}

static int uint32_value(cursor *c, uint32_t min, uint32_t max, uint32_t *out) {
    uint64_t v;
    int rc = uint_value(c, max, &v);
    if (rc == COCO_OK && v < min) {
        rc = COCO_ERR_ANNOUNCEMENT;
    }
    if (rc == COCO_OK) {
        *out = (uint32_t)v;
    }
    return rc;
}

static int equals(const char *buf, size_t n, const char *literal) {
    size_t i;
    for (i = 0; i < n; i++) {
        if (literal[i] == '\0' || literal[i] != buf[i]) {
            return 0;
        }
    }
    return literal[n] == '\0';
}

/* The index of key (buf, n) in names[0..count), or -1. */
static int key_index(const char *buf, size_t n, const char *const *names, int count) {
    int i;
    for (i = 0; i < count; i++) {
        if (n <= STRING_CAP && equals(buf, n, names[i])) {
            return i;
        }
    }
    return -1;
}

/* lowercase hex of exactly 2 * size digits, decoded into out (may be NULL) */
static int hex_string(cursor *c, size_t size, uint8_t *out) {
    char buf[STRING_CAP];
    size_t n, i;
    int rc = string(c, buf, sizeof buf, &n);
    if (rc != COCO_OK) {
        return rc;
    }
    if (n != 2 * size) {
        return COCO_ERR_ANNOUNCEMENT;
    }
    for (i = 0; i < n; i++) {
        int h = hex_value((unsigned char)buf[i]);
        if (h < 0 || (buf[i] >= 'A' && buf[i] <= 'F')) {
            return COCO_ERR_ANNOUNCEMENT;
        }
        if (out != NULL) {
            if (i % 2 == 0) {
                out[i / 2] = (uint8_t)(h << 4);
            } else {
                out[i / 2] |= (uint8_t)h;
            }
        }
    }
    return COCO_OK;
}

/* Parses "{" key ":" value ("," key ":" value)* "}" calling member() for each key; fails on
 * an unknown or repeated key and on a missing required one (bits of `required`). */
typedef int (*member_fn)(cursor *c, int index, void *state);

static int object(cursor *c, const char *const *names, int count, uint32_t required,
                  member_fn member, void *state) {
    uint32_t seen = 0;
    if (!eat(c, '{')) {
        return wrong_type(c);
    }
    if (!eat(c, '}')) {
        do {
            char buf[STRING_CAP];
            size_t n;
            int index, rc = peek(c) == '"' ? string(c, buf, sizeof buf, &n) : COCO_ERR_JSON;
            if (rc != COCO_OK) {
                return rc;
            }
            if (!eat(c, ':')) {
                return COCO_ERR_JSON;
            }
            index = key_index(buf, n, names, count);
            if (index < 0 || (seen & (1u << index)) != 0) {
                return COCO_ERR_ANNOUNCEMENT; /* unknown or repeated: the services refuse both */
            }
            seen |= 1u << index;
            rc = member(c, index, state);
            if (rc != COCO_OK) {
                return rc;
            }
        } while (eat(c, ','));
        if (!eat(c, '}')) {
            return COCO_ERR_JSON;
        }
    }
    return (seen & required) == required ? COCO_OK : COCO_ERR_ANNOUNCEMENT;
}

static int decimal_value(cursor *c, int round_up, uint64_t *units) {
    number num;
    int rc = scan_number(c, &num);
    if (rc != COCO_OK) {
        return rc;
    }
    return coco_decimal_units((const char *)num.text, num.len, round_up, units) == COCO_OK
               ? COCO_OK
               : COCO_ERR_ANNOUNCEMENT;
}

/* --- the spec object ---------------------------------------------------------------- */

static const char *const SPEC_KEYS[] = {"mechanism", "d", "s", "epsilon", "t", "hash_version",
                                        "exp_eps_weight", "unit_weight", "fingerprint"};

typedef struct {
    coco_announcement *a;
    uint64_t epsilon_down; /* epsilon rounded down, to check it against E */
    uint32_t period_keys;  /* bit 0: period_seconds seen, bit 1: budget_per_period seen */
} parse_state;

static int spec_member(cursor *c, int index, void *state) {
    parse_state *st = (parse_state *)state;
    coco_announcement *a = st->a;
    coco_spec *spec = &a->spec;
    char buf[STRING_CAP];
    uint8_t fp[4];
    uint64_t v = 0;
    size_t n;
    int rc;
    switch (index) {
    case 0:
        rc = string(c, buf, sizeof buf, &n);
        if (rc == COCO_OK) {
            spec->mechanism = equals(buf, n, "coco")        ? COCO_COCO
                              : equals(buf, n, "collision") ? COCO_COLLISION
                                                            : 0;
            rc = spec->mechanism != 0 ? COCO_OK : COCO_ERR_ANNOUNCEMENT;
        }
        return rc;
    case 1:
        return uint32_value(c, 0, 0xFFFFFFFFu, &spec->d);
    case 2:
        return uint32_value(c, 0, 0xFFFFFFFFu, &spec->s);
    case 3: { /* 0 < epsilon <= 20; its cost in ledger units, rounded up */
        cursor start;
        start.p = c->p; /* member by member: GCC -O3 copies a struct with memcpy */
        start.end = c->end;
        rc = decimal_value(c, 1, &a->epsilon_units);
        if (rc == COCO_OK) {
            rc = decimal_value(&start, 0, &v);
        }
        if (rc == COCO_OK && (a->epsilon_units == 0 || a->epsilon_units > COCO_U64(20) << 32)) {
            rc = COCO_ERR_ANNOUNCEMENT;
        }
        st->epsilon_down = v;
        return rc;
    }
    case 4:
        return uint32_value(c, 0, 0xFFFFFFFFu, &spec->t);
    case 5:
        return uint32_value(c, 0, 0xFFFFFFFFu, &spec->hash_version);
    case 6:
        rc = uint_value(c, COCO_OMEGA_LIMIT - 1, &v);
        spec->exp_eps_weight = v;
        return rc;
    case 7:
        rc = uint_value(c, 0xFFFFFFFFu, &v);
        return rc == COCO_OK && v != COCO_UNIT_WEIGHT ? COCO_ERR_ANNOUNCEMENT : rc;
    default:
        rc = hex_string(c, 4, fp);
        if (rc == COCO_OK) {
            spec->fingerprint = coco__get32(fp);
        }
        return rc;
    }
}

/* --- the shards layouts ------------------------------------------------------------- */

static const char *const LAYOUT_KEYS[] = {"count", "from_round", "generation", "keys", "seed"};

typedef struct {
    coco_shard_layout layout;
    uint32_t keys;
} layout_state;

static int layout_member(cursor *c, int index, void *state) {
    layout_state *st = (layout_state *)state;
    switch (index) {
    case 0:
        return uint32_value(c, 1, COCO_MAX_SHARDS, &st->layout.count);
    case 1:
        return uint32_value(c, 0, 0xFFFFFFFFu, &st->layout.from_round);
    case 2:
        return uint32_value(c, 0, COCO_MAX_GENERATION, &st->layout.generation);
    case 3: /* K public keys, 64 lowercase hex digits each */
        if (!eat(c, '[')) {
            return wrong_type(c);
        }
        if (eat(c, ']')) {
            return COCO_OK;
        }
        do {
            int rc = hex_string(c, COCO_PUBLIC_KEY_SIZE, NULL);
            if (rc != COCO_OK) {
                return rc;
            }
            if (++st->keys > COCO_MAX_SHARDS) {
                return COCO_ERR_ANNOUNCEMENT;
            }
        } while (eat(c, ','));
        return eat(c, ']') ? COCO_OK : COCO_ERR_JSON;
    default:
        return uint32_value(c, 0, 0xFFFFFFFFu, &st->layout.seed);
    }
}

static int shards(cursor *c, coco_announcement *a) {
    if (!eat(c, '[')) {
        return wrong_type(c);
    }
    if (eat(c, ']')) {
        return COCO_ERR_ANNOUNCEMENT; /* one or two layouts */
    }
    do {
        layout_state st;
        int rc;
        st.layout.count = 0;
        st.layout.from_round = 0;
        st.layout.generation = 0;
        st.layout.seed = 0;
        st.keys = 0;
        rc = object(c, LAYOUT_KEYS, 5, 0x1Fu, layout_member, &st);
        if (rc != COCO_OK) {
            return rc;
        }
        if (st.keys != st.layout.count || a->layout_count >= COCO_MAX_LAYOUTS) {
            return COCO_ERR_ANNOUNCEMENT;
        }
        if (a->layout_count == 1 &&
            (st.layout.from_round <= a->layouts[0].from_round ||
             st.layout.generation <= a->layouts[0].generation)) {
            return COCO_ERR_ANNOUNCEMENT; /* sorted: from_round and generation increase */
        }
        a->layouts[a->layout_count++] = st.layout;
    } while (eat(c, ','));
    return eat(c, ']') ? COCO_OK : COCO_ERR_JSON;
}

/* --- the root object ---------------------------------------------------------------- */

static const char *const ROOT_KEYS[] = {"protocol",      "spec",             "min_batch", "delta",
                                        "round_seconds", "batch_public_key", "shards",
                                        "participation", "period_seconds",   "budget_per_period"};

static int root_member(cursor *c, int index, void *state) {
    parse_state *st = (parse_state *)state;
    coco_announcement *a = st->a;
    char buf[STRING_CAP];
    uint64_t up, down;
    size_t n;
    int rc;
    switch (index) {
    case 0:
        rc = string(c, buf, sizeof buf, &n);
        return rc == COCO_OK && !equals(buf, n, COCO_PROTOCOL) ? COCO_ERR_ANNOUNCEMENT : rc;
    case 1:
        return object(c, SPEC_KEYS, 9, 0x1FFu, spec_member, st);
    case 2:
        return uint32_value(c, 1, 0xFFFFFFFFu, &a->min_batch);
    case 3: { /* 0 < delta < 1 */
        cursor start;
        start.p = c->p; /* member by member: GCC -O3 copies a struct with memcpy */
        start.end = c->end;
        rc = decimal_value(c, 1, &up);
        if (rc == COCO_OK) {
            rc = decimal_value(&start, 0, &down);
        }
        return rc == COCO_OK && (up == 0 || down >= (COCO_U64(1) << 32)) ? COCO_ERR_ANNOUNCEMENT
                                                                         : rc;
    }
    case 4:
        return uint32_value(c, 1, COCO_MAX_ROUND_SECONDS, &a->round_seconds);
    case 5:
        a->has_batch_public_key = 1;
        return hex_string(c, COCO_PUBLIC_KEY_SIZE, a->batch_public_key);
    case 6:
        return shards(c, a);
    case 8: /* checked against round_seconds once the whole object is read */
        st->period_keys |= 1u;
        return uint32_value(c, 1, COCO_MAX_PERIOD_SECONDS, &a->period_seconds);
    case 9: /* rounded down: the device's cap; checked against epsilon at the end */
        st->period_keys |= 2u;
        return decimal_value(c, 0, &a->budget_per_period_units);
    default: { /* participation: 0 < q <= 1, kept as floor(q 2^32) */
        cursor start;
        start.p = c->p;
        start.end = c->end;
        rc = decimal_value(c, 1, &up);
        if (rc == COCO_OK) {
            rc = decimal_value(&start, 0, &a->participation_units);
        }
        return rc == COCO_OK && (up == 0 || up > (COCO_U64(1) << 32)) ? COCO_ERR_ANNOUNCEMENT
                                                                      : rc;
    }
    }
}

int coco_announcement_parse(const uint8_t *json, size_t len, coco_announcement *out) {
    cursor c;
    parse_state st;
    size_t i;
    int rc, spec_rc;
    if (json == NULL || out == NULL) {
        return COCO_ERR_NULL;
    }
    for (i = 0; i < sizeof *out; i++) {
        ((uint8_t *)out)[i] = 0;
    }
    c.p = json;
    c.end = json + len;
    if (peek(&c) != '{') {
        return COCO_ERR_JSON;
    }
    st.a = out;
    st.epsilon_down = 0;
    st.period_keys = 0;
    out->participation_units = COCO_U64(1) << 32; /* absent: q = 1 */
    rc = object(&c, ROOT_KEYS, 10, 0x1Fu, root_member, &st);
    if (rc == COCO_OK && peek(&c) >= 0) {
        rc = COCO_ERR_JSON; /* trailing data */
    }
    if (rc == COCO_OK && out->has_batch_public_key && out->layout_count > 0) {
        rc = COCO_ERR_ANNOUNCEMENT; /* sharded: the keys are per shard */
    }
    if (rc == COCO_OK && st.period_keys != 0 &&
        (st.period_keys != 3u || out->period_seconds % out->round_seconds != 0 ||
         out->budget_per_period_units < out->epsilon_units)) {
        rc = COCO_ERR_ANNOUNCEMENT; /* both or neither; whole rounds; one report fits */
    }
    if (rc == COCO_OK &&
        !coco__epsilon_matches(out->spec.exp_eps_weight, out->epsilon_units, st.epsilon_down)) {
        rc = COCO_ERR_ANNOUNCEMENT; /* epsilon and exp_eps_weight disagree */
    }
    if (rc != COCO_OK) {
        return rc;
    }
    spec_rc = coco_spec_check(&out->spec);
    if (spec_rc != COCO_OK && spec_rc != COCO_ERR_SPEC_S_MAX) {
        return spec_rc;
    }
    rc = coco_spec_verify_fingerprint(&out->spec);
    return rc != COCO_OK ? rc : spec_rc;
}
