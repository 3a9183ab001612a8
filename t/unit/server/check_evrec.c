/*
 * check_evrec.c -- unit tests of the compact record table: one entry per
 * gid, oldest-first eviction when full, removal leaving holes the ring
 * skips, walks with a cursor, and a randomized comparison with a model.
 */
#include <check.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "evrec.h"

static evrec_entry ent(uint64_t gid, uint64_t ticks)
{
    evrec_entry e;
    memset(&e, 0, sizeof(e));
    e.gid = gid;
    e.ticks = ticks;
    e.node = (uint32_t)(gid * 3);
    e.exptime = (uint32_t)gid;
    e.part = (uint16_t)(gid & 0xffff);
    e.kind = (uint8_t)(gid & 3);
    return e;
}

START_TEST(test_put_find_remove)
{
    evrec *t = evrec_create(4, 7);
    evrec_entry e = ent(10, 100), got;

    ck_assert_ptr_nonnull(t);
    ck_assert_uint_eq(evrec_capacity(t), 4);
    ck_assert(!evrec_find(t, 10, &got));
    ck_assert(!evrec_put(t, &e, NULL));
    ck_assert(evrec_find(t, 10, &got));
    ck_assert_uint_eq(got.ticks, 100);
    ck_assert_uint_eq(got.node, 30);
    ck_assert_uint_eq(got.exptime, 10);
    ck_assert_uint_eq(got.part, 10);
    ck_assert_uint_eq(got.kind, 2);
    /* A second put for the gid replaces the first. */
    e.ticks = 101;
    ck_assert(!evrec_put(t, &e, NULL));
    ck_assert_uint_eq(evrec_count(t), 1);
    ck_assert(evrec_find(t, 10, &got));
    ck_assert_uint_eq(got.ticks, 101);
    ck_assert(evrec_remove(t, 10, &got));
    ck_assert_uint_eq(got.ticks, 101);
    ck_assert(!evrec_remove(t, 10, NULL));
    ck_assert_uint_eq(evrec_count(t), 0);
    /* gid 0 is never an entry. */
    e.gid = 0;
    ck_assert(!evrec_put(t, &e, NULL));
    ck_assert(!evrec_find(t, 0, NULL));
    ck_assert_uint_eq(evrec_count(t), 0);
    ck_assert_ptr_null(evrec_create(0, 1));
    evrec_destroy(t);
}
END_TEST

START_TEST(test_full_drops_oldest)
{
    evrec *t = evrec_create(3, 1);
    evrec_entry e, out;

    for (uint64_t g = 1; g <= 3; g++) {
        e = ent(g, g);
        ck_assert(!evrec_put(t, &e, NULL));
    }
    e = ent(4, 4);
    ck_assert(evrec_put(t, &e, &out));
    ck_assert_uint_eq(out.gid, 1);
    ck_assert(!evrec_find(t, 1, NULL));
    /* A hole (2 removed) is reused before anything else goes. */
    ck_assert(evrec_remove(t, 2, NULL));
    e = ent(5, 5);
    ck_assert(!evrec_put(t, &e, NULL));
    ck_assert_uint_eq(evrec_count(t), 3);
    e = ent(6, 6);
    ck_assert(evrec_put(t, &e, &out));
    ck_assert_uint_eq(out.gid, 3);
    /* Replacing an entry makes it the newest. */
    e = ent(4, 40);
    ck_assert(!evrec_put(t, &e, NULL));
    e = ent(7, 7);
    ck_assert(evrec_put(t, &e, &out));
    ck_assert_uint_eq(out.gid, 5);
    ck_assert(evrec_find(t, 4, &out));
    ck_assert_uint_eq(out.ticks, 40);
    evrec_destroy(t);
}
END_TEST

static bool drop_even(void *arg, const evrec_entry *e)
{
    size_t *seen = arg;
    (*seen)++;
    return (e->gid & 1) == 0;
}

START_TEST(test_walk)
{
    evrec *t = evrec_create(16, 3);
    uint64_t cur = 0;
    size_t seen = 0, removed = 0;

    for (uint64_t g = 1; g <= 10; g++) {
        evrec_entry e = ent(g, g);
        evrec_put(t, &e, NULL);
    }
    /* Budget 4 at a time: all ten seen once, the cursor back at 0. */
    for (int i = 0; i < 10 && (i == 0 || cur != 0); i++)
        removed += evrec_walk(t, &cur, 4, drop_even, &seen);
    ck_assert_uint_eq(cur, 0);
    ck_assert_uint_eq(seen, 10);
    ck_assert_uint_eq(removed, 5);
    ck_assert_uint_eq(evrec_count(t), 5);
    for (uint64_t g = 1; g <= 10; g++)
        ck_assert(evrec_find(t, g, NULL) == ((g & 1) == 1));
    evrec_destroy(t);
}
END_TEST

/* Random operations against a plain model: same contents, same victims. */
START_TEST(test_model)
{
    enum { CAP = 64, GIDS = 200, OPS = 200000 };
    evrec *t = evrec_create(CAP, 99);
    uint64_t order[GIDS + 1]; /* model: put sequence number, 0 = absent */
    uint64_t seq = 0, x = 88172645463325252ULL;

    memset(order, 0, sizeof(order));
    for (int op = 0; op < OPS; op++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        uint64_t g = 1 + x % GIDS;
        if ((x >> 32) % 3 == 0) {
            bool had = order[g] != 0;
            ck_assert(evrec_remove(t, g, NULL) == had);
            order[g] = 0;
            continue;
        }
        size_t n = 0;
        uint64_t oldest = 0, og = 0;
        for (uint64_t i = 1; i <= GIDS; i++) {
            if (order[i] == 0 || i == g)
                continue;
            n++;
            if (oldest == 0 || order[i] < oldest) {
                oldest = order[i];
                og = i;
            }
        }
        evrec_entry e = ent(g, (uint64_t)op), out;
        bool dropped = evrec_put(t, &e, &out);
        /* Full: the oldest goes. Holes may cost up to a quarter. */
        if (n == CAP)
            ck_assert(dropped);
        if (n < CAP - CAP / 4)
            ck_assert(!dropped);
        if (dropped) {
            ck_assert_uint_eq(out.gid, og);
            order[og] = 0;
        }
        order[g] = ++seq;
    }
    size_t n = 0;
    for (uint64_t i = 1; i <= GIDS; i++) {
        ck_assert(evrec_find(t, i, NULL) == (order[i] != 0));
        n += order[i] != 0;
    }
    ck_assert_uint_eq(evrec_count(t), n);
    evrec_destroy(t);
}
END_TEST

static Suite *evrec_suite(void)
{
    Suite *s = suite_create("evrec");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_put_find_remove);
    tcase_add_test(tc, test_full_drops_oldest);
    tcase_add_test(tc, test_walk);
    tcase_add_test(tc, test_model);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(evrec_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
