"""Fault-test harness: a three-node ribltcached cluster in network
namespaces, faults made with iptables and signals, a bounded client load
that records every write, and the checker that judges the end state.

Network. Every run makes its own namespaces, named
`rbft-<pid>-<random>-{hub,n1,n2,n3}`: a hub namespace holding a bridge,
and one namespace per node joined to it by a veth pair. Node i has the
address 10.77.0.i on its veth; it serves clients and peers on that address
only, so nothing a test does is reachable from, or leaves for, the host's
own network. Clients of the test reach node i from inside namespace i: a
socket is created in a namespace (setns on the calling thread) and keeps
it, so one python process talks to every node without sub-processes.
Faults are iptables rules on the node namespaces' veth interfaces (client
traffic stays inside a namespace and never crosses them) and signals to
the daemons. Namespaces, and with them every rule and interface, are
deleted on close, also after a failure; leftovers of earlier runs whose
owning process is gone are removed when a new run starts.

Load. Writer threads, each at a bounded rate for a bounded time and op
count, send to a node picked at random: sets of new keys, overwrites of
recent keys (so writes to one key land on different nodes within
milliseconds) and deletes. Every value names its write. Each request is
pipelined as `stats`, the write, `stats` on one connection: the node runs
them in that order, so its hybrid clock (`clock_ticks`, the last version
ticks it issued or saw; never decreasing) before and after brackets the
version of the write.

The rule (see README.md): a write w is *beaten* when some acknowledged
write w2 to the same key provably has greater version ticks, i.e.
    lo(w2) > hi(w)
where lo(w2) = max(clock_ticks before w2 + 1, host wall clock when w2 was
sent) bounds w2's ticks from below and hi(w) = clock_ticks after w bounds
w's ticks from above. After convergence each key's value must be that of a
write that is not beaten (a delete's value is "absent"; before the first
write the key is absent). A write whose reply was lost may have been
applied or not: it is allowed as the final value but never beats another.
"""

import ctypes
import os
import random
import re
import signal
import socket
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "cluster"))
sys.path.insert(0, os.path.join(HERE, "..", "proto"))

import cluster  # noqa: E402
import harness  # noqa: E402

PREFIX = "rbft-"
SUBNET = "10.77.0."
CLIENT_PORT = 11211
PEER_PORT = 11311
SKIP_ENV = "RIBLTCACHE_SKIP_NETNS"
CLONE_NEWNET = 0x40000000
# The LD_PRELOAD library that moves a node's wall clock (fakeclock.c),
# set by the test's main from --fakeclock.
FAKECLOCK = None

_libc = ctypes.CDLL(None, use_errno=True)


class Unavailable(Exception):
    """The fault environment (root, namespaces, iptables, the clock
    library) is missing on this machine."""


def sh(*argv, check=True, timeout=20.0):
    """Runs a command; returns its stdout. Raises RuntimeError with the
    command and its stderr when it fails and check is true."""
    p = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       timeout=timeout)
    if check and p.returncode != 0:
        raise RuntimeError("%s: exit %d: %s" % (
            " ".join(argv), p.returncode, p.stderr.decode(errors="replace")))
    return p.stdout.decode(errors="replace")


def check_environment(need_fakeclock=False):
    """Raises Unavailable with a message that says what is missing."""
    if os.geteuid() != 0:
        raise Unavailable("fault tests need root (network namespaces, "
                          "iptables); running as uid %d" % os.geteuid())
    for tool, pkg in (("ip", "iproute2"), ("iptables", "iptables")):
        if subprocess.run(["sh", "-c", "command -v " + tool],
                          stdout=subprocess.DEVNULL).returncode != 0:
            raise Unavailable("%s not found (Debian package %s)" % (tool,
                                                                     pkg))
    if need_fakeclock and (FAKECLOCK is None or
                           not os.path.exists(FAKECLOCK)):
        raise Unavailable("the clock library is missing: pass --fakeclock "
                          "PATH (target fault_fakeclock)")


class in_netns:
    """Context manager: the calling thread (only it) enters namespace
    `name` and returns to where it was on exit. Sockets created inside
    stay in the namespace for their whole life."""

    def __init__(self, name):
        self.name = name

    def __enter__(self):
        self.back = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
        fd = os.open("/run/netns/" + self.name, os.O_RDONLY)
        try:
            if _libc.setns(fd, CLONE_NEWNET) != 0:
                e = ctypes.get_errno()
                raise OSError(e, "setns %s: %s" % (self.name,
                                                   os.strerror(e)))
        except BaseException:
            os.close(self.back)
            raise
        finally:
            os.close(fd)
        return self

    def __exit__(self, *exc):
        try:
            if _libc.setns(self.back, CLONE_NEWNET) != 0:
                raise OSError(ctypes.get_errno(), "setns back failed")
        finally:
            os.close(self.back)


def ns_connect(ns, addr, port, timeout):
    """A TCP connection to addr:port made from inside namespace ns."""
    with in_netns(ns):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        s.settimeout(timeout)
        s.connect((addr, port))
    except OSError:
        s.close()
        raise
    return s


def pid_alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def clean_leftovers():
    """Deletes namespaces of earlier runs whose owning process is gone,
    after killing what still runs in them. Returns how many it removed."""
    removed = 0
    for line in sh("ip", "netns", "list", check=False).splitlines():
        name = line.split()[0] if line.split() else ""
        m = re.match(r"^%s(\d+)-" % re.escape(PREFIX), name)
        if not m or pid_alive(int(m.group(1))):
            continue
        for pid in sh("ip", "netns", "pids", name, check=False).split():
            try:
                os.kill(int(pid), signal.SIGCONT)
                os.kill(int(pid), signal.SIGKILL)
            except (ProcessLookupError, ValueError):
                pass
        sh("ip", "netns", "del", name, check=False)
        removed += 1
    return removed


# ------------------------------------------------------------------ network


class Net:
    """The hub and n node namespaces of one run, wired through a bridge."""

    def __init__(self, n=3):
        self.n = n
        self.tag = "%s%d-%04x" % (PREFIX, os.getpid(),
                                  random.getrandbits(16))
        self.hub = self.tag + "-hub"
        self.names = ["%s-n%d" % (self.tag, i + 1) for i in range(n)]
        self.made = []

    def addr(self, i):
        return SUBNET + str(i + 1)

    def setup(self):
        """Creates namespaces and links; raises Unavailable when the first
        namespace cannot be made (no permission) or iptables does not work
        in one, RuntimeError on another failure. What it made is removed by
        close()."""
        try:
            sh("ip", "netns", "add", self.hub)
        except RuntimeError as e:
            raise Unavailable("cannot create a network namespace: %s" % e)
        self.made.append(self.hub)
        sh("ip", "-n", self.hub, "link", "add", "br0", "type", "bridge")
        sh("ip", "-n", self.hub, "link", "set", "br0", "up")
        for i, ns in enumerate(self.names):
            sh("ip", "netns", "add", ns)
            self.made.append(ns)
            port = "p%d" % (i + 1)
            sh("ip", "-n", self.hub, "link", "add", port, "type", "veth",
               "peer", "name", "eth0", "netns", ns)
            sh("ip", "-n", self.hub, "link", "set", port, "master", "br0")
            sh("ip", "-n", self.hub, "link", "set", port, "up")
            sh("ip", "-n", ns, "addr", "add", self.addr(i) + "/24", "dev",
               "eth0")
            sh("ip", "-n", ns, "link", "set", "eth0", "up")
            sh("ip", "-n", ns, "link", "set", "lo", "up")
            # The test's own rules only; start from empty tables.
            try:
                sh("ip", "netns", "exec", ns, "iptables", "-F")
            except RuntimeError as e:
                raise Unavailable("iptables does not work in a network "
                                  "namespace: %s" % e)
        return self

    def iptables(self, i, *rule):
        sh("ip", "netns", "exec", self.names[i], "iptables", *rule)

    def heal(self):
        """Removes every rule the test added in the node namespaces."""
        for ns in self.names:
            if ns in self.made:
                sh("ip", "netns", "exec", ns, "iptables", "-F", check=False)

    def rules(self):
        return "\n".join("--- %s\n%s" % (ns, sh(
            "ip", "netns", "exec", ns, "iptables", "-S", "-v",
            check=False)) for ns in self.names if ns in self.made)

    def close(self):
        for ns in reversed(self.made):
            for pid in sh("ip", "netns", "pids", ns, check=False).split():
                try:
                    os.kill(int(pid), signal.SIGCONT)
                    os.kill(int(pid), signal.SIGKILL)
                except (ProcessLookupError, ValueError):
                    pass
            sh("ip", "netns", "del", ns, check=False)
        self.made = []

    # -- faults -----------------------------------------------------------

    def isolate(self, i):
        """Node i neither sends to nor receives from its peers."""
        self.iptables(i, "-A", "INPUT", "-i", "eth0", "-j", "DROP")
        self.iptables(i, "-A", "OUTPUT", "-o", "eth0", "-j", "DROP")

    def drop_one_way(self, src, dst):
        """Packets from node src to node dst are dropped; dst's packets to
        src still arrive."""
        self.iptables(src, "-A", "OUTPUT", "-o", "eth0", "-d", self.addr(dst),
                      "-j", "DROP")

    def lossy(self, probability):
        """Every packet a node sends to a peer is dropped with the given
        probability (once per hop: on the sender's way out)."""
        for i in range(self.n):
            self.iptables(i, "-A", "OUTPUT", "-o", "eth0", "-m", "statistic",
                          "--mode", "random", "--probability",
                          str(probability), "-j", "DROP")


# ------------------------------------------------------------------- nodes


class NsNode(cluster.Node):
    """A cluster.Node run inside a namespace with `ip netns exec`, serving
    clients and peers on the namespace's address. env adds variables to
    the daemon's environment (the clock library)."""

    def __init__(self, settings, name, ns, addr, env=None):
        super().__init__(settings, name)
        self.ns = ns
        self.addr = addr
        self.env = dict(env or {})
        self.stopped = False

    def start(self):
        env = dict(os.environ)
        env.update(self.env)
        with open(self.stderr_path, "ab") as err:
            self.proc = subprocess.Popen(
                ["ip", "netns", "exec", self.ns, harness.SERVER, "--config",
                 self.conf_path], stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL, stderr=err, env=env)
        self.returncode = None
        self.stopped = False
        if not self._wait_ready():
            log = self.stderr()
            self.kill()
            raise RuntimeError("%s did not start: %s" % (self.name, log))
        return self

    def connect(self, timeout=10.0):
        return ns_connect(self.ns, self.addr, self.port, timeout)

    def sigstop(self):
        self.proc.send_signal(signal.SIGSTOP)
        self.stopped = True

    def sigcont(self):
        self.proc.send_signal(signal.SIGCONT)
        self.stopped = False

    def stop(self, sig=signal.SIGTERM, timeout=harness.STOP_TIMEOUT):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.stopped = False
        return super().stop(sig, timeout)


class FaultCluster:
    """Three nodes in the namespaces of a Net, one shared peer list.
    skewed maps a node index to a wall clock offset in seconds."""

    def __init__(self, net, extra=None, skewed=None):
        self.net = net
        self.extra = dict(extra or {})
        self.skewed = dict(skewed or {})
        self.nodes = []

    def settings(self, i):
        s = {
            "tcpport": CLIENT_PORT,
            "inter": self.net.addr(i),
            "num_threads": 2,
            "maxbytes": "64m",
            "node_id": i + 1,
            "verbosity": 1,
            "repl_port": PEER_PORT,
            "repl_listen": self.net.addr(i),
            "peers": ",".join("%s:%d" % (self.net.addr(j), PEER_PORT)
                              for j in range(self.net.n)),
            "cluster_secret": cluster.SECRET,
            "repl_period_ms": 100,
            "repl_round_timeout_ms": 3000,
            "tombstone_grace": 3600,
        }
        s.update(self.extra)
        return s

    def env(self, i):
        if i not in self.skewed:
            return {}
        env = {"LD_PRELOAD": FAKECLOCK,
               "RIBLTCACHE_CLOCK_OFFSET": str(self.skewed[i])}
        if cluster.sanitized():
            # The preloaded library comes before the ASan runtime.
            env["ASAN_OPTIONS"] = (os.environ.get("ASAN_OPTIONS", "") +
                                   ":verify_asan_link_order=0").lstrip(":")
        return env

    def start(self):
        for i in range(self.net.n):
            node = NsNode(self.settings(i), "node%d" % (i + 1),
                          self.net.names[i], self.net.addr(i), self.env(i))
            self.nodes.append(node)  # closed by close(), started or not
            node.start()
        return self

    def __getitem__(self, i):
        return self.nodes[i]

    def close(self):
        errors = []
        for node in self.nodes:
            try:
                node.close()
            except AssertionError as e:
                errors.append(str(e))
        self.nodes = []
        if errors:
            raise AssertionError("\n".join(errors))

    def logs(self, tail=3000):
        """Each node's exit status (None: running) and the end of its
        log."""
        return "\n".join("--- %s (exit status %s)\n%s" % (
            n.name, n.proc.poll() if n.proc is not None else "not started",
            n.stderr()[-tail:]) for n in self.nodes)

    def wait_connected(self, timeout=20.0):
        """Every node has an authenticated connection up to each other."""
        want = self.net.n - 1

        def ok():
            for node in self.nodes:
                try:
                    st = node.repl_stats()
                except OSError:
                    return False
                up = sum(1 for k, v in st.items()
                         if k.endswith(":state") and v == "up" and
                         st.get(k[:-len("state")] + "node_id", "0") != "0")
                if up < want:
                    return False
            return True
        return cluster.wait_until(ok, timeout, interval=0.1)


# -------------------------------------------------------------------- load


class Write:
    """One write as the client saw it."""

    __slots__ = ("key", "value", "node", "status", "lo", "hi", "sent",
                 "acked_at")

    def __init__(self, key, value, node, sent):
        self.key = key
        self.value = value  # bytes; None for a delete
        self.node = node
        self.status = "unknown"  # acked, unknown, failed, noop
        self.lo = sent  # lower bound of the version ticks
        self.hi = None  # upper bound; None = unbounded
        self.sent = sent
        self.acked_at = None


class StatsReply:
    """Incremental parser of the pipelined `stats`, write, `stats`
    replies."""

    def __init__(self):
        self.buf = b""
        self.before = None
        self.result = None
        self.after = None

    def feed(self, data):
        self.buf += data
        while b"\r\n" in self.buf:
            line, self.buf = self.buf.split(b"\r\n", 1)
            if self.before is None or (self.result is not None and
                                       self.after is None):
                self._stat_line(line)
            else:
                self.result = line
        return self.after is not None

    def _stat_line(self, line):
        if line.startswith(b"STAT clock_ticks "):
            self._ticks = int(line.split()[2])
        elif line == b"END":
            ticks = getattr(self, "_ticks", None)
            if ticks is None:
                raise RuntimeError("stats reply without clock_ticks")
            if self.before is None:
                self.before = ticks
            else:
                self.after = ticks
            self._ticks = None
        elif not line.startswith(b"STAT "):
            raise RuntimeError("unexpected stats line %r" % line)


class Writer(threading.Thread):
    """One client thread. Writes at most `rate` ops per second until
    stop is set, `duration` seconds pass or `max_ops` ops are done. Its
    keys are its own (prefix w<id>-), so the writes to one key come from
    this thread alone, in one order. A node whose connection failed is
    avoided for `backoff` seconds."""

    def __init__(self, wid, fc, rate, duration, max_ops, seed, timeout=1.0,
                 backoff=0.5):
        super().__init__(daemon=True)
        self.wid = wid
        self.fc = fc
        self.rate = rate
        self.duration = duration
        self.max_ops = max_ops
        self.rng = random.Random(seed)
        self.timeout = timeout
        self.backoff = backoff
        self.stop_event = threading.Event()
        self.writes = []  # every Write, in the order sent
        self.keys = []  # own keys, in creation order
        self.conns = {}
        self.down_until = {}
        self.error = None
        self.connect_failures = 0

    def run(self):
        try:
            self._run()
        except Exception as e:  # reported by the test, never swallowed
            self.error = "%s: %r" % (type(e).__name__, e)
        finally:
            for s in self.conns.values():
                s.close()

    def _run(self):
        start = time.monotonic()
        period = 1.0 / self.rate
        for n in range(self.max_ops):
            if self.stop_event.is_set() or \
                    time.monotonic() - start > self.duration:
                break
            wake = start + n * period
            delay = wake - time.monotonic()
            if delay > 0 and self.stop_event.wait(delay):
                break
            node = self._pick_node()
            if node is None:
                continue
            self._one(n, node)

    def _pick_node(self):
        now = time.monotonic()
        up = [i for i in range(len(self.fc.nodes))
              if self.down_until.get(i, 0) <= now]
        return self.rng.choice(up) if up else None

    def _one(self, n, node):
        r = self.rng.random()
        if not self.keys or r < 0.5:
            key = "w%d-%05d" % (self.wid, len(self.keys))
            self.keys.append(key)
            op = "set"
        else:
            # Recent keys, so that writes to one key hit several nodes
            # close together.
            key = self.rng.choice(self.keys[-40:])
            op = "set" if r < 0.8 else "delete"
        if op == "set":
            value = ("%s:n%d:op%d" % (key, node + 1, n)).encode()
            cmd = b"set %s 0 0 %d\r\n%s\r\n" % (key.encode(), len(value),
                                                 value)
        else:
            value = None
            cmd = b"delete %s\r\n" % key.encode()
        sock = self._conn(node)
        if sock is None:
            return
        w = Write(key, value, node, time.time_ns())
        self.writes.append(w)
        reply = StatsReply()
        try:
            sock.sendall(b"stats\r\n" + cmd + b"stats\r\n")
            deadline = time.monotonic() + self.timeout
            done = False
            while not done:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise socket.timeout("reply timed out")
                sock.settimeout(left)
                data = sock.recv(65536)
                if not data:
                    raise ConnectionError("connection closed")
                done = reply.feed(data)
        except OSError:
            self._drop(node)
        finally:
            self._judge(w, reply, op)

    def _judge(self, w, reply, op):
        if reply.before is not None:
            w.lo = max(w.lo, reply.before + 1)
        if reply.result is None:
            return  # unknown: it may or may not have been applied
        res = reply.result
        if (op == "set" and res == b"STORED") or \
                (op == "delete" and res == b"DELETED"):
            w.status = "acked"
            w.acked_at = time.monotonic()
            if reply.after is not None:
                w.hi = reply.after
        elif op == "delete" and res == b"NOT_FOUND":
            w.status = "noop"  # nothing to delete there: no mutation
        else:
            w.status = "failed"
            self.error = self.error or "%s %s: %r" % (op, w.key, res)

    def _conn(self, node):
        s = self.conns.get(node)
        if s is not None:
            return s
        n = self.fc.nodes[node]
        try:
            s = ns_connect(n.ns, n.addr, n.port, self.timeout)
        except OSError:
            self.connect_failures += 1
            self.down_until[node] = time.monotonic() + self.backoff
            return None
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.conns[node] = s
        return s

    def _drop(self, node):
        s = self.conns.pop(node, None)
        if s is not None:
            s.close()
        self.down_until[node] = time.monotonic() + self.backoff


class Load:
    """A few Writers started together."""

    def __init__(self, fc, threads=3, rate=60, duration=30.0, max_ops=3000,
                 seed=None):
        seed = random.getrandbits(32) if seed is None else seed
        self.seed = seed
        self.writers = [Writer(i, fc, rate, duration, max_ops, seed + i)
                        for i in range(threads)]

    def start(self):
        for w in self.writers:
            w.start()
        return self

    def stop(self, timeout=10.0):
        for w in self.writers:
            w.stop_event.set()
        for w in self.writers:
            w.join(timeout)
        alive = [w.wid for w in self.writers if w.is_alive()]
        if alive:
            raise AssertionError("writers %r did not stop" % alive)

    def errors(self):
        return [w.error for w in self.writers if w.error]

    def writes(self):
        out = []
        for w in self.writers:
            out.extend(w.writes)
        return out

    def keys(self):
        out = []
        for w in self.writers:
            out.extend(w.keys)
        return out


# ------------------------------------------------------------------ checks


def read_all(node, keys, timeout=5.0):
    """{key: value} of every key node holds, read with multi-key gets
    from inside its namespace."""
    out = {}
    with node.connect(timeout) as s:
        for start in range(0, len(keys), 100):
            batch = keys[start:start + 100]
            s.sendall(("get %s\r\n" % " ".join(batch)).encode())
            buf = harness.recv_until(s, b"END\r\n", timeout=timeout)
            if not buf.endswith(b"END\r\n"):
                raise OSError("short get reply from %s" % node.name)
            pos = 0
            while True:
                eol = buf.index(b"\r\n", pos)
                line = buf[pos:eol]
                if line == b"END":
                    break
                parts = line.split()
                if parts[0] != b"VALUE":
                    raise OSError("bad get reply %r" % line)
                size = int(parts[3])
                out[parts[1].decode()] = buf[eol + 2:eol + 2 + size]
                pos = eol + 2 + size + 2
    return out


class Snapshot:
    def __init__(self, values, items):
        self.values = values  # one {key: value} per node
        self.items = items  # curr_items per node

    def differing(self, keys):
        return [k for k in keys
                if len({v.get(k) for v in self.values}) != 1]

    def converged(self, keys):
        return not self.differing(keys) and len(set(self.items)) == 1


def snapshot(fc, keys):
    values, items = [], []
    for node in fc.nodes:
        values.append(read_all(node, keys))
        items.append(node.curr_items())
    return Snapshot(values, items)


def wait_converged(fc, keys, timeout):
    """Polls until every node holds the same values for keys and the same
    curr_items, at most timeout seconds; returns (converged, seconds
    waited, last snapshot)."""
    t0 = time.monotonic()
    last = [None]

    def ok():
        try:
            last[0] = snapshot(fc, keys)
        except OSError:
            return False
        return last[0].converged(keys)
    good = cluster.wait_until(ok, timeout, interval=0.25)
    if last[0] is None:
        last[0] = snapshot(fc, keys)
    return bool(good), time.monotonic() - t0, last[0]


class Verdict:
    """The counts one scenario prints and asserts on."""

    def __init__(self):
        self.keys = 0
        self.mismatches = 0  # keys whose value differs between nodes
        self.lost = 0  # keys holding a value an acked write provably beat
        self.resurrections = 0  # a deleted value back after its delete
        self.unexplained = 0  # values no write of the test produced
        self.item_count_errors = 0  # curr_items != keys holding a value
        self.ambiguous = 0  # keys with more than one allowed value
        # Keys not holding the client's last acked write, lawfully: an
        # earlier write with provably greater version ticks, or a write
        # whose reply was lost and which a node applied late.
        self.older_kept = 0
        self.examples = []

    def violations(self):
        return (self.mismatches + self.lost + self.resurrections +
                self.unexplained + self.item_count_errors)

    def line(self):
        return ("keys checked %d, mismatches %d, lost writes %d, "
                "resurrections %d, unexplained values %d, item count "
                "errors %d (keys with several allowed values: %d; keys "
                "lawfully not holding the last acked write: %d)" % (
                    self.keys, self.mismatches, self.lost,
                    self.resurrections, self.unexplained,
                    self.item_count_errors, self.ambiguous,
                    self.older_kept))


def judge(writes, keys, snap):
    """Applies the rule of the module comment to the final snapshot."""
    v = Verdict()
    by_key = {k: [] for k in keys}
    for w in writes:
        if w.status in ("acked", "unknown"):
            by_key[w.key].append(w)
    v.keys = len(keys)
    for key in keys:
        ws = by_key[key]
        acked = [w for w in ws if w.status == "acked"]
        best_lo = max((w.lo for w in acked), default=-1)

        def beaten(w):
            return w.hi is not None and best_lo > w.hi
        # The key is absent before its first write: beaten by any ack.
        allowed_absent = not acked or any(
            w.value is None and not beaten(w) for w in ws)
        allowed = {w.value for w in ws if w.value is not None and
                   not beaten(w)}
        if len(allowed) + (1 if allowed_absent else 0) > 1:
            v.ambiguous += 1
        values = [s.get(key) for s in snap.values]
        if acked and ws[-1].status == "acked" and \
                values[0] != acked[-1].value and values[0] in allowed:
            v.older_kept += 1
        if len(set(values)) != 1:
            v.mismatches += 1
            v.examples.append("mismatch %s: %r" % (key, values))
        for got in set(values):
            if got is None:
                if not allowed_absent:
                    v.lost += 1
                    v.examples.append("lost %s: absent, allowed %r" % (
                        key, sorted(allowed)))
                continue
            mine = [w for w in ws if w.value == got]
            if not mine:
                v.unexplained += 1
                v.examples.append("unexplained %s: %r" % (key, got))
            elif got not in allowed:
                w = mine[0]
                deletes = [d for d in acked if d.value is None and
                           d.lo > w.hi]
                if deletes:
                    v.resurrections += 1
                    v.examples.append("resurrected %s: %r after an acked "
                                      "delete on node%d" % (
                                          key, got, deletes[0].node + 1))
                else:
                    v.lost += 1
                    v.examples.append("lost %s: holds %r, allowed %r" % (
                        key, got, sorted(allowed)))
    present = len([k for k in keys if snap.values[0].get(k) is not None])
    for i, items in enumerate(snap.items):
        if items != present:
            v.item_count_errors += 1
            v.examples.append("node%d curr_items %d, keys with a value %d"
                              % (i + 1, items, present))
    return v
