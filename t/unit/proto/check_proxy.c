/*
 * check_proxy.c -- relaying requests to the node that owns their key,
 * driven for real on loopback.
 *
 * Two servers run in this process, each an event loop thread with its own
 * store, connection environment and listener on 127.0.0.1 (port 0). A's
 * route sends keys "b:..." to B, "f:..." to a closed port then B
 * (fallback), "d:..." to a closed port, "m:..." to two closed ports,
 * "h:..." to a listener that never answers and "g:..." to a fake node that
 * answers garbage. B's route sends "b:..." back to A: a ring that
 * disagrees, which must not loop. Every test asserts the exact bytes a
 * client reads through A (or B), and where the data landed.
 */
#include <arpa/inet.h>
#include <check.h>
#include <errno.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <event2/event.h>
#include <event2/listener.h>

#include "bin_wire.h"
#include "conn.h"
#include "options.h"
#include "proxy.h"
#include "stats_registry.h"
#include "showbytes.h"

#define TIMEOUT_MS 300 /* the relay timeout of the servers under test */

/* ============================================================ routes */

typedef struct route_rule {
    char prefix[8];
    int n;
    proto_target t[3];
} route_rule;

typedef struct route_tab {
    route_rule rules[8];
    int nrules;
} route_tab;

/* What the route was last asked about "w:" keys (served here). */
static int w_calls;
static bool w_write;

static int route_cb(void *arg, const char *key, size_t nkey, bool write,
                    proto_target *out, int cap)
{
    const route_tab *tab = arg;
    if (nkey >= 2 && memcmp(key, "w:", 2) == 0) {
        __atomic_store_n(&w_write, write, __ATOMIC_RELAXED);
        __atomic_fetch_add(&w_calls, 1, __ATOMIC_RELAXED);
        return 0;
    }
    for (int i = 0; i < tab->nrules; i++) {
        const route_rule *r = &tab->rules[i];
        size_t pl = strlen(r->prefix);
        if (nkey >= pl && memcmp(key, r->prefix, pl) == 0) {
            int n = r->n < cap ? r->n : cap;
            memcpy(out, r->t, (size_t)n * sizeof(*out));
            return n;
        }
    }
    return 0;
}

static proto_target target(uint32_t node, int port)
{
    proto_target t;
    struct sockaddr_in sin;
    memset(&t, 0, sizeof(t));
    memset(&sin, 0, sizeof(sin));
    sin.sin_family = AF_INET;
    sin.sin_port = htons((uint16_t)port);
    sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    memcpy(&t.addr, &sin, sizeof(sin));
    t.addrlen = sizeof(sin);
    t.node = node;
    return t;
}

static void add_rule(route_tab *tab, const char *prefix, int n,
                     const proto_target *t)
{
    route_rule *r = &tab->rules[tab->nrules++];
    snprintf(r->prefix, sizeof(r->prefix), "%s", prefix);
    r->n = n;
    memcpy(r->t, t, (size_t)n * sizeof(*t));
}

/* =========================================================== servers */

typedef struct tsrv {
    struct event_base *base;
    struct evconnlistener *lis;
    struct event *stop_ev;
    int stop_pipe[2];
    conn_env env;
    store *st;
    proto_config cfg;
    stats_thread stats;
    route_tab routes;
    pthread_t tid;
    int port;
} tsrv;

static tsrv A, B;
static int dead_port, dead_port2;
static int hung_fd, hung_port;
static int fake_fd, fake_port;
static pthread_t fake_tid;

static void accept_cb(struct evconnlistener *l, evutil_socket_t fd,
                      struct sockaddr *sa, int salen, void *arg)
{
    tsrv *s = arg;
    (void)l;
    STATS_CONN_ADD(curr_connections, 1);
    conn_open(&s->env, fd, sa, (socklen_t)salen, false);
}

static void stop_cb(evutil_socket_t fd, short what, void *arg)
{
    tsrv *s = arg;
    (void)fd;
    (void)what;
    event_base_loopbreak(s->base);
}

static void *srv_loop(void *arg)
{
    tsrv *s = arg;
    event_base_dispatch(s->base);
    return NULL;
}

static int local_port(int fd)
{
    struct sockaddr_in sin;
    socklen_t len = sizeof(sin);
    ck_assert_int_eq(getsockname(fd, (struct sockaddr *)&sin, &len), 0);
    return ntohs(sin.sin_port);
}

/* A listening TCP socket on 127.0.0.1, port picked by the kernel. */
static int listen_any(int backlog)
{
    struct sockaddr_in sin;
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    ck_assert_int_ge(fd, 0);
    memset(&sin, 0, sizeof(sin));
    sin.sin_family = AF_INET;
    sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ck_assert_int_eq(bind(fd, (struct sockaddr *)&sin, sizeof(sin)), 0);
    ck_assert_int_eq(listen(fd, backlog), 0);
    return fd;
}

/* A port nothing listens on (bound, then closed). */
static int closed_port(void)
{
    int fd = listen_any(1);
    int port = local_port(fd);
    close(fd);
    return port;
}

static void srv_start(tsrv *s, uint32_t node)
{
    store_options o;
    int err = 0;
    struct sockaddr_in sin;

    memset(s, 0, sizeof(*s));
    store_options_default(&o);
    o.node_id = node;
    s->st = store_create(&o, &err);
    ck_assert_ptr_nonnull(s->st);
    s->cfg.item_size_max = 1024 * 1024;
    s->cfg.flush_enabled = true;
    s->cfg.cas_enabled = true;
    s->cfg.max_line = 2048;
    s->cfg.output_max = 4 * 1024 * 1024;
    s->cfg.version = "1.6.99-test";
    s->cfg.stats_list = stats_emit_group;
    s->cfg.stats_reset = stats_reset;
    s->cfg.route_fn = route_cb;
    s->cfg.route_arg = &s->routes;
    s->cfg.proxy_timeout_ms = TIMEOUT_MS;
    s->base = event_base_new();
    ck_assert_ptr_nonnull(s->base);
    conn_env_init(&s->env);
    s->env.base = s->base;
    s->env.store = s->st;
    s->env.pcfg = &s->cfg;
    s->env.stats = &s->stats;
    s->env.reqs_per_event = 20;
    s->env.output_max = s->cfg.output_max;
    s->env.input_max = 2 * s->cfg.item_size_max + s->cfg.max_line;
    s->env.proto_mode = OPTIONS_PROTO_AUTO;
    memset(&sin, 0, sizeof(sin));
    sin.sin_family = AF_INET;
    sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    s->lis = evconnlistener_new_bind(s->base, accept_cb, s,
                                     LEV_OPT_CLOSE_ON_FREE | LEV_OPT_REUSEABLE,
                                     64, (struct sockaddr *)&sin, sizeof(sin));
    ck_assert_ptr_nonnull(s->lis);
    s->port = local_port(evconnlistener_get_fd(s->lis));
    ck_assert_int_eq(pipe(s->stop_pipe), 0);
    s->stop_ev = event_new(s->base, s->stop_pipe[0], EV_READ, stop_cb, s);
    ck_assert_int_eq(event_add(s->stop_ev, NULL), 0);
}

static void srv_run(tsrv *s)
{
    ck_assert_int_eq(pthread_create(&s->tid, NULL, srv_loop, s), 0);
}

static void srv_stop(tsrv *s)
{
    ck_assert_int_eq(write(s->stop_pipe[1], "q", 1), 1);
    pthread_join(s->tid, NULL);
    conn_env_destroy(&s->env);
    conn_env_fini(&s->env);
    evconnlistener_free(s->lis);
    event_free(s->stop_ev);
    close(s->stop_pipe[0]);
    close(s->stop_pipe[1]);
    event_base_free(s->base);
    store_destroy(s->st);
}

/* What the fake node answers next (set by a test before it asks). */
static const char *fake_junk;
static size_t fake_njunk;
static bool fake_hangup; /* close right after answering */

/* The fake node: accepts, reads, answers fake_junk. */
static void *fake_loop(void *arg)
{
    char buf[4096];
    (void)arg;
    for (int i = 0; i < 16; i++) {
        int c = accept(fake_fd, NULL, NULL);
        if (c < 0)
            return NULL;
        struct timeval tv = {5, 0};
        setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
        if (recv(c, buf, sizeof(buf), 0) > 0 && fake_junk != NULL &&
            send(c, fake_junk, fake_njunk, MSG_NOSIGNAL) > 0 && !fake_hangup) {
            /* until the relay hangs up (it must) or 5 s pass */
            while (recv(c, buf, sizeof(buf), 0) > 0)
                ;
        }
        close(c);
    }
    return NULL;
}

static void setup(void)
{
    srv_start(&A, 1);
    srv_start(&B, 2);
    dead_port = closed_port();
    dead_port2 = closed_port();
    hung_fd = listen_any(16); /* never accepts: connects, never answers */
    hung_port = local_port(hung_fd);
    fake_fd = listen_any(4);
    fake_port = local_port(fake_fd);
    struct timeval tv = {5, 0};
    setsockopt(fake_fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));

    proto_target b = target(2, B.port), a = target(1, A.port);
    proto_target dead = target(3, dead_port), dead2 = target(4, dead_port2);
    proto_target hung = target(5, hung_port), fake = target(6, fake_port);
    proto_target fb[2] = {dead, b}, dd[2] = {dead, dead2};
    add_rule(&A.routes, "b:", 1, &b);
    add_rule(&A.routes, "f:", 2, fb);
    add_rule(&A.routes, "d:", 1, &dead);
    add_rule(&A.routes, "m:", 2, dd);
    add_rule(&A.routes, "h:", 1, &hung);
    add_rule(&A.routes, "g:", 1, &fake);
    add_rule(&B.routes, "b:", 1, &a); /* disagrees with A on purpose */
    srv_run(&A);
    srv_run(&B);
    ck_assert_int_eq(pthread_create(&fake_tid, NULL, fake_loop, NULL), 0);
}

static void teardown(void)
{
    srv_stop(&A);
    srv_stop(&B);
    shutdown(fake_fd, SHUT_RDWR);
    close(fake_fd);
    pthread_join(fake_tid, NULL);
    close(hung_fd);
}

/* ============================================================ clients */

static int client(int port)
{
    struct sockaddr_in sin;
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    struct timeval tv = {5, 0};
    ck_assert_int_ge(fd, 0);
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    memset(&sin, 0, sizeof(sin));
    sin.sin_family = AF_INET;
    sin.sin_port = htons((uint16_t)port);
    sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ck_assert_int_eq(connect(fd, (struct sockaddr *)&sin, sizeof(sin)), 0);
    return fd;
}

static void send_all(int fd, const void *p, size_t n)
{
    const char *c = p;
    while (n > 0) {
        ssize_t w = send(fd, c, n, MSG_NOSIGNAL);
        ck_assert_int_gt(w, 0);
        c += w;
        n -= (size_t)w;
    }
}

/* Reads n bytes (fewer on end of input or after the 5 s timeout). */
static size_t recv_n(int fd, char *buf, size_t n)
{
    size_t got = 0;
    while (got < n) {
        ssize_t r = recv(fd, buf + got, n - got, 0);
        if (r <= 0)
            break;
        got += (size_t)r;
    }
    return got;
}

/* Reads exactly nwant bytes and compares them. */
static void expect_read(int fd, const char *want, size_t nwant, int line)
{
    char *got = malloc(nwant + 1);
    size_t n = recv_n(fd, got, nwant);
    if (n != nwant || memcmp(got, want, n) != 0) {
        static char a[8192], b[8192];
        show(a, sizeof(a), got, n);
        show(b, sizeof(b), want, nwant);
        ck_abort_msg("line %d:\n got  \"%s\"\n want \"%s\"", line, a, b);
    }
    free(got);
}

/*
 * Text: sends req and then "mn", and expects want and then "MN": the
 * no-op is served here, so its answer also proves that nothing else came
 * before it.
 */
static void expect_text(int fd, const char *req, size_t nreq, const char *want,
                        size_t nwant, int line)
{
    char *w = malloc(nwant + 4);
    memcpy(w, want, nwant);
    memcpy(w + nwant, "MN\r\n", 4);
    send_all(fd, req, nreq);
    send_all(fd, "mn\r\n", 4);
    expect_read(fd, w, nwant + 4, line);
    free(w);
}

#define EXPECT(fd, req, want)                                                 \
    expect_text(fd, req, sizeof(req) - 1, want, sizeof(want) - 1, __LINE__)
#define EXPECT_S(fd, req, want)                                               \
    expect_text(fd, req, strlen(req), want, strlen(want), __LINE__)

static uint64_t cas_in(tsrv *s, const char *key)
{
    store_item *it = store_get(s->st, key, strlen(key));
    ck_assert_msg(it != NULL, "key %s missing", key);
    uint64_t c = store_item_cas(it);
    store_item_release(it);
    return c;
}

static void expect_in(tsrv *s, const char *key, const char *value)
{
    store_item *it = store_get(s->st, key, strlen(key));
    ck_assert_msg(it != NULL, "key %s missing", key);
    size_t n;
    const char *v = store_item_value(it, &n);
    ck_assert_uint_eq(n, strlen(value));
    ck_assert(memcmp(v, value, n) == 0);
    store_item_release(it);
}

static void expect_not_in(tsrv *s, const char *key)
{
    store_item *it = store_get(s->st, key, strlen(key));
    ck_assert_msg(it == NULL, "key %s present", key);
}

static uint64_t counter(uint64_t *c)
{
    return __atomic_load_n(c, __ATOMIC_RELAXED);
}

/* ============================================================= text */

START_TEST(test_text_commands)
{
    int c = client(A.port);
    char req[256], want[256];

    EXPECT(c, "set b:k 5 0 3\r\nabc\r\n", "STORED\r\n");
    expect_in(&B, "b:k", "abc");
    expect_not_in(&A, "b:k");
    EXPECT(c, "get b:k\r\n", "VALUE b:k 5 3\r\nabc\r\nEND\r\n");
    uint64_t cas = cas_in(&B, "b:k");
    snprintf(want, sizeof(want), "VALUE b:k 5 3 %" PRIu64 "\r\nabc\r\nEND\r\n",
             cas);
    EXPECT_S(c, "gets b:k\r\n", want);
    snprintf(req, sizeof(req), "cas b:k 6 0 3 %" PRIu64 "\r\nxyz\r\n", cas);
    EXPECT_S(c, req, "STORED\r\n");
    EXPECT_S(c, req, "EXISTS\r\n"); /* the cas moved on */
    EXPECT(c, "append b:k 0 0 2\r\n12\r\n", "STORED\r\n");
    EXPECT(c, "prepend b:k 0 0 1\r\n<\r\n", "STORED\r\n");
    EXPECT(c, "get b:k\r\n", "VALUE b:k 6 6\r\n<xyz12\r\nEND\r\n");
    EXPECT(c, "add b:k 0 0 1\r\nq\r\n", "NOT_STORED\r\n");
    EXPECT(c, "replace b:none 0 0 1\r\nq\r\n", "NOT_STORED\r\n");
    EXPECT(c, "set b:n 0 0 1\r\n5\r\n", "STORED\r\n");
    EXPECT(c, "incr b:n 10\r\n", "15\r\n");
    EXPECT(c, "decr b:n 3\r\n", "12\r\n");
    EXPECT(c, "incr b:none 1\r\n", "NOT_FOUND\r\n");
    EXPECT(c, "touch b:k 100\r\n", "TOUCHED\r\n");
    EXPECT(c, "touch b:none 100\r\n", "NOT_FOUND\r\n");
    EXPECT(c, "gat 100 b:k\r\n", "VALUE b:k 6 6\r\n<xyz12\r\nEND\r\n");
    snprintf(want, sizeof(want),
             "VALUE b:k 6 6 %" PRIu64 "\r\n<xyz12\r\nEND\r\n",
             cas_in(&B, "b:k"));
    EXPECT_S(c, "gats 100 b:k\r\n", want);
    EXPECT(c, "delete b:k\r\n", "DELETED\r\n");
    EXPECT(c, "delete b:k\r\n", "NOT_FOUND\r\n");
    EXPECT(c, "get b:k\r\n", "END\r\n");
    expect_not_in(&B, "b:k");
    expect_in(&B, "b:n", "12");
    expect_not_in(&A, "b:n");

    /* other keys stay here; bad input is answered here */
    EXPECT(c, "set a:k 0 0 1\r\nL\r\n", "STORED\r\n");
    expect_in(&A, "a:k", "L");
    expect_not_in(&B, "a:k");
    {
        /* a key of 251 bytes is refused before anything is relayed */
        char longreq[300];
        snprintf(longreq, sizeof(longreq), "get b:k b:%0249d\r\n", 0);
        EXPECT_S(c, longreq, "CLIENT_ERROR bad command line format\r\n");
    }
    EXPECT(c, "incr b:n x\r\n",
           "CLIENT_ERROR invalid numeric delta argument\r\n");
    EXPECT(c, "set b:k 0 0 1\r\nxx\r\n",
           "CLIENT_ERROR bad data chunk\r\nERROR\r\n");
    EXPECT(c, "version\r\n", "VERSION 1.6.99-test\r\n");
    /* every relayed request was counted, none failed */
    ck_assert_uint_eq(counter(&A.stats.proxied_requests), 21);
    ck_assert_uint_eq(counter(&A.stats.proxy_failures), 0);
    close(c);
}
END_TEST

START_TEST(test_multiget_order)
{
    int c = client(A.port);
    char want[512];

    EXPECT(c,
           "set a1 1 0 2\r\nA1\r\nset b:1 2 0 2\r\nB1\r\n"
           "set b:2 3 0 2\r\nB2\r\nset a2 4 0 2\r\nA2\r\n"
           "set b:3 5 0 2\r\nB3\r\n",
           "STORED\r\nSTORED\r\nSTORED\r\nSTORED\r\nSTORED\r\n");
    EXPECT(c, "get a1 b:1 b:2 a2 b:x b:3 a:none\r\n",
           "VALUE a1 1 2\r\nA1\r\nVALUE b:1 2 2\r\nB1\r\nVALUE b:2 3 2\r\n"
           "B2\r\nVALUE a2 4 2\r\nA2\r\nVALUE b:3 5 2\r\nB3\r\nEND\r\n");
    EXPECT(c, "get b:3 b:1 b:1\r\n",
           "VALUE b:3 5 2\r\nB3\r\nVALUE b:1 2 2\r\nB1\r\nVALUE b:1 2 2\r\n"
           "B1\r\nEND\r\n");
    EXPECT(c, "get b:x b:y\r\n", "END\r\n");
    snprintf(want, sizeof(want),
             "VALUE b:2 3 2 %" PRIu64 "\r\nB2\r\nVALUE a1 1 2 %" PRIu64
             "\r\nA1\r\nEND\r\n",
             cas_in(&B, "b:2"), cas_in(&A, "a1"));
    EXPECT_S(c, "gets b:2 a1\r\n", want);
    EXPECT(c, "gat 0 a2 b:3\r\n",
           "VALUE a2 4 2\r\nA2\r\nVALUE b:3 5 2\r\nB3\r\nEND\r\n");
    /* an unreachable owner's keys read as misses inside a multi-get */
    uint64_t failed = counter(&A.stats.proxy_failures);
    EXPECT(c, "get a1 d:1 b:1 d:2\r\n",
           "VALUE a1 1 2\r\nA1\r\nVALUE b:1 2 2\r\nB1\r\nEND\r\n");
    ck_assert_uint_eq(counter(&A.stats.proxy_failures), failed + 2);
    close(c);
}
END_TEST

START_TEST(test_noreply)
{
    int c = client(A.port);
    EXPECT(c,
           "set b:q 0 0 2 noreply\r\nqq\r\nset b:c 0 0 1 noreply\r\n7\r\n"
           "incr b:c 2 noreply\r\ndelete b:zz noreply\r\n"
           "touch b:q 100 noreply\r\nappend b:q 0 0 1 noreply\r\n!\r\n"
           "get b:q b:c\r\n",
           "VALUE b:q 0 3\r\nqq!\r\nVALUE b:c 0 1\r\n9\r\nEND\r\n");
    expect_in(&B, "b:q", "qq!");
    /* a failed noreply request answers nothing either, but counts */
    uint64_t failed = counter(&A.stats.proxy_failures);
    EXPECT(c, "set d:k 0 0 1 noreply\r\nx\r\n", "");
    ck_assert_uint_eq(counter(&A.stats.proxy_failures), failed + 1);
    close(c);
}
END_TEST

START_TEST(test_meta)
{
    int c = client(A.port);

    EXPECT(c, "ms b:m 3 T0 F7\r\nabc\r\n", "HD\r\n");
    EXPECT(c, "ms b:m 3 q\r\nxyz\r\n", "");
    expect_in(&B, "b:m", "xyz");
    EXPECT(c, "mg b:m v f O123 k\r\n", "VA 3 f0 O123 kb:m\r\nxyz\r\n");
    EXPECT(c, "mg b:m s v q Oq\r\n", "VA 3 s3 Oq\r\nxyz\r\n");
    EXPECT(c, "mg b:none v q O9 k\r\n", "");
    EXPECT(c, "mg b:none v O9 k\r\n", "EN O9 kb:none\r\n");
    EXPECT(c, "md b:m q\r\n", "");
    EXPECT(c, "md b:m q O1\r\n", "NF O1\r\n");
    expect_not_in(&B, "b:m");
    EXPECT(c, "ma b:n N0 J10 v\r\n", "VA 2\r\n10\r\n");
    EXPECT(c, "ma b:n q\r\n", "");
    EXPECT(c, "ma b:n v O5\r\n", "VA 2 O5\r\n12\r\n");
    EXPECT(c, "ma b:none q\r\n", "NF\r\n");
    /* a base64 key routes by what it decodes to */
    EXPECT(c, "ms YjpiNjQ= 1 b\r\nZ\r\n", "HD\r\n");
    expect_in(&B, "b:b64", "Z");
    EXPECT(c, "mg YjpiNjQ= b v k\r\n", "VA 1 kYjpiNjQ= b\r\nZ\r\n");
    EXPECT(c, "me b:none\r\n", "EN\r\n");
    /* quiet requests mixed with local ones keep their order */
    EXPECT(c,
           "ms a:1 1 q\r\n1\r\nms b:1 1 q\r\n2\r\nmg a:1 v q\r\n"
           "mg b:1 v q\r\nmg b:2 v q\r\nmg a:1 v\r\n",
           "VA 1\r\n1\r\nVA 1\r\n2\r\nVA 1\r\n1\r\n");
    /* failures show even for quiet requests */
    EXPECT(c, "mg d:1 v q\r\n", PROXY_TEXT_FAILURE);
    close(c);
}
END_TEST

START_TEST(test_values_that_look_like_replies)
{
    int c = client(A.port);
    EXPECT(c, "set b:v 0 0 9\r\nMN\r\nEND\r\n\r\n", "STORED\r\n");
    EXPECT(c, "mg b:v v q\r\n", "VA 9\r\nMN\r\nEND\r\n\r\n");
    EXPECT(c, "get b:v\r\n", "VALUE b:v 0 9\r\nMN\r\nEND\r\n\r\nEND\r\n");
    EXPECT(c, "set a:v 0 0 5\r\nEND\r\n\r\n", "STORED\r\n");
    EXPECT(c, "get b:v a:v\r\n",
           "VALUE b:v 0 9\r\nMN\r\nEND\r\n\r\nVALUE a:v 0 5\r\nEND\r\n\r\n"
           "END\r\n");
    EXPECT(c, "ms b:w 4 q\r\nMN\r\n\r\n", "");
    EXPECT(c, "mg b:w v\r\n", "VA 4\r\nMN\r\n\r\n");
    EXPECT(c, "set b:x 0 0 13\r\nVALUE x 0 9\r\n\r\n", "STORED\r\n");
    EXPECT(c, "mg b:x v q\r\nget b:x\r\n",
           "VA 13\r\nVALUE x 0 9\r\n\r\nVALUE b:x 0 13\r\nVALUE x 0 9\r\n"
           "\r\nEND\r\n");
    close(c);
}
END_TEST

/* Many relayed and local requests in one write: more than the in-flight
 * cap, all answered in order. */
START_TEST(test_pipeline)
{
    enum { N = 3 * PROXY_MAX_INFLIGHT };
    size_t cap = (size_t)N * 96;
    char *req = malloc(cap), *want = malloc(cap);
    size_t nr = 0, nw = 0;
    int c = client(A.port);

    for (int i = 0; i < N; i++) {
        const char *k = i % 3 == 2 ? "a:" : "b:";
        nr += (size_t)snprintf(req + nr, cap - nr,
                               "set %sp%d 0 0 %d\r\n%d\r\nget %sp%d\r\n", k, i,
                               i < 10    ? 1
                               : i < 100 ? 2
                                         : 3,
                               i, k, i);
        nw += (size_t)snprintf(want + nw, cap - nw,
                               "STORED\r\nVALUE %sp%d 0 %d\r\n%d\r\nEND\r\n",
                               k, i,
                               i < 10    ? 1
                               : i < 100 ? 2
                                         : 3,
                               i);
    }
    expect_text(c, req, nr, want, nw, __LINE__);
    expect_in(&B, "b:p0", "0");
    expect_in(&A, "a:p2", "2");
    free(req);
    free(want);
    close(c);
}
END_TEST

/* ============================================================ binary */

static size_t bin_pkt(uint8_t *p, uint8_t magic, uint8_t op, uint16_t status,
                      uint32_t opaque, uint64_t cas, const void *ext,
                      size_t next, const char *key, const void *val,
                      size_t nval)
{
    size_t nkey = key ? strlen(key) : 0;
    bin_header h = {
        .magic = magic,
        .opcode = op,
        .keylen = (uint16_t)nkey,
        .extlen = (uint8_t)next,
        .status = status,
        .bodylen = (uint32_t)(next + nkey + nval),
        .opaque = opaque,
        .cas = cas,
    };
    bin_header_encode(p, &h);
    size_t n = BIN_HEADER_LEN;
    if (next) {
        memcpy(p + n, ext, next);
        n += next;
    }
    if (nkey) {
        memcpy(p + n, key, nkey);
        n += nkey;
    }
    if (nval) {
        memcpy(p + n, val, nval);
        n += nval;
    }
    return n;
}

#define REQ(p, op, opq, cas, ext, next, key, val, nval)                       \
    bin_pkt(p, BIN_MAGIC_REQ, op, 0, opq, cas, ext, next, key, val, nval)
#define RES(p, op, st, opq, cas, ext, next, key, val, nval)                   \
    bin_pkt(p, BIN_MAGIC_RES, op, st, opq, cas, ext, next, key, val, nval)

/* Binary: req then a NOOP of ours; expects want then the NOOP's answer. */
static void expect_bin(int fd, const uint8_t *req, size_t nreq,
                       const uint8_t *want, size_t nwant, int line)
{
    uint8_t *r = malloc(nreq + BIN_HEADER_LEN);
    uint8_t *w = malloc(nwant + BIN_HEADER_LEN);
    memcpy(r, req, nreq);
    REQ(r + nreq, BIN_OP_NOOP, 0xfeedbeef, 0, NULL, 0, NULL, NULL, 0);
    if (nwant > 0)
        memcpy(w, want, nwant);
    RES(w + nwant, BIN_OP_NOOP, 0, 0xfeedbeef, 0, NULL, 0, NULL, NULL, 0);
    send_all(fd, r, nreq + BIN_HEADER_LEN);
    expect_read(fd, (const char *)w, nwant + BIN_HEADER_LEN, line);
    free(r);
    free(w);
}

START_TEST(test_binary_commands)
{
    uint8_t req[4096], want[4096], ext[20], fl[4];
    size_t nr, nw;
    int c = client(A.port);

    bin_put32(ext, 5);
    bin_put32(ext + 4, 0);
    nr = REQ(req, BIN_OP_SET, 1, 0, ext, 8, "b:k", "hello", 5);
    send_all(c, req, nr);
    nw = RES(want, BIN_OP_SET, 0, 1, 0, NULL, 0, NULL, NULL, 0);
    /* the cas comes from B: read the header, then compare */
    {
        uint8_t got[BIN_HEADER_LEN];
        ck_assert_uint_eq(recv_n(c, (char *)got, sizeof(got)), sizeof(got));
        bin_header h;
        bin_header_decode(&h, got);
        ck_assert_uint_eq(h.cas, cas_in(&B, "b:k"));
        ck_assert(memcmp(got, want, 16) == 0);
    }
    expect_in(&B, "b:k", "hello");
    expect_not_in(&A, "b:k");
    uint64_t cas = cas_in(&B, "b:k");
    bin_put32(fl, 5);
    nr = REQ(req, BIN_OP_GET, 2, 0, NULL, 0, "b:k", NULL, 0);
    nw = RES(want, BIN_OP_GET, 0, 2, cas, fl, 4, NULL, "hello", 5);
    expect_bin(c, req, nr, want, nw, __LINE__);
    nr = REQ(req, BIN_OP_GETK, 3, 0, NULL, 0, "b:k", NULL, 0);
    nw = RES(want, BIN_OP_GETK, 0, 3, cas, fl, 4, "b:k", "hello", 5);
    expect_bin(c, req, nr, want, nw, __LINE__);
    nr = REQ(req, BIN_OP_GET, 4, 0, NULL, 0, "b:none", NULL, 0);
    nw = RES(want, BIN_OP_GET, BIN_STATUS_KEY_ENOENT, 4, 0, NULL, 0, NULL,
             "Not found", 9);
    expect_bin(c, req, nr, want, nw, __LINE__);

    /* quiet set: no answer; then delete, incr */
    nr = REQ(req, BIN_OP_SETQ, 5, 0, ext, 8, "b:q", "Q", 1);
    expect_bin(c, req, nr, NULL, 0, __LINE__);
    expect_in(&B, "b:q", "Q");
    nr = REQ(req, BIN_OP_DELETE, 6, 0, NULL, 0, "b:q", NULL, 0);
    nw = RES(want, BIN_OP_DELETE, 0, 6, 0, NULL, 0, NULL, NULL, 0);
    expect_bin(c, req, nr, want, nw, __LINE__);
    expect_not_in(&B, "b:q");
    nr = REQ(req, BIN_OP_DELETEQ, 7, 0, NULL, 0, "b:q", NULL, 0);
    nw = RES(want, BIN_OP_DELETEQ, BIN_STATUS_KEY_ENOENT, 7, 0, NULL, 0, NULL,
             "Not found", 9);
    expect_bin(c, req, nr, want, nw, __LINE__);
    uint8_t ax[20], v8[8];
    bin_put64(ax, 3);      /* delta */
    bin_put64(ax + 8, 40); /* initial */
    bin_put32(ax + 16, 0);
    nr = REQ(req, BIN_OP_INCREMENT, 8, 0, ax, 20, "b:n", NULL, 0);
    send_all(c, req, nr);
    bin_put64(v8, 40);
    {
        uint8_t got[BIN_HEADER_LEN + 8];
        ck_assert_uint_eq(recv_n(c, (char *)got, sizeof(got)), sizeof(got));
        bin_header h;
        bin_header_decode(&h, got);
        ck_assert_uint_eq(h.status, 0);
        ck_assert_uint_eq(h.opaque, 8);
        ck_assert_uint_eq(h.cas, cas_in(&B, "b:n"));
        ck_assert(memcmp(got + BIN_HEADER_LEN, v8, 8) == 0);
    }
    expect_in(&B, "b:n", "40");
    ck_assert_uint_eq(counter(&A.stats.proxy_failures), 0);
    close(c);
}
END_TEST

/* A getkq batch ended by a noop: local and remote keys, hits in order. */
START_TEST(test_binary_batch)
{
    uint8_t req[4096], want[4096], ext[8], fl[4];
    size_t nr = 0, nw = 0;
    int c = client(A.port);
    int t = client(A.port);

    EXPECT(
        t,
        "set a1 9 0 2\r\nA1\r\nset b:1 8 0 2\r\nB1\r\nset b:2 7 0 2\r\nB2\r\n",
        "STORED\r\nSTORED\r\nSTORED\r\n");
    nr += REQ(req + nr, BIN_OP_GETKQ, 10, 0, NULL, 0, "a1", NULL, 0);
    nr += REQ(req + nr, BIN_OP_GETKQ, 11, 0, NULL, 0, "b:1", NULL, 0);
    nr += REQ(req + nr, BIN_OP_GETKQ, 12, 0, NULL, 0, "b:miss", NULL, 0);
    nr += REQ(req + nr, BIN_OP_GETKQ, 13, 0, NULL, 0, "b:2", NULL, 0);
    nr += REQ(req + nr, BIN_OP_GETQ, 14, 0, NULL, 0, "a:miss", NULL, 0);
    nr += REQ(req + nr, BIN_OP_GETQ, 15, 0, NULL, 0, "b:1", NULL, 0);
    nr += REQ(req + nr, BIN_OP_NOOP, 16, 0, NULL, 0, NULL, NULL, 0);
    bin_put32(fl, 9);
    nw += RES(want + nw, BIN_OP_GETKQ, 0, 10, cas_in(&A, "a1"), fl, 4, "a1",
              "A1", 2);
    bin_put32(fl, 8);
    nw += RES(want + nw, BIN_OP_GETKQ, 0, 11, cas_in(&B, "b:1"), fl, 4, "b:1",
              "B1", 2);
    bin_put32(fl, 7);
    nw += RES(want + nw, BIN_OP_GETKQ, 0, 13, cas_in(&B, "b:2"), fl, 4, "b:2",
              "B2", 2);
    bin_put32(fl, 8);
    nw += RES(want + nw, BIN_OP_GETQ, 0, 15, cas_in(&B, "b:1"), fl, 4, NULL,
              "B1", 2);
    nw += RES(want + nw, BIN_OP_NOOP, 0, 16, 0, NULL, 0, NULL, NULL, 0);
    expect_bin(c, req, nr, want, nw, __LINE__);

    /* an unreachable owner: temporary failure, even for a quiet get */
    bin_put32(ext, 0);
    bin_put32(ext + 4, 0);
    nr = REQ(req, BIN_OP_GETQ, 77, 0, NULL, 0, "d:k", NULL, 0);
    nw = RES(want, BIN_OP_GETQ, PROXY_BIN_STATUS_TMPFAIL, 77, 0, NULL, 0, NULL,
             "no owner reachable", 18);
    expect_bin(c, req, nr, want, nw, __LINE__);
    nr = REQ(req, BIN_OP_SET, 78, 0, ext, 8, "m:k", "v", 1);
    nw = RES(want, BIN_OP_SET, PROXY_BIN_STATUS_TMPFAIL, 78, 0, NULL, 0, NULL,
             "no owner reachable", 18);
    expect_bin(c, req, nr, want, nw, __LINE__);
    ck_assert_uint_eq(counter(&A.stats.proxy_failures), 2);
    /* fallback works in binary too */
    nr = REQ(req, BIN_OP_SET, 79, 0, ext, 8, "f:k", "v", 1);
    send_all(c, req, nr);
    {
        uint8_t got[BIN_HEADER_LEN];
        ck_assert_uint_eq(recv_n(c, (char *)got, sizeof(got)), sizeof(got));
        bin_header h;
        bin_header_decode(&h, got);
        ck_assert_uint_eq(h.status, 0);
        ck_assert_uint_eq(h.opaque, 79);
        ck_assert_uint_eq(h.bodylen, 0);
    }
    expect_in(&B, "f:k", "v");
    close(c);
    close(t);
}
END_TEST

/* Every keyed command asks the route once, saying whether it writes. */
static void expect_route(int fd, const char *req, const char *want, bool write,
                         int line)
{
    int before = __atomic_load_n(&w_calls, __ATOMIC_RELAXED);
    expect_text(fd, req, strlen(req), want, strlen(want), line);
    ck_assert_msg(__atomic_load_n(&w_calls, __ATOMIC_RELAXED) == before + 1,
                  "line %d: route asked %d times", line,
                  __atomic_load_n(&w_calls, __ATOMIC_RELAXED) - before);
    ck_assert_msg(__atomic_load_n(&w_write, __ATOMIC_RELAXED) == write,
                  "line %d: write flag", line);
}

START_TEST(test_route_write_flag)
{
    int c = client(A.port);
    expect_route(c, "set w:1 0 0 1\r\n1\r\n", "STORED\r\n", true, __LINE__);
    expect_route(c, "get w:1\r\n", "VALUE w:1 0 1\r\n1\r\nEND\r\n", false,
                 __LINE__);
    expect_route(c, "gat 0 w:1\r\n", "VALUE w:1 0 1\r\n1\r\nEND\r\n", true,
                 __LINE__);
    expect_route(c, "touch w:1 0\r\n", "TOUCHED\r\n", true, __LINE__);
    expect_route(c, "incr w:1 1\r\n", "2\r\n", true, __LINE__);
    expect_route(c, "mg w:1 v\r\n", "VA 1\r\n2\r\n", false, __LINE__);
    expect_route(c, "mg w:1 T0\r\n", "HD\r\n", true, __LINE__);
    expect_route(c, "me w:none\r\n", "EN\r\n", false, __LINE__);
    expect_route(c, "ma w:1\r\n", "HD\r\n", true, __LINE__);
    expect_route(c, "ms w:2 1 q\r\nx\r\n", "", true, __LINE__);
    expect_route(c, "md w:2\r\n", "HD\r\n", true, __LINE__);
    expect_route(c, "delete w:1\r\n", "DELETED\r\n", true, __LINE__);
    /* keyless commands never ask */
    int before = __atomic_load_n(&w_calls, __ATOMIC_RELAXED);
    EXPECT(c, "version\r\nverbosity 1\r\nflush_all 100\r\n",
           "VERSION 1.6.99-test\r\nOK\r\nOK\r\n");
    ck_assert_int_eq(__atomic_load_n(&w_calls, __ATOMIC_RELAXED), before);
    close(c);

    /* binary: reads and writes */
    uint8_t req[128], ext[8];
    int bc = client(A.port);
    bin_put32(ext, 0);
    bin_put32(ext + 4, 0);
    size_t nr = REQ(req, BIN_OP_SETQ, 1, 0, ext, 8, "w:3", "v", 1);
    before = __atomic_load_n(&w_calls, __ATOMIC_RELAXED);
    expect_bin(bc, req, nr, NULL, 0, __LINE__);
    ck_assert(__atomic_load_n(&w_write, __ATOMIC_RELAXED));
    nr = REQ(req, BIN_OP_GETQ, 2, 0, NULL, 0, "w:none", NULL, 0);
    expect_bin(bc, req, nr, NULL, 0, __LINE__);
    ck_assert(!__atomic_load_n(&w_write, __ATOMIC_RELAXED));
    ck_assert_int_eq(__atomic_load_n(&w_calls, __ATOMIC_RELAXED), before + 2);
    close(bc);
}
END_TEST

/* ====================================================== relay hello */

START_TEST(test_hello_marks_connection)
{
    uint8_t req[256], want[256], ext[8];
    size_t nr, nw;

    /* B routes b: keys to A; a marked connection is served at B */
    int c = client(B.port);
    EXPECT(c, "proxy_hello 1\r\n", "OK\r\n");
    EXPECT(c, "set b:h 0 0 1\r\nh\r\n", "STORED\r\n");
    expect_in(&B, "b:h", "h");
    expect_not_in(&A, "b:h");
    EXPECT(c, "get b:h\r\n", "VALUE b:h 0 1\r\nh\r\nEND\r\n");
    close(c);

    /* unmarked at B: relayed to A, where B's relay connection is marked,
     * so A serves it although its own route says B: no loop */
    c = client(B.port);
    EXPECT(c, "set b:h2 0 0 1\r\nz\r\n", "STORED\r\n");
    expect_in(&A, "b:h2", "z");
    expect_not_in(&B, "b:h2");
    ck_assert_uint_eq(counter(&B.stats.proxied_requests), 1);
    ck_assert_uint_eq(counter(&A.stats.proxied_requests), 0);
    EXPECT(c, "proxy_hello 2\r\n", "CLIENT_ERROR bad command line format\r\n");
    close(c);

    /* the binary hello */
    c = client(B.port);
    nr = REQ(req, PROXY_BIN_OP_HELLO, 9, 0, NULL, 0, NULL, NULL, 0);
    nw = RES(want, PROXY_BIN_OP_HELLO, 0, 9, 0, NULL, 0, NULL, NULL, 0);
    expect_bin(c, req, nr, want, nw, __LINE__);
    bin_put32(ext, 0);
    bin_put32(ext + 4, 0);
    nr = REQ(req, BIN_OP_SETQ, 10, 0, ext, 8, "b:bh", "y", 1);
    expect_bin(c, req, nr, NULL, 0, __LINE__);
    expect_in(&B, "b:bh", "y");
    expect_not_in(&A, "b:bh");
    close(c);
}
END_TEST

/* ========================================================== failures */

START_TEST(test_dead_and_fallback)
{
    int c = client(A.port);
    EXPECT(c, "get d:k\r\n", PROXY_TEXT_FAILURE);
    EXPECT(c, "set d:k 0 0 1\r\nx\r\n", PROXY_TEXT_FAILURE);
    EXPECT(c, "set m:k 0 0 1\r\nx\r\n", PROXY_TEXT_FAILURE);
    ck_assert_uint_eq(counter(&A.stats.proxy_failures), 3);
    /* the first target refuses: the second one serves */
    EXPECT(c, "set f:k 0 0 1\r\nF\r\n", "STORED\r\n");
    EXPECT(c, "get f:k\r\n", "VALUE f:k 0 1\r\nF\r\nEND\r\n");
    expect_in(&B, "f:k", "F");
    expect_not_in(&A, "f:k");
    ck_assert_uint_eq(counter(&A.stats.proxy_failures), 3);
    ck_assert_uint_eq(counter(&A.stats.proxied_requests), 5);
    /* the general listing names the counters */
    send_all(c, "stats\r\n", 7);
    char buf[8192];
    size_t n = 0;
    while (n < sizeof(buf) - 1) {
        ssize_t r = recv(c, buf + n, sizeof(buf) - 1 - n, 0);
        if (r <= 0)
            break;
        n += (size_t)r;
        buf[n] = '\0';
        if (strstr(buf, "END\r\n") != NULL)
            break;
    }
    buf[n] = '\0';
    ck_assert_ptr_nonnull(strstr(buf, "STAT proxied_requests "));
    ck_assert_ptr_nonnull(strstr(buf, "STAT proxy_failures "));
    close(c);
}
END_TEST

START_TEST(test_hung_target_times_out)
{
    int c = client(A.port);
    EXPECT(c, "set b:1 0 0 1\r\n1\r\nset a1 0 0 1\r\nA\r\n",
           "STORED\r\nSTORED\r\n");
    /* later replies wait behind the hung one, then come in order */
    EXPECT(c, "get h:k\r\nget b:1\r\n",
           PROXY_TEXT_FAILURE "VALUE b:1 0 1\r\n1\r\nEND\r\n");
    EXPECT(c, "get a1 h:1 b:1\r\n",
           "VALUE a1 0 1\r\nA\r\nVALUE b:1 0 1\r\n1\r\nEND\r\n");
    EXPECT(c, "mg h:2 v q\r\n", PROXY_TEXT_FAILURE);
    ck_assert_uint_eq(counter(&A.stats.proxy_failures), 3);
    close(c);
}
END_TEST

/* Replies that cannot be framed close the upstream and fail the request. */
START_TEST(test_garbage_from_upstream)
{
    static char longline[6000];
    static const struct {
        const char *junk;
        bool hangup;
    } text[] = {
        {"OK\r\nVALUE g:k 0 notanumber\r\n", false},
        {"OK\r\nVALUE g:k 0 2000000\r\n", false}, /* > item_size_max */
        {longline, false},                        /* no end of line */
        {"OK\r\nVALUE g:k 0 3\r\nabcXY", false},  /* data not ended */
        {"OK\r\nVALUE g:k 0 5\r\nab", true},      /* cut off */
        {"NOPE\r\n", false},                      /* hello refused */
    };
    memcpy(longline, "OK\r\n", 4);
    memset(longline + 4, 'x', sizeof(longline) - 5);
    int c = client(A.port);
    uint64_t failed = counter(&A.stats.proxy_failures);
    for (size_t i = 0; i < sizeof(text) / sizeof(text[0]); i++) {
        fake_junk = text[i].junk;
        fake_njunk = strlen(text[i].junk);
        fake_hangup = text[i].hangup;
        EXPECT(c, "get g:k\r\n", PROXY_TEXT_FAILURE);
        ck_assert_uint_eq(counter(&A.stats.proxy_failures), failed + i + 1);
    }
    EXPECT(c, "set b:1 0 0 1\r\n1\r\n", "STORED\r\n");

    /* binary: a good hello answer, then a bad packet */
    uint8_t junk[64], req[64], want[64];
    size_t nj = RES(junk, PROXY_BIN_OP_HELLO, 0, 0x52454c59, 0, NULL, 0, NULL,
                    NULL, 0);
    size_t nr = REQ(req, BIN_OP_GET, 42, 0, NULL, 0, "g:k", NULL, 0);
    size_t nw = RES(want, BIN_OP_GET, PROXY_BIN_STATUS_TMPFAIL, 42, 0, NULL, 0,
                    NULL, "no owner reachable", 18);
    int bc = client(A.port);
    RES(junk + nj, BIN_OP_GET, 0, 41, 0, NULL, 0, NULL, NULL, 0); /* opaque */
    fake_junk = (const char *)junk;
    fake_njunk = nj + BIN_HEADER_LEN;
    fake_hangup = false;
    expect_bin(bc, req, nr, want, nw, __LINE__);
    junk[nj] = BIN_MAGIC_REQ; /* not a response */
    junk[nj + 15] = 42;
    expect_bin(bc, req, nr, want, nw, __LINE__);
    ck_assert_uint_eq(counter(&A.stats.proxy_failures), failed + 8);
    close(bc);
    close(c);
}
END_TEST

/* A client that leaves with requests in flight, and one that quits. */
START_TEST(test_client_leaves)
{
    char buf[64];
    int c = client(A.port);
    send_all(c, "get h:k\r\nget b:1\r\n", 18);
    close(c);
    c = client(A.port);
    EXPECT(c, "set b:1 0 0 1\r\n1\r\n", "STORED\r\n");
    send_all(c, "get b:1\r\nquit\r\n", 15);
    static const char hit[] = "VALUE b:1 0 1\r\n1\r\nEND\r\n";
    expect_read(c, hit, sizeof(hit) - 1, __LINE__);
    ck_assert_int_eq(recv(c, buf, sizeof(buf), 0), 0);
    close(c);
    /* the server is fine afterwards (after the hung request timed out) */
    c = client(A.port);
    EXPECT(c, "get h:k\r\n", PROXY_TEXT_FAILURE);
    EXPECT(c, "get b:1\r\n", "VALUE b:1 0 1\r\n1\r\nEND\r\n");
    close(c);
}
END_TEST

static Suite *proxy_suite(void)
{
    Suite *s = suite_create("proxy");
    TCase *tc = tcase_create("relay");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 30);
    tcase_add_test(tc, test_text_commands);
    tcase_add_test(tc, test_multiget_order);
    tcase_add_test(tc, test_noreply);
    tcase_add_test(tc, test_meta);
    tcase_add_test(tc, test_values_that_look_like_replies);
    tcase_add_test(tc, test_pipeline);
    tcase_add_test(tc, test_binary_commands);
    tcase_add_test(tc, test_binary_batch);
    tcase_add_test(tc, test_route_write_flag);
    tcase_add_test(tc, test_hello_marks_connection);
    tcase_add_test(tc, test_dead_and_fallback);
    tcase_add_test(tc, test_hung_target_times_out);
    tcase_add_test(tc, test_garbage_from_upstream);
    tcase_add_test(tc, test_client_leaves);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    /* a client that left makes a server write to a closed socket */
    signal(SIGPIPE, SIG_IGN);
    SRunner *sr = srunner_create(proxy_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
