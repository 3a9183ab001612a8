/*
 * dnsview.h -- cluster membership from DNS: the Kubernetes headless-
 * service pattern.
 *
 * Every interval the configured names are resolved, asynchronously, on the
 * owner's event loop: a name with SRV records gives their targets and
 * ports (each target resolved to its A and AAAA addresses); a name without
 * gives its A and AAAA addresses with the port written after it. The set
 * of "address:port" strings is handed to the owner as a membership view
 * (registry_view_fn, node ids 0: a node's id is learned in the peer
 * handshake), the same way a registry's view is, so peers join and leave
 * as records are added and removed.
 *
 * A name that does not exist, or has no records, is an empty answer (a
 * service scaled to zero). A resolver that does not answer, or fails,
 * changes nothing: the last view stays, and dnsview_source says so.
 *
 * c-ares does the resolving (SRV as well as A/AAAA; libevent's evdns has
 * no SRV): its sockets are watched with events on the owner's base.
 * Threading: the owner's loop thread only, except dnsview_source.
 */
#ifndef DNSVIEW_H
#define DNSVIEW_H

#include <stddef.h>
#include <stdint.h>

#include "registry.h"

struct event_base;

typedef struct dnsview_options {
    const char *names;    /* "name:port[,name:port...]" */
    const char *server;   /* "ip[:port][,...]"; NULL or "" = system's */
    uint32_t interval_ms; /* between resolutions (>= 100) */
} dnsview_options;

typedef struct dnsview dnsview;

/*
 * Parses the names and arms the first resolution at once on base. NULL
 * with a message in err on failure. on_view(arg, ...) runs on base's
 * thread after every resolution that got an answer for every name.
 */
dnsview *dnsview_create(struct event_base *base, const dnsview_options *o,
                        registry_view_fn on_view, void *arg, char *err,
                        size_t nerr);

/* Cancels what is in flight (no callback runs after this) and frees v. */
void dnsview_destroy(dnsview *v);

/* What `stats replication` shows as membership: the names, how many
 * addresses the last view held, and whether the resolver is failing. Any
 * thread. */
void dnsview_source(dnsview *v, char *out, size_t n);

#endif /* DNSVIEW_H */
