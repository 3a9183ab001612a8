/*
 * check_decoder.c -- exact recovery of set differences, and the decoder's
 * behaviour on input no two honest sets can produce.
 */
#include <check.h>
#include <stdlib.h>

#include "riblt.h"
#include "testutil.h"

/* Two sets: a common part plus ids only A (remote) and only B (local) hold. */
struct pair {
    riblt_id *a_only, *b_only, *common;
    size_t na, nb, nc;
};

static void pair_make(struct pair *p, size_t na, size_t nb, size_t nc,
                      uint64_t seed)
{
    p->na = na;
    p->nb = nb;
    p->nc = nc;
    p->a_only = malloc((na + 1) * sizeof(riblt_id));
    p->b_only = malloc((nb + 1) * sizeof(riblt_id));
    p->common = malloc((nc + 1) * sizeof(riblt_id));
    ck_assert_ptr_nonnull(p->a_only);
    ck_assert_ptr_nonnull(p->b_only);
    ck_assert_ptr_nonnull(p->common);
    for (size_t i = 0; i < na; i++)
        p->a_only[i] = tu_id(&seed);
    for (size_t i = 0; i < nb; i++)
        p->b_only[i] = tu_id(&seed);
    for (size_t i = 0; i < nc; i++)
        p->common[i] = tu_id(&seed);
}

static void pair_free(struct pair *p)
{
    free(p->a_only);
    free(p->b_only);
    free(p->common);
}

static void add_all(riblt_encoder *e, const riblt_id *ids, size_t n)
{
    for (size_t i = 0; i < n; i++)
        TU_REQUIRE((riblt_encoder_add(e, &ids[i])) == (RIBLT_OK));
}

/* Checks the decoder found exactly A \ B (remote) and B \ A (local). */
static void expect_exact(riblt_decoder *dec, struct pair *p)
{
    size_t nr, nl;
    const riblt_id *r = riblt_decoder_remote(dec, &nr);
    const riblt_id *l = riblt_decoder_local(dec, &nl);
    riblt_id *rc = malloc((nr + 1) * sizeof(*rc));
    riblt_id *lc = malloc((nl + 1) * sizeof(*lc));
    memcpy(rc, r, nr * sizeof(*rc));
    memcpy(lc, l, nl * sizeof(*lc));
    ck_assert_uint_eq(nr, p->na);
    ck_assert_uint_eq(nl, p->nb);
    ck_assert(tu_same_set(rc, nr, p->a_only, p->na));
    ck_assert(tu_same_set(lc, nl, p->b_only, p->nb));
    free(rc);
    free(lc);
}

/*
 * One trial in "coded" mode: A's encoder streams full symbols, the decoder
 * holds B and subtracts it. Returns the number of symbols used.
 */
static size_t trial_coded(size_t d, size_t common, uint64_t seed)
{
    struct pair p;
    pair_make(&p, (d + 1) / 2, d / 2, common, seed);
    riblt_encoder *enc = riblt_encoder_create(p.na + p.nc);
    size_t cap = 3 * d + 64;
    riblt_decoder *dec = riblt_decoder_create(cap);
    ck_assert_ptr_nonnull(enc);
    ck_assert_ptr_nonnull(dec);
    add_all(enc, p.a_only, p.na);
    add_all(enc, p.common, p.nc);
    for (size_t i = 0; i < p.nb; i++)
        TU_REQUIRE((riblt_decoder_add_local(dec, &p.b_only[i])) == (0));
    for (size_t i = 0; i < p.nc; i++)
        TU_REQUIRE((riblt_decoder_add_local(dec, &p.common[i])) == (0));
    int rc = RIBLT_NEED_MORE;
    while (rc == RIBLT_NEED_MORE) {
        riblt_symbol s;
        TU_REQUIRE((riblt_encoder_produce(enc, &s, 1)) == (RIBLT_OK));
        TU_REQUIRE((riblt_decoder_add_coded(dec, &s)) == (RIBLT_OK));
        rc = riblt_decoder_decode(dec);
    }
    ck_assert_int_eq(rc, RIBLT_OK);
    expect_exact(dec, &p);
    size_t used = riblt_decoder_symbols(dec);
    riblt_encoder_destroy(enc);
    riblt_decoder_destroy(dec);
    pair_free(&p);
    return used;
}

/*
 * One trial in "difference" mode: both sides run encoders, the caller
 * subtracts its own symbol from the remote one, in batches (64 symbols, or
 * 1024 for large differences, as replication does).
 */
static size_t trial_diff(size_t d, size_t common, uint64_t seed)
{
    struct pair p;
    pair_make(&p, d / 2, (d + 1) / 2, common, seed);
    riblt_encoder *ea = riblt_encoder_create(0);
    riblt_encoder *eb = riblt_encoder_create(0);
    riblt_decoder *dec = riblt_decoder_create(3 * d + 2048);
    add_all(ea, p.a_only, p.na);
    add_all(ea, p.common, p.nc);
    add_all(eb, p.b_only, p.nb);
    add_all(eb, p.common, p.nc);
    size_t batch = d >= 10000 ? 1024 : 64;
    riblt_symbol *sa = malloc(batch * sizeof(*sa));
    riblt_symbol *sb = malloc(batch * sizeof(*sb));
    int rc = RIBLT_NEED_MORE;
    while (rc == RIBLT_NEED_MORE) {
        TU_REQUIRE(riblt_encoder_produce(ea, sa, batch) == RIBLT_OK);
        TU_REQUIRE(riblt_encoder_produce(eb, sb, batch) == RIBLT_OK);
        for (size_t i = 0; i < batch; i++) {
            riblt_symbol x;
            riblt_symbol_subtract(&x, &sa[i], &sb[i]);
            TU_REQUIRE(riblt_decoder_add_diff(dec, &x) == RIBLT_OK);
        }
        rc = riblt_decoder_decode(dec);
    }
    ck_assert_int_eq(rc, RIBLT_OK);
    expect_exact(dec, &p);
    size_t used = riblt_decoder_symbols(dec);
    free(sa);
    free(sb);
    riblt_encoder_destroy(ea);
    riblt_encoder_destroy(eb);
    riblt_decoder_destroy(dec);
    pair_free(&p);
    return used;
}

static const size_t small_d[] = {0, 1, 2, 3, 10, 100};

START_TEST(test_small_differences)
{
    size_t d = small_d[_i];
    for (int t = 0; t < 20; t++) {
        trial_coded(d, 1000, 100 * d + t);
        trial_diff(d, 10000, 7000 + 100 * d + t);
    }
}
END_TEST

START_TEST(test_d1000)
{
    for (int t = 0; t < 4; t++) {
        trial_coded(1000, 10000, 11 + t);
        trial_diff(1000, 100000, 21 + t);
    }
}
END_TEST

START_TEST(test_d10000)
{
    trial_coded(10000, 100000, 31);
    trial_diff(10000, 10000, 32);
}
END_TEST

/* 100000 differences over a common part of a million ids. */
START_TEST(test_d100000)
{
    trial_diff(100000, 1000000, 41);
}
END_TEST

START_TEST(test_identical_sets_one_symbol)
{
    struct pair p;
    pair_make(&p, 0, 0, 5000, 3);
    riblt_encoder *enc = riblt_encoder_create(0);
    riblt_decoder *dec = riblt_decoder_create(16);
    add_all(enc, p.common, p.nc);
    for (size_t i = 0; i < p.nc; i++)
        riblt_decoder_add_local(dec, &p.common[i]);
    riblt_symbol s;
    riblt_encoder_produce(enc, &s, 1);
    ck_assert_int_eq(s.count, 5000);
    ck_assert_int_eq(riblt_decoder_add_coded(dec, &s), RIBLT_OK);
    ck_assert_int_eq(riblt_decoder_decode(dec), RIBLT_OK);
    ck_assert_uint_eq(riblt_decoder_symbols(dec), 1);
    expect_exact(dec, &p);
    riblt_encoder_destroy(enc);
    riblt_decoder_destroy(dec);
    pair_free(&p);
}
END_TEST

START_TEST(test_empty_sets)
{
    riblt_encoder *enc = riblt_encoder_create(0);
    riblt_decoder *dec = riblt_decoder_create(4);
    ck_assert_int_eq(riblt_decoder_decode(dec), RIBLT_NEED_MORE);
    riblt_symbol s;
    riblt_encoder_produce(enc, &s, 1);
    ck_assert(riblt_symbol_is_zero(&s));
    ck_assert_int_eq(riblt_decoder_add_coded(dec, &s), RIBLT_OK);
    ck_assert_int_eq(riblt_decoder_decode(dec), RIBLT_OK);
    size_t n;
    riblt_decoder_remote(dec, &n);
    ck_assert_uint_eq(n, 0);
    riblt_decoder_local(dec, &n);
    ck_assert_uint_eq(n, 0);
    /* Done: further symbols are a call-order error until reset. */
    ck_assert_int_eq(riblt_decoder_add_coded(dec, &s), RIBLT_ERR_ORDER);
    riblt_decoder_reset(dec);
    ck_assert_int_eq(riblt_decoder_add_coded(dec, &s), RIBLT_OK);
    riblt_encoder_destroy(enc);
    riblt_decoder_destroy(dec);
}
END_TEST

/*
 * An id added twice leaves count 2 and no sum behind: no honest pair of
 * sets gives that, so the decoder must never claim success; it runs into
 * its cap instead.
 */
START_TEST(test_id_added_twice)
{
    uint64_t seed = 77;
    riblt_id x = tu_id(&seed);
    riblt_encoder *enc = riblt_encoder_create(0);
    riblt_decoder *dec = riblt_decoder_create(200);
    ck_assert_int_eq(riblt_encoder_add(enc, &x), RIBLT_OK);
    ck_assert_int_eq(riblt_encoder_add(enc, &x), RIBLT_OK);
    for (int i = 0; i < 20; i++) {
        riblt_id y = tu_id(&seed);
        riblt_encoder_add(enc, &y);
    }
    int rc = RIBLT_NEED_MORE;
    size_t fed = 0;
    while (rc == RIBLT_NEED_MORE) {
        riblt_symbol s;
        riblt_encoder_produce(enc, &s, 1);
        rc = riblt_decoder_add_coded(dec, &s);
        if (rc != RIBLT_OK)
            break;
        fed++;
        rc = riblt_decoder_decode(dec);
    }
    ck_assert_int_ne(rc, RIBLT_OK);
    ck_assert(rc == RIBLT_ERR_FULL || rc == RIBLT_ERR_CORRUPT);
    ck_assert_uint_le(fed, 200);
    riblt_encoder_destroy(enc);
    riblt_decoder_destroy(dec);
}
END_TEST

START_TEST(test_corrupted_symbol)
{
    struct pair p;
    pair_make(&p, 10, 10, 1000, 5);
    riblt_encoder *ea = riblt_encoder_create(0);
    riblt_decoder *dec = riblt_decoder_create(400);
    add_all(ea, p.a_only, p.na);
    add_all(ea, p.common, p.nc);
    for (size_t i = 0; i < p.nb; i++)
        riblt_decoder_add_local(dec, &p.b_only[i]);
    for (size_t i = 0; i < p.nc; i++)
        riblt_decoder_add_local(dec, &p.common[i]);
    int rc = RIBLT_NEED_MORE;
    for (int i = 0; rc == RIBLT_NEED_MORE; i++) {
        riblt_symbol s;
        riblt_encoder_produce(ea, &s, 1);
        if (i == 3)
            s.sum.lo ^= 0x10; /* one flipped bit in transit */
        rc = riblt_decoder_add_coded(dec, &s);
        if (rc != RIBLT_OK)
            break;
        rc = riblt_decoder_decode(dec);
    }
    ck_assert(rc == RIBLT_ERR_CORRUPT || rc == RIBLT_ERR_FULL);
    /* A failed decoder keeps failing and refuses symbols. */
    if (rc == RIBLT_ERR_CORRUPT) {
        riblt_symbol z = {{0, 0}, 0, 0};
        TU_REQUIRE((riblt_decoder_decode(dec)) == (RIBLT_ERR_CORRUPT));
        TU_REQUIRE((riblt_decoder_add_coded(dec, &z)) == (RIBLT_ERR_ORDER));
    }
    riblt_encoder_destroy(ea);
    riblt_decoder_destroy(dec);
    pair_free(&p);
}
END_TEST

/* Random garbage, counts of +-1/+-2 with matching or random checksums. */
START_TEST(test_garbage_is_bounded)
{
    uint64_t seed = 1234 + (uint64_t)_i;
    riblt_decoder *dec = riblt_decoder_create(5000);
    for (int i = 0; i < 6000; i++) {
        riblt_symbol s;
        s.sum = tu_id(&seed);
        uint64_t r = tu_next(&seed);
        s.count = (int64_t)(r % 5) - 2;
        /* Half of them look pure. */
        s.hash = (r & 8) ? riblt_hash(&s.sum) : tu_next(&seed);
        int rc = riblt_decoder_add_diff(dec, &s);
        if (rc != RIBLT_OK) {
            TU_REQUIRE(rc == RIBLT_ERR_FULL || rc == RIBLT_ERR_ORDER);
            break;
        }
        rc = riblt_decoder_decode(dec);
        ck_assert(rc == RIBLT_NEED_MORE || rc == RIBLT_ERR_CORRUPT ||
                  rc == RIBLT_OK);
        if (rc != RIBLT_NEED_MORE)
            break;
    }
    size_t nr, nl;
    riblt_decoder_remote(dec, &nr);
    riblt_decoder_local(dec, &nl);
    ck_assert_uint_le(nr + nl, 5000);
    ck_assert_uint_le(riblt_decoder_symbols(dec), 5000);
    riblt_decoder_destroy(dec);
}
END_TEST

/* The same id arriving pure in several cells (a replayed symbol). */
START_TEST(test_duplicate_pure_cells)
{
    uint64_t seed = 8;
    riblt_id x = tu_id(&seed);
    riblt_symbol s = {x, riblt_hash(&x), 1};
    riblt_decoder *dec = riblt_decoder_create(64);
    int rc = RIBLT_OK;
    for (int i = 0; i < 64 && rc == RIBLT_OK; i++) {
        rc = riblt_decoder_add_diff(dec, &s);
        if (rc == RIBLT_OK) {
            int d = riblt_decoder_decode(dec);
            ck_assert(d == RIBLT_NEED_MORE || d == RIBLT_ERR_CORRUPT ||
                      d == RIBLT_OK);
            if (d != RIBLT_NEED_MORE)
                break;
        }
    }
    size_t nr;
    riblt_decoder_remote(dec, &nr);
    ck_assert_uint_le(nr, 64);
    riblt_decoder_destroy(dec);
}
END_TEST

START_TEST(test_call_order)
{
    uint64_t seed = 1;
    riblt_id x = tu_id(&seed);
    riblt_symbol z = {{0, 0}, 0, 0};
    riblt_decoder *dec = riblt_decoder_create(8);
    ck_assert_int_eq(riblt_decoder_add_local(dec, &x), RIBLT_OK);
    ck_assert_int_eq(riblt_decoder_add_diff(dec, &z), RIBLT_ERR_ORDER);
    ck_assert_int_eq(riblt_decoder_add_coded(dec, &z), RIBLT_OK);
    ck_assert_int_eq(riblt_decoder_add_local(dec, &x), RIBLT_ERR_ORDER);
    ck_assert_int_eq(riblt_decoder_add_diff(dec, &z), RIBLT_ERR_ORDER);
    riblt_decoder_reset(dec);
    ck_assert_int_eq(riblt_decoder_add_diff(dec, &z), RIBLT_OK);
    ck_assert_int_eq(riblt_decoder_add_coded(dec, &z), RIBLT_ERR_ORDER);
    for (int i = 1; i < 8; i++)
        TU_REQUIRE((riblt_decoder_add_diff(dec, &z)) == (RIBLT_OK));
    ck_assert_int_eq(riblt_decoder_add_diff(dec, &z), RIBLT_ERR_FULL);
    ck_assert_ptr_null(riblt_decoder_create(0));
    ck_assert_int_eq(riblt_decoder_add_diff(NULL, &z), RIBLT_ERR_INVAL);
    riblt_decoder_destroy(dec);
}
END_TEST

static Suite *decoder_suite(void)
{
    Suite *s = suite_create("riblt_decoder");
    TCase *tc = tcase_create("recovery");
    tcase_set_timeout(tc, 300);
    tcase_add_loop_test(tc, test_small_differences, 0,
                        sizeof(small_d) / sizeof(small_d[0]));
    tcase_add_test(tc, test_d1000);
    tcase_add_test(tc, test_d10000);
    tcase_add_test(tc, test_d100000);
    suite_add_tcase(s, tc);
    TCase *te = tcase_create("edges");
    tcase_add_test(te, test_identical_sets_one_symbol);
    tcase_add_test(te, test_empty_sets);
    tcase_add_test(te, test_id_added_twice);
    tcase_add_test(te, test_corrupted_symbol);
    tcase_add_loop_test(te, test_garbage_is_bounded, 0, 8);
    tcase_add_test(te, test_duplicate_pure_cells);
    tcase_add_test(te, test_call_order);
    suite_add_tcase(s, te);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(decoder_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
