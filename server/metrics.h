/*
 * metrics.h -- Prometheus metrics over HTTP (GET /metrics), off by
 * default (metrics_port 0), on loopback by default (metrics_listen).
 *
 * Everything comes from the stats listings (stats_emit_group: the general
 * group, "replication" and "health"), so a metric and its `stats` line
 * never disagree. Names follow prometheus/memcached_exporter where the
 * meaning is the same (memcached_current_items, memcached_commands_total
 * {command,status}, memcached_items_evicted_total, ...), so existing
 * dashboards work; replication and health are ribltcache_*.
 *
 * Served by libevent's evhttp on the event loop given (the main thread's,
 * which only accepts connections and runs the once-a-second timer).
 */
#ifndef RIBLTCACHE_METRICS_H
#define RIBLTCACHE_METRICS_H

#include <stddef.h>
#include <stdint.h>

struct event_base;

typedef struct metrics metrics;

/* Binds listen:port and serves /metrics on base. NULL (err filled) when
 * the address cannot be bound. */
metrics *metrics_start(struct event_base *base, const char *listen,
                       uint16_t port, char *err, size_t nerr);
void metrics_stop(metrics *m);

/* The exposition text of every metric, appended to out (an evbuffer). */
struct evbuffer;
void metrics_write(struct evbuffer *out);

#endif
