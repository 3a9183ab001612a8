"""Rounds that repair nothing back off; a write no push carried brings
them back.

- Two idle nodes (repl_period_ms 50, so a tick every 25-75 ms) start, over
  SPAN seconds, at most a quarter of the rounds one a tick would give:
  every round finds nothing to repair (`rounds_idle`), and the gap
  doubles up to 16 ticks (`round_gap_ticks` shows it). The same holds
  under a steady stream of writes on one node, whose rounds find only
  writes in flight; the stream reaches the other node, and its push
  frames carry at least 5 writes each on average (`pushed` over
  `push_frames`: the bursts of 100 are not sent one write a frame).
- A burst too big for a tiny push queue (repl_push_queue 64) drops
  pushes (`push_queue_dropped`); rounds that follow repair them (rounds
  that are not idle), and the nodes converge.
- Push windows back off too when no peer is ready: under the same steady
  stream, node 1's replication thread wakes at most a third as often
  (context switches of its thread, from /proc) once node 2 is gone as
  while node 2 took the pushes; once node 2 is back, the writes made
  meanwhile reach it.
Counts are printed."""

import glob
import socket
import time
import unittest

import cluster
from cluster import (Cluster, count_present, pipelined_sets, repl_sum,
                     wait_until)

PERIOD_MS = 50
SPAN = 3.0


def rounds(node):
    st = node.repl_stats()
    return repl_sum(st, "rounds"), repl_sum(st, "rounds_idle")


def repl_thread_switches(pid):
    """Times the process's replication thread (rc-repl) blocked: its
    voluntary context switches. Preemptions (the involuntary ones) follow
    the machine's load, not the thread's wake-ups, and are left out."""
    for task in glob.glob("/proc/%d/task/*" % pid):
        with open(task + "/comm") as f:
            if f.read().strip() != "rc-repl":
                continue
        total = 0
        with open(task + "/status") as f:
            for line in f:
                if line.startswith("voluntary_ctxt_switches"):
                    total += int(line.split()[1])
        return total
    raise AssertionError("no rc-repl thread in %d" % pid)


def steady_stream(port, prefix, seconds):
    """100 writes every 5 ms at most for `seconds`: bounded in count and
    in time. Returns the number written."""
    s = socket.create_connection(("127.0.0.1", port), timeout=30)
    try:
        end = time.monotonic() + seconds
        sent = 0
        while time.monotonic() < end and sent < 200000:
            s.sendall(b"".join(b"set %s:%06d 0 0 1 noreply\r\nv\r\n"
                               % (prefix, sent + i) for i in range(100)))
            sent += 100
            time.sleep(0.005)
        s.sendall(b"mn\r\n")
        cluster.read_to_mn(s)
        return sent
    finally:
        s.close()


def most_rounds():
    """Rounds one a tick would start in SPAN (ticks are 0.5-1.5 periods,
    one a period on average)."""
    return SPAN * 1000 / PERIOD_MS


class RoundBackoff(unittest.TestCase):
    def start(self, **extra):
        settings = {"repl_period_ms": PERIOD_MS}
        settings.update(extra)
        cl = Cluster(2, extra=settings)
        cl.start()
        self.addCleanup(cl.close)
        if not cl.wait_connected():
            raise AssertionError(cl.logs())
        return cl

    def test_idle_rounds_back_off(self):
        cl = self.start()
        base = [rounds(n) for n in cl.nodes]
        time.sleep(SPAN)
        self.check_backed_off_since(cl, base, "idle")

    def check_backed_off_since(self, cl, base, what):
        for n, (r0, i0) in zip(cl.nodes, base):
            r, idle = rounds(n)
            print("\n%s, %s: %d rounds in %.0f s, %d idle (one a tick: "
                  "about %d)" % (what, n.name, r - r0, SPAN, idle - i0,
                                 most_rounds()), flush=True)
            self.assertLessEqual(r - r0, most_rounds() / 4, what)
            self.assertGreaterEqual(idle - i0, 1, what)
            gap = int(n.repl_stats()["round_gap_ticks"])
            print("%s: round_gap_ticks %d" % (n.name, gap), flush=True)
            # Idle, nothing can bring the gap back to one tick.
            if what == "idle":
                self.assertIn(gap, (2, 4, 8, 16), what)
            else:
                self.assertIn(gap, (1, 2, 4, 8, 16), what)

    def test_rounds_back_off_under_steady_writes(self):
        cl = self.start()
        base = [rounds(n) for n in cl.nodes]
        sent = steady_stream(cl[0].port, b"steady", SPAN)
        self.check_backed_off_since(cl, base, "%d writes" % sent)
        keys = [b"steady:%06d" % i for i in range(sent)]
        self.assertTrue(wait_until(lambda: count_present(cl[1].port, keys)
                                   == sent, 20), cl.logs())
        st = cl[0].repl_stats()
        pushed, frames = repl_sum(st, "pushed"), repl_sum(st, "push_frames")
        print("node1: %d writes pushed in %d frames" % (pushed, frames),
              flush=True)
        self.assertGreaterEqual(pushed, sent)
        self.assertGreaterEqual(pushed, 5 * frames)

    def test_undelivered_pushes_bring_rounds_back(self):
        cl = self.start(repl_push_queue=64)
        time.sleep(1.0)  # rounds back off while idle
        base = [rounds(n) for n in cl.nodes]
        keys = [b"burst:%06d" % i for i in range(20000)]
        pipelined_sets(cl[0].port, keys, b"x" * 10)
        dropped = int(cl[0].repl_stats().get("push_queue_dropped", 0))
        self.assertGreater(dropped, 0, "the burst fit the queue")
        self.assertTrue(wait_until(lambda: count_present(cl[1].port, keys)
                                   == len(keys), 20), cl.logs())
        repaired = sum(rounds(n)[0] - rounds(n)[1] - (b[0] - b[1])
                       for n, b in zip(cl.nodes, base))
        print("\n%d pushes dropped; %d rounds repaired them" %
              (dropped, repaired), flush=True)
        self.assertGreaterEqual(repaired, 1)

    def test_push_windows_back_off_without_peers(self):
        cl = self.start()
        pid = cl[0].proc.pid

        # Wake-ups per burst of 100 writes, not per second: a client slowed
        # by the machine's load sends fewer bursts, in both phases alike.
        def woken_under_stream(prefix):
            w0 = repl_thread_switches(pid)
            sent = steady_stream(cl[0].port, prefix, SPAN / 2)
            return (repl_thread_switches(pid) - w0) * 100 / max(sent, 1), sent

        live, sent_live = woken_under_stream(b"live")
        cl[1].sigkill()
        self.assertTrue(wait_until(lambda: any(
            k.endswith(":state") and v != "up"
            for k, v in cl[0].repl_stats().items()), 10), cl.logs())
        alone, sent_alone = woken_under_stream(b"alone")
        print("\nnode1's replication thread: %.2f wake-ups a burst "
              "pushing %d writes to node 2, %.2f a burst with node 2 gone "
              "(%d writes)"
              % (live, sent_live, alone, sent_alone), flush=True)
        self.assertGreater(live, 0)
        self.assertLessEqual(alone, live / 3)
        # The writes made while node 2 was gone reach it once it is back.
        cl[1].start()
        keys = [b"alone:%06d" % i for i in range(sent_alone)]
        self.assertTrue(wait_until(lambda: count_present(cl[1].port, keys)
                                   == sent_alone, 20), cl.logs())


if __name__ == "__main__":
    cluster.main()
