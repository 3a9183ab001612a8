/*
 * viewsrc.h -- what every membership source (dnsview, etcdview) keeps
 * and says the same way: the views it hands to its owner, whether it
 * answers, the `stats replication` membership line, and the log lines of
 * a source that stops and starts answering.
 *
 * A source calls viewsrc_view with each view it gets (the owner's
 * registry_view_fn runs with "<kind> <name>" as the source), and
 * viewsrc_failed when an answer does not come; the last view then stays
 * with the owner. Threading: the source's loop thread, except
 * viewsrc_text (any thread).
 */
#ifndef VIEWSRC_H
#define VIEWSRC_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "registry.h"

typedef struct viewsrc {
    registry_view_fn on_view;
    void *arg;
    char kind[8];             /* "dns", "etcd" */
    char name[160];           /* the names or URLs, as configured */
    const char *unit, *units; /* what a view counts: "member", "members" */
    uint64_t fail_logged_ms;
    pthread_mutex_t lock; /* guards what viewsrc_text reads */
    uint64_t failing_ms;  /* since when it does not answer (0: it does) */
    bool have_view;
    size_t last_n;
} viewsrc;

void viewsrc_init(viewsrc *s, const char *kind, const char *name,
                  const char *unit, const char *units,
                  registry_view_fn on_view, void *arg);
void viewsrc_fini(viewsrc *s);

/* A view: the source answers; the owner gets the view. */
void viewsrc_view(viewsrc *s, const registry_member *m, size_t n);

/* The source answered (a view may follow later). */
void viewsrc_ok(viewsrc *s);

/* No answer (why: what failed): the last view stays; a warning at most
 * every 30 s. */
void viewsrc_failed(viewsrc *s, const char *why);

/* The membership line of `stats replication`. */
void viewsrc_text(viewsrc *s, char *out, size_t n);

#endif /* VIEWSRC_H */
