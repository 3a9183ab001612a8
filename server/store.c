/*
 * store.c -- the versioned mutation store: key table, mutation journal,
 * R-IBLT sketch, LRU, memory limit, expiry and sweep.
 *
 * Contract of this implementation (store.h states the interface):
 *
 * Data structures.
 *   - An item is one allocation: header, key, value. Its key, value, id,
 *     version, kind, flags and expiry never change after it is published;
 *     only bookkeeping (links, access times) does, under the locks below or
 *     through atomics. It carries an atomic reference count; the key table
 *     owns one reference while the item is linked, and every store_item *
 *     handed out owns one more.
 *   - The key table is split into 2^min(hash_power, 12) stripes. A key's
 *     64-bit hash picks its stripe (low bits) and its bucket inside the
 *     stripe (high bits). Each stripe is its own chained hash table under
 *     its own mutex and grows on its own (doubling) when it holds more than
 *     1.5 entries per bucket: growth pauses that one stripe only, for a
 *     time proportional to its size (1/4096 of the table).
 *   - The journal (mutation id -> item) is a chained hash table; the sketch
 *     is an riblt_sketch. Both sit under one "set lock", so a set change is
 *     atomic for journal and sketch together, store_sketch_read copies a
 *     slice that matches some state of the journal, and store_journal_ids
 *     snapshots exactly that set. The journal doubles when it holds more
 *     than 1.5 ids per bucket, rehashing under the set lock: a brief pause
 *     of all writes, amortized O(1) per write.
 *   - Partitions. Every item carries its partition (16 bits on the same
 *     cache line as its id; 0 when unpartitioned), computed once by
 *     item_new from the key. There is one sketch per partition (P + 1 in
 *     partitioned mode, the last one the global partition of the empty key,
 *     one when unpartitioned) with the partition's counters (mutations,
 *     values, bytes), all under the set lock next to the one journal, so
 *     every partition's sketch is the sketch of its journal ids. A key's
 *     partition is a function of the key, so every set change touches one
 *     partition: a read summing several sketches may therefore let the set
 *     lock go between two partitions (it does every READ_HOLD_SYMBOLS
 *     symbols) and still include no write by half. Journal walks by
 *     partition filter the one journal with a bitmap; drop walks the key
 *     table from its own cursor, like sweep.
 *   - The LRU is one list of linked VALUE items under the LRU lock. Reads do
 *     not take that lock except to move an item to the head, which happens
 *     at most once per LRU_BUMP_SECS per item (as memcached does); writes
 *     link the new item at the head and unlink the one it replaces.
 *
 * Lock order. sweep lock -> one stripe lock -> (set lock | LRU lock). The
 * sweep lock serializes store_sweep and store_drop_partitions. The
 * set lock and the LRU lock are never held together, and no thread ever
 * holds two stripe locks. Eviction takes the LRU lock alone to pick a victim
 * (pinning it with a reference), drops it, then takes the victim's stripe
 * lock; so a writer never evicts while it holds a stripe lock and two
 * writers cannot deadlock. The listener is called with no lock held.
 *
 * One apply. Every change of a key's current mutation goes through
 * do_store_apply (stripe lock held): versions are compared there and only
 * there (strictly greater wins), and there the key's entry, the journal and
 * the sketch change together. Local writes stamp a fresh version from the
 * hybrid clock under the stripe lock, which is always greater than the
 * held one because the clock has caught up with every version it has seen.
 *
 * CAS. The cas unique is a field of the mutation and travels with it, so
 * it is the same on every node holding that mutation (Invariant 5). A new
 * value (set, add, replace, append, prepend, cas, incr, decr) takes a fresh
 * cas, its id's low word (never zero); touch and gat copy the touched
 * item's cas into their new mutation, as memcached keeps an item's cas
 * across touch, so gets / touch / cas succeeds. A delete tombstone takes
 * its id's low word, an eviction tombstone its derived id's (the same on
 * every node). A FLUSH has no cas: its slot holds flush_at.
 *
 * Liveness, death and sweep. An item is *live* (visible to clients) when it
 * is a VALUE, not expired (exptime 0 or > now) and not flushed. An item is
 * *dead* (due to leave the set) when
 *   - a TOMBSTONE: its exptime field, which for tombstones holds the unix
 *     second it was written (its ticks when zero), plus tombstone_grace has
 *     passed;
 *   - a VALUE: exptime + tombstone_grace has passed, or it is flushed;
 *   - a FLUSH: never; a newer flush replaces it.
 * store_sweep removes dead items from key table, journal and sketch. A
 * mutation that is already dead when do_store_apply sees it (a peer's
 * mutation that arrives late) does not enter the set: it is what this node
 * would have swept anyway. If it is newer than the held one, the held one
 * leaves too, exactly as if the late mutation had arrived in time and then
 * been swept; store_apply reports STORE_STALE. Local writes never produce a
 * dead mutation unless tombstone_grace is 0 (then delete removes the key
 * outright). A write with an already-expired exptime (-1) is stored with
 * exptime = now: a miss at once, and a real mutation that still shadows
 * older versions of the key for the grace period.
 *
 * Flush. flush_all writes a FLUSH mutation under the reserved empty key
 * with flush_at = its own ticks + delay (ticks, not the wall clock, so that
 * every earlier write of this node, whose ticks may run slightly ahead of
 * the wall clock, is covered). It is in effect once the hybrid clock
 * reaches flush_at; then every VALUE whose ticks are <= flush_at is a miss
 * (checked lazily on read), and every VALUE or TOMBSTONE whose ticks are <=
 * flush_at is dead (a tombstone older than the flush blocks nothing the
 * flush does not block already). A later flush replaces an earlier one
 * by last writer wins like any key. Why two nodes' sets stay equal: every
 * node ends up holding the same newest flush (it is an ordinary mutation and
 * reconciles); once its flush_at has passed on a node, that node sweeps every
 * older mutation and refuses every older mutation a peer sends (it is dead
 * on arrival), so what the flush covers leaves all sets whatever the order
 * in which a node learnt of the flush and of the older writes, and cannot
 * come back, while every newer mutation is kept everywhere.
 *
 * Eviction as a tombstone. When a write needs room (memory_limit), the
 * store evicts least-recently-used VALUE items. An evicted item becomes a
 * tombstone with version (evicted.ticks + 1, evicted.node): it beats exactly
 * the evicted write and loses to any later write anywhere. Its id is derived
 * from the evicted id by a fixed mix (the same on every node), so two nodes
 * that evict the same mutation hold the same tombstone and their sets stay
 * equal. Evictions are not reported to the listener; peers learn the
 * tombstone through reconciliation. An eviction tombstone carries the flag
 * bit TOMB_EVICTED (in the flags field, which travels with it) and differs
 * from a delete's in two ways: it leaves the set after EVICT_GRACE seconds
 * (or the grace, if shorter), and it is itself evictable -- it enters the
 * LRU at the head and, when it reaches the tail, is dropped without a new
 * mutation. Dropping it early only risks a peer refilling the evicted value,
 * which is harmless for a cache; without this, a cache under steady memory
 * pressure fills up with tombstones within minutes and refuses every write.
 * Delete tombstones and flushes are never evicted: when only they are left
 * and there is still no room, the write fails with STORE_ERR_NOMEM. Memory is
 * accounted by each item's real allocation size when it is linked and
 * unlinked; the room check runs before the key's lock is taken, so concurrent
 * writers may overshoot the limit by at most one item each, and writes whose
 * size depends on the held item (append, prepend, incr, touch) trim the store
 * after they complete.
 *
 * Why sets stay equal (Invariant 1). For each key a node holds the newest
 * mutation it has received that is not dead; ids are the mutation's own
 * (random, or derived deterministically for eviction tombstones), never
 * local to a node. Two nodes that received the same mutations hold the same
 * newest mutation per key whatever the order of arrival, and death depends
 * only on the mutation and the clock, so after both have swept their sets
 * (and sketches, which are a function of the set) are equal. The limit:
 * a mutation that arrives more than the grace late may find its key's
 * tombstone already swept and come back.
 */
#define _GNU_SOURCE
#include "store.h"

#include <errno.h>
#include <stddef.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>
#ifdef HAVE_JEMALLOC
#include <jemalloc/jemalloc.h>
#else
#include <malloc.h>
#endif

#define NS_PER_S 1000000000ULL
#define KEY_MAX 250
#define MAX_STRIPE_BITS 12
#define LRU_BUMP_SECS 60
/*
 * Flag bit of a tombstone written by eviction (the flags field of a
 * tombstone is otherwise 0, and travels with the mutation).
 */
#define TOMB_EVICTED 1u
/* Seconds an eviction tombstone stays in the set (at most the grace). */
#define EVICT_GRACE 60
/* Ticks beyond this are refused so that ticks + 1 can never wrap. */
#define TICKS_MAX (UINT64_MAX - (1ULL << 32))
/* Upper bound of evictions one write may cause before giving up. */
#define EVICT_TRIES (1u << 20)

/* ============================================================== items */

/* Bits of store_item.fbits. */
#define FETCHED 1u      /* read by a client since written */
#define PREV_FETCHED 2u /* FETCHED, as it was before the latest read */

/*
 * The first 64 bytes hold everything a lookup, a liveness check and a read's
 * bookkeeping touch, so a chain step costs one cache line and a hit two
 * (this one and the key's). Times are unix seconds in 32 bits (to 2106).
 */
struct store_item {
    store_item *hnext; /* key table chain; stripe lock */
    uint64_t khash;    /* key hash (stripe, bucket) */
    _Atomic uint32_t refs;
    uint32_t nvalue;
    uint8_t nkey;
    uint8_t kind;
    uint8_t linked;            /* in the key table; stripe lock */
    _Atomic uint8_t fbits;     /* FETCHED | PREV_FETCHED */
    _Atomic uint32_t lru_time; /* latest LRU bump */
    int64_t exptime;
    /* The version, flat: a store_version member would pad to 16 bytes. */
    uint64_t ticks;
    uint32_t node;
    _Atomic uint32_t atime;      /* latest access */
    _Atomic uint32_t prev_atime; /* atime, as it was before the latest read */
    uint32_t size;               /* accounted bytes */
    /* second cache line */
    uint32_t flags;
    uint16_t part; /* partition (0 when unpartitioned); next to the id, which
                      every journal walk and set change reads anyway */
    uint8_t marks; /* STORE_MARK_* (values only); part of the mutation */
    riblt_id id;
    /* One slot keeps the header at two cache lines: a FLUSH has no cas. */
    union {
        uint64_t flush_at; /* STORE_KIND_FLUSH */
        uint64_t cas;      /* every other kind */
    };
    struct store *st;
    store_item *jnext;         /* journal chain; set lock */
    store_item *lprev, *lnext; /* LRU list; LRU lock */
    /* third line, read only when the replication builds an encoder */
    uint64_t tail; /* where the id's mapping leaves the sketch: index << 8
                      | steps (riblt_tail); 0 = not recorded */
    char data[];   /* key, then value */
};

_Static_assert(offsetof(struct store_item, prev_atime) + 4 <= 64,
               "lookup fields fit the first cache line");
_Static_assert(offsetof(struct store_item, part) >= 64 &&
                   offsetof(struct store_item, jnext) + 8 <= 128,
               "partition, id and journal link share the second line");
_Static_assert(offsetof(struct store_item, tail) == 128,
               "everything but the encoder's tail fits two lines");
_Static_assert(sizeof(struct store_item) == 136, "the header stays small");

static inline store_version item_version(const store_item *it)
{
    store_version v = {it->ticks, it->node};
    return v;
}

/*
 * Packs a riblt_tail into one word: index << 8 | steps. Tails that do not
 * fit (an index of 2^56 or more, more than 255 steps: neither happens with
 * sketches of sane size) are not recorded (0), and the encoder then walks
 * that id from the beginning.
 */
static uint64_t tail_pack(const riblt_tail *t)
{
    if (t->index >= ((uint64_t)1 << 56) || t->steps == 0 || t->steps > 255)
        return 0;
    return t->index << 8 | t->steps;
}

/* ============================================================== store */

/*
 * One partition's share of the set: its sketch and counters, all under the
 * set lock (they change with the journal).
 */
struct part {
    riblt_sketch *sk;
    uint64_t mutations; /* journal entries of this partition */
    uint64_t items;     /* of them, VALUE items */
    uint64_t bytes;     /* their accounted size */
};

struct stripe {
    _Alignas(64) pthread_mutex_t lock;
    store_item **buckets;
    uint64_t mask;
    uint64_t count;
};

struct store {
    store_options opt;
    uint64_t seed[2]; /* hash secrets */

    struct stripe *stripes;
    size_t nstripes;
    _Atomic uint64_t nbuckets; /* sum over stripes, for stats */

    _Atomic uint64_t clock_last; /* hybrid clock */
    _Atomic uint64_t flush_at;   /* the held flush's flush_at; 0 = none */

    pthread_mutex_t set_lock; /* journal + partitions' sketches */
    store_item **jbuckets;
    uint64_t jmask;
    uint64_t jcount;
    struct part *parts; /* P + 1 (partitioned) or 1; set lock */
    uint32_t nparts;
    size_t sk_symbols; /* length of each partition's sketch */

    pthread_mutex_t lru_lock;
    store_item *lru_head, *lru_tail;

    pthread_mutex_t sweep_lock; /* sweep and drop cursors */
    size_t sweep_stripe;
    uint64_t sweep_bucket;
    size_t drop_stripe;
    uint64_t drop_bucket;

    _Atomic size_t mem_used;
    store_listener_fn listener;
    void *listener_arg;

    _Atomic uint64_t curr_items, total_items, bytes, evictions,
        expired_unfetched, evicted_unfetched, reclaimed, tombstones,
        applied_remote, stale_remote, swept, dropped;
};

/* One reading of the clocks, taken once per operation. */
typedef struct tnow {
    uint64_t ns;   /* wall clock */
    int64_t s;     /* wall clock, seconds */
    uint64_t peek; /* max(wall clock, hybrid clock): flush reference */
} tnow;

/* What do_store_apply did. */
enum apply_result {
    APPLY_LINKED,  /* became the key's current mutation */
    APPLY_STALE,   /* not newer than the held one (or id already held) */
    APPLY_RETIRED, /* newer but dead: the held one left, nothing linked */
};

#define RELAXED memory_order_relaxed
#define COUNT_ADD(s, f, n) atomic_fetch_add_explicit(&(s)->f, (n), RELAXED)
#define COUNT_SUB(s, f, n) atomic_fetch_sub_explicit(&(s)->f, (n), RELAXED)

/* ============================================================ helpers */

const char *store_strerror(int rc)
{
    switch (rc) {
    case STORE_OK:
        return "ok";
    case STORE_STORED:
        return "stored";
    case STORE_NOT_STORED:
        return "not stored";
    case STORE_EXISTS:
        return "exists";
    case STORE_NOT_FOUND:
        return "not found";
    case STORE_DELETED:
        return "deleted";
    case STORE_NON_NUMERIC:
        return "cannot increment or decrement non-numeric value";
    case STORE_STALE:
        return "stale mutation";
    case STORE_ERR_NOMEM:
        return "out of memory storing object";
    case STORE_ERR_TOO_LARGE:
        return "object too large for cache";
    case STORE_ERR_INVAL:
        return "invalid argument";
    default:
        return "unknown error";
    }
}

int store_version_cmp(const store_version *a, const store_version *b)
{
    if (a->ticks != b->ticks)
        return a->ticks < b->ticks ? -1 : 1;
    if (a->node != b->node)
        return a->node < b->node ? -1 : 1;
    return 0;
}

static inline uint64_t mum(uint64_t a, uint64_t b)
{
    __uint128_t r = (__uint128_t)a * b;
    return (uint64_t)r ^ (uint64_t)(r >> 64);
}

static inline uint64_t rd64(const unsigned char *p)
{
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

static inline uint64_t rd32(const unsigned char *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

#define K0 0xa0761d6478bd642fULL
#define K1 0xe7037ed1a0b428dbULL
#define K3 0x589965cc75374cc3ULL

/*
 * Keyed 64-bit hash of a key: 16-byte blocks folded with a 64x64->128
 * multiply, the tail read with overlapping loads. Fast for memcached-sized
 * keys. Every multiply has a secret (per-store random) term in each
 * operand, so a client cannot zero one out with chosen bytes and make keys
 * collide.
 */
static uint64_t key_hash(const uint64_t sec[2], const char *key, size_t n)
{
    const unsigned char *p = (const unsigned char *)key;
    uint64_t h = sec[0] ^ mum(n ^ K0, K1);
    uint64_t a, b;

    while (n > 16) {
        h = mum(rd64(p) ^ sec[1], rd64(p + 8) ^ h);
        p += 16;
        n -= 16;
    }
    if (n > 8) {
        a = rd64(p);
        b = rd64(p + n - 8);
    } else if (n >= 4) {
        a = rd32(p);
        b = rd32(p + n - 4);
    } else if (n > 0) {
        a = ((uint64_t)p[0] << 16) | ((uint64_t)p[n >> 1] << 8) | p[n - 1];
        b = 0;
    } else {
        a = b = 0;
    }
    return mum(K3 ^ n ^ sec[0], mum(a ^ sec[1], b ^ h));
}

/* Journal bucket hash of an id (keyed the same way: ids come from peers). */
static inline uint64_t id_bucket_hash(const uint64_t sec[2],
                                      const riblt_id *id)
{
    return mum(id->lo ^ sec[0], id->hi ^ sec[1]);
}

static inline uint64_t splitmix(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

/* Per-thread xoshiro256** state, seeded from getrandom() on first use. */
static __thread uint64_t rng_s[4];
static __thread int rng_ready;

static void rng_seed(void)
{
    uint64_t buf[4] = {0, 0, 0, 0};
    size_t got = 0;

    while (got < sizeof(buf)) {
        ssize_t r = getrandom((char *)buf + got, sizeof(buf) - got, 0);
        if (r < 0) {
            if (errno == EINTR)
                continue;
            break;
        }
        got += (size_t)r;
    }
    if (got < sizeof(buf)) {
        /* No kernel randomness: fall back to time, pid and addresses. */
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        uint64_t x = (uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 32) ^
                     ((uint64_t)getpid() << 16) ^ (uint64_t)(uintptr_t)&got;
        for (int i = 0; i < 4; i++)
            buf[i] ^= splitmix(&x);
    }
    if ((buf[0] | buf[1] | buf[2] | buf[3]) == 0)
        buf[0] = 1;
    memcpy(rng_s, buf, sizeof(rng_s));
    rng_ready = 1;
}

static inline uint64_t rotl(uint64_t x, int k)
{
    return (x << k) | (x >> (64 - k));
}

static uint64_t rng_next(void)
{
    if (!rng_ready)
        rng_seed();
    uint64_t r = rotl(rng_s[1] * 5, 7) * 9;
    uint64_t t = rng_s[1] << 17;
    rng_s[2] ^= rng_s[0];
    rng_s[3] ^= rng_s[1];
    rng_s[1] ^= rng_s[2];
    rng_s[0] ^= rng_s[3];
    rng_s[2] ^= t;
    rng_s[3] = rotl(rng_s[3], 45);
    return r;
}

/* A fresh mutation id; lo is never zero, so neither the id nor its cas is. */
static riblt_id new_id(void)
{
    riblt_id id;
    do
        id.lo = rng_next();
    while (id.lo == 0);
    id.hi = rng_next();
    return id;
}

/*
 * The id of the tombstone that evicts mutation `id`: a fixed bijective mix,
 * so every node evicting the same mutation writes the same tombstone.
 */
static riblt_id eviction_id(const riblt_id *id)
{
    uint64_t x = id->lo ^ 0x3c6ef372fe94f82bULL;
    uint64_t y = id->hi ^ 0xa54ff53a5f1d36f1ULL;
    riblt_id out;

    out.lo = splitmix(&x) ^ y;
    out.hi = splitmix(&y) ^ out.lo;
    if (out.lo == 0)
        out.lo = 1;
    return out;
}

static uint64_t realtime_ns(void *arg)
{
    (void)arg;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * NS_PER_S + (uint64_t)ts.tv_nsec;
}

static inline uint64_t wall_ns(const store *s)
{
    return s->opt.clock(s->opt.clock_arg);
}

static void tnow_get(store *s, tnow *t)
{
    uint64_t last = atomic_load(&s->clock_last);
    t->ns = wall_ns(s);
    t->s = (int64_t)(t->ns / NS_PER_S);
    t->peek = t->ns > last ? t->ns : last;
}

/* Hybrid clock: next = max(now, last + 1), atomically. */
static uint64_t clock_next(store *s, uint64_t now)
{
    uint64_t last = atomic_load(&s->clock_last);
    uint64_t next;

    do
        next = now > last ? now : last + 1;
    while (!atomic_compare_exchange_weak(&s->clock_last, &last, next));
    return next;
}

/* Hybrid clock: last = max(last, t), atomically. */
static void clock_catch_up(store *s, uint64_t t)
{
    uint64_t last = atomic_load(&s->clock_last);

    while (last < t && !atomic_compare_exchange_weak(&s->clock_last, &last, t))
        ;
}

static size_t alloc_size(void *p, size_t asked)
{
#ifdef HAVE_JEMALLOC
    size_t n = sallocx(p, 0);
#else
    size_t n = malloc_usable_size(p);
#endif
    return n > asked ? n : asked;
}

static inline size_t item_total(size_t nkey, size_t nvalue)
{
    return sizeof(store_item) + nkey + nvalue;
}

static inline char *item_value_ptr(store_item *it)
{
    return it->data + it->nkey;
}

/*
 * The partition of a key (see store.h): the global partition P for the
 * empty key, partition_fn's answer (reduced modulo P) otherwise, 0 when
 * unpartitioned.
 */
static inline uint32_t key_part(const store *s, const char *key, size_t nkey)
{
    uint32_t np = s->opt.partitions, p;

    if (np == 0)
        return 0;
    if (nkey == 0)
        return np;
    p = s->opt.partition_fn(s->opt.partition_arg, key, nkey);
    return p < np ? p : p % np;
}

/*
 * A new unlinked item of the given shape holding a copy of key, with one
 * reference (the caller's), in the key's partition. The value is left for
 * the caller to fill. Returns NULL when out of memory.
 */
static store_item *item_new(store *s, uint8_t kind, const char *key,
                            size_t nkey, uint64_t khash, size_t nvalue)
{
    size_t total = item_total(nkey, nvalue);
    store_item *it = malloc(total);

    if (it == NULL)
        return NULL;
    memset(it, 0, sizeof(*it));
    atomic_init(&it->refs, 1);
    it->kind = kind;
    it->nkey = (uint8_t)nkey;
    it->nvalue = (uint32_t)nvalue;
    it->khash = khash;
    it->st = s;
    it->size = (uint32_t)alloc_size(it, total);
    it->part = (uint16_t)key_part(s, key, nkey);
    if (nkey)
        memcpy(it->data, key, nkey);
    return it;
}

/* Sets the id and, for kinds that have one, the cas derived from it. */
static void item_set_id(store_item *it, const riblt_id *id)
{
    it->id = *id;
    if (it->kind != STORE_KIND_FLUSH)
        it->cas = id->lo;
}

void store_item_ref(store_item *it)
{
    atomic_fetch_add_explicit(&it->refs, 1, RELAXED);
}

void store_item_release(store_item *it)
{
    if (it == NULL)
        return;
    if (atomic_fetch_sub_explicit(&it->refs, 1, memory_order_acq_rel) == 1)
        free(it);
}

const char *store_item_key(const store_item *it, size_t *nkey)
{
    if (nkey)
        *nkey = it->nkey;
    return it->data;
}

const char *store_item_value(const store_item *it, size_t *nvalue)
{
    if (nvalue)
        *nvalue = it->nvalue;
    return it->data + it->nkey;
}

uint32_t store_item_flags(const store_item *it)
{
    return it->flags;
}

int64_t store_item_exptime(const store_item *it)
{
    return it->exptime;
}

uint64_t store_item_cas(const store_item *it)
{
    return it->kind == STORE_KIND_FLUSH ? 0 : it->cas;
}

uint8_t store_item_kind(const store_item *it)
{
    return it->kind;
}

uint8_t store_item_marks(const store_item *it)
{
    return it->marks;
}

/*
 * Seconds between the access before the most recent read (store_get or
 * store_gat) of this item and now: what meta 'l' reports to the reader that
 * just fetched it. The store must still exist.
 */
int64_t store_item_last_access(const store_item *it)
{
    int64_t now = (int64_t)(wall_ns(it->st) / NS_PER_S);
    int64_t d = now - (int64_t)atomic_load_explicit(&it->prev_atime, RELAXED);
    return d > 0 ? d : 0;
}

/*
 * Whether the item had been read by a client before its most recent read:
 * what meta 'h' reports to the reader that just fetched it.
 */
bool store_item_fetched(const store_item *it)
{
    return (atomic_load_explicit(&it->fbits, RELAXED) & PREV_FETCHED) != 0;
}

void store_item_mutation(const store_item *it, store_mutation *out)
{
    memset(out, 0, sizeof(*out));
    out->id = it->id;
    out->version = item_version(it);
    out->kind = it->kind;
    out->marks = it->marks;
    out->flags = it->flags;
    out->exptime = it->exptime;
    if (it->kind == STORE_KIND_FLUSH)
        out->flush_at = it->flush_at;
    else
        out->cas = it->cas;
    out->key = it->data;
    out->nkey = it->nkey;
    out->value = it->data + it->nkey;
    out->nvalue = it->nvalue;
}

/* ========================================================== liveness */

/*
 * Covered by the flush in effect. Tombstones too: every write a tombstone
 * older than the flush could block is older than the flush as well.
 */
static inline bool item_flushed(store *s, const store_item *it, const tnow *t)
{
    uint64_t f = atomic_load_explicit(&s->flush_at, memory_order_acquire);

    return f != 0 && it->kind != STORE_KIND_FLUSH && it->ticks <= f &&
           t->peek >= f;
}

/* Visible to clients: a VALUE neither expired nor flushed. */
static bool item_live(store *s, const store_item *it, const tnow *t)
{
    if (it->kind != STORE_KIND_VALUE)
        return false;
    if (it->exptime != 0 && it->exptime <= t->s)
        return false;
    return !item_flushed(s, it, t);
}

/* Due to leave the set (see the contract at the top). */
static bool item_dead(store *s, const store_item *it, const tnow *t)
{
    int64_t grace = (int64_t)s->opt.tombstone_grace;

    switch (it->kind) {
    case STORE_KIND_TOMBSTONE: {
        if (item_flushed(s, it, t))
            return true;
        int64_t born =
            it->exptime > 0 ? it->exptime : (int64_t)(it->ticks / NS_PER_S);
        if ((it->flags & TOMB_EVICTED) && grace > EVICT_GRACE)
            grace = EVICT_GRACE;
        /* Compared as now - grace: born and exptime may be as large as
         * a peer sends (up to INT64_MAX), and adding would overflow. */
        return t->s - grace >= born;
    }
    case STORE_KIND_VALUE:
        if (item_flushed(s, it, t))
            return true;
        return it->exptime != 0 && t->s - grace >= it->exptime;
    default:
        return false;
    }
}

/* ========================================================= key table */

static inline struct stripe *stripe_of(store *s, uint64_t h)
{
    return &s->stripes[h & (s->nstripes - 1)];
}

/*
 * The slot holding key in sp (caller holds sp->lock): *slot is the item, or
 * NULL with slot pointing at the end of the bucket's chain.
 */
static store_item **stripe_slot(struct stripe *sp, uint64_t h, const char *key,
                                size_t nkey)
{
    store_item **pp = &sp->buckets[(h >> 32) & sp->mask];

    for (; *pp != NULL; pp = &(*pp)->hnext) {
        store_item *it = *pp;
        if (it->khash == h && it->nkey == nkey &&
            (nkey == 0 || memcmp(it->data, key, nkey) == 0))
            break;
    }
    return pp;
}

/* Doubles sp's buckets (caller holds sp->lock); no-op without memory. */
static void stripe_grow(store *s, struct stripe *sp)
{
    uint64_t n = (sp->mask + 1) * 2;
    store_item **nb;

    if (n > (1ULL << 32))
        return;
    nb = calloc(n, sizeof(*nb));
    if (nb == NULL)
        return;
    for (uint64_t i = 0; i <= sp->mask; i++) {
        store_item *it = sp->buckets[i];
        while (it != NULL) {
            store_item *next = it->hnext;
            uint64_t b = (it->khash >> 32) & (n - 1);
            it->hnext = nb[b];
            nb[b] = it;
            it = next;
        }
    }
    free(sp->buckets);
    sp->buckets = nb;
    atomic_fetch_add(&s->nbuckets, sp->mask + 1);
    sp->mask = n - 1;
}

/* =========================================================== journal */

/* Finds id in the journal (caller holds set_lock). */
static store_item *journal_find(store *s, const riblt_id *id)
{
    store_item *it = s->jbuckets[id_bucket_hash(s->seed, id) & s->jmask];

    for (; it != NULL; it = it->jnext)
        if (it->id.lo == id->lo && it->id.hi == id->hi)
            return it;
    return NULL;
}

static void journal_grow(store *s)
{
    uint64_t n = (s->jmask + 1) * 2;
    store_item **nb = calloc(n, sizeof(*nb));

    if (nb == NULL)
        return;
    for (uint64_t i = 0; i <= s->jmask; i++) {
        store_item *it = s->jbuckets[i];
        while (it != NULL) {
            store_item *next = it->jnext;
            uint64_t b = id_bucket_hash(s->seed, &it->id) & (n - 1);
            it->jnext = nb[b];
            nb[b] = it;
            it = next;
        }
    }
    free(s->jbuckets);
    s->jbuckets = nb;
    s->jmask = n - 1;
}

/*
 * Journal and sketch always change together, under set_lock; the helpers
 * below change the journal only and leave the sketch to their caller, who
 * may then merge a removal and an addition into one sketch walk.
 */

/* Counts it in (sign 1) or out (-1) of its partition (set_lock held). */
static inline void part_count(store *s, const store_item *it, int sign)
{
    struct part *pt = &s->parts[it->part];

    pt->mutations += (uint64_t)(int64_t)sign;
    if (it->kind == STORE_KIND_VALUE) {
        pt->items += (uint64_t)(int64_t)sign;
        pt->bytes += (uint64_t)((int64_t)sign * it->size);
    }
}

/* Links it into the journal (caller holds set_lock). */
static void journal_link(store *s, store_item *it)
{
    store_item **b = &s->jbuckets[id_bucket_hash(s->seed, &it->id) & s->jmask];

    it->jnext = *b;
    *b = it;
    s->jcount++;
    part_count(s, it, 1);
    if (s->jcount > (s->jmask + 1) + (s->jmask + 1) / 2)
        journal_grow(s);
}

/* Unlinks it from the journal (caller holds set_lock); false if absent. */
static bool journal_unlink(store *s, store_item *it)
{
    store_item **pp =
        &s->jbuckets[id_bucket_hash(s->seed, &it->id) & s->jmask];

    for (; *pp != NULL; pp = &(*pp)->jnext) {
        if (*pp == it) {
            *pp = it->jnext;
            it->jnext = NULL;
            s->jcount--;
            part_count(s, it, -1);
            return true;
        }
    }
    return false;
}

/* Removes it from journal and sketch (caller holds set_lock). */
static void set_remove(store *s, store_item *it)
{
    if (journal_unlink(s, it))
        riblt_sketch_remove(s->parts[it->part].sk, &it->id);
}

/* =============================================================== LRU */

/*
 * The LRU holds the items eviction may take: live or expired values, and
 * eviction tombstones (dropping one only lets a peer refill the evicted
 * value, which a cache may do). Delete tombstones and flushes never go.
 */
static inline bool in_lru(const store_item *it)
{
    return it->kind == STORE_KIND_VALUE ||
           (it->kind == STORE_KIND_TOMBSTONE && (it->flags & TOMB_EVICTED));
}

/* Caller holds lru_lock. */
static void lru_unlink_locked(store *s, store_item *it)
{
    if (it->lprev)
        it->lprev->lnext = it->lnext;
    else
        s->lru_head = it->lnext;
    if (it->lnext)
        it->lnext->lprev = it->lprev;
    else
        s->lru_tail = it->lprev;
    it->lprev = it->lnext = NULL;
}

/* Caller holds lru_lock. */
static void lru_push_head_locked(store *s, store_item *it)
{
    it->lprev = NULL;
    it->lnext = s->lru_head;
    if (s->lru_head)
        s->lru_head->lprev = it;
    else
        s->lru_tail = it;
    s->lru_head = it;
}

/*
 * Records a client read of a linked item (caller holds its stripe lock):
 * access time and fetched flag, keeping the previous values for meta, and an
 * LRU bump at most once per LRU_BUMP_SECS.
 */
static void item_access(store *s, store_item *it, const tnow *t)
{
    uint8_t was = atomic_load_explicit(&it->fbits, RELAXED);
    uint32_t prev =
        atomic_exchange_explicit(&it->atime, (uint32_t)t->s, RELAXED);

    /* Racing readers may both see "not fetched": harmless for meta 'h'. */
    atomic_store_explicit(
        &it->fbits, (uint8_t)(FETCHED | ((was & FETCHED) << 1)), RELAXED);
    atomic_store_explicit(&it->prev_atime, prev, RELAXED);
    if (it->kind == STORE_KIND_VALUE &&
        t->s - (int64_t)atomic_load_explicit(&it->lru_time, RELAXED) >=
            LRU_BUMP_SECS) {
        pthread_mutex_lock(&s->lru_lock);
        if (it->linked) {
            lru_unlink_locked(s, it);
            lru_push_head_locked(s, it);
        }
        atomic_store_explicit(&it->lru_time, (uint32_t)t->s, RELAXED);
        pthread_mutex_unlock(&s->lru_lock);
    }
}

/* ========================================================= accounting */

static void account_link(store *s, store_item *it)
{
    atomic_fetch_add_explicit(&s->mem_used, it->size, RELAXED);
    if (it->kind == STORE_KIND_VALUE) {
        COUNT_ADD(s, curr_items, 1);
        COUNT_ADD(s, total_items, 1);
        COUNT_ADD(s, bytes, it->size);
    } else if (it->kind == STORE_KIND_TOMBSTONE) {
        COUNT_ADD(s, tombstones, 1);
    }
}

static void account_unlink(store *s, store_item *it)
{
    atomic_fetch_sub_explicit(&s->mem_used, it->size, RELAXED);
    if (it->kind == STORE_KIND_VALUE) {
        COUNT_SUB(s, curr_items, 1);
        COUNT_SUB(s, bytes, it->size);
    } else if (it->kind == STORE_KIND_TOMBSTONE) {
        COUNT_SUB(s, tombstones, 1);
    }
}

/* ============================================================= apply */

/*
 * Takes the item at *pp out of key table, journal, sketch and LRU and drops
 * the table's reference. Caller holds sp->lock.
 */
static void do_unlink(store *s, struct stripe *sp, store_item **pp)
{
    store_item *it = *pp;

    *pp = it->hnext;
    it->hnext = NULL;
    sp->count--;
    pthread_mutex_lock(&s->set_lock);
    set_remove(s, it);
    pthread_mutex_unlock(&s->set_lock);
    if (in_lru(it)) {
        pthread_mutex_lock(&s->lru_lock);
        lru_unlink_locked(s, it);
        pthread_mutex_unlock(&s->lru_lock);
    }
    it->linked = 0;
    account_unlink(s, it);
    store_item_release(it);
}

/*
 * The one place where versions are compared and the set changes. Caller
 * holds sp->lock (sp is it's stripe); `it` is a complete, unlinked item
 * with the caller's reference.
 *
 * Returns APPLY_LINKED when it became the key's current mutation: the
 * caller's reference now belongs to the key table (take another before
 * dropping the lock to keep using it). Returns APPLY_STALE when the held
 * mutation's version is not smaller (or the journal already holds it->id),
 * and APPLY_RETIRED when it is newer but already dead (the held mutation
 * left the set, nothing was linked); in both cases the caller still owns
 * its reference and nothing else changed.
 *
 * Both ids are hashed before the set lock, which every write shares, and an
 * overwrite swaps the old id for the new one in one interleaved sketch walk
 * (riblt_sketch_replace_hashed) rather than two.
 */
static int do_store_apply(store *s, struct stripe *sp, store_item *it,
                          const tnow *t)
{
    store_item **pp = stripe_slot(sp, it->khash, it->data, it->nkey);
    store_item *cur = *pp;

    if (cur != NULL) {
        store_version nv = item_version(it), cv = item_version(cur);
        if (store_version_cmp(&nv, &cv) <= 0)
            return APPLY_STALE;
    }
    if (item_dead(s, it, t)) {
        if (cur != NULL)
            do_unlink(s, sp, pp);
        return APPLY_RETIRED;
    }

    /* Hashed before the set lock, which every write shares. */
    uint64_t nh = riblt_hash(&it->id);
    uint64_t oh = cur != NULL ? riblt_hash(&cur->id) : 0;
    pthread_mutex_lock(&s->set_lock);
    if (journal_find(s, &it->id) != NULL) {
        pthread_mutex_unlock(&s->set_lock);
        return APPLY_STALE;
    }
    bool swapped = cur != NULL && journal_unlink(s, cur);
    journal_link(s, it);
    /* A key's partition is a function of the key: cur and it share it. */
    riblt_sketch *sk = s->parts[it->part].sk;
    riblt_tail tail;
    if (swapped && cur->part == it->part) {
        riblt_sketch_replace_tail(sk, &cur->id, oh, &it->id, nh, &tail);
    } else {
        if (swapped)
            riblt_sketch_remove_hashed(s->parts[cur->part].sk, &cur->id, oh);
        riblt_sketch_add_tail(sk, &it->id, nh, &tail);
    }
    it->tail = tail_pack(&tail);
    pthread_mutex_unlock(&s->set_lock);

    if (cur != NULL) {
        it->hnext = cur->hnext;
        cur->hnext = NULL;
    } else {
        it->hnext = NULL;
        sp->count++;
    }
    *pp = it;
    it->linked = 1;
    atomic_store_explicit(&it->lru_time, (uint32_t)t->s, RELAXED);
    if ((cur != NULL && in_lru(cur)) || in_lru(it)) {
        pthread_mutex_lock(&s->lru_lock);
        if (cur != NULL && in_lru(cur))
            lru_unlink_locked(s, cur);
        if (in_lru(it))
            lru_push_head_locked(s, it);
        pthread_mutex_unlock(&s->lru_lock);
    }
    account_link(s, it);
    if (it->kind == STORE_KIND_FLUSH) {
        atomic_store_explicit(&s->flush_at, it->flush_at,
                              memory_order_release);
        /* An immediate flush: later local writes must get greater ticks. */
        if (it->flush_at <= t->peek)
            clock_catch_up(s, it->flush_at);
    }
    if (cur != NULL) {
        cur->linked = 0;
        account_unlink(s, cur);
        store_item_release(cur);
    } else if (sp->count > (sp->mask + 1) + (sp->mask + 1) / 2) {
        stripe_grow(s, sp);
    }
    return APPLY_LINKED;
}

/* ========================================================== eviction */

/*
 * Evicts the LRU tail: a value becomes an eviction tombstone, an eviction
 * tombstone leaves (see the contract at the top). Takes no lock on entry and
 * returns with none. Returns 0 when it made progress (or the tail changed
 * under it), -1 when the LRU is empty or memory for the tombstone is
 * lacking.
 */
static int evict_one(store *s)
{
    store_item *victim, **pp;
    struct stripe *sp;
    tnow t;

    pthread_mutex_lock(&s->lru_lock);
    victim = s->lru_tail;
    if (victim != NULL)
        store_item_ref(victim);
    pthread_mutex_unlock(&s->lru_lock);
    if (victim == NULL)
        return -1;

    sp = stripe_of(s, victim->khash);
    pthread_mutex_lock(&sp->lock);
    pp = stripe_slot(sp, victim->khash, victim->data, victim->nkey);
    if (*pp == victim && victim->kind == STORE_KIND_TOMBSTONE) {
        /* An eviction tombstone reached the tail: it just leaves. */
        do_unlink(s, sp, pp);
    } else if (*pp == victim) {
        store_item *tomb = item_new(s, STORE_KIND_TOMBSTONE, victim->data,
                                    victim->nkey, victim->khash, 0);
        if (tomb == NULL) {
            pthread_mutex_unlock(&sp->lock);
            store_item_release(victim);
            return -1;
        }
        riblt_id id = eviction_id(&victim->id);
        item_set_id(tomb, &id);
        tomb->ticks = victim->ticks + 1;
        tomb->node = victim->node;
        tomb->flags = TOMB_EVICTED;
        clock_catch_up(s, tomb->ticks);
        tnow_get(s, &t);
        tomb->exptime = t.s;
        atomic_init(&tomb->atime, (uint32_t)t.s);
        bool expired = !item_live(s, victim, &t);
        bool fetched = atomic_load_explicit(&victim->fbits, RELAXED) & FETCHED;
        if (do_store_apply(s, sp, tomb, &t) != APPLY_LINKED)
            store_item_release(tomb);
        if (expired) {
            COUNT_ADD(s, reclaimed, 1);
            if (!fetched)
                COUNT_ADD(s, expired_unfetched, 1);
        } else {
            COUNT_ADD(s, evictions, 1);
            if (!fetched)
                COUNT_ADD(s, evicted_unfetched, 1);
        }
    }
    pthread_mutex_unlock(&sp->lock);
    store_item_release(victim);
    return 0;
}

/*
 * Makes room for `need` more bytes under memory_limit by evicting. Called
 * with no lock held. 0, or STORE_ERR_NOMEM when nothing evictable is left.
 */
static int ensure_room(store *s, size_t need)
{
    size_t limit = s->opt.memory_limit;

    if (limit == 0)
        return 0;
    if (need > limit)
        return STORE_ERR_NOMEM;
    for (unsigned i = 0; i < EVICT_TRIES; i++) {
        size_t used = atomic_load_explicit(&s->mem_used, RELAXED);
        if (used <= limit && need <= limit - used)
            return 0;
        if (evict_one(s) < 0)
            return STORE_ERR_NOMEM;
    }
    return STORE_ERR_NOMEM;
}

/* Brings memory back under the limit after a write that grew it. */
static void trim(store *s)
{
    if (s->opt.memory_limit != 0 &&
        atomic_load_explicit(&s->mem_used, RELAXED) > s->opt.memory_limit)
        (void)ensure_room(s, 0);
}

/* =========================================================== setup */

void store_options_default(store_options *o)
{
    memset(o, 0, sizeof(*o));
    o->node_id = 0; /* store_create draws a random non-zero id */
    o->memory_limit = 64u << 20;
    o->item_size_max = 1u << 20;
    o->tombstone_grace = 3600;
    o->sketch_symbols = 8192;
    o->hash_power = 16;
    o->clock = NULL;
    o->clock_arg = NULL;
    o->partitions = 0;
    o->partition_fn = NULL;
    o->partition_arg = NULL;
    o->partition_sketch_symbols = 256;
}

static void parts_free(store *s)
{
    if (s->parts == NULL)
        return;
    for (uint32_t p = 0; p < s->nparts; p++)
        if (s->parts[p].sk != NULL)
            riblt_sketch_destroy(s->parts[p].sk);
    free(s->parts);
    s->parts = NULL;
}

store *store_create(const store_options *o, int *err)
{
    store *s;
    unsigned bits, per;

    if (err)
        *err = STORE_ERR_INVAL;
    if (o == NULL || o->hash_power > 32 ||
        o->item_size_max < item_total(1, 0) || o->item_size_max > (1u << 30))
        return NULL;
    if (o->partitions == 0
            ? o->sketch_symbols == 0
            : o->partitions > STORE_PARTITIONS_MAX ||
                  o->partition_fn == NULL || o->partition_sketch_symbols == 0)
        return NULL;
    if (err)
        *err = STORE_ERR_NOMEM;
    s = calloc(1, sizeof(*s));
    if (s == NULL)
        return NULL;
    s->opt = *o;
    if (s->opt.clock == NULL)
        s->opt.clock = realtime_ns;
    while (s->opt.node_id == 0)
        s->opt.node_id = (uint32_t)rng_next();
    s->seed[0] = rng_next();
    s->seed[1] = rng_next();

    bits = o->hash_power < MAX_STRIPE_BITS ? o->hash_power : MAX_STRIPE_BITS;
    per = o->hash_power - bits;
    s->nstripes = (size_t)1 << bits;
    s->stripes = aligned_alloc(64, s->nstripes * sizeof(struct stripe));
    if (s->stripes == NULL)
        goto fail_stripes;
    memset(s->stripes, 0, s->nstripes * sizeof(struct stripe));
    for (size_t i = 0; i < s->nstripes; i++) {
        struct stripe *sp = &s->stripes[i];
        pthread_mutex_init(&sp->lock, NULL);
        sp->mask = (1ULL << per) - 1;
        sp->buckets = calloc(sp->mask + 1, sizeof(*sp->buckets));
        if (sp->buckets == NULL)
            goto fail;
        atomic_fetch_add(&s->nbuckets, sp->mask + 1);
    }
    /* Sized like the key table so that a filling cache rehashes it rarely. */
    s->jmask = (1ULL << (o->hash_power < 10   ? 10
                         : o->hash_power > 24 ? 24
                                              : o->hash_power)) -
               1;
    s->jbuckets = calloc(s->jmask + 1, sizeof(*s->jbuckets));
    if (s->jbuckets == NULL)
        goto fail;
    s->nparts = o->partitions ? o->partitions + 1 : 1;
    s->sk_symbols =
        o->partitions ? o->partition_sketch_symbols : o->sketch_symbols;
    s->parts = calloc(s->nparts, sizeof(*s->parts));
    if (s->parts == NULL)
        goto fail;
    for (uint32_t p = 0; p < s->nparts; p++)
        if ((s->parts[p].sk = riblt_sketch_create(s->sk_symbols)) == NULL)
            goto fail;
    pthread_mutex_init(&s->set_lock, NULL);
    pthread_mutex_init(&s->lru_lock, NULL);
    pthread_mutex_init(&s->sweep_lock, NULL);
    if (err)
        *err = STORE_OK;
    return s;

fail:
    for (size_t i = 0; i < s->nstripes; i++) {
        free(s->stripes[i].buckets);
        pthread_mutex_destroy(&s->stripes[i].lock);
    }
    free(s->stripes);
    free(s->jbuckets);
    parts_free(s);
fail_stripes:
    free(s);
    return NULL;
}

/*
 * Frees the store and drops its reference to every item. Items callers
 * still hold stay readable (key, value, fields) until released, but
 * store_item_last_access needs the store alive.
 */
void store_destroy(store *s)
{
    if (s == NULL)
        return;
    for (size_t i = 0; i < s->nstripes; i++) {
        struct stripe *sp = &s->stripes[i];
        for (uint64_t b = 0; b <= sp->mask; b++) {
            store_item *it = sp->buckets[b];
            while (it != NULL) {
                store_item *next = it->hnext;
                it->linked = 0;
                store_item_release(it);
                it = next;
            }
        }
        free(sp->buckets);
        pthread_mutex_destroy(&sp->lock);
    }
    free(s->stripes);
    free(s->jbuckets);
    parts_free(s);
    pthread_mutex_destroy(&s->set_lock);
    pthread_mutex_destroy(&s->lru_lock);
    pthread_mutex_destroy(&s->sweep_lock);
    free(s);
}

void store_set_listener(store *s, store_listener_fn fn, void *arg)
{
    s->listener = fn;
    s->listener_arg = arg;
}

/* ====================================================== local writes */

static inline bool key_ok(const char *key, size_t nkey)
{
    return key != NULL && nkey >= 1 && nkey <= KEY_MAX;
}

/*
 * Stamps a local item with a fresh id and version and applies it (caller
 * holds sp->lock). The cas is fresh (derived from the id) when keep_cas is
 * 0, else keep_cas (touch, gat, meta E). On success *note gets a reference for
 * the listener (when one is set) and *cas_out the item's cas. Returns the
 * apply result; on APPLY_STALE (only possible on an id collision) the item is
 * freed.
 */
static int commit_local(store *s, struct stripe *sp, store_item *it,
                        const tnow *t, uint64_t keep_cas, store_item **note,
                        uint64_t *cas_out)
{
    riblt_id id = new_id();
    int r;

    item_set_id(it, &id);
    if (keep_cas != 0)
        it->cas = keep_cas;
    it->ticks = clock_next(s, t->ns);
    it->node = s->opt.node_id;
    if (atomic_load_explicit(&it->atime, RELAXED) == 0)
        atomic_init(&it->atime, (uint32_t)t->s);
    r = do_store_apply(s, sp, it, t);
    if (r == APPLY_STALE) {
        store_item_release(it);
        return r;
    }
    if (cas_out)
        *cas_out = it->cas;
    if (s->listener != NULL) {
        store_item_ref(it);
        *note = it;
    }
    if (r == APPLY_RETIRED)
        store_item_release(it);
    return r;
}

/* Tells the listener about a change (no lock held) and drops the ref. */
static void notify(store *s, store_item *it, bool local)
{
    if (it == NULL)
        return;
    s->listener(s->listener_arg, it, local);
}

int64_t store_exptime_abs(store *s, int64_t exptime)
{
    int64_t now = (int64_t)(wall_ns(s) / NS_PER_S);

    if (exptime == 0)
        return 0;
    if (exptime < 0)
        return -1;
    if (exptime <= 2592000)
        return now + exptime;
    return exptime <= now ? -1 : exptime;
}

/* The absolute expiry a local write stores: -1 (expired) becomes now. */
static inline int64_t stored_exptime(int64_t exptime, const tnow *t)
{
    return exptime < 0 ? t->s : exptime;
}

int store_write_item(store *s, const store_write *w, uint64_t *cas_out)
{
    store_item *it = NULL, *cur, *note = NULL, **pp;
    struct stripe *sp;
    uint64_t h;
    bool concat, cas_mode;
    int rc;
    tnow t;

    if (s == NULL || w == NULL || !key_ok(w->key, w->nkey) ||
        (w->nvalue != 0 && w->value == NULL) || (int)w->mode < STORE_SET ||
        (int)w->mode > STORE_CAS || w->nvalue > UINT32_MAX)
        return STORE_ERR_INVAL;
    if (item_total(w->nkey, w->nvalue) > s->opt.item_size_max)
        return STORE_ERR_TOO_LARGE;
    concat = w->mode == STORE_APPEND || w->mode == STORE_PREPEND;
    cas_mode = w->mode == STORE_CAS || (!concat && w->cas != 0);
    rc = ensure_room(s, item_total(w->nkey, w->nvalue));
    if (rc < 0)
        return rc;
    h = key_hash(s->seed, w->key, w->nkey);
    if (!concat) {
        it = item_new(s, STORE_KIND_VALUE, w->key, w->nkey, h, w->nvalue);
        if (it == NULL)
            return STORE_ERR_NOMEM;
        if (w->nvalue)
            memcpy(item_value_ptr(it), w->value, w->nvalue);
        it->flags = w->flags;
        it->marks = w->marks & STORE_MARKS_ALL;
    }

    sp = stripe_of(s, h);
    pthread_mutex_lock(&sp->lock);
    tnow_get(s, &t);
    pp = stripe_slot(sp, h, w->key, w->nkey);
    cur = *pp;
    if (cur != NULL && !item_live(s, cur, &t))
        cur = NULL;

    rc = STORE_STORED;
    bool stale = false;
    if (cas_mode) {
        if (cur == NULL)
            rc = STORE_NOT_FOUND;
        else if (cur->cas != w->cas && w->invalidate)
            stale = true; /* cas uniques are random: any other cas is older */
        else if (cur->cas != w->cas)
            rc = STORE_EXISTS;
    } else if (w->mode == STORE_ADD) {
        if (cur != NULL)
            rc = STORE_NOT_STORED;
    } else if (w->mode == STORE_REPLACE) {
        if (cur == NULL)
            rc = STORE_NOT_STORED;
    } else if (concat) {
        if (cur == NULL)
            rc = STORE_NOT_STORED;
        else if (w->cas != 0 && cur->cas != w->cas)
            rc = STORE_EXISTS;
        else if (item_total(w->nkey, (size_t)cur->nvalue + w->nvalue) >
                 s->opt.item_size_max)
            rc = STORE_NOT_STORED; /* as memcached: the copy cannot fit */
    }
    if (rc != STORE_STORED) {
        pthread_mutex_unlock(&sp->lock);
        store_item_release(it);
        return rc;
    }

    if (concat) {
        size_t total = (size_t)cur->nvalue + w->nvalue;
        it = item_new(s, STORE_KIND_VALUE, w->key, w->nkey, h, total);
        if (it == NULL) {
            pthread_mutex_unlock(&sp->lock);
            return STORE_ERR_NOMEM;
        }
        char *v = item_value_ptr(it);
        const char *old = cur->data + cur->nkey;
        if (w->mode == STORE_APPEND) {
            memcpy(v, old, cur->nvalue);
            if (w->nvalue)
                memcpy(v + cur->nvalue, w->value, w->nvalue);
        } else {
            if (w->nvalue)
                memcpy(v, w->value, w->nvalue);
            memcpy(v + w->nvalue, old, cur->nvalue);
        }
        it->flags = cur->flags;
        it->exptime = cur->exptime;
    } else if (stale) {
        /* A recache that lost to an invalidation: stored, but still stale,
         * living no longer than the invalidated value. */
        it->exptime = cur->exptime;
        it->marks =
            (uint8_t)(STORE_MARK_STALE | (cur->marks & STORE_MARK_WON));
    } else {
        it->exptime = stored_exptime(w->exptime, &t);
    }
    if (commit_local(s, sp, it, &t, w->new_cas, &note, cas_out) == APPLY_STALE)
        rc = STORE_NOT_STORED;
    pthread_mutex_unlock(&sp->lock);
    notify(s, note, true);
    if (concat)
        trim(s);
    return rc;
}

/*
 * Why a key that is not live misses (store_get_ex's *why): the value it
 * holds is flushed or expired; 0 when it holds none (missing, tombstone).
 */
static int miss_reason(store *s, const store_item *it, const tnow *t)
{
    if (it == NULL || it->kind != STORE_KIND_VALUE)
        return 0;
    return item_flushed(s, it, t) ? STORE_MISS_FLUSHED : STORE_MISS_EXPIRED;
}

store_item *store_get_ex(store *s, const char *key, size_t nkey, int *why)
{
    store_item *it;
    struct stripe *sp;
    uint64_t h;
    int miss = 0;
    tnow t;

    if (why)
        *why = 0;
    if (s == NULL || !key_ok(key, nkey))
        return NULL;
    h = key_hash(s->seed, key, nkey);
    sp = stripe_of(s, h);
    pthread_mutex_lock(&sp->lock);
    tnow_get(s, &t);
    it = *stripe_slot(sp, h, key, nkey);
    if (it != NULL && item_live(s, it, &t)) {
        store_item_ref(it);
        item_access(s, it, &t);
    } else {
        miss = miss_reason(s, it, &t);
        it = NULL;
    }
    pthread_mutex_unlock(&sp->lock);
    if (why)
        *why = miss;
    return it;
}

store_item *store_get(store *s, const char *key, size_t nkey)
{
    return store_get_ex(s, key, nkey, NULL);
}

/*
 * A new unlinked item for cur's key with cur's flags, expiry and marks, and
 * its value (or an empty one), that inherits the key's access history (as
 * a read when is_read). The caller holds the stripe lock and adjusts it
 * before commit_local. NULL when out of memory.
 */
static store_item *item_derive(store *s, const store_item *cur,
                               bool keep_value, bool is_read, const tnow *t)
{
    size_t nvalue = keep_value ? cur->nvalue : 0;
    store_item *it = item_new(s, STORE_KIND_VALUE, cur->data, cur->nkey,
                              cur->khash, nvalue);
    if (it == NULL)
        return NULL;
    if (nvalue)
        memcpy(item_value_ptr(it), cur->data + cur->nkey, nvalue);
    it->flags = cur->flags;
    it->exptime = cur->exptime;
    it->marks = cur->marks;
    uint8_t fetched = atomic_load_explicit(&cur->fbits, RELAXED) & FETCHED;
    uint32_t atime = atomic_load_explicit(&cur->atime, RELAXED);
    atomic_init(&it->fbits,
                (uint8_t)(is_read ? FETCHED | (fetched << 1) : fetched));
    atomic_init(&it->prev_atime, atime);
    atomic_init(&it->atime, (uint32_t)t->s);
    return it;
}

/*
 * Replaces a live key by a copy with a new expiry (touch and gat). Returns
 * the new item with a reference for the caller when want_item, NULL when
 * the key is not live (*rc = STORE_NOT_FOUND) or on error (*rc < 0).
 */
static store_item *retouch(store *s, const char *key, size_t nkey,
                           int64_t exptime, bool is_read, int *rc, int *why)
{
    store_item *cur, *it, *note = NULL, *ret = NULL;
    struct stripe *sp;
    uint64_t h;
    tnow t;

    *rc = STORE_ERR_INVAL;
    if (why)
        *why = 0;
    if (s == NULL || !key_ok(key, nkey))
        return NULL;
    h = key_hash(s->seed, key, nkey);
    sp = stripe_of(s, h);
    pthread_mutex_lock(&sp->lock);
    tnow_get(s, &t);
    cur = *stripe_slot(sp, h, key, nkey);
    if (cur == NULL || !item_live(s, cur, &t)) {
        if (why)
            *why = miss_reason(s, cur, &t);
        pthread_mutex_unlock(&sp->lock);
        *rc = STORE_NOT_FOUND;
        return NULL;
    }
    it = item_derive(s, cur, true, is_read, &t);
    if (it == NULL) {
        pthread_mutex_unlock(&sp->lock);
        *rc = STORE_ERR_NOMEM;
        return NULL;
    }
    it->exptime = stored_exptime(exptime, &t);
    int r = commit_local(s, sp, it, &t, cur->cas, &note, NULL);
    if (r == APPLY_STALE) {
        *rc = STORE_NOT_FOUND;
    } else {
        *rc = STORE_OK;
        if (is_read) {
            store_item_ref(it);
            ret = it;
        }
    }
    pthread_mutex_unlock(&sp->lock);
    notify(s, note, true);
    trim(s);
    return ret;
}

store_item *store_gat(store *s, const char *key, size_t nkey, int64_t exptime)
{
    return store_gat_ex(s, key, nkey, exptime, NULL);
}

store_item *store_gat_ex(store *s, const char *key, size_t nkey,
                         int64_t exptime, int *why)
{
    int rc;
    return retouch(s, key, nkey, exptime, true, &rc, why);
}

int store_touch(store *s, const char *key, size_t nkey, int64_t exptime)
{
    return store_touch_ex(s, key, nkey, exptime, NULL);
}

int store_touch_ex(store *s, const char *key, size_t nkey, int64_t exptime,
                   int *why)
{
    int rc;
    retouch(s, key, nkey, exptime, false, &rc, why);
    return rc;
}

int store_delete(store *s, const char *key, size_t nkey, uint64_t cas)
{
    store_item *cur, *it, *note = NULL;
    struct stripe *sp;
    uint64_t h;
    int rc = STORE_DELETED;
    tnow t;

    if (s == NULL || !key_ok(key, nkey))
        return STORE_ERR_INVAL;
    h = key_hash(s->seed, key, nkey);
    /* Allocated before the lock: a tombstone is never larger than what it
     * replaces, so it needs no room check. */
    it = item_new(s, STORE_KIND_TOMBSTONE, key, nkey, h, 0);
    if (it == NULL)
        return STORE_ERR_NOMEM;
    sp = stripe_of(s, h);
    pthread_mutex_lock(&sp->lock);
    tnow_get(s, &t);
    cur = *stripe_slot(sp, h, key, nkey);
    if (cur == NULL || !item_live(s, cur, &t))
        rc = STORE_NOT_FOUND;
    else if (cas != 0 && cur->cas != cas)
        rc = STORE_EXISTS;
    if (rc != STORE_DELETED) {
        pthread_mutex_unlock(&sp->lock);
        store_item_release(it);
        return rc;
    }
    it->exptime = t.s;
    if (commit_local(s, sp, it, &t, 0, &note, NULL) == APPLY_STALE)
        rc = STORE_NOT_FOUND;
    pthread_mutex_unlock(&sp->lock);
    notify(s, note, true);
    return rc;
}

int store_delete_ex(store *s, const store_delete_req *r)
{
    store_item *cur, *it = NULL, *note = NULL;
    struct stripe *sp;
    uint64_t h, keep_cas;
    int rc;
    tnow t;

    if (s == NULL || r == NULL || !key_ok(r->key, r->nkey))
        return STORE_ERR_INVAL;
    if (!r->invalidate && !r->clear_value)
        return store_delete(s, r->key, r->nkey, r->cas);
    h = key_hash(s->seed, r->key, r->nkey);
    sp = stripe_of(s, h);
    pthread_mutex_lock(&sp->lock);
    tnow_get(s, &t);
    cur = *stripe_slot(sp, h, r->key, r->nkey);
    if (cur == NULL || !item_live(s, cur, &t))
        rc = STORE_NOT_FOUND;
    else if (r->cas != 0 && cur->cas != r->cas)
        rc = STORE_EXISTS;
    else if ((it = item_derive(s, cur, !r->clear_value, false, &t)) == NULL)
        rc = STORE_ERR_NOMEM;
    else
        rc = STORE_DELETED;
    if (rc != STORE_DELETED) {
        pthread_mutex_unlock(&sp->lock);
        return rc;
    }
    keep_cas = r->new_cas != 0 ? r->new_cas : cur->cas;
    if (r->clear_value) {
        it->flags = 0;
        it->exptime = 0;
        it->marks = 0;
    }
    if (r->set_ttl)
        it->exptime = stored_exptime(r->exptime, &t);
    if (r->invalidate) {
        it->marks = STORE_MARK_STALE; /* and the next reader may win */
        keep_cas = r->new_cas;        /* 0: a fresh one */
    }
    if (commit_local(s, sp, it, &t, keep_cas, &note, NULL) == APPLY_STALE)
        rc = STORE_NOT_FOUND;
    pthread_mutex_unlock(&sp->lock);
    notify(s, note, true);
    trim(s);
    return rc;
}

int store_take_win(store *s, const store_item *seen)
{
    store_item *cur, *it, *note = NULL;
    struct stripe *sp;
    int rc = STORE_NOT_STORED;
    tnow t;

    if (s == NULL || seen == NULL || seen->kind != STORE_KIND_VALUE)
        return STORE_ERR_INVAL;
    sp = stripe_of(s, seen->khash);
    pthread_mutex_lock(&sp->lock);
    tnow_get(s, &t);
    cur = *stripe_slot(sp, seen->khash, seen->data, seen->nkey);
    if (cur == seen && item_live(s, cur, &t) &&
        (cur->marks & STORE_MARK_WON) == 0) {
        it = item_derive(s, cur, true, false, &t);
        if (it == NULL) {
            rc = STORE_ERR_NOMEM;
        } else {
            it->marks |= STORE_MARK_WON;
            if (commit_local(s, sp, it, &t, cur->cas, &note, NULL) !=
                APPLY_STALE)
                rc = STORE_STORED;
        }
    }
    pthread_mutex_unlock(&sp->lock);
    notify(s, note, true);
    trim(s);
    return rc;
}

/*
 * Parses a stored value as memcached does: optional leading white space,
 * decimal digits that fit in 64 bits, then the end or white space.
 */
static bool parse_u64(const char *p, size_t n, uint64_t *out)
{
    size_t i = 0, start;
    uint64_t v = 0;

    while (i < n && (p[i] == ' ' || (p[i] >= '\t' && p[i] <= '\r')))
        i++;
    if (i < n && p[i] == '+')
        i++;
    start = i;
    for (; i < n && p[i] >= '0' && p[i] <= '9'; i++) {
        uint64_t d = (uint64_t)(p[i] - '0');
        if (v > (UINT64_MAX - d) / 10)
            return false;
        v = v * 10 + d;
    }
    if (i == start)
        return false;
    if (i < n && !(p[i] == ' ' || (p[i] >= '\t' && p[i] <= '\r')))
        return false;
    *out = v;
    return true;
}

static size_t format_u64(uint64_t v, char *buf)
{
    char tmp[24];
    size_t n = 0, i;

    do {
        tmp[n++] = (char)('0' + v % 10);
        v /= 10;
    } while (v != 0);
    for (i = 0; i < n; i++)
        buf[i] = tmp[n - 1 - i];
    return n;
}

int store_arith(store *s, const store_arith_req *r, uint64_t *value,
                uint64_t *cas_out)
{
    store_item *cur, *it, *note = NULL;
    struct stripe *sp;
    char digits[24];
    size_t nd, len;
    uint64_t h, v;
    int rc;
    tnow t;

    if (s == NULL || r == NULL || !key_ok(r->key, r->nkey))
        return STORE_ERR_INVAL;
    rc = ensure_room(s, item_total(r->nkey, 20));
    if (rc < 0)
        return rc;
    h = key_hash(s->seed, r->key, r->nkey);
    sp = stripe_of(s, h);
    pthread_mutex_lock(&sp->lock);
    tnow_get(s, &t);
    cur = *stripe_slot(sp, h, r->key, r->nkey);
    if (cur != NULL && !item_live(s, cur, &t))
        cur = NULL;

    if (cur == NULL) {
        if (!r->vivify) {
            pthread_mutex_unlock(&sp->lock);
            return STORE_NOT_FOUND;
        }
        v = r->initial;
        nd = format_u64(v, digits);
        len = nd;
        rc = STORE_STORED;
    } else {
        /* memcached's order: empty value, then cas, then the number. */
        if (cur->nvalue == 0) {
            pthread_mutex_unlock(&sp->lock);
            return STORE_NON_NUMERIC;
        }
        if (r->cas != 0 && cur->cas != r->cas) {
            pthread_mutex_unlock(&sp->lock);
            return STORE_EXISTS;
        }
        if (!parse_u64(cur->data + cur->nkey, cur->nvalue, &v)) {
            pthread_mutex_unlock(&sp->lock);
            return STORE_NON_NUMERIC;
        }
        if (r->incr)
            v += r->delta; /* wraps at 2^64, as memcached */
        else
            v = r->delta > v ? 0 : v - r->delta;
        nd = format_u64(v, digits);
        /* memcached rewrites a number that got no longer in place, padded
         * with spaces to the old length; keep that observable length. */
        len = nd <= cur->nvalue ? cur->nvalue : nd;
        rc = STORE_OK;
    }
    it = item_new(s, STORE_KIND_VALUE, r->key, r->nkey, h, len);
    if (it == NULL) {
        pthread_mutex_unlock(&sp->lock);
        return STORE_ERR_NOMEM;
    }
    memcpy(item_value_ptr(it), digits, nd);
    if (len > nd)
        memset(item_value_ptr(it) + nd, ' ', len - nd);
    if (cur != NULL)
        it->flags = cur->flags;
    /* One mutation for the number and, with touch, the new expiry. */
    if (r->touch)
        it->exptime = stored_exptime(r->touch_exptime, &t);
    else if (cur != NULL)
        it->exptime = cur->exptime;
    else
        it->exptime = stored_exptime(r->exptime, &t);
    if (commit_local(s, sp, it, &t, r->new_cas, &note, cas_out) == APPLY_STALE)
        rc = STORE_NOT_FOUND;
    else if (value)
        *value = v;
    pthread_mutex_unlock(&sp->lock);
    notify(s, note, true);
    trim(s);
    return rc;
}

int store_flush_all(store *s, uint32_t delay)
{
    store_item *it, *note = NULL;
    struct stripe *sp;
    uint64_t h;
    int r;
    tnow t;

    if (s == NULL)
        return STORE_ERR_INVAL;
    h = key_hash(s->seed, "", 0);
    it = item_new(s, STORE_KIND_FLUSH, "", 0, h, 0);
    if (it == NULL)
        return STORE_ERR_NOMEM;
    sp = stripe_of(s, h);
    pthread_mutex_lock(&sp->lock);
    tnow_get(s, &t);
    riblt_id id = new_id();
    item_set_id(it, &id);
    it->ticks = clock_next(s, t.ns);
    it->node = s->opt.node_id;
    it->flush_at = it->ticks + (uint64_t)delay * NS_PER_S;
    /* The flush must see itself as in effect when it is immediate. */
    if (it->ticks > t.peek)
        t.peek = it->ticks;
    atomic_init(&it->atime, (uint32_t)t.s);
    r = do_store_apply(s, sp, it, &t);
    if (r == APPLY_LINKED && s->listener != NULL) {
        store_item_ref(it);
        note = it;
    } else if (r != APPLY_LINKED) {
        store_item_release(it);
    }
    pthread_mutex_unlock(&sp->lock);
    notify(s, note, true);
    return r == APPLY_LINKED ? STORE_OK : STORE_ERR_INVAL;
}

/* ======================================================= replication */

static bool mutation_ok(const store_mutation *m)
{
    if (m->id.lo == 0 && m->id.hi == 0)
        return false;
    if (m->version.ticks == 0 || m->version.ticks > TICKS_MAX)
        return false;
    if (m->nvalue != 0 && m->value == NULL)
        return false;
    if (m->nvalue > UINT32_MAX)
        return false;
    if (m->marks != 0 &&
        (m->kind != STORE_KIND_VALUE || (m->marks & ~STORE_MARKS_ALL) != 0))
        return false;
    switch (m->kind) {
    case STORE_KIND_VALUE:
        return key_ok(m->key, m->nkey) && m->cas != 0;
    case STORE_KIND_TOMBSTONE:
        return key_ok(m->key, m->nkey) && m->nvalue == 0;
    case STORE_KIND_FLUSH:
        return m->nkey == 0 && m->nvalue == 0 && m->flush_at != 0;
    default:
        return false;
    }
}

int store_apply(store *s, const store_mutation *m)
{
    store_item *it, *note = NULL;
    const char *key;
    struct stripe *sp;
    uint64_t h;
    int r;
    tnow t;

    if (s == NULL || m == NULL || !mutation_ok(m))
        return STORE_ERR_INVAL;
    if (item_total(m->nkey, m->nvalue) > s->opt.item_size_max)
        return STORE_ERR_TOO_LARGE;
    clock_catch_up(s, m->version.ticks);
    key = m->nkey ? m->key : "";
    h = key_hash(s->seed, key, m->nkey);
    sp = stripe_of(s, h);
    if (s->opt.memory_limit != 0) {
        /*
         * A mutation the key already beats must not evict anything to make
         * room for itself. This early look only saves that; the decision
         * is do_store_apply's, under the lock, below.
         */
        pthread_mutex_lock(&sp->lock);
        store_item *cur = *stripe_slot(sp, h, key, m->nkey);
        store_version cv = cur != NULL ? item_version(cur) : m->version;
        bool beaten = cur != NULL && store_version_cmp(&m->version, &cv) <= 0;
        pthread_mutex_unlock(&sp->lock);
        if (beaten) {
            COUNT_ADD(s, stale_remote, 1);
            return STORE_STALE;
        }
        r = ensure_room(s, item_total(m->nkey, m->nvalue));
        if (r < 0)
            return r;
    }
    it = item_new(s, m->kind, key, m->nkey, h, m->nvalue);
    if (it == NULL)
        return STORE_ERR_NOMEM;
    if (m->nvalue)
        memcpy(item_value_ptr(it), m->value, m->nvalue);
    item_set_id(it, &m->id);
    it->ticks = m->version.ticks;
    it->node = m->version.node;
    it->flags = m->kind == STORE_KIND_FLUSH ? 0 : m->flags;
    it->exptime = m->kind == STORE_KIND_FLUSH ? 0 : m->exptime;
    it->marks = m->marks;
    /* The cas comes with the mutation: the same on every node. */
    if (m->kind == STORE_KIND_FLUSH)
        it->flush_at = m->flush_at;
    else
        it->cas = m->cas;

    pthread_mutex_lock(&sp->lock);
    tnow_get(s, &t);
    atomic_init(&it->atime, (uint32_t)t.s);
    r = do_store_apply(s, sp, it, &t);
    if (r == APPLY_LINKED && s->listener != NULL) {
        store_item_ref(it);
        note = it;
    }
    pthread_mutex_unlock(&sp->lock);
    if (r != APPLY_LINKED) {
        store_item_release(it);
        COUNT_ADD(s, stale_remote, 1);
        return STORE_STALE;
    }
    COUNT_ADD(s, applied_remote, 1);
    notify(s, note, false);
    return STORE_OK;
}

store_item *store_fetch(store *s, const riblt_id *id)
{
    store_item *it;

    if (s == NULL || id == NULL)
        return NULL;
    pthread_mutex_lock(&s->set_lock);
    it = journal_find(s, id);
    if (it != NULL)
        store_item_ref(it);
    pthread_mutex_unlock(&s->set_lock);
    return it;
}

bool store_has(store *s, const riblt_id *id)
{
    bool found;

    if (s == NULL || id == NULL)
        return false;
    pthread_mutex_lock(&s->set_lock);
    found = journal_find(s, id) != NULL;
    pthread_mutex_unlock(&s->set_lock);
    return found;
}

size_t store_sketch_symbols(const store *s)
{
    return s->sk_symbols;
}

/* ======================================================== partitions */

/*
 * Symbols a sketch read sums under one hold of the set lock before it lets
 * writers in (512 KiB of cells, tens of microseconds).
 */
#define READ_HOLD_SYMBOLS 16384

uint32_t store_partitions(const store *s)
{
    return s->opt.partitions;
}

uint32_t store_key_partition(const store *s, const char *key, size_t nkey)
{
    if (nkey != 0 && key == NULL)
        return 0;
    return key_part(s, key, nkey);
}

uint32_t store_item_partition(const store_item *it)
{
    return it->part;
}

/*
 * The set of listed partitions as a bitmap of s->nparts bits (calloc'd, the
 * caller frees it) in *out. STORE_ERR_INVAL when a partition is out of range
 * or parts is NULL with nparts > 0, STORE_ERR_NOMEM.
 */
static int parts_bitmap(const store *s, const uint32_t *parts, size_t nparts,
                        uint64_t **out)
{
    uint64_t *bits;

    *out = NULL;
    if (parts == NULL && nparts != 0)
        return STORE_ERR_INVAL;
    bits = calloc((s->nparts + 63) / 64, sizeof(*bits));
    if (bits == NULL)
        return STORE_ERR_NOMEM;
    for (size_t i = 0; i < nparts; i++) {
        if (parts[i] >= s->nparts) {
            free(bits);
            return STORE_ERR_INVAL;
        }
        bits[parts[i] / 64] |= 1ULL << (parts[i] % 64);
    }
    *out = bits;
    return STORE_OK;
}

static inline bool bit_has(const uint64_t *bits, uint32_t p)
{
    return (bits[p / 64] >> (p % 64)) & 1;
}

/* out += in, n symbols (XOR of sums and hashes, counts added). */
static void symbols_add(riblt_symbol *restrict out,
                        const riblt_symbol *restrict in, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        out[i].sum.lo ^= in[i].sum.lo;
        out[i].sum.hi ^= in[i].sum.hi;
        out[i].hash ^= in[i].hash;
        out[i].count += in[i].count;
    }
}

/*
 * Sums the marked partitions' sketches. Each partition is read whole under
 * the set lock; a write changes one partition's sketch only, so the lock
 * may be let go between two partitions without any write being half
 * included, and is, every READ_HOLD_SYMBOLS symbols.
 */
static void sum_parts(store *s, const uint64_t *bits, size_t offset,
                      riblt_symbol *out, size_t n, int64_t *set_size)
{
    int64_t total = 0;
    size_t held = 0;

    memset(out, 0, n * sizeof(*out));
    pthread_mutex_lock(&s->set_lock);
    for (uint32_t p = 0; p < s->nparts; p++) {
        if (!bit_has(bits, p))
            continue;
        if (held >= READ_HOLD_SYMBOLS) {
            pthread_mutex_unlock(&s->set_lock);
            pthread_mutex_lock(&s->set_lock);
            held = 0;
        }
        if (n != 0)
            symbols_add(out, riblt_sketch_cells(s->parts[p].sk) + offset, n);
        total += (int64_t)s->parts[p].mutations;
        held += n + 1;
    }
    pthread_mutex_unlock(&s->set_lock);
    if (set_size)
        *set_size = total;
}

int store_sketch_read_parts(store *s, const uint32_t *parts, size_t nparts,
                            size_t offset, riblt_symbol *out, size_t n,
                            int64_t *set_size)
{
    uint64_t *bits;
    int r;

    if (s == NULL || (out == NULL && n != 0) || offset > s->sk_symbols ||
        n > s->sk_symbols - offset)
        return STORE_ERR_INVAL;
    r = parts_bitmap(s, parts, nparts, &bits);
    if (r < 0)
        return r;
    sum_parts(s, bits, offset, out, n, set_size);
    free(bits);
    return STORE_OK;
}

int store_sketch_read(store *s, size_t offset, riblt_symbol *out, size_t n,
                      int64_t *set_size)
{
    int r;

    if (s == NULL || (out == NULL && n != 0))
        return STORE_ERR_INVAL;
    if (s->nparts > 1) {
        uint64_t *bits;
        if (offset > s->sk_symbols || n > s->sk_symbols - offset)
            return STORE_ERR_INVAL;
        bits = malloc((s->nparts + 63) / 64 * sizeof(*bits));
        if (bits == NULL)
            return STORE_ERR_NOMEM;
        memset(bits, 0xff, (s->nparts + 63) / 64 * sizeof(*bits));
        sum_parts(s, bits, offset, out, n, set_size);
        free(bits);
        return STORE_OK;
    }
    pthread_mutex_lock(&s->set_lock);
    r = n ? riblt_sketch_read(s->parts[0].sk, offset, out, n) : RIBLT_OK;
    if (set_size)
        *set_size = riblt_sketch_count(s->parts[0].sk);
    pthread_mutex_unlock(&s->set_lock);
    return r == RIBLT_OK ? STORE_OK : STORE_ERR_INVAL;
}

int store_partition_stats(store *s, uint32_t p, uint64_t *mutations,
                          uint64_t *items, uint64_t *bytes)
{
    if (s == NULL || p >= s->nparts)
        return STORE_ERR_INVAL;
    pthread_mutex_lock(&s->set_lock);
    if (mutations)
        *mutations = s->parts[p].mutations;
    if (items)
        *items = s->parts[p].items;
    if (bytes)
        *bytes = s->parts[p].bytes;
    pthread_mutex_unlock(&s->set_lock);
    return STORE_OK;
}

/* =========================================================== journal walks */

/* One snapshot entry of a journal walk. */
struct jent {
    riblt_id id;
    uint64_t tail;
};

/*
 * Ids in the journal (caller holds set_lock) of the partitions marked in
 * bits (NULL: all): their number, which bounds a snapshot of them.
 */
static uint64_t journal_count(store *s, const uint64_t *bits)
{
    uint64_t n = 0;

    if (bits == NULL)
        return s->jcount;
    for (uint32_t p = 0; p < s->nparts; p++)
        if (bit_has(bits, p))
            n += s->parts[p].mutations;
    return n;
}

/*
 * Snapshot of the journal's ids (with their tails when tails is set) in
 * the partitions marked in bits (NULL: all), taken under the set lock into
 * *out (the caller frees it). Returns the number of entries; 0 with *out
 * NULL when the snapshot cannot be allocated.
 */
static size_t journal_snapshot(store *s, const uint64_t *bits, bool tails,
                               void **out)
{
    size_t n = 0, esz = tails ? sizeof(struct jent) : sizeof(riblt_id);
    void *v;

    pthread_mutex_lock(&s->set_lock);
    uint64_t want = journal_count(s, bits);
    /* One spare entry: the filtered walk writes every item, then keeps it
     * or not (no branch to mispredict, so chain loads overlap). */
    size_t bytes = (want + 1) * esz;
    if (tails) {
        /* Tens of megabytes at a million keys: ask for huge pages, faulting
         * them in 4 KiB at a time would cost more than the copy. */
        if (posix_memalign(&v, 2u << 20, bytes) != 0)
            v = NULL;
        else
            madvise(v, bytes, MADV_HUGEPAGE);
    } else {
        v = malloc(bytes);
    }
    if (v != NULL && want != 0) {
        struct jent *te = v;
        riblt_id *ie = v;
        for (uint64_t b = 0; b <= s->jmask; b++) {
            for (store_item *it = s->jbuckets[b]; it; it = it->jnext) {
                size_t keep = bits == NULL || bit_has(bits, it->part);
                if (tails) {
                    te[n].id = it->id;
                    te[n].tail = it->tail;
                } else {
                    ie[n] = it->id;
                }
                n += keep;
            }
        }
    }
    pthread_mutex_unlock(&s->set_lock);
    *out = v;
    return n;
}

/* Hands a tails snapshot to fn (no lock held) and frees it. */
static size_t give_tails(struct jent *v, size_t n, store_tail_fn fn, void *arg)
{
    for (size_t i = 0; i < n; i++) {
        riblt_tail t = {v[i].tail >> 8, (uint32_t)(v[i].tail & 0xff)};
        fn(arg, &v[i].id, &t);
    }
    free(v);
    return n;
}

/* Hands an ids snapshot to fn (no lock held) and frees it. */
static size_t give_ids(riblt_id *v, size_t n, store_id_fn fn, void *arg)
{
    for (size_t i = 0; i < n; i++)
        fn(arg, &v[i]);
    free(v);
    return n;
}

/*
 * Snapshot of the journal's ids with their tails (see store_journal_tails),
 * taken under the set lock, then handed to fn with no lock held.
 */
size_t store_journal_tails(store *s, store_tail_fn fn, void *arg)
{
    void *v;
    size_t n;

    if (s == NULL || fn == NULL)
        return 0;
    n = journal_snapshot(s, NULL, true, &v);
    return give_tails(v, n, fn, arg);
}

/*
 * Snapshot of the journal's ids, taken under the set lock, then handed to
 * fn with no lock held (fn may call into the store). Returns 0 without
 * calling fn when the snapshot cannot be allocated.
 */
size_t store_journal_ids(store *s, store_id_fn fn, void *arg)
{
    void *v;
    size_t n;

    if (s == NULL || fn == NULL)
        return 0;
    n = journal_snapshot(s, NULL, false, &v);
    return give_ids(v, n, fn, arg);
}

size_t store_journal_tails_parts(store *s, const uint32_t *parts,
                                 size_t nparts, store_tail_fn fn, void *arg)
{
    uint64_t *bits;
    void *v;
    size_t n;

    if (s == NULL || fn == NULL || parts_bitmap(s, parts, nparts, &bits) < 0)
        return 0;
    n = journal_snapshot(s, bits, true, &v);
    free(bits);
    return give_tails(v, n, fn, arg);
}

size_t store_journal_ids_parts(store *s, const uint32_t *parts, size_t nparts,
                               store_id_fn fn, void *arg)
{
    uint64_t *bits;
    void *v;
    size_t n;

    if (s == NULL || fn == NULL || parts_bitmap(s, parts, nparts, &bits) < 0)
        return 0;
    n = journal_snapshot(s, bits, false, &v);
    free(bits);
    return give_ids(v, n, fn, arg);
}

/* ======================================================= maintenance */

/*
 * Walks the key table from where the previous call stopped, removing dead
 * items, until it removed `budget` of them, visited about 8 * budget + 256
 * buckets, or came round once. One stripe lock at a time; concurrent
 * sweeps take turns.
 */
size_t store_sweep(store *s, size_t budget)
{
    size_t removed = 0, visits = 0, cap, stripes_left;

    if (s == NULL || budget == 0)
        return 0;
    cap = budget > (SIZE_MAX - 256) / 8 ? SIZE_MAX : budget * 8 + 256;
    pthread_mutex_lock(&s->sweep_lock);
    stripes_left = s->nstripes + 1;
    while (stripes_left > 0 && removed < budget && visits < cap) {
        struct stripe *sp = &s->stripes[s->sweep_stripe];
        tnow t;

        pthread_mutex_lock(&sp->lock);
        tnow_get(s, &t);
        while (s->sweep_bucket <= sp->mask && removed < budget &&
               visits < cap) {
            store_item **pp = &sp->buckets[s->sweep_bucket];
            while (*pp != NULL && removed < budget) {
                store_item *it = *pp;
                visits++;
                if (!item_dead(s, it, &t)) {
                    pp = &it->hnext;
                    continue;
                }
                if (it->kind == STORE_KIND_VALUE) {
                    COUNT_ADD(s, reclaimed, 1);
                    if (!(atomic_load_explicit(&it->fbits, RELAXED) & FETCHED))
                        COUNT_ADD(s, expired_unfetched, 1);
                }
                do_unlink(s, sp, pp);
                removed++;
            }
            if (*pp != NULL)
                break; /* budget spent mid-chain: resume at this bucket */
            visits++;
            s->sweep_bucket++;
        }
        if (s->sweep_bucket > sp->mask) {
            s->sweep_bucket = 0;
            s->sweep_stripe = (s->sweep_stripe + 1) & (s->nstripes - 1);
            stripes_left--;
        }
        pthread_mutex_unlock(&sp->lock);
    }
    pthread_mutex_unlock(&s->sweep_lock);
    COUNT_ADD(s, swept, removed);
    return removed;
}

/*
 * Mutations of the marked partitions that drop may take: all of them but a
 * held flush, which is never dropped (caller holds set_lock).
 */
static uint64_t droppable(store *s, const uint64_t *bits)
{
    uint64_t n = journal_count(s, bits);
    uint32_t g = s->opt.partitions; /* the flush's partition */

    if (n != 0 && bit_has(bits, g) &&
        atomic_load_explicit(&s->flush_at, memory_order_acquire) != 0)
        n--;
    return n;
}

/*
 * Walks the key table from the drop cursor, one stripe lock at a time,
 * unlinking every non-flush item of the marked partitions (do_unlink: key
 * table, journal, sketch, LRU, accounting; no tombstone, no listener),
 * until budget went, the partitions' count says none is left, the walk
 * came round once, or it visited DROP_VISITS(budget) entries and removed
 * at least one (so that 0 still means none is left).
 */
#define DROP_VISITS(b)                                                        \
    ((b) > (SIZE_MAX - 16384) / 8 ? SIZE_MAX : (b)*8 + 16384)

size_t store_drop_partitions(store *s, const uint32_t *parts, size_t nparts,
                             size_t budget)
{
    size_t removed = 0, visits = 0, stripes_left, cap = DROP_VISITS(budget);
    uint64_t *bits, left;

    if (s == NULL || budget == 0 || parts_bitmap(s, parts, nparts, &bits) < 0)
        return 0;
#define DROP_MORE                                                             \
    (removed < budget && left > 0 && (visits < cap || removed == 0))
    pthread_mutex_lock(&s->sweep_lock);
    pthread_mutex_lock(&s->set_lock);
    left = droppable(s, bits);
    pthread_mutex_unlock(&s->set_lock);
    stripes_left = left ? s->nstripes + 1 : 0;
    while (stripes_left > 0 && DROP_MORE) {
        struct stripe *sp = &s->stripes[s->drop_stripe];

        pthread_mutex_lock(&sp->lock);
        while (s->drop_bucket <= sp->mask && DROP_MORE) {
            store_item **pp = &sp->buckets[s->drop_bucket];
            while (*pp != NULL && DROP_MORE) {
                store_item *it = *pp;
                visits++;
                if (it->kind == STORE_KIND_FLUSH || !bit_has(bits, it->part)) {
                    pp = &it->hnext;
                    continue;
                }
                do_unlink(s, sp, pp);
                removed++;
                if (left > 0) /* writes may have added to the count */
                    left--;
            }
            if (*pp != NULL)
                break; /* stopped mid-chain: resume at this bucket */
            visits++;
            s->drop_bucket++;
        }
        if (s->drop_bucket > sp->mask) {
            s->drop_bucket = 0;
            s->drop_stripe = (s->drop_stripe + 1) & (s->nstripes - 1);
            stripes_left--;
        }
        pthread_mutex_unlock(&sp->lock);
    }
#undef DROP_MORE
    pthread_mutex_unlock(&s->sweep_lock);
    free(bits);
    COUNT_ADD(s, dropped, removed);
    return removed;
}

/* ============================================================= stats */

void store_get_stats(store *s, store_stats *out)
{
    uint64_t nb = atomic_load(&s->nbuckets), level = 0;

    memset(out, 0, sizeof(*out));
    while (nb > 1) {
        nb >>= 1;
        level++;
    }
    out->curr_items = atomic_load_explicit(&s->curr_items, RELAXED);
    out->total_items = atomic_load_explicit(&s->total_items, RELAXED);
    out->bytes = atomic_load_explicit(&s->bytes, RELAXED);
    out->limit_maxbytes = s->opt.memory_limit;
    out->evictions = atomic_load_explicit(&s->evictions, RELAXED);
    out->expired_unfetched =
        atomic_load_explicit(&s->expired_unfetched, RELAXED);
    out->evicted_unfetched =
        atomic_load_explicit(&s->evicted_unfetched, RELAXED);
    out->reclaimed = atomic_load_explicit(&s->reclaimed, RELAXED);
    pthread_mutex_lock(&s->set_lock);
    out->mutations = s->jcount;
    pthread_mutex_unlock(&s->set_lock);
    out->tombstones = atomic_load_explicit(&s->tombstones, RELAXED);
    out->applied_remote = atomic_load_explicit(&s->applied_remote, RELAXED);
    out->stale_remote = atomic_load_explicit(&s->stale_remote, RELAXED);
    out->swept = atomic_load_explicit(&s->swept, RELAXED);
    out->dropped = atomic_load_explicit(&s->dropped, RELAXED);
    out->hash_power_level = level;
    out->sketch_symbols = s->sk_symbols;
    out->clock_ticks = atomic_load(&s->clock_last);
}

store_version store_clock_now(store *s)
{
    tnow t;
    store_version v;

    tnow_get(s, &t);
    v.ticks = t.peek;
    v.node = s->opt.node_id;
    return v;
}
