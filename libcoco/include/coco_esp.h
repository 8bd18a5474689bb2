/*
 * coco_esp.h: libcoco's randomness from the ESP32's hardware RNG (ESP-IDF, or Arduino on an
 * ESP32). Header only; include it in your firmware, not in libcoco.
 *
 *     #include "coco_esp.h"
 *     static const coco_rng rng = COCO_ESP_RNG;
 *
 * esp_fill_random(buf, len) returns nothing and cannot fail, while coco_rng.fill returns 0 on
 * success (mbedTLS's f_rng signature): coco_esp_fill_random adapts one to the other.
 *
 * Its bytes are cryptographically strong only while an entropy source runs: Wi-Fi or
 * Bluetooth enabled, or bootloader_random_enable() called (then disable it before starting
 * the radio), as Espressif's documentation of esp_random() says. Report only then.
 */
#ifndef COCO_ESP_H
#define COCO_ESP_H

#include <stddef.h>

#include "coco.h"

#if defined(__has_include)
#if __has_include("esp_random.h")
#include "esp_random.h" /* ESP-IDF 5 and later */
#else
#include "esp_system.h" /* ESP-IDF 4 */
#endif
#else
#include "esp_system.h"
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* A coco_rng.fill that reads the hardware RNG; ctx is unused (NULL). Never fails. */
static inline int coco_esp_fill_random(void *ctx, unsigned char *buf, size_t len) {
    (void)ctx;
    if (len > 0) {
        esp_fill_random(buf, len);
    }
    return 0;
}

/* Initialiser of a coco_rng that uses it. */
#define COCO_ESP_RNG {coco_esp_fill_random, NULL}

#ifdef __cplusplus
}
#endif

#endif /* COCO_ESP_H */
