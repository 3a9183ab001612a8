"""The peer protocol of ribltcached written independently in python, for
tests that play a (possibly hostile) peer.

Frames (replication/README.md, replication/repl_wire.h), little-endian:
  "RB" | version | type | length u32 | seq u64 | payload | tag[32]
HELLO and CHALLENGE carry a zero tag; every later frame carries
HMAC-SHA256(session key, header | payload) and seq counts the frames of
each direction from 0 (HELLO/CHALLENGE do not count).

Handshake: HELLO(node u32, nonce[32]) -> CHALLENGE(node u32, nonce[32]);
  derive(label, extra) = HMAC-SHA256(secret, label | extra byte
                          | client nonce | server nonce
                          | client node u32 | server node u32)
  session key  = derive("ribltcache session key", 0)
  client proof = derive("ribltcache proof", 0)   (PROOF payload)
  server proof = derive("ribltcache proof", 1)   (ACCEPT payload)
"""

import hashlib
import hmac
import os
import re
import socket
import struct
import time


def _wire_constant(name):
    """A #define of replication/repl_wire.h, so that these tests speak the
    version of the protocol the tree they test declares."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..",
                        "..", "replication", "repl_wire.h")
    with open(path) as f:
        m = re.search(r"#define %s\s+(\d+)" % name, f.read())
    if not m:
        raise RuntimeError("%s not found in %s" % (name, path))
    return int(m.group(1))


VERSION = _wire_constant("REPL_WIRE_VERSION")
MUT_FIXED = _wire_constant("REPL_WIRE_MUT_FIXED")  # record bytes before key
HEADER = 16
TAG = 32
NONCE = 32
MAX_PAYLOAD = 4 << 20

HELLO = 1
CHALLENGE = 2
PROOF = 3
ACCEPT = 4
SYMBOLS_REQ = 10
SYMBOLS_WALK = 0x80000000  # SYMBOLS_REQ count flag
SYMBOLS = 11
FETCH = 12
MUTATIONS = 13
DONE = 14
ERROR = 15
INFO = 17  # weight, P, R, client address: sent by a node once ready
RESUME = 19  # where our pushes stopped reaching it: sent once ready
# A node answers round requests busy for this long after a link comes up,
# and until its RESUME is answered (it waits for resumes first;
# replication/README.md, "Resume").
RESUME_QUIET_S = 0.05

SYMBOL_SIZE = 32
ZERO_TAG = bytes(TAG)


def header(ftype, length, seq):
    return b"RB" + bytes([VERSION, ftype]) + struct.pack("<IQ", length, seq)


def frame(ftype, payload, seq=0, key=None):
    """One whole frame; key None = zero tag (handshake frames)."""
    head = header(ftype, len(payload), seq)
    if key is None:
        tag = ZERO_TAG
    else:
        tag = hmac.new(key, head + payload, hashlib.sha256).digest()
    return head + payload + tag


def derive(secret, label, extra, cnonce, snonce, cnode, snode):
    msg = label.encode() + bytes([extra]) + cnonce + snonce + \
        struct.pack("<II", cnode, snode)
    return hmac.new(secret, msg, hashlib.sha256).digest()


class Closed(Exception):
    """The node closed the connection."""


class Peer:
    """A connection to a node's peer port, playing the dialing side."""

    def __init__(self, port, timeout=5.0, ssl_context=None):
        """ssl_context: play the peer over TLS (a client context with this
        peer's certificate) instead of plain TCP."""
        self.sock = socket.create_connection(("127.0.0.1", port),
                                             timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if ssl_context is not None:
            self.sock = ssl_context.wrap_socket(self.sock)
        self.key = None
        self.seq_out = 0
        self.seq_in = 0
        self.buf = b""

    def close(self):
        self.sock.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- raw I/O --------------------------------------------------------

    def send(self, data):
        self.sock.sendall(data)

    def _fill(self, n, timeout):
        deadline = time.monotonic() + timeout
        while len(self.buf) < n:
            left = deadline - time.monotonic()
            if left <= 0:
                raise socket.timeout("frame not complete")
            self.sock.settimeout(left)
            try:
                chunk = self.sock.recv(1 << 16)
            except ConnectionResetError:
                chunk = b""
            if not chunk:
                raise Closed()
            self.buf += chunk

    def recv_frame(self, timeout=5.0):
        """(type, seq, payload) of the next frame; verifies the tag (or
        that it is zero before the session key exists) and the seq. The
        INFO and RESUME a node sends once the link is ready are kept in
        self.info and self.resume and skipped."""
        while True:
            ftype, seq, payload = self._recv_one(timeout)
            if ftype == INFO:
                self.info = payload
            elif ftype == RESUME:
                self.resume = payload
            else:
                return ftype, seq, payload

    def _recv_one(self, timeout):
        self._fill(HEADER, timeout)
        if self.buf[:3] != b"RB" + bytes([VERSION]):
            raise AssertionError("bad magic %r" % self.buf[:4])
        ftype = self.buf[3]
        length, seq = struct.unpack("<IQ", self.buf[4:16])
        if length > MAX_PAYLOAD:
            raise AssertionError("frame of %d bytes" % length)
        total = HEADER + length + TAG
        self._fill(total, timeout)
        raw, self.buf = self.buf[:total], self.buf[total:]
        payload = raw[HEADER:HEADER + length]
        tag = raw[HEADER + length:]
        if ftype in (HELLO, CHALLENGE):
            if tag != ZERO_TAG:
                raise AssertionError("handshake frame with a tag")
        else:
            want = hmac.new(self.key, raw[:HEADER + length],
                            hashlib.sha256).digest()
            if not hmac.compare_digest(want, tag):
                raise AssertionError("frame tag does not verify")
            if seq != self.seq_in:
                raise AssertionError("seq %d, expected %d" %
                                     (seq, self.seq_in))
            self.seq_in += 1
        return ftype, seq, payload

    def send_frame(self, ftype, payload, key=None):
        """Sends an authenticated frame with the next seq (key: override
        the session key, e.g. a wrong one)."""
        k = key if key is not None else self.key
        self.send(frame(ftype, payload, self.seq_out, k))
        self.seq_out += 1

    def wait_closed(self, timeout=10.0):
        """True when the node closes the connection within timeout
        (whatever it still sends before is read and dropped)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.sock.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                chunk = self.sock.recv(1 << 16)
            except socket.timeout:
                return False
            except ConnectionResetError:
                return True
            if not chunk:
                return True
        return False

    # -- handshake ------------------------------------------------------

    def hello(self, node_id):
        """Sends HELLO and reads CHALLENGE; returns (server node, nonces)."""
        self.node_id = node_id
        self.cnonce = os.urandom(NONCE)
        self.send(frame(HELLO, struct.pack("<I", node_id) + self.cnonce))
        ftype, _, payload = self.recv_frame()
        if ftype != CHALLENGE or len(payload) != 4 + NONCE:
            raise AssertionError("expected CHALLENGE, got type %d" % ftype)
        self.server_node = struct.unpack("<I", payload[:4])[0]
        self.snonce = payload[4:]
        return self.server_node

    def derive(self, secret, label, extra):
        return derive(secret, label, extra, self.cnonce, self.snonce,
                      self.node_id, self.server_node)

    def handshake(self, secret, node_id=77, settle=True):
        """The whole client side; checks the server's proof. With settle,
        answers the node's RESUME (nothing to resend) and returns once the
        node takes round requests again (RESUME_QUIET_S after the link
        came up)."""
        self.hello(node_id)
        self.key = self.derive(secret, "ribltcache session key", 0)
        self.send_frame(PROOF, self.derive(secret, "ribltcache proof", 0))
        ftype, _, payload = self.recv_frame()
        if ftype != ACCEPT:
            raise AssertionError("expected ACCEPT, got type %d" % ftype)
        want = self.derive(secret, "ribltcache proof", 1)
        if not hmac.compare_digest(want, payload):
            raise AssertionError("server proof does not verify")
        if settle:
            self.send_frame(RESUME, struct.pack("<QQQ", 0, 0, 0))
            time.sleep(2 * RESUME_QUIET_S)

    # -- requests -------------------------------------------------------

    def symbols_req(self, offset, count, walk=False):
        """SYMBOLS_REQ; walk sets the flag (count's top bit) that asks for
        a round served from a walk of the set, not the sketch."""
        self.send_frame(SYMBOLS_REQ, struct.pack(
            "<QI", offset, count | (SYMBOLS_WALK if walk else 0)))


def parse_symbols(payload):
    """(offset, set size, number of symbols) of a SYMBOLS payload."""
    offset, size = struct.unpack("<Qq", payload[:16])
    body = len(payload) - 16
    if body % SYMBOL_SIZE:
        raise AssertionError("SYMBOLS body of %d bytes" % body)
    return offset, size, body // SYMBOL_SIZE
