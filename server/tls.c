/*
 * tls.c -- TLS for client connections on OpenSSL (see tls.h).
 *
 * OpenSSL (libssl) is the TLS library Debian ships and the one memcached
 * uses, so certificates, keys, cipher strings and verify modes mean what
 * an operator of memcached -Z already knows.
 */
#include "tls.h"

#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include <openssl/err.h>
#include <openssl/ssl.h>

#include "log.h"

struct tls_server {
    pthread_mutex_t lock; /* guards ctx and client_ctx against a reload */
    SSL_CTX *ctx;
    SSL_CTX *client_ctx; /* relays to other nodes' TLS client ports */
    tls_settings s;
    uint64_t handshake_errors; /* relaxed atomics */
    uint64_t new_sessions;
    int64_t last_refresh;
};

static const char session_context[] = "ribltcached";

static int proto_version(int min_version)
{
    switch (min_version) {
    case 0:
        return TLS1_VERSION;
    case 1:
        return TLS1_1_VERSION;
    case 3:
        return TLS1_3_VERSION;
    }
    return TLS1_2_VERSION;
}

/* Writes "what: OpenSSL's reason" into err and clears OpenSSL's queue. */
static int fail(char *err, size_t errlen, const char *what, const char *path)
{
    unsigned long e = ERR_peek_last_error();
    const char *why = e ? ERR_reason_error_string(e) : NULL;
    snprintf(err, errlen, "%s%s%s: %s", what, path ? " " : "",
             path ? path : "", why ? why : "unknown error");
    ERR_clear_error();
    return TLS_ERR_CONFIG;
}

/* Called by OpenSSL when a session enters the server's cache. */
static int on_new_session(SSL *ssl, SSL_SESSION *sess)
{
    (void)sess;
    tls_server *ts = SSL_CTX_get_app_data(SSL_get_SSL_CTX(ssl));
    if (ts != NULL) {
        __atomic_fetch_add(&ts->new_sessions, 1, __ATOMIC_RELAXED);
    }
    return 0; /* the cache keeps its own reference */
}

/*
 * A new context from ts->s: every file read now. The client context
 * (relays) presents the same certificate, and verifies the other node's
 * against ssl_ca_cert when one is set.
 */
static int build_ctx(tls_server *ts, bool client, SSL_CTX **out, char *err,
                     size_t errlen)
{
    const tls_settings *s = &ts->s;
    int rc;

    ERR_clear_error();
    SSL_CTX *ctx =
        SSL_CTX_new(client ? TLS_client_method() : TLS_server_method());
    if (ctx == NULL) {
        snprintf(err, errlen, "cannot create a TLS context");
        return TLS_ERR_NOMEM;
    }
    SSL_CTX_set_app_data(ctx, ts);
    if (!SSL_CTX_set_min_proto_version(ctx, proto_version(s->min_version))) {
        rc = fail(err, errlen, "ssl_min_version", NULL);
        goto bad;
    }
    if (s->chain_cert == NULL || s->key == NULL) {
        snprintf(err, errlen, "-Z needs ssl_chain_cert and ssl_key");
        rc = TLS_ERR_CONFIG;
        goto bad;
    }
    if (!SSL_CTX_use_certificate_chain_file(ctx, s->chain_cert)) {
        rc = fail(err, errlen, "ssl_chain_cert", s->chain_cert);
        goto bad;
    }
    if (!SSL_CTX_use_PrivateKey_file(ctx, s->key,
                                     s->keyformat == 2 ? SSL_FILETYPE_ASN1
                                                       : SSL_FILETYPE_PEM)) {
        rc = fail(err, errlen, "ssl_key", s->key);
        goto bad;
    }
    if (!SSL_CTX_check_private_key(ctx)) {
        rc = fail(err, errlen, "ssl_key does not match ssl_chain_cert", NULL);
        goto bad;
    }
    if (s->ca_cert != NULL) {
        if (!SSL_CTX_load_verify_locations(ctx, s->ca_cert, NULL)) {
            rc = fail(err, errlen, "ssl_ca_cert", s->ca_cert);
            goto bad;
        }
    }
    if (client) {
        SSL_CTX_set_verify(
            ctx, s->ca_cert != NULL ? SSL_VERIFY_PEER : SSL_VERIFY_NONE, NULL);
    } else if (s->ca_cert != NULL) {
        STACK_OF(X509_NAME) *names = SSL_load_client_CA_file(s->ca_cert);
        if (names == NULL) {
            rc = fail(err, errlen, "ssl_ca_cert", s->ca_cert);
            goto bad;
        }
        SSL_CTX_set_client_CA_list(ctx, names);
    }
    int verify = SSL_VERIFY_NONE;
    if (s->verify_mode >= 1) {
        verify = SSL_VERIFY_PEER;
    }
    if (s->verify_mode >= 2) {
        verify |= SSL_VERIFY_FAIL_IF_NO_PEER_CERT;
    }
    if (s->verify_mode == 3) {
        verify |= SSL_VERIFY_CLIENT_ONCE;
    }
    if (!client) {
        SSL_CTX_set_verify(ctx, verify, NULL);
    }
    if (s->ciphers != NULL && !SSL_CTX_set_cipher_list(ctx, s->ciphers)) {
        rc = fail(err, errlen, "ssl_ciphers", s->ciphers);
        goto bad;
    }
    /* Resumed sessions must keep the verified identity: the context id is
     * required whenever verification and caching are both on. */
    SSL_CTX_set_session_id_context(ctx, (const unsigned char *)session_context,
                                   sizeof(session_context) - 1);
    if (client) {
        SSL_CTX_set_session_cache_mode(ctx, SSL_SESS_CACHE_OFF);
    } else if (s->session_cache) {
        SSL_CTX_set_session_cache_mode(ctx, SSL_SESS_CACHE_SERVER);
        SSL_CTX_sess_set_new_cb(ctx, on_new_session);
    } else {
        /* No cache and no TLS 1.3 tickets: a ticket nobody can resume
         * from only costs CPU and bytes on every handshake. */
        SSL_CTX_set_session_cache_mode(ctx, SSL_SESS_CACHE_OFF);
        SSL_CTX_set_num_tickets(ctx, 0);
    }
    /* The protocols frame their own requests, so a peer that closes
     * without close_notify is a hang-up, not a truncation to report. */
    long opts = SSL_OP_NO_RENEGOTIATION | SSL_OP_NO_COMPRESSION |
                SSL_OP_IGNORE_UNEXPECTED_EOF;
#ifdef SSL_OP_ENABLE_KTLS
    if (s->kernel_tls) {
        opts |= SSL_OP_ENABLE_KTLS;
    }
#endif
    SSL_CTX_set_options(ctx, opts);
    /* Idle connections give their record buffers back (about 34 KB each);
     * writes may resume from a moved buffer and return after each
     * record. */
    SSL_CTX_set_mode(ctx, SSL_MODE_RELEASE_BUFFERS |
                              SSL_MODE_ENABLE_PARTIAL_WRITE |
                              SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
    *out = ctx;
    return TLS_OK;
bad:
    SSL_CTX_free(ctx);
    return rc;
}

int tls_server_create(const tls_settings *s, tls_server **out, char *err,
                      size_t errlen)
{
    tls_server *ts = calloc(1, sizeof(*ts));
    if (ts == NULL) {
        snprintf(err, errlen, "out of memory");
        return TLS_ERR_NOMEM;
    }
    ts->s = *s;
    pthread_mutex_init(&ts->lock, NULL);
    int rc = build_ctx(ts, false, &ts->ctx, err, errlen);
    if (rc == TLS_OK) {
        rc = build_ctx(ts, true, &ts->client_ctx, err, errlen);
    }
    if (rc != TLS_OK) {
        SSL_CTX_free(ts->ctx);
        pthread_mutex_destroy(&ts->lock);
        free(ts);
        return rc;
    }
    ts->last_refresh = (int64_t)time(NULL);
    *out = ts;
    return TLS_OK;
}

int tls_server_reload(tls_server *ts, char *err, size_t errlen)
{
    SSL_CTX *fresh = NULL, *fresh_client = NULL;
    int rc = build_ctx(ts, false, &fresh, err, errlen);
    if (rc == TLS_OK) {
        rc = build_ctx(ts, true, &fresh_client, err, errlen);
    }
    if (rc != TLS_OK) {
        SSL_CTX_free(fresh);
        return rc;
    }
    pthread_mutex_lock(&ts->lock);
    SSL_CTX *old = ts->ctx, *old_client = ts->client_ctx;
    ts->ctx = fresh;
    ts->client_ctx = fresh_client;
    __atomic_store_n(&ts->last_refresh, (int64_t)time(NULL), __ATOMIC_RELAXED);
    pthread_mutex_unlock(&ts->lock);
    /* open connections hold their own references */
    SSL_CTX_free(old);
    SSL_CTX_free(old_client);
    return TLS_OK;
}

void tls_server_destroy(tls_server *ts)
{
    if (ts == NULL) {
        return;
    }
    SSL_CTX_free(ts->ctx);
    SSL_CTX_free(ts->client_ctx);
    pthread_mutex_destroy(&ts->lock);
    free(ts);
}

void tls_server_get_stats(const tls_server *ts, tls_server_stats *st)
{
    st->handshake_errors =
        __atomic_load_n(&ts->handshake_errors, __ATOMIC_RELAXED);
    st->new_sessions = __atomic_load_n(&ts->new_sessions, __ATOMIC_RELAXED);
    st->last_refresh = __atomic_load_n(&ts->last_refresh, __ATOMIC_RELAXED);
}

bool tls_server_session_cache(const tls_server *ts)
{
    return ts->s.session_cache;
}

/* ---------------------------------------------------------- connections */

static tls_conn *conn_new(tls_server *ts, int fd, bool client)
{
    pthread_mutex_lock(&ts->lock);
    SSL *ssl = SSL_new(client ? ts->client_ctx : ts->ctx);
    pthread_mutex_unlock(&ts->lock);
    if (ssl == NULL) {
        ERR_clear_error();
        return NULL;
    }
    if (!SSL_set_fd(ssl, fd)) {
        ERR_clear_error();
        SSL_free(ssl);
        return NULL;
    }
    if (client) {
        SSL_set_connect_state(ssl);
    } else {
        SSL_set_accept_state(ssl);
    }
    return ssl;
}

tls_conn *tls_conn_new(tls_server *ts, int fd)
{
    return conn_new(ts, fd, false);
}

tls_conn *tls_conn_new_client(tls_server *ts, int fd)
{
    return conn_new(ts, fd, true);
}

void tls_conn_free(tls_conn *tc)
{
    if (tc == NULL) {
        return;
    }
    /* After a fatal error OpenSSL forbids shutdown; otherwise one
     * non-blocking attempt at close_notify. */
    if (SSL_is_init_finished(tc) &&
        !(SSL_get_shutdown(tc) & SSL_SENT_SHUTDOWN)) {
        ERR_clear_error();
        SSL_shutdown(tc);
    }
    ERR_clear_error();
    SSL_free(tc);
}

/* Logs why a handshake failed, with the client's address. */
static void log_handshake_error(SSL *ssl, int err)
{
    char addr[INET6_ADDRSTRLEN + 8] = "?";
    struct sockaddr_storage ss;
    socklen_t sl = sizeof(ss);
    if (getpeername(SSL_get_fd(ssl), (struct sockaddr *)&ss, &sl) == 0) {
        log_addr((const struct sockaddr *)&ss, sl, addr, sizeof(addr));
    }
    unsigned long e = ERR_peek_last_error();
    const char *why = e ? ERR_reason_error_string(e) : NULL;
    long vr = SSL_get_verify_result(ssl);
    if (vr != X509_V_OK) {
        why = X509_verify_cert_error_string(vr);
    }
    const char *what = SSL_is_server(ssl) ? "client" : "relay to";
    LOG(SSL_is_server(ssl) ? LOG_LEVEL_INFO : LOG_LEVEL_WARN, "tls",
        "%s %s: TLS handshake refused: %s", what, addr,
        why ? why
            : (err == SSL_ERROR_SYSCALL ? "connection closed"
                                        : "protocol error"));
}

/* Maps OpenSSL's outcome of an I/O call that returned n <= 0. */
static ssize_t io_result(SSL *ssl, int n)
{
    int err = SSL_get_error(ssl, n);
    switch (err) {
    case SSL_ERROR_WANT_READ:
        return TLS_IO_WANT_READ;
    case SSL_ERROR_WANT_WRITE:
        return TLS_IO_WANT_WRITE;
    case SSL_ERROR_ZERO_RETURN:
        return TLS_IO_CLOSED;
    case SSL_ERROR_SYSCALL:
        if (ERR_peek_error() == 0 && (n == 0 || errno == 0)) {
            /* EOF without close_notify: a client that hung up. */
            if (!SSL_is_init_finished(ssl) && SSL_is_server(ssl)) {
                tls_server *ts = SSL_CTX_get_app_data(SSL_get_SSL_CTX(ssl));
                __atomic_fetch_add(&ts->handshake_errors, 1, __ATOMIC_RELAXED);
            }
            ERR_clear_error();
            return TLS_IO_CLOSED;
        }
        break;
    default:
        break;
    }
    if (!SSL_is_init_finished(ssl)) {
        tls_server *ts = SSL_CTX_get_app_data(SSL_get_SSL_CTX(ssl));
        if (SSL_is_server(ssl)) {
            __atomic_fetch_add(&ts->handshake_errors, 1, __ATOMIC_RELAXED);
        }
        if (log_enabled(LOG_LEVEL_INFO)) {
            log_handshake_error(ssl, err);
        }
    }
    ERR_clear_error();
    return TLS_IO_ERROR;
}

ssize_t tls_conn_read(tls_conn *tc, void *buf, size_t len)
{
    if (len > INT32_MAX) {
        len = INT32_MAX;
    }
    errno = 0;
    int n = SSL_read(tc, buf, (int)len);
    if (n > 0) {
        return n;
    }
    return io_result(tc, n);
}

ssize_t tls_conn_write(tls_conn *tc, const void *buf, size_t len)
{
    if (len > INT32_MAX) {
        len = INT32_MAX;
    }
    errno = 0;
    int n = SSL_write(tc, buf, (int)len);
    if (n > 0) {
        return n;
    }
    return io_result(tc, n);
}

bool tls_conn_pending(const tls_conn *tc)
{
    return SSL_pending(tc) > 0;
}

bool tls_conn_established(const tls_conn *tc)
{
    return SSL_is_init_finished(tc);
}
