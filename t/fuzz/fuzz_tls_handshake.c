/*
 * fuzz_tls_handshake.c -- libFuzzer target for what a TLS listener reads
 * before the handshake completes.
 *
 * A server context (tls_server_create) is built once from a key and a
 * self-signed certificate made at start-up in a temporary directory. Each
 * input is a client's byte stream: it is written into one end of a
 * non-blocking socket pair, the write side then shut, and the server end
 * is driven with tls_conn_read exactly as a connection does, until it
 * reports the close, an error or that it waits for more. A stream that
 * cannot hold a handshake must end in TLS_IO_CLOSED or TLS_IO_ERROR, and
 * nothing decrypted may come out of bytes without a handshake.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include "tls.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static tls_server *server;

/* Writes a P-256 key and a self-signed certificate for it into dir. */
static void make_identity(const char *crt_path, const char *key_path)
{
    EVP_PKEY *key = EVP_EC_gen("P-256");
    X509 *x = X509_new();
    if (key == NULL || x == NULL) {
        abort();
    }
    ASN1_INTEGER_set(X509_get_serialNumber(x), 1);
    X509_gmtime_adj(X509_getm_notBefore(x), 0);
    X509_gmtime_adj(X509_getm_notAfter(x), 86400);
    X509_set_pubkey(x, key);
    X509_NAME *name = X509_get_subject_name(x);
    X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC,
                               (const unsigned char *)"fuzz", -1, -1, 0);
    X509_set_issuer_name(x, name);
    if (!X509_sign(x, key, EVP_sha256())) {
        abort();
    }
    FILE *f = fopen(crt_path, "w");
    FILE *k = fopen(key_path, "w");
    if (f == NULL || k == NULL || !PEM_write_X509(f, x) ||
        !PEM_write_PrivateKey(k, key, NULL, NULL, 0, NULL, NULL)) {
        abort();
    }
    fclose(f);
    fclose(k);
    X509_free(x);
    EVP_PKEY_free(key);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    char dir[] = "/tmp/fuzz-tls-XXXXXX";
    char crt[64], key[64], err[256];
    if (mkdtemp(dir) == NULL) {
        abort();
    }
    snprintf(crt, sizeof(crt), "%s/c.pem", dir);
    snprintf(key, sizeof(key), "%s/k.pem", dir);
    make_identity(crt, key);
    tls_settings s = {.chain_cert = crt,
                      .key = key,
                      .keyformat = 1,
                      .min_version = 2,
                      .session_cache = true};
    if (tls_server_create(&s, &server, err, sizeof(err)) != TLS_OK) {
        fprintf(stderr, "tls_server_create: %s\n", err);
        abort();
    }
    /* The context holds everything it read: the files can go. */
    unlink(crt);
    unlink(key);
    rmdir(dir);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    int sv[2];
    if (size > 65536) {
        return 0; /* more than a socket pair buffers without a reader */
    }
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, sv) != 0) {
        abort();
    }
    size_t off = 0;
    while (off < size) {
        ssize_t w = write(sv[1], data + off, size - off);
        if (w <= 0) {
            break;
        }
        off += (size_t)w;
    }
    shutdown(sv[1], SHUT_WR);

    tls_conn *tc = tls_conn_new(server, sv[0]);
    if (tc == NULL) {
        abort();
    }
    char buf[4096], sink[16384];
    ssize_t r = 0;
    for (int i = 0; i < 64; i++) {
        r = tls_conn_read(tc, buf, sizeof(buf));
        /* The server's own records (ServerHello, alerts) are read away
         * so that its writes never stall. */
        while (read(sv[1], sink, sizeof(sink)) > 0) {
        }
        if (r <= 0 && r != TLS_IO_WANT_WRITE) {
            break;
        }
        if (r > 0 && !tls_conn_established(tc)) {
            abort(); /* plaintext out of an unfinished handshake */
        }
    }
    /* The input ended (write side shut): the session cannot wait for
     * more. */
    if (r == TLS_IO_WANT_READ) {
        abort();
    }
    tls_conn_free(tc);
    close(sv[0]);
    close(sv[1]);
    return 0;
}
