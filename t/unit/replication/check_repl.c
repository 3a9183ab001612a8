/*
 * check_repl.c -- two or three stores replicating in one process over
 * loopback: eager push, repair rounds, bulk catch-up, authentication.
 * Every wait is bounded (WAIT_MS) and polls.
 */
#include <check.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "repl.h"
#include "repltest.h"
#include "store.h"

#define WAIT_MS 10000

struct node {
    store *s;
    repl *r;
    uint16_t port;
    uint32_t id;
};

static store *make_store(uint32_t id)
{
    store_options so;
    store_options_default(&so);
    so.node_id = id;
    so.memory_limit = 256u << 20;
    so.sketch_symbols = 1024;
    int err = 0;
    store *s = store_create(&so, &err);
    ck_assert_ptr_nonnull(s);
    return s;
}

static void node_start(struct node *n, const char *peers, const char *secret)
{
    repl_options o;
    repl_options_default(&o);
    o.node_id = n->id;
    o.port = n->port;
    o.peers = peers;
    o.secret = secret;
    o.period_ms = 20;
    char err[256] = "";
    n->r = repl_create(n->s, &o, err, sizeof(err));
    ck_assert_msg(n->r != NULL, "repl_create: %s", err);
    ck_assert_int_eq(repl_start(n->r), REPL_OK);
}

static void put(store *s, const char *key, const char *val)
{
    store_write w = {.mode = STORE_SET,
                     .key = key,
                     .nkey = strlen(key),
                     .value = val,
                     .nvalue = strlen(val)};
    ck_assert_int_eq(store_write_item(s, &w, NULL), STORE_STORED);
}

/* 1 when s holds key with exactly val (or, val NULL, holds no key). */
static int has(store *s, const char *key, const char *val)
{
    store_item *it = store_get(s, key, strlen(key));
    if (!it)
        return val == NULL;
    size_t n;
    const char *v = store_item_value(it, &n);
    int ok = val && n == strlen(val) && memcmp(v, val, n) == 0;
    store_item_release(it);
    return ok;
}

static int wait_has(store *s, const char *key, const char *val)
{
    for (int t = 0; t < WAIT_MS / 10; t++) {
        if (has(s, key, val))
            return 1;
        sleep_ms(10);
    }
    return 0;
}

/* Waits until both stores hold the same set (sketch symbol 0 and 1..n). */
static int wait_same_set(store *a, store *b)
{
    riblt_symbol sa[64], sb[64];
    for (int t = 0; t < WAIT_MS / 10; t++) {
        int64_t na, nb;
        store_sketch_read(a, 0, sa, 64, &na);
        store_sketch_read(b, 0, sb, 64, &nb);
        if (na == nb && memcmp(sa, sb, sizeof(sa)) == 0)
            return 1;
        sleep_ms(10);
    }
    return 0;
}

static void two_nodes(struct node *a, struct node *b, const char *sa,
                      const char *sb)
{
    a->id = 1;
    b->id = 2;
    a->port = free_port();
    b->port = free_port();
    a->s = make_store(1);
    b->s = make_store(2);
    char pa[64], pb[64];
    snprintf(pa, sizeof(pa), "127.0.0.1:%u,127.0.0.1:%u", a->port, b->port);
    snprintf(pb, sizeof(pb), "127.0.0.1:%u", a->port);
    node_start(a, pa, sa); /* a's list includes itself: it must skip it */
    node_start(b, pb, sb);
}

static void node_stop(struct node *n)
{
    repl_destroy(n->r);
    store_destroy(n->s);
}

START_TEST(test_push_and_delete)
{
    struct node a, b;
    two_nodes(&a, &b, "s3cret", "s3cret");
    put(a.s, "k1", "v1");
    ck_assert(wait_has(b.s, "k1", "v1"));
    put(b.s, "k1", "v2");
    ck_assert(wait_has(a.s, "k1", "v2"));
    ck_assert_int_eq(store_delete(a.s, "k1", 2, 0), STORE_DELETED);
    ck_assert(wait_has(b.s, "k1", NULL));
    ck_assert(wait_same_set(a.s, b.s));
    node_stop(&a);
    node_stop(&b);
}
END_TEST

/* Writes made before the peer exists arrive through rounds (bulk, then
 * streaming for what differs both ways). */
START_TEST(test_catch_up_and_repair)
{
    struct node a = {.id = 1}, b = {.id = 2};
    a.port = free_port();
    b.port = free_port();
    a.s = make_store(1);
    b.s = make_store(2);
    char key[32], val[32];
    for (int i = 0; i < 3000; i++) {
        snprintf(key, sizeof(key), "a%d", i);
        snprintf(val, sizeof(val), "va%d", i);
        put(a.s, key, val);
    }
    for (int i = 0; i < 50; i++) {
        snprintf(key, sizeof(key), "b%d", i);
        put(b.s, key, "vb");
    }
    char pa[32], pb[32];
    snprintf(pa, sizeof(pa), "127.0.0.1:%u", b.port);
    snprintf(pb, sizeof(pb), "127.0.0.1:%u", a.port);
    node_start(&a, pa, "k");
    node_start(&b, pb, "k");
    ck_assert(wait_same_set(a.s, b.s));
    ck_assert(has(b.s, "a2999", "va2999"));
    ck_assert(has(a.s, "b49", "vb"));
    store_stats st;
    store_get_stats(a.s, &st);
    ck_assert_uint_eq(st.curr_items, 3050);
    store_get_stats(b.s, &st);
    ck_assert_uint_eq(st.curr_items, 3050);
    node_stop(&a);
    node_stop(&b);
}
END_TEST

struct collect {
    char buf[8192];
    size_t n;
};

static void collect(void *arg, const char *name, const char *value)
{
    struct collect *c = arg;
    int w =
        snprintf(c->buf + c->n, sizeof(c->buf) - c->n, "%s %s\n", name, value);
    if (w > 0 && (size_t)w < sizeof(c->buf) - c->n)
        c->n += (size_t)w;
}

START_TEST(test_wrong_secret_is_refused)
{
    struct node a, b;
    two_nodes(&a, &b, "right", "wrong");
    put(a.s, "k", "v");
    sleep_ms(300);
    ck_assert(has(b.s, "k", NULL));
    struct collect c = {.n = 0};
    repl_emit_stats(b.r, collect, &c);
    ck_assert_ptr_nonnull(strstr(c.buf, "auth_failures "));
    ck_assert_ptr_null(strstr(c.buf, "\nauth_failures 0\n"));
    node_stop(&a);
    node_stop(&b);
}
END_TEST

START_TEST(test_refuses_insecure_by_default)
{
    store *s = make_store(1);
    repl_options o;
    repl_options_default(&o);
    o.port = free_port();
    o.secret = "";
    char err[256] = "";
    ck_assert_ptr_null(repl_create(s, &o, err, sizeof(err)));
    ck_assert_ptr_nonnull(strstr(err, "cluster_secret"));
    o.peers = "no-port-here";
    o.secret = "x";
    ck_assert_ptr_null(repl_create(s, &o, err, sizeof(err)));
    ck_assert_ptr_nonnull(strstr(err, "host:port"));
    store_destroy(s);
}
END_TEST

static Suite *repl_suite(void)
{
    Suite *s = suite_create("repl");
    TCase *tc = tcase_create("repl");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_push_and_delete);
    tcase_add_test(tc, test_catch_up_and_repair);
    tcase_add_test(tc, test_wrong_secret_is_refused);
    tcase_add_test(tc, test_refuses_insecure_by_default);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(repl_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
