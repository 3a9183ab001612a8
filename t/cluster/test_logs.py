"""What the log tells an operator about replication. Every line carries a
UTC timestamp, the process, a level and a subsystem. At -v a node's
start-up line names its version, node id, port, memory, threads and peers.
A node with the wrong cluster secret is refused, and both sides say so; a
peer that dies is logged down with the reason once (not once per
reconnect attempt), and up again when it returns."""

import os
import re
import shutil
import signal
import tempfile
import time
import unittest

import cluster
import harness
from cluster import Cluster, wait_until

LINE = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z ribltcached\[\d+\] "
                  r"(error|warn|info|debug) [a-z]+: ")


def read(path):
    with open(path) as f:
        return f.read()


def lines(node, text):
    return [ln for ln in node.stderr().splitlines() if text in ln]


class Logs(unittest.TestCase):
    def test_refusal_down_and_up(self):
        with Cluster(3, extra={"verbosity": 1}) as cl:
            self.assertTrue(cl.wait_connected(), cl.logs())
            log1 = cl[0].stderr()
            start = [ln for ln in log1.splitlines() if "listening on" in ln]
            self.assertEqual(len(start), 1, log1)
            self.assertRegex(start[0], LINE)
            self.assertIn("node 1,", start[0])
            self.assertIn("port %d" % cl[0].port, start[0])
            self.assertIn("127.0.0.1:%d" % cl[1].repl_port, start[0])
            self.assertTrue(lines(cl[0], "up"), log1)

            self.assertTrue(wait_until(
                lambda: all(n.stats("health")["health"] == "converged"
                            for n in cl.nodes), 20),
                [n.stats("health") for n in cl.nodes])
            # Node 3 dies: its peers log it down once, with the reason,
            # however many times they redial it meanwhile.
            earlier = len(lines(cl[0], "(node 3) down:"))
            cl[2].sigkill()
            self.assertTrue(wait_until(
                lambda: len(lines(cl[0], "(node 3) down:")) > earlier, 10),
                cl.logs())
            time.sleep(1.0)  # about 50 redials at the fast retry
            down = lines(cl[0], "(node 3) down:")[earlier:]
            self.assertEqual(len(down), 1, cl.logs())
            self.assertRegex(down[0], LINE)
            cl[2].start()
            self.assertTrue(wait_until(
                lambda: lines(cl[0], "(node 3) up after"), 20), cl.logs())

    def test_isolated(self):
        # A node whose peers are all gone reports itself isolated and
        # says so in the log once it has lasted a few seconds; a node
        # without replication reports itself standalone.
        with Cluster(2, extra={"verbosity": 1}) as cl:
            self.assertTrue(cl.wait_connected(), cl.logs())
            # The verdict is the replication tick's: wait for one that
            # saw the link up.
            self.assertTrue(wait_until(
                lambda: cl[0].stats("health")["health"] == "converged", 10),
                cl[0].stats("health"))
            cl[1].sigkill()
            self.assertTrue(wait_until(
                lambda: cl[0].stats("health")["health"] == "isolated", 10),
                cl[0].stats("health"))
            st = cl[0].stats("health")
            self.assertEqual((st["health_peers_up"], st["health_peers"]),
                             ("0", "1"))
            self.assertTrue(wait_until(
                lambda: lines(cl[0], "error health: isolated for"), 15),
                cl.logs())
            cl[1].start()
            self.assertTrue(wait_until(
                lambda: lines(cl[0], "no longer isolated"), 20), cl.logs())
        alone = harness.Server().start()
        try:
            self.assertEqual(alone.stats("health")["health"], "standalone")
        finally:
            alone.close()

    def test_wrong_secret_refused_both_sides(self):
        def extra_for(i):
            return {"cluster_secret": "not-the-cluster-secret"} if i == 1 \
                else {}
        cl = Cluster(2, extra={"verbosity": 1})
        settings = cl.settings

        def patched(i, client_ports, peer_ports):
            s = settings(i, client_ports, peer_ports)
            s.update(extra_for(i))
            return s
        cl.settings = patched
        with cl:
            ok = wait_until(
                lambda: lines(cl[0], "refused an incoming peer connection")
                and lines(cl[1], "handshake proof refused")
                and lines(cl[0], "handshake proof refused")
                and lines(cl[1], "refused an incoming peer connection"),
                15)
            self.assertTrue(ok, cl.logs())
            for node in cl.nodes:
                for ln in node.stderr().splitlines():
                    if "repl:" in ln:
                        self.assertRegex(ln, LINE)

    def test_duplicate_node_id_refused(self):
        # Node 3 is misconfigured with node 1's id. Before, each took the
        # other for its own address and the two never reconciled; now
        # both refuse the link, say why, and count it.
        cl = Cluster(3, extra={"verbosity": 1})
        settings = cl.settings

        def patched(i, client_ports, peer_ports):
            s = settings(i, client_ports, peer_ports)
            if i == 2:
                s["node_id"] = 1
            return s
        cl.settings = patched
        with cl:
            text = "the other node has our node_id 1"
            ok = wait_until(
                lambda: lines(cl[0], text) and lines(cl[2], text), 15)
            self.assertTrue(ok, cl.logs())
            def selfs(node):
                return [k for k, v in node.repl_stats().items()
                        if k.endswith(":state") and v == "self"]
            for node in (cl[0], cl[2]):
                st = node.repl_stats()
                self.assertGreater(int(st["duplicate_node_id"]), 0, st)
                # Each finds its own address, and only that one: neither
                # takes the other's for its own.
                self.assertTrue(wait_until(lambda: selfs(node), 10),
                                node.repl_stats())
            time.sleep(0.5)  # a few more dials of each other
            for node in (cl[0], cl[2]):
                self.assertEqual(len(selfs(node)), 1, node.repl_stats())

    def test_log_file_reopened_on_sighup(self):
        # log_file takes the log; after a rotation (rename) SIGHUP makes
        # the daemon write to a new file at the path, and it keeps serving.
        tmp = tempfile.mkdtemp(prefix="ribltcache-log-")
        path = os.path.join(tmp, "ribltcached.log")
        node = harness.Server(["-v", "-o", "log_file=" + path]).start()
        try:
            self.assertTrue(wait_until(
                lambda: os.path.exists(path) and
                "listening on" in read(path), 10))
            os.rename(path, path + ".1")
            os.kill(node.pid, signal.SIGHUP)
            self.assertTrue(wait_until(
                lambda: os.path.exists(path) and
                "log_file %s reopened" % path in read(path), 10))
            self.assertIn("listening on", read(path + ".1"))
            self.assertNotIn("listening on", read(path))
            for ln in read(path).splitlines():
                self.assertRegex(ln, LINE)
            self.assertEqual(node.request(b"version\r\n")[:8], b"VERSION ")
        finally:
            node.close()
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    cluster.main()
