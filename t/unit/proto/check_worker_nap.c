/*
 * check_worker_nap.c -- unit tests of the rule that decides whether a
 * worker naps after a pass of its event loop (worker_nap_* in worker.c,
 * part of the server library these suites link). t/proto/test_nap.py
 * checks the whole loop against a running daemon.
 */
#include <check.h>
#include <stdlib.h>

#include "worker.h"

/* Runs `passes` passes that (when they follow a nap) find `inputs`
 * connections with requests, `piped` of them with several, and (when
 * they do not) `piped_blocking` connections with several; returns how
 * many naps the rule took. */
static int run(worker_nap *wn, int passes, unsigned inputs, unsigned piped,
               unsigned piped_blocking)
{
    int naps = 0;
    for (int i = 0; i < passes; i++) {
        bool after_nap = wn->napping;
        unsigned in = after_nap ? inputs : 1;
        unsigned pp = after_nap ? piped : piped_blocking;
        if (worker_nap_next(wn, in, pp)) {
            naps++;
        }
    }
    return naps;
}

START_TEST(test_requests_one_at_a_time_never_nap)
{
    worker_nap wn;
    worker_nap_init(&wn);
    /* Each still needs its own read and write: nothing to gather. */
    ck_assert(!worker_nap_next(&wn, 1, 0));
    ck_assert(!worker_nap_next(&wn, 50, 0));
    ck_assert_int_eq(run(&wn, 1000, 50, 0, 0), 0);
}
END_TEST

START_TEST(test_pipelining_starts_a_nap)
{
    worker_nap wn;
    worker_nap_init(&wn);
    ck_assert(worker_nap_next(&wn, 1, 1));
    ck_assert(wn.napping);
    /* The pass after it found several connections, one pipelining: on. */
    ck_assert(worker_nap_next(&wn, 5, 1));
    /* One that found a single connection ends the naps. */
    ck_assert(!worker_nap_next(&wn, 1, 1));
    ck_assert(!wn.napping);
}
END_TEST

START_TEST(test_naps_that_find_little_become_rare)
{
    worker_nap wn;
    worker_nap_init(&wn);
    /* A lone pipelining client: each nap's pass finds that one
     * connection. After a few, one chance in sixteen starts a nap: the
     * nap, its own pass and fifteen chances passed by make 17 passes. */
    run(&wn, 64 * 17, 1, 1, 1);
    ck_assert_int_eq(run(&wn, 1700, 1, 1, 1), 100);
    /* Naps that find nothing at all: the same. */
    ck_assert_int_eq(run(&wn, 1700, 0, 0, 1), 100);
}
END_TEST

START_TEST(test_naps_that_gather_come_back)
{
    worker_nap wn;
    worker_nap_init(&wn);
    run(&wn, 1600, 1, 1, 1); /* rare */
    /* Probing naps that find eight connections bring them back. */
    int passes = 0;
    while (passes < 1000 && run(&wn, 16, 8, 2, 1) < 8)
        passes += 16;
    ck_assert_int_lt(passes, 1000);
    /* Then every pass naps: each nap's pass keeps the next one. */
    ck_assert_int_eq(run(&wn, 1000, 8, 2, 1), 1000);
}
END_TEST

static Suite *worker_nap_suite(void)
{
    Suite *s = suite_create("worker_nap");
    TCase *tc = tcase_create("rule");
    tcase_add_test(tc, test_requests_one_at_a_time_never_nap);
    tcase_add_test(tc, test_pipelining_starts_a_nap);
    tcase_add_test(tc, test_naps_that_find_little_become_rare);
    tcase_add_test(tc, test_naps_that_gather_come_back);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(worker_nap_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
