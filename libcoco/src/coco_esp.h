/* Arduino's library format puts src/ on the include path: this forwards to
 * include/coco_esp.h, the ESP32 hardware RNG as libcoco's randomness (ESP32 boards only). */
#include "../include/coco_esp.h"
