/*
 * repl.c -- the replication thread: peer connections (authenticated links,
 * repl_link.h), reconciliation rounds (initiator and responder), bulk
 * transfer and eager push. See repl.h for the overview and
 * replication/README.md for the protocol and the decisions behind it.
 *
 * Threading: everything here runs on the replication thread's event loop
 * except repl_on_change (called by client worker threads through the
 * store listener; it only touches the push queue under its mutex) and
 * repl_emit_stats (reads relaxed atomics and fields fixed at creation).
 */
#define _GNU_SOURCE
#include "repl.h"

#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <event2/event.h>
#include <event2/listener.h>

#include "evloop.h"
#include "repl_link.h"
#include "repl_wire.h"
#include "ring.h"

/* ============================================================= limits */

#define PEER_MAX 64
#define INCOMING_MAX 256
/*
 * A round first asks for coded symbol 0 alone: equal sets cancel there,
 * so a round between nodes that agree costs one symbol each way, and an
 * idle cluster is quiet. Then 64, doubling up to BATCH_MAX.
 */
#define BATCH_FIRST 1
#define BATCH_SECOND 64
#define BATCH_MAX 4096             /* 128 KiB of symbols per frame */
#define FETCH_IDS_MAX 16384        /* ids per FETCH frame (256 KiB) */
#define RECORDS_FRAME (1u << 20)   /* records per MUTATIONS frame, bytes */
#define OUT_HIGH_WATER (16u << 20) /* a peer this far behind gets no push */
#define BULK_LOW_WATER (1u << 20)  /* refill bulk output below this */
#define BACKOFF_MAX_MS 2000
#define DECODER_FIRST 8192
#define ENCODER_SPARES 2 /* encoders kept for the next rounds */

/* MUTATIONS frame flags. */
#define MUT_FINAL 1 /* last frame answering a FETCH or a bulk request */
#define MUT_PUSH 2  /* unsolicited: eager push or a round's local-only ids */
#define MUT_BULK 4  /* part of a bulk transfer */

/* Extra message types (not in repl_wire.h's list of round messages). */
#define REPL_MSG_BULK_REQ 16
/* Sent by both sides once a link is ready: weight u32, P u32, R u32,
 * client address (the rest, "host:port"). */
#define REPL_MSG_INFO 17

/* ERROR codes. */
#define ERR_GENERIC 1
#define ERR_RING 2 /* the ring fingerprints or partition lists disagree */

/* Mutations a tick may drop from lost partitions (a call walks about 8x as
 * many table entries; the whole drop is one pass over the table). */
#define DROP_BUDGET 4000

/* ============================================================== stats */

#define REPL_PEER_COUNTERS(X)                                                 \
    X(rounds)                                                                 \
    X(rounds_ok)                                                              \
    X(rounds_failed)                                                          \
    X(bulk_transfers)                                                         \
    X(symbols_recv)                                                           \
    X(diffs_remote)                                                           \
    X(diffs_local)                                                            \
    X(mutations_fetched)                                                      \
    X(mutations_sent)                                                         \
    X(pushed)                                                                 \
    X(push_dropped)                                                           \
    X(bytes_sent)                                                             \
    X(bytes_recv)                                                             \
    X(connects)                                                               \
    X(connect_failures)                                                       \
    X(auth_failures)                                                          \
    X(last_round_symbols)                                                     \
    X(last_round_us)                                                          \
    X(last_success)

struct pstats {
#define PSTATS_FIELD(n) uint64_t n;
    REPL_PEER_COUNTERS(PSTATS_FIELD)
#undef PSTATS_FIELD
};

#define PST_ADD(st, name, v)                                                  \
    __atomic_fetch_add(&(st)->name, (uint64_t)(v), __ATOMIC_RELAXED)
#define PST_SET(st, name, v)                                                  \
    __atomic_store_n(&(st)->name, (uint64_t)(v), __ATOMIC_RELAXED)
#define PST_GET(st, name) __atomic_load_n(&(st)->name, __ATOMIC_RELAXED)

/* Counters of the serving side and of the node as a whole. */
#define REPL_NODE_COUNTERS(X)                                                 \
    X(served_symbol_requests)                                                 \
    X(served_symbols)                                                         \
    X(served_fetches)                                                         \
    X(served_bulk)                                                            \
    X(applied)                                                                \
    X(stale)                                                                  \
    X(rejected_records)                                                       \
    X(bad_frames)                                                             \
    X(auth_failures)                                                          \
    X(incoming_refused)                                                       \
    X(push_queue_dropped)                                                     \
    X(encoder_builds)                                                         \
    X(served_bytes_sent)                                                      \
    X(served_bytes_recv)                                                      \
    X(ring_changes)                                                           \
    X(ring_mismatch)                                                          \
    X(partitions_dropped)                                                     \
    X(items_dropped)

struct nstats {
#define NSTATS_FIELD(n) uint64_t n;
    REPL_NODE_COUNTERS(NSTATS_FIELD)
#undef NSTATS_FIELD
};

/* ========================================================= structures */

struct repl;
struct peer;

/* One peer connection, either direction. */
struct conn {
    struct repl *r;
    repl_link *link; /* the connection itself: handshake, frames, flow */
    bool outgoing;
    struct peer *peer; /* outgoing: its peer; incoming: NULL */
    /* responder: the sketch snapshot of the current round */
    riblt_symbol *snap;
    int64_t snap_size;
    riblt_encoder *enc; /* the stream beyond the sketch */
    /* responder: when the peer's current round began (0 = none) */
    uint64_t serving_since_ns;
    /* responder: the partitions of the current round (ring_gen: the ring
     * they were checked against) */
    uint32_t *parts;
    size_t nparts;
    uint64_t parts_gen;
    /* responder: a bulk transfer in progress */
    riblt_id *bulk_ids;
    size_t bulk_n, bulk_pos;
    struct conn *next; /* incoming list */
};

/* Initiator state of one round with a peer. */
struct round {
    bool active;
    bool bulk;
    uint64_t started_ns;
    riblt_symbol *own; /* own sketch snapshot */
    int64_t own_size;
    riblt_encoder *own_enc; /* own stream beyond the sketch */
    riblt_decoder *dec;
    size_t dec_cap;
    riblt_symbol *diffs; /* every difference symbol, to refeed a bigger
                            decoder */
    size_t ndiffs, diffs_cap;
    uint64_t requested; /* offset of the outstanding SYMBOLS_REQ */
    uint32_t batch;
    riblt_id *wanted; /* sorted remote-only ids being fetched */
    size_t nwanted;
    size_t fetch_frames; /* FETCH frames not yet answered in full */
    uint32_t *parts;     /* the partitions reconciled (ascending) */
    size_t nparts;
    uint64_t gen; /* the ring generation the round started under */
};

struct peer {
    struct repl *r;
    char name[128]; /* host:port as configured or as registered */
    struct sockaddr_storage addr;
    socklen_t addrlen;
    bool self;
    bool vacant;        /* a free slot (a member that left the view) */
    bool from_registry; /* from a registry's view, not the peers list */
    uint8_t member;     /* registry_state; static peers stay alive */
    uint64_t incarnation;
    uint32_t view_node; /* the member's id in the registry's view */
    struct conn *conn;
    bool connecting;
    uint64_t retry_at_ns;
    uint32_t backoff_ms;
    uint32_t node_id; /* learned in the handshake */
    /* What its INFO frame said (info: one arrived on this connection). */
    bool info;
    uint32_t weight, info_partitions, info_replicas;
    char client[REPL_LINK_ADDR_MAX + 1];
    struct sockaddr_storage client_addr;
    socklen_t client_addrlen;
    uint64_t down_since_ns; /* its connection went down (0 = up / never) */
    /* The last round with it that succeeded: when it started, under
     * which ring generation (hand-off of lost partitions waits on it). */
    uint64_t ok_started_ns, ok_gen;
    struct round round;
    struct pstats st;
};

struct repl {
    repl_options o;
    char *secret;
    char *listen;
    store *s;
    size_t S;    /* sketch symbols */
    evloop loop; /* the replication thread and its event base */
    struct evconnlistener *lis;
    struct event *tick, *wake;
    int wake_fd;
    /*
     * Slots [0, npeers); registry members come and go, a removed one
     * leaves a vacant slot for the next. The table changes only on this
     * thread, under plock, which repl_emit_stats takes to read it.
     */
    struct peer peers[PEER_MAX];
    int npeers;
    pthread_mutex_t plock;
    registry_client *reg; /* NULL without registries */
    struct conn *incoming;
    int nincoming;
    /* push queue: filled by worker threads, drained by this thread */
    pthread_mutex_t qlock;
    store_item **queue;
    size_t qhead, qlen, qcap;
    /* encoders kept between rounds: their memory is already mapped */
    riblt_encoder *spare[ENCODER_SPARES];
    int nspare;
    /* one batch of symbols, remote and own (BATCH_MAX each) */
    riblt_symbol *syms, *own_syms;
    /* scratch for building one frame */
    uint8_t *scratch;
    size_t scratch_cap;
    struct nstats st;
    uint64_t rng;
    /*
     * Placement (replicas > 0; P == 0 means full replication and none of
     * this is used). Partition P is the global one (flush mutations):
     * every node owns it. owned/lost_ns/ring belong to this thread;
     * ready and changed_ns are read and written with atomics from any
     * thread; the published route is swapped under rlock.
     */
    uint32_t P;
    ring *ring;
    ring *prev_ring; /* the ring before the last change (NULL: none) */
    uint64_t ring_changed_ns;
    uint64_t ring_gen;
    uint8_t *owned;       /* [P+1] */
    uint8_t *ready;       /* [P+1] owned and caught up */
    uint64_t *changed_ns; /* [P+1] last change applied here */
    uint64_t *lost_ns;    /* [P+1] since when held but no longer owned */
    uint64_t *gained_ns;  /* [P+1] since when owned (start-up included) */
    uint64_t started_ns;
    uint32_t *parts_buf; /* [P+1] scratch list */
    bool republish;      /* a member's client address changed */
    uint64_t last_tick_ns;
    char advertise[REPL_LINK_ADDR_MAX + 1];
    struct sockaddr_storage adv_addr; /* our client port, for the route */
    socklen_t adv_len;
    pthread_rwlock_t rlock;
    struct route *route;
};

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static uint64_t wall_s(void)
{
    return (uint64_t)time(NULL);
}

static uint64_t rng_next(struct repl *r)
{
    uint64_t z = (r->rng += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

/* ============================================================ options */

void repl_options_default(repl_options *o)
{
    memset(o, 0, sizeof(*o));
    o->node_id = 1;
    o->listen = "127.0.0.1";
    o->port = 0;
    o->peers = "";
    o->secret = "";
    o->period_ms = 100;
    o->max_symbols = 262144;
    o->round_timeout_ms = 10000;
    o->push_queue = 65536;
    o->item_size_max = 1024 * 1024;
    o->registries = "";
    registry_timing_default(&o->timing);
    o->replicas = 0;
    o->ring_partitions = RING_DEFAULT_PARTITIONS;
    o->ring_weight = 1;
    o->handoff_ms = 10000;
    o->down_ms = 3000;
    o->advertise = "";
}

/* Resolves "host:port" (or "[v6]:port") into p->addr; p->name keeps it. */
static int peer_parse(struct peer *p, const char *spec, size_t n, char *err,
                      size_t nerr)
{
    if (repl_link_resolve("peer", spec, n, &p->addr, &p->addrlen, err, nerr) !=
        0)
        return REPL_ERR_CONFIG;
    memcpy(p->name, spec, n);
    p->name[n] = '\0';
    return REPL_OK;
}

/* Splits the comma-separated list into r->peers. */
static int peers_parse(struct repl *r, const char *list, char *err,
                       size_t nerr)
{
    const char *p = list ? list : "";
    while (*p) {
        while (*p == ' ' || *p == ',')
            p++;
        if (!*p)
            break;
        const char *e = p;
        while (*e && *e != ',' && *e != ' ')
            e++;
        if (r->npeers == PEER_MAX) {
            snprintf(err, nerr, "more than %d peers", PEER_MAX);
            return REPL_ERR_CONFIG;
        }
        struct peer *peer = &r->peers[r->npeers];
        peer->r = r;
        int rc = peer_parse(peer, p, (size_t)(e - p), err, nerr);
        if (rc != REPL_OK)
            return rc;
        r->npeers++;
        p = e;
    }
    return REPL_OK;
}

/* Placement arrays are written by the replication thread and read by
 * the client threads and stats: relaxed atomics. */
#define ALOAD(x) __atomic_load_n(&(x), __ATOMIC_RELAXED)
#define ASTORE(x, v) __atomic_store_n(&(x), (v), __ATOMIC_RELAXED)

static bool partitioned(const struct repl *r)
{
    return r->P != 0;
}

/* A round covering these partitions completed: the owned ones caught up. */
static void parts_mark_ready(struct repl *r, const uint32_t *parts, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (parts[i] < r->P && r->owned[parts[i]])
            ASTORE(r->ready[parts[i]], 1);
}

/* ======================================================== connections */

static void encoder_put(struct repl *r, riblt_encoder *enc);
static void round_fail(struct peer *p, const char *why);
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
static bool scratch_fit(struct repl *r, size_t n)
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

/* Where payloads are written before conn_send frames them. */
static uint8_t *payload_area(struct repl *r)
{
    return r->scratch;
}

/* Sends a frame whose payload the caller wrote at payload_area(r). */
static int conn_send(struct conn *c, uint8_t type, uint32_t len)
{
    return repl_link_send(c->link, type, payload_area(c->r), len) ==
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
static void conn_free(struct conn *c)
{
    repl_link_close(c->link);
}

/* An outgoing connection is gone: fail its round, retry after a backoff. */
static void peer_lost(struct peer *p)
{
    if (p->round.active)
        round_fail(p, "connection closed");
    /* Stores the stats reader may see: atomic (it only tests them). */
    __atomic_store_n(&p->conn, NULL, __ATOMIC_RELAXED);
    p->connecting = false;
    if (p->down_since_ns == 0)
        p->down_since_ns = now_ns();
    p->backoff_ms = p->backoff_ms ? p->backoff_ms * 2 : 50;
    if (p->backoff_ms > BACKOFF_MAX_MS)
        p->backoff_ms = BACKOFF_MAX_MS;
    p->retry_at_ns = now_ns() + (uint64_t)p->backoff_ms * 1000000ull;
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
    default:
        break;
    }
    if (c->outgoing && c->peer)
        peer_lost(c->peer);
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
    encoder_put(r, c->enc);
    free(c->bulk_ids);
    free(c->parts);
    free(c);
}

static void send_error(struct conn *c, uint32_t code, const char *text)
{
    size_t n = strlen(text);
    if (!repl_link_ready(c->link) || !scratch_fit(c->r, n + 4))
        return;
    uint8_t *p = payload_area(c->r);
    repl_wire_put_u32(p, code);
    memcpy(p + 4, text, n);
    conn_send(c, REPL_MSG_ERROR, (uint32_t)(n + 4));
}

/* ===================================================== mutation records */

/* Appends a mutation record at *len; false when it does not fit. */
static bool put_mutation(uint8_t *buf, size_t cap, size_t *len,
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
static size_t send_records(struct conn *c, const riblt_id *ids, size_t n,
                           uint8_t flags, uint8_t final_flags)
{
    struct repl *r = c->r;
    size_t cap = RECORDS_FRAME + r->o.item_size_max + 1024;
    if (!scratch_fit(r, cap))
        return 0;
    uint8_t *p = payload_area(r);
    size_t len = 5, count = 0, sent = 0;
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
            p[0] = flags;
            repl_wire_put_u32(p + 1, (uint32_t)count);
            conn_send(c, REPL_MSG_MUTATIONS, (uint32_t)len);
            len = 5;
            count = 0;
        }
        if (!last) {
            if (put_mutation(p, cap, &len, &m)) {
                count++;
                sent++;
            }
            store_item_release(it);
            continue;
        }
        p[0] = (uint8_t)(flags | final_flags);
        repl_wire_put_u32(p + 1, (uint32_t)count);
        conn_send(c, REPL_MSG_MUTATIONS, (uint32_t)len);
    }
    return sent;
}

/*
 * Applies the records of a MUTATIONS payload through store_apply. When
 * wanted is non-NULL, records whose id is not in it (sorted) are refused.
 * Returns the number of records, or -1 when the payload is malformed.
 */
static int apply_records(struct repl *r, const uint8_t *p, size_t len,
                         const riblt_id *wanted, size_t nwanted)
{
    if (len < 5)
        return -1;
    uint32_t count = repl_wire_get_u32(p + 1);
    size_t off = 5;
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
        if (partitioned(r)) {
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
        if (rc == STORE_OK)
            PST_ADD(&r->st, applied, 1);
        else if (rc == STORE_STALE)
            PST_ADD(&r->st, stale, 1);
        else
            PST_ADD(&r->st, rejected_records, 1);
    }
    return off == len ? (int)count : -1;
}

/* ========================================================== responder */

/* Collects journal ids into a growing array (store_journal_ids callback). */
struct idvec {
    riblt_id *v;
    size_t n, cap;
    bool failed;
};

static void idvec_push(void *arg, const riblt_id *id)
{
    struct idvec *iv = arg;
    if (iv->failed)
        return;
    if (iv->n == iv->cap) {
        size_t cap = iv->cap ? iv->cap * 2 : 1024;
        riblt_id *v = realloc(iv->v, cap * sizeof(*v));
        if (!v) {
            iv->failed = true;
            return;
        }
        iv->v = v;
        iv->cap = cap;
    }
    iv->v[iv->n++] = *id;
}

struct tailvec {
    riblt_encoder *enc;
    uint64_t base;
    bool failed;
};

static void add_tail(void *arg, const riblt_id *id, const riblt_tail *tail)
{
    struct tailvec *tv = arg;
    uint64_t h = riblt_hash(id);
    int rc = tail->steps && tail->index >= tv->base
                 ? riblt_encoder_add_tail(tv->enc, id, h, tail, tv->base)
                 : riblt_encoder_add(tv->enc, id);
    if (rc != RIBLT_OK)
        tv->failed = true;
}

/*
 * Builds an encoder over the current journal, positioned at offset. Each
 * id starts where the store's sketch walk left its mapping, so nothing
 * below the sketch is walked again. The journal may have moved since the
 * sketch snapshot; a round that mixes the two fails to decode and the next
 * round retries.
 */
/*
 * Returns an encoder to the spares (emptied) or frees it. Fresh memory is
 * expensive to fault in at a million ids, so a couple of encoders are kept
 * for the next rounds.
 */
static void encoder_put(struct repl *r, riblt_encoder *enc)
{
    if (!enc)
        return;
    if (r->nspare < ENCODER_SPARES) {
        riblt_encoder_reset(enc);
        r->spare[r->nspare++] = enc;
        return;
    }
    riblt_encoder_destroy(enc);
}

static riblt_encoder *encoder_get(struct repl *r, size_t cap)
{
    if (r->nspare > 0)
        return r->spare[--r->nspare];
    return riblt_encoder_create(cap);
}

static riblt_encoder *encoder_from_journal(struct repl *r,
                                           const uint32_t *parts,
                                           size_t nparts, int64_t size,
                                           uint64_t offset)
{
    struct tailvec tv = {encoder_get(r, size > 0 ? (size_t)size : 0), r->S,
                         false};
    if (!tv.enc)
        return NULL;
    store_journal_tails_parts(r->s, parts, nparts, add_tail, &tv);
    if (tv.failed || riblt_encoder_seek(tv.enc, offset) != RIBLT_OK) {
        encoder_put(r, tv.enc);
        return NULL;
    }
    PST_ADD(&r->st, encoder_builds, 1);
    return tv.enc;
}

/*
 * Fills out[0..n) with symbols [offset, offset+n) of a stream whose first
 * S symbols are snap and whose rest comes from *enc (built on demand over
 * the journal of the listed partitions; size: their set size, a hint).
 */
static int stream_symbols(struct repl *r, const riblt_symbol *snap,
                          riblt_encoder **enc, const uint32_t *parts,
                          size_t nparts, int64_t size, uint64_t offset,
                          riblt_symbol *out, size_t n)
{
    size_t i = 0;
    for (; i < n && offset + i < r->S; i++)
        out[i] = snap[offset + i];
    if (i == n)
        return 0;
    uint64_t at = offset + i;
    if (!*enc) {
        *enc = encoder_from_journal(r, parts, nparts, size, at);
        if (!*enc)
            return -1;
    } else if (riblt_encoder_position(*enc) != at) {
        riblt_encoder_seek(*enc, at);
    }
    return riblt_encoder_produce(*enc, out + i, n - i) == RIBLT_OK ? 0 : -1;
}

/*
 * The partitions a round with peer reconciles, ascending into out (room
 * for P + 1): those both own, and those this node lost but still holds
 * that the peer owns (the hand-off), and the global partition last. Full
 * replication: the one partition, 0.
 */
static size_t round_parts(struct repl *r, uint32_t peer, uint32_t *out)
{
    if (!partitioned(r)) {
        out[0] = 0;
        return 1;
    }
    size_t n = 0;
    for (uint32_t p = 0; p < r->P; p++)
        if ((r->owned[p] || r->lost_ns[p]) && ring_is_owner(r->ring, p, peer))
            out[n++] = p;
    out[n++] = r->P;
    return n;
}

/* Bytes of the partition bitmap a round request carries (P + 1 bits). */
static size_t parts_bitmap_size(const struct repl *r)
{
    return ((size_t)r->P + 1 + 7) / 8;
}

/*
 * The responder's side of a new round's partition list: the initiator's
 * ring fingerprint must equal ours and every partition listed must be one
 * we own (or the global one). Fills c->parts. Returns 0, or -1 (then an
 * ERR_RING error is due).
 */
static int parts_accept(struct conn *c, const uint8_t *q, size_t len)
{
    struct repl *r = c->r;
    if (!c->parts &&
        !(c->parts = malloc(((size_t)r->P + 1) * sizeof(*c->parts))))
        return -1;
    c->nparts = 0;
    c->parts_gen = r->ring_gen;
    if (!partitioned(r)) {
        if (len != 0)
            return -1;
        c->parts[c->nparts++] = 0;
        return 0;
    }
    size_t nbm = parts_bitmap_size(r);
    if (len != 8 + nbm || repl_wire_get_u64(q) != ring_fingerprint(r->ring))
        return -1;
    const uint8_t *bm = q + 8;
    for (uint32_t p = 0; p < (uint32_t)nbm * 8; p++) {
        if (!(bm[p / 8] & (1u << (p % 8))))
            continue;
        if (p > r->P || (p < r->P && !r->owned[p]))
            return -1;
        c->parts[c->nparts++] = p;
    }
    return c->nparts > 0 ? 0 : -1;
}

static int serve_symbols(struct conn *c, const uint8_t *p, size_t len)
{
    struct repl *r = c->r;
    if (len < 12)
        return -1;
    uint64_t offset = repl_wire_get_u64(p);
    uint32_t count = repl_wire_get_u32(p + 8);
    if (count == 0 || count > BATCH_MAX || offset > r->o.max_symbols ||
        count > r->o.max_symbols - offset || (offset != 0 && len != 12)) {
        send_error(c, ERR_GENERIC, "symbol request out of bounds");
        return -1;
    }
    if (offset != 0 && !c->snap)
        return -1; /* a round begins at offset 0 */
    if (offset == 0) {
        /* A new round: one consistent copy of the sketch serves it all. */
        if (parts_accept(c, p + 12, len - 12) != 0) {
            PST_ADD(&r->st, ring_mismatch, 1);
            send_error(c, ERR_RING, "ring mismatch");
            return 0;
        }
        if (!c->snap && !(c->snap = malloc(r->S * sizeof(riblt_symbol))))
            return -1;
        if (store_sketch_read_parts(r->s, c->parts, c->nparts, 0, c->snap,
                                    r->S, &c->snap_size) != STORE_OK)
            return -1;
        encoder_put(r, c->enc);
        c->enc = NULL;
        c->serving_since_ns = now_ns();
    }
    size_t body = 16 + (size_t)count * RIBLT_SYMBOL_WIRE_SIZE;
    if (!scratch_fit(r, body))
        return -1;
    uint8_t *out = payload_area(r);
    repl_wire_put_u64(out, offset);
    repl_wire_put_u64(out + 8, (uint64_t)c->snap_size);
    /* One call for the whole batch: the encoder walks it in one pass. */
    if (stream_symbols(r, c->snap, &c->enc, c->parts, c->nparts, c->snap_size,
                       offset, r->syms, count) != 0)
        return -1;
    riblt_symbols_encode(r->syms, count, out + 16,
                         (size_t)count * RIBLT_SYMBOL_WIRE_SIZE);
    PST_ADD(&r->st, served_symbol_requests, 1);
    PST_ADD(&r->st, served_symbols, count);
    return conn_send(c, REPL_MSG_SYMBOLS, (uint32_t)body);
}

static int serve_fetch(struct conn *c, const uint8_t *p, size_t len)
{
    if (len % 16 != 0 || len / 16 > FETCH_IDS_MAX)
        return -1;
    size_t n = len / 16;
    riblt_id *ids = malloc((n ? n : 1) * sizeof(*ids));
    if (!ids)
        return -1;
    for (size_t i = 0; i < n; i++)
        riblt_id_from_bytes(&ids[i], p + 16 * i);
    send_records(c, ids, n, 0, MUT_FINAL);
    free(ids);
    PST_ADD(&c->r->st, served_fetches, 1);
    return 0;
}

/* Sends the next slice of a bulk transfer; called as the output drains. */
static void bulk_continue(struct conn *c)
{
    while (c->bulk_ids && repl_link_output_length(c->link) < BULK_LOW_WATER) {
        size_t k = c->bulk_n - c->bulk_pos;
        if (k > 4096)
            k = 4096;
        bool last = c->bulk_pos + k == c->bulk_n;
        send_records(c, c->bulk_ids + c->bulk_pos, k, MUT_BULK,
                     last ? MUT_FINAL : 0);
        c->bulk_pos += k;
        if (last) {
            free(c->bulk_ids);
            c->bulk_ids = NULL;
        }
    }
}

/* A bulk request: every id of the partitions of the round just begun. */
static int serve_bulk(struct conn *c)
{
    struct idvec iv = {0};
    if (!c->parts)
        return -1;
    store_journal_ids_parts(c->r->s, c->parts, c->nparts, idvec_push, &iv);
    if (iv.failed) {
        free(iv.v);
        return -1;
    }
    free(c->bulk_ids);
    c->bulk_ids = iv.v ? iv.v : malloc(sizeof(riblt_id));
    c->bulk_n = iv.n;
    c->bulk_pos = 0;
    PST_ADD(&c->r->st, served_bulk, 1);
    bulk_continue(c);
    return 0;
}

/* A request (or push) on an incoming, authenticated connection. */
static int serve(struct conn *c, const repl_frame *f)
{
    switch (f->type) {
    case REPL_MSG_SYMBOLS_REQ:
        return serve_symbols(c, f->payload, f->length);
    case REPL_MSG_FETCH:
        return serve_fetch(c, f->payload, f->length);
    case REPL_MSG_BULK_REQ:
        return f->length == 0 ? serve_bulk(c) : -1;
    case REPL_MSG_MUTATIONS:
        return apply_records(c->r, f->payload, f->length, NULL, 0) < 0 ? -1
                                                                       : 0;
    case REPL_MSG_DONE:
        c->serving_since_ns = 0;
        /* A streamed round ends with everything the initiator held in
         * these partitions pushed here: ours are caught up. Not so after
         * a bulk pull (payload 1), which only moved data the other way. */
        if (partitioned(c->r) && c->parts && c->parts_gen == c->r->ring_gen &&
            !(f->length >= 1 && f->payload[0] == 1))
            parts_mark_ready(c->r, c->parts, c->nparts);
        return 0;
    case REPL_MSG_INFO:
        return 0; /* the dialling side's: peers are learnt by dialling */
    case REPL_MSG_PING:
        /* An indirect probe of the registry, relayed by another member. */
        if (f->length != 8)
            return -1;
        memcpy(payload_area(c->r), f->payload, 8);
        return conn_send(c, REPL_MSG_PONG, 8);
    default:
        return -1;
    }
}

/*
 * True while peer p runs a round against us. Two nodes reconciling with
 * each other at the same time would each stream the whole difference; one
 * round already moves it both ways, so the other side skips its turn.
 */
static bool peer_serving(struct repl *r, const struct peer *p, uint64_t now)
{
    for (struct conn *c = r->incoming; c; c = c->next)
        if (repl_link_ready(c->link) &&
            repl_link_peer_id(c->link) == p->node_id &&
            c->serving_since_ns != 0 &&
            now - c->serving_since_ns <
                (uint64_t)r->o.round_timeout_ms * 1000000ull)
            return true;
    return false;
}

/* ========================================================== initiator */

static void round_reset(struct peer *p)
{
    struct round *rd = &p->round;
    rd->active = false;
    rd->bulk = false;
    rd->ndiffs = 0;
    rd->nwanted = 0;
    rd->fetch_frames = 0;
    encoder_put(p->r, rd->own_enc);
    rd->own_enc = NULL;
    if (rd->dec)
        riblt_decoder_reset(rd->dec);
}

static void round_fail(struct peer *p, const char *why)
{
    (void)why;
    PST_ADD(&p->st, rounds_failed, 1);
    round_reset(p);
}

static void round_done(struct peer *p)
{
    struct round *rd = &p->round;
    struct repl *r = p->r;
    PST_ADD(&p->st, rounds_ok, 1);
    PST_SET(&p->st, last_success, wall_s());
    PST_SET(&p->st, last_round_symbols, rd->ndiffs);
    PST_SET(&p->st, last_round_us, (now_ns() - rd->started_ns) / 1000);
    /* Under an unchanged ring, the peer now holds everything we held in
     * these partitions when the round began (unless it was a bulk pull),
     * and we hold everything it held. */
    uint8_t bulk = rd->bulk ? 1 : 0;
    if (partitioned(r) && rd->gen == r->ring_gen) {
        parts_mark_ready(r, rd->parts, rd->nparts);
        if (!bulk) {
            p->ok_started_ns = rd->started_ns;
            p->ok_gen = rd->gen;
        }
    }
    round_reset(p);
    if (p->conn) {
        *payload_area(r) = bulk;
        conn_send(p->conn, REPL_MSG_DONE, 1);
    }
}

/*
 * Asks for symbols [offset, offset + count). The request that opens a
 * round (offset 0) also carries, when partitioned, our ring fingerprint
 * and the bitmap of the round's partitions.
 */
static int request_symbols(struct peer *p, uint64_t offset, uint32_t count)
{
    struct conn *c = p->conn;
    struct repl *r = c->r;
    uint8_t *q = payload_area(r);
    size_t len = 12;
    repl_wire_put_u64(q, offset);
    repl_wire_put_u32(q + 8, count);
    if (offset == 0 && partitioned(r)) {
        size_t nbm = parts_bitmap_size(r);
        if (!scratch_fit(r, 20 + nbm))
            return -1;
        q = payload_area(r);
        repl_wire_put_u64(q + 12, ring_fingerprint(r->ring));
        memset(q + 20, 0, nbm);
        for (size_t i = 0; i < p->round.nparts; i++) {
            uint32_t part = p->round.parts[i];
            q[20 + part / 8] |= (uint8_t)(1u << (part % 8));
        }
        len = 20 + nbm;
    }
    p->round.requested = offset;
    return conn_send(c, REPL_MSG_SYMBOLS_REQ, (uint32_t)len);
}

static void round_start(struct repl *r, struct peer *p)
{
    struct round *rd = &p->round;
    if (!rd->own && !(rd->own = malloc(r->S * sizeof(riblt_symbol))))
        return;
    if (!rd->parts &&
        !(rd->parts = malloc(((size_t)r->P + 1) * sizeof(*rd->parts))))
        return;
    round_reset(p);
    /* The start time is taken before the snapshot: a change to a
     * partition later than it may be missing from this round. */
    rd->started_ns = now_ns();
    rd->gen = r->ring_gen;
    rd->nparts = round_parts(r, p->node_id, rd->parts);
    if (store_sketch_read_parts(r->s, rd->parts, rd->nparts, 0, rd->own, r->S,
                                &rd->own_size) != STORE_OK)
        return;
    rd->active = true;
    rd->batch = BATCH_FIRST;
    PST_ADD(&p->st, rounds, 1);
    if (request_symbols(p, 0, rd->batch) != 0)
        round_fail(p, "send failed");
}

/* Grows the decoder, refeeding every difference symbol received so far. */
static int decoder_grow(struct repl *r, struct round *rd)
{
    size_t cap = rd->dec_cap ? rd->dec_cap * 4 : DECODER_FIRST;
    if (cap > r->o.max_symbols)
        cap = r->o.max_symbols;
    if (cap <= rd->dec_cap)
        return -1;
    riblt_decoder *d = riblt_decoder_create(cap);
    if (!d)
        return -1;
    for (size_t i = 0; i < rd->ndiffs; i++)
        riblt_decoder_add_diff(d, &rd->diffs[i]);
    riblt_decoder_destroy(rd->dec);
    rd->dec = d;
    rd->dec_cap = cap;
    return 0;
}

static int cmp_id(const void *a, const void *b)
{
    return memcmp(a, b, sizeof(riblt_id));
}

/*
 * The decoder finished: push what only we hold, fetch what only the peer
 * holds. Ids are checked against our journal first (invariant 7).
 */
static int round_exchange(struct repl *r, struct peer *p)
{
    struct round *rd = &p->round;
    size_t nr, nl;
    const riblt_id *remote = riblt_decoder_remote(rd->dec, &nr);
    const riblt_id *local = riblt_decoder_local(rd->dec, &nl);
    PST_ADD(&p->st, diffs_remote, nr);
    PST_ADD(&p->st, diffs_local, nl);
    if (nl > 0) {
        size_t sent = send_records(p->conn, local, nl, MUT_PUSH, 0);
        PST_ADD(&p->st, mutations_sent, sent);
    }
    free(rd->wanted);
    rd->wanted = malloc((nr ? nr : 1) * sizeof(riblt_id));
    if (!rd->wanted)
        return -1;
    rd->nwanted = 0;
    for (size_t i = 0; i < nr; i++)
        if (!store_has(r->s, &remote[i]))
            rd->wanted[rd->nwanted++] = remote[i];
    if (rd->nwanted == 0) {
        round_done(p);
        return 0;
    }
    qsort(rd->wanted, rd->nwanted, sizeof(riblt_id), cmp_id);
    for (size_t at = 0; at < rd->nwanted; at += FETCH_IDS_MAX) {
        size_t k = rd->nwanted - at;
        if (k > FETCH_IDS_MAX)
            k = FETCH_IDS_MAX;
        if (!scratch_fit(r, k * 16))
            return -1;
        uint8_t *q = payload_area(r);
        for (size_t i = 0; i < k; i++)
            riblt_id_to_bytes(&rd->wanted[at + i], q + 16 * i);
        conn_send(p->conn, REPL_MSG_FETCH, (uint32_t)(k * 16));
        rd->fetch_frames++;
    }
    return 0;
}

/*
 * A node this far behind the peer (by coded symbol 0's counts, a lower
 * bound on the difference) pulls everything instead of streaming: an
 * empty node, or one whose difference could not decode within the cap.
 */
static bool want_bulk(struct repl *r, int64_t own, int64_t remote)
{
    if (remote <= own)
        return false;
    if (own == 0)
        return true;
    return (uint64_t)(remote - own) * 3 / 2 > r->o.max_symbols;
}

static int on_symbols(struct repl *r, struct peer *p, const uint8_t *q,
                      size_t len)
{
    struct round *rd = &p->round;
    if (!rd->active || rd->bulk || len < 16 ||
        (len - 16) % RIBLT_SYMBOL_WIRE_SIZE != 0)
        return -1;
    uint64_t offset = repl_wire_get_u64(q);
    int64_t rsize = (int64_t)repl_wire_get_u64(q + 8);
    size_t n = (len - 16) / RIBLT_SYMBOL_WIRE_SIZE;
    if (offset != rd->requested || n == 0 || n > BATCH_MAX)
        return -1;
    PST_ADD(&p->st, symbols_recv, n);
    if (offset == 0 && want_bulk(r, rd->own_size, rsize)) {
        rd->bulk = true;
        PST_ADD(&p->st, bulk_transfers, 1);
        return conn_send(p->conn, REPL_MSG_BULK_REQ, 0);
    }
    if (rd->ndiffs + n > rd->diffs_cap) {
        size_t cap = rd->diffs_cap ? rd->diffs_cap : 1024;
        while (cap < rd->ndiffs + n)
            cap *= 2;
        riblt_symbol *d = realloc(rd->diffs, cap * sizeof(*d));
        if (!d)
            return -1;
        rd->diffs = d;
        rd->diffs_cap = cap;
    }
    riblt_symbol *remote = r->syms, *own = r->own_syms;
    if (riblt_symbols_decode(q + 16, n * RIBLT_SYMBOL_WIRE_SIZE, remote, n) !=
            (long)n ||
        stream_symbols(r, rd->own, &rd->own_enc, rd->parts, rd->nparts,
                       rd->own_size, offset, own, n) != 0)
        return -1;
    for (size_t i = 0; i < n; i++) {
        riblt_symbol *d = &rd->diffs[rd->ndiffs++];
        riblt_symbol_subtract(d, &remote[i], &own[i]);
        int rc = rd->dec ? riblt_decoder_add_diff(rd->dec, d) : RIBLT_ERR_FULL;
        if (rc == RIBLT_ERR_FULL) {
            rd->ndiffs--; /* refed below with the others */
            if (decoder_grow(r, rd) != 0)
                return -1;
            rd->ndiffs++;
            rc = riblt_decoder_add_diff(rd->dec, d);
        }
        if (rc != RIBLT_OK)
            return -1;
    }
    int rc = riblt_decoder_decode(rd->dec);
    if (rc == RIBLT_OK)
        return round_exchange(r, p);
    if (rc != RIBLT_NEED_MORE)
        return -1;
    uint64_t next = offset + n;
    if (next >= r->o.max_symbols)
        return -1; /* cap reached: the next round retries */
    rd->batch = rd->batch == BATCH_FIRST    ? BATCH_SECOND
                : rd->batch * 2 > BATCH_MAX ? BATCH_MAX
                                            : rd->batch * 2;
    uint64_t count = rd->batch;
    if (count > r->o.max_symbols - next)
        count = r->o.max_symbols - next;
    return request_symbols(p, next, (uint32_t)count);
}

static int on_mutations(struct repl *r, struct peer *p, const uint8_t *q,
                        size_t len)
{
    struct round *rd = &p->round;
    if (!rd->active || len < 5)
        return -1;
    uint8_t flags = q[0];
    int n = rd->bulk ? apply_records(r, q, len, NULL, 0)
                     : apply_records(r, q, len, rd->wanted, rd->nwanted);
    if (n < 0)
        return -1;
    PST_ADD(&p->st, mutations_fetched, n);
    if (flags & MUT_FINAL) {
        if (rd->bulk || rd->fetch_frames <= 1)
            round_done(p);
        else
            rd->fetch_frames--;
    }
    return 0;
}

/*
 * The INFO a dialled peer sends once the link is ready: its weight, its
 * ring parameters and the address of its client port (where requests for
 * its partitions are relayed). A peer whose P or R differ from ours is
 * kept out of the ring (ring_refresh).
 */
static int on_info(struct repl *r, struct peer *p, const uint8_t *q,
                   size_t len)
{
    if (len < 12 || len - 12 > REPL_LINK_ADDR_MAX)
        return -1;
    uint32_t weight = repl_wire_get_u32(q);
    if (weight == 0 || weight > RING_MAX_WEIGHT)
        return -1;
    char name[REPL_LINK_ADDR_MAX + 1], err[256];
    struct sockaddr_storage ss;
    socklen_t sl = 0;
    memcpy(name, q + 12, len - 12);
    name[len - 12] = '\0';
    memset(&ss, 0, sizeof(ss));
    if (len > 12 && repl_link_resolve("client", name, len - 12, &ss, &sl, err,
                                      sizeof(err)) != 0)
        return -1;
    pthread_mutex_lock(&r->plock);
    if (!p->info || strcmp(p->client, name) != 0 || p->weight != weight)
        r->republish = true;
    p->weight = weight;
    p->info_partitions = repl_wire_get_u32(q + 4);
    p->info_replicas = repl_wire_get_u32(q + 8);
    memcpy(p->client, name, len - 12 + 1);
    p->client_addr = ss;
    p->client_addrlen = sl;
    p->info = true;
    pthread_mutex_unlock(&r->plock);
    return 0;
}

/* A reply on an outgoing, authenticated connection. */
static int on_reply(struct conn *c, const repl_frame *f)
{
    struct peer *p = c->peer;
    switch (f->type) {
    case REPL_MSG_SYMBOLS:
        return on_symbols(c->r, p, f->payload, f->length);
    case REPL_MSG_MUTATIONS:
        return on_mutations(c->r, p, f->payload, f->length);
    case REPL_MSG_PONG:
        if (f->length != 8)
            return -1;
        if (c->r->reg)
            registry_client_pong(c->r->reg, p->node_id,
                                 repl_wire_get_u64(f->payload));
        return 0;
    case REPL_MSG_ERROR:
        /* Rings that disagree (membership still settling) fail the round
         * and keep the connection; anything else closes it. */
        if (f->length >= 4 && repl_wire_get_u32(f->payload) == ERR_RING &&
            p->round.active) {
            PST_ADD(&c->r->st, ring_mismatch, 1);
            round_fail(p, "ring mismatch");
            return 0;
        }
        return -1;
    case REPL_MSG_INFO:
        return on_info(c->r, p, f->payload, f->length);
    default:
        return -1;
    }
}

/* ====================================================== link callbacks */

/* An authenticated frame: a reply (outgoing) or a request (incoming). */
static int conn_frame(void *arg, repl_link *l, const repl_frame *f)
{
    struct conn *c = arg;
    (void)l;
    return c->outgoing ? on_reply(c, f) : serve(c, f);
}

static void conn_ready(void *arg, repl_link *l)
{
    struct conn *c = arg;
    struct repl *r = c->r;
    if (c->peer) {
        c->peer->connecting = false;
        c->peer->backoff_ms = 0;
        c->peer->down_since_ns = 0;
        __atomic_store_n(&c->peer->node_id, repl_link_peer_id(l),
                         __ATOMIC_RELAXED);
    }
    /* Both sides say who they are for the ring (the dialler's INFO is
     * ignored: each node learns its peers by dialling them). */
    size_t n = strlen(r->advertise);
    uint8_t *q = payload_area(r);
    repl_wire_put_u32(q, r->o.ring_weight ? r->o.ring_weight : 1);
    repl_wire_put_u32(q + 4, r->P);
    repl_wire_put_u32(q + 8, partitioned(r) ? r->o.replicas : 0);
    memcpy(q + 12, r->advertise, n);
    conn_send(c, REPL_MSG_INFO, (uint32_t)(12 + n));
}

/* The output drained to BULK_LOW_WATER: a bulk transfer goes on. */
static void conn_writable(void *arg, repl_link *l)
{
    struct conn *c = arg;
    (void)l;
    if (c->bulk_ids)
        bulk_continue(c);
}

static void on_accept(struct evconnlistener *lis, evutil_socket_t fd,
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

static void peer_connect(struct repl *r, struct peer *p)
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
            peer_lost(p);
        }
        return;
    }
    __atomic_store_n(&p->conn, c, __ATOMIC_RELAXED);
    p->connecting = true;
}

static bool peer_ready(const struct peer *p)
{
    return p->conn && repl_link_ready(p->conn->link);
}

/* ========================================================== placement */

/* What the client threads read: a copy of the ring and the client
 * addresses of its members. Immutable once published. */
struct route_member {
    uint32_t node;
    bool self;
    struct sockaddr_storage addr;
    socklen_t addrlen;
    char name[REPL_LINK_ADDR_MAX + 1];
};

struct route {
    ring *ring;
    ring *prev;        /* the ring before the last change, or NULL */
    uint64_t prev_end; /* until when (now_ns) prev orders reads */
    size_t n;
    struct route_member m[]; /* sorted by node id */
};

static void route_free(struct route *rt)
{
    if (!rt)
        return;
    ring_destroy(rt->ring);
    ring_destroy(rt->prev);
    free(rt);
}

/* Copies the current ring and addresses and swaps them in for readers. */
static void route_publish(struct repl *r)
{
    size_t n = ring_size(r->ring);
    ring_member *m = calloc(n ? n : 1, sizeof(*m));
    struct route *rt = calloc(1, sizeof(*rt) + n * sizeof(rt->m[0]));
    if (!m || !rt || !(rt->ring = ring_clone(r->ring, NULL)) ||
        (r->prev_ring && !(rt->prev = ring_clone(r->prev_ring, NULL)))) {
        free(m);
        route_free(rt);
        r->republish = true; /* try again next tick */
        return;
    }
    ring_members(r->ring, m, n);
    rt->n = n;
    /* A ring change publishes at once: the new owners catch up within
     * about ring_handoff_ms, and reads prefer the old ones until then. */
    rt->prev_end = r->ring_changed_ns + (uint64_t)r->o.handoff_ms * 1000000ull;
    for (size_t i = 0; i < n; i++) {
        struct route_member *rm = &rt->m[i];
        rm->node = m[i].node;
        if (m[i].node == r->o.node_id) {
            rm->self = true;
            rm->addr = r->adv_addr;
            rm->addrlen = r->adv_len;
            snprintf(rm->name, sizeof(rm->name), "%s", r->advertise);
            continue;
        }
        for (int j = 0; j < r->npeers; j++) {
            struct peer *p = &r->peers[j];
            if (!p->vacant && p->info && p->node_id == m[i].node) {
                rm->addr = p->client_addr;
                rm->addrlen = p->client_addrlen;
                snprintf(rm->name, sizeof(rm->name), "%s", p->client);
                break;
            }
        }
    }
    free(m);
    pthread_rwlock_wrlock(&r->rlock);
    struct route *old = r->route;
    r->route = rt;
    pthread_rwlock_unlock(&r->rlock);
    route_free(old);
    r->republish = false;
}

static int cmp_member(const void *a, const void *b)
{
    const ring_member *x = a, *y = b;
    return x->node < y->node ? -1 : x->node > y->node;
}

/*
 * Rebuilds the ring when its membership changed: this node, and every
 * peer whose INFO arrived, with our P and R, that is alive (registry
 * members: not dead in the view; static peers: connected, or down for
 * less than down_ms). Partitions gained start catching up; partitions
 * lost are remembered as held until handed off.
 */
static void ring_refresh(struct repl *r, uint64_t now)
{
    ring_member m[PEER_MAX + 1], cur[PEER_MAX + 1];
    size_t n = 0;
    m[n++] = (ring_member){r->o.node_id, r->o.ring_weight};
    for (int i = 0; i < r->npeers; i++) {
        struct peer *p = &r->peers[i];
        if (p->vacant || p->self || !p->info || p->node_id == 0 ||
            p->node_id == r->o.node_id || p->client_addrlen == 0 ||
            p->info_partitions != r->P || p->info_replicas != r->o.replicas)
            continue;
        bool alive =
            p->from_registry
                ? p->member != REGISTRY_DEAD
                : peer_ready(p) || (p->down_since_ns != 0 &&
                                    now - p->down_since_ns <
                                        (uint64_t)r->o.down_ms * 1000000ull);
        if (!alive)
            continue;
        bool dup = false;
        for (size_t k = 0; k < n; k++)
            dup |= m[k].node == p->node_id;
        if (!dup)
            m[n++] = (ring_member){p->node_id, p->weight};
    }
    qsort(m, n, sizeof(m[0]), cmp_member);
    size_t ncur = ring_members(r->ring, cur, PEER_MAX + 1);
    if (ncur == n && memcmp(cur, m, n * sizeof(m[0])) == 0) {
        if (r->republish)
            route_publish(r);
        return;
    }
    ring *next = ring_clone(r->ring, NULL);
    if (!next || ring_set_members(next, m, n) != RING_OK) {
        ring_destroy(next);
        return;
    }
    for (uint32_t p = 0; p < r->P; p++) {
        bool own = ring_is_owner(next, p, r->o.node_id);
        if (own && !r->owned[p]) {
            ASTORE(r->owned[p], 1);
            ASTORE(r->ready[p], 0);
            ASTORE(r->lost_ns[p], 0);
            r->gained_ns[p] = now;
        } else if (!own && r->owned[p]) {
            ASTORE(r->owned[p], 0);
            ASTORE(r->ready[p], 0);
            ASTORE(r->lost_ns[p], now);
        }
    }
    ring_destroy(r->prev_ring);
    r->prev_ring = r->ring;
    r->ring = next;
    r->ring_changed_ns = now;
    r->ring_gen++;
    PST_ADD(&r->st, ring_changes, 1);
    route_publish(r);
}

/*
 * True when every owner of lost partition p has completed a round with us
 * under the current ring that started after the last change to p here:
 * each holds what we hold, and p may go.
 */
static bool handed_off(struct repl *r, uint32_t p)
{
    uint64_t changed = ALOAD(r->changed_ns[p]);
    const uint32_t *own = ring_owners_ref(r->ring, p);
    size_t k = ring_owner_count(r->ring);
    for (size_t i = 0; i < k; i++) {
        struct peer *peer = NULL;
        for (int j = 0; j < r->npeers && !peer; j++)
            if (!r->peers[j].vacant && r->peers[j].node_id == own[i])
                peer = &r->peers[j];
        if (!peer || peer->ok_gen != r->ring_gen ||
            peer->ok_started_ns <= changed)
            return false;
    }
    return k > 0;
}

/*
 * Every tick: partitions changed here that we do not own become held
 * (a write served while rings disagreed); held partitions empty again are
 * forgotten; held partitions past the hand-off time whose owners all
 * have what we hold are dropped, a bounded number of mutations a tick.
 */
static void handoff_tick(struct repl *r, uint64_t now)
{
    size_t n = 0;
    /* Alone in the ring since start-up for ring_down_ms: nobody else holds
     * anything, what we hold is all there is. */
    bool alone = ring_size(r->ring) == 1 &&
                 now - r->started_ns >= (uint64_t)r->o.down_ms * 1000000ull;
    for (uint32_t p = 0; p < r->P; p++) {
        if (r->owned[p]) {
            /* Catching up ends with a round covering p with another
             * owner (parts_mark_ready). Without another owner there is
             * no such round: then once the holders have had
             * ring_handoff_ms to hand it over. */
            if (!r->ready[p] &&
                (alone || (ring_owner_count(r->ring) == 1 &&
                           now - r->gained_ns[p] >=
                               (uint64_t)r->o.handoff_ms * 1000000ull)))
                ASTORE(r->ready[p], 1);
            continue;
        }
        if (!r->lost_ns[p] && ALOAD(r->changed_ns[p]) > r->last_tick_ns)
            ASTORE(r->lost_ns[p], now);
        if (!r->lost_ns[p])
            continue;
        uint64_t muts = 0;
        store_partition_stats(r->s, p, &muts, NULL, NULL);
        if (muts == 0) {
            ASTORE(r->lost_ns[p], 0);
            continue;
        }
        if (now - r->lost_ns[p] < (uint64_t)r->o.handoff_ms * 1000000ull ||
            !handed_off(r, p))
            continue;
        r->parts_buf[n++] = p;
    }
    r->last_tick_ns = now;
    if (n == 0)
        return;
    size_t k = store_drop_partitions(r->s, r->parts_buf, n, DROP_BUDGET);
    PST_ADD(&r->st, items_dropped, k);
    for (size_t i = 0; i < n; i++) {
        uint64_t muts = 0;
        store_partition_stats(r->s, r->parts_buf[i], &muts, NULL, NULL);
        if (muts == 0) {
            ASTORE(r->lost_ns[r->parts_buf[i]], 0);
            PST_ADD(&r->st, partitions_dropped, 1);
        }
    }
}

/*
 * Arms the next tick after a period jittered to between 0.5 and 1.5 times
 * repl_period_ms, so that nodes started together drift apart instead of
 * choosing each other in lockstep.
 */
static void tick_arm(struct repl *r)
{
    uint64_t us = (uint64_t)r->o.period_ms * 500 +
                  rng_next(r) % ((uint64_t)r->o.period_ms * 1000 + 1);
    struct timeval tv = {(time_t)(us / 1000000), (suseconds_t)(us % 1000000)};
    event_add(r->tick, &tv);
}

/* Every period: reconnect, time rounds out, start a round. */
static void on_tick(evutil_socket_t fd, short what, void *arg)
{
    struct repl *r = arg;
    (void)fd;
    (void)what;
    uint64_t now = now_ns();
    int ready[PEER_MAX], nready = 0;
    if (partitioned(r)) {
        pthread_mutex_lock(&r->plock);
        ring_refresh(r, now);
        pthread_mutex_unlock(&r->plock);
        handoff_tick(r, now);
    }
    for (int i = 0; i < r->npeers; i++) {
        struct peer *p = &r->peers[i];
        if (p->self || p->vacant || p->member == REGISTRY_DEAD)
            continue;
        if (!p->conn && now >= p->retry_at_ns)
            peer_connect(r, p);
        if (p->round.active &&
            now - p->round.started_ns >
                (uint64_t)r->o.round_timeout_ms * 1000000ull) {
            /* A stuck round: drop the connection, replies would be late. */
            conn_free(p->conn);
            continue;
        }
        if (peer_ready(p) && !p->round.active && !peer_serving(r, p, now))
            ready[nready++] = i;
    }
    if (nready > 0)
        round_start(r, &r->peers[ready[rng_next(r) % (uint64_t)nready]]);
    tick_arm(r);
}

/* ========================================================== membership */

/* Closes a slot's connection, frees its round state and marks it vacant. */
static void peer_release(struct repl *r, struct peer *p)
{
    if (p->conn)
        conn_free(p->conn);
    round_reset(p);
    free(p->round.own);
    free(p->round.diffs);
    free(p->round.wanted);
    free(p->round.parts);
    riblt_decoder_destroy(p->round.dec);
    memset(p, 0, sizeof(*p));
    p->r = r;
    p->vacant = true;
}

/* A vacant slot or a new one at the end; NULL when the table is full. */
static struct peer *peer_slot(struct repl *r)
{
    for (int i = 0; i < r->npeers; i++)
        if (r->peers[i].vacant)
            return &r->peers[i];
    if (r->npeers == PEER_MAX)
        return NULL;
    struct peer *p = &r->peers[r->npeers++];
    memset(p, 0, sizeof(*p));
    p->r = r;
    p->vacant = true;
    return p;
}

/*
 * A registry's view (registry_view_fn): members new to it get a slot and
 * are dialled by the next tick, a member whose address changed is dialled
 * again, a dead one loses its connection and is left alone, and a member
 * no longer in the view is removed. Static peers are never touched; a
 * member that is also in the static list (same address or id) stays
 * static.
 */
static void on_view(void *arg, const registry_member *m, size_t n,
                    const char *source)
{
    struct repl *r = arg;
    bool seen[PEER_MAX] = {false};
    (void)source;
    pthread_mutex_lock(&r->plock);
    for (size_t i = 0; i < n; i++) {
        if (m[i].node == r->o.node_id)
            continue;
        struct peer *p = NULL;
        bool is_static = false;
        for (int j = 0; j < r->npeers; j++) {
            struct peer *q = &r->peers[j];
            if (q->vacant)
                continue;
            if (q->from_registry && q->view_node == m[i].node)
                p = q;
            else if (!q->from_registry && (strcmp(q->name, m[i].addr) == 0 ||
                                           q->node_id == m[i].node))
                is_static = true;
        }
        if (is_static)
            continue;
        if (p && strcmp(p->name, m[i].addr) != 0) {
            peer_release(r, p);
            p = NULL;
        }
        if (!p) {
            char err[256];
            p = peer_slot(r);
            if (!p)
                continue;
            if (peer_parse(p, m[i].addr, strlen(m[i].addr), err,
                           sizeof(err)) != REPL_OK) {
                memset(p, 0, sizeof(*p));
                p->r = r;
                p->vacant = true;
                continue;
            }
            p->vacant = false;
            p->from_registry = true;
            p->view_node = m[i].node;
            p->node_id = m[i].node;
        }
        seen[p - r->peers] = true;
        p->incarnation = m[i].incarnation;
        if (m[i].state == REGISTRY_DEAD && p->conn)
            conn_free(p->conn);
        p->member = m[i].state;
    }
    for (int j = 0; j < r->npeers; j++) {
        struct peer *q = &r->peers[j];
        if (!q->vacant && q->from_registry && !seen[j])
            peer_release(r, q);
    }
    pthread_mutex_unlock(&r->plock);
}

/*
 * An indirect probe (registry_ping_fn): PING target over our connection
 * to it; its PONG comes back through on_reply.
 */
static int on_ping(void *arg, uint32_t target, uint64_t token)
{
    struct repl *r = arg;
    for (int i = 0; i < r->npeers; i++) {
        struct peer *p = &r->peers[i];
        if (p->vacant || p->self || p->node_id != target || !peer_ready(p))
            continue;
        repl_wire_put_u64(payload_area(r), token);
        return conn_send(p->conn, REPL_MSG_PING, 8);
    }
    return -1;
}

/* ========================================================== eager push */

/* Store listener: runs on client worker threads. */
static void repl_on_change(void *arg, store_item *it, bool origin_local)
{
    struct repl *r = arg;
    if (partitioned(r)) {
        uint32_t p = store_item_partition(it);
        if (p <= r->P)
            ASTORE(r->changed_ns[p], now_ns());
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
 * Sends one MUTATIONS frame (at payload_area) to every ready peer, or only
 * to `only` when it is not NULL.
 */
static void push_frame(struct repl *r, size_t len, uint32_t count,
                       struct peer *only)
{
    for (int i = 0; i < r->npeers; i++) {
        struct peer *p = &r->peers[i];
        if (!peer_ready(p) || (only && p != only))
            continue;
        if (repl_link_output_length(p->conn->link) > OUT_HIGH_WATER) {
            PST_ADD(&p->st, push_dropped, count);
            continue;
        }
        uint8_t *q = payload_area(r);
        q[0] = MUT_PUSH;
        repl_wire_put_u32(q + 1, count);
        conn_send(p->conn, REPL_MSG_MUTATIONS, (uint32_t)len);
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
    uint8_t *q = payload_area(r);
    size_t len = 5;
    uint32_t count = 0;
    for (size_t i = 0; i < n; i++) {
        if (only) {
            uint32_t p = store_item_partition(batch[i]);
            if (p < r->P && !ring_is_owner(r->ring, p, only->node_id))
                continue;
        }
        if (len + REPL_WIRE_MUT_FIXED + 250 + r->o.item_size_max > cap) {
            push_frame(r, len, count, only);
            len = 5;
            count = 0;
        }
        store_mutation m;
        store_item_mutation(batch[i], &m);
        if (put_mutation(q, cap, &len, &m))
            count++;
    }
    if (count)
        push_frame(r, len, count, only);
}

static void on_wake(evutil_socket_t fd, short what, void *arg)
{
    struct repl *r = arg;
    (void)what;
    uint64_t v;
    ssize_t rn = read(fd, &v, sizeof(v));
    (void)rn;
    size_t cap = RECORDS_FRAME + r->o.item_size_max + 1024;
    if (!scratch_fit(r, cap))
        return;
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
            return;
        if (!partitioned(r)) {
            push_batch(r, batch, n, NULL);
        } else {
            /* Each peer gets the writes of the partitions it owns. */
            for (int i = 0; i < r->npeers; i++)
                if (peer_ready(&r->peers[i]))
                    push_batch(r, batch, n, &r->peers[i]);
        }
        for (size_t i = 0; i < n; i++)
            store_item_release(batch[i]);
    }
}

/* On the replication thread, as it stops. */
static void on_stop(void *arg)
{
    struct repl *r = arg;
    /* A clean stop leaves the registries' views at once. */
    if (r->reg)
        registry_client_leave(r->reg);
}

/* ========================================================== lifecycle */

static int bind_listener(struct repl *r, char *err, size_t nerr)
{
    char port[16];
    snprintf(port, sizeof(port), "%u", (unsigned)r->o.port);
    struct addrinfo hints = {0}, *res = NULL;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE;
    int rc = getaddrinfo(r->listen, port, &hints, &res);
    if (rc != 0 || !res) {
        snprintf(err, nerr, "peer listen address '%s': %s", r->listen,
                 gai_strerror(rc));
        return REPL_ERR_CONFIG;
    }
    r->lis = evconnlistener_new_bind(r->loop.base, on_accept, r,
                                     LEV_OPT_CLOSE_ON_FREE | LEV_OPT_REUSEABLE,
                                     64, res->ai_addr, (int)res->ai_addrlen);
    freeaddrinfo(res);
    if (!r->lis) {
        snprintf(err, nerr, "cannot listen on peer port %s:%u: %s", r->listen,
                 (unsigned)r->o.port, strerror(errno));
        return REPL_ERR_SYSTEM;
    }
    return REPL_OK;
}

/*
 * With replicas > 0: checks that the store is partitioned like the ring,
 * resolves our client address, and starts from a ring of this node alone
 * (it owns everything until peers are learnt).
 */
static int placement_setup(struct repl *r, char *err, size_t nerr)
{
    const repl_options *o = &r->o;
    snprintf(r->advertise, sizeof(r->advertise), "%s",
             o->advertise ? o->advertise : "");
    if (o->replicas == 0)
        return REPL_OK;
    if (o->ring_partitions == 0 || o->ring_partitions > RING_MAX_PARTITIONS ||
        store_partitions(r->s) != o->ring_partitions) {
        snprintf(err, nerr, "the store is not partitioned as ring_partitions");
        return REPL_ERR_CONFIG;
    }
    if (o->ring_weight == 0 || o->ring_weight > RING_MAX_WEIGHT) {
        snprintf(err, nerr, "ring_weight must be 1..%u", RING_MAX_WEIGHT);
        return REPL_ERR_CONFIG;
    }
    if (!r->advertise[0] ||
        repl_link_resolve("advertise", r->advertise, strlen(r->advertise),
                          &r->adv_addr, &r->adv_len, err, nerr) != 0) {
        if (!r->advertise[0])
            snprintf(err, nerr,
                     "replicas > 0 needs advertise (host:port of this "
                     "node's client port)");
        return REPL_ERR_CONFIG;
    }
    r->P = o->ring_partitions;
    size_t n = (size_t)r->P + 1;
    r->owned = calloc(n, 1);
    r->ready = calloc(n, 1);
    r->changed_ns = calloc(n, sizeof(uint64_t));
    r->lost_ns = calloc(n, sizeof(uint64_t));
    r->gained_ns = calloc(n, sizeof(uint64_t));
    r->parts_buf = calloc(n, sizeof(uint32_t));
    int rc = 0;
    r->ring = ring_create(r->P, o->replicas, &rc);
    if (!r->owned || !r->ready || !r->changed_ns || !r->lost_ns ||
        !r->gained_ns || !r->parts_buf || !r->ring ||
        ring_add(r->ring, o->node_id, o->ring_weight) != RING_OK) {
        snprintf(err, nerr, "out of memory");
        return REPL_ERR_NOMEM;
    }
    /* A node starts owning everything (it is alone in its ring) and
     * holding nothing: every partition but the global one catches up. */
    r->started_ns = now_ns();
    memset(r->owned, 1, n);
    r->ready[r->P] = 1;
    for (size_t p = 0; p < n; p++)
        r->gained_ns[p] = r->started_ns;
    route_publish(r);
    if (!r->route) {
        snprintf(err, nerr, "out of memory");
        return REPL_ERR_NOMEM;
    }
    return REPL_OK;
}

repl *repl_create(store *s, const repl_options *o, char *err, size_t nerr)
{
    if (o->port == 0) {
        snprintf(err, nerr, "replication needs a peer port");
        return NULL;
    }
    if (o->node_id == 0) {
        snprintf(err, nerr, "node_id must be non-zero");
        return NULL;
    }
    if ((!o->secret || !o->secret[0]) && !o->insecure) {
        snprintf(err, nerr,
                 "a cluster node needs cluster_secret (or "
                 "repl_insecure = yes to run without authentication)");
        return NULL;
    }
    if (o->period_ms == 0 || o->max_symbols < 1024 || o->push_queue == 0) {
        snprintf(err, nerr,
                 "repl_period_ms must be > 0, repl_max_symbols >= 1024, "
                 "repl_push_queue > 0");
        return NULL;
    }
    struct repl *r = calloc(1, sizeof(*r));
    if (!r) {
        snprintf(err, nerr, "out of memory");
        return NULL;
    }
    r->o = *o;
    r->s = s;
    r->S = store_sketch_symbols(s);
    pthread_rwlock_init(&r->rlock, NULL);
    r->wake_fd = -1;
    int loop_rc = evloop_init(&r->loop, on_stop, r);
    r->secret = strdup(o->secret ? o->secret : "");
    r->listen = strdup(o->listen && o->listen[0] ? o->listen : "127.0.0.1");
    r->qcap = o->push_queue;
    r->queue = calloc(r->qcap, sizeof(*r->queue));
    r->rng = now_ns() ^ ((uint64_t)o->node_id << 32);
    pthread_mutex_init(&r->qlock, NULL);
    pthread_mutex_init(&r->plock, NULL);
    /* Small frames (handshake, requests) are built without a size check. */
    r->syms = malloc(BATCH_MAX * sizeof(riblt_symbol));
    r->own_syms = malloc(BATCH_MAX * sizeof(riblt_symbol));
    if (!r->secret || !r->listen || !r->queue || r->S == 0 || !r->syms ||
        !r->own_syms || !scratch_fit(r, 65536)) {
        snprintf(err, nerr, "out of memory");
        goto fail;
    }
    if (peers_parse(r, o->peers, err, nerr) != REPL_OK)
        goto fail;
    if (placement_setup(r, err, nerr) != REPL_OK)
        goto fail;
    r->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (loop_rc != 0 || r->wake_fd < 0) {
        snprintf(err, nerr, "cannot create the replication event loop");
        goto fail;
    }
    if (bind_listener(r, err, nerr) != REPL_OK)
        goto fail;
    r->tick = event_new(r->loop.base, -1, 0, on_tick, r);
    r->wake =
        event_new(r->loop.base, r->wake_fd, EV_READ | EV_PERSIST, on_wake, r);
    if (!r->tick || !r->wake) {
        snprintf(err, nerr, "cannot create replication events");
        goto fail;
    }
    if (o->registries && o->registries[0]) {
        registry_client_options co = {
            .node_id = o->node_id,
            .registries = o->registries,
            .advertise = r->listen,
            .advertise_port = o->port,
            .secret = r->secret,
            .insecure = o->insecure,
            .timing = o->timing,
        };
        r->reg = registry_client_create(r->loop.base, &co, on_view, on_ping, r,
                                        err, nerr);
        if (!r->reg)
            goto fail;
    }
    tick_arm(r);
    event_add(r->wake, NULL);
    store_set_listener(s, repl_on_change, r);
    return r;
fail:
    repl_destroy(r);
    return NULL;
}

int repl_start(repl *r)
{
    return evloop_start(&r->loop) == 0 ? REPL_OK : REPL_ERR_SYSTEM;
}

void repl_destroy(repl *r)
{
    if (!r)
        return;
    evloop_stop(&r->loop);
    if (r->s)
        store_set_listener(r->s, NULL, NULL);
    for (int i = 0; i < r->npeers; i++) {
        struct peer *p = &r->peers[i];
        if (p->conn)
            conn_free(p->conn);
        round_reset(p);
        free(p->round.own);
        free(p->round.diffs);
        free(p->round.wanted);
        free(p->round.parts);
        riblt_decoder_destroy(p->round.dec);
    }
    while (r->incoming)
        conn_free(r->incoming);
    registry_client_destroy(r->reg);
    while (r->nspare > 0)
        riblt_encoder_destroy(r->spare[--r->nspare]);
    for (size_t i = 0; i < r->qlen; i++)
        store_item_release(r->queue[(r->qhead + i) % r->qcap]);
    if (r->lis)
        evconnlistener_free(r->lis);
    if (r->tick)
        event_free(r->tick);
    if (r->wake)
        event_free(r->wake);
    evloop_fini(&r->loop);
    if (r->wake_fd >= 0)
        close(r->wake_fd);
    pthread_mutex_destroy(&r->qlock);
    pthread_mutex_destroy(&r->plock);
    route_free(r->route);
    pthread_rwlock_destroy(&r->rlock);
    ring_destroy(r->ring);
    ring_destroy(r->prev_ring);
    free(r->owned);
    free(r->ready);
    free(r->changed_ns);
    free(r->lost_ns);
    free(r->gained_ns);
    free(r->parts_buf);
    free(r->queue);
    free(r->scratch);
    free(r->syms);
    free(r->own_syms);
    free(r->secret);
    free(r->listen);
    free(r);
}

/* ============================================================== stats */

void repl_emit_stats(repl *r, stats_emit_fn emit, void *arg)
{
    char name[192], val[192];
    snprintf(val, sizeof(val), "%u", r->o.node_id);
    emit(arg, "node_id", val);
    snprintf(val, sizeof(val), "%u", (unsigned)r->o.port);
    emit(arg, "peer_port", val);
    pthread_mutex_lock(&r->plock);
    int npeers = 0;
    for (int i = 0; i < r->npeers; i++)
        npeers += !r->peers[i].vacant;
    snprintf(val, sizeof(val), "%d", npeers);
    emit(arg, "peers", val);
    /* Where the peer set comes from: the static list alone, a registry,
     * or the cached view of a registry that is unreachable. */
    if (r->reg) {
        registry_client_source(r->reg, val, sizeof(val));
        emit(arg, "membership", val);
        snprintf(val, sizeof(val), "%llu",
                 (unsigned long long)registry_client_incarnation(r->reg));
        emit(arg, "incarnation", val);
        snprintf(val, sizeof(val), "%u", registry_client_connected(r->reg));
        emit(arg, "registries_connected", val);
    } else {
        emit(arg, "membership", "static");
    }
#define NSTATS_EMIT(n)                                                        \
    snprintf(val, sizeof(val), "%llu",                                        \
             (unsigned long long)PST_GET(&r->st, n));                         \
    emit(arg, #n, val);
    REPL_NODE_COUNTERS(NSTATS_EMIT)
#undef NSTATS_EMIT
    pthread_mutex_lock(&r->qlock);
    snprintf(val, sizeof(val), "%zu", r->qlen);
    pthread_mutex_unlock(&r->qlock);
    emit(arg, "push_queue_length", val);
    for (int i = 0; i < r->npeers; i++) {
        struct peer *p = &r->peers[i];
        if (p->vacant)
            continue;
        snprintf(name, sizeof(name), "peer%d:addr", i);
        emit(arg, name, p->name);
        snprintf(name, sizeof(name), "peer%d:origin", i);
        emit(arg, name, p->from_registry ? "registry" : "static");
        snprintf(name, sizeof(name), "peer%d:member", i);
        emit(arg, name, registry_state_name(p->member));
        snprintf(name, sizeof(name), "peer%d:incarnation", i);
        snprintf(val, sizeof(val), "%llu", (unsigned long long)p->incarnation);
        emit(arg, name, val);
        /* The connection pointer is the replication thread's: only a
         * coarse state is read here. */
        const char *state =
            __atomic_load_n(&p->self, __ATOMIC_RELAXED)   ? "self"
            : __atomic_load_n(&p->conn, __ATOMIC_RELAXED) ? "up"
                                                          : "down";
        snprintf(name, sizeof(name), "peer%d:state", i);
        emit(arg, name, state);
        snprintf(name, sizeof(name), "peer%d:node_id", i);
        snprintf(val, sizeof(val), "%u",
                 __atomic_load_n(&p->node_id, __ATOMIC_RELAXED));
        emit(arg, name, val);
#define PSTATS_EMIT(n)                                                        \
    snprintf(name, sizeof(name), "peer%d:" #n, i);                            \
    snprintf(val, sizeof(val), "%llu",                                        \
             (unsigned long long)PST_GET(&p->st, n));                         \
    emit(arg, name, val);
        REPL_PEER_COUNTERS(PSTATS_EMIT)
#undef PSTATS_EMIT
    }
    pthread_mutex_unlock(&r->plock);
}

/* ============================================================== route */

int repl_route(repl *r, const char *key, size_t nkey, bool write,
               repl_target *out, int cap)
{
    if (!r || !partitioned(r))
        return 0;
    int n = 0;
    pthread_rwlock_rdlock(&r->rlock);
    const struct route *rt = r->route;
    uint32_t p = ring_partition(rt->ring, key, nkey);
    const uint32_t *own = ring_owners_ref(rt->ring, p);
    size_t k = own ? ring_owner_count(rt->ring) : 0;
    uint32_t self = r->o.node_id, ids[16];
    size_t nid = 0;
    bool mine = false;
    for (size_t i = 0; i < k; i++)
        mine |= own[i] == self;
    if (write) {
        /*
         * Writes go to the preferred owner (the first), so that a key's
         * writes meet in one place: cas is atomic there, and a read
         * relayed to it sees them. When it is unreachable the relay falls
         * down the list, this node included (its own client port, served
         * here).
         */
        if (k > 0 && own[0] != self)
            for (size_t i = 0; i < k && nid < 16; i++)
                ids[nid++] = own[i];
    } else if (!mine || !ALOAD(r->ready[p])) {
        /*
         * Reads are served by any owner that has caught up. Otherwise the
         * other owners, best first (where the writes go), except that
         * within ring_handoff_ms of a ring change those which already
         * owned p before it come first: one that just gained p may still
         * be catching up, and a relayed request is served where it lands.
         */
        bool prefer_old = rt->prev && now_ns() < rt->prev_end;
        for (int pass = 0; pass < 2; pass++)
            for (size_t i = 0; i < k && nid < 16; i++)
                if (own[i] != self &&
                    (prefer_old && ring_is_owner(rt->prev, p, own[i])) ==
                        (pass == 0))
                    ids[nid++] = own[i];
    }
    {
        for (size_t i = 0; i < nid && n < cap; i++) {
            size_t lo = 0, hi = rt->n;
            while (lo < hi) {
                size_t mid = lo + (hi - lo) / 2;
                if (rt->m[mid].node < ids[i])
                    lo = mid + 1;
                else
                    hi = mid;
            }
            if (lo == rt->n || rt->m[lo].node != ids[i] ||
                rt->m[lo].addrlen == 0)
                continue;
            out[n].node = ids[i];
            out[n].addr = rt->m[lo].addr;
            out[n].addrlen = rt->m[lo].addrlen;
            n++;
        }
    }
    pthread_rwlock_unlock(&r->rlock);
    return n;
}

void repl_emit_ring_stats(repl *r, stats_emit_fn emit, void *arg)
{
    char name[64], val[256];
    if (!partitioned(r)) {
        emit(arg, "ring_replicas", "0");
        emit(arg, "ring_mode", "full");
        return;
    }
    pthread_rwlock_rdlock(&r->rlock);
    const struct route *rt = r->route;
    snprintf(val, sizeof(val), "%u", ring_partitions(rt->ring));
    emit(arg, "ring_partitions", val);
    snprintf(val, sizeof(val), "%u", ring_replicas(rt->ring));
    emit(arg, "ring_replicas", val);
    emit(arg, "ring_hash", "fnv1a64-splitmix64");
    snprintf(val, sizeof(val), "%016llx",
             (unsigned long long)ring_fingerprint(rt->ring));
    emit(arg, "ring_fingerprint", val);
    snprintf(val, sizeof(val), "%zu", rt->n);
    emit(arg, "ring_members", val);
    ring_member *m = calloc(rt->n ? rt->n : 1, sizeof(*m));
    if (m) {
        ring_members(rt->ring, m, rt->n);
        for (size_t i = 0; i < rt->n; i++) {
            snprintf(name, sizeof(name), "ring_member:%u", rt->m[i].node);
            snprintf(val, sizeof(val), "%u %s %s", m[i].weight,
                     rt->m[i].name[0] ? rt->m[i].name : "-",
                     rt->m[i].self ? "self" : "alive");
            emit(arg, name, val);
        }
        free(m);
    }
    uint64_t owned = 0, catching = 0, held = 0;
    for (uint32_t p = 0; p < r->P; p++) {
        if (ALOAD(r->owned[p])) {
            owned++;
            catching += !ALOAD(r->ready[p]);
        } else if (ALOAD(r->lost_ns[p])) {
            held++;
        }
    }
#define RING_EMIT(label, v)                                                   \
    snprintf(val, sizeof(val), "%llu", (unsigned long long)(v));              \
    emit(arg, label, val);
    RING_EMIT("ring_changes", PST_GET(&r->st, ring_changes))
    RING_EMIT("partitions_owned", owned)
    RING_EMIT("partitions_catching_up", catching)
    RING_EMIT("partitions_held", held)
    RING_EMIT("ring_mismatch", PST_GET(&r->st, ring_mismatch))
    RING_EMIT("rejected_records", PST_GET(&r->st, rejected_records))
    RING_EMIT("partitions_dropped", PST_GET(&r->st, partitions_dropped))
    RING_EMIT("items_dropped", PST_GET(&r->st, items_dropped))
#undef RING_EMIT
    uint32_t k = ring_owner_count(rt->ring);
    for (uint32_t p = 0; p < r->P; p++) {
        const uint32_t *own = ring_owners_ref(rt->ring, p);
        size_t len = 0;
        val[0] = '\0';
        for (uint32_t i = 0; own && i < k && len < sizeof(val) - 12; i++)
            len += (size_t)snprintf(val + len, sizeof(val) - len, "%s%u",
                                    i ? "," : "", own[i]);
        snprintf(name, sizeof(name), "ring_partition:%u", p);
        emit(arg, name, val);
    }
    pthread_rwlock_unlock(&r->rlock);
}
