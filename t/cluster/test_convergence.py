"""Concurrent writes to the same keys on different nodes converge: once
the writers stop, every node holds the same winner of every key."""

import threading
import unittest

from pymemcache.client.base import Client

import cluster
from cluster import Cluster, wait_until

NKEYS = 200
ROUNDS = 3  # each writer writes every key this many times
CHUNK = 20  # the writers meet at a barrier after this many keys
WAIT = 30.0


def snapshot(node, keys):
    """{key: (value, cas)} of every key present on node."""
    c = Client(("127.0.0.1", node.port), connect_timeout=5, timeout=5)
    try:
        out = {}
        for start in range(0, len(keys), 100):
            for k, (v, cas) in c.gets_many(keys[start:start + 100]).items():
                out[k] = (v, cas)
        return out
    finally:
        c.close()


class Convergence(unittest.TestCase):
    def test_concurrent_writers_converge(self):
        keys = ["k-%03d" % i for i in range(NKEYS)]
        with Cluster(3) as cl:
            self.assertTrue(cl.wait_connected(), cl.logs())
            errors = []
            step = threading.Barrier(3, timeout=30)

            def writer(idx):
                c = Client(("127.0.0.1", cl[idx].port), connect_timeout=5,
                           timeout=5)
                try:
                    for r in range(ROUNDS):
                        # In lockstep, chunk by chunk, so that the writers
                        # really race; within a chunk each goes through
                        # the keys in its own order.
                        for j in range(NKEYS):
                            if j % CHUNK == 0:
                                step.wait()
                            base = j - j % CHUNK
                            k = keys[base + (j + idx * 7 + r * 3) % CHUNK]
                            v = ("node%d-round%d-%s" % (idx + 1, r, k))
                            if not c.set(k, v.encode(), noreply=False):
                                errors.append("set %s on node %d" %
                                              (k, idx + 1))
                except Exception as e:  # reported by the main thread
                    errors.append("writer %d: %r" % (idx + 1, e))
                    step.abort()
                finally:
                    c.close()

            threads = [threading.Thread(target=writer, args=(i,))
                       for i in range(3)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(timeout=60)
            self.assertFalse(any(t.is_alive() for t in threads))
            self.assertEqual(errors, [])

            last = {}

            def converged():
                snaps = [snapshot(n, keys) for n in cl.nodes]
                last["snaps"] = snaps
                return all(len(s) == NKEYS for s in snaps) and \
                    snaps[0] == snaps[1] == snaps[2]
            ok = wait_until(converged, WAIT, interval=0.2)
            if not ok:
                snaps = last["snaps"]
                diff = [k for k in keys
                        if not (snaps[0].get(k) == snaps[1].get(k) ==
                                snaps[2].get(k))]
                self.fail("%d keys differ after %ss, e.g. %s: %r\n%s" % (
                    len(diff), WAIT, diff[:1],
                    [s.get(diff[0]) for s in snaps] if diff else None,
                    cl.logs()))
            final = last["snaps"][0]
            # Every winner is a value some writer wrote for that key, and
            # it is a last write: versions grow with every write on a node,
            # so the greatest version of a key is some writer's final
            # write of it.
            winners = {}
            for k, (v, _) in final.items():
                node, rnd, key = v.decode().split("-", 2)
                self.assertEqual(key, k)
                self.assertIn(node, ("node1", "node2", "node3"))
                self.assertEqual(rnd, "round%d" % (ROUNDS - 1), v)
                winners[node] = winners.get(node, 0) + 1
            print("\nwinners by node: %s" % sorted(winners.items()))
            # curr_items agree too.
            self.assertEqual(len({n.curr_items() for n in cl.nodes}), 1)


if __name__ == "__main__":
    cluster.main()
