/*
 * prefix_stats.c -- per-prefix counters for `stats detail` (see the header).
 * One table for the process under one mutex: counting is off by default
 * and, when on, a debugging aid, as in memcached.
 */
#include "prefix_stats.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

struct prefix {
    char name[PREFIX_STATS_LEN + 1];
    size_t len;
    uint64_t get, hit, set, del;
};

static struct {
    pthread_mutex_t lock;
    struct prefix v[PREFIX_STATS_MAX];
    size_t n;
    _Atomic bool on;
} ps = {.lock = PTHREAD_MUTEX_INITIALIZER};

void prefix_stats_enable(bool on)
{
    atomic_store_explicit(&ps.on, on, memory_order_relaxed);
}

void prefix_stats_clear(void)
{
    pthread_mutex_lock(&ps.lock);
    ps.n = 0;
    pthread_mutex_unlock(&ps.lock);
}

/* The entry for name (lock held), added when there is room; or NULL. */
static struct prefix *find(const char *name, size_t len)
{
    for (size_t i = 0; i < ps.n; i++)
        if (ps.v[i].len == len && memcmp(ps.v[i].name, name, len) == 0)
            return &ps.v[i];
    if (ps.n == PREFIX_STATS_MAX)
        return NULL;
    struct prefix *p = &ps.v[ps.n++];
    memset(p, 0, sizeof(*p)); /* a slot may hold counts from before a clear */
    memcpy(p->name, name, len);
    p->name[len] = '\0';
    p->len = len;
    return p;
}

void prefix_stats_record(const char *key, size_t nkey, enum prefix_stats_op op,
                         bool hit)
{
    if (!atomic_load_explicit(&ps.on, memory_order_relaxed))
        return;
    const char *d = memchr(key, ':', nkey);
    if (d == NULL || (size_t)(d - key) > PREFIX_STATS_LEN)
        return;
    pthread_mutex_lock(&ps.lock);
    struct prefix *p = find(key, (size_t)(d - key));
    if (p != NULL) {
        switch (op) {
        case PREFIX_STATS_GET:
            p->get++;
            p->hit += hit;
            break;
        case PREFIX_STATS_SET:
            p->set++;
            break;
        case PREFIX_STATS_DEL:
            p->del++;
            break;
        }
    }
    pthread_mutex_unlock(&ps.lock);
}

void prefix_stats_dump(prefix_stats_line_fn line, void *arg)
{
    char buf[PREFIX_STATS_LEN + 128];

    pthread_mutex_lock(&ps.lock);
    for (size_t i = 0; i < ps.n; i++) {
        const struct prefix *p = &ps.v[i];
        int n = snprintf(
            buf, sizeof(buf), "PREFIX %s get %llu hit %llu set %llu del %llu",
            p->name, (unsigned long long)p->get, (unsigned long long)p->hit,
            (unsigned long long)p->set, (unsigned long long)p->del);
        if (n > 0 && (size_t)n < sizeof(buf))
            line(arg, buf, (size_t)n);
    }
    pthread_mutex_unlock(&ps.lock);
}
