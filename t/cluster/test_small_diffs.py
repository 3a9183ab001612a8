"""Small differences cost few coded symbols end to end. Two nodes, cut
apart by TCP proxies, each take new keys (DIFF differences in all, split
between the two sides); after the heal the first round reconciles them.
The coded symbols both nodes received for it, divided by the differences,
must stay near R-IBLT's own cost (about 1.35-1.45 at this size): the test
asserts the median of RUNS runs is at most 1.7 a difference (before the
round's requests grew by small steps: 1.93), and at least one (a round
cannot decode d differences from fewer than d symbols: fewer means
something else carried them). The push log is off (repl_backlog_kb 0):
with it, the link's return resends the writes each side missed and no
round has anything to find. Figures are printed."""

import statistics
import time
import unittest

import cluster
from cluster import (Cluster, CuttableProxy, free_ports, pipelined_sets,
                     repl_sum, wait_until)

DIFF = 100
RUNS = 5
BOUND = 1.7


def one_run():
    ports = free_ports(4)
    cp, pp = ports[:2], ports[2:]
    proxies = [CuttableProxy(p) for p in pp]

    def peers_for(i, _):
        if i == 0:
            return "127.0.0.1:%d,127.0.0.1:%d" % (pp[0], proxies[1].port)
        return "127.0.0.1:%d,127.0.0.1:%d" % (proxies[0].port, pp[1])
    # A long period: after the heal, the round the link's return starts
    # is the only one that finds differences before the count is taken.
    cl = Cluster(2, peers_for=peers_for, ports=(cp, pp),
                 extra={"repl_period_ms": 2000, "repl_backlog_kb": 0})
    try:
        cl.start()
        if not cl.wait_connected():
            raise AssertionError(cl.logs())
        pipelined_sets(cl[0].port, [b"base:%05d" % i for i in range(1000)],
                       b"v")
        if not wait_until(lambda: cl[1].curr_items() == 1000, 20):
            raise AssertionError(cl.logs())
        for p in proxies:
            p.cut()
        time.sleep(0.2)
        pipelined_sets(cl[0].port,
                       [b"a:%05d" % i for i in range(DIFF - DIFF // 2)], b"x")
        pipelined_sets(cl[1].port, [b"b:%05d" % i for i in range(DIFF // 2)],
                       b"y")
        time.sleep(0.3)
        before = sum(repl_sum(n.repl_stats(), "symbols_recv")
                     for n in cl.nodes)
        for p in proxies:
            p.heal()
        if not wait_until(lambda: all(n.curr_items() == 1000 + DIFF
                                      for n in cl.nodes), 20):
            raise AssertionError(cl.logs())
        return sum(repl_sum(n.repl_stats(), "symbols_recv")
                   for n in cl.nodes) - before
    finally:
        try:
            cl.close()
        finally:
            for p in proxies:
                p.close()


class SmallDiffs(unittest.TestCase):
    def test_symbols_per_difference(self):
        counts = [one_run() for _ in range(RUNS)]
        per = statistics.median(counts) / DIFF
        print("\n%d differences: %s coded symbols, median %.2f a difference"
              % (DIFF, counts, per), flush=True)
        self.assertLessEqual(per, BOUND)
        self.assertGreaterEqual(per, 1.0)


if __name__ == "__main__":
    cluster.main()
