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

#include "repl_link.h"
#include "repl_wire.h"

/* ============================================================= limits */

#define PEER_MAX 64
#define INCOMING_MAX 256
#define BATCH_FIRST 64             /* first symbol batch of a round */
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

/* Extra message type (not in repl_wire.h's list of round messages). */
#define REPL_MSG_BULK_REQ 16

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
    X(served_bytes_recv)

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
    struct round round;
    struct pstats st;
};

struct repl {
    repl_options o;
    char *secret;
    char *listen;
    store *s;
    size_t S; /* sketch symbols */
    struct event_base *base;
    struct evconnlistener *lis;
    struct event *tick, *wake, *stop;
    int wake_fd, stop_fd;
    pthread_t thread;
    bool started;
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
    free(c);
}

static void send_error(struct conn *c, const char *text)
{
    size_t n = strlen(text);
    if (!repl_link_ready(c->link) || !scratch_fit(c->r, n + 4))
        return;
    uint8_t *p = payload_area(c->r);
    repl_wire_put_u32(p, 1);
    memcpy(p + 4, text, n);
    conn_send(c, REPL_MSG_ERROR, (uint32_t)(n + 4));
}

/* ===================================================== mutation records */

/* Appends an item's mutation record at *len; false when it does not fit. */
static bool put_item(uint8_t *buf, size_t cap, size_t *len, store_item *it)
{
    store_mutation m;
    store_item_mutation(it, &m);
    long n = repl_wire_put_mutation(buf + *len, cap - *len, &m);
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
        store_item *it = i < n ? store_fetch(r->s, &ids[i]) : NULL;
        if (i < n && !it)
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
            if (put_item(p, cap, &len, it)) {
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

static riblt_encoder *encoder_from_journal(struct repl *r, uint64_t offset)
{
    int64_t size = 0;
    store_sketch_read(r->s, 0, NULL, 0, &size);
    struct tailvec tv = {encoder_get(r, size > 0 ? (size_t)size : 0), r->S,
                         false};
    if (!tv.enc)
        return NULL;
    store_journal_tails(r->s, add_tail, &tv);
    if (tv.failed || riblt_encoder_seek(tv.enc, offset) != RIBLT_OK) {
        encoder_put(r, tv.enc);
        return NULL;
    }
    PST_ADD(&r->st, encoder_builds, 1);
    return tv.enc;
}

/*
 * Fills out[0..n) with symbols [offset, offset+n) of a stream whose first
 * S symbols are snap and whose rest comes from *enc (built on demand).
 */
static int stream_symbols(struct repl *r, const riblt_symbol *snap,
                          riblt_encoder **enc, uint64_t offset,
                          riblt_symbol *out, size_t n)
{
    size_t i = 0;
    for (; i < n && offset + i < r->S; i++)
        out[i] = snap[offset + i];
    if (i == n)
        return 0;
    uint64_t at = offset + i;
    if (!*enc) {
        *enc = encoder_from_journal(r, at);
        if (!*enc)
            return -1;
    } else if (riblt_encoder_position(*enc) != at) {
        riblt_encoder_seek(*enc, at);
    }
    return riblt_encoder_produce(*enc, out + i, n - i) == RIBLT_OK ? 0 : -1;
}

static int serve_symbols(struct conn *c, const uint8_t *p, size_t len)
{
    struct repl *r = c->r;
    if (len != 12)
        return -1;
    uint64_t offset = repl_wire_get_u64(p);
    uint32_t count = repl_wire_get_u32(p + 8);
    if (count == 0 || count > BATCH_MAX || offset > r->o.max_symbols ||
        count > r->o.max_symbols - offset) {
        send_error(c, "symbol request out of bounds");
        return -1;
    }
    if (offset == 0 || !c->snap) {
        /* A new round: one consistent copy of the sketch serves it all. */
        if (!c->snap && !(c->snap = malloc(r->S * sizeof(riblt_symbol))))
            return -1;
        store_sketch_read(r->s, 0, c->snap, r->S, &c->snap_size);
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
    if (stream_symbols(r, c->snap, &c->enc, offset, r->syms, count) != 0)
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

static int serve_bulk(struct conn *c)
{
    struct idvec iv = {0};
    store_journal_ids(c->r->s, idvec_push, &iv);
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
        return 0;
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
    PST_ADD(&p->st, rounds_ok, 1);
    PST_SET(&p->st, last_success, wall_s());
    PST_SET(&p->st, last_round_symbols, rd->ndiffs);
    PST_SET(&p->st, last_round_us, (now_ns() - rd->started_ns) / 1000);
    round_reset(p);
    if (p->conn)
        conn_send(p->conn, REPL_MSG_DONE, 0);
}

static int request_symbols(struct peer *p, uint64_t offset, uint32_t count)
{
    struct conn *c = p->conn;
    uint8_t *q = payload_area(c->r);
    repl_wire_put_u64(q, offset);
    repl_wire_put_u32(q + 8, count);
    p->round.requested = offset;
    return conn_send(c, REPL_MSG_SYMBOLS_REQ, 12);
}

static void round_start(struct repl *r, struct peer *p)
{
    struct round *rd = &p->round;
    if (!rd->own && !(rd->own = malloc(r->S * sizeof(riblt_symbol))))
        return;
    round_reset(p);
    store_sketch_read(r->s, 0, rd->own, r->S, &rd->own_size);
    rd->active = true;
    rd->started_ns = now_ns();
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
        stream_symbols(r, rd->own, &rd->own_enc, offset, own, n) != 0)
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
    rd->batch = rd->batch * 2 > BATCH_MAX ? BATCH_MAX : rd->batch * 2;
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
        return -1;
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
    if (c->peer) {
        c->peer->connecting = false;
        c->peer->backoff_ms = 0;
        __atomic_store_n(&c->peer->node_id, repl_link_peer_id(l),
                         __ATOMIC_RELAXED);
    }
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
    c->link = repl_link_accept(r->base, fd, &o, &conn_ops, c);
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
    int rc = repl_link_dial(r->base, (struct sockaddr *)&p->addr, p->addrlen,
                            &o, &conn_ops, c, &c->link);
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

/* Sends one MUTATIONS frame (at payload_area) to every ready peer. */
static void push_frame(struct repl *r, size_t len, uint32_t count)
{
    for (int i = 0; i < r->npeers; i++) {
        struct peer *p = &r->peers[i];
        if (!peer_ready(p))
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
        uint8_t *q = payload_area(r);
        size_t len = 5;
        uint32_t count = 0;
        for (size_t i = 0; i < n; i++) {
            if (len + REPL_WIRE_MUT_FIXED + 250 + r->o.item_size_max > cap) {
                push_frame(r, len, count);
                len = 5;
                count = 0;
            }
            if (put_item(q, cap, &len, batch[i]))
                count++;
            store_item_release(batch[i]);
        }
        if (count)
            push_frame(r, len, count);
    }
}

static void on_stop(evutil_socket_t fd, short what, void *arg)
{
    struct repl *r = arg;
    (void)fd;
    (void)what;
    /* A clean stop leaves the registries' views at once. */
    if (r->reg)
        registry_client_leave(r->reg);
    event_base_loopbreak(r->base);
}

/* ========================================================== lifecycle */

static void *repl_main(void *arg)
{
    struct repl *r = arg;
    event_base_dispatch(r->base);
    return NULL;
}

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
    r->lis = evconnlistener_new_bind(r->base, on_accept, r,
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
    r->wake_fd = r->stop_fd = -1;
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
    r->base = event_base_new();
    r->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    r->stop_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (!r->base || r->wake_fd < 0 || r->stop_fd < 0) {
        snprintf(err, nerr, "cannot create the replication event loop");
        goto fail;
    }
    if (bind_listener(r, err, nerr) != REPL_OK)
        goto fail;
    r->tick = event_new(r->base, -1, 0, on_tick, r);
    r->wake = event_new(r->base, r->wake_fd, EV_READ | EV_PERSIST, on_wake, r);
    r->stop = event_new(r->base, r->stop_fd, EV_READ, on_stop, r);
    if (!r->tick || !r->wake || !r->stop) {
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
        r->reg = registry_client_create(r->base, &co, on_view, on_ping, r, err,
                                        nerr);
        if (!r->reg)
            goto fail;
    }
    tick_arm(r);
    event_add(r->wake, NULL);
    event_add(r->stop, NULL);
    store_set_listener(s, repl_on_change, r);
    return r;
fail:
    repl_destroy(r);
    return NULL;
}

int repl_start(repl *r)
{
    if (pthread_create(&r->thread, NULL, repl_main, r) != 0)
        return REPL_ERR_SYSTEM;
    r->started = true;
    return REPL_OK;
}

void repl_destroy(repl *r)
{
    if (!r)
        return;
    if (r->started) {
        uint64_t one = 1;
        ssize_t n = write(r->stop_fd, &one, sizeof(one));
        (void)n;
        pthread_join(r->thread, NULL);
    }
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
    if (r->stop)
        event_free(r->stop);
    if (r->base)
        event_base_free(r->base);
    if (r->wake_fd >= 0)
        close(r->wake_fd);
    if (r->stop_fd >= 0)
        close(r->stop_fd);
    pthread_mutex_destroy(&r->qlock);
    pthread_mutex_destroy(&r->plock);
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
