#!/usr/bin/python3
"""The daemon's resident memory against its host pool size.

For each --pools size a ckptd is started (from --bin, storage root in a fresh work directory
under --dir) and, once it accepts a connection (it listens only after populating its pool), its
/proc/PID/status is read: VmRSS and its parts (RssAnon, RssFile, RssShmem). Then it is stopped.
What matters is RSS − pool: the daemon's own memory beside the pool it was asked for (an idle
daemon: no session, no step; a step's metadata is small next to the pool).

    PYTHONPATH=build/python /usr/bin/python3 bench/python/rss.py [--bin build/bin] [--dir /tmp]
        [--pools 256MiB,1GiB,2GiB,4GiB] [--json out.json]
"""
import argparse
import json
import os
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from stall import Daemon, fmt_size, loadavg, parse_size  # noqa: E402  (no torch needed here)

MiB = 1 << 20


def status_kib(pid):
    """{field: KiB} of the Vm*/Rss* lines of /proc/PID/status."""
    out = {}
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            key, _, value = line.partition(":")
            if key.startswith(("Vm", "Rss")) and value.strip().endswith("kB"):
                out[key] = int(value.split()[0])
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--bin", default="build/bin", help="directory holding ckptd")
    p.add_argument("--dir", default="/tmp", help="a fresh work directory is made here")
    p.add_argument("--pools", default="256MiB,1GiB,2GiB,4GiB", help="comma-separated pool sizes")
    p.add_argument("--ckptd-arg", action="append", default=[], help="extra ckptd argument")
    p.add_argument("--json", default="", help="write the results as JSON here")
    args = p.parse_args()

    if not os.path.exists(os.path.join(args.bin, "ckptd")):
        sys.exit("rss.py: no ckptd in %s (build the ckptd target, or --bin)" % args.bin)
    pools = [parse_size(s) for s in args.pools.split(",") if s]
    date = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    print("rss.py: %s, ckptd from %s; load average %s" % (date, args.bin, loadavg()))
    rows = []
    for pool in pools:
        work = tempfile.mkdtemp(prefix="ckpt-bench-rss.", dir=args.dir)
        daemon = Daemon(args.bin, work, pool, args.ckptd_arg)
        try:
            t0 = time.perf_counter()
            daemon.client("rss").close()  # answers once the pool is populated
            up_s = time.perf_counter() - t0
            st = status_kib(daemon.proc.pid)
        finally:
            daemon.stop()
            shutil.rmtree(work, ignore_errors=True)
        rss = st.get("VmRSS", 0) * 1024
        row = {"pool_bytes": pool, "rss_bytes": rss, "rss_anon_bytes": st.get("RssAnon", 0) * 1024,
               "rss_file_bytes": st.get("RssFile", 0) * 1024,
               "rss_shmem_bytes": st.get("RssShmem", 0) * 1024,
               "vm_hwm_bytes": st.get("VmHWM", 0) * 1024, "startup_s": up_s}
        rows.append(row)
        print("  pool %8s: RSS %6.0f MiB (anon %.0f, file %.0f, shmem %.0f), RSS - pool %+.0f MiB; "
              "up in %.2f s" % (fmt_size(pool), rss / MiB, row["rss_anon_bytes"] / MiB,
                                row["rss_file_bytes"] / MiB, row["rss_shmem_bytes"] / MiB,
                                (rss - pool) / MiB, up_s))
        sys.stdout.flush()
    table = [{"metric": "daemon RSS, pool %s" % fmt_size(r["pool_bytes"]),
              "ckptd": "%.0f MiB" % (r["rss_bytes"] / MiB),
              "baseline": "%.0f MiB pool" % (r["pool_bytes"] / MiB),
              "ratio": r["rss_bytes"] / r["pool_bytes"], "goal": "(info)", "met": None}
             for r in rows]
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"date": date, "loadavg_end": loadavg(), "pools": rows, "table": table}, f,
                      indent=2)
        print("JSON: %s" % args.json)


if __name__ == "__main__":
    main()
