/*
 * fuzz_proto_text.c -- libFuzzer target for the text and meta protocols.
 *
 * Input: one separator byte, then the bytes a client sends. The bytes are
 * cut at each occurrence of the separator into the pieces successive socket
 * reads would deliver, so partial lines and partial data blocks are
 * exercised. Each input gets a fresh store and connection.
 */
#include <stdint.h>

#include "fuzz_feed.h"
#include "proto_text.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1) {
        return 0;
    }
    return fuzz_feed_run(proto_text_execute, data + 1, size - 1, data[0],
                         false, true);
}
