/*
 * repl_link.h -- one authenticated, framed connection between two nodes
 * (or a node and a registry) over a libevent bufferevent.
 *
 * The peer channel (repl_conn.c) and the registry channel (registry_*.c)
 * both run on links. A link owns its bufferevent, the handshake (HELLO /
 * CHALLENGE / PROOF / ACCEPT with the cluster secret, repl_wire.h), the
 * sequence numbers of both directions, the frame reader (the length is checked
 * against a cap before a byte of payload is buffered: 64 bytes during the
 * handshake, the caller's cap after it), sending, the pause of reading
 * while the output is too far behind, closing once the output is sent,
 * timeouts and byte counters. Its owner sees only authenticated frames and
 * four events, through a table of callbacks.
 *
 * Threading: a link lives on the thread of its event base; none of these
 * functions may be called from another thread.
 */
#ifndef REPL_LINK_H
#define REPL_LINK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#include <event2/util.h>

struct event_base;

#include "repl_wire.h"

enum repl_link_rc {
    REPL_LINK_OK = 0,
    REPL_LINK_ERR_NOMEM = -1,   /* allocation or event set-up failed */
    REPL_LINK_ERR_CONNECT = -2, /* the connect call failed at once */
    REPL_LINK_ERR_STATE = -3,   /* not ready, or closing */
    REPL_LINK_ERR_FRAME = -4,   /* frame could not be built or queued */
    REPL_LINK_ERR_BUSY = -5,    /* output not empty (repl_link_send_now) */
};

const char *repl_link_strerror(int rc);

/* Why a link closed (the closed callback's argument). */
enum repl_link_why {
    REPL_LINK_CLOSED_LOCAL = 0, /* repl_link_close, or the set-up failed */
    REPL_LINK_CLOSED_NET,       /* end of stream, socket error or timeout */
    REPL_LINK_CLOSED_AUTH,      /* handshake refused, or a tag or seq bad */
    REPL_LINK_CLOSED_BAD_FRAME, /* malformed frame, or frame() < 0 */
    REPL_LINK_CLOSED_QUIET,     /* frame() > 0: the owner asked for it */
    REPL_LINK_CLOSED_SELF,      /* the other side is this very process */
    REPL_LINK_CLOSED_DUPLICATE, /* another process has our node id */
};

typedef struct repl_link repl_link;

/*
 * The owner's callbacks; arg is the pointer given at creation. A callback
 * may send on any link and may close any link, this one included (the
 * link is then freed once its own callback returns).
 */
typedef struct repl_link_ops {
    /*
     * An authenticated frame after the handshake. f->payload is valid
     * until the callback returns. Returns 0 to go on, > 0 to close the
     * link (REPL_LINK_CLOSED_QUIET), < 0 to close it as a bad frame.
     */
    int (*frame)(void *arg, repl_link *l, const repl_frame *f);
    /* The handshake succeeded: the link may send frames. May be NULL. */
    void (*ready)(void *arg, repl_link *l);
    /*
     * The link is closing; called exactly once per link, whoever closes
     * it. The owner must forget l: it is freed right after (or, when
     * closed inside one of its own callbacks, once that returns). The
     * query functions still answer during the call.
     */
    void (*closed)(void *arg, repl_link *l, int why);
    /*
     * The output drained to options.write_low_water or below (a chance to
     * queue more of a long transfer). May be NULL.
     */
    void (*writable)(void *arg, repl_link *l);
    /*
     * The node id the other side sent in its HELLO or CHALLENGE (not our
     * own when detect_self is set): false refuses the link as a failed
     * authentication. NULL accepts any id.
     */
    bool (*check_id)(void *arg, uint32_t node);
} repl_link_ops;

struct repl_tls;

typedef struct repl_link_options {
    const char *secret; /* cluster secret, borrowed for the link's life */
    /*
     * TLS 1.3 with mutual certificates (repl_tls.h), borrowed for the
     * link's life; NULL = plain TCP. With TLS, the handshake below runs
     * inside the TLS session with a key exported from it instead of the
     * secret, and the other side's announced node id must match its
     * certificate.
     */
    struct repl_tls *tls;
    uint32_t node_id; /* ours, sent in HELLO / CHALLENGE */
    /*
     * The other side has our id (our own address dialled): neither side
     * counts it as a failure. The dialling side closes at once with
     * REPL_LINK_CLOSED_SELF; the answering side sends its CHALLENGE and
     * closes once it is sent, also with REPL_LINK_CLOSED_SELF.
     */
    bool detect_self;
    uint32_t max_payload;   /* frame cap once ready (<= 4 MiB) */
    uint32_t idle_s;        /* read timeout once ready; 0 = none */
    size_t out_high_water;  /* stop reading above this; 0 = never */
    size_t write_low_water; /* when writable() is called (0 = empty) */
    /* Counters added to with relaxed atomics; each may be NULL. */
    uint64_t *bytes_sent, *bytes_recv; /* whole frames, handshake too */
    uint64_t *connects;                /* TCP connections made (dial) */
} repl_link_options;

/*
 * Takes an accepted socket (closed with the link, also on failure) and
 * waits for the other side's HELLO. Returns NULL when out of memory.
 * o is copied; ops must outlive the link.
 */
repl_link *repl_link_accept(struct event_base *base, evutil_socket_t fd,
                            const repl_link_options *o,
                            const repl_link_ops *ops, void *arg);

/*
 * The dialling side over a socket that is already connected (closed with
 * the link, also on failure): the HELLO is queued at once. Returns NULL
 * when out of memory.
 */
repl_link *repl_link_start(struct event_base *base, evutil_socket_t fd,
                           const repl_link_options *o,
                           const repl_link_ops *ops, void *arg);

/*
 * Dials addr; the HELLO goes out once connected. On success *out is the
 * link and REPL_LINK_OK is returned; a connection that fails later closes
 * with REPL_LINK_CLOSED_NET. On failure (REPL_LINK_ERR_NOMEM or
 * REPL_LINK_ERR_CONNECT) nothing is left and no callback runs.
 */
int repl_link_dial(struct event_base *base, const struct sockaddr *addr,
                   socklen_t addrlen, const repl_link_options *o,
                   const repl_link_ops *ops, void *arg, repl_link **out);

/* Closes l now: closed(REPL_LINK_CLOSED_LOCAL) runs, then l is freed. */
void repl_link_close(repl_link *l);

/*
 * Queues one authenticated frame (the next seq, tagged with the session
 * key). Only once ready; len at most options.max_payload. Returns 0 or a
 * negative REPL_LINK_ERR_*.
 */
int repl_link_send(repl_link *l, uint8_t type, const uint8_t *payload,
                   uint32_t len);

/*
 * Writes one authenticated frame straight on the socket, without the
 * event loop (for a last frame as the loop stops). Frames already queued
 * are written first; if the socket does not take all of them at once,
 * REPL_LINK_ERR_BUSY and nothing is sent. The frame may still be lost if
 * the socket cannot take it at once.
 */
int repl_link_send_now(repl_link *l, uint8_t type, const uint8_t *payload,
                       uint32_t len);

/* True once the handshake succeeded (and until the link closes). */
bool repl_link_ready(const repl_link *l);

/* True on a dialled link that sent its proof and awaits the answer: the
 * other side closing it now has refused the proof (a different secret). */
bool repl_link_proof_sent(const repl_link *l);

/*
 * Why the handshake was refused, in words (a certificate refused, by
 * either side, with OpenSSL's reason; a node id its certificate does not
 * name), or NULL when the refusal has no more specific reason than its
 * REPL_LINK_CLOSED_AUTH.
 */
const char *repl_link_refusal(const repl_link *l);

/* Writes the other side's address ("ip:port", "[v6]:port") into buf, or
 * "unknown". */
void repl_link_peer_addr(const repl_link *l, char *buf, size_t n);

/* True on a TLS link. */
bool repl_link_tls(const repl_link *l);

/* The node id the other side presented (proved once ready), 0 before. */
uint32_t repl_link_peer_id(const repl_link *l);

/* Bytes queued for sending. */
size_t repl_link_output_length(const repl_link *l);

/* The socket (for getsockname); -1 before a dial has one. */
evutil_socket_t repl_link_fd(const repl_link *l);

/*
 * Resolves "host:port" (or "[v6]:port"), the first n bytes of spec, into
 * ss/len for a connect. `what` names the address in the error message
 * ("peer", "registry"). Returns 0, or -1 with a message in err.
 */
#define REPL_LINK_ADDR_MAX 127
int repl_link_resolve(const char *what, const char *spec, size_t n,
                      struct sockaddr_storage *ss, socklen_t *len, char *err,
                      size_t nerr);

#endif /* REPL_LINK_H */
