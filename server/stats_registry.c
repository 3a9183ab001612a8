/*
 * stats_registry.c -- the `stats` listings (declared in stats.h) and the
 * registry the daemon fills at start-up (stats_registry.h).
 *
 * Counters live where they are bumped: per worker thread (stats_thread),
 * per worker connection environment (conn_yields, idle_kicks), daemon-wide
 * connection counters (stats.c), and the store's own. A listing sums them
 * at the moment it is asked for. `stats reset` zeroes the thread and
 * connection counters; the store's monotonic counters cannot be zeroed from
 * here, so reset records their current values and later listings subtract
 * them.
 */
#include "stats_registry.h"

#include <arpa/inet.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <event2/event.h>

#include "prefix_stats.h"
#include "watch.h"
#include "worker.h"

#define STATS_MAX_LISTENERS 64
#define STATS_MAX_GROUPS 8

typedef struct stats_group {
    const char *name;
    stats_group_fn fn;
    void *arg;
} stats_group;

static struct {
    pthread_mutex_t lock; /* reset baseline, registry tables */
    const options *opts;
    store *store;
    time_t started;
    int listeners[STATS_MAX_LISTENERS];
    size_t nlisteners;
    stats_group groups[STATS_MAX_GROUPS];
    size_t ngroups;
    stats_group general[STATS_MAX_GROUPS]; /* extra general lines */
    size_t ngeneral;
    store_stats base; /* store counters at the last reset */
} reg = {.lock = PTHREAD_MUTEX_INITIALIZER};

void stats_registry_setup(const options *o, store *s)
{
    pthread_mutex_lock(&reg.lock);
    reg.opts = o;
    reg.store = s;
    reg.started = time(NULL);
    memset(&reg.base, 0, sizeof(reg.base));
    pthread_mutex_unlock(&reg.lock);
}

void stats_registry_teardown(void)
{
    pthread_mutex_lock(&reg.lock);
    reg.opts = NULL;
    reg.store = NULL;
    reg.nlisteners = 0;
    reg.ngroups = 0;
    reg.ngeneral = 0;
    pthread_mutex_unlock(&reg.lock);
}

int stats_registry_add_listener(int fd)
{
    int rc = STATS_ERR_FULL;
    pthread_mutex_lock(&reg.lock);
    if (reg.nlisteners < STATS_MAX_LISTENERS) {
        reg.listeners[reg.nlisteners++] = fd;
        rc = STATS_OK;
    }
    pthread_mutex_unlock(&reg.lock);
    return rc;
}

int stats_register_group(const char *name, stats_group_fn fn, void *arg)
{
    int rc = STATS_ERR_FULL;
    pthread_mutex_lock(&reg.lock);
    if (reg.ngroups < STATS_MAX_GROUPS) {
        reg.groups[reg.ngroups].name = name;
        reg.groups[reg.ngroups].fn = fn;
        reg.groups[reg.ngroups].arg = arg;
        reg.ngroups++;
        rc = STATS_OK;
    }
    pthread_mutex_unlock(&reg.lock);
    return rc;
}

int stats_register_general(stats_group_fn fn, void *arg)
{
    int rc = STATS_ERR_FULL;
    pthread_mutex_lock(&reg.lock);
    if (reg.ngeneral < STATS_MAX_GROUPS) {
        reg.general[reg.ngeneral].name = "";
        reg.general[reg.ngeneral].fn = fn;
        reg.general[reg.ngeneral].arg = arg;
        reg.ngeneral++;
        rc = STATS_OK;
    }
    pthread_mutex_unlock(&reg.lock);
    return rc;
}

/* ------------------------------------------------------------ helpers */

static void emit_u64(stats_emit_fn emit, void *arg, const char *name,
                     uint64_t v)
{
    char buf[24];
    snprintf(buf, sizeof(buf), "%" PRIu64, v);
    emit(arg, name, buf);
}

/* Sums every worker's stats_thread into sum. */
static void sum_threads(stats_thread *sum, uint64_t *yields, uint64_t *kicks)
{
    memset(sum, 0, sizeof(*sum));
    *yields = 0;
    *kicks = 0;
    size_t n = worker_count();
    for (size_t i = 0; i < n; i++) {
        stats_thread *t = worker_stats(i);
#define STATS_SUM(name)                                                       \
    sum->name += __atomic_load_n(&t->name, __ATOMIC_RELAXED);
        STATS_THREAD_COUNTERS(STATS_SUM)
#undef STATS_SUM
        *yields += worker_conn_yields(i);
        *kicks += worker_idle_kicks(i);
    }
}

/* The store's counters minus the values recorded at the last reset. */
static void store_view(store_stats *ss)
{
    memset(ss, 0, sizeof(*ss));
    pthread_mutex_lock(&reg.lock);
    if (reg.store == NULL) {
        pthread_mutex_unlock(&reg.lock);
        return;
    }
    store_get_stats(reg.store, ss);
#define STATS_SINCE(f) ss->f = ss->f >= reg.base.f ? ss->f - reg.base.f : 0;
    STATS_SINCE(total_items)
    STATS_SINCE(evictions)
    STATS_SINCE(expired_unfetched)
    STATS_SINCE(evicted_unfetched)
    STATS_SINCE(reclaimed)
    STATS_SINCE(applied_remote)
    STATS_SINCE(stale_remote)
    STATS_SINCE(swept)
    STATS_SINCE(sweep_checked)
    STATS_SINCE(dropped)
#undef STATS_SINCE
    pthread_mutex_unlock(&reg.lock);
}

/* ------------------------------------------------------------ general */

static void emit_general(stats_emit_fn emit, void *arg)
{
    stats_thread t;
    uint64_t yields;
    uint64_t kicks;
    store_stats ss;
    char buf[64];
    struct rusage ru;
    time_t now = time(NULL);

    sum_threads(&t, &yields, &kicks);
    store_view(&ss);
    getrusage(RUSAGE_SELF, &ru);

    emit_u64(emit, arg, "pid", (uint64_t)getpid());
    emit_u64(emit, arg, "uptime", (uint64_t)(now - reg.started));
    emit_u64(emit, arg, "time", (uint64_t)now);
    emit(arg, "version", RIBLTCACHE_WIRE_VERSION);
    emit(arg, "libevent", event_get_version());
    emit_u64(emit, arg, "pointer_size", 8 * sizeof(void *));
    snprintf(buf, sizeof(buf), "%ld.%06ld", (long)ru.ru_utime.tv_sec,
             (long)ru.ru_utime.tv_usec);
    emit(arg, "rusage_user", buf);
    snprintf(buf, sizeof(buf), "%ld.%06ld", (long)ru.ru_stime.tv_sec,
             (long)ru.ru_stime.tv_usec);
    emit(arg, "rusage_system", buf);
    emit_u64(emit, arg, "max_connections", reg.opts ? reg.opts->maxconns : 0);
    emit_u64(emit, arg, "curr_connections", STATS_CONN_GET(curr_connections));
    emit_u64(emit, arg, "total_connections",
             STATS_CONN_GET(total_connections));
    emit_u64(emit, arg, "rejected_connections",
             STATS_CONN_GET(rejected_connections));
    emit_u64(emit, arg, "connection_structures",
             STATS_CONN_GET(connection_structures));
    emit_u64(emit, arg, "cmd_get", t.cmd_get);
    emit_u64(emit, arg, "cmd_set", t.cmd_set);
    emit_u64(emit, arg, "cmd_flush", t.cmd_flush);
    emit_u64(emit, arg, "cmd_touch", t.cmd_touch);
    emit_u64(emit, arg, "cmd_meta", t.cmd_meta);
    emit_u64(emit, arg, "get_hits", t.get_hits);
    emit_u64(emit, arg, "get_misses", t.get_misses);
    emit_u64(emit, arg, "get_expired", t.get_expired);
    emit_u64(emit, arg, "get_flushed", t.get_flushed);
    emit_u64(emit, arg, "delete_misses", t.delete_misses);
    emit_u64(emit, arg, "delete_hits", t.delete_hits);
    emit_u64(emit, arg, "incr_misses", t.incr_misses);
    emit_u64(emit, arg, "incr_hits", t.incr_hits);
    emit_u64(emit, arg, "decr_misses", t.decr_misses);
    emit_u64(emit, arg, "decr_hits", t.decr_hits);
    emit_u64(emit, arg, "cas_misses", t.cas_misses);
    emit_u64(emit, arg, "cas_hits", t.cas_hits);
    emit_u64(emit, arg, "cas_badval", t.cas_badval);
    emit_u64(emit, arg, "touch_hits", t.touch_hits);
    emit_u64(emit, arg, "touch_misses", t.touch_misses);
    emit_u64(emit, arg, "store_too_large", t.store_too_large);
    emit_u64(emit, arg, "store_no_memory", t.store_no_memory);
    emit_u64(emit, arg, "auth_cmds", t.auth_cmds);
    emit_u64(emit, arg, "auth_errors", t.auth_errors);
    if (reg.opts != NULL && reg.opts->idle_timeout != 0) {
        emit_u64(emit, arg, "idle_kicks", kicks);
    }
    emit_u64(emit, arg, "bytes_read", t.bytes_read);
    emit_u64(emit, arg, "bytes_written", t.bytes_written);
    emit_u64(emit, arg, "limit_maxbytes", ss.limit_maxbytes);
    emit_u64(emit, arg, "accepting_conns", STATS_CONN_GET(accepting_conns));
    emit_u64(emit, arg, "listen_disabled_num",
             STATS_CONN_GET(listen_disabled_num));
    emit_u64(emit, arg, "threads", worker_count());
    emit_u64(emit, arg, "conn_yields", yields);
    emit_u64(emit, arg, "worker_naps", t.worker_naps);
    if (reg.opts != NULL && reg.opts->repl_ack_wait_ms != 0) {
        emit_u64(emit, arg, "repl_ack_waits", t.repl_ack_waits);
        emit_u64(emit, arg, "repl_ack_failures", t.repl_ack_failures);
    }
    emit_u64(emit, arg, "time_in_listen_disabled_us",
             STATS_CONN_GET(listen_disabled_us));
    watch_stats ws;
    watch_get_stats(&ws);
    emit_u64(emit, arg, "log_worker_written", ws.written);
    emit_u64(emit, arg, "log_watcher_skipped", ws.skipped);
    emit_u64(emit, arg, "log_watcher_sent", ws.sent);
    emit_u64(emit, arg, "log_watchers", ws.watchers);
    emit_u64(emit, arg, "hash_power_level", ss.hash_power_level);
    emit_u64(emit, arg, "hash_bytes", ss.hash_bytes);
    emit_u64(emit, arg, "item_page_bytes", ss.item_page_bytes);
    emit_u64(emit, arg, "item_chunk_bytes", ss.item_chunk_bytes);
    emit_u64(emit, arg, "bytes", ss.bytes);
    emit_u64(emit, arg, "curr_items", ss.curr_items);
    emit_u64(emit, arg, "total_items", ss.total_items);
    emit_u64(emit, arg, "expired_unfetched", ss.expired_unfetched);
    emit_u64(emit, arg, "evicted_unfetched", ss.evicted_unfetched);
    emit_u64(emit, arg, "evictions", ss.evictions);
    emit_u64(emit, arg, "reclaimed", ss.reclaimed);
    /* Ours: protocol errors and the replicated store. */
    emit_u64(emit, arg, "client_errors", t.client_errors);
    emit_u64(emit, arg, "protocol_errors", t.protocol_errors);
    /* Relaying (scale-out): requests sent to an owner, and those that
     * got no answer from any. */
    emit_u64(emit, arg, "proxied_requests", t.proxied_requests);
    emit_u64(emit, arg, "proxy_failures", t.proxy_failures);
    emit_u64(emit, arg, "node_id", reg.opts ? reg.opts->node_id : 0);
    emit_u64(emit, arg, "mutations", ss.mutations);
    emit_u64(emit, arg, "tombstones", ss.tombstones);
    /* Eviction is local: records evicted values leave (replication on),
     * the table's size, the drops its overflow wrote, and the values
     * drops took out of the set that this node still holds. */
    emit_u64(emit, arg, "evicted_records", ss.evicted_records);
    emit_u64(emit, arg, "evicted_record_capacity", ss.evict_records);
    emit_u64(emit, arg, "drops", ss.drops);
    emit_u64(emit, arg, "drops_written", ss.drops_written);
    emit_u64(emit, arg, "kept_items", ss.kept_items);
    emit_u64(emit, arg, "sketch_symbols", ss.sketch_symbols);
    emit_u64(emit, arg, "applied_remote", ss.applied_remote);
    emit_u64(emit, arg, "stale_remote", ss.stale_remote);
    emit_u64(emit, arg, "swept", ss.swept);
    /* memcached's name: items the expiry sweep (its LRU crawler) looked
     * at. It stays still while nothing held can expire. */
    emit_u64(emit, arg, "crawler_items_checked", ss.sweep_checked);
    /* Mutations forgotten because this node stopped owning their
     * partition (replicas > 0). */
    emit_u64(emit, arg, "dropped", ss.dropped);
    emit_u64(emit, arg, "clock_ticks", ss.clock_ticks);
    stats_group extra[STATS_MAX_GROUPS];
    pthread_mutex_lock(&reg.lock);
    size_t n = reg.ngeneral;
    memcpy(extra, reg.general, n * sizeof(extra[0]));
    pthread_mutex_unlock(&reg.lock);
    for (size_t i = 0; i < n; i++) {
        extra[i].fn(extra[i].arg, emit, arg);
    }
}

/* ------------------------------------------------------ items / slabs */

/*
 * There are no slab classes: items are allocated at their exact size. Both
 * listings report everything as one class, number 1, with the counters
 * that have a true value here; memcached's per-chunk geometry is left out
 * rather than invented.
 */
static void emit_items(stats_emit_fn emit, void *arg)
{
    store_stats ss;
    stats_thread t;
    uint64_t yields;
    uint64_t kicks;

    store_view(&ss);
    sum_threads(&t, &yields, &kicks);
    if (ss.curr_items == 0) {
        return;
    }
    emit_u64(emit, arg, "items:1:number", ss.curr_items);
    emit_u64(emit, arg, "items:1:evicted", ss.evictions);
    emit_u64(emit, arg, "items:1:outofmemory", t.store_no_memory);
    emit_u64(emit, arg, "items:1:reclaimed", ss.reclaimed);
    emit_u64(emit, arg, "items:1:expired_unfetched", ss.expired_unfetched);
    emit_u64(emit, arg, "items:1:evicted_unfetched", ss.evicted_unfetched);
}

static void emit_slabs(stats_emit_fn emit, void *arg)
{
    store_stats ss;
    stats_thread t;
    uint64_t yields;
    uint64_t kicks;

    store_view(&ss);
    sum_threads(&t, &yields, &kicks);
    if (ss.curr_items > 0) {
        emit_u64(emit, arg, "1:used_chunks", ss.curr_items);
        emit_u64(emit, arg, "1:mem_requested", ss.bytes);
        emit_u64(emit, arg, "1:get_hits", t.get_hits);
        emit_u64(emit, arg, "1:cmd_set", t.cmd_set);
        emit_u64(emit, arg, "1:delete_hits", t.delete_hits);
        emit_u64(emit, arg, "1:incr_hits", t.incr_hits);
        emit_u64(emit, arg, "1:decr_hits", t.decr_hits);
        emit_u64(emit, arg, "1:cas_hits", t.cas_hits);
        emit_u64(emit, arg, "1:cas_badval", t.cas_badval);
        emit_u64(emit, arg, "1:touch_hits", t.touch_hits);
    }
    emit_u64(emit, arg, "active_slabs", ss.curr_items > 0 ? 1 : 0);
    emit_u64(emit, arg, "total_malloced", ss.bytes);
}

/* -------------------------------------------------------------- conns */

/* memcached's address form: tcp:1.2.3.4:5, tcp6:[::1]:5, unix:/path. */
static void format_addr(const struct sockaddr *sa, socklen_t len, char *out,
                        size_t outlen)
{
    char host[INET6_ADDRSTRLEN];
    if (len >= sizeof(struct sockaddr_in) && sa->sa_family == AF_INET) {
        const struct sockaddr_in *in = (const void *)sa;
        inet_ntop(AF_INET, &in->sin_addr, host, sizeof(host));
        snprintf(out, outlen, "tcp:%s:%u", host, ntohs(in->sin_port));
    } else if (len >= sizeof(struct sockaddr_in6) &&
               sa->sa_family == AF_INET6) {
        const struct sockaddr_in6 *in6 = (const void *)sa;
        inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof(host));
        snprintf(out, outlen, "tcp6:[%s]:%u", host, ntohs(in6->sin6_port));
    } else if (sa->sa_family == AF_UNIX) {
        const struct sockaddr_un *un = (const void *)sa;
        size_t off = offsetof(struct sockaddr_un, sun_path);
        size_t n = len > off ? strnlen(un->sun_path, len - off) : 0;
        if (n == 0) {
            snprintf(out, outlen, "<AF %d>", AF_UNIX);
        } else {
            snprintf(out, outlen, "unix:%.*s", (int)n, un->sun_path);
        }
    } else {
        snprintf(out, outlen, "<AF %d>", sa->sa_family);
    }
}

typedef struct conn_row {
    int fd;
    bool listening;
    char addr[160];
    char listen_addr[160];
    const char *state;
    uint32_t idle;
} conn_row;

typedef struct conn_rows {
    conn_row *rows;
    size_t n;
    size_t cap;
} conn_rows;

static conn_row *add_row(conn_rows *r)
{
    if (r->n == r->cap) {
        size_t cap = r->cap ? r->cap * 2 : 64;
        conn_row *nr = realloc(r->rows, cap * sizeof(*nr));
        if (nr == NULL) {
            return NULL;
        }
        r->rows = nr;
        r->cap = cap;
    }
    return &r->rows[r->n++];
}

static void collect_conn(void *arg, const conn_info *ci)
{
    conn_row *row = add_row(arg);
    if (row == NULL) {
        return;
    }
    struct sockaddr_storage local;
    socklen_t llen = sizeof(local);
    row->fd = ci->fd;
    row->listening = false;
    row->state = ci->state;
    row->idle = ci->secs_since_last_cmd;
    format_addr(ci->peer, ci->peerlen, row->addr, sizeof(row->addr));
    if (getsockname(ci->fd, (struct sockaddr *)&local, &llen) == 0) {
        format_addr((struct sockaddr *)&local, llen, row->listen_addr,
                    sizeof(row->listen_addr));
        /* A unix client has no name of its own: show the socket path. */
        if (ci->peer->sa_family == AF_UNIX &&
            strncmp(row->addr, "<AF", 3) == 0) {
            memcpy(row->addr, row->listen_addr, sizeof(row->addr));
        }
    } else {
        snprintf(row->listen_addr, sizeof(row->listen_addr), "<unknown>");
    }
}

static int row_cmp(const void *a, const void *b)
{
    const conn_row *x = a;
    const conn_row *y = b;
    return (x->fd > y->fd) - (x->fd < y->fd);
}

static void emit_conns(stats_emit_fn emit, void *arg)
{
    conn_rows rows = {0};
    char name[64];

    pthread_mutex_lock(&reg.lock);
    for (size_t i = 0; i < reg.nlisteners; i++) {
        conn_row *row = add_row(&rows);
        if (row == NULL) {
            break;
        }
        struct sockaddr_storage local;
        socklen_t llen = sizeof(local);
        row->fd = reg.listeners[i];
        row->listening = true;
        row->state = "conn_listening";
        row->idle = 0;
        if (getsockname(row->fd, (struct sockaddr *)&local, &llen) == 0) {
            format_addr((struct sockaddr *)&local, llen, row->addr,
                        sizeof(row->addr));
        } else {
            snprintf(row->addr, sizeof(row->addr), "<unknown>");
        }
    }
    pthread_mutex_unlock(&reg.lock);

    size_t n = worker_count();
    for (size_t i = 0; i < n; i++) {
        worker_conns_each(i, collect_conn, &rows);
    }
    if (rows.n > 1) {
        qsort(rows.rows, rows.n, sizeof(rows.rows[0]), row_cmp);
    }
    for (size_t i = 0; i < rows.n; i++) {
        const conn_row *r = &rows.rows[i];
        snprintf(name, sizeof(name), "%d:addr", r->fd);
        emit(arg, name, r->addr);
        if (!r->listening) {
            snprintf(name, sizeof(name), "%d:listen_addr", r->fd);
            emit(arg, name, r->listen_addr);
        }
        snprintf(name, sizeof(name), "%d:state", r->fd);
        emit(arg, name, r->state);
        snprintf(name, sizeof(name), "%d:secs_since_last_cmd", r->fd);
        emit_u64(emit, arg, name, r->idle);
    }
    free(rows.rows);
}

/* ------------------------------------------------------------- groups */

/* options_emit's lines, with maxbytes as the store has it now. */
struct settings_sink {
    stats_emit_fn emit;
    void *arg;
};

static void settings_line(void *arg, const char *name, const char *value)
{
    struct settings_sink *k = arg;

    if (strcmp(name, "maxbytes") == 0) {
        /* cache_memlimit changes the limit at run time */
        store_stats ss;
        store_view(&ss);
        emit_u64(k->emit, k->arg, name, ss.limit_maxbytes);
        return;
    }
    if (strcmp(name, "evictions") == 0) {
        /* memcached says on/off here, yes/no for the other switches */
        k->emit(k->arg, name, strcmp(value, "yes") == 0 ? "on" : "off");
        return;
    }
    k->emit(k->arg, name, value);
}

static void emit_settings(stats_emit_fn emit, void *arg)
{
    struct settings_sink k = {emit, arg};

    if (reg.opts != NULL) {
        options_emit(reg.opts, settings_line, &k);
    }
}

int stats_emit_group(const char *group, stats_emit_fn emit, void *arg)
{
    if (group == NULL || group[0] == '\0') {
        emit_general(emit, arg);
        return 0;
    }
    if (strcmp(group, "settings") == 0) {
        emit_settings(emit, arg);
        return 0;
    }
    if (strcmp(group, "items") == 0) {
        emit_items(emit, arg);
        return 0;
    }
    if (strcmp(group, "slabs") == 0) {
        emit_slabs(emit, arg);
        return 0;
    }
    if (strcmp(group, "conns") == 0) {
        emit_conns(emit, arg);
        return 0;
    }
    if (strcmp(group, "sizes") == 0) {
        emit(arg, "sizes_status", "disabled");
        return 0;
    }
    stats_group g = {0};
    pthread_mutex_lock(&reg.lock);
    for (size_t i = 0; i < reg.ngroups; i++) {
        if (strcmp(reg.groups[i].name, group) == 0) {
            g = reg.groups[i];
            break;
        }
    }
    pthread_mutex_unlock(&reg.lock);
    if (g.fn != NULL) {
        g.fn(g.arg, emit, arg);
        return 0;
    }
    return -1;
}

void stats_reset(void)
{
    prefix_stats_clear(); /* as memcached: stats reset empties the detail */
    size_t n = worker_count();
    for (size_t i = 0; i < n; i++) {
        stats_thread *t = worker_stats(i);
#define STATS_ZERO(name) __atomic_store_n(&t->name, 0, __ATOMIC_RELAXED);
        STATS_THREAD_COUNTERS(STATS_ZERO)
#undef STATS_ZERO
        worker_reset_counters(i);
    }
    __atomic_store_n(&stats_conn_counters.total_connections, 0,
                     __ATOMIC_RELAXED);
    __atomic_store_n(&stats_conn_counters.rejected_connections, 0,
                     __ATOMIC_RELAXED);
    __atomic_store_n(&stats_conn_counters.listen_disabled_num, 0,
                     __ATOMIC_RELAXED);
    __atomic_store_n(&stats_conn_counters.listen_disabled_us, 0,
                     __ATOMIC_RELAXED);
    pthread_mutex_lock(&reg.lock);
    if (reg.store != NULL) {
        store_get_stats(reg.store, &reg.base);
    }
    pthread_mutex_unlock(&reg.lock);
}
