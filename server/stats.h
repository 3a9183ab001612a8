/*
 * stats.h -- the counter tables and the `stats` listing's entry points.
 *
 * Every counter is declared once, in STATS_THREAD_COUNTERS, with memcached's
 * name where memcached has one (the names are part of the wire contract).
 * Each worker thread owns one stats_thread and bumps it without locks
 * (relaxed atomics); the daemon-wide connection counters (stats_conns) are
 * bumped by whichever thread accepts, hands off or closes a connection.
 *
 * This header sits below the workers, connections and parsers: it knows
 * none of them. The code that sums the counters into a listing does, and
 * lives above them in stats_registry.c (stats_registry.h).
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
    X(proxy_failures)                                                         \
    X(worker_naps)                                                            \
    X(repl_ack_waits)                                                         \
    X(repl_ack_failures)

typedef struct stats_thread {
#define STATS_FIELD(name) uint64_t name;
    STATS_THREAD_COUNTERS(STATS_FIELD)
#undef STATS_FIELD
} stats_thread;

/* Adds n to a counter of this thread's block (relaxed atomic). */
#define STATS_ADD(st, name, n)                                                \
    __atomic_fetch_add(&(st)->name, (uint64_t)(n), __ATOMIC_RELAXED)
#define STATS_INCR(st, name) STATS_ADD(st, name, 1)

/* Daemon-wide connection counters; relaxed atomics, any thread. Storage
 * in stats.c. */
typedef struct stats_conns {
    uint64_t curr_connections;
    uint64_t total_connections;
    uint64_t rejected_connections;
    uint64_t connection_structures;
    uint64_t listen_disabled_num;
    uint64_t listen_disabled_us; /* time the listeners spent paused */
    uint64_t accepting_conns;    /* gauge: 1 while the listeners accept */
} stats_conns;

extern stats_conns stats_conn_counters;

#define STATS_CONN_ADD(name, n)                                               \
    __atomic_fetch_add(&stats_conn_counters.name, (uint64_t)(n),              \
                       __ATOMIC_RELAXED)
#define STATS_CONN_SUB(name, n)                                               \
    __atomic_fetch_sub(&stats_conn_counters.name, (uint64_t)(n),              \
                       __ATOMIC_RELAXED)
#define STATS_CONN_SET(name, v)                                               \
    __atomic_store_n(&stats_conn_counters.name, (uint64_t)(v),                \
                     __ATOMIC_RELAXED)
#define STATS_CONN_GET(name)                                                  \
    __atomic_load_n(&stats_conn_counters.name, __ATOMIC_RELAXED)

/*
 * Emits one "name value" pair of a stats listing. The text protocol writes
 * "STAT name value\r\n", the binary protocol one stat packet each.
 */
typedef void (*stats_emit_fn)(void *arg, const char *name, const char *value);

#endif /* STATS_H */
