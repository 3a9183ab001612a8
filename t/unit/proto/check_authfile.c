/*
 * check_authfile.c -- unit tests of the credentials file behind -Y (and
 * its SASL use): parsing, comments, malformed and empty files, checks of
 * every entry, lengths that differ by one, and a reload that fails
 * keeping the old entries. (authfile.c is part of the server library
 * these suites link.)
 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "authfile.h"

static char path[64];

static void write_file(const char *text)
{
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    fputs(text, f);
    fclose(f);
}

static void setup(void)
{
    snprintf(path, sizeof(path), "/tmp/check-authfile-%d", (int)getpid());
}

static void teardown(void)
{
    unlink(path);
}

static bool ok(authfile *af, const char *user, const char *pass)
{
    return authfile_check(af, user, strlen(user), pass, strlen(pass));
}

START_TEST(test_entries_and_comments)
{
    int rc, line = 0;
    write_file("# users\n\nfoo:bar\r\nbaaaz:qu:ux\nempty:\n");
    authfile *af = authfile_open(path, &rc, &line);
    ck_assert_int_eq(rc, AUTHFILE_OK);
    ck_assert(ok(af, "foo", "bar"));
    ck_assert(ok(af, "baaaz", "qu:ux")); /* the first ':' splits */
    ck_assert(ok(af, "empty", ""));
    ck_assert(!ok(af, "foo", "ba"));
    ck_assert(!ok(af, "foo", "barr"));
    ck_assert(!ok(af, "fo", "bar"));
    ck_assert(!ok(af, "baaaz", "bar")); /* entries are not mixed */
    ck_assert(!ok(af, "# users", ""));
    ck_assert(!authfile_check(NULL, "foo", 3, "bar", 3));
    authfile_close(af);
}
END_TEST

START_TEST(test_bad_files)
{
    int rc, line = 0;
    write_file("foo:bar\nno colon\n");
    ck_assert_ptr_null(authfile_open(path, &rc, &line));
    ck_assert_int_eq(rc, AUTHFILE_ERR_FORMAT);
    ck_assert_int_eq(line, 2);
    write_file(":nouser\n");
    ck_assert_ptr_null(authfile_open(path, &rc, &line));
    ck_assert_int_eq(rc, AUTHFILE_ERR_FORMAT);
    write_file("# nothing\n\n");
    ck_assert_ptr_null(authfile_open(path, &rc, &line));
    ck_assert_int_eq(rc, AUTHFILE_ERR_EMPTY);
    unlink(path);
    ck_assert_ptr_null(authfile_open(path, &rc, &line));
    ck_assert_int_eq(rc, AUTHFILE_ERR_OPEN);
    ck_assert_str_ne(authfile_strerror(rc), "ok");
}
END_TEST

START_TEST(test_reload)
{
    int rc, line = 0;
    write_file("foo:bar\n");
    authfile *af = authfile_open(path, &rc, &line);
    ck_assert_ptr_nonnull(af);
    write_file("new:pass\n");
    ck_assert_int_eq(authfile_reload(af, path, &line), AUTHFILE_OK);
    ck_assert(ok(af, "new", "pass"));
    ck_assert(!ok(af, "foo", "bar"));
    write_file("broken\n");
    ck_assert_int_eq(authfile_reload(af, path, &line), AUTHFILE_ERR_FORMAT);
    ck_assert(ok(af, "new", "pass")); /* the old entries stay */
    authfile_close(af);
}
END_TEST

START_TEST(test_parse_from_memory)
{
    int rc, line = 0;
    static const char text[] = "a:1\n# c\nb:2:3"; /* no final newline */
    authfile *af = authfile_parse(text, sizeof(text) - 1, &rc, &line);
    ck_assert_int_eq(rc, AUTHFILE_OK);
    ck_assert(ok(af, "a", "1"));
    ck_assert(ok(af, "b", "2:3"));
    authfile_close(af);
    /* a NUL inside a line is malformed, not a shorter entry */
    static const char nul[] = "a:1\0x\n";
    ck_assert_ptr_null(authfile_parse(nul, sizeof(nul) - 1, &rc, &line));
    ck_assert_int_eq(rc, AUTHFILE_ERR_FORMAT);
    ck_assert_int_eq(line, 1);
    /* more users than the table holds */
    char many[AUTHFILE_MAX_ENTRIES * 8 + 16];
    size_t n = 0;
    for (int i = 0; i <= AUTHFILE_MAX_ENTRIES; i++)
        n += (size_t)snprintf(many + n, sizeof(many) - n, "u%d:p\n", i);
    ck_assert_ptr_null(authfile_parse(many, n, &rc, &line));
    ck_assert_int_eq(rc, AUTHFILE_ERR_TOO_MANY);
}
END_TEST

static Suite *authfile_suite(void)
{
    Suite *s = suite_create("authfile");
    TCase *tc = tcase_create("core");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_entries_and_comments);
    tcase_add_test(tc, test_bad_files);
    tcase_add_test(tc, test_reload);
    tcase_add_test(tc, test_parse_from_memory);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(authfile_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
