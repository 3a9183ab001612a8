/*
 * evrec.c -- the compact record table (evrec.h): a ring of 32-byte slots
 * in the order entries were put, and a chained index from gid to slot.
 *
 * Ring positions grow without bound; position p lives in slot p % capacity.
 * Positions [tail, head) hold every entry, and the holes left by removals
 * until the tail passes them. A put takes position head; when head - tail
 * reaches the capacity the tail first moves past holes, and if it finds an
 * entry there, that entry (the oldest) goes -- unless holes are a quarter
 * of the ring or more: then the entries move together first (compact).
 */
#include "evrec.h"

#include <stdlib.h>
#include <string.h>

struct slot {
    uint64_t gid; /* 0: free */
    uint64_t ticks;
    uint32_t node;
    uint32_t exptime;
    uint32_t next; /* index chain: slot + 1, 0 = end */
    uint16_t part;
    uint8_t kind;
    uint8_t pad;
};

_Static_assert(sizeof(struct slot) == 32, "a slot is 32 bytes");

struct evrec {
    struct slot *slots;
    uint32_t *index; /* slot + 1, 0 = empty */
    size_t cap;
    uint64_t imask;
    uint64_t seed;
    uint64_t head, tail;
    size_t count;
};

evrec *evrec_create(size_t capacity, uint64_t seed)
{
    evrec *t;
    uint64_t nb = 1;

    if (capacity == 0 || capacity >= (1u << 31))
        return NULL;
    while (nb < capacity)
        nb <<= 1;
    t = calloc(1, sizeof(*t));
    if (t == NULL)
        return NULL;
    t->slots = calloc(capacity, sizeof(*t->slots));
    t->index = calloc(nb, sizeof(*t->index));
    if (t->slots == NULL || t->index == NULL) {
        evrec_destroy(t);
        return NULL;
    }
    t->cap = capacity;
    t->imask = nb - 1;
    t->seed = seed | 1;
    return t;
}

void evrec_destroy(evrec *t)
{
    if (t == NULL)
        return;
    free(t->slots);
    free(t->index);
    free(t);
}

size_t evrec_capacity(const evrec *t)
{
    return t->cap;
}

size_t evrec_count(const evrec *t)
{
    return t->count;
}

static inline uint32_t *bucket(const evrec *t, uint64_t gid)
{
    __uint128_t m = (__uint128_t)(gid ^ t->seed) * 0x9e3779b97f4a7c15ULL;
    uint64_t h = (uint64_t)m ^ (uint64_t)(m >> 64);
    return &t->index[h & t->imask];
}

/* The index link pointing at gid's slot, or NULL. */
static uint32_t *link_of(const evrec *t, uint64_t gid)
{
    uint32_t *pp = bucket(t, gid);

    while (*pp != 0) {
        struct slot *sl = &t->slots[*pp - 1];
        if (sl->gid == gid)
            return pp;
        pp = &sl->next;
    }
    return NULL;
}

static void to_entry(const struct slot *sl, evrec_entry *e)
{
    e->gid = sl->gid;
    e->ticks = sl->ticks;
    e->node = sl->node;
    e->exptime = sl->exptime;
    e->part = sl->part;
    e->kind = sl->kind;
}

int evrec_resize(evrec *t, size_t capacity)
{
    evrec *n;

    if (capacity < t->count || capacity == 0)
        return -1;
    n = evrec_create(capacity, t->seed);
    if (n == NULL)
        return -1;
    /* Oldest first, so that the order of entries is kept. */
    for (uint64_t p = t->tail; p < t->head; p++) {
        struct slot *sl = &t->slots[p % t->cap];
        evrec_entry e;
        if (sl->gid == 0)
            continue;
        to_entry(sl, &e);
        evrec_put(n, &e, NULL);
    }
    free(t->slots);
    free(t->index);
    *t = *n;
    free(n);
    return 0;
}

bool evrec_find(const evrec *t, uint64_t gid, evrec_entry *out)
{
    uint32_t *pp = gid != 0 ? link_of(t, gid) : NULL;

    if (pp == NULL)
        return false;
    if (out != NULL)
        to_entry(&t->slots[*pp - 1], out);
    return true;
}

/* Unlinks the slot *pp names and frees it (a hole in the ring). */
static void drop_at(evrec *t, uint32_t *pp, evrec_entry *out)
{
    struct slot *sl = &t->slots[*pp - 1];

    if (out != NULL)
        to_entry(sl, out);
    *pp = sl->next;
    memset(sl, 0, sizeof(*sl));
    t->count--;
}

bool evrec_remove(evrec *t, uint64_t gid, evrec_entry *out)
{
    uint32_t *pp = gid != 0 ? link_of(t, gid) : NULL;

    if (pp == NULL)
        return false;
    drop_at(t, pp, out);
    return true;
}

/* Frees the oldest slot's entry, if the tail holds one. */
static bool drop_oldest(evrec *t, evrec_entry *out)
{
    while (t->tail < t->head) {
        struct slot *sl = &t->slots[t->tail % t->cap];
        t->tail++;
        if (sl->gid != 0) {
            drop_at(t, link_of(t, sl->gid), out);
            return true;
        }
    }
    return false;
}

/*
 * Moves every entry of [tail, head) towards the tail, closing the holes,
 * in order; head follows. O(entries), done when holes are at least a
 * quarter of the ring, so at least capacity / 4 puts pay for each.
 */
static void compact(evrec *t)
{
    uint64_t w = t->tail;

    for (uint64_t r = t->tail; r < t->head; r++) {
        struct slot *from = &t->slots[r % t->cap];
        if (from->gid == 0)
            continue;
        if (r != w) {
            uint32_t *pp = link_of(t, from->gid);
            struct slot *to = &t->slots[w % t->cap];
            *to = *from;
            memset(from, 0, sizeof(*from));
            *pp = (uint32_t)(w % t->cap) + 1;
        }
        w++;
    }
    t->head = w;
}

bool evrec_put(evrec *t, const evrec_entry *e, evrec_entry *evicted)
{
    bool dropped = false;

    if (e->gid == 0)
        return false;
    evrec_remove(t, e->gid, NULL);
    /* Move the tail past holes; if the ring is still full, close the holes
     * when there are many, else its oldest entry goes. */
    while (t->tail < t->head && t->slots[t->tail % t->cap].gid == 0)
        t->tail++;
    if (t->head - t->tail == t->cap && t->count <= t->cap - t->cap / 4 &&
        t->count < t->cap)
        compact(t);
    if (t->head - t->tail == t->cap)
        dropped = drop_oldest(t, evicted);

    size_t i = (size_t)(t->head % t->cap);
    struct slot *sl = &t->slots[i];
    uint32_t *b = bucket(t, e->gid);
    sl->gid = e->gid;
    sl->ticks = e->ticks;
    sl->node = e->node;
    sl->exptime = e->exptime;
    sl->part = e->part;
    sl->kind = e->kind;
    sl->next = *b;
    *b = (uint32_t)i + 1;
    t->head++;
    t->count++;
    return dropped;
}

size_t evrec_walk(evrec *t, uint64_t *cursor, size_t budget, evrec_fn fn,
                  void *arg)
{
    uint64_t p = *cursor < t->tail ? t->tail : *cursor;
    size_t removed = 0;

    for (; p < t->head && budget > 0; p++, budget--) {
        struct slot *sl = &t->slots[p % t->cap];
        evrec_entry e;
        if (sl->gid == 0)
            continue;
        to_entry(sl, &e);
        if (fn(arg, &e)) {
            drop_at(t, link_of(t, e.gid), NULL);
            removed++;
        }
    }
    *cursor = p < t->head ? p : 0;
    return removed;
}
