/* Hash family v1 (protocol section 3), full-length XXH32, the shard of a device and the
 * deterministic test stream (protocol 7.1). u32 arithmetic only. */
#include "coco_internal.h"

#define PRIME32_1 0x9E3779B1u
#define PRIME32_2 0x85EBCA77u
#define PRIME32_3 0xC2B2AE3Du
#define PRIME32_4 0x27D4EB2Fu
#define PRIME32_5 0x165667B1u

static uint32_t rotl32(uint32_t x, unsigned r) { return (x << r) | (x >> (32u - r)); }

static uint32_t avalanche(uint32_t h) {
    h ^= h >> 15;
    h *= PRIME32_2;
    h ^= h >> 13;
    h *= PRIME32_3;
    h ^= h >> 16;
    return h;
}

uint32_t coco_xxh32_u32(uint32_t key, uint32_t seed) {
    uint32_t h = seed + PRIME32_5 + 4u;
    h += key * PRIME32_3;
    h = rotl32(h, 17) * PRIME32_4;
    return avalanche(h);
}

static uint32_t read_le32(const uint8_t *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) |
           ((uint32_t)p[3] << 24);
}

static uint32_t round32(uint32_t acc, uint32_t lane) {
    acc += lane * PRIME32_2;
    return rotl32(acc, 13) * PRIME32_1;
}

uint32_t coco_xxh32(const void *data, size_t len, uint32_t seed) {
    const uint8_t *p = (const uint8_t *)data;
    size_t i = 0;
    uint32_t h;
    if (p == NULL) {
        len = 0;
    }
    if (len >= 16) {
        uint32_t v1 = seed + PRIME32_1 + PRIME32_2;
        uint32_t v2 = seed + PRIME32_2;
        uint32_t v3 = seed;
        uint32_t v4 = seed - PRIME32_1;
        for (; len - i >= 16; i += 16) {
            v1 = round32(v1, read_le32(p + i));
            v2 = round32(v2, read_le32(p + i + 4));
            v3 = round32(v3, read_le32(p + i + 8));
            v4 = round32(v4, read_le32(p + i + 12));
        }
        h = rotl32(v1, 1) + rotl32(v2, 7) + rotl32(v3, 12) + rotl32(v4, 18);
    } else {
        h = seed + PRIME32_5;
    }
    h += (uint32_t)len; /* the standard algorithm adds the length modulo 2^32 */
    for (; len - i >= 4; i += 4) {
        h += read_le32(p + i) * PRIME32_3;
        h = rotl32(h, 17) * PRIME32_4;
    }
    for (; i < len; i++) {
        h += (uint32_t)p[i] * PRIME32_5;
        h = rotl32(h, 11) * PRIME32_1;
    }
    return avalanche(h);
}

uint32_t coco_collision_bucket(uint32_t key, uint32_t seed, uint32_t t) {
    return (uint32_t)((COCO_U64(coco_xxh32_u32(key, seed)) * t) >> 32);
}

void coco_coco_hash(uint32_t j, uint32_t seed, uint32_t half, uint32_t *pair, int *h2) {
    uint32_t h = coco_xxh32_u32(j, seed);
    if (pair != NULL) {
        *pair = (uint32_t)((COCO_U64(h & 0x7FFFFFFFu) * half) >> 31);
    }
    if (h2 != NULL) {
        *h2 = (h >> 31) ? 1 : -1;
    }
}

uint32_t coco_shard_index(const char *device_id, size_t len, uint32_t seed, uint32_t count) {
    return (uint32_t)((COCO_U64(coco_xxh32(device_id, len, seed)) * count) >> 32);
}

int coco_test_stream_fill(void *ctx, unsigned char *buf, size_t len) {
    coco_test_stream *st = (coco_test_stream *)ctx;
    size_t i;
    if (st == NULL || buf == NULL) {
        return -1;
    }
    for (i = 0; i < len; i += 4) {
        uint32_t word = coco_xxh32_u32(st->index++, st->seed);
        size_t b;
        for (b = 0; b < 4 && i + b < len; b++) {
            buf[i + b] = (unsigned char)(word >> (24 - 8 * b));
        }
    }
    return 0;
}
