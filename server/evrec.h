/*
 * evrec.h -- a compact table of keyless mutation records, oldest first.
 *
 * What an evicted value leaves behind on a replicating node (see store.c,
 * "Eviction is local"): its key's cluster-wide hash (gid), its version,
 * expiry and partition, 32 bytes in all, without key or value. At most one
 * entry per gid. The table has a fixed capacity chosen at creation and
 * remembers the order entries were put in, so that a full table gives up
 * its oldest entry.
 *
 * A plain container: no locking (the store serializes calls), no
 * allocation after evrec_create, no knowledge of what a kind means.
 */
#ifndef EVREC_H
#define EVREC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct evrec_entry {
    uint64_t gid;   /* never 0: 0 marks a free slot */
    uint64_t ticks; /* version */
    uint32_t node;
    uint32_t exptime; /* unix seconds, 0 = never */
    uint16_t part;    /* partition */
    uint8_t kind;     /* the store's; opaque here */
} evrec_entry;

typedef struct evrec evrec;

/* Bytes one entry costs (slot and index), to size a table from a budget. */
#define EVREC_ENTRY_BYTES 36u
/* And in an ordered table (its heap and each slot's place in it). */
#define EVREC_ORDERED_ENTRY_BYTES 44u

/*
 * A table of `capacity` entries (>= 1, < 2^31), or NULL without memory.
 * seed keys the index's hash: gids are public functions of keys, so without
 * it a client could pile entries into one chain.
 */
evrec *evrec_create(size_t capacity, uint64_t seed);

/*
 * An ordered table: instead of its oldest entry, a full one gives up its
 * least entry by (exptime, gid), and an entry below all it holds does not
 * enter (evrec_put reports it as the one given up). What it holds is then
 * a function of the entries it was given, not of their order: two full
 * tables given the same entries in any order hold the same ones. Walks go
 * in slot order, not oldest first.
 */
evrec *evrec_create_ordered(size_t capacity, uint64_t seed);
void evrec_destroy(evrec *t);

/*
 * Whether evrec_put would keep e: always, unless the table is ordered,
 * full, holds no entry for e's gid and e is below its least entry.
 */
bool evrec_admits(const evrec *t, const evrec_entry *e);

size_t evrec_capacity(const evrec *t);
size_t evrec_count(const evrec *t);

/*
 * Gives the table room for `capacity` entries (>= its count, >= 1),
 * keeping every entry and their order. 0, or -1 (table unchanged) when the
 * capacity is too small or memory is lacking.
 */
int evrec_resize(evrec *t, size_t capacity);

/* Copies gid's entry to *out (may be NULL). Returns false when absent. */
bool evrec_find(const evrec *t, uint64_t gid, evrec_entry *out);

/*
 * Removes gid's entry, copying it to *out (may be NULL) first. Returns
 * false when absent.
 */
bool evrec_remove(evrec *t, uint64_t gid, evrec_entry *out);

/*
 * Adds e as the newest entry. Any entry gid already has is removed first.
 * When the table has no room, its oldest entry (ordered: its least, which
 * may be e itself, then not added) is removed to make room and copied to
 * *evicted (may be NULL); returns true then, false otherwise.
 * Room: removals leave holes in the order of entries, which are reused
 * once they are the oldest, or all at once when they reach a quarter of
 * the capacity; so a put may remove the oldest entry while up to a quarter
 * of the capacity is free. e->gid must not be 0.
 */
bool evrec_put(evrec *t, const evrec_entry *e, evrec_entry *evicted);

/*
 * Visits up to `budget` slots from *cursor (0 to start; the table keeps no
 * cursor of its own), calling fn on each entry, oldest first from the
 * start. fn returns true to remove the entry it was given. *cursor moves
 * past the visited slots; it comes back to 0 after the newest entry.
 * Returns the number of entries removed. fn may not call into the table.
 */
typedef bool (*evrec_fn)(void *arg, const evrec_entry *e);
size_t evrec_walk(evrec *t, uint64_t *cursor, size_t budget, evrec_fn fn,
                  void *arg);

#endif /* EVREC_H */
