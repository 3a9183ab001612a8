/*
 * evloop.c -- a libevent loop on a thread of its own (see evloop.h).
 */
#define _GNU_SOURCE /* pthread_setname_np */
#include "evloop.h"

#include <stdint.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <event2/event.h>

static void stop_cb(evutil_socket_t fd, short what, void *arg)
{
    evloop *l = arg;
    (void)fd;
    (void)what;
    if (l->on_stop)
        l->on_stop(l->arg);
    event_base_loopbreak(l->base);
}

static void *loop_main(void *arg)
{
    evloop *l = arg;
    event_base_dispatch(l->base);
    return NULL;
}

int evloop_init(evloop *l, void (*on_stop)(void *arg), void *arg)
{
    l->base = NULL;
    l->stop_ev = NULL;
    l->started = false;
    l->on_stop = on_stop;
    l->arg = arg;
    l->stop_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    /* Precise timers (a timerfd under epoll): the push window is a
     * fraction of a millisecond, which epoll_wait's timeout would round
     * up to a whole one. */
    struct event_config *cfg = event_config_new();
    if (cfg) {
        event_config_set_flag(cfg, EVENT_BASE_FLAG_PRECISE_TIMER);
        l->base = event_base_new_with_config(cfg);
        event_config_free(cfg);
    }
    if (l->stop_fd < 0 || !l->base)
        return -1;
    l->stop_ev = event_new(l->base, l->stop_fd, EV_READ, stop_cb, l);
    if (!l->stop_ev || event_add(l->stop_ev, NULL) != 0)
        return -1;
    return 0;
}

int evloop_start(evloop *l, const char *name)
{
    if (pthread_create(&l->thread, NULL, loop_main, l) != 0)
        return -1;
    l->started = true;
    if (name)
        (void)pthread_setname_np(l->thread, name); /* a name is no must */
    return 0;
}

void evloop_stop(evloop *l)
{
    if (!l->started)
        return;
    uint64_t one = 1;
    ssize_t n = write(l->stop_fd, &one, sizeof(one));
    (void)n; /* an eventfd write cannot fail short of overflow */
    pthread_join(l->thread, NULL);
    l->started = false;
}

void evloop_fini(evloop *l)
{
    if (l->stop_ev)
        event_free(l->stop_ev);
    /*
     * One last pass over what libevent itself still has queued: a
     * bufferevent freed while a deferred callback of its own was pending
     * (a connect that succeeded at once, say) is referenced by that
     * callback until it runs, and event_base_free drops such callbacks
     * without running them. The owner's events are gone by now, so only
     * libevent's own run.
     */
    if (l->base)
        event_base_loop(l->base, EVLOOP_NONBLOCK);
    if (l->base)
        event_base_free(l->base);
    if (l->stop_fd >= 0)
        close(l->stop_fd);
    l->stop_ev = NULL;
    l->base = NULL;
    l->stop_fd = -1;
}

int evloop_add_ms(struct event *ev, uint32_t ms)
{
    struct timeval tv = {(time_t)(ms / 1000), (suseconds_t)(ms % 1000) * 1000};
    return event_add(ev, &tv);
}
