/*
 * proto_bin.h -- memcached's binary protocol (and SASL PLAIN).
 *
 * Entry points only; see proto.h for the parser contract.
 */
#ifndef PROTO_BIN_H
#define PROTO_BIN_H

#include "proto.h"

/*
 * Consumes every complete binary request in `in` (24-byte header plus body),
 * executes it and appends the response packets to `out`. Leaves an
 * incomplete request in `in`. Returns a PROTO_* code.
 */
int proto_bin_execute(proto_ctx *ctx, struct evbuffer *in,
                      struct evbuffer *out);

/* Frees the binary parser's private state of ctx. */
void proto_bin_free(proto_ctx *ctx);

#endif /* PROTO_BIN_H */
