/*
 * Esp32Report: one coco/v1 report per round from four ADC channels, on an ESP32 with the
 * Arduino core (libcoco's README.md, "A report, start to finish").
 *
 * - randomness: the ESP32's hardware RNG through COCO_ESP_RNG (coco_esp.h); it is strong only
 *   while Wi-Fi or Bluetooth runs, so join Wi-Fi first;
 * - clock: SNTP (configTime); nothing is sent until the clock is set (COCO_ERR_CLOCK);
 * - budget ledger: NVS through Preferences (each putBytes is atomic), so a reboot never
 *   resets what was spent;
 * - readings: analogRead counts in [0, 4095], encoded with integers only (coco_ternarise_int).
 *
 * It prints the topic and the 16 bytes in hex; publish them with your MQTT client (QoS 1,
 * retain 0; libcoco's README.md, porting guide 4), and take the announcement from the
 * retained message on coco/v1/<deployment>/spec instead of ANNOUNCEMENT below, which is an
 * example (d = 4, s = 1, epsilon = 1, rounds of an hour). Other boards: replace COCO_ESP_RNG
 * with their TRNG (porting guide 1) and Preferences with their durable storage (guide 3).
 */
#include <Preferences.h>
#include <WiFi.h>
#include <time.h>

#include <coco.h>
#include <coco_esp.h>

#if !defined(ARDUINO_ARCH_ESP32)
#error "Esp32Report is for ESP32 boards: elsewhere supply a TRNG and durable ledger storage"
#endif

static const char WIFI_SSID[] = "your-ssid";
static const char WIFI_PASSWORD[] = "your-password";
static const char DEPLOYMENT[] = "lab";
static const char DEVICE_ID[] = "esp32-0001"; /* the device's own MQTT user name */
static const char BUDGET[] = "24";             /* lifetime epsilon budget of this device */
static const char ANNOUNCEMENT[] =
    "{\"delta\":1e-06,\"min_batch\":100,\"protocol\":\"coco/v1\",\"round_seconds\":3600,"
    "\"spec\":{\"d\":4,\"epsilon\":1.0,\"exp_eps_weight\":45605201,\"fingerprint\":"
    "\"52b85fd0\",\"hash_version\":1,\"mechanism\":\"coco\",\"s\":1,\"t\":4,"
    "\"unit_weight\":16777216}}";
static const int PINS[4] = {32, 33, 34, 35};

static Preferences prefs;
static const coco_rng rng = COCO_ESP_RNG;
static coco_ledger ledger;
static coco_announcement ann;
static int ready = 0;
static uint32_t last_round = UINT32_MAX;

static int ledger_load(void *ctx, uint8_t rec[COCO_LEDGER_RECORD_SIZE]) {
    (void)ctx;
    size_t n = prefs.getBytes("ledger", rec, COCO_LEDGER_RECORD_SIZE);
    return n == 0 ? 1 : (n == COCO_LEDGER_RECORD_SIZE ? 0 : -1); /* 1: no record yet */
}

static int ledger_store(void *ctx, const uint8_t rec[COCO_LEDGER_RECORD_SIZE]) {
    (void)ctx;
    return prefs.putBytes("ledger", rec, COCO_LEDGER_RECORD_SIZE) == COCO_LEDGER_RECORD_SIZE
               ? 0
               : -1;
}

static const coco_ledger_io ledger_io = {ledger_load, ledger_store, NULL};

static void fail(const char *what, int rc) {
    Serial.print(what);
    Serial.print(": ");
    Serial.println(coco_strerror(rc));
}

void setup() {
    uint64_t budget = 0;
    int rc;
    Serial.begin(115200);
    WiFi.begin(WIFI_SSID, WIFI_PASSWORD); /* also the RNG's entropy source */
    configTime(0, 0, "pool.ntp.org");
    prefs.begin("coco", false);
    rc = coco_decimal_units(BUDGET, sizeof BUDGET - 1, 0, &budget);
    if (rc == COCO_OK) {
        rc = coco_ledger_open(&ledger, &ledger_io, budget);
    }
    if (rc == COCO_OK) {
        rc = coco_announcement_parse((const uint8_t *)ANNOUNCEMENT, sizeof ANNOUNCEMENT - 1,
                                     &ann);
    }
    if (rc != COCO_OK || ann.spec.d != 4) {
        fail("setup", rc != COCO_OK ? rc : COCO_ERR_ARG);
        return;
    }
    ready = 1;
}

void loop() {
    int32_t values[4], lo[4], hi[4];
    uint32_t keys[COCO_MAX_S], round, i;
    int8_t signs[COCO_MAX_S];
    uint8_t report[COCO_REPORT_SIZE];
    char topic[COCO_TOPIC_SIZE];
    int rc;
    delay(1000);
    if (!ready || WiFi.status() != WL_CONNECTED) {
        return;
    }
    rc = coco_round_of((int64_t)time(NULL), ann.round_seconds, &round);
    if (rc != COCO_OK || round == last_round) {
        return; /* the clock is not set yet, or this round's report is sent */
    }
    rc = coco_device_ingress_topic(&ann, DEPLOYMENT, DEVICE_ID, round, topic, sizeof topic);
    for (i = 0; i < 4; i++) {
        values[i] = analogRead(PINS[i]);
        lo[i] = 0;
        hi[i] = 4095;
    }
    if (rc == COCO_OK) {
        rc = coco_ternarise_int(values, lo, hi, 4, ann.spec.s, 1, &rng, keys, signs);
    }
    if (rc == COCO_OK) { /* charges the ledger in NVS first, then randomises */
        rc = coco_make_report(&ann.spec, round, keys, signs, ann.spec.s, &rng, &ledger,
                              ann.epsilon_units, report);
    }
    if (rc != COCO_OK) {
        fail("no report", rc); /* COCO_ERR_BUDGET: spent; stop reporting for good */
        if (rc == COCO_ERR_BUDGET) {
            ready = 0;
        }
        return;
    }
    last_round = round;
    Serial.print(topic);
    Serial.print(' ');
    for (i = 0; i < COCO_REPORT_SIZE; i++) {
        if (report[i] < 16) {
            Serial.print('0');
        }
        Serial.print(report[i], HEX);
    }
    Serial.println();
}
