"""Helpers of contrib/bench: free ports, waiting for a server, and the
results table.

    benchtable.py ports N            N distinct free TCP ports on 127.0.0.1
    benchtable.py wait PORT SECONDS [1]  exit 0 once PORT answers `version`
                                     (1: over TLS)
    benchtable.py table INDEX        print the table of a run

INDEX has one line per client run, fields separated by tabs: workload,
server name, tool (memtier or memaslap), the file holding that run's
output, the clock ticks the server used during the run, the ticks per
second, and "before after cores": the busy ticks of the client's cores
before and after the run and how many cores those are ("- - N" when the
client was not pinned). memtier runs are
read from their JSON file; memaslap runs from its text output, whose
latencies come as a log2 histogram, so their percentiles are bucket bounds
(printed with a `~`).
"""

import json
import math
import socket
import statistics
import sys
import time


def free_ports(n):
    """n distinct TCP ports on 127.0.0.1 that were free a moment ago."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def wait_ready(port, timeout, tls=False):
    """True once 127.0.0.1:port answers `version` (over TLS, without
    verifying the certificate, when tls), polling every 50 ms for at most
    timeout seconds."""
    deadline = time.monotonic() + timeout
    ctx = None
    if tls:
        import ssl
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port),
                                          timeout=1.0) as raw:
                s = ctx.wrap_socket(raw) if ctx else raw
                s.sendall(b"version\r\n")
                if s.recv(64).startswith(b"VERSION "):
                    return True
        except OSError:
            pass
        time.sleep(0.05)
    return False


def parse_memtier(path):
    """(ops/s, p50 ms, p99 ms, approximate?, requests, seconds) of a
    memtier JSON file."""
    with open(path) as f:
        stats = json.load(f)["ALL STATS"]
    totals = stats["Totals"]
    pct = totals.get("Percentile Latencies", {})
    ms = stats.get("Runtime", {}).get("Total duration")
    return (float(totals["Ops/sec"]), pct.get("p50.00"), pct.get("p99.00"),
            False, totals.get("Count"), ms / 1000.0 if ms else None)


def log2_percentile(buckets, q):
    """Upper bound in microseconds of the log2 bucket holding quantile q;
    buckets maps exponent k to the count of latencies in [2^k, 2^(k+1))."""
    total = sum(buckets.values())
    if total == 0:
        return None
    want = q * total
    seen = 0
    for k in sorted(buckets):
        seen += buckets[k]
        if seen >= want:
            return float(2 ** (k + 1))
    return float(2 ** (max(buckets) + 1))


def parse_memaslap(path):
    """(ops/s, p50 ms, p99 ms, approximate?) of a memaslap text output
    (run with -S so that it prints its 'Total Statistics' histogram)."""
    with open(path, errors="replace") as f:
        lines = f.read().splitlines()
    ops = None
    count = None
    secs = None
    buckets = {}
    in_total = in_dist = False
    for line in lines:
        s = line.strip()
        if s.startswith("Run time:") and "TPS:" in s:
            ops = float(s.split("TPS:")[1].split()[0])
            if "Ops:" in s:
                count = int(s.split("Ops:")[1].split()[0])
            secs = float(s.split("Run time:")[1].split()[0].rstrip("s"))
        if s.startswith("Total Statistics ("):
            in_total, in_dist = True, False
            continue
        if in_total and s.startswith("Log2 Dist:"):
            in_dist = True
            continue
        if in_dist:
            head, _, rest = s.partition(":")
            if not head.isdigit() or not rest.strip():
                in_total = in_dist = False
                continue
            for i, count in enumerate(rest.split()):
                buckets[int(head) + i] = int(count)
    if ops is None:
        raise ValueError("no throughput line in %s" % path)
    p50 = log2_percentile(buckets, 0.50)
    p99 = log2_percentile(buckets, 0.99)
    return (ops, p50 / 1000.0 if p50 else None,
            p99 / 1000.0 if p99 else None, True, count, secs)


def fmt_ms(v, approx):
    if v is None:
        return "-"
    return ("~" if approx else "") + ("%.3f" % v)


def read_index(index_path):
    """Workloads in order of appearance, and for each workload and server
    the list of its runs as dicts (None for a run that cannot be read);
    the second value is the number of such runs."""
    order = []
    runs = {}
    failed = 0
    with open(index_path) as f:
        for line in f:
            parts = line.rstrip("\n").split("\t")
            if len(parts) != 7:
                continue
            workload, server, tool, path, ticks, hz, cores = parts
            if workload not in runs:
                order.append(workload)
                runs[workload] = {}
            try:
                parse = parse_memtier if tool == "memtier" else parse_memaslap
                ops, p50, p99, approx, count, secs = parse(path)
            except (OSError, ValueError, KeyError, TypeError):
                runs[workload].setdefault(server, []).append(None)
                failed += 1
                continue
            run = {"ops": ops, "p50": p50, "p99": p99, "approx": approx,
                   "us_per_req": None, "client_busy": None}
            if count and int(hz) > 0:
                run["us_per_req"] = int(ticks) / int(hz) * 1e6 / count
            c = cores.split()
            if (len(c) == 3 and "-" not in c and secs and int(c[2]) > 0
                    and int(hz) > 0):
                busy = (int(c[1]) - int(c[0])) / int(hz)
                # Start-up and shutdown fall in the window too: cap at 1.
                run["client_busy"] = min(1.0, busy / (secs * int(c[2])))
            runs[workload].setdefault(server, []).append(run)
    return order, runs, failed


def median_of(runs, key):
    vals = [r[key] for r in runs if r is not None and r[key] is not None]
    return statistics.median(vals) if vals else None


def table(index_path, out=sys.stdout):
    """Prints one row per workload: each server's median ops/s, p50, p99
    and server CPU microseconds per request over its runs, the ratio of
    the median ops/s (ribltcached / memcached), the lowest and highest
    ratio of a run to the memcached run next to it, the ratio of the
    median CPU per request (ribltcached / memcached), and how busy the
    client's cores were (median over all runs of the workload). A server
    with no readable run shows `failed`. Returns the number of runs that
    could not be read."""
    order, runs, failed = read_index(index_path)
    header = ("workload", "ribltcached ops/s", "p50 ms", "p99 ms", "us/req",
              "memcached ops/s", "p50 ms", "p99 ms", "us/req", "ratio",
              "run ratios", "cpu ratio", "client busy")
    rows = []
    for w in order:
        row = [w]
        for server in ("ribltcached", "memcached"):
            rs = [r for r in runs[w].get(server, []) if r is not None]
            if not rs:
                row += ["failed", "-", "-", "-"]
                continue
            approx = any(r["approx"] for r in rs)
            us = median_of(rs, "us_per_req")
            row += ["%.0f" % median_of(rs, "ops"),
                    fmt_ms(median_of(rs, "p50"), approx),
                    fmt_ms(median_of(rs, "p99"), approx),
                    "%.1f" % us if us is not None else "-"]
        a = median_of(runs[w].get("ribltcached", []), "ops")
        b = median_of(runs[w].get("memcached", []), "ops")
        row.append("%.2f" % (a / b) if a and b else "-")
        pairs = [x["ops"] / y["ops"] for x, y in
                 zip(runs[w].get("ribltcached", []),
                     runs[w].get("memcached", []))
                 if x is not None and y is not None and y["ops"] > 0]
        row.append("%.2f-%.2f" % (min(pairs), max(pairs)) if pairs else "-")
        ua = median_of(runs[w].get("ribltcached", []), "us_per_req")
        ub = median_of(runs[w].get("memcached", []), "us_per_req")
        row.append("%.2f" % (ua / ub) if ua and ub else "-")
        busy = median_of([r for rs in runs[w].values() for r in rs
                          if r is not None], "client_busy")
        row.append("%.0f%%" % (100 * busy) if busy is not None else "-")
        rows.append(row)
    widths = [max(len(str(r[i])) for r in rows + [header])
              for i in range(len(header))]

    def emit(r):
        cells = [str(r[0]).ljust(widths[0])]
        cells += [str(c).rjust(widths[i + 1]) for i, c in enumerate(r[1:])]
        out.write("  ".join(cells).rstrip() + "\n")
    emit(header)
    emit(["-" * w for w in widths])
    for r in rows:
        emit(r)
    ratios = [float(r[9]) for r in rows if r[9] != "-"]
    if ratios:
        geo = math.exp(sum(math.log(x) for x in ratios) / len(ratios))
        out.write("geometric mean of the ratios: %.2f\n" % geo)
    cpu = [float(r[11]) for r in rows if r[11] != "-"]
    if cpu:
        geo = math.exp(sum(math.log(x) for x in cpu) / len(cpu))
        out.write("geometric mean of the cpu ratios: %.2f\n" % geo)
    return failed


def main(argv):
    if len(argv) == 3 and argv[1] == "ports":
        print(" ".join(str(p) for p in free_ports(int(argv[2]))))
        return 0
    if len(argv) in (4, 5) and argv[1] == "wait":
        tls = len(argv) == 5 and argv[4] == "1"
        return 0 if wait_ready(int(argv[2]), float(argv[3]), tls) else 1
    if len(argv) == 3 and argv[1] == "table":
        return 1 if table(argv[2]) else 0
    sys.stderr.write(__doc__)
    return 64


if __name__ == "__main__":
    sys.exit(main(sys.argv))
