/*
 * bench_ring.c -- measures the placement ring: key -> owners lookups per
 * second, the cost of recomputing the placement on a membership change,
 * and how many of 1,000,000 keys change owners when a 4th node joins a
 * 3-node ring, next to the ideal. Prints; asserts nothing.
 *
 *   bench_ring [--keys N] [--partitions P]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ring.h"

#define KEY_MAX 24

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Keys as a client might name them, fixed-size slots. */
static char *make_keys(size_t n, unsigned char *len)
{
    char *keys = malloc(n * KEY_MAX);
    if (!keys)
        return NULL;
    for (size_t i = 0; i < n; i++)
        len[i] = (unsigned char)snprintf(&keys[i * KEY_MAX], KEY_MAX,
                                         "session:%zu", i);
    return keys;
}

/* Nodes 1..nodes of weight 1, placed once. */
static ring *ring_of(uint32_t partitions, uint32_t replicas, uint32_t nodes)
{
    int err;
    ring *r = ring_create(partitions, replicas, &err);
    ring_member *m = calloc(nodes ? nodes : 1, sizeof(*m));
    if (!r || !m) {
        fprintf(stderr, "ring_create: %s\n", ring_strerror(err));
        exit(1);
    }
    for (uint32_t n = 0; n < nodes; n++)
        m[n] = (ring_member){.node = n + 1, .weight = 1};
    err = ring_set_members(r, m, nodes);
    if (err != RING_OK) {
        fprintf(stderr, "ring_set_members: %s\n", ring_strerror(err));
        exit(1);
    }
    free(m);
    return r;
}

/* Key -> partition -> owners (copied out), the proxy's question. */
static void bench_lookups(const char *keys, const unsigned char *len, size_t n,
                          uint32_t partitions)
{
    ring *r = ring_of(partitions, 2, 4);
    uint32_t owners[2];
    uint64_t sum = 0;
    double t0 = now_s();
    for (int pass = 0; pass < 3; pass++) {
        for (size_t i = 0; i < n; i++) {
            uint32_t p = ring_partition(r, &keys[i * KEY_MAX], len[i]);
            ring_owners(r, p, owners, 2);
            sum += owners[0] ^ owners[1];
        }
    }
    double t1 = now_s();
    /* "Do I hold this key?", the daemon's check on every request. */
    size_t mine = 0;
    for (int pass = 0; pass < 3; pass++)
        for (size_t i = 0; i < n; i++)
            mine += ring_is_owner(
                r, ring_partition(r, &keys[i * KEY_MAX], len[i]), 3);
    double t2 = now_s();
    printf("lookups (N=4, R=2, P=%u, keys of ~14 bytes):\n", partitions);
    printf("  key -> owners      %8.1f M/s\n", 3.0 * n / (t1 - t0) / 1e6);
    printf("  key -> is owner    %8.1f M/s   (node 3 holds %.3f of keys)\n",
           3.0 * n / (t2 - t1) / 1e6, mine / (3.0 * n));
    if (sum == 42) /* keeps the loop from being optimised away */
        printf(" \n");
    ring_destroy(r);
}

/* One placement recomputation per membership size. */
static void bench_rebuild(uint32_t partitions)
{
    printf("placement rebuild on a membership change (P=%u, R=2):\n",
           partitions);
    const uint32_t sizes[] = {4, 16, 64, 256};
    for (size_t s = 0; s < sizeof(sizes) / sizeof(sizes[0]); s++) {
        ring *r = ring_of(partitions, 2, sizes[s] - 1);
        double t0 = now_s();
        int rc = ring_add(r, 100000, 1);
        double t1 = now_s();
        if (rc != RING_OK)
            fprintf(stderr, "ring_add: %s\n", ring_strerror(rc));
        printf("  N=%-4u %8.2f ms\n", sizes[s], (t1 - t0) * 1e3);
        ring_destroy(r);
    }
}

/* Keys whose owner set changes, and copies that move, on a 3 -> 4 join. */
static void bench_join(const char *keys, const unsigned char *len, size_t n,
                       uint32_t partitions, uint32_t replicas)
{
    ring *three = ring_of(partitions, replicas, 3);
    ring *four = ring_of(partitions, replicas, 4);
    uint32_t k4 = ring_owner_count(four);
    size_t changed = 0, copies = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t p = ring_partition(three, &keys[i * KEY_MAX], len[i]);
        const uint32_t *o = ring_owners_ref(four, p);
        size_t gained = 0;
        for (uint32_t j = 0; j < k4; j++)
            gained += !ring_is_owner(three, p, o[j]);
        changed += gained > 0;
        copies += gained;
    }
    long parts = ring_diff(three, four, NULL, 0);
    /* Ideal: the newcomer holds k4/4 of the keys, one new copy each, and
     * nothing else moves. */
    double ideal_keys = k4 / 4.0;
    double ideal_copies = (k4 / 4.0) / k4;
    printf("  R=%u: keys changed %zu of %zu (%.4f, ideal %.4f); copies moved"
           " %zu of %zu (%.4f, ideal %.4f); partitions %ld of %u\n",
           replicas, changed, n, (double)changed / n, ideal_keys, copies,
           n * k4, (double)copies / (double)(n * k4), ideal_copies, parts,
           partitions);
    ring_destroy(three);
    ring_destroy(four);
}

int main(int argc, char **argv)
{
    size_t nkeys = 1000000;
    uint32_t partitions = RING_DEFAULT_PARTITIONS;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--keys") && i + 1 < argc)
            nkeys = strtoul(argv[++i], NULL, 10);
        else if (!strcmp(argv[i], "--partitions") && i + 1 < argc)
            partitions = (uint32_t)strtoul(argv[++i], NULL, 10);
        else {
            fprintf(stderr, "usage: %s [--keys N] [--partitions P]\n",
                    argv[0]);
            return 2;
        }
    }
    if (nkeys == 0 || partitions == 0 || partitions > RING_MAX_PARTITIONS) {
        fprintf(stderr, "keys must be > 0, partitions 1..%u\n",
                RING_MAX_PARTITIONS);
        return 2;
    }
    unsigned char *len = malloc(nkeys);
    char *keys = len ? make_keys(nkeys, len) : NULL;
    if (!keys) {
        fprintf(stderr, "out of memory\n");
        return 1;
    }
    bench_lookups(keys, len, nkeys, partitions);
    bench_rebuild(partitions);
    printf("a 4th node joins a 3-node ring (%zu keys, P=%u):\n", nkeys,
           partitions);
    for (uint32_t replicas = 1; replicas <= 3; replicas++)
        bench_join(keys, len, nkeys, partitions, replicas);
    free(keys);
    free(len);
    return 0;
}
