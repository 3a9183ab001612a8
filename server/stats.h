/*
 * stats.h -- counters and the `stats` listing.
 *
 * Every counter is declared once, in STATS_THREAD_COUNTERS, with memcached's
 * name where memcached has one (the names are part of the wire contract).
 * Each worker thread owns one stats_thread and bumps it without locks
 * (relaxed atomics); `stats` sums all threads.
 */
#ifndef STATS_H
#define STATS_H

#include <stdint.h>

#define STATS_THREAD_COUNTERS(X)                                              \
    X(cmd_get)                                                                \
    X(cmd_set)                                                                \
    X(cmd_flush)                                                              \
    X(cmd_touch)                                                              \
    X(cmd_meta)                                                               \
    X(get_hits)                                                               \
    X(get_misses)                                                             \
    X(get_expired)                                                            \
    X(get_flushed)                                                            \
    X(delete_misses)                                                          \
    X(delete_hits)                                                            \
    X(incr_misses)                                                            \
    X(incr_hits)                                                              \
    X(decr_misses)                                                            \
    X(decr_hits)                                                              \
    X(cas_misses)                                                             \
    X(cas_hits)                                                               \
    X(cas_badval)                                                             \
    X(touch_hits)                                                             \
    X(touch_misses)                                                           \
    X(store_too_large)                                                        \
    X(store_no_memory)                                                        \
    X(auth_cmds)                                                              \
    X(auth_errors)                                                            \
    X(bytes_read)                                                             \
    X(bytes_written)                                                          \
    X(client_errors)                                                          \
    X(protocol_errors)                                                        \
    X(proxied_requests)                                                       \
    X(proxy_failures)

typedef struct stats_thread {
#define STATS_FIELD(name) uint64_t name;
    STATS_THREAD_COUNTERS(STATS_FIELD)
#undef STATS_FIELD
} stats_thread;

/* Adds n to a counter of this thread's block (relaxed atomic). */
#define STATS_ADD(st, name, n)                                                \
    __atomic_fetch_add(&(st)->name, (uint64_t)(n), __ATOMIC_RELAXED)
#define STATS_INCR(st, name) STATS_ADD(st, name, 1)

/*
 * Emits one "name value" pair of a stats listing. The text protocol writes
 * "STAT name value\r\n", the binary protocol one stat packet each.
 */
typedef void (*stats_emit_fn)(void *arg, const char *name, const char *value);

/*
 * Lists the stats group `group` ("" = general, "settings", "items", "slabs",
 * "conns", "replication", ...) through emit. Returns 0, or -1 when the group
 * is unknown. Implemented by the daemon, which knows every source of stats.
 */
int stats_emit_group(const char *group, stats_emit_fn emit, void *arg);

/* "stats reset": zeroes the resettable counters. */
void stats_reset(void);

#endif /* STATS_H */
