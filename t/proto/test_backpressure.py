"""Back-pressure: a client that sends requests without reading replies
makes the server stop reading from it; other clients stay served and the
server's memory stays bounded. A slow reader still gets every reply."""

import socket
import threading
import time
import unittest

import harness
from harness import Server, recv_exact, recv_until

# Small values: the replies are mostly copied headers, so a server that
# kept reading would grow by gigabytes long before FLOOD_LIMIT.
VALUE = b"v" * 100
FLOOD_LIMIT = 128 << 20   # request bytes the flooder offers at most
RSS_GROWTH_LIMIT_KB = 512 << 10


def set_value(srv, key, value):
    reply = srv.request(b"set %s 0 0 %d\r\n%s\r\n" % (key, len(value), value))
    assert reply == b"STORED\r\n", reply


class Flood(threading.Thread):
    """Sends `get bp` requests without ever reading, until the server stops
    taking them (2 s without progress), FLOOD_LIMIT bytes, or 60 s."""

    def __init__(self, sock):
        super().__init__(daemon=True)
        self.sock = sock
        self.sent = 0
        self.stalled = False

    def run(self):
        chunk = b"get bp\r\n" * 8192
        self.sock.setblocking(False)
        deadline = time.monotonic() + 60
        last_progress = time.monotonic()
        while self.sent < FLOOD_LIMIT and time.monotonic() < deadline:
            try:
                n = self.sock.send(chunk)
                self.sent += n
                last_progress = time.monotonic()
            except (BlockingIOError, InterruptedError):
                if time.monotonic() - last_progress > 2.0:
                    self.stalled = True
                    return
                time.sleep(0.01)
            except OSError:
                return


class BackPressure(unittest.TestCase):
    def test_non_reading_client_is_throttled(self):
        with Server(["-t", "2", "-R", "4"]) as srv:
            set_value(srv, b"bp", VALUE)
            rss_before = srv.rss_kb()

            flooder = srv.connect()
            flood = Flood(flooder)
            flood.start()

            # Another client is served all along.
            other = srv.connect()
            rounds = 0
            while flood.is_alive() and rounds < 2000:
                key = b"o%d" % (rounds % 50)
                other.sendall(b"set %s 0 0 5\r\nhello\r\nget %s\r\n" %
                              (key, key))
                self.assertEqual(
                    recv_until(other, b"END\r\n", timeout=10),
                    b"STORED\r\nVALUE %s 0 5\r\nhello\r\nEND\r\n" % key)
                rounds += 1
            flood.join(timeout=70)
            self.assertFalse(flood.is_alive())
            self.assertGreater(rounds, 0)

            # The server stopped taking requests long before the end ...
            self.assertTrue(flood.stalled, "server read %d bytes" %
                            flood.sent)
            self.assertLess(flood.sent, FLOOD_LIMIT)
            # ... and did not buffer what it could not send.
            growth = srv.rss_kb() - rss_before
            self.assertLess(growth, RSS_GROWTH_LIMIT_KB,
                            "rss grew by %d kB" % growth)
            self.assertEqual(srv.request(b"get bp\r\n", b"END\r\n",
                                         timeout=10)[:16],
                             b"VALUE bp 0 100\r\n")

            # Hanging up releases everything that was pending.
            flooder.close()
            self.assertTrue(harness.wait_for(
                lambda: srv.stats()["curr_connections"] == "2",
                timeout=15))
            other.close()

    def test_slow_reader_gets_every_reply(self):
        value = b"s" * 8192
        count = 20000
        one = b"VALUE sr 0 8192\r\n" + value + b"\r\nEND\r\n"
        with Server(["-t", "2", "-R", "1",
                     "-o", "output_buffer_max=256k"]) as srv:
            set_value(srv, b"sr", value)
            s = srv.connect()
            requests = b"get sr\r\n" * count
            sender = threading.Thread(target=s.sendall, args=(requests,),
                                      daemon=True)
            sender.start()
            got = recv_exact(s, len(one) * count, timeout=120)
            sender.join(timeout=30)
            self.assertEqual(len(got), len(one) * count)
            self.assertEqual(got, one * count)
            st = srv.stats()
            self.assertGreater(int(st["conn_yields"]), 0)
            s.close()


if __name__ == "__main__":
    harness.main()
