/*
 * stats_registry.h -- what the daemon tells the stats listings so that
 * `stats` can list everything: the settings, the store and the listening
 * sockets. The listings (stats_registry.c) also sum the worker threads'
 * counters (through worker.h) and the daemon-wide connection counters
 * (stats.h). Extra groups (e.g. "replication") can be registered by the
 * code that owns them.
 *
 * The counters themselves are in stats.h, which the modules that bump them
 * include instead of this header: only the listings know the workers.
 */
#ifndef STATS_REGISTRY_H
#define STATS_REGISTRY_H

#include <stdint.h>

#include "options.h"
#include "stats.h"
#include "store.h"

/*
 * Lists the stats group `group` ("" = general, "settings", "items", "slabs",
 * "conns", "replication", ...) through emit. Returns 0, or -1 when the group
 * is unknown. The parsers reach it through proto_config.stats_list.
 */
int stats_emit_group(const char *group, stats_emit_fn emit, void *arg);

/* "stats reset": zeroes the resettable counters. */
void stats_reset(void);

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

/* Adds lines at the end of the general `stats` listing (for example TLS's
 * counters, only when TLS is on). Returns 0 or STATS_ERR_FULL. */
int stats_register_general(stats_group_fn fn, void *arg);

#endif /* STATS_REGISTRY_H */
