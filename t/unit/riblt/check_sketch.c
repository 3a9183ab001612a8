/*
 * check_sketch.c -- the materialized sketch: equal to the encoder's prefix,
 * reversible updates, subtraction and decoding.
 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>

#include "riblt.h"
#include "testutil.h"

START_TEST(test_sketch_equals_encoder_prefix)
{
    enum { S = 1024, N = 5000 };
    uint64_t seed = 42;
    riblt_sketch *sk = riblt_sketch_create(S);
    riblt_encoder *enc = riblt_encoder_create(N);
    for (int i = 0; i < N; i++) {
        riblt_id id = tu_id(&seed);
        riblt_sketch_add(sk, &id);
        riblt_encoder_add(enc, &id);
    }
    riblt_symbol *prefix = malloc(S * sizeof(*prefix));
    ck_assert_int_eq(riblt_encoder_produce(enc, prefix, S), RIBLT_OK);
    ck_assert_int_eq(
        memcmp(prefix, riblt_sketch_cells(sk), S * sizeof(*prefix)), 0);
    ck_assert_int_eq(riblt_sketch_count(sk), N);
    free(prefix);
    riblt_sketch_destroy(sk);
    riblt_encoder_destroy(enc);
}
END_TEST

START_TEST(test_add_then_remove_is_zero)
{
    enum { S = 2048, N = 3000 };
    uint64_t seed = 9, again = 9;
    riblt_sketch *sk = riblt_sketch_create(S);
    for (int i = 0; i < N; i++) {
        riblt_id id = tu_id(&seed);
        riblt_sketch_add(sk, &id);
    }
    ck_assert_int_eq(riblt_sketch_count(sk), N);
    for (int i = 0; i < N; i++) {
        riblt_id id = tu_id(&again);
        riblt_sketch_remove_hashed(sk, &id, riblt_hash(&id));
    }
    for (size_t i = 0; i < S; i++)
        TU_REQUIRE(riblt_symbol_is_zero(&riblt_sketch_cells(sk)[i]));
    riblt_sketch_destroy(sk);
}
END_TEST

START_TEST(test_replace_equals_remove_then_add)
{
    enum { S = 4096, N = 2000 };
    uint64_t seed = 31;
    riblt_sketch *a = riblt_sketch_create(S), *b = riblt_sketch_create(S);
    riblt_id *ids = malloc(N * sizeof(*ids));
    for (int i = 0; i < N; i++) {
        ids[i] = tu_id(&seed);
        riblt_sketch_add(a, &ids[i]);
        riblt_sketch_add(b, &ids[i]);
    }
    for (int i = 0; i < N; i++) {
        riblt_id fresh = tu_id(&seed);
        riblt_sketch_remove(a, &ids[i]);
        riblt_sketch_add(a, &fresh);
        riblt_sketch_replace_hashed(b, &ids[i], riblt_hash(&ids[i]), &fresh,
                                    riblt_hash(&fresh));
    }
    ck_assert_int_eq(memcmp(riblt_sketch_cells(a), riblt_sketch_cells(b),
                            S * sizeof(riblt_symbol)),
                     0);
    ck_assert_int_eq(riblt_sketch_count(b), N);
    free(ids);
    riblt_sketch_destroy(a);
    riblt_sketch_destroy(b);
}
END_TEST

/*
 * The walks compiled for SSE4.1 (where the CPU has it) and the portable
 * ones touch the same cells with the same values: adds, removes,
 * replaces and tails alike.
 */
START_TEST(test_fast_walks_equal_portable)
{
    enum { S = 8192, N = 3000 };
    uint64_t seed = 77;
    riblt_sketch *fast = riblt_sketch_create(S),
                 *port = riblt_sketch_create(S);
    bool had = riblt_sketch_portable(port);
    ck_assert(!riblt_sketch_portable(port));
    riblt_id *ids = malloc(N * sizeof(*ids));
    for (int i = 0; i < N; i++) {
        ids[i] = tu_id(&seed);
        riblt_tail ta, tb;
        riblt_sketch_add_tail(fast, &ids[i], riblt_hash(&ids[i]), &ta);
        riblt_sketch_add_tail(port, &ids[i], riblt_hash(&ids[i]), &tb);
        ck_assert_uint_eq(ta.index, tb.index);
        ck_assert_uint_eq(ta.steps, tb.steps);
    }
    for (int i = 0; i < N; i += 2) {
        riblt_id fresh = tu_id(&seed);
        riblt_tail ta, tb;
        riblt_sketch_replace_tail(fast, &ids[i], riblt_hash(&ids[i]), &fresh,
                                  riblt_hash(&fresh), &ta);
        riblt_sketch_replace_tail(port, &ids[i], riblt_hash(&ids[i]), &fresh,
                                  riblt_hash(&fresh), &tb);
        ck_assert_uint_eq(ta.index, tb.index);
        ck_assert_uint_eq(ta.steps, tb.steps);
        riblt_sketch_remove(fast, &ids[i + 1]);
        riblt_sketch_remove(port, &ids[i + 1]);
    }
    ck_assert_int_eq(memcmp(riblt_sketch_cells(fast), riblt_sketch_cells(port),
                            S * sizeof(riblt_symbol)),
                     0);
    /* Says which code ran, so a log shows whether the comparison had two
     * sides on this machine. */
    printf("sketch walks: %s\n", had ? "SSE4.1 and portable compared"
                                     : "portable only (no SSE4.1 here)");
    free(ids);
    riblt_sketch_destroy(fast);
    riblt_sketch_destroy(port);
}
END_TEST

/*
 * Walks of many steps (a sketch of 2^20 symbols: about 28 steps an id on
 * average, some past 40) give the encoder's prefix too, by single walks
 * and by interleaved ones (replace): the walks gather far cells in
 * batches, and these cross a batch's end.
 */
START_TEST(test_long_walks_equal_encoder_prefix)
{
    enum { S = 1 << 20, N = 400 };
    uint64_t seed = 5;
    riblt_sketch *sk = riblt_sketch_create(S);
    riblt_encoder *enc = riblt_encoder_create(N);
    ck_assert_ptr_nonnull(sk);
    uint32_t longest = 0;
    for (int i = 0; i < N; i++) {
        riblt_id id = tu_id(&seed);
        riblt_tail t;
        if (i % 2 == 0) {
            riblt_sketch_add_tail(sk, &id, riblt_hash(&id), &t);
        } else {
            /* In through a replace of a passing id, out again. */
            riblt_id passing = tu_id(&seed);
            riblt_sketch_add(sk, &passing);
            riblt_sketch_replace_tail(sk, &passing, riblt_hash(&passing), &id,
                                      riblt_hash(&id), &t);
        }
        if (t.steps > longest)
            longest = t.steps;
        riblt_encoder_add(enc, &id);
    }
    /* The run had walks longer than any batch the walks use (32). */
    ck_assert_uint_gt(longest, 32);
    riblt_symbol *prefix = malloc((size_t)S * sizeof(*prefix));
    ck_assert_ptr_nonnull(prefix);
    ck_assert_int_eq(riblt_encoder_produce(enc, prefix, S), RIBLT_OK);
    ck_assert_int_eq(
        memcmp(prefix, riblt_sketch_cells(sk), (size_t)S * sizeof(*prefix)),
        0);
    ck_assert_int_eq(riblt_sketch_count(sk), N);
    free(prefix);
    riblt_sketch_destroy(sk);
    riblt_encoder_destroy(enc);
}
END_TEST

/*
 * An encoder started from the tails a sketch recorded continues the
 * stream exactly where the sketch ends, and from 0 it restarts correctly.
 */
START_TEST(test_tails_continue_the_stream)
{
    enum { S = 1024, N = 3000, L = 2000 };
    uint64_t seed = 77;
    riblt_sketch *sk = riblt_sketch_create(S);
    riblt_encoder *full = riblt_encoder_create(N);
    riblt_encoder *tails = riblt_encoder_create(N);
    riblt_id prev = tu_id(&seed);
    for (int i = 0; i < N; i++) {
        riblt_id id = tu_id(&seed);
        riblt_tail t;
        if (i % 2) {
            riblt_sketch_add_tail(sk, &id, riblt_hash(&id), &t);
        } else {
            /* Half of them arrive as the replacement of another id. */
            riblt_sketch_add(sk, &prev);
            riblt_sketch_replace_tail(sk, &prev, riblt_hash(&prev), &id,
                                      riblt_hash(&id), &t);
        }
        TU_REQUIRE(t.index >= S);
        riblt_encoder_add(full, &id);
        TU_REQUIRE(riblt_encoder_add_tail(tails, &id, riblt_hash(&id), &t,
                                          S) == RIBLT_OK);
    }
    riblt_symbol *ref = malloc((S + L) * sizeof(*ref));
    riblt_symbol *got = malloc((S + L) * sizeof(*got));
    riblt_encoder_produce(full, ref, S + L);
    ck_assert_int_eq(memcmp(ref, riblt_sketch_cells(sk), S * sizeof(*ref)), 0);
    ck_assert_int_eq(riblt_encoder_seek(tails, S), RIBLT_OK);
    ck_assert_int_eq(riblt_encoder_produce(tails, got, L), RIBLT_OK);
    ck_assert_int_eq(memcmp(got, ref + S, L * sizeof(*ref)), 0);
    /* Below the floor: every mapping restarts, the stream is still right. */
    ck_assert_int_eq(riblt_encoder_seek(tails, 0), RIBLT_OK);
    ck_assert_int_eq(riblt_encoder_produce(tails, got, S + L), RIBLT_OK);
    ck_assert_int_eq(memcmp(got, ref, (S + L) * sizeof(*ref)), 0);
    /* A tail below its base is refused. */
    riblt_encoder *e = riblt_encoder_create(1);
    riblt_tail bad = {5, 1};
    ck_assert_int_eq(riblt_encoder_add_tail(e, &prev, 1, &bad, S),
                     RIBLT_ERR_INVAL);
    riblt_encoder_destroy(e);
    free(ref);
    free(got);
    riblt_sketch_destroy(sk);
    riblt_encoder_destroy(full);
    riblt_encoder_destroy(tails);
}
END_TEST

/* Builds sketches of A = common + a_only and B = common + b_only. */
static void two_sketches(size_t s, size_t na, size_t nb, size_t nc,
                         riblt_sketch **a, riblt_sketch **b, riblt_id *a_only,
                         riblt_id *b_only)
{
    uint64_t seed = 1000 + na * 31 + nb;
    *a = riblt_sketch_create(s);
    *b = riblt_sketch_create(s);
    for (size_t i = 0; i < nc; i++) {
        riblt_id id = tu_id(&seed);
        riblt_sketch_add(*a, &id);
        riblt_sketch_add(*b, &id);
    }
    for (size_t i = 0; i < na; i++) {
        a_only[i] = tu_id(&seed);
        riblt_sketch_add(*a, &a_only[i]);
    }
    for (size_t i = 0; i < nb; i++) {
        b_only[i] = tu_id(&seed);
        riblt_sketch_add(*b, &b_only[i]);
    }
}

START_TEST(test_subtract_decodes_difference)
{
    enum { S = 1024, NA = 60, NB = 40 };
    riblt_id a_only[NA], b_only[NB];
    riblt_sketch *a, *b;
    two_sketches(S, NA, NB, 20000, &a, &b, a_only, b_only);
    ck_assert_int_eq(riblt_sketch_subtract(a, b), RIBLT_OK);
    ck_assert_int_eq(riblt_sketch_count(a), NA - NB);
    riblt_decoder *dec = riblt_decoder_create(S);
    ck_assert_int_eq(riblt_sketch_decode(a, dec), RIBLT_OK);
    size_t nr, nl;
    riblt_id r[NA], l[NB];
    memcpy(r, riblt_decoder_remote(dec, &nr), sizeof(r));
    ck_assert_uint_eq(nr, NA);
    memcpy(l, riblt_decoder_local(dec, &nl), sizeof(l));
    ck_assert_uint_eq(nl, NB);
    ck_assert(tu_same_set(r, NA, a_only, NA));
    ck_assert(tu_same_set(l, NB, b_only, NB));
    riblt_decoder_destroy(dec);
    riblt_sketch_destroy(a);
    riblt_sketch_destroy(b);
}
END_TEST

START_TEST(test_too_short_sketch)
{
    enum { S = 256, NA = 500, NB = 500 };
    riblt_id *a_only = malloc(NA * sizeof(riblt_id));
    riblt_id *b_only = malloc(NB * sizeof(riblt_id));
    riblt_sketch *a, *b;
    two_sketches(S, NA, NB, 1000, &a, &b, a_only, b_only);
    riblt_sketch_subtract(a, b);
    riblt_decoder *dec = riblt_decoder_create(S);
    ck_assert_int_eq(riblt_sketch_decode(a, dec), RIBLT_ERR_SHORT);
    riblt_decoder_destroy(dec);
    riblt_sketch_destroy(a);
    riblt_sketch_destroy(b);
    free(a_only);
    free(b_only);
}
END_TEST

START_TEST(test_sketch_bounds)
{
    riblt_sketch *a = riblt_sketch_create(16);
    riblt_sketch *b = riblt_sketch_create(32);
    riblt_symbol out[4];
    ck_assert_ptr_null(riblt_sketch_create(0));
    ck_assert_int_eq(riblt_sketch_subtract(a, b), RIBLT_ERR_INVAL);
    ck_assert_int_eq(riblt_sketch_read(a, 12, out, 4), RIBLT_OK);
    ck_assert_int_eq(riblt_sketch_read(a, 13, out, 4), RIBLT_ERR_INVAL);
    ck_assert_int_eq(riblt_sketch_read(a, 17, out, 0), RIBLT_ERR_INVAL);
    ck_assert_int_eq(riblt_sketch_read(a, SIZE_MAX, out, 2), RIBLT_ERR_INVAL);
    uint64_t seed = 3;
    riblt_id id = tu_id(&seed);
    riblt_sketch_add(a, &id);
    ck_assert_int_eq(riblt_sketch_count(a), 1);
    riblt_sketch_clear(a);
    ck_assert_int_eq(riblt_sketch_count(a), 0);
    riblt_sketch_destroy(a);
    riblt_sketch_destroy(b);
}
END_TEST

static Suite *sketch_suite(void)
{
    Suite *s = suite_create("riblt_sketch");
    TCase *tc = tcase_create("sketch");
    tcase_add_test(tc, test_sketch_equals_encoder_prefix);
    tcase_add_test(tc, test_add_then_remove_is_zero);
    tcase_add_test(tc, test_replace_equals_remove_then_add);
    tcase_add_test(tc, test_fast_walks_equal_portable);
    tcase_add_test(tc, test_long_walks_equal_encoder_prefix);
    tcase_add_test(tc, test_tails_continue_the_stream);
    tcase_add_test(tc, test_subtract_decodes_difference);
    tcase_add_test(tc, test_too_short_sketch);
    tcase_add_test(tc, test_sketch_bounds);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(sketch_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
