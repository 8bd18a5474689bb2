/*
 * mosquitto_publish: coco-fleet devices in C on a host, publishing through libmosquitto.
 *
 * For each of --devices device ids ("<prefix><i>"), one after another, in each of --rounds
 * rounds, it does what a microcontroller running libcoco does (docs/protocol.md section 12):
 * connect with client id = device id (clean session), subscribe to the retained spec
 * announcement and parse it (coco_announcement_parse), read its sensors (the simulated model
 * below: the announcement's d channels, readings in [0, 1023] around a known mean per
 * channel), encode them (coco_ternarise), charge its privacy ledger durably (one file per
 * device in --ledger-dir, created with its parents if missing), draw a fresh seed and
 * randomise (coco_make_report), publish the 16 bytes on
 * its ingress topic (coco_device_ingress_topic: sharded deployments too) with QoS 1 and
 * retain 0, wait for the PUBACK, disconnect. It prints a JSON summary.
 *
 * Randomness: getrandom(2), the kernel's CSPRNG. --test-stream SEED uses the deterministic
 * xxh32 test stream of protocol 7.1 instead, so that a test can replay every report in Python;
 * never use it for real reports. --reports FILE appends each acknowledged report in hex (for
 * tests; a report carries no device id).
 *
 * Build (Debian: apt-get install libmosquitto-dev) with CMake:
 *   cmake -S libcoco -B build -DCOCO_BUILD_EXAMPLES=ON && cmake --build build
 * or by hand: cc -std=c99 -O2 -Ilibcoco/include, this file and every libcoco/src .c file,
 * -lmosquitto.
 */
#define _GNU_SOURCE /* getrandom, fsync, nanosleep */

#include <errno.h>
#include <fcntl.h>
#include <mosquitto.h>
#include <mqtt_protocol.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "coco.h"

#define MAX_CHANNELS 256
#define ANNOUNCEMENT_MAX 65536

typedef struct {
    const char *host, *deployment, *prefix, *ledger_dir, *reports_path, *cafile;
    const char *username, *password, *budget;
    int port, devices, rounds, mqtt5, timeout_s, use_stream;
    uint32_t stream_seed, data_seed;
} options;

typedef struct {
    int subscribed, acked, connected, failed;
    int mid, reason;
    size_t announcement_len;
    unsigned char announcement[ANNOUNCEMENT_MAX];
} session;

static coco_test_stream test_stream;

/* --- randomness ------------------------------------------------------------------------- */

static int kernel_random(void *ctx, unsigned char *buf, size_t len) {
    (void)ctx;
    while (len > 0) {
        ssize_t got = getrandom(buf, len, 0);
        if (got < 0) {
            if (errno == EINTR) {
                continue;
            }
            return -1; /* no randomness: no report */
        }
        buf += got;
        len -= (size_t)got;
    }
    return 0;
}

/* --- the ledger, one durable file per device --------------------------------------------- */

typedef struct {
    char path[512];
} file_store;

static int file_load(void *ctx, uint8_t record[COCO_LEDGER_RECORD_SIZE]) {
    file_store *fs = ctx;
    FILE *f = fopen(fs->path, "rb");
    size_t n;
    if (f == NULL) {
        return errno == ENOENT ? 1 : -1;
    }
    n = fread(record, 1, COCO_LEDGER_RECORD_SIZE, f);
    fclose(f);
    /* a record of an older libcoco has 24 bytes (version 1): the ledger reads it */
    return n == COCO_LEDGER_RECORD_SIZE || n == COCO_LEDGER_V1_RECORD_SIZE ? 0 : -1;
}

static int file_store_record(void *ctx, const uint8_t record[COCO_LEDGER_RECORD_SIZE]) {
    /* write a temporary file, fsync it, rename it over the record, fsync the directory */
    file_store *fs = ctx;
    char tmp[600], dir[512];
    char *slash;
    int fd, ok;
    snprintf(tmp, sizeof tmp, "%s.tmp", fs->path);
    fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd < 0) {
        return -1;
    }
    ok = write(fd, record, COCO_LEDGER_RECORD_SIZE) == COCO_LEDGER_RECORD_SIZE && fsync(fd) == 0;
    ok = close(fd) == 0 && ok;
    if (!ok || rename(tmp, fs->path) != 0) {
        unlink(tmp);
        return -1;
    }
    snprintf(dir, sizeof dir, "%s", fs->path);
    slash = strrchr(dir, '/');
    if (slash != NULL) {
        *slash = '\0';
        fd = open(dir, O_RDONLY);
        if (fd >= 0) {
            fsync(fd);
            close(fd);
        }
    }
    return 0;
}

/* --- MQTT ------------------------------------------------------------------------------- */

static void on_connect(struct mosquitto *mosq, void *obj, int rc, int flags,
                       const mosquitto_property *props) {
    session *s = obj;
    (void)mosq;
    (void)flags;
    (void)props;
    if (rc == 0) {
        s->connected = 1;
    } else {
        s->failed = 1;
    }
}

static void on_subscribe(struct mosquitto *mosq, void *obj, int mid, int count,
                         const int *granted) {
    session *s = obj;
    (void)mosq;
    (void)mid;
    s->subscribed = count == 1 && granted[0] <= 1 ? 1 : -1;
}

static void on_message(struct mosquitto *mosq, void *obj, const struct mosquitto_message *m,
                       const mosquitto_property *props) {
    session *s = obj;
    (void)mosq;
    (void)props;
    if (m->payloadlen > 0 && (size_t)m->payloadlen <= sizeof s->announcement) {
        memcpy(s->announcement, m->payload, (size_t)m->payloadlen);
        s->announcement_len = (size_t)m->payloadlen;
    }
}

static void on_publish(struct mosquitto *mosq, void *obj, int mid, int reason,
                       const mosquitto_property *props) {
    session *s = obj;
    (void)mosq;
    (void)props;
    if (mid == s->mid) {
        s->acked = 1;
        s->reason = reason; /* MQTT 5: 0x87 and other reasons >= 0x80 are refusals */
    }
}

/* Runs the client's loop until *flag is set, the session fails, or the timeout passes. */
static int wait_for(struct mosquitto *mosq, session *s, const int *flag, int timeout_s) {
    time_t deadline = time(NULL) + timeout_s;
    while (*flag == 0 && !s->failed && time(NULL) < deadline) {
        if (mosquitto_loop(mosq, 100, 1) != MOSQ_ERR_SUCCESS) {
            return 0;
        }
    }
    return *flag > 0 && !s->failed;
}

/* --- the sensors: a simulated model with a known mean per channel ----------------------- */

/* Channel j of every device reads MODEL_CENTRE[j % 8] plus a noise uniform on the integers
 * [-MODEL_NOISE, MODEL_NOISE] (mean 0), from a hash of (device, channel, --data-seed): the
 * readings stay in [0, 1023], so none is clipped, and the mean of the encoder's value
 * v = 2 x / 1023 - 1 of channel j is exactly mu_j = 2 MODEL_CENTRE[j % 8] / 1023 - 1:
 * about +0.9, -0.9, +0.6, -0.6, +0.3, -0.3 and two within 0.001 of 0. A device that encodes
 * s of the d channels reports x_j with mean (s / d) mu_j, which is what the aggregator
 * estimates: an end-to-end check can tell these estimates from noise around 0. */
#define MODEL_NOISE 48
static const uint32_t MODEL_CENTRE[8] = {972, 51, 818, 205, 665, 358, 512, 511};

static double reading(uint32_t data_seed, int device, uint32_t channel) {
    uint32_t h = coco_xxh32_u32((uint32_t)device * 65536u + channel, data_seed);
    uint32_t centre = MODEL_CENTRE[channel % 8u];
    return (double)centre + (double)(h % (2u * MODEL_NOISE + 1u)) - (double)MODEL_NOISE;
}

/* --- the ledger directory, created like mkdir -p ----------------------------------------- */

static int make_directories(const char *path) {
    char buf[512];
    size_t len = strlen(path), i;
    struct stat st;
    if (len == 0 || len >= sizeof buf) {
        errno = ENAMETOOLONG;
        return -1;
    }
    memcpy(buf, path, len + 1);
    for (i = 1; i <= len; i++) { /* each prefix that ends a component, then the whole path */
        if (buf[i] != '/' && buf[i] != '\0') {
            continue;
        }
        buf[i] = '\0';
        if (mkdir(buf, 0700) != 0 && errno != EEXIST) {
            return -1;
        }
        if (stat(buf, &st) != 0) {
            return -1;
        }
        if (!S_ISDIR(st.st_mode)) {
            errno = ENOTDIR;
            return -1;
        }
        if (i < len) {
            buf[i] = '/';
        }
    }
    return 0;
}

/* --- one device --------------------------------------------------------------------------- */

typedef struct {
    int published, acknowledged, refused, skipped;
    uint32_t last_round, round_seconds; /* of the latest report, to wait for the next round */
} counts;

static int run_device(const options *o, int index, FILE *reports, counts *c) {
    char id[128], topic[COCO_TOPIC_SIZE], spec_topic[COCO_TOPIC_SIZE];
    static session s;
    static coco_announcement a;
    static double values[MAX_CHANNELS], lo[MAX_CHANNELS], hi[MAX_CHANNELS];
    uint32_t keys[COCO_MAX_S], round, j;
    int8_t signs[COCO_MAX_S];
    uint8_t report[COCO_REPORT_SIZE];
    file_store store;
    coco_ledger_io io;
    coco_ledger ledger;
    coco_test_stream *stream = &test_stream;
    coco_rng rng;
    struct mosquitto *mosq;
    uint64_t total = 0;
    int rc, ok = 0;

    rng.fill = o->use_stream ? coco_test_stream_fill : kernel_random;
    rng.ctx = o->use_stream ? (void *)stream : NULL;
    snprintf(id, sizeof id, "%s%d", o->prefix, index);
    memset(&s, 0, sizeof s);
    mosq = mosquitto_new(id, true, &s); /* client id = device id, clean session */
    if (mosq == NULL) {
        return 0;
    }
    if (o->mqtt5) {
        mosquitto_int_option(mosq, MOSQ_OPT_PROTOCOL_VERSION, MQTT_PROTOCOL_V5);
    }
    mosquitto_int_option(mosq, MOSQ_OPT_TCP_NODELAY, 1); /* small packets: no Nagle delay */
    mosquitto_connect_v5_callback_set(mosq, on_connect);
    mosquitto_subscribe_callback_set(mosq, on_subscribe);
    mosquitto_message_v5_callback_set(mosq, on_message);
    mosquitto_publish_v5_callback_set(mosq, on_publish);
    if (o->username != NULL || o->password != NULL) {
        mosquitto_username_pw_set(mosq, o->username ? o->username : id, o->password);
    }
    if (o->cafile != NULL && mosquitto_tls_set(mosq, o->cafile, NULL, NULL, NULL, NULL) != 0) {
        fprintf(stderr, "error: cannot use the CA file %s\n", o->cafile);
        goto done;
    }
    if (mosquitto_connect(mosq, o->host, o->port, 30) != MOSQ_ERR_SUCCESS ||
        !wait_for(mosq, &s, &s.connected, o->timeout_s)) {
        fprintf(stderr, "error: a device cannot connect to %s:%d\n", o->host, o->port);
        goto done;
    }
    /* the retained announcement, read afresh on every connection */
    if (coco_spec_topic(o->deployment, spec_topic, sizeof spec_topic) != COCO_OK ||
        mosquitto_subscribe(mosq, NULL, spec_topic, 0) != MOSQ_ERR_SUCCESS ||
        !wait_for(mosq, &s, &s.subscribed, o->timeout_s)) {
        fprintf(stderr, "error: cannot subscribe to %s\n", spec_topic);
        goto done;
    }
    {
        time_t deadline = time(NULL) + o->timeout_s;
        while (s.announcement_len == 0 && time(NULL) < deadline) {
            mosquitto_loop(mosq, 100, 1);
        }
    }
    rc = coco_announcement_parse(s.announcement, s.announcement_len, &a);
    if (rc != COCO_OK) {
        fprintf(stderr, "error: the announcement on %s is refused: %s\n", spec_topic,
                s.announcement_len ? coco_strerror(rc) : "none arrived");
        goto done;
    }
    if (a.spec.d > MAX_CHANNELS) {
        fprintf(stderr, "error: the spec has d = %u channels, at most %d here\n",
                (unsigned)a.spec.d, MAX_CHANNELS);
        goto done;
    }
    /* the round from the clock, when the report is sent; an unset clock sends nothing */
    rc = coco_round_of((int64_t)time(NULL), a.round_seconds, &round);
    if (rc == COCO_OK) {
        rc = coco_device_ingress_topic(&a, o->deployment, id, round, topic, sizeof topic);
    }
    c->last_round = round;
    c->round_seconds = a.round_seconds;
    if (rc == COCO_ERR_NO_LAYOUT || rc == COCO_ERR_CLOCK) {
        c->skipped++; /* no layout in force, or the clock is not set: no report this round */
        ok = 1;
        goto done;
    }
    if (rc != COCO_OK) {
        fprintf(stderr, "error: no ingress topic for %s: %s\n", id, coco_strerror(rc));
        goto done;
    }
    /* the ledger: opened from durable storage, charged before anything is drawn */
    if (o->budget != NULL &&
        coco_decimal_units(o->budget, strlen(o->budget), 0, &total) != COCO_OK) {
        fprintf(stderr, "error: --budget %s is not a decimal number\n", o->budget);
        goto done;
    }
    snprintf(store.path, sizeof store.path, "%s/%s.ledger", o->ledger_dir, id);
    io.load = file_load;
    io.store = file_store_record;
    io.ctx = &store;
    rc = coco_ledger_open(&ledger, &io, o->budget ? total : UINT64_MAX);
    if (rc != COCO_OK) {
        fprintf(stderr, "error: the ledger %s: %s\n", store.path, coco_strerror(rc));
        goto done;
    }
    for (j = 0; j < a.spec.d; j++) {
        values[j] = reading(o->data_seed, index, j);
        lo[j] = 0.0;
        hi[j] = 1023.0;
    }
    rc = coco_ternarise(values, lo, hi, a.spec.d, a.spec.s, 0, &rng, keys, signs);
    if (rc == COCO_OK) {
        rc = coco_make_report(&a.spec, round, keys, signs, a.spec.s, &rng, &ledger,
                              a.epsilon_units, report);
    }
    if (rc == COCO_ERR_BUDGET) {
        c->skipped++;
        ok = 1;
        goto done;
    }
    if (rc != COCO_OK) {
        fprintf(stderr, "error: no report for %s: %s\n", id, coco_strerror(rc));
        goto done;
    }
    /* QoS 1, retain 0, exactly 16 bytes, nothing else; a retry would resend these bytes */
    if (mosquitto_publish(mosq, &s.mid, topic, COCO_REPORT_SIZE, report, 1, false) !=
        MOSQ_ERR_SUCCESS) {
        fprintf(stderr, "error: publish failed for %s\n", id);
        goto done;
    }
    c->published++;
    if (!wait_for(mosq, &s, &s.acked, o->timeout_s)) {
        fprintf(stderr, "error: no PUBACK for %s\n", id);
        goto done;
    }
    if (s.reason >= 0x80) {
        c->refused++;
    } else {
        c->acknowledged++;
        if (reports != NULL) {
            for (j = 0; j < COCO_REPORT_SIZE; j++) {
                fprintf(reports, "%02x", report[j]);
            }
            fputc('\n', reports);
        }
    }
    ok = 1;
done:
    mosquitto_disconnect(mosq);
    mosquitto_loop(mosq, 100, 1);
    mosquitto_destroy(mosq);
    return ok;
}

static void usage(void) {
    fprintf(stderr,
            "usage: mosquitto_publish --deployment NAME --ledger-dir DIR [--host H] [--port P]\n"
            "         [--devices N] [--prefix ID-PREFIX] [--rounds R] [--budget EPSILON]\n"
            "         [--mqtt-version 5|3.1.1] [--cafile PEM] [--username U] [--password P]\n"
            "         [--data-seed S] [--test-stream SEED] [--reports FILE] [--timeout S]\n");
}

int main(int argc, char **argv) {
    options o;
    counts c = {0, 0, 0, 0, 0, 0};
    FILE *reports = NULL;
    int i, r, failures = 0;
    memset(&o, 0, sizeof o);
    o.host = "127.0.0.1";
    o.port = 1883;
    o.prefix = "c-device-";
    o.devices = 1;
    o.rounds = 1;
    o.mqtt5 = 1;
    o.timeout_s = 10;
    for (i = 1; i < argc; i++) {
        const char *arg = argv[i], *value = i + 1 < argc ? argv[i + 1] : NULL;
        if (value == NULL) {
            usage();
            return 2;
        }
        i++;
        if (strcmp(arg, "--host") == 0) {
            o.host = value;
        } else if (strcmp(arg, "--port") == 0) {
            o.port = atoi(value);
        } else if (strcmp(arg, "--deployment") == 0) {
            o.deployment = value;
        } else if (strcmp(arg, "--devices") == 0) {
            o.devices = atoi(value);
        } else if (strcmp(arg, "--prefix") == 0) {
            o.prefix = value;
        } else if (strcmp(arg, "--rounds") == 0) {
            o.rounds = atoi(value);
        } else if (strcmp(arg, "--ledger-dir") == 0) {
            o.ledger_dir = value;
        } else if (strcmp(arg, "--budget") == 0) {
            o.budget = value;
        } else if (strcmp(arg, "--mqtt-version") == 0) {
            o.mqtt5 = strcmp(value, "5") == 0;
        } else if (strcmp(arg, "--cafile") == 0) {
            o.cafile = value;
        } else if (strcmp(arg, "--username") == 0) {
            o.username = value;
        } else if (strcmp(arg, "--password") == 0) {
            o.password = value;
        } else if (strcmp(arg, "--data-seed") == 0) {
            o.data_seed = (uint32_t)strtoul(value, NULL, 10);
        } else if (strcmp(arg, "--test-stream") == 0) {
            o.use_stream = 1;
            o.stream_seed = (uint32_t)strtoul(value, NULL, 10);
        } else if (strcmp(arg, "--reports") == 0) {
            o.reports_path = value;
        } else if (strcmp(arg, "--timeout") == 0) {
            o.timeout_s = atoi(value);
        } else {
            usage();
            return 2;
        }
    }
    if (o.deployment == NULL || o.ledger_dir == NULL || o.devices < 1 || o.rounds < 1) {
        usage();
        return 2;
    }
    if (o.use_stream) {
        fprintf(stderr, "warning: --test-stream: deterministic reports, for tests only\n");
        test_stream.seed = o.stream_seed;
        test_stream.index = 0;
    }
    if (make_directories(o.ledger_dir) != 0) {
        fprintf(stderr, "error: cannot create the ledger directory %s: %s\n", o.ledger_dir,
                strerror(errno));
        return 1;
    }
    if (o.reports_path != NULL && (reports = fopen(o.reports_path, "a")) == NULL) {
        fprintf(stderr, "error: cannot open %s\n", o.reports_path);
        return 1;
    }
    mosquitto_lib_init();
    for (r = 0; r < o.rounds; r++) {
        uint32_t now_round, wait_s;
        /* one report per device per round (protocol 11.4): the next pass waits for a round
         * after the last one reported in */
        while (r > 0 && c.round_seconds > 0 &&
               coco_round_of((int64_t)time(NULL), c.round_seconds, &now_round) == COCO_OK &&
               now_round <= c.last_round &&
               coco_seconds_to_next_round((int64_t)time(NULL), c.round_seconds, &wait_s) ==
                   COCO_OK) {
            sleep(wait_s);
        }
        for (i = 0; i < o.devices; i++) {
            failures += !run_device(&o, i, reports, &c);
        }
    }
    mosquitto_lib_cleanup();
    if (reports != NULL) {
        fclose(reports);
    }
    printf("{\"devices\": %d, \"rounds\": %d, \"published\": %d, \"acknowledged\": %d, "
           "\"refused\": %d, \"skipped\": %d, \"failed\": %d}\n",
           o.devices, o.rounds, c.published, c.acknowledged, c.refused, c.skipped, failures);
    return failures == 0 ? 0 : 1;
}
