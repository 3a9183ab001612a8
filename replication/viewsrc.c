/*
 * viewsrc.c -- the state and the words every membership source shares
 * (see viewsrc.h).
 */
#include "viewsrc.h"

#include <stdio.h>
#include <string.h>
#include <time.h>

#include "log.h"

#define FAIL_LOG_EVERY_MS 30000

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

void viewsrc_init(viewsrc *s, const char *kind, const char *name,
                  const char *unit, const char *units,
                  registry_view_fn on_view, void *arg)
{
    memset(s, 0, sizeof(*s));
    snprintf(s->kind, sizeof(s->kind), "%s", kind);
    snprintf(s->name, sizeof(s->name), "%s", name ? name : "");
    s->unit = unit;
    s->units = units;
    s->on_view = on_view;
    s->arg = arg;
    pthread_mutex_init(&s->lock, NULL);
}

void viewsrc_fini(viewsrc *s)
{
    pthread_mutex_destroy(&s->lock);
}

void viewsrc_ok(viewsrc *s)
{
    pthread_mutex_lock(&s->lock);
    bool was_failing = s->failing_ms != 0;
    s->failing_ms = 0;
    pthread_mutex_unlock(&s->lock);
    if (was_failing)
        LOG(LOG_LEVEL_INFO, "membership", "%s %s answers again", s->kind,
            s->name);
    s->fail_logged_ms = 0;
}

void viewsrc_view(viewsrc *s, const registry_member *m, size_t n)
{
    viewsrc_ok(s);
    pthread_mutex_lock(&s->lock);
    s->have_view = true;
    s->last_n = n;
    pthread_mutex_unlock(&s->lock);
    char source[sizeof(s->kind) + sizeof(s->name) + 2];
    snprintf(source, sizeof(source), "%s %s", s->kind, s->name);
    s->on_view(s->arg, m, n, source);
}

void viewsrc_failed(viewsrc *s, const char *why)
{
    uint64_t now = now_ms();
    pthread_mutex_lock(&s->lock);
    if (s->failing_ms == 0)
        s->failing_ms = now;
    bool have = s->have_view;
    pthread_mutex_unlock(&s->lock);
    if (s->fail_logged_ms == 0 ||
        now - s->fail_logged_ms >= FAIL_LOG_EVERY_MS) {
        s->fail_logged_ms = now;
        LOG(LOG_LEVEL_WARN, "membership",
            "%s %s: %s; keeping the last view (%s)", s->kind, s->name, why,
            have ? "as it was" : "none yet");
    }
}

void viewsrc_text(viewsrc *s, char *out, size_t n)
{
    pthread_mutex_lock(&s->lock);
    if (s->failing_ms != 0)
        snprintf(out, n, "%s %s (not answering for %llu s; %s)", s->kind,
                 s->name,
                 (unsigned long long)((now_ms() - s->failing_ms) / 1000),
                 s->have_view ? "last view kept" : "no view yet");
    else if (s->have_view)
        snprintf(out, n, "%s %s (%zu %s)", s->kind, s->name, s->last_n,
                 s->last_n == 1 ? s->unit : s->units);
    else
        snprintf(out, n, "%s %s (starting)", s->kind, s->name);
    pthread_mutex_unlock(&s->lock);
}
