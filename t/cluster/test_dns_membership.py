"""Membership from DNS (peers_dns): nodes find each other through a
resolver the test runs itself, Debian's dnsmasq on 127.0.0.1 with files
the test writes.

A records: three nodes listen for peers on 127.0.0.1, .2 and .3, all on
one port, and the name `peers.test` lists them in a hosts file dnsmasq
rereads on SIGHUP. The nodes converge; a record removed takes the node
out of every view, and one added brings it back; with dnsmasq stopped the
nodes keep their view, say so in `stats replication`, and keep
replicating. SRV records: one name, three targets with three ports, read
at start (dnsmasq's --srv-host).
"""

import os
import shutil
import signal
import subprocess
import tempfile
import time
import unittest

import cluster
from cluster import Node, free_ports, wait_until

DNSMASQ = "/usr/sbin/dnsmasq"
WAIT = 20.0
INTERVAL_MS = 200


class Dnsmasq:
    """dnsmasq on 127.0.0.1:port answering only for .test from files."""

    def __init__(self, extra=()):
        self.dir = tempfile.mkdtemp(prefix="ribltcache-dns.")
        self.hosts = os.path.join(self.dir, "hosts")
        self.port = free_ports(1)[0]
        self.extra = list(extra)
        self.proc = None
        self.write_hosts([])

    def write_hosts(self, addrs):
        with open(self.hosts, "w") as f:
            for a in addrs:
                f.write("%s peers.test\n" % a)
        if self.proc is not None:
            self.proc.send_signal(signal.SIGHUP)  # rereads addn-hosts

    def start(self):
        self.log = open(os.path.join(self.dir, "dnsmasq.log"), "ab")
        self.proc = subprocess.Popen(
            [DNSMASQ, "--keep-in-foreground", "--port=%d" % self.port,
             "--listen-address=127.0.0.1", "--bind-interfaces",
             "--no-resolv", "--no-hosts", "--local=/test/",
             "--addn-hosts=%s" % self.hosts, "--pid-file=",
             "--user=%s" % ("root" if os.geteuid() == 0 else
                            os.environ.get("USER", "nobody")),
             "--log-facility=-"] + self.extra,
            stdin=subprocess.DEVNULL, stdout=self.log, stderr=self.log)
        time.sleep(0.3)
        if self.proc.poll() is not None:
            raise RuntimeError("dnsmasq did not start: %s" % open(
                os.path.join(self.dir, "dnsmasq.log")).read())
        return self

    def stop(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)
        if self.proc is not None:
            self.log.close()
        self.proc = None

    def close(self):
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)

    @property
    def server(self):
        return "127.0.0.1:%d" % self.port


def peers(node):
    """{peer address: state} of the dns-origin peers of a node, and its
    membership line."""
    rows, membership = cluster.peers_of(node, "dns")
    return {r["addr"]: r["state"] for r in rows}, membership






class DnsMembership(unittest.TestCase):
    def setUp(self):
        self.nodes = []
        self.dns = None

    def tearDown(self):
        try:
            cluster.close_nodes(self.nodes)
        finally:
            if self.dns:
                self.dns.close()

    def logs(self):
        return cluster.logs_of(self.nodes, 2500)

    def node(self, i, client_port, peer_port, names, listen=None):
        return Node({
            "tcpport": client_port, "inter": "127.0.0.1", "num_threads": 2,
            "node_id": i, "repl_port": peer_port,
            "repl_listen": listen or "127.0.0.1", "peers": "",
            "cluster_secret": cluster.SECRET, "repl_period_ms": 50,
            "peers_dns": names, "peers_dns_server": self.dns.server,
            "peers_dns_interval_ms": INTERVAL_MS, "verbosity": 1,
        }, "node%d" % i)

    def test_a_records_join_leave_and_resolver_down(self):
        self.dns = Dnsmasq().start()
        addrs = ["127.0.0.1", "127.0.0.2", "127.0.0.3"]
        self.dns.write_hosts(addrs)
        ports = free_ports(4)
        peer_port = ports[3]
        for i in range(3):
            self.nodes.append(self.node(
                i + 1, ports[i], peer_port, "peers.test:%d" % peer_port,
                listen=addrs[i]).start())
        n1, n2, n3 = self.nodes
        every = {"%s:%d" % (a, peer_port) for a in addrs}
        # each node: the other two up, itself recognised
        self.assertTrue(wait_until(lambda: all(
            set(peers(n)[0]) == every and
            sorted(peers(n)[0].values()) == ["self", "up", "up"]
            for n in self.nodes), WAIT), self.logs())
        self.assertIn("dns peers.test:%d (3 addresses)" % peer_port,
                      peers(n1)[1])
        cluster.set_prefixed(n1, b"a", 200)
        self.assertTrue(wait_until(lambda: cluster.has_prefixed(n3, b"a", 200), WAIT),
                        self.logs())

        # node 3's record removed: it leaves the others' views
        self.dns.write_hosts(addrs[:2])
        gone = "127.0.0.3:%d" % peer_port
        self.assertTrue(wait_until(lambda: all(
            gone not in peers(n)[0] for n in (n1, n2)), WAIT), self.logs())
        self.assertIn("leaves the view", n1.stderr())
        cluster.set_prefixed(n1, b"b", 100)
        self.assertTrue(wait_until(lambda: cluster.has_prefixed(n2, b"b", 100), WAIT))
        # added back: node 3 catches up on what it missed
        self.dns.write_hosts(addrs)
        self.assertTrue(wait_until(lambda: peers(n1)[0].get(gone) == "up",
                                   WAIT), self.logs())
        self.assertTrue(wait_until(lambda: cluster.has_prefixed(n3, b"b", 100), WAIT),
                        self.logs())

        # the resolver stops: views stay, replication goes on
        self.dns.stop()
        self.assertTrue(wait_until(
            lambda: "not answering" in peers(n1)[1], WAIT),
            peers(n1)[1])
        self.assertIn("last view kept", peers(n1)[1])
        self.assertEqual(len(peers(n1)[0]), 3)
        cluster.set_prefixed(n2, b"c", 100)
        self.assertTrue(wait_until(lambda: cluster.has_prefixed(n3, b"c", 100), WAIT))
        self.assertIn("keeping the last view", n1.stderr())

    def test_srv_records(self):
        ports = free_ports(6)
        peer_ports = ports[3:]
        self.dns = Dnsmasq(extra=[
            "--srv-host=_peers._tcp.cache.test,node%d.test,%d" % (i + 1, p)
            for i, p in enumerate(peer_ports)] + [
            "--host-record=node%d.test,127.0.0.1" % (i + 1)
            for i in range(3)]).start()
        for i in range(3):
            self.nodes.append(self.node(
                i + 1, ports[i], peer_ports[i],
                "_peers._tcp.cache.test:1").start())
        self.assertTrue(wait_until(lambda: all(
            sorted(peers(n)[0].values()) == ["self", "up", "up"]
            for n in self.nodes), WAIT), self.logs())
        want = {"127.0.0.1:%d" % p for p in peer_ports}
        self.assertEqual(set(peers(self.nodes[0])[0]), want)
        cluster.set_prefixed(self.nodes[2], b"s", 100)
        self.assertTrue(wait_until(lambda: cluster.has_prefixed(self.nodes[0], b"s",
                                                    100), WAIT), self.logs())

    def test_bad_settings_refuse_to_start(self):
        self.dns = Dnsmasq()
        ports = free_ports(2)
        n = self.node(1, ports[0], ports[1], "no-port-here")
        with self.assertRaises(RuntimeError) as cm:
            n.start()
        self.assertIn("peers_dns: 'no-port-here' is not name:port",
                      str(cm.exception))


if __name__ == "__main__":
    cluster.main()
