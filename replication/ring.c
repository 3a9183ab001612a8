/*
 * ring.c -- weighted rendezvous placement of fixed partitions on members
 * (see ring.h for the choice and the exact hash functions).
 *
 * The ring keeps its members sorted by node id and a table of
 * partitions x min(R, members) owner ids, best first, rebuilt from scratch on
 * every membership change. Lookups read the table; nothing is computed on
 * the read path beyond the key hash.
 */
#include "ring.h"

#include <stdlib.h>
#include <string.h>

/* Salt of the per-node hash: changing it reshuffles every cluster. */
#define RING_NODE_SEED 0x72696e676e6f6465ull /* "ringnode" */

struct ring {
    uint32_t partitions;
    uint32_t replicas;
    uint32_t k;           /* owners per partition: min(replicas, nmembers) */
    ring_member *members; /* sorted by node id */
    size_t nmembers;
    uint32_t *owners; /* partitions * k node ids, best first */
};

/* A member's bid for one partition. */
typedef struct bid {
    uint64_t len;  /* -log2(u) in Q32, >= 1 */
    uint64_t hash; /* the draw u came from (tie break) */
    uint32_t weight;
    uint32_t node;
} bid;

const char *ring_strerror(int rc)
{
    switch (rc) {
    case RING_OK:
        return "ok";
    case RING_ERR_INVAL:
        return "invalid argument";
    case RING_ERR_NOMEM:
        return "out of memory";
    case RING_ERR_EXISTS:
        return "node is already a member";
    case RING_ERR_NOT_FOUND:
        return "node is not a member";
    case RING_ERR_FULL:
        return "too many members";
    case RING_ERR_MISMATCH:
        return "rings differ in partitions or replicas";
    default:
        return "unknown ring error";
    }
}

/* SplitMix64's finalizer: a bijection on 64-bit words. */
static uint64_t mix64(uint64_t z)
{
    z ^= z >> 30;
    z *= 0xbf58476d1ce4e5b9ull;
    z ^= z >> 27;
    z *= 0x94d049bb133111ebull;
    z ^= z >> 31;
    return z;
}

uint64_t ring_hash_key(const void *key, size_t nkey)
{
    const unsigned char *p = key;
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < nkey; i++) {
        h ^= p[i];
        h *= 0x100000001b3ull;
    }
    return mix64(h);
}

/*
 * -log2(u) in Q32 fixed point for u = ((h >> 32) + 1) / 2^32, in (0, 1].
 * log2(x) is the integer part (position of the top bit) plus 32 fraction
 * bits found by squaring the mantissa, kept in Q31 so every product fits in
 * 64 bits. Integer-only, hence the same on every machine. Returns at least
 * 1 so that a score weight / len is always finite.
 */
static uint64_t neg_log2_q32(uint64_t h)
{
    uint64_t x = (h >> 32) + 1; /* 1 .. 2^32 */
    int ip = 63 - __builtin_clzll(x);
    uint64_t m = ip <= 31 ? x << (31 - ip) : x >> (ip - 31);
    uint64_t frac = 0;
    for (int bit = 31; bit >= 0; bit--) {
        m = (m * m) >> 31; /* mantissa^2 in [1, 4), Q31 */
        if (m >= (1ull << 32)) {
            m >>= 1;
            frac |= 1ull << bit;
        }
    }
    uint64_t lg = ((uint64_t)ip << 32) | frac;
    uint64_t len = (32ull << 32) - lg;
    return len ? len : 1;
}

/*
 * 1 if bid a outranks bid b: a higher weight / len, then a higher hash,
 * then a lower node id. weight < 2^16 and len <= 2^37, so the products fit.
 */
static int bid_better(const bid *a, const bid *b)
{
    uint64_t sa = (uint64_t)a->weight * b->len;
    uint64_t sb = (uint64_t)b->weight * a->len;
    if (sa != sb)
        return sa > sb;
    if (a->hash != b->hash)
        return a->hash > b->hash;
    return a->node < b->node;
}

static int bid_cmp(const void *pa, const void *pb)
{
    const bid *a = pa, *b = pb;
    if (bid_better(a, b))
        return -1;
    if (bid_better(b, a))
        return 1;
    return 0;
}

static int member_cmp(const void *pa, const void *pb)
{
    const ring_member *a = pa, *b = pb;
    return a->node < b->node ? -1 : a->node > b->node;
}

/*
 * Computes the owner table of partitions x min(replicas, n) for members m
 * (sorted by node) into a new array stored in *out (NULL when n is 0).
 * Returns RING_OK or RING_ERR_NOMEM.
 */
static int place(uint32_t partitions, uint32_t replicas, const ring_member *m,
                 size_t n, uint32_t **out, uint32_t *k_out)
{
    *out = NULL;
    uint32_t k = replicas < n ? replicas : (uint32_t)n;
    *k_out = k;
    if (n == 0)
        return RING_OK;
    uint32_t *owners = malloc((size_t)partitions * k * sizeof(*owners));
    uint64_t *seed = malloc(n * sizeof(*seed));
    bid *bids = malloc(n * sizeof(*bids));
    if (!owners || !seed || !bids) {
        free(owners);
        free(seed);
        free(bids);
        return RING_ERR_NOMEM;
    }
    for (size_t i = 0; i < n; i++)
        seed[i] = mix64(m[i].node ^ RING_NODE_SEED);
    /* Few owners of many members: keep a sorted top k; else sort all. */
    int sort_all = (size_t)k * 4 > n;
    for (uint32_t p = 0; p < partitions; p++) {
        size_t have = 0;
        for (size_t i = 0; i < n; i++) {
            uint64_t h = mix64(seed[i] ^ p);
            bid b = {.len = neg_log2_q32(h),
                     .hash = h,
                     .weight = m[i].weight,
                     .node = m[i].node};
            if (sort_all) {
                bids[have++] = b;
                continue;
            }
            if (have == k && !bid_better(&b, &bids[k - 1]))
                continue;
            size_t j = have < k ? have++ : k - 1;
            while (j > 0 && bid_better(&b, &bids[j - 1])) {
                bids[j] = bids[j - 1];
                j--;
            }
            bids[j] = b;
        }
        if (sort_all)
            qsort(bids, n, sizeof(*bids), bid_cmp);
        for (uint32_t j = 0; j < k; j++)
            owners[(size_t)p * k + j] = bids[j].node;
    }
    free(seed);
    free(bids);
    *out = owners;
    return RING_OK;
}

/*
 * Makes m (n members, sorted, validated, malloc'd) the membership: computes
 * the placement and, only if that succeeds, installs both, taking m.
 * On failure the ring is unchanged and m is still the caller's.
 */
static int install(ring *r, ring_member *m, size_t n)
{
    uint32_t *owners;
    uint32_t k;
    int rc = place(r->partitions, r->replicas, m, n, &owners, &k);
    if (rc != RING_OK)
        return rc;
    free(r->members);
    free(r->owners);
    r->members = m;
    r->nmembers = n;
    r->owners = owners;
    r->k = k;
    return RING_OK;
}

ring *ring_create(uint32_t partitions, uint32_t replicas, int *err)
{
    int dummy;
    if (!err)
        err = &dummy;
    if (partitions == 0 || partitions > RING_MAX_PARTITIONS || replicas == 0) {
        *err = RING_ERR_INVAL;
        return NULL;
    }
    ring *r = calloc(1, sizeof(*r));
    if (!r) {
        *err = RING_ERR_NOMEM;
        return NULL;
    }
    r->partitions = partitions;
    r->replicas = replicas;
    *err = RING_OK;
    return r;
}

void ring_destroy(ring *r)
{
    if (!r)
        return;
    free(r->members);
    free(r->owners);
    free(r);
}

ring *ring_clone(const ring *r, int *err)
{
    ring *c = ring_create(r->partitions, r->replicas, err);
    if (!c)
        return NULL;
    if (r->nmembers > 0) {
        size_t table = (size_t)r->partitions * r->k;
        c->members = malloc(r->nmembers * sizeof(*c->members));
        c->owners = malloc(table * sizeof(*c->owners));
        if (!c->members || !c->owners) {
            ring_destroy(c);
            if (err)
                *err = RING_ERR_NOMEM;
            return NULL;
        }
        memcpy(c->members, r->members, r->nmembers * sizeof(*c->members));
        memcpy(c->owners, r->owners, table * sizeof(*c->owners));
        c->nmembers = r->nmembers;
        c->k = r->k;
    }
    return c;
}

uint32_t ring_partitions(const ring *r)
{
    return r->partitions;
}

uint32_t ring_replicas(const ring *r)
{
    return r->replicas;
}

uint32_t ring_owner_count(const ring *r)
{
    return r->k;
}

size_t ring_size(const ring *r)
{
    return r->nmembers;
}

/* Index of node in the sorted members, or -1. */
static long find_member(const ring *r, uint32_t node)
{
    size_t lo = 0, hi = r->nmembers;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (r->members[mid].node < node)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo < r->nmembers && r->members[lo].node == node)
        return (long)lo;
    return -1;
}

bool ring_is_member(const ring *r, uint32_t node)
{
    return find_member(r, node) >= 0;
}

static bool weight_ok(uint32_t weight)
{
    return weight >= 1 && weight <= RING_MAX_WEIGHT;
}

/* A malloc'd copy of the members with room for `extra` more (or NULL). */
static ring_member *copy_members(const ring *r, size_t extra)
{
    size_t n = r->nmembers + extra;
    ring_member *m = malloc((n ? n : 1) * sizeof(*m));
    if (m && r->nmembers)
        memcpy(m, r->members, r->nmembers * sizeof(*m));
    return m;
}

int ring_add(ring *r, uint32_t node, uint32_t weight)
{
    if (!weight_ok(weight))
        return RING_ERR_INVAL;
    if (find_member(r, node) >= 0)
        return RING_ERR_EXISTS;
    if (r->nmembers >= RING_MAX_NODES)
        return RING_ERR_FULL;
    ring_member *m = copy_members(r, 1);
    if (!m)
        return RING_ERR_NOMEM;
    size_t i = r->nmembers;
    while (i > 0 && m[i - 1].node > node) {
        m[i] = m[i - 1];
        i--;
    }
    m[i] = (ring_member){.node = node, .weight = weight};
    int rc = install(r, m, r->nmembers + 1);
    if (rc != RING_OK)
        free(m);
    return rc;
}

int ring_remove(ring *r, uint32_t node)
{
    long at = find_member(r, node);
    if (at < 0)
        return RING_ERR_NOT_FOUND;
    ring_member *m = copy_members(r, 0);
    if (!m)
        return RING_ERR_NOMEM;
    memmove(&m[at], &m[at + 1], (r->nmembers - (size_t)at - 1) * sizeof(*m));
    int rc = install(r, m, r->nmembers - 1);
    if (rc != RING_OK)
        free(m);
    return rc;
}

int ring_set_weight(ring *r, uint32_t node, uint32_t weight)
{
    if (!weight_ok(weight))
        return RING_ERR_INVAL;
    long at = find_member(r, node);
    if (at < 0)
        return RING_ERR_NOT_FOUND;
    if (r->members[at].weight == weight)
        return RING_OK;
    ring_member *m = copy_members(r, 0);
    if (!m)
        return RING_ERR_NOMEM;
    m[at].weight = weight;
    int rc = install(r, m, r->nmembers);
    if (rc != RING_OK)
        free(m);
    return rc;
}

int ring_set_members(ring *r, const ring_member *in, size_t n)
{
    if (n > RING_MAX_NODES)
        return RING_ERR_FULL;
    if (n > 0 && !in)
        return RING_ERR_INVAL;
    ring_member *m = malloc((n ? n : 1) * sizeof(*m));
    if (!m)
        return RING_ERR_NOMEM;
    if (n)
        memcpy(m, in, n * sizeof(*m));
    qsort(m, n, sizeof(*m), member_cmp);
    for (size_t i = 0; i < n; i++) {
        if (!weight_ok(m[i].weight) || (i > 0 && m[i].node == m[i - 1].node)) {
            free(m);
            return RING_ERR_INVAL;
        }
    }
    int rc = install(r, m, n);
    if (rc != RING_OK)
        free(m);
    return rc;
}

size_t ring_members(const ring *r, ring_member *out, size_t cap)
{
    size_t n = r->nmembers < cap ? r->nmembers : cap;
    if (n)
        memcpy(out, r->members, n * sizeof(*out));
    return r->nmembers;
}

uint32_t ring_key_partition(uint32_t partitions, const void *key, size_t nkey)
{
    return (uint32_t)(ring_hash_key(key, nkey) % partitions);
}

uint32_t ring_partition(const ring *r, const void *key, size_t nkey)
{
    return ring_key_partition(r->partitions, key, nkey);
}

const uint32_t *ring_owners_ref(const ring *r, uint32_t p)
{
    if (p >= r->partitions || r->k == 0)
        return NULL;
    return &r->owners[(size_t)p * r->k];
}

size_t ring_owners(const ring *r, uint32_t p, uint32_t *out, size_t cap)
{
    const uint32_t *o = ring_owners_ref(r, p);
    if (!o)
        return 0;
    size_t n = r->k < cap ? r->k : cap;
    if (n)
        memcpy(out, o, n * sizeof(*out));
    return r->k;
}

bool ring_is_owner(const ring *r, uint32_t p, uint32_t node)
{
    const uint32_t *o = ring_owners_ref(r, p);
    if (!o)
        return false;
    for (uint32_t j = 0; j < r->k; j++)
        if (o[j] == node)
            return true;
    return false;
}

size_t ring_owned(const ring *r, uint32_t node, uint32_t *out, size_t cap)
{
    size_t n = 0;
    for (uint32_t p = 0; p < r->partitions; p++) {
        if (!ring_is_owner(r, p, node))
            continue;
        if (n < cap)
            out[n] = p;
        n++;
    }
    return n;
}

size_t ring_shared(const ring *r, uint32_t a, uint32_t b, uint32_t *out,
                   size_t cap)
{
    size_t n = 0;
    for (uint32_t p = 0; p < r->partitions; p++) {
        if (!ring_is_owner(r, p, a) || !ring_is_owner(r, p, b))
            continue;
        if (n < cap)
            out[n] = p;
        n++;
    }
    return n;
}

/* 1 if the owner sets of p are equal in both rings (order ignored). */
static bool same_owners(const ring *x, const ring *y, uint32_t p)
{
    if (x->k != y->k)
        return false;
    const uint32_t *ox = ring_owners_ref(x, p);
    for (uint32_t j = 0; j < x->k; j++)
        if (!ring_is_owner(y, p, ox[j]))
            return false;
    return true;
}

long ring_diff(const ring *before, const ring *after, uint32_t *out,
               size_t cap)
{
    if (before->partitions != after->partitions ||
        before->replicas != after->replicas)
        return RING_ERR_MISMATCH;
    size_t n = 0;
    for (uint32_t p = 0; p < before->partitions; p++) {
        if (same_owners(before, after, p))
            continue;
        if (n < cap)
            out[n] = p;
        n++;
    }
    return (long)n;
}

uint64_t ring_fingerprint(const ring *r)
{
    uint64_t h = mix64(((uint64_t)r->partitions << 32) | r->replicas);
    for (size_t i = 0; i < r->nmembers; i++) {
        uint64_t v =
            ((uint64_t)r->members[i].node << 32) | r->members[i].weight;
        h = mix64(h ^ mix64(v + 0x9e3779b97f4a7c15ull));
    }
    return mix64(h ^ r->nmembers);
}
