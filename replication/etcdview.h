/*
 * etcdview.h -- cluster membership through etcd v3.
 *
 * A node takes a lease, writes its member record under a key prefix with
 * that lease (key: prefix + node id in decimal; value: JSON with node,
 * addr, weight, incarnation), keeps the lease alive, and reads the prefix
 * whenever a watch on it reports a change (and every second besides): the
 * records present are the view, handed to the owner as a membership view
 * (registry_view_fn), the same way a registry's view is. A node that
 * dies stops renewing; etcd deletes its record when the lease runs out,
 * and it leaves every view.
 *
 * When etcd is unreachable the last view stays and etcdview_source says
 * so; when it answers again, a lease that expired meanwhile is taken
 * anew and the record written again.
 *
 * Transport: etcd's v3 JSON gateway over HTTP/1.1, or HTTPS with a client
 * certificate (libevent's evhttp client on the owner's loop; JSON by json-c;
 * keys and values base64 as the gateway wants them, with libcrypto's codec).
 * Threading: the owner's loop thread only, except etcdview_source.
 */
#ifndef ETCDVIEW_H
#define ETCDVIEW_H

#include <stddef.h>
#include <stdint.h>

#include "registry.h"

struct event_base;

typedef struct etcdview_options {
    const char *urls;     /* "http[s]://host:port[,...]" */
    const char *prefix;   /* key prefix, e.g. "/ribltcache/members/" */
    uint32_t lease_s;     /* lease TTL in seconds (>= 2) */
    uint32_t node_id;     /* this node's record */
    const char *addr;     /* its peer address, host:port */
    uint32_t weight;      /* its ring weight (in the record, for people) */
    uint64_t incarnation; /* grows with every start */
    /* https:// URLs: the CA etcd's certificate must chain to (NULL: the
     * system's), and our certificate and key for etcd's client
     * certificate authentication (NULL: none). */
    const char *tls_ca, *tls_cert, *tls_key;
} etcdview_options;

typedef struct etcdview etcdview;

/* Parses the options and starts registering at once on base. NULL with a
 * message in err on failure. */
etcdview *etcdview_create(struct event_base *base, const etcdview_options *o,
                          registry_view_fn on_view, void *arg, char *err,
                          size_t nerr);

/* Revokes nothing (the lease runs out), cancels what is in flight, frees
 * v. Loop thread. */
void etcdview_destroy(etcdview *v);

/* `stats replication` membership text. Any thread. */
void etcdview_source(etcdview *v, char *out, size_t n);

#endif /* ETCDVIEW_H */
