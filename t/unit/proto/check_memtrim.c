/*
 * check_memtrim.c -- unit tests of memtrim (server/memtrim.c): after a
 * burst of allocations is freed, the pages the allocator keeps count as
 * unused, a slack above them leaves them alone, and a trim gives them
 * back, which the process's resident size shows. Without jemalloc
 * (sanitizer builds) both calls report nothing.
 */
#include <check.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "memtrim.h"

#define BLOCKS 64
#define BLOCK (1u << 20)

/* Allocates, touches and frees BLOCKS blocks of BLOCK bytes. */
static void burst(void)
{
    void *p[BLOCKS];
    for (int i = 0; i < BLOCKS; i++) {
        p[i] = malloc(BLOCK);
        ck_assert_ptr_nonnull(p[i]);
        memset(p[i], i + 1, BLOCK);
    }
    for (int i = 0; i < BLOCKS; i++)
        free(p[i]);
}

#ifdef HAVE_JEMALLOC
/* VmRSS of this process, in bytes. */
static size_t rss(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    size_t kb = 0;

    ck_assert_ptr_nonnull(f);
    while (fgets(line, sizeof(line), f) != NULL)
        if (sscanf(line, "VmRSS: %zu kB", &kb) == 1)
            break;
    fclose(f);
    return kb * 1024;
}

START_TEST(test_burst_given_back)
{
    burst();
    size_t unused = memtrim_unused();
    ck_assert_uint_ge(unused, (size_t)BLOCKS * BLOCK / 2);
    /* Within the slack: nothing is done. */
    ck_assert(!memtrim_tick(unused + BLOCK));
    ck_assert_uint_ge(memtrim_unused(), unused / 2);
    size_t before = rss();
    ck_assert(memtrim_tick(BLOCK));
    ck_assert_uint_lt(memtrim_unused(), BLOCK);
    ck_assert_uint_le(rss() + (size_t)BLOCKS * BLOCK / 2, before);
}
END_TEST
#else
START_TEST(test_without_jemalloc)
{
    burst();
    ck_assert_uint_eq(memtrim_unused(), 0);
    ck_assert(!memtrim_tick(0));
}
END_TEST
#endif

static Suite *memtrim_suite(void)
{
    Suite *s = suite_create("memtrim");
    TCase *tc = tcase_create("core");
#ifdef HAVE_JEMALLOC
    tcase_add_test(tc, test_burst_given_back);
#else
    tcase_add_test(tc, test_without_jemalloc);
#endif
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(memtrim_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
