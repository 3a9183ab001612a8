/*
 * ring.h -- placement of keys on nodes when the replication factor R is
 * smaller than the cluster: keys map to a fixed number of partitions, and
 * each partition to its R owners among the members.
 *
 * The choice: weighted rendezvous hashing (highest random weight) over fixed
 * partitions, computed with integers only.
 *
 *   - key -> partition: h = mix64(fnv1a64(key)), partition = h mod P. P is
 *     fixed when the ring is created (default 1024) and never depends on the
 *     membership, so per-partition state (a sketch, a journal slice) keeps
 *     its meaning while nodes come and go.
 *   - partition -> owners: every member n gets a score for partition p,
 *     weight(n) / -log2(u), with u in (0, 1] drawn from
 *     mix64(mix64(n ^ SEED) ^ p); the R members with the highest scores own
 *     p, best first. -log2 is computed in fixed point (Q32) with integer
 *     arithmetic and scores are compared by cross-multiplication, so every
 *     node, compiler and architecture computes the same placement (no libm,
 *     no floating point). Ties (equal fixed-point scores) fall to the raw
 *     hash, which differs between any two nodes for one partition.
 *
 * Why this and not the alternatives:
 *   - Ketama (as libmemcached computes it: 160 MD5 points per server string,
 *     weighted by memory share, keys on a sorted circle) balances only to
 *     several percent with that many points, needs a walk past duplicate
 *     points to find R distinct owners (which skews who holds second
 *     copies), and ties placement to "host:port" strings. Fixed partitions
 *     would still need a second layer on top. Its one advantage, that
 *     libmemcached clients could compute it, does not apply: a ribltcached
 *     node proxies keys it does not hold, and smart clients read the
 *     partition table from `stats ring`.
 *   - Jump hash needs no memory and balances perfectly, but names buckets
 *     0..N-1: only the last node can leave without reshuffling, and it has
 *     no weights. Members here leave in any order (a node dies).
 *   - Rendezvous moves the minimum: when a node joins it takes exactly the
 *     partitions where it scores in the top R, and each loses one owner to
 *     it; when a node leaves, only its partitions change, each gaining the
 *     next best member. The placement is a pure function of the set of
 *     (node, weight) pairs, independent of the order they were added. The
 *     cost, O(P x N) scores per membership change, is paid once per change
 *     (t/bench/bench_ring: about 1-2 ms at P = 1024, N = 4, and 12 ms at
 *     N = 64); lookups are a table read.
 *   - Weights: with R = 1 a member owns weight/total of the partitions (the
 *     logarithmic method makes each member's score the maximum of `weight`
 *     unit draws without drawing them). With R > 1 a partition cannot hold
 *     two copies on one node, so a heavy member's share is below
 *     proportional (capped at one copy of every partition); shares still
 *     grow with weight.
 *
 * A ring is a value: no I/O, no locks, no store. Readers may share a const
 * ring between threads while nobody changes it; to change placement at run
 * time, clone, change the clone, diff, and publish the clone.
 */
#ifndef RING_H
#define RING_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum ring_rc {
    RING_OK = 0,
    RING_ERR_INVAL = -1,     /* argument out of range */
    RING_ERR_NOMEM = -2,     /* allocation failed; the ring is unchanged */
    RING_ERR_EXISTS = -3,    /* node already a member */
    RING_ERR_NOT_FOUND = -4, /* node not a member */
    RING_ERR_FULL = -5,      /* RING_MAX_NODES members already */
    RING_ERR_MISMATCH = -6   /* rings with different P or R */
};

const char *ring_strerror(int rc);

#define RING_DEFAULT_PARTITIONS 1024
#define RING_MAX_PARTITIONS 65536
#define RING_MAX_NODES 1024
#define RING_MAX_WEIGHT 65535

typedef struct ring ring;

/* One member: a node id (as in versions) and a weight >= 1. */
typedef struct ring_member {
    uint32_t node;
    uint32_t weight;
} ring_member;

/*
 * Creates an empty ring of `partitions` partitions (1..RING_MAX_PARTITIONS)
 * with `replicas` owners per partition (>= 1; R >= the number of members
 * means every member owns every partition: full replication). Returns NULL
 * with *err set (if err is not NULL) on bad arguments or no memory.
 */
ring *ring_create(uint32_t partitions, uint32_t replicas, int *err);
void ring_destroy(ring *r);

/* A deep copy (same P, R, members, placement); NULL with *err on failure. */
ring *ring_clone(const ring *r, int *err);

uint32_t ring_partitions(const ring *r);
uint32_t ring_replicas(const ring *r);
/* Owners per partition now: min(R, number of members). */
uint32_t ring_owner_count(const ring *r);
size_t ring_size(const ring *r);

/*
 * Membership changes. Each recomputes the placement before it returns; on
 * any error the ring is unchanged.
 *   ring_add: RING_ERR_EXISTS if node is a member, RING_ERR_INVAL for a
 *     weight outside 1..RING_MAX_WEIGHT, RING_ERR_FULL past RING_MAX_NODES.
 *   ring_remove / ring_set_weight: RING_ERR_NOT_FOUND if not a member.
 *   ring_set_members: replaces the whole membership with n members (any
 *     order; RING_ERR_INVAL for a duplicate node or a bad weight).
 */
int ring_add(ring *r, uint32_t node, uint32_t weight);
int ring_remove(ring *r, uint32_t node);
int ring_set_weight(ring *r, uint32_t node, uint32_t weight);
int ring_set_members(ring *r, const ring_member *m, size_t n);

/*
 * Copies up to cap members, sorted by node id, into out; returns the
 * number of members (which may exceed cap).
 */
size_t ring_members(const ring *r, ring_member *out, size_t cap);
bool ring_is_member(const ring *r, uint32_t node);

/*
 * The stable key hash: FNV-1a 64 over the key bytes (offset basis
 * 0xcbf29ce484222325, prime 0x100000001b3) followed by the SplitMix64
 * finalizer (z ^= z >> 30; z *= 0xbf58476d1ce4e5b9; z ^= z >> 27;
 * z *= 0x94d049bb133111eb; z ^= z >> 31), all modulo 2^64. Byte order and
 * word size do not enter it, so a client in any language can compute it.
 */
uint64_t ring_hash_key(const void *key, size_t nkey);

/*
 * The partition of a key among `partitions` (>= 1): ring_hash_key(key) mod
 * partitions. Needs no ring, so a store can file keys by partition with
 * exactly the ring's rule.
 */
uint32_t ring_key_partition(uint32_t partitions, const void *key, size_t nkey);

/* The partition of a key: ring_key_partition(ring_partitions(r), key). */
uint32_t ring_partition(const ring *r, const void *key, size_t nkey);

/*
 * Copies the owners of partition p, best first (the first is the preferred
 * target for a proxied request), into out (up to cap); returns how many
 * owners p has (ring_owner_count, 0 on an empty ring or for p out of
 * range).
 */
size_t ring_owners(const ring *r, uint32_t p, uint32_t *out, size_t cap);

/*
 * The owners of p in place: a borrowed array of ring_owner_count(r) ids,
 * valid until the ring is next changed or destroyed. NULL if p is out of
 * range or the ring is empty.
 */
const uint32_t *ring_owners_ref(const ring *r, uint32_t p);

bool ring_is_owner(const ring *r, uint32_t p, uint32_t node);

/*
 * Partitions owned by node (ring_owned) or by both a and b (ring_shared,
 * the partitions a round between a and b reconciles), ascending, up to
 * cap into out; returns the total count.
 */
size_t ring_owned(const ring *r, uint32_t node, uint32_t *out, size_t cap);
size_t ring_shared(const ring *r, uint32_t a, uint32_t b, uint32_t *out,
                   size_t cap);

/*
 * The partitions whose owner set differs between two rings of the same P
 * and R (order of owners ignored), ascending, up to cap into out (out may
 * be NULL when cap is 0). Returns the count, or RING_ERR_MISMATCH.
 */
long ring_diff(const ring *before, const ring *after, uint32_t *out,
               size_t cap);

/*
 * A 64-bit digest of (P, R, members and weights). Two rings with the same
 * fingerprint place every key the same way; nodes compare it before they
 * reconcile partitions.
 */
uint64_t ring_fingerprint(const ring *r);

#endif
