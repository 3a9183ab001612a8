/*
 * repl_psum.c -- the power-sum phase of a round (initiator side): a
 * difference too small for R-IBLT to be cheap is decoded from the two
 * sides' power sums (riblt_psum.h), 16 bytes a difference, before any
 * coded symbol past symbol 0 is asked for.
 *
 * The phase asks for the sum of the buckets' terms first, a few at a
 * time: that decodes a difference of up to RIBLT_PSUM_TERMS - 1 ids. Past
 * that, every bucket is asked for its own terms, each decoding about an
 * eighth of the difference. Whatever it finds must add up to symbol 0 of
 * the difference (XOR of the ids and of their hashes), the sketch and the
 * sums being read together on both sides; then the round ends as a decoded
 * one does (repl_round_exchange). When a bucket runs out of terms, the
 * peer keeps no power sums, or the check fails, the round goes on with
 * R-IBLT symbols from symbol 1: the terms it took are the price.
 *
 * Threading: replication thread only.
 */
#include "repl_int.h"

#include <stdlib.h>
#include <string.h>

/* Symbol 0's counts give a lower bound on the difference: past this, the
 * buckets would run out of terms, and R-IBLT is taken at once. */
#define PSUM_COVER (RIBLT_PSUM_BUCKETS * RIBLT_PSUM_TERMS / 2)

/* Terms asked for the first time, per bucket, once the sum of the
 * buckets did not decode (the difference is then 32 or more, 4 or more a
 * bucket). */
#define PSUM_BUCKET_FIRST 6

static int ask(struct repl *r, struct peer *p, unsigned slot, unsigned count)
{
    struct psum_round *ps = p->round.ps;
    unsigned first = ps->have[slot];
    if (count > RIBLT_PSUM_TERMS - first)
        count = RIBLT_PSUM_TERMS - first;
    uint8_t *q = repl_payload_area(r);
    size_t len = repl_wire_put_psums_head(
        q, slot == RIBLT_PSUM_BUCKETS ? REPL_PSUMS_ALL : (uint8_t)slot,
        (uint8_t)first, (uint8_t)count);
    ps->inflight++;
    return repl_conn_send(p->conn, REPL_MSG_PSUMS_REQ, (uint32_t)len);
}

/* The next request for a slot that did not decode from `have` terms:
 * about half as many again, at least two (each round trip costs two
 * frames and a decoding, each term past the one that decodes 16 bytes). */
static unsigned step(unsigned have)
{
    return have / 2 > 2 ? have / 2 : 2;
}

/* Gives up on power sums; R-IBLT once no reply is in flight. */
static int give_up(struct repl *r, struct peer *p)
{
    struct psum_round *ps = p->round.ps;
    if (!ps->failed) {
        ps->failed = true;
        ps->hint = 0;
        PST_ADD(&p->st, psum_fallbacks, 1);
    }
    if (ps->inflight > 0)
        return 0;
    ps->on = false;
    return repl_round_more_symbols(r, p);
}

/*
 * Every bucket decoded (or the sum did): check against symbol 0, then
 * exchange. The terms carry no sign, so which side held an id at the
 * snapshots is read off our set as it is now. An id we do not hold is
 * asked for: if the peer no longer holds it either, nothing comes. An id
 * we hold is pushed, unless its version is later than our snapshot less
 * ROUND_RECENT_NS (repl_round_old): it may have reached us since our snapshot,
 * and the peer hold it already (a write the peer's snapshot has and ours has
 * not, a push in flight when the round began). Pushing it would cost the peer
 * a stale apply; if the peer really lacks it, push brings it, or the next
 * round, when it is no longer recent.
 */
static int finish(struct repl *r, struct peer *p)
{
    struct psum_round *ps = p->round.ps;
    riblt_id sum = {0, 0};
    uint64_t hash = 0;
    for (size_t i = 0; i < ps->nfound; i++) {
        sum.lo ^= ps->found[i].lo;
        sum.hi ^= ps->found[i].hi;
        hash ^= riblt_hash(&ps->found[i]);
    }
    if (!riblt_id_equal(&sum, &ps->diff0.sum) || hash != ps->diff0.hash)
        return give_up(r, p);
    /* Ids to push first in found, ids to ask for after them (one array,
     * two views); recent ones held are dropped from both. */
    size_t nl = 0, n = 0;
    for (size_t i = 0; i < ps->nfound; i++) {
        riblt_id id = ps->found[i];
        store_mutation m;
        store_item *hold = NULL;
        if (!store_fetch_mutation(r->s, &id, &m, &hold)) {
            ps->found[n++] = id;
            continue;
        }
        bool recent = !repl_round_old(p->round.snap_ticks, m.version.ticks);
        store_item_release(hold);
        if (recent) {
            PST_ADD(&p->st, psum_recent, 1);
            continue;
        }
        ps->found[n] = ps->found[nl];
        ps->found[nl++] = id;
        n++;
    }
    ps->hint = ps->nfound;
    ps->on = false;
    PST_ADD(&p->st, rounds_psum, 1);
    return repl_round_exchange(r, p, ps->found + nl, n - nl, ps->found, nl);
}

static int begin_buckets(struct repl *r, struct peer *p, uint64_t at_least)
{
    struct psum_round *ps = p->round.ps;
    ps->buckets = true;
    ps->nfound = 0;
    unsigned k = (unsigned)(at_least / RIBLT_PSUM_BUCKETS) + 2;
    if (k < PSUM_BUCKET_FIRST)
        k = PSUM_BUCKET_FIRST;
    for (unsigned b = 0; b < RIBLT_PSUM_BUCKETS; b++)
        if (ask(r, p, b, k) != 0)
            return -1;
    return 0;
}

int repl_psum_begin(struct repl *r, struct peer *p, const riblt_symbol *diff0,
                    int64_t remote_size)
{
    struct round *rd = &p->round;
    struct psum_round *ps = rd->ps;
    if (!ps || !ps->own_ok)
        return 0;
    uint64_t bound = (uint64_t)llabs(remote_size - rd->own_size);
    if (bound > PSUM_COVER)
        return 0;
    ps->on = true;
    ps->failed = false;
    ps->buckets = false;
    ps->inflight = 0;
    ps->diff0 = *diff0;
    ps->remote_size = remote_size;
    memset(ps->have, 0, sizeof(ps->have));
    ps->done = 0;
    ps->nfound = 0;
    /* The sum of the buckets decodes up to RIBLT_PSUM_TERMS - 1, from one
     * more term than the difference. Symbol 0 alone decodes one
     * difference, so there are two or more: three terms at least. The
     * last phase's difference is a guess, the sizes' a floor. */
    uint64_t guess = bound > ps->hint ? bound : ps->hint;
    if (guess + 1 >= RIBLT_PSUM_TERMS)
        return begin_buckets(r, p, guess) == 0 ? 1 : -1;
    unsigned k = guess + 2 > 3 ? (unsigned)guess + 2 : 3;
    return ask(r, p, RIBLT_PSUM_BUCKETS, k) == 0 ? 1 : -1;
}

int repl_psum_on_reply(struct repl *r, struct peer *p, const uint8_t *q,
                       size_t len)
{
    struct round *rd = &p->round;
    struct psum_round *ps = rd->ps;
    repl_wire_psums w;
    if (repl_wire_get_psums(q, len, &w) != REPL_WIRE_OK)
        return -1;
    if (!rd->active || !ps || !ps->on || ps->inflight == 0)
        return 0; /* a reply to a round given up since */
    unsigned slot = w.bucket == REPL_PSUMS_ALL ? RIBLT_PSUM_BUCKETS : w.bucket;
    if (w.first != ps->have[slot] ||
        (slot == RIBLT_PSUM_BUCKETS) == ps->buckets)
        return -1; /* not what was asked for */
    ps->inflight--;
    PST_ADD(&p->st, psum_terms_recv, w.count);
    if (w.count == 0) /* the peer keeps none */
        return give_up(r, p);
    riblt_id *d = ps->diff + slot * RIBLT_PSUM_TERMS + w.first;
    const riblt_id *own = ps->own + slot * RIBLT_PSUM_TERMS + w.first;
    for (unsigned i = 0; i < w.count; i++) {
        riblt_id_from_bytes(&d[i], w.terms + i * RIBLT_PSUM_TERM_WIRE_SIZE);
        d[i].lo ^= own[i].lo;
        d[i].hi ^= own[i].hi;
    }
    ps->have[slot] = (uint8_t)(ps->have[slot] + w.count);
    if (ps->failed)
        return give_up(r, p);

    size_t room = sizeof(ps->found) / sizeof(ps->found[0]) - ps->nfound;
    size_t n = 0;
    int rc =
        riblt_psum_decode(ps->diff + slot * RIBLT_PSUM_TERMS, ps->have[slot],
                          ps->found + ps->nfound, room, &n);
    if (rc == RIBLT_NEED_MORE) {
        if (ps->have[slot] < RIBLT_PSUM_TERMS)
            return ask(r, p, slot, step(ps->have[slot]));
        if (slot == RIBLT_PSUM_BUCKETS)
            return begin_buckets(r, p, RIBLT_PSUM_TERMS);
        return give_up(r, p);
    }
    if (rc != RIBLT_OK)
        return give_up(r, p);
    if (slot == RIBLT_PSUM_BUCKETS) {
        ps->nfound = n;
        return finish(r, p);
    }
    /* A bucket's ids are the bucket's: anything else is not two sets. */
    for (size_t i = 0; i < n; i++)
        if (riblt_psum_bucket(riblt_hash(&ps->found[ps->nfound + i])) != slot)
            return give_up(r, p);
    ps->nfound += n;
    ps->done |= (uint16_t)(1u << slot);
    if (ps->done == (1u << RIBLT_PSUM_BUCKETS) - 1)
        return finish(r, p);
    return 0;
}
