/*
 * repl_int.h -- private to the files of the replication thread (repl.c,
 * repl_conn.c, repl_stream.c, repl_serve.c, repl_round.c, repl_push.c,
 * repl_place.c, repl_peers.c, repl_stats.c): their shared structures,
 * limits and counters, and the functions one of them calls in another.
 * Nothing else includes it; the rest of the daemon sees repl.h.
 *
 * Threading: everything declared here runs on the replication thread's
 * event loop, except where a declaration says otherwise (the push
 * listener, the stats and the route run on other threads). The fields of
 * struct repl say which lock or atomic guards what other threads read.
 */
#ifndef REPL_INT_H
#define REPL_INT_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#include <event2/util.h>

#include "dnsview.h"
#include "etcdview.h"
#include "evloop.h"
#include "registry.h"
#include "repl.h"
#include "log.h"
#include "repl_link.h"
#include "repl_wire.h"
#include "ring.h"
#include "store.h"

struct evconnlistener;
struct event;
struct route;

/* ============================================================= limits */

#define PEER_MAX 64
#define INCOMING_MAX 256
/*
 * A round first asks for coded symbol 0 alone: equal sets cancel there,
 * so a round between nodes that agree costs one symbol each way, and an
 * idle cluster is quiet. Then small steps while the round is small, and
 * larger ones once it is not (next_batch in repl_round.c).
 */
#define BATCH_FIRST 1
#define BATCH_STEP 4        /* the smallest request after symbol 0 */
#define BATCH_FINE 512      /* below this many symbols, grow by a sixteenth */
#define BATCH_MAX 4096      /* 128 KiB of symbols per frame */
#define FETCH_IDS_MAX 16384 /* ids per FETCH frame (256 KiB) */
#define RECORDS_FRAME (1u << 20)   /* records per MUTATIONS frame, bytes */
#define OUT_HIGH_WATER (16u << 20) /* a peer this far behind gets no push */
#define BULK_LOW_WATER (1u << 20)  /* refill bulk output below this */
#define BACKOFF_MAX_MS 2000
/* Reconnects during the first FAST_RETRY_NS of a peer's absence: every
 * FAST_RETRY_MS (at the tick, or at once when the peer dials us). */
#define FAST_RETRY_MS 20
#define FAST_RETRY_NS (10ull * 1000000000ull)
#define DECODER_FIRST 8192
/* A round whose peer holds this many more mutations than we do is handed
 * over to the peer (REPL_MSG_ROUND_PLEASE). */
#define HAND_OVER_DIFF 64
#define ENCODER_SPARES 2 /* encoders kept for the next rounds */
/* for this long after the last walked round ended: an encoder over a
 * large set is tens of MiB beyond -m */
#define ENCODER_SPARE_NS (10ull * 1000000000ull)

/* Mutations a tick may drop from lost partitions (a call walks about 8x as
 * many table entries; the whole drop is one pass over the table). */
#define DROP_BUDGET 4000

/* ============================================================== stats */

#define REPL_PEER_COUNTERS(X)                                                 \
    X(rounds)                                                                 \
    X(rounds_ok)                                                              \
    X(rounds_failed)                                                          \
    X(rounds_busy)                                                            \
    X(rounds_walked)                                                          \
    X(rounds_handed)                                                          \
    X(rounds_idle)                                                            \
    X(rounds_asked)                                                           \
    X(bulk_transfers)                                                         \
    X(symbols_recv)                                                           \
    X(psum_terms_recv)                                                        \
    X(rounds_psum)                                                            \
    X(psum_fallbacks)                                                         \
    X(psum_recent)                                                            \
    X(diffs_remote)                                                           \
    X(diffs_local)                                                            \
    X(mutations_fetched)                                                      \
    X(mutations_sent)                                                         \
    X(pushed)                                                                 \
    X(push_frames)                                                            \
    X(push_dropped)                                                           \
    X(push_from_log)                                                          \
    X(bytes_sent)                                                             \
    X(bytes_recv)                                                             \
    X(connects)                                                               \
    X(connect_failures)                                                       \
    X(auth_failures)                                                          \
    X(last_round_symbols)                                                     \
    X(last_round_us)                                                          \
    X(last_round_diffs)                                                       \
    X(decoder_symbols)                                                        \
    X(decoders_grown)                                                         \
    X(resumes)                                                                \
    X(resumed)                                                                \
    X(resume_missed)                                                          \
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
    X(served_psum_terms)                                                      \
    X(served_fetches)                                                         \
    X(served_bulk)                                                            \
    X(served_walks)                                                           \
    X(refused_busy)                                                           \
    X(applied)                                                                \
    X(stale)                                                                  \
    X(rejected_records)                                                       \
    X(bad_frames)                                                             \
    X(auth_failures)                                                          \
    X(incoming_refused)                                                       \
    X(duplicate_node_id)                                                      \
    X(push_queue_dropped)                                                     \
    X(push_acks)                                                              \
    X(encoder_builds)                                                         \
    X(encoder_spares_freed)                                                   \
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
    /* responder: the current round's stream, from one sketch snapshot
     * (snap) or, when walked, from an encoder over one walk of the set */
    riblt_symbol *snap;
    int64_t snap_size;
    bool walk;
    riblt_encoder *enc;
    /* responder: the snapshot's power sums (RIBLT_PSUM_SIZE terms, then
     * the RIBLT_PSUM_TERMS of their sum), valid while snap_ps_ok */
    riblt_id *snap_ps;
    bool snap_ps_ok;
    /* responder: when the peer's current round began (0 = none) */
    uint64_t serving_since_ns;
    /* responder: the partitions of the current round (ring_gen: the ring
     * they were checked against) */
    uint32_t *parts;
    size_t nparts;
    uint64_t parts_gen;
    /* incoming: our RESUME is out and the peer's answer, which follows
     * whatever it resends, has not come yet (rounds wait for it, at most
     * RESUME_WAIT_MAX_NS after resume_asked_ns) */
    bool resume_pending;
    uint64_t resume_asked_ns;
    /* responder: a bulk transfer in progress */
    riblt_id *bulk_ids;
    size_t bulk_n, bulk_pos;
    struct conn *next; /* incoming list */
};

/*
 * The power-sum phase of a round (repl_psum.c): the terms of both sides
 * and of their difference, per bucket and then the sum of the buckets
 * (index RIBLT_PSUM_BUCKETS), and the ids decoded so far. Kept with the
 * peer across rounds (9 KiB); reset by each round.
 */
#define PSUM_SLOTS (RIBLT_PSUM_BUCKETS + 1)
struct psum_round {
    bool on;           /* the round is in its power-sum phase */
    bool failed;       /* given up: R-IBLT once the replies in flight are in */
    bool buckets;      /* past the sum of the buckets: bucket by bucket */
    bool own_ok;       /* own holds the round's snapshot */
    unsigned inflight; /* PSUMS_REQ sent, not answered yet */
    riblt_symbol diff0; /* coded symbol 0 of the difference: the check */
    int64_t remote_size;
    uint8_t have[PSUM_SLOTS]; /* terms received, per slot */
    uint16_t done;            /* buckets decoded (bits) */
    size_t nfound;
    size_t hint; /* ids the last phase with this peer found: under steady
                    writes the next difference is much the same, and
                    asking for that many terms at once saves round trips */
    riblt_id own[PSUM_SLOTS * RIBLT_PSUM_TERMS];
    riblt_id diff[PSUM_SLOTS * RIBLT_PSUM_TERMS];
    riblt_id found[RIBLT_PSUM_BUCKETS * (RIBLT_PSUM_TERMS - 1)];
};

/* Initiator state of one round with a peer. */
struct round {
    bool active;
    bool bulk;
    uint64_t started_ns;
    bool walk;             /* restarted over walks of both sets */
    riblt_symbol *own;     /* own sketch snapshot */
    struct psum_round *ps; /* own power sums and the phase; NULL until a
                              round first has them */
    int64_t own_size;
    riblt_encoder *own_enc; /* own stream when walked */
    riblt_decoder *dec;
    size_t dec_cap;
    riblt_symbol *diffs; /* every difference symbol, to refeed a bigger
                            decoder */
    size_t ndiffs, diffs_cap;
    uint64_t requested; /* offset of the outstanding SYMBOLS_REQ */
    riblt_id *wanted;   /* sorted remote-only ids being fetched */
    size_t nwanted;
    size_t fetch_frames;  /* FETCH frames not yet answered in full */
    uint64_t decoded;     /* differences decoded, or records of a bulk */
    uint64_t bulk_bytes0; /* the link's bytes received when a bulk began */
    uint32_t *parts;      /* the partitions reconciled (ascending) */
    size_t nparts;
    uint64_t gen;        /* the ring generation the round started under */
    uint64_t snap_ticks; /* the store's clock when own was read */
    uint64_t repaired;   /* differences older than writes in flight that
                            this round pushed or had applied */
};

/*
 * Writes at most this much older than a round's snapshot are taken for
 * writes still in flight (a push not yet sent or applied) when a round
 * finds them: they may reach the other side meanwhile.
 */
#define ROUND_RECENT_NS (50ull * 1000000ull)

/*
 * Rounds that repaired nothing (every difference a write in flight, or
 * none), once the last round with every ready peer was such a one,
 * stretch the gap between the rounds this node starts, doubling up to
 * 2^ROUND_BACKOFF_MAX ticks; one that repaired something, a failed one,
 * a link coming up, a ring change or a push that was not delivered
 * brings it back to every tick (repl_rounds_wanted).
 */
#define ROUND_BACKOFF_MAX 4

/*
 * The push log (repl_push.c): the local writes pushed lately, in push
 * order, so that a peer whose link comes back receives exactly what it
 * missed (REPL_MSG_RESUME) instead of a round finding it. Entries are
 * numbered from 1 (seq) within one run of this node; the run is drawn at
 * start, so a restarted node's numbers are never taken for its old ones.
 */
struct pushlog {
    store_item **items; /* items[seq & (cap - 1)], tail <= seq < head */
    size_t cap;         /* a power of two; 0: no log (resume off) */
    uint64_t head, tail;
    size_t bytes, budget; /* approximate item bytes held, the bound */
    uint64_t run;
};

/* What this node applied last of a peer's pushes: that peer's run and
 * seq (the receiving side of a resume). */
struct resume_point {
    uint32_t node;
    uint64_t run, seq;
};

/* Rounds wait this long after a link comes up, so that resumes, not
 * rounds, bring over what the link missed (repl_in_round). */
#define RESUME_QUIET_MS 50
#define RESUME_QUIET_NS ((uint64_t)RESUME_QUIET_MS * 1000000ull)
/* ... and for a resume under way, until it ends, at most this long. */
#define RESUME_WAIT_MAX_NS (2000ull * 1000000ull)

/* Where a peer came from: the peers list, or a membership source's view. */
enum peer_origin {
    PEER_STATIC = 0, /* the peers list */
    PEER_REGISTRY,   /* a registry's view (liveness from the registry) */
    PEER_DNS,        /* peers_dns (addresses only; liveness as static) */
    PEER_ETCD,       /* etcd's records (liveness: the record's lease) */
};

struct peer {
    struct repl *r;
    char name[128]; /* host:port as configured or as registered */
    struct sockaddr_storage addr;
    socklen_t addrlen;
    bool self;
    bool vacant;    /* a free slot (a member that left the view) */
    uint8_t origin; /* enum peer_origin: where the peer came from */
    uint8_t member; /* registry_state; static peers stay alive */
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
    bool bulk_next; /* the last round hit the symbol cap: pull a bulk */
    /* The push log's head when our link to it came up: pushes from that
     * seq on went to it live; a resume covers the ones before. The same
     * for the link before this one, and the peer's run then (repl_push.c,
     * resume). */
    uint64_t link_seq, prev_link_seq, peer_run;
    /* Its link fell more than OUT_HIGH_WATER behind: from this push log
     * seq on it is fed from the log as its output drains, in order, and
     * gets no live push until it has caught up (0: live; repl_push.c). */
    uint64_t lag_from;
    /* Its link came back while rounds waited for resumes: a round with it
     * is due when they end (on_quiet_end in repl.c); a due round the peer
     * answers busy (its own wait) is tried again soon, a few times. */
    bool round_due, round_was_due;
    uint8_t due_retries;
    /* the last round that succeeded: when it ended, what it found */
    uint64_t last_ok_ns;
    bool last_repaired; /* our last round with it repaired something */
    uint64_t last_diffs;
    /* log rate limits: still down, failed rounds */
    log_limit down_log, round_log, push_log;
    uint32_t down_attempts; /* failed dials since it went down */
    char down_why[192];     /* the reason last logged ("" none) */
    struct round round;
    struct pstats st;
};

struct repl {
    repl_options o;
    log_limit refused_log;   /* incoming handshakes refused */
    log_limit duplicate_log; /* links refused for a duplicate node id */
    log_limit queue_log;     /* fresh writes the full push queue refused */
    uint64_t queue_dropped_logged;
    char *secret;
    char *listen;
    store *s;
    size_t S;    /* sketch symbols */
    evloop loop; /* the replication thread and its event base */
    struct evconnlistener *lis;
    struct event *tick, *wake;
    /* push coalescing: the window's timer, the last drain (ns) and how
     * many writes it carried */
    struct event *push_timer;
    struct event *redial; /* the next redial of a peer whose link is down */
    bool push_armed;
    bool push_idle; /* the armed window is an idle one (arm_window) */
    uint64_t last_push_ns;
    size_t last_push_n;
    /* rounds this node starts: one every 2^round_backoff ticks */
    unsigned round_backoff, round_ticks;
    uint64_t queue_dropped_seen; /* push_queue_dropped at the last tick */
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
    dnsview *dns;         /* NULL without peers_dns */
    etcdview *etcd;       /* NULL without etcd */
    struct conn *incoming;
    int nincoming;
    /* push queue: filled by worker threads, drained by this thread */
    pthread_mutex_t qlock;
    store_item **queue;
    size_t qhead, qlen, qcap;
    /* the window's timer is armed and will drain the queue: writers
     * need not wake this thread (under qlock) */
    bool q_timed;
    /* Acknowledgements (repl_push.c, o.acks): tickets number the queued
     * writes in queue order, q_enq the last one queued (under qlock) and
     * q_deq the last one taken by this thread. Per peer slot, the newest
     * ticket it said it applied and the newest one not sent to it on its
     * current link (atomics: client threads read them). */
    uint64_t q_enq, q_deq;
    struct ack_slot {
        uint64_t acked, gap;
    } acks[PEER_MAX];
    /* resume (repl_push.c): our push log, what we applied of each
     * peer's, and until when rounds wait for resumes after a link came
     * up */
    struct pushlog log;
    struct resume_point from[PEER_MAX];
    int nfrom;
    uint64_t quiet_until_ns;
    struct event *quiet_end; /* fires when rounds may go on */
    /* encoders kept between rounds: their memory is already mapped */
    riblt_encoder *spare[ENCODER_SPARES];
    int nspare;
    uint64_t spare_at_ns; /* when the last one was put back */
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
    /* health (repl_health.c): the verdict the tick computes, read by the
     * stats reader with atomics */
    uint64_t created_ns;
    uint64_t handed_ns; /* this node last handed a round over (behind) */
    int health;         /* enum repl_health */
    uint32_t health_up, health_total;
    uint64_t health_diffs;    /* largest last difference with a peer up */
    uint64_t health_since_ns; /* when the verdict last changed */
    log_limit isolated_log;
    char advertise[REPL_LINK_ADDR_MAX + 1];
    struct sockaddr_storage adv_addr; /* our client port, for the route */
    socklen_t adv_len;
    pthread_rwlock_t rlock;
    struct route *route;
};

/* Placement arrays are written by the replication thread and read by
 * the client threads and stats: relaxed atomics. */
#define ALOAD(x) __atomic_load_n(&(x), __ATOMIC_RELAXED)
#define ASTORE(x, v) __atomic_store_n(&(x), (v), __ATOMIC_RELAXED)

/* Placement is on (replicas > 0); P == 0 is full replication. */
static inline bool repl_partitioned(const struct repl *r)
{
    return r->P != 0;
}

/* ========================================================= repl.c */

/* Monotonic clock, in ns. */
uint64_t repl_now_ns(void);
/* Wall clock, in s (the last_success counter). */
uint64_t repl_wall_s(void);
int repl_peer_parse(struct peer *p, const char *spec, size_t n, char *err,
                    size_t nerr);

/* ==================================================== repl_conn.c */

bool repl_scratch_fit(struct repl *r, size_t n);
/* Scratch a MUTATIONS frame may need: RECORDS_FRAME of records plus one
 * record of the largest item. */
size_t repl_records_cap(const struct repl *r);
uint8_t *repl_payload_area(struct repl *r);
int repl_conn_send(struct conn *c, uint8_t type, uint32_t len);
void repl_conn_free(struct conn *c);
bool repl_put_mutation(uint8_t *buf, size_t cap, size_t *len,
                       const store_mutation *m);
size_t repl_send_records(struct conn *c, const riblt_id *ids, size_t n,
                         uint8_t flags, uint8_t final_flags);
/* old_applied, when not NULL, counts the records applied (not stale)
 * older than the writes in flight of a round whose snapshot was read at
 * snap_ticks (repl_round_old); refused, when not NULL, is set to the
 * number of records the store refused (neither applied nor stale). */
int repl_apply_records(struct repl *r, const uint8_t *p, size_t len,
                       const riblt_id *wanted, size_t nwanted,
                       uint64_t snap_ticks, uint64_t *old_applied,
                       uint32_t *refused);
/* The peer listener's callback (evconnlistener_cb). */
void repl_on_accept(struct evconnlistener *lis, evutil_socket_t fd,
                    struct sockaddr *sa, int socklen, void *arg);
void repl_peer_connect(struct repl *r, struct peer *p);

/* ================================================== repl_stream.c */

void repl_encoder_put(struct repl *r, riblt_encoder *enc);
void repl_encoder_spares_tick(struct repl *r, uint64_t now);
riblt_encoder *repl_stream_walk(struct repl *r, const uint32_t *parts,
                                size_t nparts, int64_t size_hint,
                                int64_t *size);
int repl_stream_symbols(struct repl *r, const riblt_symbol *snap,
                        riblt_encoder *enc, uint64_t offset, riblt_symbol *out,
                        size_t n);

/* =================================================== repl_serve.c */

int repl_serve(struct conn *c, const repl_frame *f);
void repl_bulk_continue(struct conn *c);
bool repl_in_round(struct repl *r, const struct conn *except, uint64_t now);

/* =================================================== repl_round.c */

void repl_round_start(struct repl *r, struct peer *p);
void repl_round_reset(struct peer *p);
void repl_round_fail(struct peer *p, const char *why);
/* Rounds from the next tick on, at every tick (ROUND_BACKOFF_MAX). */
void repl_rounds_wanted(struct repl *r);
/* Whether a write of version `ticks` is older than the writes a round
 * that read its snapshot at snap_ticks may find still in flight. */
bool repl_round_old(uint64_t snap_ticks, uint64_t ticks);
int repl_on_reply(struct conn *c, const repl_frame *f);
/* Ends the decoding: pushes the ids only we hold, fetches those only the
 * peer holds (checked against our journal first). */
int repl_round_exchange(struct repl *r, struct peer *p, const riblt_id *remote,
                        size_t nr, const riblt_id *local, size_t nl);
/* Goes on with R-IBLT symbols after symbol 0 (the power sums gave up). */
int repl_round_more_symbols(struct repl *r, struct peer *p);

/* ==================================================== repl_psum.c */

/* After symbol 0 left the difference undecoded: 1 when the power-sum
 * phase began, 0 when it cannot cover the difference (go on with R-IBLT),
 * -1 when a send failed. */
int repl_psum_begin(struct repl *r, struct peer *p, const riblt_symbol *diff0,
                    int64_t remote_size);
/* A PSUMS reply on an outgoing connection. */
int repl_psum_on_reply(struct repl *r, struct peer *p, const uint8_t *q,
                       size_t len);

/* ==================================================== repl_push.c */

/* The store listener (store_listener_fn): runs on client worker threads. */
void repl_on_change(void *arg, store_item *it, bool origin_local);
/* The wake event's callback: drains the push queue. */
void repl_on_wake(evutil_socket_t fd, short what, void *arg);
void repl_on_push_timer(evutil_socket_t fd, short what, void *arg);
void repl_push_tick(struct repl *r);
void repl_push_catch_up(struct repl *r, struct peer *p);
/* A peer's link is ready: an idle push window gives way to a short one. */
void repl_push_peer_up(struct repl *r);
/* The push log: set up (false without memory) and freed. */
bool repl_pushlog_init(struct repl *r);
void repl_pushlog_free(struct repl *r);
/* Acknowledgements: p's link came up (what was taken before went to it
 * on no link of this one); p said it applied the push of ticket t. */
void repl_ack_link_up(struct repl *r, const struct peer *p);
void repl_ack_note(struct repl *r, const struct peer *p, uint64_t t);
/* A link came up: rounds wait RESUME_QUIET_NS (with a push log). */
void repl_resume_quiet(struct repl *r, uint64_t now);
/* The receiving side: a push frame of node's, at run/seq, was applied. */
void repl_resume_note(struct repl *r, uint32_t node, uint64_t run,
                      uint64_t seq);
/* The receiving side, once the peer's link to us is ready: RESUME. */
void repl_resume_ask(struct conn *c);
/* The receiving side: the peer's RESUME answer came (its resend is in). */
int repl_resume_done(struct conn *c, const uint8_t *p, size_t len);
/* Whether rounds wait for resumes (the quiet after a link came up, or a
 * resume under way). */
bool repl_resume_waiting(struct repl *r, uint64_t now);
/* The pushing side: p (whose own run is their_run) asked to resume after
 * run/seq. */
void repl_resume_serve(struct repl *r, struct peer *p, uint64_t run,
                       uint64_t seq, uint64_t their_run);

/* ======================================================== repl.c */

void repl_arm_redial(struct repl *r, uint32_t ms);

/* =================================================== repl_place.c */

void repl_parts_mark_ready(struct repl *r, const uint32_t *parts, size_t n);
size_t repl_round_parts(struct repl *r, uint32_t peer, uint32_t *out);
size_t repl_parts_bitmap_size(const struct repl *r);
void repl_ring_refresh(struct repl *r, uint64_t now);
void repl_handoff_tick(struct repl *r, uint64_t now);
void repl_route_free(struct route *rt);
int repl_placement_setup(struct repl *r, char *err, size_t nerr);

/* =================================================== repl_peers.c */

bool repl_peer_ready(const struct peer *p);
void repl_peer_lost(struct peer *p, const char *why);
void repl_peer_free(struct peer *p);
/* The registry client's callbacks (registry_view_fn, registry_ping_fn). */
void repl_on_view(void *arg, const registry_member *m, size_t n,
                  const char *source);
/* peers_dns's and etcd's views (registry_view_fn). */
void repl_on_dns_view(void *arg, const registry_member *m, size_t n,
                      const char *source);
void repl_on_etcd_view(void *arg, const registry_member *m, size_t n,
                       const char *source);
int repl_on_ping(void *arg, uint32_t target, uint64_t token);

/* =================================================== repl_health.c */

enum repl_health {
    REPL_HEALTH_CONVERGED = 0,
    REPL_HEALTH_CATCHING_UP,
    REPL_HEALTH_ISOLATED,
};

void repl_health_tick(struct repl *r, uint64_t now);

#endif /* REPL_INT_H */
