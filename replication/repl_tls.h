/*
 * repl_tls.h -- TLS 1.3 with mutual certificates for the peer and
 * registry channels.
 *
 * One repl_tls holds the cluster's trust: this process's certificate and
 * key, and the CA every other certificate must chain to. Both ends of a
 * link present a certificate and verify the other's; a process without a
 * certificate from the cluster's CA cannot complete a handshake.
 *
 * Identity. A certificate names one node in its subject's common name,
 * "node-<id>" (the node_id, in decimal), or a registry, "registry". A
 * link checks the id the other side announces in its HELLO or CHALLENGE
 * against its certificate (repl_tls_id_ok): a node must announce the id
 * its certificate names; a registry (which announces id 0) may hold a
 * "registry" certificate or any node's, since a node may also serve as a
 * registry. So a node's certificate cannot be used to pose as another
 * node.
 *
 * Reloading (repl_tls_reload) builds a new context from the same files
 * and swaps it in; links already open keep the context they started with.
 * Thread-safe: the replication thread and the registry thread share one.
 */
#ifndef REPL_TLS_H
#define REPL_TLS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct ssl_st;

typedef struct repl_tls repl_tls;

typedef struct repl_tls_options {
    const char *cert; /* PEM certificate chain of this process */
    const char *key;  /* its PEM private key */
    const char *ca;   /* PEM CA certificate(s) of the cluster */
    /* This process's node id, checked against its own certificate at
     * creation; 0 for a registry-only process (any cluster name). */
    uint32_t node_id;
} repl_tls_options;

/* The common name prefix of a node's certificate. */
#define REPL_TLS_NODE_PREFIX "node-"
/* The common name of a registry's certificate. */
#define REPL_TLS_REGISTRY_NAME "registry"

/*
 * Loads the files and checks that the certificate names node_id. Returns
 * NULL with a one-line reason in err on failure. The strings are copied.
 */
repl_tls *repl_tls_create(const repl_tls_options *o, char *err, size_t nerr);

/* Reads the files again; on failure the old context stays and err says
 * why. Returns 0 or -1. */
int repl_tls_reload(repl_tls *t, char *err, size_t nerr);

void repl_tls_destroy(repl_tls *t);

/* A new SSL object for one link, from the current context; NULL when out
 * of memory. */
struct ssl_st *repl_tls_new_ssl(repl_tls *t);

/*
 * True when a link whose other side announced `announced` may go on:
 * with a node certificate the ids must be equal; id 0 (a registry) is
 * allowed any cluster certificate. Writes the reason for a refusal into
 * why (at most nwhy bytes).
 */
bool repl_tls_id_ok(struct ssl_st *ssl, uint32_t announced, char *why,
                    size_t nwhy);

/*
 * 32 bytes of keying material exported from the session (RFC 8446
 * section 7.5), the same at both ends and unique to this session: the
 * link's handshake key, so its frames are bound to this TLS session.
 * Returns 0 or -1.
 */
int repl_tls_exporter(struct ssl_st *ssl, uint8_t out[32]);

/*
 * Why a handshake failed, in words, from the verify result of ssl (our
 * own refusal of the other side's certificate) or OpenSSL's error code
 * err (an alert from the other side, a protocol error).
 */
void repl_tls_failure(struct ssl_st *ssl, unsigned long err, char *why,
                      size_t nwhy);

#endif /* REPL_TLS_H */
