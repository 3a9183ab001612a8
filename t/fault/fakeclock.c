/*
 * fakeclock.c -- an LD_PRELOAD library that moves a process's wall clock.
 *
 * The fault tests start one node with this library preloaded and
 * RIBLTCACHE_CLOCK_OFFSET set to a number of seconds (signed): every
 * CLOCK_REALTIME reading of the process (clock_gettime, gettimeofday, time)
 * is then that far ahead of the host's. Monotonic and CPU clocks are left
 * alone, so timers, timeouts and libevent keep real time.
 *
 * Why not libfaketime: its start-up looks up symbols with dlsym, glibc
 * allocates the error text of a failed lookup, jemalloc's first
 * initialisation reads the clock, which re-enters libfaketime before it is
 * ready, and the daemon deadlocks on jemalloc's init lock before main().
 * This library needs neither dlsym nor malloc: it reads the clocks with the
 * system call itself and the offset once, from a constructor.
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

static int64_t offset_ns;

/* Reads RIBLTCACHE_CLOCK_OFFSET (whole seconds, may be negative) once. */
__attribute__((constructor)) static void fakeclock_init(void)
{
    const char *s = getenv("RIBLTCACHE_CLOCK_OFFSET");
    char *end;
    long long v;

    if (s == NULL || *s == '\0')
        return;
    v = strtoll(s, &end, 10);
    if (*end == 's')
        end++;
    if (*end != '\0' || v > 10LL * 365 * 86400 || v < -10LL * 365 * 86400)
        return;
    offset_ns = (int64_t)v * 1000000000;
}

static int is_wall(clockid_t id)
{
    return id == CLOCK_REALTIME || id == CLOCK_REALTIME_COARSE ||
           id == CLOCK_TAI;
}

/*
 * clock_gettime as libc's, through the system call; wall clocks are moved
 * by the offset. Returns 0, or -1 with errno set.
 */
int clock_gettime(clockid_t id, struct timespec *ts)
{
    if (syscall(SYS_clock_gettime, id, ts) != 0)
        return -1;
    if (is_wall(id) && offset_ns != 0) {
        int64_t ns = (int64_t)ts->tv_nsec + offset_ns % 1000000000;
        int64_t sec = (int64_t)ts->tv_sec + offset_ns / 1000000000;

        if (ns < 0) {
            ns += 1000000000;
            sec--;
        } else if (ns >= 1000000000) {
            ns -= 1000000000;
            sec++;
        }
        ts->tv_sec = (time_t)sec;
        ts->tv_nsec = (long)ns;
    }
    return 0;
}

/* gettimeofday on the moved wall clock; the time zone is not reported. */
int gettimeofday(struct timeval *restrict tv, void *restrict tz)
{
    struct timespec ts;

    if (tz != NULL) {
        struct timezone *z = tz;
        z->tz_minuteswest = 0;
        z->tz_dsttime = 0;
    }
    if (clock_gettime(CLOCK_REALTIME, &ts) != 0)
        return -1;
    tv->tv_sec = ts.tv_sec;
    tv->tv_usec = ts.tv_nsec / 1000;
    return 0;
}

/* time on the moved wall clock. */
time_t time(time_t *t)
{
    struct timespec ts;

    if (clock_gettime(CLOCK_REALTIME, &ts) != 0)
        return (time_t)-1;
    if (t != NULL)
        *t = ts.tv_sec;
    return ts.tv_sec;
}
