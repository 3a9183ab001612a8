/*
 * check_store_parts.c -- unit tests of the store's partitioned mode: every
 * item lands in its key's partition (flushes in the global one), each
 * partition's sketch is the sketch of its journal ids, sums of partitions
 * equal an encoder over exactly those partitions' ids (and decode the
 * difference of two stores sharing only some partitions), journal tails by
 * partition continue the stream beyond the sketch, dropping partitions
 * forgets exactly their items without tombstones or listener calls, and
 * the unpartitioned store answers the same functions with partition 0.
 */
#include <check.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

/* What the partition function was asked, and what it adds to its answer. */
typedef struct pfn_state {
    uint64_t calls;
    uint32_t bias; /* added to the answer (tests the reduction modulo P) */
    uint32_t np;
} pfn_state;

static uint32_t fnv(const char *key, size_t nkey)
{
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < nkey; i++) {
        h ^= (unsigned char)key[i];
        h *= 16777619u;
    }
    return h;
}

static uint32_t pfn(void *arg, const char *key, size_t nkey)
{
    pfn_state *st = arg;
    ck_assert_uint_ge(nkey, 1);
    __atomic_fetch_add(&st->calls, 1, __ATOMIC_RELAXED);
    return fnv(key, nkey) % st->np + st->bias;
}

/* With a record table of rec_bytes (0: none). */
static store *mkp_rec(fake_clock *c, pfn_state *ps, uint32_t np,
                      size_t symbols, size_t limit, size_t rec_bytes)
{
    store_options o;
    int err = 99;
    store *s;

    store_options_default(&o);
    o.node_id = 7;
    o.memory_limit = limit;
    o.hash_power = 8;
    o.tombstone_grace = 100;
    o.clock = fake_now;
    o.clock_arg = c;
    o.partitions = np;
    o.partition_fn = np ? pfn : NULL;
    o.partition_arg = ps;
    o.partition_sketch_symbols = symbols;
    if (np == 0)
        o.sketch_symbols = symbols;
    o.evict_record_bytes = rec_bytes;
    if (ps != NULL)
        ps->np = np;
    s = store_create(&o, &err);
    ck_assert_ptr_nonnull(s);
    ck_assert_int_eq(err, STORE_OK);
    return s;
}

static store *mkp(fake_clock *c, pfn_state *ps, uint32_t np, size_t symbols,
                  size_t limit)
{
    return mkp_rec(c, ps, np, symbols, limit, 0);
}

/* The partition a key must land in. */
static uint32_t part_of(const pfn_state *ps, const char *key)
{
    return (fnv(key, strlen(key)) % ps->np + ps->bias) % ps->np;
}

static int set(store *s, const char *k, const char *v)
{
    store_write w;

    memset(&w, 0, sizeof(w));
    w.mode = STORE_SET;
    w.key = k;
    w.nkey = strlen(k);
    w.value = v;
    w.nvalue = strlen(v);
    return store_write_item(s, &w, NULL);
}

/* The id of the mutation of key k at version (ticks, node). */
static riblt_id idof(const char *k, uint64_t ticks, uint32_t node)
{
    store_mutation m;

    memset(&m, 0, sizeof(m));
    m.key = k;
    m.nkey = strlen(k);
    m.version.ticks = ticks;
    m.version.node = node;
    return store_mutation_id(&m);
}

/*
 * Applies a value (or, v NULL, a tombstone) at version (ticks, node) with
 * cas `cas` (its id follows from key and version: idof).
 */
static int apply(store *s, uint64_t cas, uint32_t node, uint64_t ticks,
                 const char *k, const char *v)
{
    store_mutation m;

    memset(&m, 0, sizeof(m));
    m.version.ticks = ticks;
    m.version.node = node;
    m.kind = v ? STORE_KIND_VALUE : STORE_KIND_TOMBSTONE;
    m.cas = cas;
    m.key = k;
    m.nkey = strlen(k);
    m.value = v;
    m.nvalue = v ? strlen(v) : 0;
    if (!v)
        m.exptime = (int64_t)(ticks / NS);
    m.id = store_mutation_id(&m);
    return store_apply(s, &m);
}

/* Applies a flush at version (ticks, 3), in effect at once. */
static int apply_flush(store *s, uint64_t ticks)
{
    store_mutation m;

    memset(&m, 0, sizeof(m));
    m.version.ticks = ticks;
    m.version.node = 3;
    m.kind = STORE_KIND_FLUSH;
    m.flush_at = ticks;
    m.id = store_mutation_id(&m);
    return store_apply(s, &m);
}

static store_stats stats(store *s)
{
    store_stats st;
    store_get_stats(s, &st);
    return st;
}

typedef struct idvec {
    riblt_id *v;
    size_t n, cap;
} idvec;

static void idvec_push(idvec *iv, const riblt_id *id)
{
    if (iv->n == iv->cap) {
        iv->cap = iv->cap ? iv->cap * 2 : 64;
        iv->v = realloc(iv->v, iv->cap * sizeof(*iv->v));
        ck_assert_ptr_nonnull(iv->v);
    }
    iv->v[iv->n++] = *id;
}

static void collect(void *arg, const riblt_id *id)
{
    idvec_push(arg, id);
}

static int id_cmp(const void *a, const void *b)
{
    const riblt_id *x = a, *y = b;
    if (x->hi != y->hi)
        return x->hi < y->hi ? -1 : 1;
    if (x->lo != y->lo)
        return x->lo < y->lo ? -1 : 1;
    return 0;
}

/* Asserts that two id lists hold the same ids (sorts both). */
static void same_ids(riblt_id *a, size_t na, riblt_id *b, size_t nb)
{
    ck_assert_uint_eq(na, nb);
    qsort(a, na, sizeof(*a), id_cmp);
    qsort(b, nb, sizeof(*b), id_cmp);
    for (size_t i = 0; i < na; i++)
        ck_assert_msg(a[i].lo == b[i].lo && a[i].hi == b[i].hi,
                      "id %zu differs", i);
}

/* Symbols [offset, offset + n) of a fresh encoder over ids. */
static void enc_stream(const riblt_id *ids, size_t nids, uint64_t offset,
                       riblt_symbol *out, size_t n)
{
    riblt_encoder *e = riblt_encoder_create(nids + 1);
    ck_assert_ptr_nonnull(e);
    for (size_t i = 0; i < nids; i++)
        ck_assert_int_eq(riblt_encoder_add(e, &ids[i]), RIBLT_OK);
    ck_assert_int_eq(riblt_encoder_seek(e, offset), RIBLT_OK);
    ck_assert_int_eq(riblt_encoder_produce(e, out, n), RIBLT_OK);
    riblt_encoder_destroy(e);
}

static void same_symbols(const riblt_symbol *a, const riblt_symbol *b,
                         size_t n)
{
    for (size_t i = 0; i < n; i++)
        ck_assert_msg(a[i].sum.lo == b[i].sum.lo &&
                          a[i].sum.hi == b[i].sum.hi &&
                          a[i].hash == b[i].hash && a[i].count == b[i].count,
                      "symbol %zu differs", i);
}

/* The ids of the listed partitions, through store_journal_ids_parts. */
static idvec ids_of(store *s, const uint32_t *parts, size_t nparts)
{
    idvec iv = {NULL, 0, 0};
    size_t n = store_journal_ids_parts(s, parts, nparts, collect, &iv);
    ck_assert_uint_eq(n, iv.n);
    return iv;
}

/* Asserts that the listed partitions' summed sketch is the sketch of their
 * journal ids. */
static void parts_match_ids(store *s, const uint32_t *parts, size_t nparts)
{
    size_t S = store_sketch_symbols(s);
    riblt_symbol *got = calloc(S, sizeof(*got)),
                 *want = calloc(S, sizeof(*want));
    int64_t size = -1;
    idvec iv = ids_of(s, parts, nparts);

    ck_assert_int_eq(
        store_sketch_read_parts(s, parts, nparts, 0, got, S, &size), STORE_OK);
    ck_assert_int_eq(size, (int64_t)iv.n);
    enc_stream(iv.v, iv.n, 0, want, S);
    same_symbols(got, want, S);
    free(iv.v);
    free(got);
    free(want);
}

/* Listener that counts its calls. */
static uint64_t heard;

static void listen_count(void *arg, store_item *it, bool local)
{
    (void)arg;
    (void)local;
    __atomic_fetch_add(&heard, 1, __ATOMIC_RELAXED);
    store_item_release(it);
}

/* The tail callback the replication uses: tails when recorded. */
typedef struct tail_enc {
    riblt_encoder *enc;
    uint64_t base;
    size_t with_tail;
} tail_enc;

static void add_tail(void *arg, const riblt_id *id, const riblt_tail *tail)
{
    tail_enc *te = arg;
    uint64_t h = riblt_hash(id);

    if (tail->steps && tail->index >= te->base) {
        ck_assert_int_eq(
            riblt_encoder_add_tail(te->enc, id, h, tail, te->base), RIBLT_OK);
        te->with_tail++;
    } else {
        ck_assert_int_eq(riblt_encoder_add(te->enc, id), RIBLT_OK);
    }
}

/* An encoder over the listed partitions built from their tails, at S. */
static riblt_encoder *tail_encoder(store *s, const uint32_t *parts,
                                   size_t nparts, size_t *with_tail)
{
    tail_enc te = {riblt_encoder_create(64), store_sketch_symbols(s), 0};
    ck_assert_ptr_nonnull(te.enc);
    store_journal_tails_parts(s, parts, nparts, add_tail, &te);
    ck_assert_int_eq(riblt_encoder_seek(te.enc, te.base), RIBLT_OK);
    if (with_tail)
        *with_tail = te.with_tail;
    return te.enc;
}

/* -------------------------------------------------------------- tests */

START_TEST(test_parts_options)
{
    fake_clock c = {T0};
    pfn_state ps = {0, 0, 0};
    store_options o;
    int err = 0;

    store_options_default(&o);
    ck_assert_uint_eq(o.partitions, 0);
    ck_assert_ptr_null(o.partition_fn);
    ck_assert_uint_eq(o.partition_sketch_symbols, 256);
    o.partitions = 4; /* no partition_fn */
    ck_assert_ptr_null(store_create(&o, &err));
    ck_assert_int_eq(err, STORE_ERR_INVAL);
    o.partition_fn = pfn;
    o.partition_arg = &ps;
    o.partition_sketch_symbols = 0;
    ck_assert_ptr_null(store_create(&o, &err));
    ck_assert_int_eq(err, STORE_ERR_INVAL);
    o.partition_sketch_symbols = 16;
    o.partitions = STORE_PARTITIONS_MAX + 1;
    ck_assert_ptr_null(store_create(&o, &err));
    ck_assert_int_eq(err, STORE_ERR_INVAL);
    /* Partitioned mode does not need the unpartitioned sketch length. */
    o.partitions = 4;
    o.sketch_symbols = 0;
    store *s = store_create(&o, &err);
    ck_assert_ptr_nonnull(s);
    ck_assert_int_eq(err, STORE_OK);
    store_destroy(s);

    s = mkp(&c, &ps, 16, 48, 0);
    ck_assert_uint_eq(store_partitions(s), 16);
    ck_assert_uint_eq(store_sketch_symbols(s), 48);
    ck_assert_uint_eq(stats(s).sketch_symbols, 48);
    ck_assert_uint_eq(store_key_partition(s, "", 0), 16);
    ck_assert_uint_eq(store_key_partition(s, "alpha", 5),
                      part_of(&ps, "alpha"));
    /* Every partition has its counters; P + 1 is out of range. */
    uint64_t m = 9, i = 9, b = 9;
    ck_assert_int_eq(store_partition_stats(s, 16, &m, &i, &b), STORE_OK);
    ck_assert_uint_eq(m + i + b, 0);
    ck_assert_int_eq(store_partition_stats(s, 17, &m, &i, &b),
                     STORE_ERR_INVAL);
    store_destroy(s);
}
END_TEST

/* Items are in their key's partition whatever wrote them; the partition
 * function runs once per write (an item's partition is computed as it
 * enters the set, not stored; the key it replaces shares it). */
START_TEST(test_parts_item_partition)
{
    fake_clock c = {T0};
    pfn_state ps = {0, 1000, 0}; /* answers >= P: reduced modulo P */
    store *s = mkp(&c, &ps, 8, 32, 0);
    char key[16];

    for (int i = 0; i < 40; i++) {
        snprintf(key, sizeof(key), "key%d", i);
        ck_assert_int_eq(set(s, key, "v"), STORE_STORED);
    }
    ck_assert_uint_eq(ps.calls, 40);
    for (int i = 0; i < 10; i++) {
        snprintf(key, sizeof(key), "peer%d", i);
        ck_assert_int_eq(apply(s, 100 + i, 1, T0 + 5 * NS, key, "x"),
                         STORE_OK);
    }
    ck_assert_uint_eq(ps.calls, 50);
    ck_assert_int_eq(store_delete(s, "key3", 4, 0), STORE_DELETED);
    ck_assert_int_eq(store_touch(s, "key4", 4, 0), STORE_OK);
    store_item *g = store_gat(s, "key5", 4, 0);
    ck_assert_ptr_nonnull(g);
    store_item_release(g);
    ck_assert_uint_eq(ps.calls, 53);

    for (int i = 0; i < 40; i++) {
        snprintf(key, sizeof(key), "key%d", i);
        uint32_t want = part_of(&ps, key);
        ck_assert_uint_lt(want, 8);
        ck_assert_uint_eq(store_key_partition(s, key, strlen(key)), want);
        store_item *it = store_get(s, key, strlen(key));
        if (i == 3) {
            ck_assert_ptr_null(it);
            continue;
        }
        ck_assert_ptr_nonnull(it);
        ck_assert_uint_eq(store_item_partition(s, it), want);
        store_item_release(it);
    }
    /* The tombstone of key3 sits in key3's partition. */
    uint32_t p3 = part_of(&ps, "key3");
    idvec iv = ids_of(s, &p3, 1);
    size_t tombs = 0;
    for (size_t i = 0; i < iv.n; i++) {
        store_item *it = store_fetch(s, &iv.v[i]);
        ck_assert_ptr_nonnull(it);
        ck_assert_uint_eq(store_item_partition(s, it), p3);
        if (store_item_kind(it) == STORE_KIND_TOMBSTONE)
            tombs++;
        store_item_release(it);
    }
    ck_assert_uint_eq(tombs, 1);
    free(iv.v);
    store_destroy(s);
}
END_TEST

/* Writes a mix of values, overwrites, tombstones and peer mutations. */
static void fill(store *s, int nkeys)
{
    char key[16], val[32];

    for (int i = 0; i < nkeys; i++) {
        snprintf(key, sizeof(key), "k%d", i);
        snprintf(val, sizeof(val), "value-%d", i);
        ck_assert_int_eq(set(s, key, val), STORE_STORED);
    }
    for (int i = 0; i < nkeys; i += 3) {
        snprintf(key, sizeof(key), "k%d", i);
        ck_assert_int_eq(set(s, key, "again"), STORE_STORED);
    }
    for (int i = 1; i < nkeys; i += 7) {
        snprintf(key, sizeof(key), "k%d", i);
        ck_assert_int_eq(store_delete(s, key, strlen(key), 0), STORE_DELETED);
    }
    for (int i = 0; i < nkeys / 4; i++) {
        snprintf(key, sizeof(key), "p%d", i);
        ck_assert_int_eq(apply(s, 5000 + (uint64_t)i, 77, T0 + NS, key, "pv"),
                         STORE_OK);
    }
}

START_TEST(test_parts_sum_is_sketch)
{
    fake_clock c = {T0};
    pfn_state ps = {0, 0, 0};
    const uint32_t np = 16;
    store *s = mkp(&c, &ps, np, 64, 0);
    uint32_t all[17];
    uint64_t msum = 0, isum = 0, bsum = 0;

    fill(s, 600);
    ck_assert_int_eq(store_flush_all(s, 1000), STORE_OK);
    for (uint32_t p = 0; p <= np; p++) {
        all[p] = p;
        parts_match_ids(s, &p, 1); /* invariant 1, partition by partition */
        uint64_t m, i, b;
        ck_assert_int_eq(store_partition_stats(s, p, &m, &i, &b), STORE_OK);
        idvec iv = ids_of(s, &p, 1);
        ck_assert_uint_eq(m, iv.n);
        free(iv.v);
        msum += m;
        isum += i;
        bsum += b;
    }
    store_stats st = stats(s);
    ck_assert_uint_eq(msum, st.mutations);
    ck_assert_uint_eq(isum, st.curr_items);
    ck_assert_uint_eq(bsum, st.bytes);
    ck_assert_uint_eq(st.mutations, 600 + 150 + 1);

    /* All partitions: the sketch of an encoder over every id. */
    parts_match_ids(s, all, np + 1);
    riblt_symbol a[64], b[64];
    int64_t na = -1, nb = -2;
    idvec every = {NULL, 0, 0};
    ck_assert_uint_eq(store_journal_ids(s, collect, &every), st.mutations);
    enc_stream(every.v, every.n, 0, b, 64);
    ck_assert_int_eq(store_sketch_read(s, 0, a, 64, &na), STORE_OK);
    ck_assert_int_eq(na, (int64_t)st.mutations);
    same_symbols(a, b, 64);
    /* A slice from an offset, and the same slice through read_parts. */
    ck_assert_int_eq(store_sketch_read(s, 40, a, 24, &na), STORE_OK);
    same_symbols(a, b + 40, 24);
    ck_assert_int_eq(store_sketch_read_parts(s, all, np + 1, 40, a, 24, &nb),
                     STORE_OK);
    ck_assert_int_eq(nb, na);
    same_symbols(a, b + 40, 24);
    free(every.v);

    /* A subset, listed out of order and with a repeat, counts once. */
    uint32_t sub[] = {9, 2, 16, 2, 11};
    uint32_t uniq[] = {2, 9, 11, 16};
    ck_assert_int_eq(store_sketch_read_parts(s, sub, 5, 0, a, 64, &na),
                     STORE_OK);
    ck_assert_int_eq(store_sketch_read_parts(s, uniq, 4, 0, b, 64, &nb),
                     STORE_OK);
    ck_assert_int_eq(na, nb);
    same_symbols(a, b, 64);
    parts_match_ids(s, sub, 5);
    idvec iv = ids_of(s, sub, 5);
    ck_assert_int_eq(nb, (int64_t)iv.n);
    free(iv.v);
    store_destroy(s);
}
END_TEST

START_TEST(test_parts_invalid_args)
{
    fake_clock c = {T0};
    pfn_state ps = {0, 0, 0};
    store *s = mkp(&c, &ps, 4, 32, 0);
    riblt_symbol out[33];
    int64_t n = -1;
    idvec iv = {NULL, 0, 0};
    uint32_t bad[] = {1, 5};
    uint32_t ok[] = {4};

    fill(s, 50);
    ck_assert_int_eq(store_sketch_read_parts(s, bad, 2, 0, out, 1, &n),
                     STORE_ERR_INVAL);
    ck_assert_int_eq(store_sketch_read_parts(s, NULL, 1, 0, out, 1, &n),
                     STORE_ERR_INVAL);
    ck_assert_int_eq(store_sketch_read_parts(s, ok, 1, 0, out, 33, &n),
                     STORE_ERR_INVAL);
    ck_assert_int_eq(store_sketch_read_parts(s, ok, 1, 30, out, 3, &n),
                     STORE_ERR_INVAL);
    ck_assert_int_eq(store_sketch_read_parts(s, ok, 1, 0, NULL, 1, &n),
                     STORE_ERR_INVAL);
    ck_assert_int_eq(store_sketch_read(s, 30, out, 3, &n), STORE_ERR_INVAL);
    /* The last symbol is in range; an empty list sums to nothing. */
    ck_assert_int_eq(store_sketch_read_parts(s, ok, 1, 31, out, 1, &n),
                     STORE_OK);
    out[0].count = 5;
    ck_assert_int_eq(store_sketch_read_parts(s, ok, 0, 0, out, 1, &n),
                     STORE_OK);
    ck_assert_int_eq(n, 0);
    ck_assert(riblt_symbol_is_zero(&out[0]));
    ck_assert_uint_eq(store_journal_ids_parts(s, bad, 2, collect, &iv), 0);
    ck_assert_uint_eq(iv.n, 0);
    ck_assert_uint_eq(store_drop_partitions(s, bad, 2, 100), 0);
    ck_assert_uint_eq(store_drop_partitions(s, ok, 1, 0), 0);
    ck_assert_uint_eq(stats(s).dropped, 0);
    ck_assert_uint_eq(stats(s).mutations, 50 + 12);
    store_destroy(s);
}
END_TEST

/*
 * Two stores share partitions SH (with a few differences inside them) and
 * hold unrelated data everywhere else. The difference of their summed
 * sketches over SH decodes to exactly the differences inside SH.
 */
static const uint32_t SH[] = {0, 3, 5, 9, 16};
#define NSH (sizeof(SH) / sizeof(SH[0]))

static bool shared(uint32_t p)
{
    for (size_t i = 0; i < NSH; i++)
        if (SH[i] == p)
            return true;
    return false;
}

/*
 * Builds A and B as above. Inside SH: `over` keys that B overwrote, `aonly`
 * keys only A has, `bonly` keys only B has, and a newer flush on A. The ids
 * only B (remote) and only A (local) hold in SH go to rem and loc.
 */
static void two_stores(fake_clock *c, pfn_state *ps, size_t symbols, int over,
                       int aonly, int bonly, store **pa, store **pb,
                       idvec *rem, idvec *loc)
{
    store *a = mkp(c, ps, 16, symbols, 0);
    store *b = mkp(c, ps, 16, symbols, 0);
    char key[24];
    uint64_t next = 1;
    int o = 0, ao = 0, bo = 0;

    /* The same old flush on both; A also has a newer one. Both are older
     * than every value below, so they cover nothing. */
    ck_assert_int_eq(apply_flush(a, T0 - 2000 * NS), STORE_OK);
    ck_assert_int_eq(apply_flush(b, T0 - 2000 * NS), STORE_OK);
    riblt_id fo = idof("", T0 - 2000 * NS, 3),
             fn = idof("", T0 - 1000 * NS, 3);
    ck_assert_int_eq(apply_flush(a, T0 - 1000 * NS), STORE_OK);
    idvec_push(loc, &fn);
    idvec_push(rem, &fo);

    for (int i = 0; i < 2000 && (o < over || ao < aonly || bo < bonly); i++) {
        snprintf(key, sizeof(key), "key-%d", i);
        uint32_t p = part_of(ps, key);
        uint64_t id = next++;
        uint64_t t = T0 + (uint64_t)i * 1000;
        if (!shared(p)) {
            /* Unrelated data on each side. */
            ck_assert_int_eq(apply(a, id, 0xa, t, key, "a"), STORE_OK);
            ck_assert_int_eq(apply(b, id, 0xb, t, key, "b"), STORE_OK);
            continue;
        }
        riblt_id rid = idof(key, t, 0x5);
        if (o < over) {
            ck_assert_int_eq(apply(a, id, 0x5, t, key, "old"), STORE_OK);
            ck_assert_int_eq(apply(b, id, 0x5, t, key, "old"), STORE_OK);
            riblt_id nid = idof(key, t + 1, 0x6);
            ck_assert_int_eq(apply(b, id, 0x6, t + 1, key, "new"), STORE_OK);
            idvec_push(rem, &nid);
            idvec_push(loc, &rid);
            o++;
        } else if (ao < aonly) {
            ck_assert_int_eq(apply(a, id, 0x5, t, key, "a"), STORE_OK);
            idvec_push(loc, &rid);
            ao++;
        } else if (bo < bonly) {
            ck_assert_int_eq(apply(b, id, 0x5, t, key, NULL), STORE_OK);
            idvec_push(rem, &rid);
            bo++;
        }
        /* And data both hold the same. */
        snprintf(key, sizeof(key), "same-%d", i);
        ck_assert_int_eq(apply(a, id, 0x7, t, key, "s"), STORE_OK);
        ck_assert_int_eq(apply(b, id, 0x7, t, key, "s"), STORE_OK);
    }
    ck_assert_int_eq(o + ao + bo, over + aonly + bonly);
    /* Unrelated data outside the shared partitions, far more than the
     * shared difference, on each side. */
    for (int i = 0, n = 0; n < 100 && i < 10000; i++) {
        snprintf(key, sizeof(key), "other-%d", i);
        if (shared(part_of(ps, key)))
            continue;
        uint64_t t = T0 + 5000000 + (uint64_t)i;
        ck_assert_int_eq(apply(a, next, 0xa, t, key, "a"), STORE_OK);
        ck_assert_int_eq(apply(b, next++, 0xb, t, key, "b"), STORE_OK);
        n++;
    }
    *pa = a;
    *pb = b;
}

START_TEST(test_parts_decode_shared)
{
    fake_clock c = {T0};
    pfn_state ps = {0, 0, 0};
    store *a, *b;
    idvec rem = {NULL, 0, 0}, loc = {NULL, 0, 0};
    riblt_symbol sa[64], sb[64], d;
    int64_t na, nb;

    two_stores(&c, &ps, 64, 4, 3, 3, &a, &b, &rem, &loc);
    ck_assert_uint_eq(rem.n, 8);
    ck_assert_uint_eq(loc.n, 8);
    ck_assert_int_eq(store_sketch_read_parts(a, SH, NSH, 0, sa, 64, &na),
                     STORE_OK);
    ck_assert_int_eq(store_sketch_read_parts(b, SH, NSH, 0, sb, 64, &nb),
                     STORE_OK);
    ck_assert_int_eq(nb - na, (int64_t)rem.n - (int64_t)loc.n);
    riblt_decoder *dec = riblt_decoder_create(64);
    ck_assert_ptr_nonnull(dec);
    for (int i = 0; i < 64; i++) {
        riblt_symbol_subtract(&d, &sb[i], &sa[i]);
        ck_assert_int_eq(riblt_decoder_add_diff(dec, &d), RIBLT_OK);
    }
    ck_assert_int_eq(riblt_decoder_decode(dec), RIBLT_OK);
    size_t nr, nl;
    const riblt_id *r = riblt_decoder_remote(dec, &nr);
    const riblt_id *l = riblt_decoder_local(dec, &nl);
    riblt_id *rr = malloc((nr + 1) * sizeof(*rr)),
             *ll = malloc((nl + 1) * sizeof(*ll));
    memcpy(rr, r, nr * sizeof(*rr));
    memcpy(ll, l, nl * sizeof(*ll));
    same_ids(rr, nr, rem.v, rem.n);
    same_ids(ll, nl, loc.v, loc.n);
    free(rr);
    free(ll);

    /* Over every partition the stores differ by far more than that. */
    uint32_t all[17];
    for (uint32_t p = 0; p <= 16; p++)
        all[p] = p;
    ck_assert_int_eq(store_sketch_read_parts(a, all, 17, 0, sa, 64, &na),
                     STORE_OK);
    ck_assert_int_eq(store_sketch_read_parts(b, all, 17, 0, sb, 64, &nb),
                     STORE_OK);
    riblt_decoder_reset(dec);
    for (int i = 0; i < 64; i++) {
        riblt_symbol_subtract(&d, &sb[i], &sa[i]);
        ck_assert_int_eq(riblt_decoder_add_diff(dec, &d), RIBLT_OK);
    }
    ck_assert_int_ne(riblt_decoder_decode(dec), RIBLT_OK);
    riblt_decoder_destroy(dec);
    free(rem.v);
    free(loc.v);
    store_destroy(a);
    store_destroy(b);
}
END_TEST

/* Tails by partition continue the summed stream beyond the sketch exactly
 * as a fresh encoder over the same ids does. */
START_TEST(test_parts_tails_continue)
{
    fake_clock c = {T0};
    pfn_state ps = {0, 0, 0};
    store *s = mkp(&c, &ps, 8, 32, 0);
    uint32_t sub[] = {1, 3, 8};
    riblt_symbol got[300], want[300];
    size_t with_tail = 0;

    fill(s, 400);
    ck_assert_int_eq(store_flush_all(s, 1000), STORE_OK);
    idvec iv = ids_of(s, sub, 3);
    riblt_encoder *e = tail_encoder(s, sub, 3, &with_tail);
    ck_assert_uint_eq(riblt_encoder_size(e), iv.n);
    /* Items keep no tails: every id is walked from its start. */
    ck_assert_uint_eq(with_tail, 0);
    ck_assert_int_eq(riblt_encoder_produce(e, got, 300), RIBLT_OK);
    enc_stream(iv.v, iv.n, 32, want, 300);
    same_symbols(got, want, 300);
    riblt_encoder_destroy(e);

    /* Below the sketch, the fresh encoder's stream is the summed sketch. */
    int64_t n;
    ck_assert_int_eq(store_sketch_read_parts(s, sub, 3, 0, got, 32, &n),
                     STORE_OK);
    enc_stream(iv.v, iv.n, 0, want, 32);
    same_symbols(got, want, 32);
    ck_assert_int_eq(n, (int64_t)iv.n);
    free(iv.v);

    /* Every partition through store_journal_tails. */
    idvec every = {NULL, 0, 0};
    store_journal_ids(s, collect, &every);
    tail_enc te = {riblt_encoder_create(64), 32, 0};
    ck_assert_uint_eq(store_journal_tails(s, add_tail, &te), every.n);
    ck_assert_int_eq(riblt_encoder_seek(te.enc, 32), RIBLT_OK);
    ck_assert_int_eq(riblt_encoder_produce(te.enc, got, 100), RIBLT_OK);
    enc_stream(every.v, every.n, 32, want, 100);
    same_symbols(got, want, 100);
    riblt_encoder_destroy(te.enc);
    free(every.v);
    store_destroy(s);
}
END_TEST

/* A difference far beyond the 16-symbol sketches decodes from the summed
 * sketches followed by the tails encoders' stream. */
START_TEST(test_parts_decode_beyond_sketch)
{
    fake_clock c = {T0};
    pfn_state ps = {0, 0, 0};
    store *a, *b;
    idvec rem = {NULL, 0, 0}, loc = {NULL, 0, 0};
    riblt_symbol sa[16], sb[16], d;
    int64_t na, nb;
    int rc = RIBLT_NEED_MORE;

    two_stores(&c, &ps, 16, 20, 15, 25, &a, &b, &rem, &loc);
    ck_assert_uint_eq(rem.n, 46);
    ck_assert_uint_eq(loc.n, 36);
    ck_assert_int_eq(store_sketch_read_parts(a, SH, NSH, 0, sa, 16, &na),
                     STORE_OK);
    ck_assert_int_eq(store_sketch_read_parts(b, SH, NSH, 0, sb, 16, &nb),
                     STORE_OK);
    riblt_decoder *dec = riblt_decoder_create(2000);
    ck_assert_ptr_nonnull(dec);
    for (int i = 0; i < 16; i++) {
        riblt_symbol_subtract(&d, &sb[i], &sa[i]);
        ck_assert_int_eq(riblt_decoder_add_diff(dec, &d), RIBLT_OK);
    }
    ck_assert_int_eq(riblt_decoder_decode(dec), RIBLT_NEED_MORE);
    riblt_encoder *ea = tail_encoder(a, SH, NSH, NULL);
    riblt_encoder *eb = tail_encoder(b, SH, NSH, NULL);
    for (int round = 0; round < 100 && rc == RIBLT_NEED_MORE; round++) {
        ck_assert_int_eq(riblt_encoder_produce(ea, sa, 16), RIBLT_OK);
        ck_assert_int_eq(riblt_encoder_produce(eb, sb, 16), RIBLT_OK);
        for (int i = 0; i < 16; i++) {
            riblt_symbol_subtract(&d, &sb[i], &sa[i]);
            ck_assert_int_eq(riblt_decoder_add_diff(dec, &d), RIBLT_OK);
        }
        rc = riblt_decoder_decode(dec);
    }
    ck_assert_int_eq(rc, RIBLT_OK);
    ck_assert_uint_gt(riblt_decoder_symbols(dec), 16);
    size_t nr, nl;
    const riblt_id *r = riblt_decoder_remote(dec, &nr);
    const riblt_id *l = riblt_decoder_local(dec, &nl);
    riblt_id *rr = malloc((nr + 1) * sizeof(*rr)),
             *ll = malloc((nl + 1) * sizeof(*ll));
    memcpy(rr, r, nr * sizeof(*rr));
    memcpy(ll, l, nl * sizeof(*ll));
    same_ids(rr, nr, rem.v, rem.n);
    same_ids(ll, nl, loc.v, loc.n);
    free(rr);
    free(ll);
    riblt_encoder_destroy(ea);
    riblt_encoder_destroy(eb);
    riblt_decoder_destroy(dec);
    free(rem.v);
    free(loc.v);
    store_destroy(a);
    store_destroy(b);
}
END_TEST

START_TEST(test_parts_drop)
{
    fake_clock c = {T0};
    pfn_state ps = {0, 0, 0};
    const uint32_t np = 8;
    store *s = mkp(&c, &ps, np, 32, 0);
    uint32_t drop[] = {2, 5, 8}; /* 8: the global partition, never dropped */
    uint32_t keep[] = {0, 1, 3, 4, 6, 7, 8};
    char key[16];
    uint64_t dm = 0, di = 0, db = 0, dt = 0;

    store_set_listener(s, listen_count, NULL);
    fill(s, 300);
    ck_assert_int_eq(store_flush_all(s, 1000), STORE_OK);
    for (int i = 1; i < 300; i += 7) {
        snprintf(key, sizeof(key), "k%d", i);
        if (part_of(&ps, key) == 2 || part_of(&ps, key) == 5)
            dt++; /* tombstones in the dropped partitions */
    }
    for (int k = 0; k < 2; k++) {
        uint64_t m, i, b;
        store_partition_stats(s, drop[k], &m, &i, &b);
        dm += m;
        di += i;
        db += b;
    }
    ck_assert_uint_gt(dm, 40);
    ck_assert_uint_gt(dt, 0);
    idvec kept_before = ids_of(s, keep, 7);
    store_stats before = stats(s);
    uint64_t heard_before = heard;

    /* Budget bounds each call; 0 once nothing is left. */
    size_t total = 0, n, calls = 0;
    ck_assert_uint_eq(store_drop_partitions(s, drop, 3, 7), 7);
    total = 7;
    while ((n = store_drop_partitions(s, drop, 3, 7)) > 0 && calls < 1000) {
        ck_assert_uint_le(n, 7);
        total += n;
        calls++;
    }
    ck_assert_uint_eq(n, 0);
    ck_assert_uint_eq(total, dm);
    ck_assert_uint_eq(store_drop_partitions(s, drop, 3, 100), 0);

    store_stats after = stats(s);
    ck_assert_uint_eq(after.dropped, dm);
    ck_assert_uint_eq(after.mutations, before.mutations - dm);
    ck_assert_uint_eq(after.curr_items, before.curr_items - di);
    ck_assert_uint_eq(after.bytes, before.bytes - db);
    ck_assert_uint_eq(after.tombstones, before.tombstones - dt);
    ck_assert_uint_eq(after.total_items, before.total_items);
    ck_assert_uint_eq(after.swept, before.swept);
    ck_assert_uint_eq(after.evictions, 0);
    ck_assert_uint_eq(heard, heard_before); /* no listener call */

    /* Nothing left of them: no ids (no tombstones), an empty sketch. */
    for (int k = 0; k < 2; k++) {
        uint64_t m = 1, i = 1, b = 1;
        store_partition_stats(s, drop[k], &m, &i, &b);
        ck_assert_uint_eq(m + i + b, 0);
    }
    idvec gone = ids_of(s, drop, 2);
    ck_assert_uint_eq(gone.n, 0);
    free(gone.v);
    riblt_symbol sym[32];
    int64_t sz = -1;
    ck_assert_int_eq(store_sketch_read_parts(s, drop, 2, 0, sym, 32, &sz),
                     STORE_OK);
    ck_assert_int_eq(sz, 0);
    for (int i = 0; i < 32; i++)
        ck_assert(riblt_symbol_is_zero(&sym[i]));

    /* Everything else is untouched, and still its own sketch. */
    idvec kept_after = ids_of(s, keep, 7);
    same_ids(kept_before.v, kept_before.n, kept_after.v, kept_after.n);
    free(kept_before.v);
    free(kept_after.v);
    parts_match_ids(s, keep, 7);
    uint32_t g = np;
    uint64_t gm = 0;
    store_partition_stats(s, g, &gm, NULL, NULL);
    ck_assert_uint_eq(gm, 1); /* the flush stays */
    for (int i = 0; i < 300; i++) {
        snprintf(key, sizeof(key), "k%d", i);
        uint32_t p = part_of(&ps, key);
        store_item *it = store_get(s, key, strlen(key));
        if (p == 2 || p == 5 || i % 7 == 1)
            ck_assert_ptr_null(it);
        else
            ck_assert_ptr_nonnull(it);
        store_item_release(it);
    }
    /* A dropped key can be written again, and counts as usual. */
    for (int i = 0; i < 300; i++) {
        snprintf(key, sizeof(key), "k%d", i);
        if (part_of(&ps, key) != 2)
            continue;
        ck_assert_int_eq(set(s, key, "back"), STORE_STORED);
        store_item *it = store_get(s, key, strlen(key));
        ck_assert_ptr_nonnull(it);
        store_item_release(it);
        ck_assert_uint_eq(stats(s).curr_items, after.curr_items + 1);
        ck_assert_uint_eq(heard, heard_before + 1);
        break;
    }
    store_destroy(s);
}
END_TEST

/* Dropping gives memory back (no eviction needed to refill it) and leaves
 * the LRU sound for the evictions that follow. */
START_TEST(test_parts_drop_memory)
{
    fake_clock c = {T0};
    pfn_state ps = {0, 0, 0};
    char key[16], val[1001];
    uint32_t drop[] = {0, 1};

    memset(val, 'x', 1000);
    val[1000] = 0;
    /* Measure what 300 values take, then size the limit a little above. */
    store *probe = mkp(&c, &ps, 4, 32, 0);
    for (int i = 0; i < 300; i++) {
        snprintf(key, sizeof(key), "m%d", i);
        ck_assert_int_eq(set(probe, key, val), STORE_STORED);
    }
    uint64_t b300 = stats(probe).bytes;
    uint64_t d0, d1;
    store_partition_stats(probe, 0, NULL, NULL, &d0);
    store_partition_stats(probe, 1, NULL, NULL, &d1);
    store_destroy(probe);

    store *s = mkp(&c, &ps, 4, 32, b300 + b300 / 8);
    for (int i = 0; i < 300; i++) {
        snprintf(key, sizeof(key), "m%d", i);
        ck_assert_int_eq(set(s, key, val), STORE_STORED);
    }
    ck_assert_uint_eq(stats(s).evictions, 0);
    ck_assert_uint_eq(stats(s).bytes, b300);
    size_t total = 0, n;
    for (int i = 0; i < 100 && (n = store_drop_partitions(s, drop, 2, 50));
         i++)
        total += n;
    ck_assert_uint_eq(stats(s).bytes, b300 - d0 - d1);
    ck_assert_uint_eq(stats(s).dropped, total);
    /* Refill exactly what left: it fits without evicting. */
    int refilled = 0;
    for (int i = 0; i < 300; i++) {
        snprintf(key, sizeof(key), "m%d", i);
        uint32_t p = part_of(&ps, key);
        if (p != 0 && p != 1)
            continue;
        ck_assert_int_eq(set(s, key, val), STORE_STORED);
        refilled++;
    }
    ck_assert_uint_eq((size_t)refilled, total);
    ck_assert_uint_eq(stats(s).evictions, 0);
    ck_assert_uint_eq(stats(s).bytes, b300);
    /* Past the limit eviction works through an LRU without dropped items. */
    for (int i = 300; i < 600; i++) {
        snprintf(key, sizeof(key), "m%d", i);
        ck_assert_int_eq(set(s, key, val), STORE_STORED);
    }
    ck_assert_uint_gt(stats(s).evictions, 0);
    uint32_t all[] = {0, 1, 2, 3, 4};
    parts_match_ids(s, all, 5);
    store_destroy(s);
}
END_TEST

/*
 * Values a drop took out of the set (kept: readable, in no partition's
 * set) leave with their partition too, and the partitions' sets stay those
 * of their mutations.
 */
START_TEST(test_parts_drop_kept)
{
    fake_clock c = {T0};
    pfn_state ps = {0, 0, 0};
    store *s = mkp_rec(&c, &ps, 4, 32, 0, 4096 * 36);
    char key[16];
    uint32_t p = 1;
    uint64_t in_p = 0, kept_p = 0;

    for (int i = 0; i < 200; i++) {
        snprintf(key, sizeof(key), "d%d", i);
        uint64_t ticks = T0 - 1000 + (uint64_t)i * 2;
        ck_assert_int_eq(apply(s, 5, 3, ticks, key, "v"), STORE_OK);
        if (i % 2 != 0)
            continue;
        /* The drop of that value's record: one tick newer, keyless. */
        store_mutation d;
        memset(&d, 0, sizeof(d));
        d.kind = STORE_KIND_DROP;
        d.version.ticks = ticks + 1;
        d.version.node = 3;
        d.id = idof(key, ticks + 1, 3);
        d.flags = part_of(&ps, key);
        d.exptime = (int64_t)(T0 / NS);
        ck_assert_int_eq(store_apply(s, &d), STORE_OK);
        ck_assert_ptr_nonnull(store_get(s, key, strlen(key)));
        store_item_release(store_get(s, key, strlen(key)));
        if (part_of(&ps, key) == p)
            kept_p++;
    }
    for (int i = 0; i < 200; i++) {
        snprintf(key, sizeof(key), "d%d", i);
        if (part_of(&ps, key) == p)
            in_p++;
    }
    store_stats st;
    store_get_stats(s, &st);
    ck_assert_uint_eq(st.kept_items, 100);
    ck_assert_uint_eq(st.curr_items, 200);
    ck_assert_uint_gt(kept_p, 0);
    uint32_t all[] = {0, 1, 2, 3, 4};
    parts_match_ids(s, all, 5);
    size_t n, total = 0;
    for (int i = 0; i < 100 && (n = store_drop_partitions(s, &p, 1, 7)); i++)
        total += n;
    store_get_stats(s, &st);
    ck_assert_uint_eq(st.kept_items, 100 - kept_p);
    ck_assert_uint_eq(st.curr_items, 200 - in_p);
    /* The partition's values, its drops and its kept values. */
    ck_assert_uint_eq(total, in_p + kept_p);
    parts_match_ids(s, all, 5);
    store_destroy(s);
}
END_TEST

/* Calls stop after a bounded walk, yet return 0 only once nothing is left:
 * a small partition in a large table goes one item per call. */
START_TEST(test_parts_drop_bounded)
{
    fake_clock c = {T0};
    pfn_state ps = {0, 0, 0};
    store *s = mkp(&c, &ps, 64, 16, 0);
    char key[16];
    uint32_t p = 5;
    uint64_t m = 0;

    int lone = 0, written = 0;

    /* Partition 7 gets one item only, far from most of the table. */
    for (int i = 0; i < 60000; i++) {
        snprintf(key, sizeof(key), "b%d", i);
        if (part_of(&ps, key) == 7 && lone++ > 0)
            continue;
        ck_assert_int_eq(set(s, key, "v"), STORE_STORED);
        written++;
    }
    store_partition_stats(s, p, &m, NULL, NULL);
    ck_assert_uint_gt(m, 100);
    size_t calls = 0, n;
    while ((n = store_drop_partitions(s, &p, 1, 1)) > 0 && calls <= m) {
        ck_assert_uint_eq(n, 1);
        calls++;
    }
    ck_assert_uint_eq(calls, m);
    ck_assert_uint_eq(stats(s).dropped, m);
    ck_assert_uint_eq(stats(s).curr_items, (uint64_t)written - m);
    store_partition_stats(s, p, &m, NULL, NULL);
    ck_assert_uint_eq(m, 0);
    p = 7;
    ck_assert_uint_eq(store_drop_partitions(s, &p, 1, 1), 1);
    ck_assert_uint_eq(store_drop_partitions(s, &p, 1, 1), 0);
    ck_assert_uint_eq(stats(s).curr_items, (uint64_t)written - calls - 1);
    store_destroy(s);
}
END_TEST

START_TEST(test_parts_flush_global)
{
    fake_clock c = {T0};
    pfn_state ps = {0, 0, 0};
    store *s = mkp(&c, &ps, 8, 32, 0);
    uint32_t g = 8;
    uint64_t m, i, b;

    ck_assert_int_eq(set(s, "a", "1"), STORE_STORED);
    uint64_t calls = ps.calls;
    ck_assert_int_eq(store_flush_all(s, 0), STORE_OK);
    ck_assert_uint_eq(ps.calls, calls); /* no key to ask about */
    idvec iv = ids_of(s, &g, 1);
    ck_assert_uint_eq(iv.n, 1);
    store_item *it = store_fetch(s, &iv.v[0]);
    ck_assert_ptr_nonnull(it);
    ck_assert_uint_eq(store_item_kind(it), STORE_KIND_FLUSH);
    ck_assert_uint_eq(store_item_partition(s, it), g);
    store_item_release(it);
    free(iv.v);
    ck_assert_int_eq(store_partition_stats(s, g, &m, &i, &b), STORE_OK);
    ck_assert_uint_eq(m, 1);
    ck_assert_uint_eq(i, 0);
    ck_assert_uint_eq(b, 0);
    parts_match_ids(s, &g, 1);

    /* A newer flush from a peer replaces it, in the same partition. */
    uint64_t later = store_clock_now(s).ticks + NS;
    ck_assert_int_eq(apply_flush(s, later), STORE_OK);
    iv = ids_of(s, &g, 1);
    ck_assert_uint_eq(iv.n, 1);
    riblt_id fid = idof("", later, 3);
    ck_assert(riblt_id_equal(&iv.v[0], &fid));
    free(iv.v);
    parts_match_ids(s, &g, 1);
    /* Dropping the global partition keeps the flush. */
    ck_assert_uint_eq(store_drop_partitions(s, &g, 1, 10), 0);
    store_partition_stats(s, g, &m, NULL, NULL);
    ck_assert_uint_eq(m, 1);
    store_destroy(s);
}
END_TEST

START_TEST(test_parts_unpartitioned)
{
    fake_clock c = {T0};
    store *s = mkp(&c, NULL, 0, 128, 0);
    uint32_t zero[] = {0}, one[] = {1};
    riblt_symbol a[128], b[128];
    int64_t na, nb;
    uint64_t m, i, by;

    ck_assert_uint_eq(store_partitions(s), 0);
    ck_assert_uint_eq(store_sketch_symbols(s), 128);
    ck_assert_uint_eq(store_key_partition(s, "abc", 3), 0);
    ck_assert_uint_eq(store_key_partition(s, "", 0), 0);
    fill(s, 200);
    ck_assert_int_eq(store_flush_all(s, 1000), STORE_OK);
    store_item *it = store_get(s, "k2", 2);
    ck_assert_ptr_nonnull(it);
    ck_assert_uint_eq(store_item_partition(s, it), 0);
    store_item_release(it);

    ck_assert_int_eq(store_sketch_read(s, 0, a, 128, &na), STORE_OK);
    ck_assert_int_eq(store_sketch_read_parts(s, zero, 1, 0, b, 128, &nb),
                     STORE_OK);
    ck_assert_int_eq(na, nb);
    same_symbols(a, b, 128);
    ck_assert_int_eq(store_sketch_read_parts(s, one, 1, 0, b, 1, &nb),
                     STORE_ERR_INVAL);
    parts_match_ids(s, zero, 1);
    store_stats st = stats(s);
    ck_assert_int_eq(store_partition_stats(s, 0, &m, &i, &by), STORE_OK);
    ck_assert_uint_eq(m, st.mutations);
    ck_assert_uint_eq(i, st.curr_items);
    ck_assert_uint_eq(by, st.bytes);
    ck_assert_int_eq(store_partition_stats(s, 1, &m, &i, &by),
                     STORE_ERR_INVAL);
    idvec iv = {NULL, 0, 0};
    ck_assert_uint_eq(store_journal_ids_parts(s, zero, 1, collect, &iv),
                      st.mutations);
    free(iv.v);
    riblt_encoder *e = tail_encoder(s, zero, 1, NULL);
    ck_assert_uint_eq(riblt_encoder_size(e), st.mutations);
    riblt_encoder_destroy(e);

    /* Dropping partition 0 forgets everything but the flush. */
    size_t total = 0, n;
    for (int k = 0; k < 100 && (n = store_drop_partitions(s, zero, 1, 64));
         k++)
        total += n;
    ck_assert_uint_eq(total, st.mutations - 1);
    st = stats(s);
    ck_assert_uint_eq(st.mutations, 1);
    ck_assert_uint_eq(st.curr_items, 0);
    ck_assert_uint_eq(st.bytes, 0);
    ck_assert_uint_eq(st.tombstones, 0);
    parts_match_ids(s, zero, 1);
    store_destroy(s);
}
END_TEST

/* ------------------------------------------------------------ threads */

typedef struct tctx {
    store *s;
    int id;
    int done;    /* writers finished (atomic) */
    long reads;  /* summed reads made by the reader */
    long failed; /* reads whose symbol 0 disagreed with the count */
} tctx;

static void *writer(void *arg)
{
    tctx *t = arg;
    char key[24];
    uint64_t x = 0x9e3779b97f4a7c15ULL * (uint64_t)(t->id + 1);

    for (int i = 0; i < 3000; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        snprintf(key, sizeof(key), "t%llu", (unsigned long long)(x % 300));
        if (x % 5 == 0)
            store_delete(t->s, key, strlen(key), 0);
        else
            set(t->s, key, "threaded");
        if (i % 1000 == 999) {
            uint32_t p = (uint32_t)(x % 16);
            store_drop_partitions(t->s, &p, 1, 20);
        }
    }
    return NULL;
}

static void *reader(void *arg)
{
    tctx *t = arg;
    uint32_t all[17];
    riblt_symbol sym[32];

    for (uint32_t p = 0; p <= 16; p++)
        all[p] = p;
    for (long i = 0; i < 200000; i++) {
        int64_t n = -1;
        ck_assert_int_eq(
            store_sketch_read_parts(t->s, all, 17, 0, sym, 32, &n), STORE_OK);
        /* Symbol 0 counts every id: consistent slices agree with the
         * counters read with them. */
        if (sym[0].count != n)
            t->failed++;
        t->reads++;
        if (__atomic_load_n(&t->done, __ATOMIC_ACQUIRE))
            break;
    }
    return NULL;
}

START_TEST(test_parts_threads)
{
    fake_clock c = {T0};
    pfn_state ps = {0, 0, 0};
    store *s = mkp(&c, &ps, 16, 32, 0);
    pthread_t w[3], r;
    tctx tw[3], tr = {s, 9, 0, 0, 0};

    ck_assert_int_eq(pthread_create(&r, NULL, reader, &tr), 0);
    for (int i = 0; i < 3; i++) {
        tw[i] = (tctx){s, i, 0, 0, 0};
        ck_assert_int_eq(pthread_create(&w[i], NULL, writer, &tw[i]), 0);
    }
    for (int i = 0; i < 3; i++)
        pthread_join(w[i], NULL);
    __atomic_store_n(&tr.done, 1, __ATOMIC_RELEASE);
    pthread_join(r, NULL);
    ck_assert_int_gt(tr.reads, 0);
    ck_assert_int_eq(tr.failed, 0);
    uint32_t all[17];
    for (uint32_t p = 0; p <= 16; p++) {
        all[p] = p;
        parts_match_ids(s, &p, 1);
    }
    parts_match_ids(s, all, 17);
    store_destroy(s);
}
END_TEST

static Suite *parts_suite(void)
{
    Suite *s = suite_create("store_parts");
    TCase *tc = tcase_create("core");

    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_parts_options);
    tcase_add_test(tc, test_parts_item_partition);
    tcase_add_test(tc, test_parts_sum_is_sketch);
    tcase_add_test(tc, test_parts_invalid_args);
    tcase_add_test(tc, test_parts_decode_shared);
    tcase_add_test(tc, test_parts_tails_continue);
    tcase_add_test(tc, test_parts_decode_beyond_sketch);
    tcase_add_test(tc, test_parts_drop);
    tcase_add_test(tc, test_parts_drop_memory);
    tcase_add_test(tc, test_parts_drop_bounded);
    tcase_add_test(tc, test_parts_flush_global);
    tcase_add_test(tc, test_parts_unpartitioned);
    tcase_add_test(tc, test_parts_drop_kept);
    tcase_add_test(tc, test_parts_threads);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(parts_suite());
    int failed;

    srunner_run_all(sr, CK_NORMAL);
    failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
