/*
 * fuzz_proto_bin.c -- libFuzzer target for the binary protocol.
 *
 * Input: a mode byte (bit 0 set: SASL PLAIN required, the connection starts
 * unauthenticated), a separator byte, then the bytes a client sends, cut at
 * each separator into the pieces successive reads would deliver. Each input
 * gets a fresh store and connection.
 */
#include <stdint.h>

#include "fuzz_feed.h"
#include "proto_bin.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 2) {
        return 0;
    }
    return fuzz_feed_run(proto_bin_execute, data + 2, size - 2, data[1],
                         (data[0] & 1) != 0, false);
}
