"""Smoke tests with real memcached clients: pymemcache (text protocol),
pylibmc (binary protocol through libmemcached), and libmemcached's
command-line tools (memccp / memccat)."""

import os
import shutil
import subprocess
import unittest

import harness
from harness import Server

try:
    import pymemcache.client.base as pmc
except ImportError:  # pragma: no cover - reported as a skip
    pmc = None
try:
    import pylibmc
except ImportError:  # pragma: no cover
    pylibmc = None


@unittest.skipIf(pmc is None, "pymemcache not installed")
class TextClient(unittest.TestCase):
    def test_pymemcache(self):
        with Server() as srv:
            c = pmc.Client(("127.0.0.1", srv.port), connect_timeout=5,
                           timeout=5)
            self.assertTrue(c.set("alpha", b"one", noreply=False))
            self.assertEqual(c.get("alpha"), b"one")
            self.assertTrue(c.add("beta", b"2", noreply=False))
            self.assertFalse(c.add("beta", b"3", noreply=False))
            self.assertEqual(c.get_many(["alpha", "beta", "gamma"]),
                             {"alpha": b"one", "beta": b"2"})
            self.assertEqual(c.incr("beta", 40), 42)
            self.assertEqual(c.decr("beta", 2), 40)
            value, cas = c.gets("alpha")
            self.assertEqual(value, b"one")
            self.assertTrue(c.cas("alpha", b"uno", cas, noreply=False))
            self.assertFalse(c.cas("alpha", b"eins", cas, noreply=False))
            self.assertEqual(c.get("alpha"), b"uno")
            self.assertTrue(c.append("alpha", b"!", noreply=False))
            self.assertEqual(c.get("alpha"), b"uno!")
            self.assertTrue(c.touch("alpha", 100, noreply=False))
            self.assertTrue(c.delete("alpha", noreply=False))
            self.assertIsNone(c.get("alpha"))
            big = os.urandom(500 * 1024)
            self.assertTrue(c.set("big", big, noreply=False))
            self.assertEqual(c.get("big"), big)
            stats = c.stats()
            self.assertIn(b"curr_items", stats)
            self.assertTrue(c.flush_all(noreply=False))
            self.assertIsNone(c.get("big"))
            self.assertTrue(c.version().startswith(b"0.") or
                            c.version()[:1].isdigit())
            c.close()


@unittest.skipIf(pylibmc is None, "pylibmc not installed")
class BinaryClient(unittest.TestCase):
    def check(self, srv):
        mc = pylibmc.Client([srv.address()], binary=True)
        mc.behaviors = {"connect_timeout": 5000, "receive_timeout": 5000000,
                        "send_timeout": 5000000}
        self.assertTrue(mc.set("k1", "v1"))
        self.assertEqual(mc.get("k1"), "v1")
        mc.set_multi({"a": 1, "b": "two", "c": b"\x00\x01"})
        self.assertEqual(mc.get_multi(["a", "b", "c", "zz"]),
                         {"a": 1, "b": "two", "c": b"\x00\x01"})
        self.assertTrue(mc.add("n", 10))
        self.assertFalse(mc.add("n", 11))
        self.assertEqual(mc.incr("n", 5), 15)
        self.assertEqual(mc.decr("n", 20), 0)
        self.assertTrue(mc.replace("k1", "v2"))
        self.assertEqual(mc.get("k1"), "v2")
        self.assertTrue(mc.delete("k1"))
        self.assertIsNone(mc.get("k1"))
        self.assertFalse(mc.delete("k1"))
        self.assertTrue(mc.touch("a", 100))
        mc.disconnect_all()

    def test_pylibmc_binary_tcp(self):
        with Server() as srv:
            self.check(srv)
            self.assertEqual(srv.stats()["curr_items"], "4")

    def test_pylibmc_binary_only_server(self):
        with Server(["-B", "binary"], ready="connect") as srv:
            self.check(srv)

    def test_pylibmc_binary_unix_socket(self):
        with Server(unix=True) as srv:
            self.check(srv)


@unittest.skipIf(pylibmc is None or not pylibmc.support_sasl,
                 "pylibmc without SASL")
class Sasl(unittest.TestCase):
    def test_sasl_plain(self):
        srv = Server(["-S"], ready="connect")
        creds = os.path.join(srv.tmpdir, "sasl")
        with open(creds, "w") as f:
            f.write("# test credentials\nalice:s3cr:et\n")
        srv.args += ["--sasl-file", creds]
        with srv:
            good = pylibmc.Client([srv.address()], binary=True,
                                  username="alice", password="s3cr:et")
            self.assertTrue(good.set("s", "ok"))
            self.assertEqual(good.get("s"), "ok")
            bad = pylibmc.Client([srv.address()], binary=True,
                                 username="alice", password="wrong")
            with self.assertRaises(pylibmc.Error):
                bad.set("s", "no")
            self.assertEqual(good.get("s"), "ok")


@unittest.skipIf(shutil.which("memccp") is None or
                 shutil.which("memccat") is None,
                 "libmemcached-tools not installed")
class CommandLineTools(unittest.TestCase):
    def test_memccp_memccat(self):
        with Server() as srv:
            path = os.path.join(srv.tmpdir, "payload.bin")
            data = os.urandom(200 * 1024)
            with open(path, "wb") as f:
                f.write(data)
            servers = "--servers=" + srv.address()
            for binary in ([], ["--binary"]):
                subprocess.run(["memccp", servers] + binary + [path],
                               check=True, timeout=30,
                               stdout=subprocess.DEVNULL)
                out = subprocess.run(["memccat", servers] + binary +
                                     ["payload.bin"], check=True,
                                     timeout=30, stdout=subprocess.PIPE)
                # memccat ends what it prints with a newline.
                self.assertEqual(out.stdout, data + b"\n")

    @unittest.skipIf(shutil.which("memcstat") is None, "memcstat missing")
    def test_memcstat_accepts_our_version(self):
        # Regression: libmemcached refuses a major version of 0, so a bare
        # "VERSION 0.1.0" made memcstat fail before listing anything.
        with Server() as srv:
            for binary in ([], ["--binary"]):
                out = subprocess.run(
                    ["memcstat", "--servers=" + srv.address()] + binary,
                    check=True, timeout=30, stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT).stdout.decode()
                self.assertIn("curr_items:", out.replace(" ", ""))
                self.assertIn("-ribltcache-", out)

    @unittest.skipIf(shutil.which("memccapable") is None, "memccapable missing")
    def test_memccapable_passes_every_check(self):
        # libmemcached's protocol conformance checks, text and binary
        with Server() as srv:
            host, port = srv.address().rsplit(":", 1)
            out = subprocess.run(["memccapable", "-h", host, "-p", port,
                                  "-t", "10"], timeout=120,
                                 stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT)
            text = out.stdout.decode(errors="replace")
            self.assertEqual(out.returncode, 0, text)
            self.assertIn("All tests passed", text)
            self.assertNotIn("[FAIL]", text)
            self.assertGreaterEqual(text.count("[pass]"), 50, text)


if __name__ == "__main__":
    harness.main()
