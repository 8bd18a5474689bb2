/* Names of the status codes (kept apart so that firmware that never prints them does not
 * link the strings). */
#include "coco_internal.h"

const char *coco_strerror(int status) {
    static const char *const names[] = {
        "ok",           "null",          "spec_mechanism", "spec_d",        "spec_s",
        "spec_t",       "spec_weight",   "spec_hash_version", "spec_s_max", "input",
        "reading",      "range",         "overflow",       "rng",           "clock",
        "round_seconds", "json",         "announcement",   "fingerprint",   "name",
        "buffer",       "no_layout",     "budget",         "storage",       "ledger_corrupt",
        "bad_length",   "bad_version",   "bad_kind",       "bad_count",     "bad_field",
        "arg",          "period_budget"};
    if (status > 0 || status < -(int)(sizeof names / sizeof names[0]) + 1) {
        return "unknown";
    }
    return names[-status];
}
