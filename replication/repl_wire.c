/*
 * repl_wire.c -- framing, authentication, mutation records and message
 * bodies of the peer channel (see repl_wire.h for the formats).
 */
#include "repl_wire.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

const char *repl_wire_strerror(int rc)
{
    switch (rc) {
    case REPL_WIRE_OK:
        return "ok";
    case REPL_WIRE_NEED_MORE:
        return "incomplete frame";
    case REPL_WIRE_ERR_MAGIC:
        return "not a peer frame of this version";
    case REPL_WIRE_ERR_TOO_BIG:
        return "frame larger than allowed";
    case REPL_WIRE_ERR_AUTH:
        return "frame authentication failed";
    case REPL_WIRE_ERR_FORMAT:
        return "malformed payload";
    case REPL_WIRE_ERR_SPACE:
        return "output buffer too small";
    case REPL_WIRE_ERR_CRYPTO:
        return "crypto library failure";
    default:
        return "unknown error";
    }
}

/* ============================================================ integers */

void repl_wire_put_u32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

void repl_wire_put_u64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

uint32_t repl_wire_get_u32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
           (uint32_t)p[3] << 24;
}

uint64_t repl_wire_get_u64(const uint8_t *p)
{
    return (uint64_t)repl_wire_get_u32(p) | (uint64_t)repl_wire_get_u32(p + 4)
                                                << 32;
}

/* =========================================================== handshake */

static uint8_t nonce_key[32];
static bool nonce_key_ok;
static pthread_once_t nonce_once = PTHREAD_ONCE_INIT;

static void nonce_key_init(void)
{
    nonce_key_ok = RAND_bytes(nonce_key, sizeof(nonce_key)) == 1;
}

/* The tag half of a nonce from its random half. */
static bool nonce_tag(const uint8_t *random_half, uint8_t tag[32])
{
    unsigned int outlen = 0;
    pthread_once(&nonce_once, nonce_key_init);
    return nonce_key_ok &&
           HMAC(EVP_sha256(), nonce_key, sizeof(nonce_key), random_half,
                REPL_WIRE_NONCE / 2, tag, &outlen) != NULL &&
           outlen == 32;
}

int repl_wire_nonce(uint8_t out[REPL_WIRE_NONCE])
{
    uint8_t tag[32];
    if (RAND_bytes(out, REPL_WIRE_NONCE / 2) != 1 || !nonce_tag(out, tag))
        return REPL_WIRE_ERR_CRYPTO;
    memcpy(out + REPL_WIRE_NONCE / 2, tag, REPL_WIRE_NONCE / 2);
    return REPL_WIRE_OK;
}

bool repl_wire_nonce_ours(const uint8_t nonce[REPL_WIRE_NONCE])
{
    uint8_t tag[32];
    return nonce_tag(nonce, tag) &&
           CRYPTO_memcmp(tag, nonce + REPL_WIRE_NONCE / 2,
                         REPL_WIRE_NONCE / 2) == 0;
}

/*
 * HMAC-SHA256(secret, label || extra || client nonce || server nonce ||
 * client node || server node): binds every derived value to both nonces
 * and both identities, so no proof or key carries over to another
 * connection.
 */
static int derive(const repl_auth *a, const char *label, int extra,
                  uint8_t out[32])
{
    uint8_t msg[32 + 1 + 2 * REPL_WIRE_NONCE + 8];
    size_t n = strlen(label);
    memcpy(msg, label, n);
    msg[n++] = (uint8_t)extra;
    memcpy(msg + n, a->client_nonce, REPL_WIRE_NONCE);
    n += REPL_WIRE_NONCE;
    memcpy(msg + n, a->server_nonce, REPL_WIRE_NONCE);
    n += REPL_WIRE_NONCE;
    repl_wire_put_u32(msg + n, a->client_node);
    repl_wire_put_u32(msg + n + 4, a->server_node);
    n += 8;
    unsigned int outlen = 0;
    if (!HMAC(EVP_sha256(), a->secret, (int)a->nsecret, msg, n, out,
              &outlen) ||
        outlen != 32)
        return REPL_WIRE_ERR_CRYPTO;
    return REPL_WIRE_OK;
}

int repl_wire_derive(repl_auth *a)
{
    return derive(a, "ribltcache session key", 0, a->session_key);
}

int repl_wire_proof(const repl_auth *a, int role, uint8_t out[32])
{
    return derive(a, "ribltcache proof", role, out);
}

bool repl_wire_proof_ok(const repl_auth *a, int role, const uint8_t *proof,
                        size_t n)
{
    uint8_t want[32];
    if (n != sizeof(want) || repl_wire_proof(a, role, want) != REPL_WIRE_OK)
        return false;
    return CRYPTO_memcmp(want, proof, sizeof(want)) == 0;
}

/* ============================================================== frames */

static bool is_handshake(uint8_t type)
{
    return type == REPL_MSG_HELLO || type == REPL_MSG_CHALLENGE;
}

struct repl_mac {
    EVP_MAC_CTX *ctx;
};

static EVP_MAC *hmac_alg;
static pthread_once_t hmac_once = PTHREAD_ONCE_INIT;

static void hmac_fetch(void)
{
    hmac_alg = EVP_MAC_fetch(NULL, "HMAC", NULL);
}

repl_mac *repl_mac_create(const uint8_t key[32])
{
    pthread_once(&hmac_once, hmac_fetch);
    if (!hmac_alg)
        return NULL;
    repl_mac *m = calloc(1, sizeof(*m));
    if (!m)
        return NULL;
    char digest[] = "SHA256";
    OSSL_PARAM params[] = {
        OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, digest, 0),
        OSSL_PARAM_construct_end(),
    };
    m->ctx = EVP_MAC_CTX_new(hmac_alg);
    if (!m->ctx || !EVP_MAC_init(m->ctx, key, 32, params)) {
        repl_mac_destroy(m);
        return NULL;
    }
    return m;
}

void repl_mac_destroy(repl_mac *m)
{
    if (!m)
        return;
    EVP_MAC_CTX_free(m->ctx);
    free(m);
}

/* The key a frame is tagged with: a raw key (one-shot HMAC) or a kept
 * context; neither: a handshake frame. */
struct keying {
    const uint8_t *key;
    repl_mac *mac;
};

static int tag_of(struct keying k, const uint8_t *data, size_t n,
                  uint8_t out[REPL_WIRE_TAG])
{
    if (k.mac) {
        size_t outlen = 0;
        if (!EVP_MAC_init(k.mac->ctx, NULL, 0, NULL) ||
            !EVP_MAC_update(k.mac->ctx, data, n) ||
            !EVP_MAC_final(k.mac->ctx, out, &outlen, REPL_WIRE_TAG) ||
            outlen != REPL_WIRE_TAG)
            return REPL_WIRE_ERR_CRYPTO;
        return REPL_WIRE_OK;
    }
    unsigned int outlen = 0;
    if (!HMAC(EVP_sha256(), k.key, 32, data, n, out, &outlen) ||
        outlen != REPL_WIRE_TAG)
        return REPL_WIRE_ERR_CRYPTO;
    return REPL_WIRE_OK;
}

static int parse(const uint8_t *buf, size_t len, struct keying k,
                 uint64_t expect_seq, uint32_t max_payload, repl_frame *out,
                 size_t *used)
{
    bool keyed = k.key != NULL || k.mac != NULL;
    if (len < REPL_WIRE_HEADER)
        return REPL_WIRE_NEED_MORE;
    if (buf[0] != 'R' || buf[1] != 'B' || buf[2] != REPL_WIRE_VERSION)
        return REPL_WIRE_ERR_MAGIC;
    uint8_t type = buf[3];
    uint32_t length = repl_wire_get_u32(buf + 4);
    if (max_payload > REPL_WIRE_MAX_PAYLOAD)
        max_payload = REPL_WIRE_MAX_PAYLOAD;
    /* Checked before waiting for the payload: nothing big is buffered. */
    if (length > max_payload)
        return REPL_WIRE_ERR_TOO_BIG;
    size_t total = repl_wire_frame_size(length);
    if (len < total)
        return REPL_WIRE_NEED_MORE;
    const uint8_t *tag = buf + REPL_WIRE_HEADER + length;
    if (!keyed) {
        static const uint8_t zero[REPL_WIRE_TAG];
        if (!is_handshake(type) || memcmp(tag, zero, REPL_WIRE_TAG) != 0)
            return REPL_WIRE_ERR_AUTH;
    } else {
        uint8_t want[REPL_WIRE_TAG];
        if (is_handshake(type))
            return REPL_WIRE_ERR_AUTH;
        if (tag_of(k, buf, REPL_WIRE_HEADER + length, want) != REPL_WIRE_OK)
            return REPL_WIRE_ERR_CRYPTO;
        if (CRYPTO_memcmp(want, tag, REPL_WIRE_TAG) != 0)
            return REPL_WIRE_ERR_AUTH;
    }
    uint64_t seq = repl_wire_get_u64(buf + 8);
    /* Authenticated frames must arrive in order, each exactly once. */
    if (keyed && seq != expect_seq)
        return REPL_WIRE_ERR_AUTH;
    out->type = type;
    out->length = length;
    out->seq = seq;
    out->payload = buf + REPL_WIRE_HEADER;
    *used = total;
    return REPL_WIRE_OK;
}

int repl_wire_parse(const uint8_t *buf, size_t len, const uint8_t *key,
                    uint64_t expect_seq, uint32_t max_payload, repl_frame *out,
                    size_t *used)
{
    struct keying k = {key, NULL};
    return parse(buf, len, k, expect_seq, max_payload, out, used);
}

int repl_wire_parse_mac(const uint8_t *buf, size_t len, repl_mac *mac,
                        uint64_t expect_seq, uint32_t max_payload,
                        repl_frame *out, size_t *used)
{
    struct keying k = {NULL, mac};
    return parse(buf, len, k, expect_seq, max_payload, out, used);
}

static long build(uint8_t *out, size_t cap, uint8_t type, uint64_t seq,
                  const uint8_t *payload, uint32_t length, struct keying k)
{
    if (length > REPL_WIRE_MAX_PAYLOAD)
        return REPL_WIRE_ERR_TOO_BIG;
    size_t total = repl_wire_frame_size(length);
    if (cap < total)
        return REPL_WIRE_ERR_SPACE;
    out[0] = 'R';
    out[1] = 'B';
    out[2] = REPL_WIRE_VERSION;
    out[3] = type;
    repl_wire_put_u32(out + 4, length);
    repl_wire_put_u64(out + 8, seq);
    /* memmove: callers may have written the payload in place already. */
    if (length > 0 && payload != out + REPL_WIRE_HEADER)
        memmove(out + REPL_WIRE_HEADER, payload, length);
    uint8_t *tag = out + REPL_WIRE_HEADER + length;
    if (k.key == NULL && k.mac == NULL) {
        memset(tag, 0, REPL_WIRE_TAG);
    } else if (tag_of(k, out, REPL_WIRE_HEADER + length, tag) !=
               REPL_WIRE_OK) {
        return REPL_WIRE_ERR_CRYPTO;
    }
    return (long)total;
}

long repl_wire_build(uint8_t *out, size_t cap, uint8_t type, uint64_t seq,
                     const uint8_t *payload, uint32_t length,
                     const uint8_t *key)
{
    struct keying k = {key, NULL};
    return build(out, cap, type, seq, payload, length, k);
}

long repl_wire_build_mac(uint8_t *out, size_t cap, uint8_t type, uint64_t seq,
                         const uint8_t *payload, uint32_t length,
                         repl_mac *mac)
{
    struct keying k = {NULL, mac};
    return build(out, cap, type, seq, payload, length, k);
}

/* ============================================================= records */

static bool keyless_kind(uint8_t kind)
{
    return kind == STORE_KIND_FLUSH || kind == STORE_KIND_EVICTED ||
           kind == STORE_KIND_DROP;
}

/* Whether the record carries the cas: not the one the id derives. */
static bool explicit_cas(const store_mutation *m)
{
    return m->cas != store_fresh_cas(&m->id);
}

size_t repl_wire_mutation_size(const store_mutation *m)
{
    return REPL_WIRE_MUT_FIXED + (keyless_kind(m->kind) ? 16 : 0) +
           (m->kind == STORE_KIND_FLUSH ? 8 : 0) + (explicit_cas(m) ? 8 : 0) +
           m->nkey + m->nvalue;
}

long repl_wire_put_mutation(uint8_t *out, size_t cap, const store_mutation *m)
{
    if (m->nkey > UINT16_MAX || m->nvalue > UINT32_MAX)
        return REPL_WIRE_ERR_FORMAT;
    size_t n = repl_wire_mutation_size(m);
    if (cap < n)
        return REPL_WIRE_ERR_SPACE;
    bool cas = explicit_cas(m);
    /* The marks ride in the kind byte's bits 4-5 (see repl_wire.h). */
    out[0] = (uint8_t)(m->kind | (m->marks & STORE_MARKS_ALL) << 4 |
                       (cas ? REPL_WIRE_MUT_CAS : 0));
    repl_wire_put_u64(out + 1, m->version.ticks);
    repl_wire_put_u32(out + 9, m->version.node);
    repl_wire_put_u32(out + 13, m->flags);
    repl_wire_put_u64(out + 17, (uint64_t)m->exptime);
    out[25] = (uint8_t)m->nkey;
    out[26] = (uint8_t)(m->nkey >> 8);
    repl_wire_put_u32(out + 27, (uint32_t)m->nvalue);
    size_t at = REPL_WIRE_MUT_FIXED;
    if (keyless_kind(m->kind)) {
        riblt_id_to_bytes(&m->id, out + at);
        at += 16;
    }
    if (m->kind == STORE_KIND_FLUSH) {
        repl_wire_put_u64(out + at, m->flush_at);
        at += 8;
    }
    if (cas) {
        repl_wire_put_u64(out + at, m->cas);
        at += 8;
    }
    if (m->nkey)
        memcpy(out + at, m->key, m->nkey);
    if (m->nvalue)
        memcpy(out + at + m->nkey, m->value, m->nvalue);
    return (long)n;
}

long repl_wire_get_mutation(const uint8_t *buf, size_t len, size_t max_value,
                            store_mutation *m)
{
    if (len < REPL_WIRE_MUT_FIXED)
        return REPL_WIRE_ERR_FORMAT;
    memset(m, 0, sizeof(*m));
    m->kind = buf[0] & 0x0f;
    m->marks = (buf[0] >> 4) & 3;
    bool cas = (buf[0] & REPL_WIRE_MUT_CAS) != 0;
    m->version.ticks = repl_wire_get_u64(buf + 1);
    m->version.node = repl_wire_get_u32(buf + 9);
    m->flags = repl_wire_get_u32(buf + 13);
    m->exptime = (int64_t)repl_wire_get_u64(buf + 17);
    m->nkey = (size_t)buf[25] | (size_t)buf[26] << 8;
    m->nvalue = repl_wire_get_u32(buf + 27);
    if ((buf[0] & 0x80) != 0 || m->kind > STORE_KIND_DROP ||
        (m->marks & ~STORE_MARKS_ALL) != 0 ||
        (m->marks != 0 && m->kind != STORE_KIND_VALUE))
        return REPL_WIRE_ERR_FORMAT;
    /* Flushes and the keyless records (evicted, drop) have no key. */
    bool keyless = keyless_kind(m->kind);
    if (keyless ? m->nkey != 0 : (m->nkey == 0 || m->nkey > 250))
        return REPL_WIRE_ERR_FORMAT;
    if (m->kind != STORE_KIND_VALUE && m->nvalue != 0)
        return REPL_WIRE_ERR_FORMAT;
    if (m->nvalue > max_value)
        return REPL_WIRE_ERR_FORMAT;
    size_t need = REPL_WIRE_MUT_FIXED + (keyless ? 16 : 0) +
                  (m->kind == STORE_KIND_FLUSH ? 8 : 0) + (cas ? 8 : 0) +
                  m->nkey + m->nvalue;
    if (len < need)
        return REPL_WIRE_ERR_FORMAT;
    size_t at = REPL_WIRE_MUT_FIXED;
    if (keyless) {
        riblt_id_from_bytes(&m->id, buf + at);
        at += 16;
    }
    if (m->kind == STORE_KIND_FLUSH) {
        m->flush_at = repl_wire_get_u64(buf + at);
        at += 8;
    }
    if (cas) {
        m->cas = repl_wire_get_u64(buf + at);
        at += 8;
    }
    m->key = (const char *)buf + at;
    m->value = (const char *)buf + at + m->nkey;
    if (!keyless)
        m->id = store_mutation_id(m);
    if (!cas)
        m->cas = store_fresh_cas(&m->id);
    else if (m->cas == store_fresh_cas(&m->id))
        return REPL_WIRE_ERR_FORMAT; /* one encoding per mutation */
    return (long)need;
}

/* ====================================================== message bodies */

size_t repl_wire_put_mutations_head(uint8_t *out, uint8_t flags,
                                    uint32_t count)
{
    out[0] = flags;
    repl_wire_put_u32(out + 1, count);
    return REPL_WIRE_MUT_HEADER;
}

void repl_wire_put_mutations_pos(uint8_t *out, uint64_t run, uint64_t seq)
{
    repl_wire_put_u64(out + REPL_WIRE_MUT_HEADER, run);
    repl_wire_put_u64(out + REPL_WIRE_MUT_HEADER + 8, seq);
}

int repl_wire_get_mutations_head(const uint8_t *p, size_t len, uint8_t *flags,
                                 uint32_t *count)
{
    if (len < REPL_WIRE_MUT_HEADER ||
        len < repl_wire_mutations_records_at(p[0]))
        return REPL_WIRE_ERR_FORMAT;
    *flags = p[0];
    *count = repl_wire_get_u32(p + 1);
    return REPL_WIRE_OK;
}

int repl_wire_get_mutations_pos(const uint8_t *p, size_t len, uint64_t *run,
                                uint64_t *seq)
{
    if (len < REPL_WIRE_MUT_HEADER + REPL_WIRE_MUT_POS ||
        !(p[0] & REPL_MUT_SEQ))
        return REPL_WIRE_ERR_FORMAT;
    *run = repl_wire_get_u64(p + REPL_WIRE_MUT_HEADER);
    *seq = repl_wire_get_u64(p + REPL_WIRE_MUT_HEADER + 8);
    return REPL_WIRE_OK;
}

void repl_wire_put_mutations_ticket(uint8_t *out, uint64_t ticket)
{
    size_t at = repl_wire_mutations_records_at(out[0]) - REPL_WIRE_MUT_TICKET;
    repl_wire_put_u64(out + at, ticket);
}

int repl_wire_get_mutations_ticket(const uint8_t *p, size_t len,
                                   uint64_t *ticket)
{
    if (len < REPL_WIRE_MUT_HEADER || !(p[0] & REPL_MUT_ACK) ||
        len < repl_wire_mutations_records_at(p[0]))
        return REPL_WIRE_ERR_FORMAT;
    *ticket = repl_wire_get_u64(p + repl_wire_mutations_records_at(p[0]) -
                                REPL_WIRE_MUT_TICKET);
    return REPL_WIRE_OK;
}

size_t repl_wire_put_push_ack(uint8_t *out, uint64_t ticket)
{
    repl_wire_put_u64(out, ticket);
    return REPL_WIRE_PUSH_ACK;
}

int repl_wire_get_push_ack(const uint8_t *p, size_t len, uint64_t *ticket)
{
    if (len != REPL_WIRE_PUSH_ACK)
        return REPL_WIRE_ERR_FORMAT;
    *ticket = repl_wire_get_u64(p);
    return REPL_WIRE_OK;
}

size_t repl_wire_put_resume(uint8_t *out, uint64_t run, uint64_t seq,
                            uint64_t own_run)
{
    repl_wire_put_u64(out, run);
    repl_wire_put_u64(out + 8, seq);
    repl_wire_put_u64(out + 16, own_run);
    return REPL_WIRE_RESUME;
}

int repl_wire_get_resume(const uint8_t *p, size_t len, uint64_t *run,
                         uint64_t *seq, uint64_t *own_run)
{
    if (len != REPL_WIRE_RESUME)
        return REPL_WIRE_ERR_FORMAT;
    *run = repl_wire_get_u64(p);
    *seq = repl_wire_get_u64(p + 8);
    *own_run = repl_wire_get_u64(p + 16);
    return REPL_WIRE_OK;
}

size_t repl_wire_put_symbols_req(uint8_t *out, uint64_t offset, uint32_t count,
                                 uint32_t flags)
{
    repl_wire_put_u64(out, offset);
    repl_wire_put_u32(out + 8, (count & ~REPL_SYMBOLS_WALK) |
                                   (flags & REPL_SYMBOLS_WALK));
    return REPL_WIRE_SYMBOLS_REQ_FIXED;
}

int repl_wire_get_symbols_req(const uint8_t *p, size_t len,
                              repl_wire_symbols_req *out)
{
    if (len < REPL_WIRE_SYMBOLS_REQ_FIXED)
        return REPL_WIRE_ERR_FORMAT;
    out->offset = repl_wire_get_u64(p);
    out->count = repl_wire_get_u32(p + 8) & ~REPL_SYMBOLS_WALK;
    out->flags = repl_wire_get_u32(p + 8) & REPL_SYMBOLS_WALK;
    out->rest = p + REPL_WIRE_SYMBOLS_REQ_FIXED;
    out->nrest = len - REPL_WIRE_SYMBOLS_REQ_FIXED;
    return REPL_WIRE_OK;
}

size_t repl_wire_put_ring_part(uint8_t *out, uint64_t fingerprint,
                               const uint32_t *parts, size_t nparts,
                               size_t nbitmap)
{
    repl_wire_put_u64(out, fingerprint);
    uint8_t *bm = out + 8;
    memset(bm, 0, nbitmap);
    for (size_t i = 0; i < nparts; i++)
        if (parts[i] / 8 < nbitmap)
            bm[parts[i] / 8] |= (uint8_t)(1u << (parts[i] % 8));
    return 8 + nbitmap;
}

int repl_wire_get_ring_part(const uint8_t *p, size_t len, size_t nbitmap,
                            uint64_t *fingerprint, const uint8_t **bitmap)
{
    if (len != 8 + nbitmap)
        return REPL_WIRE_ERR_FORMAT;
    *fingerprint = repl_wire_get_u64(p);
    *bitmap = p + 8;
    return REPL_WIRE_OK;
}

size_t repl_wire_put_symbols_head(uint8_t *out, uint64_t offset,
                                  int64_t set_size)
{
    repl_wire_put_u64(out, offset);
    repl_wire_put_u64(out + 8, (uint64_t)set_size);
    return REPL_WIRE_SYMBOLS_FIXED;
}

int repl_wire_get_symbols(const uint8_t *p, size_t len, repl_wire_symbols *out)
{
    if (len < REPL_WIRE_SYMBOLS_FIXED ||
        (len - REPL_WIRE_SYMBOLS_FIXED) % RIBLT_SYMBOL_WIRE_SIZE != 0)
        return REPL_WIRE_ERR_FORMAT;
    out->offset = repl_wire_get_u64(p);
    out->set_size = (int64_t)repl_wire_get_u64(p + 8);
    out->symbols = p + REPL_WIRE_SYMBOLS_FIXED;
    out->n = (len - REPL_WIRE_SYMBOLS_FIXED) / RIBLT_SYMBOL_WIRE_SIZE;
    return REPL_WIRE_OK;
}

size_t repl_wire_put_psums_head(uint8_t *out, uint8_t bucket, uint8_t first,
                                uint8_t count)
{
    out[0] = bucket;
    out[1] = first;
    out[2] = count;
    return REPL_WIRE_PSUMS_FIXED;
}

/* The three bytes both messages start with: a bucket that exists and a
 * range inside a bucket's terms. */
static int psums_head(const uint8_t *p, repl_wire_psums *out)
{
    out->bucket = p[0];
    out->first = p[1];
    out->count = p[2];
    out->terms = p + REPL_WIRE_PSUMS_FIXED;
    if (out->bucket >= RIBLT_PSUM_BUCKETS && out->bucket != REPL_PSUMS_ALL)
        return REPL_WIRE_ERR_FORMAT;
    if ((unsigned)out->first + out->count > RIBLT_PSUM_TERMS)
        return REPL_WIRE_ERR_FORMAT;
    return REPL_WIRE_OK;
}

int repl_wire_get_psums_req(const uint8_t *p, size_t len, repl_wire_psums *out)
{
    if (len != REPL_WIRE_PSUMS_FIXED || psums_head(p, out) != REPL_WIRE_OK ||
        out->count == 0)
        return REPL_WIRE_ERR_FORMAT;
    return REPL_WIRE_OK;
}

int repl_wire_get_psums(const uint8_t *p, size_t len, repl_wire_psums *out)
{
    if (len < REPL_WIRE_PSUMS_FIXED || psums_head(p, out) != REPL_WIRE_OK ||
        len != REPL_WIRE_PSUMS_FIXED +
                   (size_t)out->count * RIBLT_PSUM_TERM_WIRE_SIZE)
        return REPL_WIRE_ERR_FORMAT;
    return REPL_WIRE_OK;
}

size_t repl_wire_put_info(uint8_t *out, const repl_wire_info *in)
{
    repl_wire_put_u32(out, in->weight);
    repl_wire_put_u32(out + 4, in->partitions);
    repl_wire_put_u32(out + 8, in->replicas);
    if (in->naddr)
        memcpy(out + REPL_WIRE_INFO_FIXED, in->addr, in->naddr);
    return REPL_WIRE_INFO_FIXED + in->naddr;
}

int repl_wire_get_info(const uint8_t *p, size_t len, repl_wire_info *out)
{
    if (len < REPL_WIRE_INFO_FIXED)
        return REPL_WIRE_ERR_FORMAT;
    out->weight = repl_wire_get_u32(p);
    out->partitions = repl_wire_get_u32(p + 4);
    out->replicas = repl_wire_get_u32(p + 8);
    out->addr = (const char *)p + REPL_WIRE_INFO_FIXED;
    out->naddr = len - REPL_WIRE_INFO_FIXED;
    return REPL_WIRE_OK;
}
