/* SHA-256 (FIPS 180-4), compact: one 16-word rolling schedule on the stack. Used only for the
 * spec fingerprint (protocol 2.4). */
#include "coco_internal.h"

static const uint32_t K[64] = {
    0x428a2f98u, 0x71374491u, 0xb5c0fbcfu, 0xe9b5dba5u, 0x3956c25bu, 0x59f111f1u, 0x923f82a4u,
    0xab1c5ed5u, 0xd807aa98u, 0x12835b01u, 0x243185beu, 0x550c7dc3u, 0x72be5d74u, 0x80deb1feu,
    0x9bdc06a7u, 0xc19bf174u, 0xe49b69c1u, 0xefbe4786u, 0x0fc19dc6u, 0x240ca1ccu, 0x2de92c6fu,
    0x4a7484aau, 0x5cb0a9dcu, 0x76f988dau, 0x983e5152u, 0xa831c66du, 0xb00327c8u, 0xbf597fc7u,
    0xc6e00bf3u, 0xd5a79147u, 0x06ca6351u, 0x14292967u, 0x27b70a85u, 0x2e1b2138u, 0x4d2c6dfcu,
    0x53380d13u, 0x650a7354u, 0x766a0abbu, 0x81c2c92eu, 0x92722c85u, 0xa2bfe8a1u, 0xa81a664bu,
    0xc24b8b70u, 0xc76c51a3u, 0xd192e819u, 0xd6990624u, 0xf40e3585u, 0x106aa070u, 0x19a4c116u,
    0x1e376c08u, 0x2748774cu, 0x34b0bcb5u, 0x391c0cb3u, 0x4ed8aa4au, 0x5b9cca4fu, 0x682e6ff3u,
    0x748f82eeu, 0x78a5636fu, 0x84c87814u, 0x8cc70208u, 0x90befffau, 0xa4506cebu, 0xbef9a3f7u,
    0xc67178f2u};

static uint32_t ror(uint32_t x, unsigned r) { return (x >> r) | (x << (32u - r)); }

static void block(uint32_t h[8], const uint8_t *p) {
    uint32_t w[16], v[8], i;
    for (i = 0; i < 16; i++) {
        w[i] = coco__get32(p + 4 * i);
    }
    for (i = 0; i < 8; i++) {
        v[i] = h[i];
    }
    for (i = 0; i < 64; i++) {
        uint32_t s0, s1, t1, t2;
        if (i >= 16) {
            uint32_t a = w[(i + 1) & 15], b = w[(i + 14) & 15];
            s0 = ror(a, 7) ^ ror(a, 18) ^ (a >> 3);
            s1 = ror(b, 17) ^ ror(b, 19) ^ (b >> 10);
            w[i & 15] += s0 + s1 + w[(i + 9) & 15];
        }
        t1 = v[7] + (ror(v[4], 6) ^ ror(v[4], 11) ^ ror(v[4], 25)) +
             ((v[4] & v[5]) ^ (~v[4] & v[6])) + K[i] + w[i & 15];
        t2 = (ror(v[0], 2) ^ ror(v[0], 13) ^ ror(v[0], 22)) +
             ((v[0] & v[1]) ^ (v[0] & v[2]) ^ (v[1] & v[2]));
        v[7] = v[6];
        v[6] = v[5];
        v[5] = v[4];
        v[4] = v[3] + t1;
        v[3] = v[2];
        v[2] = v[1];
        v[1] = v[0];
        v[0] = t1 + t2;
    }
    for (i = 0; i < 8; i++) {
        h[i] += v[i];
    }
}

void coco__sha256(const uint8_t *data, size_t len, uint8_t out[32]) {
    uint32_t h[8] = {0x6a09e667u, 0xbb67ae85u, 0x3c6ef372u, 0xa54ff53au,
                     0x510e527fu, 0x9b05688cu, 0x1f83d9abu, 0x5be0cd19u};
    uint8_t tail[64];
    uint64_t bits = COCO_U64(len) * 8u;
    size_t done = 0, i, rest;
    for (; len - done >= 64; done += 64) {
        block(h, data + done);
    }
    rest = len - done;
    for (i = 0; i < 64; i++) {
        tail[i] = i < rest ? data[done + i] : (uint8_t)(i == rest ? 0x80u : 0u);
    }
    if (rest >= 56) {
        block(h, tail);
        for (i = 0; i < 64; i++) {
            tail[i] = 0;
        }
    }
    for (i = 0; i < 8; i++) {
        tail[56 + i] = (uint8_t)(bits >> (56 - 8 * i));
    }
    block(h, tail);
    for (i = 0; i < 8; i++) {
        coco__put32(out + 4 * i, h[i]);
    }
}

int coco_spec_fingerprint(const coco_spec *spec, uint32_t *out) {
    /* coco-fleet/spec/v1;mechanism={m};d={d};s={s};t={t};E={E};U={U};hash={v} */
    char text[160];
    uint8_t digest[32];
    size_t pos = 0;
    int rc = coco_spec_check(spec);
    const char *parts[8];
    uint64_t values[7];
    unsigned i;
    if (out == NULL) {
        return COCO_ERR_NULL;
    }
    if (rc != COCO_OK && rc != COCO_ERR_SPEC_S_MAX) {
        return rc; /* a spec beyond COCO_MAX_S still has a fingerprint */
    }
    parts[0] = spec->mechanism == COCO_COCO ? "coco-fleet/spec/v1;mechanism=coco;d="
                                             : "coco-fleet/spec/v1;mechanism=collision;d=";
    parts[1] = ";s=";
    parts[2] = ";t=";
    parts[3] = ";E=";
    parts[4] = ";U=";
    parts[5] = ";hash=";
    values[0] = spec->d;
    values[1] = spec->s;
    values[2] = spec->t;
    values[3] = spec->exp_eps_weight;
    values[4] = COCO_UNIT_WEIGHT;
    values[5] = spec->hash_version;
    for (i = 0; i < 6; i++) {
        const char *p = parts[i];
        while (*p != 0) {
            text[pos++] = *p++; /* at most 40 + 5 * 6 characters of literals */
        }
        if (coco__put_decimal(text, sizeof text, &pos, values[i]) != 0) {
            return COCO_ERR_BUFFER; /* cannot happen: 160 bytes hold the longest string */
        }
    }
    coco__sha256((const uint8_t *)text, pos, digest);
    *out = coco__get32(digest);
    return COCO_OK;
}

int coco_spec_verify_fingerprint(const coco_spec *spec) {
    uint32_t fp;
    int rc = coco_spec_fingerprint(spec, &fp);
    if (rc != COCO_OK) {
        return rc;
    }
    return fp == spec->fingerprint ? COCO_OK : COCO_ERR_FINGERPRINT;
}
