/*
 * testutil.h -- helpers shared by the riblt unit suites: a deterministic
 * id generator and exact set comparison.
 */
#ifndef RIBLT_TESTUTIL_H
#define RIBLT_TESTUTIL_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "riblt.h"

/*
 * Check's ck_assert reports every passed assertion to the parent process,
 * which is slow inside loops of millions: TU_REQUIRE only speaks on failure.
 */
#define TU_REQUIRE(cond)                                                      \
    do {                                                                      \
        if (!(cond))                                                          \
            ck_abort_msg("%s:%d: %s", __FILE__, __LINE__, #cond);             \
    } while (0)

/* splitmix64: a deterministic stream of test ids. */
static inline uint64_t tu_next(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static inline riblt_id tu_id(uint64_t *s)
{
    riblt_id id;
    id.lo = tu_next(s);
    id.hi = tu_next(s);
    return id;
}

static inline int tu_cmp_id(const void *a, const void *b)
{
    const riblt_id *x = a, *y = b;
    if (x->hi != y->hi)
        return x->hi < y->hi ? -1 : 1;
    if (x->lo != y->lo)
        return x->lo < y->lo ? -1 : 1;
    return 0;
}

/* 1 when the two arrays hold the same ids (in any order); sorts both. */
static inline int tu_same_set(riblt_id *a, size_t na, riblt_id *b, size_t nb)
{
    if (na != nb)
        return 0;
    qsort(a, na, sizeof(*a), tu_cmp_id);
    qsort(b, nb, sizeof(*b), tu_cmp_id);
    return na == 0 || memcmp(a, b, na * sizeof(*a)) == 0;
}

#endif /* RIBLT_TESTUTIL_H */
