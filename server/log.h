/*
 * log.h -- the daemon's one log: every line has a UTC timestamp, the
 * process, a level and the subsystem that wrote it, and goes to stderr or,
 * with log_syslog, to syslog (journald reads either). Thread-safe: a line
 * is written in one call. Nothing is formatted unless its level is on
 * (LOG checks first), so a hot path may hold a LOG at debug level for free.
 *
 * Levels: error and warn are on by default; -v adds info (start-up line,
 * peers up, bulk transfers, ring changes), -vv debug (client connections).
 * log_level sets the floor by name.
 */
#ifndef RIBLTCACHE_LOG_H
#define RIBLTCACHE_LOG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct sockaddr;

enum log_level {
    LOG_LEVEL_ERROR = 0,
    LOG_LEVEL_WARN = 1,
    LOG_LEVEL_INFO = 2,
    LOG_LEVEL_DEBUG = 3,
};

/* Sets the process name, the level and the sink. Call once at start-up,
 * before other threads log (until then: stderr, warn, "ribltcached"). */
void log_setup(const char *ident, int level, bool use_syslog);

/*
 * Sends stderr, and with it every log line, to the file at path (opened
 * for appending, created 0640), or keeps it where it is when path is
 * NULL. Called again (SIGHUP) it reopens the path, so a rotated log is let
 * go: lines written meanwhile land in the old file or the new one, none
 * is lost. Returns 0, or -1 with errno when the file cannot be opened
 * (stderr is then left as it was).
 */
int log_open_file(const char *path);

/* The level named by s ("error", "warn", "info", "debug"), or -1. */
int log_level_parse(const char *s);

/* True when lines of this level are written. */
bool log_enabled(int level);

void log_write(int level, const char *subsystem, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#define LOG(level, subsystem, ...)                                            \
    do {                                                                      \
        if (log_enabled(level))                                               \
            log_write((level), (subsystem), __VA_ARGS__);                     \
    } while (0)

/*
 * A rate limit for one kind of event: log_limit_pass returns true at most
 * once per interval; the lines it held back meanwhile are counted and
 * given back (*held) with the next one that passes, for the line to say
 * "(N more since)". Not thread-safe: one limit belongs to one thread.
 */
typedef struct log_limit {
    uint64_t next_ns;
    uint32_t held;
} log_limit;

bool log_limit_pass(log_limit *l, uint64_t interval_ms, uint32_t *held);

/*
 * Writes a TCP address the way log lines and peer lists give one:
 * "1.2.3.4:5" or "[::1]:5". Returns false, writing nothing, for another
 * family, a short salen or a buffer too small.
 */
bool log_addr(const struct sockaddr *sa, size_t salen, char *out, size_t n);

#endif
