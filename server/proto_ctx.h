/*
 * proto_ctx.h -- the end of a connection's parser state.
 *
 * proto.h only describes what the parsers share (types, no code behind
 * it), so the parsers can include it without knowing each other. Freeing a
 * proto_ctx has to reach every parser and the relay, so it lives here,
 * above proto_text, proto_bin and proxy, for the connection layer (and the
 * fuzz targets) to call.
 */
#ifndef PROTO_CTX_H
#define PROTO_CTX_H

#include "proto.h"

/*
 * Frees the parsers' and the relay's private state of ctx (not the ctx
 * itself) and clears their pointers, so ctx can serve a new connection.
 * Safe on a ctx no parser ever ran on.
 */
void proto_ctx_cleanup(proto_ctx *ctx);

#endif /* PROTO_CTX_H */
