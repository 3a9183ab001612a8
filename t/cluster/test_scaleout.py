"""Scale-out: with `replicas = 2`, each key lives on exactly 2 nodes and is
readable through every node.

Scenarios (nodes on loopback, static peer lists unless said otherwise):
  1. 3 nodes and 2. 4 nodes: 2000 keys written through random nodes are
     readable with their values through every node; after convergence
     every node holds exactly the keys of the partitions `stats ring` says
     it owns, so each key is on 2 nodes; single gets through node 1 are
     relayed exactly for the keys it does not own (proxied_requests);
     meta and binary requests work through owners and non-owners alike;
     deletes and flush_all made through any node hold through every node;
  3. one of 4 nodes killed with SIGKILL: once the survivors' rings drop it,
     only its partitions change owners, and every key (with 300 written
     after the kill) is on exactly 2 of the 3 live nodes, readable through
     each;
  4. a 4th node started next to 3: it owns the partitions where it ranks
     in the top 2 (in each, one old owner gives way; nothing else moves),
     holds exactly their keys, and each old node drops exactly the keys it
     lost (items_dropped) and holds no partition it does not own;
  5. through a registry (no peer lists): a 4th node joins as in 4, then a
     node is killed, declared dead and its partitions copied again as in 3;
  6. a joining node that reports no partition catching up (under the
     ring of all nodes) already holds every key of its partitions, so it
     never answers a miss for a key it owns;
  7. every key read through a joining node, from the moment it knows all
     nodes until it has caught up, has its value (with a long hand-off,
     so that only rounds end its catching up);
  8. the same through the old nodes, which must not relay reads to the
     joining node while it catches up;
  9. right after a SIGKILL, before the ring drops the dead node, every key
     read through every live node (multi-key gets) has its value:
     relaying falls back to the next owner of each key.
 10. writes meet at a key's preferred owner wherever they are sent: a set
     through one node, an incr through another and a gets through a third
     (not the second owner, whose reads are local) agree at once, and a
     cas unique used through one node fails through another.

A key's partition is computed here with the documented hash (FNV-1a 64
then the SplitMix64 finalizer, modulo the ring's partition count) and its
owners read from `stats ring`. What a node holds is read through a
connection marked with the relay hello (server/README.md, "Relaying"), which
the node always serves itself, and its curr_items must match.

Every wait polls, bounded in count and time; no timing is asserted.
"""

import random
import time
import unittest

import pylibmc
from pymemcache.client.base import Client

import cluster
from cluster import Cluster, Node, SECRET, free_ports, wait_until

R = 2
NKEYS = 2000
WAIT = 25.0  # bound of every wait for convergence
SCALE = {
    "replicas": R,
    "repl_period_ms": 50,
    "ring_handoff_ms": 1000,
    "ring_down_ms": 1000,
}
REG_TIMING = {
    "heartbeat_ms": 100,
    "probe_ms": 100,
    "probe_timeout_ms": 200,
    "suspect_timeout_ms": 1000,
    "indirect_probes": 2,
}

M64 = (1 << 64) - 1


def ring_hash(key):
    """The documented key hash: FNV-1a 64 over the key bytes, then the
    SplitMix64 finalizer, modulo 2^64."""
    h = 0xcbf29ce484222325
    for b in key:
        h = ((h ^ b) * 0x100000001b3) & M64
    h ^= h >> 30
    h = (h * 0xbf58476d1ce4e5b9) & M64
    h ^= h >> 27
    h = (h * 0x94d049bb133111eb) & M64
    h ^= h >> 31
    return h


def partition(key, nparts):
    if isinstance(key, str):
        key = key.encode()
    return ring_hash(key) % nparts


# ---------------------------------------------------------------- the ring


class RingView:
    """One node's `stats ring`, parsed."""

    def __init__(self, st):
        self.raw = st
        self.partitions = int(st["ring_partitions"])
        self.replicas = int(st["ring_replicas"])
        self.hash = st.get("ring_hash", "")
        self.fingerprint = st.get("ring_fingerprint", "")
        self.members = {}  # id -> (weight, client address, state)
        self.owners = [None] * self.partitions
        for k, v in st.items():
            if k.startswith("ring_member:"):
                w, addr, state = v.split()
                self.members[int(k.split(":", 1)[1])] = (int(w), addr, state)
            elif k.startswith("ring_partition:"):
                p = int(k.split(":", 1)[1])
                self.owners[p] = tuple(int(x) for x in v.split(",") if x)

    def counter(self, name):
        return int(self.raw[name])

    def owned_by(self, nid):
        return {p for p, o in enumerate(self.owners) if o and nid in o}


def ring_of(node):
    return RingView(node.stats("ring"))


def node_id(node):
    return int(node.settings["node_id"])


def settled_ring(nodes):
    """The ring every node of `nodes` agrees on, or None: the members are
    exactly these nodes (self or alive), the fingerprints and partition
    tables are equal, every partition has R distinct owners among them,
    and nothing is catching up."""
    ids = {node_id(n) for n in nodes}
    first = None
    for n in nodes:
        try:
            rv = ring_of(n)
        except (OSError, KeyError, ValueError):
            return None
        if set(rv.members) != ids or any(
                m[2] not in ("self", "alive") for m in rv.members.values()):
            return None
        if rv.counter("partitions_catching_up") != 0:
            return None
        if any(o is None or len(o) != R or len(set(o)) != R or
               not set(o) <= ids for o in rv.owners):
            return None
        if first is None:
            first = rv
        elif (rv.fingerprint != first.fingerprint or
              rv.owners != first.owners):
            return None
    return first


def expected_holdings(rv, keys):
    """{node id: keys of the partitions it owns} under ring view rv."""
    out = {nid: set() for nid in rv.members}
    for k in keys:
        for nid in rv.owners[partition(k, rv.partitions)]:
            out[nid].add(k)
    return out


# ------------------------------------------------------------ the clients


def client(node):
    return Client(("127.0.0.1", node.port), connect_timeout=5, timeout=5)


def get_all(c, keys):
    got = {}
    for start in range(0, len(keys), 100):
        got.update(c.get_many(keys[start:start + 100]))
    return got


RELAY_HELLO = b"proxy_hello 1\r\n"  # server/README.md, "Relaying"


def local_items(node, keys):
    """{key: value} of the keys of `keys` that node holds itself, read
    through a connection marked as a relay (always served here, never
    relayed)."""
    held = {}
    with node.connect() as s:
        s.sendall(RELAY_HELLO)
        ok = cluster.harness.recv_until(s, b"\r\n")
        if ok != b"OK\r\n":
            raise AssertionError("relay hello answered %r" % ok)
        for start in range(0, len(keys), 100):
            chunk = keys[start:start + 100]
            s.sendall(("get %s\r\n" % " ".join(chunk)).encode())
            reply = cluster.harness.recv_until(s, b"END\r\n")
            pos = 0
            while reply.startswith(b"VALUE ", pos):
                eol = reply.index(b"\r\n", pos)
                _, key, _, size = reply[pos:eol].split()[:4]
                start = eol + 2
                held[key.decode()] = reply[start:start + int(size)]
                pos = start + int(size) + 2
            if reply[pos:] != b"END\r\n":
                raise AssertionError("%s: bad get reply %r" % (
                    node.name, reply[pos:pos + 80]))
    return held


def meta_set(node, key, value):
    return node.request(b"ms %s %d\r\n%s\r\n" % (key.encode(), len(value),
                                                 value))


def meta_get(node, key):
    """The value of key read with `mg <key> v` through node, or None."""
    with node.connect() as s:
        s.sendall(b"mg %s v\r\n" % key.encode())
        head = cluster.harness.recv_until(s, b"\r\n")
        if not head.startswith(b"VA "):
            return None
        n = int(head.split()[1])
        rest = head[head.index(b"\r\n") + 2:]
        if len(rest) < n + 2:
            rest += cluster.harness.recv_exact(s, n + 2 - len(rest))
        return rest[:n]


# ------------------------------------------------------------ the clusters


class ScaleCluster(Cluster):
    """Cluster of n nodes with one shared peer list, of which only the
    first `running` are started at first (the others are named in every
    peer list and join with start_node)."""

    def __init__(self, n, running=None, extra=None):
        super().__init__(n, extra=dict(SCALE, **(extra or {})))
        self.running = n if running is None else running

    def start(self):
        last = None
        for _ in range(3):  # a picked port may be taken meanwhile
            ports = free_ports(2 * self.n)
            client_ports, peer_ports = ports[:self.n], ports[self.n:]
            self.client_ports, self.peer_ports = client_ports, peer_ports
            self.nodes = [Node(self.settings(i, client_ports, peer_ports),
                               "node%d" % (i + 1)) for i in range(self.n)]
            try:
                for node in self.nodes[:self.running]:
                    node.start()
                return self
            except RuntimeError as e:
                last = e
                Cluster.close(self)
        raise last

    def start_node(self, i):
        self.nodes[i].start()
        return self.nodes[i]

    def live(self):
        return [n for n in self.nodes if n.proc is not None and n.alive()]


class RegistryScaleCluster(ScaleCluster):
    """A registry (registry-only daemon) and n nodes without peer lists
    that find each other through it; the first `running` start at once."""

    def __init__(self, n, running=None):
        super().__init__(n, running, extra=dict(REG_TIMING, peers=None))
        self.reg = None

    def start(self):
        reg_client, reg_port = free_ports(2)
        self.reg = Node({
            "tcpport": reg_client,
            "inter": "127.0.0.1",
            "num_threads": 1,
            "repl_port": 0,
            "registry_port": reg_port,
            "registry_listen": "127.0.0.1",
            "cluster_secret": SECRET,
            **REG_TIMING,
        }, "registry").start()
        self.extra["registry"] = "127.0.0.1:%d" % reg_port
        try:
            return super().start()
        except BaseException:
            self.close()
            raise

    def close(self):
        try:
            super().close()
        finally:
            if self.reg is not None:
                self.reg.close()
                self.reg = None

    def logs(self):
        text = super().logs()
        if self.reg is not None:
            text += "\n--- registry\n" + self.reg.stderr()[-3000:]
        return text


# ----------------------------------------------------------------- checks


class ScaleOut(unittest.TestCase):
    def setUp(self):
        self.rng = random.Random(0x5ca1e)

    def make_data(self, prefix, n):
        return {"%s-%05d" % (prefix, i):
                ("v%d-%s-" % (i, prefix)).encode() * (1 + i % 5)
                for i in range(n)}

    def write_random(self, nodes, data, chunk=50):
        """Writes data in chunks of pipelined sets, each chunk through a
        node picked at random."""
        keys = sorted(data)
        clients = {n.name: client(n) for n in nodes}
        try:
            for start in range(0, len(keys), chunk):
                c = clients[self.rng.choice(nodes).name]
                part = {k: data[k] for k in keys[start:start + chunk]}
                self.assertEqual(c.set_many(part, noreply=False), [])
        finally:
            for c in clients.values():
                c.close()

    def wait_settled(self, cl, nodes):
        rv = wait_until(lambda: settled_ring(nodes), WAIT, interval=0.1)
        if not rv:
            views = {}
            for n in nodes:
                try:
                    r = ring_of(n)
                    views[n.name] = (r.members, r.fingerprint,
                                     r.counter("partitions_catching_up"))
                except Exception as e:  # noqa: BLE001 - shown in the message
                    views[n.name] = repr(e)
            self.fail("rings did not settle on %s: %s\n%s" % (
                sorted(node_id(n) for n in nodes), views, cl.logs()))
        self.assertEqual(rv.replicas, R)
        self.assertEqual(rv.hash.split()[0], "fnv1a64-splitmix64")
        return rv

    def assert_readable(self, cl, nodes, data, absent=()):
        """Every key of data has its value through every node (a bounded
        wait for writes in flight), and every key of absent misses."""
        keys = sorted(data)
        absent = sorted(absent)
        for n in nodes:
            c = client(n)
            last = {}

            def ok():
                last["got"] = get_all(c, keys)
                last["absent"] = get_all(c, absent)
                return last["got"] == data and not last["absent"]
            good = wait_until(ok, WAIT, interval=0.1)
            c.close()
            if not good:
                got = last["got"]
                wrong = [k for k in keys if got.get(k) != data[k]]
                self.fail("%s: %d of %d keys missing or wrong (e.g. %s), "
                          "%d deleted keys still there\n%s" % (
                              n.name, len(wrong), len(keys), wrong[:3],
                              len(last["absent"]), cl.logs()))

    def assert_holdings(self, cl, nodes, rv, data):
        """After convergence each node holds exactly the keys (with their
        values) of the partitions it owns in rv, so each key is on R
        nodes."""
        keys = list(data)
        want = expected_holdings(rv, keys)
        self.assertEqual(sum(len(v) for v in want.values()), R * len(keys))
        by_id = {node_id(n): n for n in nodes}
        self.assertEqual(set(want), set(by_id))
        last = {}

        def ok():
            last["items"] = {nid: by_id[nid].curr_items() for nid in by_id}
            return all(last["items"][nid] == len(want[nid]) for nid in want)
        if not wait_until(ok, WAIT, interval=0.1):
            self.fail("curr_items %s, keys of the owned partitions %s "
                      "(sum %d, want %d)\n%s" % (
                          last["items"],
                          {nid: len(v) for nid, v in want.items()},
                          sum(last["items"].values()), R * len(keys),
                          cl.logs()))
        self.assertEqual(sum(n.curr_items() for n in nodes), R * len(keys))
        ordered = sorted(keys)
        for nid, node in by_id.items():
            held = local_items(node, ordered)
            self.assertEqual(len(held), len(want[nid]), node.name)
            self.assertEqual(held, {k: data[k] for k in want[nid]},
                             node.name)

    def check_protocols(self, cl, nodes, rv):
        """Meta and binary requests go through a node that does not own
        the key as well as through one that does."""
        for i in range(20):
            key = "meta-%03d" % i
            owners = rv.owners[partition(key, rv.partitions)]
            writer = self.rng.choice(nodes)
            self.assertTrue(meta_set(writer, key, b"m%d" % i).startswith(
                b"HD"), (writer.name, key))
            for n in nodes:
                self.assertTrue(wait_until(
                    lambda: meta_get(n, key) == b"m%d" % i, WAIT),
                    "%s (owners %s) through %s\n%s" % (
                        key, owners, n.name, cl.logs()))
        keys = ["bin-%03d" % i for i in range(50)]
        writer = pylibmc.Client([nodes[0].address()], binary=True)
        self.assertEqual(writer.set_multi({k: b"b" + k.encode()
                                           for k in keys}), [])
        writer.disconnect_all()
        for n in nodes:
            mc = pylibmc.Client([n.address()], binary=True)
            self.assertTrue(wait_until(
                lambda: mc.get_multi(keys) == {k: b"b" + k.encode()
                                               for k in keys}, WAIT),
                n.name)
            mc.disconnect_all()
        written = {"meta-%03d" % i: b"m%d" % i for i in range(20)}
        written.update({k: b"b" + k.encode() for k in keys})
        return written

    def check_relay_counter(self, nodes, rv, data):
        """Through node 1: single gets of 10 keys it owns are served there,
        of 10 keys it does not own are relayed, one proxied request each
        and no failure."""
        node = nodes[0]
        nid = node_id(node)
        keys = sorted(data)
        owned = [k for k in keys
                 if nid in rv.owners[partition(k, rv.partitions)]][:10]
        other = [k for k in keys
                 if nid not in rv.owners[partition(k, rv.partitions)]][:10]
        self.assertEqual((len(owned), len(other)), (10, 10))
        c = client(node)
        st0 = node.stats()
        for k in owned:
            self.assertEqual(c.get(k), data[k], k)
        st1 = node.stats()
        for k in other:
            self.assertEqual(c.get(k), data[k], k)
        st2 = node.stats()
        c.close()
        for name, want in (("proxied_requests", (0, 10)),
                           ("proxy_failures", (0, 0))):
            got = (int(st1[name]) - int(st0[name]),
                   int(st2[name]) - int(st1[name]))
            self.assertEqual(got, want, name)

    def deletes_and_flush(self, cl, nodes, data):
        """Deletes through random nodes, then a flush through one node."""
        keys = sorted(data)
        gone = self.rng.sample(keys, 200)
        clients = [client(n) for n in nodes]
        for k in gone:
            self.assertTrue(self.rng.choice(clients).delete(
                k, noreply=False), k)
        rest = {k: v for k, v in data.items() if k not in set(gone)}
        rv = self.wait_settled(cl, nodes)
        self.assert_holdings(cl, nodes, rv, rest)
        self.assert_readable(cl, nodes, rest, absent=gone)

        # Keep the writes before the flush strictly older than it.
        time.sleep(0.01)
        self.assertTrue(clients[-1].flush_all(noreply=False))
        self.assert_readable(cl, nodes, {}, absent=keys)
        time.sleep(0.01)
        self.assertTrue(clients[0].set("after-flush", b"new", noreply=False))
        self.assert_readable(cl, nodes, {"after-flush": b"new"},
                             absent=keys)
        for c in clients:
            c.close()

    def steady_state(self, cl, data):
        """The checks of a cluster that does not change: reads through
        every node, exact holdings, other protocols, deletes, flush."""
        nodes = cl.live()
        rv = self.wait_settled(cl, nodes)
        self.write_random(nodes, data)
        self.assert_holdings(cl, nodes, rv, data)
        self.assert_readable(cl, nodes, data)
        self.check_relay_counter(nodes, rv, data)
        data = dict(data, **self.check_protocols(cl, nodes, rv))
        self.assert_holdings(cl, nodes, rv, data)
        self.deletes_and_flush(cl, nodes, data)

    # -- scenarios -----------------------------------------------------

    def test_1_three_nodes(self):
        with ScaleCluster(3) as cl:
            self.steady_state(cl, self.make_data("three", NKEYS))

    def test_2_four_nodes(self):
        with ScaleCluster(4, extra={"ring_partitions": 256}) as cl:
            self.steady_state(cl, self.make_data("four", NKEYS))

    def test_3_kill_one_of_four(self):
        with ScaleCluster(4, extra={"ring_partitions": 256}) as cl:
            nodes = cl.live()
            rv = self.wait_settled(cl, nodes)
            data = self.make_data("kill", NKEYS)
            self.write_random(nodes, data)
            self.assert_holdings(cl, nodes, rv, data)
            self.kill_and_check(cl, cl[1], data, rv)

    def kill_and_check(self, cl, victim, data, rv):
        vid = node_id(victim)
        victim.sigkill()
        live = cl.live()
        after = self.wait_settled(cl, live)
        # Only the dead node's partitions changed owners: each kept its
        # surviving owner and gained one of the others.
        for p, (b, a) in enumerate(zip(rv.owners, after.owners)):
            if vid in b:
                self.assertEqual(len(set(b) & set(a)), R - 1, p)
            else:
                self.assertEqual(set(a), set(b), p)
        more = self.make_data("after-kill", 300)
        self.write_random(live, more)
        everything = dict(data, **more)
        self.assert_holdings(cl, live, after, everything)
        self.assert_readable(cl, live, everything)

    def test_4_add_fourth_node(self):
        with ScaleCluster(4, running=3,
                          extra={"ring_partitions": 256}) as cl:
            nodes = cl.live()
            before = self.wait_settled(cl, nodes)
            data = self.make_data("add", NKEYS)
            self.write_random(nodes, data)
            self.assert_holdings(cl, nodes, before, data)
            self.add_and_check(cl, 3, data, before)

    def add_and_check(self, cl, index, data, before):
        old = cl.live()
        dropped0 = {n.name: ring_of(n).counter("items_dropped") for n in old}
        want0 = expected_holdings(before, list(data))
        new = cl.start_node(index)
        nid = node_id(new)
        live = cl.live()
        after = self.wait_settled(cl, live)
        # The new node owns the partitions where it ranks in the top R;
        # in each, one old owner gave way; nothing else moved.
        gained = after.owned_by(nid)
        self.assertGreater(len(gained), 0)
        for p, (b, a) in enumerate(zip(before.owners, after.owners)):
            if p in gained:
                self.assertEqual(len(set(b) & set(a)), R - 1, p)
            else:
                self.assertEqual(set(a), set(b), p)
        want = expected_holdings(after, list(data))
        moved = sum(1 for k in data
                    if partition(k, after.partitions) in gained)
        self.assertEqual(len(want[nid]), moved)
        print("\n%d of %d partitions and %d of %d keys gained a new owner" %
              (len(gained), after.partitions, moved, len(data)))
        # Old owners drop what they lost (after the hand-off grace); the
        # new node holds exactly its partitions' keys.
        self.assert_holdings(cl, live, after, data)
        # What each old node dropped is exactly what it lost, and it no
        # longer holds a partition it does not own.
        for n in old:
            lost = len(want0[node_id(n)]) - len(want[node_id(n)])
            self.assertTrue(wait_until(
                lambda: ring_of(n).counter("partitions_held") == 0, WAIT),
                n.name)
            self.assertEqual(ring_of(n).counter("items_dropped") -
                             dropped0[n.name], lost, n.name)
        self.assert_readable(cl, live, data)
        for n in live:
            rv = ring_of(n)
            self.assertEqual(rv.counter("partitions_owned"),
                             len(after.owned_by(node_id(n))), n.name)

    def check_first_ready(self, cl, new, live, data):
        """The moment the new node first reports no partition catching up
        under a ring of all live nodes, it holds every key of its
        partitions: a ready partition is served locally."""
        ids = {node_id(n) for n in live}
        last = {}

        def ready():
            rv = ring_of(new)
            last["rv"] = rv
            return rv if (set(rv.members) == ids and
                          rv.counter("partitions_catching_up") == 0) else None
        rv = wait_until(ready, WAIT, interval=0.02)
        self.assertTrue(rv, "%s never ready: %s\n%s" % (
            new.name, last["rv"].raw, cl.logs()))
        mine = sorted(expected_holdings(rv, list(data))[node_id(new)])
        c = client(new)
        got = get_all(c, mine)
        c.close()
        missing = [k for k in mine if got.get(k) != data[k]]
        self.assertEqual(len(missing), 0, "%s reported no partition "
                         "catching up but lacks %d of the %d keys of its "
                         "partitions (e.g. %s)" % (new.name, len(missing),
                                                   len(mine), missing[:3]))

    def test_6_joining_node_ready_only_with_its_data(self):
        with ScaleCluster(4, running=3,
                          extra={"ring_partitions": 256}) as cl:
            nodes = cl.live()
            before = self.wait_settled(cl, nodes)
            data = self.make_data("ready", 5 * NKEYS)
            self.write_random(nodes, data)
            self.assert_holdings(cl, nodes, before, data)
            new = cl.start_node(3)
            self.check_first_ready(cl, new, cl.live(), data)

    def test_7_reads_through_a_joining_node(self):
        # A long hand-off: only rounds end the new node's catching up.
        with ScaleCluster(4, running=3, extra={
                "ring_partitions": 256, "ring_handoff_ms": 30000}) as cl:
            nodes = cl.live()
            before = self.wait_settled(cl, nodes)
            data = self.make_data("join", 5 * NKEYS)
            self.write_random(nodes, data)
            self.assert_holdings(cl, nodes, before, data)
            new = cl.start_node(3)
            self.check_join_reads(cl, new, cl.live(), data, [new])

    def test_8_reads_through_old_nodes_while_one_joins(self):
        # An old node must not relay a read to the joining node while
        # that one is catching up: a relayed request is served where it
        # lands, never relayed again.
        with ScaleCluster(4, running=3, extra={
                "ring_partitions": 256, "ring_handoff_ms": 30000}) as cl:
            nodes = cl.live()
            before = self.wait_settled(cl, nodes)
            data = self.make_data("old", 5 * NKEYS)
            self.write_random(nodes, data)
            self.assert_holdings(cl, nodes, before, data)
            new = cl.start_node(3)
            self.check_join_reads(cl, new, cl.live(), data, cl.live())

    def test_9_reads_right_after_a_kill(self):
        # Multi-key gets are relayed in runs: when the first owner is down,
        # every key of a run must fall back to an owner of its own (the
        # keys of a run whose second owners differ must not read as
        # misses).
        with ScaleCluster(4, extra={"ring_partitions": 256,
                                    "ring_down_ms": 5000}) as cl:
            nodes = cl.live()
            rv = self.wait_settled(cl, nodes)
            data = self.make_data("dead", NKEYS)
            self.write_random(nodes, data)
            self.assert_holdings(cl, nodes, rv, data)
            keys = sorted(data)
            clients = {n.name: client(n) for n in nodes}
            for n in nodes:  # every worker has its upstreams open
                self.assertEqual(get_all(clients[n.name], keys), data)
            victim = cl[1]
            victim.sigkill()
            live = cl.live()
            # Let the relaying nodes see the upstreams to it close; the
            # ring keeps it for ring_down_ms, so the reads below are
            # served by falling back to the next owner.
            time.sleep(0.3)
            for n in live:
                got = get_all(clients[n.name], keys)
                missing = [k for k in keys if got.get(k) != data[k]]
                self.assertEqual(
                    len(missing), 0, "through %s right after %s died: %d "
                    "of %d keys missing (e.g. %s, owners %s)" % (
                        n.name, victim.name, len(missing), len(keys),
                        missing[:3], [rv.owners[partition(
                            k, rv.partitions)] for k in missing[:3]]))
            self.assertEqual(len(ring_of(live[0]).members), len(nodes),
                             "the ring dropped the dead node already")
            for c in clients.values():
                c.close()

    def check_join_reads(self, cl, new, live, data, through):
        """From the moment the new node knows every live node until it has
        caught up, every key read through each node of `through` has its
        value (keys of the partitions the new node is catching up are
        served by their other owners)."""
        ids = {node_id(n) for n in live}
        self.assertTrue(wait_until(lambda: set(ring_of(new).members) == ids,
                                   WAIT, interval=0.01), cl.logs())
        keys = sorted(data)
        clients = [(n, client(n)) for n in through]
        deadline = time.monotonic() + WAIT
        reads = 0
        ready = None
        for _ in range(int(WAIT / 0.01) + 1):
            rv = ring_of(new)
            if (set(rv.members) == ids and
                    rv.counter("partitions_catching_up") == 0):
                ready = rv
            for n, c in clients:
                got = get_all(c, keys)
                reads += 1
                missing = [k for k in keys if got.get(k) != data[k]]
                self.assertEqual(len(missing), 0, "read %d through %s while "
                                 "%s joins: %d of %d keys missing or wrong "
                                 "(e.g. %s)" % (reads, n.name, new.name,
                                                len(missing), len(keys),
                                                missing[:3]))
            if ready or time.monotonic() > deadline:
                break
        for _, c in clients:
            c.close()
        self.assertTrue(ready, "%s did not catch up\n%s" % (new.name,
                                                             cl.logs()))
        mine = sorted(expected_holdings(ready, keys)[node_id(new)])
        self.assertEqual(local_items(new, mine), {k: data[k] for k in mine})
        print("\n%d full reads through %s while %s caught up" % (
            reads, ", ".join(n.name for n in through), new.name))

    def test_5_registry_join_and_death(self):
        with RegistryScaleCluster(4, running=3) as cl:
            nodes = cl.live()
            before = self.wait_settled(cl, nodes)
            data = self.make_data("reg", NKEYS // 2)
            self.write_random(nodes, data)
            self.assert_holdings(cl, nodes, before, data)
            self.add_and_check(cl, 3, data, before)
            rv = self.wait_settled(cl, cl.live())
            self.kill_and_check(cl, cl[0], data, rv)

    def test_10_writes_meet_at_the_preferred_owner(self):
        # Every write goes to a key's preferred owner, wherever it is sent:
        # a write through one node is seen at once by a write through any
        # other, and cas through different nodes is atomic (one cas unique
        # wins once). Reads at the second owner are local (zero hops) and
        # only as fresh as eager push, so the read below goes through a
        # node that is not the second owner.
        with ScaleCluster(4, extra={"ring_partitions": 256}) as cl:
            nodes = cl.live()
            rv = self.wait_settled(cl, nodes)
            # For ring_handoff_ms after a ring change, relayed reads try
            # the partition's previous owners first (a new owner may be
            # catching up); past it they go where the writes go.
            time.sleep(SCALE["ring_handoff_ms"] / 1000.0 + 0.2)
            rng = random.Random(10)
            clients = [client(n) for n in nodes]
            changes = [ring_of(n).counter("ring_changes") for n in nodes]
            try:
                for i in range(60):
                    key = "meet-%03d" % i
                    second = rv.owners[partition(key, rv.partitions)][1]
                    a, b, c = rng.sample(range(len(nodes)), 3)
                    if node_id(nodes[c]) == second:
                        c = next(j for j in range(len(nodes))
                                 if j not in (a, b))
                    self.assertTrue(clients[a].set(key, b"5", noreply=False))
                    self.assertEqual(clients[b].incr(key, 2, noreply=False),
                                     7, key)
                    # A read is as fresh as the owner it lands on: the
                    # preferred one normally, an older one right after a
                    # ring change; the value arrives everywhere.
                    got = wait_until(
                        lambda: (lambda v: v if v[0] == b"7" else None)(
                            clients[c].gets(key)), WAIT, interval=0.01)
                    self.assertTrue(got, key)
                    value, cas = got
                    self.assertTrue(clients[a].cas(key, b"8", cas,
                                                   noreply=False), key)
                    self.assertFalse(clients[b].cas(key, b"9", cas,
                                                    noreply=False), key)
                after = [ring_of(n).counter("ring_changes") for n in nodes]
                print("\nring changes during the writes: %s" % [
                    y - x for x, y in zip(changes, after)])
            finally:
                for c in clients:
                    c.close()


if __name__ == "__main__":
    cluster.main()
