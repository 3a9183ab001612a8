/*
 * check_worker_poll.c -- unit tests of the rule that keeps a worker's idle
 * poll only while it pays (worker_poll_* in worker.c, part of the server
 * library these suites link): a fresh worker polls; windows that catch one
 * input each turn the poll off, leaving one wait in sixteen to look again;
 * windows that catch several turn it back on through those looks; two a
 * window keeps it on.
 */
#include <check.h>
#include <stdlib.h>

#include "worker.h"

/* Runs `waits` waits whose polling windows (when the rule polls) catch
 * `hits` inputs each; returns how many of them polled. */
static int run(worker_poll *wp, int waits, int hits)
{
    int polled = 0;
    for (int i = 0; i < waits; i++) {
        if (worker_poll_now(wp)) {
            polled++;
            worker_poll_done(wp, hits);
        }
    }
    return polled;
}

START_TEST(test_fresh_worker_polls)
{
    worker_poll wp;
    worker_poll_init(&wp);
    ck_assert(worker_poll_now(&wp));
    worker_poll_done(&wp, 3);
    ck_assert(worker_poll_now(&wp));
}
END_TEST

START_TEST(test_one_hit_windows_turn_it_off)
{
    worker_poll wp;
    worker_poll_init(&wp);
    /* The first window with a single catch already tips the average. */
    ck_assert_int_eq(run(&wp, 1, 1), 1);
    ck_assert(!worker_poll_now(&wp));
    /* From then on, one wait in sixteen polls. */
    worker_poll_init(&wp);
    run(&wp, 64, 1);
    ck_assert_int_eq(run(&wp, 1600, 1), 100);
    /* Windows that catch nothing: the same. */
    ck_assert_int_eq(run(&wp, 1600, 0), 100);
}
END_TEST

START_TEST(test_busy_windows_turn_it_back_on)
{
    worker_poll wp;
    worker_poll_init(&wp);
    run(&wp, 1600, 1); /* off */
    ck_assert_int_eq(run(&wp, 16, 4), 1);
    /* A few looks at four catches a window bring it back, for good. */
    int waits = 0;
    while (waits < 1000 && run(&wp, 16, 4) < 16)
        waits += 16;
    ck_assert_int_lt(waits, 1000);
    ck_assert_int_eq(run(&wp, 1000, 4), 1000);
}
END_TEST

START_TEST(test_two_hits_keep_it_on)
{
    worker_poll wp;
    worker_poll_init(&wp);
    ck_assert_int_eq(run(&wp, 1000, 2), 1000);
    /* One lean window among busy ones does not turn it off. */
    worker_poll_init(&wp);
    run(&wp, 100, 4);
    ck_assert_int_eq(run(&wp, 1, 1), 1);
    ck_assert(worker_poll_now(&wp));
}
END_TEST

static Suite *worker_poll_suite(void)
{
    Suite *s = suite_create("worker_poll");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_fresh_worker_polls);
    tcase_add_test(tc, test_one_hit_windows_turn_it_off);
    tcase_add_test(tc, test_busy_windows_turn_it_back_on);
    tcase_add_test(tc, test_two_hits_keep_it_on);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(worker_poll_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
