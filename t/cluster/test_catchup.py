"""Catch-up while writes go on. Node 3 is stopped (SIGSTOP) while node 1
takes MISSED new keys of 1000 bytes, so it comes back that many mutations
behind: far more than the peers' push buffers hold (they drop pushes to a
peer that stopped reading) and more than the materialized sketch can
decode, so its rounds stream coded symbols beyond it. Node 1 keeps taking writes (a steady, bounded load of
new keys) while node 3 catches up; the test asserts that node 3 holds every
missed key before that load ends, not after, that the coded symbols it
received and sent stay within 3 per missed mutation, and that then every node
converges. The time node 3 took is printed, never asserted."""

import os
import random
import signal
import socket
import threading
import time
import unittest

import cluster
from cluster import (Cluster, count_present, pipelined_sets, repl_sum,
                     wait_until)

BASE = 20000  # keys every node holds before the stop
VALUE = b"v" * 100  # base and load keys
MISSED_VALUE = b"m" * 1000  # missed keys: far more than push buffers hold
LOAD_SECONDS = 60.0  # the load's bound; catch-up must end inside it
SAMPLE = 500  # missed keys polled while waiting


def missed_count():
    """Mutations node 3 misses (fewer under the sanitizers' slowdown)."""
    return 60000 if cluster.sanitized() else 100000


def load_rate():
    """Writes per second during the catch-up."""
    return 5000 if cluster.sanitized() else 50000
class Load(threading.Thread):
    """New keys written to one node at a bounded rate, for at most
    LOAD_SECONDS, until stopped."""

    def __init__(self, port):
        super().__init__(daemon=True)
        self.port = port
        self.stop_flag = threading.Event()
        self.written = 0
        self.error = None

    def run(self):
        try:
            s = socket.create_connection(("127.0.0.1", self.port),
                                         timeout=30)
            step = 0.02
            per_step = max(1, int(load_rate() * step))
            deadline = time.monotonic() + LOAD_SECONDS
            limit = int(load_rate() * LOAD_SECONDS) + per_step
            nxt = time.monotonic()
            while (not self.stop_flag.is_set() and
                   time.monotonic() < deadline and self.written < limit):
                s.sendall(b"".join(
                    b"set load:%09d 0 0 %d noreply\r\n%s\r\n" %
                    (self.written + i, len(VALUE), VALUE)
                    for i in range(per_step)))
                self.written += per_step
                nxt += step
                pause = nxt - time.monotonic()
                if pause > 0:
                    time.sleep(pause)
            s.close()
        except OSError as e:
            self.error = e

    @property
    def running(self):
        return self.is_alive()


class CatchUp(unittest.TestCase):
    def test_catch_up_under_load(self):
        MISSED = missed_count()
        with Cluster(3, extra={"maxbytes": "256m"}) as cl:
            self.assertTrue(cl.wait_connected(), cl.logs())
            base = [b"base:%09d" % i for i in range(BASE)]
            pipelined_sets(cl[0].port, base, VALUE)
            self.assertTrue(wait_until(
                lambda: all(n.curr_items() == BASE for n in cl.nodes), 60),
                cl.logs())

            os.kill(cl[2].pid, signal.SIGSTOP)
            stopped = True
            try:
                missed = [b"miss:%09d" % i for i in range(MISSED)]
                pipelined_sets(cl[0].port, missed, MISSED_VALUE)
                self.assertTrue(wait_until(
                    lambda: cl[1].curr_items() == BASE + MISSED, 60),
                    cl.logs())
                load = Load(cl[0].port)
                load.start()
                t0 = time.monotonic()
                os.kill(cl[2].pid, signal.SIGCONT)
                stopped = False
                sample = random.Random(7).sample(missed, SAMPLE)
                verdicts = set()

                def done():
                    verdicts.add(cl[2].stats("health")["health"])
                    return (not load.running or
                            count_present(cl[2].port, sample) == SAMPLE)
                caught = wait_until(done, LOAD_SECONDS + 5, interval=0.1)
                took = time.monotonic() - t0
                still_loading = load.running
                # The sample is back; the last few of the rest may still
                # be in the round's final batch: every one must follow
                # (bounded), none may be lost.
                wait_until(lambda: count_present(cl[2].port, missed) ==
                           MISSED, 10, interval=0.1)
                have = count_present(cl[2].port, missed)
                load.stop_flag.set()
                load.join(LOAD_SECONDS + 5)
            finally:
                if stopped:
                    os.kill(cl[2].pid, signal.SIGCONT)
            self.assertIsNone(load.error)
            st = cl[2].repl_stats()
            print("node 3 behind by %d mutations: every missed key back "
                  "%.2f s after SIGCONT, %d load writes meanwhile "
                  "(%d/s); node 3: rounds %d ok %d failed %d handed %d "
                  "bulk %d, symbols received %d sent %d, fetched %d" %
                  (MISSED, took, load.written, load_rate(),
                   repl_sum(st, "rounds"), repl_sum(st, "rounds_ok"),
                   repl_sum(st, "rounds_failed"),
                   repl_sum(st, "rounds_handed"),
                   repl_sum(st, "bulk_transfers"),
                   repl_sum(st, "symbols_recv"), int(st["served_symbols"]),
                   repl_sum(st, "mutations_fetched")), flush=True)
            self.assertTrue(caught, cl.logs())
            self.assertTrue(still_loading,
                            "node 3 caught up only after the load ended")
            self.assertEqual(have, MISSED)
            # `stats health` said so while rounds did the catching up
            # (not when the peers' buffered pushes covered nearly all).
            if repl_sum(st, "rounds_handed") + repl_sum(st, "rounds_walked"):
                self.assertIn("catching_up", verdicts)
            # Rounds on one consistent set decode at about 1.35 symbols a
            # difference; rounds that mix two instants of a moving set fail
            # and start over (about 23 a difference before walked rounds).
            # Node 3 ran the rounds, or (being far behind) handed them to
            # its peers and served the symbols: count both directions.
            symbols = repl_sum(st, "symbols_recv") + int(st["served_symbols"])
            self.assertLessEqual(symbols, 3 * MISSED)

            total = BASE + MISSED + load.written
            self.assertTrue(wait_until(
                lambda: all(n.curr_items() == total for n in cl.nodes), 60),
                "%s\n%s" % ([n.curr_items() for n in cl.nodes], cl.logs()))
            self.assertTrue(wait_until(
                lambda: all(n.stats("health")["health"] == "converged"
                            for n in cl.nodes), 30),
                [n.stats("health") for n in cl.nodes])
            # The encoders kept for walked rounds (tens of MiB beyond -m
            # at this size) are freed once the walks are over.
            walkers = [n for n in cl.nodes
                       if int(n.repl_stats()["encoder_builds"]) > 0]
            print("nodes that built encoders: %d" % len(walkers))
            self.assertTrue(wait_until(
                lambda: all(int(n.repl_stats()["encoder_spares_freed"]) > 0
                            for n in walkers), 15, interval=0.5),
                [n.repl_stats()["encoder_spares_freed"] for n in walkers])
            # So is a decoder a round grew for this difference (tens of
            # MiB): every peer's round state is back to the first size.
            grown = sum(repl_sum(n.repl_stats(), "decoders_grown")
                        for n in cl.nodes)
            print("decoders grown: %d" % grown)
            self.assertGreater(grown, 0)
            held = [int(v) for n in cl.nodes
                    for k, v in n.repl_stats().items()
                    if k.endswith(":decoder_symbols")]
            self.assertTrue(held and max(held) <= 8192, held)


    def test_lagging_peer_fed_from_the_push_log(self):
        """A peer that stops reading falls more than the 16 MiB its link
        may hold behind; the writes after that wait in the writer's push
        log (large enough here) and reach it, in order, once it reads
        again: none dropped, no reconnect and resume."""
        n = 250000  # about 37 MB of pushes: past 16 MiB and the sockets
        extra = {"maxbytes": "256m", "repl_backlog_kb": 131072}
        with Cluster(2, extra=extra) as cl:
            self.assertTrue(cl.wait_connected(), cl.logs())
            connects = repl_sum(cl[0].repl_stats(), "connects")
            os.kill(cl[1].pid, signal.SIGSTOP)
            try:
                keys = [b"lag:%09d" % i for i in range(n)]
                pipelined_sets(cl[0].port, keys, VALUE)
                time.sleep(1.0)  # the pushes leave the push queue
            finally:
                os.kill(cl[1].pid, signal.SIGCONT)
            self.assertTrue(wait_until(
                lambda: cl[1].curr_items() == n, 60, interval=0.2),
                "%d of %d\n%s" % (cl[1].curr_items(), n, cl.logs()))
            st = cl[0].repl_stats()
            fetched = repl_sum(cl[1].repl_stats(), "mutations_fetched")
            print("writer: pushed %d, from the log %d, dropped %d; the "
                  "peer's rounds fetched %d" %
                  (repl_sum(st, "pushed"), repl_sum(st, "push_from_log"),
                   repl_sum(st, "push_dropped"), fetched), flush=True)
            self.assertEqual(repl_sum(st, "push_dropped"), 0, st)
            self.assertGreater(repl_sum(st, "push_from_log"), 0, st)
            self.assertEqual(repl_sum(st, "resumed"), 0, st)
            self.assertEqual(repl_sum(st, "connects"), connects, st)
            self.assertEqual(count_present(cl[1].port, keys), n)

if __name__ == "__main__":
    cluster.main()
