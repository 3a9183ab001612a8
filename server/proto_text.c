/*
 * proto_text.c -- memcached's text and meta protocols.
 *
 * A pure parser: bytes in, store calls, reply bytes out (see proto.h). It
 * answers as memcached 1.6 does, byte for byte where a client can see it.
 *
 * Layout of this file:
 *   - reply writer: replies are collected in a stack buffer and handed to
 *     the output evbuffer in large pieces; large values are added by
 *     reference to the store item (zero copy, released by evbuffer);
 *   - tokens and numbers;
 *   - classic commands (get/gets/gat/gats, storage commands, delete,
 *     incr/decr, touch, flush_all, stats, version, verbosity, quit,
 *     shutdown);
 *   - meta commands (mg, ms, md, ma, me, mn);
 *   - the request loop, which consumes every complete request of `in`.
 *
 * Meta flags supported:
 *   mg  b c f h k l O q s t u v E T N R (N vivifies an empty item on a
 *       miss, with cas E if given; response flags W, X, Z: see
 *       put_win_flags)
 *   ms  b c k O q C E F I T M(E A P R S) (I with C: a cas that does not
 *       match stores the value anyway, marked stale)
 *   md  b k O q C E I T x (I marks the value stale with a new cas instead
 *       of deleting it, x empties it; T sets the expiry with I or x)
 *   ma  b c k O q t v C E N J D T M(I + D -)
 *   me  b
 * P and L (proxy hints) are accepted and ignored, like memcached does;
 * so is every known flag on a command it does not apply to.
 * E (explicit new cas) is kept by ms, md, ma and a vivifying mg: the cas
 * travels with the mutation, so every node reports it. The stale and won
 * marks are part of the value's mutation (store.h, STORE_MARK_*), so they
 * replicate with it.
 *
 * Deliberate differences from memcached:
 *   - "mg <key> T-1 t" (a touch to an expiry in the past) answers t0: the
 *     item has expired; memcached prints its clock difference as an
 *     unsigned number (t4294964727), which no client can use. Both then
 *     miss on the key.
 * and on bad input:
 *   - numbers that do not fit their field (byte counts that would wrap)
 *     are refused instead of being truncated; client flags are kept
 *     modulo 2^32 as memcached does;
 *   - a "get" with an over-long key fails before any key is looked up;
 *   - a command line longer than max_line is answered with
 *     "CLIENT_ERROR line too long" and discarded up to its newline, instead
 *     of closing the connection (retrieval lines are streamed instead,
 *     see "long gets");
 *   - a set whose value is too large removes the key, as memcached does
 *     (its old value would otherwise be served).
 */
#include "proto_text.h"
#include "proto_text_int.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include <event2/buffer.h>

#include "authfile.h"
#include "prefix_stats.h"
#include "proxy.h"
#include "watch.h"

/* ================================================================ writer */

void pt_out_flush(pt_out *o)
{
    if (o->n) {
        evbuffer_add(o->ev, o->buf, o->n);
        o->n = 0;
    }
}

void pt_out_put(pt_out *o, const void *p, size_t n)
{
    if (n > PT_OUTBUF - o->n) {
        pt_out_flush(o);
        if (n > PT_OUTBUF) {
            evbuffer_add(o->ev, p, n);
            return;
        }
    }
    memcpy(o->buf + o->n, p, n);
    o->n += n;
}

/* Returns room for n (<= PT_OUTBUF) bytes; out_commit says how many. */
char *pt_out_reserve(pt_out *o, size_t n)
{
    if (n > PT_OUTBUF - o->n)
        pt_out_flush(o);
    return o->buf + o->n;
}

void pt_out_commit(pt_out *o, const char *end)
{
    o->n = (size_t)(end - o->buf);
}

/* Writes v in decimal at p; returns the end. */
char *pt_fmt_u64(char *p, uint64_t v)
{
    char tmp[20];
    int i = 0;
    do {
        tmp[i++] = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    while (i)
        *p++ = tmp[--i];
    return p;
}

char *pt_fmt_i64(char *p, int64_t v)
{
    if (v < 0) {
        *p++ = '-';
        return pt_fmt_u64(p, (uint64_t)0 - (uint64_t)v);
    }
    return pt_fmt_u64(p, (uint64_t)v);
}

char *pt_put_mem(char *p, const void *s, size_t n)
{
    memcpy(p, s, n);
    return p + n;
}

/* evbuffer cleanup for values added by reference: drops the item. */
static void release_item_cb(const void *data, size_t len, void *arg)
{
    (void)data;
    (void)len;
    store_item_release(arg);
}

/*
 * Appends the value of `it` followed by "\r\n". Takes over the caller's
 * reference to it: small values are copied and the item released, large
 * ones are referenced and released when the output buffer drops them.
 * While replies collect in the worker's memory (proto.h) and nothing has
 * gone to the output buffer yet, a value that fits there is copied too:
 * the reply then leaves in one write, with no buffer pieces allocated and
 * no reference kept, for one copy the kernel's would have made anyway.
 */
static void out_value(pt_out *o, store_item *it, const char *v, size_t n)
{
    if (n < PT_COPY_MAX || (o->buf != o->own && n + 2 <= PT_OUTBUF - o->n &&
                            evbuffer_get_length(o->ev) == 0)) {
        char *p = pt_out_reserve(o, n + 2);
        p = pt_put_mem(p, v, n);
        p = PUT_LIT(p, "\r\n");
        pt_out_commit(o, p);
        store_item_release(it);
        return;
    }
    pt_out_flush(o);
    if (evbuffer_add_reference(o->ev, v, n, release_item_cb, it) != 0) {
        evbuffer_add(o->ev, v, n);
        store_item_release(it);
    }
    OUT_LIT(o, "\r\n");
}

/* ================================================================ base64 */

static const char b64_chars[] =
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

static int b64_val(unsigned char c)
{
    if (c >= 'A' && c <= 'Z')
        return c - 'A';
    if (c >= 'a' && c <= 'z')
        return c - 'a' + 26;
    if (c >= '0' && c <= '9')
        return c - '0' + 52;
    if (c == '+')
        return 62;
    if (c == '/')
        return 63;
    return -1;
}

/*
 * Decodes padded base64 (length a multiple of 4, '=' only at the end).
 * Returns the decoded length, or 0 when the input is not valid base64.
 */
static size_t b64_decode(const char *in, size_t n, char *out)
{
    size_t o = 0;
    if (n == 0 || n % 4)
        return 0;
    for (size_t i = 0; i < n; i += 4) {
        int v[4];
        int pad = 0;
        for (int j = 0; j < 4; j++) {
            unsigned char c = (unsigned char)in[i + j];
            if (c == '=' && i + 4 == n && j >= 2) {
                v[j] = 0;
                pad++;
                continue;
            }
            if (pad) /* data after padding */
                return 0;
            v[j] = b64_val(c);
            if (v[j] < 0)
                return 0;
        }
        uint32_t w = (uint32_t)v[0] << 18 | (uint32_t)v[1] << 12 |
                     (uint32_t)v[2] << 6 | (uint32_t)v[3];
        out[o++] = (char)(w >> 16);
        if (pad < 2)
            out[o++] = (char)(w >> 8);
        if (pad < 1)
            out[o++] = (char)w;
    }
    return o;
}

/* Encodes n bytes at p (padded); returns the end. */
char *pt_b64_encode(char *p, const unsigned char *in, size_t n)
{
    size_t i = 0;
    for (; i + 3 <= n; i += 3) {
        uint32_t w =
            (uint32_t)in[i] << 16 | (uint32_t)in[i + 1] << 8 | in[i + 2];
        *p++ = b64_chars[w >> 18 & 63];
        *p++ = b64_chars[w >> 12 & 63];
        *p++ = b64_chars[w >> 6 & 63];
        *p++ = b64_chars[w & 63];
    }
    if (i < n) {
        uint32_t w = (uint32_t)in[i] << 16;
        if (i + 1 < n)
            w |= (uint32_t)in[i + 1] << 8;
        *p++ = b64_chars[w >> 18 & 63];
        *p++ = b64_chars[w >> 12 & 63];
        *p++ = i + 1 < n ? b64_chars[w >> 6 & 63] : '=';
        *p++ = '=';
    }
    return p;
}

/* ======================================================= tokens, numbers */

#define PT_GET_CAS 1   /* gets, gats: values with their cas */
#define PT_GET_TOUCH 2 /* gat, gats: an exptime before the keys */

/* Splits the line at spaces into at most PT_MAX_TOKENS - 1 tokens. */
static void tokenize(pt_req *r)
{
    const char *p = r->line, *e = r->line + r->len;
    r->nt = 0;
    while (p < e) {
        if (*p == ' ') {
            p++;
            continue;
        }
        if (r->nt == PT_MAX_TOKENS - 1) {
            /* memcached stops here too; the rest makes the count 24 */
            return;
        }
        const char *sp = memchr(p, ' ', (size_t)(e - p));
        if (sp == NULL)
            sp = e;
        r->t[r->nt].s = p;
        r->t[r->nt].n = (size_t)(sp - p);
        r->nt++;
        p = sp;
    }
}

bool pt_tok_is(const pt_tok *t, const char *s, size_t n)
{
    return t->n == n && memcmp(t->s, s, n) == 0;
}

/* Unsigned decimal, digits only, no overflow. */
bool pt_parse_u64(const char *s, size_t n, uint64_t *out)
{
    uint64_t v = 0;
    if (n == 0 || n > 20)
        return false;
    for (size_t i = 0; i < n; i++) {
        unsigned d = (unsigned char)s[i] - '0';
        if (d > 9)
            return false;
        if (v > (UINT64_MAX - d) / 10)
            return false;
        v = v * 10 + d;
    }
    *out = v;
    return true;
}

bool pt_parse_u32(const char *s, size_t n, uint32_t *out)
{
    uint64_t v;
    if (!pt_parse_u64(s, n, &v) || v > UINT32_MAX)
        return false;
    *out = (uint32_t)v;
    return true;
}

/*
 * Client flags as memcached reads them on a 64-bit host: a 64-bit number
 * kept modulo 2^32 (4294967296 is stored as 0), so a client sees the same
 * flags back from either server.
 */
static bool parse_flags(const char *s, size_t n, uint32_t *out)
{
    uint64_t v;
    if (!pt_parse_u64(s, n, &v))
        return false;
    *out = (uint32_t)v;
    return true;
}

/* Signed decimal: an optional '-' then digits. */
bool pt_parse_i64(const char *s, size_t n, int64_t *out)
{
    uint64_t v;
    bool neg = n > 0 && s[0] == '-';
    if (neg) {
        s++;
        n--;
    }
    if (!pt_parse_u64(s, n, &v))
        return false;
    if (neg) {
        if (v > (uint64_t)INT64_MAX + 1)
            return false;
        *out = v == (uint64_t)INT64_MAX + 1 ? INT64_MIN : -(int64_t)v;
    } else {
        if (v > INT64_MAX)
            return false;
        *out = (int64_t)v;
    }
    return true;
}

/*
 * A key: 1..250 bytes. As in memcached, any byte but the space that ends
 * it (and the newline that ends the line) may be part of it, control
 * bytes included: keys are length-counted everywhere past the parser.
 */
bool pt_key_ok(const char *k, size_t n)
{
    return n > 0 && n <= PT_KEY_MAX && memchr(k, '\n', n) == NULL;
}

/* ============================================================= helpers */

/* Replies "str\r\n" unless the request asked for noreply. */
void pt_reply(pt_req *r, const char *s, size_t n)
{
    if (r->noreply)
        return;
    char *p = pt_out_reserve(r->o, n + 2);
    p = pt_put_mem(p, s, n);
    p = PUT_LIT(p, "\r\n");
    pt_out_commit(r->o, p);
}

/*
 * Relays this request (its line and the ndata bytes after it) to the
 * owners in t, to be answered in the given framing; what the parser
 * writes afterwards goes behind its reply. Returns ndata (the handler's
 * "bytes consumed after the line").
 */
static int relay(pt_req *r, const proto_target *t, int nt, size_t ndata,
                 uint8_t kind)
{
    proxy_req q = {
        .kind = kind,
        .silent = r->noreply,
        .data = r->line,
        .n = r->linesz + ndata,
        .targets = t,
        .ntargets = nt,
    };
    pt_out_flush(r->o);
    proxy_relay(r->ctx, r->o->base, &q);
    r->o->ev = proxy_out(r->ctx, r->o->base);
    return (int)ndata;
}

/* The framing of a relayed one-reply request: quiet ones end at "MN". */
static uint8_t relay_kind(bool quiet)
{
    return quiet ? PROXY_TEXT_QUIET : PROXY_TEXT_LINE;
}

/*
 * A one-line write of key t[1] that this node does not serve is relayed
 * to its owners (after the handler checked the request, so bad input is
 * answered here). Returns 0 when it was relayed, -1 when it is ours.
 */
static int relay_line(pt_req *r)
{
    if (r->ctx->cfg->route_fn == NULL)
        return -1;
    proto_target t[PROTO_ROUTE_MAX];
    int nt = proxy_route(r->ctx, r->t[1].s, r->t[1].n, true, t);
    if (nt <= 0)
        return -1;
    return relay(r, t, nt, 0, relay_kind(r->noreply));
}

static int64_t now_s(store *s)
{
    /* a relative exptime of 1 second is converted to now + 1 */
    return store_exptime_abs(s, 1) - 1;
}

static int64_t ttl_left(store *s, int64_t exptime)
{
    if (exptime == 0)
        return -1;
    int64_t left = exptime - now_s(s);
    return left < 0 ? 0 : left;
}

static uint64_t item_cas(pt_req *r, const store_item *it)
{
    return r->ctx->cfg->cas_enabled ? store_item_cas(it) : 0;
}

/* Is an object of this key and value length too large to be stored? */
static bool too_large(pt_req *r, size_t nkey, int64_t vlen)
{
    size_t max = r->ctx->cfg->item_size_max;
    return max && (uint64_t)nkey + (uint64_t)vlen > max;
}

/* Refuses a data block: discard its vlen + 2 bytes as they arrive. */
static void swallow(pt_req *r, int64_t vlen)
{
    r->st->swallow = (uint64_t)vlen + 2;
}

/* Maps the result of a store write to its classic reply. */
static void reply_store_rc(pt_req *r, int rc)
{
    switch (rc) {
    case STORE_STORED:
        REPLY(r, "STORED");
        break;
    case STORE_NOT_STORED:
        REPLY(r, "NOT_STORED");
        break;
    case STORE_EXISTS:
        REPLY(r, "EXISTS");
        break;
    case STORE_NOT_FOUND:
        REPLY(r, "NOT_FOUND");
        break;
    case STORE_ERR_NOMEM:
        STAT(r, store_no_memory);
        REPLY(r, "SERVER_ERROR out of memory storing object");
        break;
    case STORE_ERR_TOO_LARGE:
        STAT(r, store_too_large);
        REPLY(r, "SERVER_ERROR object too large for cache");
        break;
    default:
        REPLY(r, "SERVER_ERROR Unhandled storage type.");
        break;
    }
}

/*
 * A miss on a value that expired or was flushed (the store's *why), from a
 * get, a touch or a gat alike, as memcached counts them.
 */
static void count_stale_miss(pt_req *r, int why)
{
    if (why == STORE_MISS_EXPIRED)
        STAT(r, get_expired);
    else if (why == STORE_MISS_FLUSHED)
        STAT(r, get_flushed);
}

static void count_cas(pt_req *r, int rc)
{
    if (rc == STORE_STORED)
        STAT(r, cas_hits);
    else if (rc == STORE_EXISTS)
        STAT(r, cas_badval);
    else if (rc == STORE_NOT_FOUND)
        STAT(r, cas_misses);
}

/*
 * Executes a write whose data block is complete, checked and in `value`.
 * With cas disabled (-C) a cas write can only miss or fail, as in
 * memcached, where every item's cas is 0.
 */
/*
 * As memcached: a set refused for its size removes the key, whose old value
 * would otherwise be served as if the set had not happened. The removal is
 * an ordinary delete, so it replicates; a key relayed to its owners
 * (scale-out) is left to them.
 */
static void drop_refused(pt_req *r, const char *key, size_t nkey)
{
    if (r->ctx->cfg->route_fn != NULL) {
        proto_target t[PROTO_ROUTE_MAX];
        if (proxy_route(r->ctx, key, nkey, true, t) > 0)
            return;
    }
    (void)store_delete(r->ctx->store, key, nkey, 0);
}

static int do_write(pt_req *r, const store_write *w, uint64_t *cas_out)
{
    if (watch_wanted(WATCH_FETCHERS)) {
        store_read_info ri;
        store_item *old = store_peek_ex(r->ctx->store, w->key, w->nkey, &ri);
        watch_item_get(w->key, w->nkey, old, ri.why, r->ctx->fd);
        if (old != NULL)
            store_item_release(old);
    }
    prefix_stats_record(w->key, w->nkey, PREFIX_STATS_SET, false);
    if (w->mode == STORE_CAS && !r->ctx->cfg->cas_enabled) {
        store_item *it = store_get(r->ctx->store, w->key, w->nkey);
        if (it == NULL)
            return STORE_NOT_FOUND;
        store_item_release(it);
        return STORE_EXISTS;
    }
    int rc = store_write_item(r->ctx->store, w, cas_out);
    if (rc == STORE_ERR_TOO_LARGE && w->mode == STORE_SET && w->cas == 0)
        drop_refused(r, w->key, w->nkey);
    if (watch_wanted(WATCH_MUTATIONS))
        watch_item_store(w, rc, now_s(r->ctx->store), r->ctx->fd);
    return rc;
}

/* ==================================================== classic commands */

/* Finds the next space-separated key in [*p, e). */
static bool next_key(const char **p, const char *e, pt_tok *k)
{
    const char *s = *p;
    while (s < e && *s == ' ')
        s++;
    if (s == e)
        return false;
    const char *sp = memchr(s, ' ', (size_t)(e - s));
    if (sp == NULL)
        sp = e;
    k->s = s;
    k->n = (size_t)(sp - s);
    *p = sp;
    return true;
}

/* Writes "VALUE key flags bytes [cas]\r\n" and the value. */
static void out_get_hit(pt_req *r, store_item *it, bool with_cas)
{
    size_t nkey, nval;
    const char *key = store_item_key(it, &nkey);
    const char *val = store_item_value(it, &nval);
    char *p = pt_out_reserve(r->o, 6 + nkey + 3 * 21 + 2 + 2);
    p = PUT_LIT(p, "VALUE ");
    p = pt_put_mem(p, key, nkey);
    *p++ = ' ';
    p = pt_fmt_u64(p, store_item_flags(it));
    *p++ = ' ';
    p = pt_fmt_u64(p, nval);
    if (with_cas) {
        *p++ = ' ';
        p = pt_fmt_u64(p, item_cas(r, it));
    }
    p = PUT_LIT(p, "\r\n");
    pt_out_commit(r->o, p);
    out_value(r->o, it, val, nval);
}

/* Looks one key of a get/gets/gat/gats up here and writes its hit. */
static void get_one(pt_req *r, const pt_tok *k, bool with_cas, bool touch,
                    int64_t exptime)
{
    store_item *it;
    store_read_info ri;
    if (touch) {
        STAT(r, cmd_touch);
        it = store_gat_ex(r->ctx->store, k->s, k->n, exptime, &ri);
        if (it)
            STAT(r, touch_hits);
        else
            STAT(r, touch_misses);
    } else {
        STAT(r, cmd_get);
        it = store_get_ex(r->ctx->store, k->s, k->n, &ri);
        if (it)
            STAT(r, get_hits);
        else
            STAT(r, get_misses);
    }
    count_stale_miss(r, ri.why);
    prefix_stats_record(k->s, k->n, PREFIX_STATS_GET, it != NULL);
    if (watch_wanted(WATCH_FETCHERS))
        watch_item_get(k->s, k->n, it, ri.why, r->ctx->fd);
    if (it)
        out_get_hit(r, it, with_cas);
}

/* A run of consecutive keys of a get that have the same owners. */
typedef struct pt_run {
    char *buf; /* "<cmd> [<exptime>] key key...", room for the whole line */
    size_t head;
    size_t len;
    uint32_t nkeys;
    int nt;
    proto_target t[PROTO_ROUTE_MAX];
} pt_run;

/*
 * True when two keys have the same owners in the same order: only then may
 * they share a run, so that falling back to the next owner when the first
 * is down stays right for every key of the run.
 */
static bool same_targets(const proto_target *a, int na, const proto_target *b,
                         int nb)
{
    if (na != nb)
        return false;
    for (int i = 0; i < na; i++)
        if (!proxy_same_target(&a[i], &b[i]))
            return false;
    return true;
}

/* Relays the run's keys as one get; their hits take this place. */
static void run_flush(pt_req *r, pt_run *run)
{
    if (run->nkeys == 0)
        return;
    memcpy(run->buf + run->len, "\r\n", 2);
    proxy_req q = {
        .kind = PROXY_TEXT_GET,
        .get_part = true,
        .nkeys = run->nkeys,
        .data = run->buf,
        .n = run->len + 2,
        .targets = run->t,
        .ntargets = run->nt,
    };
    pt_out_flush(r->o);
    proxy_relay(r->ctx, r->o->base, &q);
    r->o->ev = proxy_out(r->ctx, r->o->base);
    run->len = run->head;
    run->nkeys = 0;
}

/*
 * A get whose keys may live elsewhere (relaying is on). A single remote
 * key relays the request as it is (so a failure answers the protocol's
 * error). With several keys, each run of consecutive keys that go to the
 * same owners (in the same order) is relayed as one get, local keys are served
 * here, and the hits come out in the order of the keys with one END; a run
 * that fails reads as misses (and counts in proxy_failures).
 */
static int get_routed(pt_req *r, bool with_cas, bool touch, int64_t exptime,
                      const char *p, const char *e, size_t nkeys)
{
    proto_target cur[PROTO_ROUTE_MAX];
    char sbuf[1024];
    pt_run run;
    pt_tok k;

    if (nkeys == 1 && next_key(&p, e, &k)) {
        int nt = proxy_route(r->ctx, k.s, k.n, touch, cur);
        if (nt > 0) {
            proxy_req q = {
                .kind = PROXY_TEXT_GET,
                .data = r->line,
                .n = r->linesz,
                .targets = cur,
                .ntargets = nt,
            };
            pt_out_flush(r->o);
            proxy_relay(r->ctx, r->o->base, &q);
            r->o->ev = proxy_out(r->ctx, r->o->base);
            return 0;
        }
        get_one(r, &k, with_cas, touch, exptime);
        OUT_LIT(r->o, "END\r\n");
        return 0;
    }
    /* A run is a subset of the line's keys: the line's size is room. */
    run.buf = r->len + 2 <= sizeof(sbuf) ? sbuf : malloc(r->len + 2);
    if (run.buf == NULL) {
        REPLY(r, "SERVER_ERROR out of memory");
        return 0;
    }
    const pt_tok *last = touch ? &r->t[1] : &r->t[0];
    run.head = (size_t)(last->s + last->n - r->t[0].s);
    memcpy(run.buf, r->t[0].s, run.head);
    run.len = run.head;
    run.nkeys = 0;
    run.nt = 0;
    while (next_key(&p, e, &k)) {
        int nt = proxy_route(r->ctx, k.s, k.n, touch, cur);
        if (nt > 0 && run.nkeys > 0 && same_targets(cur, nt, run.t, run.nt)) {
            run.buf[run.len++] = ' ';
            memcpy(run.buf + run.len, k.s, k.n);
            run.len += k.n;
            run.nkeys++;
            continue;
        }
        run_flush(r, &run);
        if (nt > 0) {
            memcpy(run.t, cur, (size_t)nt * sizeof(cur[0]));
            run.nt = nt;
            run.buf[run.len++] = ' ';
            memcpy(run.buf + run.len, k.s, k.n);
            run.len += k.n;
            run.nkeys = 1;
        } else {
            get_one(r, &k, with_cas, touch, exptime);
        }
    }
    run_flush(r, &run);
    OUT_LIT(r->o, "END\r\n");
    if (run.buf != sbuf)
        free(run.buf);
    return 0;
}

/*
 * get/gets/gat/gats <keys...>: every key of the line (no token limit).
 * All keys are checked before any is looked up, so a bad key answers a
 * single error and touches nothing.
 */
static int cmd_get(pt_req *r, int arg)
{
    bool with_cas = arg & PT_GET_CAS, touch = arg & PT_GET_TOUCH;
    int64_t exptime = 0;
    const char *p = r->t[0].s + r->t[0].n, *e = r->line + r->len;
    pt_tok k;
    size_t nkeys = 0;

    if (touch) {
        if (!pt_parse_i64(r->t[1].s, r->t[1].n, &exptime)) {
            REPLY(r, "CLIENT_ERROR invalid exptime argument");
            return 0;
        }
        exptime = store_exptime_abs(r->ctx->store, exptime);
        p = r->t[1].s + r->t[1].n;
    }
    for (const char *q = p; next_key(&q, e, &k); nkeys++) {
        if (!pt_key_ok(k.s, k.n)) {
            REPLY(r, "CLIENT_ERROR bad command line format");
            return 0;
        }
    }
    if (r->ctx->cfg->route_fn != NULL && nkeys > 0)
        return get_routed(r, with_cas, touch, exptime, p, e, nkeys);
    while (next_key(&p, e, &k))
        get_one(r, &k, with_cas, touch, exptime);
    OUT_LIT(r->o, "END\r\n");
    return 0;
}

/*
 * set/add/replace/append/prepend <key> <flags> <exptime> <bytes>
 * [noreply], cas <key> <flags> <exptime> <bytes> <cas> [noreply], then the
 * data block. Format errors leave the data block to be read as commands
 * (as memcached does); a too-large object swallows it.
 */
static int cmd_store(pt_req *r, int arg)
{
    enum store_set_mode mode = (enum store_set_mode)arg;
    bool is_cas = mode == STORE_CAS;
    uint32_t flags;
    int64_t exptime, vlen;
    uint64_t cas = 0;

    const pt_tok *key = &r->t[1];
    if (!parse_flags(r->t[2].s, r->t[2].n, &flags) ||
        !pt_parse_i64(r->t[3].s, r->t[3].n, &exptime) ||
        !pt_parse_i64(r->t[4].s, r->t[4].n, &vlen) ||
        (is_cas && !pt_parse_u64(r->t[5].s, r->t[5].n, &cas)) || vlen < 0 ||
        vlen > INT_MAX - 2) {
        REPLY(r, "CLIENT_ERROR bad command line format");
        return 0;
    }
    if (too_large(r, key->n, vlen)) {
        STAT(r, store_too_large);
        if (mode == STORE_SET)
            drop_refused(r, key->s, key->n);
        REPLY(r, "SERVER_ERROR object too large for cache");
        swallow(r, vlen);
        return 0;
    }
    if (r->avail < (size_t)vlen + 2) {
        r->need = r->linesz + (size_t)vlen + 2;
        return PT_NEED;
    }
    if (r->ctx->cfg->route_fn != NULL && r->data[vlen] == '\r' &&
        r->data[vlen + 1] == '\n') {
        proto_target t[PROTO_ROUTE_MAX];
        int nt = proxy_route(r->ctx, key->s, key->n, true, t);
        if (nt > 0)
            return relay(r, t, nt, (size_t)vlen + 2, relay_kind(r->noreply));
    }
    STAT(r, cmd_set);
    if (r->data[vlen] != '\r' || r->data[vlen + 1] != '\n') {
        REPLY(r, "CLIENT_ERROR bad data chunk");
        return (int)vlen + 2;
    }
    store_write w = {
        .mode = mode,
        .key = key->s,
        .nkey = key->n,
        .value = r->data,
        .nvalue = (size_t)vlen,
        .flags = flags,
        .exptime = store_exptime_abs(r->ctx->store, exptime),
        .cas = cas,
    };
    int rc = do_write(r, &w, NULL);
    if (is_cas)
        count_cas(r, rc);
    reply_store_rc(r, rc);
    return (int)vlen + 2;
}

/* delete <key> [0] [noreply] */
static int cmd_delete(pt_req *r, int arg)
{
    (void)arg;
    if (r->nt > 2) {
        bool hold0 = TOK_IS(&r->t[2], "0");
        r->noreply = TOK_IS(&r->t[r->nt - 1], "noreply");
        bool valid = (r->nt == 3 && (hold0 || r->noreply)) ||
                     (r->nt == 4 && hold0 && r->noreply);
        if (!valid) {
            REPLY(r, "CLIENT_ERROR bad command line format.  "
                     "Usage: delete <key> [noreply]");
            return 0;
        }
    }
    if (relay_line(r) == 0)
        return 0;
    prefix_stats_record(r->t[1].s, r->t[1].n, PREFIX_STATS_DEL, false);
    int rc = store_delete(r->ctx->store, r->t[1].s, r->t[1].n, 0);
    if (rc == STORE_DELETED) {
        STAT(r, delete_hits);
        REPLY(r, "DELETED");
    } else {
        STAT(r, delete_misses);
        REPLY(r, "NOT_FOUND");
    }
    return 0;
}

/* incr|decr <key> <delta> [noreply] */
static int cmd_arith(pt_req *r, int arg)
{
    bool incr = arg != 0;
    uint64_t delta, value = 0;

    if (!pt_parse_u64(r->t[2].s, r->t[2].n, &delta)) {
        REPLY(r, "CLIENT_ERROR invalid numeric delta argument");
        return 0;
    }
    if (relay_line(r) == 0)
        return 0;
    store_arith_req a = {
        .key = r->t[1].s, .nkey = r->t[1].n, .incr = incr, .delta = delta};
    int rc = store_arith(r->ctx->store, &a, &value, NULL);
    switch (rc) {
    case STORE_OK:
    case STORE_STORED: {
        if (incr)
            STAT(r, incr_hits);
        else
            STAT(r, decr_hits);
        char buf[24];
        char *p = pt_fmt_u64(buf, value);
        pt_reply(r, buf, (size_t)(p - buf));
        break;
    }
    case STORE_NOT_FOUND:
        if (incr)
            STAT(r, incr_misses);
        else
            STAT(r, decr_misses);
        REPLY(r, "NOT_FOUND");
        break;
    case STORE_NON_NUMERIC:
        REPLY(r, "CLIENT_ERROR cannot increment or decrement non-numeric "
                 "value");
        break;
    default:
        REPLY(r, "SERVER_ERROR out of memory");
        break;
    }
    return 0;
}

/* touch <key> <exptime> [noreply] */
static int cmd_touch(pt_req *r, int arg)
{
    int64_t exptime;

    (void)arg;
    if (!pt_parse_i64(r->t[2].s, r->t[2].n, &exptime)) {
        REPLY(r, "CLIENT_ERROR invalid exptime argument");
        return 0;
    }
    if (relay_line(r) == 0)
        return 0;
    STAT(r, cmd_touch);
    exptime = store_exptime_abs(r->ctx->store, exptime);
    int why;
    if (store_touch_ex(r->ctx->store, r->t[1].s, r->t[1].n, exptime, &why) ==
        STORE_OK) {
        STAT(r, touch_hits);
        REPLY(r, "TOUCHED");
    } else {
        STAT(r, touch_misses);
        count_stale_miss(r, why);
        REPLY(r, "NOT_FOUND");
    }
    return 0;
}

/* flush_all [delay] [noreply] */
static int cmd_flush_all(pt_req *r, int arg)
{
    int64_t exptime = 0;
    uint32_t delay = 0;

    (void)arg;
    STAT(r, cmd_flush);
    if (!r->ctx->cfg->flush_enabled) {
        REPLY(r, "CLIENT_ERROR flush_all not allowed");
        return 0;
    }
    if (r->nt != (r->noreply ? 2u : 1u)) {
        if (!pt_parse_i64(r->t[1].s, r->t[1].n, &exptime)) {
            REPLY(r, "CLIENT_ERROR invalid exptime argument");
            return 0;
        }
    }
    if (exptime > 0) {
        /* like an item's exptime: relative, or a unix time after 30 days */
        int64_t at = store_exptime_abs(r->ctx->store, exptime);
        int64_t d = at - now_s(r->ctx->store);
        delay = d <= 0 ? 0 : d > UINT32_MAX ? UINT32_MAX : (uint32_t)d;
    }
    if (store_flush_all(r->ctx->store, delay) < 0)
        REPLY(r, "SERVER_ERROR out of memory");
    else
        REPLY(r, "OK");
    return 0;
}

/*
 * proxy_hello 1: the peer is a node relaying requests to us. Everything
 * it sends from now on is served here, never relayed again, so requests
 * cannot loop while nodes disagree about owners. It grants nothing a
 * client could not have anyway: any client may say it and gets what this
 * node holds.
 */
static int cmd_proxy_hello(pt_req *r, int arg)
{
    (void)arg;
    if (r->nt != 2 || !TOK_IS(&r->t[1], "1")) {
        REPLY(r, "CLIENT_ERROR bad command line format");
        return 0;
    }
    r->ctx->relay_peer = true;
    REPLY(r, "OK");
    return 0;
}

/* ======================================================= meta commands */

/* Parsed meta flags (memcached's preparse: every command accepts all). */
typedef struct pt_meta {
    uint64_t seen[2]; /* flag characters seen, bit per ASCII code */
    const char *key;  /* the key to use (decoded when b) */
    size_t nkey;
    bool bin; /* key was base64 */
    bool q, v;
    bool has_T, has_N, has_C, has_R;
    bool I, x; /* invalidate (ms, md), remove the value (md) */
    int64_t T, N, R;
    uint64_t C, D, J;
    uint64_t E; /* explicit new cas (ms, ma); 0 = none */
    uint32_t F;
    char M;
    const pt_tok *opaque;
    char kbuf[PT_KEY_MAX];
} pt_meta;

static bool meta_has(const pt_meta *m, unsigned char c)
{
    return m->seen[c >> 6] >> (c & 63) & 1;
}

/*
 * Parses the flags of tokens [start, nt). Returns 0, or -1 with *err set
 * to memcached's message for the first problem it reports.
 */
static int meta_parse(pt_req *r, size_t start, pt_meta *m, const char **err)
{
    bool bad = false;
    memset(m, 0, offsetof(pt_meta, kbuf));
    m->key = r->t[1].s;
    m->nkey = r->t[1].n;
    m->D = 1;
    for (size_t i = start; i < r->nt; i++) {
        const pt_tok *t = &r->t[i];
        unsigned char c = (unsigned char)t->s[0];
        if (c >= 127 || meta_has(m, c)) {
            *err = "CLIENT_ERROR duplicate flag";
            return -1;
        }
        m->seen[c >> 6] |= (uint64_t)1 << (c & 63);
        switch (c) {
        case 'b': {
            size_t n = b64_decode(r->t[1].s, r->t[1].n, m->kbuf);
            if (n == 0) {
                *err = "CLIENT_ERROR error decoding key";
                bad = true;
            }
            m->key = m->kbuf;
            m->nkey = n;
            m->bin = true;
            break;
        }
        case 'N':
        case 'R':
        case 'T': {
            int64_t v;
            if (!pt_parse_i64(t->s + 1, t->n - 1, &v)) {
                *err = "CLIENT_ERROR bad token in command line format";
                bad = true;
            } else if (c == 'N') {
                m->has_N = true;
                m->N = v;
            } else if (c == 'R') {
                m->has_R = true;
                m->R = v;
            } else {
                m->has_T = true;
                m->T = v;
            }
            break;
        }
        case 'I':
            m->I = true;
            break;
        case 'x':
            m->x = true;
            break;
        case 'O':
            m->opaque = t;
            break;
        case 'P': /* proxy hints */
        case 'L':
        case 'k':
        case 's':
        case 't':
        case 'c':
        case 'f':
        case 'h':
        case 'l':
        case 'u': /* no access recorded: store_peek_ex */
            break;
        case 'v':
            m->v = true;
            break;
        case 'q':
            m->q = true;
            break;
        case 'F':
            if (!parse_flags(t->s + 1, t->n - 1, &m->F)) {
                *err = "CLIENT_ERROR bad command line format";
                bad = true;
            }
            break;
        case 'C':
            if (!pt_parse_u64(t->s + 1, t->n - 1, &m->C)) {
                *err = "CLIENT_ERROR bad token in command line format";
                bad = true;
            } else {
                m->has_C = true;
            }
            break;
        case 'E':
            /* A cas unique is never 0 here (0 means "none"). */
            if (!pt_parse_u64(t->s + 1, t->n - 1, &m->E) || m->E == 0) {
                *err = "CLIENT_ERROR bad token in command line format";
                bad = true;
            }
            break;
        case 'M':
            if (t->n != 2) {
                *err = "CLIENT_ERROR incorrect length for M token";
                bad = true;
            } else {
                m->M = t->s[1];
            }
            break;
        case 'J':
            if (!pt_parse_u64(t->s + 1, t->n - 1, &m->J)) {
                *err = "CLIENT_ERROR invalid numeric initial value";
                bad = true;
            }
            break;
        case 'D':
            if (!pt_parse_u64(t->s + 1, t->n - 1, &m->D)) {
                *err = "CLIENT_ERROR invalid numeric delta value";
                bad = true;
            }
            break;
        default:
            *err = "CLIENT_ERROR invalid flag";
            return -1;
        }
    }
    /* Every failure above names its error; keep that true for new ones. */
    if (bad && *err == NULL)
        *err = "CLIENT_ERROR bad command line format";
    return bad ? -1 : 0;
}

/* The checks every meta command makes after its flags parsed. */
static const char *meta_check(const pt_meta *m)
{
    if (m->opaque && m->opaque->n > PT_OPAQUE_MAX)
        return "CLIENT_ERROR opaque token too long";
    if (!m->bin && !pt_key_ok(m->key, m->nkey))
        return "CLIENT_ERROR bad command line format";
    return NULL;
}

static void reply_err(pt_req *r, const char *err)
{
    r->noreply = false;
    pt_reply(r, err, strlen(err));
}

/* " k<key>" (base64 and " b" for a binary key). */
static char *put_meta_key(char *p, const pt_meta *m)
{
    p = PUT_LIT(p, " k");
    if (!m->bin)
        return pt_put_mem(p, m->key, m->nkey);
    p = pt_b64_encode(p, (const unsigned char *)m->key, m->nkey);
    return PUT_LIT(p, " b");
}

static char *put_opaque(char *p, const pt_tok *t)
{
    *p++ = ' ';
    return pt_put_mem(p, t->s, t->n);
}

/* Appends the O and k flags in request order (miss/failure replies). */
static char *put_ok_flags(char *p, pt_req *r, size_t start, const pt_meta *m)
{
    for (size_t i = start; i < r->nt; i++) {
        if (r->t[i].s[0] == 'O')
            p = put_opaque(p, &r->t[i]);
        else if (r->t[i].s[0] == 'k')
            p = put_meta_key(p, m);
    }
    return p;
}

/* Common head of mg/md/ma/me: token count, key length, flag count. */
static bool meta_head(pt_req *r, bool mg)
{
    if (r->nt < 2) {
        REPLY(r, "ERROR");
        return false;
    }
    if (r->t[1].n > PT_KEY_MAX) {
        REPLY(r, "CLIENT_ERROR bad command line format");
        return false;
    }
    if (r->nt + 1 > PT_META_MAX_TOKENS) {
        if (mg)
            REPLY(r, "CLIENT_ERROR options flags are too long");
        else
            REPLY(r, "CLIENT_ERROR options flags too long");
        return false;
    }
    return true;
}

/*
 * The stale-while-revalidate response flags of a hit, in memcached's order:
 * Z when another client holds the right to recache the item, X when it is
 * stale, W when this request wins that right -- it created the item (N),
 * or the item is stale, or it expires within R seconds, and nobody holds
 * the right yet. Winning writes the item's STORE_MARK_WON (store_take_win),
 * so that every node answers Z from then on.
 */
static char *put_win_flags(char *p, pt_req *r, const pt_meta *m,
                           const store_item *it, bool created)
{
    store *s = r->ctx->store;
    uint8_t marks = store_item_marks(it);
    bool want = false;
    if (created)
        return PUT_LIT(p, " W"); /* the vivifying write carried the mark */
    if (marks & STORE_MARK_WON)
        p = PUT_LIT(p, " Z");
    if (marks & STORE_MARK_STALE) {
        p = PUT_LIT(p, " X");
        want = true;
    }
    if (m->has_R) {
        int64_t exp = store_item_exptime(it);
        int64_t before = store_exptime_abs(s, m->R);
        if (exp != 0 && exp < before)
            want = true;
    }
    if (want && (marks & STORE_MARK_WON) == 0 &&
        store_take_win(s, it) == STORE_STORED)
        p = PUT_LIT(p, " W");
    return p;
}

/* mg <key> <flags>* */
static int cmd_mg(pt_req *r, int arg)
{
    (void)arg;
    pt_meta m;
    const char *err = NULL;
    store *s = r->ctx->store;
    bool created = false;

    if (!meta_head(r, true))
        return 0;
    if (meta_parse(r, 2, &m, &err) != 0 || (err = meta_check(&m)) != NULL) {
        reply_err(r, err);
        return 0;
    }
    if (r->ctx->cfg->route_fn != NULL) {
        proto_target t[PROTO_ROUTE_MAX];
        int nt = proxy_route(r->ctx, m.key, m.nkey, m.has_T || m.has_N, t);
        if (nt > 0)
            return relay(r, t, nt, 0, relay_kind(m.q));
    }
    STAT(r, cmd_meta);
    store_item *it;
    store_read_info ri;
    if (m.has_T)
        it = store_gat_ex(s, m.key, m.nkey, store_exptime_abs(s, m.T), &ri);
    else if (meta_has(&m, 'u'))
        it = store_peek_ex(s, m.key, m.nkey, &ri); /* no access recorded */
    else
        it = store_get_ex(s, m.key, m.nkey, &ri);
    count_stale_miss(r, ri.why);
    if (watch_wanted(WATCH_FETCHERS))
        watch_item_get(m.key, m.nkey, it, ri.why, r->ctx->fd);
    if (it == NULL && m.has_N) {
        /* vivify: an empty item; this request wins the right to fill it */
        store_write w = {.mode = STORE_ADD,
                         .key = m.key,
                         .nkey = m.nkey,
                         .value = "",
                         .nvalue = 0,
                         .exptime = store_exptime_abs(s, m.N),
                         .new_cas = m.E, /* as memcached: E is the cas of
                                            a vivified item; a touch keeps
                                            the item's cas */
                         .marks = STORE_MARK_WON};
        created = store_write_item(s, &w, NULL) == STORE_STORED;
        it = store_get_ex(s, m.key, m.nkey, &ri);
    }
    if (m.has_T)
        STAT(r, cmd_touch);
    else
        STAT(r, cmd_get);
    if (it == NULL) {
        if (m.has_T)
            STAT(r, touch_misses);
        else
            STAT(r, get_misses);
        if (m.q)
            return 0;
        char *p = pt_out_reserve(r->o, PT_LINE_MAX);
        p = PUT_LIT(p, "EN");
        p = put_ok_flags(p, r, 2, &m);
        p = PUT_LIT(p, "\r\n");
        pt_out_commit(r->o, p);
        return 0;
    }
    if (m.has_T)
        STAT(r, touch_hits);
    else
        STAT(r, get_hits);

    size_t nval;
    const char *val = store_item_value(it, &nval);
    char *p = pt_out_reserve(r->o, PT_LINE_MAX);
    if (m.v) {
        p = PUT_LIT(p, "VA ");
        p = pt_fmt_u64(p, nval);
    } else {
        p = PUT_LIT(p, "HD");
    }
    for (size_t i = 2; i < r->nt; i++) {
        switch (r->t[i].s[0]) {
        case 's':
            p = PUT_LIT(p, " s");
            p = pt_fmt_u64(p, nval);
            break;
        case 't':
            p = PUT_LIT(p, " t");
            p = pt_fmt_i64(p, ttl_left(s, store_item_exptime(it)));
            break;
        case 'c':
            p = PUT_LIT(p, " c");
            p = pt_fmt_u64(p, item_cas(r, it));
            break;
        case 'f':
            p = PUT_LIT(p, " f");
            p = pt_fmt_u64(p, store_item_flags(it));
            break;
        case 'l':
            p = PUT_LIT(p, " l");
            p = pt_fmt_i64(p, ri.last_access);
            break;
        case 'h':
            p = ri.fetched ? PUT_LIT(p, " h1") : PUT_LIT(p, " h0");
            break;
        case 'O':
            p = put_opaque(p, &r->t[i]);
            break;
        case 'k':
            p = put_meta_key(p, &m);
            break;
        default:
            break;
        }
    }
    p = put_win_flags(p, r, &m, it, created);
    p = PUT_LIT(p, "\r\n");
    pt_out_commit(r->o, p);
    if (m.v)
        out_value(r->o, it, val, nval);
    else
        store_item_release(it);
    return 0;
}

/* ms <key> <datalen> <flags>*, then the data block. */
static int cmd_ms(pt_req *r, int arg)
{
    (void)arg;
    pt_meta m;
    const char *err = "CLIENT_ERROR bad command line format";
    int64_t vlen;
    enum store_set_mode mode = STORE_SET;

    if (r->nt < 2) {
        REPLY(r, "ERROR");
        return 0;
    }
    if (r->t[1].n > PT_KEY_MAX || r->nt == 2) {
        REPLY(r, "CLIENT_ERROR bad command line format");
        return 0;
    }
    if (r->nt + 1 > PT_META_MAX_TOKENS) {
        REPLY(r, "CLIENT_ERROR options flags too long");
        return 0;
    }
    if (!pt_parse_i64(r->t[2].s, r->t[2].n, &vlen) || vlen < 0 ||
        vlen > INT_MAX - 2) {
        REPLY(r, "CLIENT_ERROR bad command line format");
        return 0;
    }
    /* from here on errors swallow the data block */
    if (meta_parse(r, 3, &m, &err) != 0 || (err = meta_check(&m)) != NULL)
        goto refuse;
    switch (m.M) {
    case 0:
    case 'S':
        mode = STORE_SET;
        break;
    case 'E':
        mode = STORE_ADD;
        break;
    case 'A':
        mode = STORE_APPEND;
        break;
    case 'P':
        mode = STORE_PREPEND;
        break;
    case 'R':
        mode = STORE_REPLACE;
        break;
    default:
        err = "CLIENT_ERROR invalid mode for ms M token";
        goto refuse;
    }
    if (too_large(r, m.nkey, vlen)) {
        STAT(r, store_too_large);
        if (mode == STORE_SET && m.C == 0)
            drop_refused(r, m.key, m.nkey);
        err = "SERVER_ERROR object too large for cache";
        goto refuse;
    }
    if (r->avail < (size_t)vlen + 2) {
        r->need = r->linesz + (size_t)vlen + 2;
        return PT_NEED;
    }
    if (r->ctx->cfg->route_fn != NULL && r->data[vlen] == '\r' &&
        r->data[vlen + 1] == '\n') {
        proto_target t[PROTO_ROUTE_MAX];
        int nt = proxy_route(r->ctx, m.key, m.nkey, true, t);
        if (nt > 0)
            return relay(r, t, nt, (size_t)vlen + 2, relay_kind(m.q));
    }
    STAT(r, cmd_meta);
    STAT(r, cmd_set);
    if (r->data[vlen] != '\r' || r->data[vlen + 1] != '\n') {
        reply_err(r, "CLIENT_ERROR bad data chunk");
        return (int)vlen + 2;
    }
    /* a cas turns set and replace into cas; add ignores it */
    uint64_t cas = 0, cas_out = 0;
    if (m.has_C) {
        if (mode == STORE_SET || mode == STORE_REPLACE)
            mode = STORE_CAS;
        if (mode != STORE_ADD)
            cas = m.C;
    }
    store_write w = {
        .mode = mode,
        .key = m.key,
        .nkey = m.nkey,
        .value = r->data,
        .nvalue = (size_t)vlen,
        .flags = m.F,
        .exptime = m.has_T ? store_exptime_abs(r->ctx->store, m.T) : 0,
        .cas = cas,
        .new_cas = m.E,
        .invalidate = m.I && mode == STORE_CAS,
    };
    int rc = do_write(r, &w, &cas_out);
    if (mode == STORE_CAS)
        count_cas(r, rc);
    char *p = pt_out_reserve(r->o, PT_LINE_MAX);
    switch (rc) {
    case STORE_STORED:
        if (m.q)
            return (int)vlen + 2;
        p = PUT_LIT(p, "HD");
        break;
    case STORE_EXISTS:
        p = PUT_LIT(p, "EX");
        break;
    case STORE_NOT_FOUND:
        p = PUT_LIT(p, "NF");
        break;
    case STORE_NOT_STORED:
        p = PUT_LIT(p, "NS");
        break;
    default:
        r->noreply = false;
        reply_store_rc(r, rc);
        return (int)vlen + 2;
    }
    for (size_t i = 3; i < r->nt; i++) {
        switch (r->t[i].s[0]) {
        case 'O':
            p = put_opaque(p, &r->t[i]);
            break;
        case 'k':
            p = put_meta_key(p, &m);
            break;
        case 'c':
            p = PUT_LIT(p, " c");
            p = pt_fmt_u64(p, rc == STORE_STORED && r->ctx->cfg->cas_enabled
                                  ? cas_out
                                  : 0);
            break;
        default:
            break;
        }
    }
    p = PUT_LIT(p, "\r\n");
    pt_out_commit(r->o, p);
    return (int)vlen + 2;

refuse:
    reply_err(r, err);
    swallow(r, vlen);
    return 0;
}

/* md <key> <flags>* */
static int cmd_md(pt_req *r, int arg)
{
    (void)arg;
    pt_meta m;
    const char *err = NULL;

    if (!meta_head(r, false))
        return 0;
    if (meta_parse(r, 2, &m, &err) != 0) {
        REPLY(r, "CLIENT_ERROR invalid or duplicate flag");
        return 0;
    }
    if ((err = meta_check(&m)) != NULL) {
        reply_err(r, err);
        return 0;
    }
    if (r->ctx->cfg->route_fn != NULL) {
        proto_target t[PROTO_ROUTE_MAX];
        int nt = proxy_route(r->ctx, m.key, m.nkey, true, t);
        if (nt > 0)
            return relay(r, t, nt, 0, relay_kind(m.q));
    }
    STAT(r, cmd_meta);
    store_delete_req d = {
        .key = m.key,
        .nkey = m.nkey,
        .cas = m.has_C ? m.C : 0,
        .invalidate = m.I,
        .clear_value = m.x,
        .set_ttl = m.has_T && (m.I || m.x),
        .exptime = m.has_T ? store_exptime_abs(r->ctx->store, m.T) : 0,
        .new_cas = m.E,
    };
    int rc = store_delete_ex(r->ctx->store, &d);
    if (rc < 0) {
        r->noreply = false;
        reply_store_rc(r, rc);
        return 0;
    }
    char *p = pt_out_reserve(r->o, PT_LINE_MAX);
    if (rc == STORE_DELETED) {
        if (!m.I) /* as memcached: marking stale is not a delete */
            STAT(r, delete_hits);
        if (m.q)
            return 0;
        p = PUT_LIT(p, "HD");
    } else {
        STAT(r, delete_misses);
        p = rc == STORE_EXISTS ? PUT_LIT(p, "EX") : PUT_LIT(p, "NF");
    }
    p = put_ok_flags(p, r, 2, &m);
    p = PUT_LIT(p, "\r\n");
    pt_out_commit(r->o, p);
    return 0;
}

/* ma <key> <flags>* */
static int cmd_ma(pt_req *r, int arg)
{
    (void)arg;
    pt_meta m;
    const char *err = NULL;
    store *s = r->ctx->store;
    bool incr = true;
    uint64_t value = 0, cas = 0;

    if (!meta_head(r, false))
        return 0;
    if (meta_parse(r, 2, &m, &err) != 0) {
        REPLY(r, "CLIENT_ERROR invalid or duplicate flag");
        return 0;
    }
    switch (m.M) {
    case 0:
    case 'I':
    case '+':
        break;
    case 'D':
    case '-':
        incr = false;
        break;
    default:
        reply_err(r, "CLIENT_ERROR invalid mode for ma M token");
        return 0;
    }
    if ((err = meta_check(&m)) != NULL) {
        reply_err(r, err);
        return 0;
    }
    if (r->ctx->cfg->route_fn != NULL) {
        proto_target t[PROTO_ROUTE_MAX];
        int nt = proxy_route(r->ctx, m.key, m.nkey, true, t);
        if (nt > 0)
            return relay(r, t, nt, 0, relay_kind(m.q));
    }
    STAT(r, cmd_meta);
    store_arith_req a = {
        .key = m.key,
        .nkey = m.nkey,
        .incr = incr,
        .delta = m.D,
        .cas = m.has_C ? m.C : 0,
        .vivify = m.has_N,
        .initial = m.J,
        .exptime = m.has_N ? store_exptime_abs(s, m.N) : 0,
        /* T: the new ttl goes in the same mutation as the number */
        .touch = m.has_T,
        .touch_exptime = m.has_T ? store_exptime_abs(s, m.T) : 0,
        .new_cas = m.E,
    };
    int rc = store_arith(s, &a, &value, &cas);
    char *p = pt_out_reserve(r->o, PT_LINE_MAX);
    switch (rc) {
    case STORE_OK:
    case STORE_STORED:
        break;
    case STORE_NOT_FOUND:
        if (incr)
            STAT(r, incr_misses);
        else
            STAT(r, decr_misses);
        p = PUT_LIT(p, "NF");
        goto tail;
    case STORE_EXISTS:
        p = PUT_LIT(p, "EX");
        goto tail;
    case STORE_NON_NUMERIC:
        reply_err(r, "CLIENT_ERROR cannot increment or decrement "
                     "non-numeric value");
        return 0;
    default:
        reply_err(r, "SERVER_ERROR out of memory");
        return 0;
    }

    if (rc == STORE_OK) {
        if (incr)
            STAT(r, incr_hits);
        else
            STAT(r, decr_hits);
    }
    int64_t exptime = m.has_T ? a.touch_exptime : a.exptime;
    bool have_item_info = rc == STORE_STORED || m.has_T;
    if (!have_item_info && (meta_has(&m, 't') || meta_has(&m, 'c'))) {
        store_item *it = store_get(s, m.key, m.nkey);
        if (it) {
            exptime = store_item_exptime(it);
            cas = store_item_cas(it);
            store_item_release(it);
        }
    }
    /* memcached hides a quiet success, but not a vivified creation */
    if (m.q && rc == STORE_OK)
        return 0;
    char num[24];
    size_t nnum = (size_t)(pt_fmt_u64(num, value) - num);
    if (m.v) {
        p = PUT_LIT(p, "VA ");
        p = pt_fmt_u64(p, nnum);
    } else {
        p = PUT_LIT(p, "HD");
    }
    for (size_t i = 2; i < r->nt; i++) {
        switch (r->t[i].s[0]) {
        case 'c':
            p = PUT_LIT(p, " c");
            p = pt_fmt_u64(p, r->ctx->cfg->cas_enabled ? cas : 0);
            break;
        case 't':
            p = PUT_LIT(p, " t");
            p = pt_fmt_i64(p, ttl_left(s, exptime));
            break;
        case 'O':
            p = put_opaque(p, &r->t[i]);
            break;
        case 'k':
            p = put_meta_key(p, &m);
            break;
        default:
            break;
        }
    }
    p = PUT_LIT(p, "\r\n");
    if (m.v) {
        p = pt_put_mem(p, num, nnum);
        p = PUT_LIT(p, "\r\n");
    }
    pt_out_commit(r->o, p);
    return 0;

tail:
    p = put_ok_flags(p, r, 2, &m);
    p = PUT_LIT(p, "\r\n");
    pt_out_commit(r->o, p);
    return 0;
}

/* me <key> [b]: memcached's debug line for an item. */
static int cmd_me(pt_req *r, int arg)
{
    (void)arg;
    char kbuf[PT_KEY_MAX];
    const char *key;
    size_t nkey;
    bool bin = false;
    store *s = r->ctx->store;

    if (r->nt < 2 || r->t[1].n > PT_KEY_MAX) {
        REPLY(r, "CLIENT_ERROR bad command line format");
        return 0;
    }
    key = r->t[1].s;
    nkey = r->t[1].n;
    if (r->nt >= 3 && TOK_IS(&r->t[2], "b")) {
        nkey = b64_decode(key, nkey, kbuf);
        key = kbuf;
        bin = true;
        if (nkey == 0) {
            REPLY(r, "CLIENT_ERROR bad command line format");
            return 0;
        }
    } else if (!pt_key_ok(key, nkey)) {
        REPLY(r, "CLIENT_ERROR bad command line format");
        return 0;
    }
    if (r->ctx->cfg->route_fn != NULL) {
        proto_target t[PROTO_ROUTE_MAX];
        int nt = proxy_route(r->ctx, key, nkey, false, t);
        if (nt > 0)
            return relay(r, t, nt, 0, PROXY_TEXT_LINE);
    }
    STAT(r, cmd_meta);
    store_read_info ri;
    store_item *it = store_get_ex(s, key, nkey, &ri);
    if (it == NULL) {
        REPLY(r, "EN");
        return 0;
    }
    size_t nval;
    (void)store_item_value(it, &nval);
    int64_t la = ri.last_access;
    char *p = pt_out_reserve(r->o, PT_LINE_MAX);
    p = PUT_LIT(p, "ME ");
    if (bin)
        p = pt_b64_encode(p, (const unsigned char *)key, nkey);
    else
        p = pt_put_mem(p, key, nkey);
    p = PUT_LIT(p, " exp=");
    p = pt_fmt_i64(p, ttl_left(s, store_item_exptime(it)));
    p = PUT_LIT(p, " la=");
    p = pt_fmt_i64(p, la < 0 ? 0 : la);
    p = PUT_LIT(p, " cas=");
    p = pt_fmt_u64(p, item_cas(r, it));
    p = ri.fetched ? PUT_LIT(p, " fetch=yes") : PUT_LIT(p, " fetch=no");
    p = PUT_LIT(p, " cls=1 size=");
    p = pt_fmt_u64(p, nkey + nval);
    p = PUT_LIT(p, "\r\n");
    pt_out_commit(r->o, p);
    store_item_release(it);
    return 0;
}

/* ============================================================ dispatch */

/* ======================================================= command table */

#define PT_F_NOREPLY 1u /* a last token "noreply" silences the reply */
#define PT_F_KEY 2u     /* token 1 is a key, checked before the handler */
#define PT_ANY (PT_MAX_TOKENS - 1)

/*
 * One text command: its name, how many tokens it takes (the name
 * included; outside the range memcached answers ERROR), what the loop
 * checks for it, and its handler with the handler's argument.
 */
typedef struct pt_cmd {
    const char *name;
    uint8_t len;
    uint8_t min, max;
    uint8_t flags;
    int (*fn)(pt_req *r, int arg);
    int arg;
} pt_cmd;

static int cmd_mn(pt_req *r, int arg)
{
    (void)arg;
    STAT(r, cmd_meta);
    OUT_LIT(r->o, "MN\r\n");
    return 0;
}

static int cmd_quit(pt_req *r, int arg)
{
    (void)r;
    (void)arg;
    return PT_CLOSE;
}

#define CMD(name, min, max, flags, fn, arg)                                   \
    {                                                                         \
        name, sizeof(name) - 1, min, max, flags, fn, arg                      \
    }

/* The busiest commands first: lookup is a scan. */
static const pt_cmd commands[] = {
    CMD("get", 2, PT_ANY, 0, cmd_get, 0),
    CMD("mg", 1, PT_ANY, 0, cmd_mg, 0),
    CMD("set", 5, 6, PT_F_NOREPLY | PT_F_KEY, cmd_store, STORE_SET),
    CMD("ms", 1, PT_ANY, 0, cmd_ms, 0),
    CMD("gets", 2, PT_ANY, 0, cmd_get, PT_GET_CAS),
    CMD("delete", 2, 4, PT_F_KEY, cmd_delete, 0),
    CMD("md", 1, PT_ANY, 0, cmd_md, 0),
    CMD("ma", 1, PT_ANY, 0, cmd_ma, 0),
    CMD("mn", 1, PT_ANY, 0, cmd_mn, 0),
    CMD("me", 1, PT_ANY, 0, cmd_me, 0),
    CMD("incr", 3, 4, PT_F_NOREPLY | PT_F_KEY, cmd_arith, 1),
    CMD("decr", 3, 4, PT_F_NOREPLY | PT_F_KEY, cmd_arith, 0),
    CMD("touch", 3, 4, PT_F_NOREPLY | PT_F_KEY, cmd_touch, 0),
    CMD("gat", 2, PT_ANY, 0, cmd_get, PT_GET_TOUCH),
    CMD("gats", 2, PT_ANY, 0, cmd_get, PT_GET_CAS | PT_GET_TOUCH),
    CMD("add", 5, 6, PT_F_NOREPLY | PT_F_KEY, cmd_store, STORE_ADD),
    CMD("replace", 5, 6, PT_F_NOREPLY | PT_F_KEY, cmd_store, STORE_REPLACE),
    CMD("append", 5, 6, PT_F_NOREPLY | PT_F_KEY, cmd_store, STORE_APPEND),
    CMD("prepend", 5, 6, PT_F_NOREPLY | PT_F_KEY, cmd_store, STORE_PREPEND),
    CMD("cas", 6, 7, PT_F_NOREPLY | PT_F_KEY, cmd_store, STORE_CAS),
    CMD("bget", 2, PT_ANY, 0, cmd_get, 0), /* memcached's ancient alias */
    CMD("flush_all", 1, 3, PT_F_NOREPLY, cmd_flush_all, 0),
    CMD("stats", 1, PT_ANY, 0, pt_cmd_stats, 0),
    CMD("version", 1, PT_ANY, 0, pt_cmd_version, 0),
    CMD("verbosity", 2, 3, PT_F_NOREPLY, pt_cmd_verbosity, 0),
    CMD("quit", 1, PT_ANY, 0, cmd_quit, 0),
    CMD("shutdown", 1, PT_ANY, 0, pt_cmd_shutdown, 0),
    CMD("refresh_certs", 1, 2, PT_F_NOREPLY, pt_cmd_refresh_certs, 0),
    CMD("slabs", 1, PT_ANY, 0, pt_cmd_slabs, 0),
    CMD("cache_memlimit", 2, 3, PT_F_NOREPLY, pt_cmd_cache_memlimit, 0),
    CMD("lru_crawler", 2, 3, 0, pt_cmd_lru_crawler, 0),
    CMD("watch", 1, PT_ANY, 0, pt_cmd_watch, 0),
    CMD("proxy_hello", 1, PT_ANY, 0, cmd_proxy_hello, 0),
};

/*
 * -Y (memcached's ascii auth): until a connection has authenticated, the
 * only request taken is "set <key> <flags> <exptime> <bytes>" whose data
 * is "<user> <password>"; key, flags and exptime are ignored and nothing
 * is stored. Anything else answers CLIENT_ERROR unauthenticated.
 */
static int cmd_auth(pt_req *r)
{
    int64_t vlen;

    if (r->nt < 5 || !TOK_IS(&r->t[0], "set") ||
        !pt_parse_i64(r->t[4].s, r->t[4].n, &vlen) || vlen < 0 ||
        vlen > PT_AUTH_MAX) {
        REPLY(r, "CLIENT_ERROR unauthenticated");
        return 0;
    }
    if (r->avail < (size_t)vlen + 2) {
        r->need = r->linesz + (size_t)vlen + 2;
        return PT_NEED;
    }
    const char *d = r->data, *e = d + vlen;
    if (d[vlen] != '\r' || d[vlen + 1] != '\n') {
        REPLY(r, "CLIENT_ERROR bad command line termination");
        return (int)vlen + 2;
    }
    const char *sp = memchr(d, ' ', (size_t)vlen);
    const char *pass = sp != NULL ? sp + 1 : e;
    const char *pe = memchr(pass, ' ', (size_t)(e - pass));
    if (sp == NULL || sp == d || pass == e) {
        STAT(r, auth_errors);
        REPLY(r, "CLIENT_ERROR bad authentication token format");
    } else if (authfile_check(r->ctx->cfg->auth, d, (size_t)(sp - d), pass,
                              (size_t)((pe != NULL ? pe : e) - pass))) {
        r->ctx->authenticated = true;
        REPLY(r, "STORED");
    } else {
        STAT(r, auth_errors);
        REPLY(r, "CLIENT_ERROR authentication failure");
    }
    STAT(r, auth_cmds);
    return (int)vlen + 2;
}

static const pt_cmd *find_cmd(const pt_tok *t)
{
    for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++) {
        const pt_cmd *c = &commands[i];
        if (c->len == t->n && c->name[0] == t->s[0] &&
            memcmp(c->name, t->s, t->n) == 0)
            return c;
    }
    return NULL;
}

/*
 * Executes the request whose line is r->line. Returns the bytes of data
 * block it consumed after the line (>= 0), or PT_NEED/PT_CLOSE/PT_SHUTDOWN.
 */
static int dispatch(pt_req *r)
{
    tokenize(r);
    if (!r->ctx->authenticated)
        return cmd_auth(r);
    const pt_cmd *c = r->nt > 0 ? find_cmd(&r->t[0]) : NULL;
    if (c == NULL) {
        /* memcached hangs up on what looks like an HTTP request */
        if (r->nt > 1 && r->t[r->nt - 1].n >= 5 &&
            memcmp(r->t[r->nt - 1].s, "HTTP/", 5) == 0)
            return PT_CLOSE_ERROR;
        REPLY(r, "ERROR");
        return 0;
    }
    if (r->nt < c->min || r->nt > c->max) {
        REPLY(r, "ERROR");
        return 0;
    }
    if ((c->flags & PT_F_NOREPLY) && r->nt > 1)
        r->noreply = TOK_IS(&r->t[r->nt - 1], "noreply");
    if ((c->flags & PT_F_KEY) && !pt_key_ok(r->t[1].s, r->t[1].n)) {
        REPLY(r, "CLIENT_ERROR bad command line format");
        return 0;
    }
    return c->fn(r, c->arg);
}

/* ============================================================ long gets */

/*
 * A retrieval line longer than PT_STREAM_MIN bytes (memcached takes a get
 * of any length) is not buffered whole: its command (and gat's exptime)
 * is read first, then its keys are looked up as they arrive, a complete
 * key at a time, and END follows the newline. Memory stays bounded by the
 * part of the line not yet consumed. A key longer than 250 bytes ends the
 * stream with CLIENT_ERROR (values already sent stay sent) and the rest
 * of the line is dropped. Relayed gets (scale-out) are not streamed:
 * there the line is bounded by max_line.
 */

/* If p (n bytes, no newline yet) starts a retrieval command, begins the
 * stream and returns the bytes of its head; 0 otherwise. */
static size_t stream_begin(proto_ctx *ctx, pt_state *st, const char *p,
                           size_t n)
{
    const char *e = p + n, *q = memchr(p, ' ', n);

    if (ctx->cfg->route_fn != NULL || !ctx->authenticated || q == NULL)
        return 0;
    /* a retrieval command is one whose table row runs cmd_get */
    pt_tok name = {p, (size_t)(q - p)};
    const pt_cmd *c = find_cmd(&name);
    if (c == NULL || c->fn != cmd_get)
        return 0;
    st->stream_exptime = 0;
    if (c->arg & PT_GET_TOUCH) {
        while (q < e && *q == ' ')
            q++;
        const char *sp = memchr(q, ' ', (size_t)(e - q));
        if (sp == NULL ||
            !pt_parse_i64(q, (size_t)(sp - q), &st->stream_exptime))
            return 0; /* served (or refused) as an ordinary line */
        st->stream_exptime = store_exptime_abs(ctx->store, st->stream_exptime);
        q = sp;
    }
    st->stream = true;
    st->stream_get = (uint8_t)c->arg;
    return (size_t)(q - p);
}

/*
 * Serves the keys in p[0, n): all of them when the line ends at p[n]
 * (final; then END, and the newline is consumed), else those before the
 * last space. Returns the bytes consumed; 0 when no key is complete yet.
 */
static size_t stream_keys(pt_req *r, const char *p, size_t n, bool final)
{
    pt_state *st = r->st;
    size_t end = n;

    if (final && end > 0 && p[end - 1] == '\r')
        end--;
    if (!final) {
        const char *sp = p + n;
        while (sp > p && sp[-1] != ' ')
            sp--;
        end = (size_t)(sp - p);
        if (end == 0) {
            if (n <= PT_KEY_MAX)
                return 0; /* one key, still arriving */
            end = n;      /* a key too long: refused below */
        }
    }
    const char *q = p, *e = p + end;
    pt_tok k;
    while (next_key(&q, e, &k)) {
        if (!pt_key_ok(k.s, k.n)) {
            REPLY(r, "CLIENT_ERROR bad command line format");
            st->stream = false;
            st->skip_line = !final;
            return final ? n + 1 : n;
        }
        get_one(r, &k, st->stream_get & PT_GET_CAS,
                st->stream_get & PT_GET_TOUCH, st->stream_exptime);
    }
    if (!final)
        return end;
    OUT_LIT(r->o, "END\r\n");
    st->stream = false;
    return n + 1;
}

/* ================================================================ loop */

static pt_state *state_of(proto_ctx *ctx)
{
    if (ctx->text == NULL)
        ctx->text = calloc(1, sizeof(pt_state));
    return ctx->text;
}

void proto_text_free(proto_ctx *ctx)
{
    if (ctx->text != NULL)
        pt_dump_free(ctx->text);
    free(ctx->text);
    ctx->text = NULL;
}

/* A contiguous view of the front of the input: the input buffer's first
 * piece or, while `flat`, the whole of the worker memory lent as input
 * (proto.h). */
typedef struct pt_view {
    struct evbuffer *in;
    const char *base; /* start of the view (the buffer's first byte) */
    size_t len;       /* bytes in the view */
    size_t off;       /* bytes of the view consumed, not yet drained */
    bool flat;        /* the view is lent memory; `in` is empty */
} pt_view;

static void view_peek(pt_view *v)
{
    struct evbuffer_iovec vec;
    if (evbuffer_peek(v->in, -1, NULL, &vec, 1) < 1) {
        v->base = NULL;
        v->len = 0;
    } else {
        v->base = vec.iov_base;
        v->len = vec.iov_len;
    }
    v->off = 0;
}

static void view_drain(pt_view *v)
{
    if (v->off == 0)
        return;
    if (v->flat) {
        v->base += v->off;
        v->len -= v->off;
    } else {
        evbuffer_drain(v->in, v->off);
    }
    v->off = 0;
}

/*
 * Makes at least `need` unconsumed bytes contiguous (or all there are, if
 * fewer). Returns how many unconsumed bytes the view now holds.
 */
static size_t view_grow(pt_view *v, size_t need)
{
    view_drain(v);
    if (v->flat)
        return v->len; /* lent memory is contiguous: all there is */
    size_t total = evbuffer_get_length(v->in);
    if (need > total)
        need = total;
    if (need > 0 && evbuffer_pullup(v->in, (ev_ssize_t)need) == NULL)
        need = 0;
    view_peek(v);
    return v->len;
}

static size_t view_total(pt_view *v)
{
    if (v->flat)
        return v->len - v->off;
    return evbuffer_get_length(v->in) - v->off;
}

/* Starts the view on the lent input, or on `in` when nothing is lent.
 * Returns -1 when lent bytes could not be kept (no memory). */
static int view_start(pt_view *v, proto_ctx *ctx)
{
    const char *lent = ctx->in_flat;
    size_t n = ctx->in_flat_len;
    ctx->in_flat = NULL;
    ctx->in_flat_len = 0;
    v->flat = false;
    if (lent != NULL && n > 0) {
        if (evbuffer_get_length(v->in) == 0) {
            v->flat = true;
            v->base = lent;
            v->len = n;
            v->off = 0;
            return 0;
        }
        /* behind input already kept: keep these too (proto.h) */
        if (evbuffer_add(v->in, lent, n) != 0)
            return -1;
    }
    view_peek(v);
    return 0;
}

/* Consumed bytes leave the view; lent bytes not consumed go to `in`, as
 * the caller's memory is not ours after the call. Returns -1 when they
 * could not (no memory). */
static int view_end(pt_view *v)
{
    view_drain(v);
    if (!v->flat || v->len == 0)
        return 0;
    v->flat = false;
    return evbuffer_add(v->in, v->base, v->len);
}

int proto_text_execute(proto_ctx *ctx, struct evbuffer *in,
                       struct evbuffer *out)
{
    pt_state *st = state_of(ctx);
    pt_out o;
    pt_view v = {.in = in};
    size_t max_line =
        ctx->cfg->max_line ? ctx->cfg->max_line : PT_DEFAULT_MAX_LINE;
    int rc = PROTO_OK;

    ctx->out_flat_len = 0;
    if (st == NULL || view_start(&v, ctx) != 0) {
        evbuffer_add(out, "SERVER_ERROR out of memory\r\n", 28);
        return PROTO_CLOSE;
    }
    o.ev = out;
    o.base = out;
    o.n = 0;
    o.buf = o.own;
    if (ctx->out_flat != NULL && ctx->out_flat_cap >= PT_OUTBUF)
        o.buf = ctx->out_flat;
    if (ctx->proxy != NULL)
        o.ev = proxy_out(ctx, out); /* behind the replies in flight */
    ctx->executed = 0;
    ctx->yielded = false;
    ctx->mid_request = false;
    for (;;) {
        if (st->dump != PT_DUMP_NONE) {
            /* a dump or watch started by an earlier request goes on */
            pt_req d = {.ctx = ctx, .st = st, .o = &o};
            if (st->dump == PT_DUMP_WATCH) {
                /* a watching connection sends nothing more that counts */
                v.off = v.len;
                view_drain(&v);
                evbuffer_drain(in, evbuffer_get_length(in));
            }
            if (!pt_dump_step(&d, ctx->cfg->output_max)) {
                rc = st->dump == PT_DUMP_WATCH ? PROTO_IDLE : PROTO_PAUSED;
                break;
            }
            continue;
        }
        size_t avail = v.len - v.off;
        if (avail == 0) {
            if (view_total(&v) == 0)
                break;
            view_grow(&v, 1);
            continue;
        }
        const char *p = v.base + v.off;
        /*
         * Between requests: a client that pipelines more than it reads
         * waits here (its requests stay in `in`), so memory follows the
         * replies it takes, not the requests it sends.
         */
        if (!st->swallow && !st->skip_line && ctx->cfg->reqs_per_event &&
            ctx->executed >= ctx->cfg->reqs_per_event) {
            /* -R: let the worker's other connections have a turn */
            ctx->yielded = true;
            rc = PROTO_PAUSED;
            break;
        }
        if (!st->swallow && !st->skip_line &&
            ((ctx->cfg->output_max &&
              evbuffer_get_length(out) + o.n > ctx->cfg->output_max) ||
             (ctx->proxy != NULL && proxy_blocked(ctx, out)))) {
            rc = PROTO_PAUSED;
            break;
        }
        if (st->swallow) {
            size_t n = avail < st->swallow ? avail : (size_t)st->swallow;
            v.off += n;
            st->swallow -= n;
            continue;
        }
        const char *nl = memchr(p, '\n', avail);
        if (st->skip_line) {
            v.off += nl ? (size_t)(nl - p) + 1 : avail;
            st->skip_line = nl == NULL;
            continue;
        }
        if (!st->stream && nl == NULL && avail >= PT_STREAM_MIN &&
            avail < max_line + 1) {
            size_t head = stream_begin(ctx, st, p, avail);
            v.off += head;
            if (head > 0)
                continue;
        }
        if (st->stream) {
            pt_req r = {.ctx = ctx, .st = st, .o = &o};
            size_t n = nl ? (size_t)(nl - p) : avail;
            size_t used = stream_keys(&r, p, n, nl != NULL);
            v.off += used;
            if (used > 0)
                continue;
            /* one key split across the buffer's pieces: join them */
            size_t total = view_total(&v);
            if (total > avail && view_grow(&v, avail + PT_KEY_MAX + 2) > avail)
                continue;
            break; /* wait for the rest of the key */
        }
        if (nl == NULL) {
            if (avail > max_line) {
                /* no newline within max_line: refuse, drop up to it */
                OUT_LIT(&o, "CLIENT_ERROR line too long\r\n");
                st->skip_line = true;
                continue;
            }
            size_t total = view_total(&v);
            size_t want = total < max_line + 1 ? total : max_line + 1;
            if (want > avail && view_grow(&v, want) > avail)
                continue;
            break; /* wait for the rest of the line */
        }
        size_t linesz = (size_t)(nl - p) + 1;
        if (linesz > max_line) {
            OUT_LIT(&o, "CLIENT_ERROR line too long\r\n");
            v.off += linesz;
            continue;
        }
        pt_req r;
        r.ctx = ctx;
        r.st = st;
        r.o = &o;
        r.line = p;
        r.len = linesz - 1;
        if (r.len > 0 && p[r.len - 1] == '\r')
            r.len--;
        r.linesz = linesz;
        r.data = nl + 1;
        r.avail = avail - linesz;
        r.need = 0;
        r.noreply = false;
        int used = dispatch(&r);
        if (used == PT_NEED) {
            if (view_total(&v) >= r.need && view_grow(&v, r.need) >= r.need)
                continue; /* now contiguous: run the request again */
            ctx->mid_request = true;
            break;
        }
        ctx->executed++;
        if (used == PT_CLOSE || used == PT_SHUTDOWN ||
            used == PT_CLOSE_ERROR) {
            v.off += linesz;
            rc = used == PT_CLOSE      ? PROTO_CLOSE
                 : used == PT_SHUTDOWN ? PROTO_SHUTDOWN
                                       : PROTO_CLOSE_ERROR;
            break;
        }
        v.off += linesz + (size_t)used;
    }
    if (view_end(&v) != 0) {
        OUT_LIT(&o, "SERVER_ERROR out of memory\r\n");
        rc = PROTO_CLOSE;
    }
    if (o.buf == ctx->out_flat && o.ev == out)
        ctx->out_flat_len = o.n; /* the last replies stay where they are */
    else
        pt_out_flush(&o);
    return rc;
}
