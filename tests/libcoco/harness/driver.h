/* The command interpreter's shared parts: output and input helpers (driver_io.c), its
 * state and protocol commands (driver.c), and the checks of error paths, randomness and
 * benchmarks (driver_checks.c). */
#ifndef HARNESS_DRIVER_H
#define HARNESS_DRIVER_H

#include "coco.h"
#include "platform.h"

#ifndef DRIVER_MAX_ITEMS
#define DRIVER_MAX_ITEMS 256
#endif
#ifndef DRIVER_MAX_BYTES
#define DRIVER_MAX_BYTES 65536
#endif

/* output: one line per command, values separated by spaces */
void out_ch(char c);
void out_str(const char *s);
void out_u64(uint64_t v);
void out_i64(int64_t v);
void out_word(const char *s);
void out_hex(const uint8_t *p, size_t n);
void out_err(int rc);
void out_end(void);

/* input: the tokens of one command line; `bad` is set by any malformed token */
typedef struct {
    const char *p;
    const char *end;
    int bad;
} line_t;

int token(line_t *l, const char **s, size_t *n);
uint64_t get_u64(line_t *l);
uint32_t get_u32(line_t *l);
int64_t get_i64(line_t *l);
size_t get_hex(line_t *l, uint8_t *buf, size_t cap);
double get_double(line_t *l);
int word_is(const char *s, size_t n, const char *w);

/* state (driver.c) */
extern coco_spec spec;
extern coco_announcement announcement;
extern coco_test_stream stream;
extern coco_rng rng;
extern uint32_t keys[DRIVER_MAX_ITEMS], keys2[DRIVER_MAX_ITEMS];
extern int8_t signs[DRIVER_MAX_ITEMS];
extern double dv[DRIVER_MAX_ITEMS], dlo[DRIVER_MAX_ITEMS], dhi[DRIVER_MAX_ITEMS];
extern int32_t iv[DRIVER_MAX_ITEMS], ilo[DRIVER_MAX_ITEMS], ihi[DRIVER_MAX_ITEMS];
extern uint8_t bytes[DRIVER_MAX_BYTES];
extern char topic_buf[COCO_TOPIC_SIZE];
extern coco_ledger ledger;
extern const coco_ledger_io mem_io;
struct storage {
    uint8_t record[COCO_LEDGER_RECORD_SIZE];
    int present, fail_load, fail_store;
};
extern struct storage storage;

void start_stream(uint32_t seed);
uint32_t get_sparse(line_t *l);

/* checks (driver_checks.c) */
void cmd_nulls(void);
void cmd_rngfail(int stuck);
void cmd_patterns(line_t *l);
void cmd_law(line_t *l);
void cmd_bench(line_t *l);

#endif
