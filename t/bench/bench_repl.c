/*
 * bench_repl.c -- convergence after a heal, in one process over loopback.
 *
 * Two stores share `common` keys (the same mutations); then each gets d/2
 * keys of its own, as if they had been partitioned. Replication starts on
 * both and the program measures the time until both hold the same set
 * and the bytes that crossed the peer channel, next to what a full key
 * listing would have cost. Prints; asserts nothing.
 *
 *   bench_repl [--common N] [--diff D] [--symbols S]
 */
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "repl.h"
#include "store.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static uint16_t free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {0};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (bind(fd, (struct sockaddr *)&a, sizeof(a)) != 0)
        return 0;
    socklen_t len = sizeof(a);
    getsockname(fd, (struct sockaddr *)&a, &len);
    close(fd);
    return ntohs(a.sin_port);
}

static store *make_store(uint32_t id, size_t symbols)
{
    store_options so;
    store_options_default(&so);
    so.node_id = id;
    so.memory_limit = 0;
    so.sketch_symbols = symbols;
    so.hash_power = 21;
    int err = 0;
    store *s = store_create(&so, &err);
    if (!s) {
        fprintf(stderr, "store_create: %s\n", store_strerror(err));
        exit(1);
    }
    return s;
}

static void put(store *s, const char *prefix, size_t i)
{
    char key[48], val[100];
    int nk = snprintf(key, sizeof(key), "%s:%zu", prefix, i);
    memset(val, 'v', sizeof(val));
    store_write w = {.mode = STORE_SET,
                     .key = key,
                     .nkey = (size_t)nk,
                     .value = val,
                     .nvalue = sizeof(val)};
    store_write_item(s, &w, NULL);
}

/* Copies a's current mutation for key into b (same id, same version). */
static void copy_key(store *a, store *b, const char *prefix, size_t i)
{
    char key[48];
    int nk = snprintf(key, sizeof(key), "%s:%zu", prefix, i);
    store_item *it = store_get(a, key, (size_t)nk);
    if (!it)
        return;
    store_mutation m;
    store_item_mutation(it, &m);
    store_apply(b, &m);
    store_item_release(it);
}

struct grab {
    const char *want;
    unsigned long long sum;
};

/* Sums every stat whose name ends in `want` (per-peer counters). */
static void grab(void *arg, const char *name, const char *value)
{
    struct grab *g = arg;
    size_t n = strlen(name), w = strlen(g->want);
    if (n >= w && strcmp(name + n - w, g->want) == 0)
        g->sum += strtoull(value, NULL, 10);
}

static unsigned long long stat_sum(repl *r, const char *want)
{
    struct grab g = {want, 0};
    repl_emit_stats(r, grab, &g);
    return g.sum;
}

static repl *start(store *s, uint32_t id, uint16_t port, uint16_t peer)
{
    char peers[32], err[256];
    snprintf(peers, sizeof(peers), "127.0.0.1:%u", peer);
    repl_options o;
    repl_options_default(&o);
    o.node_id = id;
    o.port = port;
    o.peers = peers;
    o.secret = "bench";
    o.period_ms = 100;
    o.max_symbols = 1u << 20;
    repl *r = repl_create(s, &o, err, sizeof(err));
    if (!r || repl_start(r) != REPL_OK) {
        fprintf(stderr, "repl: %s\n", err);
        exit(1);
    }
    return r;
}

int main(int argc, char **argv)
{
    size_t common = 1000000, diff = 10000, symbols = 8192;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--common") == 0)
            common = strtoull(argv[i + 1], NULL, 10);
        else if (strcmp(argv[i], "--diff") == 0)
            diff = strtoull(argv[i + 1], NULL, 10);
        else if (strcmp(argv[i], "--symbols") == 0)
            symbols = strtoull(argv[i + 1], NULL, 10);
    }
    store *a = make_store(1, symbols), *b = make_store(2, symbols);
    double t0 = now_s();
    for (size_t i = 0; i < common; i++) {
        put(a, "c", i);
        copy_key(a, b, "c", i);
    }
    for (size_t i = 0; i < diff / 2; i++) {
        put(a, "a", i);
        put(b, "b", i);
    }
    printf("loaded %zu common keys and %zu + %zu differing in %.1f s\n",
           common, diff / 2, diff / 2, now_s() - t0);
    uint16_t pa = free_port(), pb = free_port();
    double t1 = now_s();
    repl *ra = start(a, 1, pa, pb), *rb = start(b, 2, pb, pa);
    riblt_symbol sa[64], sb[64];
    double done = -1;
    for (int t = 0; t < 6000; t++) {
        int64_t na, nb;
        store_sketch_read(a, 0, sa, 64, &na);
        store_sketch_read(b, 0, sb, 64, &nb);
        if (na == nb && memcmp(sa, sb, sizeof(sa)) == 0) {
            done = now_s() - t1;
            break;
        }
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
    /* Both directions: what each node sent on the connections it dialled
     * and on the ones its peer dialled. */
    unsigned long long bytes =
        stat_sum(ra, ":bytes_sent") + stat_sum(rb, ":bytes_sent") +
        stat_sum(ra, "served_bytes_sent") + stat_sum(rb, "served_bytes_sent");
    unsigned long long syms =
        stat_sum(ra, ":symbols_recv") + stat_sum(rb, ":symbols_recv");
    unsigned long long fetched = stat_sum(ra, ":mutations_fetched") +
                                 stat_sum(rb, ":mutations_fetched");
    unsigned long long sent =
        stat_sum(ra, ":mutations_sent") + stat_sum(rb, ":mutations_sent");
    /* What moving the mutations alone costs: records of the differing keys
     * (key "a:N"/"b:N", 100-byte values, 55-byte record header). */
    double record = 55.0 + 7.0 + 100.0;
    double listing = (double)(common + diff / 2) * (16.0 + 8.0);
    if (done < 0)
        printf("did not converge within 60 s\n");
    else
        printf("converged in %.3f s after replication started\n", done);
    printf("peer channel bytes, both directions (frames, symbols, records): "
           "%llu\n",
           bytes);
    printf("coded symbols received: %llu (%.3f per difference), %llu bytes; "
           "target 1.5 * 1.35 * d * 32 = %.0f\n",
           syms, (double)syms / (double)diff, syms * 32,
           1.5 * 1.35 * (double)diff * 32);
    printf("mutations fetched %llu, pushed %llu; records alone ~%.0f bytes\n",
           fetched, sent, record * (double)diff);
    printf("last round took %llu us (initiator's clock)\n",
           stat_sum(ra, ":last_round_us") + stat_sum(rb, ":last_round_us"));
    printf("rounds %llu (failed %llu, bulk %llu), encoders built %llu\n",
           stat_sum(ra, ":rounds") + stat_sum(rb, ":rounds"),
           stat_sum(ra, ":rounds_failed") + stat_sum(rb, ":rounds_failed"),
           stat_sum(ra, ":bulk_transfers") + stat_sum(rb, ":bulk_transfers"),
           stat_sum(ra, "encoder_builds") + stat_sum(rb, "encoder_builds"));
    printf("a full listing of one node's ids and versions would be %.0f "
           "bytes\n",
           listing);
    repl_destroy(ra);
    repl_destroy(rb);
    store_destroy(a);
    store_destroy(b);
    return 0;
}
