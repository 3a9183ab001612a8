/*
 * repl_conn.c -- peer connections: one authenticated link (repl_link.h)
 * per direction and peer, its life from accept or dial to close, the
 * dispatch of its frames (replies to the initiator, repl_round.c;
 * requests to the responder, repl_serve.c), the scratch buffer frames are
 * built in, and mutation records out of the journal and into the store.
 *
 * Threading: replication thread only. The stats reader sees a peer's
 * connection pointer, which is stored with a relaxed atomic.
 */
#include "repl_int.h"

#include <stdlib.h>
#include <string.h>

#include <event2/listener.h>

/* ======================================================== connections */

static int conn_frame(void *arg, repl_link *l, const repl_frame *f);
static void conn_ready(void *arg, repl_link *l);
static void conn_closed(void *arg, repl_link *l, int why);
static void conn_writable(void *arg, repl_link *l);

static const repl_link_ops conn_ops = {
    .frame = conn_frame,
    .ready = conn_ready,
    .closed = conn_closed,
    .writable = conn_writable,
};

/* Makes sure the scratch buffer holds at least n bytes. */
size_t repl_records_cap(const struct repl *r)
{
    return RECORDS_FRAME + r->o.item_size_max + 1024;
}

bool repl_scratch_fit(struct repl *r, size_t n)
{
    if (n <= r->scratch_cap)
        return true;
    size_t cap = r->scratch_cap ? r->scratch_cap : 65536;
    while (cap < n)
        cap *= 2;
    uint8_t *p = realloc(r->scratch, cap);
    if (!p)
        return false;
    r->scratch = p;
    r->scratch_cap = cap;
    return true;
}

/* Where payloads are written before repl_conn_send frames them. */
uint8_t *repl_payload_area(struct repl *r)
{
    return r->scratch;
}

/* Sends a frame whose payload the caller wrote at repl_payload_area(r). */
int repl_conn_send(struct conn *c, uint8_t type, uint32_t len)
{
    return repl_link_send(c->link, type, repl_payload_area(c->r), len) ==
                   REPL_LINK_OK
               ? 0
               : -1;
}

/*
 * The link settings of a connection: the peer's counters for an outgoing
 * one, the node's serving counters for an incoming one.
 */
static repl_link_options conn_options(struct conn *c)
{
    struct repl *r = c->r;
    struct peer *p = c->peer;
    repl_link_options o = {
        .secret = r->secret,
        .tls = r->o.tls,
        .node_id = r->o.node_id,
        .detect_self = true,
        .max_payload = REPL_WIRE_MAX_PAYLOAD,
        .out_high_water = OUT_HIGH_WATER,
        /* conn_writable runs whenever the output drains to 1 MiB. */
        .write_low_water = BULK_LOW_WATER,
        .bytes_sent = p ? &p->st.bytes_sent : &r->st.served_bytes_sent,
        .bytes_recv = p ? &p->st.bytes_recv : &r->st.served_bytes_recv,
        .connects = p ? &p->st.connects : NULL,
    };
    return o;
}

/* Closes a connection; conn_closed forgets it everywhere. */
void repl_conn_free(struct conn *c)
{
    repl_link_close(c->link);
}

/* Why a link closed, in words, for the log. */
static const char *close_reason(int why, const repl_link *l)
{
    switch (why) {
    case REPL_LINK_CLOSED_NET:
        if (repl_link_proof_sent(l))
            return "our handshake proof refused (wrong cluster_secret?)";
        return repl_link_ready(l) ? "connection lost" : "cannot connect";
    case REPL_LINK_CLOSED_AUTH:
        return "handshake refused (wrong cluster_secret, or not a peer "
               "port)";
    case REPL_LINK_CLOSED_BAD_FRAME:
        return "malformed frame";
    case REPL_LINK_CLOSED_SELF:
        return "our own address";
    case REPL_LINK_CLOSED_DUPLICATE:
        return "it has our node_id (two nodes with one node_id: refused)";
    default:
        return "closed here";
    }
}

static void count_auth_failure(struct conn *c)
{
    PST_ADD(&c->r->st, auth_failures, 1);
    if (c->peer)
        PST_ADD(&c->peer->st, auth_failures, 1);
}

/*
 * The link closed (repl_link_ops.closed): counts why, and forgets the
 * connection in its peer or in the incoming list. c is freed.
 */
static void conn_closed(void *arg, repl_link *l, int why)
{
    struct conn *c = arg;
    struct repl *r = c->r;
    switch (why) {
    case REPL_LINK_CLOSED_AUTH:
        count_auth_failure(c);
        break;
    case REPL_LINK_CLOSED_BAD_FRAME:
        PST_ADD(&r->st, bad_frames, 1);
        break;
    case REPL_LINK_CLOSED_NET:
        if (c->outgoing && !repl_link_ready(l))
            PST_ADD(&c->peer->st, connect_failures, 1);
        break;
    case REPL_LINK_CLOSED_SELF:
        /*
         * Our own address in the peer list: the dialling side never dials
         * that entry again; neither side counts it as a failure.
         */
        if (c->outgoing)
            __atomic_store_n(&c->peer->self, true, __ATOMIC_RELAXED);
        break;
    case REPL_LINK_CLOSED_DUPLICATE: {
        /* Two nodes with one node_id would take each other for self and
         * never reconcile: refused on both sides, loudly. */
        uint32_t held = 0;
        PST_ADD(&r->st, duplicate_node_id, 1);
        if (log_limit_pass(&r->duplicate_log, 10000, &held))
            LOG(LOG_LEVEL_ERROR, "repl",
                "%s peer connection refused: the other node has our "
                "node_id %u; give every node its own node_id (%u more "
                "since the last such line)",
                c->outgoing ? "outgoing" : "incoming", (unsigned)r->o.node_id,
                (unsigned)held);
        break;
    }
    default:
        break;
    }
    const char *refusal =
        why == REPL_LINK_CLOSED_AUTH ? repl_link_refusal(l) : NULL;
    if (refusal) {
        /* A certificate refused, by either side: the reason, once per
         * 10 s, on both nodes. */
        uint32_t held = 0;
        char addr[64];
        repl_link_peer_addr(l, addr, sizeof(addr));
        if (!c->outgoing && log_limit_pass(&r->refused_log, 10000, &held))
            LOG(LOG_LEVEL_WARN, "repl",
                "incoming peer connection from %s refused: %s; %u more "
                "since the last such line",
                addr, refusal, (unsigned)held);
    }
    /* An outgoing refusal is told by the peer's down line. */
    if (c->outgoing && c->peer)
        repl_peer_lost(c->peer, refusal ? refusal : close_reason(why, l));
    else if (why == REPL_LINK_CLOSED_AUTH && !refusal) {
        uint32_t held = 0;
        if (log_limit_pass(&r->refused_log, 10000, &held))
            LOG(LOG_LEVEL_WARN, "repl",
                "refused an incoming peer connection: handshake failed "
                "(%s); %u more since the last such line",
                repl_link_tls(l) ? "not a peer of this cluster"
                                 : "wrong cluster_secret?",
                (unsigned)held);
    }
    if (!c->outgoing) {
        for (struct conn **pp = &r->incoming; *pp; pp = &(*pp)->next) {
            if (*pp == c) {
                *pp = c->next;
                r->nincoming--;
                break;
            }
        }
    }
    free(c->snap);
    free(c->snap_ps);
    repl_encoder_put(r, c->enc);
    free(c->bulk_ids);
    free(c->parts);
    free(c);
}

/* ===================================================== mutation records */

/* Appends a mutation record at *len; false when it does not fit. */
bool repl_put_mutation(uint8_t *buf, size_t cap, size_t *len,
                       const store_mutation *m)
{
    long n = repl_wire_put_mutation(buf + *len, cap - *len, m);
    if (n < 0)
        return false;
    *len += (size_t)n;
    return true;
}

/*
 * Writes MUTATIONS frames holding the items of ids (looked up in the
 * journal; ids no longer held are skipped) to c. The last frame carries
 * final_flags. Returns the number of records sent.
 */
size_t repl_send_records(struct conn *c, const riblt_id *ids, size_t n,
                         uint8_t flags, uint8_t final_flags)
{
    struct repl *r = c->r;
    size_t cap = repl_records_cap(r);
    if (!repl_scratch_fit(r, cap))
        return 0;
    uint8_t *p = repl_payload_area(r);
    size_t len = REPL_WIRE_MUT_HEADER, count = 0, sent = 0;
    for (size_t i = 0; i <= n; i++) {
        store_mutation m;
        store_item *it = NULL;
        /* An item, or a keyless record (evicted value, drop). */
        if (i < n && !store_fetch_mutation(r->s, &ids[i], &m, &it))
            continue;
        bool last = i == n;
        if (!last &&
            len + REPL_WIRE_MUT_FIXED + 250 + r->o.item_size_max > cap) {
            /* Frame full: flush it first. */
            repl_wire_put_mutations_head(p, flags, (uint32_t)count);
            repl_conn_send(c, REPL_MSG_MUTATIONS, (uint32_t)len);
            len = REPL_WIRE_MUT_HEADER;
            count = 0;
        }
        if (!last) {
            if (repl_put_mutation(p, cap, &len, &m)) {
                count++;
                sent++;
            }
            store_item_release(it);
            continue;
        }
        repl_wire_put_mutations_head(p, (uint8_t)(flags | final_flags),
                                     (uint32_t)count);
        repl_conn_send(c, REPL_MSG_MUTATIONS, (uint32_t)len);
    }
    return sent;
}

/*
 * Applies the records of a MUTATIONS payload through store_apply. When
 * wanted is non-NULL, records whose id is not in it (sorted) are refused.
 * Returns the number of records, or -1 when the payload is malformed.
 * (old_applied, refused: see repl_int.h.)
 */
int repl_apply_records(struct repl *r, const uint8_t *p, size_t len,
                       const riblt_id *wanted, size_t nwanted,
                       uint64_t snap_ticks, uint64_t *old_applied,
                       uint32_t *refused)
{
    uint8_t flags;
    uint32_t count;
    if (repl_wire_get_mutations_head(p, len, &flags, &count) != REPL_WIRE_OK)
        return -1;
    size_t off = repl_wire_mutations_records_at(flags);
    if (refused)
        *refused = 0;
    for (uint32_t i = 0; i < count; i++) {
        store_mutation m;
        long n =
            repl_wire_get_mutation(p + off, len - off, r->o.item_size_max, &m);
        if (n < 0)
            return -1;
        off += (size_t)n;
        if (wanted) {
            size_t lo = 0, hi = nwanted;
            bool found = false;
            while (lo < hi) {
                size_t mid = lo + (hi - lo) / 2;
                int cmp = memcmp(&wanted[mid], &m.id, sizeof(m.id));
                if (cmp == 0) {
                    found = true;
                    break;
                }
                if (cmp < 0)
                    lo = mid + 1;
                else
                    hi = mid;
            }
            if (!found) {
                PST_ADD(&r->st, rejected_records, 1);
                continue;
            }
        }
        if (repl_partitioned(r)) {
            /* Records of partitions this node does not own are refused:
             * owners decide what a partition holds (invariant 1 per
             * partition), a stale ring on the sender notwithstanding. */
            uint32_t part = store_mutation_partition(r->s, &m);
            if (part > r->P || !ALOAD(r->owned[part])) {
                PST_ADD(&r->st, rejected_records, 1);
                continue;
            }
        }
        int rc = store_apply(r->s, &m);
        if (rc == STORE_OK) {
            PST_ADD(&r->st, applied, 1);
            if (old_applied && repl_round_old(snap_ticks, m.version.ticks))
                (*old_applied)++;
        } else if (rc == STORE_STALE)
            PST_ADD(&r->st, stale, 1);
        else {
            PST_ADD(&r->st, rejected_records, 1);
            if (refused)
                (*refused)++;
        }
    }
    return off == len ? (int)count : -1;
}

/* ====================================================== link callbacks */

/* An authenticated frame: a reply (outgoing) or a request (incoming). */
static int conn_frame(void *arg, repl_link *l, const repl_frame *f)
{
    struct conn *c = arg;
    (void)l;
    return c->outgoing ? repl_on_reply(c, f) : repl_serve(c, f);
}

static void conn_ready(void *arg, repl_link *l)
{
    struct conn *c = arg;
    struct repl *r = c->r;
    uint64_t now = repl_now_ns();
    repl_resume_quiet(r, now);
    if (c->peer) {
        struct peer *p = c->peer;
        bool was_down = p->down_since_ns != 0;
        /* Pushes go to it live from here; a resume covers the rest. */
        p->prev_link_seq = p->link_seq;
        p->link_seq = r->log.head;
        p->lag_from = 0;
        repl_ack_link_up(r, p);
        repl_push_peer_up(r);
        if (was_down)
            LOG(LOG_LEVEL_WARN, "repl", "peer %s (node %u) up after %.1f s",
                p->name, (unsigned)repl_link_peer_id(l),
                (double)(now - p->down_since_ns) / 1e9);
        else
            LOG(LOG_LEVEL_INFO, "repl", "peer %s (node %u) up", p->name,
                (unsigned)repl_link_peer_id(l));
        p->connecting = false;
        p->backoff_ms = 0;
        repl_rounds_wanted(r);
        p->down_since_ns = 0;
        p->down_why[0] = '\0';
        __atomic_store_n(&p->node_id, repl_link_peer_id(l), __ATOMIC_RELAXED);
        /* A link back after a loss: reconcile now, not at the next tick
         * (unless this node is in a round already, or rounds wait for
         * resumes: then the tick starts it once they are done). */
        if (was_down && !repl_in_round(r, NULL, now))
            repl_round_start(r, p);
        else if (was_down) {
            p->round_due = true;
            p->due_retries = 0;
        }
    } else {
        /* Tell it where its pushes stopped reaching us. */
        repl_resume_ask(c);
        /* A peer dialled us: if our link to it is down, it is back, so
         * dial it now instead of waiting out the backoff. */
        uint32_t id = repl_link_peer_id(l);
        for (int i = 0; i < r->npeers; i++) {
            struct peer *p = &r->peers[i];
            if (!p->self && !p->vacant && p->node_id == id && !p->conn &&
                !p->connecting) {
                p->retry_at_ns = now;
                repl_peer_connect(r, p);
            }
        }
    }
    /* Both sides say who they are for the ring (the dialler's INFO is
     * ignored: each node learns its peers by dialling them). */
    repl_wire_info info = {
        .weight = r->o.ring_weight ? r->o.ring_weight : 1,
        .partitions = r->P,
        .replicas = repl_partitioned(r) ? r->o.replicas : 0,
        .addr = r->advertise,
        .naddr = strlen(r->advertise),
    };
    size_t n = repl_wire_put_info(repl_payload_area(r), &info);
    repl_conn_send(c, REPL_MSG_INFO, (uint32_t)n);
}

/* The output drained to BULK_LOW_WATER: a bulk transfer goes on, and a
 * peer that fell behind is fed from the push log. */
static void conn_writable(void *arg, repl_link *l)
{
    struct conn *c = arg;
    (void)l;
    if (c->bulk_ids)
        repl_bulk_continue(c);
    if (c->peer != NULL && c->peer->conn == c)
        repl_push_catch_up(c->r, c->peer);
}

void repl_on_accept(struct evconnlistener *lis, evutil_socket_t fd,
                    struct sockaddr *sa, int socklen, void *arg)
{
    struct repl *r = arg;
    (void)lis;
    (void)sa;
    (void)socklen;
    if (r->nincoming >= INCOMING_MAX) {
        PST_ADD(&r->st, incoming_refused, 1);
        evutil_closesocket(fd);
        return;
    }
    struct conn *c = calloc(1, sizeof(*c));
    if (!c) {
        evutil_closesocket(fd);
        return;
    }
    c->r = r;
    repl_link_options o = conn_options(c);
    c->link = repl_link_accept(r->loop.base, fd, &o, &conn_ops, c);
    if (!c->link) {
        free(c);
        return;
    }
    c->next = r->incoming;
    r->incoming = c;
    r->nincoming++;
}

void repl_peer_connect(struct repl *r, struct peer *p)
{
    struct conn *c = calloc(1, sizeof(*c));
    if (!c)
        return;
    c->r = r;
    c->outgoing = true;
    c->peer = p;
    repl_link_options o = conn_options(c);
    int rc = repl_link_dial(r->loop.base, (struct sockaddr *)&p->addr,
                            p->addrlen, &o, &conn_ops, c, &c->link);
    if (rc != REPL_LINK_OK) {
        free(c);
        if (rc == REPL_LINK_ERR_CONNECT) {
            PST_ADD(&p->st, connect_failures, 1);
            repl_peer_lost(p, "cannot connect");
        }
        return;
    }
    __atomic_store_n(&p->conn, c, __ATOMIC_RELAXED);
    p->connecting = true;
}
