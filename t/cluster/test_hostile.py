"""Hostile peers against a running node. Each test starts one node with
replication on (its peer list names only an address nobody listens on,
so every counter change is the test's doing), keeps a pymemcache client
busy on it throughout, attacks the peer port and checks that the node
closes the bad connection and counts it, that the client never sees an
error and that the node's memory stays bounded."""

import random
import socket
import struct
import threading
import time
import unittest

from pymemcache.client.base import Client

import cluster
import peerwire
from cluster import Cluster, free_ports, rss_kb, wait_until
from peerwire import Closed, Peer

MAX_SYMBOLS = 65536  # the node's repl_max_symbols: 16 full batches
SKETCH_SYMBOLS = 8192  # the node's sketch_symbols (the default)


def rss_bound_kb():
    """How much the node's RSS may grow: 64 MB (more under a sanitizer,
    whose allocator keeps freed memory in quarantine)."""
    return (256 if cluster.sanitized() else 64) * 1024


class ClientLoad(threading.Thread):
    """A memcached client doing set/get on the node until stopped (at most
    MAX_OPS operations); every failure is recorded."""

    MAX_OPS = 200000

    def __init__(self, port):
        super().__init__(daemon=True)
        self.port = port
        self.ops = 0
        self.errors = []
        self.halt = threading.Event()

    def run(self):
        c = Client(("127.0.0.1", self.port), connect_timeout=5, timeout=5)
        try:
            for i in range(self.MAX_OPS):
                if self.halt.is_set():
                    break
                key = "load-%d" % (i % 20)
                value = b"v%d" % i
                try:
                    if not c.set(key, value, noreply=False):
                        self.errors.append("set %s not stored" % key)
                    got = c.get(key)
                    if got != value:
                        self.errors.append("get %s: %r" % (key, got))
                except Exception as e:
                    self.errors.append("op %d: %r" % (i, e))
                self.ops += 1
                time.sleep(0.002)
        finally:
            c.close()

    def stop(self):
        self.halt.set()
        self.join(timeout=15)


class Hostile(unittest.TestCase):
    def setUp(self):
        cp, pp, nobody = free_ports(3)
        self.cl = Cluster(1, ports=([cp], [pp]), extra={
            "peers": "127.0.0.1:%d" % nobody,
            "repl_max_symbols": MAX_SYMBOLS,
        })
        self.cl.start()
        self.addCleanup(self.cl.close)
        self.node = self.cl[0]
        self.load = ClientLoad(self.node.port)
        self.load.start()
        self.addCleanup(self.load.stop)
        # Some data, so that symbol streams and fetches have work to do.
        c = Client(("127.0.0.1", self.node.port), timeout=5)
        self.assertEqual(c.set_many({"data-%d" % i: b"x" * 100
                                     for i in range(2000)},
                                    noreply=False), [])
        c.close()
        self.assertTrue(wait_until(lambda: self.load.ops >= 20, 10.0))
        self.rss0 = rss_kb(self.node.pid)
        self.rss_max = self.rss0
        self.st0 = self.node.repl_stats()

    def tearDown(self):
        # The node is alive, its client saw no error, its memory stayed
        # bounded, and it still serves a well-behaved peer.
        ops = self.load.ops
        self.assertTrue(wait_until(lambda: self.load.ops >= ops + 10, 10.0),
                        "the client made no progress")
        self.assertTrue(self.node.alive(), self.node.stderr())
        self.assertEqual(self.load.errors, [])
        self.sample_rss()
        self.assertLess(self.rss_max - self.rss0, rss_bound_kb(),
                        "RSS grew from %d kB to %d kB" % (self.rss0,
                                                         self.rss_max))
        with Peer(self.node.repl_port) as p:
            p.handshake(cluster.SECRET.encode())
            p.symbols_req(0, 64)
            ftype, _, payload = p.recv_frame()
            self.assertEqual(ftype, peerwire.SYMBOLS)
            offset, size, n = peerwire.parse_symbols(payload)
            self.assertEqual((offset, n), (0, 64))
            self.assertGreaterEqual(size, 2000)

    def sample_rss(self):
        """Records the node's RSS (the peak is checked in tearDown)."""
        self.rss_max = max(self.rss_max, rss_kb(self.node.pid))

    def over_bound(self):
        self.sample_rss()
        return self.rss_max - self.rss0 >= rss_bound_kb()

    def delta(self, name):
        return int(self.node.repl_stats()[name]) - int(self.st0[name])

    def wait_delta(self, name, at_least, timeout=10.0):
        ok = wait_until(lambda: self.delta(name) >= at_least, timeout)
        self.assertTrue(ok, "%s rose by %d, expected %d or more" % (
            name, self.delta(name), at_least))

    def send_until_closed(self, sock, chunks):
        """Sends chunks until the node closes; True if it closed."""
        sock.settimeout(5.0)
        try:
            for chunk in chunks:
                sock.sendall(chunk)
                self.sample_rss()
        except (BrokenPipeError, ConnectionResetError):
            return True
        except socket.timeout:
            return False
        return None

    # -------------------------------------------------------- tests

    def test_random_garbage(self):
        rng = random.Random(7)
        conns = 10
        for _ in range(conns):
            with Peer(self.node.repl_port) as p:
                blob = bytes(rng.getrandbits(8) for _ in range(64 << 10))
                if blob[:2] == b"RB":
                    blob = b"X" + blob[1:]
                self.send_until_closed(p.sock, [blob] * 16)
                self.assertTrue(p.wait_closed(), "garbage left open")
        self.wait_delta("bad_frames", conns)

    def test_huge_frame_header(self):
        # Before the handshake and after it: a header announcing a 4 GiB
        # payload, then a stream of filler the node must never buffer.
        filler = [b"\0" * (1 << 20)] * 64
        with Peer(self.node.repl_port) as p:
            p.send(peerwire.header(peerwire.HELLO, 0xFFFFFFFF, 0))
            self.send_until_closed(p.sock, filler)
            self.assertTrue(p.wait_closed())
        self.wait_delta("bad_frames", 1)
        with Peer(self.node.repl_port) as p:
            p.handshake(cluster.SECRET.encode())
            p.send(peerwire.header(peerwire.MUTATIONS, 0xFFFFFFFF,
                                   p.seq_out))
            self.send_until_closed(p.sock, filler)
            self.assertTrue(p.wait_closed())
        self.wait_delta("bad_frames", 2)

    def test_bad_authentication(self):
        secret = cluster.SECRET.encode()
        # A PROOF made with the wrong secret (its tag and its proof).
        with Peer(self.node.repl_port) as p:
            p.hello(91)
            wrong = b"not-the-secret"
            key = p.derive(wrong, "ribltcache session key", 0)
            p.send_frame(peerwire.PROOF,
                         p.derive(wrong, "ribltcache proof", 0), key=key)
            self.assertTrue(p.wait_closed())
        self.wait_delta("auth_failures", 1)
        # The right session key but a wrong proof in it.
        with Peer(self.node.repl_port) as p:
            p.hello(92)
            p.key = p.derive(secret, "ribltcache session key", 0)
            p.send_frame(peerwire.PROOF, bytes(32))
            self.assertTrue(p.wait_closed())
        self.wait_delta("auth_failures", 2)
        # A right PROOF with a replayed seq (1 instead of 0).
        with Peer(self.node.repl_port) as p:
            p.hello(93)
            p.key = p.derive(secret, "ribltcache session key", 0)
            p.seq_out = 1
            p.send_frame(peerwire.PROOF,
                         p.derive(secret, "ribltcache proof", 0))
            self.assertTrue(p.wait_closed())
        self.wait_delta("auth_failures", 3)
        # Skipping the proof: a request right after the CHALLENGE.
        with Peer(self.node.repl_port) as p:
            p.hello(94)
            p.send(peerwire.frame(peerwire.SYMBOLS_REQ,
                                  struct.pack("<QI", 0, 64)))
            self.assertTrue(p.wait_closed())
        self.wait_delta("auth_failures", 4)
        # A peer that says HELLO and then nothing is dropped too.
        with Peer(self.node.repl_port) as p:
            p.hello(95)
            self.assertTrue(p.wait_closed(timeout=20.0),
                            "a stalled handshake stays open")
        # None of them got in: nothing was applied.
        self.assertEqual(self.delta("applied"), 0)

    def test_symbol_stream_capped(self):
        # An authenticated peer that keeps asking for symbols of one round
        # (reading the replies) is cut off at repl_max_symbols in a walked
        # round, and where the sketch ends in a round served from it.
        self.stream_until_cut(walk=True, cap=MAX_SYMBOLS, bad_frames=1)
        self.stream_until_cut(walk=False, cap=SKETCH_SYMBOLS, bad_frames=2)

    def stream_until_cut(self, walk, cap, bad_frames):
        with Peer(self.node.repl_port) as p:
            p.handshake(cluster.SECRET.encode())
            offset, served, closed = 0, 0, False
            for _ in range(4 * MAX_SYMBOLS // 4096):
                try:
                    p.symbols_req(offset, 4096, walk=walk and offset == 0)
                    ftype, _, payload = p.recv_frame()
                except (Closed, BrokenPipeError, ConnectionResetError):
                    closed = True
                    break
                if ftype != peerwire.SYMBOLS:
                    self.assertEqual(ftype, peerwire.ERROR)
                    closed = p.wait_closed()
                    break
                got_offset, _, n = peerwire.parse_symbols(payload)
                self.assertEqual((got_offset, n), (offset, 4096))
                served += n
                offset += n
                self.sample_rss()
            self.assertTrue(closed, "still served at offset %d" % offset)
            self.assertEqual(served, cap)
        self.wait_delta("bad_frames", bad_frames)

    def test_symbol_flood_unread(self):
        # An authenticated peer that asks for symbols without ever reading
        # them: each 60-byte request asks for 128 KiB. The node must not
        # buffer the replies without bound (it stops reading, or drops the
        # peer).
        with Peer(self.node.repl_port) as p:
            p.handshake(cluster.SECRET.encode())
            p.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            p.sock.settimeout(2.0)
            sent = 0
            deadline = time.monotonic() + 15.0
            try:
                while sent < 20000 and time.monotonic() < deadline:
                    burst = b"".join(
                        peerwire.frame(peerwire.SYMBOLS_REQ,
                                       struct.pack("<QI", 0, 4096),
                                       p.seq_out + k, p.key)
                        for k in range(50))
                    p.sock.sendall(burst)
                    p.seq_out += 50
                    sent += 50
                    self.sample_rss()
                    if self.over_bound():
                        break  # failed already; spare the machine
            except socket.timeout:
                pass  # the node stopped reading: back-pressure
            except (BrokenPipeError, ConnectionResetError):
                pass  # the node dropped us
            # Give the node time to work through what it did read (the
            # test reads nothing meanwhile).
            served = wait_until(
                lambda: self.delta("served_symbol_requests") >= sent or
                self.over_bound(), 5.0)
            self.sample_rss()
            print("\nflood: %d requests sent, %d served (%s), RSS %d -> %d kB"
                  % (sent, self.delta("served_symbol_requests"), served,
                     self.rss0, self.rss_max))

    def test_many_silent_connections(self):
        # More connections than the node takes on its peer port, none
        # saying a word: the excess is refused and counted; once they are
        # gone a real peer gets in again (tearDown).
        socks = []
        try:
            for _ in range(300):
                socks.append(socket.create_connection(
                    ("127.0.0.1", self.node.repl_port), timeout=5))
            self.wait_delta("incoming_refused", 1)
            self.sample_rss()
        finally:
            for s in socks:
                s.close()

        def peer_gets_in():
            try:
                with Peer(self.node.repl_port) as p:
                    p.handshake(cluster.SECRET.encode())
                return True
            except (Closed, OSError):
                return False
        self.assertTrue(wait_until(peer_gets_in, 10.0, interval=0.2))

    def test_garbage_frames_after_auth(self):
        secret = cluster.SECRET.encode()
        rng = random.Random(11)
        cases = [
            # an unknown frame type
            lambda p: p.send_frame(200, b"hello"),
            # a symbol request of zero symbols, and one past the cap
            lambda p: p.symbols_req(0, 0),
            lambda p: p.symbols_req(MAX_SYMBOLS, 4096),
            # a request with a payload of the wrong size
            lambda p: p.send_frame(peerwire.SYMBOLS_REQ, b"\1\2\3"),
            # a fetch of a ragged id list
            lambda p: p.send_frame(peerwire.FETCH, b"\0" * 17),
            # a push of one mutation record cut short, and of one record
            # of an unknown kind (flags u8, count u32, records)
            lambda p: p.send_frame(peerwire.MUTATIONS, b"\2" +
                                   struct.pack("<I", 1) +
                                   bytes(peerwire.MUT_FIXED - 10)),
            lambda p: p.send_frame(peerwire.MUTATIONS, b"\2" +
                                   struct.pack("<I", 1) + b"\x09" +
                                   bytes(peerwire.MUT_FIXED - 1)),
            # raw bytes that are not a frame
            lambda p: p.send(bytes(rng.getrandbits(8) for _ in range(300))),
            # a frame whose tag is wrong
            lambda p: p.send_frame(peerwire.DONE, b"", key=bytes(32)),
        ]
        items = self.node.curr_items()
        bad0, auth0 = self.delta("bad_frames"), self.delta("auth_failures")
        rounds = 3  # every case on a fresh connection, this many times
        for _ in range(rounds):
            for i, case in enumerate(cases):
                with Peer(self.node.repl_port) as p:
                    p.handshake(secret)
                    case(p)
                    self.assertTrue(p.wait_closed(), "case %d left open" % i)
                self.sample_rss()
        got = (self.delta("bad_frames") - bad0) + \
            (self.delta("auth_failures") - auth0)
        self.assertTrue(wait_until(
            lambda: (self.delta("bad_frames") - bad0) +
            (self.delta("auth_failures") - auth0) >= rounds * len(cases),
            10.0), "counted %d of %d" % (got, rounds * len(cases)))
        self.assertEqual(self.node.curr_items(), items)
        self.assertEqual(self.delta("applied"), 0)


if __name__ == "__main__":
    cluster.main()
