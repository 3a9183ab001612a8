"""The fault tests' checker (netfault.judge) against hand-made write
histories and end states: it accepts what last-writer-wins allows and
counts each kind of violation. Needs no root and no server."""

import unittest

import netfault
from netfault import Snapshot, Write


def write(key, value, node, lo, hi, status="acked"):
    """A write whose version ticks lie in [lo, hi] (hi None: unknown)."""
    w = Write(key, value, node, lo)
    w.status = status
    w.hi = hi
    return w


def snap(*per_node, items=None):
    values = [dict(v) for v in per_node]
    if items is None:
        items = [len(values[0])] * len(values)
    return Snapshot(values, items)


class Judge(unittest.TestCase):
    def counts(self, writes, keys, s):
        v = netfault.judge(writes, keys, s)
        return (v.mismatches, v.lost, v.resurrections, v.unexplained,
                v.item_count_errors)

    def test_last_acked_write_passes(self):
        ws = [write("k", b"1", 0, 10, 20), write("k", b"2", 1, 30, 40)]
        s = snap({"k": b"2"}, {"k": b"2"}, {"k": b"2"})
        self.assertEqual(self.counts(ws, ["k"], s), (0, 0, 0, 0, 0))

    def test_overwritten_by_older_is_lost(self):
        ws = [write("k", b"1", 0, 10, 20), write("k", b"2", 1, 30, 40)]
        s = snap({"k": b"1"}, {"k": b"1"}, {"k": b"1"})
        self.assertEqual(self.counts(ws, ["k"], s), (0, 1, 0, 0, 0))

    def test_overlapping_versions_allow_either(self):
        # The second write's node had not seen the first one's clock: its
        # version may be lower, so LWW may keep the first.
        ws = [write("k", b"1", 2, 10, 50), write("k", b"2", 0, 30, 40)]
        for final in (b"1", b"2"):
            s = snap({"k": final}, {"k": final}, {"k": final})
            self.assertEqual(self.counts(ws, ["k"], s), (0, 0, 0, 0, 0))

    def test_clock_ahead_write_beats_a_later_one(self):
        # Sent first, on a node whose clock is ahead: its version is
        # provably greater than that of the write sent after it.
        ws = [write("k", b"ahead", 2, 100, 110), write("k", b"2", 0, 50, 50)]
        s = snap({"k": b"ahead"}, {"k": b"ahead"}, {"k": b"ahead"})
        self.assertEqual(self.counts(ws, ["k"], s), (0, 0, 0, 0, 0))
        self.assertEqual(netfault.judge(ws, ["k"], s).older_kept, 1)
        s = snap({"k": b"2"}, {"k": b"2"}, {"k": b"2"})
        self.assertEqual(self.counts(ws, ["k"], s), (0, 1, 0, 0, 0))

    def test_missing_acked_write_is_lost(self):
        ws = [write("k", b"1", 0, 10, 20)]
        s = snap({}, {}, {}, items=[0, 0, 0])
        self.assertEqual(self.counts(ws, ["k"], s), (0, 1, 0, 0, 0))

    def test_deleted_value_back_is_resurrection(self):
        ws = [write("k", b"1", 0, 10, 20), write("k", None, 1, 30, 40)]
        s = snap({"k": b"1"}, {"k": b"1"}, {"k": b"1"})
        self.assertEqual(self.counts(ws, ["k"], s), (0, 0, 1, 0, 0))
        gone = snap({}, {}, {}, items=[0, 0, 0])
        self.assertEqual(self.counts(ws, ["k"], gone), (0, 0, 0, 0, 0))

    def test_unknown_outcome_is_allowed_but_proves_nothing(self):
        ws = [write("k", b"1", 0, 10, 20),
              write("k", b"2", 1, 30, None, status="unknown")]
        for final in (b"1", b"2"):
            s = snap({"k": final}, {"k": final}, {"k": final})
            self.assertEqual(self.counts(ws, ["k"], s), (0, 0, 0, 0, 0))

    def test_divergence_and_strangers_are_counted(self):
        ws = [write("k", b"1", 0, 10, 20)]
        s = snap({"k": b"1"}, {"k": b"1"}, {})
        self.assertEqual(self.counts(ws, ["k"], s)[0], 1)
        s = snap({"k": b"x"}, {"k": b"x"}, {"k": b"x"})
        self.assertEqual(self.counts(ws, ["k"], s), (0, 0, 0, 1, 0))

    def test_stray_items_are_counted(self):
        ws = [write("k", b"1", 0, 10, 20)]
        s = snap({"k": b"1"}, {"k": b"1"}, {"k": b"1"}, items=[1, 2, 1])
        self.assertEqual(self.counts(ws, ["k"], s), (0, 0, 0, 0, 1))


if __name__ == "__main__":
    unittest.main(verbosity=2)
