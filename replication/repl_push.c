/*
 * repl_push.c -- eager push: the store's listener queues every write a
 * client made here, and the replication thread sends what is queued to the
 * ready peers in MUTATIONS frames, batched (to each peer, when
 * partitioned, only the writes of the partitions it owns). A full queue
 * drops the write and leaves the repair to the rounds; so does a peer
 * whose connection is too far behind.
 *
 * Threading: repl_on_change runs on client worker threads; it touches
 * only the push queue, under qlock, and changed_ns, with relaxed atomics.
 * Everything else here runs on the replication thread.
 */
#include "repl_int.h"

#include <pthread.h>
#include <unistd.h>

#include <event2/event.h>

/* ========================================================== eager push */

/* Store listener: runs on client worker threads. */
void repl_on_change(void *arg, store_item *it, bool origin_local)
{
    struct repl *r = arg;
    if (repl_partitioned(r)) {
        uint32_t p = store_item_partition(it);
        if (p <= r->P)
            ASTORE(r->changed_ns[p], repl_now_ns());
    }
    if (!origin_local) {
        store_item_release(it);
        return;
    }
    bool wake = false;
    pthread_mutex_lock(&r->qlock);
    if (r->qlen == r->qcap) {
        pthread_mutex_unlock(&r->qlock);
        store_item_release(it);
        PST_ADD(&r->st, push_queue_dropped, 1);
        return;
    }
    r->queue[(r->qhead + r->qlen) % r->qcap] = it;
    wake = r->qlen++ == 0;
    pthread_mutex_unlock(&r->qlock);
    if (wake) {
        uint64_t one = 1;
        ssize_t n = write(r->wake_fd, &one, sizeof(one));
        (void)n; /* a full counter already means "wake up" */
    }
}

/*
 * Sends one MUTATIONS frame (at repl_payload_area) to every ready peer, or
 * only to `only` when it is not NULL.
 */
static void push_frame(struct repl *r, size_t len, uint32_t count,
                       struct peer *only)
{
    for (int i = 0; i < r->npeers; i++) {
        struct peer *p = &r->peers[i];
        if (!repl_peer_ready(p) || (only && p != only))
            continue;
        if (repl_link_output_length(p->conn->link) > OUT_HIGH_WATER) {
            PST_ADD(&p->st, push_dropped, count);
            uint32_t held = 0;
            if (log_limit_pass(&p->push_log, 10000, &held))
                LOG(LOG_LEVEL_WARN, "repl",
                    "pushes to peer %s (node %u) dropped: more than %u MiB "
                    "unsent to it (rounds repair it); %u more such drops "
                    "since the last such line",
                    p->name, (unsigned)p->node_id,
                    (unsigned)(OUT_HIGH_WATER >> 20), (unsigned)held);
            continue;
        }
        uint8_t *q = repl_payload_area(r);
        repl_wire_put_mutations_head(q, REPL_MUT_PUSH, count);
        repl_conn_send(p->conn, REPL_MSG_MUTATIONS, (uint32_t)len);
        PST_ADD(&p->st, pushed, count);
    }
}

/*
 * Pushes a batch of fresh writes: to every peer (only NULL), or to one
 * peer, the items of partitions it owns (and the global one).
 */
static void push_batch(struct repl *r, store_item **batch, size_t n,
                       struct peer *only)
{
    size_t cap = RECORDS_FRAME + r->o.item_size_max + 1024;
    uint8_t *q = repl_payload_area(r);
    size_t len = REPL_WIRE_MUT_HEADER;
    uint32_t count = 0;
    for (size_t i = 0; i < n; i++) {
        if (only) {
            uint32_t p = store_item_partition(batch[i]);
            if (p < r->P && !ring_is_owner(r->ring, p, only->node_id))
                continue;
        }
        if (len + REPL_WIRE_MUT_FIXED + 250 + r->o.item_size_max > cap) {
            push_frame(r, len, count, only);
            len = REPL_WIRE_MUT_HEADER;
            count = 0;
        }
        store_mutation m;
        store_item_mutation(batch[i], &m);
        if (repl_put_mutation(q, cap, &len, &m))
            count++;
    }
    if (count)
        push_frame(r, len, count, only);
}

/* Sends everything queued, in batches of up to 512 writes. */
static void push_drain(struct repl *r)
{
    size_t cap = RECORDS_FRAME + r->o.item_size_max + 1024;
    if (!repl_scratch_fit(r, cap))
        return;
    size_t total = 0;
    for (;;) {
        store_item *batch[512];
        size_t n = 0;
        pthread_mutex_lock(&r->qlock);
        while (n < 512 && r->qlen > 0) {
            batch[n++] = r->queue[r->qhead];
            r->qhead = (r->qhead + 1) % r->qcap;
            r->qlen--;
        }
        pthread_mutex_unlock(&r->qlock);
        if (n == 0)
            break;
        total += n;
        if (!repl_partitioned(r)) {
            push_batch(r, batch, n, NULL);
        } else {
            /* Each peer gets the writes of the partitions it owns. */
            for (int i = 0; i < r->npeers; i++)
                if (repl_peer_ready(&r->peers[i]))
                    push_batch(r, batch, n, &r->peers[i]);
        }
        for (size_t i = 0; i < n; i++)
            store_item_release(batch[i]);
    }
    r->last_push_ns = repl_now_ns();
    r->last_push_n = total;
}

/*
 * The first write queued after an empty queue wakes this thread. Under a
 * steady stream of writes (the last drain was less than two windows ago
 * and carried few), the push waits one window (push_delay_us) so that the
 * frame carries the writes that arrive meanwhile: one frame, one MAC and
 * one send per peer for many writes instead of one each, and no wake-up
 * for the workers to pay while the queue is not empty. After a quiet
 * spell the first write is pushed at once, so a lone write is as fast as
 * without the window.
 */
void repl_on_wake(evutil_socket_t fd, short what, void *arg)
{
    struct repl *r = arg;
    (void)what;
    uint64_t v;
    ssize_t rn = read(fd, &v, sizeof(v));
    (void)rn;
    if (r->push_armed)
        return;
    uint64_t window = (uint64_t)r->o.push_delay_us * 1000;
    uint64_t now = repl_now_ns();
    if (window > 0 && now - r->last_push_ns < 2 * window &&
        r->last_push_n < 512) {
        struct timeval tv = {0, (suseconds_t)r->o.push_delay_us};
        if (evtimer_add(r->push_timer, &tv) == 0) {
            r->push_armed = true;
            return;
        }
    }
    push_drain(r);
}

void repl_on_push_timer(evutil_socket_t fd, short what, void *arg)
{
    struct repl *r = arg;
    (void)fd;
    (void)what;
    r->push_armed = false;
    push_drain(r);
}

/*
 * Once a tick: writes the full push queue turned away since the last
 * tick (counted by the client threads) are logged here, on the thread
 * that owns the rate limit.
 */
void repl_push_tick(struct repl *r)
{
    uint64_t dropped = PST_GET(&r->st, push_queue_dropped);
    if (dropped == r->queue_dropped_logged)
        return;
    uint32_t held = 0;
    if (log_limit_pass(&r->queue_log, 10000, &held)) {
        LOG(LOG_LEVEL_WARN, "repl",
            "%llu fresh writes not pushed: the push queue (repl_push_queue "
            "%u) was full; rounds repair them",
            (unsigned long long)(dropped - r->queue_dropped_logged),
            (unsigned)r->o.push_queue);
        r->queue_dropped_logged = dropped;
    }
}
