/*
 * check_psum.c -- power sums: the field against a portable reference, exact
 * recovery of differences up to n - 1 ids from n terms, and refusal of
 * anything larger or malformed.
 */
#include <check.h>
#include <stdlib.h>

#include "riblt_psum.h"
#include "testutil.h"

/* Toggles n ids into a fresh table. */
static void table_of(riblt_id *table, const riblt_id *ids, size_t n)
{
    memset(table, 0, RIBLT_PSUM_SIZE * sizeof(*table));
    for (size_t i = 0; i < n; i++)
        riblt_psum_toggle(table, &ids[i], riblt_hash(&ids[i]));
}

/* The terms of a set taken as one bucket: every id in bucket 0's slot. */
static void terms_of(riblt_id *terms, const riblt_id *ids, size_t n)
{
    riblt_id table[RIBLT_PSUM_SIZE];
    memset(terms, 0, RIBLT_PSUM_TERMS * sizeof(*terms));
    for (size_t i = 0; i < n; i++) {
        table_of(table, &ids[i], 1);
        riblt_id one[RIBLT_PSUM_TERMS];
        riblt_psum_combine(table, one);
        riblt_psum_add(terms, one, RIBLT_PSUM_TERMS);
    }
}

START_TEST(test_first_terms_are_odd_powers)
{
    /* x = the field element x: its terms are x^1, x^3, ..., x^63, one bit
     * each (below x^128 no reduction happens). */
    riblt_id x = {2, 0};
    riblt_id t[RIBLT_PSUM_TERMS];
    terms_of(t, &x, 1);
    for (int k = 0; k < RIBLT_PSUM_TERMS; k++) {
        int e = 2 * k + 1;
        riblt_id want = {e < 64 ? (uint64_t)1 << e : 0,
                         e >= 64 ? (uint64_t)1 << (e - 64) : 0};
        TU_REQUIRE(riblt_id_equal(&t[k], &want));
    }
    /* x^127 * x = x^128 = x^7 + x^2 + x + 1: a term that reduces. */
    riblt_id y = {0, (uint64_t)1 << 63}; /* x^127 */
    terms_of(t, &y, 1);
    /* x^381 = x^(3 * 127); check through the portable path instead */
    int was = riblt_psum_limit(RIBLT_PSUM_PORTABLE);
    riblt_id u[RIBLT_PSUM_TERMS];
    terms_of(u, &y, 1);
    riblt_psum_limit(was);
    for (int k = 0; k < RIBLT_PSUM_TERMS; k++)
        TU_REQUIRE(riblt_id_equal(&t[k], &u[k]));
}
END_TEST

START_TEST(test_every_code_agrees)
{
    /* Each code this CPU has, against the portable one. */
    uint64_t s = 11;
    riblt_id ids[64];
    for (int i = 0; i < 64; i++)
        ids[i] = tu_id(&s);
    ids[0].lo = ids[0].hi = ~(uint64_t)0; /* every bit, every fold */
    riblt_id want[RIBLT_PSUM_SIZE], got[RIBLT_PSUM_SIZE];
    int was = riblt_psum_limit(RIBLT_PSUM_PORTABLE);
    ck_assert_int_eq(riblt_psum_level(), RIBLT_PSUM_PORTABLE);
    table_of(want, ids, 64);
    for (int level = RIBLT_PSUM_CLMUL; level <= RIBLT_PSUM_VPCLMUL; level++) {
        riblt_psum_limit(level);
        if (riblt_psum_level() != level)
            continue; /* not on this CPU */
        table_of(got, ids, 64);
        ck_assert_mem_eq(got, want, sizeof(want));
    }
    riblt_psum_limit(was);
}
END_TEST

START_TEST(test_toggle_twice_is_nothing)
{
    uint64_t s = 3;
    riblt_id ids[10], table[RIBLT_PSUM_SIZE], zero[RIBLT_PSUM_SIZE];
    for (int i = 0; i < 10; i++)
        ids[i] = tu_id(&s);
    table_of(table, ids, 10);
    for (int i = 9; i >= 0; i--)
        riblt_psum_toggle(table, &ids[i], riblt_hash(&ids[i]));
    memset(zero, 0, sizeof(zero));
    ck_assert_mem_eq(table, zero, sizeof(zero));
}
END_TEST

/* Decodes every size 0..31 from d + 1 terms (and d + 1 up to 32), and
 * refuses from d terms. */
static void decode_sizes(int level)
{
    bool portable = level == RIBLT_PSUM_PORTABLE;
    int was = riblt_psum_limit(level);
    uint64_t s = portable ? 99 : 7;
    for (size_t d = 0; d < RIBLT_PSUM_TERMS; d++) {
        riblt_id ids[RIBLT_PSUM_TERMS], t[RIBLT_PSUM_TERMS],
            got[RIBLT_PSUM_TERMS];
        for (size_t i = 0; i < d; i++)
            ids[i] = tu_id(&s);
        terms_of(t, ids, d);
        size_t n = 99;
        for (size_t k = d + 1; k <= RIBLT_PSUM_TERMS; k += portable ? 31 : 1) {
            TU_REQUIRE(riblt_psum_decode(t, k, got, RIBLT_PSUM_TERMS, &n) ==
                       RIBLT_OK);
            TU_REQUIRE(tu_same_set(got, n, ids, d));
        }
        if (d > 0)
            TU_REQUIRE(riblt_psum_decode(t, d, got, RIBLT_PSUM_TERMS, &n) ==
                       RIBLT_NEED_MORE);
    }
    riblt_psum_limit(was);
}

START_TEST(test_decode_every_size)
{
    decode_sizes(RIBLT_PSUM_VPCLMUL);
    decode_sizes(RIBLT_PSUM_CLMUL); /* where the CPU has more */
}
END_TEST

START_TEST(test_decode_every_size_portable)
{
    decode_sizes(RIBLT_PSUM_PORTABLE);
}
END_TEST

START_TEST(test_difference_of_two_tables)
{
    /* A and B share 1,000 ids; 20 are only in A and 25 only in B. The sum
     * of their tables holds the 45, about 6 a bucket: each bucket decodes
     * from its own terms, and their union is the difference. */
    uint64_t s = 21;
    static riblt_id a[1020], b[1025];
    for (int i = 0; i < 1000; i++)
        a[i] = b[i] = tu_id(&s);
    for (int i = 1000; i < 1020; i++)
        a[i] = tu_id(&s);
    for (int i = 1000; i < 1025; i++)
        b[i] = tu_id(&s);
    riblt_id ta[RIBLT_PSUM_SIZE], tb[RIBLT_PSUM_SIZE];
    table_of(ta, a, 1020);
    table_of(tb, b, 1025);
    riblt_psum_add(ta, tb, RIBLT_PSUM_SIZE);
    riblt_id got[64], want[45];
    size_t ng = 0;
    for (int k = 0; k < RIBLT_PSUM_BUCKETS; k++) {
        size_t n;
        TU_REQUIRE(riblt_psum_decode(ta + k * RIBLT_PSUM_TERMS,
                                     RIBLT_PSUM_TERMS, got + ng, 64 - ng,
                                     &n) == RIBLT_OK);
        for (size_t i = 0; i < n; i++)
            TU_REQUIRE(riblt_psum_bucket(riblt_hash(&got[ng + i])) ==
                       (unsigned)k);
        ng += n;
    }
    for (int i = 0; i < 20; i++)
        want[i] = a[1000 + i];
    for (int i = 0; i < 25; i++)
        want[20 + i] = b[1000 + i];
    TU_REQUIRE(tu_same_set(got, ng, want, 45));
    /* The combined terms (one bucket for the whole set) cover 31, not
     * 45. */
    riblt_id comb[RIBLT_PSUM_TERMS];
    riblt_psum_combine(ta, comb);
    size_t n;
    TU_REQUIRE(riblt_psum_decode(comb, RIBLT_PSUM_TERMS, got, 64, &n) ==
               RIBLT_NEED_MORE);
}
END_TEST

START_TEST(test_larger_sets_are_refused)
{
    uint64_t s = 5;
    for (size_t d = RIBLT_PSUM_TERMS; d < 3 * RIBLT_PSUM_TERMS; d += 7) {
        riblt_id ids[3 * RIBLT_PSUM_TERMS], t[RIBLT_PSUM_TERMS], got[64];
        for (size_t i = 0; i < d; i++)
            ids[i] = tu_id(&s);
        terms_of(t, ids, d);
        for (size_t k = 1; k <= RIBLT_PSUM_TERMS; k++) {
            size_t n;
            TU_REQUIRE(riblt_psum_decode(t, k, got, 64, &n) ==
                       RIBLT_NEED_MORE);
        }
    }
}
END_TEST

START_TEST(test_random_terms_are_refused)
{
    /* Terms no small set has: never decoded, never a crash. */
    uint64_t s = 77;
    for (int trial = 0; trial < 200; trial++) {
        riblt_id t[RIBLT_PSUM_TERMS], got[64];
        for (int k = 0; k < RIBLT_PSUM_TERMS; k++)
            t[k] = tu_id(&s);
        size_t n = (size_t)(trial % RIBLT_PSUM_TERMS) + 1;
        size_t nout;
        TU_REQUIRE(riblt_psum_decode(t, n, got, 64, &nout) == RIBLT_NEED_MORE);
    }
    /* One term decodes no id: x alone is a set of one or of more. */
    riblt_id one = {5, 9}, got[1];
    size_t nout;
    TU_REQUIRE(riblt_psum_decode(&one, 1, got, 1, &nout) == RIBLT_NEED_MORE);
    /* Two, x and x^3, are the one-id set {x}, whatever x. */
    static riblt_id table[RIBLT_PSUM_SIZE];
    riblt_psum_toggle(table, &one, 0); /* hash 0: bucket 0 */
    TU_REQUIRE(riblt_psum_decode(table, 2, got, 1, &nout) == RIBLT_OK);
    TU_REQUIRE(nout == 1 && riblt_id_equal(&got[0], &one));
}
END_TEST

START_TEST(test_arguments)
{
    uint64_t s = 1;
    riblt_id ids[3] = {tu_id(&s), tu_id(&s), tu_id(&s)};
    riblt_id t[RIBLT_PSUM_TERMS], got[4];
    terms_of(t, ids, 3);
    size_t n;
    ck_assert_int_eq(riblt_psum_decode(t, 8, got, 2, &n), RIBLT_ERR_FULL);
    ck_assert_int_eq(riblt_psum_decode(t, RIBLT_PSUM_TERMS + 1, got, 4, &n),
                     RIBLT_ERR_INVAL);
    ck_assert_int_eq(riblt_psum_decode(NULL, 4, got, 4, &n), RIBLT_ERR_INVAL);
    ck_assert_int_eq(riblt_psum_decode(t, 0, got, 4, &n), RIBLT_NEED_MORE);
    /* all zero: the empty difference */
    memset(t, 0, sizeof(t));
    ck_assert_int_eq(riblt_psum_decode(t, 1, NULL, 0, &n), RIBLT_OK);
    ck_assert_uint_eq(n, 0);
}
END_TEST

static Suite *psum_suite(void)
{
    Suite *s = suite_create("riblt_psum");
    TCase *tc = tcase_create("psum");
    tcase_add_test(tc, test_first_terms_are_odd_powers);
    tcase_add_test(tc, test_every_code_agrees);
    tcase_add_test(tc, test_toggle_twice_is_nothing);
    tcase_add_test(tc, test_decode_every_size);
    tcase_add_test(tc, test_decode_every_size_portable);
    tcase_add_test(tc, test_difference_of_two_tables);
    tcase_add_test(tc, test_larger_sets_are_refused);
    tcase_add_test(tc, test_random_terms_are_refused);
    tcase_add_test(tc, test_arguments);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(psum_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
