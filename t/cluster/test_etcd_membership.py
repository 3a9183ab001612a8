"""Membership through etcd: Debian's etcd (etcd-server), started by the test
on loopback with its own data directory and ports.

Three nodes join through it and converge; a node killed with SIGKILL
leaves every view within its lease; etcd stopped while writes go on: the
nodes keep their view, say so, and keep replicating, and register again
when it is back; a fourth node joins a running cluster and catches up;
the same cluster at replicas = 2 builds its ring from etcd's view, and
re-replicates a SIGKILLed node's keys once its lease runs out. Every wait
is bounded.
"""

import os
import shutil
import ssl
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


def openssl(*args, cwd):
    subprocess.run(("openssl",) + args, cwd=cwd, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def make_certs(d):
    """A CA, etcd's certificate (for IP 127.0.0.1) and a client one, in
    d."""
    ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
          "-nodes")
    openssl("req", "-x509", *ec, "-days", "2", "-subj", "/CN=etcd-ca",
            "-keyout", "ca.key", "-out", "ca.crt", cwd=d)
    for name, ext in (("server", "subjectAltName=IP:127.0.0.1\n"
                       "extendedKeyUsage=serverAuth,clientAuth\n"),
                      ("client", "extendedKeyUsage=clientAuth\n")):
        with open(os.path.join(d, name + ".ext"), "w") as f:
            f.write(ext)
        openssl("req", *ec, "-subj", "/CN=" + name, "-keyout",
                name + ".key", "-out", name + ".csr", cwd=d)
        openssl("x509", "-req", "-in", name + ".csr", "-CA", "ca.crt",
                "-CAkey", "ca.key", "-CAcreateserial", "-days", "2",
                "-extfile", name + ".ext", "-out", name + ".crt", cwd=d)


class Etcd:
    """One etcd member on 127.0.0.1 with a data directory of its own;
    with tls, its client port is https and wants client certificates."""

    def __init__(self, tls=False):
        self.dir = tempfile.mkdtemp(prefix="ribltcache-etcd.")
        self.client_port, self.peer_port = free_ports(2)
        self.proc = None
        self.log = None
        self.tls = tls
        if tls:
            make_certs(self.dir)

    def path(self, name):
        return os.path.join(self.dir, name)

    @property
    def url(self):
        return "%s://127.0.0.1:%d" % ("https" if self.tls else "http",
                                      self.client_port)

    def start(self):
        peer = "http://127.0.0.1:%d" % self.peer_port
        self.log = open(os.path.join(self.dir, "etcd.log"), "ab")
        self.proc = subprocess.Popen(
            [ETCD, "--name", "t", "--data-dir", os.path.join(self.dir, "data"),
             "--listen-client-urls", self.url,
             "--advertise-client-urls", self.url,
             "--listen-peer-urls", peer,
             "--initial-advertise-peer-urls", peer,
             "--initial-cluster", "t=" + peer] + ([
                 "--cert-file", self.path("server.crt"),
                 "--key-file", self.path("server.key"),
                 "--client-cert-auth",
                 "--trusted-ca-file", self.path("ca.crt")] if self.tls else []),
            stdin=subprocess.DEVNULL, stdout=self.log, stderr=self.log)
        ok = wait_until(self.healthy, 20.0, 0.1)
        if not ok:
            raise RuntimeError("etcd did not start")
        return self

    def healthy(self):
        if self.proc.poll() is not None:
            return False
        ctx = None
        if self.tls:
            ctx = ssl.create_default_context(cafile=self.path("ca.crt"))
            ctx.load_cert_chain(self.path("client.crt"),
                                self.path("client.key"))
        try:
            with urllib.request.urlopen(self.url + "/health", timeout=1,
                                        context=ctx) as r:
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
    """{node id: state} of a node's etcd peers, and its membership line."""
    rows, membership = cluster.peers_of(node, "etcd")
    return {int(r["node_id"]): r["state"] for r in rows}, membership






class EtcdMembership(unittest.TestCase):
    def setUp(self):
        self.etcd = Etcd().start()
        self.nodes = []

    def tearDown(self):
        try:
            cluster.close_nodes(self.nodes)
        finally:
            self.etcd.close()

    def logs(self):
        return cluster.logs_of(self.nodes, 2500)

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
        # SIGKILL one: its lease runs out, the ring shrinks to two, and
        # the survivors hold every key twice between them again
        victim = self.nodes.pop()
        victim.sigkill()
        victim.close()
        live = self.nodes
        self.assertTrue(wait_until(lambda: all(
            n.stats("ring").get("ring_members") == "2" for n in live),
            LEASE_S + WAIT), self.logs())
        for n in live:
            self.assertTrue(wait_until(
                lambda: cluster.has_prefixed(n, b"r", 300), WAIT),
                self.logs())
        self.assertTrue(wait_until(
            lambda: sum(int(n.stats()["curr_items"]) for n in live) == 600,
            WAIT), [n.stats()["curr_items"] for n in live])

    def test_tls_with_client_certificates(self):
        """etcd on https with --client-cert-auth: nodes with the client
        certificate join through it; one without is refused by etcd, gets
        no view and says etcd is not answering."""
        self.etcd.close()
        self.etcd = Etcd(tls=True).start()
        e = self.etcd
        certs = {"etcd_tls_ca": e.path("ca.crt"),
                 "etcd_tls_cert": e.path("client.crt"),
                 "etcd_tls_key": e.path("client.key")}
        n1, n2 = self.add(1, certs), self.add(2, certs)
        self.assertTrue(wait_until(lambda: self.all_see([n1, n2], {1, 2}),
                                   WAIT), self.logs())
        cluster.set_prefixed(n1, b"t", 100)
        self.assertTrue(wait_until(lambda: cluster.has_prefixed(n2, b"t", 100),
                                   WAIT))
        n3 = self.add(3, {"etcd_tls_ca": e.path("ca.crt")})
        self.assertTrue(wait_until(
            lambda: "not answering" in view(n3)[1], WAIT), view(n3)[1])
        self.assertIn("no view yet", view(n3)[1])
        time.sleep(1.0)
        self.assertEqual(view(n3)[0], {})
        self.assertNotIn(3, view(n1)[0])

    def test_bad_url_refuses_to_start(self):
        cp, pp = free_ports(2)
        node = Node({"tcpport": cp, "inter": "127.0.0.1", "node_id": 1,
                     "repl_port": pp, "repl_listen": "127.0.0.1",
                     "peers": "", "cluster_secret": cluster.SECRET,
                     "etcd": "grpc://127.0.0.1:1"}, "badurl")
        with self.assertRaises(RuntimeError) as cm:
            node.start()
        self.assertIn("only http:// and https:// URLs", str(cm.exception))


if __name__ == "__main__":
    cluster.main()
