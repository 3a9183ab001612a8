"""Start-up rules of a cluster node: replication without a cluster secret
is refused unless repl_insecure says so."""

import os
import subprocess
import tempfile
import unittest

from pymemcache.client.base import Client

import cluster
import harness
from cluster import Cluster, free_ports, wait_until


def node_settings(client_port, peer_port, peers):
    return {
        "tcpport": client_port,
        "inter": "127.0.0.1",
        "num_threads": 1,
        "node_id": 1,
        "repl_port": peer_port,
        "repl_listen": "127.0.0.1",
        "peers": peers,
    }


class Startup(unittest.TestCase):
    def test_no_secret_refused(self):
        cp, pp, other = free_ports(3)
        with tempfile.TemporaryDirectory() as d:
            conf = os.path.join(d, "n.conf")
            with open(conf, "w") as f:
                for k, v in node_settings(
                        cp, pp, "127.0.0.1:%d" % other).items():
                    f.write("%s = %s\n" % (k, v))
            p = subprocess.run([harness.SERVER, "--config", conf],
                               stdin=subprocess.DEVNULL,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               timeout=15)
        err = p.stderr.decode(errors="replace")
        self.assertNotEqual(p.returncode, 0, err)
        self.assertIn("cluster_secret", err)
        self.assertIn("repl_insecure", err)

    def test_empty_secret_refused(self):
        cp, pp = free_ports(2)
        p = subprocess.run([harness.SERVER, "-l", "127.0.0.1", "-p", str(cp),
                            "--repl-port", str(pp), "--node-id", "2",
                            "--cluster-secret", ""],
                           stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, timeout=15)
        err = p.stderr.decode(errors="replace")
        self.assertNotEqual(p.returncode, 0, err)
        self.assertIn("cluster_secret", err)

    def test_insecure_starts_and_replicates(self):
        # An empty value leaves the setting out of the config file.
        cl = Cluster(2, extra={"cluster_secret": "", "repl_insecure": "yes"})
        with cl:
            self.assertTrue(cl.wait_connected(), cl.logs())
            a = Client(("127.0.0.1", cl[0].port), timeout=5)
            b = Client(("127.0.0.1", cl[1].port), timeout=5)
            self.assertTrue(a.set("insecure", b"yes", noreply=False))
            self.assertTrue(wait_until(lambda: b.get("insecure") == b"yes",
                                       20.0), cl.logs())
            a.close()
            b.close()

    def test_secret_mismatch_never_replicates(self):
        # Same cluster, different secrets: the peers refuse each other.
        # Each lists only the other, so every auth failure is theirs.
        cl = Cluster(2, peers_for=lambda i, pp: "127.0.0.1:%d" % pp[1 - i])
        orig = cl.settings

        def settings(i, cp, pp):
            s = orig(i, cp, pp)
            s["cluster_secret"] = "secret-of-node-%d" % i
            return s
        cl.settings = settings
        with cl:
            a = Client(("127.0.0.1", cl[0].port), timeout=5)
            b = Client(("127.0.0.1", cl[1].port), timeout=5)
            self.assertTrue(a.set("mismatch", b"x", noreply=False))
            failures = wait_until(
                lambda: int(cl[1].repl_stats()["auth_failures"]) > 0 and
                int(cl[0].repl_stats()["auth_failures"]) > 0, 20.0)
            self.assertTrue(failures, cl.logs())
            self.assertIsNone(b.get("mismatch"))
            self.assertEqual(int(cl[1].repl_stats()["applied"]), 0)
            a.close()
            b.close()


if __name__ == "__main__":
    cluster.main()
