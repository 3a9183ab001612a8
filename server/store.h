/*
 * store.h -- the versioned mutation store.
 *
 * Every key's current state is one immutable mutation: a hybrid-clock
 * version (ticks, node), a kind (value, tombstone, flush), the client flags,
 * an absolute expiry, the cas unique and the value, named by a 128-bit id
 * derived from key and version (store_mutation_id). The store keeps
 *   - the key table (key -> current mutation), under striped locks. Its
 *     mutations are the set that nodes reconcile: exactly the ids of the
 *     current mutation of every key held, tombstones included until swept.
 *     An id's high word is its key's cluster-wide hash, so the key table
 *     also finds a mutation by id;
 *   - the materialized R-IBLT sketch of that set; in partitioned mode
 *     (store_options.partitions) one sketch per partition, the set being
 *     split by key (see "Partitions" below).
 *
 * All writes, from clients and from peers, end in one internal function that
 * compares versions (last writer wins: a mutation replaces the current one
 * only with a strictly greater version), swaps the key's entry and updates
 * set and sketch together. That is the only place versions are compared
 * and the only place the sketch changes.
 *
 * Items handed out by the store are reference counted and immutable: a
 * caller holding a reference may read key and value without any lock, for as
 * long as it holds the reference (store_item_release drops it).
 *
 * This header is the store's whole public interface; replication/ uses it
 * and nothing else of server/.
 */
#ifndef STORE_H
#define STORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "riblt.h"
#include "riblt_psum.h"

/* Return codes of store operations (>= 0 outcomes, < 0 errors). */
enum store_rc {
    STORE_OK = 0,          /* done (get hit, apply accepted, flush done) */
    STORE_STORED = 1,      /* write stored */
    STORE_NOT_STORED = 2,  /* add on existing key, replace/append on missing */
    STORE_EXISTS = 3,      /* cas mismatch */
    STORE_NOT_FOUND = 4,   /* missing key (cas, delete, incr, touch, get) */
    STORE_DELETED = 5,     /* delete done */
    STORE_NON_NUMERIC = 6, /* incr/decr on a value that is not a number */
    STORE_STALE = 7,       /* apply: version not greater, mutation dropped */
    STORE_ERR_NOMEM = -1,  /* memory limit reached and nothing evictable */
    STORE_ERR_TOO_LARGE = -2, /* item larger than item_size_max */
    STORE_ERR_INVAL = -3,     /* malformed mutation or argument */
};

const char *store_strerror(int rc);

/* A version: compare ticks, then node. Larger wins. */
typedef struct store_version {
    uint64_t ticks; /* hybrid clock: nanoseconds since the epoch, or more */
    uint32_t node;  /* node id of the writer */
} store_version;

/* Returns <0, 0, >0 as a is older than, equal to, newer than b. */
int store_version_cmp(const store_version *a, const store_version *b);

enum store_kind {
    STORE_KIND_VALUE = 0,     /* a live value */
    STORE_KIND_TOMBSTONE = 1, /* delete or eviction; swept after the grace.
                                 flags: bit 0 set marks an eviction
                                 tombstone (short-lived, itself evictable),
                                 other bits 0; exptime: the unix second it
                                 was written (0 = take it from the ticks) */
    STORE_KIND_FLUSH = 2,     /* flush_all: invalidates every item whose
                                 version ticks are <= flush_at, once the
                                 wall clock reaches flush_at; lives under the
                                 reserved empty key */
    /*
     * Keyless kinds: nkey 0, no value; id.hi is the key's cluster-wide hash
     * (gid) and names the key; flags holds the key's partition.
     */
    STORE_KIND_EVICTED = 3, /* what an evicted value leaves on a replicating
                               node: the value's own id, version and expiry;
                               it keeps the sets of nodes that evicted
                               different values equal, and keeps a round
                               from fetching the value back. Never sent by
                               push; a round gives it to a peer that lacks
                               the mutation altogether */
    STORE_KIND_DROP = 4,    /* a cluster-wide drop: beats every mutation of
                               its key older than it on every node (value,
                               record); written, one tick newer than the
                               record it replaces, when a node's record
                               table overflows. exptime: the unix second it
                               was written; it leaves the set 60 s later */
};

/*
 * Marks a value carries for meta's stale-while-revalidate, as part of its
 * mutation (so they replicate with it). Only STORE_KIND_VALUE has marks.
 */
#define STORE_MARK_STALE 0x1u /* invalidated (md I, ms I): mg answers X */
#define STORE_MARK_WON                                                        \
    0x2u /* a client was given the right to recache it                        \
            (mg answered W): mg answers Z */
#define STORE_MARKS_ALL (STORE_MARK_STALE | STORE_MARK_WON)

/*
 * A mutation as it travels between nodes (and as store_apply takes it).
 * Pointers are borrowed for the call only; the store copies what it keeps.
 * Its id must be store_mutation_id() of it.
 */
typedef struct store_mutation {
    riblt_id id;
    store_version version;
    uint8_t kind;      /* enum store_kind */
    uint8_t marks;     /* STORE_MARK_* (STORE_KIND_VALUE only) */
    uint32_t flags;    /* client flags (TOMBSTONE: see store_kind) */
    int64_t exptime;   /* absolute unix seconds; 0 = never (TOMBSTONE:
                          see store_kind) */
    uint64_t flush_at; /* STORE_KIND_FLUSH: ticks (ns) it takes effect */
    uint64_t cas;      /* the cas unique clients see: fresh (derived from
                          the id) for a new value, the touched item's for
                          touch/gat; non-zero for STORE_KIND_VALUE,
                          ignored for STORE_KIND_FLUSH */
    const char *key;
    size_t nkey; /* 1..250; 0 only for STORE_KIND_FLUSH */
    const char *value;
    size_t nvalue;
} store_mutation;

/*
 * The id of a mutation: a function of its key and version only, the same
 * on every node (part of the peer protocol). High word: SipHash-1-3 of the
 * key under a fixed key; low word: a mix of that, ticks and node, never 0.
 */
riblt_id store_mutation_id(const store_mutation *m);

/* The cas a fresh mutation with this id gets (every node derives the same;
 * touch and meta E keep or set another, which then travels with it). */
uint64_t store_fresh_cas(const riblt_id *id);

/* --------------------------------------------------------------- setup */

typedef struct store store;

/* Returns the wall clock in nanoseconds since the Unix epoch. */
typedef uint64_t (*store_clock_fn)(void *arg);

/*
 * What store_walk shows of one live value. Pointers are valid during the
 * callback only.
 */
typedef struct store_item_info {
    const char *key;
    size_t nkey;
    size_t nvalue;
    size_t size;     /* bytes accounted for the item */
    int64_t exptime; /* absolute unix seconds, 0 = never */
    int64_t atime;   /* last access (or write), unix seconds */
    uint64_t cas;
    uint32_t flags;
    bool fetched; /* read by a client since written */
} store_item_info;

typedef struct store_options {
    uint32_t node_id;         /* this node's id in versions; 0 = draw a
                                 random non-zero one */
    size_t memory_limit;      /* bytes for items (-m); 0 = unlimited */
    size_t item_size_max;     /* largest key+value+overhead (-I) */
    uint32_t tombstone_grace; /* seconds a tombstone (and an expired item)
                                 stays in the set before it is swept */
    size_t sketch_symbols;    /* materialized sketch length (default 8192);
                                 0: no sketch (a node without replication,
                                 where nothing reads it) */
    unsigned hash_power;      /* initial key table size 2^hash_power */
    store_clock_fn clock;     /* NULL = CLOCK_REALTIME */
    void *clock_arg;
    /*
     * Partitioned mode (see "Partitions" below). partitions = P: 0 = one
     * set, as without partitions; 1..STORE_PARTITIONS_MAX: keys live in
     * partitions 0..P-1 chosen by partition_fn, flush mutations (the empty
     * key) in the global partition P. partition_fn must be a pure function
     * of the key (the same on every node), thread-safe and fast; a result
     * >= P is taken modulo P. Each partition has its own materialized
     * sketch of partition_sketch_symbols symbols (sketch_symbols is then
     * unused).
     */
    uint32_t partitions;
    uint32_t (*partition_fn)(void *arg, const char *key, size_t nkey);
    void *partition_arg;
    size_t partition_sketch_symbols; /* default 256 */
    /* Keep each partition's power sums beside its sketch (riblt_psum.h):
     * RIBLT_PSUM_SIZE ids (4 KiB) a partition and RIBLT_PSUM_TERMS field
     * multiplications per id added or taken out. Ignored without a
     * sketch. Default true. */
    bool psums;
    /*
     * Bytes of memory_limit given to the records evicted values leave
     * (STORE_KIND_EVICTED) and to drops: a table of evict_record_bytes / 36
     * entries (a 32-byte slot and a 4-byte index slot each), less than
     * memory_limit. 0 = an eviction leaves nothing (a node without peers). See
     * "Eviction is local" in store.c.
     */
    size_t evict_record_bytes;
    /* Never evict (memcached's -M): a write that finds no room fails with
     * STORE_ERR_NOMEM. Expired values are still reclaimed. */
    bool no_evict;
    /* Told of every value evicted (not of expired ones reclaimed), under
     * the key's lock: it must not call the store. NULL = nobody. */
    void (*evict_fn)(void *arg, const store_item_info *ii);
    void *evict_arg;
} store_options;

/* Largest number of partitions (items keep their partition in 16 bits). */
#define STORE_PARTITIONS_MAX 65535u

/* Fills o with the defaults (64 MB, 1 MB items, 3600 s grace, 8192;
 * unpartitioned, 256 symbols per partition sketch). */
void store_options_default(store_options *o);

/* Creates a store, or returns NULL with *err set to a STORE_ERR_*. */
store *store_create(const store_options *o, int *err);
void store_destroy(store *s);

/*
 * Called after every change of a key's current mutation (local writes,
 * peer applies, evictions, sweeps are not reported), outside the key lock,
 * with a referenced item the listener may keep (it must release it).
 * origin_local is true for writes accepted from clients on this node. One
 * listener; set it before serving.
 */
typedef struct store_item store_item;
typedef void (*store_listener_fn)(void *arg, store_item *it,
                                  bool origin_local);
void store_set_listener(store *s, store_listener_fn fn, void *arg);

/* ----------------------------------------------------------- items */

/* Drops a reference taken by any function returning store_item *. */
void store_item_release(store_item *it);
/* Takes one more reference. */
void store_item_ref(store_item *it);

const char *store_item_key(const store_item *it, size_t *nkey);
const char *store_item_value(const store_item *it, size_t *nvalue);
uint32_t store_item_flags(const store_item *it);
int64_t store_item_exptime(const store_item *it); /* absolute, 0 = never */
uint64_t store_item_cas(const store_item *it);    /* the mutation's cas */
uint8_t store_item_kind(const store_item *it);
uint8_t store_item_marks(const store_item *it); /* STORE_MARK_* */
/* The item as a mutation (pointers valid while the reference is held). */
void store_item_mutation(const store_item *it, store_mutation *out);

/* --------------------------------------------------- client operations */

/*
 * Converts a memcached exptime (0 = never; <= 30 days: relative seconds;
 * otherwise unix time; negative: already expired) into absolute unix
 * seconds at this node's clock. Already-expired values map to -1.
 */
int64_t store_exptime_abs(store *s, int64_t exptime);

enum store_set_mode {
    STORE_SET = 0,
    STORE_ADD,
    STORE_REPLACE,
    STORE_APPEND,
    STORE_PREPEND,
    STORE_CAS,
};

typedef struct store_write {
    enum store_set_mode mode;
    const char *key;
    size_t nkey;
    const char *value;
    size_t nvalue;
    uint32_t flags;
    int64_t exptime;  /* absolute (store_exptime_abs); -1 = expired */
    uint64_t cas;     /* STORE_CAS: expected cas; other modes: if non-zero,
                         the write also requires this cas (binary/meta) */
    uint64_t new_cas; /* the stored item's cas (meta E); 0 = a fresh one */
    uint8_t marks;    /* STORE_MARK_* of the stored item (meta N vivify:
                         STORE_MARK_WON); append/prepend ignore it */
    bool invalidate;  /* meta ms I, with a cas (STORE_CAS): a cas that does
                         not match stores anyway, marked STORE_MARK_STALE,
                         keeping the item's expiry and STORE_MARK_WON */
} store_write;

/*
 * Performs a storage command atomically for the key and, when it stores,
 * creates a new mutation. Returns STORE_STORED, STORE_NOT_STORED,
 * STORE_EXISTS, STORE_NOT_FOUND, or an error. *cas_out (may be NULL) gets the
 * new item's cas. A stored value carries w->marks (the invalidate case
 * aside): a write that replaces a value clears its marks.
 */
int store_write_item(store *s, const store_write *w, uint64_t *cas_out);

/*
 * Looks a live key up. Returns a referenced item or NULL (missing,
 * tombstone, expired, flushed). Counts get_hits/get_misses unless
 * the caller is a peer read (not done here).
 */
store_item *store_get(store *s, const char *key, size_t nkey);

/* Why store_get_ex missed although the key had a value. */
#define STORE_MISS_EXPIRED 1 /* its exptime has passed */
#define STORE_MISS_FLUSHED 2 /* a flush_all in effect covers it */

/* What a read tells besides the item (store_get_ex, store_gat_ex). */
typedef struct store_read_info {
    /* On a miss: 0 when the key holds no value (missing, deleted),
     * STORE_MISS_EXPIRED or STORE_MISS_FLUSHED when it holds one that is no
     * longer visible (for the get_expired / get_flushed stats; flushed wins
     * when both apply). 0 on a hit. */
    int why;
    /* On a hit, the item's state before this read, which is what meta 'l'
     * and 'h' report: seconds since the access before it, and whether a
     * client had read the item before. */
    int64_t last_access;
    bool fetched;
} store_read_info;

/* store_get, filling *ri (may be NULL). */
store_item *store_get_ex(store *s, const char *key, size_t nkey,
                         store_read_info *ri);

/*
 * store_get_ex that records no access (meta 'u'): the item's access time,
 * fetched state and eviction clock bit stay as they were, so *ri tells the
 * same before and after.
 */
store_item *store_peek_ex(store *s, const char *key, size_t nkey,
                          store_read_info *ri);

/*
 * get-and-touch: like store_get, and when the key is live, replaces it by a
 * new mutation carrying exptime (absolute) and the same value, flags and
 * cas. Returns the new item.
 */
store_item *store_gat(store *s, const char *key, size_t nkey, int64_t exptime);

/* store_gat, filling *ri (may be NULL) as store_get_ex. */
store_item *store_gat_ex(store *s, const char *key, size_t nkey,
                         int64_t exptime, store_read_info *ri);

/*
 * Sets a live key's expiry (new mutation, same value, flags and cas).
 * STORE_OK or STORE_NOT_FOUND.
 */
int store_touch(store *s, const char *key, size_t nkey, int64_t exptime);

/* store_touch, and *why (may be NULL) tells a miss apart as
 * store_read_info.why. */
int store_touch_ex(store *s, const char *key, size_t nkey, int64_t exptime,
                   int *why);

/*
 * Deletes a live key by writing a tombstone. cas 0 = unconditional.
 * STORE_DELETED, STORE_NOT_FOUND, STORE_EXISTS.
 */
int store_delete(store *s, const char *key, size_t nkey, uint64_t cas);

/* A meta delete (md): a plain delete, or one that keeps the item. */
typedef struct store_delete_req {
    const char *key;
    size_t nkey;
    uint64_t cas;     /* non-zero: require this cas */
    bool invalidate;  /* md I: keep the value, mark it STORE_MARK_STALE
                         (clearing STORE_MARK_WON) with a new cas */
    bool clear_value; /* md x: keep the item with an empty value, client
                         flags 0 and no expiry (unless set_ttl) */
    bool set_ttl;     /* md T (with I or x): the new expiry */
    int64_t exptime;  /* absolute (store_exptime_abs); -1 = expired */
    uint64_t new_cas; /* md E: the new cas (invalidate), or the cas kept by
                         clear_value; 0 = fresh (invalidate), the item's
                         own (clear_value alone) */
} store_delete_req;

/*
 * store_delete, or with invalidate or clear_value a new mutation of the
 * live key as described above. STORE_DELETED (done), STORE_NOT_FOUND,
 * STORE_EXISTS, or an error.
 */
int store_delete_ex(store *s, const store_delete_req *r);

/*
 * Gives the caller the right to recache a key (meta W): when the key's
 * current value is still `seen` (a reference from a read of this store)
 * and carries no STORE_MARK_WON, replaces it by a new mutation with the
 * same value, flags, expiry, cas and STORE_MARK_STALE, plus
 * STORE_MARK_WON, and returns STORE_STORED. STORE_NOT_STORED when another
 * caller has the mark or the key changed since `seen` was read.
 */
int store_take_win(store *s, const store_item *seen);

typedef struct store_arith_req {
    const char *key;
    size_t nkey;
    bool incr;
    uint64_t delta;
    uint64_t cas; /* non-zero: require this cas */
    bool vivify;  /* create the key with `initial` when missing */
    uint64_t initial;
    int64_t exptime;       /* absolute, for a vivified item */
    bool touch;            /* also set the expiry to touch_exptime, in the
                              same mutation (meta ma with T) */
    int64_t touch_exptime; /* absolute (store_exptime_abs); -1 = expired */
    uint64_t new_cas;      /* the new mutation's cas (meta E); 0 = fresh */
} store_arith_req;

/*
 * incr/decr: 64-bit unsigned, incr wraps, decr stops at 0, as memcached.
 * Returns STORE_OK with *value and *cas_out set (and STORE_STORED when
 * vivified), STORE_NOT_FOUND, STORE_NON_NUMERIC, STORE_EXISTS. With touch,
 * the new mutation carries touch_exptime (a vivified item too).
 */
int store_arith(store *s, const store_arith_req *r, uint64_t *value,
                uint64_t *cas_out);

/*
 * flush_all: writes a flush mutation that invalidates every item whose
 * version is older than `delay` seconds from now, at that time.
 */
int store_flush_all(store *s, uint32_t delay);

/* ------------------------------------------------------- replication */

/*
 * Applies a mutation from a peer through the same version comparison and
 * journal/sketch update as local writes. STORE_OK when it became the key's
 * current mutation, STORE_STALE when a newer (or the same) version is held,
 * or an error. Advances this node's hybrid clock past m->version.
 */
int store_apply(store *s, const store_mutation *m);

/* Returns a referenced item holding the mutation with this id, or NULL. */
store_item *store_fetch(store *s, const riblt_id *id);

/*
 * The mutation with this id, as store_item_mutation gives it: from an item
 * (then *hold gets a reference and the pointers in *m stay valid until
 * store_item_release(*hold)), or from a keyless record (*hold NULL). false
 * when the set does not hold it.
 */
bool store_fetch_mutation(store *s, const riblt_id *id, store_mutation *m,
                          store_item **hold);

/*
 * The partition a mutation belongs to: its key's, or for keyless kinds the
 * one it carries in flags (P when out of range, which store_apply refuses).
 */
uint32_t store_mutation_partition(const store *s, const store_mutation *m);

/* 1 if the set holds this mutation id (an item or a record). */
bool store_has(store *s, const riblt_id *id);

/*
 * Number of symbols in the materialized sketch: sketch_symbols, or in
 * partitioned mode partition_sketch_symbols, the length of every
 * partition's sketch (and the base of the tails of store_journal_tails and
 * store_journal_tails_parts).
 */
size_t store_sketch_symbols(const store *s);

/*
 * Copies n sketch symbols from offset: a consistent slice (taken under the
 * sketch lock). *set_size gets coded symbol 0's count (set size). In
 * partitioned mode: the sum of every partition's sketch, as
 * store_sketch_read_parts over all P + 1 partitions.
 */
int store_sketch_read(store *s, size_t offset, riblt_symbol *out, size_t n,
                      int64_t *set_size);

/*
 * Calls fn for every mutation id in the set (the "journal"), in no order,
 * from a snapshot taken one key-table stripe at a time: each stripe's ids
 * are those of one instant, not the whole set's. No id is given twice, so
 * an encoder fed one snapshot encodes a set (see set_snapshot in store.c
 * for what a write during the walk can do). Returns the number of ids.
 */
typedef void (*store_id_fn)(void *arg, const riblt_id *id);
size_t store_journal_ids(store *s, store_id_fn fn, void *arg);

/*
 * Like store_journal_ids, also giving where each id's mapping leaves the
 * sketch (riblt_tail; steps 0 = not recorded, start that id from its
 * beginning). Items keep no tail (it cost 8 bytes an item), so every tail
 * is steps 0 and an encoder built with riblt_encoder_add_tail walks each
 * id from its start.
 */
typedef void (*store_tail_fn)(void *arg, const riblt_id *id,
                              const riblt_tail *tail);
size_t store_journal_tails(store *s, store_tail_fn fn, void *arg);

/* -------------------------------------------------------- partitions */

/*
 * Partitions. In partitioned mode (store_options.partitions = P > 0) every
 * item belongs to one partition: partition_fn(key) for a key, the global
 * partition P for the empty key (flush mutations). The store calls
 * partition_fn once per mutation it creates or applies and keeps the
 * result in the item. Each partition has its own mutation count and its own
 * materialized sketch of store_sketch_symbols() symbols, updated under the
 * same lock as the count, so each partition's sketch is exactly the
 * sketch of its mutations' ids (invariant 1 per partition), and the sketch of
 * a union of partitions is the sum of their sketches (coded symbols are
 * linear). Unpartitioned (P = 0), everything is in partition 0 and the
 * functions below work with the partition list {0}.
 *
 * Partition lists (parts, nparts) name partitions 0..P (0 alone when
 * unpartitioned); a partition listed twice counts once.
 */

/* P (0 = unpartitioned). */
uint32_t store_partitions(const store *s);

/* The partition of a key: P for the empty key, 0 when unpartitioned. */
uint32_t store_key_partition(const store *s, const char *key, size_t nkey);

/* The partition the item belongs to (0 when unpartitioned). */
uint32_t store_item_partition(const store *s, const store_item *it);

/*
 * Writes to out the n symbols from offset of the SUM of the listed
 * partitions' sketches (riblt symbol addition: XOR of sums and hashes,
 * counts added), which is the sketch of the union of their sets. The slice
 * is consistent: it is the sketch of a set holding, for each listed
 * partition, that partition's ids at one instant (a write changes one
 * partition only, so no write is half included; partitions may be read at
 * different instants, which keeps writers from waiting on a long read).
 * *set_size (may be NULL) gets the number of mutations in those partitions
 * at the same instants. STORE_ERR_INVAL for a partition out of range,
 * parts NULL with nparts > 0, out NULL with n > 0, or offset + n beyond
 * store_sketch_symbols(). nparts 0 gives zero symbols.
 */
int store_sketch_read_parts(store *s, const uint32_t *parts, size_t nparts,
                            size_t offset, riblt_symbol *out, size_t n,
                            int64_t *set_size);

/*
 * store_sketch_read_parts from offset 0, and the sum of the same
 * partitions' power-sum tables (riblt_psum.h) into psums (RIBLT_PSUM_SIZE
 * ids; may be NULL), each partition's read under the same hold as its
 * sketch: the symbols and the terms are those of one set. A store without
 * a sketch, or one created with psums false, gives zero terms.
 */
int store_sketch_snapshot_parts(store *s, const uint32_t *parts, size_t nparts,
                                riblt_symbol *out, size_t n, riblt_id *psums,
                                int64_t *set_size);

/* Whether the store keeps power sums (store_options.psums and a sketch). */
bool store_has_psums(const store *s);

/*
 * store_journal_tails / store_journal_ids restricted to the mutations of
 * the listed partitions (one atomic snapshot, then fn with no lock held).
 * Tails are relative to store_sketch_symbols(), so an encoder given every
 * id of the listed partitions with riblt_encoder_add_tail(base =
 * store_sketch_symbols()) continues the stream of store_sketch_read_parts
 * of the same list beyond the sketch. Returns the number of ids; 0 (fn not
 * called) when a partition is out of range or the snapshot cannot be
 * allocated.
 */
size_t store_journal_tails_parts(store *s, const uint32_t *parts,
                                 size_t nparts, store_tail_fn fn, void *arg);
size_t store_journal_ids_parts(store *s, const uint32_t *parts, size_t nparts,
                               store_id_fn fn, void *arg);

/*
 * Counters of partition p (0..P): mutations in its set (tombstones and
 * flushes included), items (live values, as curr_items) and their bytes
 * (as bytes). Each pointer may be NULL. STORE_ERR_INVAL when p is out of
 * range.
 */
int store_partition_stats(store *s, uint32_t p, uint64_t *mutations,
                          uint64_t *items, uint64_t *bytes);

/*
 * Forgets up to `budget` mutations of the listed partitions (a node that no
 * longer owns them): they leave key table, records, set and sketch WITHOUT
 * tombstones and WITHOUT calling the listener, because losing ownership is
 * not a change of the data and must not replicate. Memory and the stats
 * (curr_items, bytes, mutations, tombstones) follow; each counts in
 * store_stats.dropped. Flush mutations are never dropped (every node holds
 * the global partition). Returns how many went: 0 means none is left in
 * those partitions (or budget is 0, or a partition is out of range). Walks
 * the key table from where the previous call stopped, one stripe lock at a
 * time: a call visits about 8 * budget + 16384 entries at most (more only
 * to find its first item), and never the whole table more than once, so
 * budget bounds a call's time, and dropping any share of the table costs
 * about one pass over it in all, spread over the calls. Writes into the listed
 * partitions while they are dropped are the caller's business (stop accepting
 * them first).
 */
size_t store_drop_partitions(store *s, const uint32_t *parts, size_t nparts,
                             size_t budget);

/* ------------------------------------------------------- maintenance */

/*
 * Sweeps up to budget entries: tombstones and expired/flushed items past the
 * grace, and records of evicted values as the values would, and drops 60 s
 * after they were written, leave the key table, records, set and sketch.
 * The key table is walked only while it holds something that can die (a
 * tombstone, a value with an expiry) or a flush not yet swept after.
 * Returns how many went.
 */
size_t store_sweep(store *s, size_t budget);

typedef void (*store_walk_fn)(void *arg, const store_item_info *ii);

/*
 * Visits the live values (not expired, not flushed) of the key table, one
 * stripe at a time under its lock, from *cursor (0 to start) on, until at
 * least budget items were visited or the table ends. fn must not call the
 * store. A stripe is visited whole, so a table that grows between calls
 * neither skips nor repeats a key. Returns false once the walk is over.
 * Reads record no access (no FETCHED, no clock bit).
 */
bool store_walk(store *s, size_t *cursor, size_t budget, store_walk_fn fn,
                void *arg);

/*
 * Changes memory_limit at run time (memcached's cache_memlimit): bytes for
 * items and the record table, whose size stays as created. Lowering it
 * evicts down to the new limit at once. STORE_ERR_INVAL when bytes is 0 or
 * leaves no room beside the record table (or the store had no limit).
 */
int store_set_memory_limit(store *s, size_t bytes);

/* ------------------------------------------------------------- stats */

typedef struct store_stats {
    uint64_t curr_items;  /* live values (not tombstones, not flush) */
    uint64_t total_items; /* values stored since start */
    uint64_t bytes;       /* bytes of live items */
    uint64_t limit_maxbytes;
    uint64_t evictions;
    uint64_t expired_unfetched;
    uint64_t evicted_unfetched;
    uint64_t reclaimed; /* expired or flushed values swept, evicted or
                           written over */
    uint64_t mutations; /* set size = sketch symbol 0 count */
    uint64_t tombstones;
    uint64_t evicted_records; /* STORE_KIND_EVICTED records held */
    uint64_t drops;           /* STORE_KIND_DROP records held */
    uint64_t drops_written;   /* record table overflows turned into drops */
    uint64_t kept_items;      /* values a drop took out of the set, still
                                 held and readable */
    uint64_t evict_records;   /* record table capacity */
    uint64_t applied_remote;  /* peer mutations accepted */
    uint64_t stale_remote;    /* peer mutations dropped as older */
    uint64_t swept;
    uint64_t sweep_checked; /* items the sweep looked at */
    uint64_t dropped;       /* mutations forgotten by store_drop_partitions */
    uint64_t hash_power_level;
    uint64_t hash_bytes; /* the key table's buckets, counted in the limit */
    uint64_t item_page_bytes;  /* chunk.c's pages (process-wide) */
    uint64_t item_chunk_bytes; /* of them, chunks in use */
    uint64_t sketch_symbols;   /* store_sketch_symbols() */
    uint64_t clock_ticks;      /* last hybrid clock value */
} store_stats;

void store_get_stats(store *s, store_stats *out);

/* The current hybrid clock reading as a version of this node: a version
 * given after this call is greater (tests; a round's power-sum phase). */
store_version store_clock_now(store *s);

#endif /* STORE_H */
