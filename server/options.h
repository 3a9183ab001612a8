/*
 * options.h -- the daemon's settings: one table, three readers.
 *
 * Every setting is declared once in OPTIONS_TABLE with its name, its flags,
 * its type, its default and its help text. The same table drives
 *   - the command line (short and long flags, and -o name=value),
 *   - the config file (`name = value` lines, see options_parse_config_buffer),
 *   - `stats settings` (options_emit) and `--help` (options_print_help).
 * The name is the one `stats settings` prints; where memcached has the
 * setting, it is memcached's name.
 */
#ifndef OPTIONS_H
#define OPTIONS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#ifndef RIBLTCACHE_VERSION
#define RIBLTCACHE_VERSION "0.1.0"
#endif

/*
 * What `version` and `stats` report to clients: the memcached release whose
 * protocol we follow, then our own version. Clients parse the first
 * number as memcached's major version (libmemcached refuses 0), and some
 * enable features (meta commands) by it.
 */
#define RIBLTCACHE_MEMCACHED_COMPAT "1.6.21"
#define RIBLTCACHE_WIRE_VERSION                                               \
    RIBLTCACHE_MEMCACHED_COMPAT "-ribltcache-" RIBLTCACHE_VERSION

/* Error codes of this module. */
enum options_rc {
    OPTIONS_OK = 0,
    OPTIONS_ERR_USAGE = -1, /* unknown option, bad value, bad syntax */
    OPTIONS_ERR_IO = -2,    /* config file cannot be read */
    OPTIONS_ERR_NOMEM = -3,
};

/* Exit status for a usage error (as sysexits.h EX_USAGE). */
#define OPTIONS_EXIT_USAGE 64

/*
 * Value types.
 *   UINT     decimal number within [min, max]
 *   SIZE     number with an optional k/m/g suffix (powers of 1024)
 *   MEGS     like SIZE, but a bare number given to the short/long flag means
 *            megabytes (memcached's -m); under the setting's own name it
 *            means bytes, exactly what `stats settings` prints
 *   KILOS    like MEGS in kilobytes: a bare number given to the flag or to
 *            -o means kilobytes (memcached's -o ssl_wbuf_size=16); under
 *            the setting's name in the config file it means bytes, what
 *            `stats settings` prints
 *   TLSVER   a TLS version: 0..3 (memcached's numbers) or tlsv1, tlsv1.1,
 *            tlsv1.2, tlsv1.3; printed by name
 *   OCTAL    octal number (file modes)
 *   BOOL_ON  yes/no; the flag alone sets yes
 *   BOOL_OFF yes/no; the flag alone sets no (memcached's -C, -F)
 *   VERB     verbosity: each -v adds one; by name a number 0..max
 *   PROTO    auto-negotiate | ascii | binary (auto is accepted too)
 *   STR      a string; unset prints as NULL; an empty value unsets it
 *   SECRET   a string that `stats settings` never shows (prints <hidden>)
 *   CLI      command-line only (help, version, config file, -o): not a
 *            setting, not in the config file or `stats settings`
 */
enum options_type {
    OPTIONS_UINT,
    OPTIONS_SIZE,
    OPTIONS_MEGS,
    OPTIONS_KILOS,
    OPTIONS_TLSVER,
    OPTIONS_OCTAL,
    OPTIONS_BOOL_ON,
    OPTIONS_BOOL_OFF,
    OPTIONS_VERB,
    OPTIONS_PROTO,
    OPTIONS_STR,
    OPTIONS_SECRET,
    OPTIONS_CLI,
};

enum options_proto {
    OPTIONS_PROTO_AUTO = 0,
    OPTIONS_PROTO_ASCII = 1,
    OPTIONS_PROTO_BINARY = 2,
};

#define OPTIONS_KB 1024ULL
#define OPTIONS_MB (1024ULL * 1024)
#define OPTIONS_GB (1024ULL * 1024 * 1024)

/*
 * X(name, short flag (0 = none), long flag, type, default, min, max, help)
 * The argument placeholder shown by --help follows from the type.
 */
#define OPTIONS_TABLE(X)                                                      \
    X(tcpport, 'p', "port", OPTIONS_UINT, "11211", 0, 65535,                  \
      "TCP port to listen on (0 = no TCP)")                                   \
    X(udpport, 'U', "udp-port", OPTIONS_UINT, "0", 0, 65535,                  \
      "UDP port; UDP is not supported: accepted, no UDP listener")            \
    X(inter, 'l', "listen", OPTIONS_STR, "127.0.0.1", 0, 0,                   \
      "interfaces to listen on, comma separated (IPv4 or IPv6)")              \
    X(domain_socket, 's', "unix-socket", OPTIONS_STR, NULL, 0, 0,             \
      "unix socket path to listen on (disables TCP, as memcached)")           \
    X(umask, 'a', "unix-mask", OPTIONS_OCTAL, "700", 0, 0777,                 \
      "access mask of the unix socket, octal")                                \
    X(maxbytes, 'm', "memory-limit", OPTIONS_MEGS, "64m", 0,                  \
      1024 * OPTIONS_GB,                                                      \
      "item memory; -m takes megabytes, maxbytes bytes (k/m/g suffix ok);"    \
      " 0 = unlimited")                                                       \
    X(maxconns, 'c', "conn-limit", OPTIONS_UINT, "1024", 1, 1000000,          \
      "max simultaneous client connections")                                  \
    X(num_threads, 't', "threads", OPTIONS_UINT, "4", 1, 256,                 \
      "number of worker threads")                                             \
    X(item_size_max, 'I', "max-item-size", OPTIONS_SIZE, "1m", OPTIONS_KB,    \
      1024 * OPTIONS_MB, "largest item stored (k/m suffix, 1k..1024m)")       \
    X(verbosity, 'v', "verbose", OPTIONS_VERB, "0", 0, 3,                     \
      "log more: -v info (start-up, peers, rounds), -vv debug (connections)") \
    X(log_level, 0, "log-level", OPTIONS_STR, "warn", 0, 0,                   \
      "lowest level logged: error, warn, info or debug (-v raises it)")       \
    X(log_syslog, 0, "log-syslog", OPTIONS_BOOL_ON, "no", 0, 0,               \
      "log to syslog (facility daemon) instead of stderr")                    \
    X(log_file, 0, "log-file", OPTIONS_STR, NULL, 0, 0,                       \
      "append the log (stderr) to this file; SIGHUP reopens it")              \
    X(metrics_port, 0, "metrics-port", OPTIONS_UINT, "0", 0, 65535,           \
      "Prometheus metrics over HTTP on this port, GET /metrics (0 = off)")    \
    X(metrics_listen, 0, "metrics-listen", OPTIONS_STR, "127.0.0.1", 0, 0,    \
      "address the metrics port listens on")                                  \
    X(flush_enabled, 'F', "disable-flush-all", OPTIONS_BOOL_OFF, "yes", 0, 0, \
      "flush_all allowed (the flag disables it)")                             \
    X(shutdown_command, 'A', "enable-shutdown", OPTIONS_BOOL_ON, "no", 0, 0,  \
      "the shutdown command allowed (the flag enables it)")                   \
    X(cas_enabled, 'C', "disable-cas", OPTIONS_BOOL_OFF, "yes", 0, 0,         \
      "cas allowed (the flag disables it)")                                   \
    X(auth_enabled_sasl, 'S', "enable-sasl", OPTIONS_BOOL_ON, "no", 0, 0,     \
      "require SASL PLAIN authentication (binary protocol); needs "           \
      "sasl_file")                                                            \
    X(sasl_file, 0, "sasl-file", OPTIONS_STR, NULL, 0, 0,                     \
      "file of user:password lines for SASL (reloaded on SIGHUP)")            \
    X(reqs_per_event, 'R', "max-reqs-per-event", OPTIONS_UINT, "20", 1,       \
      1000000, "requests served per connection before yielding")              \
    X(worker_nap_us, 0, "worker-nap-us", OPTIONS_UINT, "50", 0, 1000,         \
      "microseconds a worker naps after serving pipelining clients, to "      \
      "gather more of their requests into each read (0 = never nap)")         \
    X(watcher_logbuf_size, 0, "watcher-logbuf-size", OPTIONS_UINT, "256", 1,  \
      1048576,                                                                \
      "KB of event lines a `watch` connection may have waiting; lines "       \
      "beyond are skipped and counted")                                       \
    X(binding_protocol, 'B', "protocol", OPTIONS_PROTO, "auto-negotiate", 0,  \
      0, "client protocol: auto, ascii or binary")                            \
    X(tcp_backlog, 'b', "listen-backlog", OPTIONS_UINT, "1024", 1, 65535,     \
      "listen backlog")                                                       \
    X(daemonize, 'd', "daemon", OPTIONS_BOOL_ON, "no", 0, 0,                  \
      "run in the background")                                                \
    X(pidfile, 'P', "pidfile", OPTIONS_STR, NULL, 0, 0,                       \
      "write the process id to this file (removed on exit)")                  \
    X(user, 'u', "user", OPTIONS_STR, NULL, 0, 0,                             \
      "run as this user once the ports are bound (when started as root)")     \
    X(evictions, 'M', "disable-evictions", OPTIONS_BOOL_OFF, "yes", 0, 0,     \
      "evict when memory is full (the flag: refuse writes instead)")          \
    X(auth_file, 'Y', "auth-file", OPTIONS_STR, NULL, 0, 0,                   \
      "user:password file (memcached's -Y): a text connection's first "       \
      "command must be the authenticating set; binary ones use SASL PLAIN "   \
      "with the same entries; reloaded on SIGHUP")                            \
    X(ssl_enabled, 'Z', "enable-ssl", OPTIONS_BOOL_ON, "no", 0, 0,            \
      "TLS for client connections on every -l address not prefixed "          \
      "notls: (needs ssl_chain_cert and ssl_key)")                            \
    X(ssl_chain_cert, 0, "ssl-chain-cert", OPTIONS_STR, NULL, 0, 0,           \
      "PEM certificate chain the server presents (reloaded on SIGHUP and "    \
      "refresh_certs)")                                                       \
    X(ssl_key, 0, "ssl-key", OPTIONS_STR, NULL, 0, 0,                         \
      "private key of ssl_chain_cert")                                        \
    X(ssl_keyformat, 0, "ssl-keyformat", OPTIONS_UINT, "1", 1, 2,             \
      "format of ssl_key: 1 = PEM, 2 = DER")                                  \
    X(ssl_verify_mode, 0, "ssl-verify-mode", OPTIONS_UINT, "0", 0, 3,         \
      "client certificates: 0 none, 1 request, 2 require, 3 require once "    \
      "(1-3 need ssl_ca_cert)")                                               \
    X(ssl_ca_cert, 0, "ssl-ca-cert", OPTIONS_STR, NULL, 0, 0,                 \
      "PEM file of the CAs client certificates must chain to")                \
    X(ssl_ciphers, 0, "ssl-ciphers", OPTIONS_STR, NULL, 0, 0,                 \
      "OpenSSL cipher list for TLS 1.2 and below (NULL = OpenSSL's)")         \
    X(ssl_min_version, 0, "ssl-min-version", OPTIONS_TLSVER, "tlsv1.2", 0, 0, \
      "oldest TLS version accepted: 0..3 or tlsv1 .. tlsv1.3")                \
    X(ssl_wbuf_size, 0, "ssl-wbuf-size", OPTIONS_KILOS, "16k", OPTIONS_KB,    \
      OPTIONS_MB,                                                             \
      "KB of replies gathered per TLS write (one record is 16 KB)")           \
    X(ssl_session_cache, 0, "ssl-session-cache", OPTIONS_BOOL_ON, "no", 0, 0, \
      "server-side TLS session cache and tickets (resumed handshakes)")       \
    X(ssl_kernel_tls, 0, "ssl-kernel-tls", OPTIONS_BOOL_ON, "no", 0, 0,       \
      "let OpenSSL hand records to the kernel (kTLS) where it can")           \
    X(slab_growth_factor, 'f', "slab-growth-factor", OPTIONS_STR, NULL, 0, 0, \
      "memcached's slab growth factor: accepted, no effect (no slabs)")       \
    X(slab_min_size, 'n', "slab-min-size", OPTIONS_STR, NULL, 0, 0,           \
      "memcached's smallest chunk: accepted, no effect (no slabs)")           \
    X(prefix_delimiter, 'D', "prefix-delimiter", OPTIONS_STR, NULL, 0, 0,     \
      "memcached's stats prefix delimiter: accepted, no effect")              \
    X(memory_file, 'e', "memory-file", OPTIONS_STR, NULL, 0, 0,               \
      "memcached's restartable cache file: accepted, no effect")              \
    X(napi_ids, 'N', "napi-ids", OPTIONS_STR, NULL, 0, 0,                     \
      "memcached's NAPI ids: accepted, no effect")                            \
    X(enable_coredumps, 'r', "enable-coredumps", OPTIONS_BOOL_ON, "no", 0, 0, \
      "memcached's core file limit: accepted, no effect")                     \
    X(lock_memory, 'k', "lock-memory", OPTIONS_BOOL_ON, "no", 0, 0,           \
      "memcached's mlockall: accepted, no effect")                            \
    X(large_memory_pages, 'L', "enable-largepages", OPTIONS_BOOL_ON, "no", 0, \
      0, "memcached's large pages: accepted, no effect")                      \
    X(dump_disabled, 'X', "disable-dumping", OPTIONS_BOOL_ON, "no", 0, 0,     \
      "refuse stats cachedump and lru_crawler metadump/mgdump")               \
    X(watch_disabled, 'W', "disable-watch", OPTIONS_BOOL_ON, "no", 0, 0,      \
      "refuse the watch command")                                             \
    X(extended_ignored, 0, "extended-ignored", OPTIONS_STR, NULL, 0, 0,       \
      "memcached -o settings given that have no effect here (set by -o)")     \
    X(idle_timeout, 0, "idle-timeout", OPTIONS_UINT, "0", 0, 31536000,        \
      "close connections idle this many seconds (0 = never)")                 \
    X(node_id, 0, "node-id", OPTIONS_UINT, "1", 1, 4294967295ULL,             \
      "this node's id in mutation versions (unique per cluster)")             \
    X(tombstone_grace, 0, "tombstone-grace", OPTIONS_UINT, "3600", 0,         \
      4294967295ULL,                                                          \
      "seconds deletes and expired items stay reconcilable before sweep")     \
    X(evict_record_share, 0, "evict-record-share", OPTIONS_UINT, "2", 1, 50,  \
      "percent of -m for records of evicted values (with replication)")       \
    X(sketch_symbols, 0, "sketch-symbols", OPTIONS_UINT, "8192", 1, 16777216, \
      "coded symbols kept in the materialized sketch")                        \
    X(power_sums, 0, "power-sums", OPTIONS_BOOL_ON, "yes", 0, 0,              \
      "keep power sums beside the sketch (small differences at half a "       \
      "symbol each)")                                                         \
    X(hashpower_init, 0, "hashpower", OPTIONS_UINT, "16", 4, 32,              \
      "initial key table size, as a power of two")                            \
    X(sweep_budget, 0, "sweep-budget", OPTIONS_UINT, "10000", 1, 100000000,   \
      "entries the once-a-second expiry sweep may visit")                     \
    X(max_line, 0, "max-line", OPTIONS_SIZE, "1m", 2048, 16 * OPTIONS_MB,     \
      "longest text request line accepted (a get/gets/gat/gats line of any "  \
      "length is taken key by key)")                                          \
    X(output_buffer_max, 0, "output-buffer-max", OPTIONS_SIZE, "4m",          \
      64 * OPTIONS_KB, OPTIONS_GB,                                            \
      "pending reply bytes per connection before reading pauses")             \
    X(repl_port, 0, "repl-port", OPTIONS_UINT, "0", 0, 65535,                 \
      "peer port for replication (0 = replication off)")                      \
    X(repl_listen, 0, "repl-listen", OPTIONS_STR, "127.0.0.1", 0, 0,          \
      "address of the peer listener")                                         \
    X(peers, 0, "peers", OPTIONS_STR, NULL, 0, 0,                             \
      "cluster members, host:port,host:port (may include this node)")         \
    X(cluster_secret, 0, "cluster-secret", OPTIONS_SECRET, NULL, 0, 0,        \
      "shared secret peers authenticate with (prefer the config file)")       \
    X(etcd, 0, "etcd", OPTIONS_STR, NULL, 0, 0,                               \
      "membership through etcd v3: http[s]://host:port[,...] (its JSON "      \
      "gateway)")                                                             \
    X(etcd_prefix, 0, "etcd-prefix", OPTIONS_STR, "/ribltcache/", 0, 0,       \
      "key prefix of the member records in etcd")                             \
    X(etcd_lease_s, 0, "etcd-lease-s", OPTIONS_UINT, "10", 2, 3600,           \
      "seconds a dead node's etcd record outlives it (its lease)")            \
    X(etcd_tls_ca, 0, "etcd-tls-ca", OPTIONS_STR, NULL, 0, 0,                 \
      "https:// etcd: CA its certificate must chain to (unset = system's)")   \
    X(etcd_tls_cert, 0, "etcd-tls-cert", OPTIONS_STR, NULL, 0, 0,             \
      "https:// etcd: client certificate chain (--client-cert-auth)")         \
    X(etcd_tls_key, 0, "etcd-tls-key", OPTIONS_STR, NULL, 0, 0,               \
      "https:// etcd: the client certificate's key")                          \
    X(peers_dns, 0, "peers-dns", OPTIONS_STR, NULL, 0, 0,                     \
      "peers from DNS, name:port[,...]: SRV targets, or A/AAAA addresses "    \
      "with the port, resolved every peers_dns_interval_ms")                  \
    X(peers_dns_server, 0, "peers-dns-server", OPTIONS_STR, NULL, 0, 0,       \
      "resolver for peers_dns, ip[:port][,...] (unset = the system's)")       \
    X(peers_dns_interval_ms, 0, "peers-dns-interval-ms", OPTIONS_UINT,        \
      "5000", 100, 3600000, "milliseconds between peers_dns resolutions")     \
    X(repl_tls_cert, 0, "repl-tls-cert", OPTIONS_STR, NULL, 0, 0,             \
      "peer TLS: this node's PEM certificate chain (CN node-<node_id>)")      \
    X(repl_tls_key, 0, "repl-tls-key", OPTIONS_STR, NULL, 0, 0,               \
      "peer TLS: its PEM private key")                                        \
    X(repl_tls_ca, 0, "repl-tls-ca", OPTIONS_STR, NULL, 0, 0,                 \
      "peer TLS: the cluster's CA certificate(s); with the two above, "       \
      "peer and registry links run TLS 1.3 with mutual certificates")         \
    X(repl_insecure, 0, "repl-insecure", OPTIONS_BOOL_ON, "no", 0, 0,         \
      "allow replication without a cluster secret")                           \
    X(repl_period_ms, 0, "repl-period-ms", OPTIONS_UINT, "100", 1, 3600000,   \
      "milliseconds between reconciliation rounds")                           \
    X(repl_max_symbols, 0, "repl-max-symbols", OPTIONS_UINT, "262144", 1,     \
      4294967295ULL, "coded symbols one round may take, cap")                 \
    X(repl_round_timeout_ms, 0, "repl-round-timeout-ms", OPTIONS_UINT,        \
      "10000", 1, 3600000, "a round taking longer fails")                     \
    X(repl_push_queue, 0, "repl-push-queue", OPTIONS_UINT, "65536", 1,        \
      4294967295ULL, "fresh writes waiting for eager push, cap")              \
    X(repl_push_delay_us, 0, "repl-push-delay-us", OPTIONS_UINT, "1000", 0,   \
      100000,                                                                 \
      "under a steady stream of writes, microseconds a push waits to carry"   \
      " more (0 = push each wake-up at once)")                                \
    X(repl_ack_wait_ms, 0, "repl-ack-wait-ms", OPTIONS_UINT, "0", 0, 3600000, \
      "answer a write only once a peer holds it, waiting at most this many"   \
      " milliseconds (then the connection closes unanswered); 0 = answer"     \
      " once this node holds it")                                             \
    X(repl_backlog_kb, 0, "repl-backlog-kb", OPTIONS_UINT, "8192", 0,         \
      4194304,                                                                \
      "KiB of recent local writes kept to resend to a peer whose link"        \
      " comes back (0 = rounds only)")                                        \
    X(replicas, 0, "replicas", OPTIONS_UINT, "0", 0, 1024,                    \
      "copies of each key (0 = every node holds every key)")                  \
    X(ring_partitions, 0, "ring-partitions", OPTIONS_UINT, "1024", 1, 65536,  \
      "partitions of the placement ring (the same on every node)")            \
    X(ring_weight, 0, "ring-weight", OPTIONS_UINT, "1", 1, 65535,             \
      "this node's share of the partitions, relative to the others")          \
    X(partition_sketch_symbols, 0, "partition-sketch-symbols", OPTIONS_UINT,  \
      "256", 16, 65536, "coded symbols kept per partition (replicas > 0)")    \
    X(ring_handoff_ms, 0, "ring-handoff-ms", OPTIONS_UINT, "10000", 0,        \
      86400000, "a partition this node lost is kept this long at least")      \
    X(ring_down_ms, 0, "ring-down-ms", OPTIONS_UINT, "3000", 0, 86400000,     \
      "a static peer unreachable this long leaves the ring")                  \
    X(proxy_timeout_ms, 0, "proxy-timeout-ms", OPTIONS_UINT, "2000", 1,       \
      3600000, "a request relayed to an owner fails after this long")         \
    X(advertise, 0, "advertise", OPTIONS_STR, NULL, 0, 0,                     \
      "host:port other nodes relay client requests to (default: -l and -p)")  \
    X(registry, 0, "registry", OPTIONS_STR, NULL, 0, 0,                       \
      "registries to join, host:port,host:port (needs repl_port)")            \
    X(registry_port, 0, "registry-port", OPTIONS_UINT, "0", 0, 65535,         \
      "serve as a registry on this port (0 = not a registry)")                \
    X(registry_listen, 0, "registry-listen", OPTIONS_STR, "127.0.0.1", 0, 0,  \
      "address of the registry listener")                                     \
    X(heartbeat_ms, 0, "heartbeat-ms", OPTIONS_UINT, "1000", 1, 3600000,      \
      "milliseconds between a member's heartbeats to its registries")         \
    X(probe_ms, 0, "probe-ms", OPTIONS_UINT, "1000", 1, 3600000,              \
      "a registry probes one member every this many milliseconds")            \
    X(probe_timeout_ms, 0, "probe-timeout-ms", OPTIONS_UINT, "500", 1,        \
      3600000, "a direct or indirect probe unanswered this long fails")       \
    X(suspect_timeout_ms, 0, "suspect-timeout-ms", OPTIONS_UINT, "5000", 1,   \
      3600000, "a suspect member without news this long is declared dead")    \
    X(indirect_probes, 0, "indirect-probes", OPTIONS_UINT, "3", 0, 16,        \
      "members asked to ping one that missed a direct probe")                 \
    X(config, 0, "config", OPTIONS_CLI, NULL, 0, 0,                           \
      "read settings from FILE (name = value lines); flags override it")      \
    X(extended, 'o', "extended", OPTIONS_CLI, NULL, 0, 0,                     \
      "set settings by name: -o name=value[,name=value...]")                  \
    X(help, 'h', "help", OPTIONS_CLI, NULL, 0, 0, "print this help and exit") \
    X(version, 'V', "version", OPTIONS_CLI, NULL, 0, 0,                       \
      "print the version and exit")                                           \
    X(man, 0, "man", OPTIONS_CLI, NULL, 0, 0,                                 \
      "print the manual page (roff) and exit")

/* Index of each table entry: OPTIONS_IDX_tcpport, ... */
enum options_index {
#define OPTIONS_IDX(name, ...) OPTIONS_IDX_##name,
    OPTIONS_TABLE(OPTIONS_IDX)
#undef OPTIONS_IDX
        OPTIONS_COUNT
};

/*
 * The settings. Numbers are uint64_t, flags bool, strings owned char *
 * (NULL = unset). CLI-only entries have a bool that tells whether they
 * were given.
 */
#define OPTIONS_CTYPE_OPTIONS_UINT uint64_t
#define OPTIONS_CTYPE_OPTIONS_SIZE uint64_t
#define OPTIONS_CTYPE_OPTIONS_MEGS uint64_t
#define OPTIONS_CTYPE_OPTIONS_KILOS uint64_t
#define OPTIONS_CTYPE_OPTIONS_TLSVER uint64_t
#define OPTIONS_CTYPE_OPTIONS_OCTAL uint64_t
#define OPTIONS_CTYPE_OPTIONS_BOOL_ON bool
#define OPTIONS_CTYPE_OPTIONS_BOOL_OFF bool
#define OPTIONS_CTYPE_OPTIONS_VERB uint64_t
#define OPTIONS_CTYPE_OPTIONS_PROTO uint64_t
#define OPTIONS_CTYPE_OPTIONS_STR char *
#define OPTIONS_CTYPE_OPTIONS_SECRET char *
#define OPTIONS_CTYPE_OPTIONS_CLI bool

typedef struct options {
#define OPTIONS_FIELD(name, sh, lng, type, ...) OPTIONS_CTYPE_##type name;
    OPTIONS_TABLE(OPTIONS_FIELD)
#undef OPTIONS_FIELD
    char *config_path; /* -f FILE, when given */
} options;

/* What the command line asked for. */
enum options_action {
    OPTIONS_RUN = 0,
    OPTIONS_HELP = 1,
    OPTIONS_VERSION = 2,
    OPTIONS_MAN = 3,
};

/* Sets every setting to its table default. Returns 0. */
int options_init(options *o);

/* Frees the strings of o (not o itself). */
void options_free(options *o);

/*
 * Parses a whole command line: defaults, then the config file named by
 * -f/--config (if any), then every flag in order (flags override the file).
 * Returns 0 with *action set, or a negative OPTIONS_ERR_* with a one-line
 * message in err (NUL-terminated, at most errlen bytes). Not reentrant
 * (uses getopt).
 */
int options_parse_argv(options *o, int argc, char **argv,
                       enum options_action *action, char *err, size_t errlen);

/*
 * Parses config text: one `name = value` per line; blank lines and lines
 * whose first non-blank character is '#' are ignored; whitespace around name
 * and value is ignored; a name is a `stats settings` name or a long flag
 * name (dashes or underscores). Lines longer than OPTIONS_MAX_LINE, NUL
 * bytes, unknown names and bad values are errors (message names the line).
 * On error o may hold the settings of the lines before the bad one.
 * buf need not be NUL-terminated. Returns 0 or OPTIONS_ERR_USAGE.
 */
#define OPTIONS_MAX_LINE 1024
int options_parse_config_buffer(options *o, const char *buf, size_t len,
                                char *err, size_t errlen);

/* Reads a file (at most 1 MB) and parses it as above. */
int options_parse_config_file(options *o, const char *path, char *err,
                              size_t errlen);

/*
 * Sets one setting by name (as in the config file). Returns 0 or
 * OPTIONS_ERR_USAGE with a message.
 */
int options_set(options *o, const char *name, const char *value, char *err,
                size_t errlen);

/* Checks combinations (e.g. -U must be 0, -S needs sasl_file). */
int options_validate(const options *o, char *err, size_t errlen);

/* The prefix that keeps one -l address plain while -Z is on. */
#define OPTIONS_NOTLS_PREFIX "notls:"

/*
 * Splits one -l entry in place as memcached reads it:
 * [notls:]host[:port], where an IPv6 host with a port is bracketed
 * ([::1]:11211) and a bare IPv6 address (more than one ':') is a host
 * alone. Sets *notls (the prefix was there) and *port (NULL: -p's).
 * Returns the host, or NULL when the brackets are malformed.
 */
char *options_listen_entry(char *entry, bool *notls, char **port);

/* Prints usage and every option with its default to f. */
void options_print_help(FILE *f, const char *prog);

/*
 * The manual page ribltcached(1), in roff, from the same table as the
 * help: the build writes it with `ribltcached --man`, so it never drifts
 * from the options.
 */
void options_print_man(FILE *f);

/* Emits every setting as `stats settings` lists it. */
typedef void (*options_emit_fn)(void *arg, const char *name,
                                const char *value);
void options_emit(const options *o, options_emit_fn emit, void *arg);

/* Human-readable text of an OPTIONS_* code. */
const char *options_strerror(int rc);

#endif /* OPTIONS_H */
