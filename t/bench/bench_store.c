/*
 * bench_store.c -- throughput of the mutation store and the cost of its
 * sketch updates.
 *
 * Part 1: set and get operations per second with 1 and 2 threads over a
 * fixed key space (default 100k keys, 100-byte values, no memory limit).
 * Each thread works on its own share of the keys for set and on all keys,
 * in a scrambled order, for get.
 *
 * Part 2: the nanoseconds per write spent in the sketch, in one run and on
 * the same ids: the interleaved riblt_sketch_replace_hashed that the store
 * uses when a write replaces a key's mutation, against the separate
 * remove + add walks (hashed, and hashing inside as the plain calls do).
 * The sketch is the store's default length and already holds the key
 * space's ids, as the store's would.
 *
 * Prints; asserts nothing.
 *
 *   bench_store [--keys N] [--value B] [--rounds R] [--symbols S]
 */
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "riblt.h"
#include "store.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static uint64_t xorshift(uint64_t *x)
{
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    return *x;
}

struct job {
    store *s;
    char (*keys)[32];
    size_t nkeys;
    const char *value;
    size_t nvalue;
    unsigned tid, nthreads, rounds;
    size_t ops, hits;
};

/* set: thread t writes keys t, t + n, t + 2n, ... in each round. */
static void *do_sets(void *arg)
{
    struct job *j = arg;
    store_write w = {
        .mode = STORE_SET, .value = j->value, .nvalue = j->nvalue};

    for (unsigned r = 0; r < j->rounds; r++) {
        for (size_t i = j->tid; i < j->nkeys; i += j->nthreads) {
            w.key = j->keys[i];
            w.nkey = strlen(j->keys[i]);
            if (store_write_item(j->s, &w, NULL) == STORE_STORED)
                j->ops++;
        }
    }
    return NULL;
}

/* get: each thread reads rounds * nkeys / nthreads keys, scrambled. */
static void *do_gets(void *arg)
{
    struct job *j = arg;
    uint64_t x = 0x9e3779b97f4a7c15ULL * (j->tid + 1);
    size_t n = (size_t)j->rounds * j->nkeys / j->nthreads;

    for (size_t i = 0; i < n; i++) {
        const char *k = j->keys[xorshift(&x) % j->nkeys];
        store_item *it = store_get(j->s, k, strlen(k));
        if (it != NULL) {
            j->hits++;
            store_item_release(it);
        }
        j->ops++;
    }
    return NULL;
}

/* Runs fn on nthreads threads; returns operations per second. */
static double run(void *(*fn)(void *), store *s, char (*keys)[32],
                  size_t nkeys, const char *value, size_t nvalue,
                  unsigned nthreads, unsigned rounds, size_t *hits)
{
    pthread_t th[2];
    struct job jobs[2];
    size_t ops = 0;
    double t0, t1;

    memset(jobs, 0, sizeof(jobs));
    t0 = now_s();
    for (unsigned i = 0; i < nthreads; i++) {
        jobs[i] = (struct job){.s = s,
                               .keys = keys,
                               .nkeys = nkeys,
                               .value = value,
                               .nvalue = nvalue,
                               .tid = i,
                               .nthreads = nthreads,
                               .rounds = rounds};
        pthread_create(&th[i], NULL, fn, &jobs[i]);
    }
    for (unsigned i = 0; i < nthreads; i++) {
        pthread_join(th[i], NULL);
        ops += jobs[i].ops;
        if (hits)
            *hits += jobs[i].hits;
    }
    t1 = now_s();
    return (double)ops / (t1 - t0);
}

static store *make_store(size_t symbols, bool psums)
{
    store_options o;
    int err = 0;
    store *s;

    store_options_default(&o);
    o.memory_limit = 0;
    o.sketch_symbols = symbols;
    o.psums = psums;
    o.hash_power = 17;
    s = store_create(&o, &err);
    if (s == NULL) {
        fprintf(stderr, "store_create: %s\n", store_strerror(err));
        exit(1);
    }
    return s;
}

static riblt_id random_id(uint64_t *x)
{
    riblt_id id;
    id.lo = xorshift(x) | 1;
    id.hi = xorshift(x);
    return id;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

enum sketch_mode { SK_REPLACE, SK_SEPARATE_HASHED, SK_SEPARATE };

/*
 * One pass of n writes: each swaps ids[i] for a fresh id in the sketch,
 * the way mode says. Returns nanoseconds per write. ids[i] and hashes[i]
 * hold the new id afterwards.
 */
static double sketch_pass(riblt_sketch *sk, riblt_id *ids, uint64_t *hashes,
                          const riblt_id *fresh, size_t n, enum sketch_mode m)
{
    double t0 = now_s(), t1;

    for (size_t i = 0; i < n; i++) {
        uint64_t nh;
        switch (m) {
        case SK_REPLACE:
            nh = riblt_hash(&fresh[i]);
            riblt_sketch_replace_hashed(sk, &ids[i], hashes[i], &fresh[i], nh);
            hashes[i] = nh;
            break;
        case SK_SEPARATE_HASHED:
            nh = riblt_hash(&fresh[i]);
            riblt_sketch_remove_hashed(sk, &ids[i], hashes[i]);
            riblt_sketch_add_hashed(sk, &fresh[i], nh);
            hashes[i] = nh;
            break;
        case SK_SEPARATE:
            riblt_sketch_remove(sk, &ids[i]);
            riblt_sketch_add(sk, &fresh[i]);
            break;
        }
        ids[i] = fresh[i];
    }
    t1 = now_s();
    /* Bookkeeping for the next pass, outside the timing. */
    if (m == SK_SEPARATE)
        for (size_t i = 0; i < n; i++)
            hashes[i] = riblt_hash(&ids[i]);
    return (t1 - t0) * 1e9 / (double)n;
}

static void bench_sketch(size_t nkeys, size_t symbols, unsigned trials)
{
    static const char *names[] = {"replace_hashed", "remove+add hashed",
                                  "remove+add"};
    riblt_sketch *sk = riblt_sketch_create(symbols);
    riblt_id *ids = malloc(nkeys * sizeof(*ids));
    riblt_id *fresh = malloc(nkeys * sizeof(*fresh));
    uint64_t *hashes = malloc(nkeys * sizeof(*hashes));
    double *ns[3];
    uint64_t x = 0x2545f4914f6cdd1dULL;

    if (sk == NULL || ids == NULL || fresh == NULL || hashes == NULL) {
        fprintf(stderr, "out of memory\n");
        exit(1);
    }
    for (size_t i = 0; i < nkeys; i++) {
        ids[i] = random_id(&x);
        hashes[i] = riblt_hash(&ids[i]);
        riblt_sketch_add_hashed(sk, &ids[i], hashes[i]);
    }
    for (int m = 0; m < 3; m++)
        ns[m] = calloc(trials, sizeof(double));
    /* Modes take turns within each trial, so drift hits all alike. */
    for (unsigned t = 0; t < trials; t++) {
        for (int m = 0; m < 3; m++) {
            for (size_t i = 0; i < nkeys; i++)
                fresh[i] = random_id(&x);
            ns[m][t] = sketch_pass(sk, ids, hashes, fresh, nkeys,
                                   (enum sketch_mode)m);
        }
    }
    printf("sketch: %zu symbols holding %zu ids, %zu writes x %u trials "
           "(ns per write, one id out and one in)\n",
           symbols, nkeys, nkeys, trials);
    double med[3];
    for (int m = 0; m < 3; m++) {
        qsort(ns[m], trials, sizeof(double), cmp_double);
        med[m] = ns[m][trials / 2];
        printf("  %-20s median %7.1f  best %7.1f\n", names[m], med[m],
               ns[m][0]);
    }
    printf("  replace vs remove+add hashed: %.2fx; vs remove+add: %.2fx\n",
           med[SK_SEPARATE_HASHED] / med[SK_REPLACE],
           med[SK_SEPARATE] / med[SK_REPLACE]);
    for (int m = 0; m < 3; m++)
        free(ns[m]);
    free(hashes);
    free(fresh);
    free(ids);
    riblt_sketch_destroy(sk);
}

/*
 * What the power sums cost a write: one thread's overwrites of every key
 * on a store with them and on one without, taking turns over `trials`
 * trials so that drift hits both alike. Prints ns per write and the
 * difference of the medians.
 */
static void bench_psums(char (*keys)[32], size_t nkeys, const char *value,
                        size_t nvalue, size_t symbols, unsigned trials)
{
    store *st[2] = {make_store(symbols, false), make_store(symbols, true)};
    double *ns[2] = {calloc(trials, sizeof(double)),
                     calloc(trials, sizeof(double))};
    if (ns[0] == NULL || ns[1] == NULL) {
        fprintf(stderr, "out of memory\n");
        exit(1);
    }
    for (int k = 0; k < 2; k++)
        run(do_sets, st[k], keys, nkeys, value, nvalue, 1, 1, NULL);
    for (unsigned t = 0; t < trials; t++)
        for (int k = 0; k < 2; k++)
            ns[k][t] = 1e9 / run(do_sets, st[k], keys, nkeys, value, nvalue, 1,
                                 1, NULL);
    double med[2];
    printf("power sums: %zu overwrites x %u trials, 1 thread (ns per "
           "write)\n",
           nkeys, trials);
    for (int k = 0; k < 2; k++) {
        qsort(ns[k], trials, sizeof(double), cmp_double);
        med[k] = ns[k][trials / 2];
        printf("  %-20s median %7.1f  best %7.1f\n",
               k ? "with power sums" : "without", med[k], ns[k][0]);
        store_destroy(st[k]);
        free(ns[k]);
    }
    printf("  power sums add %.1f ns a write (%.2fx)\n", med[1] - med[0],
           med[1] / med[0]);
}

static void usage(const char *argv0)
{
    fprintf(stderr,
            "usage: %s [--keys N] [--value B] [--rounds R] [--symbols S]\n",
            argv0);
    exit(2);
}

int main(int argc, char **argv)
{
    size_t nkeys = 100000, nvalue = 100, symbols = 8192;
    unsigned rounds = 3;

    for (int i = 1; i < argc; i += 2) { /* --name value pairs */
        if (i + 1 >= argc)
            usage(argv[0]);
        unsigned long long v = strtoull(argv[i + 1], NULL, 10);
        if (v == 0)
            usage(argv[0]);
        if (strcmp(argv[i], "--keys") == 0 && v <= 100000000)
            nkeys = (size_t)v;
        else if (strcmp(argv[i], "--value") == 0 && v <= (1u << 20))
            nvalue = (size_t)v;
        else if (strcmp(argv[i], "--rounds") == 0 && v <= 1000)
            rounds = (unsigned)v;
        else if (strcmp(argv[i], "--symbols") == 0 && v <= (1u << 24))
            symbols = (size_t)v;
        else
            usage(argv[0]);
    }

    char(*keys)[32] = malloc(nkeys * sizeof(*keys));
    char *value = malloc(nvalue);
    if (keys == NULL || value == NULL) {
        fprintf(stderr, "out of memory\n");
        return 1;
    }
    for (size_t i = 0; i < nkeys; i++)
        snprintf(keys[i], sizeof(keys[i]), "key:%zu", i);
    memset(value, 'v', nvalue);

    printf("store: %zu keys, %zu-byte values, %u rounds per run\n", nkeys,
           nvalue, rounds);
    for (unsigned nt = 1; nt <= 2; nt++) {
        store *s = make_store(symbols, true);
        size_t hits = 0;
        /* The first round fills the table; the timed ones overwrite. */
        run(do_sets, s, keys, nkeys, value, nvalue, nt, 1, NULL);
        double set_ops =
            run(do_sets, s, keys, nkeys, value, nvalue, nt, rounds, NULL);
        double get_ops =
            run(do_gets, s, keys, nkeys, value, nvalue, nt, rounds, &hits);
        printf("  %u thread%s: set %10.0f ops/s   get %10.0f ops/s "
               "(%zu hits)\n",
               nt, nt > 1 ? "s" : " ", set_ops, get_ops, hits);
        store_destroy(s);
    }
    bench_sketch(nkeys, symbols, 11);
    bench_psums(keys, nkeys, value, nvalue, symbols, 11);
    free(value);
    free(keys);
    return 0;
}
