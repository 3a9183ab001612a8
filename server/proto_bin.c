/*
 * proto_bin.c -- memcached's binary protocol, as a pure parser.
 *
 * proto_bin_execute() takes whole request packets from an input evbuffer,
 * runs them against the store and appends response packets to an output
 * evbuffer. It follows memcached's own server (the compatibility reference)
 * packet for packet: the same statuses, the same error texts in the value,
 * the same quiet-command rules and the same decisions about when a
 * malformed request ends the connection.
 *
 * Life of a request:
 *   1. Once the 24-byte header is in, it is judged on its own (bin_admit):
 *      framing errors close the connection after an error reply, as in
 *      memcached, because the stream cannot be trusted to resynchronize;
 *      requests that are well framed but refused (unknown opcode, value too
 *      large, SASL off) get their reply at once and their body is dropped as
 *      it arrives, never buffered.
 *   2. Otherwise the parser waits until the whole packet (bounded by the item
 *      size limit) is buffered, pulls it up into one contiguous block, runs
 *      it and drains it.
 *
 * Buffering is bounded by item_size_max plus a few hundred bytes. Nothing is
 * allocated per request; the only allocation is the small per-connection
 * state that remembers a pending discard and a SASL exchange.
 *
 * Where this parser departs from memcached 1.6, on purpose:
 *   - A body longer than 1 GiB is refused with EINVAL and the connection
 *     closed (memcached's current rule; older releases tried to swallow it).
 *   - An unknown opcode's body is skipped exactly; memcached skips the
 *     extras and key twice and so loses the next request.
 *   - STAT, TOUCH and GAT must not carry a value (memcached would read it as
 *     the next request); such requests get EINVAL and a close.
 *   - VERBOSITY (4-byte level in the extras) is accepted and answered, as in
 *     memcached 1.4, instead of being an unknown command.
 *   - A SET refused as too large leaves the key's old value in place (the
 *     store never changes on a refused request); memcached drops it.
 *   - SASL is PLAIN only, checked against one configured user; PLAIN without
 *     an initial response answers AUTH_CONTINUE and expects SASL_STEP.
 */
#include "proto_bin.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "authfile.h"
#include "bin_wire.h"
#include "prefix_stats.h"
#include "proxy.h"
#include "watch.h"

/* Longest key memcached accepts (the wire allows 65535). */
#define BIN_KEY_MAX 250
/* Bodies larger than this end the connection (memcached's upper limit). */
#define BIN_BODY_LIMIT (1024u * 1024u * 1024u)
/* Longest SASL mechanism name and PLAIN message accepted. */
#define BIN_SASL_MECH_MAX 32
#define BIN_SASL_DATA_MAX 1024
/* Values at least this long are sent by reference, shorter ones copied. */
#define BIN_REF_MIN 256
/* Extras + key + value that a reply copies in one piece. */
#define BIN_INLINE_MAX 512
/* Relative expirations end here; larger values are unix times. */
#define BIN_REL_EXPTIME_MAX (60 * 60 * 24 * 30)

static const char bin_mechs[] = "PLAIN";
static const char bin_authenticated[] = "Authenticated";

/* Per-connection state, allocated the first time it is needed. */
typedef struct bin_state {
    uint64_t discard;  /* body bytes of a refused request still to drop */
    bool sasl_started; /* SASL_AUTH PLAIN without data: STEP comes next */
} bin_state;

/* One request being handled; pointers point into the pulled-up packet. */
typedef struct bin_req {
    bin_header h;
    uint8_t cmd; /* the opcode, quiet variants mapped to their loud one */
    bool quiet;  /* suppress the success reply (and GET misses) */
    const uint8_t *ext;
    const char *key;
    const char *val;
    size_t nval;
} bin_req;

/* What bin_admit decided about a request from its header. */
enum bin_verdict {
    BIN_RUN = 0,       /* buffer the whole packet and execute it */
    BIN_SKIP = 1,      /* reply written; drop the body */
    BIN_CLOSE = 2,     /* reply (if any) written; close the connection */
    BIN_WAIT = 3,      /* nothing written; judge again when more bytes came */
    BIN_SKIP_DROP = 4, /* a SET refused for its size: as BIN_SKIP, after
                          the key (in `in` already) is removed */
};

#define BIN_COUNT(ctx, name)                                                  \
    do {                                                                      \
        if ((ctx)->stats)                                                     \
            STATS_INCR((ctx)->stats, name);                                   \
    } while (0)

/* ============================================================ replies */

/* The text memcached puts in the value of an error response. */
static const char *bin_status_text(uint16_t status)
{
    switch (status) {
    case BIN_STATUS_KEY_ENOENT:
        return "Not found";
    case BIN_STATUS_KEY_EEXISTS:
        return "Data exists for key.";
    case BIN_STATUS_E2BIG:
        return "Too large.";
    case BIN_STATUS_EINVAL:
        return "Invalid arguments";
    case BIN_STATUS_NOT_STORED:
        return "Not stored.";
    case BIN_STATUS_DELTA_BADVAL:
        return "Non-numeric server-side value for incr or decr";
    case BIN_STATUS_AUTH_ERROR:
        return "Auth failure.";
    case BIN_STATUS_UNKNOWN_COMMAND:
        return "Unknown command";
    case BIN_STATUS_ENOMEM:
        return "Out of memory";
    default:
        return "";
    }
}

/* Encodes the response header for r into buf (BIN_HEADER_LEN bytes). */
static void bin_encode_reply(uint8_t *buf, const bin_req *r, uint16_t status,
                             uint64_t cas, size_t next, size_t nkey,
                             size_t nval)
{
    bin_header h = {
        .magic = BIN_MAGIC_RES,
        .opcode = r->h.opcode,
        .keylen = (uint16_t)nkey,
        .extlen = (uint8_t)next,
        .datatype = 0,
        .status = status,
        .bodylen = (uint32_t)(next + nkey + nval),
        .opaque = r->h.opaque,
        .cas = cas,
    };
    bin_header_encode(buf, &h);
}

/*
 * Appends one response packet for r whose value is nval bytes long: the
 * header, extras and key, and the value too when val is not NULL. With a
 * NULL val the caller appends the nval value bytes itself, right after.
 * Small packets go in with a single copy. Returns 0, or -1 when the output
 * buffer could not take the bytes (the packet may then be partial).
 */
static int bin_reply(struct evbuffer *out, const bin_req *r, uint16_t status,
                     uint64_t cas, const void *ext, size_t next,
                     const void *key, size_t nkey, const void *val,
                     size_t nval)
{
    uint8_t buf[BIN_HEADER_LEN + BIN_INLINE_MAX];
    size_t ninline = val ? nval : 0;

    bin_encode_reply(buf, r, status, cas, next, nkey, nval);
    if (next + nkey + ninline <= BIN_INLINE_MAX) {
        uint8_t *p = buf + BIN_HEADER_LEN;
        if (next)
            memcpy(p, ext, next);
        if (nkey)
            memcpy(p + next, key, nkey);
        if (ninline)
            memcpy(p + next + nkey, val, ninline);
        return evbuffer_add(out, buf, BIN_HEADER_LEN + next + nkey + ninline);
    }
    if (evbuffer_add(out, buf, BIN_HEADER_LEN) != 0)
        return -1;
    if (next && evbuffer_add(out, ext, next) != 0)
        return -1;
    if (nkey && evbuffer_add(out, key, nkey) != 0)
        return -1;
    if (ninline && evbuffer_add(out, val, ninline) != 0)
        return -1;
    return 0;
}

/* Appends an error response carrying memcached's text for status. */
static int bin_error(struct evbuffer *out, const bin_req *r, uint16_t status)
{
    const char *text = bin_status_text(status);
    return bin_reply(out, r, status, 0, NULL, 0, NULL, 0, text, strlen(text));
}

/* Appends an empty success response unless the request is quiet. */
static int bin_ok(struct evbuffer *out, const bin_req *r, uint64_t cas)
{
    if (r->quiet)
        return 0;
    return bin_reply(out, r, BIN_STATUS_OK, cas, NULL, 0, NULL, 0, "", 0);
}

/* evbuffer cleanup for a value sent by reference: drops the item. */
static void bin_release_value(const void *data, size_t len, void *extra)
{
    (void)data;
    (void)len;
    store_item_release(extra);
}

/* The cas a response shows for it: none when cas is disabled (-C). */
static uint64_t bin_item_cas(const proto_ctx *ctx, const store_item *it)
{
    return ctx->cfg->cas_enabled ? store_item_cas(it) : 0;
}

/* ============================================================ framing */

/* Maps a quiet opcode to its loud twin and says whether it was quiet. */
static uint8_t bin_loud(uint8_t op, bool *quiet)
{
    *quiet = true;
    switch (op) {
    case BIN_OP_GETQ:
        return BIN_OP_GET;
    case BIN_OP_GETKQ:
        return BIN_OP_GETK;
    case BIN_OP_SETQ:
        return BIN_OP_SET;
    case BIN_OP_ADDQ:
        return BIN_OP_ADD;
    case BIN_OP_REPLACEQ:
        return BIN_OP_REPLACE;
    case BIN_OP_DELETEQ:
        return BIN_OP_DELETE;
    case BIN_OP_INCREMENTQ:
        return BIN_OP_INCREMENT;
    case BIN_OP_DECREMENTQ:
        return BIN_OP_DECREMENT;
    case BIN_OP_QUITQ:
        return BIN_OP_QUIT;
    case BIN_OP_FLUSHQ:
        return BIN_OP_FLUSH;
    case BIN_OP_APPENDQ:
        return BIN_OP_APPEND;
    case BIN_OP_PREPENDQ:
        return BIN_OP_PREPEND;
    case BIN_OP_GATQ:
        return BIN_OP_GAT;
    case BIN_OP_GATKQ:
        return BIN_OP_GATK;
    default:
        *quiet = false;
        return op;
    }
}

/*
 * Checks the lengths of a request against what its (loud) opcode takes.
 * Returns 1 when they fit, 0 when they do not, -1 for an unknown opcode.
 * memcached's rules, a little stricter where it would read a stray value as
 * the next request (STAT, TOUCH and GAT must not carry a value).
 */
static int bin_shape(const bin_req *r)
{
    const bin_header *h = &r->h;
    uint32_t kb = (uint32_t)h->keylen + h->extlen;

    switch (r->cmd) {
    case BIN_OP_NOOP:
    case BIN_OP_VERSION:
    case BIN_OP_QUIT:
    case BIN_OP_SASL_LIST_MECHS:
        return h->extlen == 0 && h->keylen == 0 && h->bodylen == 0;
    case BIN_OP_FLUSH:
        return h->keylen == 0 && h->bodylen == h->extlen &&
               (h->extlen == 0 || h->extlen == BIN_EXT_FLUSH);
    case BIN_OP_VERBOSITY:
        return h->keylen == 0 && h->extlen == BIN_EXT_VERBOSITY &&
               h->bodylen == BIN_EXT_VERBOSITY;
    case BIN_OP_SET:
    case BIN_OP_ADD:
    case BIN_OP_REPLACE:
        return h->extlen == BIN_EXT_STORE && h->keylen > 0;
    case BIN_OP_APPEND:
    case BIN_OP_PREPEND:
        return h->extlen == 0 && h->keylen > 0;
    case BIN_OP_GET:
    case BIN_OP_GETK:
    case BIN_OP_DELETE:
        return h->extlen == 0 && h->keylen > 0 && h->bodylen == kb;
    case BIN_OP_INCREMENT:
    case BIN_OP_DECREMENT:
        return h->extlen == BIN_EXT_ARITH && h->keylen > 0 && h->bodylen == kb;
    case BIN_OP_TOUCH:
    case BIN_OP_GAT:
    case BIN_OP_GATK:
        return h->extlen == BIN_EXT_TOUCH && h->keylen > 0 && h->bodylen == kb;
    case BIN_OP_STAT:
        return h->extlen == 0 && h->bodylen == kb;
    case BIN_OP_SASL_AUTH:
    case BIN_OP_SASL_STEP:
        return h->extlen == 0 && h->keylen > 0;
    case PROXY_BIN_OP_HELLO:
        return h->extlen == 0 && h->keylen == 0 && h->bodylen == 0;
    default:
        return -1;
    }
}

/* Commands a client may send before SASL authentication. */
static bool bin_sasl_exempt(uint8_t op)
{
    return op == BIN_OP_SASL_LIST_MECHS || op == BIN_OP_SASL_AUTH ||
           op == BIN_OP_SASL_STEP || op == BIN_OP_VERSION;
}

/* Writes an error reply for a request that ends the connection. */
static int bin_fatal(proto_ctx *ctx, const bin_req *r, struct evbuffer *out,
                     uint16_t status)
{
    BIN_COUNT(ctx, protocol_errors);
    bin_error(out, r, status);
    return BIN_CLOSE;
}

/*
 * Judges a request from its header alone, in memcached's order of checks.
 * Returns BIN_RUN (nothing written), BIN_SKIP (error reply written, body to
 * be dropped) or BIN_CLOSE (error reply written). Called again each time
 * more bytes arrive while the body is incomplete, so BIN_RUN must not have
 * side effects.
 */
static int bin_admit(proto_ctx *ctx, const bin_req *r, struct evbuffer *out,
                     size_t avail)
{
    const bin_header *h = &r->h;
    const proto_config *cfg = ctx->cfg;
    int shape;

    /* Key and extras past the body: the framing is broken. */
    if ((uint32_t)h->keylen + h->extlen > h->bodylen)
        return bin_fatal(ctx, r, out, BIN_STATUS_UNKNOWN_COMMAND);
    if (h->bodylen > BIN_BODY_LIMIT)
        return bin_fatal(ctx, r, out, BIN_STATUS_EINVAL);
    if ((cfg->sasl || cfg->auth != NULL) && !ctx->authenticated &&
        !bin_sasl_exempt(r->cmd)) {
        BIN_COUNT(ctx, auth_errors);
        return bin_fatal(ctx, r, out, BIN_STATUS_AUTH_ERROR);
    }
    if (h->keylen > BIN_KEY_MAX)
        return bin_fatal(ctx, r, out, BIN_STATUS_EINVAL);

    shape = bin_shape(r);
    if (shape < 0) {
        bin_error(out, r, BIN_STATUS_UNKNOWN_COMMAND);
        return BIN_SKIP;
    }
    if (shape == 0)
        return bin_fatal(ctx, r, out, BIN_STATUS_EINVAL);

    switch (r->cmd) {
    case BIN_OP_SASL_LIST_MECHS:
    case BIN_OP_SASL_AUTH:
    case BIN_OP_SASL_STEP:
        if (!cfg->sasl && cfg->auth == NULL) {
            bin_error(out, r, BIN_STATUS_UNKNOWN_COMMAND);
            return BIN_SKIP;
        }
        if (h->keylen > BIN_SASL_MECH_MAX ||
            h->bodylen - h->keylen > BIN_SASL_DATA_MAX) {
            BIN_COUNT(ctx, auth_errors);
            bin_error(out, r, BIN_STATUS_EINVAL);
            return BIN_SKIP;
        }
        break;
    case BIN_OP_SET:
    case BIN_OP_ADD:
    case BIN_OP_REPLACE:
    case BIN_OP_APPEND:
    case BIN_OP_PREPEND:
        /* The store decides the exact limit (it counts its overhead);
         * this only keeps a hopeless value from being buffered. */
        if (h->bodylen - h->keylen - h->extlen > cfg->item_size_max) {
            /* a refused SET removes the key (as memcached, and as the
             * text protocol): wait for the key's bytes first */
            bool drop = r->cmd == BIN_OP_SET;
            if (drop && avail < BIN_HEADER_LEN + (size_t)h->extlen + h->keylen)
                return BIN_WAIT;
            BIN_COUNT(ctx, cmd_set);
            BIN_COUNT(ctx, store_too_large);
            bin_error(out, r, BIN_STATUS_E2BIG);
            return drop ? BIN_SKIP_DROP : BIN_SKIP;
        }
        break;
    default:
        break;
    }
    return BIN_RUN;
}

/* ========================================================== commands */

/*
 * GET, GETK, TOUCH, GAT, GATK (and quiet twins). A hit answers flags in the
 * extras and the item's cas; the value goes by reference when it is large,
 * the item's reference then travelling with the output buffer.
 */
static int bin_get(proto_ctx *ctx, const bin_req *r, struct evbuffer *out)
{
    bool touch = r->cmd == BIN_OP_TOUCH || r->cmd == BIN_OP_GAT ||
                 r->cmd == BIN_OP_GATK;
    bool with_key = r->cmd == BIN_OP_GETK || r->cmd == BIN_OP_GATK;
    size_t nkey = r->h.keylen;
    store_item *it;
    store_read_info ri;

    if (touch) {
        int64_t exp = store_exptime_abs(ctx->store, bin_get32(r->ext));
        BIN_COUNT(ctx, cmd_touch);
        it = store_gat_ex(ctx->store, r->key, nkey, exp, &ri);
        if (it)
            BIN_COUNT(ctx, touch_hits);
        else
            BIN_COUNT(ctx, touch_misses);
    } else {
        BIN_COUNT(ctx, cmd_get);
        it = store_get_ex(ctx->store, r->key, nkey, &ri);
        if (it)
            BIN_COUNT(ctx, get_hits);
        else
            BIN_COUNT(ctx, get_misses);
    }
    /* as memcached: touching an expired or flushed item counts too */
    if (ri.why == STORE_MISS_EXPIRED)
        BIN_COUNT(ctx, get_expired);
    else if (ri.why == STORE_MISS_FLUSHED)
        BIN_COUNT(ctx, get_flushed);
    if (watch_wanted(WATCH_FETCHERS))
        watch_item_get(r->key, nkey, it, ri.why, ctx->fd);

    if (!it) {
        if (r->quiet)
            return 0;
        if (with_key) /* the key comes back instead of the error text */
            return bin_reply(out, r, BIN_STATUS_KEY_ENOENT, 0, NULL, 0, r->key,
                             nkey, NULL, 0);
        return bin_error(out, r, BIN_STATUS_KEY_ENOENT);
    }

    uint8_t flags[BIN_EXT_GET_RES];
    size_t nvalue = 0;
    const char *value = store_item_value(it, &nvalue);
    uint64_t cas = bin_item_cas(ctx, it);
    size_t nk = with_key ? nkey : 0;
    int rc;

    bin_put32(flags, store_item_flags(it));
    if (r->cmd == BIN_OP_TOUCH)
        nvalue = 0;
    if (nvalue < BIN_REF_MIN) {
        rc = bin_reply(out, r, BIN_STATUS_OK, cas, flags, sizeof(flags),
                       r->key, nk, value, nvalue);
        store_item_release(it);
        return rc;
    }
    rc = bin_reply(out, r, BIN_STATUS_OK, cas, flags, sizeof(flags), r->key,
                   nk, NULL, nvalue);
    if (rc != 0) {
        store_item_release(it);
        return rc;
    }
    /* The output buffer now owns our reference and drops it once sent. */
    if (evbuffer_add_reference(out, value, nvalue, bin_release_value, it) !=
        0) {
        rc = evbuffer_add(out, value, nvalue);
        store_item_release(it);
    }
    return rc;
}

/* Maps a store result of a storage command to the binary status. */
static uint16_t bin_update_status(proto_ctx *ctx, uint8_t cmd, int rc)
{
    bool concat = cmd == BIN_OP_APPEND || cmd == BIN_OP_PREPEND;

    switch (rc) {
    case STORE_STORED:
    case STORE_OK:
        return BIN_STATUS_OK;
    case STORE_EXISTS:
        return BIN_STATUS_KEY_EEXISTS;
    case STORE_NOT_FOUND:
        return concat ? BIN_STATUS_NOT_STORED : BIN_STATUS_KEY_ENOENT;
    case STORE_NOT_STORED:
        /* memcached's choice: add says "exists", replace "not found". */
        if (cmd == BIN_OP_ADD)
            return BIN_STATUS_KEY_EEXISTS;
        if (cmd == BIN_OP_REPLACE)
            return BIN_STATUS_KEY_ENOENT;
        return BIN_STATUS_NOT_STORED;
    case STORE_ERR_TOO_LARGE:
        BIN_COUNT(ctx, store_too_large);
        return BIN_STATUS_E2BIG;
    case STORE_ERR_NOMEM:
        BIN_COUNT(ctx, store_no_memory);
        return BIN_STATUS_ENOMEM;
    default:
        return BIN_STATUS_EINVAL;
    }
}

/*
 * SET, ADD, REPLACE, APPEND, PREPEND (and quiet twins). A non-zero cas turns
 * set/add/replace into a compare-and-swap, as in memcached; append and
 * prepend then require the cas too. Success answers the new item's cas.
 */
static int bin_update(proto_ctx *ctx, const bin_req *r, struct evbuffer *out)
{
    bool concat = r->cmd == BIN_OP_APPEND || r->cmd == BIN_OP_PREPEND;
    uint64_t cas = ctx->cfg->cas_enabled ? r->h.cas : 0;
    uint64_t new_cas = 0;
    store_write w = {
        .key = r->key,
        .nkey = r->h.keylen,
        .value = r->val,
        .nvalue = r->nval,
        .cas = cas,
    };
    uint16_t status;
    int rc;

    switch (r->cmd) {
    case BIN_OP_ADD:
        w.mode = STORE_ADD;
        break;
    case BIN_OP_REPLACE:
        w.mode = STORE_REPLACE;
        break;
    case BIN_OP_APPEND:
        w.mode = STORE_APPEND;
        break;
    case BIN_OP_PREPEND:
        w.mode = STORE_PREPEND;
        break;
    default:
        w.mode = STORE_SET;
        break;
    }
    if (!concat) {
        w.flags = bin_get32(r->ext);
        w.exptime = store_exptime_abs(ctx->store, bin_get32(r->ext + 4));
        if (cas != 0)
            w.mode = STORE_CAS;
    }

    BIN_COUNT(ctx, cmd_set);
    rc = store_write_item(ctx->store, &w, &new_cas);
    if (watch_wanted(WATCH_MUTATIONS))
        watch_item_store(&w, rc, store_exptime_abs(ctx->store, 1) - 1,
                         ctx->fd);
    if (w.mode == STORE_CAS) {
        if (rc == STORE_STORED)
            BIN_COUNT(ctx, cas_hits);
        else if (rc == STORE_EXISTS)
            BIN_COUNT(ctx, cas_badval);
        else if (rc == STORE_NOT_FOUND)
            BIN_COUNT(ctx, cas_misses);
    }
    status = bin_update_status(ctx, r->cmd, rc);
    if (status != BIN_STATUS_OK)
        return bin_error(out, r, status);
    return bin_ok(out, r, ctx->cfg->cas_enabled ? new_cas : 0);
}

/*
 * With cas disabled (-C) every item's cas reads as 0, so a request that
 * names a cas can only mismatch: EEXISTS when the key is live, else
 * ENOENT (memcached's answers). Returns the status.
 */
static uint16_t bin_cas_disabled_status(proto_ctx *ctx, const bin_req *r)
{
    store_item *it = store_get(ctx->store, r->key, r->h.keylen);

    if (!it)
        return BIN_STATUS_KEY_ENOENT;
    store_item_release(it);
    return BIN_STATUS_KEY_EEXISTS;
}

/* DELETE (and DELETEQ); a non-zero cas must match the item's. */
static int bin_delete(proto_ctx *ctx, const bin_req *r, struct evbuffer *out)
{
    int rc;

    if (!ctx->cfg->cas_enabled && r->h.cas != 0) {
        uint16_t status = bin_cas_disabled_status(ctx, r);
        if (status == BIN_STATUS_KEY_ENOENT)
            BIN_COUNT(ctx, delete_misses);
        return bin_error(out, r, status);
    }
    rc = store_delete(ctx->store, r->key, r->h.keylen, r->h.cas);
    switch (rc) {
    case STORE_DELETED:
    case STORE_OK:
        BIN_COUNT(ctx, delete_hits);
        return bin_ok(out, r, 0);
    case STORE_NOT_FOUND:
        BIN_COUNT(ctx, delete_misses);
        return bin_error(out, r, BIN_STATUS_KEY_ENOENT);
    case STORE_EXISTS:
        return bin_error(out, r, BIN_STATUS_KEY_EEXISTS);
    case STORE_ERR_NOMEM:
        BIN_COUNT(ctx, store_no_memory);
        return bin_error(out, r, BIN_STATUS_ENOMEM);
    default:
        return bin_error(out, r, BIN_STATUS_EINVAL);
    }
}

/*
 * INCREMENT, DECREMENT (and quiet twins). Extras: delta, initial value,
 * expiration; expiration 0xffffffff means a missing key is not created.
 * Success answers the new value as 8 big-endian bytes and the item's cas.
 */
static int bin_arith(proto_ctx *ctx, const bin_req *r, struct evbuffer *out)
{
    bool incr = r->cmd == BIN_OP_INCREMENT;
    uint32_t exp = bin_get32(r->ext + 16);
    store_arith_req a = {
        .key = r->key,
        .nkey = r->h.keylen,
        .incr = incr,
        .delta = bin_get64(r->ext),
        .cas = ctx->cfg->cas_enabled ? r->h.cas : 0,
        .vivify = exp != BIN_ARITH_NO_CREATE,
        .initial = bin_get64(r->ext + 8),
        .exptime = 0,
    };
    uint64_t value = 0, cas = 0;
    uint8_t body[8];
    int rc;

    if (!ctx->cfg->cas_enabled && r->h.cas != 0 &&
        bin_cas_disabled_status(ctx, r) == BIN_STATUS_KEY_EEXISTS)
        return bin_error(out, r, BIN_STATUS_KEY_EEXISTS);
    if (a.vivify)
        a.exptime = store_exptime_abs(ctx->store, exp);

    rc = store_arith(ctx->store, &a, &value, &cas);
    switch (rc) {
    case STORE_OK:
        if (incr)
            BIN_COUNT(ctx, incr_hits);
        else
            BIN_COUNT(ctx, decr_hits);
        /* fall through */
    case STORE_STORED:
        if (r->quiet)
            return 0;
        bin_put64(body, value);
        return bin_reply(out, r, BIN_STATUS_OK,
                         ctx->cfg->cas_enabled ? cas : 0, NULL, 0, NULL, 0,
                         body, sizeof(body));
    case STORE_NOT_FOUND:
        if (incr)
            BIN_COUNT(ctx, incr_misses);
        else
            BIN_COUNT(ctx, decr_misses);
        return bin_error(out, r, BIN_STATUS_KEY_ENOENT);
    case STORE_NON_NUMERIC:
        return bin_error(out, r, BIN_STATUS_DELTA_BADVAL);
    case STORE_EXISTS:
        return bin_error(out, r, BIN_STATUS_KEY_EEXISTS);
    case STORE_NOT_STORED:
        return bin_error(out, r, BIN_STATUS_NOT_STORED);
    case STORE_ERR_NOMEM:
        BIN_COUNT(ctx, store_no_memory);
        return bin_error(out, r, BIN_STATUS_ENOMEM);
    default:
        return bin_error(out, r, BIN_STATUS_EINVAL);
    }
}

/*
 * FLUSH (and FLUSHQ), with an optional delay in the extras (relative
 * seconds up to 30 days, else a unix time). Refused with AUTH_ERROR when
 * flush is disabled, as memcached does.
 */
static int bin_flush(proto_ctx *ctx, const bin_req *r, struct evbuffer *out)
{
    uint32_t when = r->h.extlen ? bin_get32(r->ext) : 0;
    uint32_t delay = when;
    int rc;

    if (!ctx->cfg->flush_enabled)
        return bin_error(out, r, BIN_STATUS_AUTH_ERROR);
    if (when > BIN_REL_EXPTIME_MAX) {
        /* Both readings come from the store's clock. */
        int64_t at = store_exptime_abs(ctx->store, when);
        int64_t now = store_exptime_abs(ctx->store, 1) - 1;
        delay = at > now ? (uint32_t)(at - now) : 0;
    }
    BIN_COUNT(ctx, cmd_flush);
    rc = store_flush_all(ctx->store, delay);
    if (rc < 0) {
        if (rc == STORE_ERR_NOMEM)
            BIN_COUNT(ctx, store_no_memory);
        return bin_error(out, r,
                         rc == STORE_ERR_NOMEM ? BIN_STATUS_ENOMEM
                                               : BIN_STATUS_EINVAL);
    }
    return bin_ok(out, r, 0);
}

/* Where stats packets go while a group is listed. */
typedef struct bin_stat_sink {
    struct evbuffer *out;
    const bin_req *r;
} bin_stat_sink;

/* stats_emit_fn: one packet per stat, the name as key, value as value. */
static void bin_stat_emit(void *arg, const char *name, const char *value)
{
    bin_stat_sink *sink = arg;
    size_t nname = strlen(name);
    size_t nvalue = strlen(value);

    if (nname > UINT16_MAX)
        nname = UINT16_MAX;
    bin_reply(sink->out, sink->r, BIN_STATUS_OK, 0, NULL, 0, name, nname,
              value, nvalue);
}

/* Collects `stats detail dump` lines into one value (prefix_stats_dump). */
struct detail_buf {
    char *p;
    size_t n, cap;
    bool failed;
};

static void detail_collect(void *arg, const char *text, size_t len)
{
    struct detail_buf *b = arg;
    if (b->failed)
        return;
    if (b->n + len + 2 > b->cap) {
        size_t cap = (b->n + len + 2) * 2;
        char *np = realloc(b->p, cap);
        if (np == NULL) {
            b->failed = true;
            return;
        }
        b->p = np;
        b->cap = cap;
    }
    memcpy(b->p + b->n, text, len);
    memcpy(b->p + b->n + len, "\r\n", 2);
    b->n += len + 2;
}

/*
 * STAT "detail on|off|dump", as memcached: on and off answer an empty
 * stat; dump answers one value holding the text protocol's dump lines and
 * "END\r\n".
 */
static int bin_stat_detail(struct evbuffer *out, const bin_req *r,
                           const char *what)
{
    if (strcmp(what, "on") == 0 || strcmp(what, "off") == 0) {
        prefix_stats_enable(what[1] == 'n');
        return bin_reply(out, r, BIN_STATUS_OK, 0, NULL, 0, NULL, 0, "", 0);
    }
    if (strcmp(what, "dump") != 0)
        return bin_error(out, r, BIN_STATUS_KEY_ENOENT);
    struct detail_buf b = {0};
    prefix_stats_dump(detail_collect, &b);
    detail_collect(&b, "END", 3);
    int rc = b.failed ? bin_error(out, r, BIN_STATUS_ENOMEM)
                      : bin_reply(out, r, BIN_STATUS_OK, 0, NULL, 0, NULL, 0,
                                  b.p, b.n);
    free(b.p);
    return rc;
}

/*
 * STAT: the key names the group ("" = general). One packet per stat, then
 * an empty packet ends the listing. "reset" zeroes the counters and answers
 * just the terminator; an unknown group answers KEY_ENOENT.
 */
static int bin_stat(proto_ctx *ctx, const bin_req *r, struct evbuffer *out)
{
    char group[BIN_KEY_MAX + 1];
    size_t n = r->h.keylen;
    bin_stat_sink sink = {.out = out, .r = r};

    memcpy(group, r->key, n);
    group[n] = '\0';
    if (memchr(group, '\0', n))
        return bin_error(out, r, BIN_STATUS_KEY_ENOENT);
    if (strncmp(group, "detail ", 7) == 0)
        return bin_stat_detail(out, r, group + 7);
    if (strcmp(group, "reset") == 0) {
        if (ctx->cfg->stats_reset != NULL)
            ctx->cfg->stats_reset();
    } else if (ctx->cfg->stats_list == NULL ||
               ctx->cfg->stats_list(group, bin_stat_emit, &sink) != 0)
        return bin_error(out, r, BIN_STATUS_KEY_ENOENT);
    return bin_reply(out, r, BIN_STATUS_OK, 0, NULL, 0, NULL, 0, "", 0);
}

/*
 * Checks a SASL PLAIN message, "authzid NUL authcid NUL password", against
 * the configured credentials. An authorization id, when given, must be the
 * user itself.
 */
static bool bin_plain_ok(const proto_config *cfg, const char *msg, size_t n)
{
    const char *z1 = memchr(msg, '\0', n);
    const char *user, *pass, *z2;
    size_t nzid, nuser, npass;

    if (!z1)
        return false;
    user = z1 + 1;
    z2 = memchr(user, '\0', (size_t)(msg + n - user));
    if (!z2)
        return false;
    pass = z2 + 1;
    nzid = (size_t)(z1 - msg);
    nuser = (size_t)(z2 - user);
    npass = (size_t)(msg + n - pass);
    if (memchr(pass, '\0', npass))
        return false;
    if (nzid != 0 && (nzid != nuser || memcmp(msg, user, nuser) != 0))
        return false;
    /* sasl_file's users, and -Y's: both files are sets of users. Both are
     * checked, so the time does not tell which one matched. */
    bool ok = authfile_check(cfg->sasl_auth, user, nuser, pass, npass);
    ok |= authfile_check(cfg->auth, user, nuser, pass, npass);
    return ok;
}

/* Returns the connection's private state, allocating it on first use. */
static bin_state *bin_state_get(proto_ctx *ctx)
{
    if (!ctx->bin)
        ctx->bin = calloc(1, sizeof(bin_state));
    return ctx->bin;
}

/*
 * SASL_AUTH and SASL_STEP, mechanism PLAIN only. Every attempt first drops
 * an earlier authentication (as memcached does). PLAIN with no data answers
 * AUTH_CONTINUE and takes the credentials in the SASL_STEP that follows.
 */
static int bin_sasl(proto_ctx *ctx, const bin_req *r, struct evbuffer *out)
{
    bin_state *st = bin_state_get(ctx);
    bool ok = false;

    if (!st)
        return bin_error(out, r, BIN_STATUS_ENOMEM);
    ctx->authenticated = false;
    if (r->cmd == BIN_OP_SASL_AUTH) {
        st->sasl_started = false;
        if (r->h.keylen == sizeof(bin_mechs) - 1 &&
            strncasecmp(r->key, bin_mechs, r->h.keylen) == 0) {
            if (r->nval == 0) {
                st->sasl_started = true;
                return bin_reply(out, r, BIN_STATUS_AUTH_CONTINUE, 0, NULL, 0,
                                 NULL, 0, "", 0);
            }
            ok = bin_plain_ok(ctx->cfg, r->val, r->nval);
        }
    } else if (st->sasl_started) {
        st->sasl_started = false;
        ok = bin_plain_ok(ctx->cfg, r->val, r->nval);
    }

    BIN_COUNT(ctx, auth_cmds);
    if (!ok) {
        BIN_COUNT(ctx, auth_errors);
        return bin_error(out, r, BIN_STATUS_AUTH_ERROR);
    }
    ctx->authenticated = true;
    return bin_reply(out, r, BIN_STATUS_OK, 0, NULL, 0, NULL, 0,
                     bin_authenticated, sizeof(bin_authenticated) - 1);
}

/*
 * Runs one admitted, fully buffered request. Returns PROTO_OK, or
 * PROTO_CLOSE after QUIT or when the output buffer failed.
 */
static int bin_dispatch(proto_ctx *ctx, const bin_req *r, struct evbuffer *out)
{
    const char *version = ctx->cfg->version ? ctx->cfg->version : "";
    uint32_t level;
    int rc;

    switch (r->cmd) {
    case BIN_OP_GET:
    case BIN_OP_GETK:
    case BIN_OP_TOUCH:
    case BIN_OP_GAT:
    case BIN_OP_GATK:
        rc = bin_get(ctx, r, out);
        break;
    case BIN_OP_SET:
    case BIN_OP_ADD:
    case BIN_OP_REPLACE:
    case BIN_OP_APPEND:
    case BIN_OP_PREPEND:
        rc = bin_update(ctx, r, out);
        break;
    case BIN_OP_DELETE:
        rc = bin_delete(ctx, r, out);
        break;
    case BIN_OP_INCREMENT:
    case BIN_OP_DECREMENT:
        rc = bin_arith(ctx, r, out);
        break;
    case BIN_OP_FLUSH:
        rc = bin_flush(ctx, r, out);
        break;
    case BIN_OP_STAT:
        rc = bin_stat(ctx, r, out);
        break;
    case BIN_OP_NOOP:
        rc = bin_ok(out, r, 0);
        break;
    case BIN_OP_VERSION:
        rc = bin_reply(out, r, BIN_STATUS_OK, 0, NULL, 0, NULL, 0, version,
                       strlen(version));
        break;
    case BIN_OP_VERBOSITY:
        level = bin_get32(r->ext);
        ctx->verbose = level > INT_MAX ? INT_MAX : (int)level;
        rc = bin_ok(out, r, 0);
        break;
    case BIN_OP_QUIT:
        bin_ok(out, r, 0);
        return PROTO_CLOSE;
    case BIN_OP_SASL_LIST_MECHS:
        rc = bin_reply(out, r, BIN_STATUS_OK, 0, NULL, 0, NULL, 0, bin_mechs,
                       sizeof(bin_mechs) - 1);
        break;
    case BIN_OP_SASL_AUTH:
    case BIN_OP_SASL_STEP:
        rc = bin_sasl(ctx, r, out);
        break;
    case PROXY_BIN_OP_HELLO:
        /* A node relaying to us: serve it here from now on (proxy.h). */
        ctx->relay_peer = true;
        rc = bin_ok(out, r, 0);
        break;
    default:
        /* bin_admit lets only the opcodes above through. */
        rc = bin_error(out, r, BIN_STATUS_UNKNOWN_COMMAND);
        break;
    }
    return rc == 0 ? PROTO_OK : PROTO_CLOSE;
}

/* ========================================================== relaying */

/* Whether a (loud) opcode names a key to route, and whether it writes. */
static bool bin_keyed(uint8_t cmd, bool *write)
{
    switch (cmd) {
    case BIN_OP_GET:
    case BIN_OP_GETK:
        *write = false;
        return true;
    case BIN_OP_TOUCH:
    case BIN_OP_GAT:
    case BIN_OP_GATK:
    case BIN_OP_SET:
    case BIN_OP_ADD:
    case BIN_OP_REPLACE:
    case BIN_OP_APPEND:
    case BIN_OP_PREPEND:
    case BIN_OP_DELETE:
    case BIN_OP_INCREMENT:
    case BIN_OP_DECREMENT:
        *write = true;
        return true;
    default:
        return false;
    }
}

/*
 * Relays the admitted, fully buffered request r (the need bytes at p) when
 * its key lives elsewhere. Returns true when it was relayed (its reply,
 * or the temporary-failure status, takes its place in the output).
 */
static bool bin_relay(proto_ctx *ctx, const bin_req *r, const uint8_t *p,
                      size_t need, struct evbuffer *out)
{
    proto_target t[PROTO_ROUTE_MAX];
    bool write;
    int nt;

    if (!bin_keyed(r->cmd, &write))
        return false;
    nt = proxy_route(ctx, r->key, r->h.keylen, write, t);
    if (nt <= 0)
        return false;
    proxy_req q = {
        .kind = r->quiet ? PROXY_BIN_QUIET : PROXY_BIN_ONE,
        .bin_opcode = r->h.opcode,
        .bin_opaque = r->h.opaque,
        .data = p,
        .n = need,
        .targets = t,
        .ntargets = nt,
    };
    proxy_relay(ctx, out, &q);
    return true;
}

/* ======================================================== entry points */

/*
 * Drops up to the pending discard count of bytes from in. Returns true when
 * nothing is left to discard.
 */
static bool bin_discard(proto_ctx *ctx, struct evbuffer *in)
{
    bin_state *st = ctx->bin;
    size_t avail, n;

    if (!st || st->discard == 0)
        return true;
    avail = evbuffer_get_length(in);
    n = st->discard < avail ? (size_t)st->discard : avail;
    evbuffer_drain(in, n);
    st->discard -= n;
    return st->discard == 0;
}

/*
 * The key of a SET refused for its size (its bytes are in `in`) is
 * removed through an ordinary, replicated delete, so that its old value
 * is not served as if the set had not happened; a key relayed to its
 * owners (scale-out) is left to them.
 */
static void bin_drop_refused(proto_ctx *ctx, struct evbuffer *in,
                             const bin_req *r)
{
    char key[BIN_KEY_MAX];
    size_t nkey = r->h.keylen;
    struct evbuffer_ptr at;

    if (nkey == 0 || nkey > sizeof(key) ||
        evbuffer_ptr_set(in, &at, BIN_HEADER_LEN + r->h.extlen,
                         EVBUFFER_PTR_SET) != 0 ||
        evbuffer_copyout_from(in, &at, key, nkey) != (ev_ssize_t)nkey)
        return;
    if (ctx->cfg->route_fn != NULL) {
        proto_target t[PROTO_ROUTE_MAX];
        if (proxy_route(ctx, key, nkey, true, t) > 0)
            return;
    }
    (void)store_delete(ctx->store, key, nkey, 0);
}

int proto_bin_execute(proto_ctx *ctx, struct evbuffer *in,
                      struct evbuffer *conn_out)
{
    ctx->executed = 0;
    ctx->yielded = false;
    ctx->mid_request = false;
    for (;;) {
        uint8_t raw[BIN_HEADER_LEN];
        bin_req r;
        size_t avail, need, body_in;
        const uint8_t *p;
        int rc;
        /* Replies go behind relayed requests still in flight. */
        struct evbuffer *out =
            ctx->proxy != NULL ? proxy_out(ctx, conn_out) : conn_out;

        if (!bin_discard(ctx, in))
            return PROTO_OK;
        avail = evbuffer_get_length(in);
        if (avail < BIN_HEADER_LEN)
            return PROTO_OK;
        /* -R: let the worker's other connections have a turn */
        if (ctx->cfg->reqs_per_event &&
            ctx->executed >= ctx->cfg->reqs_per_event) {
            ctx->yielded = true;
            return PROTO_PAUSED;
        }
        /* Between requests: wait while the client is not reading. */
        if (ctx->cfg->output_max &&
            evbuffer_get_length(conn_out) > ctx->cfg->output_max)
            return PROTO_PAUSED;
        if (ctx->proxy != NULL && proxy_blocked(ctx, conn_out))
            return PROTO_PAUSED;
        if (evbuffer_copyout(in, raw, BIN_HEADER_LEN) != BIN_HEADER_LEN)
            return PROTO_CLOSE;

        memset(&r, 0, sizeof(r));
        bin_header_decode(&r.h, raw);
        if (r.h.magic != BIN_MAGIC_REQ) {
            /* Not a request: nothing in the stream can be trusted. */
            BIN_COUNT(ctx, protocol_errors);
            return PROTO_CLOSE;
        }
        r.cmd = bin_loud(r.h.opcode, &r.quiet);

        switch (bin_admit(ctx, &r, out, avail)) {
        case BIN_CLOSE:
            return PROTO_CLOSE;
        case BIN_WAIT:
            return PROTO_OK;
        case BIN_SKIP_DROP:
            bin_drop_refused(ctx, in, &r);
            /* fall through */
        case BIN_SKIP:
            body_in = avail - BIN_HEADER_LEN;
            if (body_in > r.h.bodylen)
                body_in = r.h.bodylen;
            evbuffer_drain(in, BIN_HEADER_LEN + body_in);
            if (body_in < r.h.bodylen) {
                bin_state *st = bin_state_get(ctx);
                if (!st)
                    return PROTO_CLOSE;
                st->discard = r.h.bodylen - body_in;
            }
            continue;
        default:
            break;
        }

        need = BIN_HEADER_LEN + (size_t)r.h.bodylen;
        if (avail < need) {
            ctx->mid_request = true;
            return PROTO_OK;
        }
        ctx->executed++;
        p = evbuffer_pullup(in, (ev_ssize_t)need);
        if (!p) {
            bin_error(out, &r, BIN_STATUS_ENOMEM);
            return PROTO_CLOSE;
        }
        r.ext = p + BIN_HEADER_LEN;
        r.key = (const char *)r.ext + r.h.extlen;
        r.val = r.key + r.h.keylen;
        r.nval = r.h.bodylen - r.h.extlen - r.h.keylen;

        if (ctx->cfg->route_fn != NULL &&
            bin_relay(ctx, &r, p, need, conn_out)) {
            evbuffer_drain(in, need);
            continue;
        }
        rc = bin_dispatch(ctx, &r, out);
        evbuffer_drain(in, need);
        if (rc != PROTO_OK)
            return rc;
    }
}

void proto_bin_free(proto_ctx *ctx)
{
    free(ctx->bin);
    ctx->bin = NULL;
}
