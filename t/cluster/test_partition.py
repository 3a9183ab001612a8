"""Partition and heal. Node 3 reaches its peers, and they reach it, only
through TCP proxies run by the test. Cutting the proxies isolates node 3
in both directions; both sides take writes (disjoint keys, conflicting
keys, deletes); after the heal every node holds the same items."""

import time
import unittest

from pymemcache.client.base import Client

import cluster
from cluster import Cluster, CuttableProxy, free_ports, wait_until

BASE = 200  # keys every node holds before the cut
SIDE = 300  # keys written on each side during the cut
BOTH = 50  # keys written on both sides during the cut
WAIT = 45.0


def client(node):
    return Client(("127.0.0.1", node.port), connect_timeout=5, timeout=5)


def snapshot(node, keys):
    c = client(node)
    try:
        out = {}
        for start in range(0, len(keys), 100):
            out.update(c.get_many(keys[start:start + 100]))
        return out
    finally:
        c.close()


class Partition(unittest.TestCase):
    def test_cut_and_heal(self):
        # Ports are fixed (proxies stand in front of them), and a proxy's
        # own listener can be given one just picked for a node.
        cluster.retry_on_taken_port(self.cut_and_heal_once)

    def cut_and_heal_once(self):
        ports = free_ports(6)
        client_ports, peer_ports = ports[:3], ports[3:]
        # to_node[i]: a proxy in front of node i's peer port.
        to_node = [CuttableProxy(p) for p in peer_ports]
        proxies = to_node

        def peers_for(i, pp):
            if i == 2:  # the isolated node reaches the others via proxies
                return "127.0.0.1:%d,127.0.0.1:%d,127.0.0.1:%d" % (
                    to_node[0].port, to_node[1].port, pp[2])
            return "127.0.0.1:%d,127.0.0.1:%d,127.0.0.1:%d" % (
                pp[0], pp[1], to_node[2].port)

        cl = Cluster(3, peers_for=peers_for, ports=(client_ports, peer_ports))
        try:
            cl.start()
            self.run_partition(cl, proxies)
        finally:
            try:
                cl.close()
            finally:
                for p in proxies:
                    p.close()

    def run_partition(self, cl, proxies):
        self.assertTrue(cl.wait_connected(), cl.logs())
        c1, c2, c3 = (client(n) for n in cl.nodes)
        base = {"base-%03d" % i: b"base" for i in range(BASE)}
        self.assertEqual(c1.set_many(base, noreply=False), [])
        self.assertTrue(wait_until(
            lambda: snapshot(cl[2], list(base)) == base, 20.0), cl.logs())

        for p in proxies:
            p.cut()
        side_a = {"a-%03d" % i: b"from-node1-%d" % i for i in range(SIDE)}
        side_b = {"b-%03d" % i: b"from-node3-%d" % i for i in range(SIDE)}
        both = ["both-%02d" % i for i in range(BOTH)]
        self.assertEqual(c1.set_many(side_a, noreply=False), [])
        self.assertEqual(c3.set_many(side_b, noreply=False), [])
        for k in both:
            self.assertTrue(c2.set(k, b"node2:" + k.encode(), noreply=False))
            self.assertTrue(c3.set(k, b"node3:" + k.encode(), noreply=False))
        deleted = ["base-%03d" % i for i in range(0, BASE, 10)]
        for k in deleted:
            self.assertTrue(c3.delete(k, noreply=False))
        changed = ["base-%03d" % i for i in range(5, BASE, 10)]
        for k in changed:
            self.assertTrue(c1.set(k, b"changed", noreply=False))

        # The cut holds: let a few periods pass, then each side still
        # lacks the other side's writes.
        time.sleep(0.5)
        self.assertEqual(c3.get_many(list(side_a)[:50]), {},
                         "the partition leaked to node 3")
        self.assertEqual(c1.get_many(list(side_b)[:50]), {},
                         "the partition leaked to node 1")
        self.assertEqual(c2.get_many(list(side_b)[:50]), {},
                         "the partition leaked to node 2")

        healed = time.monotonic()
        for p in proxies:
            p.heal()
        keys = sorted(set(base) | set(side_a) | set(side_b) | set(both))
        last = {}

        def converged():
            snaps = [snapshot(n, keys) for n in cl.nodes]
            last["snaps"] = snaps
            if not snaps[0] == snaps[1] == snaps[2]:
                return False
            items = [n.curr_items() for n in cl.nodes]
            last["items"] = items
            return items[0] == items[1] == items[2]
        ok = wait_until(converged, WAIT, interval=0.1)
        took = time.monotonic() - healed
        snaps = last["snaps"]
        if not ok:
            diff = [k for k in keys
                    if not snaps[0].get(k) == snaps[1].get(k) ==
                    snaps[2].get(k)]
            self.fail("not converged %.1fs after the heal: %d keys differ "
                      "(e.g. %s: %r), curr_items %r\n%s" % (
                          took, len(diff), diff[:1],
                          [s.get(diff[0]) for s in snaps] if diff else None,
                          last.get("items"), cl.logs()))
        print("\nconverged %.3f s after the heal" % took)
        final = snaps[0]
        for k, v in side_a.items():
            self.assertEqual(final.get(k), v, k)
        for k, v in side_b.items():
            self.assertEqual(final.get(k), v, k)
        for k in deleted:
            self.assertNotIn(k, final)
        for k in changed:
            self.assertEqual(final.get(k), b"changed", k)
        # Node 3 wrote each of these after node 2 did (same clock, one
        # machine): last writer wins.
        for k in both:
            self.assertEqual(final.get(k), b"node3:" + k.encode(), k)
        expect = BASE - len(deleted) + 2 * SIDE + BOTH
        self.assertEqual(last["items"], [expect] * 3)
        for c in (c1, c2, c3):
            c.close()


if __name__ == "__main__":
    cluster.main()
