/*
 * check_mapping.c -- the random mapping of ids onto coded symbol indices.
 */
#include <check.h>
#include <stdlib.h>

#include "riblt.h"
#include "testutil.h"

/* Sequences computed by the paper's reference implementation. */
static const struct {
    uint64_t seed;
    uint64_t idx[12];
} golden[] = {
    {1, {1, 2, 3, 6, 11, 19, 44, 116, 122, 341, 972, 3263}},
    {12345, {1, 8, 12, 17, 36, 148, 478, 579, 587, 882, 896, 900}},
    {0xdeadbeefcafebabeULL, {1, 2, 4, 7, 21, 40, 62, 117, 143, 258, 265, 298}},
};

START_TEST(test_golden_sequences)
{
    for (size_t g = 0; g < sizeof(golden) / sizeof(golden[0]); g++) {
        riblt_mapping m;
        riblt_mapping_init(&m, golden[g].seed);
        TU_REQUIRE((m.index) == (0));
        for (int i = 0; i < 12; i++)
            TU_REQUIRE((riblt_mapping_next(&m)) == (golden[g].idx[i]));
    }
}
END_TEST

START_TEST(test_strictly_increasing)
{
    uint64_t s = 7;
    for (int k = 0; k < 2000; k++) {
        riblt_mapping m;
        riblt_mapping_init(&m, tu_next(&s));
        uint64_t last = m.index;
        for (int i = 0; i < 60 && last != UINT64_MAX; i++) {
            uint64_t next = riblt_mapping_next(&m);
            TU_REQUIRE((next) > (last));
            last = next;
        }
    }
}
END_TEST

START_TEST(test_zero_hash_is_not_stuck)
{
    riblt_mapping m;
    riblt_mapping_init(&m, 0);
    ck_assert_uint_ne(m.state, 0);
    uint64_t a = riblt_mapping_next(&m);
    uint64_t b = riblt_mapping_next(&m);
    ck_assert_uint_gt(b, a);
    ck_assert_uint_ne(m.state, 0);
}
END_TEST

START_TEST(test_saturates_without_overflow)
{
    uint64_t s = 99;
    for (int k = 0; k < 1000; k++) {
        riblt_mapping m;
        riblt_mapping_init(&m, tu_next(&s));
        m.index = UINT64_MAX - 1000 + (uint64_t)(k % 1000);
        uint64_t last = m.index;
        for (int i = 0; i < 2000; i++) {
            uint64_t next = riblt_mapping_next(&m);
            TU_REQUIRE((next) >= (last));
            last = next;
        }
        TU_REQUIRE((last) == (UINT64_MAX));
        TU_REQUIRE((riblt_mapping_next(&m)) == (UINT64_MAX));
    }
    /* A huge jump from a large index saturates too (not wraps). */
    riblt_mapping m = {.state = 1, .index = (uint64_t)1 << 62};
    for (int i = 0; i < 200; i++) {
        uint64_t before = m.index;
        TU_REQUIRE((riblt_mapping_next(&m)) >= (before));
    }
}
END_TEST

/*
 * Index i is hit with probability about 1 / (1 + i/2): the reference's
 * closed form ceil((i + 1.5)((1 - u)^-1/2 - 1)) gives exactly 16/25 at
 * index 1 and approaches the ideal further out. With 200000 ids the
 * standard error is below 0.0012, so the bands below cannot fail by chance.
 */
START_TEST(test_distribution)
{
    enum { N = 200000 };
    static const uint64_t probe[] = {1, 2, 3, 10, 100, 1000};
    unsigned hits[6] = {0};
    uint64_t s = 2024;
    for (int k = 0; k < N; k++) {
        riblt_mapping m;
        riblt_mapping_init(&m, tu_next(&s));
        size_t p = 0;
        uint64_t idx = riblt_mapping_next(&m);
        while (p < 6) {
            if (idx == probe[p]) {
                hits[p]++;
                p++;
            } else if (idx > probe[p]) {
                p++;
            } else {
                idx = riblt_mapping_next(&m);
            }
        }
    }
    for (int p = 0; p < 6; p++) {
        double want =
            probe[p] == 1 ? 16.0 / 25.0 : 1.0 / (1.0 + (double)probe[p] / 2.0);
        double got = (double)hits[p] / N;
        double band = 0.006 + 0.03 * want;
        ck_assert_msg(got > want - band && got < want + band,
                      "index %lu: %f, want %f", (unsigned long)probe[p], got,
                      want);
    }
}
END_TEST

START_TEST(test_hash_is_not_xor_linear)
{
    uint64_t s = 5;
    for (int k = 0; k < 10000; k++) {
        riblt_id a = tu_id(&s), b = tu_id(&s);
        riblt_id x = {a.lo ^ b.lo, a.hi ^ b.hi};
        TU_REQUIRE((riblt_hash(&x)) != (riblt_hash(&a) ^ riblt_hash(&b)));
    }
}
END_TEST

static Suite *mapping_suite(void)
{
    Suite *s = suite_create("riblt_mapping");
    TCase *tc = tcase_create("mapping");
    tcase_add_test(tc, test_golden_sequences);
    tcase_add_test(tc, test_strictly_increasing);
    tcase_add_test(tc, test_zero_hash_is_not_stuck);
    tcase_add_test(tc, test_saturates_without_overflow);
    tcase_add_test(tc, test_distribution);
    tcase_add_test(tc, test_hash_is_not_xor_linear);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(mapping_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
