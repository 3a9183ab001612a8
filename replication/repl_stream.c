/*
 * repl_stream.c -- the coded symbol stream of one side of a round, which
 * both the responder (repl_serve.c) and the initiator (repl_round.c) read:
 * the first S symbols from a snapshot of the store's sketch, the rest from
 * an encoder over the journal, built when first needed. Encoders are kept
 * in a small pool between rounds.
 *
 * Threading: replication thread only.
 */
#include "repl_int.h"

#include <stdlib.h>

/* Adds each journal id to an encoder (store_journal_tails_parts callback). */
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
 * Returns an encoder to the spares (emptied) or frees it. Fresh memory is
 * expensive to fault in at a million ids, so a couple of encoders are kept
 * for the next rounds.
 */
void repl_encoder_put(struct repl *r, riblt_encoder *enc)
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

/*
 * Builds an encoder over the current journal, positioned at offset. Each
 * id starts where the store's sketch walk left its mapping, so nothing
 * below the sketch is walked again. The journal may have moved since the
 * sketch snapshot; a round that mixes the two fails to decode and the next
 * round retries.
 */
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
        repl_encoder_put(r, tv.enc);
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
int repl_stream_symbols(struct repl *r, const riblt_symbol *snap,
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
