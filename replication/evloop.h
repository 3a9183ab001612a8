/*
 * evloop.h -- a libevent loop on a thread of its own, stopped from any
 * thread: the lifecycle the replication thread (repl.c) and the registry
 * server (registry_server.c) share.
 *
 *   evloop_init   creates the event base and the stop event (an eventfd);
 *   evloop_start  runs event_base_dispatch on a new thread, named (as top
 *                 -H and ps -L show it) when name is not NULL;
 *   evloop_stop   asks the loop to stop (on_stop runs on the loop thread,
 *                 then the loop breaks) and joins the thread; a loop that
 *                 was never started is left alone;
 *   evloop_fini   frees what evloop_init created (after every event of the
 *                 owner's on the base is freed).
 */
#ifndef EVLOOP_H
#define EVLOOP_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

struct event;
struct event_base;

typedef struct evloop {
    struct event_base *base;
    struct event *stop_ev;
    int stop_fd;
    pthread_t thread;
    bool started;
    void (*on_stop)(void *arg); /* may be NULL */
    void *arg;
} evloop;

/* 0, or -1 when the base, the eventfd or the event cannot be created (what
 * was created is freed by evloop_fini, which is safe to call then). */
int evloop_init(evloop *l, void (*on_stop)(void *arg), void *arg);
/* 0, or -1 when the thread cannot be created. name: at most 15 bytes. */
int evloop_start(evloop *l, const char *name);
void evloop_stop(evloop *l);
void evloop_fini(evloop *l);

/* Adds ev (a timer) to fire in ms milliseconds; event_add's result. */
int evloop_add_ms(struct event *ev, uint32_t ms);

#endif /* EVLOOP_H */
