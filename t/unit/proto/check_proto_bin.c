/*
 * check_proto_bin.c -- the binary protocol parser against a real store.
 *
 * Each test feeds request packets to proto_bin_execute and compares the
 * output buffer with the exact response bytes memcached sends for the same
 * requests. Expected packets are built here with their own big-endian
 * writer (not the parser's), and the cas a response must carry is read
 * back from the store through store_get. The robustness tests end by
 * checking that the parser still answers NOOP and VERSION (or, when the
 * request closes the connection, that a fresh connection does) and that the
 * store holds exactly what it held before.
 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "authfile.h"
#include "proto.h"
#include "proto_bin.h"
#include "stats.h"
#include "stats_registry.h"
#include "store.h"

#define VERSION_STR "1.6.99-bintest"
#define ITEM_MAX (64 * 1024)
#define OPQ 0xa1b2c3d4u

/* Opcodes and statuses, spelled out as the protocol numbers them. */
enum {
    OP_GET = 0x00,
    OP_SET = 0x01,
    OP_ADD = 0x02,
    OP_REPLACE = 0x03,
    OP_DELETE = 0x04,
    OP_INCR = 0x05,
    OP_DECR = 0x06,
    OP_QUIT = 0x07,
    OP_FLUSH = 0x08,
    OP_GETQ = 0x09,
    OP_NOOP = 0x0a,
    OP_VERSION = 0x0b,
    OP_GETK = 0x0c,
    OP_GETKQ = 0x0d,
    OP_APPEND = 0x0e,
    OP_PREPEND = 0x0f,
    OP_STAT = 0x10,
    OP_SETQ = 0x11,
    OP_ADDQ = 0x12,
    OP_REPLACEQ = 0x13,
    OP_DELETEQ = 0x14,
    OP_INCRQ = 0x15,
    OP_DECRQ = 0x16,
    OP_QUITQ = 0x17,
    OP_FLUSHQ = 0x18,
    OP_APPENDQ = 0x19,
    OP_PREPENDQ = 0x1a,
    OP_VERBOSITY = 0x1b,
    OP_TOUCH = 0x1c,
    OP_GAT = 0x1d,
    OP_GATQ = 0x1e,
    OP_SASL_LIST = 0x20,
    OP_SASL_AUTH = 0x21,
    OP_SASL_STEP = 0x22,
    OP_GATK = 0x23,
    OP_GATKQ = 0x24,
};
enum {
    ST_OK = 0x00,
    ST_ENOENT = 0x01,
    ST_EEXISTS = 0x02,
    ST_E2BIG = 0x03,
    ST_EINVAL = 0x04,
    ST_NOT_STORED = 0x05,
    ST_BADVAL = 0x06,
    ST_AUTH_ERROR = 0x20,
    ST_AUTH_CONTINUE = 0x21,
    ST_UNKNOWN = 0x81,
};

/* ------------------------------------------------------------ packets */

/* A growable byte string for building requests and expected replies. */
typedef struct bytes {
    uint8_t *p;
    size_t n, cap;
} bytes;

static void b_need(bytes *b, size_t more)
{
    if (b->n + more <= b->cap)
        return;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->n + more)
        cap *= 2;
    b->p = realloc(b->p, cap);
    ck_assert_ptr_nonnull(b->p);
    b->cap = cap;
}

static void b_add(bytes *b, const void *p, size_t n)
{
    if (n == 0)
        return;
    b_need(b, n);
    memcpy(b->p + b->n, p, n);
    b->n += n;
}

static void b_be(bytes *b, uint64_t v, int width)
{
    uint8_t t[8];
    for (int i = 0; i < width; i++)
        t[i] = (uint8_t)(v >> (8 * (width - 1 - i)));
    b_add(b, t, (size_t)width);
}

static void b_free(bytes *b)
{
    free(b->p);
    memset(b, 0, sizeof(*b));
}

/*
 * Appends one packet. keylen/extlen/bodylen are taken from the pieces
 * unless overridden (>= 0) to forge malformed headers.
 */
static void pkt_raw(bytes *b, uint8_t magic, uint8_t op, uint16_t status,
                    uint32_t opaque, uint64_t cas, const void *ext,
                    size_t next, const void *key, size_t nkey, const void *val,
                    size_t nval, long keylen, long extlen, long long bodylen)
{
    b_be(b, magic, 1);
    b_be(b, op, 1);
    b_be(b, keylen >= 0 ? (uint64_t)keylen : nkey, 2);
    b_be(b, extlen >= 0 ? (uint64_t)extlen : next, 1);
    b_be(b, 0, 1);
    b_be(b, status, 2);
    b_be(b, bodylen >= 0 ? (uint64_t)bodylen : next + nkey + nval, 4);
    b_be(b, opaque, 4);
    b_be(b, cas, 8);
    b_add(b, ext, next);
    b_add(b, key, nkey);
    b_add(b, val, nval);
}

/* A well-formed request; key and val are C strings (NULL = none). */
static void req(bytes *b, uint8_t op, const void *ext, size_t next,
                const char *key, const char *val, uint64_t cas)
{
    pkt_raw(b, 0x80, op, 0, OPQ, cas, ext, next, key, key ? strlen(key) : 0,
            val, val ? strlen(val) : 0, -1, -1, -1);
}

/* An expected response with explicit pieces. */
static void res(bytes *b, uint8_t op, uint16_t status, uint64_t cas,
                const void *ext, size_t next, const void *key, size_t nkey,
                const void *val, size_t nval)
{
    pkt_raw(b, 0x81, op, status, OPQ, cas, ext, next, key, nkey, val, nval, -1,
            -1, -1);
}

/* An expected error response: memcached puts a text in the value. */
static void res_err(bytes *b, uint8_t op, uint16_t status)
{
    const char *t = status == ST_ENOENT       ? "Not found"
                    : status == ST_EEXISTS    ? "Data exists for key."
                    : status == ST_E2BIG      ? "Too large."
                    : status == ST_EINVAL     ? "Invalid arguments"
                    : status == ST_NOT_STORED ? "Not stored."
                    : status == ST_BADVAL
                        ? "Non-numeric server-side value for incr or decr"
                    : status == ST_AUTH_ERROR ? "Auth failure."
                    : status == ST_UNKNOWN    ? "Unknown command"
                                              : NULL;
    ck_assert_ptr_nonnull(t);
    res(b, op, status, 0, NULL, 0, NULL, 0, t, strlen(t));
}

static void res_ok(bytes *b, uint8_t op, uint64_t cas)
{
    res(b, op, ST_OK, cas, NULL, 0, NULL, 0, NULL, 0);
}

/* Extras of storage requests: flags, expiration. */
static const uint8_t *ext_store(uint8_t e[8], uint32_t flags, uint32_t exp)
{
    for (int i = 0; i < 4; i++) {
        e[i] = (uint8_t)(flags >> (24 - 8 * i));
        e[4 + i] = (uint8_t)(exp >> (24 - 8 * i));
    }
    return e;
}

/* Extras of incr/decr: delta, initial, expiration. */
static const uint8_t *ext_arith(uint8_t e[20], uint64_t delta,
                                uint64_t initial, uint32_t exp)
{
    for (int i = 0; i < 8; i++) {
        e[i] = (uint8_t)(delta >> (56 - 8 * i));
        e[8 + i] = (uint8_t)(initial >> (56 - 8 * i));
    }
    for (int i = 0; i < 4; i++)
        e[16 + i] = (uint8_t)(exp >> (24 - 8 * i));
    return e;
}

static const uint8_t *be32(uint8_t e[4], uint32_t v)
{
    for (int i = 0; i < 4; i++)
        e[i] = (uint8_t)(v >> (24 - 8 * i));
    return e;
}

static const uint8_t *be64(uint8_t e[8], uint64_t v)
{
    for (int i = 0; i < 8; i++)
        e[i] = (uint8_t)(v >> (56 - 8 * i));
    return e;
}

/* ------------------------------------------------------------ fixture */

static store *st;
static proto_config cfg;
static authfile *users; /* SASL's, for every test of this process */
static stats_thread counters;
static proto_ctx ctx;
static struct evbuffer *in, *out;

static void setup(void)
{
    store_options o;
    int err = 0;

    store_options_default(&o);
    o.node_id = 7;
    o.item_size_max = ITEM_MAX;
    st = store_create(&o, &err);
    ck_assert_msg(st != NULL, "store_create: %d", err);

    memset(&cfg, 0, sizeof(cfg));
    cfg.item_size_max = ITEM_MAX;
    cfg.flush_enabled = true;
    cfg.cas_enabled = true;
    cfg.max_line = 2048;
    cfg.version = VERSION_STR;
    cfg.stats_list = stats_emit_group;
    cfg.stats_reset = stats_reset;
    if (users == NULL) {
        static const char text[] = "alice:s3cret\n";
        int rc;
        users = authfile_parse(text, sizeof(text) - 1, &rc, NULL);
        ck_assert_ptr_nonnull(users);
    }
    cfg.sasl_auth = users;

    memset(&counters, 0, sizeof(counters));
    memset(&ctx, 0, sizeof(ctx));
    ctx.store = st;
    ctx.cfg = &cfg;
    ctx.stats = &counters;
    ctx.authenticated = true;
    in = evbuffer_new();
    out = evbuffer_new();
    ck_assert_ptr_nonnull(in);
    ck_assert_ptr_nonnull(out);
}

static void teardown(void)
{
    proto_bin_free(&ctx);
    evbuffer_free(in);
    evbuffer_free(out);
    store_destroy(st);
}

/* Turns SASL on for this test's connection (before it sends anything). */
static void sasl_on(void)
{
    cfg.sasl = true;
    ctx.authenticated = false;
}

/* Feeds b to the parser (then empties b) and returns its PROTO_* code. */
static int feed(bytes *b)
{
    ck_assert_int_eq(evbuffer_add(in, b->p, b->n), 0);
    b->n = 0;
    return proto_bin_execute(&ctx, in, out);
}

static void hexdump(char *dst, size_t cap, const uint8_t *p, size_t n)
{
    size_t o = 0;
    dst[0] = '\0';
    for (size_t i = 0; i < n && o + 4 < cap; i++)
        o += (size_t)snprintf(dst + o, cap - o, "%02x", p[i]);
    if (o + 4 >= cap)
        snprintf(dst + cap - 4, 4, "...");
}

/* Asserts that the output is exactly `want`, then empties both. */
static void expect_out(bytes *want)
{
    size_t n = evbuffer_get_length(out);
    uint8_t *got = malloc(n ? n : 1);
    ck_assert_ptr_nonnull(got);
    ck_assert_int_eq(evbuffer_remove(out, got, n), (int)n);
    if (n != want->n || (n && memcmp(got, want->p, n) != 0)) {
        char a[401], e[401];
        hexdump(a, sizeof(a), got, n);
        hexdump(e, sizeof(e), want->p, want->n);
        ck_abort_msg("output mismatch\n got  (%zu) %s\n want (%zu) %s", n, a,
                     want->n, e);
    }
    free(got);
    want->n = 0;
}

/* The cas the store holds for key (0 when missing). */
static uint64_t cas_of(const char *key)
{
    store_item *it = store_get(st, key, strlen(key));
    if (!it)
        return 0;
    uint64_t c = store_item_cas(it);
    store_item_release(it);
    return c;
}

/* Asserts what the store holds for key (val NULL = missing). */
static void expect_value(const char *key, const char *val, uint32_t flags)
{
    store_item *it = store_get(st, key, strlen(key));
    if (!val) {
        ck_assert_msg(it == NULL, "key %s should be missing", key);
        return;
    }
    ck_assert_msg(it != NULL, "key %s missing", key);
    size_t n = 0;
    const char *v = store_item_value(it, &n);
    ck_assert_uint_eq(n, strlen(val));
    ck_assert_int_eq(memcmp(v, val, n), 0);
    ck_assert_uint_eq(store_item_flags(it), flags);
    store_item_release(it);
}

/* Stores key=val directly through the store. */
static uint64_t seed(const char *key, const char *val, uint32_t flags)
{
    store_write w = {.mode = STORE_SET,
                     .key = key,
                     .nkey = strlen(key),
                     .value = val,
                     .nvalue = strlen(val),
                     .flags = flags};
    uint64_t cas = 0;
    ck_assert_int_eq(store_write_item(st, &w, &cas), STORE_STORED);
    ck_assert_uint_ne(cas, 0);
    return cas;
}

/* What "the store is unchanged" compares. */
typedef struct snapshot {
    uint64_t mutations, curr_items, cas;
} snapshot;

static snapshot snap(void)
{
    store_stats s;
    store_get_stats(st, &s);
    return (snapshot){s.mutations, s.curr_items, cas_of("seed")};
}

static void expect_unchanged(const snapshot *before)
{
    snapshot now = snap();
    ck_assert_uint_eq(now.mutations, before->mutations);
    ck_assert_uint_eq(now.curr_items, before->curr_items);
    ck_assert_uint_eq(now.cas, before->cas);
    expect_value("seed", "seedvalue", 5);
}

/* The connection still works: NOOP and VERSION answer exactly. */
static void expect_alive(void)
{
    bytes b = {0}, w = {0};
    req(&b, OP_NOOP, NULL, 0, NULL, NULL, 0);
    req(&b, OP_VERSION, NULL, 0, NULL, NULL, 0);
    ck_assert_int_eq(feed(&b), PROTO_OK);
    res_ok(&w, OP_NOOP, 0);
    res(&w, OP_VERSION, ST_OK, 0, NULL, 0, NULL, 0, VERSION_STR,
        strlen(VERSION_STR));
    expect_out(&w);
    ck_assert_uint_eq(evbuffer_get_length(in), 0);
    b_free(&b);
    b_free(&w);
}

/* After a request that closed the connection: a new one works. */
static void expect_new_conn_alive(void)
{
    proto_bin_free(&ctx);
    evbuffer_drain(in, evbuffer_get_length(in));
    evbuffer_drain(out, evbuffer_get_length(out));
    ctx.authenticated = !cfg.sasl;
    if (cfg.sasl) {
        cfg.sasl = false; /* NOOP needs no login for this check */
        ctx.authenticated = true;
    }
    expect_alive();
}

/* ===================================================== basic commands */

START_TEST(test_noop_version_literal)
{
    static const uint8_t rq[] = {
        0x80, 0x0a, 0, 0, 0, 0, 0, 0, 0,    0,    0, 0, 0xde, 0xad, 0xbe, 0xef,
        0,    0,    0, 0, 0, 0, 0, 0, 0x80, 0x0b, 0, 0, 0,    0,    0,    0,
        0,    0,    0, 0, 0, 0, 0, 9, 0,    0,    0, 0, 0,    0,    0,    0};
    static const uint8_t want[] = {
        0x81, 0x0a, 0,    0,   0,   0,   0,   0,   0,   0,   0,   0,    0xde,
        0xad, 0xbe, 0xef, 0,   0,   0,   0,   0,   0,   0,   0,   0x81, 0x0b,
        0,    0,    0,    0,   0,   0,   0,   0,   0,   14,  0,   0,    0,
        9,    0,    0,    0,   0,   0,   0,   0,   0,   '1', '.', '6',  '.',
        '9',  '9',  '-',  'b', 'i', 'n', 't', 'e', 's', 't'};
    bytes b = {0}, w = {0};
    b_add(&b, rq, sizeof(rq));
    b_add(&w, want, sizeof(want));
    ck_assert_int_eq(feed(&b), PROTO_OK);
    expect_out(&w);
    ck_assert_uint_eq(evbuffer_get_length(in), 0);
    b_free(&b);
    b_free(&w);
}
END_TEST

START_TEST(test_get_miss)
{
    bytes b = {0}, w = {0};
    req(&b, OP_GET, NULL, 0, "foo", NULL, 0);
    ck_assert_int_eq(feed(&b), PROTO_OK);
    res_err(&w, OP_GET, ST_ENOENT);
    expect_out(&w);

    /* GETK: the key comes back in place of the text. */
    req(&b, OP_GETK, NULL, 0, "foo", NULL, 0);
    ck_assert_int_eq(feed(&b), PROTO_OK);
    res(&w, OP_GETK, ST_ENOENT, 0, NULL, 0, "foo", 3, NULL, 0);
    expect_out(&w);

    /* Quiet misses say nothing; NOOP flushes. */
    req(&b, OP_GETQ, NULL, 0, "foo", NULL, 0);
    req(&b, OP_GETKQ, NULL, 0, "foo", NULL, 0);
    req(&b, OP_NOOP, NULL, 0, NULL, NULL, 0);
    ck_assert_int_eq(feed(&b), PROTO_OK);
    res_ok(&w, OP_NOOP, 0);
    expect_out(&w);
    ck_assert_uint_eq(counters.get_misses, 4);
    ck_assert_uint_eq(counters.cmd_get, 4);
    b_free(&b);
    b_free(&w);
}
END_TEST

START_TEST(test_set_get)
{
    bytes b = {0}, w = {0};
    uint8_t e[8], f[4];
    req(&b, OP_SET, ext_store(e, 0x12345678, 0), 8, "foo", "bar", 0);
    ck_assert_int_eq(feed(&b), PROTO_OK);
    uint64_t cas = cas_of("foo");
    ck_assert_uint_ne(cas, 0);
    res_ok(&w, OP_SET, cas);
    expect_out(&w);
    expect_value("foo", "bar", 0x12345678);

    req(&b, OP_GET, NULL, 0, "foo", NULL, 0);
    req(&b, OP_GETK, NULL, 0, "foo", NULL, 0);
    req(&b, OP_GETQ, NULL, 0, "foo", NULL, 0);
    req(&b, OP_GETKQ, NULL, 0, "foo", NULL, 0);
    ck_assert_int_eq(feed(&b), PROTO_OK);
    be32(f, 0x12345678);
    res(&w, OP_GET, ST_OK, cas, f, 4, NULL, 0, "bar", 3);
    res(&w, OP_GETK, ST_OK, cas, f, 4, "foo", 3, "bar", 3);
    res(&w, OP_GETQ, ST_OK, cas, f, 4, NULL, 0, "bar", 3);
    res(&w, OP_GETKQ, ST_OK, cas, f, 4, "foo", 3, "bar", 3);
    expect_out(&w);
    ck_assert_uint_eq(counters.get_hits, 4);
    ck_assert_uint_eq(counters.cmd_set, 1);

    /* An empty value. */
    req(&b, OP_SET, ext_store(e, 0, 0), 8, "empty", "", 0);
    req(&b, OP_GET, NULL, 0, "empty", NULL, 0);
    ck_assert_int_eq(feed(&b), PROTO_OK);
    cas = cas_of("empty");
    res_ok(&w, OP_SET, cas);
    res(&w, OP_GET, ST_OK, cas, be32(f, 0), 4, NULL, 0, NULL, 0);
    expect_out(&w);
    b_free(&b);
    b_free(&w);
}
END_TEST

/* 1 if some chain of the output buffer starts at key's value bytes. */
static int by_reference(const char *key)
{
    struct evbuffer_iovec v[64];
    store_item *it = store_get(st, key, strlen(key));
    size_t nvalue = 0;
    int found = 0;
    ck_assert_ptr_nonnull(it);
    const char *value = store_item_value(it, &nvalue);
    int n = evbuffer_peek(out, -1, NULL, v, 64);
    ck_assert_int_le(n, 64);
    for (int i = 0; i < n; i++)
        if (v[i].iov_base == value && v[i].iov_len == nvalue)
            found = 1;
    store_item_release(it);
    return found;
}

START_TEST(test_large_value_by_reference)
{
    /* Values of 256 bytes and more take the by-reference path. */
    static const size_t sizes[] = {255, 256, 257, 4000, ITEM_MAX / 2};
    bytes b = {0}, w = {0};
    uint8_t e[8], f[4];
    for (size_t k = 0; k < sizeof(sizes) / sizeof(sizes[0]); k++) {
        size_t n = sizes[k];
        char *v = malloc(n + 1);
        ck_assert_ptr_nonnull(v);
        for (size_t i = 0; i < n; i++)
            v[i] = (char)('a' + (i * 7 + k) % 26);
        v[n] = '\0';
        req(&b, OP_SET, ext_store(e, 9, 0), 8, "big", v, 0);
        req(&b, OP_GETK, NULL, 0, "big", NULL, 0);
        ck_assert_int_eq(feed(&b), PROTO_OK);
        uint64_t cas = cas_of("big");
        res_ok(&w, OP_SET, cas);
        res(&w, OP_GETK, ST_OK, cas, be32(f, 9), 4, "big", 3, v, n);
        /* Large values are not copied: a chain of the output points at the
         * item's own bytes. */
        ck_assert_int_eq(by_reference("big"), n >= 256);
        expect_out(&w);
        /* The reply outlives a later overwrite of the key. */
        req(&b, OP_GET, NULL, 0, "big", NULL, 0);
        req(&b, OP_SETQ, ext_store(e, 0, 0), 8, "big", "x", 0);
        ck_assert_int_eq(feed(&b), PROTO_OK);
        res(&w, OP_GET, ST_OK, cas, be32(f, 9), 4, NULL, 0, v, n);
        expect_out(&w);
        expect_value("big", "x", 0);
        free(v);
    }
    b_free(&b);
    b_free(&w);
}
END_TEST

START_TEST(test_add_replace)
{
    bytes b = {0}, w = {0};
    uint8_t e[8];
    seed("k", "v1", 0);
    req(&b, OP_ADD, ext_store(e, 0, 0), 8, "k", "x", 0);
    req(&b, OP_ADDQ, ext_store(e, 0, 0), 8, "k", "x", 0);
    req(&b, OP_REPLACE, ext_store(e, 0, 0), 8, "nokey", "x", 0);
    req(&b, OP_REPLACEQ, ext_store(e, 0, 0), 8, "nokey", "x", 0);
    ck_assert_int_eq(feed(&b), PROTO_OK);
    res_err(&w, OP_ADD, ST_EEXISTS);
    res_err(&w, OP_ADDQ, ST_EEXISTS);
    res_err(&w, OP_REPLACE, ST_ENOENT);
    res_err(&w, OP_REPLACEQ, ST_ENOENT);
    expect_out(&w);
    expect_value("k", "v1", 0);
    expect_value("nokey", NULL, 0);

    req(&b, OP_ADD, ext_store(e, 3, 0), 8, "new", "n", 0);
    ck_assert_int_eq(feed(&b), PROTO_OK);
    res_ok(&w, OP_ADD, cas_of("new"));
    expect_out(&w);
    req(&b, OP_REPLACE, ext_store(e, 4, 0), 8, "k", "v2", 0);
    ck_assert_int_eq(feed(&b), PROTO_OK);
    res_ok(&w, OP_REPLACE, cas_of("k"));
    expect_out(&w);
    expect_value("new", "n", 3);
    expect_value("k", "v2", 4);
    b_free(&b);
    b_free(&w);
}
END_TEST

START_TEST(test_cas)
{
    bytes b = {0}, w = {0};
    uint8_t e[8];
    uint64_t cas = seed("k", "v1", 0);

    req(&b, OP_SET, ext_store(e, 0, 0), 8, "k", "bad", cas + 1);
    req(&b, OP_SET, ext_store(e, 0, 0), 8, "nokey", "bad", cas);
    req(&b, OP_ADD, ext_store(e, 0, 0), 8, "k", "bad", cas + 1);
    req(&b, OP_REPLACE, ext_store(e, 0, 0), 8, "k", "bad", cas + 1);
    ck_assert_int_eq(feed(&b), PROTO_OK);
    res_err(&w, OP_SET, ST_EEXISTS);
    res_err(&w, OP_SET, ST_ENOENT);
    res_err(&w, OP_ADD, ST_EEXISTS);
    res_err(&w, OP_REPLACE, ST_EEXISTS);
    expect_out(&w);
    expect_value("k", "v1", 0);
    expect_value("nokey", NULL, 0);
    ck_assert_uint_eq(counters.cas_badval, 3);
    ck_assert_uint_eq(counters.cas_misses, 1);

    req(&b, OP_SET, ext_store(e, 2, 0), 8, "k", "good", cas);
    ck_assert_int_eq(feed(&b), PROTO_OK);
    uint64_t cas2 = cas_of("k");
    ck_assert_uint_ne(cas2, cas);
    res_ok(&w, OP_SET, cas2);
    expect_out(&w);
    expect_value("k", "good", 2);
    ck_assert_uint_eq(counters.cas_hits, 1);

    /* The old cas is spent. */
    req(&b, OP_SETQ, ext_store(e, 0, 0), 8, "k", "again", cas);
    ck_assert_int_eq(feed(&b), PROTO_OK);
    res_err(&w, OP_SETQ, ST_EEXISTS);
    expect_out(&w);
    expect_value("k", "good", 2);
    b_free(&b);
    b_free(&w);
}
END_TEST

START_TEST(test_append_prepend)
{
    bytes b = {0}, w = {0};
    seed("k", "mid", 6);
    req(&b, OP_APPEND, NULL, 0, "nokey", "x", 0);
    req(&b, OP_PREPENDQ, NULL, 0, "nokey", "x", 0);
    ck_assert_int_eq(feed(&b), PROTO_OK);
    res_err(&w, OP_APPEND, ST_NOT_STORED);
    res_err(&w, OP_PREPENDQ, ST_NOT_STORED);
    expect_out(&w);
    expect_value("nokey", NULL, 0);

    req(&b, OP_APPEND, NULL, 0, "k", "-end", 0);
    ck_assert_int_eq(feed(&b), PROTO_OK);
    res_ok(&w, OP_APPEND, cas_of("k"));
    expect_out(&w);
    req(&b, OP_PREPENDQ, NULL, 0, "k", "start-", 0);
    req(&b, OP_APPENDQ, NULL, 0, "k", "!", 0);
    ck_assert_int_eq(feed(&b), PROTO_OK);
    expect_out(&w);
    expect_value("k", "start-mid-end!", 6);

    /* With a cas, append must match it. */
    uint64_t cas = cas_of("k");
    req(&b, OP_APPEND, NULL, 0, "k", "?", cas + 1);
    ck_assert_int_eq(feed(&b), PROTO_OK);
    res_err(&w, OP_APPEND, ST_EEXISTS);
    expect_out(&w);
    expect_value("k", "start-mid-end!", 6);
    req(&b, OP_PREPEND, NULL, 0, "k", ">", cas);
    ck_assert_int_eq(feed(&b), PROTO_OK);
    res_ok(&w, OP_PREPEND, cas_of("k"));
    expect_out(&w);
    expect_value("k", ">start-mid-end!", 6);
    b_free(&b);
    b_free(&w);
}
END_TEST

START_TEST(test_delete)
{
    bytes b = {0}, w = {0};
    uint64_t cas = seed("k", "v", 0);
    seed("q", "v", 0);
    req(&b, OP_DELETE, NULL, 0, "k", NULL, cas + 1);
    ck_assert_int_eq(feed(&b), PROTO_OK);
    res_err(&w, OP_DELETE, ST_EEXISTS);
    expect_out(&w);
    expect_value("k", "v", 0);

    req(&b, OP_DELETE, NULL, 0, "k", NULL, cas);
    req(&b, OP_DELETE, NULL, 0, "k", NULL, 0);
    req(&b, OP_DELETEQ, NULL, 0, "q", NULL, 0);
    req(&b, OP_DELETEQ, NULL, 0, "q", NULL, 0);
    req(&b, OP_NOOP, NULL, 0, NULL, NULL, 0);
    ck_assert_int_eq(feed(&b), PROTO_OK);
    res_ok(&w, OP_DELETE, 0);
    res_err(&w, OP_DELETE, ST_ENOENT);
    res_err(&w, OP_DELETEQ, ST_ENOENT);
    res_ok(&w, OP_NOOP, 0);
    expect_out(&w);
    expect_value("k", NULL, 0);
    expect_value("q", NULL, 0);
    ck_assert_uint_eq(counters.delete_hits, 2);
    ck_assert_uint_eq(counters.delete_misses, 2);
    b_free(&b);
    b_free(&w);
}
END_TEST

START_TEST(test_incr_decr)
{
    bytes b = {0}, w = {0};
    uint8_t e[20], v[8];

    req(&b, OP_INCR, ext_arith(e, 1, 10, 0xffffffffu), 20, "n", NULL, 0);
    ck_assert_int_eq(feed(&b), PROTO_OK);
    res_err(&w, OP_INCR, ST_ENOENT);
    expect_out(&w);
    expect_value("n", NULL, 0);
    ck_assert_uint_eq(counters.incr_misses, 1);

    req(&b, OP_INCR, ext_arith(e, 1, 10, 0), 20, "n", NULL, 0);
    ck_assert_int_eq(feed(&b), PROTO_OK);
    res(&w, OP_INCR, ST_OK, cas_of("n"), NULL, 0, NULL, 0, be64(v, 10), 8);
    expect_out(&w);
    expect_value("n", "10", 0);

    req(&b, OP_INCR, ext_arith(e, 5, 99, 0), 20, "n", NULL, 0);
    ck_assert_int_eq(feed(&b), PROTO_OK);
    res(&w, OP_INCR, ST_OK, cas_of("n"), NULL, 0, NULL, 0, be64(v, 15), 8);
    expect_out(&w);

    req(&b, OP_DECR, ext_arith(e, 500, 0, 0), 20, "n", NULL, 0);
    ck_assert_int_eq(feed(&b), PROTO_OK);
    res(&w, OP_DECR, ST_OK, cas_of("n"), NULL, 0, NULL, 0, be64(v, 0), 8);
    expect_out(&w);
    /* memcached pads a shorter decr result with spaces. */
    expect_value("n", "0 ", 0);

    req(&b, OP_INCRQ, ext_arith(e, 7, 0, 0), 20, "n", NULL, 0);
    req(&b, OP_DECRQ, ext_arith(e, 2, 0, 0), 20, "n", NULL, 0);
    req(&b, OP_DECRQ, ext_arith(e, 2, 0, 0xffffffffu), 20, "none", NULL, 0);
    req(&b, OP_NOOP, NULL, 0, NULL, NULL, 0);
    ck_assert_int_eq(feed(&b), PROTO_OK);
    res_err(&w, OP_DECRQ, ST_ENOENT);
    res_ok(&w, OP_NOOP, 0);
    expect_out(&w);
    expect_value("n", "5 ", 0);

    /* 64-bit wrap on incr. */
    seed("w", "18446744073709551615", 0);
    req(&b, OP_INCR, ext_arith(e, 2, 0, 0), 20, "w", NULL, 0);
    ck_assert_int_eq(feed(&b), PROTO_OK);
    res(&w, OP_INCR, ST_OK, cas_of("w"), NULL, 0, NULL, 0, be64(v, 1), 8);
    expect_out(&w);

    /* Not a number. */
    seed("t", "abc", 0);
    req(&b, OP_INCR, ext_arith(e, 1, 0, 0), 20, "t", NULL, 0);
    ck_assert_int_eq(feed(&b), PROTO_OK);
    res_err(&w, OP_INCR, ST_BADVAL);
    expect_out(&w);
    expect_value("t", "abc", 0);

    /* A cas that does not match. */
    uint64_t cas = cas_of("n");
    req(&b, OP_INCR, ext_arith(e, 1, 0, 0), 20, "n", NULL, cas + 1);
    ck_assert_int_eq(feed(&b), PROTO_OK);
    res_err(&w, OP_INCR, ST_EEXISTS);
    expect_out(&w);
    expect_value("n", "5 ", 0);
    b_free(&b);
    b_free(&w);
}
END_TEST

START_TEST(test_touch_gat)
{
    bytes b = {0}, w = {0};
    uint8_t x[4], f[4];
    seed("t", "abc", 0x0102);
    int64_t exp_lo = store_exptime_abs(st, 100);

    req(&b, OP_TOUCH, be32(x, 100), 4, "t", NULL, 0);
    ck_assert_int_eq(feed(&b), PROTO_OK);
    /* TOUCH answers the flags only, and the touched item's cas. */
    res(&w, OP_TOUCH, ST_OK, cas_of("t"), be32(f, 0x0102), 4, NULL, 0, NULL,
        0);
    expect_out(&w);

    req(&b, OP_TOUCH, be32(x, 100), 4, "zz", NULL, 0);
    req(&b, OP_GAT, be32(x, 100), 4, "zz", NULL, 0);
    req(&b, OP_GATK, be32(x, 100), 4, "zz", NULL, 0);
    req(&b, OP_GATQ, be32(x, 100), 4, "zz", NULL, 0);
    req(&b, OP_GATKQ, be32(x, 100), 4, "zz", NULL, 0);
    req(&b, OP_NOOP, NULL, 0, NULL, NULL, 0);
    ck_assert_int_eq(feed(&b), PROTO_OK);
    res_err(&w, OP_TOUCH, ST_ENOENT);
    res_err(&w, OP_GAT, ST_ENOENT);
    res(&w, OP_GATK, ST_ENOENT, 0, NULL, 0, "zz", 2, NULL, 0);
    res_ok(&w, OP_NOOP, 0);
    expect_out(&w);

    req(&b, OP_GAT, be32(x, 100), 4, "t", NULL, 0);
    ck_assert_int_eq(feed(&b), PROTO_OK);
    res(&w, OP_GAT, ST_OK, cas_of("t"), f, 4, NULL, 0, "abc", 3);
    expect_out(&w);
    req(&b, OP_GATK, be32(x, 100), 4, "t", NULL, 0);
    ck_assert_int_eq(feed(&b), PROTO_OK);
    res(&w, OP_GATK, ST_OK, cas_of("t"), f, 4, "t", 1, "abc", 3);
    expect_out(&w);
    req(&b, OP_GATKQ, be32(x, 100), 4, "t", NULL, 0);
    ck_assert_int_eq(feed(&b), PROTO_OK);
    res(&w, OP_GATKQ, ST_OK, cas_of("t"), f, 4, "t", 1, "abc", 3);
    expect_out(&w);
    ck_assert_uint_eq(counters.touch_hits, 4);
    ck_assert_uint_eq(counters.touch_misses, 5);

    /* The new expiry is the item's (read around the requests, as the
     * clock may tick between). */
    int64_t exp_hi = store_exptime_abs(st, 100);
    store_item *it = store_get(st, "t", 1);
    ck_assert_ptr_nonnull(it);
    ck_assert_int_ge(store_item_exptime(it), exp_lo);
    ck_assert_int_le(store_item_exptime(it), exp_hi);
    store_item_release(it);

    /* A unix time in the past expires it; touching it then is a miss that
     * counts in get_expired, as in memcached. */
    ck_assert_uint_eq(counters.get_expired, 0);
    uint64_t ct = cas_of("t"); /* touch keeps the cas */
    req(&b, OP_TOUCH, be32(x, 1000000000u), 4, "t", NULL, 0);
    req(&b, OP_TOUCH, be32(x, 100), 4, "t", NULL, 0);
    req(&b, OP_GAT, be32(x, 100), 4, "t", NULL, 0);
    ck_assert_int_eq(feed(&b), PROTO_OK);
    res(&w, OP_TOUCH, ST_OK, ct, f, 4, NULL, 0, NULL, 0);
    res_err(&w, OP_TOUCH, ST_ENOENT);
    res_err(&w, OP_GAT, ST_ENOENT);
    expect_out(&w);
    ck_assert_uint_eq(counters.get_expired, 2);
    b_free(&b);
    b_free(&w);
}
END_TEST

START_TEST(test_expiry_in_set)
{
    bytes b = {0}, w = {0};
    uint8_t e[8];
    int64_t exp_lo = store_exptime_abs(st, 300);
    /* A unix time in the past: stored, then already expired. */
    req(&b, OP_SET, ext_store(e, 0, 1000000000u), 8, "old", "v", 0);
    req(&b, OP_SET, ext_store(e, 0, 300), 8, "soon", "v", 0);
    ck_assert_int_eq(feed(&b), PROTO_OK);
    evbuffer_drain(out, evbuffer_get_length(out));
    req(&b, OP_GET, NULL, 0, "old", NULL, 0);
    ck_assert_int_eq(feed(&b), PROTO_OK);
    res_err(&w, OP_GET, ST_ENOENT);
    expect_out(&w);
    store_item *it = store_get(st, "soon", 4);
    ck_assert_ptr_nonnull(it);
    ck_assert_int_ge(store_item_exptime(it), exp_lo);
    ck_assert_int_le(store_item_exptime(it), store_exptime_abs(st, 300));
    store_item_release(it);
    b_free(&b);
    b_free(&w);
}
END_TEST

START_TEST(test_flush)
{
    bytes b = {0}, w = {0};
    uint8_t x[4];
    seed("a", "1", 0);
    seed("b", "2", 0);

    /* Disabled: AUTH_ERROR, even quiet, and nothing goes. */
    cfg.flush_enabled = false;
    req(&b, OP_FLUSH, NULL, 0, NULL, NULL, 0);
    req(&b, OP_FLUSHQ, NULL, 0, NULL, NULL, 0);
    ck_assert_int_eq(feed(&b), PROTO_OK);
    res_err(&w, OP_FLUSH, ST_AUTH_ERROR);
    res_err(&w, OP_FLUSHQ, ST_AUTH_ERROR);
    expect_out(&w);
    expect_value("a", "1", 0);
    cfg.flush_enabled = true;

    /* A delay: nothing goes yet. */
    req(&b, OP_FLUSH, be32(x, 600), 4, NULL, NULL, 0);
    ck_assert_int_eq(feed(&b), PROTO_OK);
    res_ok(&w, OP_FLUSH, 0);
    expect_out(&w);
    expect_value("a", "1", 0);

    req(&b, OP_FLUSH, NULL, 0, NULL, NULL, 0);
    ck_assert_int_eq(feed(&b), PROTO_OK);
    res_ok(&w, OP_FLUSH, 0);
    expect_out(&w);
    expect_value("a", NULL, 0);
    expect_value("b", NULL, 0);

    uint8_t e[8];
    req(&b, OP_SETQ, ext_store(e, 0, 0), 8, "c", "3", 0);
    req(&b, OP_FLUSHQ, NULL, 0, NULL, NULL, 0);
    req(&b, OP_NOOP, NULL, 0, NULL, NULL, 0);
    ck_assert_int_eq(feed(&b), PROTO_OK);
    res_ok(&w, OP_NOOP, 0);
    expect_out(&w);
    expect_value("c", NULL, 0);
    ck_assert_uint_eq(counters.cmd_flush, 3);
    b_free(&b);
    b_free(&w);
}
END_TEST

/* A stats group with known contents. */
static void probe_group(void *arg, stats_emit_fn emit, void *emit_arg)
{
    (void)arg;
    emit(emit_arg, "probe_a", "1");
    emit(emit_arg, "probe_bb", "twenty-two");
}

START_TEST(test_stat)
{
    bytes b = {0}, w = {0};
    ck_assert_int_eq(stats_register_group("binprobe", probe_group, NULL), 0);

    req(&b, OP_STAT, NULL, 0, "binprobe", NULL, 0);
    ck_assert_int_eq(feed(&b), PROTO_OK);
    res(&w, OP_STAT, ST_OK, 0, NULL, 0, "probe_a", 7, "1", 1);
    res(&w, OP_STAT, ST_OK, 0, NULL, 0, "probe_bb", 8, "twenty-two", 10);
    res_ok(&w, OP_STAT, 0);
    expect_out(&w);

    req(&b, OP_STAT, NULL, 0, "no-such-group", NULL, 0);
    ck_assert_int_eq(feed(&b), PROTO_OK);
    res_err(&w, OP_STAT, ST_ENOENT);
    expect_out(&w);

    req(&b, OP_STAT, NULL, 0, "reset", NULL, 0);
    ck_assert_int_eq(feed(&b), PROTO_OK);
    res_ok(&w, OP_STAT, 0);
    expect_out(&w);

    /* stats detail, as memcached's binary test drives it */
    req(&b, OP_STAT, NULL, 0, "detail on", NULL, 0);
    ck_assert_int_eq(feed(&b), PROTO_OK);
    res_ok(&w, OP_STAT, 0);
    expect_out(&w);
    req(&b, OP_STAT, NULL, 0, "detail dump", NULL, 0);
    ck_assert_int_eq(feed(&b), PROTO_OK);
    res(&w, OP_STAT, ST_OK, 0, NULL, 0, NULL, 0, "END\r\n", 5);
    expect_out(&w);
    req(&b, OP_STAT, NULL, 0, "detail off", NULL, 0);
    ck_assert_int_eq(feed(&b), PROTO_OK);
    res_ok(&w, OP_STAT, 0);
    expect_out(&w);
    req(&b, OP_STAT, NULL, 0, "detail sideways", NULL, 0);
    ck_assert_int_eq(feed(&b), PROTO_OK);
    res_err(&w, OP_STAT, ST_ENOENT);
    expect_out(&w);
    b_free(&b);
    b_free(&w);
}
END_TEST

START_TEST(test_stat_general_shape)
{
    /* The general listing: stat packets, then one empty terminator. */
    bytes b = {0};
    req(&b, OP_STAT, NULL, 0, NULL, NULL, 0);
    ck_assert_int_eq(feed(&b), PROTO_OK);
    size_t n = evbuffer_get_length(out);
    uint8_t *p = evbuffer_pullup(out, (ev_ssize_t)n);
    size_t off = 0, packets = 0;
    bool ended = false;
    while (off + 24 <= n) {
        ck_assert_msg(!ended, "packet after the terminator");
        uint16_t kl = (uint16_t)(p[off + 2] << 8 | p[off + 3]);
        uint32_t bl = (uint32_t)p[off + 8] << 24 | p[off + 9] << 16 |
                      p[off + 10] << 8 | p[off + 11];
        ck_assert_uint_eq(p[off], 0x81);
        ck_assert_uint_eq(p[off + 1], OP_STAT);
        ck_assert_uint_eq(p[off + 6] << 8 | p[off + 7], ST_OK);
        ck_assert_uint_ge(bl, kl);
        if (kl == 0 && bl == 0)
            ended = true;
        off += 24 + bl;
        packets++;
    }
    ck_assert(ended);
    ck_assert_uint_eq(off, n);
    ck_assert_uint_ge(packets, 2);
    b_free(&b);
}
END_TEST

START_TEST(test_verbosity)
{
    bytes b = {0}, w = {0};
    uint8_t x[4];
    req(&b, OP_VERBOSITY, be32(x, 2), 4, NULL, NULL, 0);
    req(&b, OP_NOOP, NULL, 0, NULL, NULL, 0);
    ck_assert_int_eq(feed(&b), PROTO_OK);
    res_ok(&w, OP_VERBOSITY, 0);
    res_ok(&w, OP_NOOP, 0);
    expect_out(&w);
    ck_assert_int_eq(ctx.verbose, 2);
    b_free(&b);
    b_free(&w);
}
END_TEST

START_TEST(test_quit)
{
    bytes b = {0}, w = {0};
    req(&b, OP_QUIT, NULL, 0, NULL, NULL, 0);
    req(&b, OP_NOOP, NULL, 0, NULL, NULL, 0);
    ck_assert_int_eq(feed(&b), PROTO_CLOSE);
    res_ok(&w, OP_QUIT, 0);
    expect_out(&w);
    /* What followed QUIT was not run. */
    ck_assert_uint_eq(evbuffer_get_length(in), 24);
    evbuffer_drain(in, 24);

    req(&b, OP_QUITQ, NULL, 0, NULL, NULL, 0);
    ck_assert_int_eq(feed(&b), PROTO_CLOSE);
    expect_out(&w);
    b_free(&b);
    b_free(&w);
}
END_TEST

START_TEST(test_opaque_echoed)
{
    bytes b = {0}, w = {0};
    pkt_raw(&b, 0x80, OP_NOOP, 0, 0x01020304, 0, NULL, 0, NULL, 0, NULL, 0, -1,
            -1, -1);
    pkt_raw(&b, 0x80, OP_GET, 0, 0xfffffffe, 0, NULL, 0, "m", 1, NULL, 0, -1,
            -1, -1);
    ck_assert_int_eq(feed(&b), PROTO_OK);
    pkt_raw(&w, 0x81, OP_NOOP, 0, 0x01020304, 0, NULL, 0, NULL, 0, NULL, 0, -1,
            -1, -1);
    pkt_raw(&w, 0x81, OP_GET, ST_ENOENT, 0xfffffffe, 0, NULL, 0, NULL, 0,
            "Not found", 9, -1, -1, -1);
    expect_out(&w);
    b_free(&b);
    b_free(&w);
}
END_TEST

START_TEST(test_cas_disabled)
{
    bytes b = {0}, w = {0};
    uint8_t e[8], f[4], a[20], v[8];
    cfg.cas_enabled = false;
    uint64_t cas = seed("k", "v", 0);

    /* Responses carry cas 0; a set with a cas ignores it. */
    req(&b, OP_SET, ext_store(e, 0, 0), 8, "k", "w", cas + 1);
    req(&b, OP_GET, NULL, 0, "k", NULL, 0);
    ck_assert_int_eq(feed(&b), PROTO_OK);
    res_ok(&w, OP_SET, 0);
    res(&w, OP_GET, ST_OK, 0, be32(f, 0), 4, NULL, 0, "w", 1);
    expect_out(&w);

    /* delete and incr with any cas cannot match. */
    req(&b, OP_DELETE, NULL, 0, "k", NULL, cas_of("k"));
    req(&b, OP_DELETE, NULL, 0, "nokey", NULL, 5);
    ck_assert_int_eq(feed(&b), PROTO_OK);
    res_err(&w, OP_DELETE, ST_EEXISTS);
    res_err(&w, OP_DELETE, ST_ENOENT);
    expect_out(&w);
    expect_value("k", "w", 0);
    seed("n", "4", 0);
    req(&b, OP_INCR, ext_arith(a, 1, 0, 0), 20, "n", NULL, 9);
    req(&b, OP_INCR, ext_arith(a, 1, 0, 0), 20, "n", NULL, 0);
    ck_assert_int_eq(feed(&b), PROTO_OK);
    res_err(&w, OP_INCR, ST_EEXISTS);
    res(&w, OP_INCR, ST_OK, 0, NULL, 0, NULL, 0, be64(v, 5), 8);
    expect_out(&w);
    b_free(&b);
    b_free(&w);
}
END_TEST

/* ============================================================== SASL */

START_TEST(test_sasl_required)
{
    bytes b = {0}, w = {0};
    snapshot before;
    sasl_on();
    seed("seed", "seedvalue", 5);
    before = snap();

    /* VERSION and LIST_MECHS are allowed; anything else ends it all. */
    req(&b, OP_VERSION, NULL, 0, NULL, NULL, 0);
    req(&b, OP_SASL_LIST, NULL, 0, NULL, NULL, 0);
    req(&b, OP_GETQ, NULL, 0, "seed", NULL, 0);
    req(&b, OP_NOOP, NULL, 0, NULL, NULL, 0);
    ck_assert_int_eq(feed(&b), PROTO_CLOSE);
    res(&w, OP_VERSION, ST_OK, 0, NULL, 0, NULL, 0, VERSION_STR,
        strlen(VERSION_STR));
    res(&w, OP_SASL_LIST, ST_OK, 0, NULL, 0, NULL, 0, "PLAIN", 5);
    res_err(&w, OP_GETQ, ST_AUTH_ERROR);
    expect_out(&w);
    expect_unchanged(&before);

    /* Unknown opcodes too. */
    evbuffer_drain(in, evbuffer_get_length(in));
    req(&b, 0x50, NULL, 0, NULL, NULL, 0);
    ck_assert_int_eq(feed(&b), PROTO_CLOSE);
    res_err(&w, 0x50, ST_AUTH_ERROR);
    expect_out(&w);
    expect_unchanged(&before);
    b_free(&b);
    b_free(&w);
}
END_TEST

START_TEST(test_sasl_plain)
{
    bytes b = {0}, w = {0};
    uint8_t e[8];
    static const char good[] = "\0alice\0s3cret";
    static const char good_zid[] = "alice\0alice\0s3cret";
    static const char bad_pass[] = "\0alice\0wrong";
    static const char bad_user[] = "\0bob\0s3cret";
    static const char other_zid[] = "bob\0alice\0s3cret";
    static const char malformed[] = "alice-s3cret";
    sasl_on();

    /* Failures answer AUTH_ERROR and keep the connection. */
    pkt_raw(&b, 0x80, OP_SASL_AUTH, 0, OPQ, 0, NULL, 0, "PLAIN", 5, bad_pass,
            sizeof(bad_pass) - 1, -1, -1, -1);
    pkt_raw(&b, 0x80, OP_SASL_AUTH, 0, OPQ, 0, NULL, 0, "PLAIN", 5, bad_user,
            sizeof(bad_user) - 1, -1, -1, -1);
    pkt_raw(&b, 0x80, OP_SASL_AUTH, 0, OPQ, 0, NULL, 0, "PLAIN", 5, other_zid,
            sizeof(other_zid) - 1, -1, -1, -1);
    pkt_raw(&b, 0x80, OP_SASL_AUTH, 0, OPQ, 0, NULL, 0, "PLAIN", 5, malformed,
            sizeof(malformed) - 1, -1, -1, -1);
    pkt_raw(&b, 0x80, OP_SASL_AUTH, 0, OPQ, 0, NULL, 0, "CRAM-MD5", 8, good,
            sizeof(good) - 1, -1, -1, -1);
    pkt_raw(&b, 0x80, OP_SASL_STEP, 0, OPQ, 0, NULL, 0, "PLAIN", 5, good,
            sizeof(good) - 1, -1, -1, -1);
    ck_assert_int_eq(feed(&b), PROTO_OK);
    for (int i = 0; i < 5; i++)
        res_err(&w, OP_SASL_AUTH, ST_AUTH_ERROR);
    res_err(&w, OP_SASL_STEP, ST_AUTH_ERROR);
    expect_out(&w);
    ck_assert(!ctx.authenticated);
    ck_assert_uint_eq(counters.auth_errors, 6);

    pkt_raw(&b, 0x80, OP_SASL_AUTH, 0, OPQ, 0, NULL, 0, "PLAIN", 5, good,
            sizeof(good) - 1, -1, -1, -1);
    req(&b, OP_SET, ext_store(e, 0, 0), 8, "k", "v", 0);
    ck_assert_int_eq(feed(&b), PROTO_OK);
    res(&w, OP_SASL_AUTH, ST_OK, 0, NULL, 0, NULL, 0, "Authenticated", 13);
    res_ok(&w, OP_SET, cas_of("k"));
    expect_out(&w);
    ck_assert(ctx.authenticated);

    /* A new, failing attempt drops the login, as in memcached. */
    pkt_raw(&b, 0x80, OP_SASL_AUTH, 0, OPQ, 0, NULL, 0, "PLAIN", 5, bad_pass,
            sizeof(bad_pass) - 1, -1, -1, -1);
    ck_assert_int_eq(feed(&b), PROTO_OK);
    res_err(&w, OP_SASL_AUTH, ST_AUTH_ERROR);
    expect_out(&w);
    ck_assert(!ctx.authenticated);

    /* PLAIN without data: AUTH_CONTINUE, then STEP carries it. */
    pkt_raw(&b, 0x80, OP_SASL_AUTH, 0, OPQ, 0, NULL, 0, "plain", 5, NULL, 0,
            -1, -1, -1);
    pkt_raw(&b, 0x80, OP_SASL_STEP, 0, OPQ, 0, NULL, 0, "PLAIN", 5, good_zid,
            sizeof(good_zid) - 1, -1, -1, -1);
    req(&b, OP_NOOP, NULL, 0, NULL, NULL, 0);
    ck_assert_int_eq(feed(&b), PROTO_OK);
    res(&w, OP_SASL_AUTH, ST_AUTH_CONTINUE, 0, NULL, 0, NULL, 0, NULL, 0);
    res(&w, OP_SASL_STEP, ST_OK, 0, NULL, 0, NULL, 0, "Authenticated", 13);
    res_ok(&w, OP_NOOP, 0);
    expect_out(&w);
    ck_assert(ctx.authenticated);
    b_free(&b);
    b_free(&w);
}
END_TEST

START_TEST(test_sasl_limits)
{
    /* An over-long mechanism name or PLAIN message: EINVAL, the body is
     * dropped and the connection goes on. */
    bytes b = {0}, w = {0};
    char mech[41], data[1100];
    sasl_on();
    memset(mech, 'M', 40);
    mech[40] = '\0';
    memset(data, 'd', sizeof(data));
    pkt_raw(&b, 0x80, OP_SASL_AUTH, 0, OPQ, 0, NULL, 0, mech, 40, "x", 1, -1,
            -1, -1);
    pkt_raw(&b, 0x80, OP_SASL_AUTH, 0, OPQ, 0, NULL, 0, "PLAIN", 5, data,
            sizeof(data), -1, -1, -1);
    req(&b, OP_SASL_LIST, NULL, 0, NULL, NULL, 0);
    ck_assert_int_eq(feed(&b), PROTO_OK);
    res_err(&w, OP_SASL_AUTH, ST_EINVAL);
    res_err(&w, OP_SASL_AUTH, ST_EINVAL);
    res(&w, OP_SASL_LIST, ST_OK, 0, NULL, 0, NULL, 0, "PLAIN", 5);
    expect_out(&w);
    ck_assert_uint_eq(evbuffer_get_length(in), 0);
    ck_assert(!ctx.authenticated);
    b_free(&b);
    b_free(&w);
}
END_TEST

START_TEST(test_sasl_disabled)
{
    bytes b = {0}, w = {0};
    static const char good[] = "\0alice\0s3cret";
    req(&b, OP_SASL_LIST, NULL, 0, NULL, NULL, 0);
    pkt_raw(&b, 0x80, OP_SASL_AUTH, 0, OPQ, 0, NULL, 0, "PLAIN", 5, good,
            sizeof(good) - 1, -1, -1, -1);
    ck_assert_int_eq(feed(&b), PROTO_OK);
    res_err(&w, OP_SASL_LIST, ST_UNKNOWN);
    res_err(&w, OP_SASL_AUTH, ST_UNKNOWN);
    expect_out(&w);
    expect_alive();
    b_free(&b);
    b_free(&w);
}
END_TEST

/* ======================================================== robustness */

START_TEST(test_truncated_header_waits)
{
    bytes b = {0}, w = {0};
    uint8_t e[8];
    seed("seed", "seedvalue", 5);
    snapshot before = snap();
    req(&b, OP_SET, ext_store(e, 1, 0), 8, "key", "value", 0);
    bytes whole = b;
    memset(&b, 0, sizeof(b));
    /* One byte at a time: silence until the last byte. */
    for (size_t i = 0; i + 1 < whole.n; i++) {
        ck_assert_int_eq(evbuffer_add(in, whole.p + i, 1), 0);
        ck_assert_int_eq(proto_bin_execute(&ctx, in, out), PROTO_OK);
        ck_assert_uint_eq(evbuffer_get_length(out), 0);
        ck_assert_uint_eq(evbuffer_get_length(in), i + 1);
    }
    expect_unchanged(&before);
    ck_assert_int_eq(evbuffer_add(in, whole.p + whole.n - 1, 1), 0);
    ck_assert_int_eq(proto_bin_execute(&ctx, in, out), PROTO_OK);
    res_ok(&w, OP_SET, cas_of("key"));
    expect_out(&w);
    expect_value("key", "value", 1);
    expect_alive();
    b_free(&whole);
    b_free(&w);
}
END_TEST

START_TEST(test_bad_magic_closes)
{
    bytes b = {0}, w = {0};
    seed("seed", "seedvalue", 5);
    snapshot before = snap();

    /* A response magic, then a text command: closed without a reply. */
    pkt_raw(&b, 0x81, OP_NOOP, 0, OPQ, 0, NULL, 0, NULL, 0, NULL, 0, -1, -1,
            -1);
    ck_assert_int_eq(feed(&b), PROTO_CLOSE);
    expect_out(&w);
    expect_unchanged(&before);
    expect_new_conn_alive();

    /* A good request, then a text command: the first is answered. */
    req(&b, OP_NOOP, NULL, 0, NULL, NULL, 0);
    b_add(&b, "get seed\r\nget seed\r\nget seed\r\n", 30);
    ck_assert_int_eq(feed(&b), PROTO_CLOSE);
    res_ok(&w, OP_NOOP, 0);
    expect_out(&w);
    expect_unchanged(&before);
    expect_new_conn_alive();
    b_free(&b);
    b_free(&w);
}
END_TEST

START_TEST(test_key_ext_past_body_closes)
{
    bytes b = {0}, w = {0};
    uint8_t e[8];
    seed("seed", "seedvalue", 5);
    snapshot before = snap();
    /* keylen 4 + extlen 8 > bodylen 10: memcached answers
     * UNKNOWN_COMMAND and closes. */
    pkt_raw(&b, 0x80, OP_SET, 0, OPQ, 0, ext_store(e, 0, 0), 8, "seed", 4,
            "xx", 2, -1, -1, 10);
    ck_assert_int_eq(feed(&b), PROTO_CLOSE);
    res_err(&w, OP_SET, ST_UNKNOWN);
    expect_out(&w);
    expect_unchanged(&before);
    expect_new_conn_alive();

    pkt_raw(&b, 0x80, OP_GET, 0, OPQ, 0, NULL, 0, "seed", 4, NULL, 0, -1, -1,
            3);
    ck_assert_int_eq(feed(&b), PROTO_CLOSE);
    res_err(&w, OP_GET, ST_UNKNOWN);
    expect_out(&w);
    expect_unchanged(&before);
    expect_new_conn_alive();
    ck_assert_uint_eq(counters.protocol_errors, 2);
    b_free(&b);
    b_free(&w);
}
END_TEST

START_TEST(test_huge_bodylen_closes)
{
    bytes b = {0}, w = {0};
    uint8_t e[8];
    static const uint32_t lens[] = {0xffffffffu, 0xfffffff0u,
                                    1024u * 1024u * 1024u + 1u};
    seed("seed", "seedvalue", 5);
    snapshot before = snap();
    for (size_t i = 0; i < 3; i++) {
        /* Only the header and a little body are ever sent. */
        pkt_raw(&b, 0x80, OP_SET, 0, OPQ, 0, ext_store(e, 0, 0), 8, "seed", 4,
                "abc", 3, -1, -1, lens[i]);
        ck_assert_int_eq(feed(&b), PROTO_CLOSE);
        res_err(&w, OP_SET, ST_EINVAL);
        expect_out(&w);
        expect_unchanged(&before);
        expect_new_conn_alive();
    }
    b_free(&b);
    b_free(&w);
}
END_TEST

START_TEST(test_too_large_value_is_discarded)
{
    bytes b = {0}, w = {0};
    uint8_t e[8];
    enum { CHUNK = 4096 };
    static char chunk[CHUNK];
    seed("seed", "seedvalue", 5);
    snapshot before = snap();
    memset(chunk, 'z', sizeof(chunk));

    /* SETQ of 16 item sizes: E2BIG at once, quiet or not, and the body
     * is dropped as it arrives, never held. */
    uint32_t vlen = 16 * ITEM_MAX;
    pkt_raw(&b, 0x80, OP_SETQ, 0, OPQ, 0, ext_store(e, 0, 0), 8, "seed", 4,
            NULL, 0, -1, -1, 12 + (long long)vlen);
    ck_assert_int_eq(feed(&b), PROTO_OK);
    res_err(&w, OP_SETQ, ST_E2BIG);
    expect_out(&w);
    for (uint32_t sent = 0; sent < vlen; sent += CHUNK) {
        ck_assert_int_eq(evbuffer_add(in, chunk, CHUNK), 0);
        ck_assert_int_eq(proto_bin_execute(&ctx, in, out), PROTO_OK);
        ck_assert_uint_eq(evbuffer_get_length(in), 0);
        ck_assert_uint_eq(evbuffer_get_length(out), 0);
    }
    /* As memcached (and the text protocol): the refused SET removed the
     * key, through one delete, so the old value is not served. */
    {
        store_item *it = store_get(st, "seed", 4);
        ck_assert_ptr_null(it);
        snapshot gone = snap();
        ck_assert_uint_eq(gone.curr_items, before.curr_items - 1);
        ck_assert_uint_eq(gone.mutations, before.mutations);
    }
    seed("seed", "seedvalue", 5);
    before = snap();
    expect_alive();

    /* The same with the tail of the body and the next request in one
     * buffer, and for APPEND (no extras): the key stays. */
    pkt_raw(&b, 0x80, OP_APPEND, 0, OPQ, 0, NULL, 0, "seed", 4, NULL, 0, -1,
            -1, 4 + (long long)ITEM_MAX + 1);
    b_add(&b, chunk, CHUNK);
    ck_assert_int_eq(feed(&b), PROTO_OK);
    res_err(&w, OP_APPEND, ST_E2BIG);
    expect_out(&w);
    ck_assert_uint_eq(evbuffer_get_length(in), 0);
    for (uint32_t left = ITEM_MAX + 1 - CHUNK; left > 0;) {
        uint32_t n = left < CHUNK ? left : CHUNK;
        b_add(&b, chunk, n);
        left -= n;
    }
    req(&b, OP_NOOP, NULL, 0, NULL, NULL, 0);
    ck_assert_int_eq(feed(&b), PROTO_OK);
    res_ok(&w, OP_NOOP, 0);
    expect_out(&w);
    expect_unchanged(&before);
    expect_alive();
    ck_assert_uint_eq(counters.store_too_large, 2);
    b_free(&b);
    b_free(&w);
}
END_TEST

START_TEST(test_value_at_limit_is_buffered)
{
    /* A value just under the limit is taken whole, whatever the chunks. */
    bytes b = {0}, w = {0};
    uint8_t e[8];
    size_t n = ITEM_MAX - 200;
    char *v = malloc(n + 1);
    ck_assert_ptr_nonnull(v);
    memset(v, 'q', n);
    v[n] = '\0';
    req(&b, OP_SET, ext_store(e, 0, 0), 8, "lim", v, 0);
    for (size_t off = 0; off < b.n; off += 1000) {
        size_t k = b.n - off < 1000 ? b.n - off : 1000;
        ck_assert_int_eq(evbuffer_add(in, b.p + off, k), 0);
        ck_assert_int_eq(proto_bin_execute(&ctx, in, out), PROTO_OK);
    }
    b.n = 0;
    res_ok(&w, OP_SET, cas_of("lim"));
    expect_out(&w);
    expect_value("lim", v, 0);
    free(v);
    b_free(&b);
    b_free(&w);
}
END_TEST

START_TEST(test_long_key_closes)
{
    bytes b = {0}, w = {0};
    uint8_t e[8];
    char key[252];
    seed("seed", "seedvalue", 5);
    snapshot before = snap();
    memset(key, 'k', 251);
    key[251] = '\0';
    req(&b, OP_SET, ext_store(e, 0, 0), 8, key, "v", 0);
    ck_assert_int_eq(feed(&b), PROTO_CLOSE);
    res_err(&w, OP_SET, ST_EINVAL);
    expect_out(&w);
    expect_unchanged(&before);
    expect_new_conn_alive();

    /* 250 is fine. */
    key[250] = '\0';
    req(&b, OP_GETK, NULL, 0, key, NULL, 0);
    ck_assert_int_eq(feed(&b), PROTO_OK);
    res(&w, OP_GETK, ST_ENOENT, 0, NULL, 0, key, 250, NULL, 0);
    expect_out(&w);
    b_free(&b);
    b_free(&w);
}
END_TEST

START_TEST(test_wrong_extlen_closes)
{
    /* Each: lengths that do not fit the opcode -> EINVAL and close. */
    struct {
        uint8_t op;
        size_t next;
        const char *key;
        const char *val;
    } cases[] = {
        {OP_GET, 4, "seed", NULL},     {OP_GETQ, 0, NULL, NULL},
        {OP_GET, 0, "seed", "x"},      {OP_SET, 4, "seed", "v"},
        {OP_SET, 8, NULL, "v"},        {OP_ADDQ, 12, "seed", "v"},
        {OP_APPEND, 4, "seed", "v"},   {OP_PREPEND, 0, NULL, "v"},
        {OP_DELETE, 4, "seed", NULL},  {OP_DELETE, 0, "seed", "v"},
        {OP_INCR, 8, "seed", NULL},    {OP_DECR, 20, "seed", "v"},
        {OP_INCR, 20, NULL, NULL},     {OP_TOUCH, 0, "seed", NULL},
        {OP_GAT, 8, "seed", NULL},     {OP_GATK, 4, NULL, NULL},
        {OP_TOUCH, 4, "seed", "v"},    {OP_NOOP, 0, NULL, "v"},
        {OP_NOOP, 4, NULL, NULL},      {OP_VERSION, 0, "k", NULL},
        {OP_QUIT, 0, NULL, "v"},       {OP_FLUSH, 2, NULL, NULL},
        {OP_FLUSH, 0, "k", NULL},      {OP_FLUSH, 4, NULL, "v"},
        {OP_STAT, 4, NULL, NULL},      {OP_STAT, 0, "items", "v"},
        {OP_VERBOSITY, 0, NULL, NULL}, {OP_SASL_LIST, 0, NULL, "v"},
        {OP_SASL_AUTH, 0, NULL, "x"},  {OP_SASL_AUTH, 4, "PLAIN", "x"},
    };
    static const uint8_t zeros[32];
    bytes b = {0}, w = {0};
    seed("seed", "seedvalue", 5);
    snapshot before = snap();
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        req(&b, cases[i].op, zeros, cases[i].next, cases[i].key, cases[i].val,
            0);
        ck_assert_msg(feed(&b) == PROTO_CLOSE, "case %zu not closed", i);
        res_err(&w, cases[i].op, ST_EINVAL);
        expect_out(&w);
        expect_unchanged(&before);
        expect_new_conn_alive();
    }
    b_free(&b);
    b_free(&w);
}
END_TEST

START_TEST(test_unknown_opcode_skipped)
{
    bytes b = {0}, w = {0};
    static const uint8_t ext[3] = {1, 2, 3};
    seed("seed", "seedvalue", 5);
    snapshot before = snap();
    /* A body of extras, key and value, all skipped; the NOOP after it in
     * the same buffer is answered. */
    pkt_raw(&b, 0x80, 0x50, 0, OPQ, 0, ext, 3, "seed", 4, "abcdef", 6, -1, -1,
            -1);
    pkt_raw(&b, 0x80, 0xff, 0, OPQ, 0, NULL, 0, NULL, 0, NULL, 0, -1, -1, -1);
    req(&b, OP_NOOP, NULL, 0, NULL, NULL, 0);
    ck_assert_int_eq(feed(&b), PROTO_OK);
    res_err(&w, 0x50, ST_UNKNOWN);
    res_err(&w, 0xff, ST_UNKNOWN);
    res_ok(&w, OP_NOOP, 0);
    expect_out(&w);
    expect_unchanged(&before);

    /* A body that arrives later is skipped as it comes. */
    pkt_raw(&b, 0x80, 0x42, 0, OPQ, 0, NULL, 0, NULL, 0, NULL, 0, -1, -1,
            5000);
    ck_assert_int_eq(feed(&b), PROTO_OK);
    res_err(&w, 0x42, ST_UNKNOWN);
    expect_out(&w);
    char junk[1000];
    memset(junk, 0x80, sizeof(junk));
    for (int i = 0; i < 5; i++) {
        b_add(&b, junk, sizeof(junk));
        ck_assert_int_eq(feed(&b), PROTO_OK);
        ck_assert_uint_eq(evbuffer_get_length(in), 0);
    }
    expect_out(&w);
    expect_unchanged(&before);
    expect_alive();
    b_free(&b);
    b_free(&w);
}
END_TEST

START_TEST(test_quiet_stream_then_noop)
{
    bytes b = {0}, w = {0};
    uint8_t e[8], a[20], f[4];
    req(&b, OP_SETQ, ext_store(e, 1, 0), 8, "a", "1", 0);
    req(&b, OP_SETQ, ext_store(e, 2, 0), 8, "b", "2", 0);
    req(&b, OP_SETQ, ext_store(e, 4, 0), 8, "c", "3", 0);
    req(&b, OP_GETQ, NULL, 0, "missing", NULL, 0);
    req(&b, OP_GETKQ, NULL, 0, "c", NULL, 0);
    req(&b, OP_ADDQ, ext_store(e, 0, 0), 8, "a", "x", 0);
    req(&b, OP_REPLACEQ, ext_store(e, 3, 0), 8, "b", "22", 0);
    req(&b, OP_APPENDQ, NULL, 0, "b", "2", 0);
    req(&b, OP_INCRQ, ext_arith(a, 5, 0, 0), 20, "a", NULL, 0);
    req(&b, OP_DELETEQ, NULL, 0, "missing", NULL, 0);
    req(&b, OP_DELETEQ, NULL, 0, "a", NULL, 0);
    req(&b, OP_GETQ, NULL, 0, "b", NULL, 0);
    req(&b, OP_NOOP, NULL, 0, NULL, NULL, 0);
    ck_assert_int_eq(feed(&b), PROTO_OK);
    /* Everything succeeded silently except the errors and the hits. */
    res(&w, OP_GETKQ, ST_OK, cas_of("c"), be32(f, 4), 4, "c", 1, "3", 1);
    res_err(&w, OP_ADDQ, ST_EEXISTS);
    res_err(&w, OP_DELETEQ, ST_ENOENT);
    res(&w, OP_GETQ, ST_OK, cas_of("b"), be32(f, 3), 4, NULL, 0, "222", 3);
    res_ok(&w, OP_NOOP, 0);
    expect_out(&w);
    expect_value("a", NULL, 0);
    expect_value("b", "222", 3);
    expect_value("c", "3", 4);
    b_free(&b);
    b_free(&w);
}
END_TEST

/*
 * A client that pipelines more than it reads: the parser stops taking
 * requests once `out` holds more than output_max, and goes on where it
 * stopped when run again after the output drained.
 */
START_TEST(test_output_max_pauses_between_requests)
{
    char value[601];
    memset(value, 'v', 600);
    value[600] = '\0';
    seed("big", value, 0);
    evbuffer_drain(out, evbuffer_get_length(out));
    cfg.output_max = 1000;
    bytes b = {0};
    for (int i = 0; i < 10; i++)
        req(&b, OP_GET, NULL, 0, "big", NULL, 0);
    ck_assert_int_eq(feed(&b), PROTO_PAUSED);
    size_t reply = 24 + 4 + 600;
    size_t got = 0;
    int rounds = 0;
    for (;;) {
        size_t len = evbuffer_get_length(out);
        /* Two replies pass the 1000-byte mark: the third waits. */
        ck_assert_uint_le(len, 2 * reply);
        ck_assert_uint_eq(len % reply, 0);
        got += len / reply;
        evbuffer_drain(out, len);
        rounds++;
        if (evbuffer_get_length(in) == 0 || rounds == 20)
            break;
        int rc = proto_bin_execute(&ctx, in, out);
        ck_assert_int_eq(rc,
                         (evbuffer_get_length(in) ? PROTO_PAUSED : PROTO_OK));
    }
    ck_assert_uint_eq(got, 10);
    ck_assert_int_eq(rounds, 5);
    b_free(&b);
    cfg.output_max = 0;
}
END_TEST

static Suite *proto_bin_suite(void)
{
    Suite *s = suite_create("proto_bin");
    TCase *tc = tcase_create("commands");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_noop_version_literal);
    tcase_add_test(tc, test_get_miss);
    tcase_add_test(tc, test_set_get);
    tcase_add_test(tc, test_large_value_by_reference);
    tcase_add_test(tc, test_add_replace);
    tcase_add_test(tc, test_cas);
    tcase_add_test(tc, test_append_prepend);
    tcase_add_test(tc, test_delete);
    tcase_add_test(tc, test_incr_decr);
    tcase_add_test(tc, test_touch_gat);
    tcase_add_test(tc, test_expiry_in_set);
    tcase_add_test(tc, test_flush);
    tcase_add_test(tc, test_stat);
    tcase_add_test(tc, test_stat_general_shape);
    tcase_add_test(tc, test_verbosity);
    tcase_add_test(tc, test_quit);
    tcase_add_test(tc, test_opaque_echoed);
    tcase_add_test(tc, test_cas_disabled);
    suite_add_tcase(s, tc);

    tc = tcase_create("sasl");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_sasl_required);
    tcase_add_test(tc, test_sasl_plain);
    tcase_add_test(tc, test_sasl_limits);
    tcase_add_test(tc, test_sasl_disabled);
    suite_add_tcase(s, tc);

    tc = tcase_create("robustness");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_truncated_header_waits);
    tcase_add_test(tc, test_bad_magic_closes);
    tcase_add_test(tc, test_key_ext_past_body_closes);
    tcase_add_test(tc, test_huge_bodylen_closes);
    tcase_add_test(tc, test_too_large_value_is_discarded);
    tcase_add_test(tc, test_value_at_limit_is_buffered);
    tcase_add_test(tc, test_long_key_closes);
    tcase_add_test(tc, test_wrong_extlen_closes);
    tcase_add_test(tc, test_unknown_opcode_skipped);
    tcase_add_test(tc, test_quiet_stream_then_noop);
    tcase_add_test(tc, test_output_max_pauses_between_requests);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(proto_bin_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
