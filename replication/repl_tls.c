/*
 * repl_tls.c -- the peer and registry channels' TLS context (see
 * repl_tls.h). OpenSSL, as everywhere in ribltcache: TLS 1.3 only, both
 * sides verified against the cluster's CA, no session resumption (links
 * are few and long-lived).
 */
#include "repl_tls.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>

struct repl_tls {
    pthread_mutex_t lock; /* guards ctx against a reload */
    SSL_CTX *ctx;
    char *cert, *key, *ca;
    uint32_t node_id;
};

static const char exporter_label[] = "EXPORTER-ribltcache-link";

/* Writes "what path: OpenSSL's reason" into err; clears OpenSSL's queue. */
static void fail(char *err, size_t nerr, const char *what, const char *path)
{
    unsigned long e = ERR_peek_last_error();
    const char *why = e ? ERR_reason_error_string(e) : NULL;
    snprintf(err, nerr, "%s %s: %s", what, path, why ? why : "unknown error");
    ERR_clear_error();
}

/*
 * The identity a certificate's common name gives: 0 with *node set (0 for
 * "registry"), or -1.
 */
static int cert_id(X509 *x, uint32_t *node)
{
    char cn[64];
    if (!x)
        return -1;
    int n = X509_NAME_get_text_by_NID(X509_get_subject_name(x), NID_commonName,
                                      cn, sizeof(cn));
    if (n <= 0 || (size_t)n >= sizeof(cn))
        return -1;
    if (strcmp(cn, REPL_TLS_REGISTRY_NAME) == 0) {
        *node = 0;
        return 0;
    }
    size_t np = sizeof(REPL_TLS_NODE_PREFIX) - 1;
    if (strncmp(cn, REPL_TLS_NODE_PREFIX, np) != 0 || cn[np] < '1' ||
        cn[np] > '9')
        return -1;
    char *end;
    errno = 0;
    unsigned long v = strtoul(cn + np, &end, 10);
    if (errno != 0 || *end != '\0' || v == 0 || v > UINT32_MAX)
        return -1;
    *node = (uint32_t)v;
    return 0;
}

static SSL_CTX *build(const repl_tls *t, char *err, size_t nerr)
{
    SSL_CTX *ctx = SSL_CTX_new(TLS_method());
    if (!ctx) {
        snprintf(err, nerr, "cannot create a TLS context");
        return NULL;
    }
    SSL_CTX_set_min_proto_version(ctx, TLS1_3_VERSION);
    SSL_CTX_set_options(ctx, SSL_OP_NO_RENEGOTIATION | SSL_OP_NO_COMPRESSION);
    SSL_CTX_set_session_cache_mode(ctx, SSL_SESS_CACHE_OFF);
    SSL_CTX_set_num_tickets(ctx, 0);
    if (SSL_CTX_use_certificate_chain_file(ctx, t->cert) != 1) {
        fail(err, nerr, "repl_tls_cert", t->cert);
        goto bad;
    }
    if (SSL_CTX_use_PrivateKey_file(ctx, t->key, SSL_FILETYPE_PEM) != 1) {
        fail(err, nerr, "repl_tls_key", t->key);
        goto bad;
    }
    if (SSL_CTX_check_private_key(ctx) != 1) {
        fail(err, nerr, "repl_tls_key", t->key);
        goto bad;
    }
    if (SSL_CTX_load_verify_locations(ctx, t->ca, NULL) != 1) {
        fail(err, nerr, "repl_tls_ca", t->ca);
        goto bad;
    }
    SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT,
                       NULL);
    uint32_t own = 0;
    if (cert_id(SSL_CTX_get0_certificate(ctx), &own) != 0) {
        snprintf(err, nerr,
                 "repl_tls_cert %s: its common name is neither "
                 "\"" REPL_TLS_NODE_PREFIX "<node_id>\" nor "
                 "\"" REPL_TLS_REGISTRY_NAME "\"",
                 t->cert);
        goto bad;
    }
    if (t->node_id != 0 && own != t->node_id) {
        snprintf(err, nerr,
                 "repl_tls_cert %s names %s%u, but node_id is %u: a node "
                 "needs a certificate for its own id",
                 t->cert, own ? "node " : "a registry",
                 own ? (unsigned)own : 0u, (unsigned)t->node_id);
        goto bad;
    }
    return ctx;
bad:
    SSL_CTX_free(ctx);
    return NULL;
}

repl_tls *repl_tls_create(const repl_tls_options *o, char *err, size_t nerr)
{
    if (!o->cert || !o->cert[0] || !o->key || !o->key[0] || !o->ca ||
        !o->ca[0]) {
        snprintf(err, nerr,
                 "peer TLS needs repl_tls_cert, repl_tls_key and repl_tls_ca");
        return NULL;
    }
    repl_tls *t = calloc(1, sizeof(*t));
    if (!t) {
        snprintf(err, nerr, "out of memory");
        return NULL;
    }
    t->cert = strdup(o->cert);
    t->key = strdup(o->key);
    t->ca = strdup(o->ca);
    t->node_id = o->node_id;
    if (!t->cert || !t->key || !t->ca) {
        snprintf(err, nerr, "out of memory");
        repl_tls_destroy(t);
        return NULL;
    }
    t->ctx = build(t, err, nerr);
    if (!t->ctx) {
        repl_tls_destroy(t);
        return NULL;
    }
    pthread_mutex_init(&t->lock, NULL);
    return t;
}

int repl_tls_reload(repl_tls *t, char *err, size_t nerr)
{
    SSL_CTX *ctx = build(t, err, nerr);
    if (!ctx)
        return -1;
    pthread_mutex_lock(&t->lock);
    SSL_CTX *old = t->ctx;
    t->ctx = ctx;
    pthread_mutex_unlock(&t->lock);
    SSL_CTX_free(old); /* links keep their own reference */
    return 0;
}

void repl_tls_destroy(repl_tls *t)
{
    if (!t)
        return;
    if (t->ctx) {
        SSL_CTX_free(t->ctx);
        pthread_mutex_destroy(&t->lock);
    }
    free(t->cert);
    free(t->key);
    free(t->ca);
    free(t);
}

SSL *repl_tls_new_ssl(repl_tls *t)
{
    pthread_mutex_lock(&t->lock);
    SSL *ssl = SSL_new(t->ctx);
    pthread_mutex_unlock(&t->lock);
    return ssl;
}

bool repl_tls_id_ok(SSL *ssl, uint32_t announced, char *why, size_t nwhy)
{
    uint32_t cert = 0;
    if (cert_id(SSL_get0_peer_certificate(ssl), &cert) != 0) {
        snprintf(why, nwhy,
                 "its certificate names no node (common name is not "
                 "\"" REPL_TLS_NODE_PREFIX "<id>\" or "
                 "\"" REPL_TLS_REGISTRY_NAME "\")");
        return false;
    }
    if (announced == 0 || cert == announced)
        return true;
    if (cert == 0)
        snprintf(why, nwhy,
                 "it announced node %u with a registry's certificate",
                 (unsigned)announced);
    else
        snprintf(why, nwhy,
                 "it announced node %u with the certificate of node %u",
                 (unsigned)announced, (unsigned)cert);
    return false;
}

int repl_tls_exporter(SSL *ssl, uint8_t out[32])
{
    return SSL_export_keying_material(ssl, out, 32, exporter_label,
                                      sizeof(exporter_label) - 1, NULL, 0,
                                      0) == 1
               ? 0
               : -1;
}

void repl_tls_failure(SSL *ssl, unsigned long err, char *why, size_t nwhy)
{
    long vr = ssl ? SSL_get_verify_result(ssl) : X509_V_OK;
    if (vr != X509_V_OK) {
        snprintf(why, nwhy, "certificate refused: %s",
                 X509_verify_cert_error_string(vr));
        return;
    }
    const char *r = err ? ERR_reason_error_string(err) : NULL;
    snprintf(why, nwhy, "TLS handshake failed: %s",
             r ? r : "connection closed during the handshake");
}
