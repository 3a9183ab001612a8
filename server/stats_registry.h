/*
 * stats_registry.h -- what the daemon tells stats.c so that `stats` can
 * list everything: the settings, the store, the worker threads' counters
 * (through worker.h), the listening sockets, and the daemon-wide connection
 * counters below. Extra groups (e.g. "replication") can be registered by
 * the modules that own them.
 */
#ifndef STATS_REGISTRY_H
#define STATS_REGISTRY_H

#include <stdint.h>

#include "options.h"
#include "stats.h"
#include "store.h"

/* Daemon-wide connection counters; relaxed atomics, any thread. */
typedef struct stats_conns {
    uint64_t curr_connections;
    uint64_t total_connections;
    uint64_t rejected_connections;
    uint64_t connection_structures;
    uint64_t listen_disabled_num;
    uint64_t accepting_conns; /* gauge: 1 while the listeners accept */
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

enum stats_rc {
    STATS_OK = 0,
    STATS_ERR_FULL = -1, /* too many listeners or groups */
};

/*
 * Records what stats lists. o and s must stay valid until
 * stats_registry_teardown. Call before serving.
 */
void stats_registry_setup(const options *o, store *s);
void stats_registry_teardown(void);

/* A listening socket, listed by `stats conns` as conn_listening. */
int stats_registry_add_listener(int fd);

/*
 * Adds a stats group. fn lists it through emit. name is borrowed and must
 * stay valid. Returns 0 or STATS_ERR_FULL.
 */
typedef void (*stats_group_fn)(void *arg, stats_emit_fn emit, void *emit_arg);
int stats_register_group(const char *name, stats_group_fn fn, void *arg);

#endif /* STATS_REGISTRY_H */
