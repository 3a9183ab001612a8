/*
 * fuzz_feed.h -- shared plumbing of the client protocol fuzz targets.
 *
 * Builds the world a parser sees on a real connection (a small store that
 * evicts early, the daemon's default proto_config, a stats block, the stats
 * registry) fresh for each input, feeds the input in pieces as a socket
 * would deliver them, and tears everything down again so LeakSanitizer sees
 * every byte the parser kept.
 */
#ifndef FUZZ_FEED_H
#define FUZZ_FEED_H

#include <stddef.h>
#include <stdint.h>

#include "proto.h"

/* A parser entry point: proto_text_execute or proto_bin_execute. */
typedef int (*fuzz_feed_exec_fn)(proto_ctx *ctx, struct evbuffer *in,
                                 struct evbuffer *out);

/*
 * Runs one input through exec. sep is the piece separator: data is cut at
 * every byte equal to sep (the separator itself is dropped) and each piece
 * is appended to the connection's input buffer, followed by one call of
 * exec, as if it had arrived in its own read. Replies are drained as a
 * client would read them. Stops after PROTO_CLOSE or PROTO_SHUTDOWN. When
 * sasl is true the config requires SASL PLAIN (user "fuzz", password
 * "secret") and the connection starts unauthenticated. When lend is true
 * (the text parser), every other piece that arrives while the input buffer
 * is empty is lent as the worker's memory instead (proto.h: a malloc'd copy,
 * freed after the call), and replies go to lent reply memory too. Aborts
 * when the parser breaks its contract (a return code outside PROTO_*, bytes
 * added to its input beyond a lent piece, lent input not taken, or lent
 * replies beyond the lent memory). Returns 0.
 */
int fuzz_feed_run(fuzz_feed_exec_fn exec, const uint8_t *data, size_t size,
                  uint8_t sep, bool sasl, bool lend);

#endif /* FUZZ_FEED_H */
