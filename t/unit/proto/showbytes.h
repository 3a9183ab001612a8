/*
 * showbytes.h -- prints protocol bytes readably in test failure messages
 * (\r, \n and non-printable bytes escaped), for the protocol suites.
 */
#ifndef SHOWBYTES_H
#define SHOWBYTES_H

#include <stddef.h>
#include <stdio.h>

/* Writes n bytes of s to dst (cap bytes, NUL-terminated), escaped. */
static inline void show(char *dst, size_t cap, const char *s, size_t n)
{
    size_t j = 0;
    for (size_t i = 0; i < n && j + 5 < cap; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '\r') {
            dst[j++] = '\\';
            dst[j++] = 'r';
        } else if (c == '\n') {
            dst[j++] = '\\';
            dst[j++] = 'n';
        } else if (c < 32 || c > 126) {
            j += (size_t)snprintf(dst + j, cap - j, "\\x%02x", c);
        } else {
            dst[j++] = (char)c;
        }
    }
    dst[j] = '\0';
}

#endif
