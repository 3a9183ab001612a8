/*
 * proto_text_int.h -- private to the text protocol's files.
 *
 *   proto_text.c        the request loop, the command table, the reply
 *                       writer, and the key-value and meta commands;
 *   proto_text_admin.c  commands about the server rather than keys: stats,
 *                       slabs, cache_memlimit, lru_crawler (and its dumps),
 *                       watch, verbosity, version, shutdown.
 *
 * A handler gets one parsed request (pt_req) and writes its reply through
 * the writer below; it returns the bytes it consumed after the line (its
 * data block), or one of the PT_* codes.
 */
#ifndef PROTO_TEXT_INT_H
#define PROTO_TEXT_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "proto.h"

#define PT_KEY_MAX 250
#define PT_MAX_TOKENS 24      /* memcached counts 23 tokens + an end mark */
#define PT_META_MAX_TOKENS 20 /* same count, for meta flags */
#define PT_OPAQUE_MAX 32
#define PT_COPY_MAX 256 /* values below this are copied, not referenced */
#define PT_OUTBUF PROTO_OUT_FLAT
#define PT_DEFAULT_MAX_LINE 2048
#define PT_LINE_MAX 1024 /* longest reply line we build (meta) */
#define PT_VERBOSITY_MAX 2
#define PT_AUTH_MAX 1024 /* bytes of "<user> <password>" (-Y) */
#define PT_STREAM_MIN                                                         \
    65536 /* a retrieval line without its newline after                       \
             this many bytes is served as it comes */

/* Handler results besides ">= 0: extra bytes consumed after the line". */
enum {
    PT_NEED = -1,        /* the request's data block is not complete yet */
    PT_CLOSE = -2,       /* quit, or an HTTP request */
    PT_SHUTDOWN = -3,    /* shutdown */
    PT_CLOSE_ERROR = -4, /* what looks like an HTTP request */
};

/* A dump that runs across several parser calls (lru_crawler, cachedump). */
enum pt_dump {
    PT_DUMP_NONE = 0,
    PT_DUMP_META,  /* lru_crawler metadump: key=... lines, then END */
    PT_DUMP_MG,    /* lru_crawler mgdump: mg <key> lines, then EN */
    PT_DUMP_WATCH, /* watch: log lines until the client hangs up */
};

/* Per-connection state: what is left of a previous request. */
typedef struct pt_state {
    uint64_t swallow;   /* bytes of a refused data block still to discard */
    bool skip_line;     /* discarding an over-long line up to its newline */
    uint8_t dump;       /* enum pt_dump */
    bool stream;        /* inside a long retrieval line, taking its keys as
                           they come (see proto_text.c, "long gets") */
    uint8_t stream_get; /* its PT_GET_* flags */
    int64_t stream_exptime;
    size_t dump_cursor;
    struct watch_sub *watch; /* this connection's watch subscription */
} pt_state;

/* ---------------------------------------------------------- the writer */

/* Replies are collected in buf and handed to ev in large pieces; the
 * last piece may stay in the worker's memory (proto_ctx.out_flat). */
typedef struct pt_out {
    struct evbuffer *ev;   /* where replies go now */
    struct evbuffer *base; /* the connection's output (ev differs while
                              relayed requests are in flight) */
    size_t n;
    char *buf; /* PT_OUTBUF bytes: own, or the worker's */
    char own[PT_OUTBUF];
} pt_out;

void pt_out_flush(pt_out *o);
void pt_out_put(pt_out *o, const void *p, size_t n);
/* Returns room for n (<= PT_OUTBUF) bytes; pt_out_commit says how many. */
char *pt_out_reserve(pt_out *o, size_t n);
void pt_out_commit(pt_out *o, const char *end);
/* Write at p and return the end. */
char *pt_fmt_u64(char *p, uint64_t v);
char *pt_fmt_i64(char *p, int64_t v);
char *pt_put_mem(char *p, const void *s, size_t n);
/* base64 of n bytes (4 per 3, padded) */
char *pt_b64_encode(char *p, const unsigned char *in, size_t n);

#define OUT_LIT(o, s) pt_out_put((o), s, sizeof(s) - 1)
#define PUT_LIT(p, s) pt_put_mem((p), s, sizeof(s) - 1)

/* ---------------------------------------------------------- a request */

typedef struct pt_tok {
    const char *s;
    size_t n;
} pt_tok;

/* One request: its line, its tokens and where its data block starts. */
typedef struct pt_req {
    proto_ctx *ctx;
    pt_state *st;
    pt_out *o;
    const char *line; /* the command line without "\r\n" */
    size_t len;
    size_t linesz;    /* bytes of the line including its newline */
    const char *data; /* bytes after the line, contiguous */
    size_t avail;
    size_t need; /* PT_NEED: bytes needed from the start of the line */
    pt_tok t[PT_MAX_TOKENS];
    size_t nt; /* tokens held; memcached's token count is nt + 1 */
    bool noreply;
} pt_req;

bool pt_tok_is(const pt_tok *t, const char *s, size_t n);
#define TOK_IS(t, lit) pt_tok_is((t), lit, sizeof(lit) - 1)

/* Decimal numbers: digits only (an optional '-' for i64), no overflow. */
bool pt_parse_u64(const char *s, size_t n, uint64_t *out);
bool pt_parse_u32(const char *s, size_t n, uint32_t *out);
bool pt_parse_i64(const char *s, size_t n, int64_t *out);

/* A key a text command may name (1..250 bytes, no space, CR or LF). */
bool pt_key_ok(const char *k, size_t n);

/* Replies "s\r\n" unless the request asked for noreply. */
void pt_reply(pt_req *r, const char *s, size_t n);
#define REPLY(r, lit) pt_reply((r), lit, sizeof(lit) - 1)

#define STAT(r, name)                                                         \
    do {                                                                      \
        if ((r)->ctx->stats)                                                  \
            STATS_INCR((r)->ctx->stats, name);                                \
    } while (0)

/* ---------------------------------------------- proto_text_admin.c */

int pt_cmd_stats(pt_req *r, int arg);
int pt_cmd_slabs(pt_req *r, int arg);
int pt_cmd_cache_memlimit(pt_req *r, int arg);
int pt_cmd_lru_crawler(pt_req *r, int arg);
int pt_cmd_watch(pt_req *r, int arg);
int pt_cmd_verbosity(pt_req *r, int arg);
int pt_cmd_version(pt_req *r, int arg);
int pt_cmd_shutdown(pt_req *r, int arg);
int pt_cmd_refresh_certs(pt_req *r, int arg);

/*
 * Continues the dump st->dump into o until it ends (then st->dump is
 * PT_DUMP_NONE and the trailer is written) or o's buffer holds more than
 * limit bytes (0: no limit). Returns true when the dump has ended.
 */
bool pt_dump_step(pt_req *r, size_t limit);

/* Ends the connection's dump or watch (the connection closes). */
void pt_dump_free(pt_state *st);

#endif /* PROTO_TEXT_INT_H */
