/*
 * proto_text.h -- memcached's text and meta protocols.
 *
 * Entry points only; see proto.h for the parser contract.
 */
#ifndef PROTO_TEXT_H
#define PROTO_TEXT_H

#include "proto.h"

/*
 * Consumes every complete request in `in` (a command line and, for storage
 * commands, its data block), executes it and appends the reply to `out`.
 * Leaves an incomplete request in `in`. Returns a PROTO_* code.
 */
int proto_text_execute(proto_ctx *ctx, struct evbuffer *in,
                       struct evbuffer *out);

/* Frees the text parser's private state of ctx. */
void proto_text_free(proto_ctx *ctx);

#endif /* PROTO_TEXT_H */
