/*
 * repl_push.c -- eager push: the store's listener queues every write a
 * client made here, and the replication thread sends what is queued to the
 * ready peers in MUTATIONS frames, batched (to each peer, when
 * partitioned, only the writes of the partitions it owns). A full queue
 * drops the write and leaves the repair to the rounds; so does a peer
 * whose connection is too far behind.
 *
 * Every pushed write also enters the push log, numbered, so that a peer
 * whose link comes back is sent the writes it missed, from where it says
 * it stopped (resume, below), instead of a round looking for them.
 *
 * With acknowledgements (repl_ack_wait_ms), every queued write also gets
 * a ticket, and pushes ask their receivers to confirm them (below).
 *
 * Threading: repl_on_change runs on client worker threads; it touches
 * only the push queue and q_enq, under qlock, changed_ns, with relaxed
 * atomics, and its thread's own ticket. repl_ticket_take runs there too;
 * repl_ticket_held on any thread reads the confirmations (atomics).
 * Everything else here runs on the replication thread.
 */
#include "repl_int.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#include <event2/event.h>

/* Writes a push frame batch takes at most; a window that carried a full
 * batch is not waited for again. */
#define PUSH_BATCH 512

/* With no peer ready, a window is this many push windows (arm_window). */
#define PUSH_IDLE_WINDOWS 16

/* ========================================================== eager push */

/* The newest ticket the calling client thread's writes got since its last
 * repl_ticket_take, and whether the full queue refused one of them. */
static _Thread_local uint64_t my_ticket;
static _Thread_local bool my_dropped;

/* Store listener: runs on client worker threads. */
void repl_on_change(void *arg, store_item *it, bool origin_local)
{
    struct repl *r = arg;
    if (repl_partitioned(r)) {
        uint32_t p = store_item_partition(r->s, it);
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
        my_dropped = true;
        return;
    }
    r->queue[(r->qhead + r->qlen) % r->qcap] = it;
    wake = r->qlen++ == 0 && !r->q_timed;
    my_ticket = ++r->q_enq;
    pthread_mutex_unlock(&r->qlock);
    if (wake) {
        uint64_t one = 1;
        ssize_t n = write(r->wake_fd, &one, sizeof(one));
        (void)n; /* a full counter already means "wake up" */
    }
}

/* ==================================================== acknowledgements */

/*
 * A client write is held by a peer once that peer confirmed (PUSH_ACK) a
 * push frame at or after the write's ticket, on a link that was sent the
 * write. Frames go to a peer in ticket order and are applied in order, so
 * a confirmation covers every write before it that the link carried; the
 * writes a link did not carry (the peer was down, fed from the log, too
 * far behind, or the link is newer than the write) raise the slot's gap,
 * and a confirmation counts only for tickets above it. The gap is stored
 * before any later frame is sent, and so before the confirmation that
 * would cover the skipped ticket: a reader that sees the confirmation
 * (acquire) sees the gap too.
 */
uint64_t repl_ticket_take(bool *dropped)
{
    uint64_t t = my_ticket;
    *dropped = my_dropped;
    my_ticket = 0;
    my_dropped = false;
    return t;
}

bool repl_ticket_held(repl *r, uint64_t t)
{
    /* Every slot: one never used confirmed nothing (acked 0), and the
     * table's size is the replication thread's. */
    for (int i = 0; i < PEER_MAX; i++) {
        uint64_t acked = __atomic_load_n(&r->acks[i].acked, __ATOMIC_SEQ_CST);
        if (acked >= t &&
            __atomic_load_n(&r->acks[i].gap, __ATOMIC_ACQUIRE) < t)
            return true;
    }
    return false;
}

/* Slot i was not sent the writes up to ticket t. */
static void ack_gap(struct repl *r, int i, uint64_t t)
{
    if (t > r->acks[i].gap)
        __atomic_store_n(&r->acks[i].gap, t, __ATOMIC_RELEASE);
}

static void ack_gap_all(struct repl *r, uint64_t t)
{
    for (int i = 0; i < r->npeers; i++)
        ack_gap(r, i, t);
}

void repl_ack_link_up(struct repl *r, const struct peer *p)
{
    ack_gap(r, (int)(p - r->peers), r->q_deq);
}

/* Whether another slot than i already holds every ticket in (lo, hi]. */
static bool held_elsewhere(const struct repl *r, int i, uint64_t lo,
                           uint64_t hi)
{
    for (int j = 0; j < r->npeers; j++)
        if (j != i && r->acks[j].acked >= hi && r->acks[j].gap <= lo)
            return true;
    return false;
}

void repl_ack_note(struct repl *r, const struct peer *p, uint64_t t)
{
    int i = (int)(p - r->peers);
    struct ack_slot *a = &r->acks[i];
    if (t <= a->acked || t > r->q_deq)
        return; /* old, or not a ticket of ours */
    uint64_t lo = a->acked > a->gap ? a->acked : a->gap;
    /* Sequentially consistent, as the client thread's count of waiting
     * connections that on_acked reads next: either that thread sees this
     * confirmation when it checks again, or on_acked sees it waiting. */
    __atomic_store_n(&a->acked, t, __ATOMIC_SEQ_CST);
    PST_ADD(&r->st, push_acks, 1);
    /* The second peer's word on the same writes wakes nobody. */
    if (r->o.on_acked && t > lo && !held_elsewhere(r, i, lo, t))
        r->o.on_acked(r->o.acked_arg);
}

/* ============================================================ push log */

bool repl_pushlog_init(struct repl *r)
{
    struct pushlog *g = &r->log;
    size_t want;

    memset(g, 0, sizeof(*g));
    g->head = g->tail = 1;
    if (r->o.backlog_bytes == 0)
        return true;
    /* An entry per 64 bytes of budget, as a power of two: the log is
     * bounded by the bytes its items take before it runs out of slots,
     * unless the writes are tiny. */
    want = r->o.backlog_bytes / 64;
    g->cap = 1024;
    while (g->cap < want && g->cap < ((size_t)1 << 24))
        g->cap <<= 1;
    g->items = calloc(g->cap, sizeof(*g->items));
    if (g->items == NULL)
        return false;
    g->budget = r->o.backlog_bytes;
    if (getrandom(&g->run, sizeof(g->run), 0) != (ssize_t)sizeof(g->run))
        g->run = repl_now_ns() ^ ((uint64_t)r->o.node_id << 32);
    if (g->run == 0)
        g->run = 1; /* 0 means "none" in a RESUME */
    return true;
}

void repl_pushlog_free(struct repl *r)
{
    struct pushlog *g = &r->log;

    for (uint64_t q = g->tail; q < g->head; q++)
        store_item_release(g->items[q & (g->cap - 1)]);
    free(g->items);
    memset(g, 0, sizeof(*g));
}

/* What an entry counts for against the budget (the item's allocation,
 * roughly: its header is some 60 bytes). */
static size_t entry_bytes(const store_item *it)
{
    size_t nk, nv;

    (void)store_item_key(it, &nk);
    (void)store_item_value(it, &nv);
    return 64 + nk + nv;
}

/* Adds the caller's reference to it to the log; the oldest entries go
 * when the log is out of slots or over its budget. */
static void pushlog_add(struct pushlog *g, store_item *it)
{
    store_item_ref(it);
    g->items[g->head & (g->cap - 1)] = it;
    g->head++;
    g->bytes += entry_bytes(it);
    while (g->head - g->tail > g->cap - 1 ||
           (g->bytes > g->budget && g->tail < g->head - 1)) {
        store_item *old = g->items[g->tail & (g->cap - 1)];
        g->bytes -= entry_bytes(old);
        store_item_release(old);
        g->tail++;
    }
}

/* ============================================================ pushes */

/*
 * Sends one MUTATIONS frame (at repl_payload_area) to every ready peer, or
 * only to `only` when it is not NULL; first and seq are the push log's
 * numbers of its first and last records (0 without a log).
 *
 * A live push (from_log false) skips a peer fed from the log; a peer
 * whose link is more than OUT_HIGH_WATER behind starts being fed from the
 * log at `first` (repl_push_catch_up), or, without a log, loses the push
 * to the rounds. A frame from the log goes whatever the link holds: its
 * sender checked before the batch.
 */
static void push_frame(struct repl *r, size_t len, uint32_t count,
                       struct peer *only, uint64_t first, uint64_t seq,
                       uint64_t ticket, bool from_log)
{
    for (int i = 0; i < r->npeers; i++) {
        struct peer *p = &r->peers[i];
        if (!repl_peer_ready(p) || (only && p != only) ||
            (!from_log && p->lag_from != 0)) {
            if (ticket != 0)
                ack_gap(r, i, ticket);
            continue;
        }
        if (!from_log &&
            repl_link_output_length(p->conn->link) > OUT_HIGH_WATER) {
            if (first != 0) {
                p->lag_from = first;
                uint32_t held = 0;
                if (log_limit_pass(&p->push_log, 10000, &held))
                    LOG(LOG_LEVEL_INFO, "repl",
                        "peer %s (node %u) is more than %u MiB behind: it "
                        "is fed from the push log as it drains; %u more "
                        "such lines since the last",
                        p->name, (unsigned)p->node_id,
                        (unsigned)(OUT_HIGH_WATER >> 20), (unsigned)held);
                if (ticket != 0)
                    ack_gap(r, i, ticket);
                continue;
            }
            if (ticket != 0)
                ack_gap(r, i, ticket);
            PST_ADD(&p->st, push_dropped, count);
            repl_rounds_wanted(r);
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
        uint8_t flags = REPL_MUT_PUSH | (seq != 0 ? REPL_MUT_SEQ : 0) |
                        (ticket != 0 ? REPL_MUT_ACK : 0);
        repl_wire_put_mutations_head(q, flags, count);
        if (seq != 0)
            repl_wire_put_mutations_pos(q, r->log.run, seq);
        if (ticket != 0)
            repl_wire_put_mutations_ticket(q, ticket);
        repl_conn_send(p->conn, REPL_MSG_MUTATIONS, (uint32_t)len);
        PST_ADD(&p->st, pushed, count);
        PST_ADD(&p->st, push_frames, 1);
        if (from_log)
            PST_ADD(&p->st, push_from_log, count);
    }
}

/* Whether any peer is ready; with `live`, one that takes live pushes, so
 * that a live push frame would go to it (push_frame's test). */
static bool any_ready(const struct repl *r, bool live)
{
    for (int i = 0; i < r->npeers; i++)
        if (repl_peer_ready(&r->peers[i]) &&
            (!live || r->peers[i].lag_from == 0))
            return true;
    return false;
}

/*
 * Pushes a batch of writes: to every peer (only NULL), or to one peer, the
 * items of partitions it owns (and the global one). seq0 is the push log's
 * number of batch[0], the others following it (0: no log); ticket0 the
 * ticket of batch[0] when the receivers are to confirm the frames (0:
 * not); from_log as push_frame's.
 */
static void push_batch(struct repl *r, store_item **batch, size_t n,
                       struct peer *only, uint64_t seq0, uint64_t ticket0,
                       bool from_log)
{
    /* With every peer down or fed from the log, a live batch would be
     * encoded for nobody: the log (or the rounds) carries it. */
    if (!from_log && only == NULL && !any_ready(r, true)) {
        if (ticket0 != 0)
            ack_gap_all(r, ticket0 + n - 1);
        return;
    }
    size_t cap = repl_records_cap(r);
    uint8_t *q = repl_payload_area(r);
    size_t start = repl_wire_mutations_records_at(
        (seq0 ? REPL_MUT_SEQ : 0) | (ticket0 ? REPL_MUT_ACK : 0));
    size_t len = start;
    uint32_t count = 0;
    uint64_t first = 0, last = 0, ticket = 0;
    for (size_t i = 0; i < n; i++) {
        if (only) {
            uint32_t p = store_item_partition(r->s, batch[i]);
            if (p < r->P && !ring_is_owner(r->ring, p, only->node_id))
                continue;
        }
        if (len + REPL_WIRE_MUT_FIXED + 250 + r->o.item_size_max > cap) {
            push_frame(r, len, count, only, first, last, ticket, from_log);
            len = start;
            count = 0;
        }
        store_mutation m;
        store_item_mutation(batch[i], &m);
        if (repl_put_mutation(q, cap, &len, &m)) {
            if (count++ == 0)
                first = seq0 ? seq0 + i : 0;
            last = seq0 ? seq0 + i : 0;
            ticket = ticket0 ? ticket0 + i : 0;
        } else if (ticket0 != 0) {
            ack_gap_all(r, ticket0 + i); /* no frame carries it */
        }
    }
    if (count)
        push_frame(r, len, count, only, first, last, ticket, from_log);
}

/*
 * Sends p the log's writes from `from` up to `to`, in batches, from the
 * log (push_frame's from_log); `paced` stops between batches once p's
 * link holds more than OUT_HIGH_WATER. The caller made the scratch area
 * fit (repl_scratch_fit). Returns where it stopped.
 */
static uint64_t log_send(struct repl *r, struct peer *p, uint64_t from,
                         uint64_t to, bool paced)
{
    struct pushlog *g = &r->log;
    uint64_t q = from;

    while (q < to && (!paced || repl_link_output_length(p->conn->link) <=
                                    OUT_HIGH_WATER)) {
        store_item *batch[PUSH_BATCH];
        size_t n = 0;
        while (n < PUSH_BATCH && q + n < to)
            batch[n] = g->items[(q + n) & (g->cap - 1)], n++;
        push_batch(r, batch, n, p, q, 0, true);
        q += n;
    }
    return q;
}

/*
 * Feeds a peer that fell behind (lag_from) from the push log, in order,
 * while its link holds at most OUT_HIGH_WATER; once it has everything the
 * log holds, live pushes go to it again. What the log let go before it
 * was sent is lost to the rounds (push_dropped), as without a log. Runs
 * when the link drains (repl_conn.c), before each push and once a tick.
 */
void repl_push_catch_up(struct repl *r, struct peer *p)
{
    struct pushlog *g = &r->log;

    if (p->lag_from == 0 || !repl_peer_ready(p))
        return;
    if (p->lag_from < g->tail) {
        PST_ADD(&p->st, push_dropped, g->tail - p->lag_from);
        repl_rounds_wanted(r);
        p->lag_from = g->tail;
    }
    if (!repl_scratch_fit(r, repl_records_cap(r)))
        return;
    p->lag_from = log_send(r, p, p->lag_from, g->head, true);
    if (p->lag_from >= g->head)
        p->lag_from = 0; /* live from the next push on */
}

/*
 * Sends what is queued, in batches of up to PUSH_BATCH writes. With
 * `chase`, until the queue is empty; without, only what was queued when
 * it began: the caller has a window armed for the writes queued while it
 * sends, and chasing them would send a frame to every peer for the one or
 * two that arrive during a send.
 */
static void push_drain(struct repl *r, bool chase)
{
    size_t cap = repl_records_cap(r);
    r->last_push_n = 0;
    if (!repl_scratch_fit(r, cap))
        return;
    size_t total = 0;
    pthread_mutex_lock(&r->qlock);
    size_t todo = chase ? SIZE_MAX : r->qlen;
    pthread_mutex_unlock(&r->qlock);
    while (todo > 0) {
        store_item *batch[PUSH_BATCH];
        size_t n = 0;
        pthread_mutex_lock(&r->qlock);
        while (n < PUSH_BATCH && n < todo && r->qlen > 0) {
            batch[n++] = r->queue[r->qhead];
            r->qhead = (r->qhead + 1) % r->qcap;
            r->qlen--;
        }
        pthread_mutex_unlock(&r->qlock);
        if (n == 0)
            break;
        todo -= n;
        total += n;
        /* The queue hands writes out in the order they got tickets. */
        uint64_t ticket0 = r->o.acks ? r->q_deq + 1 : 0;
        r->q_deq += n;
        /* Peers fed from the log take what it holds first: caught up,
         * they receive this batch live, in order. */
        for (int i = 0; i < r->npeers; i++)
            repl_push_catch_up(r, &r->peers[i]);
        uint64_t seq0 = 0;
        if (r->log.cap != 0) {
            seq0 = r->log.head;
            for (size_t i = 0; i < n; i++)
                pushlog_add(&r->log, batch[i]);
        }
        if (!repl_partitioned(r)) {
            push_batch(r, batch, n, NULL, seq0, ticket0, false);
        } else {
            /* Each peer gets the writes of the partitions it owns
             * (acknowledgements need full replication: no tickets). */
            for (int i = 0; i < r->npeers; i++)
                if (repl_peer_ready(&r->peers[i]))
                    push_batch(r, batch, n, &r->peers[i], seq0, 0, false);
        }
        for (size_t i = 0; i < n; i++)
            store_item_release(batch[i]);
    }
    r->last_push_ns = repl_now_ns();
    r->last_push_n = total;
}

/*
 * With no peer ready (all down, or none yet), a drain only moves the
 * queue into the push log, for the peers' resume: the window is then
 * PUSH_IDLE_WINDOWS long, so that a node cut off from its peers does not
 * wake a thousand times a second to send nothing. The first peer whose
 * link comes up shortens it again (repl_push_peer_up).
 */
static bool add_window(struct repl *r, bool idle)
{
    uint64_t us =
        (uint64_t)r->o.push_delay_us * (idle ? PUSH_IDLE_WINDOWS : 1);
    struct timeval tv = {(time_t)(us / 1000000), (suseconds_t)(us % 1000000)};
    if (evtimer_add(r->push_timer, &tv) != 0)
        return false;
    r->push_idle = idle;
    return true;
}

/*
 * The first write queued after an empty queue wakes this thread. Under a
 * steady stream of writes (the last drain was less than two windows ago
 * and carried few), the push waits one window (push_delay_us) so that the
 * frame carries the writes that arrive meanwhile: one frame, one MAC and
 * one send per peer for many writes instead of one each. After a quiet
 * spell what is queued is pushed at once, so a lone write is as fast as
 * without the window, and a window is armed behind it (push_now).
 *
 * While writes keep coming, the window's timer re-arms itself after each
 * drain and q_timed tells the writers so: they queue without waking this
 * thread (no eventfd write, no cross-core wake-up per window), and the
 * timer drains every window until one finds the queue empty.
 */
static bool arm_window(struct repl *r)
{
    /* A client that waits for its write to be confirmed sends no other
     * meanwhile: with acknowledgements, a drain that carried one write
     * had no stream to wait for. */
    if (r->o.acks && r->last_push_n < 2)
        return false;
    if (!add_window(r, !any_ready(r, false)))
        return false;
    r->push_armed = true;
    pthread_mutex_lock(&r->qlock);
    r->q_timed = true;
    pthread_mutex_unlock(&r->qlock);
    return true;
}

void repl_push_peer_up(struct repl *r)
{
    if (r->push_armed && r->push_idle)
        (void)add_window(r, false); /* on failure the idle one stands */
}

/* After a drain that carried writes but not a full batch (a full one is
 * not waited for again), the stream is taken to go on: arms the next
 * window. */
static bool window_after_drain(struct repl *r)
{
    return r->last_push_n > 0 && r->last_push_n < PUSH_BATCH && arm_window(r);
}

/*
 * Sends what is queued at once, and arms a window behind it for the writes
 * that arrive meanwhile: a burst after a quiet spell has its first writes
 * sent at once and the rest in windows. Chasing the queue instead left
 * this thread unarmed once it caught up, so the rest of the burst woke it
 * again (an eventfd write from a client thread, a wake-up here) before a
 * window took over; and where sends are slow (a loaded machine) it sent a
 * frame to every peer for each write or two that arrived during the
 * previous send. Without a window to arm (push_delay_us 0, a drain that
 * filled a batch, or with acknowledgements after a lone write:
 * arm_window), the queue is chased until empty, as before.
 */
static void push_now(struct repl *r)
{
    if (r->o.push_delay_us == 0) {
        push_drain(r, true); /* no window: one drain, not two */
        return;
    }
    push_drain(r, false);
    if (!window_after_drain(r))
        push_drain(r, true);
}

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
        r->last_push_n < PUSH_BATCH && arm_window(r))
        return;
    push_now(r);
}

void repl_on_push_timer(evutil_socket_t fd, short what, void *arg)
{
    struct repl *r = arg;
    (void)fd;
    (void)what;
    r->push_armed = false;
    push_drain(r, false);
    if (window_after_drain(r))
        return;
    /* The stream paused (or a window filled): writers wake this thread
     * again. A write queued before the flag went down has not woken it,
     * so it is pushed now. */
    pthread_mutex_lock(&r->qlock);
    r->q_timed = false;
    bool left = r->qlen > 0;
    pthread_mutex_unlock(&r->qlock);
    if (left)
        push_now(r);
}

/*
 * Once a tick: writes the full push queue turned away since the last
 * tick (counted by the client threads) are logged here, on the thread
 * that owns the rate limit.
 */
void repl_push_tick(struct repl *r)
{
    for (int i = 0; i < r->npeers; i++)
        repl_push_catch_up(r, &r->peers[i]);
    uint64_t dropped = PST_GET(&r->st, push_queue_dropped);
    if (dropped != r->queue_dropped_seen) {
        r->queue_dropped_seen = dropped;
        repl_rounds_wanted(r); /* writes no push carried */
    }
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

/* ============================================================ resume */

/*
 * A link came back: what it missed is best sent from the push logs at
 * either end (a RESUME each way), not found by a round, which would also
 * find it on every other peer that holds it. So rounds, run and served,
 * wait RESUME_QUIET_NS after any link comes up (repl_in_round); what no
 * log covered is left to them.
 */
void repl_resume_quiet(struct repl *r, uint64_t now)
{
    if (r->log.cap == 0)
        return;
    r->quiet_until_ns = now + RESUME_QUIET_NS;
    evloop_add_ms(r->quiet_end, RESUME_QUIET_MS + 1);
}

static struct resume_point *resume_point(struct repl *r, uint32_t node,
                                         bool add)
{
    for (int i = 0; i < r->nfrom; i++)
        if (r->from[i].node == node)
            return &r->from[i];
    if (!add)
        return NULL;
    /* One per node id; a full table reuses a slot (the resume is only a
     * shortcut: what it misses, rounds find). */
    struct resume_point *rp =
        r->nfrom < PEER_MAX ? &r->from[r->nfrom++] : &r->from[node % PEER_MAX];
    rp->node = node;
    rp->run = 0;
    rp->seq = 0;
    return rp;
}

void repl_resume_note(struct repl *r, uint32_t node, uint64_t run,
                      uint64_t seq)
{
    struct resume_point *rp = resume_point(r, node, true);

    if (rp->run != run) {
        rp->run = run;
        rp->seq = seq;
    } else if (seq > rp->seq) {
        rp->seq = seq;
    }
}

void repl_resume_ask(struct conn *c)
{
    struct repl *r = c->r;
    struct resume_point *rp =
        resume_point(r, repl_link_peer_id(c->link), false);
    size_t n = repl_wire_put_resume(repl_payload_area(r), rp ? rp->run : 0,
                                    rp ? rp->seq : 0, r->log.run);

    if (repl_conn_send(c, REPL_MSG_RESUME, (uint32_t)n) == 0) {
        c->resume_pending = true;
        c->resume_asked_ns = repl_now_ns();
    }
}

int repl_resume_done(struct conn *c, const uint8_t *p, size_t len)
{
    uint64_t run, seq, own;

    if (repl_wire_get_resume(p, len, &run, &seq, &own) != REPL_WIRE_OK)
        return -1;
    c->resume_pending = false;
    /* Rounds due may go as soon as nothing else is waited for. */
    if (!repl_resume_waiting(c->r, repl_now_ns()))
        evloop_add_ms(c->r->quiet_end, 0);
    return 0;
}

bool repl_resume_waiting(struct repl *r, uint64_t now)
{
    if (now < r->quiet_until_ns)
        return true;
    for (struct conn *c = r->incoming; c; c = c->next)
        if (c->resume_pending && repl_link_ready(c->link) &&
            now - c->resume_asked_ns < RESUME_WAIT_MAX_NS)
            return true;
    return false;
}

/*
 * Where p's resume starts, 0 for nowhere. From what it says it applied
 * last, when that is of our run. When it applied no push of our run but
 * is the same process as at our previous link to it (same run of its
 * own), it received none of the pushes that went to that link live, so
 * from where that link came up; what it has from before, it has from
 * rounds. A peer we never had a link to, or that restarted since (a new
 * run), gets nothing: rounds and bulk bring it level.
 */
static uint64_t resume_from(const struct repl *r, const struct peer *p,
                            uint64_t run, uint64_t seq, uint64_t their_run)
{
    if (run == r->log.run && seq != 0)
        return seq + 1;
    if (their_run != 0 && their_run == p->peer_run && p->prev_link_seq != 0)
        return p->prev_link_seq;
    return 0;
}

/* Resends what p missed, if the log holds it; returns the seq of the last
 * write resent (0: none). */
static uint64_t resume_resend(struct repl *r, struct peer *p, uint64_t run,
                              uint64_t seq, uint64_t their_run)
{
    struct pushlog *g = &r->log;
    uint64_t from = g->cap ? resume_from(r, p, run, seq, their_run) : 0;

    p->peer_run = their_run;
    if (from == 0 || from >= p->link_seq) {
        LOG(LOG_LEVEL_DEBUG, "repl",
            "peer %s (node %u) resumes at %s seq %llu: nothing to resend "
            "(log %llu..%llu, link up at %llu)",
            p->name, (unsigned)p->node_id,
            run == g->run ? "our run" : "another run", (unsigned long long)seq,
            (unsigned long long)g->tail, (unsigned long long)g->head,
            (unsigned long long)p->link_seq);
        return 0;
    }
    PST_ADD(&p->st, resumes, 1);
    if (from < g->tail) {
        /* It missed more than the log holds. */
        PST_ADD(&p->st, resume_missed, 1);
        repl_rounds_wanted(r);
        return 0;
    }
    if (!repl_scratch_fit(r, repl_records_cap(r)))
        return 0;
    uint64_t to = p->link_seq;
    log_send(r, p, from, to, false);
    PST_ADD(&p->st, resumed, to - from);
    LOG(LOG_LEVEL_INFO, "repl",
        "peer %s (node %u): resent %llu writes it missed from the push log",
        p->name, (unsigned)p->node_id, (unsigned long long)(to - from));
    return to - 1;
}

/* The answer to a RESUME, after whatever was resent: last, the seq of the
 * last write resent (0: none). */
static void resume_answer(struct repl *r, struct peer *p, uint64_t last)
{
    size_t n = repl_wire_put_resume(repl_payload_area(r), r->log.run, last,
                                    r->log.run);
    repl_conn_send(p->conn, REPL_MSG_RESUME, (uint32_t)n);
}

void repl_resume_serve(struct repl *r, struct peer *p, uint64_t run,
                       uint64_t seq, uint64_t their_run)
{
    uint64_t last = resume_resend(r, p, run, seq, their_run);

    resume_answer(r, p, last);
}
