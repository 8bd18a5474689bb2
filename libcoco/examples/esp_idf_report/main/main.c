/* esp_idf_report: SKELETON, not built by the tests (README.md here). ESP-IDF 5.x. */
#include <string.h>
#include <time.h>

#include "coco.h"
#include "coco_esp.h"
#include "esp_netif_sntp.h"
#include "freertos/FreeRTOS.h"
#include "freertos/task.h"
#include "esp_wifi.h"
#include "mqtt_client.h"
#include "nvs.h"
#include "nvs_flash.h"

#define DEPLOYMENT "lab"     /* TODO */
#define DEVICE_ID "esp32-0001" /* TODO: the device's MQTT user name */
#define BUDGET "24"          /* TODO: lifetime epsilon budget */

static const coco_rng rng = COCO_ESP_RNG;
static nvs_handle_t nvs;
static coco_ledger ledger;
static coco_announcement ann;
static volatile int have_announcement;

/* The ledger record in NVS: nvs_set_blob + nvs_commit replace it atomically. */
static int ledger_load(void *ctx, uint8_t rec[COCO_LEDGER_RECORD_SIZE]) {
    size_t len = COCO_LEDGER_RECORD_SIZE;
    esp_err_t err = nvs_get_blob(nvs, "ledger", rec, &len);
    (void)ctx;
    if (err == ESP_ERR_NVS_NOT_FOUND) {
        return 1;
    }
    return err == ESP_OK && len == COCO_LEDGER_RECORD_SIZE ? 0 : -1;
}

static int ledger_store(void *ctx, const uint8_t rec[COCO_LEDGER_RECORD_SIZE]) {
    (void)ctx;
    return nvs_set_blob(nvs, "ledger", rec, COCO_LEDGER_RECORD_SIZE) == ESP_OK &&
                   nvs_commit(nvs) == ESP_OK
               ? 0
               : -1;
}

static const coco_ledger_io ledger_io = {ledger_load, ledger_store, NULL};

static void on_mqtt(void *arg, esp_event_base_t base, int32_t id, void *data) {
    esp_mqtt_event_handle_t event = data;
    char spec_topic[COCO_TOPIC_SIZE];
    (void)arg;
    (void)base;
    if (id == MQTT_EVENT_CONNECTED &&
        coco_spec_topic(DEPLOYMENT, spec_topic, sizeof spec_topic) == COCO_OK) {
        have_announcement = 0; /* read it afresh on every connection */
        esp_mqtt_client_subscribe(event->client, spec_topic, 1);
    } else if (id == MQTT_EVENT_DATA && event->total_data_len == event->data_len) {
        have_announcement = coco_announcement_parse((const uint8_t *)event->data,
                                                    (size_t)event->data_len, &ann) == COCO_OK;
    }
}

void app_main(void) {
    uint64_t budget = 0;
    uint32_t last_round = UINT32_MAX;
    ESP_ERROR_CHECK(nvs_flash_init());
    ESP_ERROR_CHECK(nvs_open("coco", NVS_READWRITE, &nvs));
    /* TODO: start Wi-Fi (esp_wifi_init, esp_wifi_set_config, esp_wifi_start, connect):
     * esp_fill_random is strong only while the radio runs */
    esp_sntp_config_t sntp = ESP_NETIF_SNTP_DEFAULT_CONFIG("pool.ntp.org");
    esp_netif_sntp_init(&sntp);
    if (coco_decimal_units(BUDGET, strlen(BUDGET), 0, &budget) != COCO_OK ||
        coco_ledger_open(&ledger, &ledger_io, budget) != COCO_OK) {
        return; /* a damaged ledger is never reset */
    }
    esp_mqtt_client_config_t cfg = {
        .broker.address.uri = "mqtts://broker.example:8883", /* TODO, with its CA */
        .credentials.client_id = DEVICE_ID,
        .credentials.username = DEVICE_ID,
        /* TODO: .credentials.authentication.password, .broker.verification.certificate */
    };
    esp_mqtt_client_handle_t client = esp_mqtt_client_init(&cfg);
    esp_mqtt_client_register_event(client, ESP_EVENT_ANY_ID, on_mqtt, NULL);
    esp_mqtt_client_start(client);
    for (;;) {
        uint32_t keys[COCO_MAX_S], round;
        int8_t signs[COCO_MAX_S];
        int32_t values[4] = {0, 0, 0, 0}, lo[4] = {0, 0, 0, 0},
                hi[4] = {4095, 4095, 4095, 4095}; /* TODO: read your sensors (d = 4) */
        uint8_t report[COCO_REPORT_SIZE];
        char topic[COCO_TOPIC_SIZE];
        vTaskDelay(pdMS_TO_TICKS(1000));
        if (!have_announcement || ann.spec.d != 4 ||
            coco_round_of((int64_t)time(NULL), ann.round_seconds, &round) != COCO_OK ||
            round == last_round) {
            continue; /* no announcement, clock not set, or this round is done */
        }
        if (coco_device_ingress_topic(&ann, DEPLOYMENT, DEVICE_ID, round, topic,
                                      sizeof topic) == COCO_OK &&
            coco_ternarise_int(values, lo, hi, 4, ann.spec.s, 1, &rng, keys, signs) ==
                COCO_OK &&
            coco_make_report(&ann.spec, round, keys, signs, ann.spec.s, &rng, &ledger,
                             ann.epsilon_units, report) == COCO_OK) {
            /* QoS 1, retain 0; without a PUBACK resend these same bytes (TODO) */
            esp_mqtt_client_publish(client, topic, (const char *)report, COCO_REPORT_SIZE, 1,
                                    0);
            last_round = round;
        }
    }
}
