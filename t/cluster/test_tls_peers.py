"""Peer and registry channels over TLS 1.3 with mutual certificates.

Every certificate is made here, for this run, with the openssl command
line: a cluster CA, one certificate per node (common name node-<id>), one
for the registry, and the ones that must be refused: a node certificate
from another CA and an expired one. Checks: three TLS nodes converge and
a value written on one crosses the wire only encrypted (a relaying proxy
records the bytes; the same check finds the value in clear over the HMAC
channel, so it can fail); a node whose certificate comes from another CA,
or has expired, is refused by the cluster and refuses it back, both sides
logging the reason, and no data crosses either way; a certificate for
another node id refuses to start; nodes find each other through a TLS
registry; SIGHUP reloads the peer certificates.
"""

import os
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import time
import unittest

import cluster
import peerwire
from cluster import (Cluster, CuttableProxy, Node, free_ports, wait_until)

WAIT = 30.0


def openssl(*args):
    subprocess.run(("openssl",) + args, check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)


class Certs:
    """A directory of certificates made for one test class."""

    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="ribltcache-tls-peers.")
        self.ca("ca")
        self.ca("otherca")

    def path(self, name):
        return os.path.join(self.dir, name)

    def ca(self, name):
        openssl("req", "-x509", "-newkey", "ec", "-pkeyopt",
                "ec_paramgen_curve:prime256v1", "-nodes", "-days", "2",
                "-subj", "/CN=%s" % name, "-keyout", self.path(name + ".key"),
                "-out", self.path(name + ".crt"))

    def leaf(self, cn, ca="ca", name=None, days="2"):
        """A key and a certificate for common name cn signed by ca; returns
        (cert path, key path)."""
        name = name or cn
        key, csr, crt = (self.path(name + ext)
                         for ext in (".key", ".csr", ".crt"))
        openssl("req", "-newkey", "ec", "-pkeyopt",
                "ec_paramgen_curve:prime256v1", "-nodes", "-subj",
                "/CN=%s" % cn, "-keyout", key, "-out", csr)
        openssl("x509", "-req", "-in", csr, "-CA", self.path(ca + ".crt"),
                "-CAkey", self.path(ca + ".key"), "-CAcreateserial", "-days",
                days, "-out", crt)
        return crt, key

    def settings(self, cn, ca="ca", name=None, days="2"):
        crt, key = self.leaf(cn, ca, name, days)
        return {"repl_tls_cert": crt, "repl_tls_key": key,
                "repl_tls_ca": self.path(ca + ".crt")}

    def close(self):
        shutil.rmtree(self.dir, ignore_errors=True)


def tls_cluster(certs, n=3, peers_for=None, ports=None, extra=None):
    c = Cluster(n, extra=dict({"cluster_secret": ""}, **(extra or {})),
                peers_for=peers_for, ports=ports)
    orig = c.settings

    def settings(i, client_ports, peer_ports):
        s = orig(i, client_ports, peer_ports)
        s.update(certs.node[i + 1])
        return s
    c.settings = settings
    return c






def recv_lines(sock, n, timeout=20.0):
    """The next n lines from sock, without their CRLF."""
    buf = b""
    deadline = time.monotonic() + timeout
    while buf.count(b"\r\n") < n and time.monotonic() < deadline:
        sock.settimeout(max(0.1, deadline - time.monotonic()))
        chunk = sock.recv(65536)
        if not chunk:
            break
        buf += chunk
    return buf.split(b"\r\n")[:n]




class TlsPeers(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.certs = Certs()
        cls.certs.node = {i: cls.certs.settings("node-%d" % i)
                          for i in range(1, 4)}

    @classmethod
    def tearDownClass(cls):
        cls.certs.close()

    def test_converge_and_encrypted_on_the_wire(self):
        """Three TLS nodes converge; node 1's link to node 2 passes a
        recording proxy, which sees no value in clear (and does see it
        over an HMAC cluster, the control)."""
        marker = b"clear-text-marker-7f3a9c"
        for tls in (True, False):
            # Ports are fixed (a proxy stands in front of one), and the
            # proxy's own listener can be given one just picked for a node.
            seen = cluster.retry_on_taken_port(
                lambda: self.captured_between_nodes(tls, marker))
            self.assertGreater(len(seen), 200 * len(marker))
            if tls:
                self.assertNotIn(marker, seen)
                self.assertNotIn(b"k199", seen)
            else:
                self.assertIn(marker, seen)

    def captured_between_nodes(self, tls, marker):
        """200 values with marker set on node 1 of a three-node cluster (TLS
        or HMAC), once every node has them: the bytes node 1's link to
        node 2 carried."""
        ports = free_ports(6)
        proxy = CuttableProxy(ports[4])
        proxy.captured = bytearray()

        def peers_for(i, peer_ports):
            addrs = ["127.0.0.1:%d" % p for p in peer_ports]
            if i == 0:
                addrs[1] = "127.0.0.1:%d" % proxy.port
            return ",".join(addrs)
        c = (tls_cluster(self.certs, 3, peers_for,
                         (ports[:3], ports[3:6])) if tls else
             Cluster(3, peers_for=peers_for,
                     ports=(ports[:3], ports[3:6])))
        try:
            with c:
                self.assertTrue(c.wait_connected(WAIT), c.logs())
                cluster.set_prefixed(c[0], b"k", 200, marker)
                for node in c.nodes[1:]:
                    self.assertTrue(
                        wait_until(lambda: cluster.has_prefixed(node, b"k", 200),
                                   WAIT), c.logs())
                st = c[1].repl_stats()
                self.assertEqual(st["auth_failures"], "0")
                with proxy.lock:
                    return bytes(proxy.captured)
        finally:
            proxy.close()

    def refused_node(self, settings, reason_here, reason_there):
        """Three good nodes and a fourth with `settings` in one peer list:
        it stays out, both sides log why, nothing crosses."""
        self.certs.node[4] = settings
        with tls_cluster(self.certs, 4) as c:
            good, bad = c.nodes[:3], c[3]
            self.assertTrue(wait_until(
                lambda: all(reason_there in n.stderr() for n in good[:1]),
                WAIT), c.logs())
            self.assertTrue(wait_until(
                lambda: reason_here in bad.stderr(), WAIT), c.logs())
            cluster.set_prefixed(good[0], b"g", 100, b"good")
            cluster.set_prefixed(bad, b"b", 100, b"bad")
            self.assertTrue(wait_until(lambda: cluster.has_prefixed(good[2], b"g", 100),
                                       WAIT), c.logs())
            time.sleep(1.0)  # rounds every 50 ms: plenty of chances
            self.assertEqual(cluster.count_present(bad.port, cluster.prefixed_keys(b"g", 100)), 0)
            for n in good:
                self.assertEqual(cluster.count_present(n.port, cluster.prefixed_keys(b"b", 100)), 0)
            st = good[0].repl_stats()
            self.assertGreater(int(st["auth_failures"]), 0)
            self.assertEqual(
                bad.stats("health")["health"], "isolated", c.logs())

    def test_foreign_ca_refused_both_sides(self):
        self.refused_node(
            self.certs.settings("node-4", ca="otherca", name="node-4-other"),
            "certificate refused", "unknown ca")

    def test_expired_certificate_refused(self):
        s = self.certs.settings("node-4", name="node-4-expired", days="0")
        time.sleep(1.1)  # valid until the second it was made
        self.refused_node(s, "certificate expired",
                          "certificate has expired")

    def test_announced_id_must_match_certificate(self):
        """A process holding node 2's certificate that says it is node 3
        is refused before the handshake goes on, and the node says why;
        the same process saying it is node 2 gets its CHALLENGE."""
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.check_hostname = False
        ctx.load_verify_locations(self.certs.path("ca.crt"))
        ctx.load_cert_chain(self.certs.node[2]["repl_tls_cert"],
                            self.certs.node[2]["repl_tls_key"])
        with tls_cluster(self.certs, 1) as c:
            with peerwire.Peer(c[0].repl_port, ssl_context=ctx) as p:
                with self.assertRaises(peerwire.Closed):
                    p.hello(3)
            self.assertTrue(wait_until(
                lambda: "it announced node 3 with the certificate of node 2"
                in c[0].stderr(), WAIT), c.logs())
            with peerwire.Peer(c[0].repl_port, ssl_context=ctx) as p:
                self.assertEqual(p.hello(2), 1)

    def test_certificate_for_another_id_refuses_to_start(self):
        ports = free_ports(2)
        node = Node({"tcpport": ports[0], "inter": "127.0.0.1",
                     "node_id": 7, "repl_port": ports[1],
                     "repl_listen": "127.0.0.1", "peers": "",
                     **self.certs.node[2]}, "wrongid")
        with self.assertRaises(RuntimeError) as cm:
            node.start()
        self.assertIn("names node 2, but node_id is 7", str(cm.exception))

    def test_registry_over_tls(self):
        """Nodes find each other through a registry, every link TLS."""
        reg_cert = self.certs.settings("registry")
        ports = free_ports(8)
        reg = Node({"tcpport": ports[0], "inter": "127.0.0.1",
                    "num_threads": 1, "repl_port": 0,
                    "registry_port": ports[1],
                    "registry_listen": "127.0.0.1", "heartbeat_ms": 100,
                    **reg_cert}, "registry")
        nodes = []
        try:
            reg.start()
            for i in range(3):
                nodes.append(Node({
                    "tcpport": ports[2 + 2 * i], "inter": "127.0.0.1",
                    "num_threads": 2, "node_id": i + 1,
                    "repl_port": ports[3 + 2 * i],
                    "repl_listen": "127.0.0.1",
                    "registry": "127.0.0.1:%d" % ports[1],
                    "repl_period_ms": 50, "heartbeat_ms": 100,
                    **self.certs.node[i + 1]}, "node%d" % (i + 1)).start())
            self.assertTrue(wait_until(
                lambda: reg.stats("registry").get("members") == "3",
                WAIT), reg.stderr())
            cluster.set_prefixed(nodes[0], b"r", 100, b"via-registry")
            self.assertTrue(wait_until(lambda: cluster.has_prefixed(nodes[2], b"r", 100),
                                       WAIT),
                            "\n".join(n.stderr()[-2000:] for n in nodes))
        finally:
            for n in nodes + [reg]:
                n.close()

    def test_scaleout_relays_over_tls(self):
        """replicas = 1 on three nodes running -Z: a TLS client writes and
        reads every key through one node, so about two thirds are relayed,
        over TLS, to the nodes that own them. Each node's first -l address
        is its TLS listener (so the one it advertises); the harness talks
        to a notls: listener on the usual port."""
        ports = free_ports(3)
        ca = self.certs.path("ca.crt")

        def settings(i, client_ports, peer_ports):
            s = orig(i, client_ports, peer_ports)
            s.update({"inter": "127.0.0.1:%d,notls:127.0.0.1" % ports[i],
                      "ssl_enabled": "yes",
                      "ssl_chain_cert": s["repl_tls_cert"],
                      "ssl_key": s["repl_tls_key"], "ssl_ca_cert": ca,
                      "replicas": 1, "ring_handoff_ms": 1000})
            return s
        c = tls_cluster(self.certs, 3)
        orig = c.settings
        c.settings = settings
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.check_hostname = False
        ctx.load_verify_locations(ca)
        with c:
            self.assertTrue(c.wait_connected(WAIT), c.logs())
            self.assertTrue(wait_until(
                lambda: all(n.stats("ring").get("ring_members") == "3"
                            for n in c.nodes), WAIT), c.logs())
            keys = [b"relay-%d" % i for i in range(300)]
            st0 = c[0].stats()
            with ctx.wrap_socket(socket.create_connection(
                    ("127.0.0.1", ports[0]), timeout=10)) as s:
                s.sendall(b"".join(b"set %s 0 0 6\r\nvalue!\r\n" % k
                                   for k in keys))
                got = recv_lines(s, len(keys))
                self.assertEqual(set(got), {b"STORED"}, got[:5])
                s.sendall(b"".join(b"mg %s v\r\n" % k for k in keys))
                got = recv_lines(s, 2 * len(keys))
                self.assertEqual(got.count(b"value!"), len(keys))
            st1 = c[0].stats()
            relayed = (int(st1["proxied_requests"]) -
                       int(st0["proxied_requests"]))
            self.assertGreater(relayed, len(keys), c.logs())
            self.assertEqual(st1["proxy_failures"], st0["proxy_failures"])
            # every node finds every key, relaying (over TLS) what it
            # does not own, also for a client on its notls: listener
            for n in c.nodes:
                self.assertEqual(cluster.count_present(n.port, cluster.prefixed_keys(b"relay-", 300)), 300)

    def test_sighup_reloads_peer_certificates(self):
        with tls_cluster(self.certs, 2, extra={"verbosity": 1}) as c:
            self.assertTrue(c.wait_connected(WAIT), c.logs())
            os.kill(c[0].pid, signal.SIGHUP)
            self.assertTrue(wait_until(
                lambda: "peer certificates reloaded" in c[0].stderr(),
                WAIT), c.logs())
            # a key that no longer loads: the old context stays
            key = c[0].settings["repl_tls_key"]
            saved = open(key, "rb").read()
            try:
                with open(key, "wb") as f:
                    f.write(b"not a key\n")
                os.kill(c[0].pid, signal.SIGHUP)
                self.assertTrue(wait_until(
                    lambda: "peer certificates not reloaded" in
                    c[0].stderr(), WAIT), c.logs())
            finally:
                with open(key, "wb") as f:
                    f.write(saved)
            cluster.set_prefixed(c[0], b"h", 50, b"after-hup")
            self.assertTrue(wait_until(lambda: cluster.has_prefixed(c[1], b"h", 50),
                                       WAIT), c.logs())


if __name__ == "__main__":
    cluster.main()
