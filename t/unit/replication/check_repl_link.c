/*
 * check_repl_link.c -- authenticated links over a socketpair: the
 * handshake, a wrong secret, self-detection, the frame cap checked from the
 * header alone, replayed frames, and a link closed from its own callback.
 * Some tests drive one side by hand with repl_wire to send exactly the
 * bytes a hostile peer would.
 */
#include <check.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <event2/event.h>

#include "repl_link.h"
#include "repl_wire.h"

#define PUMP_ROUNDS 2000 /* loop iterations, about 1 ms each at most */

/* What one side's callbacks saw. */
struct side {
    repl_link *l;
    int ready;
    int closed;
    int why;
    int frames;
    uint8_t type;
    uint32_t length;
    uint8_t payload[64];
    bool close_in_frame; /* frame() closes its own link */
    uint64_t sent, recv, connects;
};

static int side_frame(void *arg, repl_link *l, const repl_frame *f)
{
    struct side *s = arg;
    s->frames++;
    s->type = f->type;
    s->length = f->length;
    memcpy(s->payload, f->payload,
           f->length < sizeof(s->payload) ? f->length : sizeof(s->payload));
    if (s->close_in_frame)
        repl_link_close(l);
    return 0;
}

static void side_ready(void *arg, repl_link *l)
{
    struct side *s = arg;
    ck_assert_ptr_eq(l, s->l);
    s->ready++;
}

static void side_closed(void *arg, repl_link *l, int why)
{
    struct side *s = arg;
    ck_assert_ptr_eq(l, s->l);
    s->closed++;
    s->why = why;
    s->l = NULL;
}

static const repl_link_ops ops = {
    .frame = side_frame,
    .ready = side_ready,
    .closed = side_closed,
};

static repl_link_options options(struct side *s, const char *secret,
                                 uint32_t node)
{
    repl_link_options o = {
        .secret = secret,
        .node_id = node,
        .detect_self = true,
        .max_payload = 1024,
        .bytes_sent = &s->sent,
        .bytes_recv = &s->recv,
        .connects = &s->connects,
    };
    return o;
}

/* Runs the loop until done(a, b) or PUMP_ROUNDS iterations. */
static bool pump(struct event_base *base, bool (*done)(struct side *, void *),
                 struct side *s, void *arg)
{
    for (int i = 0; i < PUMP_ROUNDS; i++) {
        if (done(s, arg))
            return true;
        event_base_loop(base, EVLOOP_NONBLOCK);
        usleep(500);
    }
    return done(s, arg);
}

static bool both_ready(struct side *a, void *arg)
{
    struct side *b = arg;
    return a->ready && b->ready;
}

static bool both_closed(struct side *a, void *arg)
{
    struct side *b = arg;
    return a->closed && b->closed;
}

static bool is_closed(struct side *a, void *arg)
{
    (void)arg;
    return a->closed;
}

static bool has_frames(struct side *a, void *arg)
{
    return a->frames >= *(int *)arg;
}

/* Two links on the two ends of a socketpair: a dials, b answers. */
static void pair(struct event_base *base, struct side *a, const char *sa,
                 uint32_t na, struct side *b, const char *sb, uint32_t nb)
{
    int sv[2];
    ck_assert_int_eq(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    evutil_make_socket_nonblocking(sv[0]);
    evutil_make_socket_nonblocking(sv[1]);
    repl_link_options oa = options(a, sa, na), ob = options(b, sb, nb);
    b->l = repl_link_accept(base, sv[1], &ob, &ops, b);
    a->l = repl_link_start(base, sv[0], &oa, &ops, a);
    ck_assert_ptr_nonnull(a->l);
    ck_assert_ptr_nonnull(b->l);
}

START_TEST(test_handshake_and_frames)
{
    struct event_base *base = event_base_new();
    struct side a = {0}, b = {0};
    pair(base, &a, "secret", 7, &b, "secret", 9);
    ck_assert(pump(base, both_ready, &a, &b));
    ck_assert_uint_eq(repl_link_peer_id(a.l), 9);
    ck_assert_uint_eq(repl_link_peer_id(b.l), 7);
    uint8_t p[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    ck_assert_int_eq(repl_link_send(a.l, REPL_MSG_PING, p, 8), REPL_LINK_OK);
    ck_assert_int_eq(repl_link_send(a.l, REPL_MSG_PONG, p, 4), REPL_LINK_OK);
    int two = 2, one = 1;
    ck_assert(pump(base, has_frames, &b, &two));
    ck_assert_uint_eq(b.type, REPL_MSG_PONG);
    ck_assert_uint_eq(b.length, 4);
    ck_assert_mem_eq(b.payload, p, 4);
    ck_assert_int_eq(repl_link_send(b.l, REPL_MSG_PONG, p + 4, 4),
                     REPL_LINK_OK);
    ck_assert(pump(base, has_frames, &a, &one));
    ck_assert_mem_eq(a.payload, p + 4, 4);
    /* Over the cap given at creation: refused before it is queued. */
    uint8_t big[1025] = {0};
    ck_assert_int_eq(repl_link_send(a.l, REPL_MSG_PING, big, sizeof(big)),
                     REPL_LINK_ERR_FRAME);
    /* Every byte one side sent, the other received, handshake included:
     * HELLO 84 + PROOF 80 + frames 56 + 52 one way. */
    ck_assert_uint_eq(a.sent, 84 + 80 + 56 + 52);
    ck_assert_uint_eq(a.sent, b.recv);
    ck_assert_uint_eq(b.sent, a.recv);
    ck_assert_uint_eq(a.connects, 0); /* not dialled */
    ck_assert_int_eq(a.closed + b.closed, 0);
    repl_link_close(a.l);
    ck_assert_int_eq(a.why, REPL_LINK_CLOSED_LOCAL);
    ck_assert(pump(base, is_closed, &b, NULL));
    ck_assert_int_eq(b.why, REPL_LINK_CLOSED_NET);
    event_base_free(base);
}
END_TEST

START_TEST(test_wrong_secret_is_refused)
{
    struct event_base *base = event_base_new();
    struct side a = {0}, b = {0};
    pair(base, &a, "one secret", 7, &b, "another", 9);
    ck_assert(pump(base, both_closed, &a, &b));
    ck_assert_int_eq(a.ready + b.ready, 0);
    /* The answering side cannot verify the PROOF's tag. */
    ck_assert_int_eq(b.why, REPL_LINK_CLOSED_AUTH);
    ck_assert_int_eq(a.why, REPL_LINK_CLOSED_NET);
    event_base_free(base);
}
END_TEST

START_TEST(test_self_is_detected_quietly)
{
    struct event_base *base = event_base_new();
    struct side a = {0}, b = {0};
    pair(base, &a, "secret", 5, &b, "secret", 5);
    ck_assert(pump(base, both_closed, &a, &b));
    ck_assert_int_eq(a.ready + b.ready, 0);
    ck_assert_int_eq(a.why, REPL_LINK_CLOSED_SELF);
    ck_assert_int_eq(b.why, REPL_LINK_CLOSED_SELF);
    event_base_free(base);
}
END_TEST

START_TEST(test_closing_from_frame_callback)
{
    struct event_base *base = event_base_new();
    struct side a = {0}, b = {0};
    pair(base, &a, "secret", 7, &b, "secret", 9);
    ck_assert(pump(base, both_ready, &a, &b));
    b.close_in_frame = true;
    uint8_t p[8] = {0};
    /* Two frames in one read: the second must not reach a closed link. */
    ck_assert_int_eq(repl_link_send(a.l, REPL_MSG_PING, p, 8), REPL_LINK_OK);
    ck_assert_int_eq(repl_link_send(a.l, REPL_MSG_PING, p, 8), REPL_LINK_OK);
    ck_assert(pump(base, both_closed, &a, &b));
    ck_assert_int_eq(b.frames, 1);
    ck_assert_int_eq(b.closed, 1);
    ck_assert_int_eq(b.why, REPL_LINK_CLOSED_LOCAL);
    event_base_free(base);
}
END_TEST

/* ------------------------------------------------ a hand-driven client */

struct raw {
    int fd;
    repl_auth auth;
    uint64_t seq;
    uint8_t in[512];
    size_t nin;
};

static void raw_write(struct raw *r, const uint8_t *p, size_t n)
{
    ck_assert_int_eq(write(r->fd, p, n), (ssize_t)n);
}

/* Sends one frame (key NULL: a handshake frame with a zero tag). */
static void raw_frame(struct raw *r, uint8_t type, const uint8_t *p,
                      uint32_t n, const uint8_t *key)
{
    uint8_t f[256];
    long len =
        repl_wire_build(f, sizeof(f), type, key ? r->seq++ : 0, p, n, key);
    ck_assert_int_gt(len, 0);
    raw_write(r, f, (size_t)len);
}

/* Pumps the loop until one whole frame arrived on the raw side. */
static void raw_read(struct event_base *base, struct raw *r,
                     const uint8_t *key, uint64_t seq, repl_frame *f)
{
    for (int i = 0; i < PUMP_ROUNDS; i++) {
        size_t used = 0;
        int rc = repl_wire_parse(r->in, r->nin, key, seq, 64, f, &used);
        if (rc == REPL_WIRE_OK) {
            /* The caller reads the payload before the next raw_read. */
            r->nin = 0;
            ck_assert_uint_eq(used, repl_wire_frame_size(f->length));
            return;
        }
        ck_assert_int_eq(rc, REPL_WIRE_NEED_MORE);
        event_base_loop(base, EVLOOP_NONBLOCK);
        ssize_t n = read(r->fd, r->in + r->nin, sizeof(r->in) - r->nin);
        if (n > 0)
            r->nin += (size_t)n;
        else
            usleep(500);
    }
    ck_abort_msg("no frame from the link");
}

/* A link answering on sv[1], the raw side on sv[0]. */
static void raw_pair(struct event_base *base, struct raw *r, struct side *b)
{
    int sv[2];
    ck_assert_int_eq(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    evutil_make_socket_nonblocking(sv[0]);
    evutil_make_socket_nonblocking(sv[1]);
    memset(r, 0, sizeof(*r));
    r->fd = sv[0];
    r->auth.secret = (const uint8_t *)"secret";
    r->auth.nsecret = 6;
    repl_link_options o = options(b, "secret", 9);
    o.max_payload = 100;
    b->l = repl_link_accept(base, sv[1], &o, &ops, b);
    ck_assert_ptr_nonnull(b->l);
}

/* Runs the client's side of the handshake by hand. */
static void raw_handshake(struct event_base *base, struct raw *r)
{
    uint8_t p[4 + REPL_WIRE_NONCE];
    r->auth.client_node = 7;
    ck_assert_int_eq(repl_wire_nonce(r->auth.client_nonce), REPL_WIRE_OK);
    repl_wire_put_u32(p, 7);
    memcpy(p + 4, r->auth.client_nonce, REPL_WIRE_NONCE);
    raw_frame(r, REPL_MSG_HELLO, p, sizeof(p), NULL);
    repl_frame f;
    raw_read(base, r, NULL, 0, &f);
    ck_assert_uint_eq(f.type, REPL_MSG_CHALLENGE);
    ck_assert_uint_eq(f.length, 4 + REPL_WIRE_NONCE);
    r->auth.server_node = repl_wire_get_u32(f.payload);
    ck_assert_uint_eq(r->auth.server_node, 9);
    memcpy(r->auth.server_nonce, f.payload + 4, REPL_WIRE_NONCE);
    ck_assert_int_eq(repl_wire_derive(&r->auth), REPL_WIRE_OK);
    uint8_t proof[32];
    ck_assert_int_eq(repl_wire_proof(&r->auth, 0, proof), REPL_WIRE_OK);
    raw_frame(r, REPL_MSG_PROOF, proof, 32, r->auth.session_key);
    raw_read(base, r, r->auth.session_key, 0, &f);
    ck_assert_uint_eq(f.type, REPL_MSG_ACCEPT);
    ck_assert(repl_wire_proof_ok(&r->auth, 1, f.payload, f.length));
}

/* A frame header alone, claiming length bytes of payload. */
static void raw_header(struct raw *r, uint32_t length)
{
    uint8_t h[REPL_WIRE_HEADER] = {'R', 'B', REPL_WIRE_VERSION, REPL_MSG_PING};
    repl_wire_put_u32(h + 4, length);
    repl_wire_put_u64(h + 8, r->seq);
    raw_write(r, h, sizeof(h));
}

START_TEST(test_raw_handshake_then_frames)
{
    struct event_base *base = event_base_new();
    struct raw r;
    struct side b = {0};
    raw_pair(base, &r, &b);
    raw_handshake(base, &r);
    ck_assert_int_eq(b.ready, 1);
    uint8_t p[8] = {9, 8, 7, 6, 5, 4, 3, 2};
    raw_frame(&r, REPL_MSG_PING, p, 8, r.auth.session_key);
    int one = 1;
    ck_assert(pump(base, has_frames, &b, &one));
    ck_assert_mem_eq(b.payload, p, 8);
    ck_assert_int_eq(b.closed, 0);
    repl_link_close(b.l);
    close(r.fd);
    event_base_free(base);
}
END_TEST

START_TEST(test_oversized_handshake_frame_refused_from_header)
{
    struct event_base *base = event_base_new();
    struct raw r;
    struct side b = {0};
    raw_pair(base, &r, &b);
    /* 65 bytes is over the handshake's cap; the payload never comes. */
    raw_header(&r, 65);
    ck_assert(pump(base, is_closed, &b, NULL));
    ck_assert_int_eq(b.why, REPL_LINK_CLOSED_BAD_FRAME);
    ck_assert_int_eq(b.ready, 0);
    close(r.fd);
    event_base_free(base);
}
END_TEST

START_TEST(test_oversized_frame_refused_from_header)
{
    struct event_base *base = event_base_new();
    struct raw r;
    struct side b = {0};
    raw_pair(base, &r, &b);
    raw_handshake(base, &r);
    /* At the cap: the link waits for the payload and stays open. */
    raw_header(&r, 100);
    for (int i = 0; i < 20; i++) {
        event_base_loop(base, EVLOOP_NONBLOCK);
        usleep(500);
    }
    ck_assert_int_eq(b.closed, 0);
    close(r.fd);
    repl_link_close(b.l);

    struct side c = {0};
    raw_pair(base, &r, &c);
    raw_handshake(base, &r);
    /* One byte over the caller's cap: refused from the header alone. */
    raw_header(&r, 101);
    ck_assert(pump(base, is_closed, &c, NULL));
    ck_assert_int_eq(c.why, REPL_LINK_CLOSED_BAD_FRAME);
    ck_assert_int_eq(c.frames, 0);
    close(r.fd);
    event_base_free(base);
}
END_TEST

START_TEST(test_replayed_frame_refused)
{
    struct event_base *base = event_base_new();
    struct raw r;
    struct side b = {0};
    raw_pair(base, &r, &b);
    raw_handshake(base, &r);
    uint8_t p[8] = {1}, f[64];
    long n = repl_wire_build(f, sizeof(f), REPL_MSG_PING, r.seq++, p, 8,
                             r.auth.session_key);
    ck_assert_int_gt(n, 0);
    raw_write(&r, f, (size_t)n);
    int one = 1;
    ck_assert(pump(base, has_frames, &b, &one));
    ck_assert_int_eq(b.closed, 0);
    /* The same bytes again: a valid tag, an old seq. */
    raw_write(&r, f, (size_t)n);
    ck_assert(pump(base, is_closed, &b, NULL));
    ck_assert_int_eq(b.why, REPL_LINK_CLOSED_AUTH);
    ck_assert_int_eq(b.frames, 1);
    close(r.fd);
    event_base_free(base);
}
END_TEST

static Suite *link_suite(void)
{
    Suite *s = suite_create("repl_link");
    TCase *tc = tcase_create("link");
    tcase_add_test(tc, test_handshake_and_frames);
    tcase_add_test(tc, test_wrong_secret_is_refused);
    tcase_add_test(tc, test_self_is_detected_quietly);
    tcase_add_test(tc, test_closing_from_frame_callback);
    tcase_add_test(tc, test_raw_handshake_then_frames);
    tcase_add_test(tc, test_oversized_handshake_frame_refused_from_header);
    tcase_add_test(tc, test_oversized_frame_refused_from_header);
    tcase_add_test(tc, test_replayed_frame_refused);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(link_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
