"""Membership through a registry: nodes join through it and converge; a
node killed with SIGKILL is declared dead (after indirect probes) and no
longer chosen for rounds, then rejoins under a newer incarnation; the
cluster keeps replicating with its cached view while the registry is
down; a restarted registry gets every member back; a new node joins a
running cluster and catches up; a node stopped cleanly leaves the view.

The registry is the same binary in registry-only mode (repl_port = 0).
Short periods keep the test quick; every wait is bounded.
"""

import time
import unittest

from pymemcache.client.base import Client

import cluster
from cluster import Node, SECRET, free_ports, wait_until

TIMING = {
    "heartbeat_ms": 100,
    "probe_ms": 100,
    "probe_timeout_ms": 200,
    "suspect_timeout_ms": 1000,
    "indirect_probes": 2,
}
WAIT = 30.0


def client(node):
    return Client(("127.0.0.1", node.port), connect_timeout=5, timeout=5)


def get_all(c, keys):
    got = {}
    for start in range(0, len(keys), 100):
        got.update(c.get_many(keys[start:start + 100]))
    return got


def members(st):
    """The peers of a node's `stats replication`, by node id:
    {id: {"addr", "origin", "member", "state", "rounds", ...}}."""
    peers = {}
    for k, v in st.items():
        if k.startswith("peer") and ":" in k:
            idx, field = k.split(":", 1)
            if idx == "peer_port":
                continue
            peers.setdefault(idx, {})[field] = v
    return {int(p["node_id"]): p for p in peers.values() if "node_id" in p}


def directory(reg):
    """The registry's members, by node id: {id: {"state", ...}}."""
    st = reg.stats("registry")
    rows = {}
    for k, v in st.items():
        if k.startswith("member") and ":" in k:
            idx, field = k.split(":", 1)
            rows.setdefault(idx, {})[field] = v
    return {int(r["node_id"]): r for r in rows.values()}, st


class RegistryCluster:
    """A registry and n nodes that find each other only through it."""

    def __init__(self, n=3):
        self.n = n
        self.nodes = []
        self.reg = None

    def start(self):
        ports = free_ports(2 * (self.n + 1) + 2)
        self.reg_client, self.reg_port = ports[0], ports[1]
        self.spare = ports[2:4]  # for a node that joins later
        self.ports = ports[4:]
        self.reg = Node({
            "tcpport": self.reg_client,
            "inter": "127.0.0.1",
            "num_threads": 1,
            "repl_port": 0,
            "registry_port": self.reg_port,
            "registry_listen": "127.0.0.1",
            "cluster_secret": SECRET,
            **TIMING,
        }, "registry").start()
        for i in range(self.n):
            self.add_node(i + 1, self.ports[2 * i], self.ports[2 * i + 1])
        return self

    def add_node(self, node_id, client_port, peer_port):
        node = Node({
            "tcpport": client_port,
            "inter": "127.0.0.1",
            "num_threads": 2,
            "maxbytes": "64m",
            "node_id": node_id,
            "repl_port": peer_port,
            "repl_listen": "127.0.0.1",
            "registry": "127.0.0.1:%d" % self.reg_port,
            "cluster_secret": SECRET,
            "repl_period_ms": 50,
            **TIMING,
        }, "node%d" % node_id).start()
        self.nodes.append(node)
        return node

    def close(self):
        errors = []
        for node in self.nodes + ([self.reg] if self.reg else []):
            try:
                node.close()
            except AssertionError as e:
                errors.append(str(e))
        self.nodes, self.reg = [], None
        if errors:
            raise AssertionError("\n".join(errors))

    def logs(self):
        return "\n".join("--- %s\n%s" % (n.name, n.stderr()[-3000:])
                         for n in self.nodes + [self.reg] if n)

    def __enter__(self):
        try:
            return self.start()
        except Exception:
            self.close()
            raise

    def __exit__(self, *exc):
        self.close()


def view_is(node, want_alive, source_prefix="registry 127.0.0.1:"):
    """True when node's membership comes from a registry and its peers
    alive and connected are exactly want_alive (node ids)."""
    st = node.repl_stats()
    if not st.get("membership", "").startswith(source_prefix):
        return False
    m = members(st)
    alive = {i for i, p in m.items()
             if p["member"] == "alive" and p["state"] == "up"}
    return alive == set(want_alive) and all(
        p["origin"] == "registry" for p in m.values())


class Registry(unittest.TestCase):
    def test_join_kill_rejoin(self):
        with RegistryCluster(3) as rc:
            n1, n2, n3 = rc.nodes
            # Joined through the registry only (no peer lists).
            for node, others in ((n1, {2, 3}), (n2, {1, 3}), (n3, {1, 2})):
                self.assertTrue(wait_until(lambda: view_is(node, others),
                                           WAIT), rc.logs())
            d, st = directory(rc.reg)
            self.assertEqual({i: r["state"] for i, r in d.items()},
                             {1: "alive", 2: "alive", 3: "alive"})

            # Writes on each node converge everywhere.
            data = {}
            for i, node in enumerate(rc.nodes):
                c = client(node)
                part = {"join-%d-%03d" % (i, k): b"v%d" % k
                        for k in range(100)}
                self.assertEqual(c.set_many(part, noreply=False), [])
                c.close()
                data.update(part)
            for node in rc.nodes:
                c = client(node)
                self.assertTrue(wait_until(
                    lambda: get_all(c, list(data)) == data, WAIT),
                    rc.logs())
                c.close()

            # SIGKILL node 3: suspect after the helpers fail to reach it,
            # dead a suspect timeout later, on the registry and in views.
            inc3 = int(d[3]["incarnation"])
            n3.sigkill()
            self.assertTrue(wait_until(
                lambda: directory(rc.reg)[0][3]["state"] == "dead", WAIT),
                rc.logs())
            d, st = directory(rc.reg)
            self.assertGreaterEqual(int(st["indirect_probes"]), 1)
            self.assertGreaterEqual(int(st["declared_dead"]), 1)
            for node in (n1, n2):
                self.assertTrue(wait_until(
                    lambda: members(node.repl_stats())[3]["member"] == "dead",
                    WAIT), rc.logs())

            # A dead peer is never chosen: its round counter stands still
            # while rounds with the live peer go on.
            m = members(n1.repl_stats())
            dead_rounds = int(m[3]["rounds"])
            live_rounds = int(m[2]["rounds"])
            self.assertTrue(wait_until(
                lambda: int(members(n1.repl_stats())[2]["rounds"]) >=
                live_rounds + 5, WAIT), rc.logs())
            m = members(n1.repl_stats())
            self.assertEqual(int(m[3]["rounds"]), dead_rounds)
            self.assertEqual(m[3]["state"], "down")

            # Writes while it is dead, then it comes back (same config,
            # empty store): newer incarnation, alive, caught up.
            c1 = client(n1)
            during = {"dead-%03d" % k: b"d%d" % k for k in range(200)}
            self.assertEqual(c1.set_many(during, noreply=False), [])
            data.update(during)
            c1.close()
            n3.start()
            self.assertTrue(wait_until(
                lambda: directory(rc.reg)[0][3]["state"] == "alive", WAIT),
                rc.logs())
            self.assertGreater(
                int(directory(rc.reg)[0][3]["incarnation"]), inc3)
            self.assertTrue(wait_until(lambda: view_is(n1, {2, 3}), WAIT),
                            rc.logs())
            c3 = client(n3)
            self.assertTrue(wait_until(
                lambda: get_all(c3, list(data)) == data, WAIT), rc.logs())
            c3.close()

    def test_registry_down_restart_and_new_node(self):
        with RegistryCluster(3) as rc:
            n1, n2, n3 = rc.nodes
            for node, others in ((n1, {2, 3}), (n2, {1, 3}), (n3, {1, 2})):
                self.assertTrue(wait_until(lambda: view_is(node, others),
                                           WAIT), rc.logs())

            # The registry dies: the nodes keep their cached view and keep
            # replicating.
            rc.reg.sigkill()
            for node in rc.nodes:
                self.assertTrue(wait_until(
                    lambda: node.repl_stats()["membership"].startswith(
                        "cached"), WAIT), rc.logs())
                self.assertEqual(node.repl_stats()["registries_connected"],
                                 "0")
            data = {"down-%03d" % k: b"x%d" % k for k in range(300)}
            c2 = client(n2)
            self.assertEqual(c2.set_many(data, noreply=False), [])
            c2.close()
            for node in (n1, n3):
                c = client(node)
                self.assertTrue(wait_until(
                    lambda: get_all(c, list(data)) == data, WAIT),
                    rc.logs())
                c.close()
            for node, others in ((n1, {2, 3}), (n2, {1, 3}), (n3, {1, 2})):
                self.assertTrue(view_is(node, others, "cached"),
                                node.repl_stats())

            # The registry comes back empty: every member registers again
            # and the views come from the registry once more.
            rc.reg.start()
            self.assertTrue(wait_until(
                lambda: {i: r["state"] for i, r in
                         directory(rc.reg)[0].items()} ==
                {1: "alive", 2: "alive", 3: "alive"}, WAIT), rc.logs())
            for node, others in ((n1, {2, 3}), (n2, {1, 3}), (n3, {1, 2})):
                self.assertTrue(wait_until(lambda: view_is(node, others),
                                           WAIT), rc.logs())

            # A new node joins the running cluster and catches up.
            n4 = rc.add_node(4, rc.spare[0], rc.spare[1])
            for node, others in ((n1, {2, 3, 4}), (n4, {1, 2, 3})):
                self.assertTrue(wait_until(lambda: view_is(node, others),
                                           WAIT), rc.logs())
            c4 = client(n4)
            self.assertTrue(wait_until(
                lambda: get_all(c4, list(data)) == data, WAIT), rc.logs())
            c4.close()

            # Stopped cleanly, it leaves: gone from the directory and from
            # every view, not declared dead.
            n4.stop()
            self.assertTrue(wait_until(
                lambda: 4 not in directory(rc.reg)[0], WAIT), rc.logs())
            d, st = directory(rc.reg)
            self.assertGreaterEqual(int(st["leaves"]), 1)
            self.assertEqual(st["declared_dead"], "0")
            for node in (n1, n2, n3):
                self.assertTrue(wait_until(
                    lambda: 4 not in members(node.repl_stats()), WAIT),
                    rc.logs())
                self.assertTrue(view_is(node, {1, 2, 3} - {node.settings[
                    "node_id"]}), node.repl_stats())


if __name__ == "__main__":
    cluster.main()
