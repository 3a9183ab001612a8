/*
 * bench_riblt.c -- measures the riblt library: communication overhead
 * (coded symbols needed per difference) and the speed of encoding, sketch
 * updates and decoding. Prints a table; asserts nothing.
 *
 *   bench_riblt [--quick] [--trials N]
 */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "riblt.h"
#include "riblt_psum.h"

static uint64_t rng = 0x1234567;

static uint64_t next64(void)
{
    uint64_t z = (rng += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static riblt_id next_id(void)
{
    riblt_id id = {next64(), next64()};
    return id;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* The difference stream of d ids split both ways, decoded to the end. */
static size_t symbols_for(size_t d, riblt_encoder *enc, riblt_decoder *dec)
{
    riblt_encoder_reset(enc);
    riblt_decoder_reset(dec);
    for (size_t i = 0; i < d; i++) {
        riblt_id id = next_id();
        if (i % 2 == 0)
            riblt_encoder_add(enc, &id);
        else
            riblt_encoder_remove(enc, &id);
    }
    riblt_symbol s;
    int rc = RIBLT_NEED_MORE;
    while (rc == RIBLT_NEED_MORE) {
        riblt_encoder_produce(enc, &s, 1);
        if (riblt_decoder_add_diff(dec, &s) != RIBLT_OK)
            return 0;
        rc = riblt_decoder_decode(dec);
    }
    return rc == RIBLT_OK ? riblt_decoder_symbols(dec) : 0;
}

static void overhead(int trials)
{
    static const size_t ds[] = {1, 2, 4, 10, 100, 1000, 10000};
    printf("communication overhead (coded symbols / d), %d trials each\n",
           trials);
    printf("%8s %10s %10s\n", "d", "symbols/d", "failed");
    riblt_encoder *enc = riblt_encoder_create(10000);
    riblt_decoder *dec = riblt_decoder_create(100000);
    for (size_t k = 0; k < sizeof(ds) / sizeof(ds[0]); k++) {
        double sum = 0;
        int failed = 0;
        for (int t = 0; t < trials; t++) {
            size_t n = symbols_for(ds[k], enc, dec);
            if (n == 0)
                failed++;
            sum += (double)n / (double)ds[k];
        }
        printf("%8zu %10.3f %10d\n", ds[k], sum / (trials - failed), failed);
    }
    riblt_encoder_destroy(enc);
    riblt_decoder_destroy(dec);
}

static void encoding(int quick)
{
    static const size_t ns[] = {10000, 100000, 1000000};
    printf("\nencoder: add N ids, then produce the first K symbols\n");
    printf("%9s %12s %12s %14s %15s\n", "N", "ns/id added", "(reused)",
           "first 1000 ms", "first 10000 ms");
    riblt_symbol *out = malloc(10000 * sizeof(*out));
    for (size_t k = 0; k < 3; k++) {
        size_t n = quick ? ns[k] / 10 : ns[k];
        riblt_encoder *enc = riblt_encoder_create(0);
        double t0 = now_s();
        for (size_t i = 0; i < n; i++) {
            riblt_id id = next_id();
            riblt_encoder_add(enc, &id);
        }
        double t1 = now_s();
        riblt_encoder_produce(enc, out, 1000);
        double t2 = now_s();
        riblt_encoder_seek(enc, 0);
        double t3 = now_s();
        riblt_encoder_produce(enc, out, 10000);
        double t4 = now_s();
        /* Again into the same encoder: its memory is already there. */
        riblt_encoder_reset(enc);
        double t5 = now_s();
        for (size_t i = 0; i < n; i++) {
            riblt_id id = next_id();
            riblt_encoder_add(enc, &id);
        }
        double t6 = now_s();
        printf("%9zu %12.1f %12.1f %14.2f %15.2f\n", n,
               (t1 - t0) * 1e9 / (double)n, (t6 - t5) * 1e9 / (double)n,
               (t2 - t1) * 1e3, (t4 - t3) * 1e3);
        riblt_encoder_destroy(enc);
    }
    free(out);
}

static void sketch(int quick)
{
    enum { S = 8192 };
    size_t n = quick ? 100000 : 1000000;
    riblt_id *ids = malloc(n * sizeof(*ids));
    for (size_t i = 0; i < n; i++)
        ids[i] = next_id();
    riblt_sketch *sk = riblt_sketch_create(S);
    double t0 = now_s();
    for (size_t i = 0; i < n; i++)
        riblt_sketch_add(sk, &ids[i]);
    double t1 = now_s();
    for (size_t i = 0; i < n; i++)
        riblt_sketch_remove(sk, &ids[i]);
    double t2 = now_s();
    for (size_t i = 0; i < n; i++)
        riblt_sketch_add(sk, &ids[i]);
    double t3 = now_s();
    for (size_t i = 0; i + 1 < n; i += 2)
        riblt_sketch_replace_hashed(sk, &ids[i], riblt_hash(&ids[i]),
                                    &ids[i + 1], riblt_hash(&ids[i + 1]));
    double t4 = now_s();
    printf("\nsketch of %d symbols: add %.1f ns, remove %.1f ns per id; "
           "replace (remove + add) %.1f ns per pair (%zu ids)\n",
           S, (t1 - t0) * 1e9 / (double)n, (t2 - t1) * 1e9 / (double)n,
           (t4 - t3) * 1e9 / (double)(n / 2), n);
    riblt_sketch_destroy(sk);

    /* The same replaces over COLD sketches in turn (16 MiB, past this
     * machine's L2): the cells come from further away, as in a server
     * whose items and connections share the caches with its sketch. */
    enum { COLD = 64 };
    riblt_sketch *cold[COLD];
    for (int c = 0; c < COLD; c++)
        cold[c] = riblt_sketch_create(S);
    double t5 = now_s();
    for (size_t i = 0; i + 1 < n; i += 2)
        riblt_sketch_replace_hashed(cold[(i / 2) % COLD], &ids[i],
                                    riblt_hash(&ids[i]), &ids[i + 1],
                                    riblt_hash(&ids[i + 1]));
    double t6 = now_s();
    printf("replace over %d sketches in turn (%d MiB): %.1f ns per pair\n",
           COLD, COLD * S * (int)sizeof(riblt_symbol) >> 20,
           (t6 - t5) * 1e9 / (double)(n / 2));
    for (int c = 0; c < COLD; c++)
        riblt_sketch_destroy(cold[c]);
    free(ids);
}

/*
 * Times decoding a pre-produced stream. diff_mode: the stream is the
 * difference itself (what replication feeds); otherwise the decoder holds
 * its local set (d/2 ids of its own plus 1000 common) and subtracts it
 * from the remote stream itself, as the paper's reference benchmark does.
 */
static void decode_one(size_t d, int diff_mode)
{
    enum { COMMON = 1000 };
    riblt_encoder *enc = riblt_encoder_create(d + COMMON);
    riblt_decoder *dec = riblt_decoder_create(3 * d + 64);
    for (size_t i = 0; i < d; i++) {
        riblt_id id = next_id();
        if (i % 2 == 0)
            riblt_encoder_add(enc, &id);
        else if (diff_mode)
            riblt_encoder_remove(enc, &id);
        else
            riblt_decoder_add_local(dec, &id);
    }
    for (size_t i = 0; !diff_mode && i < COMMON; i++) {
        riblt_id id = next_id();
        riblt_encoder_add(enc, &id);
        riblt_decoder_add_local(dec, &id);
    }
    /* Produce the stream first so only decoding is timed. */
    size_t len = 2 * d + 64;
    riblt_symbol *s = malloc(len * sizeof(*s));
    riblt_encoder_produce(enc, s, len);
    double t0 = now_s();
    int rc = RIBLT_NEED_MORE;
    size_t i = 0;
    while (rc == RIBLT_NEED_MORE && i < len) {
        if (diff_mode)
            riblt_decoder_add_diff(dec, &s[i++]);
        else
            riblt_decoder_add_coded(dec, &s[i++]);
        rc = riblt_decoder_decode(dec);
    }
    double t1 = now_s();
    printf("%8zu %-10s %10.3f %14.1f %12.2f%s\n", d,
           diff_mode ? "diff" : "coded", (double)i / (double)d,
           (t1 - t0) * 1e9 / (double)d, (t1 - t0) * 1e3,
           rc == RIBLT_OK ? "" : "  (not decoded)");
    free(s);
    riblt_encoder_destroy(enc);
    riblt_decoder_destroy(dec);
}

static void decoding(int quick)
{
    static const size_t ds[] = {1000, 100000};
    printf("\ndecode a pre-produced stream\n");
    printf("%8s %-10s %10s %14s %12s\n", "d", "mode", "symbols/d",
           "ns/difference", "total ms");
    for (size_t k = 0; k < 2; k++) {
        size_t d = quick ? ds[k] / 10 : ds[k];
        decode_one(d, 1);
        decode_one(d, 0);
    }
}

/*
 * Power sums: what a change of the set costs (one toggle), with the CPU's
 * carry-less multiply and portably, and what decoding one bucket of d ids
 * from d + 1 terms costs.
 */
static void psums(int quick)
{
    static riblt_id table[RIBLT_PSUM_SIZE];
    size_t n = quick ? 100000 : 1000000;
    riblt_id *ids = malloc(n * sizeof(*ids));
    uint64_t *h = malloc(n * sizeof(*h));
    if (ids == NULL || h == NULL)
        exit(1);
    for (size_t i = 0; i < n; i++) {
        ids[i] = next_id();
        h[i] = riblt_hash(&ids[i]);
    }
    printf("power sums: %d terms a bucket, %d buckets\n", RIBLT_PSUM_TERMS,
           RIBLT_PSUM_BUCKETS);
    static const char *names[] = {"portable", "PCLMULQDQ", "VPCLMULQDQ"};
    int best = riblt_psum_level();
    for (int level = RIBLT_PSUM_PORTABLE; level <= best; level++) {
        int was = riblt_psum_limit(level);
        size_t m = level == RIBLT_PSUM_PORTABLE ? n / 20 : n;
        double t0 = now_s();
        for (size_t i = 0; i < m; i++)
            riblt_psum_toggle(table, &ids[i], h[i]);
        double t1 = now_s();
        printf("  toggle (%-10s) %8.1f ns per id\n", names[level],
               (t1 - t0) * 1e9 / (double)m);
        riblt_psum_limit(was);
    }
    static const size_t ds[] = {2, 8, 16, 31};
    for (size_t k = 0; k < sizeof(ds) / sizeof(ds[0]); k++) {
        size_t d = ds[k], reps = quick ? 5 : 50;
        riblt_id t[RIBLT_PSUM_TERMS], out[RIBLT_PSUM_TERMS];
        double total = 0;
        int ok = 0;
        for (size_t r = 0; r < reps; r++) {
            memset(table, 0, sizeof(table));
            for (size_t i = 0; i < d; i++)
                riblt_psum_toggle(table, &ids[r * d + i], h[r * d + i]);
            riblt_psum_combine(table, t);
            size_t got;
            double t0 = now_s();
            ok += riblt_psum_decode(t, d + 1, out, RIBLT_PSUM_TERMS, &got) ==
                      RIBLT_OK &&
                  got == d;
            total += now_s() - t0;
        }
        printf("  decode %2zu ids from %2zu terms: %8.1f us (%d of %zu "
               "decoded)\n",
               d, d + 1, total * 1e6 / (double)reps, ok, reps);
    }
    free(h);
    free(ids);
}

int main(int argc, char **argv)
{
    int quick = 0, trials = 100;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--quick") == 0) {
            quick = 1;
            trials = 10;
        } else if (strcmp(argv[i], "--trials") == 0 && i + 1 < argc) {
            trials = atoi(argv[++i]);
        } else {
            fprintf(stderr, "usage: %s [--quick] [--trials N]\n", argv[0]);
            return 64;
        }
    }
    if (trials < 1)
        trials = 1;
    overhead(trials);
    encoding(quick);
    sketch(quick);
    decoding(quick);
    psums(quick);
    return 0;
}
