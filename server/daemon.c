/*
 * daemon.c -- the daemon's machinery (see daemon.h): settings, listeners,
 * signals, pidfile, daemonizing, privileges, the open files limit and the
 * once-a-second sweep.
 *
 * Settings (options) -> store -> worker threads -> listening sockets on the
 * main thread's event loop, plus the once-a-second expiry sweep and the
 * signals. The main thread only accepts connections and hands them to the
 * workers; it never parses a request. What server/ does not know
 * (replication, the registry, placement) comes in through the hooks the
 * composition root passes to daemon_main. The log lines written here name
 * the subsystem "main": the main thread's.
 */
#define _GNU_SOURCE /* pipe2 */
#include "daemon.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <grp.h>
#include <pwd.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <event2/event.h>
#include <event2/listener.h>
#ifdef HAVE_SYSTEMD
#include <systemd/sd-daemon.h>
#endif

#include "authfile.h"
#include "log.h"
#include "memtrim.h"
#include "metrics.h"
#include "stats_registry.h"
#include "tls.h"
#include "watch.h"
#include "worker.h"

#define MAX_LISTENERS 32

/* Exit status when the daemon cannot start (bind, memory, threads). */
#define EXIT_STARTUP 1

static const char *const prog = "ribltcached";

typedef struct daemon_state {
    options opts;
    proto_config pcfg;
    authfile *sasl_auth; /* -S */
    authfile *auth;      /* -Y */
    tls_server *tls;     /* -Z */
    store *store;
    struct event_base *base;
    struct evconnlistener *listeners[MAX_LISTENERS];
    size_t nlisteners;
    struct event *ev_term;
    struct event *ev_int;
    struct event *ev_hup;
    struct event *ev_tick;
    struct event *ev_shutdown;
    struct event *ev_relisten;
    int shutdown_pipe[2];
    metrics *metrics;
    bool unix_bound;
    bool pid_written;
    daemon_hooks hooks;
} daemon_state;

static daemon_state d = {.shutdown_pipe = {-1, -1}};

static void die(int status, const char *fmt, ...)
    __attribute__((format(printf, 2, 3), noreturn));

static void die(int status, const char *fmt, ...)
{
    va_list ap;
    fprintf(stderr, "%s: ", prog);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    exit(status);
}

/* ---------------------------------------------------------- users */

/* Loads an authfile (-S's sasl_file, -Y's auth_file), or says why not. */
static authfile *load_users(const char *what, const char *path)
{
    int rc, line = 0;
    authfile *af = authfile_open(path, &rc, &line);
    if (af == NULL)
        fprintf(stderr, "%s: %s %s: %s (line %d)\n", prog, what, path,
                authfile_strerror(rc), line);
    return af;
}

/* SIGHUP: reads an authfile again; a broken file keeps the old users. */
static void reload_users(authfile *af, const char *what, const char *path)
{
    int line = 0, rc;

    if (af == NULL)
        return;
    rc = authfile_reload(af, path, &line);
    if (rc != AUTHFILE_OK)
        LOG(LOG_LEVEL_ERROR, "main",
            "SIGHUP: %s %s not reloaded (line %d: %s); the old entries stay",
            what, path, line, authfile_strerror(rc));
    else
        LOG(LOG_LEVEL_INFO, "main", "SIGHUP: %s %s reloaded", what, path);
}

/* ---------------------------------------------------------- TLS */

static tls_settings tls_settings_of(const options *o)
{
    tls_settings ts = {
        .chain_cert = o->ssl_chain_cert,
        .key = o->ssl_key,
        .keyformat = (int)o->ssl_keyformat,
        .ca_cert = o->ssl_ca_cert,
        .verify_mode = (int)o->ssl_verify_mode,
        .ciphers = o->ssl_ciphers,
        .min_version = (int)o->ssl_min_version,
        .session_cache = o->ssl_session_cache,
        .kernel_tls = o->ssl_kernel_tls,
    };
    return ts;
}

/*
 * SIGHUP and `refresh_certs`: a new TLS context from the files; a file
 * that does not load keeps the old context. Returns 0, or -1 with the
 * reason in err.
 */
static int reload_certs(char *err, size_t errlen)
{
    int hooked = 1;
    char herr[512] = "";
    if (d.hooks.reload_certs != NULL)
        hooked = d.hooks.reload_certs(d.hooks.arg, herr, sizeof(herr));
    if (hooked < 0)
        LOG(LOG_LEVEL_ERROR, "tls",
            "peer certificates not reloaded (%s); the old ones stay", herr);
    else if (hooked == 0)
        LOG(LOG_LEVEL_INFO, "tls", "peer certificates reloaded");
    if (d.tls == NULL) {
        if (hooked == 1)
            snprintf(err, errlen, "TLS not enabled");
        else
            snprintf(err, errlen, "%s", herr);
        return hooked == 0 ? 0 : -1;
    }
    if (tls_server_reload(d.tls, err, errlen) != TLS_OK) {
        LOG(LOG_LEVEL_ERROR, "tls",
            "certificates not reloaded (%s); the old ones stay", err);
        return -1;
    }
    LOG(LOG_LEVEL_INFO, "tls", "certificates reloaded from %s",
        d.opts.ssl_chain_cert);
    if (hooked < 0) {
        snprintf(err, errlen, "%s", herr);
        return -1;
    }
    return 0;
}

/* TLS lines of the general `stats` listing, as memcached names them. */
static void tls_stats(void *arg, stats_emit_fn emit, void *emit_arg)
{
    char val[32];
    tls_server_stats st;
    (void)arg;
    tls_server_get_stats(d.tls, &st);
    if (tls_server_session_cache(d.tls)) {
        snprintf(val, sizeof(val), "%llu",
                 (unsigned long long)st.new_sessions);
        emit(emit_arg, "ssl_new_sessions", val);
    }
    snprintf(val, sizeof(val), "%llu",
             (unsigned long long)st.handshake_errors);
    emit(emit_arg, "ssl_handshake_errors", val);
    long long since = (long long)time(NULL) - st.last_refresh;
    snprintf(val, sizeof(val), "%lld", since < 0 ? 0 : since);
    emit(emit_arg, "time_since_server_cert_refresh", val);
}

/* ---------------------------------------------------------- accepting */

/* arg is non-NULL on a TLS listener. */
static void accept_cb(struct evconnlistener *l, evutil_socket_t fd,
                      struct sockaddr *sa, int salen, void *arg)
{
    static const char too_many[] = "ERROR Too many open connections\r\n";
    /* A TLS client gets the refusal in its own form: a fatal
     * internal_error alert record (type 21, version 3.1, length 2). */
    static const unsigned char tls_too_many[] = {21, 3, 1, 0, 2, 2, 80};
    (void)l;

    uint64_t before = STATS_CONN_ADD(curr_connections, 1);
    if (before >= d.opts.maxconns) {
        STATS_CONN_SUB(curr_connections, 1);
        STATS_CONN_ADD(rejected_connections, 1);
        /* As memcached: tell the client why, then hang up. A TLS client
         * that is told nothing fails on its next write; told with an
         * alert, it gives up without writing. */
        ssize_t n = arg == NULL ? send(fd, too_many, sizeof(too_many) - 1,
                                       MSG_NOSIGNAL | MSG_DONTWAIT)
                                : send(fd, tls_too_many, sizeof(tls_too_many),
                                       MSG_NOSIGNAL | MSG_DONTWAIT);
        (void)n;
        LOG(LOG_LEVEL_WARN, "main",
            "too many open connections (maxconns %llu): refused one",
            (unsigned long long)d.opts.maxconns);
        close(fd);
        return;
    }
    STATS_CONN_ADD(total_connections, 1);
    if (sa->sa_family == AF_INET || sa->sa_family == AF_INET6) {
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    }
    worker_dispatch(fd, sa, (socklen_t)salen, arg != NULL);
}

/* When the listeners were paused (monotonic µs); 0 while they accept. */
static uint64_t paused_since_us;

static uint64_t mono_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

static void relisten_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    (void)arg;
    for (size_t i = 0; i < d.nlisteners; i++) {
        evconnlistener_enable(d.listeners[i]);
    }
    if (paused_since_us != 0) {
        STATS_CONN_ADD(listen_disabled_us, mono_us() - paused_since_us);
        paused_since_us = 0;
    }
    STATS_CONN_SET(accepting_conns, 1);
}

/* accept() failed (e.g. out of file descriptors): pause accepting briefly
 * instead of spinning on a listener that stays readable. */
static void accept_error_cb(struct evconnlistener *l, void *arg)
{
    int err = EVUTIL_SOCKET_ERROR();
    (void)arg;
    LOG(LOG_LEVEL_WARN, "main", "accept: %s",
        evutil_socket_error_to_string(err));
    if (err == EMFILE || err == ENFILE || err == ENOBUFS || err == ENOMEM) {
        struct timeval pause = {0, 100 * 1000};
        STATS_CONN_ADD(listen_disabled_num, 1);
        STATS_CONN_SET(accepting_conns, 0);
        if (paused_since_us == 0)
            paused_since_us = mono_us();
        evconnlistener_disable(l);
        event_add(d.ev_relisten, &pause);
    }
}

static void add_listener(struct evconnlistener *l)
{
    evconnlistener_set_error_cb(l, accept_error_cb);
    d.listeners[d.nlisteners++] = l;
    stats_registry_add_listener(evconnlistener_get_fd(l));
}

/*
 * Splits one -l entry (options_listen_entry). Sets *tls (the listener
 * speaks TLS) and *port (NULL = -p's). Returns the host, or NULL when
 * malformed.
 */
static char *split_listen(char *entry, bool *tls, char **port)
{
    static const char notls[] = OPTIONS_NOTLS_PREFIX;
    if (!d.opts.ssl_enabled && strncmp(entry, notls, sizeof(notls) - 1) == 0) {
        die(EXIT_STARTUP, "-l %s: notls: is valid only with -Z", entry);
    }
    bool plain;
    char *host = options_listen_entry(entry, &plain, port);
    *tls = d.opts.ssl_enabled && !plain;
    return host;
}

/* Binds every address of the comma-separated -l list. */
static void listen_tcp(void)
{
    char *list = strdup(d.opts.inter);
    char dport[16];
    char *save = NULL;
    if (list == NULL) {
        die(EXIT_STARTUP, "out of memory");
    }
    snprintf(dport, sizeof(dport), "%u", (unsigned)d.opts.tcpport);
    for (char *entry = strtok_r(list, ",;", &save); entry != NULL;
         entry = strtok_r(NULL, ",;", &save)) {
        bool tls;
        char *port;
        char *host = split_listen(entry, &tls, &port);
        if (host == NULL ||
            (port != NULL && (port[0] == '\0' ||
                              strspn(port, "0123456789") != strlen(port)))) {
            die(EXIT_STARTUP,
                "bad listen address '%s' (want "
                "[notls:]host[:port])",
                entry);
        }
        if (port == NULL) {
            port = dport;
        }
        struct addrinfo hints = {0};
        struct addrinfo *res = NULL;
        hints.ai_family = AF_UNSPEC;
        hints.ai_socktype = SOCK_STREAM;
        hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
        int gai = getaddrinfo(host, port, &hints, &res);
        if (gai != 0) {
            die(EXIT_STARTUP, "cannot resolve listen address '%s': %s", host,
                gai_strerror(gai));
        }
        for (struct addrinfo *ai = res; ai != NULL; ai = ai->ai_next) {
            if (d.nlisteners == MAX_LISTENERS) {
                die(EXIT_STARTUP, "too many listen addresses");
            }
            struct evconnlistener *l = evconnlistener_new_bind(
                d.base, accept_cb, tls ? (void *)d.tls : NULL,
                LEV_OPT_CLOSE_ON_FREE | LEV_OPT_REUSEABLE |
                    LEV_OPT_CLOSE_ON_EXEC,
                (int)d.opts.tcp_backlog, ai->ai_addr, (int)ai->ai_addrlen);
            if (l == NULL) {
                die(EXIT_STARTUP, "failed to listen on %s port %s: %s", host,
                    port, strerror(errno));
            }
            add_listener(l);
        }
        freeaddrinfo(res);
    }
    free(list);
}

/*
 * MEMCACHED_PORT_FILENAME (memcached's, used by tools that start it on
 * port 0): the ports bound, one "TCP INET: <port>" or "TCP INET6: <port>"
 * line per listener, written to NAME.lck and renamed to NAME.
 */
static void write_port_file(void)
{
    const char *name = getenv("MEMCACHED_PORT_FILENAME");
    char tmp[4096];

    if (name == NULL || name[0] == '\0') {
        return;
    }
    if ((size_t)snprintf(tmp, sizeof(tmp), "%s.lck", name) >= sizeof(tmp)) {
        die(EXIT_STARTUP, "MEMCACHED_PORT_FILENAME is too long");
    }
    FILE *f = fopen(tmp, "w");
    if (f == NULL) {
        die(EXIT_STARTUP, "cannot write %s: %s", tmp, strerror(errno));
    }
    for (size_t i = 0; i < d.nlisteners; i++) {
        struct sockaddr_storage ss;
        socklen_t sl = sizeof(ss);
        int fd = evconnlistener_get_fd(d.listeners[i]);
        if (getsockname(fd, (struct sockaddr *)&ss, &sl) != 0) {
            continue;
        }
        if (ss.ss_family == AF_INET) {
            fprintf(f, "TCP INET: %u\n",
                    ntohs(((struct sockaddr_in *)&ss)->sin_port));
        } else if (ss.ss_family == AF_INET6) {
            fprintf(f, "TCP INET6: %u\n",
                    ntohs(((struct sockaddr_in6 *)&ss)->sin6_port));
        }
    }
    if (fclose(f) != 0 || rename(tmp, name) != 0) {
        die(EXIT_STARTUP, "cannot write %s: %s", name, strerror(errno));
    }
}

static void listen_unix(void)
{
    const char *path = d.opts.domain_socket;
    struct sockaddr_un sun = {0};
    struct stat st;

    sun.sun_family = AF_UNIX;
    memcpy(sun.sun_path, path, strlen(path) + 1);
    /* A socket left by an earlier run is replaced; anything else is not. */
    if (lstat(path, &st) == 0) {
        if (!S_ISSOCK(st.st_mode)) {
            die(EXIT_STARTUP,
                "unix socket path %s exists and is not a "
                "socket",
                path);
        }
        unlink(path);
    }
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        die(EXIT_STARTUP, "socket: %s", strerror(errno));
    }
    mode_t old = umask((mode_t)(~d.opts.umask & 0777));
    int rc = bind(fd, (struct sockaddr *)&sun, sizeof(sun));
    int err = errno;
    umask(old);
    if (rc != 0) {
        die(EXIT_STARTUP, "failed to bind unix socket %s: %s", path,
            strerror(err));
    }
    d.unix_bound = true;
    if (listen(fd, (int)d.opts.tcp_backlog) != 0) {
        die(EXIT_STARTUP, "listen on %s: %s", path, strerror(errno));
    }
    struct evconnlistener *l = evconnlistener_new(
        d.base, accept_cb, NULL, LEV_OPT_CLOSE_ON_FREE | LEV_OPT_CLOSE_ON_EXEC,
        0, fd);
    if (l == NULL) {
        die(EXIT_STARTUP, "cannot watch unix socket %s", path);
    }
    add_listener(l);
}

/* ------------------------------------------------- timers and signals */

/* Unused allocator pages the daemon leaves resident before it returns them
 * (memtrim.h). 2 MiB: under steady writes and eviction the allocator's
 * unused pages stay below it (a -m 64 node made as many madvise calls
 * with it as without it), so it purges after a burst's memory was freed,
 * and what it leaves is a quarter of the 8 MiB allowance above -m. */
#define TRIM_SLACK (2u << 20)

static void tick_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    (void)arg;
    store_sweep(d.store, (size_t)d.opts.sweep_budget);
    memtrim_tick(TRIM_SLACK);
}

/*
 * SIGHUP: what logrotate and `systemctl reload` send. The daemon keeps
 * serving; there is no log file to reopen (logging goes to stderr), so it
 * only says it was asked.
 */
static void hup_cb(evutil_socket_t sig, short what, void *arg)
{
    (void)sig;
    (void)what;
    (void)arg;
    reload_users(d.auth, "auth_file", d.opts.auth_file);
    reload_users(d.sasl_auth, "sasl_file", d.opts.sasl_file);
    if (d.tls != NULL || d.hooks.reload_certs != NULL) {
        char err[512];
        reload_certs(err, sizeof(err));
    }
    if (!d.opts.log_file) {
        LOG(LOG_LEVEL_INFO, "main",
            "SIGHUP: nothing to reopen, still serving");
        return;
    }
    if (log_open_file(d.opts.log_file) != 0)
        LOG(LOG_LEVEL_ERROR, "main", "SIGHUP: cannot reopen log_file %s: %s",
            d.opts.log_file, strerror(errno));
    else
        LOG(LOG_LEVEL_INFO, "main", "SIGHUP: log_file %s reopened",
            d.opts.log_file);
}

/*
 * Descriptors beyond the client limit: listeners, peer and registry
 * links, pipes and event descriptors of the threads.
 */
#define NOFILE_RESERVE 256

/*
 * One line naming the memcached options given that have no effect here
 * (accepted so that an existing command line or unit file starts).
 */
static void warn_ignored(void)
{
    char line[1024];
    size_t n = 0;
    const options *o = &d.opts;
#define IGN_STR(field, flag)                                                  \
    if (o->field != NULL && n < sizeof(line))                                 \
        n += (size_t)snprintf(line + n, sizeof(line) - n, " %s %s", flag,     \
                              o->field);
#define IGN_BOOL(field, flag)                                                 \
    if (o->field && n < sizeof(line))                                         \
        n += (size_t)snprintf(line + n, sizeof(line) - n, " %s", flag);
    IGN_STR(slab_growth_factor, "-f")
    IGN_STR(slab_min_size, "-n")
    IGN_STR(prefix_delimiter, "-D")
    IGN_STR(memory_file, "-e")
    IGN_STR(napi_ids, "-N")
    IGN_BOOL(enable_coredumps, "-r")
    IGN_BOOL(lock_memory, "-k")
    IGN_BOOL(large_memory_pages, "-L")
    IGN_STR(extended_ignored, "-o")
#undef IGN_STR
#undef IGN_BOOL
    if (o->udpport != 0 && n < sizeof(line)) {
        n += (size_t)snprintf(line + n, sizeof(line) - n, " -U %llu (no UDP)",
                              (unsigned long long)o->udpport);
    }
    if (n > 0) {
        LOG(LOG_LEVEL_WARN, "main",
            "memcached options accepted with no effect here:%s", line);
    }
}

/*
 * -u: once every port is bound and the pidfile written, a daemon started
 * as root continues as this user (its groups too), as memcached does. Not
 * root: nothing to drop, -u is ignored.
 */
static void drop_privileges(void)
{
    if (d.opts.user == NULL || geteuid() != 0) {
        return;
    }
    struct passwd *pw = getpwnam(d.opts.user);
    if (pw == NULL) {
        die(EXIT_STARTUP, "-u: no user '%s'", d.opts.user);
    }
    if (initgroups(pw->pw_name, pw->pw_gid) != 0 || setgid(pw->pw_gid) != 0 ||
        setuid(pw->pw_uid) != 0) {
        die(EXIT_STARTUP, "-u %s: cannot drop privileges: %s", d.opts.user,
            strerror(errno));
    }
    LOG(LOG_LEVEL_INFO, "main", "running as %s (uid %u)", pw->pw_name,
        (unsigned)pw->pw_uid);
}

/* Sets RLIMIT_NOFILE's soft limit (and the hard one, if below) to n. */
static int nofile_set(struct rlimit rl, rlim_t n)
{
    if (rl.rlim_max != RLIM_INFINITY && rl.rlim_max < n) {
        rl.rlim_max = n;
    }
    rl.rlim_cur = n;
    return setrlimit(RLIMIT_NOFILE, &rl);
}

/*
 * Makes RLIMIT_NOFILE hold -c clients and the daemon's own descriptors,
 * raising the soft limit, and the hard one when allowed, as memcached
 * does. When -c plus the reserve cannot be had, -c alone will do (what
 * memcached asks for); when not even that, the daemon refuses to start
 * rather than leave clients beyond the limit hanging.
 */
static void raise_nofile(void)
{
    struct rlimit rl;
    rlim_t want = (rlim_t)d.opts.maxconns + NOFILE_RESERVE;

    if (getrlimit(RLIMIT_NOFILE, &rl) != 0) {
        die(EXIT_STARTUP, "getrlimit(RLIMIT_NOFILE): %s", strerror(errno));
    }
    if (rl.rlim_cur == RLIM_INFINITY || rl.rlim_cur >= want) {
        return;
    }
    if (nofile_set(rl, want) == 0) {
        return;
    }
    if (rl.rlim_cur >= (rlim_t)d.opts.maxconns ||
        nofile_set(rl, (rlim_t)d.opts.maxconns) == 0) {
        return;
    }
    die(EXIT_STARTUP,
        "cannot raise the open files limit (%llu) to -c %llu: %s (start as "
        "root, raise the limit, or ask for a smaller -c)",
        (unsigned long long)rl.rlim_cur, (unsigned long long)d.opts.maxconns,
        strerror(errno));
}

static void signal_cb(evutil_socket_t sig, short what, void *arg)
{
    (void)what;
    (void)arg;
    LOG(LOG_LEVEL_INFO, "main", "signal %d, shutting down", (int)sig);
    event_base_loopbreak(d.base);
}

/* Called on a worker thread when a client sent `shutdown`. */
void daemon_wake_acks(void)
{
    worker_pool_wake_acks();
}

static void request_shutdown(void *arg)
{
    (void)arg;
    char b = 's';
    ssize_t n = write(d.shutdown_pipe[1], &b, 1);
    (void)n;
}

static void shutdown_cb(evutil_socket_t fd, short what, void *arg)
{
    char buf[16];
    ssize_t n = read(fd, buf, sizeof(buf));
    (void)n;
    (void)what;
    (void)arg;
    LOG(LOG_LEVEL_INFO, "main", "shutdown requested by a client");
    event_base_loopbreak(d.base);
}

/* ----------------------------------------------------------- lifetime */

static void write_pidfile(void)
{
    if (d.opts.pidfile == NULL) {
        return;
    }
    FILE *f = fopen(d.opts.pidfile, "w");
    if (f == NULL) {
        die(EXIT_STARTUP, "cannot write pidfile %s: %s", d.opts.pidfile,
            strerror(errno));
    }
    fprintf(f, "%ld\n", (long)getpid());
    if (fclose(f) != 0) {
        die(EXIT_STARTUP, "cannot write pidfile %s", d.opts.pidfile);
    }
    d.pid_written = true;
}

/*
 * Detaches from the terminal. The parent waits until the child reports
 * that it is serving (exit 0) or dies trying (exit 1), so whoever started
 * the daemon learns whether it started. stderr stays open until then so
 * that start-up errors are seen; see daemon_ready().
 */
static int ready_fd = -1;

static void daemonize(void)
{
    int p[2];
    if (pipe2(p, O_CLOEXEC) != 0) {
        die(EXIT_STARTUP, "pipe: %s", strerror(errno));
    }
    pid_t pid = fork();
    if (pid < 0) {
        die(EXIT_STARTUP, "fork: %s", strerror(errno));
    }
    if (pid > 0) {
        char ok = 0;
        close(p[1]);
        ssize_t n;
        do {
            n = read(p[0], &ok, 1);
        } while (n < 0 && errno == EINTR);
        _exit(n == 1 && ok == 'r' ? 0 : EXIT_STARTUP);
    }
    close(p[0]);
    ready_fd = p[1];
    if (setsid() < 0) {
        die(EXIT_STARTUP, "setsid: %s", strerror(errno));
    }
    int null = open("/dev/null", O_RDWR);
    if (null >= 0) {
        dup2(null, STDIN_FILENO);
        dup2(null, STDOUT_FILENO);
        if (null > STDERR_FILENO) {
            close(null);
        }
    }
}

/* Tells the waiting parent that start-up succeeded. Without -v, stderr is
 * let go as well: nothing more is written there. */
static void daemon_ready(void)
{
#ifdef HAVE_SYSTEMD
    /* Under systemd (Type=notify): serving from now on. A no-op when
     * NOTIFY_SOCKET is not set. */
    sd_notifyf(0, "READY=1\nSTATUS=serving on port %llu\nMAINPID=%lu",
               (unsigned long long)d.opts.tcpport, (unsigned long)getpid());
#endif
    if (ready_fd < 0) {
        return;
    }
    char ok = 'r';
    ssize_t n = write(ready_fd, &ok, 1);
    (void)n;
    close(ready_fd);
    ready_fd = -1;
    if (d.opts.verbosity == 0 && !d.opts.log_file) {
        int null = open("/dev/null", O_WRONLY);
        if (null >= 0) {
            dup2(null, STDERR_FILENO);
            close(null);
        }
    }
}

static void start(void)
{
    int err = 0;
    const daemon_hooks *h = &d.hooks;
    char herr[1024] = "";
    store_options so;

    store_options_default(&so);
    so.node_id = (uint32_t)d.opts.node_id;
    so.memory_limit = (size_t)d.opts.maxbytes;
    so.item_size_max = (size_t)d.opts.item_size_max;
    /* Without replication there is nothing to reconcile: deletes remove
     * the key outright and an expired value goes at the next sweep, as in
     * memcached, instead of staying tombstone_grace seconds. */
    so.tombstone_grace =
        d.opts.repl_port != 0 ? (uint32_t)d.opts.tombstone_grace : 0;
    so.no_evict = !d.opts.evictions;
    so.evict_fn = watch_eviction; /* silent while nobody watches */
    watch_set_buffer((size_t)d.opts.watcher_logbuf_size * 1024);
    /* Records of evicted values exist for peers to agree with: a node
     * without replication evicts like memcached, leaving nothing. */
    if (d.opts.repl_port != 0)
        so.evict_record_bytes =
            so.memory_limit / 100 * (size_t)d.opts.evict_record_share;
    /* Only rounds read the sketch: without replication it is not kept. */
    so.sketch_symbols =
        d.opts.repl_port != 0 ? (size_t)d.opts.sketch_symbols : 0;
    /* Portably a power-sum toggle costs about 16 times what the CPU's
     * carry-less multiply does (riblt_psum.h): there, they are not kept. */
    so.psums = d.opts.power_sums && riblt_psum_level() != RIBLT_PSUM_PORTABLE;
    if (d.opts.power_sums && d.opts.repl_port != 0 && !so.psums)
        LOG(LOG_LEVEL_INFO, "store",
            "power sums off: this CPU has no carry-less multiply");
    so.hash_power = (unsigned)d.opts.hashpower_init;
    if (h->store_options != NULL &&
        h->store_options(h->arg, &d.opts, &so, herr, sizeof(herr)) != 0) {
        die(EXIT_STARTUP, "%s", herr);
    }
    d.store = store_create(&so, &err);
    if (d.store == NULL) {
        die(EXIT_STARTUP, "cannot create the store: %s", store_strerror(err));
    }
    {
        /* -m counts the key table (memcached's does not): say so when a
         * large hashpower leaves items little of it. */
        store_stats ss;
        store_get_stats(d.store, &ss);
        if (so.memory_limit != 0 && ss.hash_bytes >= so.memory_limit / 4)
            LOG(LOG_LEVEL_WARN, "main",
                "hashpower %u: the key table takes %llu KiB of the %llu KiB "
                "of -m, which counts it; items get the rest%s",
                so.hash_power, (unsigned long long)(ss.hash_bytes >> 10),
                (unsigned long long)(so.memory_limit >> 10),
                ss.hash_bytes >= so.memory_limit ? " (none: every write will "
                                                   "fail for want of memory)"
                                                 : "");
    }

    d.pcfg.item_size_max = (size_t)d.opts.item_size_max;
    d.pcfg.stats_list = stats_emit_group;
    d.pcfg.dump_disabled = d.opts.dump_disabled;
    d.pcfg.watch_disabled = d.opts.watch_disabled;
    d.pcfg.reqs_per_event = (unsigned)d.opts.reqs_per_event;
    d.pcfg.stats_reset = stats_reset;
    d.pcfg.sasl = d.opts.auth_enabled_sasl;
    d.pcfg.sasl_auth = d.sasl_auth;
    d.pcfg.auth = d.auth;
    d.pcfg.flush_enabled = d.opts.flush_enabled;
    d.pcfg.shutdown_enabled = d.opts.shutdown_command;
    d.pcfg.cas_enabled = d.opts.cas_enabled;
    d.pcfg.max_line = (size_t)d.opts.max_line;
    d.pcfg.output_max = (size_t)d.opts.output_buffer_max;
    d.pcfg.version = RIBLTCACHE_WIRE_VERSION;
    d.pcfg.refresh_certs = reload_certs;
    if (d.opts.ssl_enabled) {
        tls_settings tset = tls_settings_of(&d.opts);
        char terr[512];
        if (tls_server_create(&tset, &d.tls, terr, sizeof(terr)) != TLS_OK) {
            die(EXIT_STARTUP, "TLS: %s", terr);
        }
    }
    /* With -Z, relays reach the other nodes' client ports over TLS. */
    d.pcfg.relay_tls = d.tls;

    stats_registry_setup(&d.opts, d.store);
    if (d.tls != NULL) {
        stats_register_general(tls_stats, NULL);
    }
    if (h->setup != NULL &&
        h->setup(h->arg, &d.opts, d.store, &d.pcfg, herr, sizeof(herr)) != 0) {
        die(EXIT_STARTUP, "%s", herr);
    }

    d.base = event_base_new();
    if (d.base == NULL) {
        die(EXIT_STARTUP, "cannot create the event loop");
    }
    if (pipe2(d.shutdown_pipe, O_CLOEXEC | O_NONBLOCK) != 0) {
        die(EXIT_STARTUP, "pipe: %s", strerror(errno));
    }

    worker_setup ws = {
        .nthreads = (size_t)d.opts.num_threads,
        .store = d.store,
        .pcfg = &d.pcfg,
        .verbose = (int)d.opts.verbosity,
        .reqs_per_event = (unsigned)d.opts.reqs_per_event,
        .nap_us = (unsigned)d.opts.worker_nap_us,
        .output_max = (size_t)d.opts.output_buffer_max,
        .input_max =
            2 * (size_t)d.opts.item_size_max + (size_t)d.opts.max_line + 4096,
        .tls = d.tls,
        .tls_wbuf_size = (size_t)d.opts.ssl_wbuf_size,
        .proto_mode = (int)d.opts.binding_protocol,
        .idle_timeout = (uint32_t)d.opts.idle_timeout,
        .request_shutdown = request_shutdown,
        .shutdown_arg = NULL,
    };
    int rc = worker_pool_start(&ws);
    if (rc != 0) {
        die(EXIT_STARTUP, "cannot start %u worker threads",
            (unsigned)ws.nthreads);
    }

    /* The signals are ours before the first client can connect: a SIGHUP
     * sent once the port answers (a reload right after start) would
     * otherwise find it still ignored, as it is until here. */
    d.ev_term = evsignal_new(d.base, SIGTERM, signal_cb, NULL);
    d.ev_int = evsignal_new(d.base, SIGINT, signal_cb, NULL);
    d.ev_hup = evsignal_new(d.base, SIGHUP, hup_cb, NULL);
    if (d.ev_term == NULL || d.ev_int == NULL || d.ev_hup == NULL ||
        event_add(d.ev_term, NULL) != 0 || event_add(d.ev_int, NULL) != 0 ||
        event_add(d.ev_hup, NULL) != 0) {
        die(EXIT_STARTUP, "cannot set up the main event loop");
    }
    if (d.opts.domain_socket != NULL) {
        listen_unix();
    } else {
        listen_tcp();
    }
    if (h->run != NULL && h->run(h->arg, herr, sizeof(herr)) != 0) {
        die(EXIT_STARTUP, "%s", herr);
    }
    STATS_CONN_SET(accepting_conns, 1);

    struct timeval one = {1, 0};
    d.ev_tick = event_new(d.base, -1, EV_PERSIST, tick_cb, NULL);
    d.ev_shutdown = event_new(d.base, d.shutdown_pipe[0], EV_READ | EV_PERSIST,
                              shutdown_cb, NULL);
    d.ev_relisten = evtimer_new(d.base, relisten_cb, NULL);
    if (d.ev_tick == NULL || d.ev_shutdown == NULL || d.ev_relisten == NULL ||
        event_add(d.ev_tick, &one) != 0 ||
        event_add(d.ev_shutdown, NULL) != 0) {
        die(EXIT_STARTUP, "cannot set up the main event loop");
    }
    if (d.opts.metrics_port != 0) {
        char merr[256];
        d.metrics =
            metrics_start(d.base, d.opts.metrics_listen,
                          (uint16_t)d.opts.metrics_port, merr, sizeof(merr));
        if (!d.metrics)
            die(EXIT_STARTUP, "%s", merr);
    }
    write_pidfile();
    write_port_file();
    drop_privileges();
    if (d.opts.domain_socket)
        LOG(LOG_LEVEL_INFO, "main",
            "%s %s: node %llu, listening on unix socket %s, %llu MB, %u "
            "threads",
            prog, RIBLTCACHE_VERSION, (unsigned long long)d.opts.node_id,
            d.opts.domain_socket, (unsigned long long)(d.opts.maxbytes >> 20),
            (unsigned)ws.nthreads);
    else
        LOG(LOG_LEVEL_INFO, "main",
            "%s %s: node %llu, listening on %s port %llu, %llu MB, %u "
            "threads; peers: %s%s%s%s",
            prog, RIBLTCACHE_VERSION, (unsigned long long)d.opts.node_id,
            d.opts.inter, (unsigned long long)d.opts.tcpport,
            (unsigned long long)(d.opts.maxbytes >> 20), (unsigned)ws.nthreads,
            d.opts.repl_port == 0 ? "none (replication off)"
            : d.opts.peers        ? d.opts.peers
                                  : "",
            d.opts.repl_port != 0 && d.opts.registry ? " registry " : "",
            d.opts.repl_port != 0 && d.opts.registry ? d.opts.registry : "",
            d.opts.repl_port != 0 && !d.opts.peers && !d.opts.registry
                ? "none configured"
                : "");
}

static void stop(void)
{
#ifdef HAVE_SYSTEMD
    sd_notify(0, "STOPPING=1");
#endif
    /* Stop accepting first, then let every worker finish its clients. */
    for (size_t i = 0; i < d.nlisteners; i++) {
        evconnlistener_free(d.listeners[i]);
    }
    d.nlisteners = 0;
    metrics_stop(d.metrics);
    d.metrics = NULL;
    if (d.unix_bound) {
        unlink(d.opts.domain_socket);
    }
    worker_pool_stop();
    /* After the workers: no client request runs any more. */
    if (d.hooks.stop != NULL) {
        d.hooks.stop(d.hooks.arg);
    }
    stats_registry_teardown();
    event_free(d.ev_term);
    event_free(d.ev_int);
    event_free(d.ev_hup);
    event_free(d.ev_tick);
    event_free(d.ev_shutdown);
    event_free(d.ev_relisten);
    event_base_free(d.base);
    close(d.shutdown_pipe[0]);
    close(d.shutdown_pipe[1]);
    store_destroy(d.store);
    if (d.pid_written) {
        unlink(d.opts.pidfile);
    }
    authfile_close(d.sasl_auth);
    authfile_close(d.auth);
    tls_server_destroy(d.tls);
    d.tls = NULL;
    d.sasl_auth = NULL;
    d.auth = NULL;
    options_free(&d.opts);
}

int daemon_main(int argc, char **argv, const daemon_hooks *hooks)
{
    char err[1024];
    enum options_action action;

    if (hooks != NULL) {
        d.hooks = *hooks;
    }

    int rc =
        options_parse_argv(&d.opts, argc, argv, &action, err, sizeof(err));
    if (rc != 0) {
        fprintf(stderr, "%s: %s\nTry '%s --help' for the options.\n", prog,
                err, prog);
        options_free(&d.opts);
        return rc == OPTIONS_ERR_USAGE ? OPTIONS_EXIT_USAGE : EXIT_STARTUP;
    }
    if (action == OPTIONS_HELP) {
        options_print_help(stdout, prog);
        options_free(&d.opts);
        return 0;
    }
    if (action == OPTIONS_MAN) {
        options_print_man(stdout);
        options_free(&d.opts);
        return 0;
    }
    if (action == OPTIONS_VERSION) {
        printf("%s %s\n", prog, RIBLTCACHE_VERSION);
        options_free(&d.opts);
        return 0;
    }
    int level = log_level_parse(d.opts.log_level);
    if (level < 0) {
        fprintf(stderr,
                "%s: log_level '%s': expected error, warn, info or debug\n",
                prog, d.opts.log_level ? d.opts.log_level : "");
        options_free(&d.opts);
        return OPTIONS_EXIT_USAGE;
    }
    if (d.opts.verbosity > 0 && level < LOG_LEVEL_WARN + (int)d.opts.verbosity)
        level = LOG_LEVEL_WARN + (int)d.opts.verbosity;
    log_setup(prog, level, d.opts.log_syslog);
    if (log_open_file(d.opts.log_file) != 0) {
        fprintf(stderr, "%s: log_file %s: %s\n", prog, d.opts.log_file,
                strerror(errno));
        options_free(&d.opts);
        return EXIT_STARTUP;
    }
    if ((d.opts.auth_enabled_sasl &&
         (d.sasl_auth = load_users("sasl_file", d.opts.sasl_file)) == NULL) ||
        (d.opts.auth_file != NULL &&
         (d.auth = load_users("auth_file", d.opts.auth_file)) == NULL)) {
        authfile_close(d.sasl_auth);
        options_free(&d.opts);
        return OPTIONS_EXIT_USAGE;
    }

    signal(SIGPIPE, SIG_IGN);
    /* Until the event loop takes SIGHUP over, it must not kill us. */
    signal(SIGHUP, SIG_IGN);
    raise_nofile();
    warn_ignored();
    if (d.opts.daemonize) {
        daemonize();
    }
    start();
    daemon_ready();
    event_base_dispatch(d.base);
    stop();
    return 0;
}
