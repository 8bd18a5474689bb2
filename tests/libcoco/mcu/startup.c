/* Bare-metal start-up for the emulated Cortex-M boards (QEMU microbit: Cortex-M0, ARMv6-M;
 * QEMU mps2-an386: Cortex-M4): vector table, .data/.bss set-up, semihosting output and exit,
 * the SysTick counter for benchmarks and stack painting. No libc. */
#include <stddef.h>
#include <stdint.h>

#include "platform.h"

extern uint32_t _sidata, _sdata, _edata, _sbss, _ebss, _estack, _stack_limit;
extern const char *const driver_lines[];
extern const unsigned long driver_line_count;

int main(void);
void reset_handler(void);
void fault_handler(void);

/* --- semihosting (ARM semihosting v2: BKPT 0xAB, operation in r0, argument in r1) ------ */

static int semihost(int op, const void *arg) {
    register int r0 __asm__("r0") = op;
    register const void *r1 __asm__("r1") = arg;
    __asm__ volatile("bkpt 0xAB" : "+r"(r0) : "r"(r1) : "memory");
    return r0;
}

#define SYS_WRITE0 0x04
#define SYS_EXIT 0x18
#define ADP_STOPPED_APPLICATION_EXIT 0x20026
#define ADP_STOPPED_RUNTIME_ERROR 0x20023

static char semihost_line[128];

void plat_write(const char *s, size_t n) {
    while (n > 0) { /* SYS_WRITE0 prints a NUL-terminated string */
        size_t chunk = n < sizeof semihost_line - 1 ? n : sizeof semihost_line - 1, i;
        for (i = 0; i < chunk; i++) {
            semihost_line[i] = s[i];
        }
        semihost_line[chunk] = '\0';
        semihost(SYS_WRITE0, semihost_line);
        s += chunk;
        n -= chunk;
    }
}

static void exit_with(int ok) {
    for (;;) {
        semihost(SYS_EXIT, (const void *)(uintptr_t)(ok ? ADP_STOPPED_APPLICATION_EXIT
                                                       : ADP_STOPPED_RUNTIME_ERROR));
    }
}

/* --- SysTick: with QEMU's -icount shift=0 each instruction advances the virtual clock by
 * 1 ns, and SysTick counts the board's clock, so ticks measure executed instructions ------ */

#define SYST_CSR (*(volatile uint32_t *)0xE000E010u)
#define SYST_RVR (*(volatile uint32_t *)0xE000E014u)
#define SYST_CVR (*(volatile uint32_t *)0xE000E018u)

int plat_has_bench(void) { return 1; }

uint32_t plat_instructions(void) {
    /* a 24-bit down-counter: report ticks counting up (differences mod 2^24) */
    return (0x00FFFFFFu - SYST_CVR) & 0x00FFFFFFu;
}

/* The caller's stack pointer (a leaf that pushes nothing). */
__attribute__((naked)) uint32_t plat_sp(void) {
    __asm__ volatile("mov r0, sp\n\tbx lr");
}

#define PAINT 0xC0C0A5A5u

__attribute__((noinline)) void plat_stack_paint(void) {
    volatile uint32_t *p = &_stack_limit;
    uint32_t below = plat_sp() - 32; /* leave this function's own frame alone */
    while ((uint32_t)(uintptr_t)p < below) {
        *p++ = PAINT;
    }
}

uint32_t plat_stack_used(uint32_t top) {
    const volatile uint32_t *p = &_stack_limit;
    while ((uint32_t)(uintptr_t)p < top && *p == PAINT) {
        p++;
    }
    return top - (uint32_t)(uintptr_t)p;
}

/* A loop of a known number of instructions (2 per iteration: subs, bne), to calibrate
 * instructions per SysTick tick on each board. */
__attribute__((noinline)) static void plat_spin(uint32_t iterations) {
    __asm__ volatile(".syntax unified\n1: subs %0, %0, #1\n\tbne 1b" : "+l"(iterations) : : "cc");
}

/* --- the C runtime the compiler may call, without libc ------------------------------- */

void *memcpy(void *dst, const void *src, size_t n);
void *memset(void *dst, int c, size_t n);
void *memcpy(void *dst, const void *src, size_t n) {
    unsigned char *d = dst;
    const unsigned char *s = src;
    while (n-- > 0) {
        *d++ = *s++;
    }
    return dst;
}
void *memset(void *dst, int c, size_t n) {
    unsigned char *d = dst;
    while (n-- > 0) {
        *d++ = (unsigned char)c;
    }
    return dst;
}

/* --- reset ---------------------------------------------------------------------------- */

void reset_handler(void) {
    uint32_t *src = &_sidata, *dst = &_sdata;
    while (dst < &_edata) {
        *dst++ = *src++;
    }
    for (dst = &_sbss; dst < &_ebss; dst++) {
        *dst = 0;
    }
    SYST_RVR = 0x00FFFFFFu;
    SYST_CVR = 0;
    SYST_CSR = 5u; /* enable, processor clock, no interrupt */
    exit_with(main() == 0);
}

void fault_handler(void) {
    static const char message[] = "\n!! hard fault\n";
    plat_write(message, sizeof message - 1);
    exit_with(0);
}

__attribute__((section(".vectors"), used)) static void (*const vectors[16])(void) = {
    (void (*)(void))(uintptr_t)&_estack, reset_handler, fault_handler, fault_handler,
    fault_handler, fault_handler, fault_handler, 0, 0, 0, 0, fault_handler, fault_handler, 0,
    fault_handler, fault_handler};

int main(void) {
    char calib[64];
    uint32_t before, after, ticks, iterations = 200000u, n = 0, i;
    int bad = 0;
    before = plat_instructions();
    plat_spin(iterations);
    after = plat_instructions();
    ticks = (after - before) & 0x00FFFFFFu;
    /* "> calib: <ticks> <instructions>" */
    {
        const char *head = "> calib: ";
        uint32_t values[2], v;
        char digits[10];
        int k;
        values[0] = ticks;
        values[1] = 2u * iterations;
        for (i = 0; head[i] != 0; i++) {
            calib[n++] = head[i];
        }
        for (k = 0; k < 2; k++) {
            int m = 0;
            v = values[k];
            do {
                digits[m++] = (char)('0' + v % 10u);
                v /= 10u;
            } while (v > 0);
            while (m > 0) {
                calib[n++] = digits[--m];
            }
            calib[n++] = k == 0 ? ' ' : '\n';
        }
    }
    plat_write(calib, n);
    for (i = 0; i < driver_line_count; i++) { /* one literal per line: C99 allows 4095 bytes */
        const char *line = driver_lines[i];
        size_t len = 0;
        while (line[len] != '\0') {
            len++;
        }
        bad += driver_run(line, len);
    }
    return bad == 0 ? 0 : 1;
}
