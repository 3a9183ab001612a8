/*
 * chunk.h -- item memory: fine size classes carved from 64 KiB pages.
 *
 * The store's items up to CHUNK_MAX bytes are allocated here instead of
 * from the general allocator, whose size classes are four to a doubling
 * (a 1070-byte item takes jemalloc's 1280-byte class, 16 % lost). Classes
 * here are 8 bytes apart up to 512 bytes, 16 up to 1 KiB, 32 up to 2 KiB,
 * and above that one class per number of chunks a page holds (31 down to
 * 8), so a chunk wastes at most a few per cent. A page holds chunks of one
 * class; a page whose chunks are all free goes back to the general
 * allocator (each class keeps at most one empty page). Items larger than
 * CHUNK_MAX stay with the general allocator, whose classes are then close
 * enough.
 *
 * Process-wide and thread-safe (a mutex per class). A chunk remembers
 * nothing of its size: callers pass the size they asked for to learn the
 * chunk's size. Built with AddressSanitizer, free chunks are poisoned.
 */
#ifndef CHUNK_H
#define CHUNK_H

#include <stddef.h>
#include <stdint.h>

/* Bytes in a page, and the largest request served from pages. */
#define CHUNK_PAGE (64u << 10)
#define CHUNK_MAX 8184u

/*
 * A chunk of at least n bytes (1 <= n <= CHUNK_MAX), 8-byte aligned, or
 * NULL without memory.
 */
void *chunk_alloc(size_t n);

/* Returns a chunk from chunk_alloc. NULL is ignored. */
void chunk_free(void *p);

/*
 * The size of the chunk chunk_alloc(n) returns: the bytes it really takes
 * (what memory accounting should count). 0 when n is 0 or > CHUNK_MAX.
 */
size_t chunk_size(size_t n);

typedef struct chunk_stats {
    uint64_t pages;       /* pages held, empty ones kept included */
    uint64_t chunk_bytes; /* bytes of chunks handed out */
} chunk_stats;

/* Process-wide totals, read without stopping allocation. */
void chunk_stats_read(chunk_stats *out);

#endif
