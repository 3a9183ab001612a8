/*
 * prototest.h -- the harness the text and meta protocol suites share:
 * a real store on a fixed clock, a parser context, and helpers that feed
 * requests (whole or in pieces) and compare the exact reply bytes.
 * Included by one test file each, so its definitions are static.
 */
#ifndef PROTOTEST_H
#define PROTOTEST_H

#include <check.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/buffer.h>

#include "proto_text.h"
#include "stats_registry.h"
#include "showbytes.h"

#define T0_S 1700000000ULL /* the test clock, in unix seconds */

static uint64_t clock_ns;
static store *st;
static proto_config cfg;
static stats_thread sth;
static proto_ctx ctx;

static uint64_t test_clock(void *arg)
{
    (void)arg;
    return clock_ns;
}

static void setup(void)
{
    store_options o;
    int err = 0;
    store_options_default(&o);
    o.node_id = 1;
    o.clock = test_clock;
    clock_ns = T0_S * 1000000000ULL;
    st = store_create(&o, &err);
    ck_assert_ptr_nonnull(st);
    memset(&cfg, 0, sizeof(cfg));
    cfg.item_size_max = 1024 * 1024;
    cfg.flush_enabled = true;
    cfg.cas_enabled = true;
    cfg.max_line = 2048;
    cfg.version = "1.6.99-test";
    cfg.stats_list = stats_emit_group;
    cfg.stats_reset = stats_reset;
    memset(&sth, 0, sizeof(sth));
    memset(&ctx, 0, sizeof(ctx));
    ctx.store = st;
    ctx.cfg = &cfg;
    ctx.stats = &sth;
    ctx.authenticated = true;
}

static void teardown(void)
{
    proto_text_free(&ctx);
    store_destroy(st);
}

/* The bytes left in `in` after the last run. */
static size_t left_in;
static int last_rc;

/* Ends a run: the bytes left in `in`, and the reply (NUL-terminated,
 * malloc) taken from `out`; frees both buffers. */
static char *run_end(struct evbuffer *in, struct evbuffer *out, size_t *outlen)
{
    left_in = evbuffer_get_length(in);
    size_t len = evbuffer_get_length(out);
    char *s = malloc(len + 1);
    evbuffer_remove(out, s, len);
    s[len] = '\0';
    if (outlen)
        *outlen = len;
    evbuffer_free(in);
    evbuffer_free(out);
    return s;
}

/* Feeds n bytes in one call; returns the reply (NUL-terminated, malloc). */
static char *run_n(const char *req, size_t n, size_t *outlen)
{
    struct evbuffer *in = evbuffer_new(), *out = evbuffer_new();
    evbuffer_add(in, req, n);
    last_rc = proto_text_execute(&ctx, in, out);
    return run_end(in, out, outlen);
}

/*
 * Feeds the request in pieces of `step` bytes, each piece its own evbuffer
 * chunk, keeping unconsumed bytes between calls as a connection would.
 */
static char *run_split(const char *req, size_t n, size_t step, size_t *outlen)
{
    struct evbuffer *in = evbuffer_new(), *out = evbuffer_new();
    for (size_t i = 0; i < n; i += step) {
        size_t k = n - i < step ? n - i : step;
        evbuffer_add_reference(in, req + i, k, NULL, NULL);
        last_rc = proto_text_execute(&ctx, in, out);
        if (last_rc != PROTO_OK)
            break;
    }
    /* the references point at req: consume what is left before return */
    return run_end(in, out, outlen);
}

/*
 * Feeds the request in pieces of `step` bytes as the connection layer does
 * with its worker's memory (proto.h): a piece arriving while `in` is empty
 * is lent (a malloc'd copy, freed and so unreadable after the call), any
 * other goes into `in`; replies left in the lent reply memory are taken
 * after those in `out`. *lent_out counts the reply bytes that came that way.
 */
static char *run_lent(const char *req, size_t n, size_t step, size_t *outlen,
                      size_t *lent_out)
{
    struct evbuffer *in = evbuffer_new(), *out = evbuffer_new();
    char *rbuf = malloc(PROTO_OUT_FLAT);
    ck_assert_ptr_nonnull(rbuf);
    *lent_out = 0;
    for (size_t i = 0; i < n; i += step) {
        size_t k = n - i < step ? n - i : step;
        char *piece = NULL;
        if (evbuffer_get_length(in) == 0) {
            piece = malloc(k);
            ck_assert_ptr_nonnull(piece);
            memcpy(piece, req + i, k);
            ctx.in_flat = piece;
            ctx.in_flat_len = k;
        } else {
            evbuffer_add(in, req + i, k);
        }
        ctx.out_flat = rbuf;
        ctx.out_flat_cap = PROTO_OUT_FLAT;
        last_rc = proto_text_execute(&ctx, in, out);
        ck_assert_ptr_null(ctx.in_flat); /* taken, whatever was consumed */
        evbuffer_add(out, rbuf, ctx.out_flat_len);
        *lent_out += ctx.out_flat_len;
        ctx.out_flat = NULL;
        ctx.out_flat_cap = 0;
        ctx.out_flat_len = 0;
        free(piece);
        if (last_rc != PROTO_OK)
            break;
    }
    free(rbuf);
    return run_end(in, out, outlen);
}

static void expect_bytes(const char *req, size_t nreq, const char *want,
                         size_t nwant, int line)
{
    size_t n;
    char *got = run_n(req, nreq, &n);
    if (n != nwant || memcmp(got, want, n) != 0) {
        static char a[4096], b[4096], q[4096];
        show(a, sizeof(a), got, n);
        show(b, sizeof(b), want, nwant);
        show(q, sizeof(q), req, nreq < 400 ? nreq : 400);
        ck_abort_msg("line %d: request \"%s\"\n got  \"%s\"\n want \"%s\"",
                     line, q, a, b);
    }
    free(got);
}

#define EXPECT(req, want)                                                     \
    expect_bytes(req, sizeof(req) - 1, want, sizeof(want) - 1, __LINE__)

/* Expects the store to hold key with exactly this value. */
static void expect_value(const char *key, const char *value)
{
    store_item *it = store_get(st, key, strlen(key));
    ck_assert_msg(it != NULL, "key %s missing", key);
    size_t n;
    const char *v = store_item_value(it, &n);
    ck_assert_uint_eq(n, strlen(value));
    ck_assert(memcmp(v, value, n) == 0);
    store_item_release(it);
}

static void expect_missing(const char *key)
{
    store_item *it = store_get(st, key, strlen(key));
    ck_assert_msg(it == NULL, "key %s present", key);
}

static uint64_t cas_of(const char *key)
{
    store_item *it = store_get(st, key, strlen(key));
    ck_assert_ptr_nonnull(it);
    uint64_t c = store_item_cas(it);
    store_item_release(it);
    return c;
}

#endif /* PROTOTEST_H */
