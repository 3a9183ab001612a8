/*
 * bin_wire.h -- the wire format of memcached's binary protocol.
 *
 * Constants (magic bytes, opcodes, status codes) and the 24-byte packet
 * header with its big-endian encoding. Used by the binary protocol parser
 * and by its tests; nothing here allocates or touches a buffer beyond the
 * bytes it is given.
 *
 * Header layout (all integers big-endian):
 *   0 magic   1 opcode   2-3 key length   4 extras length   5 data type
 *   6-7 vbucket (request) / status (response)   8-11 total body length
 *   12-15 opaque (echoed)   16-23 cas
 * The body follows: extras, then key, then value.
 */
#ifndef BIN_WIRE_H
#define BIN_WIRE_H

#include <stdint.h>

#define BIN_HEADER_LEN 24

enum bin_magic {
    BIN_MAGIC_REQ = 0x80,
    BIN_MAGIC_RES = 0x81,
};

enum bin_status {
    BIN_STATUS_OK = 0x00,
    BIN_STATUS_KEY_ENOENT = 0x01,
    BIN_STATUS_KEY_EEXISTS = 0x02,
    BIN_STATUS_E2BIG = 0x03,
    BIN_STATUS_EINVAL = 0x04,
    BIN_STATUS_NOT_STORED = 0x05,
    BIN_STATUS_DELTA_BADVAL = 0x06,
    BIN_STATUS_AUTH_ERROR = 0x20,
    BIN_STATUS_AUTH_CONTINUE = 0x21,
    BIN_STATUS_UNKNOWN_COMMAND = 0x81,
    BIN_STATUS_ENOMEM = 0x82,
};

enum bin_opcode {
    BIN_OP_GET = 0x00,
    BIN_OP_SET = 0x01,
    BIN_OP_ADD = 0x02,
    BIN_OP_REPLACE = 0x03,
    BIN_OP_DELETE = 0x04,
    BIN_OP_INCREMENT = 0x05,
    BIN_OP_DECREMENT = 0x06,
    BIN_OP_QUIT = 0x07,
    BIN_OP_FLUSH = 0x08,
    BIN_OP_GETQ = 0x09,
    BIN_OP_NOOP = 0x0a,
    BIN_OP_VERSION = 0x0b,
    BIN_OP_GETK = 0x0c,
    BIN_OP_GETKQ = 0x0d,
    BIN_OP_APPEND = 0x0e,
    BIN_OP_PREPEND = 0x0f,
    BIN_OP_STAT = 0x10,
    BIN_OP_SETQ = 0x11,
    BIN_OP_ADDQ = 0x12,
    BIN_OP_REPLACEQ = 0x13,
    BIN_OP_DELETEQ = 0x14,
    BIN_OP_INCREMENTQ = 0x15,
    BIN_OP_DECREMENTQ = 0x16,
    BIN_OP_QUITQ = 0x17,
    BIN_OP_FLUSHQ = 0x18,
    BIN_OP_APPENDQ = 0x19,
    BIN_OP_PREPENDQ = 0x1a,
    BIN_OP_VERBOSITY = 0x1b,
    BIN_OP_TOUCH = 0x1c,
    BIN_OP_GAT = 0x1d,
    BIN_OP_GATQ = 0x1e,
    BIN_OP_SASL_LIST_MECHS = 0x20,
    BIN_OP_SASL_AUTH = 0x21,
    BIN_OP_SASL_STEP = 0x22,
    BIN_OP_GATK = 0x23,
    BIN_OP_GATKQ = 0x24,
};

/* Extras lengths fixed by the protocol. */
#define BIN_EXT_STORE 8     /* flags (4), expiration (4) */
#define BIN_EXT_ARITH 20    /* delta (8), initial (8), expiration (4) */
#define BIN_EXT_TOUCH 4     /* expiration (4) */
#define BIN_EXT_FLUSH 4     /* optional delay (4) */
#define BIN_EXT_VERBOSITY 4 /* level (4) */
#define BIN_EXT_GET_RES 4   /* response flags (4) */

/* Expiration in an arithmetic request that forbids creating the key. */
#define BIN_ARITH_NO_CREATE 0xffffffffu

/* A decoded packet header (host byte order). */
typedef struct bin_header {
    uint8_t magic;
    uint8_t opcode;
    uint16_t keylen;
    uint8_t extlen;
    uint8_t datatype;
    uint16_t status; /* vbucket id in a request */
    uint32_t bodylen;
    uint32_t opaque; /* echoed unchanged in the response */
    uint64_t cas;
} bin_header;

static inline uint16_t bin_get16(const uint8_t *p)
{
    return (uint16_t)((uint16_t)p[0] << 8 | p[1]);
}

static inline uint32_t bin_get32(const uint8_t *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 |
           p[3];
}

static inline uint64_t bin_get64(const uint8_t *p)
{
    return (uint64_t)bin_get32(p) << 32 | bin_get32(p + 4);
}

static inline void bin_put16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)(v >> 8);
    p[1] = (uint8_t)v;
}

static inline void bin_put32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)(v >> 24);
    p[1] = (uint8_t)(v >> 16);
    p[2] = (uint8_t)(v >> 8);
    p[3] = (uint8_t)v;
}

static inline void bin_put64(uint8_t *p, uint64_t v)
{
    bin_put32(p, (uint32_t)(v >> 32));
    bin_put32(p + 4, (uint32_t)v);
}

/* Decodes the 24 header bytes at p. */
static inline void bin_header_decode(bin_header *h, const uint8_t *p)
{
    h->magic = p[0];
    h->opcode = p[1];
    h->keylen = bin_get16(p + 2);
    h->extlen = p[4];
    h->datatype = p[5];
    h->status = bin_get16(p + 6);
    h->bodylen = bin_get32(p + 8);
    h->opaque = bin_get32(p + 12);
    h->cas = bin_get64(p + 16);
}

/* Encodes h into the 24 bytes at p. */
static inline void bin_header_encode(uint8_t *p, const bin_header *h)
{
    p[0] = h->magic;
    p[1] = h->opcode;
    bin_put16(p + 2, h->keylen);
    p[4] = h->extlen;
    p[5] = h->datatype;
    bin_put16(p + 6, h->status);
    bin_put32(p + 8, h->bodylen);
    bin_put32(p + 12, h->opaque);
    bin_put64(p + 16, h->cas);
}

#endif /* BIN_WIRE_H */
