/*
 * fuzz_feed.c -- shared plumbing of the client protocol fuzz targets (see
 * fuzz_feed.h).
 */
#include "fuzz_feed.h"

#include <stdlib.h>
#include <string.h>

#include <event2/buffer.h>

#include "authfile.h"
#include "options.h"
#include "proto_ctx.h"
#include "stats_registry.h"

/*
 * Item memory. Fuzz inputs are a few kilobytes, so the limit is far below
 * the daemon's: a handful of sets already reach it and eviction runs.
 */
#define FUZZ_MEMORY_LIMIT (64u << 10)
/* A reply backlog past which the client "reads" (drains) it. */
#define FUZZ_OUT_DRAIN (1u << 20)
/* 2023-11-14 in nanoseconds; the clock then moves 1 ms per reading. */
#define FUZZ_T0_NS 1700000000000000000ULL

static uint64_t fuzz_clock_ns;
static options fuzz_opts;
static bool fuzz_opts_ready;
static authfile *fuzz_users; /* SASL's, made once, kept for the process */

/* A deterministic clock, so every crash replays exactly. */
static uint64_t fuzz_clock(void *arg)
{
    (void)arg;
    fuzz_clock_ns += 1000000;
    return fuzz_clock_ns;
}

/* The daemon's defaults, taken from the options table it uses. */
static void fill_config(proto_config *cfg, bool sasl)
{
    if (!fuzz_opts_ready) {
        options_init(&fuzz_opts);
        fuzz_opts_ready = true;
    }
    memset(cfg, 0, sizeof(*cfg));
    cfg->item_size_max = (size_t)fuzz_opts.item_size_max;
    cfg->sasl = sasl;
    if (fuzz_users == NULL) {
        static const char text[] = "fuzz:secret\n";
        int rc;
        fuzz_users = authfile_parse(text, sizeof(text) - 1, &rc, NULL);
    }
    cfg->sasl_auth = fuzz_users;
    cfg->flush_enabled = fuzz_opts.flush_enabled;
    cfg->shutdown_enabled = true; /* reach the shutdown path too */
    cfg->cas_enabled = fuzz_opts.cas_enabled;
    cfg->max_line = (size_t)fuzz_opts.max_line;
    /* Small, so that pausing between requests is exercised too. */
    cfg->output_max = 4096;
    cfg->version = RIBLTCACHE_VERSION;
}

static void drain(struct evbuffer *out, size_t keep)
{
    size_t n = evbuffer_get_length(out);
    if (n > keep) {
        evbuffer_drain(out, n - keep);
    }
}

int fuzz_feed_run(fuzz_feed_exec_fn exec, const uint8_t *data, size_t size,
                  uint8_t sep, bool sasl, bool lend)
{
    store_options so;
    proto_config cfg;
    stats_thread sth;
    proto_ctx ctx;
    int err = 0;

    fuzz_clock_ns = FUZZ_T0_NS;
    store_options_default(&so);
    so.node_id = 1;
    so.memory_limit = FUZZ_MEMORY_LIMIT;
    so.sketch_symbols = 256; /* creation cost per input stays small */
    so.hash_power = 8;
    so.clock = fuzz_clock;
    store *st = store_create(&so, &err);
    if (st == NULL) {
        abort();
    }
    fill_config(&cfg, sasl);
    cfg.stats_list = stats_emit_group;
    cfg.stats_reset = stats_reset;
    stats_registry_setup(&fuzz_opts, st);
    memset(&sth, 0, sizeof(sth));
    memset(&ctx, 0, sizeof(ctx));
    ctx.store = st;
    ctx.cfg = &cfg;
    ctx.stats = &sth;
    ctx.authenticated = !sasl;

    struct evbuffer *in = evbuffer_new();
    struct evbuffer *out = evbuffer_new();
    if (in == NULL || out == NULL) {
        abort();
    }
    char *rbuf = lend ? malloc(PROTO_OUT_FLAT) : NULL;
    if (lend && rbuf == NULL) {
        abort();
    }
    size_t start = 0;
    unsigned piece = 0;
    for (size_t i = 0; i <= size; i++) {
        if (i < size && data[i] != sep) {
            continue;
        }
        size_t k = i - start;
        char *lent = NULL;
        if (lend && piece++ % 2 == 1 && k > 0 &&
            evbuffer_get_length(in) == 0) {
            lent = malloc(k);
            if (lent == NULL) {
                abort();
            }
            memcpy(lent, data + start, k);
            ctx.in_flat = lent;
            ctx.in_flat_len = k;
        } else if (k > 0) {
            evbuffer_add(in, data + start, k);
        }
        start = i + 1;
        ctx.out_flat = rbuf;
        ctx.out_flat_cap = rbuf != NULL ? PROTO_OUT_FLAT : 0;
        size_t before = evbuffer_get_length(in) + (lent != NULL ? k : 0);
        int rc = exec(&ctx, in, out);
        free(lent);
        if (evbuffer_get_length(in) > before || ctx.in_flat != NULL ||
            ctx.out_flat_len > ctx.out_flat_cap) {
            abort(); /* a parser only consumes, and takes what is lent */
        }
        if (ctx.out_flat_len > 0) {
            evbuffer_add(out, rbuf, ctx.out_flat_len);
            ctx.out_flat_len = 0;
        }
        ctx.out_flat = NULL;
        ctx.out_flat_cap = 0;
        if (rc == PROTO_CLOSE || rc == PROTO_SHUTDOWN ||
            rc == PROTO_CLOSE_ERROR) {
            break;
        }
        if (rc != PROTO_OK && rc != PROTO_PAUSED && rc != PROTO_IDLE) {
            abort();
        }
        drain(out, FUZZ_OUT_DRAIN);
    }
    free(rbuf);
    evbuffer_free(in);
    evbuffer_free(out);
    proto_ctx_cleanup(&ctx);
    stats_registry_teardown();
    store_destroy(st);
    return 0;
}
