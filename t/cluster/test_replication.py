"""Three nodes replicate every kind of write: set, delete, flush_all,
incr, append, touch, all made on one node and read on the others."""

import time
import unittest

from pymemcache.client.base import Client

import cluster
import harness
from cluster import Cluster, wait_until

NKEYS = 1000
WAIT = 20.0  # seconds a replicated write may take to show everywhere


def client(node):
    return Client(("127.0.0.1", node.port), connect_timeout=5, timeout=5)


def meta_ttl(node, key):
    """Remaining TTL of key on node as the meta protocol reports it
    (-1 = never expires), or None when the key is missing."""
    reply = node.request(b"mg " + key.encode() + b" t\r\n")
    if reply.startswith(b"EN"):
        return None
    for tok in reply.split():
        if tok.startswith(b"t"):
            return int(tok[1:])
    raise AssertionError("no TTL in %r" % reply)


class Replication(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.cl = Cluster(3).start()
        try:
            if not cls.cl.wait_connected():
                raise AssertionError("nodes did not connect:\n" +
                                     cls.cl.logs())
        except BaseException:
            cls.cl.close()
            raise
        cls.clients = [client(n) for n in cls.cl.nodes]

    @classmethod
    def tearDownClass(cls):
        for c in cls.clients:
            c.close()
        cls.cl.close()

    def everywhere(self, check, what):
        """Waits until check(client) holds on every node."""
        for i, c in enumerate(self.clients):
            self.assertTrue(wait_until(lambda: check(c), WAIT),
                            "%s not on node %d\n%s" % (what, i + 1,
                                                       self.cl.logs()))

    def test_0_replication_thread_named(self):
        names = harness.thread_names(self.cl.nodes[0].proc.pid)
        self.assertEqual(names.count("rc-repl"), 1, names)

    def test_1_sets_and_deletes(self):
        c1 = self.clients[0]
        data = {"set-%04d" % i: ("value-%d-" % i).encode() * (1 + i % 7)
                for i in range(NKEYS)}
        keys = sorted(data)
        for start in range(0, NKEYS, 100):
            chunk = {k: data[k] for k in keys[start:start + 100]}
            self.assertEqual(c1.set_many(chunk, noreply=False), [])

        def all_there(c):
            got = {}
            for start in range(0, NKEYS, 100):
                got.update(c.get_many(keys[start:start + 100]))
            return got == data
        self.everywhere(all_there, "%d keys" % NKEYS)

        gone = keys[:100]
        for k in gone:
            self.assertTrue(c1.delete(k, noreply=False))

        def deleted(c):
            return not c.get_many(gone) and \
                c.get(keys[100]) == data[keys[100]]
        self.everywhere(deleted, "the deletes")

    def test_2_flush_all(self):
        c1, c2, c3 = self.clients
        before = {"pre-flush-%d" % i: b"old" for i in range(50)}
        self.assertEqual(c1.set_many(before, noreply=False), [])
        self.everywhere(lambda c: len(c.get_many(list(before))) == 50,
                        "the writes before the flush")
        # Keep the writes before the flush strictly older than it.
        time.sleep(0.01)
        self.assertTrue(c2.flush_all(noreply=False))
        self.everywhere(lambda c: c.get_many(list(before)) == {},
                        "the flush")
        time.sleep(0.01)
        self.assertTrue(c3.set("post-flush", b"new", noreply=False))
        self.everywhere(lambda c: c.get("post-flush") == b"new",
                        "the write after the flush")
        # Several rounds later the flush still holds and the write after
        # it still survives, everywhere.
        st0 = cluster.repl_sum(self.cl[0].repl_stats(), "rounds_ok")
        self.assertTrue(wait_until(
            lambda: cluster.repl_sum(self.cl[0].repl_stats(), "rounds_ok")
            >= st0 + 5, WAIT), "no reconciliation rounds ran")
        for i, c in enumerate(self.clients):
            self.assertEqual(c.get_many(list(before)), {}, "node %d" % i)
            self.assertEqual(c.get("post-flush"), b"new", "node %d" % i)

    def test_3_incr_append_touch(self):
        c1, c2, c3 = self.clients
        self.assertTrue(c1.set("counter", b"10", noreply=False))
        self.everywhere(lambda c: c.get("counter") == b"10", "counter")
        self.assertEqual(c2.incr("counter", 5), 15)
        self.everywhere(lambda c: c.get("counter") == b"15", "incr")
        self.assertEqual(c3.decr("counter", 3), 12)
        self.everywhere(lambda c: c.get("counter") == b"12", "decr")

        self.assertTrue(c1.set("text", b"abc", noreply=False))
        self.everywhere(lambda c: c.get("text") == b"abc", "text")
        self.assertTrue(c3.append("text", b"def", noreply=False))
        self.everywhere(lambda c: c.get("text") == b"abcdef", "append")
        self.assertTrue(c2.prepend("text", b">", noreply=False))
        self.everywhere(lambda c: c.get("text") == b">abcdef", "prepend")

        self.assertTrue(c1.set("touched", b"t", expire=0, noreply=False))
        for n in self.cl.nodes:
            self.assertTrue(wait_until(lambda: meta_ttl(n, "touched") == -1,
                                       WAIT), n.name)
        self.assertTrue(c2.touch("touched", 600, noreply=False))
        for n in self.cl.nodes:
            ttl = wait_until(
                lambda: (meta_ttl(n, "touched") or -1) > 0 and
                meta_ttl(n, "touched"), WAIT)
            self.assertTrue(ttl and 500 < ttl <= 600,
                            "touch on %s: ttl %r" % (n.name, ttl))
        # A short touch makes the item expire on every node.
        self.assertTrue(c3.touch("touched", 1, noreply=False))
        self.everywhere(lambda c: c.get("touched") is None, "expiry by touch")

    def test_4_cas_across_nodes(self):
        c1, c2, _ = self.clients
        self.assertTrue(c1.set("caskey", b"v1", noreply=False))
        self.everywhere(lambda c: c.get("caskey") == b"v1", "caskey")
        v1, cas1 = c1.gets("caskey")
        v2, cas2 = c2.gets("caskey")
        self.assertEqual((v1, cas1), (v2, cas2))
        self.assertTrue(c2.cas("caskey", b"v2", cas2, noreply=False))
        self.everywhere(lambda c: c.get("caskey") == b"v2", "cas")
        # The old cas unique is stale everywhere now.
        self.assertFalse(c1.cas("caskey", b"v3", cas1, noreply=False))

    def test_4b_stale_while_revalidate(self):
        """md I on one node marks the value stale on every node; the first
        reader to win (W) on any node leaves a mark that makes every node
        answer Z; the winner's recache clears both everywhere."""
        n1, n2, n3 = self.cl.nodes
        self.assertEqual(n1.request(b"ms swr 2 T300\r\nv1\r\n"), b"HD\r\n")
        self.everywhere(lambda c: c.get("swr") == b"v1", "swr")
        self.assertEqual(n1.request(b"md swr I\r\n"), b"HD\r\n")
        for n in (n2, n3):
            self.assertTrue(wait_until(
                lambda: b" X" in n.request(b"mg swr k\r\n"), WAIT),
                "stale mark not replicated\n" + self.cl.logs())
        # The mg calls above won on n2 or n3 (each answers W at most once);
        # from now on every node answers Z X.
        for i, n in enumerate(self.cl.nodes):
            self.assertTrue(wait_until(
                lambda: n.request(b"mg swr\r\n") == b"HD Z X\r\n", WAIT),
                "won mark not on node %d: %r\n%s" % (
                    i + 1, n.request(b"mg swr\r\n"), self.cl.logs()))
        # The winner recaches with the current cas: clean everywhere.
        reply = n3.request(b"mg swr c\r\n").split()
        cas = [t for t in reply if t.startswith(b"c")][0][1:]
        self.assertEqual(
            n3.request(b"ms swr 2 T300 C" + cas + b"\r\nv2\r\n"), b"HD\r\n")
        self.everywhere(lambda c: c.get("swr") == b"v2", "recache")
        for i, n in enumerate(self.cl.nodes):
            self.assertEqual(n.request(b"mg swr\r\n"), b"HD\r\n",
                             "marks left on node %d" % (i + 1))

    def test_5_self_entry_in_shared_peer_list(self):
        # Every node finds its own address in the shared list and stops
        # dialing it (replication/README.md: marked `self`).
        for i, n in enumerate(self.cl.nodes):
            key = "peer%d:state" % i
            ok = wait_until(lambda: n.repl_stats().get(key) == "self", 5.0)
            self.assertTrue(ok, "%s: %s = %r (auth_failures %s)" % (
                n.name, key, n.repl_stats().get(key),
                n.repl_stats().get("auth_failures")))


if __name__ == "__main__":
    cluster.main()
