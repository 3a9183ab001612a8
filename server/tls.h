/*
 * tls.h -- TLS for client connections (memcached's -Z), on OpenSSL.
 *
 * A tls_server holds the SSL_CTX built from the ssl_* settings; every
 * connection accepted on a TLS listener gets a tls_conn from it. Reloading
 * (SIGHUP, `refresh_certs`) builds a whole new context from the files and
 * swaps it in: connections already open keep the context they started with
 * (OpenSSL counts the references), new ones take the new one, and a file
 * that does not load leaves the old context serving.
 *
 * A tls_conn is driven on the connection's own non-blocking socket with
 * SSL_read / SSL_write, so the connection layer keeps its one cycle of
 * read -> parse -> gathered write: the handshake runs inside the first
 * reads. Nothing here blocks.
 */
#ifndef TLS_H
#define TLS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

enum tls_rc {
    TLS_OK = 0,
    TLS_ERR_CONFIG = -1, /* a file does not load, or a setting is refused */
    TLS_ERR_NOMEM = -2,
};

/* What the context is built from: memcached's ssl_* settings. Strings are
 * borrowed for the life of the tls_server (reloads read the files again). */
typedef struct tls_settings {
    const char *chain_cert; /* PEM certificate chain (required) */
    const char *key;        /* private key (required) */
    int keyformat;          /* 1 = PEM, 2 = DER (memcached's ssl_keyformat) */
    const char *ca_cert;    /* CAs client certificates must chain to */
    int verify_mode;        /* 0 none, 1 request, 2 require, 3 require once */
    const char *ciphers;    /* TLS 1.2 cipher list, NULL = OpenSSL's */
    int min_version;        /* 0 = TLS 1.0 ... 3 = TLS 1.3 */
    bool session_cache;     /* server-side session cache and tickets */
    bool kernel_tls;        /* ask OpenSSL to hand records to the kernel */
} tls_settings;

typedef struct tls_server tls_server;

/* Counters for `stats`. */
typedef struct tls_server_stats {
    uint64_t handshake_errors; /* handshakes that failed (garbage, refused
                                  certificates, protocol versions) */
    uint64_t new_sessions;     /* sessions added to the cache */
    int64_t last_refresh;      /* unix time the context was last built */
} tls_server_stats;

/*
 * Builds the context from s. Returns 0 with *out set, or TLS_ERR_* with a
 * one-line reason in err (NUL-terminated, at most errlen bytes).
 */
int tls_server_create(const tls_settings *s, tls_server **out, char *err,
                      size_t errlen);

/*
 * Reads the certificate, key and CA files again into a new context and
 * makes it the one new connections use. On failure the old context stays
 * and err says why. Any thread.
 */
int tls_server_reload(tls_server *ts, char *err, size_t errlen);

/* Frees ts; connections still open keep their own reference. */
void tls_server_destroy(tls_server *ts);

/* Any thread. */
void tls_server_get_stats(const tls_server *ts, tls_server_stats *st);
bool tls_server_session_cache(const tls_server *ts);

/* ---------------------------------------------------------- connections */

/* One connection's TLS state (OpenSSL's SSL object). */
typedef struct ssl_st tls_conn;

/* What tls_conn_read / tls_conn_write return besides a byte count. */
enum tls_io {
    TLS_IO_CLOSED = 0,      /* the peer closed (close_notify or EOF) */
    TLS_IO_WANT_READ = -1,  /* retry once the socket is readable */
    TLS_IO_WANT_WRITE = -2, /* retry once the socket is writable */
    TLS_IO_ERROR = -3,      /* the connection is unusable: close it */
};

/* A server-side TLS connection on the accepted socket fd, from the current
 * context. Returns NULL when out of memory. */
tls_conn *tls_conn_new(tls_server *ts, int fd);

/* A client-side TLS connection on the connecting socket fd (relays to
 * another node's TLS client port): it presents this node's certificate and
 * verifies the other's against ssl_ca_cert when that is set. The
 * handshake runs inside the first writes and reads. NULL when out of
 * memory. */
tls_conn *tls_conn_new_client(tls_server *ts, int fd);

/* Sends close_notify when the session is healthy (never blocks), then
 * frees tc. */
void tls_conn_free(tls_conn *tc);

/*
 * Reads up to len decrypted bytes into buf, running the handshake first.
 * Returns the count (> 0) or an enum tls_io value. A failed handshake is
 * counted and logged with its reason.
 */
ssize_t tls_conn_read(tls_conn *tc, void *buf, size_t len);

/*
 * Writes up to len bytes of buf as TLS records. Returns the count written
 * (> 0) or an enum tls_io value. After WANT_*, call again with the same
 * first bytes (more may follow them).
 */
ssize_t tls_conn_write(tls_conn *tc, const void *buf, size_t len);

/* Decrypted bytes OpenSSL holds that the socket will not signal. */
bool tls_conn_pending(const tls_conn *tc);

/* The handshake has completed. */
bool tls_conn_established(const tls_conn *tc);

#endif /* TLS_H */
