/*
 * libcoco: eps-LDP reports of protocol coco/v1 (CoCo and Collision) for microcontrollers.
 *
 * The one public header. Everything here is specified bit for bit in docs/protocol.md of
 * coco-fleet; the reference implementation is edge/device.py (and edge/codec.py,
 * edge/rounds.py, edge/announce.py, edge/shards.py). The library reproduces every published
 * test vector (docs/vectors-v1.json, docs/wire-vectors-v1.json) on the host and on an
 * emulated Cortex-M0+/M4.
 *
 * Properties:
 *   - C99, freestanding: needs <stddef.h> and <stdint.h>; no libc call, no malloc, no global
 *     or static mutable state (every function is reentrant), stack use bounded by
 *     COCO_MAX_S (libcoco/README.md has the measured numbers).
 *   - The randomisers, the hash family, the codec, rounds, topics, the announcement parser
 *     and the ledger use integer arithmetic only. Floating point appears in exactly one
 *     place: coco_ternarise() and coco_pad_key_values() turn a real-valued reading into a
 *     sign probability (protocol section 6.1), in IEEE double, as the reference does, so
 *     the results are bit-exact with it. coco_ternarise_int() is the integer alternative for
 *     integer readings (ADC counts): its sign probabilities are exact rationals rounded to
 *     2^-32, with no float at all.
 *   - Bad input returns a documented negative error code (enum coco_status), never undefined
 *     behaviour. Outputs are written only on success unless a function says otherwise.
 *   - Randomness comes from a caller-supplied CSPRNG callback (coco_rng). What qualifies:
 *     a hardware TRNG, or a cryptographic DRBG (CTR_DRBG, HMAC_DRBG, ChaCha20) seeded from
 *     one. Never rand(), a linear congruential generator, MicroPython's random, or anything
 *     seeded from the time, the device id or the data. A failing callback makes every
 *     function return COCO_ERR_RNG and send nothing.
 */
#ifndef COCO_H
#define COCO_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define COCO_VERSION "1.0.0"
#define COCO_PROTOCOL "coco/v1"
#define COCO_HASH_VERSION 1u
/* U = 2^24: the integer weight of probability ratio 1 (protocol section 2.2). */
#define COCO_UNIT_WEIGHT 16777216u

/* The largest s (non-zero entries per input) the randomisers and encoders accept. It sizes
 * their stack arrays (2 bytes per entry in the randomisers, 8 in the encoders); a spec with
 * a larger s is refused with COCO_ERR_SPEC_S_MAX. Override with -DCOCO_MAX_S=n (1..4096). */
#ifndef COCO_MAX_S
#define COCO_MAX_S 32
#endif

#define COCO_REPORT_SIZE 16
#define COCO_BATCH_HEADER_SIZE 30
#define COCO_RECORD_SIZE 6
#define COCO_BATCH_ID_SIZE 16
#define COCO_PUBLIC_KEY_SIZE 32

/* 2025-01-01T00:00:00Z: a clock that reads earlier has not been set (protocol 11.2). */
#define COCO_CLOCK_FLOOR 1735689600
#define COCO_MAX_ROUND_SECONDS 86400u

/* Topic levels (deployment, device id): 1 to 64 characters of UTF-8, no '/', '+', '#', NUL. */
#define COCO_MAX_NAME_CHARS 64
#define COCO_MAX_SHARDS 256u
#define COCO_MAX_GENERATION 65535u
#define COCO_MAX_LAYOUTS 2
/* "g65535s255" plus NUL. */
#define COCO_LABEL_SIZE 11
/* Room for any topic the library builds: "coco/v1/" + 256 + "/ingress/" + 10 + "/" + 256 + NUL. */
#define COCO_TOPIC_SIZE 541

/* Error codes. COCO_OK is 0; every error is negative. coco_strerror() names them. */
enum coco_status {
    COCO_OK = 0,
    COCO_ERR_NULL = -1,              /* a required pointer or callback is NULL */
    COCO_ERR_SPEC_MECHANISM = -2,    /* mechanism is neither COCO_COCO nor COCO_COLLISION */
    COCO_ERR_SPEC_D = -3,            /* d outside [1, 2^30] */
    COCO_ERR_SPEC_S = -4,            /* s outside [1, d] */
    COCO_ERR_SPEC_T = -5,            /* t: CoCo even and 2s+2 <= t, Collision s+1 <= t; t <= 65535 */
    COCO_ERR_SPEC_WEIGHT = -6,       /* E <= U, or Omega >= 2^53 */
    COCO_ERR_SPEC_HASH_VERSION = -7, /* hash_version is not 1 */
    COCO_ERR_SPEC_S_MAX = -8,        /* s > COCO_MAX_S, the compiled limit */
    COCO_ERR_INPUT = -9,             /* sparse input: count != s, key out of range or twice, sign not +-1 */
    COCO_ERR_READING = -10,          /* a reading NaN/infinite or outside [lo, hi] (no clip); a value outside [-1, 1] */
    COCO_ERR_RANGE = -11,            /* a channel range with lo >= hi or a non-finite bound */
    COCO_ERR_OVERFLOW = -12,         /* more key-value pairs than s and sample_overflow is off */
    COCO_ERR_RNG = -13,              /* the random callback failed (or returned 128 rejections in a row) */
    COCO_ERR_CLOCK = -14,            /* the clock reads before 2025-01-01, or the round exceeds 2^32 - 1 */
    COCO_ERR_ROUND_SECONDS = -15,    /* round_seconds outside [1, 86400] */
    COCO_ERR_JSON = -16,             /* the announcement is not JSON (syntax) */
    COCO_ERR_ANNOUNCEMENT = -17,     /* valid JSON, but a key is missing, unknown, repeated or out of range */
    COCO_ERR_FINGERPRINT = -18,      /* the spec's fingerprint is not SHA-256 of its canonical string */
    COCO_ERR_NAME = -19,             /* a deployment or device name that is not a valid topic level */
    COCO_ERR_BUFFER = -20,           /* the output buffer is too small */
    COCO_ERR_NO_LAYOUT = -21,        /* sharded deployment: no layout in force for this round */
    COCO_ERR_BUDGET = -22,           /* the ledger refuses the charge: budget exhausted */
    COCO_ERR_STORAGE = -23,          /* the ledger's load or store callback failed */
    COCO_ERR_LEDGER_CORRUPT = -24,   /* the stored ledger record fails its checks (never reset) */
    COCO_ERR_BAD_LENGTH = -25,       /* wire: "bad_length" */
    COCO_ERR_BAD_VERSION = -26,      /* wire: "bad_version" */
    COCO_ERR_BAD_KIND = -27,         /* wire: "bad_kind" */
    COCO_ERR_BAD_COUNT = -28,        /* wire: "bad_count" */
    COCO_ERR_BAD_FIELD = -29,        /* wire: "bad_field" (a field out of range when encoding) */
    COCO_ERR_ARG = -30,              /* another argument out of its documented range */
    COCO_ERR_PERIOD_BUDGET = -31     /* the ledger refuses the charge: this period's budget is spent */
};

/* The name of a status code: "ok", "null", ..., the wire reasons "bad_length" etc. exactly as
 * edge/codec.py names them; "unknown" for anything else. */
const char *coco_strerror(int status);

/* ---------------------------------------------------------------------------------------
 * Randomness
 * ------------------------------------------------------------------------------------- */

/* Fills buf with len cryptographically strong random bytes; returns 0 on success, anything
 * else on failure. The signature of mbedtls_ctr_drbg_random / mbedtls_hmac_drbg_random, so
 * those can be passed directly. The library always asks for 4 bytes, read big-endian as one
 * 32-bit word, and takes the top k bits of a fresh word for each getrandbits(k) of the
 * protocol (section 4.1). */
typedef int (*coco_random_fn)(void *ctx, unsigned char *buf, size_t len);

typedef struct coco_rng {
    coco_random_fn fill;
    void *ctx;
} coco_rng;

/* One uniform 32-bit word (a report seed). */
int coco_random_u32(const coco_rng *rng, uint32_t *out);

/* randbelow(n) of protocol 4.2: uniform in [0, n) for 1 <= n < 2^64 by rejection; n == 1
 * draws nothing. After 128 rejections in a row (probability below 2^-128 with a working
 * source) it gives up with COCO_ERR_RNG instead of looping forever on a stuck source. */
int coco_randbelow(const coco_rng *rng, uint64_t n, uint64_t *out);

/* The deterministic test stream xxh32_stream(seed) of protocol 7.1: word i is
 * coco_xxh32_u32(i, seed). FOR TEST VECTORS ONLY, never for real reports. Use it as
 *   coco_test_stream st = {seed, 0}; coco_rng rng = {coco_test_stream_fill, &st}; */
typedef struct coco_test_stream {
    uint32_t seed;
    uint32_t index;
} coco_test_stream;
int coco_test_stream_fill(void *ctx, unsigned char *buf, size_t len);

/* ---------------------------------------------------------------------------------------
 * Hash family v1 (protocol section 3) and full-length XXH32
 * ------------------------------------------------------------------------------------- */

/* XXH32 of the 4-byte little-endian encoding of key, seeded: the hash family v1. */
uint32_t coco_xxh32_u32(uint32_t key, uint32_t seed);
/* XXH32 of len bytes (any length), the standard algorithm (equal to xxHash's XXH32). */
uint32_t coco_xxh32(const void *data, size_t len, uint32_t seed);
/* Collision's bucket of element key y: (xxh32_u32(y, seed) * t) >> 32. */
uint32_t coco_collision_bucket(uint32_t key, uint32_t seed, uint32_t t);
/* CoCo's H1 (*pair, in [0, half)) and H2 (*h2, +1 or -1) of dimension j. */
void coco_coco_hash(uint32_t j, uint32_t seed, uint32_t half, uint32_t *pair, int *h2);

/* ---------------------------------------------------------------------------------------
 * The mechanism spec (protocol section 2) and the randomisers (section 5)
 * ------------------------------------------------------------------------------------- */

enum coco_mechanism { COCO_COCO = 1, COCO_COLLISION = 2 };

/* A validated spec as announced (or compiled in). epsilon does not appear: the randomiser
 * uses only E = exp_eps_weight, taken from the announcement; a device never computes exp. */
typedef struct coco_spec {
    uint32_t mechanism;      /* COCO_COCO or COCO_COLLISION */
    uint32_t d;              /* 1 <= d <= 2^30 */
    uint32_t s;              /* 1 <= s <= d, s <= COCO_MAX_S */
    uint32_t t;              /* CoCo: even, 2s+2 <= t; Collision: s+1 <= t; t <= 65535 */
    uint64_t exp_eps_weight; /* E = floor(e^eps * 2^24) > 2^24, from the announcement */
    uint32_t hash_version;   /* 1 */
    uint32_t fingerprint;    /* the spec's fingerprint as an integer (first 4 bytes of SHA-256) */
} coco_spec;

/* COCO_OK if every field is in range (the fingerprint is not checked here). */
int coco_spec_check(const coco_spec *spec);

/* SHA-256 of the canonical string (protocol 2.4): *out = the fingerprint the fields give. */
int coco_spec_fingerprint(const coco_spec *spec, uint32_t *out);
/* COCO_OK if spec->fingerprint equals coco_spec_fingerprint(), else COCO_ERR_FINGERPRINT. */
int coco_spec_verify_fingerprint(const coco_spec *spec);

/* COCO_OK if (keys, signs) is a valid input: exactly n == s entries, distinct keys in
 * [0, d), signs +1 or -1. */
int coco_check_input(const coco_spec *spec, const uint32_t *keys, const int8_t *signs,
                     uint32_t n);

/* One randomised output z in [0, t) of the spec's mechanism for the s-sparse ternary input
 * (keys, signs) under report seed `seed` (protocol 5.2 Collision, 5.4 CoCo; bit-exact with
 * edge/device.py). Checks the spec and the input first. Integer arithmetic only, no
 * division. */
int coco_randomise(const coco_spec *spec, const uint32_t *keys, const int8_t *signs,
                   uint32_t n, uint32_t seed, const coco_rng *rng, uint16_t *z);

/* ---------------------------------------------------------------------------------------
 * Encoders (protocol section 6): readings -> s-sparse ternary vector
 * ------------------------------------------------------------------------------------- */

/* ternarise(values, lo, hi, s, clip) of protocol 6.3 for d = channels channels: validates
 * every channel first (finite reading, finite lo < hi, reading inside [lo, hi] unless clip),
 * then draws s channels (partial Fisher-Yates, in draw order) into keys[0..s) and a sign
 * for each into signs[0..s). IEEE double, bit-exact with edge/device.ternarise where the
 * compiler evaluates doubles in double precision (FLT_EVAL_METHOD 0, no FMA contraction:
 * build with -ffp-contract=off, as libcoco's CMakeLists.txt does). */
int coco_ternarise(const double *values, const double *lo, const double *hi,
                   uint32_t channels, uint32_t s, int clip, const coco_rng *rng,
                   uint32_t *keys, int8_t *signs);

/* As coco_ternarise for integer readings (ADC counts) with integer bounds, without any
 * floating point: the sign of channel j is +1 with probability
 * floor(2^32 (x_j - lo_j) / (hi_j - lo_j)) / 2^32, the exact (1 + v_j) / 2 rounded down to
 * 2^-32. Same draws in the same order as coco_ternarise; the sign thresholds can differ
 * from the double computation by its rounding (at most a few units of 2^-32). */
int coco_ternarise_int(const int32_t *values, const int32_t *lo, const int32_t *hi,
                       uint32_t channels, uint32_t s, int clip, const coco_rng *rng,
                       uint32_t *keys, int8_t *signs);

/* pad_key_values(pairs, d, s, sample_overflow) of protocol 6.4: k pairs (pair_keys[i],
 * pair_values[i]) with distinct keys in [0, d) and values in [-1, 1] -> exactly s keys in
 * [0, d + s) with signs. The mechanism then runs on d + s dimensions. */
int coco_pad_key_values(const uint32_t *pair_keys, const double *pair_values, uint32_t k,
                        uint32_t d, uint32_t s, int sample_overflow, const coco_rng *rng,
                        uint32_t *keys, int8_t *signs);

/* ---------------------------------------------------------------------------------------
 * Wire format v1 (protocol section 10)
 * ------------------------------------------------------------------------------------- */

typedef struct coco_report {
    uint32_t fingerprint;
    uint32_t round;
    uint32_t seed;
    uint16_t z;
} coco_report;

typedef struct coco_batch_header {
    uint32_t fingerprint;
    uint32_t round;
    uint8_t batch_id[COCO_BATCH_ID_SIZE];
    uint32_t count;
} coco_batch_header;

/* The 16-byte report version | kind | fingerprint | round | seed | z (big-endian);
 * COCO_ERR_BAD_FIELD if z > 65535. */
int coco_encode_report(uint32_t fingerprint, uint32_t round, uint32_t seed, uint32_t z,
                       uint8_t out[COCO_REPORT_SIZE]);
/* Decoding checks in the protocol's order: < 2 bytes (BAD_LENGTH), version (BAD_VERSION),
 * kind (BAD_KIND), exact length (BAD_LENGTH). */
int coco_decode_report(const uint8_t *buf, size_t len, coco_report *out);

/* The 30-byte batch header of `count` records. */
int coco_encode_batch_header(uint32_t fingerprint, uint32_t round,
                             const uint8_t batch_id[COCO_BATCH_ID_SIZE], uint32_t count,
                             uint8_t out[COCO_BATCH_HEADER_SIZE]);
/* One 6-byte record seed | z; COCO_ERR_BAD_FIELD if z > 65535. */
int coco_encode_record(uint32_t seed, uint32_t z, uint8_t out[COCO_RECORD_SIZE]);
/* Checks prefix, header length (BAD_LENGTH) and that len == 30 + 6 count (BAD_COUNT). */
int coco_decode_batch_header(const uint8_t *buf, size_t len, coco_batch_header *out);
/* Record i of a batch whose header decoded: COCO_ERR_ARG if i >= count. */
int coco_batch_record(const uint8_t *buf, size_t len, uint32_t i, uint32_t *seed,
                      uint16_t *z);

/* ---------------------------------------------------------------------------------------
 * Rounds (protocol section 11)
 * ------------------------------------------------------------------------------------- */

/* *round = floor(unix_seconds / round_seconds). COCO_ERR_CLOCK when the clock reads before
 * 2025-01-01 (not set: do not report) or the round does not fit 32 bits;
 * COCO_ERR_ROUND_SECONDS unless 1 <= round_seconds <= 86400. */
int coco_round_of(int64_t unix_seconds, uint32_t round_seconds, uint32_t *round);
/* Whole seconds until the next round starts, in [1, round_seconds]. Same errors. */
int coco_seconds_to_next_round(int64_t unix_seconds, uint32_t round_seconds,
                               uint32_t *seconds);

/* ---------------------------------------------------------------------------------------
 * The announcement (protocol 10.5) and sharded deployments
 * ------------------------------------------------------------------------------------- */

typedef struct coco_shard_layout {
    uint32_t count;      /* shards, 1..256 */
    uint32_t from_round; /* first round of the layout */
    uint32_t seed;       /* XXH32 seed of the shard assignment */
    uint32_t generation; /* 0..65535 */
} coco_shard_layout;

typedef struct coco_announcement {
    coco_spec spec;
    uint32_t round_seconds;
    uint32_t min_batch;
    /* The spec's epsilon in ledger units of 2^-32, rounded up: what one report costs. */
    uint64_t epsilon_units;
    uint8_t has_batch_public_key;
    uint8_t batch_public_key[COCO_PUBLIC_KEY_SIZE]; /* raw RFC 8032 Ed25519 key */
    uint8_t layout_count;                           /* 0: unsharded */
    coco_shard_layout layouts[COCO_MAX_LAYOUTS];    /* sorted by from_round */
    /* participation q in units of 2^-32, rounded down: 2^32 (q = 1) when not announced */
    uint64_t participation_units;
    /* The deployment's device period policy (protocol 10.5, 12.1): at most
     * budget_per_period_units (2^-32 epsilon, rounded down) per period of period_seconds;
     * both 0 when not announced. Pass them to coco_ledger_open_period. */
    uint32_t period_seconds;
    uint64_t budget_per_period_units;
} coco_announcement;

/* Parses the retained announcement (UTF-8 JSON of len bytes, not NUL-terminated) in
 * constant memory, without recursion or malloc. Checks every key of protocol 10.5 and of the
 * optional shards layouts: required keys present, no unknown or repeated key, integers in
 * range (the optional participation q in (0, 1]; the optional period_seconds and
 * budget_per_period together, the period a multiple of round_seconds up to 366 days, the budget
 * rounded down at least epsilon_units), the spec's fields (coco_spec_check), hash_version 1 (else
 * COCO_ERR_SPEC_HASH_VERSION), unit_weight 2^24, the fingerprint against SHA-256 of the
 * canonical string (COCO_ERR_FINGERPRINT), and epsilon against exp_eps_weight
 * (ln(E/U) <= epsilon < ln((E+1)/U), up to 2^-16, with an integer logarithm). Not checked
 * (the services check them; a device does not use them): that the shards' public keys are
 * distinct, and that delta rounds to a double in (0, 1). The first problem met decides the
 * code: COCO_ERR_JSON for syntax, COCO_ERR_ANNOUNCEMENT for a key or value. *out is valid
 * only on COCO_OK. */
int coco_announcement_parse(const uint8_t *json, size_t len, coco_announcement *out);

/* Participation sampling (protocol 12.2): whether the device reports in this round, decided
 * once at the start of the round from the CSPRNG: *yes = 1 if a fresh 32-bit word is below
 * a->participation_units (probability q rounded down to 2^-32), else 0. Draws nothing when
 * q = 1. A device that sits a round out charges nothing and sends nothing. */
int coco_participates(const coco_announcement *a, const coco_rng *rng, int *yes);

/* A decimal JSON number (e.g. "0.5", "1e-05") in units of 2^-32, rounded up (round_up != 0)
 * or down, exactly, in integer arithmetic. COCO_ERR_ARG for text that is not exactly one
 * JSON number, a negative number, or one >= 2^31. */
int coco_decimal_units(const char *text, size_t len, int round_up, uint64_t *units);

/* The layout in force for round r: the one with the largest from_round <= r. Unsharded
 * (layout_count 0): *layout = NULL and COCO_OK. Before the first layout: COCO_ERR_NO_LAYOUT
 * (the device does not report in that round). */
int coco_layout_for_round(const coco_announcement *a, uint32_t round,
                          const coco_shard_layout **layout);

/* (XXH32(device_id bytes, seed) * count) >> 32, the shard of a device; 0 when count is 0. */
uint32_t coco_shard_index(const char *device_id, size_t len, uint32_t seed, uint32_t count);

/* "g<generation>s<index>" into buf (NUL-terminated). */
int coco_shard_label(uint32_t generation, uint32_t index, char *buf, size_t cap);

/* "coco/v1/<deployment>/spec". */
int coco_spec_topic(const char *deployment, char *buf, size_t cap);
/* "coco/v1/<deployment>/ingress/<device-id>", or with label != NULL
 * "coco/v1/<deployment>/ingress/<label>/<device-id>". Names are checked (COCO_ERR_NAME). */
int coco_ingress_topic(const char *deployment, const char *device_id, const char *label,
                       char *buf, size_t cap);
/* The ingress topic of device_id's report of round r under announcement a: the shard of
 * the layout in force (COCO_ERR_NO_LAYOUT before the first), or unsharded. */
int coco_device_ingress_topic(const coco_announcement *a, const char *deployment,
                              const char *device_id, uint32_t round, char *buf, size_t cap);

/* ---------------------------------------------------------------------------------------
 * Budget ledger (protocol section 12; edge/ledger.py): charge before transmit
 * ------------------------------------------------------------------------------------- */

/* Budgets are counted in units of 2^-32 epsilon. A charge is the report's epsilon rounded
 * up (coco_announcement.epsilon_units), a cap is rounded down, so the ledger never spends
 * more than edge/ledger.py's exact arithmetic would allow (exactly the same for epsilons
 * that are multiples of 2^-32, such as 0.5 or 1).
 *
 * Two caps, either or both (protocol 12.1): a lifetime cap total_units (UINT64_MAX: none),
 * refused with COCO_ERR_BUDGET for good; and a period cap of period_units per period of
 * period_seconds, periods aligned on Unix time (period k = [k P, (k + 1) P)), refused with
 * COCO_ERR_PERIOD_BUDGET until the next period (coco_ledger_renews_at). A charge goes to the
 * period of the ledger's time (coco_ledger_set_time: the start of the report's round,
 * round * round_seconds); a time in a period below the highest one charged is charged to
 * that highest one, so a clock set back never renews a budget. */
#define COCO_LEDGER_RECORD_SIZE 40
/* The longest period of a period cap: 366 days, as edge/budget.py. */
#define COCO_MAX_PERIOD_SECONDS 31622400u
/* The version-1 record (lifetime only), still read: storage written by an older libcoco
 * holds 24 bytes, and load may return them followed by anything. */
#define COCO_LEDGER_V1_RECORD_SIZE 24

/* Persistent storage for one 40-byte record (a flash page, EEPROM, a file). load returns 0
 * with the record, 1 when nothing was ever stored (a new device), anything else on error.
 * store returns 0 only once the record is durable (written and flushed: a crash after it
 * returns must not lose it). */
typedef struct coco_ledger_io {
    int (*load)(void *ctx, uint8_t record[COCO_LEDGER_RECORD_SIZE]);
    int (*store)(void *ctx, const uint8_t record[COCO_LEDGER_RECORD_SIZE]);
    void *ctx;
} coco_ledger_io;

typedef struct coco_ledger {
    coco_ledger_io io;
    uint64_t total_units;        /* the lifetime cap in force */
    uint64_t spent_units;        /* spent in the device's life */
    uint32_t reports;
    uint32_t cap_seconds;        /* the period cap in force: its period length, 0 for none */
    uint64_t cap_units;          /* ... and its budget per period */
    uint32_t period_seconds;     /* the length the period history was kept with (0: none) */
    uint32_t period;             /* the highest period index charged */
    uint64_t period_spent_units; /* what that period spent */
    int64_t now;                 /* Unix time of the next charge (coco_ledger_set_time) */
} coco_ledger;

/* Loads the stored record (COCO_ERR_LEDGER_CORRUPT if it fails its checks: the ledger is
 * never silently reset) or starts and stores a new one; a lifetime cap only. */
int coco_ledger_open(coco_ledger *ledger, const coco_ledger_io *io, uint64_t total_units);
/* As coco_ledger_open, with a period cap of period_units per period_seconds (1 to 31622400,
 * 366 days; 0: no period cap). A record kept with another period length carries its
 * period's spending to the new period holding the last second of the old one. */
int coco_ledger_open_period(coco_ledger *ledger, const coco_ledger_io *io, uint64_t total_units,
                            uint32_t period_seconds, uint64_t period_units);
/* The Unix time the next charges are made at: the start of the report's round. Needed
 * under a period cap (a charge before it is COCO_ERR_CLOCK); COCO_ERR_CLOCK before
 * 2025-01-01. */
int coco_ledger_set_time(coco_ledger *ledger, int64_t unix_seconds);
/* Records one report of cost_units at the ledger's time: COCO_ERR_BUDGET (lifetime cap) or
 * COCO_ERR_PERIOD_BUDGET (period cap), nothing recorded, if spent + cost would exceed a cap
 * (the lifetime cap is checked first); COCO_ERR_STORAGE (nothing recorded) if the record
 * cannot be stored. */
int coco_ledger_charge(coco_ledger *ledger, uint64_t cost_units);
/* coco_ledger_set_time, then coco_ledger_charge. */
int coco_ledger_charge_at(coco_ledger *ledger, uint64_t cost_units, int64_t unix_seconds);
/* When the period a charge at the ledger's time goes to ends: the Unix time a device refused
 * with COCO_ERR_PERIOD_BUDGET waits for (COCO_ERR_ARG without a period cap). A cap below one
 * report's cost never fits, whatever the period: check cost <= cap once at start-up. */
int coco_ledger_renews_at(const coco_ledger *ledger, int64_t *unix_seconds);

/* ---------------------------------------------------------------------------------------
 * One report, start to finish
 * ------------------------------------------------------------------------------------- */

/* Checks the spec and the input, charges the ledger (durably, before anything is drawn, at
 * the ledger's time: under a period cap call coco_ledger_set_time first),
 * draws a fresh seed, randomises and encodes the 16-byte report of `round` into out.
 * A retry of an unacknowledged publish MUST resend these same bytes, never call this again
 * for the same reading (protocol 11.4). */
int coco_make_report(const coco_spec *spec, uint32_t round, const uint32_t *keys,
                     const int8_t *signs, uint32_t n, const coco_rng *rng,
                     coco_ledger *ledger, uint64_t cost_units,
                     uint8_t out[COCO_REPORT_SIZE]);

#ifdef __cplusplus
}
#endif

#endif /* COCO_H */
