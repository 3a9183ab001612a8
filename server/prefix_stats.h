/*
 * prefix_stats.h -- memcached's per-prefix statistics (`stats detail`).
 *
 * When on, every get, set and delete of a key that holds the delimiter
 * (':') counts for the prefix before it: gets, hits, sets, deletes.
 * `stats detail dump` lists them as memcached does:
 *   PREFIX <prefix> get <n> hit <n> set <n> del <n>
 * Off by default; counting costs a mutex per request while on. At most
 * PREFIX_STATS_MAX prefixes are kept (later ones are not counted), each
 * at most PREFIX_STATS_LEN bytes.
 */
#ifndef PREFIX_STATS_H
#define PREFIX_STATS_H

#include <stdbool.h>
#include <stddef.h>

#define PREFIX_STATS_MAX 4096
#define PREFIX_STATS_LEN 250

enum prefix_stats_op {
    PREFIX_STATS_GET = 0, /* counts a hit too when hit */
    PREFIX_STATS_SET = 1,
    PREFIX_STATS_DEL = 2,
};

/* Turns counting on or off (the counts stay until the process ends). */
void prefix_stats_enable(bool on);

/* Forgets every prefix and its counts (stats reset). */
void prefix_stats_clear(void);

/* Counts one operation on key (no-op while off or without a delimiter). */
void prefix_stats_record(const char *key, size_t nkey, enum prefix_stats_op op,
                         bool hit);

/*
 * Calls line(arg, text, len) for each prefix, in the order first seen,
 * with the dump line without its "\r\n".
 */
typedef void (*prefix_stats_line_fn)(void *arg, const char *text, size_t len);
void prefix_stats_dump(prefix_stats_line_fn line, void *arg);

#endif /* PREFIX_STATS_H */
