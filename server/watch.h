/*
 * watch.h -- memcached's `watch`: event lines streamed to the connections
 * that asked for them.
 *
 * A connection subscribes with a mask of event kinds; every event of those
 * kinds, on any thread, is formatted once (memcached's line format, keys
 * URI-encoded) and appended to each subscriber's buffer. A subscriber that
 * does not keep up loses lines, never memory: its buffer holds at most
 * watch_buffer_bytes, lines beyond are counted and reported as
 * "skipped=N" once there is room again.
 *
 * Cost while nobody watches: callers test watch_wanted() (one relaxed
 * load) before building anything.
 */
#ifndef WATCH_H
#define WATCH_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <sys/socket.h>

#include "store.h"

struct evbuffer;

enum watch_kind {
    WATCH_FETCHERS = 1u,   /* item_get */
    WATCH_MUTATIONS = 2u,  /* item_store */
    WATCH_EVICTIONS = 4u,  /* eviction */
    WATCH_CONNEVENTS = 8u, /* conn_new, conn_close */
};

#define WATCH_MAX 16 /* subscribers at once */

enum watch_rc {
    WATCH_OK = 0,
    WATCH_ERR_TOO_MANY = -1,
    WATCH_ERR_NOMEM = -2,
};

/* The union of the subscribers' masks; read through watch_wanted. */
extern _Atomic unsigned watch_kinds;

static inline bool watch_wanted(unsigned kind)
{
    return (atomic_load_explicit(&watch_kinds, memory_order_relaxed) & kind) !=
           0;
}

typedef struct watch_sub watch_sub;

/* Sets each subscriber's buffer size (memcached's watcher_logbuf_size, in
 * KB there); applies to subscriptions made afterwards. */
void watch_set_buffer(size_t bytes);

/* Subscribes to the kinds in mask. Returns WATCH_OK and *out, or an error. */
int watch_subscribe(unsigned mask, watch_sub **out);

/* Ends a subscription; its waiting lines are dropped. NULL is a no-op. */
void watch_unsubscribe(watch_sub *w);

/* Moves the lines waiting for w (at most its buffer size, a pending
 * "skipped=N" line first) into out. Returns the bytes moved. */
size_t watch_take(watch_sub *w, struct evbuffer *out);

/* memcached's log_* stats. */
typedef struct watch_stats {
    uint64_t watchers; /* subscribed now */
    uint64_t written;  /* lines formatted */
    uint64_t sent;     /* lines handed to a watcher's buffer */
    uint64_t skipped;  /* lines a watcher lost (its buffer was full) */
} watch_stats;

void watch_get_stats(watch_stats *out);

/* Events. Call only when watch_wanted(kind) is true. */

/* fetchers: a read of key that found it (NULL: a miss, for why, a
 * STORE_MISS_* of store_read_info). */
void watch_item_get(const char *key, size_t nkey, const store_item *it,
                    int why, int fd);

/* mutations: a write that returned rc (STORE_*). */
void watch_item_store(const store_write *w, int rc, int64_t now, int fd);

/* evictions: a store_options.evict_fn (arg unused). */
void watch_eviction(void *arg, const store_item_info *ii);

/* open: conn_new, else conn_close with reason (normal, error, ...). */
void watch_conn(bool open, const struct sockaddr *peer, socklen_t peerlen,
                const char *reason, int fd);

/*
 * URI-encodes n bytes of src into dst (room for 3 n + 1 bytes): every byte
 * but letters, digits and "-._~" becomes %XX, as memcached's dumps do.
 * Returns the end of the text written (a NUL follows it).
 */
char *watch_uriencode(char *dst, const char *src, size_t n);

#endif /* WATCH_H */
