/* The local privacy-budget ledger (edge/ledger.py and edge/budget.py, protocol section 12.1):
 * a record in the caller's persistent storage, charged and stored durably before a report
 * is drawn, with a lifetime cap, a period cap, or both.
 *
 * Record version 2, 40 bytes (big-endian): "coLd" | 2 | 3 zero bytes | spent u64 | reports u32
 * | period_seconds u32 (0: no period kept yet) | period u32 (the highest period index charged)
 * | period_spent u64 | CRC-32 (IEEE 802.3) of the first 36 bytes. Version 1, 24 bytes: "coLd" |
 * 1 | 3 zero bytes | spent u64 | reports u32 | CRC-32 of the first 20 (the bytes after it are
 * ignored) is still read, as a ledger without period history, and rewritten as version 2 at
 * the next charge. A record that fails any check is refused (COCO_ERR_LEDGER_CORRUPT), never
 * reset: a reset would hand the device a fresh budget.
 *
 * The safe side of the period cap (as edge/budget.py): a charge dated in a period below the
 * highest one charged is charged to that highest period, so a clock set back never renews a
 * budget; a record kept with another period length carries its period's spending to the new
 * period holding the last second of the old one. */
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

static void put64(uint8_t *p, uint64_t v) {
    coco__put32(p, (uint32_t)(v >> 32));
    coco__put32(p + 4, (uint32_t)v);
}

static uint64_t get64(const uint8_t *p) {
    return ((uint64_t)coco__get32(p) << 32) | coco__get32(p + 4);
}

/* The state a charge leaves behind (what the record stores). */
typedef struct {
    uint64_t spent;
    uint32_t reports;
    uint32_t period_seconds;
    uint32_t period;
    uint64_t period_spent;
} state;

static void encode(uint8_t rec[COCO_LEDGER_RECORD_SIZE], const state *s) {
    rec[0] = 'c';
    rec[1] = 'o';
    rec[2] = 'L';
    rec[3] = 'd';
    rec[4] = 2;
    rec[5] = rec[6] = rec[7] = 0;
    put64(rec + 8, s->spent);
    coco__put32(rec + 16, s->reports);
    coco__put32(rec + 20, s->period_seconds);
    coco__put32(rec + 24, s->period);
    put64(rec + 28, s->period_spent);
    coco__put32(rec + 36, crc32(rec, 36));
}

static int decode(const uint8_t rec[COCO_LEDGER_RECORD_SIZE], state *s) {
    if (rec[0] != 'c' || rec[1] != 'o' || rec[2] != 'L' || rec[3] != 'd' || rec[5] != 0 ||
        rec[6] != 0 || rec[7] != 0) {
        return COCO_ERR_LEDGER_CORRUPT;
    }
    s->spent = get64(rec + 8);
    s->reports = coco__get32(rec + 16);
    if (rec[4] == 1) {
        if (coco__get32(rec + 20) != crc32(rec, 20)) {
            return COCO_ERR_LEDGER_CORRUPT;
        }
        s->period_seconds = s->period = 0;
        s->period_spent = 0;
        return COCO_OK;
    }
    if (rec[4] != 2 || coco__get32(rec + 36) != crc32(rec, 36)) {
        return COCO_ERR_LEDGER_CORRUPT;
    }
    s->period_seconds = coco__get32(rec + 20);
    s->period = coco__get32(rec + 24);
    s->period_spent = get64(rec + 28);
    if (s->period_seconds > COCO_MAX_PERIOD_SECONDS || s->period_spent > s->spent ||
        (s->period_seconds == 0 && (s->period != 0 || s->period_spent != 0))) {
        return COCO_ERR_LEDGER_CORRUPT; /* fields no charge can produce */
    }
    return COCO_OK;
}

int coco_ledger_open_period(coco_ledger *ledger, const coco_ledger_io *io, uint64_t total_units,
                            uint32_t period_seconds, uint64_t period_units) {
    uint8_t rec[COCO_LEDGER_RECORD_SIZE];
    state s;
    int rc;
    if (ledger == NULL || io == NULL || io->load == NULL || io->store == NULL) {
        return COCO_ERR_NULL;
    }
    if (period_seconds > COCO_MAX_PERIOD_SECONDS) {
        return COCO_ERR_ARG;
    }
    s.spent = s.period_spent = 0;
    s.reports = s.period_seconds = s.period = 0;
    rc = io->load(io->ctx, rec);
    if (rc == 1) { /* a new device: store the empty record now, so bad storage fails early */
        encode(rec, &s);
        if (io->store(io->ctx, rec) != 0) {
            return COCO_ERR_STORAGE;
        }
    } else if (rc != 0) {
        return COCO_ERR_STORAGE;
    } else if (decode(rec, &s) != COCO_OK) {
        return COCO_ERR_LEDGER_CORRUPT;
    }
    if (period_seconds != 0 && s.period_seconds != 0 && s.period_seconds != period_seconds) {
        /* another period length: carry the spending to the period holding the old one's end */
        uint64_t last = ((uint64_t)s.period + 1u) * s.period_seconds - 1u;
        uint64_t index = last / period_seconds;
        if (index > 0xFFFFFFFFu) {
            return COCO_ERR_LEDGER_CORRUPT;
        }
        s.period = (uint32_t)index;
        s.period_seconds = period_seconds;
    }
    ledger->io = *io;
    ledger->total_units = total_units;
    ledger->spent_units = s.spent;
    ledger->reports = s.reports;
    ledger->cap_seconds = period_seconds;
    ledger->cap_units = period_units;
    ledger->period_seconds = s.period_seconds;
    ledger->period = s.period;
    ledger->period_spent_units = s.period_spent;
    ledger->now = 0;
    return COCO_OK;
}

int coco_ledger_open(coco_ledger *ledger, const coco_ledger_io *io, uint64_t total_units) {
    return coco_ledger_open_period(ledger, io, total_units, 0, 0);
}

int coco_ledger_set_time(coco_ledger *ledger, int64_t unix_seconds) {
    if (ledger == NULL) {
        return COCO_ERR_NULL;
    }
    if (unix_seconds < COCO_CLOCK_FLOOR) {
        return COCO_ERR_CLOCK;
    }
    ledger->now = unix_seconds;
    return COCO_OK;
}

/* The state after one charge of cost at ledger->now, or why not (lifetime first). */
static int decide(const coco_ledger *ledger, uint64_t cost, state *s) {
    uint64_t index;
    s->spent = ledger->spent_units + cost;
    s->reports = ledger->reports + 1u;
    s->period_seconds = ledger->period_seconds;
    s->period = ledger->period;
    s->period_spent = ledger->period_spent_units;
    if (s->spent < cost || s->spent > ledger->total_units || ledger->reports == 0xFFFFFFFFu) {
        return COCO_ERR_BUDGET;
    }
    if (ledger->cap_seconds == 0) {
        return COCO_OK; /* no period cap: any period history is kept as it is */
    }
    if (ledger->now < COCO_CLOCK_FLOOR) {
        return COCO_ERR_CLOCK; /* coco_ledger_set_time was not called */
    }
    index = (uint64_t)ledger->now / ledger->cap_seconds;
    if (index > 0xFFFFFFFFu) {
        return COCO_ERR_CLOCK;
    }
    if (ledger->period_seconds != 0 && index <= ledger->period) {
        index = ledger->period; /* the same period, or a clock set back: never renews */
    } else {
        s->period_spent = 0;
    }
    s->period_spent += cost;
    if (s->period_spent < cost || s->period_spent > ledger->cap_units) {
        return COCO_ERR_PERIOD_BUDGET;
    }
    s->period_seconds = ledger->cap_seconds;
    s->period = (uint32_t)index;
    return COCO_OK;
}

int coco_ledger_charge(coco_ledger *ledger, uint64_t cost_units) {
    uint8_t rec[COCO_LEDGER_RECORD_SIZE];
    state s;
    int rc;
    if (ledger == NULL || ledger->io.store == NULL) {
        return COCO_ERR_NULL;
    }
    if (cost_units == 0) {
        return COCO_ERR_ARG; /* a report always costs its epsilon > 0 */
    }
    rc = decide(ledger, cost_units, &s);
    if (rc != COCO_OK) {
        return rc; /* nothing recorded */
    }
    encode(rec, &s);
    if (ledger->io.store(ledger->io.ctx, rec) != 0) {
        return COCO_ERR_STORAGE; /* nothing recorded: the report must not be released */
    }
    ledger->spent_units = s.spent;
    ledger->reports = s.reports;
    ledger->period_seconds = s.period_seconds;
    ledger->period = s.period;
    ledger->period_spent_units = s.period_spent;
    return COCO_OK;
}

int coco_ledger_charge_at(coco_ledger *ledger, uint64_t cost_units, int64_t unix_seconds) {
    int rc = coco_ledger_set_time(ledger, unix_seconds);
    return rc == COCO_OK ? coco_ledger_charge(ledger, cost_units) : rc;
}

int coco_ledger_renews_at(const coco_ledger *ledger, int64_t *unix_seconds) {
    uint64_t index;
    if (ledger == NULL || unix_seconds == NULL) {
        return COCO_ERR_NULL;
    }
    if (ledger->cap_seconds == 0) {
        return COCO_ERR_ARG; /* no period cap */
    }
    if (ledger->now < COCO_CLOCK_FLOOR) {
        return COCO_ERR_CLOCK;
    }
    index = (uint64_t)ledger->now / ledger->cap_seconds;
    if (ledger->period_seconds != 0 && index < ledger->period) {
        index = ledger->period;
    }
    *unix_seconds = (int64_t)((index + 1u) * ledger->cap_seconds);
    return COCO_OK;
}
