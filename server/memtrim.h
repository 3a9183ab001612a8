/*
 * memtrim.h -- gives the general allocator's unused pages back to the
 * system once they pile up.
 *
 * jemalloc returns freed pages by decay, a little at each allocation in
 * the same arena. A process that frees a large burst (a walked round's
 * encoders, peer buffers after a fast writer) and then goes quiet keeps
 * those pages resident, outside -m, for as long as it stays quiet: a
 * -m 64 node kept 26 MB of them. The daemon calls memtrim_tick once a
 * second; only when the unused pages exceed the slack is anything done.
 *
 * Without jemalloc (sanitizer builds) both calls do nothing.
 */
#ifndef MEMTRIM_H
#define MEMTRIM_H

#include <stdbool.h>
#include <stddef.h>

/* Bytes of unused pages the allocator holds resident (0 when unknown). */
size_t memtrim_unused(void);

/*
 * Gives the unused pages back when they exceed `slack` bytes. Returns
 * whether it did.
 */
bool memtrim_tick(size_t slack);

#endif
