/*
 * metrics.c -- Prometheus text exposition of the stats listings (see
 * metrics.h): collect the general, "replication" and "health" groups as
 * name/value pairs, then print each metric from the table below.
 */
#define _GNU_SOURCE
#include "metrics.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/buffer.h>
#include <event2/event.h>
#include <event2/http.h>

#include "stats_registry.h"

/* ============================================================ a listing */

/* One stats group, as collected: name/value pairs in listing order. */
struct listing {
    char **names, **values;
    size_t n, cap;
    int failed;
};

static void collect(void *arg, const char *name, const char *value)
{
    struct listing *l = arg;
    if (l->failed)
        return;
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 128;
        char **nn = realloc(l->names, cap * sizeof(*nn));
        if (nn)
            l->names = nn;
        char **nv = realloc(l->values, cap * sizeof(*nv));
        if (nv)
            l->values = nv;
        if (!nn || !nv) {
            l->failed = 1;
            return;
        }
        l->cap = cap;
    }
    l->names[l->n] = strdup(name);
    l->values[l->n] = strdup(value);
    if (!l->names[l->n] || !l->values[l->n]) {
        free(l->names[l->n]);
        free(l->values[l->n]);
        l->failed = 1;
        return;
    }
    l->n++;
}

static void listing_free(struct listing *l)
{
    for (size_t i = 0; i < l->n; i++) {
        free(l->names[i]);
        free(l->values[i]);
    }
    free(l->names);
    free(l->values);
}

static const char *get(const struct listing *l, const char *name)
{
    for (size_t i = 0; i < l->n; i++)
        if (strcmp(l->names[i], name) == 0)
            return l->values[i];
    return NULL;
}

/* Sum of "peerN:<field>" over every peer. */
static unsigned long long peer_sum(const struct listing *l, const char *field)
{
    unsigned long long total = 0;
    size_t nf = strlen(field);
    for (size_t i = 0; i < l->n; i++) {
        const char *colon = strchr(l->names[i], ':');
        if (strncmp(l->names[i], "peer", 4) == 0 && colon &&
            strlen(colon + 1) == nf && strcmp(colon + 1, field) == 0)
            total += strtoull(l->values[i], NULL, 10);
    }
    return total;
}

/* ============================================================== output */

static void head(struct evbuffer *out, const char *name, const char *type,
                 const char *help)
{
    evbuffer_add_printf(out, "# HELP %s %s\n# TYPE %s %s\n", name, help, name,
                        type);
}

/* A sample whose value is a stats value, copied as it is (stats values
 * are decimal numbers, integer or with a fraction). */
static void sample(struct evbuffer *out, const char *name, const char *labels,
                   const char *value)
{
    evbuffer_add_printf(out, "%s%s %s\n", name, labels ? labels : "",
                        value ? value : "0");
}

/* A label value: backslash, quote and newline escaped. */
static void label_value(char *dst, size_t cap, const char *src)
{
    size_t j = 0;
    for (size_t i = 0; src[i] && j + 3 < cap; i++) {
        char c = src[i];
        if (c == '\\' || c == '"') {
            dst[j++] = '\\';
            dst[j++] = c;
        } else if (c == '\n') {
            dst[j++] = '\\';
            dst[j++] = 'n';
        } else {
            dst[j++] = c;
        }
    }
    dst[j] = '\0';
}

/* A metric straight from one stat of the general listing. */
struct simple {
    const char *stat, *name, *type, *help;
};

static const struct simple general[] = {
    {"uptime", "memcached_uptime_seconds", "gauge",
     "Seconds the server has been up."},
    {"time", "memcached_time_seconds", "gauge",
     "The server's clock, unix seconds."},
    {"curr_items", "memcached_current_items", "gauge",
     "Items currently stored."},
    {"total_items", "memcached_items_total", "counter", "Items ever stored."},
    {"bytes", "memcached_current_bytes", "gauge",
     "Bytes of the items currently stored."},
    {"limit_maxbytes", "memcached_limit_bytes", "gauge",
     "The memory limit (-m), bytes."},
    {"evictions", "memcached_items_evicted_total", "counter",
     "Items evicted to make room."},
    {"reclaimed", "memcached_items_reclaimed_total", "counter",
     "Expired items whose memory was used again."},
    {"curr_connections", "memcached_current_connections", "gauge",
     "Client connections open."},
    {"total_connections", "memcached_connections_total", "counter",
     "Client connections ever accepted."},
    {"rejected_connections", "memcached_connections_rejected_total", "counter",
     "Client connections refused at the limit."},
    {"max_connections", "memcached_max_connections", "gauge",
     "The client connection limit (-c)."},
    {"listen_disabled_num", "memcached_connections_listener_disabled_total",
     "counter", "Times the listener stopped at the connection limit."},
    {"bytes_read", "memcached_read_bytes_total", "counter",
     "Bytes read from clients."},
    {"bytes_written", "memcached_written_bytes_total", "counter",
     "Bytes written to clients."},
    {"rusage_user", "memcached_process_user_cpu_seconds_total", "counter",
     "User CPU seconds of the process."},
    {"rusage_system", "memcached_process_system_cpu_seconds_total", "counter",
     "System CPU seconds of the process."},
    {"threads", "memcached_threads", "gauge", "Worker threads."},
    {"repl_ack_waits", "ribltcache_ack_waits_total", "counter",
     "Replies held until a peer held their writes (repl_ack_wait_ms)."},
    {"repl_ack_failures", "ribltcache_ack_failures_total", "counter",
     "Connections closed unanswered: no peer confirmed their writes."},
};

/* memcached_commands_total{command,status}: the exporter's mapping. */
static const struct {
    const char *command, *status, *stat;
} commands[] = {
    {"get", "hit", "get_hits"},        {"get", "miss", "get_misses"},
    {"get", "expired", "get_expired"}, {"get", "flushed", "get_flushed"},
    {"set", "hit", "cmd_set"},         {"cas", "hit", "cas_hits"},
    {"cas", "miss", "cas_misses"},     {"cas", "badval", "cas_badval"},
    {"delete", "hit", "delete_hits"},  {"delete", "miss", "delete_misses"},
    {"incr", "hit", "incr_hits"},      {"incr", "miss", "incr_misses"},
    {"decr", "hit", "decr_hits"},      {"decr", "miss", "decr_misses"},
    {"touch", "hit", "touch_hits"},    {"touch", "miss", "touch_misses"},
    {"flush", "hit", "cmd_flush"},
};

static void write_general(struct evbuffer *out, const struct listing *g)
{
    char lv[256], labels[320];
    head(out, "memcached_up", "gauge", "Whether the server answered.");
    sample(out, "memcached_up", NULL, "1");
    const char *version = get(g, "version");
    if (version) {
        label_value(lv, sizeof(lv), version);
        snprintf(labels, sizeof(labels), "{version=\"%s\"}", lv);
        head(out, "memcached_version", "gauge", "The server's version.");
        sample(out, "memcached_version", labels, "1");
    }
    for (size_t i = 0; i < sizeof(general) / sizeof(general[0]); i++) {
        const char *v = get(g, general[i].stat);
        if (!v)
            continue;
        head(out, general[i].name, general[i].type, general[i].help);
        sample(out, general[i].name, NULL, v);
    }
    head(out, "memcached_commands_total", "counter",
         "Commands by command and result.");
    for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++) {
        const char *v = get(g, commands[i].stat);
        if (!v)
            continue;
        snprintf(labels, sizeof(labels), "{command=\"%s\",status=\"%s\"}",
                 commands[i].command, commands[i].status);
        sample(out, "memcached_commands_total", labels, v);
    }
    const char *v = get(g, "mutations");
    if (v) {
        head(out, "ribltcache_mutations", "gauge",
             "Mutations in the reconciliation set (values, tombstones, "
             "records of evicted values).");
        sample(out, "ribltcache_mutations", NULL, v);
    }
}

/*
 * Peer i of the replication listing: -1 past the last, 0 for this node's
 * own entry, 1 with its labels ({peer,node}) and its state filled.
 */
static int peer_at(const struct listing *r, int i, char *labels, size_t cap,
                   const char **state)
{
    char key[48], lv[256];
    snprintf(key, sizeof(key), "peer%d:addr", i);
    const char *addr = get(r, key);
    if (!addr)
        return -1;
    snprintf(key, sizeof(key), "peer%d:state", i);
    *state = get(r, key);
    if (*state && strcmp(*state, "self") == 0)
        return 0;
    snprintf(key, sizeof(key), "peer%d:node_id", i);
    const char *id = get(r, key);
    label_value(lv, sizeof(lv), addr);
    snprintf(labels, cap, "{peer=\"%s\",node=\"%s\"}", lv, id ? id : "0");
    return 1;
}

/* One gauge per peer (self left out) from its peerN:<field>. */
static void peer_series(struct evbuffer *out, const struct listing *r,
                        const char *name, const char *help, const char *field)
{
    char key[64], labels[320];
    const char *state;
    head(out, name, "gauge", help);
    for (int i = 0, rc;
         (rc = peer_at(r, i, labels, sizeof(labels), &state)) >= 0; i++) {
        if (rc == 0)
            continue;
        snprintf(key, sizeof(key), "peer%d:%s", i, field);
        sample(out, name, labels, get(r, key));
    }
}

/* Replication: node counters, sums over peers, and one series per peer. */
static void write_replication(struct evbuffer *out, const struct listing *r)
{
    char buf[64], labels[320];
    static const struct simple node[] = {
        {"applied", "ribltcache_applied_total", "counter",
         "Mutations from peers that won and were applied."},
        {"stale", "ribltcache_stale_total", "counter",
         "Mutations from peers that lost to what this node held."},
        {"push_queue_length", "ribltcache_push_queue_length", "gauge",
         "Fresh writes waiting to be pushed."},
        {"round_gap_ticks", "ribltcache_round_gap_ticks", "gauge",
         "Ticks between the rounds this node starts: 1 while rounds "
         "repair, up to 16 once they find nothing."},
        {"push_queue_dropped", "ribltcache_push_queue_dropped_total",
         "counter", "Fresh writes not pushed: the queue was full."},
        {"push_acks", "ribltcache_push_acks_total", "counter",
         "Peers' confirmations that they applied pushed writes."},
        {"bad_frames", "ribltcache_peer_bad_frames_total", "counter",
         "Peer frames refused as malformed."},
        {"auth_failures", "ribltcache_peer_auth_failures_total", "counter",
         "Peer handshakes refused."},
        {"duplicate_node_id", "ribltcache_duplicate_node_id_total", "counter",
         "Peer links refused: the other node has this node's id."},
        {"served_symbols", "ribltcache_symbols_served_total", "counter",
         "Coded symbols sent to peers' rounds."},
        {"served_bulk", "ribltcache_bulk_served_total", "counter",
         "Bulk transfers sent to peers."},
        {"ring_changes", "ribltcache_ring_changes_total", "counter",
         "Times the placement ring changed (replicas > 0)."},
        {"ring_mismatch", "ribltcache_ring_mismatches_total", "counter",
         "Rounds refused because the two rings differed."},
        {"partitions_dropped", "ribltcache_partitions_dropped_total",
         "counter", "Partitions handed off to their owners and dropped."},
    };
    for (size_t i = 0; i < sizeof(node) / sizeof(node[0]); i++) {
        const char *v = get(r, node[i].stat);
        if (!v)
            continue;
        head(out, node[i].name, node[i].type, node[i].help);
        sample(out, node[i].name, NULL, v);
    }
    head(out, "ribltcache_rounds_total", "counter",
         "Reconciliation rounds this node ran, by result.");
    static const char *const results[][2] = {{"ok", "rounds_ok"},
                                             {"failed", "rounds_failed"},
                                             {"busy", "rounds_busy"}};
    for (size_t i = 0; i < 3; i++) {
        snprintf(labels, sizeof(labels), "{result=\"%s\"}", results[i][0]);
        snprintf(buf, sizeof(buf), "%llu", peer_sum(r, results[i][1]));
        sample(out, "ribltcache_rounds_total", labels, buf);
    }
    static const struct simple sums[] = {
        {"symbols_recv", "ribltcache_symbols_received_total", "counter",
         "Coded symbols received in this node's rounds."},
        {"bulk_transfers", "ribltcache_bulk_transfers_total", "counter",
         "Bulk transfers this node pulled."},
        {"mutations_fetched", "ribltcache_mutations_fetched_total", "counter",
         "Mutations fetched in this node's rounds."},
        {"mutations_sent", "ribltcache_mutations_sent_total", "counter",
         "Mutations this node's rounds pushed to peers."},
        {"pushed", "ribltcache_pushed_total", "counter",
         "Fresh writes pushed to peers (one per peer)."},
        {"push_dropped", "ribltcache_push_dropped_total", "counter",
         "Pushes lost to rounds: the peer was too far behind for the "
         "push log."},
        {"push_from_log", "ribltcache_push_from_log_total", "counter",
         "Writes sent to a peer that fell behind from the push log."},
    };
    for (size_t i = 0; i < sizeof(sums) / sizeof(sums[0]); i++) {
        head(out, sums[i].name, sums[i].type, sums[i].help);
        snprintf(buf, sizeof(buf), "%llu", peer_sum(r, sums[i].stat));
        sample(out, sums[i].name, NULL, buf);
    }
    head(out, "ribltcache_differences_total", "counter",
         "Differences decoded in this node's rounds, by which side held "
         "them.");
    snprintf(buf, sizeof(buf), "%llu", peer_sum(r, "diffs_remote"));
    sample(out, "ribltcache_differences_total", "{side=\"peer\"}", buf);
    snprintf(buf, sizeof(buf), "%llu", peer_sum(r, "diffs_local"));
    sample(out, "ribltcache_differences_total", "{side=\"here\"}", buf);

    /* Per peer (self left out): up, seconds since its last good round,
     * the difference that round found. */
    head(out, "ribltcache_peer_up", "gauge",
         "Whether the link to the peer is up.");
    const char *state;
    for (int i = 0, rc;
         (rc = peer_at(r, i, labels, sizeof(labels), &state)) >= 0; i++)
        if (rc > 0)
            sample(out, "ribltcache_peer_up", labels,
                   state && strcmp(state, "up") == 0 ? "1" : "0");
    peer_series(out, r, "ribltcache_peer_last_round_differences",
                "Differences the last good round with the peer found.",
                "last_round_diffs");
    peer_series(out, r, "ribltcache_peer_last_success_timestamp_seconds",
                "When the last good round with the peer ended, unix seconds "
                "(0: never).",
                "last_success");
}

static void write_health(struct evbuffer *out, const struct listing *h)
{
    static const char *const verdicts[] = {"converged", "catching_up",
                                           "isolated", "standalone"};
    const char *verdict = get(h, "health");
    char labels[64];
    head(out, "ribltcache_health", "gauge",
         "This node's verdict: 1 for the one that holds.");
    for (size_t i = 0; i < 4; i++) {
        snprintf(labels, sizeof(labels), "{verdict=\"%s\"}", verdicts[i]);
        sample(out, "ribltcache_health", labels,
               verdict && strcmp(verdict, verdicts[i]) == 0 ? "1" : "0");
    }
    static const struct simple gauges[] = {
        {"health_peers_up", "ribltcache_peers_up", "gauge",
         "Peers whose link is up."},
        {"health_peers", "ribltcache_peers", "gauge", "Peers known."},
        {"health_last_differences", "ribltcache_last_round_differences",
         "gauge",
         "The largest difference the last round with an up peer found."},
    };
    for (size_t i = 0; i < sizeof(gauges) / sizeof(gauges[0]); i++) {
        const char *v = get(h, gauges[i].stat);
        if (!v)
            continue;
        head(out, gauges[i].name, gauges[i].type, gauges[i].help);
        sample(out, gauges[i].name, NULL, v);
    }
}

void metrics_write(struct evbuffer *out)
{
    struct listing g = {0}, r = {0}, h = {0};
    stats_emit_group("", collect, &g);
    int repl = stats_emit_group("replication", collect, &r) == 0;
    stats_emit_group("health", collect, &h);
    write_general(out, &g);
    if (repl)
        write_replication(out, &r);
    write_health(out, &h);
    listing_free(&g);
    listing_free(&r);
    listing_free(&h);
}

/* ================================================================ http */

struct metrics {
    struct evhttp *http;
};

static void on_metrics(struct evhttp_request *req, void *arg)
{
    (void)arg;
    if (evhttp_request_get_command(req) != EVHTTP_REQ_GET) {
        evhttp_send_error(req, 405, "only GET");
        return;
    }
    struct evbuffer *body = evbuffer_new();
    if (!body) {
        evhttp_send_error(req, 500, "out of memory");
        return;
    }
    metrics_write(body);
    evhttp_add_header(evhttp_request_get_output_headers(req), "Content-Type",
                      "text/plain; version=0.0.4; charset=utf-8");
    evhttp_send_reply(req, 200, "OK", body);
    evbuffer_free(body);
}

static void on_other(struct evhttp_request *req, void *arg)
{
    (void)arg;
    evhttp_send_error(req, 404, "try /metrics");
}

metrics *metrics_start(struct event_base *base, const char *listen,
                       uint16_t port, char *err, size_t nerr)
{
    metrics *m = calloc(1, sizeof(*m));
    if (!m || !(m->http = evhttp_new(base))) {
        snprintf(err, nerr, "metrics: out of memory");
        free(m);
        return NULL;
    }
    /* A scrape is one small GET: bound what a client may send. */
    evhttp_set_max_headers_size(m->http, 16384);
    evhttp_set_max_body_size(m->http, 0);
    evhttp_set_timeout(m->http, 10);
    evhttp_set_allowed_methods(m->http, EVHTTP_REQ_GET);
    evhttp_set_cb(m->http, "/metrics", on_metrics, m);
    evhttp_set_gencb(m->http, on_other, m);
    if (!evhttp_bind_socket_with_handle(m->http, listen, port)) {
        snprintf(err, nerr, "metrics: cannot listen on %s port %u", listen,
                 (unsigned)port);
        evhttp_free(m->http);
        free(m);
        return NULL;
    }
    return m;
}

void metrics_stop(metrics *m)
{
    if (!m)
        return;
    evhttp_free(m->http);
    free(m);
}
