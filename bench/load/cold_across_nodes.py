#!/usr/bin/env python3
"""A whole job's cold load from throttled storage on 4 nodes: read once per job vs once per node.

One ckpt-coordinator and 4 ckptd on this machine (the nodes), one shared storage root (the
parallel filesystem). A data-parallel job of 4 ranks (ckpt_coordinator_rank, one per node, each
holding the full state) saves step 1; then, per round and mode, 4 fresh daemons (nothing in
memory) start inside one blkio cgroup whose read bandwidth on the root's disk is capped
(--throttle: every daemon shares it, like nodes sharing a PFS), the page cache is dropped, and the
4 ranks load step 1 at once. The two modes, same run, alternating:

  per-node  daemons without --peer-listen: the coordinator's plan can name no node to serve,
            so every node reads all it needs (what ckptd did before cold loads were planned)
  planned   daemons with --peer-listen: each stored byte several nodes need is read by one and
            fetched by the others over the data plane (docs/design.md §4.7)

Reported per mode: the job's load, from the first rank's Load call to the last one's return
(the ranks print both on the machine's monotonic clock); the wall time from starting the 4 rank
processes to the last one done (each also registers its tensors before and checks every element
after); the mean time of one load in the daemons (ckptd_load_duration_seconds, the plan's wait
included); and the daemons' storage reads (ckptd_read_bytes_total{source="storage"}, summed) over
the step's unique bytes. Needs root (cgroup, drop_caches).

The ranks load in step: all have registered and filled their memory before the first Load call,
and none checks what it loaded before the last Load returned. The 4 "nodes" share this machine's
cores, and on real nodes a rank's own work does not take another node's cores; --overlapped lets
each rank go on as soon as it can instead (the only way before 2026-11-29).

  sudo /usr/bin/python3 bench/load/cold_across_nodes.py [--bin build/bin] [--tensors 88]
       [--throttle 200MiB] [--rounds 2] [--overlapped] [--json out.json]
"""
import argparse
import json
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

NODES = 4
JOB = "coldbench"
WORK = None
CGROUP = "/sys/fs/cgroup/blkio/ckptd-cold-bench"


def parse_bytes(text):
    m = re.fullmatch(r"(\d+)(KiB|MiB|GiB)?", text)
    if not m:
        raise argparse.ArgumentTypeError("bytes like 200MiB, not %r" % text)
    return int(m.group(1)) * {None: 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}[m.group(2)]


def unique_bytes(tensors):  # tests/integration/coordinator_model.h: UniqueBytes
    return 64 * 1024 * 4 + sum(16 * (k + 1) * 1024 * 4 for k in range(tensors))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(predicate, what, timeout=60.0):
    deadline = time.monotonic() + timeout
    pause = 0.005
    while not predicate():
        if time.monotonic() > deadline:
            sys.exit("cold_across_nodes: timed out waiting for %s (logs in %s)" % (what, WORK))
        time.sleep(pause)  # polling a child's readiness, with backoff
        pause = min(pause * 2, 0.1)


def disk_of(path):
    st = os.stat(path)
    return "%d:%d" % (os.major(st.st_dev), os.minor(st.st_dev))


def throttle_reads(path, bytes_per_s):
    """Caps the cgroup's reads of the disk that holds `path`."""
    with open(os.path.join(CGROUP, "blkio.throttle.read_bps_device"), "w") as f:
        f.write("%s %d" % (disk_of(path), bytes_per_s))


def drop_page_cache():
    subprocess.run(["sync"], check=True)
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3")


def wait_ready(daemon):
    wait_for(lambda: b" ready" in open(daemon["log"], "rb").read(), "a daemon's 'ready'")


def metrics_page(daemon):
    return urllib.request.urlopen("http://%s/metrics" % daemon["metrics"]).read().decode()


def sample(page, series):
    """One series' value on a /metrics page (0 when absent)."""
    m = re.search("^" + re.escape(series) + r" (\S+)$", page, re.M)
    return float(m.group(1)) if m else 0.0


def job_load_seconds(outs):
    """The job's load: first Load call started → last one returned (ranks' clocks)."""
    spans = [tuple(int(x) for x in re.search(r"load_ns (\d+) (\d+)", o).groups()) for o in outs]
    return (max(e for _, e in spans) - min(b for b, _ in spans)) / 1e9


class Cluster:
    """The coordinator and, per start(), 4 fresh daemons."""

    def __init__(self, args, work):
        self.args, self.work = args, work
        self.root = os.path.join(work, "root")
        self.coordinator = None
        self.daemons = []

    def start_coordinator(self):
        sock = os.path.join(self.work, "coordinator.sock")
        log = open(os.path.join(self.work, "coordinator.log"), "ab")
        self.coordinator = subprocess.Popen(
            [os.path.join(self.args.bin, "ckpt-coordinator"), "--listen", "unix:" + sock,
             "--storage-root", self.root, "--log-level", "warn"], stdout=log, stderr=log)
        wait_for(lambda: os.path.exists(sock), "the coordinator's socket")
        self.coordinator_address = "unix:" + sock

    def start_daemon(self, tag, node_id, peer, cgroup, extra=()):
        """One fresh daemon, not waited for (wait_ready); `extra`: more ckptd flags."""
        sock = os.path.join(self.work, "%s-%s.sock" % (tag, node_id))
        logpath = os.path.join(self.work, "%s-%s.log" % (tag, node_id))
        metrics = "127.0.0.1:%d" % free_port()
        cmd = [os.path.join(self.args.bin, "ckptd"), "--socket", sock, "--storage-root",
               self.root, "--node-id", node_id, "--coordinator", self.coordinator_address,
               "--host-pool", self.args.host_pool, "--metrics", metrics, "--log-level", "info",
               "--admin", "unix:" + sock + ".admin"]
        if peer:
            cmd += ["--peer-listen", "127.0.0.1:0"]
        cmd += list(extra)
        log = open(logpath, "ab")
        # Into the throttled cgroup before exec: the daemon and its threads are in it.
        pre = (lambda: open(os.path.join(CGROUP, "cgroup.procs"), "w").write(
            str(os.getpid()))) if cgroup else None
        proc = subprocess.Popen(cmd, stdout=log, stderr=log, preexec_fn=pre)
        return {"proc": proc, "socket": sock, "log": logpath, "metrics": metrics,
                "node": node_id}

    def start_daemons(self, tag, peer, cgroup, extra=()):
        self.daemons = []
        for i in range(NODES):  # one by one: what started is in self.daemons, to be killed
            self.daemons.append(self.start_daemon(tag, "n%d" % i, peer, cgroup, extra))
        for d in self.daemons:
            wait_ready(d)

    def stop_daemons(self):
        for d in self.daemons:
            d["proc"].send_signal(signal.SIGTERM)
        for d in self.daemons:
            d["proc"].wait(timeout=120)
        self.daemons = []

    def ranks(self, mode, extra):
        """Runs one rank per daemon to the end; their outputs. A load moves in step (unless
        --overlapped): every rank registered and filled before the first loads, every load
        returned before the first checks what it loaded."""
        in_step = mode == "load" and not self.args.overlapped
        procs = []
        for i, d in enumerate(self.daemons):
            procs.append(subprocess.Popen(
                [os.path.join(self.args.bin, "ckpt_coordinator_rank"), mode, "--socket",
                 d["socket"], "--job", JOB, "--rank", str(i), "--world-size", str(NODES),
                 "--tp", "1", "--tensors", str(self.args.tensors)] + extra +
                (["--in-step"] if in_step else []),
                stdin=subprocess.PIPE if in_step else subprocess.DEVNULL,
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
        heard = [b""] * len(procs)
        for gate in (("ready", "loaded") if in_step else ()):
            for i, p in enumerate(procs):
                while True:  # other lines (a log line) may come first
                    line = p.stdout.readline()
                    heard[i] += line
                    if not line or line.decode(errors="replace").strip() == gate:
                        break
                if not line:
                    for q in procs:
                        q.kill()
                    sys.exit("cold_across_nodes: rank %d ended before %r:\n%s" % (
                        i, gate, (heard[i] + p.communicate()[0]).decode(errors="replace")))
            for p in procs:
                p.stdin.write(b"go\n")
                p.stdin.flush()
        outs = [(h + p.communicate()[0]).decode() for h, p in zip(heard, procs)]
        for p, out in zip(procs, outs):
            if p.returncode != 0:
                sys.exit("cold_across_nodes: a rank failed (%d):\n%s" % (p.returncode, out))
        return outs

    def scrape(self):
        """(storage bytes read by all daemons, mean seconds of one load in the daemons)"""
        reads = seconds = count = 0.0
        for d in self.daemons:
            page = metrics_page(d)
            reads += sample(page, 'ckptd_read_bytes_total{source="storage"}')
            seconds += sample(page, "ckptd_load_duration_seconds_sum")
            count += sample(page, "ckptd_load_duration_seconds_count")
        return reads, seconds / max(count, 1)


def add_cluster_args(ap, doc, host_pool):
    """The options of a 4-node run on this machine (this script's, and bench/peer's)."""
    ap.description = doc
    ap.formatter_class = argparse.RawDescriptionHelpFormatter
    ap.add_argument("--bin", default="build/bin")
    ap.add_argument("--dir", default="/tmp")
    ap.add_argument("--tensors", type=int, default=88, help="88: ~245 MiB of unique state")
    ap.add_argument("--throttle", type=parse_bytes, default=parse_bytes("200MiB"),
                    help="read bytes/s of the storage disk, shared by the 4 daemons")
    ap.add_argument("--host-pool", default=host_pool)
    ap.add_argument("--overlapped", action="store_true",
                    help="let each rank fill its memory, load and check it as soon as it can, "
                         "overlapping other ranks' loads on this machine's shared cores (before "
                         "2026-11-29 the only way)")


def main():
    ap = argparse.ArgumentParser()
    add_cluster_args(ap, __doc__, "512MiB")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--json")
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("cold_across_nodes: needs root (blkio cgroup, drop_caches)")
    global WORK
    work = WORK = tempfile.mkdtemp(prefix="ckptd-cold-bench-", dir=args.dir)
    cluster = Cluster(args, work)
    os.makedirs(CGROUP, exist_ok=True)
    unique = unique_bytes(args.tensors)
    results = {"per-node": [], "planned": []}
    try:
        cluster.start_coordinator()
        os.makedirs(cluster.root, exist_ok=True)
        throttle_reads(cluster.root, args.throttle)
        cluster.start_daemons("save", peer=False, cgroup=False)
        cluster.ranks("save", ["--steps", "1"])
        cluster.stop_daemons()
        for r in range(args.rounds):
            for mode in ("per-node", "planned"):
                drop_page_cache()
                cluster.start_daemons("%s-%d" % (mode, r), peer=(mode == "planned"), cgroup=True)
                t0 = time.monotonic()
                outs = cluster.ranks("load", ["--step", "1"])
                seconds = time.monotonic() - t0
                load_seconds = job_load_seconds(outs)
                reads, daemon_seconds = cluster.scrape()
                cluster.stop_daemons()
                results[mode].append({"seconds": seconds, "load_seconds": load_seconds,
                                      "daemon_load_seconds": daemon_seconds,
                                      "storage_bytes": reads})
                print("round %d %-8s  %6.2f s, the job's load %5.2f s (one in a daemon: %5.2f s)  "
                      "storage reads %.2f x unique" % (r, mode, seconds, load_seconds,
                                                       daemon_seconds, reads / unique), flush=True)
    finally:
        for d in cluster.daemons:
            d["proc"].kill()
        if cluster.coordinator:
            cluster.coordinator.kill()
        try:
            os.rmdir(CGROUP)
        except OSError:
            pass
    med = {m: statistics.median(x["seconds"] for x in v) for m, v in results.items()}
    load = {m: statistics.median(x["load_seconds"] for x in v) for m, v in results.items()}
    reads = {m: statistics.median(x["storage_bytes"] for x in v) / unique
             for m, v in results.items()}
    summary = {"nodes": NODES, "unique_bytes": unique, "throttle_bytes_per_s": args.throttle,
               "ranks_in_step": not args.overlapped,
               "rounds": results, "median_seconds": med, "storage_reads_over_unique": reads,
               "median_load_seconds": load,
               "time_ratio_planned_over_per_node": med["planned"] / med["per-node"],
               "load_ratio_planned_over_per_node": load["planned"] / load["per-node"]}
    print("median: per-node %.2f s (the job's load %.2f s, reads %.2f x), planned %.2f s (the "
          "job's load %.2f s, reads %.2f x): ratio %.2f (the job's load %.2f)"
          % (med["per-node"], load["per-node"], reads["per-node"], med["planned"],
             load["planned"], reads["planned"], summary["time_ratio_planned_over_per_node"],
             summary["load_ratio_planned_over_per_node"]))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=1)


if __name__ == "__main__":
    main()
