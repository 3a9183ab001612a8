/*
 * store.c -- the versioned mutation store: key table, R-IBLT sketch, the
 * records evicted values leave, eviction clock, memory limit, expiry and
 * sweep.
 *
 * Contract of this implementation (store.h states the interface):
 *
 * Data structures.
 *   - An item is one allocation: a 35-byte header, key, value, and a
 *     trailer of the fields it needs (see struct store_item for what the
 *     header leaves out and why). Its key, value,
 *     version, kind, flags and expiry never change after it is published;
 *     only bookkeeping (chain link, access time, bits) does, under the
 *     locks below or through atomics. It carries an atomic reference count;
 *     the key table owns one reference while the item is linked, and every
 *     store_item * handed out owns one more.
 *   - Ids. A mutation's id is a function of key and version (make_id): the
 *     high word is the key's cluster-wide SipHash (gid), the low word mixes
 *     in the version. So every node names a mutation alike without storing
 *     its id, and the key table, whose buckets come from the gid (through a
 *     per-store secret mix), finds a mutation by id as well as by key.
 *   - The key table is split into 2^min(hash_power, 12) stripes. A key's
 *     bucket hash picks its stripe (low bits) and its bucket inside the
 *     stripe (high bits). Each stripe is its own chained hash table under
 *     its own mutex and grows on its own (doubling) when it holds more than
 *     2 entries per bucket (so the table costs 4 to 8 bytes an item, all
 *     counted in the memory limit; a lookup visits 1.5 to 2 items on
 *     average): growth pauses that one stripe only, for a
 *     time proportional to its size (1/4096 of the table).
 *   - The set. The items linked in the key table, plus the keyless records
 *     (below), are the set nodes reconcile. The sketches and the set's
 *     counters sit under one "set lock", so a set change is atomic for
 *     them, and store_sketch_read copies a slice that matches some state
 *     of the set. store_journal_ids walks the key table one stripe at a
 *     time, then the records.
 *   - Partitions. An item's partition is its key's (0 when unpartitioned),
 *     computed when needed (item_part: once as a mutation enters the set,
 *     once as it leaves, and by walks that filter by partition); every
 *     record carries its key's. There is one sketch per partition (P + 1
 *     in partitioned mode, the last one the global partition of the empty
 *     key, one when unpartitioned) with the partition's counters
 *     (mutations, values, bytes), all under the set lock, so every partition's
 * sketch is the sketch of its mutations. A key's partition is a function of
 * the key, so every set change touches one partition: a read summing several
 *     sketches may therefore let the set lock go between two partitions
 *     (it does every READ_HOLD_SYMBOLS symbols) and still include no write
 *     by half. Walks by partition filter with a bitmap; drop walks the key
 *     table from its own cursor, like sweep.
 *   - Eviction is a clock over the key table (see "eviction clock"): a
 *     REF bit per item instead of LRU links.
 *
 * Lock order. (sweep lock | evict lock) -> one stripe lock -> record lock
 * -> set lock. The sweep lock serializes store_sweep and
 * store_drop_partitions, the evict lock the clock's hand. No thread ever
 * holds two stripe locks, and a thread holding the record or set lock takes
 * no stripe lock; so writers that evict (ensure_room runs before the
 * writer's own stripe lock) cannot deadlock. The listener is called with
 * no lock held.
 *
 * One apply. Every change of a key's current mutation goes through
 * do_store_apply (stripe lock held), or do_apply_keyless for the keyless
 * kinds: versions are compared there and only there (strictly greater
 * wins), and there the key's entry (item or record) and the sketch change
 * together. Local writes stamp a fresh version from the hybrid clock under
 * the stripe lock, which is always greater than the held one because the
 * clock has caught up with every version it has seen.
 *
 * CAS. The cas unique is a field of the mutation and travels with it, so
 * it is the same on every node holding that mutation (Invariant 5). A new
 * value (set, add, replace, append, prepend, cas, incr, decr) takes a fresh
 * cas from its id (fresh_cas: half the low word plus one, never zero and
 * below 10^19, which clients format into 20-byte buffers); touch and gat
 * copy the touched item's cas into their new mutation, as memcached keeps
 * an item's cas across touch, so gets / touch / cas succeeds. A delete
 * tombstone takes one from its id likewise. A FLUSH has no cas: its slot
 * holds flush_at.
 *
 * Liveness, death and sweep. An item is *live* (visible to clients) when it
 * is a VALUE, not expired (exptime 0 or > now) and not flushed. An item is
 * *dead* (due to leave the set) when
 *   - a TOMBSTONE: its exptime field, which for tombstones holds the unix
 *     second it was written (its ticks when zero), plus tombstone_grace has
 *     passed;
 *   - a VALUE: the second exptime + tombstone_grace has passed (so a value
 *     that expires, or arrives expired, is a miss for at least the rest
 *     of that second before it goes), or it is flushed;
 *   - a FLUSH: never; a newer flush replaces it.
 * Records die as the mutations they stand for (rec_dead). store_sweep
 * removes dead items and records from key table, record tables and
 * sketch. A
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
 * Eviction is local. When a write needs room under memory_limit (which
 * counts items, the key table's buckets and the records held), the clock
 * evicts a VALUE item. What that leaves depends
 * on whether the node replicates (store_options.evict_record_bytes):
 *   - without a record table (a node without peers): nothing; the value and
 *     its mutation are gone, as in memcached.
 *   - with one: a record of the mutation -- gid, version, expiry and
 *     partition, 32 bytes, no key or value (STORE_KIND_EVICTED) -- takes
 *     the item's place as the key's current mutation. Its id is the
 *     value's, so the set, and so the sketches, do not change: a peer that
 *     kept the value agrees with this node, no round fetches the value
 *     back, and the peer keeps its copy (an eviction deletes nothing
 *     anywhere else). A replayed or older write of the key loses to the
 *     record; any newer write, delete or flush wins over it as over the
 *     value. A peer that lacks the mutation altogether receives the record
 *     (keyless, by id) rather than nothing, so that it agrees too.
 * The record table has a fixed capacity (evict_record_bytes); a record is
 * counted against the limit while it is held, not before. When the table
 * is full, its oldest record goes, and becomes a drop (STORE_KIND_DROP): a
 * keyless mutation one tick newer than the record, in the drops' own table
 * (a sixteenth of the capacity to start with, reserved; it grows to
 * DROP_MAX_ENTRIES at most, counted against the limit). A drop is in the set
 * like any mutation, so push and rounds take it to every peer, where it
 * takes the mutation it names out of the set: a peer holding that value
 * keeps it, readable, as a KEPT item (linked, in no set, evicted without a
 * record), so an eviction never deletes data on another node; only a value
 * older than the one the drop names leaves (do_apply_keyless). A kept
 * value is replaced by any newer write or delete as usual, and its own or
 * an older mutation of its key coming back from a peer that still holds it
 * in its set (once the drop is gone) brings it back into the set. A drop
 * leaves every set DROP_GRACE seconds after it was written. A full drops'
 * table lets its least drop (oldest by creation second) go early, and drops
 * below it at once; a peer may then refill that value once, which a cache may
 * do. Under steady eviction that is the common case: drops are written as fast
 * as values are evicted, far more than a minute's worth fits.
 * Records are not reported to the listener (no push): rounds carry them. A
 * drop is (drop_item), so that peers let the value go while it is young.
 * Tombstones and flushes are never evicted: when only they are left and there
 * is still no room, the write fails with STORE_ERR_NOMEM. Memory is accounted
 * by each item's real allocation size (chunk.c's class, or the general
 * allocator's above CHUNK_MAX) when it is linked and unlinked, by the key
 * table's buckets when a stripe grows, and by EVREC_ENTRY_BYTES a record held;
 * the room check runs before the key's lock is taken, so concurrent writers
 * may overshoot the limit by at most one item each, and writes whose size
 * depends on the held item (append, prepend, incr, touch) trim the store after
 * they complete.
 *
 * Why sets stay equal (Invariant 1). For each key a node holds the newest
 * mutation it has received that is not dead, as an item or a record; ids
 * are functions of key and version, never local to a node. Two nodes that
 * received the same mutations hold the same newest mutation per key
 * whatever the order of arrival and whatever each evicted (a record has
 * its value's id; a kept value is in no set, its drop newer than it in
 * every set that received the drop, whether that node kept the value, had
 * evicted it or never had it), and death depends only on the mutation and
 * the clock, so after both have swept their sets (and sketches, which are
 * a function of the set) are equal. The limits: a mutation that arrives more
 * than the grace late may find its key's tombstone already swept and come
 * back; a drop freed early lets a peer refill its value; and two keys whose
 * 64-bit gids collide share one record slot (a write of one supersedes the
 * other's record).
 */
#define _GNU_SOURCE
#include "store.h"

#include "chunk.h"
#include "evrec.h"

#include <assert.h>
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
/* Seconds a drop (STORE_KIND_DROP) stays in the set (at most the grace). */
#define DROP_GRACE 60
/* The drops' table grows to at most this many entries (176 KiB), or to as
 * many as the records' table has when that is fewer (see rec_put). */
#define DROP_MAX_ENTRIES 4096
/* What a drop's slot costs (the drops' table is an ordered one). */
#define DROP_ENTRY_BYTES EVREC_ORDERED_ENTRY_BYTES
/* Ticks beyond this are refused so that ticks + 1 can never wrap. */
#define TICKS_MAX (UINT64_MAX - (1ULL << 32))
/* Upper bound of evictions one write may cause before giving up. */
#define EVICT_TRIES (1u << 20)
/* The eviction clock's age gate (see gate_note). */
#define GATE_SAMPLES 64
#define GATE_SKIPS_MAX 256
/* Live values a write looks past for an expired one under no_evict. */
#define NO_EVICT_LOOK 64

/* ============================================================== items */

/* Bits of store_item.abits. */
#define FETCHED 1u /* read by a client since written */
#define REF                                                                   \
    2u            /* the eviction clock's second chance: set by a read,       \
                     cleared by the hand as it passes */
#define LINKED 4u /* in the key table; changed under the stripe lock */
#define KEPT                                                                  \
    8u /* linked but out of the set: a drop took the value's mutation out     \
          of every set and the value stays readable here (see "Eviction is    \
          local"); changed under the stripe lock */

/*
 * An item header is 35 bytes, then the key, then the value, then a trailer
 * of the optional fields the item needs (bits XTRA, XEXP, XFLG of km, in
 * that order), in one allocation. The shape is chosen by item_new and
 * never changes. What the header does not hold, and where that comes from
 * instead:
 *   - the mutation id: derived from key and version (item_id), the same
 *     on every node, so no journal maps ids to items: the key table does,
 *     because the id's high word is the key's cluster-wide hash, which
 *     picks the bucket;
 *   - the cas: a new value's is its id's (fresh_cas), computed when asked
 *     (gets, cas, binary responses); only an item whose cas is another one
 *     -- touch and gat keep the touched item's, meta E sets one, a peer
 *     sent one -- has the 8-byte field. So do a FLUSH (its flush_at) and a
 *     DROP (its gid);
 *   - expiry and client flags when they are 0 (most items have no flags,
 *     many no expiry): each has a 4-byte field only when non-zero;
 *   - the partition: a function of the key (item_part), or for a keyless
 *     DROP its flags field;
 *   - the key's hash: recomputed (short chains; a table doubling rehashes
 *     one stripe);
 *   - LRU links: eviction is a clock over the key table (REF bit);
 *   - the store pointer, the accounted size, the encoder's tail: computed
 *     where needed (alloc_size; the encoder walks from each id's start).
 * Times are unix seconds in 32 bits (to 2106); an exptime beyond that is
 * kept as UINT32_MAX.
 */
struct store_item {
    store_item *hnext; /* key table chain; stripe lock */
    uint64_t ticks;    /* the version, flat */
    uint32_t node;
    uint32_t nvalue;
    _Atomic uint32_t atime; /* latest access */
    _Atomic uint32_t refs;
    uint8_t nkey;
    uint8_t km;            /* kind (low 3 bits) | marks << 3 | X* bits */
    _Atomic uint8_t abits; /* FETCHED | REF | LINKED */
    char data[];           /* key, then value */
};

#define ITEM_HDR offsetof(struct store_item, data)
_Static_assert(offsetof(struct store_item, data) == 35,
               "the header stays at 35 bytes");

/*
 * Bits of store_item.km above kind and marks: the fields of the trailer
 * after the value, in this order, each there only when its bit is set.
 */
#define XTRA                                                                  \
    0x80u          /* 8 bytes (item_x): a cas other than the id's, a FLUSH's  \
                      flush_at, a DROP's gid */
#define XEXP 0x40u /* 4 bytes: a non-zero exptime (absolute unix seconds) */
#define XFLG 0x20u /* 4 bytes: non-zero client flags */
#define XTRA_BYTES 8u

static inline uint8_t item_kind(const store_item *it)
{
    return it->km & 7u;
}

static inline bool item_kept(const store_item *it)
{
    return (atomic_load_explicit(&it->abits, memory_order_relaxed) & KEPT) !=
           0;
}

static inline uint8_t item_marks(const store_item *it)
{
    return (uint8_t)((it->km >> 3) & STORE_MARKS_ALL);
}

static inline void item_set_marks(store_item *it, uint8_t marks)
{
    it->km = (uint8_t)((it->km & ~(STORE_MARKS_ALL << 3)) |
                       (marks & STORE_MARKS_ALL) << 3);
}

/* Where the expiry field sits in a trailer of these bits. */
static inline size_t x_exp_at(unsigned km)
{
    return (km & XTRA) ? XTRA_BYTES : 0;
}

/* Where the flags field sits. */
static inline size_t x_flg_at(unsigned km)
{
    return x_exp_at(km) + ((km & XEXP) ? 4 : 0);
}

/* The bytes of a trailer of these bits. */
static inline size_t x_bytes(unsigned km)
{
    return x_flg_at(km) + ((km & XFLG) ? 4 : 0);
}

/* The trailer's bytes, counted as part of the value's allocation. */
static inline size_t item_xbytes(const store_item *it)
{
    return x_bytes(it->km);
}

static inline char *item_tail(const store_item *it)
{
    return (char *)it->data + it->nkey + it->nvalue;
}

/* Absolute unix seconds, 0 = never (no XEXP field). */
static inline uint32_t item_exptime(const store_item *it)
{
    uint32_t v = 0;
    if (it->km & XEXP)
        memcpy(&v, item_tail(it) + x_exp_at(it->km), 4);
    return v;
}

static inline uint32_t item_flags(const store_item *it)
{
    uint32_t v = 0;
    if (it->km & XFLG)
        memcpy(&v, item_tail(it) + x_flg_at(it->km), 4);
    return v;
}

/*
 * Sets an unpublished item's expiry: into its field, which item_new made
 * when the expiry it was given was non-zero; an item without one takes
 * only 0.
 */
static inline void item_set_exptime(store_item *it, uint32_t v)
{
    if (it->km & XEXP)
        memcpy(item_tail(it) + x_exp_at(it->km), &v, 4);
    else
        assert(v == 0);
}

/*
 * The trailer (the item must have one): a cas other than the one derived
 * from the id, a FLUSH's flush_at, a DROP's gid.
 */
static inline uint64_t item_x(const store_item *it)
{
    uint64_t v;
    memcpy(&v, item_tail(it), sizeof(v));
    return v;
}

static inline void item_x_set(store_item *it, uint64_t v)
{
    memcpy(item_tail(it), &v, sizeof(v));
}

static inline store_version item_version(const store_item *it)
{
    store_version v = {it->ticks, it->node};
    return v;
}

/* An absolute expiry as an item keeps it (see struct store_item). */
static inline uint32_t exptime_pack(int64_t e)
{
    if (e <= 0)
        return e == 0 ? 0 : 1; /* negative: expired long ago */
    return e >= (int64_t)UINT32_MAX ? UINT32_MAX : (uint32_t)e;
}

/* ============================================================ key ids */

static inline uint64_t rotl(uint64_t x, int k)
{
    return (x << k) | (x >> (64 - k));
}

static inline uint64_t le64(const unsigned char *p)
{
    uint64_t v;
    memcpy(&v, p, 8);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    v = __builtin_bswap64(v);
#endif
    return v;
}

#define SIP_ROUND(v0, v1, v2, v3)                                             \
    do {                                                                      \
        v0 += v1;                                                             \
        v1 = rotl(v1, 13) ^ v0;                                               \
        v0 = rotl(v0, 32);                                                    \
        v2 += v3;                                                             \
        v3 = rotl(v3, 16) ^ v2;                                               \
        v0 += v3;                                                             \
        v3 = rotl(v3, 21) ^ v0;                                               \
        v2 += v1;                                                             \
        v1 = rotl(v1, 17) ^ v2;                                               \
        v2 = rotl(v2, 32);                                                    \
    } while (0)

/* The fixed SipHash key of key_gid: part of the peer protocol. */
#define GID_K0 0x7269626c74636163ULL
#define GID_K1 0x68652d6b65796964ULL

/*
 * The cluster-wide 64-bit hash of a key: SipHash-1-3 under a fixed key,
 * the same on every node (it is the high word of every mutation id). The
 * key table's buckets come from it through a per-store secret mix
 * (bucket_hash): a client can compute this hash, but to pile keys into one
 * bucket it would need full 64-bit collisions of a keyed PRF, not just
 * bucket collisions.
 */
static uint64_t key_gid(const char *key, size_t n)
{
    const unsigned char *p = (const unsigned char *)key;
    uint64_t v0 = GID_K0 ^ 0x736f6d6570736575ULL;
    uint64_t v1 = GID_K1 ^ 0x646f72616e646f6dULL;
    uint64_t v2 = GID_K0 ^ 0x6c7967656e657261ULL;
    uint64_t v3 = GID_K1 ^ 0x7465646279746573ULL;
    uint64_t m, last = (uint64_t)(n & 0xff) << 56;
    size_t i, rest = n & 7;

    for (i = 0; i + 8 <= n; i += 8) {
        m = le64(p + i);
        v3 ^= m;
        SIP_ROUND(v0, v1, v2, v3);
        v0 ^= m;
    }
    for (size_t j = 0; j < rest; j++)
        last |= (uint64_t)p[i + j] << (8 * j);
    v3 ^= last;
    SIP_ROUND(v0, v1, v2, v3);
    v0 ^= last;
    v2 ^= 0xff;
    SIP_ROUND(v0, v1, v2, v3);
    SIP_ROUND(v0, v1, v2, v3);
    SIP_ROUND(v0, v1, v2, v3);
    m = v0 ^ v1 ^ v2 ^ v3;
    return m != 0 ? m : 1; /* 0 marks a free record slot */
}

static inline uint64_t mum(uint64_t a, uint64_t b)
{
    __uint128_t r = (__uint128_t)a * b;
    return (uint64_t)r ^ (uint64_t)(r >> 64);
}

#define K0 0xa0761d6478bd642fULL
#define K1 0xe7037ed1a0b428dbULL
#define K3 0x589965cc75374cc3ULL

/*
 * The id of the mutation (key, version): high word the key's gid, low word
 * a mix of gid, ticks and node (never zero). A node writes each tick once,
 * so two mutations of one key never share an id; two keys would need equal
 * gids and an unlucky mix.
 */
static riblt_id make_id(uint64_t gid, uint64_t ticks, uint32_t node)
{
    riblt_id id;

    id.hi = gid;
    id.lo =
        mum(ticks ^ K0, gid ^ K1) ^ mum((uint64_t)node ^ K3, rotl(gid, 29));
    if (id.lo == 0)
        id.lo = 1;
    return id;
}

static inline riblt_id item_id(const store_item *it)
{
    return make_id(key_gid(it->data, it->nkey), it->ticks, it->node);
}

riblt_id store_mutation_id(const store_mutation *m)
{
    const char *key = m->nkey ? m->key : "";
    return make_id(key_gid(key, m->nkey), m->version.ticks, m->version.node);
}

/* The cas a new value takes: from its id, non-zero and below 10^19. */
static inline uint64_t fresh_cas(const riblt_id *id)
{
    return (id->lo >> 1) + 1;
}

uint64_t store_fresh_cas(const riblt_id *id)
{
    return fresh_cas(id);
}

/*
 * An item's cas: the trailer's when it has one, else the one its id gives
 * (most items: a new value's cas is fresh). A FLUSH has none.
 */
static inline uint64_t item_cas(const store_item *it)
{
    if (item_kind(it) == STORE_KIND_FLUSH)
        return 0;
    if (it->km & XTRA)
        return item_x(it);
    riblt_id id = item_id(it);
    return fresh_cas(&id);
}

/* ============================================================== store */

/*
 * One partition's share of the set: its sketch and counters, all under the
 * set lock (they change with the set).
 */
struct part {
    riblt_sketch *sk;
    riblt_id *ps;       /* power sums (RIBLT_PSUM_SIZE), NULL when not kept */
    uint64_t mutations; /* set entries of this partition */
    uint64_t items;     /* of them, VALUE items */
    uint64_t bytes;     /* their accounted size */
    uint64_t kept;      /* KEPT values, linked but not in the set */
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

    pthread_mutex_t set_lock; /* partitions' sketches and counters */
    uint64_t set_count;       /* mutations in the set; set lock */
    struct part *parts;       /* P + 1 (partitioned) or 1; set lock */
    uint32_t nparts;
    size_t sk_symbols; /* length of each partition's sketch */

    pthread_mutex_t evict_lock; /* the eviction clock's hand */
    size_t hand_stripe;
    uint64_t hand_bucket;
    uint64_t gate;               /* evict unread items written before this
                                    (ticks); UINT64_MAX until known */
    uint64_t ages[GATE_SAMPLES]; /* ticks of recent candidates */
    uint64_t nages;

    /* Keyless records (evicted values, drops); see "Eviction is local". */
    pthread_mutex_t rec_lock;
    evrec *recs;                 /* STORE_KIND_EVICTED; NULL: evictions leave
                                    nothing */
    evrec *droptab;              /* STORE_KIND_DROP: grows and shrinks, its
                                    slots counted in mem_used */
    size_t drop_cap0;            /* its first capacity */
    size_t drop_cap_max;         /* and its largest */
    _Atomic size_t nrecs;        /* entries of both, for a lock-free "none" */
    uint64_t rec_evicted;        /* STORE_KIND_EVICTED entries; rec_lock */
    uint64_t rec_drops;          /* STORE_KIND_DROP entries; rec_lock */
    size_t rec_counted;          /* records counted in mem_used; rec_lock */
    uint64_t rec_cursor[2];      /* sweep's place in each table; rec_lock */
    uint64_t drop_rec_cursor[2]; /* drop's; rec_lock */
    _Atomic size_t item_limit;   /* the limit less the drops' first
                                    table */
    _Atomic size_t limit_now;    /* memory_limit, or cache_memlimit's */

    pthread_mutex_t sweep_lock; /* sweep and drop cursors */
    size_t sweep_stripe;
    uint64_t sweep_bucket;
    uint64_t pass_began;  /* hybrid ticks when the sweep's pass began */
    uint64_t flush_swept; /* the flush_at a whole pass has swept after */
    size_t drop_stripe;
    uint64_t drop_bucket;

    _Atomic size_t mem_used;
    store_listener_fn listener;
    void *listener_arg;

    _Atomic uint64_t curr_items, total_items, bytes, evictions,
        expired_unfetched, evicted_unfetched, reclaimed, tombstones,
        applied_remote, stale_remote, swept, dropped, drops_written,
        sweep_checked;
    /* Items that may die where they are (tombstones, values with an
     * expiry): while there are none and no flush is left to sweep, the
     * sweep has nothing to find in the key table and does not walk it. */
    _Atomic uint64_t mortal;
};

/*
 * The sketch changes of the set, and the hashes they need. A store created
 * with sketch_symbols 0 (a node without replication: nothing would ever
 * read it) keeps none: the set's counters still follow every change, the
 * sketch walks and the hashes are skipped.
 */
static inline uint64_t sk_hash(const store *s, const riblt_id *id)
{
    return s->sk_symbols != 0 ? riblt_hash(id) : 0;
}

static inline void sk_add(store *s, uint32_t p, const riblt_id *id, uint64_t h)
{
    if (s->sk_symbols != 0) {
        riblt_sketch_add_hashed(s->parts[p].sk, id, h);
        if (s->parts[p].ps != NULL)
            riblt_psum_toggle(s->parts[p].ps, id, h);
    }
}

static inline void sk_remove(store *s, uint32_t p, const riblt_id *id,
                             uint64_t h)
{
    if (s->sk_symbols != 0) {
        riblt_sketch_remove_hashed(s->parts[p].sk, id, h);
        if (s->parts[p].ps != NULL)
            riblt_psum_toggle(s->parts[p].ps, id, h);
    }
}

static inline void sk_replace(store *s, uint32_t p, const riblt_id *oid,
                              uint64_t oh, const riblt_id *nid, uint64_t nh)
{
    if (s->sk_symbols != 0) {
        riblt_sketch_replace_hashed(s->parts[p].sk, oid, oh, nid, nh);
        if (s->parts[p].ps != NULL) {
            riblt_psum_toggle(s->parts[p].ps, oid, oh);
            riblt_psum_toggle(s->parts[p].ps, nid, nh);
        }
    }
}

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

/* The key table's hash of a gid: a mix under this store's secret. */
static inline uint64_t bucket_hash(const uint64_t sec[2], uint64_t gid)
{
    return mum(mum(gid ^ sec[0], K1 ^ sec[1]), K3);
}

/* A key's two hashes: cluster-wide gid, and this table's bucket hash. */
struct kh {
    uint64_t gid, h;
};

static inline struct kh key_kh(const store *s, const char *key, size_t nkey)
{
    struct kh k;
    k.gid = key_gid(key, nkey);
    k.h = bucket_hash(s->seed, k.gid);
    return k;
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

static size_t alloc_size(const void *p, size_t asked)
{
#ifdef HAVE_JEMALLOC
    size_t n = sallocx((void *)p, 0);
#else
    size_t n = malloc_usable_size((void *)p);
#endif
    return n > asked ? n : asked;
}

static inline size_t item_total(size_t nkey, size_t nvalue)
{
    return ITEM_HDR + nkey + nvalue;
}

/*
 * The bytes an item is allocated with: header, key and value, but at least
 * the struct's padded size, so that no access through the struct type
 * reads past the allocation. Up to CHUNK_MAX they come from chunk.c's
 * fine classes, beyond from the general allocator.
 */
static inline size_t item_alloc_bytes(size_t nkey, size_t nvalue)
{
    size_t total = item_total(nkey, nvalue);
    return total > sizeof(store_item) ? total : sizeof(store_item);
}

/* The bytes an item was allocated with (item_alloc_bytes of its shape). */
static inline size_t item_bytes(const store_item *it)
{
    return item_alloc_bytes(it->nkey, it->nvalue + item_xbytes(it));
}

/* The bytes an item is accounted for: its real allocation. */
static inline size_t item_size(const store_item *it)
{
    size_t n = item_bytes(it);

    return n <= CHUNK_MAX ? chunk_size(n) : alloc_size(it, n);
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
 * An item's partition: its key's (key_part, computed when asked: a
 * partition is a function of the key), a keyless DROP's from its flags
 * field.
 */
static inline uint32_t item_part(const store *s, const store_item *it)
{
    if (item_kind(it) == STORE_KIND_DROP)
        return item_flags(it);
    return key_part(s, it->data, it->nkey);
}

/*
 * What an item holds besides key and value, in its trailer when non-zero
 * (see struct store_item): client flags, expiry (exptime_pack's), and
 * whether it has the 8-byte slot (xtra: set by commit_local or the caller).
 */
struct item_shape {
    uint32_t flags;
    uint32_t exptime;
    bool xtra;
};

/*
 * A new unlinked item of the given shape holding a copy of key, flags and
 * expiry, with one reference (the caller's). The value (and the 8-byte
 * slot) is left for the caller to fill. Returns NULL when out of memory.
 */
static store_item *item_new(uint8_t kind, const char *key, size_t nkey,
                            size_t nvalue, struct item_shape sh)
{
    uint8_t x = (uint8_t)((sh.xtra ? XTRA : 0) | (sh.exptime ? XEXP : 0) |
                          (sh.flags ? XFLG : 0));
    size_t n = item_alloc_bytes(nkey, nvalue + x_bytes(x));
    store_item *it = n <= CHUNK_MAX ? chunk_alloc(n) : malloc(n);

    if (it == NULL)
        return NULL;
    memset(it, 0, ITEM_HDR);
    atomic_init(&it->refs, 1);
    it->km = (uint8_t)((kind & 7u) | x);
    it->nkey = (uint8_t)nkey;
    it->nvalue = (uint32_t)nvalue;
    item_set_exptime(it, sh.exptime);
    if (sh.flags)
        memcpy(item_tail(it) + x_flg_at(x), &sh.flags, 4);
    if (nkey)
        memcpy(it->data, key, nkey);
    return it;
}

/*
 * Unpublished it with expiry exptime: it itself when it has room for that,
 * else a copy with the field (it is released). NULL when out of memory (it
 * is released too).
 */
static store_item *item_reshape(store_item *it, uint32_t exptime)
{
    if (exptime == 0 || (it->km & XEXP)) {
        item_set_exptime(it, exptime);
        return it;
    }
    struct item_shape sh = {item_flags(it), exptime, (it->km & XTRA) != 0};
    store_item *c =
        item_new(item_kind(it), it->data, it->nkey, it->nvalue, sh);
    if (c != NULL) {
        memcpy(item_value_ptr(c), item_value_ptr(it), it->nvalue);
        item_set_marks(c, item_marks(it));
    }
    store_item_release(it);
    return c;
}

void store_item_ref(store_item *it)
{
    atomic_fetch_add_explicit(&it->refs, 1, RELAXED);
}

void store_item_release(store_item *it)
{
    if (it == NULL)
        return;
    if (atomic_fetch_sub_explicit(&it->refs, 1, memory_order_acq_rel) != 1)
        return;
    if (item_bytes(it) <= CHUNK_MAX)
        chunk_free(it);
    else
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
    return item_flags(it);
}

int64_t store_item_exptime(const store_item *it)
{
    return item_exptime(it);
}

uint64_t store_item_cas(const store_item *it)
{
    return item_cas(it);
}

uint8_t store_item_kind(const store_item *it)
{
    return item_kind(it);
}

uint8_t store_item_marks(const store_item *it)
{
    return item_marks(it);
}

void store_item_mutation(const store_item *it, store_mutation *out)
{
    memset(out, 0, sizeof(*out));
    if (item_kind(it) == STORE_KIND_DROP) {
        /* A drop handed to the listener (drop_item): keyless. */
        out->id = make_id(item_x(it), it->ticks, it->node);
        out->version = item_version(it);
        out->kind = STORE_KIND_DROP;
        out->exptime = item_exptime(it);
        out->flags = item_flags(it); /* the partition */
        return;
    }
    out->id = item_id(it);
    out->version = item_version(it);
    out->kind = item_kind(it);
    out->marks = item_marks(it);
    out->flags = item_flags(it);
    out->exptime = item_exptime(it);
    if (item_kind(it) == STORE_KIND_FLUSH)
        out->flush_at = item_x(it);
    else
        out->cas = (it->km & XTRA) ? item_x(it) : fresh_cas(&out->id);
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

    return f != 0 && item_kind(it) != STORE_KIND_FLUSH && it->ticks <= f &&
           t->peek >= f;
}

static inline bool item_expired(const store_item *it, const tnow *t)
{
    uint32_t e = item_exptime(it);
    return e != 0 && (int64_t)e <= t->s;
}

/* Visible to clients: a VALUE neither expired nor flushed. */
static bool item_live(store *s, const store_item *it, const tnow *t)
{
    if (item_kind(it) != STORE_KIND_VALUE || item_expired(it, t))
        return false;
    return !item_flushed(s, it, t);
}

/* Due to leave the set (see the contract at the top). */
static bool item_dead(store *s, const store_item *it, const tnow *t)
{
    int64_t grace = (int64_t)s->opt.tombstone_grace;

    switch (item_kind(it)) {
    case STORE_KIND_TOMBSTONE: {
        if (item_flushed(s, it, t))
            return true;
        uint32_t e = item_exptime(it);
        int64_t born = e > 0 ? (int64_t)e : (int64_t)(it->ticks / NS_PER_S);
        /* Compared as now - grace: born may be as large as ticks a peer
         * sends allow, and adding would overflow. */
        return t->s - grace >= born;
    }
    case STORE_KIND_VALUE:
        if (item_flushed(s, it, t))
            return true;
        /* strictly after: a value that expires this second (or arrived
         * expired) is kept until the next, so a read in that second sees
         * it expired (memcached's get_expired), even with a grace of 0 */
        {
            uint32_t e = item_exptime(it);
            return e != 0 && t->s - grace > (int64_t)e;
        }
    default:
        return false;
    }
}

/* ========================================================= key table */

static inline struct stripe *stripe_of(store *s, uint64_t h)
{
    return &s->stripes[h & (s->nstripes - 1)];
}

static inline store_item **bucket_of(struct stripe *sp, uint64_t h)
{
    return &sp->buckets[(h >> 32) & sp->mask];
}

/*
 * The slot holding key in sp (caller holds sp->lock; h is the key's
 * bucket_hash): *slot is the item, or NULL with slot pointing at the end of
 * the bucket's chain.
 */
static store_item **stripe_slot(struct stripe *sp, uint64_t h, const char *key,
                                size_t nkey)
{
    store_item **pp = bucket_of(sp, h);

    for (; *pp != NULL; pp = &(*pp)->hnext) {
        store_item *it = *pp;
        if (it->nkey == nkey &&
            (nkey == 0 || memcmp(it->data, key, nkey) == 0))
            break;
    }
    return pp;
}

/* The item in the set whose mutation id is *id, or NULL (caller holds its
 * stripe). */
static store_item *stripe_find_id(struct stripe *sp, uint64_t h,
                                  const riblt_id *id)
{
    for (store_item *it = *bucket_of(sp, h); it != NULL; it = it->hnext) {
        if (key_gid(it->data, it->nkey) != id->hi || item_kept(it))
            continue;
        riblt_id mine = make_id(id->hi, it->ticks, it->node);
        if (mine.lo == id->lo)
            return it;
    }
    return NULL;
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
            uint64_t h = bucket_hash(s->seed, key_gid(it->data, it->nkey));
            uint64_t b = (h >> 32) & (n - 1);
            it->hnext = nb[b];
            nb[b] = it;
            it = next;
        }
    }
    free(sp->buckets);
    sp->buckets = nb;
    atomic_fetch_add(&s->nbuckets, sp->mask + 1);
    /* The key table is counted against the limit like the items. */
    atomic_fetch_add_explicit(&s->mem_used, (sp->mask + 1) * sizeof(*nb),
                              RELAXED);
    sp->mask = n - 1;
}

/* =============================================================== set */

/*
 * The set is exactly the items linked in the key table: an item enters it
 * when do_store_apply links it and leaves when it is unlinked. The key
 * table finds an id (its high word picks the bucket); the partitions'
 * sketches and counters, under set_lock, follow every change.
 */

/*
 * Counts it in (sign 1) or out (-1) of its partition p, item_part's answer
 * (set_lock held; the caller asks item_part before taking it).
 */
static inline void part_count(store *s, const store_item *it, uint32_t p,
                              int sign)
{
    struct part *pt = &s->parts[p];

    s->set_count += (uint64_t)(int64_t)sign;
    pt->mutations += (uint64_t)(int64_t)sign;
    if (item_kind(it) == STORE_KIND_VALUE) {
        pt->items += (uint64_t)(int64_t)sign;
        pt->bytes += (uint64_t)((int64_t)sign * (int64_t)item_size(it));
    }
}

/*
 * Takes it out of counters and sketch (caller holds its stripe lock); a
 * kept item, which is in neither, out of its partition's kept count.
 */
static void set_remove(store *s, store_item *it)
{
    uint32_t p = item_part(s, it);

    if (item_kept(it)) {
        pthread_mutex_lock(&s->set_lock);
        s->parts[p].kept--;
        pthread_mutex_unlock(&s->set_lock);
        return;
    }
    /* The id (a hash of the key) is for the sketch alone. */
    riblt_id id = {0, 0};
    uint64_t h = 0;
    if (s->sk_symbols != 0) {
        id = item_id(it);
        h = riblt_hash(&id);
    }
    pthread_mutex_lock(&s->set_lock);
    part_count(s, it, p, -1);
    sk_remove(s, p, &id, h);
    pthread_mutex_unlock(&s->set_lock);
}

/*
 * Moves a linked VALUE out of the set while it stays in the key table,
 * readable (keep: a drop took its mutation out of every set), or a kept
 * one back into the set (!keep: its mutation came back from a peer that
 * holds it in its set). Caller holds its stripe lock; see "Eviction is
 * local".
 */
static void set_keep(store *s, store_item *it, bool keep)
{
    riblt_id id = item_id(it);
    uint64_t h = sk_hash(s, &id);
    uint32_t p = item_part(s, it);

    pthread_mutex_lock(&s->set_lock);
    part_count(s, it, p, keep ? -1 : 1);
    if (keep) {
        sk_remove(s, p, &id, h);
        s->parts[p].kept++;
    } else {
        sk_add(s, p, &id, h);
        s->parts[p].kept--;
    }
    pthread_mutex_unlock(&s->set_lock);
    if (keep)
        atomic_fetch_or_explicit(&it->abits, KEPT, memory_order_relaxed);
    else
        atomic_fetch_and_explicit(&it->abits, (uint8_t)~KEPT,
                                  memory_order_relaxed);
}

/* =========================================================== records */

/*
 * Keyless records: what eviction leaves on a replicating node
 * (STORE_KIND_EVICTED) and the cluster-wide drops written when their table
 * overflows (STORE_KIND_DROP), in s->recs and s->droptab under rec_lock.
 * A record is the current mutation of its gid exactly as an item is of its
 * key: a gid has an item or a record in the set, never both, and both kinds
 * are in the set; the one pair is a KEPT item (in no set) and the drop
 * that named it. Every
 * change of a gid's record happens under the stripe lock of that gid,
 * except the conversion of an overflowing record into a drop, which only
 * rec_lock covers (writers of that gid take rec_lock before they look).
 * Lock order: stripe -> rec_lock -> set_lock.
 */

static inline riblt_id rec_id(const evrec_entry *e)
{
    return make_id(e->gid, e->ticks, e->node);
}

static inline store_version rec_version(const evrec_entry *e)
{
    store_version v = {e->ticks, e->node};
    return v;
}

/* Counts e in (1) or out (-1) of the set and the record counters
 * (rec_lock and set_lock held). */
static void rec_count(store *s, const evrec_entry *e, int sign)
{
    s->set_count += (uint64_t)(int64_t)sign;
    s->parts[e->part].mutations += (uint64_t)(int64_t)sign;
    if (e->kind == STORE_KIND_DROP)
        s->rec_drops += (uint64_t)(int64_t)sign;
    else
        s->rec_evicted += (uint64_t)(int64_t)sign;
}

/* Takes e out of the set: counters and sketch (rec_lock held). */
static void rec_set_remove(store *s, const evrec_entry *e)
{
    riblt_id id = rec_id(e);
    uint64_t h = sk_hash(s, &id);

    pthread_mutex_lock(&s->set_lock);
    rec_count(s, e, -1);
    sk_remove(s, e->part, &id, h);
    pthread_mutex_unlock(&s->set_lock);
}

/* Due to leave the set, as item_dead says for the mutations they stand
 * for: an evicted value's record when the value would be, a drop
 * DROP_GRACE seconds after it was written. */
static bool rec_dead(store *s, const evrec_entry *e, const tnow *t)
{
    uint64_t f = atomic_load_explicit(&s->flush_at, memory_order_acquire);
    int64_t grace = (int64_t)s->opt.tombstone_grace;

    if (f != 0 && e->ticks <= f && t->peek >= f)
        return true;
    if (e->kind == STORE_KIND_DROP) {
        int64_t born = e->exptime > 0 ? (int64_t)e->exptime
                                      : (int64_t)(e->ticks / NS_PER_S);
        if (grace > DROP_GRACE)
            grace = DROP_GRACE;
        return t->s - grace >= born;
    }
    return e->exptime != 0 &&
           t->s - grace > (int64_t)e->exptime; /* as a value */
}

/*
 * After the tables changed (rec_lock held): the lock-free count, and the
 * records' memory. Records are counted against the limit as they are
 * held, EVREC_ENTRY_BYTES each, not reserved: a node that evicts little,
 * or whose records are overwritten, keeps the room for items.
 */
static inline void recs_sync(store *s)
{
    size_t n = evrec_count(s->recs);

    atomic_store_explicit(&s->nrecs, n + evrec_count(s->droptab), RELAXED);
    if (n > s->rec_counted)
        atomic_fetch_add_explicit(
            &s->mem_used, (n - s->rec_counted) * EVREC_ENTRY_BYTES, RELAXED);
    else if (n < s->rec_counted)
        atomic_fetch_sub_explicit(
            &s->mem_used, (s->rec_counted - n) * EVREC_ENTRY_BYTES, RELAXED);
    s->rec_counted = n;
}

/* gid's record, in either table (rec_lock held). */
static bool recs_find(store *s, uint64_t gid, evrec_entry *e)
{
    return evrec_find(s->recs, gid, e) || evrec_find(s->droptab, gid, e);
}

/* Removes gid's record from its table (rec_lock held); not the set. */
static void recs_remove(store *s, uint64_t gid)
{
    if (!evrec_remove(s->recs, gid, NULL))
        evrec_remove(s->droptab, gid, NULL);
}

/* evrec_walk over both tables, records first (cursors: one each). */
static size_t recs_walk(store *s, uint64_t cursor[2], size_t budget,
                        evrec_fn fn, void *arg)
{
    size_t n = evrec_walk(s->recs, &cursor[0], budget, fn, arg);
    return n + evrec_walk(s->droptab, &cursor[1], budget, fn, arg);
}

/*
 * Gives the drops' table `cap` entries, its memory counted in mem_used
 * (rec_lock held). false when memory is lacking.
 */
static bool drops_resize(store *s, size_t cap)
{
    size_t old = evrec_capacity(s->droptab);

    if (evrec_resize(s->droptab, cap) != 0)
        return false;
    if (cap > old)
        atomic_fetch_add_explicit(&s->mem_used, (cap - old) * DROP_ENTRY_BYTES,
                                  RELAXED);
    else
        atomic_fetch_sub_explicit(&s->mem_used, (old - cap) * DROP_ENTRY_BYTES,
                                  RELAXED);
    return true;
}

/*
 * An unlinked item that stands for drop d, for the listener (which pushes
 * it at once, so that peers let the value go while the drop is young):
 * kind STORE_KIND_DROP, no key, the gid in the trailer; see
 * store_item_mutation. NULL without memory (rounds carry the drop then).
 */
static store_item *drop_item(store *s, const evrec_entry *d)
{
    /* Keyless: the partition comes with it, in the flags. */
    struct item_shape sh = {d->part, d->exptime, true};
    store_item *it = item_new(STORE_KIND_DROP, "", 0, 0, sh);

    if (it == NULL)
        return NULL;
    it->ticks = d->ticks;
    it->node = d->node;
    item_x_set(it, d->gid);
    return it;
}

/*
 * Puts e, already counted in the set, into its table (rec_lock held). The
 * records' table has a fixed size and gives up its oldest entry when full:
 * that record becomes a drop one tick newer, so that peers holding its
 * value let it go too. The drops' table absorbs a burst by growing (its
 * memory counted against the limit like items', so writes evict to pay
 * for it), up to drop_cap_max entries; beyond, or when memory for growing
 * is lacking, its least drop goes early (a peer may then refill its
 * value). Least by creation second, then gid (an ordered evrec), not by
 * arrival, and a drop a peer sends that is below all a full table holds
 * goes at once (evrec_put): so what a full table holds is a
 * function of the drops it has seen, and two nodes that have seen the
 * same drops hold the same ones. Letting the first arrived go instead,
 * two equal -m 8 nodes left idle after steady eviction sent each other 2
 * to 7 MB/s for the drops' whole minute: each let go drops the other
 * still held, took them back at the next round, and let others go for
 * them. Growing without that bound, under steady eviction the drops (a
 * minute of evictions) took nearly all of the limit: a node at -m 64 held
 * 40,000 100-byte items instead of 355,000. The bound is one number for
 * every node whose record share reaches it (DROP_MAX_ENTRIES; -m 8 and
 * up by default), not a share of each node's memory: a drop let go early
 * that a peer still holds comes back at the next round and pushes out
 * another, so a small node beside a big one whose table held four times
 * as many drops kept 4 MB/s of rounds going between them for the drops'
 * minute (an ordered table below the other's would still refuse the
 * other's extra drops every round); with equal tables both keep the same.
 * Why 4,096 and not more: since a drop keeps the value it names, a drop
 * let go early costs no node anything, and a smaller bound is one more
 * nodes share (32,768 left -m 8 to -m 23 with smaller tables than their
 * peers', and a -m 8 node beside a -m 32 one never agreed under steady
 * eviction) and less of a small node's memory: 8,192 drops, 352 KiB,
 * were 4 % of -m 8 and 2 % of -m 16 (replication/README.md, "Evictions
 * stay local", has the items held with each bound).
 */
static void rec_put(store *s, const evrec_entry *e, const tnow *t,
                    store_item **note)
{
    evrec_entry x, d; /* d outlives the branch: e may point at it */

    if (e->kind == STORE_KIND_EVICTED) {
        if (!evrec_put(s->recs, e, &x)) {
            recs_sync(s);
            return;
        }
        d = x;
        d.kind = STORE_KIND_DROP;
        d.ticks = x.ticks + 1;
        d.exptime = exptime_pack(t->s);
        clock_catch_up(s, d.ticks);
        riblt_id oid = rec_id(&x), nid = rec_id(&d);
        uint64_t oh = sk_hash(s, &oid), nh = sk_hash(s, &nid);
        pthread_mutex_lock(&s->set_lock);
        rec_count(s, &x, -1);
        sk_replace(s, x.part, &oid, oh, &nid, nh);
        rec_count(s, &d, 1);
        pthread_mutex_unlock(&s->set_lock);
        COUNT_ADD(s, drops_written, 1);
        if (note != NULL && *note == NULL && s->listener != NULL)
            *note = drop_item(s, &d);
        e = &d;
    }
    size_t cap = evrec_capacity(s->droptab);
    if (evrec_count(s->droptab) >= cap && cap < s->drop_cap_max)
        drops_resize(s, cap * 2 < s->drop_cap_max ? cap * 2 : s->drop_cap_max);
    if (evrec_put(s->droptab, e, &x))
        rec_set_remove(s, &x);
    recs_sync(s);
}

/*
 * Locks rec_lock and looks gid's record up when the tables may hold any.
 * Returns true with rec_lock held and *e filled when there is one; false
 * with rec_lock not held otherwise.
 */
static bool rec_lookup(store *s, uint64_t gid, evrec_entry *e)
{
    if (s->recs == NULL || atomic_load_explicit(&s->nrecs, RELAXED) == 0)
        return false;
    pthread_mutex_lock(&s->rec_lock);
    if (recs_find(s, gid, e))
        return true;
    pthread_mutex_unlock(&s->rec_lock);
    return false;
}

static void notify(store *s, store_item *it, bool local);

/* ===================================================== eviction clock */

/*
 * Eviction is a clock over the key table: items carry a REF bit, clear
 * when they are linked and set whenever a client reads them; the hand
 * walks the table bucket by bucket, clearing REF bits, and takes the first
 * evictable item it finds without one (or an expired one at once). An item
 * thus stays until the hand reaches it, and one more turn of the hand for
 * every time it was read in between: second-chance LRU (CLOCK), with no
 * list to keep in order, so a read costs no lock beyond its stripe's and
 * the header no links. A new item has no REF bit: the hand's position is
 * unrelated to write order, so a write-only stream is evicted in table
 * order, and protecting new items too would make the hand clear a whole
 * table of them before its first eviction.
 *
 * The clock takes live or expired values only. Tombstones and flushes
 * never go.
 */
static inline bool evictable(const store_item *it)
{
    return item_kind(it) == STORE_KIND_VALUE;
}

/*
 * Records a client read of a linked item (caller holds its stripe lock):
 * access time, fetched and REF bits. *prev gets the state before this read
 * (for meta 'l' and 'h'), when prev is not NULL.
 */
static void item_access(store_item *it, const tnow *t, store_read_info *prev)
{
    uint32_t was_at = atomic_load_explicit(&it->atime, RELAXED);
    uint8_t was = atomic_load_explicit(&it->abits, RELAXED);

    if (was_at != (uint32_t)t->s)
        atomic_store_explicit(&it->atime, (uint32_t)t->s, RELAXED);
    /* Only write the bits when they change: a hot item's line stays shared
     * between the cores that read it. */
    if ((was & (FETCHED | REF)) != (FETCHED | REF))
        was = atomic_fetch_or_explicit(&it->abits, FETCHED | REF, RELAXED);
    if (prev != NULL) {
        int64_t d = t->s - (int64_t)was_at;
        prev->last_access = d > 0 ? d : 0;
        prev->fetched = (was & FETCHED) != 0;
    }
}

/* ========================================================= accounting */

/* An item that can die in the key table; fixed while it is linked, as an
 * item's expiry field is (item_set_exptime). */
static inline bool item_mortal(const store_item *it)
{
    return item_kind(it) == STORE_KIND_TOMBSTONE ||
           (item_kind(it) == STORE_KIND_VALUE && (it->km & XEXP));
}

static void account_link(store *s, store_item *it)
{
    size_t sz = item_size(it);

    atomic_fetch_add_explicit(&s->mem_used, sz, RELAXED);
    if (item_mortal(it))
        COUNT_ADD(s, mortal, 1);
    if (item_kind(it) == STORE_KIND_VALUE) {
        COUNT_ADD(s, curr_items, 1);
        COUNT_ADD(s, total_items, 1);
        COUNT_ADD(s, bytes, sz);
    } else if (item_kind(it) == STORE_KIND_TOMBSTONE) {
        COUNT_ADD(s, tombstones, 1);
    }
}

static void account_unlink(store *s, store_item *it)
{
    size_t sz = item_size(it);

    atomic_fetch_sub_explicit(&s->mem_used, sz, RELAXED);
    if (item_mortal(it))
        COUNT_SUB(s, mortal, 1);
    if (item_kind(it) == STORE_KIND_VALUE) {
        COUNT_SUB(s, curr_items, 1);
        COUNT_SUB(s, bytes, sz);
    } else if (item_kind(it) == STORE_KIND_TOMBSTONE) {
        COUNT_SUB(s, tombstones, 1);
    }
}

/* ============================================================= apply */

/* An item that left the key table: accounting, and the table's
 * reference dropped. */
static void item_retire(store *s, store_item *it)
{
    atomic_fetch_and_explicit(&it->abits, (uint8_t)~LINKED, RELAXED);
    account_unlink(s, it);
    store_item_release(it);
}

/* Takes the item at *pp out of the key table only (the set is the
 * caller's business) and retires it. Caller holds sp->lock. */
static void chain_unlink(store *s, struct stripe *sp, store_item **pp)
{
    store_item *it = *pp;

    *pp = it->hnext;
    it->hnext = NULL;
    sp->count--;
    item_retire(s, it);
}

/*
 * Takes the item at *pp out of key table, set and sketch and drops the
 * table's reference. Caller holds sp->lock.
 */
static void do_unlink(store *s, struct stripe *sp, store_item **pp)
{
    set_remove(s, *pp);
    chain_unlink(s, sp, pp);
}

/*
 * The one place where versions are compared and the set changes. Caller
 * holds sp->lock (sp is its stripe, k its key's hashes); `it` is a
 * complete, unlinked item with the caller's reference.
 *
 * Returns APPLY_LINKED when it became the key's current mutation: the
 * caller's reference now belongs to the key table (take another before
 * dropping the lock to keep using it). Returns APPLY_STALE when the held
 * mutation's version is not smaller (a KEPT item without its drop is
 * brought back into the set then), and APPLY_RETIRED when it is
 * newer but already dead (the held mutation left the set, nothing was linked);
 * in both cases the caller still owns its reference and nothing else
 * changed.
 *
 * Both ids are derived and hashed before the set lock, which every write
 * shares, and an overwrite swaps the old id for the new one in one
 * interleaved sketch walk (riblt_sketch_replace_hashed) rather than two.
 */
static int do_store_apply(store *s, struct stripe *sp, const struct kh *k,
                          store_item *it, const tnow *t)
{
    store_item **pp = stripe_slot(sp, k->h, it->data, it->nkey);
    store_item *cur = *pp;
    store_version nv = item_version(it);
    uint64_t gid = k->gid;
    evrec_entry re;
    bool rec = false;    /* re is the gid's record (rec_lock held) */
    bool cur_in = false; /* cur is the key's mutation in the set */

    if (cur != NULL && !item_kept(cur)) {
        store_version cv = item_version(cur);
        if (store_version_cmp(&nv, &cv) <= 0)
            return APPLY_STALE;
        cur_in = true;
    } else {
        /* No item in the set: the key's mutation there is its record, if
         * any. A kept item is a value a drop took out of the set; once
         * the drop is gone, its own or an older mutation arriving (from a
         * peer that never saw the drop) is stale and brings the kept
         * value back into the set, so that the peer receives it in turn
         * rather than sending the older one at every round. */
        if ((rec = rec_lookup(s, gid, &re))) {
            store_version rv = rec_version(&re);
            if (store_version_cmp(&nv, &rv) <= 0) {
                pthread_mutex_unlock(&s->rec_lock);
                return APPLY_STALE;
            }
        } else if (cur != NULL) {
            store_version cv = item_version(cur);
            if (store_version_cmp(&nv, &cv) <= 0) {
                set_keep(s, cur, false);
                return APPLY_STALE;
            }
        }
    }
    if (item_dead(s, it, t)) {
        if (cur != NULL)
            do_unlink(s, sp, pp);
        if (rec) {
            recs_remove(s, gid);
            rec_set_remove(s, &re);
            recs_sync(s);
            pthread_mutex_unlock(&s->rec_lock);
        }
        return APPLY_RETIRED;
    }

    riblt_id nid = make_id(gid, it->ticks, it->node), oid = {0, 0};
    uint64_t nh = sk_hash(s, &nid), oh = 0;
    if (cur_in)
        oid = make_id(gid, cur->ticks, cur->node);
    else if (rec)
        oid = rec_id(&re);
    if (cur_in || rec)
        oh = sk_hash(s, &oid);
    if (rec)
        recs_remove(s, gid);
    /* A key's partition is a function of the key: cur and it share it. */
    uint32_t p = item_part(s, it);
    pthread_mutex_lock(&s->set_lock);
    if (cur != NULL && !cur_in)
        s->parts[p].kept--;
    if (cur_in || rec) {
        if (cur_in)
            part_count(s, cur, p, -1);
        else
            rec_count(s, &re, -1);
        sk_replace(s, p, &oid, oh, &nid, nh);
    } else {
        sk_add(s, p, &nid, nh);
    }
    part_count(s, it, p, 1);
    pthread_mutex_unlock(&s->set_lock);
    if (rec) {
        recs_sync(s);
        pthread_mutex_unlock(&s->rec_lock);
    }

    if (cur != NULL) {
        it->hnext = cur->hnext;
        cur->hnext = NULL;
    } else {
        it->hnext = NULL;
        sp->count++;
    }
    *pp = it;
    atomic_fetch_or_explicit(&it->abits, LINKED, RELAXED);
    account_link(s, it);
    if (item_kind(it) == STORE_KIND_FLUSH) {
        uint64_t fa = item_x(it);
        atomic_store_explicit(&s->flush_at, fa, memory_order_release);
        /* An immediate flush: later local writes must get greater ticks. */
        if (fa <= t->peek)
            clock_catch_up(s, fa);
    }
    if (cur != NULL) {
        /* memcached's "reclaimed": a value stored over one that had
         * expired or been flushed */
        if (item_kind(cur) == STORE_KIND_VALUE && !item_live(s, cur, t))
            COUNT_ADD(s, reclaimed, 1);
        item_retire(s, cur);
    } else if (sp->count > 2 * (sp->mask + 1)) {
        stripe_grow(s, sp);
    }
    return APPLY_LINKED;
}

/*
 * A keyless mutation from a peer (STORE_KIND_EVICTED, STORE_KIND_DROP) as
 * the current mutation of its gid: compared with the gid's mutation in the
 * set (its item, or its record), which leaves when it is older. A drop
 * that names the gid's value (its version is one tick past the value's,
 * the record it was written from) takes the value out of the set and
 * leaves it readable here, kept; an older value than the one it names
 * leaves. A kept value is out of the set: older keyless mutations and the
 * record of that very mutation lose to it and, when its drop is gone,
 * bring it back into the set (their sender holds that key in its set, and
 * must receive the newer value). Caller holds
 * sp->lock (h is bucket_hash of e->gid). Returns an apply_result.
 */
static int do_apply_keyless(store *s, struct stripe *sp, uint64_t h,
                            const evrec_entry *e, const tnow *t,
                            store_item **note)
{
    store_item **pp = bucket_of(sp, h);
    store_version ev = rec_version(e);
    evrec_entry re;
    bool rec;

    for (; *pp != NULL; pp = &(*pp)->hnext)
        if (key_gid((*pp)->data, (*pp)->nkey) == e->gid)
            break;
    store_item *cur = *pp;
    bool kept = cur != NULL && item_kept(cur);
    pthread_mutex_lock(&s->rec_lock);
    rec = (cur == NULL || kept) && recs_find(s, e->gid, &re);
    if (cur != NULL || rec) {
        store_version cv = rec ? rec_version(&re) : item_version(cur);
        if (store_version_cmp(&ev, &cv) <= 0) {
            if (kept && !rec)
                set_keep(s, cur, false); /* as in do_store_apply */
            pthread_mutex_unlock(&s->rec_lock);
            return APPLY_STALE;
        }
    }
    if (cur != NULL) {
        bool named = e->kind == STORE_KIND_DROP &&
                     item_kind(cur) == STORE_KIND_VALUE &&
                     cur->ticks + 1 == e->ticks && cur->node == e->node;
        if (!named)
            do_unlink(s, sp, pp);
        else if (!kept)
            set_keep(s, cur, true);
    }
    if (rec) {
        recs_remove(s, e->gid);
        rec_set_remove(s, &re);
    }
    int r = APPLY_RETIRED;
    if (!rec_dead(s, e, t)) {
        riblt_id id = rec_id(e);
        uint64_t ih = sk_hash(s, &id);
        pthread_mutex_lock(&s->set_lock);
        rec_count(s, e, 1);
        sk_add(s, e->part, &id, ih);
        pthread_mutex_unlock(&s->set_lock);
        rec_put(s, e, t, note);
        r = APPLY_LINKED;
    }
    recs_sync(s);
    pthread_mutex_unlock(&s->rec_lock);
    return r;
}

/* ========================================================== eviction */

/* What store_walk and evict_fn are shown of a value. */
static void item_info(const store_item *it, store_item_info *ii)
{
    ii->key = it->data;
    ii->nkey = it->nkey;
    ii->nvalue = it->nvalue;
    ii->size = item_size(it);
    ii->exptime = item_exptime(it);
    ii->atime = atomic_load_explicit(&it->atime, RELAXED);
    ii->cas = item_cas(it);
    ii->flags = item_flags(it);
    ii->fetched = (atomic_load_explicit(&it->abits, RELAXED) & FETCHED) != 0;
}

/*
 * Evicts the value at *pp (caller holds sp->lock; gid is its key's): it
 * leaves the key table, and on a replicating node leaves a record of its
 * mutation in its place (see "Eviction is local"), so the set does not
 * change.
 */
static void evict_at(store *s, struct stripe *sp, uint64_t gid,
                     store_item **pp, const tnow *t, store_item **note)
{
    store_item *victim = *pp;
    bool expired = !item_live(s, victim, t);
    bool fetched = atomic_load_explicit(&victim->abits, RELAXED) & FETCHED;

    if (!expired && s->opt.evict_fn != NULL) {
        store_item_info ii;
        item_info(victim, &ii);
        s->opt.evict_fn(s->opt.evict_arg, &ii);
    }

    if (s->recs == NULL || item_kept(victim)) {
        /* A kept value is in no set: it leaves nothing behind. */
        do_unlink(s, sp, pp);
    } else {
        evrec_entry e = {.gid = gid,
                         .ticks = victim->ticks,
                         .node = victim->node,
                         .exptime = item_exptime(victim),
                         .part = (uint16_t)item_part(s, victim),
                         .kind = STORE_KIND_EVICTED};
        /* The same id stays in the set, now as a record: no sketch change. */
        pthread_mutex_lock(&s->rec_lock);
        pthread_mutex_lock(&s->set_lock);
        part_count(s, victim, e.part, -1);
        rec_count(s, &e, 1);
        pthread_mutex_unlock(&s->set_lock);
        rec_put(s, &e, t, note);
        pthread_mutex_unlock(&s->rec_lock);
        chain_unlink(s, sp, pp);
    }
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

/* Buckets the hand visits under one stripe lock before it lets go. */
#define HAND_SPAN 64

/*
 * The age gate: the hand takes an unread item only when it was written
 * before the gate, the GATE_RANK-th oldest of the last GATE_SAMPLES
 * candidates it met (about the oldest quarter), so that eviction follows
 * write time and not the table's order. Versions are the same on every
 * node, so nodes under the same writes evict much the same items, and a
 * record of an eviction seldom has to become a drop that costs a peer its
 * copy. After GATE_SKIPS_MAX candidates that the gate kept, or once the
 * hand has gone round the table once in a call, the next unread one goes
 * anyway.
 */
static void gate_note(store *s, uint64_t ticks)
{
    s->ages[s->nages++ % GATE_SAMPLES] = ticks;
    if (s->nages % (GATE_SAMPLES / 4) != 0 || s->nages < GATE_SAMPLES / 4)
        return;
    size_t n = s->nages < GATE_SAMPLES ? (size_t)s->nages : GATE_SAMPLES;
    uint64_t v[GATE_SAMPLES];
    memcpy(v, s->ages, n * sizeof(v[0]));
    /* Insertion sort of at most 64: cheaper than anything cleverer. */
    for (size_t i = 1; i < n; i++) {
        uint64_t x = v[i];
        size_t j = i;
        for (; j > 0 && v[j - 1] > x; j--)
            v[j] = v[j - 1];
        v[j] = x;
    }
    s->gate = v[n / 4];
}

/*
 * Moves the clock's hand until it evicts one item (see "eviction clock").
 * Takes no lock on entry and returns with none. Returns 0 when it evicted
 * one, -1 when two full turns found nothing evictable.
 */
static int evict_one(store *s)
{
    uint64_t budget = 2 * (atomic_load(&s->nbuckets) +
                           atomic_load_explicit(&s->curr_items, RELAXED)) +
                      2 * HAND_SPAN;
    /* The gate applies to the first turn of the hand only. */
    uint64_t ungated = budget / 2;
    int done = 1; /* 1: still looking */
    unsigned skips = 0;
    store_item *note = NULL; /* a drop the eviction wrote */

    pthread_mutex_lock(&s->evict_lock);
    while (done == 1 && budget > 0) {
        struct stripe *sp = &s->stripes[s->hand_stripe];
        tnow t;

        pthread_mutex_lock(&sp->lock);
        tnow_get(s, &t);
        for (unsigned n = 0; n < HAND_SPAN && done == 1; n++) {
            if (s->hand_bucket > sp->mask)
                break;
            store_item **pp = &sp->buckets[s->hand_bucket];
            for (; *pp != NULL && budget > 0; budget--) {
                store_item *it = *pp;
                if (!evictable(it)) {
                    pp = &it->hnext;
                    continue;
                }
                uint8_t b = atomic_load_explicit(&it->abits, RELAXED);
                bool expired =
                    item_kind(it) == STORE_KIND_VALUE && !item_live(s, it, &t);
                if ((b & REF) && !expired) {
                    atomic_fetch_and_explicit(&it->abits, (uint8_t)~REF,
                                              RELAXED);
                    pp = &it->hnext;
                    continue;
                }
                if (!expired && s->opt.no_evict) {
                    /* -M: only expired values may go; look at a few. */
                    pp = &it->hnext;
                    if (++skips >= NO_EVICT_LOOK)
                        budget = 1; /* the loop's decrement ends it */
                    continue;
                }
                if (!expired) {
                    bool young = it->ticks > s->gate;
                    gate_note(s, it->ticks);
                    if (young && budget > ungated &&
                        skips++ < GATE_SKIPS_MAX) {
                        pp = &it->hnext;
                        continue;
                    }
                }
                evict_at(s, sp, key_gid(it->data, it->nkey), pp, &t, &note);
                done = 0;
                break;
            }
            if (done == 1) {
                s->hand_bucket++;
                if (budget > 0)
                    budget--;
            }
        }
        if (s->hand_bucket > sp->mask) {
            s->hand_bucket = 0;
            s->hand_stripe = (s->hand_stripe + 1) & (s->nstripes - 1);
        }
        pthread_mutex_unlock(&sp->lock);
    }
    pthread_mutex_unlock(&s->evict_lock);
    notify(s, note, true);
    return done == 0 ? 0 : -1;
}

/* The key table's buckets: counted in mem_used, never evicted. */
static inline size_t table_bytes(store *s)
{
    return atomic_load(&s->nbuckets) * sizeof(store_item *);
}

/* The limit writes evict down to under a memory limit of `bytes`: the
 * drops' first table is reserved (0 without records). */
static inline size_t items_limit(const store *s, size_t bytes)
{
    return bytes - s->drop_cap0 * DROP_ENTRY_BYTES;
}

/*
 * Makes room for `need` more bytes under memory_limit by evicting. Called
 * with no lock held. 0, or STORE_ERR_NOMEM when nothing evictable is left.
 */
static int ensure_room(store *s, size_t need)
{
    size_t limit = atomic_load_explicit(&s->item_limit, RELAXED);

    if (limit == 0)
        return 0;
    size_t table = table_bytes(s);
    if (table >= limit || need > limit - table)
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
    size_t limit = atomic_load_explicit(&s->item_limit, RELAXED);

    if (limit != 0 && atomic_load_explicit(&s->mem_used, RELAXED) > limit)
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
    o->psums = true;
}

static void parts_free(store *s)
{
    if (s->parts == NULL)
        return;
    for (uint32_t p = 0; p < s->nparts; p++) {
        if (s->parts[p].sk != NULL)
            riblt_sketch_destroy(s->parts[p].sk);
        free(s->parts[p].ps);
    }
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
    if (o->partitions != 0 &&
        (o->partitions > STORE_PARTITIONS_MAX || o->partition_fn == NULL ||
         o->partition_sketch_symbols == 0))
        return NULL;
    /* The record table comes out of memory_limit and must leave room. */
    size_t nrec = o->evict_record_bytes / EVREC_ENTRY_BYTES;
    if (nrec >= (1u << 31) ||
        (o->memory_limit != 0 && o->evict_record_bytes >= o->memory_limit))
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
    atomic_init(&s->item_limit, o->memory_limit);
    atomic_init(&s->limit_now, o->memory_limit);
    if (nrec != 0) {
        /* A sixteenth of the entries for drops to start with (at most
         * DROP_MAX_ENTRIES); that table grows beyond it when it must
         * (drops_resize counts the growth). */
        s->drop_cap0 = nrec / 16 ? nrec / 16 : 1;
        if (s->drop_cap0 > DROP_MAX_ENTRIES)
            s->drop_cap0 = DROP_MAX_ENTRIES; /* the bound holds for all */
        s->drop_cap_max = nrec < DROP_MAX_ENTRIES ? nrec : DROP_MAX_ENTRIES;
        s->recs = evrec_create(nrec > s->drop_cap0 ? nrec - s->drop_cap0 : 1,
                               rng_next());
        s->droptab = evrec_create_ordered(s->drop_cap0, rng_next());
        if (s->recs == NULL || s->droptab == NULL)
            goto fail_stripes;
        if (o->memory_limit != 0)
            atomic_store(&s->item_limit, items_limit(s, o->memory_limit));
    }

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
        atomic_fetch_add(&s->mem_used, (sp->mask + 1) * sizeof(*sp->buckets));
    }
    s->nparts = o->partitions ? o->partitions + 1 : 1;
    s->sk_symbols =
        o->partitions ? o->partition_sketch_symbols : o->sketch_symbols;
    s->parts = calloc(s->nparts, sizeof(*s->parts));
    if (s->parts == NULL)
        goto fail;
    for (uint32_t p = 0; p < s->nparts && s->sk_symbols != 0; p++) {
        if ((s->parts[p].sk = riblt_sketch_create(s->sk_symbols)) == NULL)
            goto fail;
        if (o->psums && (s->parts[p].ps = calloc(RIBLT_PSUM_SIZE,
                                                 sizeof(riblt_id))) == NULL)
            goto fail;
    }
    pthread_mutex_init(&s->set_lock, NULL);
    pthread_mutex_init(&s->evict_lock, NULL);
    pthread_mutex_init(&s->sweep_lock, NULL);
    pthread_mutex_init(&s->rec_lock, NULL);
    s->gate = UINT64_MAX;
    if (err)
        *err = STORE_OK;
    return s;

fail:
    for (size_t i = 0; i < s->nstripes; i++) {
        free(s->stripes[i].buckets);
        pthread_mutex_destroy(&s->stripes[i].lock);
    }
    free(s->stripes);
    parts_free(s);
fail_stripes:
    evrec_destroy(s->recs);
    evrec_destroy(s->droptab);
    free(s);
    return NULL;
}

/*
 * Frees the store and drops its reference to every item. Items callers
 * still hold stay readable (key, value, fields) until released.
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
                atomic_fetch_and_explicit(&it->abits, (uint8_t)~LINKED,
                                          RELAXED);
                store_item_release(it);
                it = next;
            }
        }
        free(sp->buckets);
        pthread_mutex_destroy(&sp->lock);
    }
    free(s->stripes);
    parts_free(s);
    pthread_mutex_destroy(&s->set_lock);
    pthread_mutex_destroy(&s->evict_lock);
    pthread_mutex_destroy(&s->sweep_lock);
    pthread_mutex_destroy(&s->rec_lock);
    evrec_destroy(s->recs);
    evrec_destroy(s->droptab);
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
static int commit_local(store *s, struct stripe *sp, const struct kh *k,
                        store_item *it, const tnow *t, uint64_t keep_cas,
                        store_item **note, uint64_t *cas_out)
{
    int r;

    it->ticks = clock_next(s, t->ns);
    it->node = s->opt.node_id;
    if (keep_cas != 0) {
        /* The caller allocated a trailer for it (item_new's xtra). */
        assert(it->km & XTRA);
        item_x_set(it, keep_cas);
    } else if (it->km & XTRA) {
        riblt_id id = make_id(k->gid, it->ticks, it->node);
        item_x_set(it, fresh_cas(&id));
    }
    if (atomic_load_explicit(&it->atime, RELAXED) == 0)
        atomic_init(&it->atime, (uint32_t)t->s);
    r = do_store_apply(s, sp, k, it, t);
    if (r == APPLY_STALE) {
        store_item_release(it);
        return r;
    }
    if (cas_out)
        *cas_out = keep_cas != 0 ? keep_cas : item_cas(it);
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
    struct kh k;
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
    k = key_kh(s, w->key, w->nkey);
    if (!concat) {
        /* The expiry is set under the lock (a relative one counts from
         * then); it is non-zero exactly when w's is. */
        struct item_shape sh = {w->flags, w->exptime != 0, w->new_cas != 0};
        it = item_new(STORE_KIND_VALUE, w->key, w->nkey, w->nvalue, sh);
        if (it == NULL)
            return STORE_ERR_NOMEM;
        if (w->nvalue)
            memcpy(item_value_ptr(it), w->value, w->nvalue);
        item_set_marks(it, w->marks);
    }

    sp = stripe_of(s, k.h);
    pthread_mutex_lock(&sp->lock);
    tnow_get(s, &t);
    pp = stripe_slot(sp, k.h, w->key, w->nkey);
    cur = *pp;
    if (cur != NULL && !item_live(s, cur, &t))
        cur = NULL;

    rc = STORE_STORED;
    bool stale = false;
    if (cas_mode) {
        if (cur == NULL)
            rc = STORE_NOT_FOUND;
        else if (item_cas(cur) != w->cas) {
            /* cas uniques are random: any other cas is older */
            if (w->invalidate)
                stale = true;
            else
                rc = STORE_EXISTS;
        }
    } else if (w->mode == STORE_ADD) {
        if (cur != NULL)
            rc = STORE_NOT_STORED;
    } else if (w->mode == STORE_REPLACE) {
        if (cur == NULL)
            rc = STORE_NOT_STORED;
    } else if (concat) {
        if (cur == NULL)
            rc = STORE_NOT_STORED;
        else if (w->cas != 0 && item_cas(cur) != w->cas)
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
        struct item_shape sh = {item_flags(cur), item_exptime(cur),
                                w->new_cas != 0};
        it = item_new(STORE_KIND_VALUE, w->key, w->nkey, total, sh);
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
    } else if (stale) {
        /* A recache that lost to an invalidation: stored, but still stale,
         * living no longer than the invalidated value. */
        it = item_reshape(it, item_exptime(cur));
        if (it == NULL) {
            pthread_mutex_unlock(&sp->lock);
            return STORE_ERR_NOMEM;
        }
        item_set_marks(it, (uint8_t)(STORE_MARK_STALE |
                                     (item_marks(cur) & STORE_MARK_WON)));
    } else {
        item_set_exptime(it, exptime_pack(stored_exptime(w->exptime, &t)));
    }
    if (commit_local(s, sp, &k, it, &t, w->new_cas, &note, cas_out) ==
        APPLY_STALE)
        rc = STORE_NOT_STORED;
    pthread_mutex_unlock(&sp->lock);
    notify(s, note, true);
    if (concat)
        trim(s);
    return rc;
}

/*
 * Why a key that is not live misses (store_read_info.why): the value it
 * holds is flushed or expired; 0 when it holds none (missing, tombstone).
 */
static int miss_reason(store *s, const store_item *it, const tnow *t)
{
    if (it == NULL || item_kind(it) != STORE_KIND_VALUE)
        return 0;
    return item_flushed(s, it, t) ? STORE_MISS_FLUSHED : STORE_MISS_EXPIRED;
}

static inline void read_info_clear(store_read_info *ri)
{
    if (ri != NULL)
        memset(ri, 0, sizeof(*ri));
}

/* store_get_ex and store_peek_ex: a read that records an access or not. */
static store_item *do_get(store *s, const char *key, size_t nkey,
                          store_read_info *ri, bool access)
{
    store_item *it;
    struct stripe *sp;
    struct kh k;
    tnow t;

    read_info_clear(ri);
    if (s == NULL || !key_ok(key, nkey))
        return NULL;
    k = key_kh(s, key, nkey);
    sp = stripe_of(s, k.h);
    pthread_mutex_lock(&sp->lock);
    tnow_get(s, &t);
    it = *stripe_slot(sp, k.h, key, nkey);
    if (it != NULL && item_live(s, it, &t)) {
        store_item_ref(it);
        if (access) {
            item_access(it, &t, ri);
        } else if (ri != NULL) {
            int64_t d =
                t.s - (int64_t)atomic_load_explicit(&it->atime, RELAXED);
            ri->last_access = d > 0 ? d : 0;
            ri->fetched =
                (atomic_load_explicit(&it->abits, RELAXED) & FETCHED) != 0;
        }
    } else {
        if (ri != NULL)
            ri->why = miss_reason(s, it, &t);
        it = NULL;
    }
    pthread_mutex_unlock(&sp->lock);
    return it;
}

store_item *store_get_ex(store *s, const char *key, size_t nkey,
                         store_read_info *ri)
{
    return do_get(s, key, nkey, ri, true);
}

store_item *store_peek_ex(store *s, const char *key, size_t nkey,
                          store_read_info *ri)
{
    return do_get(s, key, nkey, ri, false);
}

store_item *store_get(store *s, const char *key, size_t nkey)
{
    return store_get_ex(s, key, nkey, NULL);
}

/*
 * A new unlinked item for cur's key with the given flags and expiry (the
 * item's final ones: they shape it), cur's marks and its value (or an empty
 * one), that inherits the key's access history (as a read when is_read:
 * then *ri, when not NULL, gets the history before it). The caller holds
 * the stripe lock and adjusts the item before commit_local. NULL when out
 * of memory.
 */
static store_item *item_derive(store *s, const store_item *cur,
                               bool keep_value, bool is_read, const tnow *t,
                               store_read_info *ri, uint32_t flags,
                               uint32_t exptime)
{
    size_t nvalue = keep_value ? cur->nvalue : 0;
    /* With the 8-byte slot: a derived item mostly keeps cur's cas. */
    struct item_shape sh = {flags, exptime, true};
    store_item *it =
        item_new(STORE_KIND_VALUE, cur->data, cur->nkey, nvalue, sh);
    if (it == NULL)
        return NULL;
    if (nvalue)
        memcpy(item_value_ptr(it), cur->data + cur->nkey, nvalue);
    item_set_marks(it, item_marks(cur));
    uint8_t was = atomic_load_explicit(&cur->abits, RELAXED);
    uint8_t fetched = was & FETCHED;
    uint32_t atime = atomic_load_explicit(&cur->atime, RELAXED);
    /* The clock's REF bit passes on too: a touch is no reason to evict. */
    atomic_init(&it->abits,
                (uint8_t)(is_read ? FETCHED | REF : was & (FETCHED | REF)));
    atomic_init(&it->atime, is_read ? (uint32_t)t->s : atime);
    if (is_read && ri != NULL) {
        int64_t d = t->s - (int64_t)atime;
        ri->last_access = d > 0 ? d : 0;
        ri->fetched = fetched != 0;
    }
    return it;
}

/*
 * Replaces a live key by a copy with a new expiry (touch and gat). Returns
 * the new item with a reference for the caller when want_item, NULL when
 * the key is not live (*rc = STORE_NOT_FOUND) or on error (*rc < 0).
 */
static store_item *retouch(store *s, const char *key, size_t nkey,
                           int64_t exptime, bool is_read, int *rc,
                           store_read_info *ri)
{
    store_item *cur, *it, *note = NULL, *ret = NULL;
    struct stripe *sp;
    struct kh k;
    tnow t;

    *rc = STORE_ERR_INVAL;
    read_info_clear(ri);
    if (s == NULL || !key_ok(key, nkey))
        return NULL;
    k = key_kh(s, key, nkey);
    sp = stripe_of(s, k.h);
    pthread_mutex_lock(&sp->lock);
    tnow_get(s, &t);
    cur = *stripe_slot(sp, k.h, key, nkey);
    if (cur == NULL || !item_live(s, cur, &t)) {
        if (ri != NULL)
            ri->why = miss_reason(s, cur, &t);
        pthread_mutex_unlock(&sp->lock);
        *rc = STORE_NOT_FOUND;
        return NULL;
    }
    it = item_derive(s, cur, true, is_read, &t, ri, item_flags(cur),
                     exptime_pack(stored_exptime(exptime, &t)));
    if (it == NULL) {
        pthread_mutex_unlock(&sp->lock);
        *rc = STORE_ERR_NOMEM;
        return NULL;
    }
    int r = commit_local(s, sp, &k, it, &t, item_cas(cur), &note, NULL);
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
                         int64_t exptime, store_read_info *ri)
{
    int rc;
    return retouch(s, key, nkey, exptime, true, &rc, ri);
}

int store_touch(store *s, const char *key, size_t nkey, int64_t exptime)
{
    return store_touch_ex(s, key, nkey, exptime, NULL);
}

int store_touch_ex(store *s, const char *key, size_t nkey, int64_t exptime,
                   int *why)
{
    store_read_info ri;
    int rc;

    retouch(s, key, nkey, exptime, false, &rc, &ri);
    if (why)
        *why = ri.why;
    return rc;
}

int store_delete(store *s, const char *key, size_t nkey, uint64_t cas)
{
    store_item *cur, *it, *note = NULL;
    struct stripe *sp;
    struct kh k;
    int rc = STORE_DELETED;
    tnow t;

    if (s == NULL || !key_ok(key, nkey))
        return STORE_ERR_INVAL;
    k = key_kh(s, key, nkey);
    /* Allocated before the lock: a tombstone is never larger than what it
     * replaces, so it needs no room check. */
    /* Its expiry field holds the second it is written (set below). */
    struct item_shape sh = {0, 1, false};
    it = item_new(STORE_KIND_TOMBSTONE, key, nkey, 0, sh);
    if (it == NULL)
        return STORE_ERR_NOMEM;
    sp = stripe_of(s, k.h);
    pthread_mutex_lock(&sp->lock);
    tnow_get(s, &t);
    cur = *stripe_slot(sp, k.h, key, nkey);
    if (cur == NULL || !item_live(s, cur, &t))
        rc = STORE_NOT_FOUND;
    else if (cas != 0 && item_cas(cur) != cas)
        rc = STORE_EXISTS;
    if (rc != STORE_DELETED) {
        pthread_mutex_unlock(&sp->lock);
        store_item_release(it);
        return rc;
    }
    item_set_exptime(it, exptime_pack(t.s));
    if (commit_local(s, sp, &k, it, &t, 0, &note, NULL) == APPLY_STALE)
        rc = STORE_NOT_FOUND;
    pthread_mutex_unlock(&sp->lock);
    notify(s, note, true);
    return rc;
}

int store_delete_ex(store *s, const store_delete_req *r)
{
    store_item *cur, *it = NULL, *note = NULL;
    struct stripe *sp;
    struct kh k;
    uint64_t keep_cas;
    int rc;
    tnow t;

    if (s == NULL || r == NULL || !key_ok(r->key, r->nkey))
        return STORE_ERR_INVAL;
    if (!r->invalidate && !r->clear_value)
        return store_delete(s, r->key, r->nkey, r->cas);
    k = key_kh(s, r->key, r->nkey);
    sp = stripe_of(s, k.h);
    pthread_mutex_lock(&sp->lock);
    tnow_get(s, &t);
    cur = *stripe_slot(sp, k.h, r->key, r->nkey);
    if (cur == NULL || !item_live(s, cur, &t))
        rc = STORE_NOT_FOUND;
    else if (r->cas != 0 && item_cas(cur) != r->cas)
        rc = STORE_EXISTS;
    else if ((it = item_derive(
                  s, cur, !r->clear_value, false, &t, NULL,
                  r->clear_value ? 0 : item_flags(cur),
                  r->set_ttl ? exptime_pack(stored_exptime(r->exptime, &t))
                  : r->clear_value ? 0
                                   : item_exptime(cur))) == NULL)
        rc = STORE_ERR_NOMEM;
    else
        rc = STORE_DELETED;
    if (rc != STORE_DELETED) {
        pthread_mutex_unlock(&sp->lock);
        return rc;
    }
    keep_cas = r->new_cas != 0 ? r->new_cas : item_cas(cur);
    if (r->clear_value)
        item_set_marks(it, 0);
    if (r->invalidate) {
        item_set_marks(it, STORE_MARK_STALE); /* the next reader may win */
        keep_cas = r->new_cas;                /* 0: a fresh one */
    }
    if (commit_local(s, sp, &k, it, &t, keep_cas, &note, NULL) == APPLY_STALE)
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
    struct kh k;
    int rc = STORE_NOT_STORED;
    tnow t;

    if (s == NULL || seen == NULL || item_kind(seen) != STORE_KIND_VALUE)
        return STORE_ERR_INVAL;
    k = key_kh(s, seen->data, seen->nkey);
    sp = stripe_of(s, k.h);
    pthread_mutex_lock(&sp->lock);
    tnow_get(s, &t);
    cur = *stripe_slot(sp, k.h, seen->data, seen->nkey);
    if (cur == seen && item_live(s, cur, &t) &&
        (item_marks(cur) & STORE_MARK_WON) == 0) {
        it = item_derive(s, cur, true, false, &t, NULL, item_flags(cur),
                         item_exptime(cur));
        if (it == NULL) {
            rc = STORE_ERR_NOMEM;
        } else {
            item_set_marks(it, item_marks(it) | STORE_MARK_WON);
            if (commit_local(s, sp, &k, it, &t, item_cas(cur), &note, NULL) !=
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
    struct kh k;
    uint64_t v;
    int rc;
    tnow t;

    if (s == NULL || r == NULL || !key_ok(r->key, r->nkey))
        return STORE_ERR_INVAL;
    rc = ensure_room(s, item_total(r->nkey, 20));
    if (rc < 0)
        return rc;
    k = key_kh(s, r->key, r->nkey);
    sp = stripe_of(s, k.h);
    pthread_mutex_lock(&sp->lock);
    tnow_get(s, &t);
    cur = *stripe_slot(sp, k.h, r->key, r->nkey);
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
        if (r->cas != 0 && item_cas(cur) != r->cas) {
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
    /* One mutation for the number and, with touch, the new expiry. */
    struct item_shape sh = {
        cur != NULL ? item_flags(cur) : 0,
        r->touch      ? exptime_pack(stored_exptime(r->touch_exptime, &t))
        : cur != NULL ? item_exptime(cur)
                      : exptime_pack(stored_exptime(r->exptime, &t)),
        r->new_cas != 0};
    it = item_new(STORE_KIND_VALUE, r->key, r->nkey, len, sh);
    if (it == NULL) {
        pthread_mutex_unlock(&sp->lock);
        return STORE_ERR_NOMEM;
    }
    memcpy(item_value_ptr(it), digits, nd);
    if (len > nd)
        memset(item_value_ptr(it) + nd, ' ', len - nd);
    if (commit_local(s, sp, &k, it, &t, r->new_cas, &note, cas_out) ==
        APPLY_STALE)
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
    struct kh k;
    int r;
    tnow t;

    if (s == NULL)
        return STORE_ERR_INVAL;
    k = key_kh(s, "", 0);
    struct item_shape sh = {0, 0, true};
    it = item_new(STORE_KIND_FLUSH, "", 0, 0, sh);
    if (it == NULL)
        return STORE_ERR_NOMEM;
    sp = stripe_of(s, k.h);
    pthread_mutex_lock(&sp->lock);
    tnow_get(s, &t);
    it->ticks = clock_next(s, t.ns);
    it->node = s->opt.node_id;
    item_x_set(it, it->ticks + (uint64_t)delay * NS_PER_S);
    /* The flush must see itself as in effect when it is immediate. */
    if (it->ticks > t.peek)
        t.peek = it->ticks;
    atomic_init(&it->atime, (uint32_t)t.s);
    r = do_store_apply(s, sp, &k, it, &t);
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
    case STORE_KIND_EVICTED:
    case STORE_KIND_DROP:
        return m->nkey == 0 && m->nvalue == 0 && m->id.hi != 0;
    default:
        return false;
    }
}

static inline bool kind_keyless(uint8_t kind)
{
    return kind == STORE_KIND_EVICTED || kind == STORE_KIND_DROP;
}

uint32_t store_mutation_partition(const store *s, const store_mutation *m)
{
    if (!kind_keyless(m->kind))
        return key_part(s, m->nkey ? m->key : "", m->nkey);
    /* Keyless records carry their key's partition; never the global one. */
    if (s->opt.partitions == 0)
        return m->flags == 0 ? 0 : 1;
    return m->flags < s->opt.partitions ? m->flags : s->opt.partitions + 1;
}

/* store_apply of a keyless mutation (mutation_ok'd). */
static int apply_keyless(store *s, const store_mutation *m)
{
    store_item *note = NULL;
    uint32_t part = store_mutation_partition(s, m);
    riblt_id want = make_id(m->id.hi, m->version.ticks, m->version.node);
    struct stripe *sp;
    uint64_t h;
    int r;
    tnow t;

    if (s->recs == NULL || part > s->opt.partitions ||
        (s->opt.partitions != 0 && part == s->opt.partitions) ||
        want.lo != m->id.lo)
        return STORE_ERR_INVAL;
    evrec_entry e = {.gid = m->id.hi,
                     .ticks = m->version.ticks,
                     .node = m->version.node,
                     .exptime = exptime_pack(m->exptime),
                     .part = (uint16_t)part,
                     .kind = m->kind};
    clock_catch_up(s, m->version.ticks);
    h = bucket_hash(s->seed, e.gid);
    sp = stripe_of(s, h);
    pthread_mutex_lock(&sp->lock);
    tnow_get(s, &t);
    r = do_apply_keyless(s, sp, h, &e, &t, &note);
    pthread_mutex_unlock(&sp->lock);
    /* A drop this apply wrote (its record table overflowed) is ours. */
    notify(s, note, true);
    if (r != APPLY_LINKED) {
        COUNT_ADD(s, stale_remote, 1);
        return STORE_STALE;
    }
    COUNT_ADD(s, applied_remote, 1);
    return STORE_OK;
}

int store_apply(store *s, const store_mutation *m)
{
    store_item *it, *note = NULL;
    const char *key;
    struct stripe *sp;
    struct kh k;
    int r;
    tnow t;

    if (s == NULL || m == NULL || !mutation_ok(m))
        return STORE_ERR_INVAL;
    if (kind_keyless(m->kind))
        return apply_keyless(s, m);
    if (item_total(m->nkey, m->nvalue) > s->opt.item_size_max)
        return STORE_ERR_TOO_LARGE;
    key = m->nkey ? m->key : "";
    k = key_kh(s, key, m->nkey);
    /* The id is a function of key and version: one that is not cannot be
     * this mutation's, whoever sent it. */
    riblt_id want = make_id(k.gid, m->version.ticks, m->version.node);
    if (want.lo != m->id.lo || want.hi != m->id.hi)
        return STORE_ERR_INVAL;
    clock_catch_up(s, m->version.ticks);
    sp = stripe_of(s, k.h);
    if (s->opt.memory_limit != 0) {
        /*
         * A mutation the key already beats must not evict anything to make
         * room for itself. This early look only saves that; the decision
         * is do_store_apply's, under the lock, below.
         */
        pthread_mutex_lock(&sp->lock);
        store_item *cur = *stripe_slot(sp, k.h, key, m->nkey);
        bool kept = cur != NULL && item_kept(cur);
        evrec_entry re;
        bool rec = (cur == NULL || kept) && rec_lookup(s, k.gid, &re);
        store_version cv = rec           ? rec_version(&re)
                           : cur != NULL ? item_version(cur)
                                         : m->version;
        /* A kept value without its drop is for do_store_apply to bring
         * back into the set. */
        int c = store_version_cmp(&m->version, &cv);
        bool beaten = rec ? c <= 0 : cur != NULL && !kept && c <= 0;
        if (rec)
            pthread_mutex_unlock(&s->rec_lock);
        pthread_mutex_unlock(&sp->lock);
        if (beaten) {
            COUNT_ADD(s, stale_remote, 1);
            return STORE_STALE;
        }
        r = ensure_room(s, item_total(m->nkey, m->nvalue));
        if (r < 0)
            return r;
    }
    /* The cas comes with the mutation: the same on every node. A trailer
     * keeps it when it is not the one its id gives (touch kept an older
     * one), and a FLUSH's flush_at. */
    riblt_id mid = make_id(k.gid, m->version.ticks, m->version.node);
    bool flush = m->kind == STORE_KIND_FLUSH;
    struct item_shape sh = {flush ? 0 : m->flags,
                            flush ? 0 : exptime_pack(m->exptime),
                            flush || m->cas != fresh_cas(&mid)};
    it = item_new(m->kind, key, m->nkey, m->nvalue, sh);
    if (it == NULL)
        return STORE_ERR_NOMEM;
    if (m->nvalue)
        memcpy(item_value_ptr(it), m->value, m->nvalue);
    it->ticks = m->version.ticks;
    it->node = m->version.node;
    item_set_marks(it, m->marks);
    if (sh.xtra)
        item_x_set(it, flush ? m->flush_at : m->cas);

    pthread_mutex_lock(&sp->lock);
    tnow_get(s, &t);
    atomic_init(&it->atime, (uint32_t)t.s);
    r = do_store_apply(s, sp, &k, it, &t);
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

/* The linked item whose mutation id is *id, referenced, or NULL. */
store_item *store_fetch(store *s, const riblt_id *id)
{
    struct stripe *sp;
    store_item *it;
    uint64_t h;

    if (s == NULL || id == NULL)
        return NULL;
    h = bucket_hash(s->seed, id->hi);
    sp = stripe_of(s, h);
    pthread_mutex_lock(&sp->lock);
    it = stripe_find_id(sp, h, id);
    if (it != NULL)
        store_item_ref(it);
    pthread_mutex_unlock(&sp->lock);
    return it;
}

/* The record whose mutation id is *id into *e; false when none. */
static bool rec_fetch(store *s, const riblt_id *id, evrec_entry *e)
{
    bool found;

    if (!rec_lookup(s, id->hi, e))
        return false;
    riblt_id mine = rec_id(e);
    found = mine.lo == id->lo;
    pthread_mutex_unlock(&s->rec_lock);
    return found;
}

bool store_fetch_mutation(store *s, const riblt_id *id, store_mutation *m,
                          store_item **hold)
{
    evrec_entry e;

    *hold = NULL;
    if (s == NULL || id == NULL)
        return false;
    *hold = store_fetch(s, id);
    if (*hold != NULL) {
        store_item_mutation(*hold, m);
        return true;
    }
    if (!rec_fetch(s, id, &e))
        return false;
    memset(m, 0, sizeof(*m));
    m->id = *id;
    m->version = rec_version(&e);
    m->kind = e.kind;
    m->exptime = e.exptime;
    m->flags = e.part;
    return true;
}

bool store_has(store *s, const riblt_id *id)
{
    store_item *it = store_fetch(s, id);
    evrec_entry e;

    store_item_release(it);
    return it != NULL || (s != NULL && id != NULL && rec_fetch(s, id, &e));
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

uint32_t store_item_partition(const store *s, const store_item *it)
{
    return item_part(s, it);
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
                      riblt_symbol *out, size_t n, riblt_id *psums,
                      int64_t *set_size)
{
    int64_t total = 0;
    size_t held = 0;

    if (n != 0)
        memset(out, 0, n * sizeof(*out));
    if (psums != NULL)
        memset(psums, 0, RIBLT_PSUM_SIZE * sizeof(*psums));
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
        if (psums != NULL && s->parts[p].ps != NULL) {
            riblt_psum_add(psums, s->parts[p].ps, RIBLT_PSUM_SIZE);
            held += RIBLT_PSUM_SIZE / 2; /* 16-byte terms, 32-byte cells */
        }
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
    sum_parts(s, bits, offset, out, n, NULL, set_size);
    free(bits);
    return STORE_OK;
}

int store_sketch_snapshot_parts(store *s, const uint32_t *parts, size_t nparts,
                                riblt_symbol *out, size_t n, riblt_id *psums,
                                int64_t *set_size)
{
    uint64_t *bits;
    int r;

    if (s == NULL || (out == NULL && n != 0) || n > s->sk_symbols)
        return STORE_ERR_INVAL;
    r = parts_bitmap(s, parts, nparts, &bits);
    if (r < 0)
        return r;
    sum_parts(s, bits, 0, out, n, psums, set_size);
    free(bits);
    return STORE_OK;
}

bool store_has_psums(const store *s)
{
    return s != NULL && s->sk_symbols != 0 && s->parts[0].ps != NULL;
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
        sum_parts(s, bits, offset, out, n, NULL, set_size);
        free(bits);
        return STORE_OK;
    }
    pthread_mutex_lock(&s->set_lock);
    if (s->parts[0].sk == NULL) /* no sketch: zero symbols */
        r = n == 0 && offset == 0 ? RIBLT_OK : RIBLT_ERR_INVAL;
    else
        r = n ? riblt_sketch_read(s->parts[0].sk, offset, out, n) : RIBLT_OK;
    if (set_size)
        *set_size = s->parts[0].sk != NULL ? riblt_sketch_count(s->parts[0].sk)
                                           : (int64_t)s->parts[0].mutations;
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

/* ============================================================= set walks */

/*
 * Mutations in the set (caller holds set_lock) of the partitions marked in
 * bits (NULL: all): their number, which sizes a snapshot of them.
 */
static uint64_t set_count(store *s, const uint64_t *bits)
{
    uint64_t n = 0;

    if (bits == NULL)
        return s->set_count;
    for (uint32_t p = 0; p < s->nparts; p++)
        if (bit_has(bits, p))
            n += s->parts[p].mutations;
    return n;
}

/* Collects record ids into a snapshot (evrec_walk callback; never
 * removes). */
struct rec_collect {
    riblt_id *v;
    size_t n, cap;
    const uint64_t *bits;
    bool failed;
};

static bool rec_collect_fn(void *arg, const evrec_entry *e)
{
    struct rec_collect *rc = arg;

    if ((rc->bits == NULL || bit_has(rc->bits, e->part)) && rc->n < rc->cap)
        rc->v[rc->n++] = rec_id(e);
    return false;
}

/*
 * Snapshot of the set's ids in the partitions marked in bits (NULL: all)
 * into *out (the caller frees it): first the records' (under rec_lock, at
 * once), then the key table one stripe lock at a time, each stripe's ids
 * those of one instant, the stripes' of successive instants (a walk under
 * every lock at once would stall every read). The result is a set: no id
 * is listed twice. An item evicted during the walk may be missing (its
 * record came after the records were read, its stripe was read after it
 * left), never listed twice; records first is what rules that out, since
 * a record never turns back into an item with the same id (an equal
 * version is stale). A key written during the walk may be listed with
 * both its record's id and its new item's: two mutations the set held at
 * different instants, which a round resolves like any difference.
 * Returns the number of ids; 0 with *out NULL when the snapshot cannot be
 * allocated.
 */
static size_t set_snapshot(store *s, const uint64_t *bits, riblt_id **out)
{
    size_t n = 0, cap;
    riblt_id *v;

    pthread_mutex_lock(&s->set_lock);
    cap = (size_t)set_count(s, bits);
    pthread_mutex_unlock(&s->set_lock);
    cap += cap / 16 + 64; /* writes during the walk */
    v = malloc(cap * sizeof(*v));
    *out = NULL;
    if (v == NULL)
        return 0;
    if (s->recs != NULL) {
        pthread_mutex_lock(&s->rec_lock);
        struct rec_collect rc = {v, 0, cap, bits, false};
        size_t nr = evrec_count(s->recs) + evrec_count(s->droptab);
        uint64_t cursors[2] = {0, 0};
        if (nr > cap) {
            rc.cap = nr + cap;
            rc.v = realloc(v, rc.cap * sizeof(*v));
            rc.failed = rc.v == NULL;
        }
        if (!rc.failed)
            recs_walk(s, cursors, SIZE_MAX, rec_collect_fn, &rc);
        pthread_mutex_unlock(&s->rec_lock);
        if (rc.failed) {
            free(v);
            return 0;
        }
        v = rc.v;
        n = rc.n;
        cap = rc.cap;
    }
    for (size_t i = 0; i < s->nstripes; i++) {
        struct stripe *sp = &s->stripes[i];
        pthread_mutex_lock(&sp->lock);
        if (n + sp->count > cap) {
            size_t ncap = (n + sp->count) * 2;
            riblt_id *nv = realloc(v, ncap * sizeof(*v));
            if (nv == NULL) {
                pthread_mutex_unlock(&sp->lock);
                free(v);
                return 0;
            }
            v = nv;
            cap = ncap;
        }
        for (uint64_t b = 0; b <= sp->mask; b++)
            for (store_item *it = sp->buckets[b]; it; it = it->hnext)
                if (!item_kept(it) &&
                    (bits == NULL || bit_has(bits, item_part(s, it))))
                    v[n++] = item_id(it);
        pthread_mutex_unlock(&sp->lock);
    }
    *out = v;
    return n;
}

/* Hands a snapshot to fn as tails (none recorded) and frees it. */
static size_t give_tails(riblt_id *v, size_t n, store_tail_fn fn, void *arg)
{
    riblt_tail t = {0, 0};

    for (size_t i = 0; i < n; i++)
        fn(arg, &v[i], &t);
    free(v);
    return n;
}

/* Hands a snapshot to fn (no lock held) and frees it. */
static size_t give_ids(riblt_id *v, size_t n, store_id_fn fn, void *arg)
{
    for (size_t i = 0; i < n; i++)
        fn(arg, &v[i]);
    free(v);
    return n;
}

/*
 * Snapshot of the set's ids (see set_snapshot), then handed to fn with no
 * lock held; no tails are recorded (the encoder walks each id from its
 * start).
 */
size_t store_journal_tails(store *s, store_tail_fn fn, void *arg)
{
    riblt_id *v;
    size_t n;

    if (s == NULL || fn == NULL)
        return 0;
    n = set_snapshot(s, NULL, &v);
    return give_tails(v, n, fn, arg);
}

/*
 * Snapshot of the set's ids (see set_snapshot), then handed to fn with no
 * lock held (fn may call into the store). Returns 0 without calling fn
 * when the snapshot cannot be allocated.
 */
size_t store_journal_ids(store *s, store_id_fn fn, void *arg)
{
    riblt_id *v;
    size_t n;

    if (s == NULL || fn == NULL)
        return 0;
    n = set_snapshot(s, NULL, &v);
    return give_ids(v, n, fn, arg);
}

size_t store_journal_tails_parts(store *s, const uint32_t *parts,
                                 size_t nparts, store_tail_fn fn, void *arg)
{
    uint64_t *bits;
    riblt_id *v;
    size_t n;

    if (s == NULL || fn == NULL || parts_bitmap(s, parts, nparts, &bits) < 0)
        return 0;
    n = set_snapshot(s, bits, &v);
    free(bits);
    return give_tails(v, n, fn, arg);
}

size_t store_journal_ids_parts(store *s, const uint32_t *parts, size_t nparts,
                               store_id_fn fn, void *arg)
{
    uint64_t *bits;
    riblt_id *v;
    size_t n;

    if (s == NULL || fn == NULL || parts_bitmap(s, parts, nparts, &bits) < 0)
        return 0;
    n = set_snapshot(s, bits, &v);
    free(bits);
    return give_ids(v, n, fn, arg);
}

/* ======================================================= maintenance */

/* Takes dead records out of the set (evrec_walk callback, rec_lock held). */
struct rec_sweep {
    store *s;
    tnow t;
    const uint64_t *bits; /* drop: the partitions to take, dead or not */
    size_t left;          /* removals allowed */
};

static bool rec_sweep_fn(void *arg, const evrec_entry *e)
{
    struct rec_sweep *rs = arg;

    if (rs->left == 0 || (rs->bits != NULL ? !bit_has(rs->bits, e->part)
                                           : !rec_dead(rs->s, e, &rs->t)))
        return false;
    rec_set_remove(rs->s, e);
    rs->left--;
    return true;
}

/*
 * Whether the key table may hold an item the sweep would remove: one that
 * can die (item_mortal), or a flush whose time has come that no whole
 * pass begun after it has swept. A store of values without expiry (and no
 * flush) is not walked at all: nothing there can die, and walking it
 * would cost a cache miss per item every second, busy or idle. Caller
 * holds sweep_lock. The count is read without the stripe locks: an item
 * linked meanwhile is found at the next call.
 */
static bool sweep_wanted(store *s, const tnow *t)
{
    if (atomic_load_explicit(&s->mortal, RELAXED) > 0)
        return true;
    uint64_t f = atomic_load_explicit(&s->flush_at, memory_order_acquire);
    return f != 0 && f != s->flush_swept && t->peek >= f;
}

/*
 * Walks the key table from where the previous call stopped, removing dead
 * items, until it removed `budget` of them, visited about 8 * budget + 256
 * buckets, or came round once; then the record tables likewise from their
 * own cursors, with what is left of both bounds (at least a quarter of
 * the visits). One stripe lock at a time; concurrent sweeps take turns.
 * The key table is skipped while nothing in it can die (sweep_wanted).
 */
size_t store_sweep(store *s, size_t budget)
{
    size_t removed = 0, visits = 0, checked = 0, cap, stripes_left;
    tnow t0;

    if (s == NULL || budget == 0)
        return 0;
    cap = budget > (SIZE_MAX - 256) / 8 ? SIZE_MAX : budget * 8 + 256;
    pthread_mutex_lock(&s->sweep_lock);
    tnow_get(s, &t0);
    stripes_left = sweep_wanted(s, &t0) ? s->nstripes + 1 : 0;
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
                checked++;
                if (!item_dead(s, it, &t)) {
                    pp = &it->hnext;
                    continue;
                }
                if (item_kind(it) == STORE_KIND_VALUE) {
                    COUNT_ADD(s, reclaimed, 1);
                    if (!(atomic_load_explicit(&it->abits, RELAXED) & FETCHED))
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
            if (s->sweep_stripe == 0) {
                /* A whole pass: begun after a flush's time, it swept
                 * every item that flush killed. */
                uint64_t f =
                    atomic_load_explicit(&s->flush_at, memory_order_acquire);
                if (f != 0 && s->pass_began >= f)
                    s->flush_swept = f;
                s->pass_began = t.peek;
            }
        }
        pthread_mutex_unlock(&sp->lock);
    }
    COUNT_ADD(s, sweep_checked, checked);
    if (s->recs != NULL && removed < budget) {
        /* The records get what the key table left of the visits, and at
         * least a quarter of them: a key table larger than one call's
         * visits never comes round within a call, and records and drops
         * were then never swept (a drop stayed past its minute). */
        size_t rvisits = visits < cap ? cap - visits : 0;
        if (rvisits < cap / 4)
            rvisits = cap / 4;
        struct rec_sweep rs = {s, {0, 0, 0}, NULL, budget - removed};
        tnow_get(s, &rs.t);
        pthread_mutex_lock(&s->rec_lock);
        removed += recs_walk(s, s->rec_cursor, rvisits, rec_sweep_fn, &rs);
        /* Drops expire in a minute: give back what a burst grew. */
        size_t dcap = evrec_capacity(s->droptab);
        if (dcap > s->drop_cap0 && evrec_count(s->droptab) < dcap / 4)
            drops_resize(s, dcap / 2 > s->drop_cap0 ? dcap / 2 : s->drop_cap0);
        recs_sync(s);
        pthread_mutex_unlock(&s->rec_lock);
    }
    pthread_mutex_unlock(&s->sweep_lock);
    COUNT_ADD(s, swept, removed);
    return removed;
}

bool store_walk(store *s, size_t *cursor, size_t budget, store_walk_fn fn,
                void *arg)
{
    size_t seen = 0;

    while (*cursor < s->nstripes && seen < budget) {
        struct stripe *sp = &s->stripes[*cursor];
        tnow t;

        pthread_mutex_lock(&sp->lock);
        tnow_get(s, &t);
        for (uint64_t b = 0; b <= sp->mask; b++) {
            for (store_item *it = sp->buckets[b]; it != NULL; it = it->hnext) {
                if (!item_live(s, it, &t))
                    continue;
                store_item_info ii;
                item_info(it, &ii);
                fn(arg, &ii);
                seen++;
            }
        }
        pthread_mutex_unlock(&sp->lock);
        (*cursor)++;
    }
    return *cursor < s->nstripes;
}

/*
 * What drop may take of the marked partitions: their mutations but a held
 * flush, which is never dropped, and their kept values (caller holds
 * set_lock).
 */
static uint64_t droppable(store *s, const uint64_t *bits)
{
    uint64_t n = set_count(s, bits);
    uint32_t g = s->opt.partitions; /* the flush's partition */

    if (n != 0 && bit_has(bits, g) &&
        atomic_load_explicit(&s->flush_at, memory_order_acquire) != 0)
        n--;
    for (uint32_t p = 0; p < s->nparts; p++)
        if (bit_has(bits, p))
            n += s->parts[p].kept;
    return n;
}

/*
 * Walks the key table from the drop cursor, one stripe lock at a time,
 * unlinking every non-flush item of the marked partitions (do_unlink: key
 * table, set, sketch, accounting; no tombstone, no listener; and records),
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
    if (s->recs != NULL && left > 0) {
        struct rec_sweep rs = {s, {0, 0, 0}, bits, budget};
        pthread_mutex_lock(&s->rec_lock);
        size_t n = recs_walk(s, s->drop_rec_cursor, cap, rec_sweep_fn, &rs);
        recs_sync(s);
        pthread_mutex_unlock(&s->rec_lock);
        removed += n;
        left = n < left ? left - n : 0;
    }
    stripes_left = left ? s->nstripes + 1 : 0;
    while (stripes_left > 0 && DROP_MORE) {
        struct stripe *sp = &s->stripes[s->drop_stripe];

        pthread_mutex_lock(&sp->lock);
        while (s->drop_bucket <= sp->mask && DROP_MORE) {
            store_item **pp = &sp->buckets[s->drop_bucket];
            while (*pp != NULL && DROP_MORE) {
                store_item *it = *pp;
                visits++;
                if (item_kind(it) == STORE_KIND_FLUSH ||
                    !bit_has(bits, item_part(s, it))) {
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

int store_set_memory_limit(store *s, size_t bytes)
{
    size_t rec = 0;

    if (s == NULL || bytes == 0 || s->opt.memory_limit == 0)
        return STORE_ERR_INVAL;
    if (s->recs != NULL)
        rec = evrec_capacity(s->recs) * EVREC_ENTRY_BYTES +
              s->drop_cap0 * DROP_ENTRY_BYTES;
    if (bytes <= rec)
        return STORE_ERR_INVAL;
    /* Readers take either limit; a write in flight may use the old one. */
    atomic_store_explicit(&s->limit_now, bytes, RELAXED);
    atomic_store_explicit(&s->item_limit, items_limit(s, bytes), RELAXED);
    trim(s);
    return STORE_OK;
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
    out->limit_maxbytes = atomic_load_explicit(&s->limit_now, RELAXED);
    out->evictions = atomic_load_explicit(&s->evictions, RELAXED);
    out->expired_unfetched =
        atomic_load_explicit(&s->expired_unfetched, RELAXED);
    out->evicted_unfetched =
        atomic_load_explicit(&s->evicted_unfetched, RELAXED);
    out->reclaimed = atomic_load_explicit(&s->reclaimed, RELAXED);
    pthread_mutex_lock(&s->set_lock);
    out->mutations = s->set_count;
    for (uint32_t p = 0; p < s->nparts; p++)
        out->kept_items += s->parts[p].kept;
    pthread_mutex_unlock(&s->set_lock);
    out->tombstones = atomic_load_explicit(&s->tombstones, RELAXED);
    if (s->recs != NULL) {
        pthread_mutex_lock(&s->rec_lock);
        out->evicted_records = s->rec_evicted;
        out->drops = s->rec_drops;
        pthread_mutex_unlock(&s->rec_lock);
        out->evict_records = evrec_capacity(s->recs);
    }
    out->drops_written = atomic_load_explicit(&s->drops_written, RELAXED);
    out->applied_remote = atomic_load_explicit(&s->applied_remote, RELAXED);
    out->stale_remote = atomic_load_explicit(&s->stale_remote, RELAXED);
    out->swept = atomic_load_explicit(&s->swept, RELAXED);
    out->sweep_checked = atomic_load_explicit(&s->sweep_checked, RELAXED);
    out->dropped = atomic_load_explicit(&s->dropped, RELAXED);
    out->hash_power_level = level;
    out->hash_bytes = table_bytes(s);
    chunk_stats cs;
    chunk_stats_read(&cs);
    out->item_page_bytes = cs.pages * CHUNK_PAGE;
    out->item_chunk_bytes = cs.chunk_bytes;
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
