/*
 * check_evrec.c -- unit tests of the compact record table: one entry per
 * gid, oldest-first eviction when full, removal leaving holes the ring
 * skips, walks with a cursor, and a randomized comparison with a model;
 * for ordered tables, the least entry goes, what a full table holds does
 * not depend on the order entries came in, and a model comparison.
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

/* An entry with the given expiry (the ordered tables' first key). */
static evrec_entry ent_at(uint64_t gid, uint32_t exptime)
{
    evrec_entry e = ent(gid, gid * 10);
    e.exptime = exptime;
    return e;
}

START_TEST(test_ordered_least_goes)
{
    evrec *t = evrec_create_ordered(3, 5);
    evrec_entry e, out;

    ck_assert_ptr_nonnull(t);
    e = ent_at(1, 50);
    ck_assert(!evrec_put(t, &e, NULL));
    e = ent_at(2, 30);
    ck_assert(!evrec_put(t, &e, NULL));
    e = ent_at(3, 40);
    ck_assert(!evrec_put(t, &e, NULL));
    /* Full: the least (expiry 30), not the first put, goes. */
    e = ent_at(4, 45);
    ck_assert(evrec_admits(t, &e));
    ck_assert(evrec_put(t, &e, &out));
    ck_assert_uint_eq(out.gid, 2);
    /* Below everything held: not let in; put reports it as given up and
     * the table is unchanged. */
    e = ent_at(5, 10);
    ck_assert(!evrec_admits(t, &e));
    ck_assert(evrec_put(t, &e, &out));
    ck_assert_uint_eq(out.gid, 5);
    ck_assert(!evrec_find(t, 5, NULL));
    ck_assert_uint_eq(evrec_count(t), 3);
    /* Equal expiries: the gid decides. */
    e = ent_at(6, 40);
    ck_assert(evrec_put(t, &e, &out));
    ck_assert_uint_eq(out.gid, 3);
    e = ent_at(0x10, 40);
    ck_assert(evrec_put(t, &e, &out));
    ck_assert_uint_eq(out.gid, 6);
    /* A gid it holds is always let in (a replacement). */
    e = ent_at(1, 5);
    ck_assert(evrec_admits(t, &e));
    ck_assert(!evrec_put(t, &e, NULL));
    ck_assert(evrec_find(t, 1, &out));
    ck_assert_uint_eq(out.exptime, 5);
    /* Removal frees a slot for the next put. */
    ck_assert(evrec_remove(t, 4, NULL));
    e = ent_at(7, 1);
    ck_assert(!evrec_put(t, &e, NULL));
    ck_assert_uint_eq(evrec_count(t), 3);
    /* Resizing keeps every entry and the order. */
    ck_assert_int_eq(evrec_resize(t, 8), 0);
    ck_assert_uint_eq(evrec_count(t), 3);
    ck_assert_int_eq(evrec_resize(t, 3), 0);
    e = ent_at(8, 100);
    ck_assert(evrec_put(t, &e, &out));
    ck_assert_uint_eq(out.gid, 7);
    evrec_destroy(t);
}
END_TEST

static uint64_t xorshift(uint64_t *x)
{
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    return *x;
}

/* Two full tables fed the same entries in different orders end up with
 * the same entries: the ones of greatest (expiry, gid). */
START_TEST(test_ordered_order_free)
{
    enum { CAP = 100, N = 1000 };
    evrec *a = evrec_create_ordered(CAP, 1), *b = evrec_create_ordered(CAP, 2);
    evrec_entry es[N];
    uint64_t x = 0x9e3779b97f4a7c15ULL;

    for (int i = 0; i < N; i++)
        es[i] = ent_at((uint64_t)i + 1, (uint32_t)(xorshift(&x) % 60));
    for (int i = 0; i < N; i++)
        evrec_put(a, &es[i], NULL);
    /* b: in a shuffled order, some entries twice. */
    int idx[N];
    for (int i = 0; i < N; i++)
        idx[i] = i;
    for (int i = N - 1; i > 0; i--) {
        int j = (int)(xorshift(&x) % (uint64_t)(i + 1)), tmp = idx[i];
        idx[i] = idx[j];
        idx[j] = tmp;
    }
    for (int i = 0; i < N; i++) {
        evrec_put(b, &es[idx[i]], NULL);
        if (i % 7 == 0)
            evrec_put(b, &es[idx[i / 2]], NULL);
    }
    ck_assert_uint_eq(evrec_count(a), CAP);
    ck_assert_uint_eq(evrec_count(b), CAP);
    /* Which ones: the CAP greatest keys. */
    int kept = 0;
    for (int i = 0; i < N; i++) {
        int above = 0;
        for (int j = 0; j < N; j++)
            above += es[j].exptime > es[i].exptime ||
                     (es[j].exptime == es[i].exptime && es[j].gid > es[i].gid);
        bool want = above < CAP;
        ck_assert(evrec_find(a, es[i].gid, NULL) == want);
        ck_assert(evrec_find(b, es[i].gid, NULL) == want);
        kept += want;
    }
    ck_assert_int_eq(kept, CAP);
    evrec_destroy(a);
    evrec_destroy(b);
}
END_TEST

/* Random puts, removals and walks against a model of an ordered table. */
START_TEST(test_ordered_model)
{
    enum { CAP = 48, GIDS = 160, OPS = 100000 };
    evrec *t = evrec_create_ordered(CAP, 42);
    uint32_t held[GIDS + 1]; /* model: expiry + 1, 0 = absent */
    uint64_t x = 1234567;

    memset(held, 0, sizeof(held));
    for (int op = 0; op < OPS; op++) {
        uint64_t r = xorshift(&x), g = 1 + r % GIDS;
        uint32_t exp = (uint32_t)((r >> 20) % 40);
        if ((r >> 40) % 4 == 0) {
            ck_assert(evrec_remove(t, g, NULL) == (held[g] != 0));
            held[g] = 0;
            continue;
        }
        if ((r >> 40) % 97 == 1) {
            /* A walk that removes even gids: the model follows. */
            uint64_t cur = 0;
            size_t seen = 0;
            do
                evrec_walk(t, &cur, 16, drop_even, &seen);
            while (cur != 0);
            for (uint64_t i = 2; i <= GIDS; i += 2)
                held[i] = 0;
            continue;
        }
        /* The model's least entry other than g's, and how many are held. */
        size_t n = 0;
        uint64_t lg = 0;
        for (uint64_t i = 1; i <= GIDS; i++) {
            if (held[i] == 0 || i == g)
                continue;
            n++;
            if (lg == 0 || held[i] < held[lg] ||
                (held[i] == held[lg] && i < lg))
                lg = i;
        }
        evrec_entry e = ent_at(g, exp), out;
        bool in =
            n < CAP || exp + 1 > held[lg] || (exp + 1 == held[lg] && g > lg);
        ck_assert(evrec_admits(t, &e) == (in || held[g] != 0));
        bool dropped = evrec_put(t, &e, &out);
        held[g] = 0;
        if (n == CAP) {
            ck_assert(dropped);
            ck_assert_uint_eq(out.gid, in ? lg : g);
            if (in) {
                held[lg] = 0;
                held[g] = exp + 1;
            }
        } else {
            ck_assert(!dropped);
            held[g] = exp + 1;
        }
    }
    size_t n = 0;
    for (uint64_t i = 1; i <= GIDS; i++) {
        evrec_entry got;
        ck_assert(evrec_find(t, i, &got) == (held[i] != 0));
        if (held[i] != 0)
            ck_assert_uint_eq(got.exptime + 1, held[i]);
        n += held[i] != 0;
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
    tcase_add_test(tc, test_ordered_least_goes);
    tcase_add_test(tc, test_ordered_order_free);
    tcase_add_test(tc, test_ordered_model);
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
