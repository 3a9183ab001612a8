/*
 * proto_ctx.c -- what the parsers share at the connection level: releasing
 * their per-connection state (and the relay state) when a connection
 * ends.
 */
#include "proto_ctx.h"

#include "proto_bin.h"
#include "proto_text.h"
#include "proxy.h"

void proto_ctx_cleanup(proto_ctx *ctx)
{
    /* Each parser frees only its own state and tolerates never having
     * run on this connection. */
    proto_text_free(ctx);
    proto_bin_free(ctx);
    proxy_conn_free(ctx);
    ctx->relay_peer = false;
    ctx->text = NULL;
    ctx->bin = NULL;
}
