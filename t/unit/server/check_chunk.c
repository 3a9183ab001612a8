/*
 * check_chunk.c -- unit tests of item memory (chunk.c): class sizes close
 * above every request, chunks inside one aligned page and apart from each
 * other, reuse of freed chunks, pages given back once empty, and threads
 * allocating and freeing at once.
 */
#include <check.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "chunk.h"

START_TEST(test_class_sizes)
{
    size_t prev = 0;

    ck_assert_uint_eq(chunk_size(0), 0);
    ck_assert_uint_eq(chunk_size(CHUNK_MAX + 1), 0);
    ck_assert_uint_eq(chunk_size(CHUNK_MAX), CHUNK_MAX);
    for (size_t n = 1; n <= CHUNK_MAX; n++) {
        size_t c = chunk_size(n);
        ck_assert_uint_ge(c, n);
        ck_assert_uint_eq(c % 8, 0);
        ck_assert_uint_ge(c, prev);
        /* At most 8 bytes (past the 16-byte minimum) or 1/7 above the
         * request (the widest step, at the top, is 8 to 9 chunks a page);
         * at most 1/15 from 128 bytes to 4 KiB. */
        size_t most = n + n / 7 > n + 8 ? n + n / 7 : n + 8;
        ck_assert_uint_le(c, most > 16 ? most : 16);
        if (n <= 4096 && n > 128)
            ck_assert_uint_le(c * 15, n * 16);
        prev = c;
    }
    /* The item sizes memfit writes (53-byte header, 17-byte key). */
    ck_assert_uint_eq(chunk_size(53 + 17 + 10), 80);
    ck_assert_uint_eq(chunk_size(53 + 17 + 100), 176);
    ck_assert_uint_eq(chunk_size(53 + 17 + 1000), 1088);
}
END_TEST

START_TEST(test_alloc_free_reuse)
{
    chunk_stats before, mid, after;
    enum { N = 5000 };
    static char *p[N];

    chunk_stats_read(&before);
    for (int i = 0; i < N; i++) {
        p[i] = chunk_alloc(100);
        ck_assert_ptr_nonnull(p[i]);
        ck_assert_uint_eq((uintptr_t)p[i] % 8, 0);
        /* The chunk lies inside one page. */
        uintptr_t page = (uintptr_t)p[i] & ~(uintptr_t)(CHUNK_PAGE - 1);
        ck_assert_uint_le((uintptr_t)p[i] + chunk_size(100),
                          page + CHUNK_PAGE);
        memset(p[i], i & 0xff, 100);
    }
    chunk_stats_read(&mid);
    ck_assert_uint_eq(mid.chunk_bytes - before.chunk_bytes,
                      (uint64_t)N * chunk_size(100));
    /* 5000 chunks of 104 bytes fill 8 pages (629 a page), no more. */
    ck_assert_uint_ge(mid.pages - before.pages, 8);
    ck_assert_uint_le(mid.pages - before.pages, 9);
    /* No two chunks overlap: each still holds its own pattern. */
    for (int i = 0; i < N; i++)
        for (int b = 0; b < 100; b++)
            ck_assert_int_eq((unsigned char)p[i][b], i & 0xff);
    /* A freed chunk is handed out again before a new page is taken. */
    char *again;
    chunk_free(p[17]);
    again = chunk_alloc(97);
    ck_assert_ptr_eq(again, p[17]);
    p[17] = again;
    for (int i = 0; i < N; i++)
        chunk_free(p[i]);
    chunk_stats_read(&after);
    ck_assert_uint_eq(after.chunk_bytes, before.chunk_bytes);
    /* Empty pages go back; the class keeps one. */
    ck_assert_uint_le(after.pages, before.pages + 1);
    chunk_free(NULL);
    ck_assert_ptr_null(chunk_alloc(0));
    ck_assert_ptr_null(chunk_alloc(CHUNK_MAX + 1));
}
END_TEST

START_TEST(test_every_class)
{
    chunk_stats before, after;
    static void *p[CHUNK_MAX / 8 + 1][3];

    chunk_stats_read(&before);
    for (size_t i = 1; i <= CHUNK_MAX / 8; i++)
        for (int k = 0; k < 3; k++) {
            p[i][k] = chunk_alloc(i * 8);
            ck_assert_ptr_nonnull(p[i][k]);
            memset(p[i][k], (int)i, i * 8);
        }
    for (size_t i = 1; i <= CHUNK_MAX / 8; i++)
        for (int k = 0; k < 3; k++) {
            unsigned char *q = p[i][k];
            ck_assert_int_eq(q[0], (unsigned char)i);
            ck_assert_int_eq(q[i * 8 - 1], (unsigned char)i);
            chunk_free(q);
        }
    chunk_stats_read(&after);
    ck_assert_uint_eq(after.chunk_bytes, before.chunk_bytes);
}
END_TEST

struct worker_arg {
    unsigned seed;
    int bad;
};

static void *churn(void *argp)
{
    struct worker_arg *a = argp;
    enum { SLOTS = 512 };
    unsigned char *slot[SLOTS] = {0};
    size_t len[SLOTS] = {0};

    for (int i = 0; i < 200000; i++) {
        int s = (int)(rand_r(&a->seed) % SLOTS);
        if (slot[s] != NULL) {
            for (size_t b = 0; b < len[s]; b += 61)
                if (slot[s][b] != (unsigned char)s)
                    a->bad = 1;
            chunk_free(slot[s]);
            slot[s] = NULL;
        } else {
            len[s] = 1 + rand_r(&a->seed) % 3000;
            slot[s] = chunk_alloc(len[s]);
            if (slot[s] == NULL) {
                a->bad = 1;
                break;
            }
            memset(slot[s], s, len[s]);
        }
    }
    for (int s = 0; s < SLOTS; s++)
        chunk_free(slot[s]);
    return NULL;
}

START_TEST(test_threads)
{
    chunk_stats before, after;
    pthread_t t[3];
    struct worker_arg a[3] = {{1, 0}, {2, 0}, {3, 0}};

    chunk_stats_read(&before);
    for (int i = 0; i < 3; i++)
        ck_assert_int_eq(pthread_create(&t[i], NULL, churn, &a[i]), 0);
    for (int i = 0; i < 3; i++) {
        pthread_join(t[i], NULL);
        ck_assert_int_eq(a[i].bad, 0);
    }
    chunk_stats_read(&after);
    ck_assert_uint_eq(after.chunk_bytes, before.chunk_bytes);
}
END_TEST

static Suite *chunk_suite(void)
{
    Suite *s = suite_create("chunk");
    TCase *tc = tcase_create("core");

    tcase_add_test(tc, test_class_sizes);
    tcase_add_test(tc, test_alloc_free_reuse);
    tcase_add_test(tc, test_every_class);
    tcase_add_test(tc, test_threads);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(chunk_suite());
    int failed;

    srunner_run_all(sr, CK_NORMAL);
    failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
