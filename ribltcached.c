/*
 * ribltcached.c -- the composition root: the ribltcached program.
 *
 * server/ is the daemon (daemon.h: settings, listeners, signals, workers,
 * the store) and knows nothing of replication/; replication/ reaches the
 * store through store.h and knows nothing of the daemon. This file is the
 * one place that knows both: it builds the replication object, the
 * registry and the placement ring from the settings and hands them to the
 * daemon as hooks (store options, stats groups, the relay's route_fn,
 * start and stop).
 *
 * Replication is optional at build time: without replication/ (HAVE_REPL
 * undefined, set by the build when it links the replication library) the
 * daemon runs as a single node and refuses the settings that need a peer.
 */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon.h"
#include "options.h"
#include "proto.h"
#include "stats_registry.h"
#include "store.h"

#ifdef HAVE_REPL
#include "registry.h"
#include "repl.h"
#include "repl_tls.h"
#include "ring.h"

/* What the hooks own; set up in root_setup, gone after root_stop. */
static struct {
    repl *repl;
    registry_server *registry;
    repl_tls *tls;       /* peer and registry TLS, when repl_tls_* are set */
    uint32_t partitions; /* ring_partitions, for key_partition */
} root;

static void repl_stats(void *arg, stats_emit_fn emit, void *emit_arg)
{
    repl_emit_stats(arg, emit, emit_arg);
}

static void ring_stats(void *arg, stats_emit_fn emit, void *emit_arg)
{
    repl_emit_ring_stats(arg, emit, emit_arg);
}

static void health_stats(void *arg, stats_emit_fn emit, void *emit_arg)
{
    repl_emit_health(arg, emit, emit_arg);
}

/* The store's partition of a key: the ring's, computed the same way. */
static uint32_t key_partition(void *arg, const char *key, size_t nkey)
{
    (void)arg;
    return ring_key_partition(root.partitions, key, nkey);
}

/* proto_route_fn over the replication ring. */
static int route_key(void *arg, const char *key, size_t nkey, bool write,
                     proto_target *out, int cap)
{
    repl_target t[PROTO_ROUTE_MAX];
    if (cap > PROTO_ROUTE_MAX) {
        cap = PROTO_ROUTE_MAX;
    }
    int n = repl_route(arg, key, nkey, write, t, cap);
    for (int i = 0; i < n; i++) {
        out[i].node = t[i].node;
        out[i].addr = t[i].addr;
        out[i].addrlen = t[i].addrlen;
    }
    return n;
}

/*
 * daemon_hooks.store_options. With replicas > 0 the store keeps one set
 * per ring partition. Checks the settings placement needs (a TCP client
 * port other nodes can reach, no SASL: relayed requests carry no
 * credentials).
 */
static int root_store_options(void *arg, const options *o, store_options *so,
                              char *err, size_t nerr)
{
    (void)arg;
    if (o->replicas == 0) {
        return 0;
    }
    if (o->repl_port == 0) {
        snprintf(err, nerr, "replicas > 0 needs repl_port");
        return -1;
    }
    if (o->auth_enabled_sasl) {
        snprintf(err, nerr,
                 "replicas > 0 cannot be combined with SASL: "
                 "relayed requests carry no credentials");
        return -1;
    }
    root.partitions = (uint32_t)o->ring_partitions;
    so->partitions = root.partitions;
    so->partition_fn = key_partition;
    so->partition_arg = NULL;
    so->partition_sketch_symbols = (size_t)o->partition_sketch_symbols;
    return 0;
}

/*
 * The address other nodes relay requests to: advertise, or the first -l
 * address (with its own port, or -p) when it is a concrete address; a
 * `notls:` prefix is skipped (with -Z, relays speak TLS, so that first
 * address should be a TLS listener). Returns 0, or -1 with a message in
 * err when there is none.
 */
static int advertise_address(const options *o, char *out, size_t n, char *err,
                             size_t nerr)
{
    if (o->advertise != NULL && o->advertise[0] != '\0') {
        snprintf(out, n, "%s", o->advertise);
        return 0;
    }
    /* The first -l address, split as the daemon splits it. */
    char first[256];
    size_t k = strcspn(o->inter, ",; ");
    if (k >= sizeof(first)) {
        k = sizeof(first) - 1;
    }
    memcpy(first, o->inter, k);
    first[k] = '\0';
    bool notls;
    char *port_text;
    char *host = options_listen_entry(first, &notls, &port_text);
    unsigned port = port_text != NULL ? (unsigned)strtoul(port_text, NULL, 10)
                                      : (unsigned)o->tcpport;
    if (host == NULL || port == 0 || o->domain_socket != NULL ||
        host[0] == '\0' || strcmp(host, "0.0.0.0") == 0 ||
        strcmp(host, "::") == 0 || strcmp(host, "*") == 0) {
        snprintf(err, nerr,
                 "replicas > 0 needs advertise = host:port (the "
                 "client address other nodes relay to)");
        return -1;
    }
    if (strchr(host, ':') != NULL) {
        snprintf(out, n, "[%s]:%u", host, port);
    } else {
        snprintf(out, n, "%s:%u", host, port);
    }
    return 0;
}

static void registry_stats(void *arg, stats_emit_fn emit, void *emit_arg)
{
    registry_server_emit_stats(arg, emit, emit_arg);
}

static void timing_from_options(const options *o, registry_timing *t)
{
    registry_timing_default(t);
    t->heartbeat_ms = (uint32_t)o->heartbeat_ms;
    t->probe_ms = (uint32_t)o->probe_ms;
    t->probe_timeout_ms = (uint32_t)o->probe_timeout_ms;
    t->suspect_timeout_ms = (uint32_t)o->suspect_timeout_ms;
    t->indirect_probes = (uint32_t)o->indirect_probes;
}

/* Creates the registry (binds its port) when registry_port is set: inside
 * a node, or alone when repl_port is 0. */
/* The peer channel's TLS context, when any repl_tls_* setting is given
 * (all three are then needed). */
static int tls_setup(const options *o, char *err, size_t nerr)
{
    if (!o->repl_tls_cert && !o->repl_tls_key && !o->repl_tls_ca) {
        return 0;
    }
    repl_tls_options to = {
        .cert = o->repl_tls_cert,
        .key = o->repl_tls_key,
        .ca = o->repl_tls_ca,
        .node_id = o->repl_port != 0 ? (uint32_t)o->node_id : 0,
    };
    char terr[512];
    root.tls = repl_tls_create(&to, terr, sizeof(terr));
    if (root.tls == NULL) {
        snprintf(err, nerr, "peer TLS: %s", terr);
        return -1;
    }
    return 0;
}

/* daemon_hooks.reload_certs: the peer channel's certificates. */
static int root_reload_certs(void *arg, char *err, size_t nerr)
{
    (void)arg;
    if (root.tls == NULL) {
        return 1;
    }
    return repl_tls_reload(root.tls, err, nerr);
}

static int registry_setup(const options *o, char *err, size_t nerr)
{
    if (o->registry_port == 0) {
        return 0;
    }
    registry_server_options ro = {
        .listen = o->registry_listen,
        .port = (uint16_t)o->registry_port,
        .secret = o->cluster_secret ? o->cluster_secret : "",
        .insecure = o->repl_insecure,
        .tls = root.tls,
    };
    char rerr[512];
    timing_from_options(o, &ro.timing);
    root.registry = registry_server_create(&ro, rerr, sizeof(rerr));
    if (root.registry == NULL) {
        snprintf(err, nerr, "registry: %s", rerr);
        return -1;
    }
    stats_register_group("registry", registry_stats, root.registry);
    return 0;
}

/* "stats health" of a node without replication: nothing to agree with. */
static void standalone_health(void *arg, stats_emit_fn emit, void *emit_arg)
{
    (void)arg;
    emit(emit_arg, "health", "standalone");
}

/* proto_config's acknowledgement hooks (repl_ack_wait_ms), and the
 * replication thread's word that peers confirmed writes. */
static uint64_t ack_take(void *arg, bool *dropped)
{
    (void)arg;
    return repl_ticket_take(dropped);
}

static bool ack_held(void *arg, uint64_t ticket)
{
    return repl_ticket_held(arg, ticket);
}

static void on_acked(void *arg)
{
    (void)arg;
    daemon_wake_acks();
}

/*
 * daemon_hooks.setup. Creates the registry and the replication object
 * (binding their ports) when their ports are set, registers their stats
 * groups, and with replicas > 0 routes the parsers' keys over the ring.
 */
static int root_setup(void *arg, const options *o, store *s,
                      proto_config *pcfg, char *err, size_t nerr)
{
    (void)arg;
    if (tls_setup(o, err, nerr) != 0 || registry_setup(o, err, nerr) != 0) {
        return -1;
    }
    if (o->repl_port == 0) {
        if (o->repl_ack_wait_ms != 0) {
            snprintf(err, nerr,
                     "repl_ack_wait_ms needs replication (repl_port)");
            return -1;
        }
        stats_register_group("health", standalone_health, NULL);
        return 0;
    }
    repl_options ro;
    char rerr[512];
    repl_options_default(&ro);
    ro.node_id = (uint32_t)o->node_id;
    ro.listen = o->repl_listen;
    ro.port = (uint16_t)o->repl_port;
    ro.peers = o->peers ? o->peers : "";
    ro.secret = o->cluster_secret ? o->cluster_secret : "";
    ro.insecure = o->repl_insecure;
    ro.tls = root.tls;
    ro.period_ms = (uint32_t)o->repl_period_ms;
    ro.push_delay_us = (uint32_t)o->repl_push_delay_us;
    ro.backlog_bytes = (size_t)o->repl_backlog_kb << 10;
    ro.max_symbols = (uint32_t)o->repl_max_symbols;
    ro.round_timeout_ms = (uint32_t)o->repl_round_timeout_ms;
    ro.push_queue = (uint32_t)o->repl_push_queue;
    ro.item_size_max = (size_t)o->item_size_max;
    ro.registries = o->registry ? o->registry : "";
    ro.dns_names = o->peers_dns ? o->peers_dns : "";
    ro.dns_server = o->peers_dns_server ? o->peers_dns_server : "";
    ro.dns_interval_ms = (uint32_t)o->peers_dns_interval_ms;
    ro.etcd_urls = o->etcd ? o->etcd : "";
    ro.etcd_prefix = o->etcd_prefix ? o->etcd_prefix : "/ribltcache/";
    ro.etcd_lease_s = (uint32_t)o->etcd_lease_s;
    ro.etcd_tls_ca = o->etcd_tls_ca;
    ro.etcd_tls_cert = o->etcd_tls_cert;
    ro.etcd_tls_key = o->etcd_tls_key;
    timing_from_options(o, &ro.timing);
    char adv[300] = "";
    if (o->replicas > 0 &&
        advertise_address(o, adv, sizeof(adv), err, nerr) != 0) {
        return -1;
    }
    ro.replicas = (uint32_t)o->replicas;
    ro.ring_partitions = (uint32_t)o->ring_partitions;
    ro.ring_weight = (uint32_t)o->ring_weight;
    ro.handoff_ms = (uint32_t)o->ring_handoff_ms;
    ro.down_ms = (uint32_t)o->ring_down_ms;
    ro.advertise = adv;
    ro.acks = o->repl_ack_wait_ms != 0;
    ro.on_acked = ro.acks ? on_acked : NULL;
    root.repl = repl_create(s, &ro, rerr, sizeof(rerr));
    if (root.repl == NULL) {
        snprintf(err, nerr, "replication: %s", rerr);
        return -1;
    }
    stats_register_group("replication", repl_stats, root.repl);
    stats_register_group("ring", ring_stats, root.repl);
    stats_register_group("health", health_stats, root.repl);
    if (ro.acks) {
        pcfg->ack_take = ack_take;
        pcfg->ack_held = ack_held;
        pcfg->ack_arg = root.repl;
        pcfg->ack_wait_ms = (uint32_t)o->repl_ack_wait_ms;
    }
    if (o->replicas > 0) {
        pcfg->route_fn = route_key;
        pcfg->route_arg = root.repl;
        pcfg->proxy_timeout_ms = (uint32_t)o->proxy_timeout_ms;
    }
    return 0;
}

/* daemon_hooks.run: the registry's and replication's threads. */
static int root_run(void *arg, char *err, size_t nerr)
{
    (void)arg;
    if (root.registry != NULL && registry_server_start(root.registry) != 0) {
        snprintf(err, nerr, "registry: cannot start its thread");
        return -1;
    }
    if (root.repl != NULL && repl_start(root.repl) != 0) {
        snprintf(err, nerr, "replication: cannot start its thread");
        return -1;
    }
    return 0;
}

/* daemon_hooks.stop. Runs after the workers: no client write can reach
 * the push queue now. */
static void root_stop(void *arg)
{
    (void)arg;
    if (root.repl != NULL) {
        repl_destroy(root.repl);
        root.repl = NULL;
    }
    if (root.registry != NULL) {
        registry_server_destroy(root.registry);
        root.registry = NULL;
    }
    repl_tls_destroy(root.tls);
    root.tls = NULL;
}

static const daemon_hooks hooks = {
    .store_options = root_store_options,
    .setup = root_setup,
    .run = root_run,
    .reload_certs = root_reload_certs,
    .stop = root_stop,
};
#else
/* daemon_hooks.store_options of a single-node build: no placement. */
static int root_store_options(void *arg, const options *o, store_options *so,
                              char *err, size_t nerr)
{
    (void)arg;
    (void)so;
    if (o->replicas != 0) {
        snprintf(err, nerr,
                 "this build has no replication (replicas must "
                 "be 0)");
        return -1;
    }
    return 0;
}

/* daemon_hooks.setup of a single-node build: no peer, no registry. */
static int root_setup(void *arg, const options *o, store *s,
                      proto_config *pcfg, char *err, size_t nerr)
{
    (void)arg;
    (void)s;
    (void)pcfg;
    if (o->repl_port != 0 || o->registry_port != 0 ||
        o->repl_ack_wait_ms != 0) {
        snprintf(err, nerr,
                 "this build has no replication (repl_port, "
                 "registry_port and repl_ack_wait_ms must be 0)");
        return -1;
    }
    return 0;
}

static const daemon_hooks hooks = {
    .store_options = root_store_options,
    .setup = root_setup,
};
#endif

int main(int argc, char **argv)
{
    return daemon_main(argc, argv, &hooks);
}
