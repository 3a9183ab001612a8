"""memcached's admin commands that tools rely on: lru_crawler metadump and
mgdump, stats cachedump, watch; and two drop-in fixes that only show on a
running daemon (control bytes in text keys, a refused binary SET)."""

import re
import signal
import socket
import struct
import time
import unittest

import harness
from harness import Server, parse_stats, recv_until, wait_for

META_LINE = re.compile(
    rb"^key=(\S+) exp=(-1|\d+) la=\d+ cas=\d+ fetch=(yes|no) cls=1 "
    rb"size=\d+$")


def fill(sock, keys, value=b"v", ttl=0):
    """Sets every key (noreply), then waits for a version reply."""
    out = b"".join(b"set %s 0 %d %d noreply\r\n%s\r\n" % (k, ttl, len(value),
                                                            value)
                   for k in keys)
    sock.sendall(out + b"version\r\n")
    recv_until(sock, b"\r\n")


def read_lines(sock, last):
    """Lines up to and including the line equal to last."""
    data = recv_until(sock, last + b"\r\n", timeout=30.0)
    return data.split(b"\n")[:-1]


class Dumps(unittest.TestCase):
    def test_metadump_lists_every_live_item_once(self):
        with Server(["-m", "64"]) as srv:
            s = srv.connect()
            keys = [b"k:%05d" % i for i in range(5000)]
            fill(s, keys)
            fill(s, [b"short"], ttl=1)
            s.sendall(b"set ctl\x01key 0 100 1\r\nx\r\n")
            self.assertEqual(recv_until(s, b"\r\n"), b"STORED\r\n")
            s.sendall(b"get k:00001\r\n")
            recv_until(s, b"END\r\n")
            time.sleep(2.1)  # "short" expires: not listed
            s.sendall(b"lru_crawler metadump all\r\n")
            lines = read_lines(s, b"END")
            self.assertEqual(lines[-1], b"END\r")
            seen = {}
            for line in lines[:-1]:
                m = META_LINE.match(line)
                self.assertIsNotNone(m, line)
                seen[m.group(1)] = m
            self.assertEqual(len(lines) - 1, len(seen), "a key twice")
            self.assertEqual(set(seen),
                             {k.replace(b":", b"%3A") for k in keys} |
                             {b"ctl%01key"})
            self.assertEqual(seen[b"k%3A00001"].group(3), b"yes")
            self.assertEqual(seen[b"k%3A00002"].group(3), b"no")
            self.assertEqual(seen[b"k%3A00002"].group(2), b"-1")
            self.assertNotEqual(seen[b"ctl%01key"].group(2), b"-1")
            # the connection goes on serving after the dump
            s.sendall(b"mn\r\n")
            self.assertEqual(recv_until(s, b"\r\n"), b"MN\r\n")

    def test_mgdump_lines_fetch_what_they_name(self):
        with Server() as srv:
            s = srv.connect()
            fill(s, [b"a", b"b", b"c\x02d"])
            s.sendall(b"lru_crawler mgdump hash\r\n")
            data = recv_until(s, b"EN\r\n")
            lines = data.split(b"\r\n")[:-2]
            self.assertEqual(sorted(lines),
                             [b"mg YwJk b", b"mg a", b"mg b"])
            # each line, with flags appended, is a working meta get
            s.sendall(b"".join(l + b" v\r\n" for l in lines) + b"mn\r\n")
            self.assertEqual(recv_until(s, b"MN\r\n"),
                             b"VA 1\r\nv\r\n" * 3 + b"MN\r\n")

    def test_dump_of_a_big_cache_is_paced_by_the_reader(self):
        # A reader that does not read holds the dump, not the server's
        # memory: the 16 MB dump waits in the socket and in at most
        # output_max of the server's buffers.
        with Server(["-m", "256"]) as srv:
            s = srv.connect()
            for part in range(10):
                fill(s, [b"key:%07d" % i
                         for i in range(part * 20000, (part + 1) * 20000)])
            rss0 = srv.rss_kb()
            s.sendall(b"lru_crawler metadump all\r\n")
            time.sleep(1.0)  # the server fills the socket, then waits
            rss1 = srv.rss_kb()
            if harness.rss_is_live_memory():
                self.assertLess(rss1 - rss0, 8 << 10,
                                "dump buffered %d kB" % (rss1 - rss0))
            lines = read_lines(s, b"END")
            self.assertEqual(len(lines), 200001)
            other = srv.connect()
            other.sendall(b"version\r\n")
            self.assertTrue(recv_until(other, b"\r\n").startswith(b"VERSION"))

    def test_class_lists_and_refusals(self):
        with Server() as srv:
            s = srv.connect()
            fill(s, [b"a"])
            for req, want in [
                (b"lru_crawler metadump 2,3\r\n", b"END\r\n"),
                (b"lru_crawler metadump x\r\n",
                 b"BADCLASS invalid class id\r\n"),
                (b"lru_crawler crawl 1\r\n", b"OK\r\n"),
                (b"lru_crawler sleep 2000000\r\n",
                 b"CLIENT_ERROR sleep must be one second or less\r\n"),
                (b"lru_crawler tocrawl 10\r\n", b"OK\r\n"),
                (b"lru_crawler bogus\r\n", b"ERROR\r\n"),
            ]:
                s.sendall(req)
                self.assertEqual(recv_until(s, b"\r\n"), want, req)
            s.sendall(b"lru_crawler metadump 1,2\r\n")
            self.assertEqual(len(read_lines(s, b"END")), 2)
            # as memcached: a dump must not follow other replies in one batch
            s.sendall(b"mn\r\nlru_crawler metadump all\r\n")
            self.assertEqual(
                recv_until(s, b"metadump\r\n"),
                b"MN\r\nERROR cannot pipeline other commands before "
                b"metadump\r\n")

    def test_stats_cachedump(self):
        with Server() as srv:
            s = srv.connect()
            fill(s, [b"a", b"b", b"c"], value=b"12345")
            s.sendall(b"stats cachedump 1 2\r\n")
            lines = recv_until(s, b"END\r\n").split(b"\r\n")[:-2]
            self.assertEqual(len(lines), 2)
            for line in lines:
                self.assertRegex(line, rb"^ITEM [abc] \[5 b; 0 s\]$")
            s.sendall(b"stats cachedump 1 0\r\n")
            self.assertEqual(recv_until(s, b"END\r\n").count(b"ITEM "), 3)
            s.sendall(b"stats cachedump 5 0\r\n")
            self.assertEqual(recv_until(s, b"\r\n"), b"END\r\n")
            s.sendall(b"stats cachedump 99 0\r\n")
            self.assertEqual(recv_until(s, b"\r\n"),
                             b"CLIENT_ERROR Illegal slab id\r\n")


class Watch(unittest.TestCase):
    def test_fetchers_mutations_and_connections(self):
        with Server() as srv:
            w = srv.connect()
            w.sendall(b"watch fetchers mutations connevents\r\n")
            self.assertEqual(recv_until(w, b"\r\n"), b"OK\r\n")
            c = srv.connect()
            c.sendall(b"set vfoo 0 0 4\r\nvbar\r\nget vfoo\r\nquit\r\n")
            recv_until(c, b"END\r\n")
            # The close is logged before the socket closes: wait for the
            # end of the stream, or the next connection (on another
            # worker) may be logged first.
            c.settimeout(10)
            while c.recv(4096):
                pass
            h = srv.connect()
            h.sendall(b"GET / HTTP/1.1\r\n")
            want = [
                rb"type=conn_new rip=127\.0\.0\.1 rport=\d+ transport=tcp",
                rb"type=item_get key=vfoo status=not_found clsid=1 cfd=\d+ "
                rb"size=0",
                rb"type=item_store key=vfoo status=stored cmd=set ttl=0 "
                rb"clsid=1 cfd=\d+ size=4",
                rb"type=item_get key=vfoo status=found clsid=1 cfd=\d+ "
                rb"size=4",
                rb"type=conn_close .* reason=normal",
                rb"type=conn_new ",
                rb"type=conn_close .* reason=error",
            ]
            # Connection events of other clients (the harness's readiness
            # probe, whose close the server may see after the watch began)
            # are not this test's.
            ours = {b"rport=%d " % c.getsockname()[1],
                    b"rport=%d " % h.getsockname()[1]}

            def mine(line):
                return b"type=conn_" not in line or any(
                    p in line for p in ours)
            got, lines = b"", []
            deadline = time.monotonic() + 10
            while len(lines) < len(want) and time.monotonic() < deadline:
                chunk = recv_until(w, b"\n")
                if not chunk:
                    break
                got += chunk
                *done, got = got.split(b"\n")
                lines += [line for line in done if mine(line)]
            lines = lines[:len(want)]
            self.assertEqual(len(lines), len(want), lines)
            for line, pattern in zip(lines, want):
                self.assertRegex(line, rb"^ts=\d+\.\d+ gid=\d+ " + pattern)

    def test_evictions_and_a_slow_watcher_skips(self):
        with Server(["-m", "8", "-o", "watcher_logbuf_size=1"]) as srv:
            w = srv.connect()
            w.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            w.sendall(b"watch evictions fetchers\r\n")
            self.assertEqual(recv_until(w, b"\r\n"), b"OK\r\n")
            c = srv.connect()
            value = b"B" * 11000
            fill(c, [b"n,foo%d" % i for i in range(2000)], value=value)
            for i in range(3000):
                c.sendall(b"get miss%d\r\n" % i)
            c.sendall(b"mn\r\n")
            recv_until(c, b"MN\r\n", timeout=30)
            got = b""
            deadline = time.monotonic() + 10
            while (b"type=eviction" not in got or b"skipped=" not in got) \
                    and time.monotonic() < deadline:
                got += w.recv(65536)
            self.assertRegex(got, rb"type=eviction key=n%2Cfoo\d+ fetch=no")
            self.assertRegex(got, rb"\nskipped=\d+\n")

    def test_kinds_and_limits(self):
        with Server() as srv:
            s = srv.connect()
            s.sendall(b"watch nonsense\r\n")
            self.assertEqual(recv_until(s, b"\r\n"), b"ERROR\r\n")
            s.sendall(b"mn\r\nwatch\r\n")
            self.assertEqual(
                recv_until(s, b"watch\r\n"),
                b"MN\r\nERROR cannot pipeline other commands before watch\r\n")
            held = []
            for _ in range(16):
                x = srv.connect()
                x.sendall(b"watch mutations\r\n")
                self.assertEqual(recv_until(x, b"\r\n"), b"OK\r\n")
                held.append(x)
            x = srv.connect()
            x.sendall(b"watch\r\n")
            self.assertEqual(recv_until(x, b"\r\n"),
                             b"WATCHER_TOO_MANY log watcher limit reached\r\n")
            held.pop().close()
            # a watcher that hung up gives its slot back
            self.assertTrue(wait_for(
                lambda: srv.request(b"watch\r\n") == b"OK\r\n", timeout=5))


class Switches(unittest.TestCase):
    def test_no_dumps_no_watch(self):
        # memcached's -X and -W
        with Server(["-X", "-W"]) as srv:
            s = srv.connect()
            for req, want in [
                (b"lru_crawler metadump all\r\n",
                 b"ERROR metadump not allowed\r\n"),
                (b"lru_crawler mgdump all\r\n",
                 b"ERROR mgdump not allowed\r\n"),
                (b"stats cachedump 1 0\r\n",
                 b"CLIENT_ERROR stats cachedump not allowed\r\n"),
                (b"watch mutations\r\n",
                 b"CLIENT_ERROR watch commands not allowed\r\n"),
                (b"mn\r\n", b"MN\r\n"),
            ]:
                s.sendall(req)
                self.assertEqual(recv_until(s, b"\r\n"), want, req)

    def test_watcher_stats(self):
        with Server() as srv:
            w1, w2 = srv.connect(), srv.connect()
            for w in (w1, w2):
                w.sendall(b"watch fetchers\r\n")
                self.assertEqual(recv_until(w, b"\r\n"), b"OK\r\n")
            self.assertEqual(srv.stats()["log_watchers"], "2")
            srv.request(b"get nothing\r\n", b"END\r\n")
            self.assertTrue(wait_for(
                lambda: srv.stats()["log_watcher_sent"] == "2"))
            self.assertEqual(srv.stats()["log_worker_written"], "1")
            w1.close()
            w2.close()
            self.assertTrue(wait_for(
                lambda: srv.stats()["log_watchers"] == "0"))


class KeysAndRefusals(unittest.TestCase):
    def test_control_bytes_in_text_keys(self):
        # memcached stores them; so does this server, on every protocol
        with Server() as srv:
            s = srv.connect()
            s.sendall(b"set a\tb\x01 0 0 1\r\nx\r\nget a\tb\x01\r\n")
            self.assertEqual(recv_until(s, b"END\r\n"),
                             b"STORED\r\nVALUE a\tb\x01 0 1\r\nx\r\nEND\r\n")

    def test_binary_set_too_large_removes_the_key(self):
        with Server(["-I", "1m"]) as srv:
            s = srv.connect()
            s.sendall(b"set big 0 0 3\r\nold\r\n")
            self.assertEqual(recv_until(s, b"\r\n"), b"STORED\r\n")
            b = srv.connect()
            value = b"z" * (2 << 20)
            body = struct.pack(">II", 0, 0) + b"big" + value
            hdr = struct.pack(">BBHBBHIIQ", 0x80, 0x01, 3, 8, 0, 0,
                              len(body), 7, 0)
            b.sendall(hdr + body)
            resp = harness.recv_exact(b, 24)
            status = struct.unpack(">H", resp[6:8])[0]
            self.assertEqual(status, 0x0003)  # E2BIG
            harness.recv_exact(b, struct.unpack(">I", resp[8:12])[0])
            s.sendall(b"get big\r\n")
            self.assertEqual(recv_until(s, b"END\r\n"), b"END\r\n")
            self.assertEqual(srv.stats()["curr_items"], "0")


class Connections(unittest.TestCase):
    def test_reqs_per_event_counts_requests(self):
        # memcached's -R: requests per event; a pipeline of six with -R 1
        # yields after each one
        with Server(["-R", "1"]) as srv:
            s = srv.connect()
            s.sendall(b"set foobar 0 0 5\r\nBubba\r\n" * 6)
            self.assertEqual(recv_until(s, b"STORED\r\n" * 6),
                             b"STORED\r\n" * 6)
            self.assertGreaterEqual(int(srv.stats()["conn_yields"]), 5)

    def test_a_client_mid_value_is_in_nread(self):
        with Server() as srv:
            s = srv.connect()
            s.sendall(b"set half 0 0 10\r\n12345")
            t = srv.connect()

            def nread():
                t.sendall(b"stats conns\r\n")
                return b":state conn_nread" in recv_until(t, b"END\r\n")
            self.assertTrue(wait_for(nread, timeout=5))
            s.sendall(b"67890\r\n")
            self.assertEqual(recv_until(s, b"\r\n"), b"STORED\r\n")


def sasl_plain(sock, user, password):
    """Binary SASL_AUTH PLAIN; returns the status."""
    body = b"PLAIN" + b"\0" + user + b"\0" + password
    hdr = struct.pack(">BBHBBHIIQ", 0x80, 0x21, 5, 0, 0, 0, len(body), 1, 0)
    sock.sendall(hdr + body)
    resp = harness.recv_exact(sock, 24)
    harness.recv_exact(sock, struct.unpack(">I", resp[8:12])[0])
    return struct.unpack(">H", resp[6:8])[0]


class TextAuth(unittest.TestCase):
    def server(self, entries):
        srv = Server(ready="connect")
        self.path = srv.tmpdir + "/authfile"
        with open(self.path, "w") as f:
            f.write(entries)
        srv.args += ["-Y", self.path]
        return srv

    def test_memcached_sequence(self):
        # memcached's t/ascii-auth.t, and what it leaves out
        with self.server("# users\nfoo:bar\nbaaaz:quux\n") as srv:
            s = srv.connect()
            for req, want in [
                (b"set foo 0 0 2\r\nhi\r\n",
                 b"CLIENT_ERROR bad authentication token format\r\n"),
                (b"get foo\r\n", b"CLIENT_ERROR unauthenticated\r\n"),
                (b"set foo 0 0 7\r\nfoo bab\r\n",
                 b"CLIENT_ERROR authentication failure\r\n"),
                (b"set foo 0 0 6\r\nfoo ba\r\n",
                 b"CLIENT_ERROR authentication failure\r\n"),
                (b"set foo 0 0 7\r\nfoo bar\r\n", b"STORED\r\n"),
                (b"set toast 0 0 2\r\nhi\r\n", b"STORED\r\n"),
                (b"get toast\r\n", b"VALUE toast 0 2\r\nhi\r\nEND\r\n"),
                (b"get foo\r\n", b"END\r\n"),  # the auth set stored nothing
            ]:
                s.sendall(req)
                self.assertEqual(recv_until(s, want), want, req)
            s2 = srv.connect()
            s2.sendall(b"set x 0 0 10\r\nbaaaz quux\r\nget toast\r\n")
            self.assertEqual(recv_until(s2, b"END\r\n"),
                             b"STORED\r\nVALUE toast 0 2\r\nhi\r\nEND\r\n")
            st = parse_stats_of(s2)
            self.assertEqual(st["auth_cmds"], "5")
            self.assertEqual(st["auth_errors"], "3")
            # binary: nothing before SASL, which takes the same entries
            b = srv.connect()
            hdr = struct.pack(">BBHBBHIIQ", 0x80, 0x00, 5, 0, 0, 0, 5, 0, 0)
            b.sendall(hdr + b"toast")  # GET, unauthenticated
            resp = harness.recv_exact(b, 24)
            self.assertEqual(struct.unpack(">H", resp[6:8])[0], 0x20)
            harness.recv_exact(b, struct.unpack(">I", resp[8:12])[0])
            b = srv.connect()
            self.assertEqual(sasl_plain(b, b"foo", b"nope"), 0x20)
            self.assertEqual(sasl_plain(b, b"foo", b"bar"), 0)

    def test_sighup_reloads_and_bad_files_refuse(self):
        with self.server("foo:bar\n") as srv:
            with open(self.path, "w") as f:
                f.write("new:pass\n")
            srv.proc.send_signal(signal.SIGHUP)

            def new_works():
                return srv.request(b"set x 0 0 8\r\nnew pass\r\n") == \
                    b"STORED\r\n"
            self.assertTrue(wait_for(new_works, timeout=5))
            s = srv.connect()
            s.sendall(b"set x 0 0 7\r\nfoo bar\r\n")
            self.assertEqual(recv_until(s, b"\r\n"),
                             b"CLIENT_ERROR authentication failure\r\n")
            # a broken file on reload keeps the entries in force
            with open(self.path, "w") as f:
                f.write("no colon here\n")
            srv.proc.send_signal(signal.SIGHUP)
            self.assertTrue(wait_for(
                lambda: "not reloaded" in srv.stderr(), timeout=5))
            self.assertTrue(new_works())
        rc, _, err = harness.run(["-Y", "/nonexistent/x"])
        self.assertNotEqual(rc, 0)
        self.assertIn("auth_file", err)


def parse_stats_of(sock):
    sock.sendall(b"stats\r\n")
    return parse_stats(recv_until(sock, b"END\r\n"))


if __name__ == "__main__":
    harness.main()
