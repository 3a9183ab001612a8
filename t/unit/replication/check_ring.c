/*
 * check_ring.c -- the consistent-hash ring: key hash, placement rules,
 * determinism, balance, weights and how little moves when members change.
 *
 * Placement is a pure function of the membership, so every figure below is
 * the same on every run; the tolerances are still derived from the
 * statistics of the method (stated at each check) rather than from the
 * numbers one run happened to give.
 */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ring.h"

/*
 * Check's own asserts record every passing check (a write per call), which
 * dominates loops of millions of checks; this one only reports failures.
 */
#define CHECK(c)                                                              \
    do {                                                                      \
        if (!(c))                                                             \
            ck_abort_msg("%s:%d: check failed: %s", __FILE__, __LINE__, #c);  \
    } while (0)

/* Same bijection as the one ring.h documents (written from its text). */
static uint64_t ref_mix(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* The documented key hash, byte by byte: FNV-1a 64, then the finalizer. */
static uint64_t ref_hash(const char *key, size_t n)
{
    uint64_t h = 14695981039346656037ull;
    for (size_t i = 0; i < n; i++) {
        h ^= (unsigned char)key[i];
        h *= 1099511628211ull;
    }
    return ref_mix(h);
}

/* A small deterministic generator for shuffles and keys. */
static uint64_t rng_next(uint64_t *s)
{
    *s += 0x9e3779b97f4a7c15ull;
    return ref_mix(*s);
}

static ring *make_ring(uint32_t partitions, uint32_t replicas,
                       const ring_member *m, size_t n)
{
    int err = -100;
    ring *r = ring_create(partitions, replicas, &err);
    ck_assert_ptr_nonnull(r);
    ck_assert_int_eq(err, RING_OK);
    ck_assert_int_eq(ring_set_members(r, m, n), RING_OK);
    return r;
}

/* The id of the i-th test member (spread out, not 1, 2, 3...). */
static uint32_t node_of(size_t i)
{
    return (uint32_t)(101 + 7 * i);
}

/* Members node_of(0 .. n-1), weight 1. */
static ring *make_equal(uint32_t partitions, uint32_t replicas, size_t n)
{
    ring_member m[64];
    ck_assert_uint_le(n, 64);
    for (size_t i = 0; i < n; i++)
        m[i] = (ring_member){.node = node_of(i), .weight = 1};
    return make_ring(partitions, replicas, m, n);
}

/* Every partition's owners, in order, equal in both rings. */
static void assert_same_placement(const ring *a, const ring *b)
{
    ck_assert_uint_eq(ring_partitions(a), ring_partitions(b));
    ck_assert_uint_eq(ring_owner_count(a), ring_owner_count(b));
    uint32_t k = ring_owner_count(a);
    for (uint32_t p = 0; p < ring_partitions(a); p++) {
        const uint32_t *oa = ring_owners_ref(a, p);
        const uint32_t *ob = ring_owners_ref(b, p);
        CHECK(memcmp(oa, ob, k * sizeof(*oa)) == 0);
    }
    ck_assert_uint_eq(ring_fingerprint(a), ring_fingerprint(b));
}

START_TEST(test_arguments)
{
    int err = 0;
    ck_assert_ptr_null(ring_create(0, 2, &err));
    ck_assert_int_eq(err, RING_ERR_INVAL);
    ck_assert_ptr_null(ring_create(RING_MAX_PARTITIONS + 1, 2, &err));
    ck_assert_int_eq(err, RING_ERR_INVAL);
    ck_assert_ptr_null(ring_create(64, 0, NULL));

    ring *r = ring_create(64, 2, &err);
    ck_assert_ptr_nonnull(r);
    /* Empty: keys still have partitions, nobody owns them. */
    uint32_t out[4];
    ck_assert_uint_eq(ring_owner_count(r), 0);
    ck_assert_uint_eq(ring_owners(r, 5, out, 4), 0);
    ck_assert_ptr_null(ring_owners_ref(r, 5));
    ck_assert(!ring_is_owner(r, 5, 1));
    ck_assert_uint_lt(ring_partition(r, "k", 1), 64);

    ck_assert_int_eq(ring_add(r, 1, 0), RING_ERR_INVAL);
    ck_assert_int_eq(ring_add(r, 1, RING_MAX_WEIGHT + 1), RING_ERR_INVAL);
    ck_assert_int_eq(ring_add(r, 1, 3), RING_OK);
    ck_assert_int_eq(ring_add(r, 2, 1), RING_OK);
    uint64_t fp = ring_fingerprint(r);
    ck_assert_int_eq(ring_add(r, 1, 1), RING_ERR_EXISTS);
    ck_assert_int_eq(ring_remove(r, 9), RING_ERR_NOT_FOUND);
    ck_assert_int_eq(ring_set_weight(r, 9, 1), RING_ERR_NOT_FOUND);
    ck_assert_int_eq(ring_set_weight(r, 1, 0), RING_ERR_INVAL);
    ring_member dup[] = {{.node = 5, .weight = 1}, {.node = 5, .weight = 2}};
    ck_assert_int_eq(ring_set_members(r, dup, 2), RING_ERR_INVAL);
    ring_member zero[] = {{.node = 5, .weight = 1}, {.node = 6, .weight = 0}};
    ck_assert_int_eq(ring_set_members(r, zero, 2), RING_ERR_INVAL);
    /* Every refused change left the ring as it was. */
    ck_assert_uint_eq(ring_fingerprint(r), fp);
    ck_assert_uint_eq(ring_size(r), 2);
    ring_member got[4];
    ck_assert_uint_eq(ring_members(r, got, 4), 2);
    ck_assert_uint_eq(got[0].node, 1);
    ck_assert_uint_eq(got[0].weight, 3);
    ck_assert_uint_eq(got[1].node, 2);
    ck_assert(ring_is_member(r, 2));
    ck_assert(!ring_is_member(r, 3));
    ck_assert_uint_eq(ring_owners(r, 64, out, 4), 0); /* out of range */
    ck_assert(!ring_is_owner(r, 64, 1));

    /* A weight change is a change; setting the same weight is not. */
    ck_assert_int_eq(ring_set_weight(r, 1, 3), RING_OK);
    ck_assert_uint_eq(ring_fingerprint(r), fp);
    ck_assert_int_eq(ring_set_weight(r, 1, 4), RING_OK);
    ck_assert_uint_ne(ring_fingerprint(r), fp);

    /* Diff needs the same P and R. */
    ring *other = ring_create(64, 3, NULL);
    ck_assert_int_eq(ring_diff(r, other, NULL, 0), RING_ERR_MISMATCH);
    ring_destroy(other);
    other = ring_create(32, 2, NULL);
    ck_assert_int_eq(ring_diff(r, other, NULL, 0), RING_ERR_MISMATCH);
    ring_destroy(other);

    ck_assert_int_eq(ring_set_members(r, NULL, 0), RING_OK);
    ck_assert_uint_eq(ring_size(r), 0);
    ck_assert_uint_eq(ring_owner_count(r), 0);
    ck_assert_str_eq(ring_strerror(RING_ERR_MISMATCH),
                     "rings differ in partitions or replicas");
    ring_destroy(r);
    ring_destroy(NULL);
}
END_TEST

START_TEST(test_key_hash)
{
    /* The hash is exactly the documented one, for keys of every length. */
    ring *r = make_equal(1000, 2, 3);
    char key[300];
    uint64_t s = 42;
    for (int i = 0; i < 2000; i++) {
        size_t n = (size_t)(rng_next(&s) % sizeof(key));
        for (size_t j = 0; j < n; j++)
            key[j] = (char)rng_next(&s);
        uint64_t h = ref_hash(key, n);
        CHECK((ring_hash_key(key, n)) == (h));
        CHECK((ring_partition(r, key, n)) == (h % 1000));
    }
    CHECK((ring_hash_key("", 0)) == (ref_mix(14695981039346656037ull)));
    /* One byte of difference moves the hash. */
    CHECK((ring_hash_key("key:1", 5)) != (ring_hash_key("key:2", 5)));
    ring_destroy(r);
}
END_TEST

START_TEST(test_order_independence)
{
    enum { N = 9 };
    ring_member m[N];
    for (int i = 0; i < N; i++)
        m[i] = (ring_member){.node = (uint32_t)(1000 - 37 * i),
                             .weight = (uint32_t)(1 + i % 4)};
    for (uint32_t replicas = 1; replicas <= 4; replicas++) {
        ring *base = make_ring(1024, replicas, m, N);
        /* Added one by one, in reverse. */
        ring *rev = ring_create(1024, replicas, NULL);
        for (int i = N - 1; i >= 0; i--)
            CHECK((ring_add(rev, m[i].node, m[i].weight)) == (RING_OK));
        assert_same_placement(base, rev);
        /* A shuffled list, and a history of adds, removes and reweights
         * that ends at the same membership. */
        uint64_t s = replicas;
        for (int round = 0; round < 5; round++) {
            ring_member sh[N];
            memcpy(sh, m, sizeof(sh));
            for (int i = N - 1; i > 0; i--) {
                int j = (int)(rng_next(&s) % (uint64_t)(i + 1));
                ring_member t = sh[i];
                sh[i] = sh[j];
                sh[j] = t;
            }
            ring *sr = ring_create(1024, replicas, NULL);
            CHECK((ring_add(sr, 77, 5)) == (RING_OK));
            for (int i = 0; i < N; i++)
                CHECK((ring_add(sr, sh[i].node, 9)) == (RING_OK));
            CHECK((ring_remove(sr, 77)) == (RING_OK));
            for (int i = 0; i < N; i++)
                CHECK((ring_set_weight(sr, sh[i].node, sh[i].weight)) ==
                      (RING_OK));
            assert_same_placement(base, sr);
            ring_destroy(sr);
        }
        /* A clone places the same way and is independent afterwards. */
        ring *c = ring_clone(base, NULL);
        CHECK((c) != NULL);
        assert_same_placement(base, c);
        CHECK((ring_remove(c, m[0].node)) == (RING_OK));
        CHECK(ring_is_member(base, m[0].node));
        CHECK((ring_fingerprint(c)) != (ring_fingerprint(base)));
        ring_destroy(c);
        ring_destroy(rev);
        ring_destroy(base);
    }
}
END_TEST

START_TEST(test_distinct_owners)
{
    for (size_t n = 1; n <= 8; n++) {
        for (uint32_t replicas = 1; replicas <= 6; replicas++) {
            ring *r = make_equal(512, replicas, n);
            uint32_t k = replicas < n ? replicas : (uint32_t)n;
            CHECK((ring_owner_count(r)) == (k));
            size_t total = 0;
            for (uint32_t p = 0; p < 512; p++) {
                uint32_t o[8];
                CHECK((ring_owners(r, p, o, 8)) == (k));
                for (uint32_t a = 0; a < k; a++) {
                    CHECK(ring_is_member(r, o[a]));
                    CHECK(ring_is_owner(r, p, o[a]));
                    for (uint32_t b = a + 1; b < k; b++)
                        CHECK((o[a]) != (o[b]));
                }
            }
            for (size_t i = 0; i < n; i++) {
                size_t owned = ring_owned(r, node_of(i), NULL, 0);
                total += owned;
                if (replicas >= n) /* full replication */
                    CHECK((owned) == (512));
            }
            CHECK((total) == (512 * (size_t)k));
            CHECK(!ring_is_owner(r, 0, 1)); /* not a member */
            ring_destroy(r);
        }
    }
}
END_TEST

/*
 * Equal weights: a member's partition count is a sum of P independent
 * draws, each owning with probability q = R/N, so its standard deviation
 * is sqrt(P q (1 - q)). Every member must be within 4.5 of them (a chance
 * of about 7e-6 per member for a correct method), and, at the default
 * P = 1024, within 10% of the ideal for the small clusters R = 2 targets.
 */
START_TEST(test_balance)
{
    const size_t sizes[] = {2, 3, 4, 5, 8, 16};
    double worst = 0;
    for (size_t si = 0; si < sizeof(sizes) / sizeof(sizes[0]); si++) {
        size_t n = sizes[si];
        for (uint32_t replicas = 1; replicas < n && replicas <= 3;
             replicas++) {
            const uint32_t parts = 4096;
            ring *r = make_equal(parts, replicas, n);
            double q = (double)replicas / (double)n;
            double ideal = parts * q;
            double sd = sqrt(parts * q * (1 - q));
            for (size_t i = 0; i < n; i++) {
                double got = (double)ring_owned(r, node_of(i), NULL, 0);
                double z = fabs(got - ideal) / sd;
                if (z > worst)
                    worst = z;
                ck_assert_msg(z <= 4.5,
                              "N=%zu R=%u node %zu owns %.0f of %u"
                              " (ideal %.1f, sd %.1f)",
                              n, replicas, i, got, parts, ideal, sd);
            }
            ring_destroy(r);
        }
    }
    printf("ring balance: worst member %.2f sd from ideal\n", worst);
    for (size_t n = 3; n <= 4; n++) {
        ring *r = make_equal(RING_DEFAULT_PARTITIONS, 2, n);
        double ideal = RING_DEFAULT_PARTITIONS * 2.0 / (double)n;
        for (size_t i = 0; i < n; i++) {
            double got = (double)ring_owned(r, node_of(i), NULL, 0);
            ck_assert_msg(fabs(got - ideal) <= 0.10 * ideal,
                          "N=%zu node %zu owns %.0f, ideal %.1f", n, i, got,
                          ideal);
        }
        ring_destroy(r);
    }
}
END_TEST

/*
 * The probability that member `target` is among the first `depth` picks of
 * weighted sampling without replacement from the members in `alive`
 * (bitmask). Rendezvous with weight / -log(u) scores draws exactly that.
 */
static double inclusion(const uint32_t *w, size_t n, unsigned alive, int depth,
                        size_t target)
{
    if (depth == 0)
        return 0;
    double total = 0;
    for (size_t i = 0; i < n; i++)
        if (alive & (1u << i))
            total += w[i];
    double pr = 0;
    for (size_t i = 0; i < n; i++) {
        if (!(alive & (1u << i)))
            continue;
        double first = w[i] / total;
        if (i == target)
            pr += first;
        else
            pr +=
                first * inclusion(w, n, alive & ~(1u << i), depth - 1, target);
    }
    return pr;
}

START_TEST(test_weights)
{
    static const struct {
        uint32_t replicas;
        size_t n;
        uint32_t w[6];
    } cases[] = {
        {1, 4, {1, 1, 2, 4}},       {1, 3, {1, 2, 3}},
        {2, 4, {1, 1, 1, 2}},       {2, 5, {1, 2, 3, 4, 5}},
        {3, 6, {1, 1, 1, 1, 3, 3}},
    };
    const uint32_t parts = 4096;
    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
        ring_member m[6];
        for (size_t i = 0; i < cases[c].n; i++)
            m[i] = (ring_member){.node = node_of(i), .weight = cases[c].w[i]};
        ring *r = make_ring(parts, cases[c].replicas, m, cases[c].n);
        unsigned all = (1u << cases[c].n) - 1;
        for (size_t i = 0; i < cases[c].n; i++) {
            double q = inclusion(cases[c].w, cases[c].n, all,
                                 (int)cases[c].replicas, i);
            double ideal = parts * q, sd = sqrt(parts * q * (1 - q));
            double got = (double)ring_owned(r, node_of(i), NULL, 0);
            /* R = 1: exactly proportional to weight. */
            if (cases[c].replicas == 1) {
                double sum = 0;
                for (size_t j = 0; j < cases[c].n; j++)
                    sum += cases[c].w[j];
                CHECK(fabs(q - cases[c].w[i] / sum) < 1e-12);
            }
            ck_assert_msg(fabs(got - ideal) <= 4.5 * sd,
                          "case %zu node %zu weight %u owns %.0f, expected "
                          "%.1f (sd %.1f)",
                          c, i, cases[c].w[i], got, ideal, sd);
        }
        ring_destroy(r);
    }

    /* Raising one weight only ever gives that member partitions: every
     * partition that changes now has it and did not before; lowering it
     * back restores the placement. */
    ring *r = make_equal(1024, 2, 5);
    ring *before = ring_clone(r, NULL);
    uint32_t x = node_of(2);
    CHECK((ring_set_weight(r, x, 3)) == (RING_OK));
    uint32_t changed[1024];
    long d = ring_diff(before, r, changed, 1024);
    CHECK((d) > (0));
    for (long i = 0; i < d; i++) {
        CHECK(ring_is_owner(r, changed[i], x));
        CHECK(!ring_is_owner(before, changed[i], x));
    }
    CHECK((ring_owned(r, x, NULL, 0)) ==
          (ring_owned(before, x, NULL, 0) + (size_t)d));
    CHECK((ring_set_weight(r, x, 1)) == (RING_OK));
    assert_same_placement(before, r);
    ring_destroy(before);
    ring_destroy(r);
}
END_TEST

/*
 * Partition p changed by at most one owner each way between the rings: the
 * owner it lost, if any, is `lost` (when not 0) and the one it gained, if
 * any, is `gained` (when not 0).
 */
static void assert_swap(const ring *before, const ring *after, uint32_t p,
                        uint32_t lost, uint32_t gained)
{
    uint32_t kb = ring_owner_count(before), ka = ring_owner_count(after);
    const uint32_t *ob = ring_owners_ref(before, p);
    const uint32_t *oa = ring_owners_ref(after, p);
    uint32_t nmissing = 0, nextra = 0, missing = 0, extra = 0;
    for (uint32_t j = 0; j < kb; j++)
        if (!ring_is_owner(after, p, ob[j])) {
            missing = ob[j];
            nmissing++;
        }
    for (uint32_t j = 0; j < ka; j++)
        if (!ring_is_owner(before, p, oa[j])) {
            extra = oa[j];
            nextra++;
        }
    CHECK((nmissing) <= (1));
    CHECK((nextra) <= (1));
    CHECK((kb + nextra) == (ka + nmissing));
    CHECK((nmissing + nextra > 0) == (1));
    if (lost && nmissing)
        CHECK((missing) == (lost));
    if (gained && nextra)
        CHECK((extra) == (gained));
}

/*
 * A 4th member joins a 3-member ring at R = 2. Ideal: the newcomer owns
 * R/N = 1/2 of the partitions afterwards, and takes each of them from
 * exactly one old owner, so 1/2 of the partitions change owner set and 1/4
 * of the (key, owner) pairs move, with nothing else reshuffled. Each
 * partition independently goes to the newcomer with probability 1/2, so
 * the changed fraction has sd sqrt(0.25 / P) = 0.0156 at P = 1024: it must
 * be within 4 sd of 1/2 (so at most 0.5625), and the moved pairs, exactly
 * half of that, within 4 sd of 1/4. Keys are hashed into partitions
 * uniformly, so over 200,000 keys the key figures follow the partition
 * figures to within about 0.002 more; the bound for keys adds 0.01.
 */
START_TEST(test_join_movement)
{
    const uint32_t parts = RING_DEFAULT_PARTITIONS;
    ring *three = make_equal(parts, 2, 3);
    ring *four = ring_clone(three, NULL);
    uint32_t newcomer = node_of(3);
    CHECK((ring_add(four, newcomer, 1)) == (RING_OK));

    uint32_t changed[RING_DEFAULT_PARTITIONS];
    long d = ring_diff(three, four, changed, parts);
    CHECK((d) >= (0));
    double frac = (double)d / parts;
    double sd = sqrt(0.25 / parts);
    ck_assert_msg(fabs(frac - 0.5) <= 4 * sd, "changed fraction %.4f", frac);
    CHECK(frac <= 0.5625);
    /* Exactly the newcomer's partitions changed, one owner each. */
    CHECK(((size_t)d) == (ring_owned(four, newcomer, NULL, 0)));
    for (long i = 0; i < d; i++) {
        CHECK(ring_is_owner(four, changed[i], newcomer));
        assert_swap(three, four, changed[i], 0, newcomer);
        CHECK(!ring_is_owner(three, changed[i], newcomer));
        if (i > 0)
            CHECK((changed[i - 1]) < (changed[i]));
    }

    /* The same with keys: owner sets that change, and copies that move. */
    const int nkeys = 200000;
    long keys_changed = 0, pairs_moved = 0;
    for (int i = 0; i < nkeys; i++) {
        char key[32];
        int n = snprintf(key, sizeof(key), "user:%d:profile", i);
        uint32_t p = ring_partition(three, key, (size_t)n);
        CHECK((p) == (ring_partition(four, key, (size_t)n)));
        int moved = 0;
        const uint32_t *o = ring_owners_ref(four, p);
        for (int j = 0; j < 2; j++)
            if (!ring_is_owner(three, p, o[j]))
                moved++;
        pairs_moved += moved;
        keys_changed += moved > 0;
    }
    double kf = (double)keys_changed / nkeys;
    double pf = (double)pairs_moved / (2.0 * nkeys);
    printf("ring join 3->4, R=2, P=%u: %ld partitions changed (%.4f, ideal "
           "0.5); keys changed %.4f (ideal 0.5); key-owner pairs moved %.4f "
           "(ideal 0.25)\n",
           parts, d, frac, kf, pf);
    ck_assert_msg(fabs(kf - 0.5) <= 4 * sd + 0.01, "keys changed %.4f", kf);
    ck_assert_msg(fabs(pf - 0.25) <= 2 * sd + 0.005, "pairs moved %.4f", pf);
    /* No key gained more than the one new copy. */
    CHECK((pairs_moved) == (keys_changed));

    ring_destroy(four);
    ring_destroy(three);
}
END_TEST

/* Joins and leaves of every size move only the partitions of the member
 * that came or went, and each of those by exactly one owner. */
START_TEST(test_leave_movement)
{
    for (size_t n = 2; n <= 8; n++) {
        for (uint32_t replicas = 1; replicas <= 4; replicas++) {
            ring *full = make_equal(1024, replicas, n);
            for (size_t gone = 0; gone < n; gone++) {
                uint32_t x = node_of(gone);
                ring *less = ring_clone(full, NULL);
                CHECK((ring_remove(less, x)) == (RING_OK));
                uint32_t owned[1024], changed[1024];
                size_t no = ring_owned(full, x, owned, 1024);
                long d = ring_diff(full, less, changed, 1024);
                CHECK((d) == ((long)no));
                CHECK((memcmp(owned, changed, no * sizeof(owned[0]))) == (0));
                for (size_t i = 0; i < no; i++) {
                    uint32_t p = changed[i];
                    /* With members to spare the next best takes over;
                     * otherwise the partition keeps one owner fewer. */
                    assert_swap(full, less, p, x, 0);
                    CHECK(!ring_is_owner(less, p, x));
                    CHECK((ring_owner_count(less)) ==
                          (replicas < n - 1 ? replicas : (uint32_t)n - 1));
                }
                /* Joining again restores the placement. */
                CHECK((ring_add(less, x, 1)) == (RING_OK));
                assert_same_placement(full, less);
                ring_destroy(less);
            }
            ring_destroy(full);
        }
    }
}
END_TEST

START_TEST(test_shared_and_owned)
{
    ring_member m[] = {{.node = 10, .weight = 1},
                       {.node = 20, .weight = 2},
                       {.node = 30, .weight = 1},
                       {.node = 40, .weight = 3}};
    ring *r = make_ring(256, 2, m, 4);
    for (int a = 0; a < 4; a++) {
        for (int b = 0; b < 4; b++) {
            uint32_t got[256];
            size_t n = ring_shared(r, m[a].node, m[b].node, got, 256);
            size_t want = 0;
            for (uint32_t p = 0; p < 256; p++) {
                if (ring_is_owner(r, p, m[a].node) &&
                    ring_is_owner(r, p, m[b].node)) {
                    CHECK((want) < (n));
                    CHECK((got[want]) == (p));
                    want++;
                }
            }
            CHECK((n) == (want));
            if (a == b)
                CHECK((n) == (ring_owned(r, m[a].node, NULL, 0)));
        }
    }
    /* A short buffer still reports the full count. */
    uint32_t two[2];
    size_t all = ring_owned(r, 40, two, 2);
    CHECK((all) > (2));
    CHECK(ring_is_owner(r, two[0], 40));
    CHECK(ring_is_owner(r, two[1], 40));
    CHECK((ring_shared(r, 10, 99, NULL, 0)) == (0));
    ring_destroy(r);
}
END_TEST

static Suite *ring_suite(void)
{
    Suite *s = suite_create("ring");
    TCase *tc = tcase_create("ring");
    tcase_add_test(tc, test_arguments);
    tcase_add_test(tc, test_key_hash);
    tcase_add_test(tc, test_order_independence);
    tcase_add_test(tc, test_distinct_owners);
    tcase_add_test(tc, test_balance);
    tcase_add_test(tc, test_weights);
    tcase_add_test(tc, test_join_movement);
    tcase_add_test(tc, test_leave_movement);
    tcase_add_test(tc, test_shared_and_owned);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(ring_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
