/* What the command interpreter needs from where it runs (host process or bare-metal MCU). */
#ifndef HARNESS_PLATFORM_H
#define HARNESS_PLATFORM_H

#include <stddef.h>
#include <stdint.h>

/* Writes n bytes of output (a whole line, '\n' included). */
void plat_write(const char *s, size_t n);
/* Benchmarks (bare metal only): a counter that grows with executed instructions (SysTick
 * ticks; the firmware prints its calibration), the caller's stack pointer, and the deepest
 * stack use below `top` since plat_stack_paint(), in bytes. */
int plat_has_bench(void);
uint32_t plat_instructions(void);
uint32_t plat_sp(void);
void plat_stack_paint(void);
uint32_t plat_stack_used(uint32_t top);

/* Runs every line of the script (commands separated by '\n'); returns the number of lines
 * that could not be parsed. */
int driver_run(const char *script, size_t len);

#endif
