/*
 * watch.c -- see watch.h.
 *
 * One lock guards the subscriber table and every subscriber's buffer. It
 * is taken only while somebody watches (callers test watch_wanted first),
 * by event producers for one append and by a watching connection for one
 * take, so it stays short.
 */
#include "watch.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <sys/un.h>

#include <event2/buffer.h>

#define WATCH_LINE_MAX 1024    /* a 250-byte key encodes to 750 */
#define WATCH_BUFFER_MIN 1024u /* bytes */
#define WATCH_BUFFER_DEFAULT (256u * 1024u)

struct watch_sub {
    unsigned mask;
    size_t cap;
    uint64_t skipped; /* lines lost since the last skipped= line */
    struct evbuffer *buf;
};

_Atomic unsigned watch_kinds;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static watch_sub *subs[WATCH_MAX];
static size_t buffer_bytes = WATCH_BUFFER_DEFAULT;
static _Atomic uint64_t gid;
static uint64_t n_sent, n_skipped; /* lock held */

/* Recomputes watch_kinds (lock held). */
static void kinds_update(void)
{
    unsigned m = 0;
    for (size_t i = 0; i < WATCH_MAX; i++)
        if (subs[i] != NULL)
            m |= subs[i]->mask;
    atomic_store_explicit(&watch_kinds, m, memory_order_relaxed);
}

void watch_set_buffer(size_t bytes)
{
    pthread_mutex_lock(&lock);
    buffer_bytes = bytes < WATCH_BUFFER_MIN ? WATCH_BUFFER_MIN : bytes;
    pthread_mutex_unlock(&lock);
}

int watch_subscribe(unsigned mask, watch_sub **out)
{
    watch_sub *w = calloc(1, sizeof(*w));
    if (w == NULL)
        return WATCH_ERR_NOMEM;
    w->buf = evbuffer_new();
    if (w->buf == NULL) {
        free(w);
        return WATCH_ERR_NOMEM;
    }
    w->mask = mask;
    pthread_mutex_lock(&lock);
    w->cap = buffer_bytes;
    size_t i = 0;
    while (i < WATCH_MAX && subs[i] != NULL)
        i++;
    if (i == WATCH_MAX) {
        pthread_mutex_unlock(&lock);
        evbuffer_free(w->buf);
        free(w);
        return WATCH_ERR_TOO_MANY;
    }
    subs[i] = w;
    kinds_update();
    pthread_mutex_unlock(&lock);
    *out = w;
    return WATCH_OK;
}

void watch_unsubscribe(watch_sub *w)
{
    if (w == NULL)
        return;
    pthread_mutex_lock(&lock);
    for (size_t i = 0; i < WATCH_MAX; i++)
        if (subs[i] == w)
            subs[i] = NULL;
    kinds_update();
    pthread_mutex_unlock(&lock);
    evbuffer_free(w->buf);
    free(w);
}

/* Writes w's "skipped=N" line into buf (48 bytes); returns its length. */
static size_t skipped_line(const watch_sub *w, char *buf)
{
    return (size_t)snprintf(buf, 48, "skipped=%llu\n",
                            (unsigned long long)w->skipped);
}

/* Appends a pending skipped= line if it fits (lock held). */
static void put_skipped(watch_sub *w)
{
    char line[48];
    size_t n = skipped_line(w, line);
    if (evbuffer_get_length(w->buf) + n <= w->cap) {
        evbuffer_add(w->buf, line, n);
        w->skipped = 0;
    }
}

size_t watch_take(watch_sub *w, struct evbuffer *out)
{
    pthread_mutex_lock(&lock);
    if (w->skipped > 0)
        put_skipped(w);
    size_t moved = evbuffer_get_length(w->buf);
    evbuffer_add_buffer(out, w->buf);
    pthread_mutex_unlock(&lock);
    return moved;
}

/* Hands one formatted line to every subscriber of kind. */
static void emit(unsigned kind, const char *line, size_t n)
{
    pthread_mutex_lock(&lock);
    for (size_t i = 0; i < WATCH_MAX; i++) {
        watch_sub *w = subs[i];
        if (w == NULL || !(w->mask & kind))
            continue;
        size_t room = w->cap - evbuffer_get_length(w->buf);
        if (w->skipped > 0) {
            /* the skipped= line goes first, and only with this line */
            char sk[48];
            size_t m = skipped_line(w, sk);
            if (m + n > room) {
                w->skipped++;
                n_skipped++;
                continue;
            }
            evbuffer_add(w->buf, sk, m);
            w->skipped = 0;
            room -= m;
        }
        if (n <= room) {
            evbuffer_add(w->buf, line, n);
            n_sent++;
        } else {
            w->skipped++;
            n_skipped++;
        }
    }
    pthread_mutex_unlock(&lock);
}

void watch_get_stats(watch_stats *out)
{
    pthread_mutex_lock(&lock);
    out->watchers = 0;
    for (size_t i = 0; i < WATCH_MAX; i++)
        out->watchers += subs[i] != NULL;
    out->sent = n_sent;
    out->skipped = n_skipped;
    pthread_mutex_unlock(&lock);
    /* every line takes a gid */
    out->written = atomic_load_explicit(&gid, memory_order_relaxed);
}

char *watch_uriencode(char *dst, const char *src, size_t n)
{
    static const char hex[] = "0123456789ABCDEF";
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)src[i];
        if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
            (c >= '0' && c <= '9') || c == '-' || c == '.' || c == '_' ||
            c == '~') {
            *dst++ = (char)c;
        } else {
            *dst++ = '%';
            *dst++ = hex[c >> 4];
            *dst++ = hex[c & 15];
        }
    }
    *dst = '\0';
    return dst;
}

/* "ts=S.U gid=N " into line; returns its length. */
static int head(char *line, size_t cap)
{
    struct timeval tv;
    gettimeofday(&tv, NULL);
    return snprintf(line, cap, "ts=%lld.%d gid=%llu ", (long long)tv.tv_sec,
                    (int)tv.tv_usec,
                    (unsigned long long)atomic_fetch_add_explicit(
                        &gid, 1, memory_order_relaxed) +
                        1);
}

static void finish(unsigned kind, char *line, int n)
{
    if (n > 0 && (size_t)n < WATCH_LINE_MAX)
        emit(kind, line, (size_t)n);
}

void watch_item_get(const char *key, size_t nkey, const store_item *it,
                    int why, int fd)
{
    char line[WATCH_LINE_MAX], k[3 * 250 + 1];
    const char *status = why == STORE_MISS_EXPIRED   ? "expired"
                         : why == STORE_MISS_FLUSHED ? "flushed"
                                                     : "not_found";
    size_t nvalue = 0;

    if (nkey > 250)
        return;
    if (it != NULL) {
        store_item_value(it, &nvalue);
        status = "found";
    }
    watch_uriencode(k, key, nkey);
    int n = head(line, sizeof(line));
    n += snprintf(line + n, sizeof(line) - (size_t)n,
                  "type=item_get key=%s status=%s clsid=1 cfd=%d size=%zu\n",
                  k, status, fd, nvalue);
    finish(WATCH_FETCHERS, line, n);
}

void watch_item_store(const store_write *w, int rc, int64_t now, int fd)
{
    static const char *const cmds[] = {"set",    "add",     "replace",
                                       "append", "prepend", "cas"};
    char line[WATCH_LINE_MAX], k[3 * 250 + 1];
    const char *status = rc == STORE_STORED          ? "stored"
                         : rc == STORE_EXISTS        ? "exists"
                         : rc == STORE_NOT_FOUND     ? "not_found"
                         : rc == STORE_ERR_TOO_LARGE ? "too_large"
                         : rc == STORE_ERR_NOMEM     ? "no_memory"
                                                     : "not_stored";
    int64_t ttl = w->exptime == 0 ? 0 : w->exptime - now;

    if (w->nkey > 250)
        return;
    watch_uriencode(k, w->key, w->nkey);
    int n = head(line, sizeof(line));
    n += snprintf(line + n, sizeof(line) - (size_t)n,
                  "type=item_store key=%s status=%s cmd=%s ttl=%lld clsid=1 "
                  "cfd=%d size=%zu\n",
                  k, status, (unsigned)w->mode < 6 ? cmds[w->mode] : "na",
                  (long long)(ttl < 0 ? 0 : ttl), fd, w->nvalue);
    finish(WATCH_MUTATIONS, line, n);
}

void watch_eviction(void *arg, const store_item_info *ii)
{
    char line[WATCH_LINE_MAX], k[3 * 250 + 1];
    struct timeval tv;

    (void)arg;
    if (!watch_wanted(WATCH_EVICTIONS) || ii->nkey > 250)
        return;
    gettimeofday(&tv, NULL);
    watch_uriencode(k, ii->key, ii->nkey);
    int n = head(line, sizeof(line));
    n += snprintf(line + n, sizeof(line) - (size_t)n,
                  "type=eviction key=%s fetch=%s ttl=%lld la=%lld clsid=1 "
                  "size=%zu\n",
                  k, ii->fetched ? "yes" : "no",
                  (long long)(ii->exptime == 0 ? -1 : ii->exptime - tv.tv_sec),
                  (long long)(tv.tv_sec - ii->atime), ii->nvalue);
    finish(WATCH_EVICTIONS, line, n);
}

void watch_conn(bool open, const struct sockaddr *peer, socklen_t peerlen,
                const char *reason, int fd)
{
    char line[WATCH_LINE_MAX], ip[INET6_ADDRSTRLEN] = "unknown";
    unsigned port = 0;
    const char *transport = "tcp";

    if (peer != NULL && peer->sa_family == AF_INET &&
        peerlen >= (socklen_t)sizeof(struct sockaddr_in)) {
        const struct sockaddr_in *a = (const void *)peer;
        inet_ntop(AF_INET, &a->sin_addr, ip, sizeof(ip));
        port = ntohs(a->sin_port);
    } else if (peer != NULL && peer->sa_family == AF_INET6 &&
               peerlen >= (socklen_t)sizeof(struct sockaddr_in6)) {
        const struct sockaddr_in6 *a = (const void *)peer;
        inet_ntop(AF_INET6, &a->sin6_addr, ip, sizeof(ip));
        port = ntohs(a->sin6_port);
    } else if (peer != NULL && peer->sa_family == AF_UNIX) {
        transport = "local";
    }
    int n = head(line, sizeof(line));
    if (open)
        n += snprintf(line + n, sizeof(line) - (size_t)n,
                      "type=conn_new rip=%s rport=%u transport=%s cfd=%d\n",
                      ip, port, transport, fd);
    else
        n += snprintf(line + n, sizeof(line) - (size_t)n,
                      "type=conn_close rip=%s rport=%u transport=%s "
                      "reason=%s cfd=%d\n",
                      ip, port, transport, reason ? reason : "normal", fd);
    finish(WATCH_CONNEVENTS, line, n);
}
