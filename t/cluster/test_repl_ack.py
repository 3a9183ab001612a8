"""Acknowledged writes (repl_ack_wait_ms): a node answers a write only once
a peer holds it.

- With the setting, every write node 1 answered is already readable on
  node 2 at once (text and binary sets, a pipeline whose replies keep
  their order); the same loop on a cluster without the setting is run for
  comparison and its count printed.
- With node 2 stopped (SIGSTOP), a write gets no answer: the connection
  closes after repl_ack_wait_ms and repl_ack_failures counts it; once
  node 2 runs again, writes are answered again.
- Eight writers on node 1 of three until node 1 is killed (SIGKILL):
  every write it answered is on both survivors once they reconciled.
  (Without the setting the same run fails: two such runs lost 7 of
  14,247 and 4 of 19,197 answered writes, the loss window.)
- The setting is refused without replication and with replicas > 0.
"""

import os
import signal
import socket
import struct
import subprocess
import threading
import time
import unittest
import urllib.request

import cluster
import harness
from cluster import Cluster, free_ports, wait_until

WRITES = 200
WRITERS = 8


def connect(port):
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


def read_until(s, end, limit=1 << 16):
    """Reads until the bytes end with `end`; b"" at the peer's close."""
    buf = b""
    while not buf.endswith(end) and len(buf) < limit:
        chunk = s.recv(4096)
        if not chunk:
            return buf if buf else b""
        buf += chunk
    return buf


def text_set(s, key, value):
    s.sendall(b"set %s 0 0 %d\r\n%s\r\n" % (key, len(value), value))
    return read_until(s, b"\r\n")


def text_get(s, key):
    s.sendall(b"get %s\r\n" % key)
    return read_until(s, b"END\r\n")


def binary_set(s, key, value):
    """A binary SET (opcode 1, 8 bytes of extras); returns the status."""
    extras = struct.pack(">II", 0, 0)
    body = extras + key + value
    s.sendall(struct.pack(">BBHBBHIIQ", 0x80, 0x01, len(key), len(extras), 0,
                          0, len(body), 7, 0) + body)
    head = b""
    while len(head) < 24:
        chunk = s.recv(24 - len(head))
        if not chunk:
            return None
        head += chunk
    _, _, _, _, _, status, blen, _, _ = struct.unpack(">BBHBBHIIQ", head)
    left = blen
    while left > 0:
        left -= len(s.recv(left))
    return status


def immediate_reads(cl, prefix):
    """Sets WRITES keys on node 1, each read on node 2 right after its
    answer; returns how many node 2 already held, and the median time a
    set took (ms)."""
    w, r = connect(cl[0].port), connect(cl[1].port)
    held, took = 0, []
    try:
        for i in range(WRITES):
            key = b"%s%d" % (prefix, i)
            t0 = time.monotonic()
            if text_set(w, key, b"v%d" % i) != b"STORED\r\n":
                raise AssertionError("set %r not stored" % key)
            took.append(time.monotonic() - t0)
            if b"VALUE " + key in text_get(r, key):
                held += 1
    finally:
        w.close()
        r.close()
    took.sort()
    return held, 1000 * took[len(took) // 2]


class ReplAck(unittest.TestCase):
    def test_answered_writes_are_on_a_peer(self):
        with Cluster(2) as plain:
            plain.wait_connected()
            held_plain, ms_plain = immediate_reads(plain, b"p")
        cl = Cluster(2, extra={"repl_ack_wait_ms": 2000})
        mport = free_ports(1)[0]
        cl.set_on_node(0, "metrics_port", mport)
        with cl:
            cl.wait_connected()
            held, ms = immediate_reads(cl, b"a")
            print("node 2 held %d of %d answered sets at once with "
                  "repl_ack_wait_ms (median set %.2f ms), %d of %d "
                  "without (median set %.2f ms)" %
                  (held, WRITES, ms, held_plain, WRITES, ms_plain))
            self.assertEqual(held, WRITES)

            # A pipeline: the replies come in order, after the
            # confirmation; both writes are on node 2 by then.
            w, r = connect(cl[0].port), connect(cl[1].port)
            w.sendall(b"set pa 0 0 1\r\na\r\nget pa\r\n"
                      b"set pb 0 0 1\r\nb\r\n")
            self.assertEqual(read_until(w, b"STORED\r\nVALUE pa 0 1\r\n"
                                           b"a\r\nEND\r\nSTORED\r\n"),
                             b"STORED\r\nVALUE pa 0 1\r\na\r\nEND\r\n"
                             b"STORED\r\n")
            self.assertIn(b"VALUE pb", text_get(r, b"pb"))
            self.assertIn(b"VALUE pa", text_get(r, b"pa"))

            # A large reply still going out when a write waits: it
            # completes after the confirmation, in order.
            big = b"B" * (768 * 1024)
            self.assertEqual(text_set(w, b"big", big), b"STORED\r\n")
            w.sendall(b"get big\r\nset after-big 0 0 1\r\nz\r\n")
            time.sleep(0.2)  # the socket fills, the set waits
            want = (b"VALUE big 0 %d\r\n%s\r\nEND\r\nSTORED\r\n" %
                    (len(big), big))
            self.assertEqual(read_until(w, b"END\r\nSTORED\r\n",
                                        limit=len(want) + 1), want)
            self.assertIn(b"VALUE after-big", text_get(r, b"after-big"))

            # The binary protocol waits the same way.
            b = connect(cl[0].port)
            for i in range(20):
                self.assertEqual(binary_set(b, b"bin%d" % i, b"x"), 0)
                self.assertIn(b"VALUE bin%d" % i,
                              text_get(r, b"bin%d" % i))
            for s in (w, r, b):
                s.close()
            st = cl[0].stats()
            self.assertGreaterEqual(int(st["repl_ack_waits"]), 1)
            self.assertEqual(int(st["repl_ack_failures"]), 0)
            acks = int(cl[0].repl_stats()["push_acks"])
            self.assertGreater(acks, 0)
            with urllib.request.urlopen(
                    "http://127.0.0.1:%d/metrics" % mport, timeout=10) as u:
                text = u.read().decode()
            m = dict(line.rsplit(" ", 1) for line in text.splitlines()
                     if line and not line.startswith("#"))
            self.assertEqual(m["ribltcache_ack_waits_total"],
                             st["repl_ack_waits"])
            self.assertEqual(m["ribltcache_ack_failures_total"], "0")
            self.assertGreaterEqual(int(m["ribltcache_push_acks_total"]),
                                    acks)

    def test_unconfirmed_write_is_not_answered(self):
        cl = Cluster(2, extra={"repl_ack_wait_ms": 300})
        with cl:
            cl.wait_connected()
            w = connect(cl[0].port)
            self.assertEqual(text_set(w, b"before", b"1"), b"STORED\r\n")
            os.kill(cl[1].proc.pid, signal.SIGSTOP)
            try:
                t0 = time.monotonic()
                reply = text_set(w, b"lonely", b"2")
                waited = time.monotonic() - t0
                print("with the peer stopped, the set's connection closed "
                      "after %.2f s (repl_ack_wait_ms 300), reply %r" %
                      (waited, reply))
                self.assertEqual(reply, b"")
                self.assertGreaterEqual(waited, 0.25)
                w.close()
                self.assertEqual(
                    int(cl[0].stats()["repl_ack_failures"]), 1)
                # The node still serves; it holds the write itself.
                r = connect(cl[0].port)
                self.assertIn(b"VALUE lonely", text_get(r, b"lonely"))
                r.close()
            finally:
                os.kill(cl[1].proc.pid, signal.SIGCONT)
            # The peer is back: writes are answered again, and held there.
            def stored():
                try:
                    with connect(cl[0].port) as s:
                        return text_set(s, b"after", b"3") == b"STORED\r\n"
                except OSError:
                    return False
            self.assertTrue(wait_until(stored, 20.0), cl.logs())
            with connect(cl[1].port) as r:
                self.assertIn(b"VALUE after", text_get(r, b"after"))
                # The unanswered write reaches the peer as any other.
                self.assertTrue(wait_until(
                    lambda: b"VALUE lonely" in text_get(r, b"lonely"), 20.0))

    def test_acknowledged_writes_survive_kill(self):
        # Three nodes, writers on node 1 until it is killed with SIGKILL;
        # every write it answered must be on node 2 and node 3 once they
        # have reconciled, the window notwithstanding.
        cl = Cluster(3, extra={"repl_ack_wait_ms": 2000})
        with cl:
            cl.wait_connected()
            acked = [[] for _ in range(WRITERS)]
            stop = threading.Event()

            def writer(n):
                try:
                    s = connect(cl[0].port)
                    for i in range(100000):
                        if stop.is_set():
                            break
                        key = b"k%d-%d" % (n, i)
                        if text_set(s, key, b"%d" % i) != b"STORED\r\n":
                            break
                        acked[n].append(key)
                except OSError:
                    pass
            threads = [threading.Thread(target=writer, args=(n,))
                       for n in range(WRITERS)]
            for t in threads:
                t.start()
            # Killed once the writers have had a few hundred sets
            # acknowledged, however slowly the machine serves them.
            wait_until(lambda: sum(len(a) for a in acked) >= 200, 20)
            cl[0].sigkill()
            stop.set()
            for t in threads:
                t.join(10)
            keys = [k for a in acked for k in a]
            self.assertGreater(len(keys), 100)

            def missing(node):
                with connect(node.port) as s:
                    return [k for k in keys
                            if b"VALUE " + k not in text_get(s, k)]
            left = {}
            for node in cl.nodes[1:]:
                left[node.name] = wait_until(
                    lambda: not missing(node), 20.0) or missing(node)
            print("%d writes answered before node 1 was killed; missing "
                  "on the survivors: %s" % (
                      len(keys), {k: (0 if v is True else len(v))
                                  for k, v in left.items()}))
            for name, v in left.items():
                self.assertIs(v, True, "%s lacks %s" % (name, v))

    def refused(self, args):
        p = subprocess.run([harness.SERVER, "-l", "127.0.0.1"] + args,
                           stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, timeout=15)
        err = p.stderr.decode(errors="replace")
        self.assertNotEqual(p.returncode, 0, err)
        self.assertIn("repl_ack_wait_ms", err)

    def test_refused_settings(self):
        cp, pp, other = free_ports(3)
        self.refused(["-p", str(cp), "-o", "repl_ack_wait_ms=100"])
        self.refused(["-p", str(cp), "--repl-port", str(pp), "--node-id",
                      "1", "--cluster-secret", cluster.SECRET, "--peers",
                      "127.0.0.1:%d" % other, "-o",
                      "repl_ack_wait_ms=100,replicas=1"])


if __name__ == "__main__":
    cluster.main()
