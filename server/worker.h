/*
 * worker.h -- the pool of worker threads that serve client connections.
 *
 * Each worker runs its own event_base. The accepting thread hands a new
 * socket to the next worker in turn (round robin) through a queue and a
 * wake-up pipe; from then on only that worker touches the connection.
 * Each worker owns one stats_thread block that its parsers bump without
 * locks.
 */
#ifndef WORKER_H
#define WORKER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#include "conn.h"
#include "proto.h"

enum worker_rc {
    WORKER_OK = 0,
    WORKER_ERR_NOMEM = -1,
    WORKER_ERR_SYS = -2,   /* pipe, thread or event setup failed */
    WORKER_ERR_STATE = -3, /* pool not running */
};

/* What every worker needs; copied by worker_pool_start. */
typedef struct worker_setup {
    size_t nthreads;
    store *store;
    const proto_config *pcfg;
    int verbose;
    unsigned reqs_per_event;
    unsigned nap_us; /* see worker_loop in worker.c; 0 = never nap */
    size_t output_max;
    size_t input_max;
    struct tls_server *tls; /* TLS listeners' context, or NULL */
    size_t tls_wbuf_size;   /* ssl_wbuf_size */
    int proto_mode;
    uint32_t idle_timeout;
    void (*request_shutdown)(void *arg); /* any thread */
    void *shutdown_arg;
} worker_setup;

/* Starts the threads. Returns 0 or WORKER_ERR_*. */
int worker_pool_start(const worker_setup *ws);

/*
 * Hands an accepted non-blocking socket to the next worker, which takes
 * ownership (it closes the socket when done, or at once on failure); tls:
 * it came from a TLS listener.
 * The caller has counted it in curr_connections. Returns 0 or an error
 * (then the socket has been closed and the count given back).
 */
int worker_dispatch(int fd, const struct sockaddr *sa, socklen_t salen,
                    bool tls);

/*
 * Stops every worker (their connections get one last flush and close) and
 * joins the threads. Safe to call when the pool never started.
 */
void worker_pool_stop(void);

/*
 * Peers confirmed writes (any thread): wakes each worker that has
 * connections waiting for a confirmation (conn_env_ack_kick).
 */
void worker_pool_wake_acks(void);

/* Number of workers; their counters (for stats). */
size_t worker_count(void);
stats_thread *worker_stats(size_t i);
uint64_t worker_conn_yields(size_t i);
uint64_t worker_idle_kicks(size_t i);
/* Zeroes worker i's yield and idle counters (stats reset). */
void worker_reset_counters(size_t i);
/* Lists worker i's connections (see conn_env_each). */
void worker_conns_each(size_t i, conn_info_fn fn, void *arg);

/*
 * Whether a pass of a worker's event loop is followed by a nap (see
 * worker_loop in worker.c).
 */
typedef struct worker_nap {
    int avg;      /* connections a nap's pass found, running average, x16 */
    int skip;     /* chances to nap left to pass by while naps don't pay */
    bool napping; /* the next pass follows a nap */
} worker_nap;
void worker_nap_init(worker_nap *wn);
/* A pass read requests on `inputs` connections, `piped` of them more
 * than one: whether to nap now. */
bool worker_nap_next(worker_nap *wn, unsigned inputs, unsigned piped);

#endif /* WORKER_H */
