/*
 * proto.c -- what the parsers share at the connection level: releasing
 * their per-connection state when a connection ends.
 */
#include "proto.h"

#include "proto_bin.h"
#include "proto_text.h"

void proto_ctx_cleanup(proto_ctx *ctx)
{
    /* Each parser frees only its own state and tolerates never having
     * run on this connection. */
    proto_text_free(ctx);
    proto_bin_free(ctx);
    ctx->text = NULL;
    ctx->bin = NULL;
}
