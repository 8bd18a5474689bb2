/* The command interpreter's output (one line per command, buffered, written through the
 * platform) and input (tokens of a line: decimals, hex bytes, doubles as IEEE bits). */
#include "driver.h"

#define OUT_SIZE 256

static char out_buf[OUT_SIZE];
static size_t out_len;

static void out_flush(void) {
    if (out_len > 0) {
        plat_write(out_buf, out_len);
        out_len = 0;
    }
}

void out_ch(char c) {
    if (out_len == OUT_SIZE) {
        out_flush();
    }
    out_buf[out_len++] = c;
}

void out_str(const char *s) {
    while (*s != 0) {
        out_ch(*s++);
    }
}

static void out_sep(void) {
    if (out_len > 0 && out_buf[out_len - 1] != ' ') {
        out_ch(' ');
    }
}

static void out_digits(uint64_t v) {
    char digits[20];
    int n = 0;
    do {
        digits[n++] = (char)('0' + (int)(v % 10u));
        v /= 10u;
    } while (v > 0);
    while (n > 0) {
        out_ch(digits[--n]);
    }
}

void out_u64(uint64_t v) {
    out_sep();
    out_digits(v);
}

void out_i64(int64_t v) {
    out_sep();
    if (v < 0) {
        out_ch('-');
    }
    out_digits(v < 0 ? (uint64_t)0 - (uint64_t)v : (uint64_t)v);
}

void out_word(const char *s) {
    out_sep();
    out_str(s);
}

void out_hex(const uint8_t *p, size_t n) {
    static const char hex[] = "0123456789abcdef";
    size_t i;
    out_sep();
    if (n == 0) {
        out_ch('-');
    }
    for (i = 0; i < n; i++) {
        out_ch(hex[p[i] >> 4]);
        out_ch(hex[p[i] & 15]);
    }
}

void out_err(int rc) {
    out_word("err");
    out_word(coco_strerror(rc));
}

void out_end(void) {
    out_ch('\n');
    out_flush();
}

/* --- input -------------------------------------------------------------------------- */

int token(line_t *l, const char **s, size_t *n) {
    while (l->p < l->end && *l->p == ' ') {
        l->p++;
    }
    *s = l->p;
    while (l->p < l->end && *l->p != ' ') {
        l->p++;
    }
    *n = (size_t)(l->p - *s);
    if (*n == 0) {
        l->bad = 1;
    }
    return *n > 0;
}

uint64_t get_u64(line_t *l) {
    const char *s;
    size_t n, i;
    uint64_t v = 0;
    if (!token(l, &s, &n)) {
        return 0;
    }
    for (i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9') {
            l->bad = 1;
            return 0;
        }
        v = v * 10u + (uint64_t)(s[i] - '0');
    }
    return v;
}

uint32_t get_u32(line_t *l) { return (uint32_t)get_u64(l); }

int64_t get_i64(line_t *l) {
    const char *s;
    size_t n, i = 0;
    uint64_t v = 0;
    int neg = 0;
    if (!token(l, &s, &n)) {
        return 0;
    }
    if (s[0] == '-') {
        neg = 1;
        i = 1;
    }
    for (; i < n; i++) {
        if (s[i] < '0' || s[i] > '9') {
            l->bad = 1;
            return 0;
        }
        v = v * 10u + (uint64_t)(s[i] - '0');
    }
    return neg ? (int64_t)(0 - v) : (int64_t)v;
}

static int hex_digit(char c) {
    if (c >= '0' && c <= '9') {
        return c - '0';
    }
    if (c >= 'a' && c <= 'f') {
        return c - 'a' + 10;
    }
    return -1;
}

/* Hex bytes ("-" for none) into buf; returns the count. */
size_t get_hex(line_t *l, uint8_t *buf, size_t cap) {
    const char *s;
    size_t n, i;
    if (!token(l, &s, &n)) {
        return 0;
    }
    if (n == 1 && s[0] == '-') {
        return 0;
    }
    if (n % 2 != 0 || n / 2 > cap) {
        l->bad = 1;
        return 0;
    }
    for (i = 0; i < n / 2; i++) {
        int hi = hex_digit(s[2 * i]), lo = hex_digit(s[2 * i + 1]);
        if (hi < 0 || lo < 0) {
            l->bad = 1;
            return 0;
        }
        buf[i] = (uint8_t)(hi * 16 + lo);
    }
    return n / 2;
}

/* An IEEE double given as the 16 hex digits of its bits. */
double get_double(line_t *l) {
    uint8_t b[8];
    union {
        uint64_t bits;
        double value;
    } u;
    size_t i;
    u.bits = 0;
    if (get_hex(l, b, 8) != 8) {
        l->bad = 1;
        return 0.0;
    }
    for (i = 0; i < 8; i++) {
        u.bits = (u.bits << 8) | b[i];
    }
    return u.value;
}

int word_is(const char *s, size_t n, const char *w) {
    size_t i;
    for (i = 0; i < n; i++) {
        if (w[i] != s[i]) {
            return 0;
        }
    }
    return w[n] == '\0';
}
