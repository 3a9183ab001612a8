"""Client TLS (-Z and memcached's ssl_* settings): real TLS clients (Python's
ssl, pymemcache with a TLS context, openssl s_client) over the text, meta
and binary protocols; notls: listeners; client certificates required and
refused; plaintext, garbage and stalled handshakes; certificate reloads.
Every certificate is made here with the openssl command, in a temporary
directory."""

import os
import shutil
import signal
import socket
import ssl
import struct
import subprocess
import tempfile
import time
import unittest

import harness
from harness import Server, free_port, parse_stats, recv_until, wait_for

from pymemcache.client.base import Client


def openssl(*args, cwd):
    subprocess.run(["openssl"] + list(args), cwd=cwd, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                   timeout=60)


def make_ca(d, name):
    openssl("req", "-x509", "-newkey", "ec", "-pkeyopt",
            "ec_paramgen_curve:prime256v1", "-nodes", "-days", "2", "-subj",
            "/CN=%s" % name, "-keyout", name + ".key", "-out", name + ".crt",
            cwd=d)


def make_cert(d, ca, name, cn, san=None):
    """A key and a certificate signed by ca (a make_ca name)."""
    openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
            "-nodes", "-subj", "/CN=%s" % cn, "-keyout", name + ".key",
            "-out", name + ".csr", cwd=d)
    ext = os.path.join(d, name + ".ext")
    with open(ext, "w") as f:
        f.write("subjectAltName=%s\n" % (san or "DNS:localhost"))
    openssl("x509", "-req", "-in", name + ".csr", "-CA", ca + ".crt",
            "-CAkey", ca + ".key", "-CAcreateserial", "-days", "2",
            "-extfile", ext, "-out", name + ".crt", cwd=d)


CERTS = None  # temporary directory with every certificate


def setUpModule():
    global CERTS
    CERTS = tempfile.mkdtemp(prefix="ribltcached-tls-")
    make_ca(CERTS, "ca")
    make_ca(CERTS, "rogue")
    make_cert(CERTS, "ca", "server", "server-one",
              "IP:127.0.0.1,DNS:localhost")
    make_cert(CERTS, "ca", "server2", "server-two",
              "IP:127.0.0.1,DNS:localhost")
    make_cert(CERTS, "ca", "client", "client-one")
    make_cert(CERTS, "rogue", "intruder", "client-rogue")


def tearDownModule():
    shutil.rmtree(CERTS, ignore_errors=True)


def cert(name):
    return os.path.join(CERTS, name)


def tls_args(extra=""):
    opts = "ssl_chain_cert=%s,ssl_key=%s" % (cert("server.crt"),
                                             cert("server.key"))
    if extra:
        opts += "," + extra
    return ["-Z", "-o", opts]


def client_ctx(certname=None, max_version=None):
    ctx = ssl.create_default_context(cafile=cert("ca.crt"))
    if certname is not None:
        ctx.load_cert_chain(cert(certname + ".crt"), cert(certname + ".key"))
    if max_version is not None:
        ctx.maximum_version = max_version
    return ctx


def tls_connect(port, ctx=None, timeout=10.0):
    ctx = ctx or client_ctx()
    raw = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    try:
        return ctx.wrap_socket(raw, server_hostname="127.0.0.1")
    except Exception:
        raw.close()
        raise


def peer_cn(sock):
    subject = dict(x[0] for x in sock.getpeercert()["subject"])
    return subject["commonName"]


def tls_request(port, data, terminator=b"\r\n", ctx=None):
    with tls_connect(port, ctx) as s:
        s.sendall(data)
        return recv_until(s, terminator)


def tls_stats(port, group="", ctx=None):
    cmd = ("stats %s\r\n" % group) if group else "stats\r\n"
    return parse_stats(tls_request(port, cmd.encode(), b"END\r\n", ctx))


def closed_without_reply(sock, timeout=10.0):
    """Reads until EOF; returns the bytes the server sent before closing,
    or None when it did not close within timeout."""
    sock.settimeout(timeout)
    data = b""
    try:
        while True:
            chunk = sock.recv(4096)
            if not chunk:
                return data
            data += chunk
    except socket.timeout:
        return None
    except ConnectionResetError:
        return data


class Protocols(unittest.TestCase):
    def test_text_meta_and_binary_over_tls(self):
        with Server(tls_args(), ready="connect") as srv:
            with tls_connect(srv.port) as s:
                s.sendall(b"set k 5 0 3\r\nabc\r\nget k\r\n")
                self.assertEqual(recv_until(s, b"END\r\n"),
                                 b"STORED\r\nVALUE k 5 3\r\nabc\r\nEND\r\n")
                s.sendall(b"ms m 2 T0\r\nhi\r\nmg m v f\r\n")
                self.assertEqual(recv_until(s, b"hi\r\n"),
                                 b"HD\r\nVA 2 f0\r\nhi\r\n")
            with tls_connect(srv.port) as s:
                # binary GET of "k": header, then the key
                s.sendall(struct.pack(">BBHBBHIIQ", 0x80, 0x00, 1, 0, 0, 0,
                                      1, 7, 0) + b"k")
                head = s.recv(24)
                while len(head) < 24:
                    head += s.recv(24 - len(head))
                magic, op, _, extlen, _, status, body = struct.unpack(
                    ">BBHBBHI", head[:12])
                self.assertEqual((magic, op, status, extlen), (0x81, 0, 0, 4))
                rest = b""
                while len(rest) < body:
                    rest += s.recv(body - len(rest))
                self.assertEqual(rest[4:], b"abc")

    def test_large_values_and_pipelines(self):
        # Replies larger than one TLS record, and requests split over
        # many records, both ways.
        with Server(tls_args() + ["-I", "4m"], ready="connect") as srv:
            value = os.urandom(3 << 20)
            with tls_connect(srv.port) as s:
                s.sendall(b"set big 0 0 %d\r\n%s\r\n" % (len(value), value))
                self.assertEqual(recv_until(s, b"\r\n"), b"STORED\r\n")
                s.sendall(b"get big\r\n" * 3)
                want = (b"VALUE big 0 %d\r\n%s\r\nEND\r\n" %
                        (len(value), value)) * 3
                got = harness.recv_exact(s, len(want))
                self.assertEqual(got, want)
                sets = b"".join(b"set k%d 0 0 2 noreply\r\nv%d\r\n" %
                                (i, i % 10) for i in range(20000))
                s.sendall(sets + b"mn\r\n")
                self.assertEqual(recv_until(s, b"MN\r\n"), b"MN\r\n")
                s.sendall(b"".join(b"mg k%d v\r\n" % i for i in range(20000)))
                want = b"".join(b"VA 2\r\nv%d\r\n" % (i % 10)
                                for i in range(20000))
                self.assertEqual(harness.recv_exact(s, len(want)), want)

    def test_pymemcache_with_tls_context(self):
        with Server(tls_args(), ready="connect") as srv:
            c = Client(("127.0.0.1", srv.port), tls_context=client_ctx(),
                       connect_timeout=5, timeout=5)
            c.set("py", b"tls", expire=0)
            self.assertEqual(c.get("py"), b"tls")
            self.assertEqual(c.incr("n", 1), None)
            c.set("n", b"41")
            self.assertEqual(c.incr("n", 1), 42)
            c.close()

    def test_openssl_s_client(self):
        with Server(tls_args(), ready="connect") as srv:
            p = subprocess.run(
                ["openssl", "s_client", "-connect", "127.0.0.1:%d" % srv.port,
                 "-CAfile", cert("ca.crt"), "-verify_return_error", "-quiet"],
                input=b"set s 0 0 2\r\nok\r\nget s\r\nquit\r\n",
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=30)
            self.assertEqual(p.stdout,
                             b"STORED\r\nVALUE s 0 2\r\nok\r\nEND\r\n",
                             p.stderr)

    def test_notls_listener_shares_the_cache(self):
        plain = free_port()
        with Server(tls_args(), ready="connect",
                    listen="127.0.0.1,notls:127.0.0.1:%d" % plain) as srv:
            self.assertEqual(tls_request(srv.port, b"set x 0 0 1\r\n1\r\n"),
                             b"STORED\r\n")
            with socket.create_connection(("127.0.0.1", plain), 5) as s:
                s.sendall(b"get x\r\n")
                self.assertEqual(recv_until(s, b"END\r\n"),
                                 b"VALUE x 0 1\r\n1\r\nEND\r\n")
            st = parse_stats(tls_request(srv.port, b"stats settings\r\n",
                                         b"END\r\n"))
            self.assertEqual(st["ssl_enabled"], "yes")
            self.assertEqual(st["ssl_min_version"], "tlsv1.2")
            self.assertEqual(st["ssl_wbuf_size"], "16384")
            self.assertEqual(st["ssl_chain_cert"], cert("server.crt"))

    def test_notls_needs_tls(self):
        p = subprocess.run([harness.SERVER, "-l", "notls:127.0.0.1", "-p",
                            str(free_port())], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, timeout=15)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn(b"notls: is valid only with -Z", p.stderr)

    def test_bad_certificate_refuses_to_start(self):
        code, _, err = harness.run(
            ["-Z", "-o", "ssl_chain_cert=%s,ssl_key=%s" %
             (cert("server.crt"), cert("client.key")), "-p",
             str(free_port())])
        self.assertNotEqual(code, 0)
        self.assertIn("TLS: ssl_key %s: key values mismatch" %
                      cert("client.key"), err)
        code, _, err = harness.run(
            ["-Z", "-o", "ssl_chain_cert=/nonexistent.pem,ssl_key=%s" %
             cert("server.key"), "-p", str(free_port())])
        self.assertNotEqual(code, 0)
        self.assertIn("ssl_chain_cert /nonexistent.pem", err)


class Refusals(unittest.TestCase):
    def test_plaintext_client_gets_nothing_like_a_reply(self):
        with Server(tls_args(), ready="connect") as srv:
            for req in (b"get foo\r\n", b"version\r\n",
                        b"\x80\x0b\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"
                        b"\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"):
                with srv.connect() as s:
                    s.sendall(req)
                    data = closed_without_reply(s)
                self.assertIsNotNone(data, "connection left open")
                # At most a TLS alert record (content type 21): nothing a
                # memcached client could parse as a reply.
                self.assertTrue(data == b"" or data[:1] == b"\x15", data)
                for word in (b"END", b"VALUE", b"ERROR", b"VERSION"):
                    self.assertNotIn(word, data)
            st = tls_stats(srv.port)
            self.assertGreaterEqual(int(st["ssl_handshake_errors"]), 3)

    def test_garbage_and_stalled_handshakes_are_closed(self):
        with Server(tls_args(), ready="connect") as srv:
            with srv.connect() as s:
                s.sendall(os.urandom(4096))
                # Mostly refused at once; now and then the random bytes
                # begin like a record longer than 4096 bytes, and then it
                # is the handshake limit (5 s) that closes the connection.
                self.assertIsNotNone(closed_without_reply(s, timeout=12))
            # A client that starts a handshake and stops: closed within
            # the handshake limit (5 s), long before any idle timeout.
            hello = b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03"
            stalled = [srv.connect() for _ in range(3)]
            quiet = srv.connect()  # sends nothing at all
            for s in stalled:
                s.sendall(hello)
            t0 = time.monotonic()
            for s in stalled + [quiet]:
                self.assertIsNotNone(closed_without_reply(s, timeout=12),
                                     "handshake slot held")
                s.close()
            self.assertLess(time.monotonic() - t0, 12)
            self.assertTrue(wait_for(
                lambda: tls_stats(srv.port)["curr_connections"] == "1",
                timeout=5))

    def test_client_certificates_required(self):
        args = tls_args("ssl_verify_mode=2,ssl_ca_cert=%s" % cert("ca.crt"))
        with Server(args + ["-v"], ready="connect") as srv:
            ok = tls_request(srv.port, b"version\r\n",
                             ctx=client_ctx("client"))
            self.assertTrue(ok.startswith(b"VERSION "), ok)
            for who in (None, "intruder"):
                # TLS 1.3 reports a refused client certificate on the
                # first read after the handshake.
                with self.assertRaises((ssl.SSLError, ConnectionError,
                                        AssertionError)):
                    with tls_connect(srv.port, client_ctx(who)) as s:
                        s.sendall(b"version\r\n")
                        got = recv_until(s, b"\r\n", timeout=5)
                        self.assertTrue(got.startswith(b"VERSION"))
            log = wait_for(lambda: srv.stderr().count(
                "TLS handshake refused") >= 2 and srv.stderr(), timeout=5)
            self.assertTrue(log, srv.stderr())
            self.assertIn("peer did not return a certificate", log)
            self.assertTrue("unable to get local issuer certificate" in log or
                            "certificate verify failed" in log, log)
            self.assertGreaterEqual(
                int(tls_stats(srv.port, ctx=client_ctx("client"))[
                    "ssl_handshake_errors"]), 2)

    def test_min_version(self):
        with Server(tls_args("ssl_min_version=3"), ready="connect") as srv:
            with self.assertRaises((ssl.SSLError, ConnectionError)):
                tls_request(srv.port, b"version\r\n",
                            ctx=client_ctx(
                                max_version=ssl.TLSVersion.TLSv1_2))
            with tls_connect(srv.port) as s:
                self.assertEqual(s.version(), "TLSv1.3")


class Reload(unittest.TestCase):
    def test_refresh_certs_and_sighup(self):
        d = tempfile.mkdtemp(prefix="ribltcached-reload-")
        try:
            crt, key = os.path.join(d, "c.pem"), os.path.join(d, "k.pem")
            shutil.copy(cert("server.crt"), crt)
            shutil.copy(cert("server.key"), key)
            args = ["-Z", "-o", "ssl_chain_cert=%s,ssl_key=%s" % (crt, key)]
            with Server(args, ready="connect") as srv:
                old = tls_connect(srv.port)
                self.assertEqual(peer_cn(old), "server-one")
                shutil.copy(cert("server2.crt"), crt)
                shutil.copy(cert("server2.key"), key)
                old.sendall(b"refresh_certs\r\n")
                self.assertEqual(recv_until(old, b"\r\n"), b"OK\r\n")
                with tls_connect(srv.port) as s:
                    self.assertEqual(peer_cn(s), "server-two")
                # The open connection keeps its session.
                old.sendall(b"version\r\n")
                self.assertTrue(recv_until(old, b"\r\n").startswith(
                    b"VERSION "))
                # A key that does not match: refused, the old ones stay.
                shutil.copy(cert("client.key"), key)
                old.sendall(b"refresh_certs\r\n")
                self.assertEqual(
                    recv_until(old, b"\r\n"),
                    b"SERVER_ERROR ssl_key %s: key values mismatch\r\n" %
                    key.encode())
                with tls_connect(srv.port) as s:
                    self.assertEqual(peer_cn(s), "server-two")
                # SIGHUP reloads as well.
                shutil.copy(cert("server.crt"), crt)
                shutil.copy(cert("server.key"), key)
                srv.proc.send_signal(signal.SIGHUP)

                def first_cert():
                    with tls_connect(srv.port) as s:
                        return peer_cn(s) == "server-one"
                self.assertTrue(wait_for(first_cert, timeout=5))
                old.close()
        finally:
            shutil.rmtree(d, ignore_errors=True)

    def test_refresh_certs_without_tls(self):
        with Server() as srv:
            self.assertEqual(srv.request(b"refresh_certs\r\n"),
                             b"SERVER_ERROR TLS not enabled\r\n")


if __name__ == "__main__":
    harness.main()
