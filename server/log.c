/*
 * log.c -- the daemon's log (see log.h): one formatted line per call, to
 * stderr or syslog.
 */
#define _GNU_SOURCE
#include "log.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <syslog.h>
#include <time.h>
#include <unistd.h>

static _Atomic int log_level = LOG_LEVEL_WARN;
static bool log_syslog;
static char log_ident[64] = "ribltcached";

static const char *const level_names[] = {"error", "warn", "info", "debug"};

void log_setup(const char *ident, int level, bool use_syslog)
{
    if (ident) {
        const char *base = strrchr(ident, '/');
        snprintf(log_ident, sizeof(log_ident), "%s", base ? base + 1 : ident);
    }
    if (level < LOG_LEVEL_ERROR)
        level = LOG_LEVEL_ERROR;
    if (level > LOG_LEVEL_DEBUG)
        level = LOG_LEVEL_DEBUG;
    log_level = level;
    log_syslog = use_syslog;
    if (use_syslog)
        openlog(log_ident, LOG_PID | LOG_NDELAY, LOG_DAEMON);
}

int log_open_file(const char *path)
{
    if (!path)
        return 0;
    int fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0640);
    if (fd < 0)
        return -1;
    /* dup2 swaps descriptor 2 in one step: no moment without a log. */
    int rc = dup2(fd, STDERR_FILENO) < 0 ? -1 : 0;
    close(fd);
    return rc;
}

int log_level_parse(const char *s)
{
    for (int i = 0; i <= LOG_LEVEL_DEBUG; i++)
        if (s && strcmp(s, level_names[i]) == 0)
            return i;
    return -1;
}

bool log_enabled(int level)
{
    return level <= log_level;
}

void log_write(int level, const char *subsystem, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;

    if (level < LOG_LEVEL_ERROR || level > LOG_LEVEL_DEBUG)
        level = LOG_LEVEL_ERROR;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    if (log_syslog) {
        static const int prio[] = {LOG_ERR, LOG_WARNING, LOG_INFO, LOG_DEBUG};
        syslog(prio[level], "%s %s: %s", level_names[level], subsystem, msg);
        return;
    }
    struct timespec ts;
    struct tm tm;
    char when[32];
    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    strftime(when, sizeof(when), "%Y-%m-%dT%H:%M:%S", &tm);
    /* One fprintf per line: stdio locks the stream for the call. */
    fprintf(stderr, "%s.%03ldZ %s[%ld] %s %s: %s\n", when,
            ts.tv_nsec / 1000000, log_ident, (long)getpid(),
            level_names[level], subsystem, msg);
}

bool log_limit_pass(log_limit *l, uint64_t interval_ms, uint32_t *held)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    uint64_t now = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
    if (now < l->next_ns) {
        l->held++;
        return false;
    }
    l->next_ns = now + interval_ms * 1000000ull;
    if (held)
        *held = l->held;
    l->held = 0;
    return true;
}

bool log_addr(const struct sockaddr *sa, size_t salen, char *out, size_t n)
{
    const void *ip;
    unsigned port;
    bool v6 = sa->sa_family == AF_INET6;
    if (sa->sa_family == AF_INET && salen >= sizeof(struct sockaddr_in)) {
        const struct sockaddr_in *a = (const void *)sa;
        ip = &a->sin_addr;
        port = ntohs(a->sin_port);
    } else if (v6 && salen >= sizeof(struct sockaddr_in6)) {
        const struct sockaddr_in6 *a = (const void *)sa;
        ip = &a->sin6_addr;
        port = ntohs(a->sin6_port);
    } else {
        return false;
    }
    char host[INET6_ADDRSTRLEN], tmp[INET6_ADDRSTRLEN + 10];
    if (!inet_ntop(sa->sa_family, ip, host, sizeof(host)))
        return false;
    int w = snprintf(tmp, sizeof(tmp), v6 ? "[%s]:%u" : "%s:%u", host, port);
    if (w < 0 || (size_t)w >= n)
        return false;
    memcpy(out, tmp, (size_t)w + 1);
    return true;
}
