"""Cluster test harness: several ribltcached nodes replicating on loopback.

Builds on t/proto/harness.py (the single-server harness): a Node is a
harness.Server whose settings, client port included, live in a config file
of its own, so that a node killed with SIGKILL restarts with the very same
configuration. A Cluster picks free client and peer ports, writes one config
per node (one shared peer list unless a test rewires it), starts the nodes
and stops them, also when a test fails.

Also here: a TCP proxy that can cut and heal the connections it carries
(partition tests), polling helpers bounded in count and time, and the
replication stats readers the tests share.
"""

import os
import select
import socket
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", "proto"))

import harness  # noqa: E402
from harness import free_port  # noqa: E402

SECRET = "cluster-test-secret-5d1e0b9a"

# Every wait of these tests: poll this often, at most this many times.
POLL_INTERVAL = 0.05


def main():
    harness.main()


# True when the binary under test is an ASan/UBSan build (slower, and its
# allocator keeps freed memory in quarantine).
sanitized = harness.sanitized


def wait_until(predicate, timeout, interval=POLL_INTERVAL):
    """Polls predicate until it returns a true value, at most timeout
    seconds and timeout / interval + 1 times; returns its last value."""
    tries = int(timeout / interval) + 1
    deadline = time.monotonic() + timeout
    value = predicate()
    while not value and tries > 0 and time.monotonic() < deadline:
        tries -= 1
        time.sleep(interval)
        value = predicate()
    return value


def free_ports(n):
    """n distinct TCP ports on 127.0.0.1 that were free a moment ago."""
    ports = set()
    for _ in range(20 * n):
        if len(ports) == n:
            break
        ports.add(free_port())
    if len(ports) != n:
        raise RuntimeError("could not pick %d free ports" % n)
    return sorted(ports)


def retry_on_taken_port(fn, tries=3):
    """Runs fn() again (at most `tries` times in all) when a node did not
    start because a port picked by free_ports was taken meanwhile, as a
    test that fixes its ports (proxies in front of them) cannot pick
    others inside Cluster.start."""
    for attempt in range(tries):
        try:
            return fn()
        except RuntimeError as e:
            if "Address already in use" not in str(e) or \
                    attempt == tries - 1:
                raise


def read_to_mn(s):
    """Reads a connection's replies up to and including the `MN` that an
    `mn` sent after the requests answers with; returns them."""
    data = b""
    while not data.endswith(b"MN\r\n"):
        chunk = s.recv(65536)
        if not chunk:
            raise AssertionError("connection closed before MN")
        data += chunk
    return data


def pipelined_sets(port, keys, value):
    """set <key> noreply for every key, pipelined, then an mn round trip."""
    s = socket.create_connection(("127.0.0.1", port), timeout=30)
    try:
        for start in range(0, len(keys), 1000):
            s.sendall(b"".join(
                b"set %s 0 0 %d noreply\r\n%s\r\n" % (k, len(value), value)
                for k in keys[start:start + 1000]))
        s.sendall(b"mn\r\n")
        read_to_mn(s)
    finally:
        s.close()


def count_present(port, keys):
    """How many of keys the node holds (pipelined `mg <key>`, 1000 a
    send)."""
    s = socket.create_connection(("127.0.0.1", port), timeout=30)
    present = 0
    try:
        for start in range(0, len(keys), 1000):
            batch = keys[start:start + 1000]
            s.sendall(b"".join(b"mg %s\r\n" % k for k in batch) + b"mn\r\n")
            present += read_to_mn(s).count(b"HD\r\n")
    finally:
        s.close()
    return present


def prefixed_keys(prefix, n):
    """prefix0 .. prefix<n-1>, as bytes."""
    return [b"%s%d" % (prefix, i) for i in range(n)]


def set_prefixed(node, prefix, n, value=b"v"):
    """Sets prefix0 .. prefix<n-1> on node (pipelined, noreply)."""
    pipelined_sets(node.port, prefixed_keys(prefix, n), value)


def has_prefixed(node, prefix, n):
    """True when node holds every one of prefix0 .. prefix<n-1>."""
    return count_present(node.port, prefixed_keys(prefix, n)) == n


def peers_of(node, origin):
    """The peers of a node's `stats replication` that came from origin
    (static, registry, dns, etcd), as dicts of their fields (addr,
    node_id, state, ...), and the node's membership line."""
    st = node.repl_stats()
    rows = {}
    for k, v in st.items():
        if k.startswith("peer") and ":" in k:
            idx, field = k.split(":", 1)
            rows.setdefault(idx, {})[field] = v
    return ([r for r in rows.values() if r.get("origin") == origin],
            st.get("membership", ""))


def close_nodes(nodes):
    """Stops every node of the list; raises, once all are stopped, if one
    reported a sanitizer error."""
    errors = []
    for node in nodes:
        try:
            node.close()
        except AssertionError as e:
            errors.append(str(e))
    if errors:
        raise AssertionError("\n".join(errors))


def logs_of(nodes, tail=4000):
    """The end of every node's log, each under its name."""
    return "\n".join("--- %s\n%s" % (n.name, n.stderr()[-tail:])
                     for n in nodes)


# ------------------------------------------------------------------ nodes


class Node(harness.Server):
    """One ribltcached process started from a config file of its own."""

    def __init__(self, settings, name="node"):
        super().__init__()
        self.name = name
        self.settings = dict(settings)
        self.port = int(self.settings["tcpport"])
        self.conf_path = os.path.join(self.tmpdir, name + ".conf")
        self.write_config()

    def write_config(self):
        """One `name = value` line per setting; a setting whose value is
        None or empty is left out (the daemon's default applies)."""
        with open(self.conf_path, "w") as f:
            for k, v in self.settings.items():
                if v is not None and v != "":
                    f.write("%s = %s\n" % (k, v))

    @property
    def repl_port(self):
        return int(self.settings["repl_port"])

    def start(self):
        """Starts the daemon on the config file; raises when it does not
        answer. A restart appends to the same log."""
        with open(self.stderr_path, "ab") as err:
            self.proc = subprocess.Popen(
                [harness.SERVER, "--config", self.conf_path],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                stderr=err)
        self.returncode = None
        if not self._wait_ready():
            log = self.stderr()
            self.kill()
            raise RuntimeError("%s did not start: %s" % (self.name, log))
        return self

    def sigkill(self):
        """Kills the process with SIGKILL and reaps it."""
        self.kill()

    def repl_stats(self):
        return self.stats("replication")

    def curr_items(self):
        return int(self.stats()["curr_items"])


def repl_sum(st, field):
    """Sum of a per-peer counter (peerN:field) over every peer."""
    total = 0
    for k, v in st.items():
        if k.startswith("peer") and k.endswith(":" + field):
            total += int(v)
    return total


def rss_kb(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


class Cluster:
    """n nodes on loopback with one shared peer list (each node meets its
    own address in it). peers_for(i, peer_ports) may return another list
    for node i (a partition test routes some through a proxy). extra
    settings go into every node's config."""

    def __init__(self, n=3, extra=None, peers_for=None, ports=None):
        self.n = n
        self.extra = dict(extra or {})
        self.peers_for = peers_for
        self.nodes = []
        self.fixed_ports = ports

    def settings(self, i, client_ports, peer_ports):
        peers = ",".join("127.0.0.1:%d" % p for p in peer_ports)
        if self.peers_for is not None:
            peers = self.peers_for(i, peer_ports)
        s = {
            "tcpport": client_ports[i],
            "inter": "127.0.0.1",
            "num_threads": 2,
            "maxbytes": "64m",
            "node_id": i + 1,
            "repl_port": peer_ports[i],
            "repl_listen": "127.0.0.1",
            "peers": peers,
            "cluster_secret": SECRET,
            "repl_period_ms": 50,
        }
        s.update(self.extra)
        return s

    def start(self):
        last = None
        for _ in range(3):  # a picked port may be taken meanwhile
            if self.fixed_ports:
                client_ports, peer_ports = self.fixed_ports
            else:
                ports = free_ports(2 * self.n)
                client_ports, peer_ports = ports[:self.n], ports[self.n:]
            self.client_ports, self.peer_ports = client_ports, peer_ports
            self.nodes = [Node(self.settings(i, client_ports, peer_ports),
                               "node%d" % (i + 1)) for i in range(self.n)]
            try:
                for node in self.nodes:
                    node.start()
                return self
            except RuntimeError as e:
                last = e
                self.close()
                if self.fixed_ports:
                    break
        raise last

    def close(self):
        """Stops every node; raises if one reported a sanitizer error."""
        nodes, self.nodes = self.nodes, []
        close_nodes(nodes)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.close()

    def set_on_node(self, i, name, value):
        """Adds a setting to node i's config only (call before start)."""
        settings = self.settings

        def patched(j, client_ports, peer_ports):
            s = settings(j, client_ports, peer_ports)
            if j == i:
                s[name] = value
            return s
        self.settings = patched

    def __getitem__(self, i):
        return self.nodes[i]

    def logs(self):
        return logs_of(self.nodes)

    def wait_connected(self, timeout=20.0):
        """Waits until every node has an authenticated connection to
        each other node (peerN:node_id learned and state up)."""
        want = self.n - 1

        def ok():
            for node in self.nodes:
                st = node.repl_stats()
                up = 0
                for k, v in st.items():
                    if k.endswith(":state") and v == "up":
                        nid = st[k[:-len("state")] + "node_id"]
                        if nid != "0":
                            up += 1
                if up < want:
                    return False
            return True
        return wait_until(ok, timeout)


# ------------------------------------------------------------ TCP proxy


class CuttableProxy:
    """A TCP proxy on 127.0.0.1 in front of one target port. While cut it
    closes every connection it carries and accepts-and-closes new ones."""

    def __init__(self, target_port, port=None):
        self.target = ("127.0.0.1", target_port)
        self.lsock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.lsock.bind(("127.0.0.1", port or 0))
        self.lsock.listen(64)
        self.port = self.lsock.getsockname()[1]
        self.cut_flag = False
        self.lock = threading.Lock()
        self.conns = []  # socket pairs being relayed
        self.stopping = False
        self.accepted = 0
        self.refused = 0
        self.captured = None  # a bytearray: every byte relayed is added
        self.thread = threading.Thread(target=self._accept_loop, daemon=True)
        self.thread.start()

    def _accept_loop(self):
        while not self.stopping:
            r, _, _ = select.select([self.lsock], [], [], 0.1)
            if not r:
                continue
            try:
                client, _ = self.lsock.accept()
            except OSError:
                continue
            with self.lock:
                cut = self.cut_flag
            if cut:
                self.refused += 1
                client.close()
                continue
            try:
                upstream = socket.create_connection(self.target, timeout=2.0)
            except OSError:
                client.close()
                continue
            pair = (client, upstream)
            with self.lock:
                # A cut may have come while this one was connecting.
                cut = self.cut_flag
                if not cut:
                    self.conns.append(pair)
            if cut:
                self.refused += 1
                client.close()
                upstream.close()
                continue
            self.accepted += 1
            threading.Thread(target=self._relay, args=(pair,),
                             daemon=True).start()

    def _relay(self, pair):
        a, b = pair
        a.settimeout(None)
        b.settimeout(None)
        socks = [a, b]
        try:
            while not self.stopping:
                r, _, _ = select.select(socks, [], [], 0.2)
                with self.lock:
                    if pair not in self.conns:
                        break
                for s in r:
                    data = s.recv(65536)
                    if not data:
                        raise OSError("closed")
                    if self.captured is not None:
                        with self.lock:
                            self.captured += data
                    (b if s is a else a).sendall(data)
        except (OSError, ValueError):
            pass
        finally:
            self._drop(pair)

    def _drop(self, pair):
        with self.lock:
            if pair in self.conns:
                self.conns.remove(pair)
        for s in pair:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()

    def cut(self):
        with self.lock:
            self.cut_flag = True
            pairs = list(self.conns)
        for pair in pairs:
            self._drop(pair)

    def heal(self):
        with self.lock:
            self.cut_flag = False

    def close(self):
        self.stopping = True
        self.cut()
        self.thread.join(timeout=5)
        self.lsock.close()
