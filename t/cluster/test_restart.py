"""A node killed with SIGKILL and restarted empty from the same config
catches up with everything written before and while it was down, and
receives it once (not once from each peer)."""

import unittest

from pymemcache.client.base import Client

import cluster
from cluster import Cluster, wait_until

BEFORE = 500  # keys written while all nodes run
DURING = 1500  # keys written while node 3 is down
WAIT = 30.0


def client(node):
    return Client(("127.0.0.1", node.port), connect_timeout=5, timeout=5)


def get_all(c, keys):
    got = {}
    for start in range(0, len(keys), 100):
        got.update(c.get_many(keys[start:start + 100]))
    return got


class Restart(unittest.TestCase):
    def test_killed_node_catches_up(self):
        with Cluster(3) as cl:
            self.assertTrue(cl.wait_connected(), cl.logs())
            c1, c2 = client(cl[0]), client(cl[1])
            data = {}
            before = {"before-%04d" % i: b"b%d" % i for i in range(BEFORE)}
            self.assertEqual(c1.set_many(before, noreply=False), [])
            data.update(before)
            c3 = client(cl[2])
            self.assertTrue(wait_until(
                lambda: get_all(c3, list(before)) == before, WAIT),
                cl.logs())
            c3.close()

            cl[2].sigkill()
            self.assertFalse(cl[2].alive())
            during = {"during-%04d" % i: b"d%d" % i for i in range(DURING)}
            half = DURING // 2
            items = sorted(during.items())
            self.assertEqual(c1.set_many(dict(items[:half]),
                                         noreply=False), [])
            self.assertEqual(c2.set_many(dict(items[half:]),
                                         noreply=False), [])
            # Changes to keys it already had: a delete and an overwrite.
            self.assertTrue(c2.delete("before-0000", noreply=False))
            del data["before-0000"]
            self.assertTrue(c1.set("before-0001", b"changed", noreply=False))
            data["before-0001"] = b"changed"
            data.update(during)

            cl[2].start()  # same config file, empty store
            c3 = client(cl[2])
            keys = sorted(data) + ["before-0000"]
            last = {}

            def caught_up():
                last["got"] = get_all(c3, keys)
                return last["got"] == data
            ok = wait_until(caught_up, WAIT, interval=0.1)
            missing = [k for k in data if k not in last["got"]]
            self.assertTrue(ok, "%d keys missing (e.g. %s), extra %s\n%s" % (
                len(missing), missing[:3],
                set(last["got"]) - set(data), cl.logs()))
            # Only rounds carry what was written while it was down: as
            # initiator (a bulk transfer or streamed rounds) or as responder
            # (its peers' rounds push what it lacks).
            st = cl[2].repl_stats()
            counts = {k: cluster.repl_sum(st, k)
                      for k in ("bulk_transfers", "rounds_ok")}
            counts.update({k: int(st[k]) for k in (
                "served_symbol_requests", "served_bulk", "applied",
                "stale")})
            print("\nnode 3 after its restart: %s" % counts)
            self.assertGreater(counts["bulk_transfers"] + counts["rounds_ok"] +
                               counts["served_symbol_requests"] +
                               counts["served_bulk"], 0, st)
            self.assertGreaterEqual(int(st["applied"]), len(data), st)
            # From one peer, once: a node takes part in one round at a
            # time, so its two peers do not both send it everything.
            self.assertLessEqual(int(st["stale"]), len(data) // 10, st)
            self.assertEqual(cl[2].curr_items(), cl[0].curr_items())
            for c in (c1, c2, c3):
                c.close()


if __name__ == "__main__":
    cluster.main()
