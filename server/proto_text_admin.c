/*
 * proto_text_admin.c -- text commands about the server rather than keys:
 * stats, slabs, cache_memlimit, lru_crawler and its dumps, watch,
 * verbosity, version, shutdown (see proto_text_int.h).
 *
 * Dumps (lru_crawler metadump / mgdump) and watch outlive their request:
 * the handler records them in the connection's text state, and the
 * request loop calls pt_dump_step before it reads the next request. A
 * dump walks the key table a stripe at a time (store_walk) and stops
 * whenever the output holds more than the connection's output_max, so a
 * dump of any size needs memory for one stripe's lines, not for the whole
 * cache; requests pipelined behind it wait until it ends, in order.
 */
#include "proto_text_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/buffer.h>

#include "prefix_stats.h"
#include "watch.h"

/* verbosity <level> [noreply] */
int pt_cmd_verbosity(pt_req *r, int arg)
{
    uint32_t level;

    (void)arg;
    if (!pt_parse_u32(r->t[1].s, r->t[1].n, &level)) {
        REPLY(r, "CLIENT_ERROR bad command line format");
        return 0;
    }
    r->ctx->verbose = level > PT_VERBOSITY_MAX ? PT_VERBOSITY_MAX : (int)level;
    REPLY(r, "OK");
    return 0;
}

/*
 * slabs automove <0|1|2> | slabs reassign <src> <dst>. There is one class
 * (items are allocated at their size, see stats slabs): automove is
 * accepted, a reassignment names a class that does not exist or the same
 * class twice, answered as memcached answers those.
 */
int pt_cmd_slabs(pt_req *r, int arg)
{
    uint32_t v, src, dst;

    (void)arg;
    if (r->nt == 3 && TOK_IS(&r->t[1], "automove")) {
        if (!pt_parse_u32(r->t[2].s, r->t[2].n, &v) || v > 2) {
            REPLY(r, "CLIENT_ERROR bad command line format");
            return 0;
        }
        REPLY(r, "OK");
        return 0;
    }
    if (r->nt == 4 && TOK_IS(&r->t[1], "reassign")) {
        bool any = r->t[2].n == 2 && memcmp(r->t[2].s, "-1", 2) == 0;
        if (!any && !pt_parse_u32(r->t[2].s, r->t[2].n, &src)) {
            REPLY(r, "CLIENT_ERROR bad command line format");
            return 0;
        }
        if (!pt_parse_u32(r->t[3].s, r->t[3].n, &dst)) {
            REPLY(r, "CLIENT_ERROR bad command line format");
            return 0;
        }
        if (!any && src == dst)
            REPLY(r, "SAME src and dst class are identical");
        else
            REPLY(r, "BADCLASS invalid src or dst class");
        return 0;
    }
    REPLY(r, "ERROR");
    return 0;
}

/* cache_memlimit <megabytes> [noreply]: the memory limit, at run time. */
int pt_cmd_cache_memlimit(pt_req *r, int arg)
{
    uint64_t mb;

    (void)arg;
    if (!pt_parse_u64(r->t[1].s, r->t[1].n, &mb) || mb > (1ULL << 40)) {
        REPLY(r, "CLIENT_ERROR bad command line format");
        return 0;
    }
    /* memcached's floor, and ours: the record table must fit below. */
    if (mb < 8 ||
        store_set_memory_limit(r->ctx->store, (size_t)mb << 20) != STORE_OK) {
        REPLY(r, "MEMLIMIT_TOO_SMALL cannot set maxbytes to less than 8m");
        return 0;
    }
    REPLY(r, "OK");
    return 0;
}

static void emit_stat(void *arg, const char *name, const char *value)
{
    pt_out *o = arg;
    size_t nn = strlen(name), nv = strlen(value);
    if (nn + nv + 9 > PT_OUTBUF) /* never for real stats; stay correct */
        return;
    char *p = pt_out_reserve(o, nn + nv + 9);
    p = PUT_LIT(p, "STAT ");
    p = pt_put_mem(p, name, nn);
    *p++ = ' ';
    p = pt_put_mem(p, value, nv);
    p = PUT_LIT(p, "\r\n");
    pt_out_commit(o, p);
}

/* stats [group]: the daemon lists the groups; "reset" and "detail" here. */
/* One `stats detail dump` line (prefix_stats_dump callback). */
static void detail_line(void *arg, const char *text, size_t len)
{
    pt_out *o = arg;
    if (len + 2 > PT_OUTBUF)
        return;
    char *p = pt_out_reserve(o, len + 2);
    p = pt_put_mem(p, text, len);
    p = PUT_LIT(p, "\r\n");
    pt_out_commit(o, p);
}

static int pt_stats_list(pt_req *r, const char *group, stats_emit_fn emit,
                         void *arg)
{
    const proto_config *cfg = r->ctx->cfg;
    return cfg->stats_list != NULL ? cfg->stats_list(group, emit, arg) : -1;
}

/* memcached's cap on a cachedump reply */
#define PT_CACHEDUMP_MAX (2u * 1024u * 1024u)

typedef struct cachedump_walk {
    pt_out *o;
    uint32_t limit; /* 0 = as many as fit */
    uint32_t shown;
    size_t bytes;
} cachedump_walk;

static void cachedump_line(void *arg, const store_item_info *ii)
{
    cachedump_walk *d = arg;
    size_t n = ii->nkey + 64;

    if ((d->limit != 0 && d->shown >= d->limit) ||
        d->bytes + n + 5 > PT_CACHEDUMP_MAX)
        return;
    char *p = pt_out_reserve(d->o, n), *start = p;
    p = PUT_LIT(p, "ITEM ");
    p = pt_put_mem(p, ii->key, ii->nkey);
    p = PUT_LIT(p, " [");
    p = pt_fmt_u64(p, ii->nvalue);
    p = PUT_LIT(p, " b; ");
    p = pt_fmt_i64(p, ii->exptime);
    p = PUT_LIT(p, " s]\r\n");
    d->bytes += (size_t)(p - start);
    d->shown++;
    pt_out_commit(d->o, p);
}

/*
 * stats cachedump <class> <limit>: "ITEM key [bytes b; exptime s]" for
 * up to limit live items (0: as many as fit in 2 MB), as memcached lists
 * one slab class. Every item is in class 1 here.
 */
static int cachedump(pt_req *r)
{
    uint32_t id, limit;
    cachedump_walk d = {.o = r->o};

    if (r->ctx->cfg->dump_disabled) {
        REPLY(r, "CLIENT_ERROR stats cachedump not allowed");
        return 0;
    }
    if (r->nt < 4) {
        REPLY(r, "CLIENT_ERROR bad command line");
        return 0;
    }
    if (!pt_parse_u32(r->t[2].s, r->t[2].n, &id) ||
        !pt_parse_u32(r->t[3].s, r->t[3].n, &limit)) {
        REPLY(r, "CLIENT_ERROR bad command line format");
        return 0;
    }
    if (id >= 64) {
        REPLY(r, "CLIENT_ERROR Illegal slab id");
        return 0;
    }
    d.limit = limit;
    if (id == 1) {
        size_t cursor = 0;
        while ((limit == 0 || d.shown < limit) &&
               d.bytes + PT_KEY_MAX + 64 < PT_CACHEDUMP_MAX &&
               store_walk(r->ctx->store, &cursor, limit ? limit : 4096,
                          cachedump_line, &d))
            ;
    }
    OUT_LIT(r->o, "END\r\n");
    return 0;
}

int pt_cmd_stats(pt_req *r, int arg)
{
    char group[64];

    (void)arg;
    if (r->nt == 1) {
        pt_stats_list(r, "", emit_stat, r->o);
        OUT_LIT(r->o, "END\r\n");
        return 0;
    }
    const pt_tok *g = &r->t[1];
    if (TOK_IS(g, "reset")) {
        if (r->ctx->cfg->stats_reset != NULL)
            r->ctx->cfg->stats_reset();
        REPLY(r, "RESET");
        return 0;
    }
    if (TOK_IS(g, "detail")) {
        if (r->nt == 3 &&
            (TOK_IS(&r->t[2], "on") || TOK_IS(&r->t[2], "off"))) {
            prefix_stats_enable(TOK_IS(&r->t[2], "on"));
            REPLY(r, "OK");
        } else if (r->nt == 3 && TOK_IS(&r->t[2], "dump")) {
            prefix_stats_dump(detail_line, r->o);
            OUT_LIT(r->o, "END\r\n");
        } else {
            REPLY(r, "CLIENT_ERROR usage: stats detail on|off|dump");
        }
        return 0;
    }
    if (TOK_IS(g, "cachedump"))
        return cachedump(r);
    if (g->n >= sizeof(group)) {
        REPLY(r, "ERROR");
        return 0;
    }
    memcpy(group, g->s, g->n);
    group[g->n] = '\0';
    /* a failed group may have emitted lines: list into a side buffer */
    pt_out *side = malloc(sizeof(*side));
    if (side == NULL) {
        REPLY(r, "SERVER_ERROR out of memory writing stats");
        return 0;
    }
    side->ev = evbuffer_new();
    side->n = 0;
    side->buf = side->own;
    if (side->ev == NULL) {
        free(side);
        REPLY(r, "SERVER_ERROR out of memory writing stats");
        return 0;
    }
    if (pt_stats_list(r, group, emit_stat, side) == 0) {
        pt_out_flush(side);
        pt_out_flush(r->o);
        evbuffer_add_buffer(r->o->ev, side->ev);
        OUT_LIT(r->o, "END\r\n");
    } else {
        REPLY(r, "ERROR");
    }
    evbuffer_free(side->ev);
    free(side);
    return 0;
}

/* shutdown [graceful] */
int pt_cmd_shutdown(pt_req *r, int arg)
{
    (void)arg;
    if (!r->ctx->cfg->shutdown_enabled) {
        REPLY(r, "ERROR: shutdown not enabled");
        return 0;
    }
    if (r->nt == 1 || (r->nt == 2 && TOK_IS(&r->t[1], "graceful")))
        return PT_SHUTDOWN;
    REPLY(r, "CLIENT_ERROR invalid shutdown mode");
    return 0;
}

/*
 * refresh_certs [noreply]: the TLS certificate, key and CA files are read
 * again; new connections use them, open ones keep theirs. A file that
 * does not load keeps the old ones: SERVER_ERROR with OpenSSL's reason.
 */
int pt_cmd_refresh_certs(pt_req *r, int arg)
{
    char err[512] = "TLS not enabled";
    (void)arg;
    if (r->ctx->cfg->refresh_certs == NULL ||
        r->ctx->cfg->refresh_certs(err, sizeof(err)) != 0) {
        char line[600];
        int n = snprintf(line, sizeof(line), "SERVER_ERROR %s", err);
        pt_reply(r, line,
                 (size_t)n < sizeof(line) ? (size_t)n : sizeof(line) - 1);
        return 0;
    }
    REPLY(r, "OK");
    return 0;
}

int pt_cmd_version(pt_req *r, int arg)
{
    (void)arg;
    const char *v = r->ctx->cfg->version ? r->ctx->cfg->version : "";
    OUT_LIT(r->o, "VERSION ");
    pt_out_put(r->o, v, strlen(v));
    OUT_LIT(r->o, "\r\n");
    return 0;
}

/* ========================================================== lru_crawler */

/* Stripes a dump walks per step before it looks at the output again. */
#define PT_DUMP_BUDGET 256

/* Output already waiting in this batch: a dump must start a reply of its
 * own (memcached: "cannot pipeline other commands before ..."). */
static bool has_pending(const pt_req *r)
{
    return r->o->n > 0 || (r->o->ev != r->o->base) ||
           evbuffer_get_length(r->o->ev) > 0;
}

/*
 * lru_crawler metadump|mgdump <classes|all|hash>: one line per live item
 * (metadump: memcached's key=... line; mgdump: "mg <key>" to feed back as
 * meta gets). There is one item class (1): a list naming it, "all" and
 * "hash" all walk the key table. lru_crawler crawl answers OK: expired
 * items are swept continuously here. enable / disable / sleep / tocrawl
 * are accepted.
 */
int pt_cmd_lru_crawler(pt_req *r, int arg)
{
    (void)arg;
    const pt_tok *sub = &r->t[1];

    if (r->nt == 3 && (TOK_IS(sub, "metadump") || TOK_IS(sub, "mgdump"))) {
        bool mg = TOK_IS(sub, "mgdump");
        if (r->ctx->cfg->dump_disabled) {
            if (mg)
                REPLY(r, "ERROR mgdump not allowed");
            else
                REPLY(r, "ERROR metadump not allowed");
            return 0;
        }
        const pt_tok *cls = &r->t[2];
        bool ours = true;
        if (!TOK_IS(cls, "all") && !TOK_IS(cls, "hash")) {
            /* a list of class ids: 1 is ours, 2..63 are empty */
            ours = false;
            for (size_t i = 0, j; i < cls->n; i = j + 1) {
                uint32_t id;
                for (j = i; j < cls->n && cls->s[j] != ','; j++)
                    ;
                if (!pt_parse_u32(cls->s + i, j - i, &id) || id == 0 ||
                    id > 63) {
                    REPLY(r, "BADCLASS invalid class id");
                    return 0;
                }
                ours = ours || id == 1;
            }
        }
        if (has_pending(r)) {
            if (mg)
                REPLY(r, "ERROR cannot pipeline other commands before mgdump");
            else
                REPLY(r,
                      "ERROR cannot pipeline other commands before metadump");
            return 0;
        }
        if (!ours) {
            if (mg)
                OUT_LIT(r->o, "EN\r\n");
            else
                OUT_LIT(r->o, "END\r\n");
            return 0;
        }
        r->st->dump = mg ? PT_DUMP_MG : PT_DUMP_META;
        r->st->dump_cursor = 0;
        return 0;
    }
    if (r->nt == 3 && TOK_IS(sub, "crawl")) {
        REPLY(r, "OK");
        return 0;
    }
    if (r->nt == 3 && (TOK_IS(sub, "sleep") || TOK_IS(sub, "tocrawl"))) {
        uint32_t v;
        if (!pt_parse_u32(r->t[2].s, r->t[2].n, &v)) {
            REPLY(r, "CLIENT_ERROR bad command line format");
            return 0;
        }
        if (TOK_IS(sub, "sleep") && v > 1000000) {
            REPLY(r, "CLIENT_ERROR sleep must be one second or less");
            return 0;
        }
        REPLY(r, "OK");
        return 0;
    }
    if (r->nt == 2 && (TOK_IS(sub, "enable") || TOK_IS(sub, "disable"))) {
        REPLY(r, "OK");
        return 0;
    }
    REPLY(r, "ERROR");
    return 0;
}

typedef struct dump_walk {
    pt_req *r;
    bool mg;
    bool cas_enabled;
} dump_walk;

/* One line of a dump (store_walk callback). */
static void dump_line(void *arg, const store_item_info *ii)
{
    dump_walk *d = arg;
    pt_out *o = d->r->o;
    char *p = pt_out_reserve(o, 3 * PT_KEY_MAX + 160);

    if (d->mg) {
        bool plain = true;
        for (size_t i = 0; i < ii->nkey; i++)
            if ((unsigned char)ii->key[i] <= ' ')
                plain = false;
        p = PUT_LIT(p, "mg ");
        if (plain) {
            p = pt_put_mem(p, ii->key, ii->nkey);
        } else {
            p = pt_b64_encode(p, (const unsigned char *)ii->key, ii->nkey);
            p = PUT_LIT(p, " b");
        }
        p = PUT_LIT(p, "\r\n");
    } else {
        /* memcached 1.6's metadump line; la is the last access */
        p = PUT_LIT(p, "key=");
        p = watch_uriencode(p, ii->key, ii->nkey);
        p = PUT_LIT(p, " exp=");
        p = pt_fmt_i64(p, ii->exptime == 0 ? -1 : ii->exptime);
        p = PUT_LIT(p, " la=");
        p = pt_fmt_i64(p, ii->atime);
        p = PUT_LIT(p, " cas=");
        p = pt_fmt_u64(p, d->cas_enabled ? ii->cas : 0);
        p = ii->fetched ? PUT_LIT(p, " fetch=yes") : PUT_LIT(p, " fetch=no");
        p = PUT_LIT(p, " cls=1 size=");
        p = pt_fmt_u64(p, ii->size);
        p = PUT_LIT(p, "\n");
    }
    pt_out_commit(o, p);
}

bool pt_dump_step(pt_req *r, size_t limit)
{
    pt_state *st = r->st;

    if (st->dump == PT_DUMP_WATCH) {
        pt_out_flush(r->o);
        watch_take(st->watch, r->o->ev);
        return false; /* until the client hangs up */
    }
    dump_walk d = {r, st->dump == PT_DUMP_MG, r->ctx->cfg->cas_enabled};
    for (;;) {
        if (!store_walk(r->ctx->store, &st->dump_cursor, PT_DUMP_BUDGET,
                        dump_line, &d)) {
            if (d.mg)
                OUT_LIT(r->o, "EN\r\n");
            else
                OUT_LIT(r->o, "END\r\n");
            st->dump = PT_DUMP_NONE;
            return true;
        }
        if (limit != 0 && evbuffer_get_length(r->o->ev) + r->o->n > limit)
            return false;
    }
}

/* ================================================================= watch */

/*
 * watch [fetchers|mutations|evictions|connevents ...]: the connection
 * turns into a stream of event lines (watch.h) until the client hangs up.
 * Without arguments, fetchers. Kinds memcached has and this server does
 * not produce (rawcmds, sysevents, proxy*) are accepted and stay silent.
 */
int pt_cmd_watch(pt_req *r, int arg)
{
    unsigned mask = 0;

    (void)arg;
    if (r->ctx->cfg->watch_disabled) {
        REPLY(r, "CLIENT_ERROR watch commands not allowed");
        return 0;
    }
    if (has_pending(r)) {
        REPLY(r, "ERROR cannot pipeline other commands before watch");
        return 0;
    }
    for (size_t i = 1; i < r->nt; i++) {
        const pt_tok *t = &r->t[i];
        if (TOK_IS(t, "fetchers"))
            mask |= WATCH_FETCHERS;
        else if (TOK_IS(t, "mutations"))
            mask |= WATCH_MUTATIONS;
        else if (TOK_IS(t, "evictions"))
            mask |= WATCH_EVICTIONS;
        else if (TOK_IS(t, "connevents"))
            mask |= WATCH_CONNEVENTS;
        else if (!(TOK_IS(t, "rawcmds") || TOK_IS(t, "sysevents") ||
                   TOK_IS(t, "proxyreqs") || TOK_IS(t, "proxyevents") ||
                   TOK_IS(t, "proxyuser") || TOK_IS(t, "deletions"))) {
            REPLY(r, "ERROR");
            return 0;
        }
    }
    if (r->nt == 1)
        mask = WATCH_FETCHERS;
    int rc = watch_subscribe(mask, &r->st->watch);
    if (rc == WATCH_ERR_TOO_MANY) {
        REPLY(r, "WATCHER_TOO_MANY log watcher limit reached");
        return 0;
    }
    if (rc != WATCH_OK) {
        REPLY(r, "WATCHER_FAILED failed to add log watcher");
        return 0;
    }
    r->st->dump = PT_DUMP_WATCH;
    OUT_LIT(r->o, "OK\r\n");
    return 0;
}

void pt_dump_free(pt_state *st)
{
    watch_unsubscribe(st->watch);
    st->watch = NULL;
    st->dump = PT_DUMP_NONE;
}
