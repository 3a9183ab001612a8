/*
 * repl_serve.c -- the responder: what a node does for the rounds its
 * peers run against it on their incoming connections. It serves coded
 * symbols from one sketch snapshot per round (repl_stream.c), fetches and
 * bulk transfers of records, takes the records pushed to it, and checks
 * that a round's partitions are ones it owns under the same ring.
 *
 * Threading: replication thread only.
 */
#include "repl_int.h"

#include <stdlib.h>
#include <string.h>

/* ========================================================== responder */

static void send_error(struct conn *c, uint32_t code, const char *text)
{
    size_t n = strlen(text);
    if (!repl_link_ready(c->link) || !repl_scratch_fit(c->r, n + 4))
        return;
    uint8_t *p = repl_payload_area(c->r);
    repl_wire_put_u32(p, code);
    memcpy(p + 4, text, n);
    repl_conn_send(c, REPL_MSG_ERROR, (uint32_t)(n + 4));
}

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

/*
 * The responder's side of a new round's partition list: the initiator's
 * ring fingerprint must equal ours and every partition listed must be one
 * we own (or the global one). Fills c->parts. Returns 0, or -1 (then a
 * REPL_ERROR_RING error is due).
 */
static int parts_accept(struct conn *c, const uint8_t *q, size_t len)
{
    struct repl *r = c->r;
    if (!c->parts &&
        !(c->parts = malloc(((size_t)r->P + 1) * sizeof(*c->parts))))
        return -1;
    c->nparts = 0;
    c->parts_gen = r->ring_gen;
    if (!repl_partitioned(r)) {
        if (len != 0)
            return -1;
        c->parts[c->nparts++] = 0;
        return 0;
    }
    size_t nbm = repl_parts_bitmap_size(r);
    uint64_t fingerprint;
    const uint8_t *bm;
    if (repl_wire_get_ring_part(q, len, nbm, &fingerprint, &bm) !=
            REPL_WIRE_OK ||
        fingerprint != ring_fingerprint(r->ring))
        return -1;
    for (uint32_t p = 0; p < (uint32_t)nbm * 8; p++) {
        if (!(bm[p / 8] & (1u << (p % 8))))
            continue;
        if (p > r->P || (p < r->P && !r->owned[p]))
            return -1;
        c->parts[c->nparts++] = p;
    }
    return c->nparts > 0 ? 0 : -1;
}

/*
 * True while this node takes part in a round other than the one on
 * connection `except`: one it runs, or one it serves. A node takes part
 * in one round at a time, so that two peers never both send it the same
 * missing mutations.
 */
bool repl_in_round(struct repl *r, const struct conn *except, uint64_t now)
{
    /* A link just came up: resumes first (repl_resume_quiet). */
    if (repl_resume_waiting(r, now))
        return true;
    for (int i = 0; i < r->npeers; i++)
        if (r->peers[i].round.active)
            return true;
    for (struct conn *c = r->incoming; c; c = c->next)
        if (c != except && repl_link_ready(c->link) &&
            c->serving_since_ns != 0 &&
            now - c->serving_since_ns <
                (uint64_t)r->o.round_timeout_ms * 1000000ull)
            return true;
    return false;
}

/*
 * The request that opens a round (offset 0): checks its partitions, then
 * takes what serves the whole round: one copy of the sketch, or, when the
 * initiator asks for a walked round, an encoder over one walk of the set.
 * Returns 0 (the round is open), 1 (refused with an ERROR, the link
 * stays) or -1.
 */
static int round_open(struct conn *c, const repl_wire_symbols_req *req)
{
    struct repl *r = c->r;
    uint64_t now = repl_now_ns();
    if (parts_accept(c, req->rest, req->nrest) != 0) {
        PST_ADD(&r->st, ring_mismatch, 1);
        send_error(c, REPL_ERROR_RING, "ring mismatch");
        return 1;
    }
    if (repl_in_round(r, c, now)) {
        PST_ADD(&r->st, refused_busy, 1);
        c->serving_since_ns = 0;
        send_error(c, REPL_ERROR_BUSY, "in another round");
        return 1;
    }
    repl_encoder_put(r, c->enc);
    c->enc = NULL;
    c->walk = (req->flags & REPL_SYMBOLS_WALK) != 0;
    c->snap_ps_ok = false;
    if (c->walk) {
        int64_t hint = 0;
        store_sketch_read_parts(r->s, c->parts, c->nparts, 0, NULL, 0, &hint);
        c->enc = repl_stream_walk(r, c->parts, c->nparts, hint, &c->snap_size);
        if (!c->enc)
            return -1;
        PST_ADD(&r->st, served_walks, 1);
    } else {
        if (!c->snap && !(c->snap = malloc(r->S * sizeof(riblt_symbol))))
            return -1;
        /* The power sums come from the same reads as the sketch: the
         * initiator checks what it decodes from them against symbol 0. */
        if (store_has_psums(r->s) && !c->snap_ps)
            c->snap_ps = malloc((RIBLT_PSUM_SIZE + RIBLT_PSUM_TERMS) *
                                sizeof(riblt_id));
        riblt_id *ps = store_has_psums(r->s) ? c->snap_ps : NULL;
        if (store_sketch_snapshot_parts(r->s, c->parts, c->nparts, c->snap,
                                        r->S, ps, &c->snap_size) != STORE_OK)
            return -1;
        if (ps)
            riblt_psum_combine(ps, ps + RIBLT_PSUM_SIZE);
        c->snap_ps_ok = ps != NULL;
    }
    c->serving_since_ns = now;
    return 0;
}

static int serve_symbols(struct conn *c, const uint8_t *p, size_t len)
{
    struct repl *r = c->r;
    repl_wire_symbols_req req;
    if (repl_wire_get_symbols_req(p, len, &req) != REPL_WIRE_OK)
        return -1;
    uint64_t offset = req.offset;
    uint32_t count = req.count;
    /* Only the request that opens a round carries more (its ring part
     * and flags); a round from the sketch ends where the sketch does. */
    bool walk = offset == 0 ? (req.flags & REPL_SYMBOLS_WALK) != 0 : c->walk;
    uint64_t end = walk || r->S > r->o.max_symbols ? r->o.max_symbols : r->S;
    if (count == 0 || count > BATCH_MAX || offset > end ||
        count > end - offset ||
        (offset != 0 && (req.nrest != 0 || req.flags != 0))) {
        send_error(c, REPL_ERROR_GENERIC, "symbol request out of bounds");
        return -1;
    }
    if (offset != 0 && c->serving_since_ns == 0)
        return -1; /* a round begins at offset 0 */
    if (offset == 0) {
        int rc = round_open(c, &req);
        if (rc != 0)
            return rc < 0 ? -1 : 0;
    }
    size_t body =
        REPL_WIRE_SYMBOLS_FIXED + (size_t)count * RIBLT_SYMBOL_WIRE_SIZE;
    if (!repl_scratch_fit(r, body))
        return -1;
    uint8_t *out = repl_payload_area(r);
    size_t head = repl_wire_put_symbols_head(out, offset, c->snap_size);
    /* One call for the whole batch: the encoder walks it in one pass. */
    if (repl_stream_symbols(r, c->walk ? NULL : c->snap, c->enc, offset,
                            r->syms, count) != 0)
        return -1;
    riblt_symbols_encode(r->syms, count, out + head,
                         (size_t)count * RIBLT_SYMBOL_WIRE_SIZE);
    PST_ADD(&r->st, served_symbol_requests, 1);
    PST_ADD(&r->st, served_symbols, count);
    return repl_conn_send(c, REPL_MSG_SYMBOLS, (uint32_t)body);
}

/* Terms of the round's power sums, from the snapshot its sketch was read
 * with; none (count 0) when this node keeps no power sums. */
static int serve_psums(struct conn *c, const uint8_t *p, size_t len)
{
    struct repl *r = c->r;
    repl_wire_psums req;
    if (repl_wire_get_psums_req(p, len, &req) != REPL_WIRE_OK ||
        c->serving_since_ns == 0 || c->walk)
        return -1;
    unsigned count = c->snap_ps_ok ? req.count : 0;
    size_t body =
        REPL_WIRE_PSUMS_FIXED + (size_t)count * RIBLT_PSUM_TERM_WIRE_SIZE;
    if (!repl_scratch_fit(r, body))
        return -1;
    uint8_t *out = repl_payload_area(r);
    size_t at =
        repl_wire_put_psums_head(out, req.bucket, req.first, (uint8_t)count);
    size_t slot =
        req.bucket == REPL_PSUMS_ALL ? RIBLT_PSUM_BUCKETS : req.bucket;
    const riblt_id *t = c->snap_ps_ok
                            ? c->snap_ps + slot * RIBLT_PSUM_TERMS + req.first
                            : NULL;
    for (unsigned i = 0; i < count; i++)
        riblt_id_to_bytes(&t[i], out + at + i * RIBLT_PSUM_TERM_WIRE_SIZE);
    PST_ADD(&r->st, served_psum_terms, count);
    return repl_conn_send(c, REPL_MSG_PSUMS, (uint32_t)body);
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
    repl_send_records(c, ids, n, 0, REPL_MUT_FINAL);
    free(ids);
    PST_ADD(&c->r->st, served_fetches, 1);
    return 0;
}

/* Sends the next slice of a bulk transfer; called as the output drains. */
void repl_bulk_continue(struct conn *c)
{
    while (c->bulk_ids && repl_link_output_length(c->link) < BULK_LOW_WATER) {
        size_t k = c->bulk_n - c->bulk_pos;
        if (k > 4096)
            k = 4096;
        bool last = c->bulk_pos + k == c->bulk_n;
        repl_send_records(c, c->bulk_ids + c->bulk_pos, k, REPL_MUT_BULK,
                          last ? REPL_MUT_FINAL : 0);
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
    repl_bulk_continue(c);
    return 0;
}

/* A request (or push) on an incoming, authenticated connection. */
int repl_serve(struct conn *c, const repl_frame *f)
{
    switch (f->type) {
    case REPL_MSG_SYMBOLS_REQ:
        return serve_symbols(c, f->payload, f->length);
    case REPL_MSG_FETCH:
        return serve_fetch(c, f->payload, f->length);
    case REPL_MSG_PSUMS_REQ:
        return serve_psums(c, f->payload, f->length);
    case REPL_MSG_BULK_REQ:
        return f->length == 0 ? serve_bulk(c) : -1;
    case REPL_MSG_MUTATIONS: {
        uint64_t run, seq, ticket;
        uint32_t refused = 0;
        int n = repl_apply_records(c->r, f->payload, f->length, NULL, 0, 0,
                                   NULL, &refused);
        if (n < 0)
            return -1;
        /* An eager push: remember how far this peer's pushes reached. */
        if (repl_wire_get_mutations_pos(f->payload, f->length, &run, &seq) ==
            REPL_WIRE_OK)
            repl_resume_note(c->r, repl_link_peer_id(c->link), run, seq);
        /* Its sender waits for a peer to hold these writes: confirm, unless
         * the store refused one (the sender's wait then ends in a timeout,
         * or in another peer's confirmation). */
        if (repl_wire_get_mutations_ticket(f->payload, f->length, &ticket) ==
                REPL_WIRE_OK &&
            refused == 0) {
            uint8_t *q = repl_payload_area(c->r);
            return repl_conn_send(c, REPL_MSG_PUSH_ACK,
                                  (uint32_t)repl_wire_put_push_ack(q, ticket));
        }
        return 0;
    }
    case REPL_MSG_DONE:
        c->serving_since_ns = 0;
        repl_encoder_put(c->r, c->enc);
        c->enc = NULL;
        /* A streamed round ends with everything the initiator held in
         * these partitions pushed here: ours are caught up. Not so after
         * a bulk pull, which only moved data the other way, nor after an
         * abandoned round. */
        if (repl_partitioned(c->r) && c->parts &&
            c->parts_gen == c->r->ring_gen &&
            (f->length == 0 || f->payload[0] == REPL_DONE_STREAMED))
            repl_parts_mark_ready(c->r, c->parts, c->nparts);
        return 0;
    case REPL_MSG_INFO:
        return 0; /* the dialling side's: peers are learnt by dialling */
    case REPL_MSG_RESUME:
        return repl_resume_done(c, f->payload, f->length);
    case REPL_MSG_ROUND_PLEASE: {
        /* A peer far behind us asks us to run the round (our symbols go
         * to it no more: its symbols come to us, our records to it). */
        if (f->length != 0)
            return -1;
        uint32_t id = repl_link_peer_id(c->link);
        uint64_t now = repl_now_ns();
        for (int i = 0; i < c->r->npeers; i++) {
            struct peer *p = &c->r->peers[i];
            if (!p->self && !p->vacant && p->node_id == id &&
                repl_peer_ready(p)) {
                PST_ADD(&p->st, rounds_asked, 1);
                if (!repl_in_round(c->r, NULL, now)) {
                    repl_round_start(c->r, p);
                } else if (repl_resume_waiting(c->r, now)) {
                    /* Waiting for resumes: its round comes after. */
                    p->round_due = true;
                    p->due_retries = 0;
                }
                break;
            }
        }
        return 0;
    }
    case REPL_MSG_PING:
        /* An indirect probe of the registry, relayed by another member. */
        if (f->length != 8)
            return -1;
        memcpy(repl_payload_area(c->r), f->payload, 8);
        return repl_conn_send(c, REPL_MSG_PONG, 8);
    default:
        return -1;
    }
}
