"""Start-up: flags, --help, --version, config files, bad input."""

import os
import re
import socket
import tempfile
import unittest

import harness
from harness import Server, run

USAGE = 64

# Every flag the daemon must accept (memcached 1.6's plus ours).
EXPECTED_FLAGS = [
    "-p, --port", "-U, --udp-port", "-l, --listen", "-s, --unix-socket",
    "-a, --unix-mask", "-m, --memory-limit", "-c, --conn-limit",
    "-t, --threads", "-I, --max-item-size", "-v, --verbose",
    "-F, --disable-flush-all", "-A, --enable-shutdown", "-C, --disable-cas",
    "-S, --enable-sasl", "-R, --max-reqs-per-event", "-B, --protocol",
    "-b, --listen-backlog", "-o, --extended", "-d, --daemon",
    "-P, --pidfile", "-h, --help", "-V, --version", "--config",
    "--idle-timeout", "--node-id", "--tombstone-grace", "--sketch-symbols",
    "--sasl-file", "-u, --user", "-M, --disable-evictions",
    "-Y, --auth-file", "-Z, --enable-ssl", "-f, --slab-growth-factor",
    "-n, --slab-min-size", "-D, --prefix-delimiter", "-e, --memory-file",
    "-N, --napi-ids", "-r, --enable-coredumps", "-k, --lock-memory",
    "-L, --enable-largepages", "-X, --disable-dumping", "-W, --disable-watch",
]


def help_names():
    code, out, _ = run(["--help"])
    return set(re.findall(r"^\s+\[([a-z_]+)\] default:", out, re.M))


def write_config(text):
    fd, path = tempfile.mkstemp(prefix="ribltcached-conf-", suffix=".conf")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    return path


class HelpAndVersion(unittest.TestCase):
    def test_help_lists_every_option(self):
        code, out, err = run(["--help"])
        self.assertEqual(code, 0, err)
        for flag in EXPECTED_FLAGS:
            self.assertIn(flag, out)
        # Every setting shows its default.
        self.assertIn("[tcpport] default: 11211", out)
        self.assertIn("[maxconns] default: 1024", out)
        self.assertIn("[num_threads] default: 4", out)
        self.assertIn("[item_size_max] default: 1m", out)
        self.assertIn("[idle_timeout] default: 0", out)

    def test_short_help(self):
        code, out, _ = run(["-h"])
        self.assertEqual(code, 0)
        self.assertIn("--port", out)

    def test_version(self):
        for flag in ("-V", "--version"):
            code, out, _ = run([flag])
            self.assertEqual(code, 0)
            self.assertRegex(out, r"^ribltcached \d+\.\d+\.\d+\n$")


class BadFlags(unittest.TestCase):
    def assertUsageError(self, args, needle):
        code, out, err = run(args)
        self.assertEqual(code, USAGE, "args %r: %s" % (args, err))
        self.assertIn(needle, err)
        self.assertEqual(out, "")

    def test_unknown_flags(self):
        self.assertUsageError(["--no-such-flag"], "--no-such-flag")
        self.assertUsageError(["-J"], "-J")
        self.assertUsageError(["extra-argument"], "extra-argument")

    def test_missing_value(self):
        self.assertUsageError(["-p"], "-p")
        self.assertUsageError(["--threads"], "--threads")

    def test_bad_values(self):
        self.assertUsageError(["-p", "70000"], "tcpport")
        self.assertUsageError(["-p", "12ab"], "tcpport")
        self.assertUsageError(["-t", "0"], "num_threads")
        self.assertUsageError(["-c", "-5"], "maxconns")
        self.assertUsageError(["-I", "512"], "item_size_max")
        self.assertUsageError(["-I", "2g"], "item_size_max")
        self.assertUsageError(["-I", "5x"], "item_size_max")
        self.assertUsageError(["-B", "carrier-pigeon"], "binding_protocol")
        self.assertUsageError(["-a", "999"], "umask")
        self.assertUsageError(["-o", "no_such_setting=1"], "no_such_setting")
        self.assertUsageError(["-o", "novalue"], "name=value")

    def test_item_size_against_memory(self):
        self.assertUsageError(["-m", "1", "-I", "1m"], "half of maxbytes")

    def test_missing_protection_refused(self):
        # Protection that was asked for and cannot be had (TLS without a
        # certificate; an unreadable auth file): the daemon refuses to
        # start rather than run without it.
        self.assertUsageError(["-Y", "/nonexistent/auth"],
                              "auth_file /nonexistent/auth: cannot read")
        self.assertUsageError(["-Z"], "-Z/ssl_enabled needs ssl_chain_cert")
        self.assertUsageError(
            ["-Z", "-o", "ssl_chain_cert=/x,ssl_key=/y,ssl_verify_mode=2"],
            "needs ssl_ca_cert")

    def test_sasl_needs_credentials(self):
        self.assertUsageError(["-S"], "sasl-file")

    def test_bad_flag_does_not_listen(self):
        port = harness.free_port()
        code, _, _ = run(["-p", str(port), "--bogus"])
        self.assertEqual(code, USAGE)
        with self.assertRaises(OSError):
            socket.create_connection(("127.0.0.1", port), timeout=1).close()

    def test_port_in_use(self):
        with socket.socket() as busy:
            busy.bind(("127.0.0.1", 0))
            busy.listen(1)
            port = busy.getsockname()[1]
            code, _, err = run(["-l", "127.0.0.1", "-p", str(port)])
            self.assertNotEqual(code, 0)
            self.assertIn("failed to listen", err)


class Settings(unittest.TestCase):
    def test_flags_reach_stats_settings(self):
        args = ["-c", "77", "-t", "2", "-m", "100", "-I", "2m", "-R", "7",
                "-C", "-F", "-A", "-B", "ascii", "-b", "99",
                "--idle-timeout", "30", "--node-id", "9",
                "-o", "tombstone_grace=120,sketch_symbols=4096", "-vv"]
        with Server(args) as srv:
            st = srv.stats("settings")
        self.assertEqual(st["maxconns"], "77")
        self.assertEqual(st["num_threads"], "2")
        self.assertEqual(st["maxbytes"], str(100 << 20))
        self.assertEqual(st["item_size_max"], str(2 << 20))
        self.assertEqual(st["reqs_per_event"], "7")
        self.assertEqual(st["cas_enabled"], "no")
        self.assertEqual(st["peers"], "NULL")
        self.assertEqual(st["flush_enabled"], "no")
        self.assertEqual(st["shutdown_command"], "yes")
        self.assertEqual(st["binding_protocol"], "ascii")
        self.assertEqual(st["tcp_backlog"], "99")
        self.assertEqual(st["idle_timeout"], "30")
        self.assertEqual(st["node_id"], "9")
        self.assertEqual(st["tombstone_grace"], "120")
        self.assertEqual(st["sketch_symbols"], "4096")
        self.assertEqual(st["verbosity"], "2")
        self.assertEqual(st["udpport"], "0")

    def test_worker_nap(self):
        # Naps are on by default (50 us); 0 turns them off; both serve
        # requests, and an out-of-range value stops the start-up.
        for args, want in (([], "50"), (["-o", "worker_nap_us=0"], "0"),
                           (["--worker-nap-us", "500"], "500")):
            with Server(args) as srv:
                self.assertEqual(srv.stats("settings")["worker_nap_us"], want)
                self.assertEqual(srv.request(b"set p 0 0 1\r\nx\r\n"),
                                 b"STORED\r\n")
                self.assertEqual(srv.request(b"get p\r\n", b"END\r\n"),
                                 b"VALUE p 0 1\r\nx\r\nEND\r\n")
        code, _, err = run(["-o", "worker_nap_us=1001"])
        self.assertEqual(code, 64)
        self.assertIn("worker_nap_us", err)

    def test_secret_never_listed(self):
        with Server(["--cluster-secret", "sw0rdfish"]) as srv:
            raw = srv.request(b"stats settings\r\n", b"END\r\n")
        self.assertNotIn(b"sw0rdfish", raw)
        self.assertIn(b"STAT cluster_secret <hidden>\r\n", raw)

    def test_settings_names_are_config_names(self):
        names = help_names()
        self.assertIn("tcpport", names)
        with Server() as srv:
            settings = srv.stats("settings")
        self.assertEqual(set(settings), names)

        # Every listed value, fed back through a config file, is accepted
        # and reproduces the same listing (the port comes from the flag).
        lines = ["# generated from stats settings"]
        for name, value in settings.items():
            if value != "NULL" and name != "tcpport":
                lines.append("%s = %s" % (name, value))
        path = write_config("\n".join(lines) + "\n")
        try:
            with Server(["--config", path]) as srv2:
                again = srv2.stats("settings")
        finally:
            os.unlink(path)
        settings.pop("tcpport")
        again.pop("tcpport")
        self.assertEqual(again, settings)


class ConfigFile(unittest.TestCase):
    def test_config_file_applies(self):
        path = write_config(
            "# a comment\n\n"
            "  maxconns = 55  \n"
            "num_threads=3\n"
            "item_size_max = 512k\n"
            "maxbytes = 32m\n"
            "idle_timeout = 12\n"
            "port = 1\n"          # long flag name works too; CLI overrides
            "cas_enabled = no\n"
            "peers = 127.0.0.1:1\n"
            "peers =\n")          # an empty value unsets a string
        try:
            with Server(["--config", path]) as srv:
                st = srv.stats("settings")
                self.assertEqual(st["tcpport"], str(srv.port))
        finally:
            os.unlink(path)
        self.assertEqual(st["maxconns"], "55")
        self.assertEqual(st["num_threads"], "3")
        self.assertEqual(st["item_size_max"], str(512 << 10))
        self.assertEqual(st["maxbytes"], str(32 << 20))
        self.assertEqual(st["idle_timeout"], "12")
        self.assertEqual(st["cas_enabled"], "no")

    def test_cli_overrides_file_in_any_order(self):
        path = write_config("maxconns = 10\nnum_threads = 2\n")
        try:
            with Server(["-c", "20", "--config", path]) as srv:
                st = srv.stats("settings")
        finally:
            os.unlink(path)
        self.assertEqual(st["maxconns"], "20")
        self.assertEqual(st["num_threads"], "2")

    def check_bad(self, text, needle):
        path = write_config(text)
        try:
            code, _, err = run(["--config", path])
        finally:
            os.unlink(path)
        self.assertEqual(code, USAGE, err)
        self.assertIn(needle, err)

    def test_bad_config_files(self):
        self.check_bad("maxconns = 5\nbogus_name = 1\n", "line 2")
        self.check_bad("maxconns = 5\nbogus_name = 1\n", "bogus_name")
        self.check_bad("maxconns\n", "expected 'name = value'")
        self.check_bad("num_threads = many\n", "num_threads")
        self.check_bad("= 4\n", "missing name")
        self.check_bad("maxconns = %s\n" % ("9" * 2000), "longer than")
        self.check_bad("config = other.conf\n", "command line")
        self.check_bad("maxconns = 5\x00\n", "NUL")

    def test_missing_config_file(self):
        code, _, err = run(["--config", "/nonexistent/ribltcached.conf"])
        self.assertNotEqual(code, 0)
        self.assertIn("cannot open config file", err)

    def test_shipped_single_conf(self):
        # conf/single.conf must start as is (its port replaced by -p).
        here = os.path.dirname(os.path.abspath(__file__))
        conf = os.path.join(here, "..", "..", "conf", "single.conf")
        with Server(["--config", conf]) as srv:
            st = srv.stats("settings")
        self.assertEqual(st["tcpport"], str(srv.port))


class MemcachedCommandLine(unittest.TestCase):
    """An existing memcached command line or unit file starts the daemon:
    the flags that mean something here act, the rest are accepted with one
    warning line naming each."""

    def test_flags_without_effect_accepted_and_named(self):
        args = ["-f", "1.25", "-n", "48", "-k", "-L", "-r",
                "-D", ":", "-e", "/nonexistent/memory_file", "-U", "11211",
                "-o", "slab_chunk_max=512,no_modern,lru_crawler,"
                "hash_algorithm=murmur3,ext_path=/x:64m",
                "-o", "modern,idle_timeout=30", "-o", "relaxed_privileges"]
        with Server(args) as srv:
            self.assertEqual(srv.request(b"set k 0 0 1\r\nv\r\n"),
                             b"STORED\r\n")
            st = srv.stats("settings")
            err = srv.stderr()
        lines = [ln for ln in err.splitlines() if "no effect here" in ln]
        self.assertEqual(len(lines), 1, err)
        for name in ("-f 1.25", "-n 48", "-k", "-L", "-r",
                     "-D :", "-e /nonexistent/memory_file", "-U 11211",
                     "slab_chunk_max=512", "no_modern", "lru_crawler",
                     "hash_algorithm=murmur3", "ext_path=/x:64m", "modern",
                     "relaxed_privileges"):
            self.assertIn(name, lines[0])
        # A setting of ours given in the same -o still applies.
        self.assertEqual(st["idle_timeout"], "30")
        self.assertEqual(st["slab_growth_factor"], "1.25")

    def test_disable_evictions(self):
        # -M: a full cache refuses writes with memcached's error instead of
        # evicting; what it holds stays readable.
        with Server(["-M", "-m", "2"]) as srv:
            s = srv.connect()
            value = b"v" * 1000
            refused = None
            for i in range(5000):
                s.sendall(b"set key%d 0 0 1000\r\n%s\r\n" % (i, value))
                reply = harness.recv_until(s, b"\r\n")
                if reply != b"STORED\r\n":
                    refused = (i, reply)
                    break
            s.close()
            self.assertIsNotNone(refused)
            self.assertEqual(refused[1],
                             b"SERVER_ERROR out of memory storing object\r\n")
            st = srv.stats()
            self.assertEqual(st["evictions"], "0")
            self.assertEqual(srv.stats("settings")["evictions"], "off")
            self.assertEqual(srv.request(b"get key0\r\n", b"END\r\n"),
                             b"VALUE key0 0 1000\r\n" + value + b"\r\nEND\r\n")

    def test_cache_memlimit_shows_in_settings(self):
        # As memcached (its dyn-maxbytes test): the new limit is what
        # stats settings and stats report.
        with Server(["-m", "64"]) as srv:
            self.assertEqual(srv.stats("settings")["maxbytes"],
                             str(64 << 20))
            self.assertEqual(srv.request(b"cache_memlimit 100\r\n"),
                             b"OK\r\n")
            self.assertEqual(srv.stats("settings")["maxbytes"],
                             str(100 << 20))
            self.assertEqual(srv.stats()["limit_maxbytes"], str(100 << 20))

    def test_user_drops_privileges(self):
        # -u: once its port is bound, a daemon started as root runs as the
        # user; started as anyone else it stays who it is.
        import pwd
        nobody = pwd.getpwnam("nobody").pw_uid
        with Server(["-u", "nobody"]) as srv:
            with open("/proc/%d/status" % srv.pid) as f:
                uid = [ln for ln in f if ln.startswith("Uid:")][0].split()
            self.assertTrue(srv.request(b"version\r\n").startswith(
                b"VERSION "))
        want = nobody if os.geteuid() == 0 else os.geteuid()
        self.assertEqual(int(uid[1]), want)  # real
        self.assertEqual(int(uid[2]), want)  # effective


if __name__ == "__main__":
    harness.main()
