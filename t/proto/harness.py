"""Black-box test harness: runs a ribltcached binary on loopback.

Each test script calls main(), which takes --server PATH from the command
line and then runs the script's unittest cases. Server() starts the daemon
on a free 127.0.0.1 port (or a unix socket in a private temporary
directory), waits until it answers, and stops it with SIGTERM.
"""

import argparse
import os
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import unittest

SERVER = None  # path of the ribltcached binary, set by main()

START_TIMEOUT = 15.0
SANITIZER_MARKERS = ("ERROR: AddressSanitizer", "ERROR: LeakSanitizer",
                     "runtime error:", "ThreadSanitizer")
STOP_TIMEOUT = 15.0


def free_port():
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(args, timeout=15.0):
    """Runs the binary to completion; returns (exit code, stdout, stderr)."""
    p = subprocess.run([SERVER] + list(args), stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, timeout=timeout)
    return p.returncode, p.stdout.decode(errors="replace"), \
        p.stderr.decode(errors="replace")


def recv_until(sock, terminator, limit=64 << 20, timeout=10.0):
    """Reads from sock until the data ends with terminator (or EOF)."""
    sock.settimeout(timeout)
    buf = b""
    while not buf.endswith(terminator) and len(buf) < limit:
        chunk = sock.recv(65536)
        if not chunk:
            break
        buf += chunk
    return buf


def recv_exact(sock, n, timeout=30.0):
    """Reads exactly n bytes (fewer only on EOF), within timeout overall."""
    deadline = time.monotonic() + timeout
    parts = []
    got = 0
    while got < n:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        sock.settimeout(left)
        try:
            chunk = sock.recv(min(1 << 20, n - got))
        except socket.timeout:
            break
        if not chunk:
            break
        parts.append(chunk)
        got += len(chunk)
    return b"".join(parts)


def parse_stats(data):
    """{"name": "value"} from a text `stats` reply."""
    out = {}
    for line in data.decode(errors="replace").split("\r\n"):
        if line.startswith("STAT "):
            parts = line.split(" ", 2)
            out[parts[1]] = parts[2] if len(parts) > 2 else ""
    return out


class Server:
    """One ribltcached process. Use as a context manager."""

    def __init__(self, args=(), unix=False, ready="version",
                 listen="127.0.0.1", nofile=None):
        self.args = list(args)
        self.nofile = nofile  # RLIMIT_NOFILE (n or (soft, hard)), if given
        self.listen = listen
        self.unix = unix
        self.ready = ready
        self.port = None
        self.sock_path = None
        self.proc = None
        self.tmpdir = tempfile.mkdtemp(prefix="ribltcached-t-")
        self.stderr_path = os.path.join(self.tmpdir, "stderr")
        self.returncode = None

    # -- life cycle ----------------------------------------------------

    def start(self):
        last = ""
        for _ in range(3):  # a picked port may be taken meanwhile
            argv = [SERVER] + self.args
            if self.unix:
                self.sock_path = os.path.join(self.tmpdir, "mc.sock")
                argv += ["-s", self.sock_path]
            else:
                self.port = free_port()
                argv += ["-l", self.listen, "-p", str(self.port)]
            limit = None
            if self.nofile is not None:
                # n, or (soft, hard)
                n = self.nofile if isinstance(self.nofile, tuple) else \
                    (self.nofile, self.nofile)

                def limit():
                    resource.setrlimit(resource.RLIMIT_NOFILE, n)
            with open(self.stderr_path, "wb") as err:
                self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL,
                                             stdout=subprocess.DEVNULL,
                                             stderr=err, preexec_fn=limit)
            if self._wait_ready():
                return self
            last = self.stderr()
            self.kill()
        raise RuntimeError("ribltcached did not start: " + last)

    def _wait_ready(self):
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return False
            try:
                with self.connect(timeout=2.0) as s:
                    if self.ready == "connect":
                        return True
                    s.sendall(b"version\r\n")
                    if recv_until(s, b"\r\n", timeout=2.0).startswith(
                            b"VERSION "):
                        return True
            except OSError:
                pass
            time.sleep(0.05)
        return False

    def stop(self, sig=signal.SIGTERM, timeout=STOP_TIMEOUT):
        """Sends sig and waits; returns the exit code (None if killed)."""
        if self.proc is None:
            return self.returncode
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.kill()
                return None
        self.returncode = self.proc.returncode
        return self.returncode

    def kill(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=STOP_TIMEOUT)

    def wait_exit(self, timeout=STOP_TIMEOUT):
        """Waits for the process to exit on its own; returns the code or
        None when it is still running after timeout."""
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None

    def close(self):
        """Stops the server; raises if it reported a sanitizer error."""
        self.stop()
        self.kill()
        report = self.stderr()
        shutil.rmtree(self.tmpdir, ignore_errors=True)
        for marker in SANITIZER_MARKERS:
            if marker in report:
                raise AssertionError("server reported:\n" + report)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.close()

    # -- helpers -------------------------------------------------------

    @property
    def pid(self):
        return self.proc.pid

    def alive(self):
        return self.proc.poll() is None

    def stderr(self):
        try:
            with open(self.stderr_path, "rb") as f:
                return f.read().decode(errors="replace")
        except OSError:
            return ""

    def address(self):
        """host:port (or the socket path) as client libraries take it."""
        if self.unix:
            return self.sock_path
        return "127.0.0.1:%d" % self.port

    def connect(self, timeout=10.0):
        if self.unix:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                s.settimeout(timeout)
                s.connect(self.sock_path)
            except OSError:
                s.close()
                raise
        else:
            s = socket.create_connection(("127.0.0.1", self.port),
                                         timeout=timeout)
        return s

    def request(self, data, terminator=b"\r\n", timeout=10.0):
        """One request on a fresh connection; returns the reply bytes."""
        with self.connect(timeout) as s:
            s.sendall(data)
            return recv_until(s, terminator, timeout=timeout)

    def stats(self, group=""):
        cmd = ("stats %s\r\n" % group) if group else "stats\r\n"
        return parse_stats(self.request(cmd.encode(), b"END\r\n"))

    def rss_kb(self):
        """Resident set size of the server process, in kB."""
        with open("/proc/%d/status" % self.proc.pid) as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
        return 0


def task_files(pid, name):
    """The contents of /proc/PID/task/TID/<name> for each thread of pid
    (threads that end meanwhile are left out)."""
    out = []
    for tid in os.listdir("/proc/%d/task" % pid):
        try:
            with open("/proc/%d/task/%s/%s" % (pid, tid, name)) as f:
                out.append(f.read())
        except OSError:
            pass
    return out


def thread_names(pid):
    """The names of process pid's threads (as top -H shows them)."""
    return [c.strip() for c in task_files(pid, "comm")]


def sanitized():
    """True for an AddressSanitizer build (CI runs both kinds); False when
    the binary cannot be read."""
    try:
        with open(SERVER, "rb") as f:
            return b"__asan_init" in f.read()
    except OSError:
        return False


def rss_is_live_memory():
    """False for an AddressSanitizer build: it keeps freed blocks in
    quarantine, so its RSS follows allocation churn, not what is held.
    Tests assert RSS bounds on plain builds only."""
    return not sanitized()


def wait_for(predicate, timeout=10.0, interval=0.05):
    """Polls predicate until true or timeout; returns its last value."""
    deadline = time.monotonic() + timeout
    value = predicate()
    while not value and time.monotonic() < deadline:
        time.sleep(interval)
        value = predicate()
    return value


def main():
    global SERVER
    ap = argparse.ArgumentParser()
    ap.add_argument("--server", required=True,
                    help="path of the ribltcached binary")
    args, rest = ap.parse_known_args()
    SERVER = os.path.abspath(args.server)
    if not os.access(SERVER, os.X_OK):
        sys.exit("not an executable: %s" % SERVER)
    unittest.main(argv=[sys.argv[0]] + rest, verbosity=2)
