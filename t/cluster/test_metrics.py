"""Prometheus metrics. Node 1 of a two-node cluster serves /metrics on a
port of its own (metrics_port). The test checks the exposition against the
stats it mirrors (memcached_exporter's names for the memcached part,
ribltcache_* for replication and health), has Debian's promtool lint it,
then starts a real Prometheus (Debian's package) on loopback with its own
data directory, lets it scrape the node, and reads a series back through
Prometheus's query API."""

import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import unittest
import urllib.parse
import urllib.request

import cluster
from cluster import Cluster, free_ports, pipelined_sets, wait_until

KEYS = 25
PROMETHEUS = "/usr/bin/prometheus"
PROMTOOL = "/usr/bin/promtool"


def fetch(url, timeout=5):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.status, r.headers.get("Content-Type", ""), r.read().decode()


def samples(text):
    """{series: value} of an exposition (comments left out)."""
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            series, value = line.rsplit(" ", 1)
            out[series] = value
    return out


class Metrics(unittest.TestCase):
    def test_scrape(self):
        self.assertTrue(os.access(PROMETHEUS, os.X_OK),
                        "Debian's prometheus package is needed "
                        "(contrib/install-deps installs it)")
        mport, pport = free_ports(2)
        cl = Cluster(2)
        cl.set_on_node(0, "metrics_port", mport)
        with cl:
            self.assertTrue(cl.wait_connected(), cl.logs())
            pipelined_sets(cl[0].port, [b"m:%03d" % i for i in range(KEYS)],
                           b"value")
            self.assertTrue(wait_until(
                lambda: cl[1].curr_items() == KEYS, 20), cl.logs())
            self.assertTrue(wait_until(
                lambda: cl[0].stats("health")["health"] == "converged", 20))
            url = "http://127.0.0.1:%d/metrics" % mport
            status, ctype, text = fetch(url)
            self.assertEqual(status, 200)
            self.assertTrue(ctype.startswith("text/plain; version=0.0.4"))
            m = samples(text)
            self.assertEqual(m["memcached_up"], "1")
            self.assertEqual(m["memcached_current_items"], str(KEYS))
            self.assertEqual(
                m['memcached_commands_total{command="set",status="hit"}'],
                str(KEYS))
            self.assertEqual(m["memcached_limit_bytes"], str(64 << 20))
            peer = '{peer="127.0.0.1:%d",node="2"}' % cl[1].repl_port
            self.assertEqual(m["ribltcache_peer_up" + peer], "1")
            self.assertIn("ribltcache_peer_last_round_differences" + peer, m)
            self.assertGreater(int(m[
                "ribltcache_peer_last_success_timestamp_seconds" + peer]), 0)
            self.assertEqual(m['ribltcache_health{verdict="converged"}'], "1")
            self.assertEqual(m['ribltcache_health{verdict="isolated"}'], "0")
            self.assertEqual(m["ribltcache_peers_up"], "1")
            self.assertGreater(
                int(m['ribltcache_rounds_total{result="ok"}']), 0)
            # Another path is a 404; another method is refused.
            with self.assertRaises(urllib.error.HTTPError) as e:
                fetch("http://127.0.0.1:%d/" % mport)
            self.assertEqual(e.exception.code, 404)
            req = urllib.request.Request(url, data=b"x", method="POST")
            with self.assertRaises(urllib.error.HTTPError):
                urllib.request.urlopen(req, timeout=5)
            # The format passes Prometheus's own linter.
            lint = subprocess.run([PROMTOOL, "check", "metrics"],
                                  input=text.encode(), capture_output=True,
                                  timeout=30)
            self.assertEqual(lint.returncode, 0, lint.stdout + lint.stderr)
            self.scrape_with_prometheus(mport, pport)

    def scrape_with_prometheus(self, mport, pport):
        tmp = tempfile.mkdtemp(prefix="ribltcache-prom-")
        conf = os.path.join(tmp, "prometheus.yml")
        with open(conf, "w") as f:
            f.write("global:\n  scrape_interval: 1s\n"
                    "scrape_configs:\n  - job_name: ribltcache\n"
                    "    static_configs:\n"
                    "      - targets: ['127.0.0.1:%d']\n" % mport)
        log = open(os.path.join(tmp, "log"), "wb")
        proc = subprocess.Popen(
            [PROMETHEUS, "--config.file=" + conf,
             "--storage.tsdb.path=" + os.path.join(tmp, "data"),
             "--web.listen-address=127.0.0.1:%d" % pport],
            stdin=subprocess.DEVNULL, stdout=log, stderr=log)
        try:
            query = ("http://127.0.0.1:%d/api/v1/query?query=%s" % (
                pport, urllib.parse.quote("memcached_current_items")))
            last = {}

            def scraped():
                try:
                    _, _, body = fetch(query, timeout=2)
                except OSError:
                    return False
                res = json.loads(body)
                last["res"] = res
                found = res.get("data", {}).get("result", [])
                return bool(found) and found[0]["value"][1] == str(KEYS)
            ok = wait_until(scraped, 60, interval=0.5)
            with open(os.path.join(tmp, "log"), "rb") as f:
                plog = f.read().decode(errors="replace")[-3000:]
            self.assertTrue(ok, "%r\n%s" % (last.get("res"), plog))
            series = last["res"]["data"]["result"][0]["metric"]
            self.assertEqual(series["job"], "ribltcache")
            self.assertEqual(series["instance"], "127.0.0.1:%d" % mport)
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            log.close()
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    cluster.main()
