"""Membership through etcd: Debian's etcd (etcd-server), started by the test
on loopback with its own data directory and ports.

Three nodes join through it and converge; a node killed with SIGKILL
leaves every view within its lease; etcd stopped while writes go on: the
nodes keep their view, say so, and keep replicating, and register again
when it is back; a fourth node joins a running cluster and catches up;
the same cluster at replicas = 2 builds its ring from etcd's view. Every
wait is bounded.
"""

import os
import shutil
import subprocess
import tempfile
import time
import unittest
import urllib.request

import cluster
from cluster import Node, free_ports, wait_until

ETCD = "/usr/bin/etcd"
LEASE_S = 2
WAIT = 25.0


class Etcd:
    """One etcd member on 127.0.0.1 with a data directory of its own."""

    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="ribltcache-etcd.")
        self.client_port, self.peer_port = free_ports(2)
        self.proc = None
        self.log = None

    @property
    def url(self):
        return "http://127.0.0.1:%d" % self.client_port

    def start(self):
        peer = "http://127.0.0.1:%d" % self.peer_port
        self.log = open(os.path.join(self.dir, "etcd.log"), "ab")
        self.proc = subprocess.Popen(
            [ETCD, "--name", "t", "--data-dir", os.path.join(self.dir, "data"),
             "--listen-client-urls", self.url,
             "--advertise-client-urls", self.url,
             "--listen-peer-urls", peer,
             "--initial-advertise-peer-urls", peer,
             "--initial-cluster", "t=" + peer],
            stdin=subprocess.DEVNULL, stdout=self.log, stderr=self.log)
        ok = wait_until(self.healthy, 20.0, 0.1)
        if not ok:
            raise RuntimeError("etcd did not start")
        return self

    def healthy(self):
        if self.proc.poll() is not None:
            return False
        try:
            with urllib.request.urlopen(self.url + "/health",
                                        timeout=1) as r:
                return b'"health":"true"' in r.read()
        except OSError:
            return False

    def stop(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(20)
        if self.log:
            self.log.close()
            self.log = None
        self.proc = None

    def close(self):
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


def view(node):
    """{node id: state} of a node's etcd peers, and its membership text."""
    st = node.repl_stats()
    out = {}
    for k, v in st.items():
        if k.startswith("peer") and k.endswith(":origin") and v == "etcd":
            i = k[:-len(":origin")]
            out[int(st[i + ":node_id"])] = st[i + ":state"]
    return out, st.get("membership", "")






class EtcdMembership(unittest.TestCase):
    def setUp(self):
        self.etcd = Etcd().start()
        self.nodes = []

    def tearDown(self):
        errors = []
        for n in self.nodes:
            try:
                n.close()
            except AssertionError as e:
                errors.append(str(e))
        self.etcd.close()
        if errors:
            raise AssertionError("\n".join(errors))

    def logs(self):
        return "\n".join("--- %s\n%s" % (n.name, n.stderr()[-2500:])
                         for n in self.nodes)

    def add(self, node_id, extra=None):
        cp, pp = free_ports(2)
        s = {"tcpport": cp, "inter": "127.0.0.1", "num_threads": 2,
             "node_id": node_id, "repl_port": pp,
             "repl_listen": "127.0.0.1", "peers": "",
             "cluster_secret": cluster.SECRET, "repl_period_ms": 50,
             "etcd": self.etcd.url, "etcd_lease_s": LEASE_S,
             "verbosity": 1}
        s.update(extra or {})
        node = Node(s, "node%d" % node_id).start()
        self.nodes.append(node)
        return node

    def all_see(self, nodes, ids):
        return all(set(view(n)[0]) == set(ids) - {int(n.settings["node_id"])}
                   and all(st == "up" for st in view(n)[0].values())
                   for n in nodes)

    def test_join_kill_outage_and_join(self):
        n1, n2, n3 = (self.add(i) for i in (1, 2, 3))
        self.assertTrue(wait_until(lambda: self.all_see(self.nodes, {1, 2, 3}),
                                   WAIT), self.logs())
        self.assertIn("(3 members)", view(n1)[1])
        cluster.set_prefixed(n1, b"a", 200)
        self.assertTrue(wait_until(lambda: cluster.has_prefixed(n3, b"a", 200), WAIT))

        # SIGKILL: its lease runs out and it leaves every view
        n3.sigkill()
        t0 = time.monotonic()
        self.assertTrue(wait_until(lambda: all(
            3 not in view(n)[0] for n in (n1, n2)), LEASE_S + 10), self.logs())
        left = time.monotonic() - t0
        print("\nSIGKILLed node left the views after %.1f s (lease %d s)"
              % (left, LEASE_S), flush=True)
        self.nodes.remove(n3)
        n3.close()

        # etcd down while writes go on: views kept, replication goes on
        self.etcd.stop()
        self.assertTrue(wait_until(
            lambda: "not answering" in view(n1)[1], WAIT), view(n1)[1])
        self.assertIn("last view kept", view(n1)[1])
        cluster.set_prefixed(n1, b"b", 200)
        self.assertTrue(wait_until(lambda: cluster.has_prefixed(n2, b"b", 200), WAIT))
        self.assertEqual(set(view(n2)[0]), {1})
        self.etcd.start()
        self.assertTrue(wait_until(
            lambda: all("(2 members)" in view(n)[1] for n in (n1, n2)),
            WAIT), self.logs())

        # a fourth node joins and catches up
        n4 = self.add(4)
        self.assertTrue(wait_until(lambda: self.all_see([n1, n2, n4],
                                                        {1, 2, 4}),
                                   WAIT), self.logs())
        self.assertTrue(wait_until(lambda: cluster.has_prefixed(n4, b"a", 200) and
                                   cluster.has_prefixed(n4, b"b", 200), WAIT),
                        self.logs())

    def test_replicas_two(self):
        extra = {"replicas": 2, "ring_handoff_ms": 1000,
                 "ring_down_ms": 1000}
        for i in (1, 2, 3):
            self.add(i, extra)
        self.assertTrue(wait_until(lambda: self.all_see(self.nodes,
                                                        {1, 2, 3}),
                                   WAIT), self.logs())
        self.assertTrue(wait_until(lambda: all(
            n.stats("ring").get("ring_members") == "3" for n in self.nodes),
            WAIT), self.logs())
        cluster.set_prefixed(self.nodes[0], b"r", 300)
        for n in self.nodes:
            self.assertTrue(wait_until(lambda: cluster.has_prefixed(n, b"r", 300), WAIT),
                            self.logs())
        # each key on exactly two nodes
        self.assertTrue(wait_until(
            lambda: sum(int(n.stats()["curr_items"])
                        for n in self.nodes) == 2 * 300, WAIT),
            "items held %s, want 600 in all\n%s" % (
                [n.stats()["curr_items"] for n in self.nodes], self.logs()))

    def test_bad_url_refuses_to_start(self):
        cp, pp = free_ports(2)
        node = Node({"tcpport": cp, "inter": "127.0.0.1", "node_id": 1,
                     "repl_port": pp, "repl_listen": "127.0.0.1",
                     "peers": "", "cluster_secret": cluster.SECRET,
                     "etcd": "https://127.0.0.1:1"}, "badurl")
        with self.assertRaises(RuntimeError) as cm:
            node.start()
        self.assertIn("only http:// URLs", str(cm.exception))


if __name__ == "__main__":
    cluster.main()
