"""contrib/cluster moved by a base port into a work directory of its own:
three nodes start on BASE..BASE+2 (peers on BASE+100..BASE+102) without
editing the repository's conf files, replicate, report, and stop."""

import os
import random
import shutil
import socket
import subprocess
import tempfile
import unittest

import cluster
import harness
from cluster import wait_until

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
SCRIPT = os.path.join(ROOT, "contrib", "cluster")


def free_base(tries=50):
    """A base port whose six ports are all free right now."""
    rng = random.Random()
    for _ in range(tries):
        base = rng.randrange(30000, 60000)
        socks = []
        try:
            for p in (base, base + 1, base + 2, base + 100, base + 101,
                      base + 102):
                s = socket.socket()
                s.bind(("127.0.0.1", p))
                socks.append(s)
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError("no free base port")


class ContribCluster(unittest.TestCase):
    def test_base_port_and_work_dir(self):
        build = os.path.dirname(os.path.dirname(harness.SERVER))
        work = tempfile.mkdtemp(prefix="ribltcache-cluster-")
        base = free_base()

        def run(*args):
            return subprocess.run(["sh", SCRIPT] + list(args),
                                  capture_output=True, text=True, timeout=60)
        try:
            r = run("-p", str(base), "-w", work, "start", build)
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            self.assertIn("port %d, peer port %d" % (base + 2, base + 102),
                          r.stdout)
            c = socket.create_connection(("127.0.0.1", base), timeout=5)
            c.sendall(b"set moved 0 0 2\r\nok\r\n")
            self.assertEqual(c.recv(100), b"STORED\r\n")
            c.close()

            def on_node3():
                s = socket.create_connection(("127.0.0.1", base + 2),
                                             timeout=5)
                s.sendall(b"mg moved v\r\n")
                got = s.recv(100)
                s.close()
                return got.startswith(b"VA 2")
            self.assertTrue(wait_until(on_node3, 20))
            # stop and status find the nodes through the work directory.
            r = run("-w", work, "status", build)
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            self.assertIn("port %d" % (base + 1), r.stdout)
        finally:
            r = run("-w", work, "stop", build)
            shutil.rmtree(work, ignore_errors=True)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertEqual(r.stdout.count("stopped"), 3, r.stdout)


if __name__ == "__main__":
    cluster.main()
