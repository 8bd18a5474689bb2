/* Wire format v1 (protocol 10.2-10.4), rounds (section 11), topics and shard labels. */
#include "coco_internal.h"

#define KIND_REPORT 1u
#define KIND_BATCH 2u
#define WIRE_VERSION 1u

int coco_encode_report(uint32_t fingerprint, uint32_t round, uint32_t seed, uint32_t z,
                       uint8_t out[COCO_REPORT_SIZE]) {
    if (out == NULL) {
        return COCO_ERR_NULL;
    }
    if (z > 0xFFFFu) {
        return COCO_ERR_BAD_FIELD;
    }
    out[0] = WIRE_VERSION;
    out[1] = KIND_REPORT;
    coco__put32(out + 2, fingerprint);
    coco__put32(out + 6, round);
    coco__put32(out + 10, seed);
    out[14] = (uint8_t)(z >> 8);
    out[15] = (uint8_t)z;
    return COCO_OK;
}

static int check_prefix(const uint8_t *buf, size_t len, uint8_t kind) {
    if (len < 2) {
        return COCO_ERR_BAD_LENGTH;
    }
    if (buf[0] != WIRE_VERSION) {
        return COCO_ERR_BAD_VERSION;
    }
    if (buf[1] != kind) {
        return COCO_ERR_BAD_KIND;
    }
    return COCO_OK;
}

int coco_decode_report(const uint8_t *buf, size_t len, coco_report *out) {
    int rc;
    if ((buf == NULL && len > 0) || out == NULL) {
        return COCO_ERR_NULL;
    }
    rc = check_prefix(buf, len, KIND_REPORT);
    if (rc != COCO_OK) {
        return rc;
    }
    if (len != COCO_REPORT_SIZE) {
        return COCO_ERR_BAD_LENGTH;
    }
    out->fingerprint = coco__get32(buf + 2);
    out->round = coco__get32(buf + 6);
    out->seed = coco__get32(buf + 10);
    out->z = (uint16_t)(((unsigned)buf[14] << 8) | buf[15]);
    return COCO_OK;
}

int coco_encode_batch_header(uint32_t fingerprint, uint32_t round,
                             const uint8_t batch_id[COCO_BATCH_ID_SIZE], uint32_t count,
                             uint8_t out[COCO_BATCH_HEADER_SIZE]) {
    unsigned i;
    if (batch_id == NULL || out == NULL) {
        return COCO_ERR_NULL;
    }
    out[0] = WIRE_VERSION;
    out[1] = KIND_BATCH;
    coco__put32(out + 2, fingerprint);
    coco__put32(out + 6, round);
    for (i = 0; i < COCO_BATCH_ID_SIZE; i++) {
        out[10 + i] = batch_id[i];
    }
    coco__put32(out + 26, count);
    return COCO_OK;
}

int coco_encode_record(uint32_t seed, uint32_t z, uint8_t out[COCO_RECORD_SIZE]) {
    if (out == NULL) {
        return COCO_ERR_NULL;
    }
    if (z > 0xFFFFu) {
        return COCO_ERR_BAD_FIELD;
    }
    coco__put32(out, seed);
    out[4] = (uint8_t)(z >> 8);
    out[5] = (uint8_t)z;
    return COCO_OK;
}

int coco_decode_batch_header(const uint8_t *buf, size_t len, coco_batch_header *out) {
    uint32_t count;
    unsigned i;
    int rc;
    if ((buf == NULL && len > 0) || out == NULL) {
        return COCO_ERR_NULL;
    }
    rc = check_prefix(buf, len, KIND_BATCH);
    if (rc != COCO_OK) {
        return rc;
    }
    if (len < COCO_BATCH_HEADER_SIZE) {
        return COCO_ERR_BAD_LENGTH;
    }
    count = coco__get32(buf + 26);
    /* 30 + 6 count in 64 bits: a count near 2^32 must not wrap around */
    if (COCO_U64(len) != COCO_U64(COCO_BATCH_HEADER_SIZE) + COCO_U64(COCO_RECORD_SIZE) * count) {
        return COCO_ERR_BAD_COUNT;
    }
    out->fingerprint = coco__get32(buf + 2);
    out->round = coco__get32(buf + 6);
    for (i = 0; i < COCO_BATCH_ID_SIZE; i++) {
        out->batch_id[i] = buf[10 + i];
    }
    out->count = count;
    return COCO_OK;
}

int coco_batch_record(const uint8_t *buf, size_t len, uint32_t i, uint32_t *seed,
                      uint16_t *z) {
    coco_batch_header header;
    const uint8_t *rec;
    int rc;
    if (seed == NULL || z == NULL) {
        return COCO_ERR_NULL;
    }
    rc = coco_decode_batch_header(buf, len, &header);
    if (rc != COCO_OK) {
        return rc;
    }
    if (i >= header.count) {
        return COCO_ERR_ARG;
    }
    rec = buf + COCO_BATCH_HEADER_SIZE + (size_t)COCO_RECORD_SIZE * i;
    *seed = coco__get32(rec);
    *z = (uint16_t)(((unsigned)rec[4] << 8) | rec[5]);
    return COCO_OK;
}

/* --- rounds ------------------------------------------------------------------------- */

static int round_checks(int64_t unix_seconds, uint32_t round_seconds, uint64_t *round) {
    uint64_t r;
    if (round_seconds < 1u || round_seconds > COCO_MAX_ROUND_SECONDS) {
        return COCO_ERR_ROUND_SECONDS;
    }
    if (unix_seconds < COCO_CLOCK_FLOOR) {
        return COCO_ERR_CLOCK; /* not set (1970, 2000 after a reboot without RTC): no report */
    }
    {   /* r = unix_seconds / round_seconds by shift and subtract: no libgcc division */
        uint64_t n = (uint64_t)unix_seconds, rem = 0;
        int bit;
        r = 0;
        for (bit = 63; bit >= 0; bit--) {
            rem = (rem << 1) | ((n >> bit) & 1u);
            r <<= 1;
            if (rem >= round_seconds) {
                rem -= round_seconds;
                r |= 1u;
            }
        }
    }
    if (r > 0xFFFFFFFFu) {
        return COCO_ERR_CLOCK;
    }
    *round = r;
    return COCO_OK;
}

int coco_round_of(int64_t unix_seconds, uint32_t round_seconds, uint32_t *round) {
    uint64_t r;
    int rc;
    if (round == NULL) {
        return COCO_ERR_NULL;
    }
    rc = round_checks(unix_seconds, round_seconds, &r);
    if (rc == COCO_OK) {
        *round = (uint32_t)r;
    }
    return rc;
}

int coco_seconds_to_next_round(int64_t unix_seconds, uint32_t round_seconds,
                               uint32_t *seconds) {
    uint64_t r;
    int rc;
    if (seconds == NULL) {
        return COCO_ERR_NULL;
    }
    rc = round_checks(unix_seconds, round_seconds, &r);
    if (rc == COCO_OK) {
        *seconds = (uint32_t)((r + 1) * round_seconds - (uint64_t)unix_seconds);
    }
    return rc;
}

/* --- topics and shards -------------------------------------------------------------- */

int coco__put_decimal(char *buf, size_t cap, size_t *pos, uint64_t v) {
    /* Digits by repeated subtraction of powers of ten: no 64-bit division (a libgcc routine
     * of several hundred bytes on Cortex-M0), at most 9 subtractions per digit. */
    uint64_t p = 1;
    unsigned n = 1;
    while (n < 20 && p * 10u <= v) { /* p <= 10^18 here, so p * 10 does not overflow */
        p *= 10u;
        n++;
    }
    if (*pos + n >= cap) {
        return -1;
    }
    while (n > 0) {
        unsigned digit = 0, k;
        uint64_t next = 1;
        while (v >= p) {
            v -= p;
            digit++;
        }
        buf[(*pos)++] = (char)('0' + digit);
        for (k = 2; k < n; k++) { /* next = p / 10 = 10^(n - 2) */
            next *= 10u;
        }
        p = next;
        n--;
    }
    buf[*pos] = '\0';
    return 0;
}

/* A topic level of 1 to 64 UTF-8 characters without '/', '+', '#' (NUL ends the C string);
 * returns its length in bytes, or 0 if it is not one. */
static size_t name_length(const char *name) {
    size_t i = 0, chars = 0;
    const unsigned char *p = (const unsigned char *)name;
    if (p == NULL) {
        return 0;
    }
    while (p[i] != 0) {
        unsigned c = p[i], extra, b;
        uint32_t cp;
        if (c == '/' || c == '+' || c == '#') {
            return 0;
        }
        if (c < 0x80u) {
            extra = 0;
            cp = c;
        } else if (c >= 0xC2u && c <= 0xDFu) {
            extra = 1;
            cp = c & 0x1Fu;
        } else if (c >= 0xE0u && c <= 0xEFu) {
            extra = 2;
            cp = c & 0x0Fu;
        } else if (c >= 0xF0u && c <= 0xF4u) {
            extra = 3;
            cp = c & 0x07u;
        } else {
            return 0; /* not UTF-8 */
        }
        for (b = 1; b <= extra; b++) {
            if ((p[i + b] & 0xC0u) != 0x80u) {
                return 0;
            }
            cp = (cp << 6) | (p[i + b] & 0x3Fu);
        }
        if ((extra == 2 && (cp < 0x800u || (cp >= 0xD800u && cp <= 0xDFFFu))) ||
            (extra == 3 && (cp < 0x10000u || cp > 0x10FFFFu))) {
            return 0; /* overlong, surrogate or beyond Unicode */
        }
        i += 1 + extra;
        if (++chars > COCO_MAX_NAME_CHARS) {
            return 0;
        }
    }
    return i;
}

static int append(char *buf, size_t cap, size_t *pos, const char *text, size_t n) {
    size_t i;
    if (*pos + n >= cap) {
        return COCO_ERR_BUFFER;
    }
    for (i = 0; i < n; i++) {
        buf[(*pos)++] = text[i];
    }
    buf[*pos] = '\0';
    return COCO_OK;
}

static size_t cstrlen(const char *s) {
    size_t n = 0;
    while (s[n] != 0) {
        n++;
    }
    return n;
}

int coco_shard_label(uint32_t generation, uint32_t index, char *buf, size_t cap) {
    size_t pos = 0;
    if (buf == NULL) {
        return COCO_ERR_NULL;
    }
    if (generation > COCO_MAX_GENERATION || index >= COCO_MAX_SHARDS) {
        return COCO_ERR_ARG;
    }
    if (append(buf, cap, &pos, "g", 1) != COCO_OK || coco__put_decimal(buf, cap, &pos, generation) ||
        append(buf, cap, &pos, "s", 1) != COCO_OK || coco__put_decimal(buf, cap, &pos, index)) {
        if (cap > 0) {
            buf[0] = '\0';
        }
        return COCO_ERR_BUFFER;
    }
    return COCO_OK;
}

/* A label g<generation>s<index> as edge/shards.py parses it: no leading zeros, in range. */
static int label_ok(const char *label) {
    uint32_t number[2] = {0, 0};
    unsigned part, i = 0;
    for (part = 0; part < 2; part++) {
        unsigned digits = 0;
        if (label[i++] != (part == 0 ? 'g' : 's')) {
            return 0;
        }
        while (label[i] >= '0' && label[i] <= '9') {
            if (digits == 1 && number[part] == 0) {
                return 0; /* leading zero */
            }
            if (++digits > 5) {
                return 0;
            }
            number[part] = number[part] * 10u + (uint32_t)(label[i++] - '0');
        }
        if (digits == 0) {
            return 0;
        }
    }
    return label[i] == '\0' && number[0] <= COCO_MAX_GENERATION && number[1] < COCO_MAX_SHARDS;
}

static int topic(const char *deployment, const char *middle, const char *label,
                 const char *device_id, const char *tail, char *buf, size_t cap) {
    size_t pos = 0, dep_len, dev_len = 0;
    int rc;
    if (deployment == NULL || buf == NULL) {
        return COCO_ERR_NULL;
    }
    if (cap > 0) {
        buf[0] = '\0';
    }
    dep_len = name_length(deployment);
    if (dep_len == 0) {
        return COCO_ERR_NAME;
    }
    if (device_id != NULL) {
        dev_len = name_length(device_id);
        if (dev_len == 0) {
            return COCO_ERR_NAME;
        }
    }
    if (label != NULL && !label_ok(label)) {
        return COCO_ERR_NAME;
    }
    rc = append(buf, cap, &pos, "coco/v1/", 8);
    if (rc == COCO_OK) {
        rc = append(buf, cap, &pos, deployment, dep_len);
    }
    if (rc == COCO_OK) {
        rc = append(buf, cap, &pos, middle, cstrlen(middle));
    }
    if (rc == COCO_OK && label != NULL) {
        rc = append(buf, cap, &pos, label, cstrlen(label));
        if (rc == COCO_OK) {
            rc = append(buf, cap, &pos, "/", 1);
        }
    }
    if (rc == COCO_OK && device_id != NULL) {
        rc = append(buf, cap, &pos, device_id, dev_len);
    }
    if (rc == COCO_OK) {
        rc = append(buf, cap, &pos, tail, cstrlen(tail));
    }
    if (rc != COCO_OK && cap > 0) {
        buf[0] = '\0';
    }
    return rc;
}

int coco_spec_topic(const char *deployment, char *buf, size_t cap) {
    return topic(deployment, "/spec", NULL, NULL, "", buf, cap);
}

int coco_ingress_topic(const char *deployment, const char *device_id, const char *label,
                       char *buf, size_t cap) {
    if (device_id == NULL) {
        return COCO_ERR_NULL;
    }
    return topic(deployment, "/ingress/", label, device_id, "", buf, cap);
}

int coco_layout_for_round(const coco_announcement *a, uint32_t round,
                          const coco_shard_layout **layout) {
    unsigned i;
    const coco_shard_layout *found = NULL;
    if (a == NULL || layout == NULL) {
        return COCO_ERR_NULL;
    }
    *layout = NULL;
    if (a->layout_count == 0) {
        return COCO_OK;
    }
    for (i = 0; i < a->layout_count && i < COCO_MAX_LAYOUTS; i++) {
        if (a->layouts[i].from_round <= round) {
            found = &a->layouts[i];
        }
    }
    if (found == NULL) {
        return COCO_ERR_NO_LAYOUT;
    }
    *layout = found;
    return COCO_OK;
}

int coco_device_ingress_topic(const coco_announcement *a, const char *deployment,
                              const char *device_id, uint32_t round, char *buf, size_t cap) {
    const coco_shard_layout *layout;
    char label[COCO_LABEL_SIZE];
    size_t id_len;
    int rc;
    if (device_id == NULL || buf == NULL) {
        return COCO_ERR_NULL;
    }
    if (cap > 0) {
        buf[0] = '\0';
    }
    rc = coco_layout_for_round(a, round, &layout);
    if (rc != COCO_OK) {
        return rc;
    }
    if (layout == NULL) {
        return coco_ingress_topic(deployment, device_id, NULL, buf, cap);
    }
    id_len = name_length(device_id);
    if (id_len == 0) {
        return COCO_ERR_NAME;
    }
    rc = coco_shard_label(layout->generation,
                          coco_shard_index(device_id, id_len, layout->seed, layout->count),
                          label, sizeof label);
    if (rc != COCO_OK) {
        return rc;
    }
    return coco_ingress_topic(deployment, device_id, label, buf, cap);
}
