/*
 * repl_wire.h -- the peer channel's wire format: authenticated frames, the
 * records they carry and the bodies of the round messages.
 *
 * A peer connection starts with a challenge-response handshake proving both
 * sides know the cluster secret (HMAC-SHA256, OpenSSL's libcrypto), which
 * also derives a per-connection session key. Every frame after it is
 *
 *   magic "RB" (2) | version (1) | type (1) | length (4, LE) | seq (8, LE)
 *   | payload (length bytes) | tag (32)
 *
 * where tag = HMAC-SHA256(session key, header || payload) and seq counts
 * the frames sent in each direction from 0, so a frame cannot be replayed,
 * reordered or moved to another connection. The length is checked against
 * a hard cap before any byte of the payload is buffered.
 *
 * This module is pure: it parses and builds bytes, it does no I/O.
 */
#ifndef REPL_WIRE_H
#define REPL_WIRE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "riblt.h"
#include "riblt_psum.h"
#include "store.h"

#define REPL_WIRE_OK 0
#define REPL_WIRE_NEED_MORE 1      /* not a whole frame yet */
#define REPL_WIRE_ERR_MAGIC (-1)   /* not our protocol or version */
#define REPL_WIRE_ERR_TOO_BIG (-2) /* length over the cap */
#define REPL_WIRE_ERR_AUTH (-3)    /* tag does not verify */
#define REPL_WIRE_ERR_FORMAT (-4)  /* payload malformed for its type */
#define REPL_WIRE_ERR_SPACE (-5)   /* output buffer too small */
#define REPL_WIRE_ERR_CRYPTO (-6)  /* libcrypto failed */

const char *repl_wire_strerror(int rc);

/* 3: mutation records leave out what the receiver derives (id, fresh
 * cas); 4: pushes carry their place in the sender's push log, and RESUME;
 * 5: power sums (PSUMS_REQ, PSUMS); peers of another version are refused
 * at the handshake. REPL_MUT_ACK and PUSH_ACK came within version 5: only
 * a node with repl_ack_wait_ms sends them, and an older receiver refuses
 * such a frame as malformed (closing the link), so that setting wants
 * every node at this release. */
#define REPL_WIRE_VERSION 5
#define REPL_WIRE_HEADER 16
#define REPL_WIRE_TAG 32
#define REPL_WIRE_NONCE 32
/* Largest payload a peer may send in one frame. */
#define REPL_WIRE_MAX_PAYLOAD (4u << 20)

enum repl_msg {
    REPL_MSG_HELLO = 1,        /* node id, nonce (unauthenticated, tag zero) */
    REPL_MSG_CHALLENGE = 2,    /* node id, nonce (unauthenticated, tag zero) */
    REPL_MSG_PROOF = 3,        /* client proof (first authenticated frame) */
    REPL_MSG_ACCEPT = 4,       /* server proof */
    REPL_MSG_SYMBOLS_REQ = 10, /* offset u64, count u32, [ring part] */
    REPL_MSG_SYMBOLS = 11,     /* offset u64, set size i64, symbols */
    REPL_MSG_FETCH = 12,       /* mutation ids wanted */
    REPL_MSG_MUTATIONS = 13,   /* flags u8, count u32, mutation records */
    REPL_MSG_DONE = 14,        /* round finished (stats), no payload */
    REPL_MSG_ERROR = 15,       /* u32 code (REPL_ERROR_*), text */
    /* Every id of the partitions of the round just begun; no payload. */
    REPL_MSG_BULK_REQ = 16,
    /* Sent by both sides once a link is ready (repl_wire_info). */
    REPL_MSG_INFO = 17,
    /* From a node far behind, after it ended its round: run one with me
     * now (no payload), so that what I lack comes as records alone. */
    REPL_MSG_ROUND_PLEASE = 18,
    /* Sent once a link is ready, by the side that receives the other's
     * pushes: the last push it applied (the pusher's run and seq) and its
     * own run; the pusher resends what came after, if its push log still
     * has it, then answers with a RESUME of its own (its run, the last seq
     * resent or 0, its run), which tells that the resend is complete
     * (repl_wire_put_resume). */
    REPL_MSG_RESUME = 19,
    /* Liveness, on the peer channel and on the registry channel. */
    REPL_MSG_PING = 20, /* token u64: answer PONG with the same token */
    REPL_MSG_PONG = 21, /* token u64 */
    /* Registry channel (member <-> registry, see registry.h). */
    REPL_MSG_REG_REGISTER = 22,  /* node u32, incarnation u64, addr */
    REPL_MSG_REG_HEARTBEAT = 23, /* incarnation u64, view epoch u64 */
    REPL_MSG_REG_LEAVE = 24,     /* incarnation u64 */
    REPL_MSG_REG_VIEW = 25,      /* epoch u64, count u32, members */
    REPL_MSG_REG_REJOIN = 26,    /* incarnation u64 the registry knows */
    REPL_MSG_REG_PING_REQ = 27,  /* token u64, target node u32 */
    REPL_MSG_REG_PING_ACK = 28,  /* token u64, target node u32, ok u8 */
    REPL_MSG_PSUMS_REQ = 29,     /* bucket u8, first u8, count u8 */
    REPL_MSG_PSUMS = 30,         /* bucket u8, first u8, count u8, terms */
    /* The receiver of a push flagged REPL_MUT_ACK applied it: the frame's
     * ticket u64 (repl_wire_put_push_ack). */
    REPL_MSG_PUSH_ACK = 31,
};

/* A parsed frame header. */
typedef struct repl_frame {
    uint8_t type;
    uint32_t length;
    uint64_t seq;
    const uint8_t *payload; /* borrowed from the input buffer */
} repl_frame;

/* ------------------------------------------------------------ handshake */

/*
 * Key material of one connection. The secret is borrowed for the life of
 * the struct; the session key is derived once both nonces are known.
 */
typedef struct repl_auth {
    const uint8_t *secret;
    size_t nsecret;
    uint8_t client_nonce[REPL_WIRE_NONCE];
    uint8_t server_nonce[REPL_WIRE_NONCE];
    uint32_t client_node, server_node;
    uint8_t session_key[32];
} repl_auth;

/*
 * Fills a nonce: 16 bytes from the kernel's random source, then 16 bytes
 * of HMAC-SHA256 of those under a key this process drew at random, so
 * that the process, and only it, can tell its own nonces
 * (repl_wire_nonce_ours). That is how a node that meets its own node id
 * at the other end of a link tells its own address (the same process)
 * from another node configured with the same id.
 */
int repl_wire_nonce(uint8_t out[REPL_WIRE_NONCE]);

/* True if this process made the nonce with repl_wire_nonce. */
bool repl_wire_nonce_ours(const uint8_t nonce[REPL_WIRE_NONCE]);

/*
 * Derives the session key and the two proofs from the secret, both nonces
 * and both node ids. role 0 = client's proof, 1 = server's proof.
 */
int repl_wire_derive(repl_auth *a);
int repl_wire_proof(const repl_auth *a, int role, uint8_t out[32]);

/* Constant-time check of a proof received from the other side. */
bool repl_wire_proof_ok(const repl_auth *a, int role, const uint8_t *proof,
                        size_t n);

/* -------------------------------------------------------------- frames */

/*
 * Parses one frame from buf. Returns REPL_WIRE_OK with *used = bytes of the
 * whole frame, REPL_WIRE_NEED_MORE, or an error (the connection must then
 * be dropped). key NULL: the frame must be a HELLO or CHALLENGE, whose tag
 * is all zero; otherwise the tag is verified with key and seq must equal
 * expect_seq. max_payload caps the length (at most REPL_WIRE_MAX_PAYLOAD).
 */
int repl_wire_parse(const uint8_t *buf, size_t len, const uint8_t *key,
                    uint64_t expect_seq, uint32_t max_payload, repl_frame *out,
                    size_t *used);

/*
 * Writes a frame (header, payload, tag) into out (cap bytes). key NULL
 * writes a zero tag (handshake only). Returns the frame size or a negative
 * REPL_WIRE_ERR_*.
 */
long repl_wire_build(uint8_t *out, size_t cap, uint8_t type, uint64_t seq,
                     const uint8_t *payload, uint32_t length,
                     const uint8_t *key);

/*
 * A keyed HMAC-SHA256 context for one session key, kept for the life of a
 * connection: each frame's tag then costs a re-init with the same key and
 * one pass over the frame, several times cheaper than a one-shot HMAC
 * (which sets the key up, and in OpenSSL 3 fetches the algorithm, on every
 * call). One thread at a time uses it.
 */
typedef struct repl_mac repl_mac;

/* NULL when libcrypto cannot set the context up. */
repl_mac *repl_mac_create(const uint8_t key[32]);
void repl_mac_destroy(repl_mac *m);

/* repl_wire_parse / repl_wire_build with the key of mac (NULL: handshake
 * frames only, as a NULL key). Same frames, same checks. */
int repl_wire_parse_mac(const uint8_t *buf, size_t len, repl_mac *mac,
                        uint64_t expect_seq, uint32_t max_payload,
                        repl_frame *out, size_t *used);
long repl_wire_build_mac(uint8_t *out, size_t cap, uint8_t type, uint64_t seq,
                         const uint8_t *payload, uint32_t length,
                         repl_mac *mac);

/* Size of a frame carrying a payload of n bytes. */
static inline size_t repl_wire_frame_size(size_t n)
{
    return REPL_WIRE_HEADER + n + REPL_WIRE_TAG;
}

/* ------------------------------------------------------------ records */

/*
 * A mutation record on the wire:
 *   kind (1) | ticks (8) | node (4) | flags (4) | exptime (8) | nkey (2)
 *   | nvalue (4) | [id (16)] | [flush_at (8)] | [cas (8)] | key | value
 * The kind byte holds the kind in bits 0-3, the value's STORE_MARK_* in
 * bits 4-5, and in bit 6 REPL_WIRE_MUT_CAS: an explicit cas follows; bit
 * 7 is 0. What the receiver can derive is left out: the id of a keyed
 * mutation (store_mutation_id of key and version; the receiving store
 * checks it anyway) and a fresh cas (store_fresh_cas of the id). So the
 * id is sent only for the keyless kinds (a flush; an evicted value's
 * record and a drop, whose key is named by the id's high word and whose
 * flags hold its partition), flush_at only for a flush, and the cas only
 * when it is not the fresh one (touch and meta E keep or set another); a
 * record that sends a cas equal to the fresh one is malformed, so every
 * mutation has one encoding.
 */
#define REPL_WIRE_MUT_FIXED 31
#define REPL_WIRE_MUT_CAS 0x40

/* Bytes repl_wire_put_mutation will write for m. */
size_t repl_wire_mutation_size(const store_mutation *m);

/* Appends m at out (cap bytes). Returns bytes written or ERR_SPACE. */
long repl_wire_put_mutation(uint8_t *out, size_t cap, const store_mutation *m);

/*
 * Reads one record from buf. The key and value pointers of *m point into
 * buf. Returns bytes consumed or REPL_WIRE_ERR_FORMAT (truncated, key of 0
 * or more than 250 bytes for a keyed kind, a key for a keyless one
 * (flush, evicted, drop), unknown kind, unknown
 * marks or marks on a kind other than a value, value larger than
 * max_value).
 */
long repl_wire_get_mutation(const uint8_t *buf, size_t len, size_t max_value,
                            store_mutation *m);

/* ---------------------------------------------------- message bodies */

/*
 * The bodies of the round messages. Each get function checks only the
 * layout (lengths) and returns REPL_WIRE_OK or REPL_WIRE_ERR_FORMAT; the
 * bounds that depend on the node (caps, its ring) are the caller's. The
 * pointers a get function fills borrow from its input. Each put function
 * writes at out, which the caller has sized (no check), and returns the
 * bytes written.
 */

/* ERROR codes. */
#define REPL_ERROR_GENERIC 1
/* The ring fingerprints or partition lists disagree: the round fails, the
 * link stays. */
#define REPL_ERROR_RING 2
/* The responder takes part in another round (one at a time, so a missing
 * mutation arrives once): the round ends unrun, the link stays. */
#define REPL_ERROR_BUSY 3

/* DONE: one byte, how the round ended (absent: as REPL_DONE_STREAMED). */
#define REPL_DONE_STREAMED 0  /* decoded and exchanged both ways */
#define REPL_DONE_BULK 1      /* a bulk pull: data moved one way only */
#define REPL_DONE_ABANDONED 2 /* failed or capped; nothing to conclude */

/* MUTATIONS flags (the first byte of the frame). */
/* The last frame answering a FETCH or a bulk request. */
#define REPL_MUT_FINAL 1
/* Unsolicited: eager push, or a round's local-only ids. */
#define REPL_MUT_PUSH 2
/* Part of a bulk transfer. */
#define REPL_MUT_BULK 4
/* An eager push with its place in the sender's push log: run u64 | seq u64
 * (the seq of the frame's last record) follow the header. */
#define REPL_MUT_SEQ 8
/* An eager push whose sender acknowledges writes only once a peer holds
 * them: ticket u64 (the number of the frame's last write in the sender's
 * queue) follows the header and position; the receiver answers PUSH_ACK
 * with it once the frame is applied. */
#define REPL_MUT_ACK 16

/*
 * MUTATIONS: flags u8 | count u32 | [run u64 | seq u64 with REPL_MUT_SEQ]
 * | [ticket u64 with REPL_MUT_ACK] | count records (repl_wire_put_mutation).
 */
#define REPL_WIRE_MUT_HEADER 5
#define REPL_WIRE_MUT_POS 16
#define REPL_WIRE_MUT_TICKET 8

size_t repl_wire_put_mutations_head(uint8_t *out, uint8_t flags,
                                    uint32_t count);

/* Writes the push position after a header flagged REPL_MUT_SEQ. */
void repl_wire_put_mutations_pos(uint8_t *out, uint64_t run, uint64_t seq);

/* Where the records start under these flags. */
static inline size_t repl_wire_mutations_records_at(uint8_t flags)
{
    return REPL_WIRE_MUT_HEADER +
           ((flags & REPL_MUT_SEQ) ? REPL_WIRE_MUT_POS : 0) +
           ((flags & REPL_MUT_ACK) ? REPL_WIRE_MUT_TICKET : 0);
}

/* Reads the header (and checks the position fits when flagged); the
 * records follow at repl_wire_mutations_records_at(flags). */
int repl_wire_get_mutations_head(const uint8_t *p, size_t len, uint8_t *flags,
                                 uint32_t *count);

/* The push position of a frame whose header is flagged REPL_MUT_SEQ. */
int repl_wire_get_mutations_pos(const uint8_t *p, size_t len, uint64_t *run,
                                uint64_t *seq);

/* Writes the ticket after a header flagged REPL_MUT_ACK (and its position,
 * when flagged REPL_MUT_SEQ). */
void repl_wire_put_mutations_ticket(uint8_t *out, uint64_t ticket);

/* The ticket of a frame whose header is flagged REPL_MUT_ACK. */
int repl_wire_get_mutations_ticket(const uint8_t *p, size_t len,
                                   uint64_t *ticket);

/* PUSH_ACK: ticket u64. */
#define REPL_WIRE_PUSH_ACK 8
size_t repl_wire_put_push_ack(uint8_t *out, uint64_t ticket);
int repl_wire_get_push_ack(const uint8_t *p, size_t len, uint64_t *ticket);

/*
 * RESUME: run u64 | seq u64 | own run u64: the last push applied of the
 * pusher's (run and seq; 0 and 0 when none of its current run, as far as
 * the sender knows), and the sender's own run (a new one: it restarted).
 */
#define REPL_WIRE_RESUME 24
size_t repl_wire_put_resume(uint8_t *out, uint64_t run, uint64_t seq,
                            uint64_t own_run);
int repl_wire_get_resume(const uint8_t *p, size_t len, uint64_t *run,
                         uint64_t *seq, uint64_t *own_run);

/*
 * SYMBOLS_REQ: offset u64 | count u32, then the ring part on the request
 * that opens a round (offset 0) between partitioned nodes. The count's top
 * bit is a flag, REPL_SYMBOLS_WALK, on the request that opens a round: serve
 * the whole round from an encoder over one walk of the set, not from the
 * materialized sketch (a round whose difference is past the sketch; see
 * replication/README.md). The ring part is:
 *   ring fingerprint u64 | bitmap of the round's partitions
 * where the bitmap has nbitmap = (P + 1 + 7) / 8 bytes and bit p (byte
 * p / 8, bit p % 8) stands for partition p, P being the global one.
 */
#define REPL_WIRE_SYMBOLS_REQ_FIXED 12

#define REPL_SYMBOLS_WALK 0x80000000u

typedef struct repl_wire_symbols_req {
    uint64_t offset;
    uint32_t count;      /* without the flag bit */
    uint32_t flags;      /* REPL_SYMBOLS_WALK or 0 */
    const uint8_t *rest; /* what follows the fixed part (the ring part) */
    size_t nrest;
} repl_wire_symbols_req;

size_t repl_wire_put_symbols_req(uint8_t *out, uint64_t offset, uint32_t count,
                                 uint32_t flags);
int repl_wire_get_symbols_req(const uint8_t *p, size_t len,
                              repl_wire_symbols_req *out);

/*
 * Writes the ring part (8 + nbitmap bytes) with the bits of the nparts
 * partitions listed set; a partition past the bitmap is left out. Returns
 * 8 + nbitmap.
 */
size_t repl_wire_put_ring_part(uint8_t *out, uint64_t fingerprint,
                               const uint32_t *parts, size_t nparts,
                               size_t nbitmap);

/* Reads a ring part, which must be exactly 8 + nbitmap bytes. */
int repl_wire_get_ring_part(const uint8_t *p, size_t len, size_t nbitmap,
                            uint64_t *fingerprint, const uint8_t **bitmap);

/*
 * SYMBOLS: offset u64 | set size i64 | n coded symbols of
 * RIBLT_SYMBOL_WIRE_SIZE bytes (riblt_symbols_encode), the set size being
 * the count of the responder's coded symbol 0.
 */
#define REPL_WIRE_SYMBOLS_FIXED 16

typedef struct repl_wire_symbols {
    uint64_t offset;
    int64_t set_size;
    const uint8_t *symbols; /* n wire symbols */
    size_t n;
} repl_wire_symbols;

/* Writes offset and set size; the symbols go at REPL_WIRE_SYMBOLS_FIXED. */
size_t repl_wire_put_symbols_head(uint8_t *out, uint64_t offset,
                                  int64_t set_size);

/* Reads the header; the rest must be whole symbols (n may be 0). */
int repl_wire_get_symbols(const uint8_t *p, size_t len,
                          repl_wire_symbols *out);

/*
 * PSUMS_REQ: bucket u8 | first u8 | count u8, asking within an open round
 * (not a walked one) for terms [first, first + count) of the responder's
 * power sums (riblt_psum.h), from the snapshot its sketch was read with:
 * of one bucket (0 .. RIBLT_PSUM_BUCKETS - 1), or of the whole set
 * (REPL_PSUMS_ALL, riblt_psum_combine). count >= 1 and first + count <=
 * RIBLT_PSUM_TERMS.
 * PSUMS: the same three bytes, then count terms of
 * RIBLT_PSUM_TERM_WIRE_SIZE bytes (riblt_id_to_bytes). A responder that
 * keeps no power sums answers with count 0 and no terms.
 */
#define REPL_WIRE_PSUMS_FIXED 3
#define REPL_PSUMS_ALL 0xFF

typedef struct repl_wire_psums {
    uint8_t bucket, first, count;
    const uint8_t *terms; /* count terms (PSUMS only) */
} repl_wire_psums;

/* Writes the three bytes; the terms of a PSUMS go after them. */
size_t repl_wire_put_psums_head(uint8_t *out, uint8_t bucket, uint8_t first,
                                uint8_t count);
int repl_wire_get_psums_req(const uint8_t *p, size_t len,
                            repl_wire_psums *out);
int repl_wire_get_psums(const uint8_t *p, size_t len, repl_wire_psums *out);

/*
 * INFO: weight u32 | partitions u32 | replicas u32 | client address
 * ("host:port", the rest of the payload, not terminated; may be empty).
 */
#define REPL_WIRE_INFO_FIXED 12

typedef struct repl_wire_info {
    uint32_t weight;     /* the sender's ring weight */
    uint32_t partitions; /* its P */
    uint32_t replicas;   /* its R (0: full replication) */
    const char *addr;    /* its client port, naddr bytes */
    size_t naddr;
} repl_wire_info;

/* Writes REPL_WIRE_INFO_FIXED + in->naddr bytes; returns that. */
size_t repl_wire_put_info(uint8_t *out, const repl_wire_info *in);
int repl_wire_get_info(const uint8_t *p, size_t len, repl_wire_info *out);

/* Little-endian helpers shared by the record builders. */
void repl_wire_put_u32(uint8_t *p, uint32_t v);
void repl_wire_put_u64(uint8_t *p, uint64_t v);
uint32_t repl_wire_get_u32(const uint8_t *p);
uint64_t repl_wire_get_u64(const uint8_t *p);

#endif /* REPL_WIRE_H */
