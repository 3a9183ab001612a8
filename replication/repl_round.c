/*
 * repl_round.c -- the initiator: the round this node runs with one peer
 * over its outgoing connection. It streams coded symbols from the peer,
 * subtracts its own (repl_stream.c) and decodes the difference, pulls a
 * bulk transfer instead when far behind, then pushes what only it holds,
 * fetches what only the peer holds and ends the round with DONE. The
 * peer's INFO, PONG and ERROR replies arrive here too.
 *
 * Threading: replication thread only. The peer's INFO is stored under
 * plock (the stats reader and the ring rebuild read it); the counters are
 * relaxed atomics.
 */
#include "repl_int.h"

#include <stdlib.h>
#include <string.h>

/* ========================================================== initiator */

void repl_round_reset(struct peer *p)
{
    struct round *rd = &p->round;
    rd->active = false;
    rd->bulk = false;
    rd->walk = false;
    rd->ndiffs = 0;
    rd->nwanted = 0;
    rd->fetch_frames = 0;
    rd->decoded = 0;
    if (rd->ps) {
        rd->ps->on = false;
        rd->ps->own_ok = false;
    }
    repl_encoder_put(p->r, rd->own_enc);
    rd->own_enc = NULL;
    /* What a round grew for a big difference goes with it: a decoder
     * grown towards repl_max_symbols, the difference symbols kept to
     * refeed it and the ids fetched take memory in proportion (51 MB on
     * a -m 64 node after one such round), and a node that kept them would
     * hold that beyond -m until its next big round. The next round starts from
     * DECODER_FIRST again, lazily (decoder_grow). */
    if (rd->dec_cap > DECODER_FIRST) {
        riblt_decoder_destroy(rd->dec);
        rd->dec = NULL;
        rd->dec_cap = 0;
        PST_SET(&p->st, decoder_symbols, 0);
    } else if (rd->dec) {
        riblt_decoder_reset(rd->dec);
    }
    if (rd->diffs_cap > DECODER_FIRST) {
        free(rd->diffs);
        rd->diffs = NULL;
        rd->diffs_cap = 0;
    }
    free(rd->wanted); /* allocated by each round's exchange */
    rd->wanted = NULL;
}

/* Ends the round unrun or unfinished; the peer is told when the link is
 * up, so it stops serving it. */
static void round_abandon(struct peer *p)
{
    bool tell = p->round.active && repl_peer_ready(p);
    repl_round_reset(p);
    if (tell) {
        *repl_payload_area(p->r) = REPL_DONE_ABANDONED;
        repl_conn_send(p->conn, REPL_MSG_DONE, 1);
    }
}

bool repl_round_old(uint64_t snap_ticks, uint64_t ticks)
{
    return snap_ticks > ROUND_RECENT_NS &&
           ticks <= snap_ticks - ROUND_RECENT_NS;
}

/* round_backoff is written here only, on the replication thread; `stats`
 * reads it from a client thread (repl_stats.c). */
static void set_backoff(struct repl *r, unsigned b)
{
    __atomic_store_n(&r->round_backoff, b, __ATOMIC_RELAXED);
}

void repl_rounds_wanted(struct repl *r)
{
    set_backoff(r, 0);
    r->round_ticks = 0;
}

void repl_round_fail(struct peer *p, const char *why)
{
    repl_rounds_wanted(p->r);
    uint32_t held = 0;
    if (log_limit_pass(&p->round_log, 10000, &held))
        LOG(LOG_LEVEL_WARN, "repl",
            "round with peer %s (node %u) failed: %s; %u more failed "
            "rounds since the last such line",
            p->name, (unsigned)p->node_id, why, (unsigned)held);
    PST_ADD(&p->st, rounds_failed, 1);
    round_abandon(p);
}

static void round_done(struct peer *p)
{
    struct round *rd = &p->round;
    struct repl *r = p->r;
    PST_ADD(&p->st, rounds_ok, 1);
    PST_SET(&p->st, last_success, repl_wall_s());
    PST_SET(&p->st, last_round_symbols, rd->ndiffs);
    PST_SET(&p->st, last_round_us, (repl_now_ns() - rd->started_ns) / 1000);
    LOG(LOG_LEVEL_DEBUG, "repl",
        "round with peer %s (node %u) done in %.1f ms: %llu differences",
        p->name, (unsigned)p->node_id,
        (double)(repl_now_ns() - rd->started_ns) / 1e6,
        (unsigned long long)rd->decoded);
    if (rd->bulk)
        LOG(LOG_LEVEL_INFO, "repl",
            "bulk transfer from peer %s (node %u) done in %.2f s: %llu "
            "records, %llu bytes received",
            p->name, (unsigned)p->node_id,
            (double)(repl_now_ns() - rd->started_ns) / 1e9,
            (unsigned long long)rd->decoded,
            (unsigned long long)(PST_GET(&p->st, bytes_recv) -
                                 rd->bulk_bytes0));
    /* Under an unchanged ring, the peer now holds everything we held in
     * these partitions when the round began (unless it was a bulk pull),
     * and we hold everything it held. */
    uint8_t bulk = rd->bulk ? REPL_DONE_BULK : REPL_DONE_STREAMED;
    /* Rounds back off once the last round with every ready peer was
     * idle: one that repaired something with a peer is followed by rounds
     * at every tick until that peer's next one finds nothing. */
    p->last_repaired = rd->bulk || rd->walk || rd->repaired > 0;
    if (!p->last_repaired)
        PST_ADD(&p->st, rounds_idle, 1);
    bool repairing = false;
    for (int i = 0; i < r->npeers; i++)
        if (repl_peer_ready(&r->peers[i]) && r->peers[i].last_repaired)
            repairing = true;
    if (repairing)
        repl_rounds_wanted(r);
    else if (r->round_backoff < ROUND_BACKOFF_MAX)
        set_backoff(r, r->round_backoff + 1);
    p->last_ok_ns = repl_now_ns();
    p->last_diffs = rd->decoded;
    PST_SET(&p->st, last_round_diffs, rd->decoded);
    if (repl_partitioned(r) && rd->gen == r->ring_gen) {
        repl_parts_mark_ready(r, rd->parts, rd->nparts);
        if (!bulk) {
            p->ok_started_ns = rd->started_ns;
            p->ok_gen = rd->gen;
        }
    }
    repl_round_reset(p);
    if (p->conn) {
        *repl_payload_area(r) = bulk;
        repl_conn_send(p->conn, REPL_MSG_DONE, 1);
    }
}

/*
 * Asks for symbols [offset, offset + count). The request that opens a
 * round (offset 0) also carries, when partitioned, our ring fingerprint
 * and the bitmap of the round's partitions.
 */
static int request_symbols(struct peer *p, uint64_t offset, uint32_t count,
                           uint32_t flags)
{
    struct conn *c = p->conn;
    struct repl *r = c->r;
    bool ring_part = offset == 0 && repl_partitioned(r);
    size_t nbm = ring_part ? repl_parts_bitmap_size(r) : 0;
    if (ring_part &&
        !repl_scratch_fit(r, REPL_WIRE_SYMBOLS_REQ_FIXED + 8 + nbm))
        return -1;
    uint8_t *q = repl_payload_area(r);
    size_t len = repl_wire_put_symbols_req(q, offset, count, flags);
    if (ring_part)
        len += repl_wire_put_ring_part(q + len, ring_fingerprint(r->ring),
                                       p->round.parts, p->round.nparts, nbm);
    p->round.requested = offset;
    return repl_conn_send(c, REPL_MSG_SYMBOLS_REQ, (uint32_t)len);
}

void repl_round_start(struct repl *r, struct peer *p)
{
    struct round *rd = &p->round;
    p->round_was_due = false; /* on_quiet_end sets it for its own */
    LOG(LOG_LEVEL_DEBUG, "repl", "round with peer %s (node %u) starts",
        p->name, (unsigned)p->node_id);
    if (!rd->own && !(rd->own = malloc(r->S * sizeof(riblt_symbol))))
        return;
    if (!rd->parts &&
        !(rd->parts = malloc(((size_t)r->P + 1) * sizeof(*rd->parts))))
        return;
    repl_round_reset(p);
    /* The start time is taken before the snapshot: a change to a
     * partition later than it may be missing from this round. */
    rd->started_ns = repl_now_ns();
    rd->gen = r->ring_gen;
    rd->nparts = repl_round_parts(r, p->node_id, rd->parts);
    /* Power sums from the same reads as the sketch: a psum phase checks
     * its result against symbol 0. */
    if (store_has_psums(r->s) && !rd->ps)
        rd->ps = calloc(1, sizeof(*rd->ps));
    riblt_id *own_ps =
        store_has_psums(r->s) ? (rd->ps ? rd->ps->own : NULL) : NULL;
    rd->snap_ticks = store_clock_now(r->s).ticks;
    rd->repaired = 0;
    if (store_sketch_snapshot_parts(r->s, rd->parts, rd->nparts, rd->own, r->S,
                                    own_ps, &rd->own_size) != STORE_OK)
        return;
    if (own_ps) {
        riblt_psum_combine(own_ps, own_ps + RIBLT_PSUM_SIZE);
        rd->ps->own_ok = true;
    }
    rd->active = true;
    PST_ADD(&p->st, rounds, 1);
    if (request_symbols(p, 0, BATCH_FIRST, 0) != 0)
        repl_round_fail(p, "send failed");
}

/*
 * Restarts the round as a walked one: the difference is past what the
 * sketch can decode, and symbols beyond the sketch must come from the
 * same set as the ones before them. Both sides now encode one walk of
 * their set from symbol 0 (the peer on our flag), so writes landing
 * meanwhile cannot make the stream inconsistent; they are left to push
 * and to the next round.
 */
static int round_walk(struct repl *r, struct peer *p, int64_t remote_size)
{
    struct round *rd = &p->round;
    rd->walk = true;
    rd->ndiffs = 0;
    if (rd->dec)
        riblt_decoder_reset(rd->dec);
    repl_encoder_put(r, rd->own_enc);
    rd->own_enc = repl_stream_walk(r, rd->parts, rd->nparts,
                                   rd->own_size > remote_size ? rd->own_size
                                                              : remote_size,
                                   &rd->own_size);
    if (!rd->own_enc)
        return -1;
    PST_ADD(&p->st, rounds_walked, 1);
    return request_symbols(p, 0, BATCH_MAX, REPL_SYMBOLS_WALK);
}

/* Grows the decoder, refeeding every difference symbol received so far. */
static int decoder_grow(struct repl *r, struct peer *p)
{
    struct round *rd = &p->round;
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
    PST_SET(&p->st, decoder_symbols, cap);
    if (cap > DECODER_FIRST)
        PST_ADD(&p->st, decoders_grown, 1);
    return 0;
}

static int cmp_id(const void *a, const void *b)
{
    return memcmp(a, b, sizeof(riblt_id));
}

/* The decoder finished: exchange what it found. */
static int round_exchange(struct repl *r, struct peer *p)
{
    size_t nr, nl;
    const riblt_id *remote = riblt_decoder_remote(p->round.dec, &nr);
    const riblt_id *local = riblt_decoder_local(p->round.dec, &nl);
    return repl_round_exchange(r, p, remote, nr, local, nl);
}

/*
 * Push what only we hold, fetch what only the peer holds. Ids are checked
 * against our journal first (invariant 7).
 */
int repl_round_exchange(struct repl *r, struct peer *p, const riblt_id *remote,
                        size_t nr, const riblt_id *local, size_t nl)
{
    struct round *rd = &p->round;
    PST_ADD(&p->st, diffs_remote, nr);
    PST_ADD(&p->st, diffs_local, nl);
    /* Ids only we hold that are older than writes in flight: the peer
     * lacked them, and pushing them repairs it. */
    for (size_t i = 0; i < nl && rd->repaired == 0; i++) {
        store_mutation m;
        store_item *hold = NULL;
        if (!store_fetch_mutation(r->s, &local[i], &m, &hold))
            continue;
        if (repl_round_old(rd->snap_ticks, m.version.ticks))
            rd->repaired++;
        store_item_release(hold);
    }
    rd->decoded = nr + nl;
    if (nl > 0) {
        size_t sent = repl_send_records(p->conn, local, nl, REPL_MUT_PUSH, 0);
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
        if (!repl_scratch_fit(r, k * 16))
            return -1;
        uint8_t *q = repl_payload_area(r);
        for (size_t i = 0; i < k; i++)
            riblt_id_to_bytes(&rd->wanted[at + i], q + 16 * i);
        repl_conn_send(p->conn, REPL_MSG_FETCH, (uint32_t)(k * 16));
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

/*
 * How many symbols to ask for next, `received` being those this round
 * has. Every symbol past the one that completes the decoding is waste, so
 * small rounds grow by small steps: after symbol 0, about what its counts
 * say the difference at least needs (4/3 of |R| - |I|, R-IBLT needing
 * about 1.35 symbols a difference) or BATCH_STEP; then a sixteenth of what
 * was received (at least BATCH_STEP), which bounds the waste by about a
 * sixteenth, until BATCH_FINE symbols; then a quarter (waste at most a
 * quarter, a dozen round trips from BATCH_FINE to a full sketch). A walked
 * round, whose difference is known to be large, asks BATCH_MAX a time.
 */
static uint64_t next_batch(const struct round *rd, uint64_t received,
                           int64_t remote_size)
{
    if (rd->walk)
        return BATCH_MAX;
    uint64_t count;
    if (received == BATCH_FIRST) {
        uint64_t bound = (uint64_t)llabs(remote_size - rd->own_size);
        count = bound * 4 / 3 > BATCH_STEP ? bound * 4 / 3 : BATCH_STEP;
    } else if (received < BATCH_FINE) {
        count = received / 16 > BATCH_STEP ? received / 16 : BATCH_STEP;
    } else {
        count = received / 4;
    }
    return count > BATCH_MAX ? BATCH_MAX : count;
}

static int more_symbols(struct repl *r, struct peer *p, uint64_t next,
                        int64_t rsize);

static int on_symbols(struct repl *r, struct peer *p, const uint8_t *q,
                      size_t len)
{
    struct round *rd = &p->round;
    repl_wire_symbols sy;
    if (!rd->active || rd->bulk ||
        repl_wire_get_symbols(q, len, &sy) != REPL_WIRE_OK)
        return -1;
    uint64_t offset = sy.offset;
    int64_t rsize = sy.set_size;
    size_t n = sy.n;
    if (offset != rd->requested || n == 0 || n > BATCH_MAX)
        return -1;
    PST_ADD(&p->st, symbols_recv, n);
    if (offset == 0 && !rd->walk &&
        (want_bulk(r, rd->own_size, rsize) || (p->bulk_next && rsize > 0))) {
        rd->bulk = true;
        rd->bulk_bytes0 = PST_GET(&p->st, bytes_recv);
        p->bulk_next = false;
        PST_ADD(&p->st, bulk_transfers, 1);
        LOG(LOG_LEVEL_INFO, "repl",
            "bulk transfer from peer %s (node %u): it holds %lld "
            "mutations, this node %lld",
            p->name, (unsigned)p->node_id, (long long)rsize,
            (long long)rd->own_size);
        return repl_conn_send(p->conn, REPL_MSG_BULK_REQ, 0);
    }
    /* Far behind the peer (it holds many more mutations): hand the round
     * over. We end ours and ask the peer to run one with us now; then
     * our symbols go to it and what we lack comes as records alone, so
     * the node that is behind receives only what it lacks. Only under
     * full replication: with a ring, the two sides' rounds cover
     * different partitions (a node's hand-off of partitions it lost
     * rides on the rounds it runs itself). */
    if (offset == 0 && !rd->walk && !repl_partitioned(r) &&
        rsize - rd->own_size > HAND_OVER_DIFF) {
        PST_ADD(&p->st, rounds_handed, 1);
        r->handed_ns = repl_now_ns();
        repl_round_reset(p);
        *repl_payload_area(r) = REPL_DONE_ABANDONED;
        if (repl_conn_send(p->conn, REPL_MSG_DONE, 1) != 0)
            return -1;
        return repl_conn_send(p->conn, REPL_MSG_ROUND_PLEASE, 0);
    }
    /* Symbol 0's counts bound the difference from below: past what the
     * sketch decodes, walk at once. */
    if (offset == 0 && !rd->walk &&
        (uint64_t)llabs(rsize - rd->own_size) * 3 / 2 > r->S)
        return round_walk(r, p, rsize);
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
    if (riblt_symbols_decode(sy.symbols, n * RIBLT_SYMBOL_WIRE_SIZE, remote,
                             n) != (long)n ||
        repl_stream_symbols(r, rd->walk ? NULL : rd->own, rd->own_enc, offset,
                            own, n) != 0)
        return -1;
    for (size_t i = 0; i < n; i++) {
        riblt_symbol *d = &rd->diffs[rd->ndiffs++];
        riblt_symbol_subtract(d, &remote[i], &own[i]);
        int rc = rd->dec ? riblt_decoder_add_diff(rd->dec, d) : RIBLT_ERR_FULL;
        if (rc == RIBLT_ERR_FULL) {
            rd->ndiffs--; /* refed below with the others */
            if (decoder_grow(r, p) != 0)
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
    if (rc != RIBLT_NEED_MORE) {
        /* Symbols that do not decode: the link is sound, the round not. */
        repl_round_fail(p, "inconsistent symbols");
        return 0;
    }
    /* A small difference: power sums cost half a symbol a difference
     * where R-IBLT's first symbols cost 1.6-1.75. */
    if (offset == 0 && !rd->walk && n == 1) {
        int begun = repl_psum_begin(r, p, &rd->diffs[0], rsize);
        if (begun != 0)
            return begun < 0 ? -1 : 0;
    }
    return more_symbols(r, p, offset + n, rsize);
}

int repl_round_more_symbols(struct repl *r, struct peer *p)
{
    return more_symbols(r, p, p->round.ndiffs, p->round.ps->remote_size);
}

/* Asks for the symbols after the first `next`, or walks, or gives up. */
static int more_symbols(struct repl *r, struct peer *p, uint64_t next,
                        int64_t rsize)
{
    struct round *rd = &p->round;
    if (next >= r->o.max_symbols) {
        /* Past the cap: the next round with this peer pulls a bulk
         * transfer, which has no cap. */
        p->bulk_next = true;
        repl_round_fail(p, "symbol cap reached");
        return 0;
    }
    uint64_t end =
        rd->walk || r->S > r->o.max_symbols ? r->o.max_symbols : r->S;
    if (next >= end)
        return round_walk(r, p, rsize);
    uint64_t count = next_batch(rd, next, rsize);
    if (count > end - next)
        count = end - next;
    return request_symbols(p, next, (uint32_t)count, 0);
}

static int on_mutations(struct repl *r, struct peer *p, const uint8_t *q,
                        size_t len)
{
    struct round *rd = &p->round;
    uint8_t flags;
    uint32_t count;
    if (!rd->active ||
        repl_wire_get_mutations_head(q, len, &flags, &count) != REPL_WIRE_OK)
        return -1;
    /* A fetched write applied here that is older than the writes in
     * flight was missing: a repair. */
    int n = rd->bulk ? repl_apply_records(r, q, len, NULL, 0, 0, NULL, NULL)
                     : repl_apply_records(r, q, len, rd->wanted, rd->nwanted,
                                          rd->snap_ticks, &rd->repaired, NULL);
    if (n < 0)
        return -1;
    PST_ADD(&p->st, mutations_fetched, n);
    if (rd->bulk)
        rd->decoded += (uint64_t)n; /* a bulk pull's difference, bounded */
    if (flags & REPL_MUT_FINAL) {
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
 * kept out of the ring (repl_ring_refresh).
 */
static int on_info(struct repl *r, struct peer *p, const uint8_t *q,
                   size_t len)
{
    repl_wire_info in;
    if (repl_wire_get_info(q, len, &in) != REPL_WIRE_OK ||
        in.naddr > REPL_LINK_ADDR_MAX)
        return -1;
    if (in.weight == 0 || in.weight > RING_MAX_WEIGHT)
        return -1;
    char name[REPL_LINK_ADDR_MAX + 1], err[256];
    struct sockaddr_storage ss;
    socklen_t sl = 0;
    memcpy(name, in.addr, in.naddr);
    name[in.naddr] = '\0';
    memset(&ss, 0, sizeof(ss));
    if (in.naddr > 0 && repl_link_resolve("client", name, in.naddr, &ss, &sl,
                                          err, sizeof(err)) != 0)
        return -1;
    pthread_mutex_lock(&r->plock);
    if (!p->info || strcmp(p->client, name) != 0 || p->weight != in.weight)
        r->republish = true;
    p->weight = in.weight;
    p->info_partitions = in.partitions;
    p->info_replicas = in.replicas;
    memcpy(p->client, name, in.naddr + 1);
    p->client_addr = ss;
    p->client_addrlen = sl;
    p->info = true;
    pthread_mutex_unlock(&r->plock);
    return 0;
}

/* A reply on an outgoing, authenticated connection. */
int repl_on_reply(struct conn *c, const repl_frame *f)
{
    struct peer *p = c->peer;
    switch (f->type) {
    case REPL_MSG_SYMBOLS:
        return on_symbols(c->r, p, f->payload, f->length);
    case REPL_MSG_MUTATIONS:
        return on_mutations(c->r, p, f->payload, f->length);
    case REPL_MSG_PSUMS:
        return repl_psum_on_reply(c->r, p, f->payload, f->length);
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
        if (f->length >= 4 &&
            repl_wire_get_u32(f->payload) == REPL_ERROR_RING &&
            p->round.active) {
            PST_ADD(&c->r->st, ring_mismatch, 1);
            repl_round_fail(p, "ring mismatch");
            return 0;
        }
        /* The peer is in another round: ours waits for a later tick. */
        if (f->length >= 4 &&
            repl_wire_get_u32(f->payload) == REPL_ERROR_BUSY &&
            p->round.active) {
            PST_ADD(&p->st, rounds_busy, 1);
            repl_round_reset(p);
            /* A round due after a link came back: the peer still waits
             * for resumes of its own; try again shortly. */
            if (p->round_was_due && p->due_retries < 8) {
                p->due_retries++;
                p->round_due = true;
                evloop_add_ms(c->r->quiet_end, 10);
            }
            p->round_was_due = false;
            return 0;
        }
        return -1;
    case REPL_MSG_INFO:
        return on_info(c->r, p, f->payload, f->length);
    case REPL_MSG_PUSH_ACK: {
        uint64_t ticket;
        if (repl_wire_get_push_ack(f->payload, f->length, &ticket) !=
            REPL_WIRE_OK)
            return -1;
        repl_ack_note(c->r, p, ticket);
        return 0;
    }
    case REPL_MSG_RESUME: {
        uint64_t run, seq, their_run;
        if (repl_wire_get_resume(f->payload, f->length, &run, &seq,
                                 &their_run) != REPL_WIRE_OK)
            return -1;
        repl_resume_serve(c->r, p, run, seq, their_run);
        return 0;
    }
    default:
        return -1;
    }
}
