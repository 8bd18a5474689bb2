/* The local privacy-budget ledger (edge/ledger.py, protocol section 12): a 24-byte record in
 * the caller's persistent storage, charged and stored durably before a report is drawn.
 *
 * Record (big-endian): "coLd" | version 1 | 3 zero bytes | spent_units u64 | reports u32 |
 * CRC-32 (IEEE 802.3) of the first 20 bytes. A record that fails any check is refused
 * (COCO_ERR_LEDGER_CORRUPT), never reset: a reset would hand the device a fresh budget. */
#include "coco_internal.h"

static uint32_t crc32(const uint8_t *p, size_t n) {
    uint32_t crc = 0xFFFFFFFFu;
    size_t i;
    unsigned b;
    for (i = 0; i < n; i++) {
        crc ^= p[i];
        for (b = 0; b < 8; b++) {
            crc = (crc >> 1) ^ (0xEDB88320u & (0u - (crc & 1u)));
        }
    }
    return ~crc;
}

static void encode(uint8_t rec[COCO_LEDGER_RECORD_SIZE], uint64_t spent, uint32_t reports) {
    rec[0] = 'c';
    rec[1] = 'o';
    rec[2] = 'L';
    rec[3] = 'd';
    rec[4] = 1;
    rec[5] = rec[6] = rec[7] = 0;
    coco__put32(rec + 8, (uint32_t)(spent >> 32));
    coco__put32(rec + 12, (uint32_t)spent);
    coco__put32(rec + 16, reports);
    coco__put32(rec + 20, crc32(rec, 20));
}

int coco_ledger_open(coco_ledger *ledger, const coco_ledger_io *io, uint64_t total_units) {
    uint8_t rec[COCO_LEDGER_RECORD_SIZE];
    int rc;
    if (ledger == NULL || io == NULL || io->load == NULL || io->store == NULL) {
        return COCO_ERR_NULL;
    }
    rc = io->load(io->ctx, rec);
    if (rc == 1) { /* a new device: store the empty record now, so bad storage fails early */
        encode(rec, 0, 0);
        if (io->store(io->ctx, rec) != 0) {
            return COCO_ERR_STORAGE;
        }
    } else if (rc != 0) {
        return COCO_ERR_STORAGE;
    } else if (rec[0] != 'c' || rec[1] != 'o' || rec[2] != 'L' || rec[3] != 'd' || rec[4] != 1 ||
               rec[5] != 0 || rec[6] != 0 || rec[7] != 0 ||
               coco__get32(rec + 20) != crc32(rec, 20)) {
        return COCO_ERR_LEDGER_CORRUPT;
    }
    ledger->io = *io;
    ledger->total_units = total_units;
    ledger->spent_units = ((uint64_t)coco__get32(rec + 8) << 32) | coco__get32(rec + 12);
    ledger->reports = coco__get32(rec + 16);
    return COCO_OK;
}

int coco_ledger_charge(coco_ledger *ledger, uint64_t cost_units) {
    uint8_t rec[COCO_LEDGER_RECORD_SIZE];
    uint64_t spent;
    if (ledger == NULL || ledger->io.store == NULL) {
        return COCO_ERR_NULL;
    }
    if (cost_units == 0) {
        return COCO_ERR_ARG; /* a report always costs its epsilon > 0 */
    }
    spent = ledger->spent_units + cost_units;
    if (spent < cost_units || spent > ledger->total_units || ledger->reports == 0xFFFFFFFFu) {
        return COCO_ERR_BUDGET; /* nothing recorded */
    }
    encode(rec, spent, ledger->reports + 1);
    if (ledger->io.store(ledger->io.ctx, rec) != 0) {
        return COCO_ERR_STORAGE; /* nothing recorded: the report must not be released */
    }
    ledger->spent_units = spent;
    ledger->reports++;
    return COCO_OK;
}
