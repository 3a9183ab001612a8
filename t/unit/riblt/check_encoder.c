/*
 * check_encoder.c -- the encoder's stream: seeking, removal, call order.
 */
#include <check.h>
#include <stdlib.h>

#include "riblt.h"
#include "testutil.h"

static riblt_encoder *make(size_t n, uint64_t seed)
{
    riblt_encoder *e = riblt_encoder_create(n);
    ck_assert_ptr_nonnull(e);
    for (size_t i = 0; i < n; i++) {
        riblt_id id = tu_id(&seed);
        TU_REQUIRE((riblt_encoder_add(e, &id)) == (RIBLT_OK));
    }
    return e;
}

START_TEST(test_seek_matches_full_stream)
{
    enum { N = 3000, L = 5000 };
    riblt_encoder *full = make(N, 17);
    riblt_symbol *ref = malloc(L * sizeof(*ref));
    riblt_encoder_produce(full, ref, L);
    static const uint64_t offsets[] = {0, 1, 7, 100, 4095, 4999};
    riblt_encoder *e = make(N, 17);
    riblt_symbol got[1];
    for (size_t k = 0; k < 6; k++) {
        /* Forward seeks, then a backward one at k == 0 of the next round. */
        TU_REQUIRE((riblt_encoder_seek(e, offsets[k])) == (RIBLT_OK));
        TU_REQUIRE((riblt_encoder_position(e)) == (offsets[k]));
        riblt_encoder_produce(e, got, 1);
        TU_REQUIRE((memcmp(got, &ref[offsets[k]], sizeof(got))) == (0));
    }
    ck_assert_int_eq(riblt_encoder_seek(e, 100), RIBLT_OK); /* backwards */
    riblt_symbol tail[50];
    riblt_encoder_produce(e, tail, 50);
    ck_assert_int_eq(memcmp(tail, &ref[100], sizeof(tail)), 0);
    free(ref);
    riblt_encoder_destroy(full);
    riblt_encoder_destroy(e);
}
END_TEST

/* Single symbols (heap) and batches (mapping walk) give one stream. */
START_TEST(test_mixed_batch_sizes)
{
    enum { N = 2000, L = 3000 };
    riblt_encoder *full = make(N, 23);
    riblt_symbol *ref = malloc(L * sizeof(*ref));
    riblt_symbol *got = malloc(L * sizeof(*got));
    for (int i = 0; i < L; i++)
        riblt_encoder_produce(full, &ref[i], 1);
    riblt_encoder *e = make(N, 23);
    static const size_t steps[] = {1, 3, 15, 16, 1, 200, 2, 17, 1000, 1};
    size_t at = 0;
    for (size_t k = 0; at < L; k = (k + 1) % 10) {
        size_t n = steps[k] < L - at ? steps[k] : L - at;
        TU_REQUIRE((riblt_encoder_produce(e, got + at, n)) == (RIBLT_OK));
        at += n;
    }
    ck_assert_int_eq(memcmp(got, ref, L * sizeof(*ref)), 0);
    free(ref);
    free(got);
    riblt_encoder_destroy(full);
    riblt_encoder_destroy(e);
}
END_TEST

START_TEST(test_remove_cancels_add)
{
    enum { N = 500, L = 300 };
    riblt_encoder *a = make(N, 5);
    riblt_encoder *b = make(N, 5);
    uint64_t seed = 999;
    for (int i = 0; i < 40; i++) {
        riblt_id extra = tu_id(&seed);
        TU_REQUIRE((riblt_encoder_add(b, &extra)) == (RIBLT_OK));
        TU_REQUIRE((riblt_encoder_remove(b, &extra)) == (RIBLT_OK));
    }
    ck_assert_uint_eq(riblt_encoder_size(b), N + 80);
    riblt_symbol sa[L], sb[L];
    riblt_encoder_produce(a, sa, L);
    riblt_encoder_produce(b, sb, L);
    ck_assert_int_eq(memcmp(sa, sb, sizeof(sa)), 0);
    riblt_encoder_destroy(a);
    riblt_encoder_destroy(b);
}
END_TEST

START_TEST(test_symbol_zero_counts_the_set)
{
    riblt_encoder *e = make(1234, 1);
    riblt_symbol s;
    riblt_encoder_produce(e, &s, 1);
    ck_assert_int_eq(s.count, 1234);
    riblt_encoder_destroy(e);
}
END_TEST

START_TEST(test_call_order)
{
    riblt_encoder *e = make(10, 2);
    riblt_symbol s;
    uint64_t seed = 3;
    riblt_id id = tu_id(&seed);
    riblt_encoder_produce(e, &s, 1);
    ck_assert_int_eq(riblt_encoder_add(e, &id), RIBLT_ERR_ORDER);
    ck_assert_int_eq(riblt_encoder_remove(e, &id), RIBLT_ERR_ORDER);
    riblt_encoder_reset(e);
    ck_assert_uint_eq(riblt_encoder_size(e), 0);
    ck_assert_uint_eq(riblt_encoder_position(e), 0);
    ck_assert_int_eq(riblt_encoder_add(e, &id), RIBLT_OK);
    ck_assert_int_eq(riblt_encoder_seek(e, 10), RIBLT_OK);
    ck_assert_int_eq(riblt_encoder_add(e, &id), RIBLT_ERR_ORDER);
    ck_assert_int_eq(riblt_encoder_produce(e, NULL, 1), RIBLT_ERR_INVAL);
    ck_assert_int_eq(riblt_encoder_add(NULL, &id), RIBLT_ERR_INVAL);
    ck_assert_int_eq(riblt_encoder_seek(e, UINT64_MAX), RIBLT_OK);
    ck_assert_int_eq(riblt_encoder_produce(e, &s, 1), RIBLT_ERR_INVAL);
    riblt_encoder_destroy(e);
}
END_TEST

static Suite *encoder_suite(void)
{
    Suite *s = suite_create("riblt_encoder");
    TCase *tc = tcase_create("encoder");
    tcase_add_test(tc, test_seek_matches_full_stream);
    tcase_add_test(tc, test_mixed_batch_sizes);
    tcase_add_test(tc, test_remove_cancels_add);
    tcase_add_test(tc, test_symbol_zero_counts_the_set);
    tcase_add_test(tc, test_call_order);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(encoder_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
