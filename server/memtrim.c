/*
 * memtrim.c -- returns jemalloc's dirty pages to the system (memtrim.h).
 *
 * jemalloc's own names, through mallctl: "epoch" refreshes the statistics,
 * "stats.arenas.<all>.pdirty" is the number of dirty pages (freed, still
 * resident) over all arenas, and "arena.<all>.purge" returns them.
 */
#include "memtrim.h"

#ifdef HAVE_JEMALLOC
#include <stdint.h>

#include <jemalloc/jemalloc.h>

#define ALL_ARENAS_STR(x) #x
#define ALL_ARENAS(x) ALL_ARENAS_STR(x)

size_t memtrim_unused(void)
{
    uint64_t epoch = 1;
    size_t pdirty = 0, page = 0, sz = sizeof(epoch);

    if (mallctl("epoch", &epoch, &sz, &epoch, sz) != 0)
        return 0;
    sz = sizeof(pdirty);
    if (mallctl("stats.arenas." ALL_ARENAS(MALLCTL_ARENAS_ALL) ".pdirty",
                &pdirty, &sz, NULL, 0) != 0)
        return 0;
    sz = sizeof(page);
    if (mallctl("arenas.page", &page, &sz, NULL, 0) != 0)
        return 0;
    return pdirty * page;
}

bool memtrim_tick(size_t slack)
{
    if (memtrim_unused() <= slack)
        return false;
    return mallctl("arena." ALL_ARENAS(MALLCTL_ARENAS_ALL) ".purge", NULL,
                   NULL, NULL, 0) == 0;
}

#else

size_t memtrim_unused(void)
{
    return 0;
}

bool memtrim_tick(size_t slack)
{
    (void)slack;
    return false;
}

#endif
