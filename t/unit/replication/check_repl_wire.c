/*
 * check_repl_wire.c -- peer frames: authentication, bounds, records.
 */
#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "repl_wire.h"

static void make_auth(repl_auth *a, const char *secret)
{
    memset(a, 0, sizeof(*a));
    a->secret = (const uint8_t *)secret;
    a->nsecret = strlen(secret);
    for (int i = 0; i < REPL_WIRE_NONCE; i++) {
        a->client_nonce[i] = (uint8_t)i;
        a->server_nonce[i] = (uint8_t)(200 - i);
    }
    a->client_node = 1;
    a->server_node = 2;
}

START_TEST(test_handshake_keys)
{
    repl_auth c, s, bad;
    make_auth(&c, "cluster secret");
    make_auth(&s, "cluster secret");
    make_auth(&bad, "another secret");
    ck_assert_int_eq(repl_wire_derive(&c), REPL_WIRE_OK);
    ck_assert_int_eq(repl_wire_derive(&s), REPL_WIRE_OK);
    ck_assert_int_eq(repl_wire_derive(&bad), REPL_WIRE_OK);
    ck_assert_int_eq(memcmp(c.session_key, s.session_key, 32), 0);
    ck_assert_int_ne(memcmp(c.session_key, bad.session_key, 32), 0);
    uint8_t p0[32], p1[32], pb[32];
    repl_wire_proof(&c, 0, p0);
    repl_wire_proof(&c, 1, p1);
    repl_wire_proof(&bad, 0, pb);
    ck_assert_int_ne(memcmp(p0, p1, 32), 0);
    ck_assert(repl_wire_proof_ok(&s, 0, p0, 32));
    ck_assert(!repl_wire_proof_ok(&s, 1, p0, 32)); /* reflected proof */
    ck_assert(!repl_wire_proof_ok(&s, 0, pb, 32)); /* wrong secret */
    ck_assert(!repl_wire_proof_ok(&s, 0, p0, 31)); /* short */
    /* Another nonce: nothing carries over. */
    s.server_nonce[0] ^= 1;
    ck_assert(!repl_wire_proof_ok(&s, 0, p0, 32));
    uint8_t n1[REPL_WIRE_NONCE], n2[REPL_WIRE_NONCE];
    ck_assert_int_eq(repl_wire_nonce(n1), REPL_WIRE_OK);
    ck_assert_int_eq(repl_wire_nonce(n2), REPL_WIRE_OK);
    ck_assert_int_ne(memcmp(n1, n2, REPL_WIRE_NONCE), 0);
}
END_TEST

static const uint8_t key[32] = {1, 2, 3, 4, 5, 6, 7, 8, 9};

START_TEST(test_frame_round_trip)
{
    uint8_t buf[256];
    const uint8_t payload[] = "twelve bytes";
    long n =
        repl_wire_build(buf, sizeof(buf), REPL_MSG_FETCH, 7, payload, 12, key);
    ck_assert_int_eq(n, REPL_WIRE_HEADER + 12 + REPL_WIRE_TAG);
    ck_assert_int_eq(memcmp(buf, "RB\x05\x0c\x0c\0\0\0\x07\0\0\0\0\0\0\0", 16),
                     0);
    repl_frame f;
    size_t used = 0;
    ck_assert_int_eq(repl_wire_parse(buf, (size_t)n, key, 7, 1024, &f, &used),
                     REPL_WIRE_OK);
    ck_assert_uint_eq(used, (size_t)n);
    ck_assert_uint_eq(f.type, REPL_MSG_FETCH);
    ck_assert_uint_eq(f.length, 12);
    ck_assert_int_eq(memcmp(f.payload, payload, 12), 0);
    /* Every proper prefix is incomplete, never an error. */
    for (long i = 0; i < n; i++)
        ck_assert_int_eq(
            repl_wire_parse(buf, (size_t)i, key, 7, 1024, &f, &used),
            REPL_WIRE_NEED_MORE);
    /* Wrong sequence number, wrong key, any flipped byte: refused. */
    ck_assert_int_eq(repl_wire_parse(buf, (size_t)n, key, 8, 1024, &f, &used),
                     REPL_WIRE_ERR_AUTH);
    uint8_t other[32] = {9};
    ck_assert_int_eq(
        repl_wire_parse(buf, (size_t)n, other, 7, 1024, &f, &used),
        REPL_WIRE_ERR_AUTH);
    for (long i = 8; i < n; i++) {
        buf[i] ^= 0x20;
        int rc = repl_wire_parse(buf, (size_t)n, key, 7, 1024, &f, &used);
        buf[i] ^= 0x20;
        if (rc != REPL_WIRE_ERR_AUTH)
            ck_abort_msg("flip at %ld accepted: %d", i, rc);
    }
    /* Unauthenticated parsing accepts no authenticated type. */
    ck_assert_int_eq(repl_wire_parse(buf, (size_t)n, NULL, 0, 1024, &f, &used),
                     REPL_WIRE_ERR_AUTH);
}
END_TEST

/* A kept HMAC context tags exactly as the one-shot key does, frame after
 * frame (the context is re-initialised each time, not chained). */
START_TEST(test_frame_mac_context)
{
    uint8_t a[256], b[256];
    const uint8_t payload[] = "twelve bytes";
    repl_mac *mac = repl_mac_create(key);
    ck_assert_ptr_nonnull(mac);
    for (uint64_t seq = 0; seq < 3; seq++) {
        long n = repl_wire_build(a, sizeof(a), REPL_MSG_FETCH, seq, payload,
                                 12, key);
        long m = repl_wire_build_mac(b, sizeof(b), REPL_MSG_FETCH, seq,
                                     payload, 12, mac);
        ck_assert_int_eq(n, m);
        ck_assert_int_eq(memcmp(a, b, (size_t)n), 0);
        repl_frame f;
        size_t used = 0;
        ck_assert_int_eq(
            repl_wire_parse_mac(a, (size_t)n, mac, seq, 1024, &f, &used),
            REPL_WIRE_OK);
        ck_assert_int_eq(
            repl_wire_parse_mac(a, (size_t)n, mac, seq + 1, 1024, &f, &used),
            REPL_WIRE_ERR_AUTH);
        a[20] ^= 1;
        ck_assert_int_eq(
            repl_wire_parse_mac(a, (size_t)n, mac, seq, 1024, &f, &used),
            REPL_WIRE_ERR_AUTH);
    }
    uint8_t other_key[32] = {9};
    repl_mac *other = repl_mac_create(other_key);
    ck_assert_ptr_nonnull(other);
    long n =
        repl_wire_build(a, sizeof(a), REPL_MSG_FETCH, 0, payload, 12, key);
    repl_frame f;
    size_t used = 0;
    ck_assert_int_eq(
        repl_wire_parse_mac(a, (size_t)n, other, 0, 1024, &f, &used),
        REPL_WIRE_ERR_AUTH);
    repl_mac_destroy(other);
    repl_mac_destroy(mac);
}
END_TEST

/* A process tells its own nonces from anyone else's. */
START_TEST(test_nonce_ours)
{
    uint8_t a[REPL_WIRE_NONCE], b[REPL_WIRE_NONCE];
    ck_assert_int_eq(repl_wire_nonce(a), REPL_WIRE_OK);
    ck_assert_int_eq(repl_wire_nonce(b), REPL_WIRE_OK);
    ck_assert(memcmp(a, b, sizeof(a)) != 0);
    ck_assert(repl_wire_nonce_ours(a));
    ck_assert(repl_wire_nonce_ours(b));
    for (size_t i = 0; i < sizeof(a); i++) {
        a[i] ^= 1;
        ck_assert(!repl_wire_nonce_ours(a));
        a[i] ^= 1;
    }
    uint8_t zero[REPL_WIRE_NONCE] = {0};
    ck_assert(!repl_wire_nonce_ours(zero));
}
END_TEST

START_TEST(test_handshake_frames)
{
    uint8_t buf[128], payload[36] = {0};
    long n = repl_wire_build(buf, sizeof(buf), REPL_MSG_HELLO, 0, payload, 36,
                             NULL);
    ck_assert_int_gt(n, 0);
    repl_frame f;
    size_t used;
    ck_assert_int_eq(repl_wire_parse(buf, (size_t)n, NULL, 0, 64, &f, &used),
                     REPL_WIRE_OK);
    ck_assert_uint_eq(f.type, REPL_MSG_HELLO);
    /* A handshake frame after authentication is refused. */
    ck_assert_int_eq(repl_wire_parse(buf, (size_t)n, key, 0, 64, &f, &used),
                     REPL_WIRE_ERR_AUTH);
    /* A handshake frame with a non-zero tag is refused. */
    buf[n - 1] = 1;
    ck_assert_int_eq(repl_wire_parse(buf, (size_t)n, NULL, 0, 64, &f, &used),
                     REPL_WIRE_ERR_AUTH);
}
END_TEST

START_TEST(test_bounds_before_buffering)
{
    uint8_t hdr[REPL_WIRE_HEADER] = {'R', 'B', REPL_WIRE_VERSION,
                                     REPL_MSG_SYMBOLS};
    repl_frame f;
    size_t used;
    repl_wire_put_u32(hdr + 4, 0xffffffffu);
    /* Rejected from the header alone, before the payload arrives. */
    ck_assert_int_eq(
        repl_wire_parse(hdr, sizeof(hdr), key, 0, 1u << 20, &f, &used),
        REPL_WIRE_ERR_TOO_BIG);
    repl_wire_put_u32(hdr + 4, (1u << 20) + 1);
    ck_assert_int_eq(
        repl_wire_parse(hdr, sizeof(hdr), key, 0, 1u << 20, &f, &used),
        REPL_WIRE_ERR_TOO_BIG);
    /* The hard cap applies even when the caller asks for more. */
    repl_wire_put_u32(hdr + 4, REPL_WIRE_MAX_PAYLOAD + 1);
    ck_assert_int_eq(
        repl_wire_parse(hdr, sizeof(hdr), key, 0, UINT32_MAX, &f, &used),
        REPL_WIRE_ERR_TOO_BIG);
    hdr[0] = 'G';
    ck_assert_int_eq(repl_wire_parse(hdr, sizeof(hdr), key, 0, 64, &f, &used),
                     REPL_WIRE_ERR_MAGIC);
    hdr[0] = 'R';
    hdr[2] = REPL_WIRE_VERSION + 1;
    ck_assert_int_eq(repl_wire_parse(hdr, sizeof(hdr), key, 0, 64, &f, &used),
                     REPL_WIRE_ERR_MAGIC);
    /* A version 1 peer (records without the cas) is refused, not misread. */
    hdr[2] = 1;
    ck_assert_int_eq(repl_wire_parse(hdr, sizeof(hdr), key, 0, 64, &f, &used),
                     REPL_WIRE_ERR_MAGIC);
    uint8_t small[48];
    ck_assert_int_eq(
        repl_wire_build(small, sizeof(small), REPL_MSG_DONE, 0, NULL, 0, key),
        REPL_WIRE_HEADER + REPL_WIRE_TAG);
    ck_assert_int_eq(
        repl_wire_build(small, sizeof(small), REPL_MSG_DONE, 0, small, 8, key),
        REPL_WIRE_ERR_SPACE);
}
END_TEST

/* A push's place in the sender's log, and RESUME, round trip; a frame
 * flagged with a position too short to hold it is refused. */
START_TEST(test_push_position)
{
    uint8_t buf[64];
    uint8_t flags;
    uint32_t count;
    uint64_t run, seq;

    ck_assert_uint_eq(repl_wire_mutations_records_at(REPL_MUT_PUSH),
                      REPL_WIRE_MUT_HEADER);
    ck_assert_uint_eq(
        repl_wire_mutations_records_at(REPL_MUT_PUSH | REPL_MUT_SEQ),
        REPL_WIRE_MUT_HEADER + REPL_WIRE_MUT_POS);
    repl_wire_put_mutations_head(buf, REPL_MUT_PUSH | REPL_MUT_SEQ, 7);
    repl_wire_put_mutations_pos(buf, 0x1122334455667788ULL, 4242);
    ck_assert_int_eq(repl_wire_get_mutations_head(buf, 21, &flags, &count),
                     REPL_WIRE_OK);
    ck_assert_uint_eq(flags, REPL_MUT_PUSH | REPL_MUT_SEQ);
    ck_assert_uint_eq(count, 7);
    ck_assert_int_eq(repl_wire_get_mutations_pos(buf, 21, &run, &seq),
                     REPL_WIRE_OK);
    ck_assert_uint_eq(run, 0x1122334455667788ULL);
    ck_assert_uint_eq(seq, 4242);
    /* Flagged, but cut inside the position. */
    ck_assert_int_eq(repl_wire_get_mutations_head(buf, 20, &flags, &count),
                     REPL_WIRE_ERR_FORMAT);
    ck_assert_int_eq(repl_wire_get_mutations_pos(buf, 20, &run, &seq),
                     REPL_WIRE_ERR_FORMAT);
    /* Not flagged: no position to read. */
    repl_wire_put_mutations_head(buf, REPL_MUT_PUSH, 7);
    ck_assert_int_eq(repl_wire_get_mutations_head(buf, 5, &flags, &count),
                     REPL_WIRE_OK);
    ck_assert_int_eq(repl_wire_get_mutations_pos(buf, 21, &run, &seq),
                     REPL_WIRE_ERR_FORMAT);

    uint64_t own;
    ck_assert_uint_eq(repl_wire_put_resume(buf, 99, 12345, 7),
                      REPL_WIRE_RESUME);
    ck_assert_int_eq(
        repl_wire_get_resume(buf, REPL_WIRE_RESUME, &run, &seq, &own),
        REPL_WIRE_OK);
    ck_assert_uint_eq(run, 99);
    ck_assert_uint_eq(seq, 12345);
    ck_assert_uint_eq(own, 7);
    ck_assert_int_eq(repl_wire_get_resume(buf, 23, &run, &seq, &own),
                     REPL_WIRE_ERR_FORMAT);
    ck_assert_int_eq(repl_wire_get_resume(buf, 25, &run, &seq, &own),
                     REPL_WIRE_ERR_FORMAT);
}
END_TEST

/* A push whose receiver is to confirm it: the ticket after the position
 * (or right after the header), and PUSH_ACK carrying it back. */
START_TEST(test_push_ticket)
{
    uint8_t buf[64];
    uint8_t flags;
    uint32_t count;
    uint64_t run, seq, ticket;
    const uint8_t both = REPL_MUT_PUSH | REPL_MUT_SEQ | REPL_MUT_ACK;

    ck_assert_uint_eq(repl_wire_mutations_records_at(both),
                      REPL_WIRE_MUT_HEADER + REPL_WIRE_MUT_POS +
                          REPL_WIRE_MUT_TICKET);
    repl_wire_put_mutations_head(buf, both, 3);
    repl_wire_put_mutations_pos(buf, 77, 4242);
    repl_wire_put_mutations_ticket(buf, 0x0102030405060708ULL);
    ck_assert_int_eq(repl_wire_get_mutations_head(buf, 29, &flags, &count),
                     REPL_WIRE_OK);
    ck_assert_int_eq(repl_wire_get_mutations_pos(buf, 29, &run, &seq),
                     REPL_WIRE_OK);
    ck_assert_uint_eq(seq, 4242);
    ck_assert_int_eq(repl_wire_get_mutations_ticket(buf, 29, &ticket),
                     REPL_WIRE_OK);
    ck_assert_uint_eq(ticket, 0x0102030405060708ULL);
    ck_assert_uint_eq(buf[21], 0x08); /* little-endian, after the position */
    /* Cut inside the ticket: no head, no ticket. */
    ck_assert_int_eq(repl_wire_get_mutations_head(buf, 28, &flags, &count),
                     REPL_WIRE_ERR_FORMAT);
    ck_assert_int_eq(repl_wire_get_mutations_ticket(buf, 28, &ticket),
                     REPL_WIRE_ERR_FORMAT);
    /* Without a position, the ticket follows the header. */
    repl_wire_put_mutations_head(buf, REPL_MUT_PUSH | REPL_MUT_ACK, 1);
    repl_wire_put_mutations_ticket(buf, 9);
    ck_assert_int_eq(repl_wire_get_mutations_ticket(buf, 13, &ticket),
                     REPL_WIRE_OK);
    ck_assert_uint_eq(ticket, 9);
    ck_assert_uint_eq(buf[REPL_WIRE_MUT_HEADER], 9);
    /* Not flagged: none. */
    repl_wire_put_mutations_head(buf, REPL_MUT_PUSH | REPL_MUT_SEQ, 1);
    ck_assert_int_eq(repl_wire_get_mutations_ticket(buf, 29, &ticket),
                     REPL_WIRE_ERR_FORMAT);

    ck_assert_uint_eq(repl_wire_put_push_ack(buf, 123456789),
                      REPL_WIRE_PUSH_ACK);
    ck_assert_int_eq(repl_wire_get_push_ack(buf, REPL_WIRE_PUSH_ACK, &ticket),
                     REPL_WIRE_OK);
    ck_assert_uint_eq(ticket, 123456789);
    ck_assert_int_eq(repl_wire_get_push_ack(buf, 7, &ticket),
                     REPL_WIRE_ERR_FORMAT);
    ck_assert_int_eq(repl_wire_get_push_ack(buf, 9, &ticket),
                     REPL_WIRE_ERR_FORMAT);
}
END_TEST

/* PSUMS_REQ and PSUMS: the exact bytes, and every malformed head refused. */
START_TEST(test_psums_messages)
{
    uint8_t b[3 + 2 * RIBLT_PSUM_TERM_WIRE_SIZE];
    repl_wire_psums w;

    ck_assert_uint_eq(repl_wire_put_psums_head(b, REPL_PSUMS_ALL, 4, 2), 3);
    ck_assert_int_eq(memcmp(b, "\xff\x04\x02", 3), 0);
    ck_assert_int_eq(repl_wire_get_psums_req(b, 3, &w), REPL_WIRE_OK);
    ck_assert_uint_eq(w.bucket, REPL_PSUMS_ALL);
    ck_assert_uint_eq(w.first, 4);
    ck_assert_uint_eq(w.count, 2);
    /* A request is exactly three bytes; a reply carries count terms. */
    ck_assert_int_eq(repl_wire_get_psums_req(b, 4, &w), REPL_WIRE_ERR_FORMAT);
    ck_assert_int_eq(repl_wire_get_psums(b, 3, &w), REPL_WIRE_ERR_FORMAT);
    riblt_id t = {0x0123456789abcdefULL, 0xfedcba9876543210ULL};
    riblt_id_to_bytes(&t, b + 3);
    riblt_id_to_bytes(&t, b + 3 + RIBLT_PSUM_TERM_WIRE_SIZE);
    ck_assert_int_eq(repl_wire_get_psums(b, sizeof(b), &w), REPL_WIRE_OK);
    ck_assert_ptr_eq(w.terms, b + 3);
    ck_assert_int_eq(repl_wire_get_psums(b, sizeof(b) - 1, &w),
                     REPL_WIRE_ERR_FORMAT);
    /* "none kept": a reply of count 0, which no request may be */
    repl_wire_put_psums_head(b, 7, 0, 0);
    ck_assert_int_eq(repl_wire_get_psums(b, 3, &w), REPL_WIRE_OK);
    ck_assert_int_eq(repl_wire_get_psums_req(b, 3, &w), REPL_WIRE_ERR_FORMAT);
    /* no bucket 8; no term 32 */
    repl_wire_put_psums_head(b, RIBLT_PSUM_BUCKETS, 0, 1);
    ck_assert_int_eq(repl_wire_get_psums_req(b, 3, &w), REPL_WIRE_ERR_FORMAT);
    repl_wire_put_psums_head(b, 0, RIBLT_PSUM_TERMS - 1, 2);
    ck_assert_int_eq(repl_wire_get_psums_req(b, 3, &w), REPL_WIRE_ERR_FORMAT);
    repl_wire_put_psums_head(b, 0, RIBLT_PSUM_TERMS - 1, 1);
    ck_assert_int_eq(repl_wire_get_psums_req(b, 3, &w), REPL_WIRE_OK);
}
END_TEST

START_TEST(test_mutation_records)
{
    store_mutation m = {
        .version = {1700000000123456789ULL, 3},
        .kind = STORE_KIND_VALUE,
        .flags = 0xdeadbeef,
        .exptime = 1800000000,
        .key = "user:42",
        .nkey = 7,
        .value = "hello world",
        .nvalue = 11,
    };
    m.id = store_mutation_id(&m);
    m.cas = store_fresh_cas(&m.id);
    uint8_t buf[160];
    /* A keyed value with its fresh cas: neither id nor cas is sent. */
    long n = repl_wire_put_mutation(buf, sizeof(buf), &m);
    ck_assert_int_eq(REPL_WIRE_MUT_FIXED, 31);
    ck_assert_int_eq(n, REPL_WIRE_MUT_FIXED + 7 + 11);
    ck_assert_uint_eq(repl_wire_mutation_size(&m), (size_t)n);
    ck_assert_uint_eq(buf[0], STORE_KIND_VALUE);
    /* flags, exptime, nkey and nvalue, little-endian, then the key. */
    ck_assert_int_eq(memcmp(buf + 13, "\xef\xbe\xad\xde", 4), 0);
    ck_assert_int_eq(memcmp(buf + 25, "\x07\0\x0b\0\0\0", 6), 0);
    ck_assert_int_eq(memcmp(buf + REPL_WIRE_MUT_FIXED, "user:42", 7), 0);
    store_mutation r;
    ck_assert_int_eq(repl_wire_get_mutation(buf, (size_t)n, 1024, &r), n);
    ck_assert(riblt_id_equal(&r.id, &m.id)); /* derived by the receiver */
    ck_assert_uint_eq(r.cas, m.cas);
    ck_assert_uint_eq(r.version.ticks, m.version.ticks);
    ck_assert_uint_eq(r.version.node, 3);
    ck_assert_uint_eq(r.flags, 0xdeadbeef);
    ck_assert_int_eq(r.exptime, 1800000000);
    ck_assert_uint_eq(r.nkey, 7);
    ck_assert_int_eq(memcmp(r.key, "user:42", 7), 0);
    ck_assert_uint_eq(r.nvalue, 11);
    ck_assert_int_eq(memcmp(r.value, "hello world", 11), 0);
    for (long i = 0; i < n; i++)
        ck_assert_int_eq(repl_wire_get_mutation(buf, (size_t)i, 1024, &r),
                         REPL_WIRE_ERR_FORMAT);
    ck_assert_int_eq(repl_wire_get_mutation(buf, (size_t)n, 10, &r),
                     REPL_WIRE_ERR_FORMAT); /* value over the cap */
    ck_assert_int_eq(repl_wire_put_mutation(buf, (size_t)n - 1, &m),
                     REPL_WIRE_ERR_SPACE);
    /* A cas of its own (touch, meta E) travels, flagged in the kind. */
    m.cas = 0x0102030405060708ULL;
    long nc = repl_wire_put_mutation(buf, sizeof(buf), &m);
    ck_assert_int_eq(nc, n + 8);
    ck_assert_uint_eq(buf[0], STORE_KIND_VALUE | REPL_WIRE_MUT_CAS);
    ck_assert_int_eq(memcmp(buf + REPL_WIRE_MUT_FIXED,
                            "\x08\x07\x06\x05\x04\x03\x02\x01", 8),
                     0);
    ck_assert_int_eq(repl_wire_get_mutation(buf, (size_t)nc, 1024, &r), nc);
    ck_assert_uint_eq(r.cas, 0x0102030405060708ULL);
    ck_assert(riblt_id_equal(&r.id, &m.id));
    /* The fresh cas sent explicitly is a second encoding: refused. */
    uint64_t fresh = store_fresh_cas(&m.id);
    uint8_t bad[160];
    memcpy(bad, buf, (size_t)nc);
    repl_wire_put_u64(bad + REPL_WIRE_MUT_FIXED, fresh);
    ck_assert_int_eq(repl_wire_get_mutation(bad, (size_t)nc, 1024, &r),
                     REPL_WIRE_ERR_FORMAT);
    m.cas = fresh;
    n = repl_wire_put_mutation(buf, sizeof(buf), &m);
    /* Malformed: unknown kind, bit 7, tombstone with a value, bad key
     * lengths. */
    memcpy(bad, buf, (size_t)n);
    bad[0] = 9;
    ck_assert_int_eq(repl_wire_get_mutation(bad, (size_t)n, 1024, &r),
                     REPL_WIRE_ERR_FORMAT);
    bad[0] = STORE_KIND_VALUE | 0x80;
    ck_assert_int_eq(repl_wire_get_mutation(bad, (size_t)n, 1024, &r),
                     REPL_WIRE_ERR_FORMAT);
    bad[0] = STORE_KIND_TOMBSTONE;
    ck_assert_int_eq(repl_wire_get_mutation(bad, (size_t)n, 1024, &r),
                     REPL_WIRE_ERR_FORMAT);
    memcpy(bad, buf, (size_t)n);
    bad[25] = 0;
    ck_assert_int_eq(repl_wire_get_mutation(bad, (size_t)n, 1024, &r),
                     REPL_WIRE_ERR_FORMAT);
    bad[25] = 251;
    ck_assert_int_eq(repl_wire_get_mutation(bad, sizeof(bad), 1024, &r),
                     REPL_WIRE_ERR_FORMAT);
    /* A value's marks ride in bits 4-5 of the kind byte; marks on a
     * tombstone are malformed. */
    ck_assert_uint_eq(r.marks, 0);
    m.marks = STORE_MARK_STALE | STORE_MARK_WON;
    ck_assert_int_eq(repl_wire_put_mutation(buf, sizeof(buf), &m), n);
    ck_assert_uint_eq(buf[0], STORE_KIND_VALUE | 0x30);
    ck_assert_int_eq(repl_wire_get_mutation(buf, (size_t)n, 1024, &r), n);
    ck_assert_uint_eq(r.kind, STORE_KIND_VALUE);
    ck_assert_uint_eq(r.marks, STORE_MARK_STALE | STORE_MARK_WON);
    /* A tombstone: key, no value; its id is derived too. */
    store_mutation t = {.version = {5, 2},
                        .kind = STORE_KIND_TOMBSTONE,
                        .key = "gone",
                        .nkey = 4};
    t.id = store_mutation_id(&t);
    t.cas = store_fresh_cas(&t.id);
    n = repl_wire_put_mutation(buf, sizeof(buf), &t);
    ck_assert_int_eq(n, REPL_WIRE_MUT_FIXED + 4);
    ck_assert_int_eq(repl_wire_get_mutation(buf, (size_t)n, 0, &r), n);
    ck_assert(riblt_id_equal(&r.id, &t.id));
    buf[0] = STORE_KIND_TOMBSTONE | 0x10;
    ck_assert_int_eq(repl_wire_get_mutation(buf, (size_t)n, 0, &r),
                     REPL_WIRE_ERR_FORMAT);
    /* A flush record: no key, its id and flush_at sent. */
    store_mutation fl = {
        .id = {7, 9}, .kind = STORE_KIND_FLUSH, .flush_at = 5};
    fl.cas = store_fresh_cas(&fl.id);
    n = repl_wire_put_mutation(buf, sizeof(buf), &fl);
    ck_assert_int_eq(n, REPL_WIRE_MUT_FIXED + 16 + 8);
    ck_assert_int_eq(repl_wire_get_mutation(buf, (size_t)n, 0, &r), n);
    ck_assert_uint_eq(r.flush_at, 5);
    ck_assert(riblt_id_equal(&r.id, &fl.id));
    buf[25] = 1;
    ck_assert_int_eq(repl_wire_get_mutation(buf, sizeof(buf), 0, &r),
                     REPL_WIRE_ERR_FORMAT);
    /* An evicted value's record: keyless, its id sent (the key's gid). */
    store_mutation ev = {.id = {0xabcdef, 0x1234},
                         .version = {9, 1},
                         .kind = STORE_KIND_EVICTED,
                         .flags = 3};
    ev.cas = store_fresh_cas(&ev.id);
    n = repl_wire_put_mutation(buf, sizeof(buf), &ev);
    ck_assert_int_eq(n, REPL_WIRE_MUT_FIXED + 16);
    ck_assert_int_eq(repl_wire_get_mutation(buf, (size_t)n, 0, &r), n);
    ck_assert(riblt_id_equal(&r.id, &ev.id));
    ck_assert_uint_eq(r.flags, 3);
}
END_TEST

static Suite *wire_suite(void)
{
    Suite *s = suite_create("repl_wire");
    TCase *tc = tcase_create("wire");
    tcase_add_test(tc, test_handshake_keys);
    tcase_add_test(tc, test_frame_round_trip);
    tcase_add_test(tc, test_frame_mac_context);
    tcase_add_test(tc, test_nonce_ours);
    tcase_add_test(tc, test_handshake_frames);
    tcase_add_test(tc, test_bounds_before_buffering);
    tcase_add_test(tc, test_mutation_records);
    tcase_add_test(tc, test_push_position);
    tcase_add_test(tc, test_push_ticket);
    tcase_add_test(tc, test_psums_messages);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(wire_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
