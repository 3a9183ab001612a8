/*
 * check_store.c -- unit tests of the versioned mutation store: versions and
 * last writer wins, every write mode, tombstones and sweep, expiry and
 * flush on a fake clock, the set invariant (equal sets give equal
 * sketches), eviction under a memory limit, and a threaded smoke test.
 */
#include <check.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chunk.h"
#include "store.h"

#define NS 1000000000ULL
#define T0 (1700000000ULL * NS)

/* ------------------------------------------------------------ helpers */

typedef struct fake_clock {
    uint64_t ns;
} fake_clock;

static uint64_t fake_now(void *arg)
{
    return __atomic_load_n(&((fake_clock *)arg)->ns, __ATOMIC_RELAXED);
}

static void advance(fake_clock *c, uint64_t secs)
{
    __atomic_fetch_add(&c->ns, secs * NS, __ATOMIC_RELAXED);
}

/* A store with a record table of rec_bytes (see store_options). */
#define KEY_TABLE_ROOM ((1u << 14) * sizeof(void *))

static store *mk_sketch(fake_clock *c, uint32_t node, size_t limit,
                        size_t rec_bytes, size_t sketch_symbols)
{
    store_options o;
    int err = 99;
    store *s;

    store_options_default(&o);
    o.node_id = node;
    /* limit is the room for items and records; the key table is counted
     * against the limit too: with a limit, 2^14 buckets (4 a stripe), which
     * the few hundred items a limited test holds never make grow. */
    o.memory_limit = limit ? limit + KEY_TABLE_ROOM : 0;
    o.sketch_symbols = sketch_symbols;
    o.hash_power = limit ? 14 : 8;
    o.tombstone_grace = 100;
    o.evict_record_bytes = rec_bytes;
    o.clock = fake_now;
    o.clock_arg = c;
    s = store_create(&o, &err);
    ck_assert_ptr_nonnull(s);
    ck_assert_int_eq(err, STORE_OK);
    return s;
}

static store *mk_rec(fake_clock *c, uint32_t node, size_t limit,
                     size_t rec_bytes)
{
    return mk_sketch(c, node, limit, rec_bytes, 256);
}

/* A store without records: evictions leave nothing (a lone node). */
static store *mk(fake_clock *c, uint32_t node, size_t limit)
{
    return mk_rec(c, node, limit, 0);
}

static int wr(store *s, enum store_set_mode mode, const char *k, const char *v,
              uint32_t flags, int64_t exptime, uint64_t cas, uint64_t *cas_out)
{
    store_write w;

    memset(&w, 0, sizeof(w));
    w.mode = mode;
    w.key = k;
    w.nkey = strlen(k);
    w.value = v;
    w.nvalue = strlen(v);
    w.flags = flags;
    w.exptime = exptime;
    w.cas = cas;
    return store_write_item(s, &w, cas_out);
}

static int set(store *s, const char *k, const char *v)
{
    return wr(s, STORE_SET, k, v, 0, 0, 0, NULL);
}

/* Asserts key k holds exactly value v (NULL: a miss). */
static void expect(store *s, const char *k, const char *v)
{
    store_item *it = store_get(s, k, strlen(k));
    if (v == NULL) {
        ck_assert_msg(it == NULL, "key %s should be a miss", k);
        return;
    }
    ck_assert_msg(it != NULL, "key %s should hold %s", k, v);
    size_t n;
    const char *val = store_item_value(it, &n);
    ck_assert_uint_eq(n, strlen(v));
    ck_assert_msg(memcmp(val, v, n) == 0, "key %s: got %.*s want %s", k,
                  (int)n, val, v);
    store_item_release(it);
}

static uint64_t cas_of(store *s, const char *k)
{
    store_item *it = store_get(s, k, strlen(k));
    ck_assert_ptr_nonnull(it);
    uint64_t c = store_item_cas(it);
    store_item_release(it);
    return c;
}

static store_stats stats(store *s)
{
    store_stats st;
    store_get_stats(s, &st);
    return st;
}

static int64_t set_size(store *s)
{
    int64_t n = -1;
    ck_assert_int_eq(store_sketch_read(s, 0, NULL, 0, &n), STORE_OK);
    return n;
}

/*
 * A peer mutation with cas `cas` (non-zero for a value). Its id follows from
 * key and version: apply() sets it after the caller's changes.
 */
static store_mutation mut(uint64_t cas, uint64_t ticks, uint32_t node,
                          uint8_t kind, const char *k, const char *v)
{
    store_mutation m;
    memset(&m, 0, sizeof(m));
    m.cas = cas;
    m.version.ticks = ticks;
    m.version.node = node;
    m.kind = kind;
    m.key = k;
    m.nkey = k ? strlen(k) : 0;
    m.value = v;
    m.nvalue = v ? strlen(v) : 0;
    m.id = store_mutation_id(&m);
    return m;
}

/* store_apply of m with its id set from key and version. */
static int apply(store *s, store_mutation *m)
{
    m->id = store_mutation_id(m);
    return store_apply(s, m);
}

/* Compares the whole sketches (and so the sets) of two stores. */
static void same_sketch(store *a, store *b)
{
    size_t n = store_sketch_symbols(a);
    riblt_symbol *x = calloc(n, sizeof(*x)), *y = calloc(n, sizeof(*y));
    int64_t na, nb;

    ck_assert_uint_eq(n, store_sketch_symbols(b));
    ck_assert_int_eq(store_sketch_read(a, 0, x, n, &na), STORE_OK);
    ck_assert_int_eq(store_sketch_read(b, 0, y, n, &nb), STORE_OK);
    ck_assert_int_eq(na, nb);
    ck_assert_msg(memcmp(x, y, n * sizeof(*x)) == 0, "sketches differ");
    free(x);
    free(y);
}

/* Listener that records every mutation it is told about. */
typedef struct recorder {
    pthread_mutex_t lock;
    store_item *items[4096];
    bool local[4096];
    size_t n;
} recorder;

static void record(void *arg, store_item *it, bool origin_local)
{
    recorder *r = arg;
    pthread_mutex_lock(&r->lock);
    if (r->n < 4096) {
        r->local[r->n] = origin_local;
        r->items[r->n++] = it;
    } else {
        store_item_release(it);
    }
    pthread_mutex_unlock(&r->lock);
}

static void recorder_init(recorder *r)
{
    memset(r, 0, sizeof(*r));
    pthread_mutex_init(&r->lock, NULL);
}

static void recorder_free(recorder *r)
{
    for (size_t i = 0; i < r->n; i++)
        store_item_release(r->items[i]);
    pthread_mutex_destroy(&r->lock);
}

/* ------------------------------------------------------------- tests */

START_TEST(test_version_cmp)
{
    store_version a = {100, 1}, b = {100, 2}, c = {101, 1}, d = {100, 1};
    ck_assert_int_lt(store_version_cmp(&a, &b), 0);
    ck_assert_int_gt(store_version_cmp(&b, &a), 0);
    ck_assert_int_lt(store_version_cmp(&b, &c), 0);
    ck_assert_int_gt(store_version_cmp(&c, &b), 0);
    ck_assert_int_eq(store_version_cmp(&a, &d), 0);
}
END_TEST

START_TEST(test_create_invalid)
{
    store_options o;
    int err = 0;
    store_options_default(&o);
    ck_assert_uint_eq(o.memory_limit, 64u << 20);
    ck_assert_uint_eq(o.item_size_max, 1u << 20);
    ck_assert_uint_eq(o.tombstone_grace, 3600);
    ck_assert_uint_eq(o.sketch_symbols, 8192);
    o.item_size_max = 0;
    ck_assert_ptr_null(store_create(&o, &err));
    ck_assert_int_eq(err, STORE_ERR_INVAL);
    ck_assert_ptr_null(store_create(NULL, &err));
    ck_assert_int_eq(err, STORE_ERR_INVAL);
}
END_TEST

START_TEST(test_hybrid_clock)
{
    fake_clock c = {T0};
    store *s = mk(&c, 1, 0);
    uint64_t c1, c2;

    /* The fake clock stands still: ticks still strictly increase. */
    ck_assert_int_eq(wr(s, STORE_SET, "a", "1", 0, 0, 0, &c1), STORE_STORED);
    ck_assert_int_eq(wr(s, STORE_SET, "a", "2", 0, 0, 0, &c2), STORE_STORED);
    ck_assert_uint_ne(c1, c2);
    ck_assert_uint_eq(stats(s).clock_ticks, T0 + 1);
    /* A peer far ahead pulls the clock with it. */
    store_mutation m = mut(55, T0 + 5000, 9, STORE_KIND_VALUE, "p", "x");
    ck_assert_int_eq(apply(s, &m), STORE_OK);
    ck_assert_uint_ge(store_clock_now(s).ticks, T0 + 5000);
    store_item *it;
    ck_assert_int_eq(set(s, "q", "y"), STORE_STORED);
    it = store_get(s, "q", 1);
    store_mutation out;
    store_item_mutation(it, &out);
    ck_assert_uint_eq(out.version.ticks, T0 + 5001);
    ck_assert_uint_eq(out.version.node, 1);
    store_item_release(it);
    store_destroy(s);
}
END_TEST

START_TEST(test_exptime_abs)
{
    fake_clock c = {T0};
    store *s = mk(&c, 1, 0);
    int64_t now = (int64_t)(T0 / NS);
    ck_assert_int_eq(store_exptime_abs(s, 0), 0);
    ck_assert_int_eq(store_exptime_abs(s, -5), -1);
    ck_assert_int_eq(store_exptime_abs(s, 10), now + 10);
    ck_assert_int_eq(store_exptime_abs(s, 2592000), now + 2592000);
    ck_assert_int_eq(store_exptime_abs(s, now + 99), now + 99);
    ck_assert_int_eq(store_exptime_abs(s, 2592001), -1);
    ck_assert_int_eq(store_exptime_abs(s, now), -1);
    store_destroy(s);
}
END_TEST

START_TEST(test_set_get)
{
    fake_clock c = {T0};
    store *s = mk(&c, 1, 0);
    uint64_t cas = 0;

    ck_assert_int_eq(wr(s, STORE_SET, "k", "hello", 42, 0, 0, &cas),
                     STORE_STORED);
    ck_assert_uint_ne(cas, 0);
    store_item *it = store_get(s, "k", 1);
    ck_assert_ptr_nonnull(it);
    ck_assert_uint_eq(store_item_flags(it), 42);
    ck_assert_uint_eq(store_item_cas(it), cas);
    ck_assert_int_eq(store_item_kind(it), STORE_KIND_VALUE);
    size_t nk;
    ck_assert_int_eq(memcmp(store_item_key(it, &nk), "k", 1), 0);
    ck_assert_uint_eq(nk, 1);
    /* Readers keep their item across a replacement. */
    ck_assert_int_eq(set(s, "k", "world"), STORE_STORED);
    size_t nv;
    ck_assert_int_eq(memcmp(store_item_value(it, &nv), "hello", 5), 0);
    store_item_release(it);
    expect(s, "k", "world");
    expect(s, "nope", NULL);
    store_stats st = stats(s);
    ck_assert_uint_eq(st.curr_items, 1);
    ck_assert_uint_eq(st.total_items, 2);
    ck_assert_uint_eq(st.mutations, 1);
    ck_assert_int_eq(set_size(s), 1);
    /* Empty value and bad keys. */
    ck_assert_int_eq(set(s, "e", ""), STORE_STORED);
    expect(s, "e", "");
    ck_assert_int_eq(set(s, "", "x"), STORE_ERR_INVAL);
    char big[300];
    memset(big, 'k', 251);
    big[251] = 0;
    ck_assert_int_eq(set(s, big, "x"), STORE_ERR_INVAL);
    big[250] = 0;
    ck_assert_int_eq(set(s, big, "x"), STORE_STORED);
    store_destroy(s);
}
END_TEST

START_TEST(test_add_replace)
{
    fake_clock c = {T0};
    store *s = mk(&c, 1, 0);

    ck_assert_int_eq(wr(s, STORE_REPLACE, "k", "a", 0, 0, 0, NULL),
                     STORE_NOT_STORED);
    expect(s, "k", NULL);
    ck_assert_int_eq(wr(s, STORE_ADD, "k", "a", 0, 0, 0, NULL), STORE_STORED);
    ck_assert_int_eq(wr(s, STORE_ADD, "k", "b", 0, 0, 0, NULL),
                     STORE_NOT_STORED);
    expect(s, "k", "a");
    ck_assert_int_eq(wr(s, STORE_REPLACE, "k", "c", 7, 0, 0, NULL),
                     STORE_STORED);
    expect(s, "k", "c");
    /* add succeeds over a deleted key. */
    ck_assert_int_eq(store_delete(s, "k", 1, 0), STORE_DELETED);
    ck_assert_int_eq(wr(s, STORE_REPLACE, "k", "d", 0, 0, 0, NULL),
                     STORE_NOT_STORED);
    ck_assert_int_eq(wr(s, STORE_ADD, "k", "e", 0, 0, 0, NULL), STORE_STORED);
    expect(s, "k", "e");
    store_destroy(s);
}
END_TEST

START_TEST(test_append_prepend)
{
    fake_clock c = {T0};
    store *s = mk(&c, 1, 0);
    int64_t exp = (int64_t)(T0 / NS) + 50;

    ck_assert_int_eq(wr(s, STORE_APPEND, "k", "x", 0, 0, 0, NULL),
                     STORE_NOT_STORED);
    ck_assert_int_eq(wr(s, STORE_PREPEND, "k", "x", 0, 0, 0, NULL),
                     STORE_NOT_STORED);
    expect(s, "k", NULL);
    ck_assert_int_eq(wr(s, STORE_SET, "k", "mid", 5, exp, 0, NULL),
                     STORE_STORED);
    ck_assert_int_eq(wr(s, STORE_APPEND, "k", "-end", 9, 0, 0, NULL),
                     STORE_STORED);
    ck_assert_int_eq(wr(s, STORE_PREPEND, "k", "start-", 9, 0, 0, NULL),
                     STORE_STORED);
    expect(s, "k", "start-mid-end");
    store_item *it = store_get(s, "k", 1);
    ck_assert_uint_eq(store_item_flags(it), 5);
    ck_assert_int_eq(store_item_exptime(it), exp);
    uint64_t cas = store_item_cas(it);
    store_item_release(it);
    /* With a cas (binary/meta): mismatch is EXISTS. */
    ck_assert_int_eq(wr(s, STORE_APPEND, "k", "!", 0, 0, cas + 1, NULL),
                     STORE_EXISTS);
    ck_assert_int_eq(wr(s, STORE_APPEND, "k", "!", 0, 0, cas, NULL),
                     STORE_STORED);
    expect(s, "k", "start-mid-end!");
    /* It keeps the existing expiry: gone after 50 s. */
    advance(&c, 50);
    expect(s, "k", NULL);
    ck_assert_int_eq(wr(s, STORE_APPEND, "k", "x", 0, 0, 0, NULL),
                     STORE_NOT_STORED);
    store_destroy(s);
}
END_TEST

START_TEST(test_cas)
{
    fake_clock c = {T0};
    store *s = mk(&c, 1, 0);
    uint64_t c1, c2;

    ck_assert_int_eq(wr(s, STORE_CAS, "k", "v", 0, 0, 12345, NULL),
                     STORE_NOT_FOUND);
    ck_assert_int_eq(wr(s, STORE_SET, "k", "v1", 0, 0, 0, &c1), STORE_STORED);
    ck_assert_int_eq(wr(s, STORE_CAS, "k", "v2", 0, 0, c1 + 1, NULL),
                     STORE_EXISTS);
    expect(s, "k", "v1");
    ck_assert_int_eq(wr(s, STORE_CAS, "k", "v2", 3, 0, c1, &c2), STORE_STORED);
    ck_assert_uint_ne(c1, c2);
    ck_assert_uint_eq(cas_of(s, "k"), c2);
    expect(s, "k", "v2");
    ck_assert_int_eq(wr(s, STORE_CAS, "k", "v3", 0, 0, c1, NULL),
                     STORE_EXISTS);
    /* set with a cas behaves like cas (binary protocol). */
    ck_assert_int_eq(wr(s, STORE_SET, "k", "v4", 0, 0, c1, NULL),
                     STORE_EXISTS);
    ck_assert_int_eq(wr(s, STORE_SET, "zz", "v4", 0, 0, c1, NULL),
                     STORE_NOT_FOUND);
    ck_assert_int_eq(wr(s, STORE_SET, "k", "v4", 0, 0, c2, NULL),
                     STORE_STORED);
    expect(s, "k", "v4");
    /* cas on a deleted key: not found. */
    uint64_t c3 = cas_of(s, "k");
    ck_assert_int_eq(store_delete(s, "k", 1, 0), STORE_DELETED);
    ck_assert_int_eq(wr(s, STORE_CAS, "k", "v5", 0, 0, c3, NULL),
                     STORE_NOT_FOUND);
    store_destroy(s);
}
END_TEST

static int arith(store *s, const char *k, bool incr, uint64_t delta,
                 uint64_t *v)
{
    store_arith_req r;
    memset(&r, 0, sizeof(r));
    r.key = k;
    r.nkey = strlen(k);
    r.incr = incr;
    r.delta = delta;
    return store_arith(s, &r, v, NULL);
}

START_TEST(test_incr_decr)
{
    fake_clock c = {T0};
    store *s = mk(&c, 1, 0);
    uint64_t v = 777;

    ck_assert_int_eq(arith(s, "n", true, 1, &v), STORE_NOT_FOUND);
    ck_assert_uint_eq(v, 777);
    ck_assert_int_eq(wr(s, STORE_SET, "n", "10", 33, 0, 0, NULL),
                     STORE_STORED);
    uint64_t before = cas_of(s, "n");
    ck_assert_int_eq(arith(s, "n", true, 5, &v), STORE_OK);
    ck_assert_uint_eq(v, 15);
    expect(s, "n", "15");
    /* Every change is a new mutation: new cas, flags kept. */
    ck_assert_uint_ne(cas_of(s, "n"), before);
    store_item *it = store_get(s, "n", 1);
    ck_assert_uint_eq(store_item_flags(it), 33);
    store_item_release(it);
    ck_assert_uint_eq(stats(s).mutations, 1);
    /* decr floors at 0. */
    ck_assert_int_eq(arith(s, "n", false, 100, &v), STORE_OK);
    ck_assert_uint_eq(v, 0);
    /* A shorter number keeps the length, space padded, as memcached. */
    expect(s, "n", "0 ");
    ck_assert_int_eq(set(s, "n", "100"), STORE_STORED);
    ck_assert_int_eq(arith(s, "n", false, 1, &v), STORE_OK);
    expect(s, "n", "99 ");
    ck_assert_int_eq(arith(s, "n", true, 1, &v), STORE_OK);
    expect(s, "n", "100");
    ck_assert_int_eq(arith(s, "n", true, 900, &v), STORE_OK);
    expect(s, "n", "1000");
    /* incr wraps at 2^64; the largest 20-digit value parses. */
    ck_assert_int_eq(set(s, "w", "18446744073709551615"), STORE_STORED);
    ck_assert_int_eq(arith(s, "w", true, 0, &v), STORE_OK);
    ck_assert_uint_eq(v, UINT64_MAX);
    ck_assert_int_eq(arith(s, "w", true, 2, &v), STORE_OK);
    ck_assert_uint_eq(v, 1);
    char padded[21];
    memset(padded, ' ', 20);
    padded[0] = '1';
    padded[20] = 0;
    expect(s, "w", padded);
    /* One past 2^64 - 1 is not a number. */
    ck_assert_int_eq(set(s, "o", "18446744073709551616"), STORE_STORED);
    ck_assert_int_eq(arith(s, "o", true, 1, &v), STORE_NON_NUMERIC);
    expect(s, "o", "18446744073709551616");
    /* Non-numeric values. */
    ck_assert_int_eq(set(s, "x", "abc"), STORE_STORED);
    ck_assert_int_eq(arith(s, "x", true, 1, &v), STORE_NON_NUMERIC);
    ck_assert_int_eq(set(s, "x", "12a"), STORE_STORED);
    ck_assert_int_eq(arith(s, "x", false, 1, &v), STORE_NON_NUMERIC);
    ck_assert_int_eq(set(s, "x", ""), STORE_STORED);
    ck_assert_int_eq(arith(s, "x", true, 1, &v), STORE_NON_NUMERIC);
    ck_assert_int_eq(set(s, "x", "-5"), STORE_STORED);
    ck_assert_int_eq(arith(s, "x", true, 1, &v), STORE_NON_NUMERIC);
    expect(s, "x", "-5");
    ck_assert_int_eq(set(s, "x", "7 "), STORE_STORED);
    ck_assert_int_eq(arith(s, "x", true, 1, &v), STORE_OK);
    ck_assert_uint_eq(v, 8);
    store_destroy(s);
}
END_TEST

START_TEST(test_arith_cas_vivify)
{
    fake_clock c = {T0};
    store *s = mk(&c, 1, 0);
    store_arith_req r;
    uint64_t v = 0, cas = 0;

    memset(&r, 0, sizeof(r));
    r.key = "v";
    r.nkey = 1;
    r.incr = true;
    r.delta = 3;
    r.vivify = true;
    r.initial = 40;
    r.exptime = (int64_t)(T0 / NS) + 10;
    ck_assert_int_eq(store_arith(s, &r, &v, &cas), STORE_STORED);
    ck_assert_uint_eq(v, 40);
    ck_assert_uint_eq(cas, cas_of(s, "v"));
    expect(s, "v", "40");
    ck_assert_int_eq(store_arith(s, &r, &v, &cas), STORE_OK);
    ck_assert_uint_eq(v, 43);
    r.cas = cas + 1;
    ck_assert_int_eq(store_arith(s, &r, &v, NULL), STORE_EXISTS);
    r.cas = cas;
    ck_assert_int_eq(store_arith(s, &r, &v, NULL), STORE_OK);
    ck_assert_uint_eq(v, 46);
    advance(&c, 10);
    expect(s, "v", NULL);
    store_destroy(s);
}
END_TEST

START_TEST(test_touch_gat)
{
    fake_clock c = {T0};
    store *s = mk(&c, 1, 0);
    int64_t now = (int64_t)(T0 / NS);

    ck_assert_int_eq(store_touch(s, "t", 1, now + 5), STORE_NOT_FOUND);
    ck_assert_ptr_null(store_gat(s, "t", 1, now + 5));
    ck_assert_int_eq(wr(s, STORE_SET, "t", "val", 8, now + 5, 0, NULL),
                     STORE_STORED);
    uint64_t c1 = cas_of(s, "t");
    ck_assert_int_eq(store_touch(s, "t", 1, now + 20), STORE_OK);
    /* A new mutation, but the cas is kept, as memcached keeps it. */
    uint64_t c2 = cas_of(s, "t");
    ck_assert_uint_eq(c1, c2);
    advance(&c, 10);
    expect(s, "t", "val");
    store_read_info ri;
    store_item *it = store_gat_ex(s, "t", 1, now + 40, &ri);
    ck_assert_ptr_nonnull(it);
    ck_assert_int_eq(store_item_exptime(it), now + 40);
    ck_assert_uint_eq(store_item_flags(it), 8);
    ck_assert_uint_eq(store_item_cas(it), c2);
    /* The previous read is remembered (meta 'h'). */
    ck_assert(ri.fetched);
    store_item_release(it);
    ck_assert_uint_eq(stats(s).mutations, 1);
    advance(&c, 25);
    expect(s, "t", "val");
    advance(&c, 5);
    expect(s, "t", NULL);
    ck_assert_int_eq(store_touch(s, "t", 1, 0), STORE_NOT_FOUND);
    /* Touch with an expired time makes it a miss at once. */
    ck_assert_int_eq(set(s, "u", "1"), STORE_STORED);
    ck_assert_int_eq(store_touch(s, "u", 1, -1), STORE_OK);
    expect(s, "u", NULL);
    store_destroy(s);
}
END_TEST

START_TEST(test_fetched_last_access)
{
    fake_clock c = {T0};
    store *s = mk(&c, 1, 0);

    store_read_info ri;
    ck_assert_int_eq(set(s, "a", "1"), STORE_STORED);
    advance(&c, 7);
    store_item *it = store_get_ex(s, "a", 1, &ri);
    ck_assert(!ri.fetched);
    ck_assert_int_eq(ri.last_access, 7);
    store_item_release(it);
    advance(&c, 3);
    it = store_get_ex(s, "a", 1, &ri);
    ck_assert(ri.fetched);
    ck_assert_int_eq(ri.last_access, 3);
    store_item_release(it);
    /* gat is a read too; touch is not. */
    advance(&c, 2);
    ck_assert_int_eq(store_touch(s, "a", 1, 0), STORE_OK);
    advance(&c, 1);
    it = store_gat_ex(s, "a", 1, 0, &ri);
    ck_assert(ri.fetched);
    ck_assert_int_eq(ri.last_access, 3);
    store_item_release(it);
    store_destroy(s);
}
END_TEST

START_TEST(test_delete_tombstone)
{
    fake_clock c = {T0};
    store *s = mk(&c, 1, 0);

    ck_assert_int_eq(store_delete(s, "d", 1, 0), STORE_NOT_FOUND);
    ck_assert_int_eq(set(s, "d", "v"), STORE_STORED);
    uint64_t cas = cas_of(s, "d");
    store_item *held = store_get(s, "d", 1);
    store_mutation old;
    store_item_mutation(held, &old);
    riblt_id oldid = old.id;
    ck_assert(store_has(s, &oldid));
    ck_assert_int_eq(store_delete(s, "d", 1, cas + 1), STORE_EXISTS);
    expect(s, "d", "v");
    ck_assert_int_eq(store_delete(s, "d", 1, cas), STORE_DELETED);
    expect(s, "d", NULL);
    ck_assert_int_eq(store_delete(s, "d", 1, 0), STORE_NOT_FOUND);
    /* The value's id left the journal; the holder still reads it. */
    ck_assert(!store_has(s, &oldid));
    ck_assert_int_eq(memcmp(store_item_value(held, NULL), "v", 1), 0);
    store_item_release(held);
    store_stats st = stats(s);
    ck_assert_uint_eq(st.curr_items, 0);
    ck_assert_uint_eq(st.tombstones, 1);
    ck_assert_uint_eq(st.mutations, 1);
    ck_assert_int_eq(set_size(s), 1);
    store_destroy(s);
}
END_TEST

/* Toggles every id of the set into a power-sum table (store_journal_ids). */
static void toggle_id(void *arg, const riblt_id *id)
{
    riblt_psum_toggle(arg, id, riblt_hash(id));
}

/* The power sums a snapshot gives are those of the set's ids, through
 * writes, overwrites and deletes; a store told not to keep them, or
 * without a sketch, gives zero terms. */
START_TEST(test_psums_follow_the_set)
{
    fake_clock c = {T0};
    store *s = mk(&c, 1, 0);
    char k[16];
    static riblt_id got[RIBLT_PSUM_SIZE], want[RIBLT_PSUM_SIZE];
    riblt_symbol sym;
    int64_t n;
    uint32_t p0 = 0;

    ck_assert(store_has_psums(s));
    for (int i = 0; i < 200; i++) {
        snprintf(k, sizeof(k), "k%d", i);
        ck_assert_int_eq(set(s, k, "v"), STORE_STORED);
    }
    for (int i = 0; i < 50; i++) {
        snprintf(k, sizeof(k), "k%d", i);
        ck_assert_int_eq(set(s, k, "w"), STORE_STORED);
    }
    for (int i = 50; i < 80; i++) {
        snprintf(k, sizeof(k), "k%d", i);
        ck_assert_int_eq(store_delete(s, k, strlen(k), 0), STORE_DELETED);
    }
    ck_assert_int_eq(store_sketch_snapshot_parts(s, &p0, 1, &sym, 1, got, &n),
                     STORE_OK);
    ck_assert_int_eq(n, 200); /* 170 values, 30 tombstones */
    memset(want, 0, sizeof(want));
    ck_assert_uint_eq(store_journal_ids(s, toggle_id, want), 200);
    ck_assert_mem_eq(got, want, sizeof(want));
    /* The symbols of the same call are the sketch's own. */
    riblt_symbol first;
    ck_assert_int_eq(store_sketch_read(s, 0, &first, 1, NULL), STORE_OK);
    ck_assert_mem_eq(&sym, &first, sizeof(sym));
    store_destroy(s);

    store_options o;
    int err;
    store_options_default(&o);
    o.sketch_symbols = 256;
    o.psums = false;
    s = store_create(&o, &err);
    ck_assert_ptr_nonnull(s);
    ck_assert(!store_has_psums(s));
    ck_assert_int_eq(set(s, "a", "v"), STORE_STORED);
    memset(got, 0xff, sizeof(got));
    ck_assert_int_eq(store_sketch_snapshot_parts(s, &p0, 1, NULL, 0, got, &n),
                     STORE_OK);
    memset(want, 0, sizeof(want));
    ck_assert_mem_eq(got, want, sizeof(want));
    store_destroy(s);

    o.psums = true;
    o.sketch_symbols = 0;
    s = store_create(&o, &err);
    ck_assert_ptr_nonnull(s);
    ck_assert(!store_has_psums(s));
    store_destroy(s);
}
END_TEST

START_TEST(test_lww_apply)
{
    fake_clock c = {T0};
    store *s = mk(&c, 5, 0);
    store_mutation m;

    m = mut(100, T0 + 10, 3, STORE_KIND_VALUE, "k", "first");
    ck_assert_int_eq(apply(s, &m), STORE_OK);
    riblt_id id100 = m.id;
    expect(s, "k", "first");
    /* Same mutation again: equal version loses. */
    ck_assert_int_eq(apply(s, &m), STORE_STALE);
    /* Older loses. */
    m = mut(101, T0 + 9, 9, STORE_KIND_VALUE, "k", "older");
    ck_assert_int_eq(apply(s, &m), STORE_STALE);
    /* Equal version with another id loses (not strictly greater). */
    m = mut(102, T0 + 10, 3, STORE_KIND_VALUE, "k", "tie");
    ck_assert_int_eq(apply(s, &m), STORE_STALE);
    expect(s, "k", "first");
    /* Same ticks, larger node wins. */
    m = mut(103, T0 + 10, 4, STORE_KIND_VALUE, "k", "node4");
    ck_assert_int_eq(apply(s, &m), STORE_OK);
    expect(s, "k", "node4");
    /* Newer wins. */
    m = mut(104, T0 + 11, 1, STORE_KIND_VALUE, "k", "newer");
    m.flags = 77;
    ck_assert_int_eq(apply(s, &m), STORE_OK);
    riblt_id id104 = m.id;
    store_item *it = store_get(s, "k", 1);
    ck_assert_uint_eq(store_item_flags(it), 77);
    ck_assert_uint_eq(store_item_cas(it), 104);
    store_item_release(it);
    ck_assert(!store_has(s, &id100));
    ck_assert(store_has(s, &id104));
    it = store_fetch(s, &id104);
    ck_assert_ptr_nonnull(it);
    store_mutation out;
    store_item_mutation(it, &out);
    ck_assert_uint_eq(out.version.ticks, T0 + 11);
    ck_assert_uint_eq(out.version.node, 1);
    ck_assert_uint_eq(out.nvalue, 5);
    store_item_release(it);
    ck_assert_ptr_null(store_fetch(s, &id100));
    store_stats st = stats(s);
    ck_assert_uint_eq(st.applied_remote, 3);
    ck_assert_uint_eq(st.stale_remote, 3);
    ck_assert_uint_eq(st.mutations, 1);
    /* A local write after a peer's beats it. */
    ck_assert_int_eq(set(s, "k", "local"), STORE_STORED);
    expect(s, "k", "local");
    store_destroy(s);
}
END_TEST

START_TEST(test_apply_invalid)
{
    fake_clock c = {T0};
    store *s = mk(&c, 5, 0);
    store_mutation m;

    m = mut(0, T0, 3, STORE_KIND_VALUE, "k", "v");
    m.id.hi = 0;
    ck_assert_int_eq(store_apply(s, &m), STORE_ERR_INVAL);
    m = mut(1, T0, 3, STORE_KIND_VALUE, NULL, "v");
    ck_assert_int_eq(store_apply(s, &m), STORE_ERR_INVAL);
    m = mut(1, T0, 3, 9, "k", "v");
    ck_assert_int_eq(store_apply(s, &m), STORE_ERR_INVAL);
    m = mut(1, T0, 3, STORE_KIND_TOMBSTONE, "k", "v");
    ck_assert_int_eq(store_apply(s, &m), STORE_ERR_INVAL);
    m = mut(1, T0, 3, STORE_KIND_FLUSH, "k", NULL);
    m.flush_at = T0;
    ck_assert_int_eq(store_apply(s, &m), STORE_ERR_INVAL);
    m = mut(1, UINT64_MAX, 3, STORE_KIND_VALUE, "k", "v");
    ck_assert_int_eq(store_apply(s, &m), STORE_ERR_INVAL);
    /* A value without a cas is malformed; a tombstone may have none. */
    m = mut(1, T0, 3, STORE_KIND_VALUE, "k", "v");
    m.cas = 0;
    ck_assert_int_eq(store_apply(s, &m), STORE_ERR_INVAL);
    ck_assert_uint_eq(stats(s).mutations, 0);
    m = mut(2, T0, 3, STORE_KIND_TOMBSTONE, "t", NULL);
    m.cas = 0;
    ck_assert_int_eq(store_apply(s, &m), STORE_OK);
    ck_assert_uint_eq(stats(s).mutations, 1);
    /* An id that is not the one of its key and version is refused: the
     * id of the same version under another key, or any other. */
    m = mut(1, T0, 3, STORE_KIND_VALUE, "k", "v");
    ck_assert_int_eq(store_apply(s, &m), STORE_OK);
    riblt_id kid = m.id;
    m = mut(1, T0, 3, STORE_KIND_VALUE, "k2", "v");
    m.id = kid;
    ck_assert_int_eq(store_apply(s, &m), STORE_ERR_INVAL);
    m = mut(1, T0 + 1, 3, STORE_KIND_VALUE, "k2", "v");
    m.id.lo ^= 1;
    ck_assert_int_eq(store_apply(s, &m), STORE_ERR_INVAL);
    expect(s, "k2", NULL);
    ck_assert_int_eq(set_size(s), 2);
    /* Ids are the same on every store: a function of key and version. */
    store *o = mk(&c, 6, 0);
    m = mut(1, T0, 3, STORE_KIND_VALUE, "k", "v");
    ck_assert_int_eq(store_apply(o, &m), STORE_OK);
    ck_assert(store_has(o, &kid));
    ck_assert(store_has(s, &kid));
    store_destroy(o);
    store_destroy(s);
}
END_TEST

/*
 * Expiry times as large as a peer may send (up to INT64_MAX) are compared
 * with the grace without overflowing: such a value and such a tombstone
 * stay in the set and are never swept (regression: the sweep added the
 * grace to them).
 */
START_TEST(test_far_expiry_not_swept)
{
    fake_clock c = {T0};
    store *s = mk(&c, 5, 0);
    store_mutation m = mut(20, T0, 3, STORE_KIND_VALUE, "far", "v");
    m.exptime = INT64_MAX;
    ck_assert_int_eq(apply(s, &m), STORE_OK);
    m = mut(21, T0, 3, STORE_KIND_TOMBSTONE, "gone", NULL);
    m.exptime = INT64_MAX;
    ck_assert_int_eq(apply(s, &m), STORE_OK);
    advance(&c, 100000);
    ck_assert_uint_eq(store_sweep(s, 1000), 0);
    ck_assert_int_eq(set_size(s), 2);
    expect(s, "far", "v");
    store_destroy(s);
}
END_TEST

/*
 * The sweep walks the key table only while something there can die: a
 * store of values without expiry is not walked; a value with an expiry, a
 * tombstone and a flush each make it walk until what they killed is gone.
 */
START_TEST(test_sweep_walks_only_what_can_die)
{
    fake_clock c = {T0};
    store *s = mk(&c, 1, 0);
    char k[16];
    for (int i = 0; i < 100; i++) {
        snprintf(k, sizeof(k), "k%d", i);
        ck_assert_int_eq(set(s, k, "v"), STORE_STORED);
    }
    ck_assert_uint_eq(store_sweep(s, 1000), 0);
    ck_assert_uint_eq(stats(s).sweep_checked, 0);

    /* An expiring value: walked, swept once expired (and the grace gone
     * by), then quiet again. */
    ck_assert_int_eq(
        wr(s, STORE_SET, "ttl", "v", 0, store_exptime_abs(s, 10), 0, NULL),
        STORE_STORED);
    ck_assert_uint_eq(store_sweep(s, 1000), 0);
    uint64_t checked = stats(s).sweep_checked;
    ck_assert_uint_ge(checked, 101);
    advance(&c, 112);
    ck_assert_uint_eq(store_sweep(s, 1000), 1);
    checked = stats(s).sweep_checked;
    ck_assert_uint_eq(store_sweep(s, 1000), 0);
    ck_assert_uint_eq(stats(s).sweep_checked, checked);

    /* A tombstone: walked until its grace ends and it is swept. */
    ck_assert_int_eq(store_delete(s, "k0", 2, 0), STORE_DELETED);
    ck_assert_uint_eq(store_sweep(s, 1000), 0);
    ck_assert_uint_gt(stats(s).sweep_checked, checked);
    advance(&c, 101);
    ck_assert_uint_eq(store_sweep(s, 1000), 1);
    checked = stats(s).sweep_checked;
    ck_assert_uint_eq(store_sweep(s, 1000), 0);
    ck_assert_uint_eq(stats(s).sweep_checked, checked);

    /* A flush kills values without expiry: they are all swept, and once
     * a whole pass begun after the flush has gone by, the walks stop. */
    ck_assert_int_eq(store_flush_all(s, 0), STORE_OK);
    advance(&c, 1);
    size_t removed = 0;
    for (int i = 0; i < 4; i++)
        removed += store_sweep(s, 1000);
    ck_assert_uint_eq(removed, 99);
    ck_assert_uint_eq(stats(s).curr_items, 0);
    checked = stats(s).sweep_checked;
    ck_assert_uint_eq(store_sweep(s, 1000), 0);
    ck_assert_uint_eq(stats(s).sweep_checked, checked);
    /* A value written after the flush is not killed by it. */
    ck_assert_int_eq(set(s, "after", "v"), STORE_STORED);
    expect(s, "after", "v");
    store_destroy(s);
}
END_TEST

START_TEST(test_no_resurrection)
{
    fake_clock c = {T0};
    store *s = mk(&c, 5, 0);
    store_mutation m;

    m = mut(10, T0 - 1000, 3, STORE_KIND_VALUE, "k", "old");
    ck_assert_int_eq(apply(s, &m), STORE_OK);
    ck_assert_int_eq(store_delete(s, "k", 1, 0), STORE_DELETED);
    /* A late, older write from a peer does not come back. */
    m = mut(11, T0 - 500, 3, STORE_KIND_VALUE, "k", "late");
    ck_assert_int_eq(apply(s, &m), STORE_STALE);
    expect(s, "k", NULL);
    /* Within the grace the tombstone stays in journal and sketch. */
    advance(&c, 99);
    ck_assert_uint_eq(store_sweep(s, 1000), 0);
    ck_assert_int_eq(set_size(s), 1);
    ck_assert_int_eq(apply(s, &m), STORE_STALE);
    /* After the grace the sweep takes it out of both. */
    advance(&c, 1);
    ck_assert_uint_eq(store_sweep(s, 1000), 1);
    ck_assert_int_eq(set_size(s), 0);
    store_stats st = stats(s);
    ck_assert_uint_eq(st.mutations, 0);
    ck_assert_uint_eq(st.tombstones, 0);
    ck_assert_uint_eq(st.swept, 1);
    size_t n = store_sketch_symbols(s);
    riblt_symbol *cells = calloc(n, sizeof(*cells));
    ck_assert_int_eq(store_sketch_read(s, 0, cells, n, NULL), STORE_OK);
    for (size_t i = 0; i < n; i++)
        ck_assert(riblt_symbol_is_zero(&cells[i]));
    free(cells);
    /* A tombstone that is past its sweep point does not enter. */
    m = mut(12, T0, 3, STORE_KIND_TOMBSTONE, "z", NULL);
    m.exptime = (int64_t)(T0 / NS) - 100;
    ck_assert_int_eq(apply(s, &m), STORE_STALE);
    ck_assert_int_eq(set_size(s), 0);
    /* A fresh one does, and still beats older values. */
    m = mut(13, T0 + 100 * NS, 3, STORE_KIND_TOMBSTONE, "z", NULL);
    m.exptime = (int64_t)(T0 / NS) + 100;
    ck_assert_int_eq(apply(s, &m), STORE_OK);
    m = mut(14, T0 + 50 * NS, 3, STORE_KIND_VALUE, "z", "v");
    ck_assert_int_eq(apply(s, &m), STORE_STALE);
    expect(s, "z", NULL);
    store_destroy(s);
}
END_TEST

START_TEST(test_expiry)
{
    fake_clock c = {T0};
    store *s = mk(&c, 1, 0);

    int64_t exp = store_exptime_abs(s, 10);
    ck_assert_int_eq(wr(s, STORE_SET, "e", "v", 0, exp, 0, NULL),
                     STORE_STORED);
    advance(&c, 9);
    expect(s, "e", "v");
    advance(&c, 1);
    expect(s, "e", NULL);
    /* Still in the set until the second after exptime + grace. */
    ck_assert_uint_eq(store_sweep(s, 100), 0);
    ck_assert_uint_eq(stats(s).mutations, 1);
    advance(&c, 100);
    ck_assert_uint_eq(store_sweep(s, 100), 0);
    advance(&c, 1);
    ck_assert_uint_eq(store_sweep(s, 100), 1);
    store_stats st = stats(s);
    ck_assert_uint_eq(st.mutations, 0);
    ck_assert_uint_eq(st.curr_items, 0);
    ck_assert_uint_eq(st.expired_unfetched, 0);
    ck_assert_int_eq(set_size(s), 0);
    /* A set with an already-expired time is stored but is a miss. */
    ck_assert_int_eq(set(s, "x", "live"), STORE_STORED);
    ck_assert_int_eq(wr(s, STORE_SET, "x", "gone", 0, -1, 0, NULL),
                     STORE_STORED);
    expect(s, "x", NULL);
    ck_assert_uint_eq(stats(s).mutations, 1);
    /* A peer's mutation expired long ago is dropped, and retires the
     * older value it replaces, as if it had come in time and been swept. */
    store_mutation m = mut(9, T0 + 1, 2, STORE_KIND_VALUE, "p", "v");
    ck_assert_int_eq(apply(s, &m), STORE_OK);
    m = mut(10, T0 + 2, 2, STORE_KIND_VALUE, "p", "w");
    m.exptime = (int64_t)(T0 / NS) - 5;
    ck_assert_int_eq(apply(s, &m), STORE_STALE);
    expect(s, "p", NULL);
    riblt_id id9 = {9, 9 * 7919 + 13};
    ck_assert(!store_has(s, &id9));
    /* Expired but not yet dead: enters the set, a miss. */
    m = mut(11, T0 + 3, 2, STORE_KIND_VALUE, "q", "w");
    m.exptime = (int64_t)(c.ns / NS) - 5;
    ck_assert_int_eq(apply(s, &m), STORE_OK);
    expect(s, "q", NULL);
    store_destroy(s);
}
END_TEST

START_TEST(test_flush_immediate)
{
    fake_clock c = {T0};
    store *s = mk(&c, 1, 0);
    recorder rec;

    recorder_init(&rec);
    store_set_listener(s, record, &rec);
    ck_assert_int_eq(set(s, "a", "1"), STORE_STORED);
    ck_assert_int_eq(set(s, "b", "2"), STORE_STORED);
    store_item *held = store_get(s, "a", 1);
    store_mutation olda;
    store_item_mutation(held, &olda);
    ck_assert_int_eq(store_flush_all(s, 0), STORE_OK);
    expect(s, "a", NULL);
    expect(s, "b", NULL);
    ck_assert_int_eq(wr(s, STORE_ADD, "a", "3", 0, 0, 0, NULL), STORE_STORED);
    expect(s, "a", "3");
    ck_assert_uint_eq(rec.n, 4);
    ck_assert_int_eq(store_item_kind(rec.items[2]), STORE_KIND_FLUSH);
    ck_assert(rec.local[2]);
    /* The flush is a mutation in the set. */
    store_stats st = stats(s);
    ck_assert_uint_eq(st.mutations, 3);
    /* Sweep takes the flushed values out. */
    ck_assert_uint_eq(store_sweep(s, 100), 1);
    ck_assert_uint_eq(stats(s).mutations, 2);
    /* A late peer value older than the flush is stale; newer is kept. */
    store_mutation m = olda;
    m.key = "b";
    m.nkey = 1;
    m.id.lo ^= 0x55;
    ck_assert_int_eq(apply(s, &m), STORE_STALE);
    expect(s, "b", NULL);
    /* Ticks equal to flush_at are covered too. */
    store_mutation fm;
    store_item_mutation(rec.items[2], &fm);
    ck_assert_uint_eq(fm.flush_at, fm.version.ticks);
    m = mut(499, fm.flush_at, 0, STORE_KIND_VALUE, "b", "edge");
    ck_assert_int_eq(apply(s, &m), STORE_STALE);
    m = mut(498, fm.flush_at, 0, STORE_KIND_TOMBSTONE, "b", NULL);
    m.exptime = (int64_t)(T0 / NS);
    ck_assert_int_eq(apply(s, &m), STORE_STALE);
    m = mut(500, store_clock_now(s).ticks + 1, 2, STORE_KIND_VALUE, "b",
            "new");
    ck_assert_int_eq(apply(s, &m), STORE_OK);
    expect(s, "b", "new");
    store_item_release(held);
    recorder_free(&rec);
    store_destroy(s);
}
END_TEST

START_TEST(test_flush_delayed)
{
    fake_clock c = {T0};
    store *s = mk(&c, 1, 0);

    ck_assert_int_eq(set(s, "a", "1"), STORE_STORED);
    ck_assert_int_eq(store_flush_all(s, 10), STORE_OK);
    advance(&c, 5);
    ck_assert_int_eq(set(s, "b", "2"), STORE_STORED);
    expect(s, "a", "1");
    expect(s, "b", "2");
    ck_assert_uint_eq(store_sweep(s, 100), 0);
    advance(&c, 6);
    expect(s, "a", NULL);
    expect(s, "b", NULL);
    ck_assert_int_eq(set(s, "c", "3"), STORE_STORED);
    expect(s, "c", "3");
    ck_assert_uint_eq(store_sweep(s, 100), 2);
    /* A later flush replaces the earlier by last writer wins. */
    ck_assert_int_eq(store_flush_all(s, 0), STORE_OK);
    expect(s, "c", NULL);
    ck_assert_uint_eq(stats(s).mutations, 2);
    store_destroy(s);
}
END_TEST

START_TEST(test_flush_from_peer)
{
    fake_clock c = {T0};
    store *a = mk(&c, 1, 0), *b = mk(&c, 2, 0);
    recorder rec;

    recorder_init(&rec);
    store_set_listener(a, record, &rec);
    ck_assert_int_eq(set(a, "x", "1"), STORE_STORED);
    ck_assert_int_eq(store_flush_all(a, 0), STORE_OK);
    ck_assert_uint_eq(rec.n, 2);
    /* b gets the flush first, then the older value: stale. */
    store_mutation m;
    store_item_mutation(rec.items[1], &m);
    ck_assert_int_eq(m.kind, STORE_KIND_FLUSH);
    ck_assert_int_eq(apply(b, &m), STORE_OK);
    store_item_mutation(rec.items[0], &m);
    ck_assert_int_eq(apply(b, &m), STORE_STALE);
    expect(b, "x", NULL);
    ck_assert_uint_eq(store_sweep(a, 100), 1);
    same_sketch(a, b);
    /* A peer flush whose flush_at is exactly now: the next local write
     * still gets ticks past it and is live. */
    fake_clock c2 = {T0 + 1000 * NS};
    store *e = mk(&c2, 4, 0);
    m = mut(600, T0, 2, STORE_KIND_FLUSH, NULL, NULL);
    m.flush_at = c2.ns;
    ck_assert_int_eq(apply(e, &m), STORE_OK);
    ck_assert_int_eq(set(e, "k", "v"), STORE_STORED);
    expect(e, "k", "v");
    store_destroy(e);
    recorder_free(&rec);
    store_destroy(a);
    store_destroy(b);
}
END_TEST

START_TEST(test_cas_same_on_peers)
{
    fake_clock c = {T0};
    store *a = mk(&c, 1, 0), *b = mk(&c, 2, 0);
    recorder rec;

    recorder_init(&rec);
    store_set_listener(a, record, &rec);
    ck_assert_int_eq(set(a, "k", "v"), STORE_STORED);
    ck_assert_uint_eq(rec.n, 1);
    store_mutation m;
    store_item_mutation(rec.items[0], &m);
    ck_assert_int_eq(apply(b, &m), STORE_OK);
    uint64_t ca = cas_of(a, "k");
    ck_assert_uint_eq(ca, cas_of(b, "k"));
    /* gets on a, cas on b. */
    ck_assert_int_eq(wr(b, STORE_CAS, "k", "w", 0, 0, ca, NULL), STORE_STORED);
    recorder_free(&rec);
    store_destroy(a);
    store_destroy(b);
}
END_TEST

/* The value's marks for meta stale-while-revalidate (STORE_MARK_*). */
static uint8_t marks_of(store *s, const char *k)
{
    store_item *it = store_get(s, k, strlen(k));
    ck_assert_ptr_nonnull(it);
    uint8_t m = store_item_marks(it);
    store_item_release(it);
    return m;
}

/*
 * md I marks the value stale with a new cas; the first store_take_win
 * gets the right to recache, a second does not, and the marks travel with
 * the mutation to a peer; a recache with the old cas and invalidate stays
 * stale; a plain write clears the marks; md x empties the value.
 */
START_TEST(test_stale_marks)
{
    fake_clock c = {T0};
    store *a = mk(&c, 1, 0), *b = mk(&c, 2, 0);
    recorder rec;

    recorder_init(&rec);
    store_set_listener(a, record, &rec);
    ck_assert_int_eq(
        wr(a, STORE_SET, "k", "v1", 5, store_exptime_abs(a, 100), 0, NULL),
        STORE_STORED);
    uint64_t c0 = cas_of(a, "k");
    ck_assert_uint_eq(marks_of(a, "k"), 0);

    store_delete_req d = {
        .key = "k", .nkey = 1, .cas = c0 + 1, .invalidate = true};
    ck_assert_int_eq(store_delete_ex(a, &d), STORE_EXISTS);
    d.cas = c0;
    d.set_ttl = true;
    d.exptime = store_exptime_abs(a, 30);
    ck_assert_int_eq(store_delete_ex(a, &d), STORE_DELETED);
    expect(a, "k", "v1");
    ck_assert_uint_eq(marks_of(a, "k"), STORE_MARK_STALE);
    uint64_t c1 = cas_of(a, "k");
    ck_assert_uint_ne(c1, c0);
    store_item *it = store_get(a, "k", 1);
    ck_assert_int_eq(store_item_exptime(it), (int64_t)(T0 / NS) + 30);
    ck_assert_uint_eq(store_item_flags(it), 5);

    /* One winner; the cas stays; a reference to an older value loses. */
    ck_assert_int_eq(store_take_win(a, it), STORE_STORED);
    ck_assert_int_eq(store_take_win(a, it), STORE_NOT_STORED);
    store_item_release(it);
    it = store_get(a, "k", 1);
    ck_assert_int_eq(store_take_win(a, it), STORE_NOT_STORED);
    store_item_release(it);
    ck_assert_uint_eq(marks_of(a, "k"), STORE_MARK_STALE | STORE_MARK_WON);
    ck_assert_uint_eq(cas_of(a, "k"), c1);

    /* The marks replicate with the mutation. */
    ck_assert_uint_ge(rec.n, 3);
    store_mutation m;
    store_item_mutation(rec.items[rec.n - 1], &m);
    ck_assert_uint_eq(m.marks, STORE_MARK_STALE | STORE_MARK_WON);
    ck_assert_int_eq(apply(b, &m), STORE_OK);
    ck_assert_uint_eq(marks_of(b, "k"), STORE_MARK_STALE | STORE_MARK_WON);
    ck_assert_uint_eq(cas_of(b, "k"), c1);

    /* Marks only on values, only known bits. */
    store_mutation bad = m;
    bad.id.lo ^= 1;
    bad.version.ticks += 1000;
    bad.marks = 0x4;
    ck_assert_int_eq(apply(b, &bad), STORE_ERR_INVAL);
    bad.marks = STORE_MARK_STALE;
    bad.kind = STORE_KIND_TOMBSTONE;
    bad.nvalue = 0;
    ck_assert_int_eq(apply(b, &bad), STORE_ERR_INVAL);

    /* A recache with the cas read before the invalidation: stored, still
     * stale, the invalidated expiry and the win kept. Without invalidate
     * it is refused. */
    store_write w = {.mode = STORE_CAS,
                     .key = "k",
                     .nkey = 1,
                     .value = "v2",
                     .nvalue = 2,
                     .cas = c0,
                     .exptime = store_exptime_abs(a, 500)};
    ck_assert_int_eq(store_write_item(a, &w, NULL), STORE_EXISTS);
    w.invalidate = true;
    /* Then the same asking no expiry: the item still takes the invalidated
     * one's (a copy of it with room for the field). */
    const char *recache[2] = {"v2", "v9"};
    for (int i = 0; i < 2; i++) {
        w.value = recache[i];
        w.exptime = i == 0 ? store_exptime_abs(a, 500) : 0;
        ck_assert_int_eq(store_write_item(a, &w, NULL), STORE_STORED);
        expect(a, "k", recache[i]);
        ck_assert_uint_eq(marks_of(a, "k"), STORE_MARK_STALE | STORE_MARK_WON);
        it = store_get(a, "k", 1);
        ck_assert_int_eq(store_item_exptime(it), (int64_t)(T0 / NS) + 30);
        store_item_release(it);
    }
    w.exptime = store_exptime_abs(a, 500);
    /* With the right cas, invalidate changes nothing: a clean value. */
    w.cas = cas_of(a, "k");
    w.value = "v3";
    ck_assert_int_eq(store_write_item(a, &w, NULL), STORE_STORED);
    ck_assert_uint_eq(marks_of(a, "k"), 0);
    /* touch keeps the marks, a write clears them. */
    w.mode = STORE_SET;
    w.cas = 0;
    w.marks = STORE_MARK_WON;
    w.invalidate = false;
    ck_assert_int_eq(store_write_item(a, &w, NULL), STORE_STORED);
    ck_assert_int_eq(store_touch(a, "k", 1, 0), STORE_OK);
    ck_assert_uint_eq(marks_of(a, "k"), STORE_MARK_WON);
    ck_assert_int_eq(set(a, "k", "v4"), STORE_STORED);
    ck_assert_uint_eq(marks_of(a, "k"), 0);

    /* md x: an empty value, flags 0, no expiry, the same cas. */
    ck_assert_int_eq(
        wr(a, STORE_SET, "x", "hello", 3, store_exptime_abs(a, 100), 0, NULL),
        STORE_STORED);
    uint64_t cx = cas_of(a, "x");
    store_delete_req dx = {.key = "x", .nkey = 1, .clear_value = true};
    ck_assert_int_eq(store_delete_ex(a, &dx), STORE_DELETED);
    it = store_get(a, "x", 1);
    ck_assert_ptr_nonnull(it);
    size_t n = 9;
    store_item_value(it, &n);
    ck_assert_uint_eq(n, 0);
    ck_assert_uint_eq(store_item_flags(it), 0);
    ck_assert_int_eq(store_item_exptime(it), 0);
    ck_assert_uint_eq(store_item_cas(it), cx);
    store_item_release(it);
    /* missing key */
    dx.key = "nope";
    dx.nkey = 4;
    ck_assert_int_eq(store_delete_ex(a, &dx), STORE_NOT_FOUND);

    recorder_free(&rec);
    store_destroy(a);
    store_destroy(b);
}
END_TEST

static uint64_t lcg(uint64_t *x)
{
    *x = *x * 6364136223846793005ULL + 1442695040888963407ULL;
    return *x >> 33;
}

/* Invariant 1: the same mutations in any order give equal sketches. */
START_TEST(test_set_invariant)
{
    fake_clock c = {T0};
    store *a = mk(&c, 1, 0), *b = mk(&c, 2, 0), *d = mk(&c, 3, 0);
    recorder rec;
    uint64_t x = 12345;
    char key[16], val[16];

    recorder_init(&rec);
    store_set_listener(a, record, &rec);
    for (int i = 0; i < 600; i++) {
        snprintf(key, sizeof(key), "k%d", (int)(lcg(&x) % 50));
        snprintf(val, sizeof(val), "%d", i);
        switch (lcg(&x) % 5) {
        case 0:
            store_delete(a, key, strlen(key), 0);
            break;
        case 1:
            wr(a, STORE_APPEND, key, "+", 0, 0, 0, NULL);
            break;
        case 2:
            arith(a, key, true, 1, NULL);
            break;
        default:
            set(a, key, val);
        }
        if (i == 300)
            store_flush_all(a, 0);
    }
    ck_assert_uint_lt(rec.n, 4096);
    size_t n = rec.n;
    size_t *order = malloc(n * sizeof(*order));
    for (size_t i = 0; i < n; i++)
        order[i] = i;
    for (size_t i = n - 1; i > 0; i--) {
        size_t j = lcg(&x) % (i + 1), t = order[i];
        order[i] = order[j];
        order[j] = t;
    }
    store_mutation m;
    for (size_t i = 0; i < n; i++) {
        store_item_mutation(rec.items[i], &m);
        int r = apply(b, &m);
        ck_assert(r == STORE_OK || r == STORE_STALE);
        store_item_mutation(rec.items[n - 1 - i], &m);
        r = apply(d, &m);
        ck_assert(r == STORE_OK || r == STORE_STALE);
    }
    /* b saw them in order, d in reverse; now shuffled again into b. */
    for (size_t i = 0; i < n; i++) {
        store_item_mutation(rec.items[order[i]], &m);
        ck_assert_int_eq(apply(b, &m), STORE_STALE);
    }
    store_sweep(a, SIZE_MAX);
    store_sweep(b, SIZE_MAX);
    store_sweep(d, SIZE_MAX);
    same_sketch(a, b);
    same_sketch(a, d);
    ck_assert_uint_eq(stats(a).mutations, stats(b).mutations);
    ck_assert_uint_eq(stats(a).mutations, stats(d).mutations);
    ck_assert_uint_gt(stats(a).mutations, 10);
    /* After the grace all tombstones leave every set alike. */
    advance(&c, 200);
    store_sweep(a, SIZE_MAX);
    store_sweep(b, SIZE_MAX);
    store_sweep(d, SIZE_MAX);
    same_sketch(a, b);
    same_sketch(a, d);
    ck_assert_uint_eq(stats(a).tombstones, 0);
    free(order);
    recorder_free(&rec);
    store_destroy(a);
    store_destroy(b);
    store_destroy(d);
}
END_TEST

START_TEST(test_listener)
{
    fake_clock c = {T0};
    store *s = mk(&c, 1, 0);
    recorder rec;

    recorder_init(&rec);
    store_set_listener(s, record, &rec);
    ck_assert_int_eq(set(s, "a", "1"), STORE_STORED);
    ck_assert_int_eq(wr(s, STORE_ADD, "a", "1", 0, 0, 0, NULL),
                     STORE_NOT_STORED);
    ck_assert_int_eq(store_delete(s, "a", 1, 0), STORE_DELETED);
    store_mutation m = mut(77, T0 + 100, 2, STORE_KIND_VALUE, "r", "v");
    ck_assert_int_eq(apply(s, &m), STORE_OK);
    ck_assert_int_eq(apply(s, &m), STORE_STALE);
    ck_assert_uint_eq(rec.n, 3);
    ck_assert(rec.local[0] && rec.local[1] && !rec.local[2]);
    ck_assert_int_eq(store_item_kind(rec.items[1]), STORE_KIND_TOMBSTONE);
    ck_assert_uint_eq(store_item_cas(rec.items[2]), 77);
    recorder_free(&rec);
    store_destroy(s);
}
END_TEST

/* Collects the ids of a store. */
typedef struct idlist {
    riblt_id ids[64];
    size_t n;
} idlist;

static void collect(void *arg, const riblt_id *id)
{
    idlist *l = arg;
    if (l->n < 64)
        l->ids[l->n++] = *id;
}

static size_t item_bytes(const char *key, size_t nvalue)
{
    fake_clock c = {T0};
    store *s = mk(&c, 1, 0);
    char *v = malloc(nvalue + 1);
    memset(v, 'v', nvalue);
    v[nvalue] = 0;
    ck_assert_int_eq(set(s, key, v), STORE_STORED);
    size_t n = stats(s).bytes;
    free(v);
    store_destroy(s);
    return n;
}

/* gets, touch, cas: the touch keeps the cas, so the cas still matches. */
/* Fresh cas uniques fit clients' 20-byte buffers: below 10^19, never 0. */
START_TEST(test_cas_below_1e19)
{
    fake_clock c = {T0};
    store *s = mk(&c, 1, 0);
    char key[16];
    uint64_t top = 0;

    for (int i = 0; i < 5000; i++) {
        uint64_t cas = 0;
        snprintf(key, sizeof(key), "c%d", i);
        ck_assert_int_eq(wr(s, STORE_SET, key, "v", 0, 0, 0, &cas),
                         STORE_STORED);
        ck_assert_uint_ne(cas, 0);
        ck_assert_uint_lt(cas, 10000000000000000000ULL);
        top = cas > top ? cas : top;
    }
    /* Not squeezed into a small range either (drawn from 63 bits). */
    ck_assert_uint_gt(top, 1ULL << 60);
    store_destroy(s);
}
END_TEST

START_TEST(test_touch_keeps_cas)
{
    fake_clock c = {T0};
    store *s = mk(&c, 1, 0);
    int64_t now = (int64_t)(T0 / NS);
    uint64_t c0 = 0, c1 = 0;

    ck_assert_int_eq(wr(s, STORE_SET, "k", "v1", 0, 0, 0, &c0), STORE_STORED);
    ck_assert_int_eq(store_touch(s, "k", 1, now + 100), STORE_OK);
    ck_assert_int_eq(wr(s, STORE_CAS, "k", "v2", 0, 0, c0, &c1), STORE_STORED);
    expect(s, "k", "v2");
    /* The cas write is a new value: a fresh cas, and the old one fails. */
    ck_assert_uint_ne(c1, c0);
    ck_assert_int_eq(wr(s, STORE_CAS, "k", "v3", 0, 0, c0, NULL),
                     STORE_EXISTS);
    /* gat keeps it too; then append, delete and incr with it succeed. */
    store_item *it = store_gat(s, "k", 1, now + 200);
    ck_assert_ptr_nonnull(it);
    ck_assert_uint_eq(store_item_cas(it), c1);
    ck_assert_int_eq(store_item_exptime(it), now + 200);
    store_item_release(it);
    ck_assert_int_eq(wr(s, STORE_APPEND, "k", "!", 0, 0, c1, NULL),
                     STORE_STORED);
    expect(s, "k", "v2!");
    uint64_t c2 = cas_of(s, "k");
    ck_assert_uint_ne(c2, c1);
    ck_assert_int_eq(store_touch(s, "k", 1, 0), STORE_OK);
    ck_assert_int_eq(store_delete(s, "k", 1, c2), STORE_DELETED);
    expect(s, "k", NULL);
    ck_assert_int_eq(set(s, "n", "5"), STORE_STORED);
    uint64_t cn = cas_of(s, "n");
    ck_assert_int_eq(store_touch(s, "n", 1, now + 50), STORE_OK);
    store_arith_req r = {
        .key = "n", .nkey = 1, .incr = true, .delta = 1, .cas = cn};
    uint64_t v = 0, cas = 0;
    ck_assert_int_eq(store_arith(s, &r, &v, &cas), STORE_OK);
    ck_assert_uint_eq(v, 6);
    /* incr makes a new value: a new cas. */
    ck_assert_uint_ne(cas, cn);
    ck_assert_uint_eq(cas, cas_of(s, "n"));
    store_destroy(s);
}
END_TEST

/* The cas travels with the mutation: a peer holds the one it was sent. */
START_TEST(test_apply_keeps_cas)
{
    fake_clock c = {T0};
    store *a = mk(&c, 1, 0), *b = mk(&c, 2, 0);
    int64_t now = (int64_t)(T0 / NS);
    recorder rec;

    /* A record whose cas is not its id's low word keeps that cas. */
    store_mutation m = mut(300, T0 + 1, 7, STORE_KIND_VALUE, "p", "x");
    m.cas = 0xfeedfacecafe;
    ck_assert_int_eq(apply(b, &m), STORE_OK);
    ck_assert_uint_eq(cas_of(b, "p"), 0xfeedfacecafe);
    store_item *it = store_get(b, "p", 1);
    store_mutation out;
    store_item_mutation(it, &out);
    ck_assert_uint_eq(out.cas, 0xfeedfacecafe);
    store_item_release(it);
    ck_assert_int_eq(wr(b, STORE_CAS, "p", "y", 0, 0, 0xfeedfacecafe, NULL),
                     STORE_STORED);

    /* set and touch on a, both replicated to b: gets on a, cas on b. */
    recorder_init(&rec);
    store_set_listener(a, record, &rec);
    ck_assert_int_eq(set(a, "k", "v"), STORE_STORED);
    uint64_t ca = cas_of(a, "k");
    ck_assert_int_eq(store_touch(a, "k", 1, now + 60), STORE_OK);
    ck_assert_uint_eq(rec.n, 2);
    for (size_t i = 0; i < rec.n; i++) {
        store_item_mutation(rec.items[i], &m);
        ck_assert_uint_eq(m.cas, ca);
        ck_assert_int_eq(apply(b, &m), STORE_OK);
    }
    ck_assert_uint_eq(cas_of(b, "k"), ca);
    it = store_get(b, "k", 1);
    ck_assert_int_eq(store_item_exptime(it), now + 60);
    store_item_release(it);
    ck_assert_int_eq(wr(b, STORE_CAS, "k", "w", 0, 0, ca, NULL), STORE_STORED);
    recorder_free(&rec);
    store_destroy(a);
    store_destroy(b);
}
END_TEST

/* What store_walk showed of the one item walked. */
static void one_info(void *arg, const store_item_info *ii)
{
    *(store_item_info *)arg = *ii;
}

static store_item_info info_of(store *s)
{
    store_item_info ii;
    size_t cursor = 0;

    memset(&ii, 0, sizeof(ii));
    while (store_walk(s, &cursor, 64, one_info, &ii))
        ;
    return ii;
}

/*
 * The item layout: a 35-byte header, then key and value, in one chunk. The
 * cas of a new value is not stored (its id gives it); an item whose cas is
 * not its id's -- kept by touch, or sent so by a peer -- carries it in an
 * 8-byte trailer field, non-zero client flags and expiry in 4-byte ones,
 * and is accounted for them.
 */
START_TEST(test_item_layout)
{
    fake_clock c = {T0};
    store *a = mk(&c, 1, 0), *b = mk(&c, 2, 0);
    int64_t now = (int64_t)(T0 / NS);
    const char *k = "key:0000000000042"; /* memfit's 17-byte keys */
    char v[101];
    store_mutation m;
    recorder rec;

    memset(v, 'x', 100);
    v[100] = 0;
    recorder_init(&rec);
    store_set_listener(a, record, &rec);
    ck_assert_int_eq(set(a, k, v), STORE_STORED);
    store_item_info ii = info_of(a);
    ck_assert_uint_eq(ii.size, chunk_size(35 + 17 + 100));
    ck_assert_uint_lt(ii.size, chunk_size(53 + 17 + 100));
    store_item_mutation(rec.items[0], &m);
    ck_assert_uint_eq(ii.cas, store_fresh_cas(&m.id));
    ck_assert_uint_eq(m.cas, ii.cas);

    /* A peer given that mutation stores it as compactly. */
    ck_assert_int_eq(apply(b, &m), STORE_OK);
    ck_assert_uint_eq(info_of(b).size, ii.size);
    ck_assert_uint_eq(info_of(b).cas, ii.cas);
    ck_assert_uint_eq(stats(b).bytes, stats(a).bytes);

    /* touch keeps the cas in the trailer, and the expiry; so does its
     * peer. */
    ck_assert_int_eq(store_touch(a, k, strlen(k), now + 60), STORE_OK);
    store_item_info it2 = info_of(a);
    ck_assert_uint_eq(it2.cas, ii.cas);
    ck_assert_int_eq(it2.exptime, now + 60);
    ck_assert_uint_eq(it2.size, chunk_size(35 + 17 + 100 + 8 + 4));
    store_item_mutation(rec.items[1], &m);
    ck_assert_uint_eq(m.cas, ii.cas);
    ck_assert_uint_ne(m.cas, store_fresh_cas(&m.id));
    ck_assert_int_eq(apply(b, &m), STORE_OK);
    ck_assert_uint_eq(info_of(b).size, it2.size);
    ck_assert_uint_eq(info_of(b).cas, ii.cas);
    ck_assert_uint_eq(stats(b).bytes, stats(a).bytes);

    /* A new value drops the trailer again, and the old cas fails. */
    ck_assert_int_eq(wr(a, STORE_CAS, k, "y", 0, 0, ii.cas, NULL),
                     STORE_STORED);
    ck_assert_uint_eq(info_of(a).size, chunk_size(35 + 17 + 1));
    ck_assert_int_eq(wr(a, STORE_CAS, k, "z", 0, 0, ii.cas, NULL),
                     STORE_EXISTS);

    /* Client flags and an expiry take 4 bytes each, only when non-zero. */
    ck_assert_int_eq(wr(a, STORE_SET, k, v, 7, 0, 0, NULL), STORE_STORED);
    ii = info_of(a);
    ck_assert_uint_eq(ii.size, chunk_size(35 + 17 + 100 + 4));
    ck_assert_uint_eq(ii.flags, 7);
    ck_assert_int_eq(ii.exptime, 0);
    ck_assert_int_eq(wr(a, STORE_SET, k, v, 0xffffffffu, now + 100, 0, NULL),
                     STORE_STORED);
    ii = info_of(a);
    ck_assert_uint_eq(ii.size, chunk_size(35 + 17 + 100 + 8));
    ck_assert_uint_eq(ii.flags, 0xffffffffu);
    ck_assert_int_eq(ii.exptime, now + 100);
    store_item_mutation(rec.items[rec.n - 1], &m);
    ck_assert_uint_eq(m.flags, 0xffffffffu);
    ck_assert_int_eq(m.exptime, now + 100);
    ck_assert_int_eq(apply(b, &m), STORE_OK);
    ck_assert_uint_eq(info_of(b).size, ii.size);
    ck_assert_uint_eq(info_of(b).flags, 0xffffffffu);
    ck_assert_int_eq(info_of(b).exptime, now + 100);
    ck_assert_uint_eq(stats(b).bytes, stats(a).bytes);
    /* append keeps both; touch to 0 keeps the flags, drops the expiry. */
    ck_assert_int_eq(wr(a, STORE_APPEND, k, "!", 0, 0, 0, NULL), STORE_STORED);
    ii = info_of(a);
    ck_assert_uint_eq(ii.flags, 0xffffffffu);
    ck_assert_int_eq(ii.exptime, now + 100);
    ck_assert_uint_eq(ii.size, chunk_size(35 + 17 + 101 + 8));
    ck_assert_int_eq(store_touch(a, k, strlen(k), 0), STORE_OK);
    ii = info_of(a);
    ck_assert_uint_eq(ii.flags, 0xffffffffu);
    ck_assert_int_eq(ii.exptime, 0);
    ck_assert_uint_eq(ii.size, chunk_size(35 + 17 + 101 + 8 + 4));
    recorder_free(&rec);
    store_destroy(a);
    store_destroy(b);
}
END_TEST

/* ma with T: the number and the new expiry are one mutation. */
START_TEST(test_arith_touch)
{
    fake_clock c = {T0};
    store *s = mk(&c, 1, 0);
    int64_t now = (int64_t)(T0 / NS);
    recorder rec;
    uint64_t v = 0, cas = 0;

    recorder_init(&rec);
    store_set_listener(s, record, &rec);
    ck_assert_int_eq(wr(s, STORE_SET, "n", "41", 3, now + 10, 0, NULL),
                     STORE_STORED);
    store_arith_req r = {.key = "n",
                         .nkey = 1,
                         .incr = true,
                         .delta = 1,
                         .touch = true,
                         .touch_exptime = now + 500};
    ck_assert_int_eq(store_arith(s, &r, &v, &cas), STORE_OK);
    ck_assert_uint_eq(v, 42);
    ck_assert_uint_eq(rec.n, 2);
    ck_assert_int_eq(store_item_exptime(rec.items[1]), now + 500);
    ck_assert_uint_eq(store_item_flags(rec.items[1]), 3);
    ck_assert_uint_eq(store_item_cas(rec.items[1]), cas);
    size_t nv;
    const char *val = store_item_value(rec.items[1], &nv);
    ck_assert_int_eq(nv, 2);
    ck_assert_int_eq(memcmp(val, "42", 2), 0);
    /* Without touch the expiry is kept. */
    r.touch = false;
    ck_assert_int_eq(store_arith(s, &r, &v, NULL), STORE_OK);
    ck_assert_uint_eq(rec.n, 3);
    ck_assert_int_eq(store_item_exptime(rec.items[2]), now + 500);
    /* A vivified item with touch takes the touch expiry. */
    store_arith_req viv = {.key = "m",
                           .nkey = 1,
                           .incr = true,
                           .delta = 1,
                           .vivify = true,
                           .initial = 7,
                           .exptime = now + 5,
                           .touch = true,
                           .touch_exptime = now + 900};
    ck_assert_int_eq(store_arith(s, &viv, &v, NULL), STORE_STORED);
    ck_assert_uint_eq(v, 7);
    ck_assert_uint_eq(rec.n, 4);
    ck_assert_int_eq(store_item_exptime(rec.items[3]), now + 900);
    /* A touch to an expired time makes the result a miss at once. */
    r.touch = true;
    r.touch_exptime = -1;
    ck_assert_int_eq(store_arith(s, &r, &v, NULL), STORE_OK);
    ck_assert_uint_eq(v, 44);
    expect(s, "n", NULL);
    /* A miss changes nothing. */
    r.key = "absent";
    r.nkey = 6;
    ck_assert_int_eq(store_arith(s, &r, &v, NULL), STORE_NOT_FOUND);
    ck_assert_uint_eq(rec.n, 5);
    recorder_free(&rec);
    store_destroy(s);
}
END_TEST

/* store_get_ex tells an expired and a flushed value from a missing one. */
START_TEST(test_get_ex_why)
{
    fake_clock c = {T0};
    store *s = mk(&c, 1, 0);
    int64_t now = (int64_t)(T0 / NS);
    store_read_info ri;

    ck_assert_ptr_null(store_get_ex(s, "none", 4, &ri));
    ck_assert_int_eq(ri.why, 0);
    ck_assert_int_eq(wr(s, STORE_SET, "e", "v", 0, now + 5, 0, NULL),
                     STORE_STORED);
    ck_assert_int_eq(set(s, "d", "v"), STORE_STORED);
    ck_assert_int_eq(store_delete(s, "d", 1, 0), STORE_DELETED);
    store_item *it = store_get_ex(s, "e", 1, &ri);
    ck_assert_ptr_nonnull(it);
    ck_assert_int_eq(ri.why, 0);
    store_item_release(it);
    ri.why = 99;
    ck_assert_ptr_null(store_get_ex(s, "d", 1, &ri));
    ck_assert_int_eq(ri.why, 0); /* deleted: a plain miss */
    advance(&c, 5);
    ck_assert_ptr_null(store_get_ex(s, "e", 1, &ri));
    ck_assert_int_eq(ri.why, STORE_MISS_EXPIRED);
    ck_assert_ptr_null(store_get_ex(s, "e", 1, NULL));
    ck_assert_int_eq(set(s, "f", "v"), STORE_STORED);
    advance(&c, 1);
    ck_assert_int_eq(store_flush_all(s, 0), STORE_OK);
    ck_assert_ptr_null(store_get_ex(s, "f", 1, &ri));
    ck_assert_int_eq(ri.why, STORE_MISS_FLUSHED);
    /* Expired and flushed: flushed. */
    ck_assert_ptr_null(store_get_ex(s, "e", 1, &ri));
    ck_assert_int_eq(ri.why, STORE_MISS_FLUSHED);
    /* Invalid keys are plain misses. */
    ri.why = 99;
    ck_assert_ptr_null(store_get_ex(s, "", 0, &ri));
    ck_assert_int_eq(ri.why, 0);
    store_destroy(s);
}
END_TEST

/*
 * Overwrites swap the old id for the new one in one sketch walk: after many
 * of them the sketch equals that of a store given only the final values.
 */
START_TEST(test_overwrite_sketch)
{
    fake_clock c = {T0};
    store *a = mk(&c, 1, 0), *b = mk(&c, 2, 0);
    char key[16], val[16];

    for (int round = 0; round < 5; round++) {
        for (int i = 0; i < 50; i++) {
            snprintf(key, sizeof(key), "k%d", i);
            snprintf(val, sizeof(val), "%d", round * 100 + i);
            ck_assert_int_eq(set(a, key, val), STORE_STORED);
        }
    }
    ck_assert_int_eq(store_touch(a, "k1", 2, 0), STORE_OK);
    ck_assert_int_eq(store_delete(a, "k2", 2, 0), STORE_DELETED);
    ck_assert_int_eq(set_size(a), 50);
    /* b learns a's set (tombstone included) by plain additions. */
    idlist l = {.n = 0};
    ck_assert_uint_eq(store_journal_ids(a, collect, &l), 50);
    for (size_t i = 0; i < l.n; i++) {
        store_item *it = store_fetch(a, &l.ids[i]);
        ck_assert_ptr_nonnull(it);
        store_mutation m;
        store_item_mutation(it, &m);
        ck_assert_int_eq(apply(b, &m), STORE_OK);
        store_item_release(it);
    }
    same_sketch(a, b);
    expect(b, "k2", NULL);
    expect(b, "k49", "449");
    store_destroy(a);
    store_destroy(b);
}
END_TEST

/*
 * sketch_symbols 0 (a node without replication): no sketch, and the set's
 * counters follow the same writes, deletes, peer mutations, expiries and
 * evictions as those of a store with one.
 */
START_TEST(test_no_sketch)
{
    fake_clock c = {T0};
    store *none = mk_sketch(&c, 1, 64 * 1024, 0, 0);
    ck_assert_uint_eq(store_sketch_symbols(none), 0);
    store *with = mk(&c, 1, 64 * 1024);
    ck_assert_uint_eq(store_sketch_symbols(with), 256);
    store *both[2] = {none, with};
    char key[16], val[200];
    memset(val, 'v', sizeof(val) - 1);
    val[sizeof(val) - 1] = '\0';
    for (int w = 0; w < 2; w++) {
        store *s = both[w];
        for (int i = 0; i < 100; i++) {
            snprintf(key, sizeof(key), "k%d", i);
            ck_assert_int_eq(set(s, key, "one"), STORE_STORED);
        }
        for (int i = 0; i < 50; i++) { /* overwrites */
            snprintf(key, sizeof(key), "k%d", i);
            ck_assert_int_eq(set(s, key, "two"), STORE_STORED);
        }
        ck_assert_int_eq(store_delete(s, "k3", 2, 0), STORE_DELETED);
        ck_assert_int_eq(wr(s, STORE_SET, "short", "x", 0,
                            store_exptime_abs(s, 5), 0, NULL),
                         STORE_STORED);
        store_mutation m = mut(77, T0 + 1, 9, STORE_KIND_VALUE, "peer", "p");
        ck_assert_int_eq(apply(s, &m), STORE_OK);
    }
    expect(none, "k1", "two");
    expect(none, "k3", NULL);
    expect(none, "peer", "p");
    expect(none, "short", "x");
    expect(none, "k99", "one");
    expect(none, "k0", "two");
    ck_assert_int_eq(set_size(none), 102); /* 100 + short + peer */
    ck_assert_int_eq(set_size(none), set_size(with));
    /* No symbol can be read from it. */
    riblt_symbol sym;
    int64_t n = -1;
    ck_assert_int_eq(store_sketch_read(none, 0, &sym, 1, &n), STORE_ERR_INVAL);
    advance(&c, 10); /* short expires; the sweeps take it */
    store_sweep(none, 1000000);
    store_sweep(with, 1000000);
    ck_assert_int_eq(set_size(none), set_size(with));
    /* Fill both well past the limit: evictions leave the set alike. */
    for (int w = 0; w < 2; w++)
        for (int i = 0; i < 2000; i++) {
            snprintf(key, sizeof(key), "f%d", i);
            ck_assert_int_eq(set(both[w], key, val), STORE_STORED);
        }
    store_stats a = stats(none), b = stats(with);
    ck_assert_uint_gt(a.evictions, 0);
    ck_assert_uint_eq(a.curr_items, b.curr_items);
    ck_assert_int_eq(set_size(none), set_size(with));
    store_destroy(none);
    store_destroy(with);
}
END_TEST

/*
 * Reads keep items from eviction (the clock's second chance), and unread
 * items go oldest first (the age gate).
 */
START_TEST(test_eviction_clock)
{
    fake_clock c = {T0};
    size_t one = item_bytes("k:0000", 100);
    store *s = mk(&c, 1, one * 200);
    char key[16], v[101];

    memset(v, 'v', 100);
    v[100] = 0;
    for (int i = 0; i < 200; i++) {
        snprintf(key, sizeof(key), "k:%04d", i);
        ck_assert_int_eq(set(s, key, v), STORE_STORED);
    }
    ck_assert_uint_eq(stats(s).evictions, 0);
    /* k:0000..k:0019 are read before every write: the hand always finds
     * them referenced. Everything else is written once and never read. */
    for (int i = 200; i < 2000; i++) {
        for (int h = 0; h < 20; h++) {
            snprintf(key, sizeof(key), "k:%04d", h);
            store_item_release(store_get(s, key, 6));
        }
        snprintf(key, sizeof(key), "k:%04d", i);
        ck_assert_int_eq(set(s, key, v), STORE_STORED);
    }
    store_stats st = stats(s);
    ck_assert_uint_ge(st.evictions, 1790);
    ck_assert_uint_eq(st.evicted_unfetched, st.evictions);
    ck_assert_uint_le(st.curr_items, 200);
    for (int h = 0; h < 20; h++) {
        snprintf(key, sizeof(key), "k:%04d", h);
        expect(s, key, v);
    }
    /* Oldest first: of the last 180 written, most are still here. */
    int recent = 0;
    for (int i = 1820; i < 2000; i++) {
        snprintf(key, sizeof(key), "k:%04d", i);
        store_item *it = store_get(s, key, 6);
        recent += it != NULL;
        store_item_release(it);
    }
    ck_assert_int_ge(recent, 120);
    /* A lone store (no record table) leaves nothing behind. */
    ck_assert_uint_eq(st.mutations, st.curr_items);
    ck_assert_uint_eq(st.tombstones, 0);
    ck_assert_uint_eq(st.evicted_records, 0);
    store_destroy(s);
}
END_TEST

typedef struct idvec {
    riblt_id *v;
    size_t n, cap;
} idvec;

static void idvec_add(void *arg, const riblt_id *id)
{
    idvec *iv = arg;
    if (iv->n == iv->cap) {
        iv->cap = iv->cap ? iv->cap * 2 : 64;
        iv->v = realloc(iv->v, iv->cap * sizeof(*iv->v));
        ck_assert_ptr_nonnull(iv->v);
    }
    iv->v[iv->n++] = *id;
}

/*
 * Gives `to` at most `max` mutations that `from` has and it lacks, looking
 * from the journal's id number `start` on (round the end), so that
 * successive calls with other starts reach every difference.
 */
static size_t give_some(store *from, store *to, size_t max, size_t start)
{
    idvec iv = {NULL, 0, 0};
    size_t moved = 0;

    store_journal_ids(from, idvec_add, &iv);
    for (size_t k = 0; k < iv.n && moved < max; k++) {
        size_t i = (start + k) % iv.n;
        store_mutation m;
        store_item *hold;
        if (store_has(to, &iv.v[i]) ||
            !store_fetch_mutation(from, &iv.v[i], &m, &hold))
            continue;
        int r = store_apply(to, &m);
        ck_assert(r == STORE_OK || r == STORE_STALE);
        moved++;
        store_item_release(hold);
    }
    free(iv.v);
    return moved;
}

/* Gives `to` every mutation `from` holds that `to` lacks, as a round's
 * fetch would (ids, then store_fetch_mutation, then store_apply). */
static size_t give_missing(store *from, store *to)
{
    return give_some(from, to, SIZE_MAX, 0);
}

/* Both directions, as rounds would, until neither side lacks anything. */
static void reconcile(store *a, store *b)
{
    for (int i = 0; i < 4; i++)
        if (give_missing(a, b) + give_missing(b, a) == 0)
            break;
}

/*
 * Writes keys k:000.. with 1000-byte values (v, 1001 bytes, is filled) to
 * a, recording what a tells its listener in *rec (the caller frees it), and
 * applies every recorded mutation to b, as push would.
 */
static void write_pushed(store *a, store *b, recorder *rec, int n, char *v)
{
    char key[16];

    memset(v, 'v', 1000);
    v[1000] = 0;
    recorder_init(rec);
    store_set_listener(a, record, rec);
    for (int i = 0; i < n; i++) {
        snprintf(key, sizeof(key), "k:%03d", i);
        ck_assert_int_eq(set(a, key, v), STORE_STORED);
    }
    for (size_t i = 0; i < rec->n; i++) {
        store_mutation m;
        store_item_mutation(rec->items[i], &m);
        ck_assert_int_eq(store_apply(b, &m), STORE_OK);
    }
}

/*
 * Eviction is local: a small node evicts, a big one that saw the same
 * writes keeps them all, their sets stay equal, and nothing evicted comes
 * back or beats a newer write or a delete.
 */
START_TEST(test_eviction_local)
{
    fake_clock c = {T0};
    size_t one = item_bytes("k:000", 1000);
    store *a = mk_rec(&c, 1, one * 10 + 128 * 36, 128 * 36);
    store *b = mk_rec(&c, 2, 0, 128 * 36);
    char key[16], v[1001];
    recorder rec;

    write_pushed(a, b, &rec, 100, v);
    ck_assert_uint_eq(rec.n, 100);
    store_stats sa = stats(a), sb = stats(b);
    /* Room for 10 items plus the record table; records are counted as
     * held, so the room they do not use yet holds an item or two more. */
    ck_assert_uint_ge(sa.evictions, 85);
    ck_assert_uint_eq(sa.evicted_records, sa.evictions);
    ck_assert_uint_eq(sa.curr_items + sa.evicted_records, 100);
    ck_assert_uint_eq(sa.mutations, 100);
    ck_assert_uint_eq(sb.curr_items, 100);
    ck_assert_uint_eq(sb.evictions, 0);
    /* Equal sets: nothing for a round to move either way. */
    same_sketch(a, b);
    ck_assert_uint_eq(give_missing(b, a), 0);
    /* A replayed write of an evicted value does not come back. */
    size_t back = 0;
    for (size_t i = 0; i < rec.n; i++) {
        store_mutation m;
        store_item_mutation(rec.items[i], &m);
        int r = store_apply(a, &m);
        ck_assert_int_eq(r, STORE_STALE);
        back++;
    }
    ck_assert_uint_eq(back, 100);
    ck_assert_uint_eq(stats(a).curr_items, sa.curr_items);
    /* A newer write and a delete on b win over a's records. */
    int ev = -1;
    for (int i = 0; i < 100 && ev < 0; i++) {
        snprintf(key, sizeof(key), "k:%03d", i);
        store_item *it = store_get(a, key, 5);
        if (it == NULL)
            ev = i;
        store_item_release(it);
    }
    ck_assert_int_ge(ev, 0);
    snprintf(key, sizeof(key), "k:%03d", ev);
    ck_assert_int_eq(set(b, key, "newer"), STORE_STORED);
    ck_assert_uint_eq(give_missing(b, a), 1);
    expect(a, key, "newer");
    char key2[16];
    int ev2 = -1;
    for (int i = ev + 1; i < 100 && ev2 < 0; i++) {
        snprintf(key2, sizeof(key2), "k:%03d", i);
        store_item *it = store_get(a, key2, 5);
        if (it == NULL)
            ev2 = i;
        store_item_release(it);
    }
    ck_assert_int_ge(ev2, 0);
    ck_assert_int_eq(store_delete(b, key2, 5, 0), STORE_DELETED);
    ck_assert_uint_eq(give_missing(b, a), 1);
    expect(a, key2, NULL);
    expect(b, key2, NULL);
    same_sketch(a, b);
    ck_assert_uint_eq(stats(a).tombstones, 1);
    /* A node that lacks a mutation altogether gets the record, not the
     * value: the sets agree, and it holds no value a takes for evicted. */
    store *e = mk_rec(&c, 3, 0, 4096 * 36);
    ck_assert_uint_eq(give_missing(a, e), stats(a).mutations);
    same_sketch(a, e);
    ck_assert_uint_eq(stats(e).curr_items, stats(a).curr_items);
    ck_assert_uint_eq(stats(e).evicted_records, stats(a).evicted_records);
    /* A store without a record table refuses keyless records. */
    idvec iv = {NULL, 0, 0};
    store_journal_ids(a, idvec_add, &iv);
    store *lone = mk(&c, 4, 0);
    size_t refused = 0;
    for (size_t i = 0; i < iv.n; i++) {
        store_mutation m;
        store_item *hold;
        ck_assert(store_fetch_mutation(a, &iv.v[i], &m, &hold));
        if (m.kind == STORE_KIND_EVICTED) {
            ck_assert_int_eq(m.nkey, 0);
            ck_assert_int_eq(store_apply(lone, &m), STORE_ERR_INVAL);
            refused++;
        }
        store_item_release(hold);
    }
    ck_assert_uint_gt(refused, 0);
    free(iv.v);
    store_destroy(lone);
    store_destroy(e);
    recorder_free(&rec);
    store_destroy(a);
    store_destroy(b);
}
END_TEST

/*
 * Two nodes of different sizes evict different values under the same
 * writes and keep equal sets; each holds what its memory allows.
 */
START_TEST(test_eviction_mixed_sizes)
{
    fake_clock c = {T0};
    size_t one = item_bytes("k:0000", 500);
    size_t rb = 512 * 36;
    store *a = mk_rec(&c, 1, one * 20 + rb, rb),
          *b = mk_rec(&c, 2, one * 80 + rb, rb);
    char key[16], v[501];
    recorder rec;

    memset(v, 'v', 500);
    v[500] = 0;
    recorder_init(&rec);
    store_set_listener(a, record, &rec);
    for (int i = 0; i < 400; i++) {
        snprintf(key, sizeof(key), "k:%04d", i);
        ck_assert_int_eq(set(a, key, v), STORE_STORED);
        store_mutation m;
        store_item_mutation(rec.items[rec.n - 1], &m);
        ck_assert_int_eq(store_apply(b, &m), STORE_OK);
        store_item_release(rec.items[--rec.n]);
        if (i % 50 == 0)
            advance(&c, 1);
    }
    same_sketch(a, b);
    store_stats sa = stats(a), sb = stats(b);
    /* Each holds what a lone store of its size holds under the same
     * writes, less the room of the records it holds (counted as held) and
     * of the drops' first table (a sixteenth of the records', reserved). */
    size_t lone[2], lim[2] = {one * 20 + rb, one * 80 + rb};
    for (int k = 0; k < 2; k++) {
        store *l = mk(&c, 9, lim[k]);
        for (int i = 0; i < 400; i++) {
            snprintf(key, sizeof(key), "k:%04d", i);
            ck_assert_int_eq(set(l, key, v), STORE_STORED);
        }
        lone[k] = stats(l).curr_items;
        store_destroy(l);
    }
    ck_assert_uint_ge((sa.curr_items + 1) * one + sa.evicted_records * 36 +
                          rb / 16 + one,
                      lone[0] * one);
    ck_assert_uint_le(sa.curr_items, lone[0]);
    ck_assert_uint_lt(sa.curr_items, lone[0] - 1);
    ck_assert_uint_ge((sb.curr_items + 1) * one + sb.evicted_records * 36 +
                          rb / 16 + one,
                      lone[1] * one);
    ck_assert_uint_le(sb.curr_items, lone[1]);
    ck_assert_uint_eq(sa.mutations, 400);
    ck_assert_uint_eq(sb.mutations, 400);
    ck_assert_uint_eq(give_missing(a, b) + give_missing(b, a), 0);
    recorder_free(&rec);
    store_destroy(a);
    store_destroy(b);
}
END_TEST

/*
 * A full record table turns its oldest records into drops, which reach
 * peers like any mutation: a peer holding the value takes it out of its set
 * and keeps it, readable; sets agree, and drops leave every set after 60 s.
 * (50 writes: few enough drops for their table to hold them all;
 * test_drops_bounded goes beyond.)
 */
START_TEST(test_eviction_record_overflow)
{
    fake_clock c = {T0};
    size_t one = item_bytes("k:000", 1000);
    /* 40 entries: 38 for records, 2 for drops to start with (they grow). */
    store *a = mk_rec(&c, 1, one * 6 + 40 * 36, 40 * 36);
    store *b = mk_rec(&c, 2, 0, 4096 * 36);
    char v[1001];
    recorder rec;

    write_pushed(a, b, &rec, 50, v);
    store_stats sa = stats(a);
    ck_assert_uint_eq(sa.evict_records, 38);
    ck_assert_uint_gt(sa.drops_written, 4);
    ck_assert_uint_eq(sa.evicted_records, 38);
    /* No drop went early: the drops' table grew. */
    ck_assert_uint_eq(sa.drops, sa.drops_written);
    /* Every drop went to the listener too (push), keyless. */
    size_t pushed = 0;
    for (size_t i = 0; i < rec.n; i++) {
        if (store_item_kind(rec.items[i]) != STORE_KIND_DROP)
            continue;
        store_mutation m;
        store_item_mutation(rec.items[i], &m);
        ck_assert_uint_eq(m.nkey, 0);
        ck_assert(store_has(a, &m.id));
        pushed++;
    }
    ck_assert_uint_eq(pushed, sa.drops_written);
    ck_assert_uint_eq(sa.mutations,
                      sa.curr_items + sa.evicted_records + sa.drops);
    /* b keeps every value; the drops took their mutations out of its set. */
    reconcile(a, b);
    same_sketch(a, b);
    store_stats sb = stats(b);
    ck_assert_uint_eq(sb.drops, sa.drops);
    ck_assert_uint_eq(sb.curr_items, 50);
    ck_assert_uint_eq(sb.kept_items, sb.drops);
    ck_assert_uint_eq(sb.evicted_records, 0);
    ck_assert_uint_eq(sb.mutations, 50 - sb.kept_items + sb.drops);
    ck_assert_uint_eq(sa.kept_items, 0);
    /* An old write of a dropped value does not come back into the set
     * while the drop is in it. */
    for (size_t i = 0; i < rec.n; i++) {
        store_mutation m;
        store_item_mutation(rec.items[i], &m);
        int r = store_apply(b, &m);
        ck_assert_int_eq(r, STORE_STALE);
    }
    ck_assert_uint_eq(stats(b).kept_items, sb.kept_items);
    /* Drops leave after 60 s, on both, and the sets still agree; b still
     * holds what it kept. */
    advance(&c, 61);
    store_sweep(a, SIZE_MAX);
    store_sweep(b, SIZE_MAX);
    ck_assert_uint_eq(stats(a).drops, 0);
    ck_assert_uint_eq(stats(b).drops, 0);
    same_sketch(a, b);
    ck_assert_uint_eq(stats(b).curr_items, 50);
    ck_assert_uint_eq(stats(b).kept_items, sb.kept_items);
    recorder_free(&rec);
    store_destroy(a);
    store_destroy(b);
}
END_TEST

/* Whether b holds key k readable but out of its set (kept). */
static bool is_kept(store *b, const char *k)
{
    store_item *it = store_get(b, k, strlen(k));
    if (it == NULL)
        return false;
    store_mutation m;
    store_item_mutation(it, &m);
    bool in = store_has(b, &m.id);
    store_item_release(it);
    return !in;
}

/*
 * A drop takes the value it names out of every set and leaves it where it
 * is held: a newer write or a delete still wins over a kept value, an
 * eviction of one leaves no record, a drop that names a newer version than
 * a node holds removes the older value, and the kept mutation itself,
 * coming back from a peer that still has it in its set, comes back into
 * the set.
 */
START_TEST(test_drop_keeps_value)
{
    fake_clock c = {T0};
    size_t one = item_bytes("k:000", 1000);
    store *a = mk_rec(&c, 1, one * 6 + 40 * 36, 40 * 36);
    store *b = mk_rec(&c, 2, one * 200 + 400 * 36, 400 * 36);
    char key[16], v[1001];
    recorder rec;
    const char *kk[64];
    char keys[64][16];
    size_t nk = 0;

    write_pushed(a, b, &rec, 50, v);
    reconcile(a, b);
    same_sketch(a, b);
    for (int i = 0; i < 50; i++) {
        snprintf(keys[nk], sizeof(keys[nk]), "k:%03d", i);
        if (is_kept(b, keys[nk])) {
            kk[nk] = keys[nk];
            nk++;
        }
    }
    store_stats sb = stats(b);
    ck_assert_uint_ge(nk, 5);
    ck_assert_uint_eq(nk, sb.kept_items);
    ck_assert_uint_eq(sb.curr_items, 50);

    /* A newer write of a kept key through a reaches b: in the set again,
     * and the drop gone from both sets. */
    size_t n0 = rec.n;
    ck_assert_int_eq(set(a, kk[0], "newer"), STORE_STORED);
    ck_assert_uint_eq(rec.n, n0 + 1);
    store_mutation m;
    store_item_mutation(rec.items[n0], &m);
    ck_assert_int_eq(store_apply(b, &m), STORE_OK);
    expect(b, kk[0], "newer");
    ck_assert(!is_kept(b, kk[0]));
    ck_assert_uint_eq(stats(b).kept_items, nk - 1);
    ck_assert_uint_eq(stats(b).drops, sb.drops - 1);
    same_sketch(a, b);

    /* A delete through b of a key it keeps: a tombstone on both. */
    ck_assert_int_eq(store_delete(b, kk[1], strlen(kk[1]), 0), STORE_DELETED);
    ck_assert_uint_eq(give_missing(b, a), 1);
    expect(a, kk[1], NULL);
    expect(b, kk[1], NULL);
    ck_assert_uint_eq(stats(b).kept_items, nk - 2);
    same_sketch(a, b);

    /* A drop naming a newer version than a node holds removes its older
     * value; one older than what it holds is stale. */
    store *d = mk_rec(&c, 3, 0, 4096 * 36);
    store_mutation old = mut(7, 1, 3, STORE_KIND_VALUE, kk[2], "older");
    ck_assert_int_eq(apply(d, &old), STORE_OK);
    store_mutation nw =
        mut(7, UINT64_C(1) << 62, 3, STORE_KIND_VALUE, kk[3], "newest");
    ck_assert_int_eq(apply(d, &nw), STORE_OK);
    size_t drops_seen = 0;
    for (size_t i = 0; i < rec.n; i++) {
        if (store_item_kind(rec.items[i]) != STORE_KIND_DROP)
            continue;
        store_item_mutation(rec.items[i], &m);
        store_mutation probe2 = mut(1, 1, 1, STORE_KIND_VALUE, kk[2], "x");
        store_mutation probe3 = mut(1, 1, 1, STORE_KIND_VALUE, kk[3], "x");
        if (m.id.hi == probe2.id.hi) {
            ck_assert_int_eq(store_apply(d, &m), STORE_OK);
            drops_seen++;
        } else if (m.id.hi == probe3.id.hi) {
            ck_assert_int_eq(store_apply(d, &m), STORE_STALE);
            drops_seen++;
        }
    }
    ck_assert_uint_eq(drops_seen, 2);
    expect(d, kk[2], NULL);
    expect(d, kk[3], "newest");
    ck_assert_uint_eq(stats(d).kept_items, 0);
    store_destroy(d);

    /* After the drops' minute, b still keeps what it kept; the same or an
     * older mutation from a peer that holds it in its set, as a value or
     * as the record of an evicted one, is stale and brings the kept value
     * back into the set. */
    advance(&c, 61);
    store_sweep(a, SIZE_MAX);
    store_sweep(b, SIZE_MAX);
    same_sketch(a, b);
    size_t back = 0;
    for (size_t i = 0; i < rec.n && back < 3; i++) {
        if (store_item_kind(rec.items[i]) != STORE_KIND_VALUE)
            continue;
        size_t nkey;
        const char *k = store_item_key(rec.items[i], &nkey);
        snprintf(key, sizeof(key), "%.*s", (int)nkey, k);
        if (!is_kept(b, key))
            continue;
        store_item_mutation(rec.items[i], &m);
        if (back == 1) {
            /* The record a node that evicted it would send. */
            riblt_id id = m.id;
            store_version ver = m.version;
            memset(&m, 0, sizeof(m));
            m.id = id;
            m.version = ver;
            m.kind = STORE_KIND_EVICTED;
        }
        if (back == 2) {
            /* An older value of the key. */
            m.version.ticks -= 1000;
            m.value = "old";
            m.nvalue = 3;
            m.id = store_mutation_id(&m);
            m.cas = store_fresh_cas(&m.id);
        }
        uint64_t k0 = stats(b).kept_items;
        ck_assert_int_eq(store_apply(b, &m), STORE_STALE);
        ck_assert(!is_kept(b, key));
        /* The kept value, not the older one, is what b serves. */
        store_item *held = store_get(b, key, strlen(key));
        size_t nheld;
        ck_assert_ptr_nonnull(held);
        store_item_value(held, &nheld);
        ck_assert_uint_eq(nheld, 1000);
        store_item_release(held);
        ck_assert_uint_eq(stats(b).kept_items, k0 - 1);
        back++;
    }
    ck_assert_uint_eq(back, 3);
    /* Now a lacks them, and takes them (a cache may refill; a full a then
     * evicts again, and may write drops, which is why a's refills wait
     * until all three came back: a new drop would keep its value out). */
    ck_assert_uint_ge(give_missing(b, a), 3);
    reconcile(a, b);
    same_sketch(a, b);
    /* Evicting a kept value leaves no record; evicting one in the set
     * leaves its record, and the sets still agree. */
    store_stats before = stats(b);
    /* Room for about ten values beside the key table and the records. */
    ck_assert_int_eq(
        store_set_memory_limit(b, KEY_TABLE_ROOM + 400 * 36 + one * 10),
        STORE_OK);
    store_stats after = stats(b);
    uint64_t ev = after.evictions - before.evictions;
    uint64_t kept_gone = before.kept_items - after.kept_items;
    ck_assert_uint_gt(ev, 20);
    ck_assert_uint_gt(kept_gone, 0);
    ck_assert_uint_eq(after.evicted_records - before.evicted_records,
                      ev - kept_gone);
    same_sketch(a, b);
    recorder_free(&rec);
    store_destroy(a);
    store_destroy(b);
}
END_TEST

/*
 * Under sustained eviction the drops' table grows to as many entries as the
 * records' table has (here fewer than DROP_MAX_ENTRIES) and no further:
 * beyond, the oldest drop goes early. Drops never squeeze the items out of
 * the limit (they once grew against it until a node under steady eviction
 * held a tenth of its items).
 */
START_TEST(test_drops_bounded)
{
    fake_clock c = {T0};
    size_t one = item_bytes("k:000", 1000);
    store *a = mk_rec(&c, 1, one * 6 + 40 * 36, 40 * 36);
    char key[16], v[1001];

    memset(v, 'v', 1000);
    v[1000] = 0;
    for (int i = 0; i < 400; i++) {
        snprintf(key, sizeof(key), "k:%03d", i);
        ck_assert_int_eq(set(a, key, v), STORE_STORED);
    }
    store_stats sa = stats(a);
    ck_assert_uint_eq(sa.evicted_records, 38);
    ck_assert_uint_le(sa.drops, 40);
    ck_assert_uint_gt(sa.drops_written, 300);
    ck_assert_uint_ge(sa.curr_items, 4);
    ck_assert_uint_eq(sa.mutations,
                      sa.curr_items + sa.evicted_records + sa.drops);
    store_destroy(a);
    /* A big record share (2^20 entries) starts its drops' table at the
     * common bound, 4,096, not at a sixteenth (65,536): the records get
     * the rest, and no node's drops' table outgrows another's. */
    store *big = mk_rec(&c, 2, 0, ((size_t)1 << 20) * 36);
    ck_assert_uint_eq(stats(big).evict_records, ((size_t)1 << 20) - 4096);
    store_destroy(big);
}
END_TEST

/*
 * Two equal nodes whose drops' tables are full agree after exchanging what
 * each lacks a few mutations at a time, as interleaved rounds do: a drop
 * below all a full table holds goes at once, taking the entry of its key
 * that it beats with it, so nothing stays different.
 */
START_TEST(test_drops_converge)
{
    fake_clock c = {T0};
    size_t one = item_bytes("k:000", 1000);
    store *a = mk_rec(&c, 1, one * 6 + 40 * 36, 40 * 36);
    store *b = mk_rec(&c, 2, one * 6 + 40 * 36, 40 * 36);
    char key[16], v[1001];

    recorder rec;

    memset(v, 'v', 1000);
    v[1000] = 0;
    recorder_init(&rec);
    store_set_listener(a, record, &rec);
    /* Writes through a, each pushed to b at once (b evicts as well, and
     * its own drops go nowhere until the exchanges). */
    size_t pushed = 0;
    for (int i = 0; i < 300; i++) {
        snprintf(key, sizeof(key), "k:%03d", i);
        ck_assert_int_eq(set(a, key, v), STORE_STORED);
        for (; pushed < rec.n; pushed++) {
            store_mutation m;
            store_item_mutation(rec.items[pushed], &m);
            int r = store_apply(b, &m);
            ck_assert(r == STORE_OK || r == STORE_STALE);
        }
        if (i % 25 == 0)
            advance(&c, 1);
    }
    ck_assert_uint_eq(stats(a).drops, 40);
    ck_assert_uint_eq(stats(b).drops, 40);
    int n = 0;
    size_t moved = 1;
    while (n < 400 && moved != 0) {
        size_t at = (size_t)n * 29;
        moved = give_some(a, b, 8, at) + give_some(b, a, 8, at);
        n++;
    }
    ck_assert_msg(moved == 0, "still moving after %d exchanges", n);
    same_sketch(a, b);
    store_stats sa = stats(a), sb = stats(b);
    ck_assert_uint_eq(sa.drops, sb.drops);
    ck_assert_uint_eq(sa.mutations, sb.mutations);
    recorder_free(&rec);
    store_destroy(a);
    store_destroy(b);
}
END_TEST

START_TEST(test_eviction_churn)
{
    fake_clock c = {T0};
    size_t one = item_bytes("key:0000", 200);
    store *s = mk(&c, 1, one * 20);
    char key[16], v[201];

    memset(v, 'v', 200);
    v[200] = 0;
    for (int i = 0; i < 2000; i++) {
        snprintf(key, sizeof(key), "key:%04d", i);
        ck_assert_int_eq(set(s, key, v), STORE_STORED);
        if (i % 100 == 0)
            advance(&c, 1);
    }
    store_stats st = stats(s);
    ck_assert_uint_ge(st.curr_items, 10);
    ck_assert_uint_ge(st.evictions, 1900);
    ck_assert_uint_eq(st.curr_items + st.tombstones, st.mutations);
    expect(s, "key:1999", v);
    expect(s, "key:0000", NULL);
    /* Deletes' tombstones are not evictable: the delete sticks. */
    ck_assert_int_eq(store_delete(s, "key:1999", 8, 0), STORE_DELETED);
    for (int i = 0; i < 100; i++) {
        snprintf(key, sizeof(key), "new:%04d", i);
        ck_assert_int_eq(set(s, key, v), STORE_STORED);
    }
    store_mutation m = mut(42, T0, 2, STORE_KIND_VALUE, "key:1999", "old");
    ck_assert_int_eq(apply(s, &m), STORE_STALE);
    store_destroy(s);
}
END_TEST

START_TEST(test_nomem)
{
    fake_clock c = {T0};
    size_t one = item_bytes("key-000", 100);
    store *s = mk(&c, 1, one * 4);
    char key[16];

    const char *v40 = "0123456789012345678901234567890123456789";
    int i, r = STORE_STORED;

    /* Fill with tombstones (deletes need no room) until a set fails. */
    for (i = 0; i < 1000; i++) {
        snprintf(key, sizeof(key), "key-%03d", i);
        r = set(s, key, v40);
        if (r != STORE_STORED)
            break;
        ck_assert_int_eq(store_delete(s, key, strlen(key), 0), STORE_DELETED);
    }
    ck_assert_int_eq(r, STORE_ERR_NOMEM);
    ck_assert_int_gt(i, 0);
    expect(s, key, NULL);
    store_stats st = stats(s);
    ck_assert_uint_eq(st.mutations, (uint64_t)i);
    ck_assert_uint_eq(st.tombstones, (uint64_t)i);
    ck_assert_uint_eq(st.curr_items, 0);
    ck_assert_uint_eq(st.evictions, 0);
    /* After the tombstones are swept there is room again. */
    advance(&c, 101);
    ck_assert_uint_eq(store_sweep(s, SIZE_MAX), (size_t)i);
    ck_assert_int_eq(set(s, key, v40), STORE_STORED);
    expect(s, key, v40);
    /* An item larger than the whole limit fails without evicting. */
    char big[2048];
    memset(big, 'b', sizeof(big) - 1);
    big[sizeof(big) - 1] = 0;
    ck_assert_int_eq(set(s, "big", big), STORE_ERR_NOMEM);
    expect(s, key, v40);
    ck_assert_uint_eq(stats(s).evictions, 0);
    store_destroy(s);
}
END_TEST

START_TEST(test_too_large)
{
    fake_clock c = {T0};
    store_options o;
    int err;

    store_options_default(&o);
    o.item_size_max = 1024;
    o.sketch_symbols = 64;
    o.hash_power = 4;
    o.clock = fake_now;
    o.clock_arg = &c;
    store *s = store_create(&o, &err);
    char v[2048];
    memset(v, 'x', sizeof(v) - 1);
    v[sizeof(v) - 1] = 0;
    ck_assert_int_eq(set(s, "k", "small"), STORE_STORED);
    ck_assert_int_eq(set(s, "k", v), STORE_ERR_TOO_LARGE);
    expect(s, "k", "small");
    v[600] = 0;
    /* An append whose result cannot fit is not stored, as memcached. */
    ck_assert_int_eq(set(s, "k", v), STORE_STORED);
    ck_assert_int_eq(wr(s, STORE_APPEND, "k", v, 0, 0, 0, NULL),
                     STORE_NOT_STORED);
    store_mutation m = mut(3, T0 + 1, 2, STORE_KIND_VALUE, "p", NULL);
    m.value = v;
    m.nvalue = 2000;
    ck_assert_int_eq(apply(s, &m), STORE_ERR_TOO_LARGE);
    ck_assert_uint_eq(stats(s).mutations, 1);
    store_destroy(s);
}
END_TEST

START_TEST(test_sweep_budget)
{
    fake_clock c = {T0};
    store *s = mk(&c, 1, 0);
    char key[16];

    for (int i = 0; i < 100; i++) {
        snprintf(key, sizeof(key), "k%d", i);
        ck_assert_int_eq(set(s, key, "v"), STORE_STORED);
        ck_assert_int_eq(store_delete(s, key, strlen(key), 0), STORE_DELETED);
    }
    ck_assert_int_eq(set(s, "keep", "v"), STORE_STORED);
    advance(&c, 100);
    ck_assert_uint_eq(store_sweep(s, 10), 10);
    ck_assert_uint_eq(stats(s).mutations, 91);
    ck_assert_uint_eq(store_sweep(s, 30), 30);
    /* One at a time, even inside a chain. */
    for (int i = 0; i < 20; i++)
        ck_assert_uint_eq(store_sweep(s, 1), 1);
    ck_assert_uint_eq(store_sweep(s, SIZE_MAX), 40);
    ck_assert_uint_eq(store_sweep(s, SIZE_MAX), 0);
    ck_assert_int_eq(set_size(s), 1);
    expect(s, "keep", "v");
    riblt_symbol sym[2];
    ck_assert_int_eq(store_sketch_read(s, 255, sym, 2, NULL), STORE_ERR_INVAL);
    ck_assert_int_eq(store_sketch_read(s, 255, sym, 1, NULL), STORE_OK);
    store_destroy(s);
}
END_TEST

START_TEST(test_table_growth)
{
    fake_clock c = {T0};
    store_options o;
    int err;
    char key[32], val[32];

    store_options_default(&o);
    o.hash_power = 1;
    o.sketch_symbols = 64;
    o.memory_limit = 0;
    o.clock = fake_now;
    o.clock_arg = &c;
    store *s = store_create(&o, &err);
    ck_assert_uint_eq(stats(s).hash_power_level, 1);
    for (int i = 0; i < 20000; i++) {
        snprintf(key, sizeof(key), "key:%d", i);
        snprintf(val, sizeof(val), "%d", i * 3);
        ck_assert_int_eq(set(s, key, val), STORE_STORED);
    }
    for (int i = 0; i < 20000; i++) {
        snprintf(key, sizeof(key), "key:%d", i);
        snprintf(val, sizeof(val), "%d", i * 3);
        expect(s, key, val);
    }
    store_stats st = stats(s);
    ck_assert_uint_ge(st.hash_power_level, 13);
    ck_assert_uint_eq(st.curr_items, 20000);
    ck_assert_uint_eq(st.mutations, 20000);
    ck_assert_int_eq(set_size(s), 20000);
    store_destroy(s);
}
END_TEST

/* ------------------------------------------------------ threaded smoke */

typedef struct worker {
    store *s;
    uint64_t seed;
    int ops;
} worker;

static void *smoke(void *arg)
{
    worker *w = arg;
    uint64_t x = w->seed;
    char key[16], val[64];

    for (int i = 0; i < w->ops; i++) {
        snprintf(key, sizeof(key), "k%d", (int)(lcg(&x) % 200));
        size_t nv = lcg(&x) % 60;
        memset(val, 'a' + (int)(i % 26), nv);
        val[nv] = 0;
        switch (lcg(&x) % 8) {
        case 0:
            store_delete(w->s, key, strlen(key), 0);
            break;
        case 1:
            wr(w->s, STORE_APPEND, key, "z", 0, 0, 0, NULL);
            break;
        case 2: {
            store_arith_req r = {.key = key,
                                 .nkey = strlen(key),
                                 .incr = true,
                                 .delta = 1,
                                 .vivify = true};
            store_arith(w->s, &r, NULL, NULL);
            break;
        }
        case 3: {
            store_mutation m;
            memset(&m, 0, sizeof(m));
            m.id.lo = lcg(&x) | 1;
            m.id.hi = lcg(&x);
            m.version = store_clock_now(w->s);
            m.version.ticks += lcg(&x) % 1000;
            m.version.node = 99;
            m.kind = STORE_KIND_VALUE;
            m.cas = m.id.lo;
            m.key = key;
            m.nkey = strlen(key);
            m.value = val;
            m.nvalue = nv;
            apply(w->s, &m);
            break;
        }
        case 4:
            store_touch(w->s, key, strlen(key), 0);
            break;
        case 5:
            store_sweep(w->s, 16);
            break;
        default:
            if (lcg(&x) % 2)
                set(w->s, key, val);
            else
                store_item_release(store_get(w->s, key, strlen(key)));
        }
    }
    return NULL;
}

static void count_id(void *arg, const riblt_id *id)
{
    (void)id;
    (*(size_t *)arg)++;
}

/*
 * Four threads of mixed writes on a store small enough to evict: the set
 * (journal walk, sketch count, counters) stays one set. With rec_bytes,
 * evictions leave records and the small record table overflows into drops
 * while the threads run.
 */
static void threads_run(size_t rec_bytes)
{
    store_options o;
    int err;
    pthread_t th[4];
    worker w[4];

    store_options_default(&o);
    o.hash_power = 4;
    o.sketch_symbols = 512;
    o.memory_limit = 12 * 1024 + rec_bytes; /* small: evictions happen */
    o.evict_record_bytes = rec_bytes;
    store *s = store_create(&o, &err);
    ck_assert_ptr_nonnull(s);
    for (int i = 0; i < 4; i++) {
        w[i].s = s;
        w[i].seed = 1000 + (uint64_t)i;
        w[i].ops = 20000;
        ck_assert_int_eq(pthread_create(&th[i], NULL, smoke, &w[i]), 0);
    }
    for (int i = 0; i < 4; i++)
        pthread_join(th[i], NULL);
    store_stats st = stats(s);
    size_t n = 0;
    ck_assert_uint_eq(store_journal_ids(s, count_id, &n), st.mutations);
    ck_assert_uint_eq(n, st.mutations);
    ck_assert_int_eq(set_size(s), (int64_t)st.mutations);
    ck_assert_uint_eq(st.curr_items + st.tombstones + st.evicted_records +
                          st.drops,
                      st.mutations);
    /* Evictions happened: with rec_bytes, each one left a record (most
     * superseded since by the next write of their key). */
    ck_assert_uint_gt(st.evictions, 0);
    ck_assert_uint_le(st.mutations, 200 + st.drops);
    /* Every key's current mutation is in the set. */
    for (int i = 0; i < 200; i++) {
        char key[16];
        snprintf(key, sizeof(key), "k%d", i);
        store_item *it = store_get(s, key, strlen(key));
        if (it != NULL) {
            riblt_id id;
            store_mutation m;
            store_item_mutation(it, &m);
            id = m.id;
            ck_assert(store_has(s, &id));
            store_item_release(it);
        }
    }
    store_destroy(s);
}

START_TEST(test_threads)
{
    threads_run(0);
}
END_TEST

START_TEST(test_threads_records)
{
    threads_run(32 * 36);
}
END_TEST

static Suite *store_suite(void)
{
    Suite *s = suite_create("store");
    TCase *tc = tcase_create("core");

    tcase_add_test(tc, test_version_cmp);
    tcase_add_test(tc, test_create_invalid);
    tcase_add_test(tc, test_hybrid_clock);
    tcase_add_test(tc, test_exptime_abs);
    tcase_add_test(tc, test_set_get);
    tcase_add_test(tc, test_add_replace);
    tcase_add_test(tc, test_append_prepend);
    tcase_add_test(tc, test_cas);
    tcase_add_test(tc, test_incr_decr);
    tcase_add_test(tc, test_arith_cas_vivify);
    tcase_add_test(tc, test_touch_gat);
    tcase_add_test(tc, test_fetched_last_access);
    tcase_add_test(tc, test_delete_tombstone);
    tcase_add_test(tc, test_psums_follow_the_set);
    tcase_add_test(tc, test_lww_apply);
    tcase_add_test(tc, test_apply_invalid);
    tcase_add_test(tc, test_no_resurrection);
    tcase_add_test(tc, test_expiry);
    tcase_add_test(tc, test_flush_immediate);
    tcase_add_test(tc, test_flush_delayed);
    tcase_add_test(tc, test_flush_from_peer);
    tcase_add_test(tc, test_cas_same_on_peers);
    tcase_add_test(tc, test_cas_below_1e19);
    tcase_add_test(tc, test_touch_keeps_cas);
    tcase_add_test(tc, test_apply_keeps_cas);
    tcase_add_test(tc, test_item_layout);
    tcase_add_test(tc, test_arith_touch);
    tcase_add_test(tc, test_get_ex_why);
    tcase_add_test(tc, test_overwrite_sketch);
    tcase_add_test(tc, test_no_sketch);
    tcase_add_test(tc, test_set_invariant);
    tcase_add_test(tc, test_listener);
    tcase_add_test(tc, test_eviction_clock);
    tcase_add_test(tc, test_eviction_local);
    tcase_add_test(tc, test_eviction_mixed_sizes);
    tcase_add_test(tc, test_eviction_record_overflow);
    tcase_add_test(tc, test_drop_keeps_value);
    tcase_add_test(tc, test_drops_bounded);
    tcase_add_test(tc, test_drops_converge);
    tcase_add_test(tc, test_eviction_churn);
    tcase_add_test(tc, test_nomem);
    tcase_add_test(tc, test_too_large);
    tcase_add_test(tc, test_sweep_budget);
    tcase_add_test(tc, test_table_growth);
    tcase_add_test(tc, test_threads);
    tcase_add_test(tc, test_threads_records);
    tcase_add_test(tc, test_far_expiry_not_swept);
    tcase_add_test(tc, test_sweep_walks_only_what_can_die);
    tcase_add_test(tc, test_stale_marks);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(store_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
