/* Arduino's library format puts src/ on the include path: this forwards to the one public
 * header, include/coco.h (CMake and PlatformIO use include/ directly). */
#include "../include/coco.h"
