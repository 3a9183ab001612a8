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
 *
 * An ordered table has no ring: free slots are chained through `next`,
 * and a binary min-heap of slot numbers by (exptime, gid), with each
 * slot's place in it, names the entry a full table gives up.
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
    bool ordered;
    uint32_t *heap; /* ordered: slot numbers, least first */
    uint32_t *hpos; /* ordered: each slot's place in heap */
    uint32_t free1; /* ordered: first free slot + 1, 0 = none */
};

static evrec *table_new(size_t capacity, uint64_t seed, bool ordered)
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
    if (ordered) {
        t->ordered = true;
        t->heap = calloc(capacity, sizeof(*t->heap));
        t->hpos = calloc(capacity, sizeof(*t->hpos));
        if (t->heap == NULL || t->hpos == NULL) {
            evrec_destroy(t);
            return NULL;
        }
        for (size_t i = 0; i + 1 < capacity; i++)
            t->slots[i].next = (uint32_t)i + 2;
        t->free1 = 1;
    }
    return t;
}

evrec *evrec_create(size_t capacity, uint64_t seed)
{
    return table_new(capacity, seed, false);
}

evrec *evrec_create_ordered(size_t capacity, uint64_t seed)
{
    return table_new(capacity, seed, true);
}

void evrec_destroy(evrec *t)
{
    if (t == NULL)
        return;
    free(t->slots);
    free(t->index);
    free(t->heap);
    free(t->hpos);
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

/* ========================================================== the heap */

static bool key_less(uint32_t ea, uint64_t ga, uint32_t eb, uint64_t gb)
{
    return ea != eb ? ea < eb : ga < gb;
}

static bool slot_less(const evrec *t, uint32_t a, uint32_t b)
{
    const struct slot *x = &t->slots[a], *y = &t->slots[b];
    return key_less(x->exptime, x->gid, y->exptime, y->gid);
}

static void heap_set(evrec *t, size_t i, uint32_t slot)
{
    t->heap[i] = slot;
    t->hpos[slot] = (uint32_t)i;
}

static void sift_up(evrec *t, size_t i)
{
    uint32_t x = t->heap[i];

    while (i > 0 && slot_less(t, x, t->heap[(i - 1) / 2])) {
        heap_set(t, i, t->heap[(i - 1) / 2]);
        i = (i - 1) / 2;
    }
    heap_set(t, i, x);
}

/* Heap of n entries. */
static void sift_down(evrec *t, size_t i, size_t n)
{
    uint32_t x = t->heap[i];

    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n)
            break;
        if (c + 1 < n && slot_less(t, t->heap[c + 1], t->heap[c]))
            c++;
        if (!slot_less(t, t->heap[c], x))
            break;
        heap_set(t, i, t->heap[c]);
        i = c;
    }
    heap_set(t, i, x);
}

/* Takes slot out of the heap of t->count entries. */
static void heap_remove(evrec *t, uint32_t slot)
{
    size_t i = t->hpos[slot], last = t->count - 1;

    if (i != last) {
        uint32_t moved = t->heap[last];
        heap_set(t, i, moved);
        sift_down(t, i, last);
        sift_up(t, t->hpos[moved]);
    }
}

/* ========================================================== the table */

/* The positions that may hold entries: the ring's [tail, head), or every
 * slot of an ordered table. */
static void span(const evrec *t, uint64_t *from, uint64_t *to)
{
    *from = t->ordered ? 0 : t->tail;
    *to = t->ordered ? t->cap : t->head;
}

int evrec_resize(evrec *t, size_t capacity)
{
    evrec *n;

    if (capacity < t->count || capacity == 0)
        return -1;
    n = table_new(capacity, t->seed, t->ordered);
    if (n == NULL)
        return -1;
    /* Oldest first, so that the order of entries is kept (an ordered
     * table has room for all and keeps no order of arrival). */
    uint64_t from, to;
    span(t, &from, &to);
    for (uint64_t p = from; p < to; p++) {
        struct slot *sl = &t->slots[p % t->cap];
        evrec_entry e;
        if (sl->gid == 0)
            continue;
        to_entry(sl, &e);
        evrec_put(n, &e, NULL);
    }
    free(t->slots);
    free(t->index);
    free(t->heap);
    free(t->hpos);
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

/* Unlinks the slot *pp names and frees it (a hole in the ring; in an
 * ordered table, out of the heap and onto the free chain). */
static void drop_at(evrec *t, uint32_t *pp, evrec_entry *out)
{
    uint32_t i = *pp - 1;
    struct slot *sl = &t->slots[i];

    if (out != NULL)
        to_entry(sl, out);
    *pp = sl->next;
    if (t->ordered)
        heap_remove(t, i);
    memset(sl, 0, sizeof(*sl));
    if (t->ordered) {
        sl->next = t->free1;
        t->free1 = i + 1;
    }
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

bool evrec_admits(const evrec *t, const evrec_entry *e)
{
    if (!t->ordered || t->count < t->cap || link_of(t, e->gid) != NULL)
        return true;
    const struct slot *m = &t->slots[t->heap[0]];
    return !key_less(e->exptime, e->gid, m->exptime, m->gid);
}

/* Fills slot i with e and links it into the index. */
static void link_slot(evrec *t, uint32_t i, const evrec_entry *e)
{
    struct slot *sl = &t->slots[i];
    uint32_t *b = bucket(t, e->gid);

    sl->gid = e->gid;
    sl->ticks = e->ticks;
    sl->node = e->node;
    sl->exptime = e->exptime;
    sl->part = e->part;
    sl->kind = e->kind;
    sl->next = *b;
    *b = i + 1;
}

static bool put_ordered(evrec *t, const evrec_entry *e, evrec_entry *evicted)
{
    bool dropped = false;

    if (t->count == t->cap) {
        if (!evrec_admits(t, e)) {
            if (evicted != NULL)
                *evicted = *e;
            return true;
        }
        drop_at(t, link_of(t, t->slots[t->heap[0]].gid), evicted);
        dropped = true;
    }
    uint32_t i = t->free1 - 1;
    t->free1 = t->slots[i].next;
    link_slot(t, i, e);
    heap_set(t, t->count, i);
    sift_up(t, t->count);
    t->count++;
    return dropped;
}

bool evrec_put(evrec *t, const evrec_entry *e, evrec_entry *evicted)
{
    bool dropped = false;

    if (e->gid == 0)
        return false;
    evrec_remove(t, e->gid, NULL);
    if (t->ordered)
        return put_ordered(t, e, evicted);
    /* Move the tail past holes; if the ring is still full, close the holes
     * when there are many, else its oldest entry goes. */
    while (t->tail < t->head && t->slots[t->tail % t->cap].gid == 0)
        t->tail++;
    if (t->head - t->tail == t->cap && t->count <= t->cap - t->cap / 4 &&
        t->count < t->cap)
        compact(t);
    if (t->head - t->tail == t->cap)
        dropped = drop_oldest(t, evicted);

    link_slot(t, (uint32_t)(t->head % t->cap), e);
    t->head++;
    t->count++;
    return dropped;
}

size_t evrec_walk(evrec *t, uint64_t *cursor, size_t budget, evrec_fn fn,
                  void *arg)
{
    uint64_t start, end;
    span(t, &start, &end);
    uint64_t p = *cursor < start ? start : *cursor;
    size_t removed = 0;

    for (; p < end && budget > 0; p++, budget--) {
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
    *cursor = p < end ? p : 0;
    return removed;
}
