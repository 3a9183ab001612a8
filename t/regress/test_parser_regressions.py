"""Regression tests for classic memcached parser bugs, black-box.

Each test sends the kind of request that has broken memcached-compatible
parsers before (lengths that overflow, counts out of range, keys one byte
too long, data blocks without their CRLF, endless lines, stray spaces, too
many tokens, unknown binary opcodes, a client that never reads) and checks
the exact reply where memcached defines one. After every test a fresh
connection must still answer `version`, a canary key set before the test
must be intact, and curr_items must not have moved: bad input changes
nothing.

Usage: test_parser_regressions.py --server PATH [unittest args]
"""

import os
import socket
import struct
import sys
import threading
import time
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", "proto"))
import harness  # noqa: E402
from harness import Server, recv_exact, recv_until  # noqa: E402

CANARY_KEY = b"regress:canary"
CANARY_VALUE = b"the canary is alive"
ITEM_MAX = 1024 * 1024  # the daemon's default -I

# Binary protocol
REQ, RES = 0x80, 0x81
OP_GET, OP_SET, OP_NOOP = 0x00, 0x01, 0x0A
ST_TOO_LARGE, ST_EINVAL, ST_UNKNOWN = 0x03, 0x04, 0x81
SET_EXTRAS = struct.pack(">II", 0, 0)


def bin_request(op, key=b"", extras=b"", value=b"", opaque=0, bodylen=None):
    """A binary request; bodylen overrides the honest body length."""
    if bodylen is None:
        bodylen = len(key) + len(extras) + len(value)
    return struct.pack(">BBHBBHIIQ", REQ, op, len(key), len(extras), 0, 0,
                       bodylen, opaque, 0) + extras + key + value


def bin_error(op, status, text, opaque=0):
    """The exact bytes of an error response carrying text as its body."""
    return struct.pack(">BBHBBHIIQ", RES, op, 0, 0, 0, status, len(text),
                       opaque, 0) + text


def read_reply(sock, want=None, quiet=0.3, timeout=10.0):
    """Reads until `want` bytes arrived (or, without want, until the
    connection is quiet for `quiet` s), then waits `quiet` s more for
    anything extra. Returns (bytes, closed): closed is True when the server
    closed or reset the connection."""
    deadline = time.monotonic() + timeout
    buf = b""
    while time.monotonic() < deadline:
        if want is not None and len(buf) >= want:
            wait = quiet
        elif want is not None:
            wait = deadline - time.monotonic()
        else:
            wait = quiet
        sock.settimeout(max(wait, 0.01))
        try:
            chunk = sock.recv(1 << 20)
        except socket.timeout:
            return buf, False
        except ConnectionResetError:
            return buf, True
        if not chunk:
            return buf, True
        buf += chunk
    return buf, False


def send_all(sock, data):
    """Sends data; False if the server closed the connection meanwhile."""
    try:
        sock.sendall(data)
        return True
    except (BrokenPipeError, ConnectionResetError):
        return False


class ParserRegressions(unittest.TestCase):
    srv = None

    @classmethod
    def setUpClass(cls):
        cls.srv = Server(["-t", "2"]).start()

    @classmethod
    def tearDownClass(cls):
        cls.srv.close()

    # -- the invariant every test ends with -----------------------------

    def setUp(self):
        reply = self.srv.request(b"set %s 0 0 %d\r\n%s\r\n" %
                                 (CANARY_KEY, len(CANARY_VALUE),
                                  CANARY_VALUE))
        self.assertEqual(reply, b"STORED\r\n")
        self.items = self.srv.stats()["curr_items"]
        self.rss = self.srv.rss_kb()

    def tearDown(self):
        self.assertTrue(self.srv.alive(), "the server died (exit status "
                        "%s):\n%s" % (self.srv.proc.poll(),
                                       self.srv.stderr()[-3000:]))
        reply = self.srv.request(b"version\r\n")
        self.assertTrue(reply.startswith(b"VERSION ") and
                        reply.endswith(b"\r\n"), reply)
        self.assertEqual(
            self.srv.request(b"get %s\r\n" % CANARY_KEY, b"END\r\n"),
            b"VALUE %s 0 %d\r\n%s\r\nEND\r\n" %
            (CANARY_KEY, len(CANARY_VALUE), CANARY_VALUE))
        self.assertEqual(self.srv.stats()["curr_items"], self.items)

    def exchange(self, data, want=None, quiet=0.3):
        """Sends data on a fresh connection; returns (reply, closed)."""
        with self.srv.connect() as s:
            if not send_all(s, data):
                return read_reply(s, want, quiet)[0], True
            return read_reply(s, want, quiet)

    def assert_missing(self, key):
        self.assertEqual(self.srv.request(b"get %s\r\n" % key), b"END\r\n")

    def assert_rss_bounded(self, limit_kb):
        grown = self.srv.rss_kb() - self.rss
        self.assertLess(grown, limit_kb, "RSS grew by %d kB" % grown)

    # -- binary lengths --------------------------------------------------

    def test_bin_key_and_extras_exceed_body(self):
        # memcached answers "Unknown command" and closes the connection
        # (for the first case; for the others it waits for keylen + extlen
        # bytes before it notices, a wait this server does not make).
        cases = [
            (OP_SET, bin_request(OP_SET, b"k" * 10, SET_EXTRAS, bodylen=12)),
            (OP_GET, bin_request(OP_GET, b"k" * 10, bodylen=5)[:-5]),
            (OP_SET, struct.pack(">BBHBBHIIQ", REQ, OP_SET, 0xFFFF, 0xFF, 0,
                                 0, 100, 0, 0) + b"x" * 100),
        ]
        for op, req in cases:
            with self.subTest(op=op, req=req[:24].hex()):
                reply, closed = self.exchange(req)
                self.assertEqual(reply,
                                 bin_error(op, ST_UNKNOWN, b"Unknown command"))
                self.assertTrue(closed)
        self.assert_missing(b"k" * 10)

    def test_bin_bodylen_near_2_32(self):
        for bodylen in (0xFFFFFFFF, 0xFFFFFFF0, 0x80000000):
            with self.subTest(bodylen=bodylen):
                # A get carries no value: memcached refuses it as invalid.
                reply, closed = self.exchange(
                    bin_request(OP_GET, b"k", bodylen=bodylen) + b"k")
                self.assertEqual(reply, bin_error(OP_GET, ST_EINVAL,
                                                  b"Invalid arguments"))
                self.assertTrue(closed)
                # A set announcing ~4 GB: refused before anything is
                # buffered. memcached says "Too large." (once it has
                # swallowed what arrived); this server may also refuse it
                # as invalid and close.
                with self.srv.connect() as s:
                    send_all(s, bin_request(OP_SET, b"k", SET_EXTRAS,
                                            bodylen=bodylen) +
                             SET_EXTRAS + b"k" + b"v" * 65536)
                    reply, _ = read_reply(s, 24)
                self.assertGreaterEqual(len(reply), 24, reply)
                magic, op, _, _, _, status, blen = struct.unpack(
                    ">BBHBBHI", reply[:12])
                self.assertEqual((magic, op), (RES, OP_SET))
                self.assertIn(status, (ST_TOO_LARGE, ST_EINVAL))
                self.assertEqual(len(reply), 24 + blen)
        self.assert_missing(b"k")
        self.assert_rss_bounded(64 << 10)

    def test_bin_value_above_item_limit(self):
        value = b"v" * (2 * ITEM_MAX)
        req = bin_request(OP_SET, b"big", SET_EXTRAS, value)
        reply, closed = self.exchange(req + bin_request(OP_NOOP, opaque=9),
                                      quiet=1.0)
        too_large = bin_error(OP_SET, ST_TOO_LARGE, b"Too large.")
        self.assertTrue(reply.startswith(too_large), reply[:64])
        # The value is swallowed and the connection goes on, or it is
        # closed; it is never taken as commands.
        rest = reply[len(too_large):]
        if not closed:
            self.assertEqual(rest, struct.pack(">BBHBBHIIQ", RES, OP_NOOP, 0,
                                               0, 0, 0, 0, 9, 0))
        else:
            self.assertIn(rest, (b"", struct.pack(">BBHBBHIIQ", RES, OP_NOOP,
                                                  0, 0, 0, 0, 0, 9, 0)))
        self.assert_missing(b"big")

    def test_bin_unknown_opcodes(self):
        for op in (0x1F, 0x42, 0x7F, 0xC0, 0xFF):
            with self.subTest(op=op):
                with self.srv.connect() as s:
                    s.sendall(bin_request(op, opaque=0x1234) +
                              bin_request(OP_NOOP, opaque=0x5678))
                    want = bin_error(op, ST_UNKNOWN, b"Unknown command",
                                     0x1234) + struct.pack(
                        ">BBHBBHIIQ", RES, OP_NOOP, 0, 0, 0, 0, 0, 0x5678, 0)
                    self.assertEqual(recv_exact(s, len(want), 10), want)

    # -- text byte counts ------------------------------------------------

    def test_text_byte_counts(self):
        # memcached gives these exact bytes for all but 2^32, on which it
        # waits for a data block (its length wraps).
        for count in (b"-1", b"2147483647", b"4294967295", b"4294967296",
                      b"18446744073709551616", b"1" * 40, b"0x10", b"12ab"):
            with self.subTest(count=count):
                reply, _ = self.exchange(b"set k 0 0 %s\r\n" % count)
                self.assertEqual(reply,
                                 b"CLIENT_ERROR bad command line format\r\n")
        self.assert_missing(b"k")

    def test_text_value_above_item_limit(self):
        n = 2 * ITEM_MAX
        reply, _ = self.exchange(b"set big 0 0 %d\r\n%s\r\nversion\r\n" %
                                 (n, b"v" * n), quiet=1.0)
        # memcached swallows the data block and goes on.
        self.assertTrue(reply.startswith(
            b"SERVER_ERROR object too large for cache\r\nVERSION "), reply)
        self.assertTrue(reply.endswith(b"\r\n"))
        self.assertEqual(reply.count(b"\r\n"), 2)
        self.assert_missing(b"big")

    # -- keys, data blocks, lines ----------------------------------------

    def test_key_of_251_bytes(self):
        key = b"a" * 251
        bad = b"CLIENT_ERROR bad command line format\r\n"
        # The data line that follows a refused set is then a bad command.
        self.assertEqual(self.exchange(b"set %s 0 0 1\r\nx\r\n" % key)[0],
                         bad + b"ERROR\r\n")
        self.assertEqual(self.exchange(b"get %s\r\n" % key)[0], bad)
        self.assertEqual(self.exchange(b"delete %s\r\n" % key)[0], bad)
        self.assertEqual(self.exchange(b"incr %s 1\r\n" % key)[0], bad)
        self.assertEqual(self.exchange(b"touch %s 1\r\n" % key)[0], bad)
        self.assertEqual(self.exchange(b"mg %s v\r\n" % key)[0], bad)
        self.assert_missing(b"a" * 250)

    def test_data_block_without_crlf(self):
        reply, _ = self.exchange(b"set k 0 0 3\r\nabcde\r\n")
        self.assertEqual(reply, b"CLIENT_ERROR bad data chunk\r\nERROR\r\n")
        reply, _ = self.exchange(b"set k 0 0 3\r\nabcXY")
        self.assertEqual(reply, b"CLIENT_ERROR bad data chunk\r\n")
        reply, _ = self.exchange(b"set k 0 0 3\r\nabc\nX")
        self.assertTrue(reply.startswith(b"CLIENT_ERROR bad data chunk\r\n"),
                        reply)
        self.assert_missing(b"k")

    def test_line_longer_than_buffer(self):
        # Past the longest line the server accepts, with no newline: it
        # answers a CLIENT_ERROR or closes (memcached closes); it does not
        # wait forever or keep the bytes.
        junk = b"x" * (1 << 20)
        with self.srv.connect() as s:
            sent = 0
            while sent < (16 << 20) and send_all(s, junk):
                sent += len(junk)
            reply, closed = read_reply(s, quiet=1.0)
        self.assertTrue(closed or reply.startswith(b"CLIENT_ERROR "), reply)
        self.assertTrue(reply == b"" or reply.endswith(b"\r\n"), reply)
        self.assertNotIn(b"STORED", reply)
        # The same with a command name in front (memcached reads get keys
        # as they come; this server caps the whole line).
        with self.srv.connect() as s:
            send_all(s, b"get " + b"k" * (4 << 20))
            reply, closed = read_reply(s, quiet=1.0)
        self.assertTrue(closed or reply.startswith(b"CLIENT_ERROR "), reply)
        self.assert_rss_bounded(64 << 10)

    def test_get_followed_by_spaces(self):
        spaces = b" " * 300
        self.assertEqual(self.exchange(b"get%s\r\n" % spaces)[0],
                         b"ERROR\r\n")
        self.assertEqual(self.exchange(b"get%sk\r\n" % spaces)[0],
                         b"END\r\n")
        self.assertEqual(
            self.exchange(b"get%s%s%s\r\n" % (spaces, CANARY_KEY, spaces))[0],
            b"VALUE %s 0 %d\r\n%s\r\nEND\r\n" %
            (CANARY_KEY, len(CANARY_VALUE), CANARY_VALUE))

    def test_more_tokens_than_allowed(self):
        extra = b"x " * 30
        # The data line is read as a command after the refused set.
        self.assertEqual(self.exchange(b"set k 0 0 1 %s\r\nx\r\n" % extra)[0],
                         b"ERROR\r\nERROR\r\n")
        self.assertEqual(self.exchange(b"incr k 1 %s\r\n" % extra)[0],
                         b"ERROR\r\n")
        self.assertEqual(self.exchange(b"delete k %s\r\n" % extra)[0],
                         b"ERROR\r\n")
        # get takes any number of keys.
        self.assertEqual(self.exchange(b"get %s\r\n" % (b"k " * 300))[0],
                         b"END\r\n")
        one = b"VALUE %s 0 %d\r\n%s\r\n" % (CANARY_KEY, len(CANARY_VALUE),
                                           CANARY_VALUE)
        want = one * 200 + b"END\r\n"
        reply, _ = self.exchange(b"get %s\r\n" % (b" ".join([CANARY_KEY] *
                                                              200)),
                                 want=len(want))
        self.assertEqual(reply, want)
        self.assert_missing(b"k")

    # -- a client that never reads ---------------------------------------

    def test_client_never_reads(self):
        value = b"r" * 65536
        reply = self.srv.request(b"set bigread 0 0 %d\r\n%s\r\n" %
                                 (len(value), value))
        self.assertEqual(reply, b"STORED\r\n")
        self.items = self.srv.stats()["curr_items"]
        self.rss = self.srv.rss_kb()
        # Each 13-byte request asks for a 64 kB reply: a server that kept
        # reading would need gigabytes of output buffer.
        flooder = self.srv.connect()
        flooder.setblocking(False)
        chunk = b"get bigread\r\n" * 4096
        offered, limit = 0, 64 << 20
        deadline = time.monotonic() + 30
        last = time.monotonic()
        stalled = False
        other = self.srv.connect()
        answered = 0
        try:
            while offered < limit and time.monotonic() < deadline:
                try:
                    offered += flooder.send(chunk)
                    last = time.monotonic()
                except (BlockingIOError, InterruptedError):
                    if time.monotonic() - last > 2.0:
                        stalled = True
                        break
                    time.sleep(0.01)
                # Another client is answered meanwhile.
                other.sendall(b"get %s\r\n" % CANARY_KEY)
                self.assertEqual(recv_until(other, b"END\r\n", timeout=10),
                                 b"VALUE %s 0 %d\r\n%s\r\nEND\r\n" %
                                 (CANARY_KEY, len(CANARY_VALUE),
                                  CANARY_VALUE))
                answered += 1
            self.assertTrue(stalled, "the server read %d bytes" % offered)
            self.assertGreater(answered, 0)
            self.assert_rss_bounded(256 << 10)
        finally:
            flooder.close()
            other.close()
        self.assertEqual(self.srv.request(b"delete bigread\r\n"),
                         b"DELETED\r\n")
        self.items = self.srv.stats()["curr_items"]


if __name__ == "__main__":
    harness.main()
