/* The host build of the command interpreter: commands on stdin, results on stdout. */
#include <stdio.h>
#include <stdlib.h>

#include "platform.h"

void plat_write(const char *s, size_t n) { fwrite(s, 1, n, stdout); }
int plat_has_bench(void) { return 0; }
uint32_t plat_instructions(void) { return 0; }
uint32_t plat_sp(void) { return 0; }
void plat_stack_paint(void) {}
uint32_t plat_stack_used(uint32_t top) { return top; }

int main(void) {
    size_t cap = 1 << 16, len = 0;
    char *buf = malloc(cap);
    int bad = 0;
    if (buf == NULL) {
        return 2;
    }
    for (;;) { /* one line at a time, so that the output streams as the input does */
        int c = getchar();
        if (c == EOF || c == '\n') {
            if (len > 0) {
                bad += driver_run(buf, len);
                fflush(stdout);
            }
            len = 0;
            if (c == EOF) {
                break;
            }
            continue;
        }
        if (len == cap) {
            char *bigger = realloc(buf, cap * 2);
            if (bigger == NULL) {
                free(buf);
                return 2;
            }
            buf = bigger;
            cap *= 2;
        }
        buf[len++] = (char)c;
    }
    free(buf);
    return bad == 0 ? 0 : 1;
}
