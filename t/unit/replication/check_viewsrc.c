/*
 * check_viewsrc.c -- what the membership sources share: the list reader
 * of the settings (listspec.h) and the view-source state and words
 * (viewsrc.h): views handed over with their source, the last view kept
 * while the source fails, the membership line in each state.
 */
#include <check.h>
#include <stdio.h>
#include <string.h>

#include "listspec.h"
#include "viewsrc.h"

/* ---------------------------------------------------------- listspec */

/* The items of spec joined with '|', into out. */
static void items(const char *spec, char *out, size_t cap)
{
    const char *p = spec, *item;
    size_t n, len = 0;
    out[0] = '\0';
    while (listspec_next(&p, &item, &n)) {
        len += (size_t)snprintf(out + len, cap - len, "%s%.*s", len ? "|" : "",
                                (int)n, item);
    }
}

START_TEST(test_listspec)
{
    char out[256];
    items("a:1,b:2", out, sizeof(out));
    ck_assert_str_eq(out, "a:1|b:2");
    items("  a:1 , ,b:2,, c:3  ", out, sizeof(out));
    ck_assert_str_eq(out, "a:1|b:2|c:3");
    items("", out, sizeof(out));
    ck_assert_str_eq(out, "");
    items(" , ,", out, sizeof(out));
    ck_assert_str_eq(out, "");
    items(NULL, out, sizeof(out));
    ck_assert_str_eq(out, "");
    items("[::1]:5,http://h:2", out, sizeof(out));
    ck_assert_str_eq(out, "[::1]:5|http://h:2");
}
END_TEST

/* ----------------------------------------------------------- viewsrc */

static size_t got_n;
static char got_source[256];
static char got_first[REGISTRY_ADDR_MAX + 1];
static int calls;

static void on_view(void *arg, const registry_member *m, size_t n,
                    const char *source)
{
    (void)arg;
    calls++;
    got_n = n;
    snprintf(got_source, sizeof(got_source), "%s", source);
    snprintf(got_first, sizeof(got_first), "%s", n ? m[0].addr : "");
}

START_TEST(test_viewsrc_states)
{
    viewsrc s;
    char text[256];
    calls = 0;
    viewsrc_init(&s, "dns", "peers.test:7000", "address", "addresses", on_view,
                 NULL);
    viewsrc_text(&s, text, sizeof(text));
    ck_assert_str_eq(text, "dns peers.test:7000 (starting)");

    /* failing before any view: none handed over, says so */
    viewsrc_failed(&s, "SRV lookup: timeout");
    ck_assert_int_eq(calls, 0);
    viewsrc_text(&s, text, sizeof(text));
    ck_assert_msg(strstr(text, "not answering for") != NULL, "%s", text);
    ck_assert_msg(strstr(text, "no view yet") != NULL, "%s", text);

    /* a view: handed over with its source; answering again */
    registry_member m[2];
    memset(m, 0, sizeof(m));
    snprintf(m[0].addr, sizeof(m[0].addr), "127.0.0.2:7000");
    snprintf(m[1].addr, sizeof(m[1].addr), "127.0.0.3:7000");
    viewsrc_view(&s, m, 2);
    ck_assert_int_eq(calls, 1);
    ck_assert_uint_eq(got_n, 2);
    ck_assert_str_eq(got_source, "dns peers.test:7000");
    ck_assert_str_eq(got_first, "127.0.0.2:7000");
    viewsrc_text(&s, text, sizeof(text));
    ck_assert_str_eq(text, "dns peers.test:7000 (2 addresses)");

    /* one member: singular */
    viewsrc_view(&s, m, 1);
    viewsrc_text(&s, text, sizeof(text));
    ck_assert_str_eq(text, "dns peers.test:7000 (1 address)");

    /* failing after a view: no view handed over, the last one kept */
    viewsrc_failed(&s, "address lookup: connection refused");
    ck_assert_int_eq(calls, 2);
    viewsrc_text(&s, text, sizeof(text));
    ck_assert_msg(strstr(text, "last view kept") != NULL, "%s", text);

    /* an answer without a view yet (etcd's put, say) ends the failure */
    viewsrc_ok(&s);
    viewsrc_text(&s, text, sizeof(text));
    ck_assert_str_eq(text, "dns peers.test:7000 (1 address)");
    viewsrc_fini(&s);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("viewsrc");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_listspec);
    tcase_add_test(tc, test_viewsrc_states);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? 0 : 1;
}
