"""Helpers of contrib/bench: free ports, waiting for a server, and the
results table.

    benchtable.py ports N            N distinct free TCP ports on 127.0.0.1
    benchtable.py wait PORT SECONDS  exit 0 once PORT answers `version`
    benchtable.py table INDEX        print the table of a run

INDEX has one line per client run: workload, server name, tool
(memtier or memaslap) and the file holding that run's output, separated
by tabs. memtier runs are read from their JSON file; memaslap runs from
its text output, whose latencies come as a log2 histogram, so their
percentiles are bucket bounds (printed with a `~`).
"""

import json
import math
import socket
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


def wait_ready(port, timeout):
    """True once 127.0.0.1:port answers `version`, polling every 50 ms
    for at most timeout seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port),
                                          timeout=1.0) as s:
                s.sendall(b"version\r\n")
                if s.recv(64).startswith(b"VERSION "):
                    return True
        except OSError:
            pass
        time.sleep(0.05)
    return False


def parse_memtier(path):
    """(ops/s, p50 ms, p99 ms, approximate?) of a memtier JSON file."""
    with open(path) as f:
        totals = json.load(f)["ALL STATS"]["Totals"]
    pct = totals.get("Percentile Latencies", {})
    return (float(totals["Ops/sec"]), pct.get("p50.00"), pct.get("p99.00"),
            False)


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
    buckets = {}
    in_total = in_dist = False
    for line in lines:
        s = line.strip()
        if s.startswith("Run time:") and "TPS:" in s:
            ops = float(s.split("TPS:")[1].split()[0])
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
            p99 / 1000.0 if p99 else None, True)


def fmt_ms(v, approx):
    if v is None:
        return "-"
    return ("~" if approx else "") + ("%.3f" % v)


def table(index_path, out=sys.stdout):
    """Prints one row per workload: each server's ops/s, p50 and p99 and
    the ribltcached/memcached ratio of ops/s. A run whose output cannot
    be read shows `failed`. Returns the number of such runs."""
    order = []
    results = {}
    failed = 0
    with open(index_path) as f:
        for line in f:
            parts = line.rstrip("\n").split("\t")
            if len(parts) != 4:
                continue
            workload, server, tool, path = parts
            if workload not in results:
                order.append(workload)
                results[workload] = {}
            try:
                parse = parse_memtier if tool == "memtier" else parse_memaslap
                results[workload][server] = parse(path)
            except (OSError, ValueError, KeyError, TypeError):
                results[workload][server] = None
                failed += 1
    header = ("workload", "ribltcached ops/s", "p50 ms", "p99 ms",
              "memcached ops/s", "p50 ms", "p99 ms", "ratio")
    rows = []
    for w in order:
        row = [w]
        for server in ("ribltcached", "memcached"):
            r = results[w].get(server)
            if r is None:
                row += ["failed", "-", "-"]
            else:
                row += ["%.0f" % r[0], fmt_ms(r[1], r[3]), fmt_ms(r[2], r[3])]
        a, b = results[w].get("ribltcached"), results[w].get("memcached")
        row.append("%.2f" % (a[0] / b[0]) if a and b and b[0] > 0 else "-")
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
    ratios = [float(r[-1]) for r in rows if r[-1] != "-"]
    if ratios:
        geo = math.exp(sum(math.log(x) for x in ratios) / len(ratios))
        out.write("geometric mean of the ratios: %.2f\n" % geo)
    return failed


def main(argv):
    if len(argv) == 3 and argv[1] == "ports":
        print(" ".join(str(p) for p in free_ports(int(argv[2]))))
        return 0
    if len(argv) == 4 and argv[1] == "wait":
        return 0 if wait_ready(int(argv[2]), float(argv[3])) else 1
    if len(argv) == 3 and argv[1] == "table":
        return 1 if table(argv[2]) else 0
    sys.stderr.write(__doc__)
    return 64


if __name__ == "__main__":
    sys.exit(main(sys.argv))
