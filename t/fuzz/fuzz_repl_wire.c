/*
 * fuzz_repl_wire.c -- libFuzzer target for the peer wire format.
 *
 * Three views of each input:
 *   1. the raw bytes as a frame stream, parsed without a key (handshake
 *      frames) and with a session key at several expected sequence numbers;
 *   2. a frame built from the input with repl_wire_build (under the
 *      session key unless it is a handshake type), so the authenticated
 *      path reaches the payload: it must parse back to exactly what was
 *      built, and one byte short of it must be "need more";
 *   3. every payload (and the raw bytes) read as mutation records with
 *      repl_wire_get_mutation; each record must re-encode to the same bytes
 *      and is applied to a real store with store_apply;
 *   4. every payload (and the raw bytes) read as each round message body
 *      (MUTATIONS header, SYMBOLS_REQ and its ring part, SYMBOLS, INFO):
 *      a body that parses must write back to the same bytes.
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "repl_wire.h"
#include "store.h"

#ifndef FUZZ_REPL_WIRE_SEEDS
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
#endif

#define FUZZ_ITEM_MAX (1u << 20)
#define FUZZ_T0_NS 1700000000000000000ULL

static const uint8_t fuzz_key[32] = {
    0x52, 0x42, 0x01, 0x0d, 0x11, 0x2a, 0x33, 0x44, 0x55, 0x66, 0x77,
    0x88, 0x99, 0xaa, 0xbb, 0xcc, 0xdd, 0xee, 0xff, 0x10, 0x20, 0x30,
    0x40, 0x50, 0x60, 0x70, 0x80, 0x90, 0xa0, 0xb0, 0xc0, 0xd0,
};

static uint64_t fuzz_clock_ns;

static uint64_t fuzz_clock(void *arg)
{
    (void)arg;
    fuzz_clock_ns += 1000000;
    return fuzz_clock_ns;
}

/*
 * Reads records from p until they stop parsing, applying each to st. A
 * record must re-encode to the bytes it was read from.
 */
static void apply_records(store *st, const uint8_t *p, size_t len,
                          uint8_t *scratch, size_t scratch_cap)
{
    size_t off = 0;
    while (off < len) {
        store_mutation m;
        long n = repl_wire_get_mutation(p + off, len - off, FUZZ_ITEM_MAX, &m);
        if (n < 0) {
            if (n != REPL_WIRE_ERR_FORMAT) {
                abort();
            }
            return;
        }
        if (n < REPL_WIRE_MUT_FIXED || (size_t)n > len - off) {
            abort();
        }
        if (repl_wire_mutation_size(&m) != (size_t)n) {
            abort();
        }
        if ((size_t)n <= scratch_cap) {
            long w = repl_wire_put_mutation(scratch, scratch_cap, &m);
            if (w != n || memcmp(scratch, p + off, (size_t)n) != 0) {
                abort();
            }
        }
        int rc = store_apply(st, &m);
        if (rc != STORE_OK && rc != STORE_STALE && rc != STORE_ERR_INVAL &&
            rc != STORE_ERR_NOMEM && rc != STORE_ERR_TOO_LARGE) {
            abort();
        }
        off += (size_t)n;
    }
}

/* Whether the put of a parsed body wrote back exactly its bytes. */
static void same_bytes(const uint8_t *want, const uint8_t *got, size_t n,
                       size_t written)
{
    if (written != n || memcmp(want, got, n) != 0) {
        abort();
    }
}

/*
 * Reads p as each round message body. A get must succeed exactly when the
 * layout fits, and what it read must write back to the same bytes.
 */
static void parse_bodies(const uint8_t *p, size_t len, uint8_t *scratch,
                         size_t scratch_cap)
{
    if (len > scratch_cap) {
        abort();
    }

    uint8_t flags;
    uint32_t count;
    int rc = repl_wire_get_mutations_head(p, len, &flags, &count);
    if ((rc == REPL_WIRE_OK) !=
        (len >= REPL_WIRE_MUT_HEADER &&
         len >= repl_wire_mutations_records_at(p[0]))) {
        abort();
    }
    if (rc == REPL_WIRE_OK) {
        size_t w = repl_wire_put_mutations_head(scratch, flags, count);
        same_bytes(p, scratch, REPL_WIRE_MUT_HEADER, w);
    }
    uint64_t run, seq;
    rc = repl_wire_get_mutations_pos(p, len, &run, &seq);
    if ((rc == REPL_WIRE_OK) !=
        (len >= REPL_WIRE_MUT_HEADER + REPL_WIRE_MUT_POS &&
         (p[0] & REPL_MUT_SEQ) != 0)) {
        abort();
    }
    if (rc == REPL_WIRE_OK) {
        /* The header as it came: with REPL_MUT_ACK a position may fit
         * where the whole head (its ticket too) does not, and count was
         * not read. */
        memcpy(scratch, p, REPL_WIRE_MUT_HEADER);
        repl_wire_put_mutations_pos(scratch, run, seq);
        same_bytes(p, scratch, REPL_WIRE_MUT_HEADER + REPL_WIRE_MUT_POS,
                   REPL_WIRE_MUT_HEADER + REPL_WIRE_MUT_POS);
    }
    uint64_t ticket;
    rc = repl_wire_get_mutations_ticket(p, len, &ticket);
    if ((rc == REPL_WIRE_OK) !=
        (len >= REPL_WIRE_MUT_HEADER && (p[0] & REPL_MUT_ACK) != 0 &&
         len >= repl_wire_mutations_records_at(p[0]))) {
        abort();
    }
    if (rc == REPL_WIRE_OK) {
        size_t at = repl_wire_mutations_records_at(p[0]);
        memcpy(scratch, p, at);
        repl_wire_put_mutations_ticket(scratch, ticket);
        same_bytes(p, scratch, at, at);
    }
    rc = repl_wire_get_push_ack(p, len, &ticket);
    if ((rc == REPL_WIRE_OK) != (len == REPL_WIRE_PUSH_ACK)) {
        abort();
    }
    if (rc == REPL_WIRE_OK) {
        size_t w = repl_wire_put_push_ack(scratch, ticket);
        same_bytes(p, scratch, REPL_WIRE_PUSH_ACK, w);
    }
    uint64_t own;
    rc = repl_wire_get_resume(p, len, &run, &seq, &own);
    if ((rc == REPL_WIRE_OK) != (len == REPL_WIRE_RESUME)) {
        abort();
    }
    if (rc == REPL_WIRE_OK) {
        size_t w = repl_wire_put_resume(scratch, run, seq, own);
        same_bytes(p, scratch, REPL_WIRE_RESUME, w);
    }

    repl_wire_symbols_req req;
    rc = repl_wire_get_symbols_req(p, len, &req);
    if ((rc == REPL_WIRE_OK) != (len >= REPL_WIRE_SYMBOLS_REQ_FIXED)) {
        abort();
    }
    if (rc == REPL_WIRE_OK) {
        if (req.rest != p + REPL_WIRE_SYMBOLS_REQ_FIXED ||
            req.nrest != len - REPL_WIRE_SYMBOLS_REQ_FIXED) {
            abort();
        }
        size_t w = repl_wire_put_symbols_req(scratch, req.offset, req.count,
                                             req.flags);
        same_bytes(p, scratch, REPL_WIRE_SYMBOLS_REQ_FIXED, w);
        /* The ring part at the size it has, and at two that it has not
         * (1 and the bitmap of the default 1024 partitions). */
        size_t sizes[3] = {req.nrest >= 8 ? req.nrest - 8 : 0, 1, 129};
        for (int i = 0; i < 3; i++) {
            size_t nbm = sizes[i];
            uint64_t fp;
            const uint8_t *bm;
            rc = repl_wire_get_ring_part(req.rest, req.nrest, nbm, &fp, &bm);
            if ((rc == REPL_WIRE_OK) != (req.nrest == 8 + nbm)) {
                abort();
            }
            if (rc != REPL_WIRE_OK) {
                continue;
            }
            if (bm != req.rest + 8) {
                abort();
            }
            uint32_t *parts = malloc((nbm * 8 + 1) * sizeof(*parts));
            if (parts == NULL) {
                abort();
            }
            size_t nparts = 0;
            for (uint32_t b = 0; b < (uint32_t)nbm * 8; b++) {
                if (bm[b / 8] & (1u << (b % 8))) {
                    parts[nparts++] = b;
                }
            }
            w = repl_wire_put_ring_part(scratch, fp, parts, nparts, nbm);
            same_bytes(req.rest, scratch, req.nrest, w);
            free(parts);
        }
    }

    repl_wire_symbols sy;
    rc = repl_wire_get_symbols(p, len, &sy);
    bool fits = len >= REPL_WIRE_SYMBOLS_FIXED &&
                (len - REPL_WIRE_SYMBOLS_FIXED) % RIBLT_SYMBOL_WIRE_SIZE == 0;
    if ((rc == REPL_WIRE_OK) != fits) {
        abort();
    }
    if (rc == REPL_WIRE_OK) {
        if (sy.symbols != p + REPL_WIRE_SYMBOLS_FIXED ||
            REPL_WIRE_SYMBOLS_FIXED + sy.n * RIBLT_SYMBOL_WIRE_SIZE != len) {
            abort();
        }
        size_t w = repl_wire_put_symbols_head(scratch, sy.offset, sy.set_size);
        same_bytes(p, scratch, REPL_WIRE_SYMBOLS_FIXED, w);
    }

    repl_wire_info info;
    rc = repl_wire_get_info(p, len, &info);
    if ((rc == REPL_WIRE_OK) != (len >= REPL_WIRE_INFO_FIXED)) {
        abort();
    }
    if (rc == REPL_WIRE_OK) {
        if ((const uint8_t *)info.addr != p + REPL_WIRE_INFO_FIXED ||
            info.naddr != len - REPL_WIRE_INFO_FIXED) {
            abort();
        }
        size_t w = repl_wire_put_info(scratch, &info);
        same_bytes(p, scratch, len, w);
    }

    /* PSUMS_REQ and PSUMS: the head, and the terms through the decoder,
     * whose result must have exactly those terms. */
    repl_wire_psums ps;
    bool head_ok = len >= REPL_WIRE_PSUMS_FIXED &&
                   (p[0] < RIBLT_PSUM_BUCKETS || p[0] == REPL_PSUMS_ALL) &&
                   (unsigned)p[1] + p[2] <= RIBLT_PSUM_TERMS;
    rc = repl_wire_get_psums_req(p, len, &ps);
    if ((rc == REPL_WIRE_OK) !=
        (head_ok && len == REPL_WIRE_PSUMS_FIXED && p[2] != 0)) {
        abort();
    }
    rc = repl_wire_get_psums(p, len, &ps);
    if ((rc == REPL_WIRE_OK) !=
        (head_ok && len == REPL_WIRE_PSUMS_FIXED +
                               (size_t)p[2] * RIBLT_PSUM_TERM_WIRE_SIZE)) {
        abort();
    }
    if (rc == REPL_WIRE_OK) {
        size_t w =
            repl_wire_put_psums_head(scratch, ps.bucket, ps.first, ps.count);
        same_bytes(p, scratch, REPL_WIRE_PSUMS_FIXED, w);
        riblt_id terms[RIBLT_PSUM_TERMS], found[RIBLT_PSUM_TERMS];
        for (unsigned i = 0; i < ps.count; i++) {
            riblt_id_from_bytes(&terms[i],
                                ps.terms + i * RIBLT_PSUM_TERM_WIRE_SIZE);
        }
        size_t n = 0;
        rc = riblt_psum_decode(terms, ps.count, found, RIBLT_PSUM_TERMS, &n);
        if (rc != RIBLT_OK && rc != RIBLT_NEED_MORE) {
            abort();
        }
        if (rc == RIBLT_OK) {
            /* Every found id, taken as one bucket: the same terms. */
            riblt_id table[RIBLT_PSUM_SIZE], sum[RIBLT_PSUM_TERMS];
            memset(table, 0, sizeof(table));
            for (size_t i = 0; i < n; i++) {
                riblt_psum_toggle(table, &found[i], 0);
            }
            riblt_psum_combine(table, sum);
            if (n >= ps.count ||
                memcmp(sum, terms, ps.count * sizeof(riblt_id)) != 0) {
                abort();
            }
        }
    }
}

/* Parses a stream of frames from buf; returns the payloads' records. */
static void parse_stream(store *st, const uint8_t *buf, size_t len,
                         const uint8_t *key, uint64_t seq, uint8_t *scratch,
                         size_t scratch_cap)
{
    size_t off = 0;
    while (off < len) {
        repl_frame f;
        size_t used = 0;
        int rc = repl_wire_parse(buf + off, len - off, key, seq,
                                 REPL_WIRE_MAX_PAYLOAD, &f, &used);
        if (rc != REPL_WIRE_OK) {
            if (rc != REPL_WIRE_NEED_MORE && rc != REPL_WIRE_ERR_MAGIC &&
                rc != REPL_WIRE_ERR_TOO_BIG && rc != REPL_WIRE_ERR_AUTH &&
                rc != REPL_WIRE_ERR_FORMAT && rc != REPL_WIRE_ERR_CRYPTO) {
                abort();
            }
            return;
        }
        if (used != repl_wire_frame_size(f.length) || used > len - off) {
            abort();
        }
        if (f.length > 0 && (f.payload < buf + off ||
                             f.payload + f.length > buf + off + used)) {
            abort();
        }
        apply_records(st, f.payload, f.length, scratch, scratch_cap);
        parse_bodies(f.payload, f.length, scratch, scratch_cap);
        if (f.length > 5) {
            apply_records(st, f.payload + 5, f.length - 5, scratch,
                          scratch_cap);
        }
        off += used;
        seq++;
    }
}

#ifdef FUZZ_REPL_WIRE_SEEDS
#include <stdio.h>

/* Writes one seed file dir/name. */
static void write_seed(const char *dir, const char *name, const uint8_t *p,
                       size_t n)
{
    char path[4096];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (f == NULL || fwrite(p, 1, n, f) != n || fclose(f) != 0) {
        perror(path);
        exit(1);
    }
}

/* Appends a MUTATIONS payload of three records to p; returns its size. */
static size_t batch(uint8_t *p, size_t cap)
{
    store_mutation m[3];
    memset(m, 0, sizeof(m));
    for (int i = 0; i < 3; i++) {
        m[i].version.ticks = FUZZ_T0_NS + (uint64_t)i;
        m[i].version.node = 2;
        m[i].flags = (uint32_t)i;
        m[i].cas = 0x5eed0000ULL + (uint64_t)i + 1;
    }
    m[0].kind = STORE_KIND_VALUE;
    m[0].key = "alpha";
    m[0].nkey = 5;
    m[0].value = "one";
    m[0].nvalue = 3;
    m[1].kind = STORE_KIND_TOMBSTONE;
    m[1].key = "beta";
    m[1].nkey = 4;
    m[2].kind = STORE_KIND_FLUSH;
    m[2].flush_at = FUZZ_T0_NS;
    for (int i = 0; i < 3; i++)
        m[i].id = store_mutation_id(&m[i]);
    size_t off = 5;
    p[0] = 0;
    repl_wire_put_u32(p + 1, 3);
    for (int i = 0; i < 3; i++) {
        long n = repl_wire_put_mutation(p + off, cap - off, &m[i]);
        if (n < 0) {
            exit(1);
        }
        off += (size_t)n;
    }
    return off;
}

/*
 * The seed corpus: a handshake frame, an authenticated MUTATIONS frame
 * under the target's session key, raw records, the input form that the
 * target itself wraps into a frame, and SYMBOLS_REQ (with and without the
 * ring part) and INFO frames, and PSUMS_REQ and PSUMS in the input form.
 * Usage: seeds <dir>.
 */
int main(int argc, char **argv)
{
    static uint8_t payload[4096], frame[8192], in[4096];
    if (argc != 2) {
        fprintf(stderr, "usage: %s <corpus dir>\n", argv[0]);
        return 2;
    }
    uint8_t hello[4 + REPL_WIRE_NONCE] = {7, 0, 0, 0};
    memset(hello + 4, 0x5a, REPL_WIRE_NONCE);
    long n = repl_wire_build(frame, sizeof(frame), REPL_MSG_HELLO, 0, hello,
                             sizeof(hello), NULL);
    write_seed(argv[1], "hello", frame, (size_t)n);

    size_t nb = batch(payload, sizeof(payload));
    n = repl_wire_build(frame, sizeof(frame), REPL_MSG_MUTATIONS, 0, payload,
                        (uint32_t)nb, fuzz_key);
    write_seed(argv[1], "mutations_frame", frame, (size_t)n);
    write_seed(argv[1], "records", payload + 5, nb - 5);

    in[0] = REPL_MSG_MUTATIONS;
    memcpy(in + 1, payload, nb);
    write_seed(argv[1], "mutations_wrapped", in, nb + 1);

    uint8_t req[12];
    repl_wire_put_u64(req, 0);
    repl_wire_put_u32(req + 8, 64);
    n = repl_wire_build(frame, sizeof(frame), REPL_MSG_SYMBOLS_REQ, 0, req,
                        sizeof(req), fuzz_key);
    write_seed(argv[1], "symbols_req", frame, (size_t)n);

    /* The request that opens a partitioned round: 1024 partitions, the
     * round over 3, 700 and the global one. */
    static const uint32_t parts[] = {3, 700, 1024};
    size_t len = repl_wire_put_symbols_req(payload, 0, 1, 0);
    len += repl_wire_put_ring_part(payload + len, 0x5c8e6b76c3200b1aULL, parts,
                                   3, 129);
    n = repl_wire_build(frame, sizeof(frame), REPL_MSG_SYMBOLS_REQ, 0, payload,
                        (uint32_t)len, fuzz_key);
    write_seed(argv[1], "symbols_req_ring", frame, (size_t)n);

    repl_wire_info info = {1, 1024, 2, "127.0.0.1:11211", 15};
    len = repl_wire_put_info(payload, &info);
    n = repl_wire_build(frame, sizeof(frame), REPL_MSG_INFO, 0, payload,
                        (uint32_t)len, fuzz_key);
    write_seed(argv[1], "info", frame, (size_t)n);

    /* A PSUMS_REQ, and a PSUMS carrying the first three terms of the sum
     * of a two-id set's buckets (which decode), wrapped. */
    in[0] = REPL_MSG_PSUMS_REQ;
    len = repl_wire_put_psums_head(in + 1, REPL_PSUMS_ALL, 0, 3);
    write_seed(argv[1], "psums_req_wrapped", in, len + 1);
    static riblt_id table[RIBLT_PSUM_SIZE];
    riblt_id two[2] = {{0x1234, 0x5678}, {0x9abc, 0xdef0}},
             t[RIBLT_PSUM_TERMS];
    for (int i = 0; i < 2; i++)
        riblt_psum_toggle(table, &two[i], riblt_hash(&two[i]));
    riblt_psum_combine(table, t);
    in[0] = REPL_MSG_PSUMS;
    len = repl_wire_put_psums_head(in + 1, REPL_PSUMS_ALL, 0, 3);
    for (int i = 0; i < 3; i++)
        riblt_id_to_bytes(&t[i], in + 1 + len + 16 * (size_t)i);
    write_seed(argv[1], "psums_wrapped", in, 1 + len + 48);
    return 0;
}
#else
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    store_options so;
    int err = 0;

    fuzz_clock_ns = FUZZ_T0_NS;
    store_options_default(&so);
    so.node_id = 7;
    so.memory_limit = 64u << 10; /* small inputs still evict */
    so.item_size_max = FUZZ_ITEM_MAX;
    so.sketch_symbols = 256;
    so.hash_power = 8;
    so.clock = fuzz_clock;
    store *st = store_create(&so, &err);
    if (st == NULL) {
        abort();
    }
    size_t cap = repl_wire_frame_size(size) + REPL_WIRE_MUT_FIXED;
    uint8_t *scratch = malloc(cap);
    if (scratch == NULL) {
        abort();
    }

    /* 1. The raw bytes as frames, without and with the key. */
    parse_stream(st, data, size, NULL, 0, scratch, cap);
    for (uint64_t seq = 0; seq < 2; seq++) {
        parse_stream(st, data, size, fuzz_key, seq, scratch, cap);
    }

    /* 2. A frame built around the input, which must parse back. */
    if (size >= 1 && size - 1 <= REPL_WIRE_MAX_PAYLOAD) {
        uint8_t type = data[0];
        uint32_t n = (uint32_t)(size - 1);
        uint8_t *frame = malloc(repl_wire_frame_size(n));
        if (frame == NULL) {
            abort();
        }
        /* Handshake frames carry a zero tag, all others the session's. */
        bool keyed = type != REPL_MSG_HELLO && type != REPL_MSG_CHALLENGE;
        long w = repl_wire_build(frame, repl_wire_frame_size(n), type, 3,
                                 data + 1, n, keyed ? fuzz_key : NULL);
        if (w == (long)repl_wire_frame_size(n)) {
            repl_frame f;
            size_t used = 0;
            int rc = repl_wire_parse(frame, (size_t)w, keyed ? fuzz_key : NULL,
                                     3, REPL_WIRE_MAX_PAYLOAD, &f, &used);
            if (rc != REPL_WIRE_OK) {
                abort(); /* an authentic frame must verify */
            }
            if (used != (size_t)w || f.type != type || f.length != n ||
                f.seq != 3 || memcmp(f.payload, data + 1, n) != 0) {
                abort();
            }
            apply_records(st, f.payload, f.length, scratch, cap);
            parse_bodies(f.payload, f.length, scratch, cap);
            /* A truncated copy is only ever "need more". */
            rc = repl_wire_parse(frame, (size_t)w - 1, keyed ? fuzz_key : NULL,
                                 3, REPL_WIRE_MAX_PAYLOAD, &f, &used);
            if (rc != REPL_WIRE_NEED_MORE) {
                abort();
            }
        } else if (w >= 0) {
            abort();
        }
        free(frame);
    }

    /* 3. The raw bytes as records, at the start and past a batch header. */
    apply_records(st, data, size, scratch, cap);
    if (size > 5) {
        apply_records(st, data + 5, size - 5, scratch, cap);
    }

    /* 4. The raw bytes as each message body. */
    parse_bodies(data, size, scratch, cap);

    free(scratch);
    store_destroy(st);
    return 0;
}
#endif /* FUZZ_REPL_WIRE_SEEDS */
