/*
 * etcdview.c -- membership through etcd v3's JSON gateway (see
 * etcdview.h).
 *
 * One tick a second (or a third of the lease, if shorter) drives it: no
 * lease -> grant one, then put the record with it; a lease -> keep it
 * alive (a reply without a TTL means it expired: grant again); read the
 * prefix; make sure a watch on the prefix is open. Any watch traffic reads
 * the prefix again at once, so a change shows within one round trip. Each
 * kind of request is in flight at most once. A request that fails marks
 * etcd unreachable and moves to the next URL; the view stays.
 */
#include "etcdview.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/bufferevent_ssl.h>
#include <event2/event.h>
#include <event2/http.h>
#include <json-c/json.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>

#include "evloop.h"
#include "listspec.h"
#include "log.h"
#include "viewsrc.h"

#define ETCD_URLS_MAX 8
#define ETCD_TIMEOUT_S 3
#define ETCD_BODY_MAX (1u << 20)
/* Connections finished within one loop iteration: a handful at most. */
#define ETCD_DONE_MAX 64

enum req_kind { R_GRANT, R_PUT, R_KEEPALIVE, R_RANGE, R_KINDS };

struct eurl {
    char host[128];
    uint16_t port;
    bool tls; /* https:// */
};

struct etcdview {
    struct event_base *base;
    viewsrc src; /* views, answering or not, stats */
    etcdview_options o;
    char prefix[128], addr[REGISTRY_ADDR_MAX + 1];
    struct eurl urls[ETCD_URLS_MAX];
    int nurls, cur;
    SSL_CTX *tls; /* for https:// URLs, NULL without */
    /* the connection of each request in flight: one request a connection,
     * so a request that fails takes no other request with it */
    struct evhttp_connection *rconn[R_KINDS];
    /* connections whose request is over, freed by the reap event on the
     * next loop iteration (not inside their own callback) */
    struct evhttp_connection *done[ETCD_DONE_MAX];
    int ndone;
    struct event *reap;
    struct evhttp_connection *wconn; /* the watch's own connection */
    struct evhttp_request *watch;    /* open watch, NULL none */
    bool inflight[R_KINDS];
    struct call {
        struct etcdview *v;
        enum req_kind kind;
    } calls[R_KINDS]; /* the callback argument of each kind */
    bool range_again; /* a change was seen while a range was in flight */
    long long lease;  /* 0: none */
    bool registered;  /* the record is written under the lease */
    struct event *tick;
    uint32_t tick_ms;
    bool destroying;
};

/* ============================================================ base64 */

static bool b64_encode(const void *in, size_t n, char *out, size_t cap)
{
    if (4 * ((n + 2) / 3) + 1 > cap)
        return false;
    EVP_EncodeBlock((unsigned char *)out, in, (int)n);
    return true;
}

/* Decodes a base64 string into out (NUL-terminated); the length or -1. */
static long b64_decode(const char *in, char *out, size_t cap)
{
    size_t n = strlen(in);
    if (n % 4 != 0 || 3 * (n / 4) + 1 > cap)
        return -1;
    int len = EVP_DecodeBlock((unsigned char *)out, (const unsigned char *)in,
                              (int)n);
    if (len < 0)
        return -1;
    /* EVP_DecodeBlock counts the padding as zero bytes. */
    if (n > 0 && in[n - 1] == '=')
        len--;
    if (n > 1 && in[n - 2] == '=')
        len--;
    out[len] = '\0';
    return len;
}

/* The key just past every key with the prefix (etcd's range_end). */
static void prefix_end(const char *prefix, char *out, size_t cap)
{
    size_t n = strlen(prefix);
    snprintf(out, cap, "%s", prefix);
    while (n > 0) {
        unsigned char c = (unsigned char)out[n - 1];
        if (c < 0xff) {
            out[n - 1] = (char)(c + 1);
            out[n] = '\0';
            return;
        }
        n--;
    }
    out[0] = '\0';
}

/* ========================================================== requests */

/* A request failed: etcd does not answer (from now, if not already); the
 * next request goes to the next URL. */
static void state_failed(etcdview *v, const char *what)
{
    char why[200];
    snprintf(why, sizeof(why), "%s to %s:%u failed", what,
             v->urls[v->cur].host, (unsigned)v->urls[v->cur].port);
    viewsrc_failed(&v->src, why);
    v->cur = (v->cur + 1) % v->nurls;
}

static void on_reply(struct evhttp_request *req, void *arg);

/* Frees the connections retired since the last iteration. */
static void on_reap(evutil_socket_t fd, short what, void *arg)
{
    etcdview *v = arg;
    (void)fd;
    (void)what;
    while (v->ndone > 0)
        evhttp_connection_free(v->done[--v->ndone]);
}

/* A connection whose request is over: freed on the next iteration. */
static void retire(etcdview *v, struct evhttp_connection *c)
{
    if (v->ndone == ETCD_DONE_MAX)
        on_reap(-1, 0, v); /* cannot happen: the list is emptied every
                              iteration */
    v->done[v->ndone++] = c;
    struct timeval now = {0, 0};
    evtimer_add(v->reap, &now);
}

/*
 * A connection to urls[cur], for one request. Over TLS it has its own TLS
 * session (SNI and the server's name or address checked against its
 * certificate): an evhttp connection that reconnects would reuse a
 * finished session.
 */
static struct evhttp_connection *connect_url(etcdview *v)
{
    const struct eurl *u = &v->urls[v->cur];
    if (!u->tls)
        return evhttp_connection_base_new(v->base, NULL, u->host, u->port);
    SSL *ssl = SSL_new(v->tls);
    if (!ssl)
        return NULL;
    SSL_set_tlsext_host_name(ssl, u->host);
    X509_VERIFY_PARAM *param = SSL_get0_param(ssl);
    if (X509_VERIFY_PARAM_set1_ip_asc(param, u->host) != 1)
        SSL_set1_host(ssl, u->host);
    struct bufferevent *bev = bufferevent_openssl_socket_new(
        v->base, -1, ssl, BUFFEREVENT_SSL_CONNECTING,
        BEV_OPT_CLOSE_ON_FREE | BEV_OPT_DEFER_CALLBACKS);
    if (!bev) {
        SSL_free(ssl);
        return NULL;
    }
    bufferevent_openssl_set_allow_dirty_shutdown(bev, 1);
    struct evhttp_connection *c = evhttp_connection_base_bufferevent_new(
        v->base, NULL, bev, u->host, u->port);
    if (!c)
        bufferevent_free(bev);
    return c;
}

/*
 * POSTs body to path on a connection of its own; the reply comes to
 * on_reply, which retires the connection. (A connection shared by several
 * requests, freed when one of them fails, would drop the others without
 * their callbacks, leaving their kinds in flight for good.)
 */
static void post(etcdview *v, enum req_kind kind, const char *path,
                 const char *body)
{
    if (v->inflight[kind])
        return;
    struct evhttp_connection *conn = connect_url(v);
    if (!conn)
        return;
    evhttp_connection_set_timeout(conn, ETCD_TIMEOUT_S);
    evhttp_connection_set_retries(conn, 0);
    struct call *c = &v->calls[kind];
    c->v = v;
    c->kind = kind;
    struct evhttp_request *req = evhttp_request_new(on_reply, c);
    if (!req) {
        evhttp_connection_free(conn);
        return;
    }
    struct evkeyvalq *h = evhttp_request_get_output_headers(req);
    evhttp_add_header(h, "Host", v->urls[v->cur].host);
    evhttp_add_header(h, "Content-Type", "application/json");
    evhttp_add_header(h, "Connection", "close");
    evbuffer_add(evhttp_request_get_output_buffer(req), body, strlen(body));
    if (evhttp_make_request(conn, req, EVHTTP_REQ_POST, path) != 0) {
        evhttp_connection_free(conn); /* the request is freed by evhttp */
        return;
    }
    v->rconn[kind] = conn;
    v->inflight[kind] = true;
}

static void put_record(etcdview *v);
static void read_prefix(etcdview *v);

/* The members of a range reply: every record under the prefix. */
static void take_view(etcdview *v, json_object *reply)
{
    registry_member m[REGISTRY_MEMBERS_MAX];
    size_t n = 0;
    json_object *kvs = NULL;
    if (json_object_object_get_ex(reply, "kvs", &kvs) &&
        json_object_is_type(kvs, json_type_array)) {
        size_t len = json_object_array_length(kvs);
        for (size_t i = 0; i < len && n < REGISTRY_MEMBERS_MAX; i++) {
            json_object *kv = json_object_array_get_idx(kvs, i), *val;
            char raw[1024];
            if (!json_object_object_get_ex(kv, "value", &val) ||
                b64_decode(json_object_get_string(val), raw, sizeof(raw)) < 0)
                continue;
            json_object *rec = json_tokener_parse(raw), *f;
            if (!rec)
                continue;
            registry_member *x = &m[n];
            memset(x, 0, sizeof(*x));
            const char *addr = NULL;
            if (json_object_object_get_ex(rec, "node", &f))
                x->node = (uint32_t)json_object_get_int64(f);
            if (json_object_object_get_ex(rec, "incarnation", &f))
                x->incarnation = (uint64_t)json_object_get_int64(f);
            if (json_object_object_get_ex(rec, "addr", &f))
                addr = json_object_get_string(f);
            if (x->node != 0 && addr && strlen(addr) > 0 &&
                strlen(addr) <= REGISTRY_ADDR_MAX) {
                snprintf(x->addr, sizeof(x->addr), "%s", addr);
                x->state = REGISTRY_ALIVE;
                n++;
            }
            json_object_put(rec);
        }
    }
    viewsrc_view(&v->src, m, n);
}

static void on_reply(struct evhttp_request *req, void *arg)
{
    struct call *c = arg;
    etcdview *v = c->v;
    enum req_kind kind = c->kind;
    if (v->destroying)
        return;
    v->inflight[kind] = false;
    if (v->rconn[kind]) {
        retire(v, v->rconn[kind]);
        v->rconn[kind] = NULL;
    }
    static const char *const names[R_KINDS] = {"lease grant", "put",
                                               "lease keepalive", "range"};
    if (!req || evhttp_request_get_response_code(req) != 200) {
        if (kind == R_PUT || kind == R_GRANT)
            v->registered = false;
        state_failed(v, names[kind]);
        return;
    }
    struct evbuffer *in = evhttp_request_get_input_buffer(req);
    size_t len = evbuffer_get_length(in);
    if (len > ETCD_BODY_MAX) {
        state_failed(v, names[kind]);
        return;
    }
    char *body = malloc(len + 1);
    if (!body)
        return;
    evbuffer_copyout(in, body, len);
    body[len] = '\0';
    json_object *reply = json_tokener_parse(body);
    free(body);
    if (!reply) {
        state_failed(v, names[kind]);
        return;
    }
    viewsrc_ok(&v->src);
    json_object *f = NULL;
    switch (kind) {
    case R_GRANT:
        if (json_object_object_get_ex(reply, "ID", &f)) {
            v->lease = json_object_get_int64(f);
            put_record(v);
        }
        break;
    case R_PUT:
        v->registered = true;
        LOG(LOG_LEVEL_INFO, "membership",
            "registered with etcd %s as node %u at %s (lease %lld, %u s)",
            v->src.name, (unsigned)v->o.node_id, v->addr, v->lease,
            (unsigned)v->o.lease_s);
        read_prefix(v);
        break;
    case R_KEEPALIVE: {
        json_object *res = NULL, *ttl = NULL;
        if (!json_object_object_get_ex(reply, "result", &res) ||
            !json_object_object_get_ex(res, "TTL", &ttl) ||
            json_object_get_int64(ttl) <= 0) {
            LOG(LOG_LEVEL_WARN, "membership",
                "etcd lease %lld expired; registering again", v->lease);
            v->lease = 0;
            v->registered = false;
        }
        break;
    }
    case R_RANGE:
        take_view(v, reply);
        if (v->range_again) {
            v->range_again = false;
            read_prefix(v);
        }
        break;
    default:
        break;
    }
    json_object_put(reply);
}

static void grant(etcdview *v)
{
    char body[64];
    snprintf(body, sizeof(body), "{\"TTL\":%u}", (unsigned)v->o.lease_s);
    post(v, R_GRANT, "/v3/lease/grant", body);
}

static void put_record(etcdview *v)
{
    char key[160], k64[224], val[512], v64[704], body[1024];
    snprintf(key, sizeof(key), "%s%u", v->prefix, (unsigned)v->o.node_id);
    json_object *rec = json_object_new_object();
    json_object_object_add(rec, "node", json_object_new_int64(v->o.node_id));
    json_object_object_add(rec, "addr", json_object_new_string(v->addr));
    json_object_object_add(rec, "weight", json_object_new_int64(v->o.weight));
    json_object_object_add(rec, "incarnation",
                           json_object_new_int64((int64_t)v->o.incarnation));
    snprintf(val, sizeof(val), "%s",
             json_object_to_json_string_ext(rec, JSON_C_TO_STRING_PLAIN));
    json_object_put(rec);
    if (!b64_encode(key, strlen(key), k64, sizeof(k64)) ||
        !b64_encode(val, strlen(val), v64, sizeof(v64)))
        return;
    snprintf(body, sizeof(body),
             "{\"key\":\"%s\",\"value\":\"%s\",\"lease\":\"%lld\"}", k64, v64,
             v->lease);
    post(v, R_PUT, "/v3/kv/put", body);
}

static void keepalive(etcdview *v)
{
    char body[64];
    snprintf(body, sizeof(body), "{\"ID\":\"%lld\"}", v->lease);
    post(v, R_KEEPALIVE, "/v3/lease/keepalive", body);
}

/* The range request of the prefix (also the watch's). */
static bool range_body(etcdview *v, const char *fmt, char *body, size_t cap)
{
    char end[160], k64[224], e64[224];
    prefix_end(v->prefix, end, sizeof(end));
    if (!b64_encode(v->prefix, strlen(v->prefix), k64, sizeof(k64)) ||
        !b64_encode(end, strlen(end), e64, sizeof(e64)))
        return false;
    snprintf(body, cap, fmt, k64, e64);
    return true;
}

static void read_prefix(etcdview *v)
{
    char body[512];
    if (v->inflight[R_RANGE]) {
        v->range_again = true;
        return;
    }
    if (range_body(v, "{\"key\":\"%s\",\"range_end\":\"%s\"}", body,
                   sizeof(body)))
        post(v, R_RANGE, "/v3/kv/range", body);
}

/* ============================================================= watch */

/* Any message on the watch: read the prefix again now. */
static void on_watch_chunk(struct evhttp_request *req, void *arg)
{
    etcdview *v = arg;
    struct evbuffer *in = evhttp_request_get_input_buffer(req);
    evbuffer_drain(in, evbuffer_get_length(in));
    if (!v->destroying)
        read_prefix(v);
}

/* The watch ended (etcd gone, or it closed the stream). */
static void on_watch_done(struct evhttp_request *req, void *arg)
{
    etcdview *v = arg;
    (void)req;
    if (v->destroying)
        return;
    v->watch = NULL;
    if (v->wconn) {
        retire(v, v->wconn);
        v->wconn = NULL;
    }
}

static void open_watch(etcdview *v)
{
    char body[512];
    if (v->watch ||
        !range_body(
            v, "{\"create_request\":{\"key\":\"%s\",\"range_end\":\"%s\"}}",
            body, sizeof(body)))
        return;
    v->wconn = connect_url(v);
    if (!v->wconn)
        return;
    evhttp_connection_set_retries(v->wconn, 0);
    struct evhttp_request *req = evhttp_request_new(on_watch_done, v);
    if (!req) {
        evhttp_connection_free(v->wconn);
        v->wconn = NULL;
        return;
    }
    evhttp_request_set_chunked_cb(req, on_watch_chunk);
    struct evkeyvalq *h = evhttp_request_get_output_headers(req);
    evhttp_add_header(h, "Host", v->urls[v->cur].host);
    evhttp_add_header(h, "Content-Type", "application/json");
    evbuffer_add(evhttp_request_get_output_buffer(req), body, strlen(body));
    if (evhttp_make_request(v->wconn, req, EVHTTP_REQ_POST, "/v3/watch") !=
        0) {
        evhttp_connection_free(v->wconn);
        v->wconn = NULL;
        return;
    }
    v->watch = req;
}

/* ============================================================== tick */

static void on_tick(evutil_socket_t fd, short what, void *arg)
{
    etcdview *v = arg;
    (void)fd;
    (void)what;
    if (v->lease == 0)
        grant(v);
    else if (!v->registered)
        put_record(v);
    else
        keepalive(v);
    read_prefix(v);
    open_watch(v);
    evloop_add_ms(v->tick, v->tick_ms);
}

/* ========================================================= lifecycle */

/* The client context for https:// URLs: etcd's certificate verified
 * against etcd_tls_ca (or the system's CAs), our certificate presented
 * when etcd_tls_cert is set (etcd's --client-cert-auth). */
static SSL_CTX *tls_context(const etcdview_options *o, char *err, size_t nerr)
{
    SSL_CTX *ctx = SSL_CTX_new(TLS_client_method());
    if (!ctx) {
        snprintf(err, nerr, "etcd: cannot create a TLS context");
        return NULL;
    }
    SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
    SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, NULL);
    const char *what = NULL, *path = NULL;
    if (o->tls_ca && o->tls_ca[0]) {
        if (SSL_CTX_load_verify_locations(ctx, o->tls_ca, NULL) != 1)
            what = "etcd_tls_ca", path = o->tls_ca;
    } else if (SSL_CTX_set_default_verify_paths(ctx) != 1) {
        what = "the system's CA certificates", path = "";
    }
    if (!what && o->tls_cert && o->tls_cert[0]) {
        if (SSL_CTX_use_certificate_chain_file(ctx, o->tls_cert) != 1)
            what = "etcd_tls_cert", path = o->tls_cert;
        else if (!o->tls_key || SSL_CTX_use_PrivateKey_file(
                                    ctx, o->tls_key, SSL_FILETYPE_PEM) != 1)
            what = "etcd_tls_key", path = o->tls_key ? o->tls_key : "(unset)";
    }
    if (what) {
        unsigned long e = ERR_peek_last_error();
        snprintf(err, nerr, "%s %s: %s", what, path,
                 e ? ERR_reason_error_string(e) : "cannot be read");
        ERR_clear_error();
        SSL_CTX_free(ctx);
        return NULL;
    }
    return ctx;
}

static int parse_urls(etcdview *v, const char *spec, char *err, size_t nerr)
{
    const char *p = spec, *item;
    size_t n;
    while (listspec_next(&p, &item, &n)) {
        char one[200];
        if (n >= sizeof(one) || v->nurls == ETCD_URLS_MAX) {
            snprintf(err, nerr, "etcd: too many or too long URLs");
            return -1;
        }
        memcpy(one, item, n);
        one[n] = '\0';
        const char *hp = one;
        bool tls = false;
        if (strncmp(hp, "http://", 7) == 0) {
            hp += 7;
        } else if (strncmp(hp, "https://", 8) == 0) {
            hp += 8;
            tls = true;
        } else if (strstr(hp, "://")) {
            snprintf(err, nerr, "etcd: '%s': only http:// and https:// URLs",
                     one);
            return -1;
        }
        const char *colon = strrchr(hp, ':');
        struct eurl *u = &v->urls[v->nurls];
        char *end = NULL;
        unsigned long port = colon ? strtoul(colon + 1, &end, 10) : 0;
        size_t hl = colon ? (size_t)(colon - hp) : 0;
        if (!colon || hl == 0 || hl >= sizeof(u->host) || !end ||
            (*end != '\0' && *end != '/') || port < 1 || port > 65535) {
            snprintf(err, nerr, "etcd: '%s' is not http[s]://host:port", one);
            return -1;
        }
        memcpy(u->host, hp, hl);
        u->host[hl] = '\0';
        u->port = (uint16_t)port;
        u->tls = tls;
        v->nurls++;
    }
    if (v->nurls == 0) {
        snprintf(err, nerr, "etcd: no URL given");
        return -1;
    }
    return 0;
}

etcdview *etcdview_create(struct event_base *base, const etcdview_options *o,
                          registry_view_fn on_view, void *arg, char *err,
                          size_t nerr)
{
    etcdview *v = calloc(1, sizeof(*v));
    if (!v) {
        snprintf(err, nerr, "out of memory");
        return NULL;
    }
    v->base = base;
    viewsrc_init(&v->src, "etcd", o->urls, "member", "members", on_view, arg);
    v->o = *o;
    if (parse_urls(v, o->urls, err, nerr) != 0)
        goto fail;
    const char *pre = o->prefix && o->prefix[0] ? o->prefix : "/ribltcache/";
    if (strlen(pre) >= sizeof(v->prefix) - 12) {
        snprintf(err, nerr, "etcd_prefix is too long");
        goto fail;
    }
    snprintf(v->prefix, sizeof(v->prefix), "%s", pre);
    if (!o->addr || !o->addr[0] || strlen(o->addr) > REGISTRY_ADDR_MAX) {
        snprintf(err, nerr, "etcd: no peer address to register");
        goto fail;
    }
    snprintf(v->addr, sizeof(v->addr), "%s", o->addr);
    if (v->o.lease_s < 2)
        v->o.lease_s = 2;
    for (int i = 0; i < v->nurls; i++)
        if (v->urls[i].tls && !v->tls && !(v->tls = tls_context(o, err, nerr)))
            goto fail;
    v->tick_ms = v->o.lease_s * 1000 / 3;
    if (v->tick_ms > 1000)
        v->tick_ms = 1000;
    v->tick = evtimer_new(base, on_tick, v);
    v->reap = evtimer_new(base, on_reap, v);
    if (!v->tick || !v->reap) {
        snprintf(err, nerr, "out of memory");
        goto fail;
    }
    evloop_add_ms(v->tick, 0); /* the first pass at once */
    return v;
fail:
    etcdview_destroy(v);
    return NULL;
}

void etcdview_destroy(etcdview *v)
{
    if (!v)
        return;
    v->destroying = true;
    if (v->tick)
        event_free(v->tick);
    if (v->reap)
        event_free(v->reap);
    if (v->wconn)
        evhttp_connection_free(v->wconn);
    for (int k = 0; k < R_KINDS; k++)
        if (v->rconn[k])
            evhttp_connection_free(v->rconn[k]);
    while (v->ndone > 0)
        evhttp_connection_free(v->done[--v->ndone]);
    SSL_CTX_free(v->tls); /* connections hold their own references */
    viewsrc_fini(&v->src);
    free(v);
}

void etcdview_source(etcdview *v, char *out, size_t n)
{
    viewsrc_text(&v->src, out, n);
}
