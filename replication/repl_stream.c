/*
 * repl_stream.c -- the coded symbol stream of one side of a round, which
 * both the responder (repl_serve.c) and the initiator (repl_round.c) read:
 * either a copy of the first S symbols of the store's sketch, or, for a
 * walked round, an encoder over one walk of the set. A round never mixes
 * the two: the sketch and a walk are the set at different instants.
 * Encoders are kept in a small pool between rounds.
 *
 * Threading: replication thread only.
 */
#include "repl_int.h"

#include <stdlib.h>
#include <string.h>

/* Adds each id of a set snapshot to an encoder (store_journal_ids_parts
 * callback). */
struct encfill {
    riblt_encoder *enc;
    bool failed;
};

static void add_id(void *arg, const riblt_id *id)
{
    struct encfill *ef = arg;
    if (riblt_encoder_add(ef->enc, id) != RIBLT_OK)
        ef->failed = true;
}

/*
 * Returns an encoder to the spares (emptied) or frees it. Fresh memory is
 * expensive to fault in at a million ids, so a couple of encoders are kept
 * for the next rounds: walked rounds come in runs (a node catching up),
 * and repl_encoder_spares_tick frees them once a run is over.
 */
void repl_encoder_put(struct repl *r, riblt_encoder *enc)
{
    if (!enc)
        return;
    if (r->nspare < ENCODER_SPARES) {
        riblt_encoder_reset(enc);
        r->spare[r->nspare++] = enc;
        r->spare_at_ns = repl_now_ns();
        return;
    }
    riblt_encoder_destroy(enc);
}

/*
 * Frees the spare encoders ENCODER_SPARE_NS after the last was put back
 * (called every tick). They hold memory outside -m: two encoders over half
 * a million ids were 100 MiB that a -m 64 node kept for good after one
 * burst of walked rounds.
 */
void repl_encoder_spares_tick(struct repl *r, uint64_t now)
{
    if (r->nspare == 0 || now - r->spare_at_ns < ENCODER_SPARE_NS)
        return;
    while (r->nspare > 0)
        riblt_encoder_destroy(r->spare[--r->nspare]);
    PST_ADD(&r->st, encoder_spares_freed, 1);
}

static riblt_encoder *encoder_get(struct repl *r, size_t cap)
{
    if (r->nspare > 0)
        return r->spare[--r->nspare];
    return riblt_encoder_create(cap);
}

/*
 * An encoder over one snapshot of the set of the listed partitions
 * (store_journal_ids_parts: one walk, in which no id is listed twice),
 * positioned at symbol 0; *size gets the number of ids. Every symbol of a
 * walked round comes from it, so the stream is that of one set, whatever
 * writes land meanwhile. size_hint sizes a fresh encoder.
 */
riblt_encoder *repl_stream_walk(struct repl *r, const uint32_t *parts,
                                size_t nparts, int64_t size_hint,
                                int64_t *size)
{
    struct encfill ef = {encoder_get(r, size_hint > 0 ? (size_t)size_hint : 0),
                         false};
    if (!ef.enc)
        return NULL;
    size_t n = store_journal_ids_parts(r->s, parts, nparts, add_id, &ef);
    if (ef.failed || riblt_encoder_seek(ef.enc, 0) != RIBLT_OK) {
        repl_encoder_put(r, ef.enc);
        return NULL;
    }
    *size = (int64_t)n;
    PST_ADD(&r->st, encoder_builds, 1);
    return ef.enc;
}

/*
 * Fills out[0..n) with symbols [offset, offset+n) of one side's stream:
 * from snap, a copy of the first S symbols of the sketch (then offset + n
 * must not pass S), or, snap NULL, from enc (repl_stream_walk).
 */
int repl_stream_symbols(struct repl *r, const riblt_symbol *snap,
                        riblt_encoder *enc, uint64_t offset, riblt_symbol *out,
                        size_t n)
{
    if (snap) {
        if (offset > r->S || n > r->S - offset)
            return -1;
        memcpy(out, snap + offset, n * sizeof(*out));
        return 0;
    }
    if (!enc)
        return -1;
    if (riblt_encoder_position(enc) != offset &&
        riblt_encoder_seek(enc, offset) != RIBLT_OK)
        return -1;
    return riblt_encoder_produce(enc, out, n) == RIBLT_OK ? 0 : -1;
}
