/*
 * daemon.h -- the ribltcached daemon's machinery: settings, listeners,
 * signals, pidfile, daemonizing, privilege drop, the open files limit, the
 * once-a-second sweep, start and stop.
 *
 * server/ knows nothing of replication/: the program's main() (the
 * composition root, ribltcached.c at the top of the tree) is the one place
 * that knows both. It hands daemon_main the hooks below, which bring in
 * what server/ cannot name (replication, the registry, placement): store
 * options, stats groups (through stats_registry.h), the relay's route_fn,
 * and their threads' start and stop.
 */
#ifndef DAEMON_H
#define DAEMON_H

#include <stddef.h>

#include "options.h"
#include "proto.h"
#include "store.h"

/*
 * What the composition root adds to the daemon. Every member may be NULL.
 * A hook that returns non-zero has written a message to err (nerr bytes):
 * the daemon prints it and exits with status 1, as for any start-up error.
 * o is the daemon's settings, valid until stop returns.
 */
typedef struct daemon_hooks {
    void *arg; /* passed to every hook */
    /* Before the store is created: adjusts its options (so holds the
     * daemon's own already). */
    int (*store_options)(void *arg, const options *o, store_options *so,
                         char *err, size_t nerr);
    /* Once the store exists and the stats registry is set up, before the
     * worker threads start: creates what the hooks own, registers their
     * stats groups, and may set pcfg's relay fields (route_fn, route_arg,
     * proxy_timeout_ms) and its acknowledgement fields (ack_take,
     * ack_held, ack_arg, ack_wait_ms). s stays valid until stop
     * returns. */
    int (*setup)(void *arg, const options *o, store *s, proto_config *pcfg,
                 char *err, size_t nerr);
    /* Once the listeners are bound, before the daemon serves: starts the
     * hooks' threads. */
    int (*run)(void *arg, char *err, size_t nerr);
    /* SIGHUP and `refresh_certs`: loads the hooks' certificates again
     * (the peer channel's). Returns 0 when reloaded, 1 when the hooks
     * have none, -1 with a message in err when a file does not load (the
     * old ones stay). Main thread. */
    int (*reload_certs)(void *arg, char *err, size_t nerr);
    /* At shutdown, after the worker threads are gone (no client request
     * runs any more) and before the store is destroyed. */
    void (*stop)(void *arg);
} daemon_hooks;

/*
 * The whole life of the daemon: parses the command line (and --config),
 * answers --help, --man and --version, or starts, serves until SIGTERM,
 * SIGINT or the `shutdown` command, and stops. hooks may be NULL; it is
 * copied. Returns the process's exit status; a start-up error exits from
 * inside with a message on stderr.
 */
int daemon_main(int argc, char **argv, const daemon_hooks *hooks);

/*
 * Peers confirmed writes (any thread, while the daemon runs): the workers
 * answer the connections that waited for them (proto_config.ack_held).
 */
void daemon_wake_acks(void);

#endif /* DAEMON_H */
