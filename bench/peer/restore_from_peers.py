#!/usr/bin/env python3
"""A lost node's job restored from the peer-memory tier vs the same job's cold load from storage.

What is measured, and why. The peer-memory tier (proto/README.md §4.1) copies each persisted
rank's data file into another node's memory, so that when a node dies the job restarts without
reading storage: the survivors still hold their own files in their hot caches, the lost node's
file is in its holder's peer pool, and a load planned by the coordinator fetches every such file
from memory over the data plane. On a shared parallel filesystem a restart's time is storage
bandwidth; this benchmark asks how much of it the tier saves, against the best a restore from
storage does here: the planned cold load of bench/load/cold_across_nodes.py, which reads each
stored byte once per job (goal: the tier's restore at least 3x faster).

One machine plays 4 nodes: one ckpt-coordinator and 4 ckptd over one storage root, every daemon
inside one blkio cgroup whose read bandwidth on the root's disk is capped (--throttle, shared by
all, like nodes sharing a PFS). A data-parallel job of 4 ranks (ckpt_coordinator_rank, one per
node, each holding the full state). Per round, same job and bytes, the two modes in turn:

  peer  a fresh coordinator and 4 daemons with the tier (--peer-listen, --peer-pool, --replicas
        1); once each has its holder, the ranks save steps 1 and 2 (--step) and wait until each
        is replicated;
        node n0 is SIGKILLed (its memory is gone), a fresh daemon "n0-new" takes its place, the
        page cache is dropped, and the 4 ranks load step 2 (rank 0 on the replacement, ranks 1-3
        on the survivors)
  cold  then, over the same storage root (the very files the peer mode saved), a fresh
        coordinator and 4 fresh daemons with a data plane but nothing in memory: the cold
        script's "planned" mode, after the page cache is dropped

Reported per mode (medians over rounds): the job's load, from the first rank's Load call to the
last one's return (the ranks print both on the machine's monotonic clock); the ranks' run, from
starting the 4 rank processes to the last one done (each also registers before and checks every
element after); the mean load in a daemon (ckptd_load_duration_seconds); the live daemons'
storage reads (ckptd_read_bytes_total{source="storage"}) and bytes received over the data plane
(ckptd_peer_bytes_total{direction="received"}) during the load, over the step's unique bytes;
and the ratio cold / peer of the job's load. The ranks load in step, as in the cold script (all
filled before the first Load, none checking before the last returned; --overlapped: not).

Replication throughput, from the peer mode's save: the bytes the daemons sent over the data plane
(every one a PUT to a holder: no load has run yet) over the time from the first rank persisted to
the step replicated. Not from "committed": a node starts replicating a rank as soon as it
persisted, and a step may be replicated before its commit. Each rank (--wait-replicated) waits
for persisted, committed, replicated in turn and notes when each wait returned, so the window is
an upper bound and the throughput a lower bound, of 4 senders at once on the machine's cores.
Beside it, when iperf3 is on PATH, one TCP stream over loopback for 3 s (iperf3 -c 127.0.0.1 -t 3)
in the same run; without iperf3 that baseline is skipped, and said so.

Not measured: a real network, real nodes with their own cores and memory bandwidth, and waiting
for the coordinator to declare n0 lost (its watch stream closes when it dies, and from then on no
plan names it; the lease, 10 s, is not waited for). Needs root (cgroup v1 blkio, drop_caches).

  sudo /usr/bin/python3 bench/peer/restore_from_peers.py [--bin build/bin] [--tensors 88]
       [--throttle 200MiB] [--host-pool 1GiB] [--peer-pool 1GiB] [--rounds 2] [--overlapped]
       [--json out.json]
"""
import argparse
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "load"))
import cold_across_nodes as cold  # noqa: E402  (Cluster, the cgroup, metrics, the job's load)

cold.JOB = "peerbench"
cold.CGROUP = "/sys/fs/cgroup/blkio/ckptd-peer-bench"  # not the cold script's: both may exist
GOAL = 3.0  # cold / peer, the job's load
MIB = float(1 << 20)
SERIES = {"storage": 'ckptd_read_bytes_total{source="storage"}',
          "sent": 'ckptd_peer_bytes_total{direction="sent"}',
          "received": 'ckptd_peer_bytes_total{direction="received"}'}
CLUSTERS = []  # every cluster started, for the teardown


def fail(message):
    sys.exit("restore_from_peers: %s (logs in %s)" % (message, cold.WORK))


# ---- the daemons' side: flags, admin status, metrics ----

def tier_flags(args):
    """The peer-memory tier, besides --peer-listen (Cluster's peer=True)."""
    return ["--peer-pool", args.peer_pool, "--replicas", "1"]


def status(args, daemon):
    """The daemon's admin status (GetStatus) as ckptctl --json prints it, or None."""
    run = subprocess.run([os.path.join(args.bin, "ckptctl"), "--json", "--admin",
                          "unix:" + daemon["socket"] + ".admin", "status"],
                         capture_output=True, timeout=60)
    return json.loads(run.stdout) if run.returncode == 0 else None


def peer_status(args, daemon):
    return (status(args, daemon) or {}).get("peer", {})


def wait_for_holders(args, daemons):
    """Until each daemon heard its holder from the coordinator (a save before that is not
    replicated: "0 of the 1 holder(s)")."""
    for d in daemons:
        cold.wait_for(lambda d=d: len(peer_status(args, d).get("holders", [])) >= 1,
                      "node %s's holder" % d["node"])


def totals(daemons):
    """Storage reads and data-plane bytes sent and received, summed over the daemons."""
    sums = dict.fromkeys(SERIES, 0.0)
    for d in daemons:
        page = cold.metrics_page(d)
        for key, series in SERIES.items():
            sums[key] += cold.sample(page, series)
    return sums


def stop(cluster):
    cluster.stop_daemons()
    cluster.coordinator.send_signal(signal.SIGTERM)
    cluster.coordinator.wait(timeout=60)
    cluster.coordinator = None


def teardown():
    procs = []
    for cluster in CLUSTERS:
        procs += [d["proc"] for d in cluster.daemons]
        procs += [cluster.coordinator] if cluster.coordinator else []
    for proc in procs:
        proc.kill()
    for proc in procs:
        proc.wait()  # reaped, so that the cgroup is empty and goes
    try:
        os.rmdir(cold.CGROUP)
    except OSError:
        pass


# ---- the steps of a round ----

def step_data_bytes(root, step):
    """The sizes of a step's data files: what its replication sends, gaps between slots aside."""
    d = os.path.join(root, cold.JOB, "step-%010d" % step)
    return float(sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d)
                     if f.endswith(".data")))


def save_and_replicate(args, cluster):
    """The ranks save steps 1..args.step in one run (the first save writes every replica, the
    next ones follow the writer plan: each shard once) and wait for each to be replicated; what
    replicating the last one took."""
    steps = ",".join(str(s) for s in range(1, args.step + 1))
    t0 = time.monotonic()
    outs = cluster.ranks("save", ["--steps", steps, "--wait-replicated"])
    save_seconds = time.monotonic() - t0
    marks = []
    for out in outs:
        m = re.search(r"step %d replicated persisted_ns (\d+) committed_ns (\d+) "
                      r"replicated_ns (\d+)" % args.step, out)
        if not m:
            fail("step %d was not committed and replicated:\n%s" % (args.step, out))
        marks.append([int(x) for x in m.groups()])
    persisted = min(p for p, _, _ in marks)
    committed = max(c for _, c, _ in marks)
    replicated = max(r for _, _, r in marks)
    window = (replicated - persisted) / 1e9
    sent = step_data_bytes(cluster.root, args.step)
    return {"save_seconds": save_seconds, "replicated_bytes": sent,
            "held_bytes": sum(int(peer_status(args, d).get("held_bytes", 0))
                              for d in cluster.daemons),
            "persisted_to_replicated_seconds": window,
            "committed_to_replicated_seconds": max(0.0, (replicated - committed) / 1e9),
            "replication_bytes_per_s": sent / window if window > 0 else None}


def lose_node_0(args, cluster):
    """SIGKILL n0 (its hot cache and peer pool die with it); a fresh n0-new takes its rank."""
    lost = cluster.daemons[0]
    lost["proc"].kill()
    lost["proc"].wait()
    cluster.daemons[0] = cluster.start_daemon("replacement", "n0-new", peer=True, cgroup=True,
                                              extra=tier_flags(args))
    cold.wait_ready(cluster.daemons[0])
    wait_for_holders(args, cluster.daemons[:1])  # it registered with the coordinator


def measure_load(args, cluster):
    """Drops the page cache, then the 4 ranks load step args.step at once."""
    cold.drop_page_cache()
    before = totals(cluster.daemons)
    t0 = time.monotonic()
    outs = cluster.ranks("load", ["--step", str(args.step)])
    seconds = time.monotonic() - t0
    after = totals(cluster.daemons)
    _, daemon_seconds = cluster.scrape()
    return {"seconds": seconds, "load_seconds": cold.job_load_seconds(outs),
            "daemon_load_seconds": daemon_seconds,
            "storage_bytes": after["storage"] - before["storage"],
            "peer_received_bytes": after["received"] - before["received"]}


def peer_round(args, work, r):
    """Save, replicate, lose n0, restore. Returns (the result, the storage root it saved to)."""
    cluster = cold.Cluster(args, os.path.join(work, "round-%d" % r, "peer"))
    CLUSTERS.append(cluster)
    os.makedirs(cluster.root)
    cluster.start_coordinator()
    cluster.start_daemons("tier", peer=True, cgroup=True, extra=tier_flags(args))
    wait_for_holders(args, cluster.daemons)
    result = save_and_replicate(args, cluster)
    lose_node_0(args, cluster)
    result.update(measure_load(args, cluster))
    stop(cluster)
    return result, cluster.root


def cold_round(args, work, r, root):
    """The cold script's planned mode over `root`: a fresh coordinator and 4 fresh daemons."""
    cluster = cold.Cluster(args, os.path.join(work, "round-%d" % r, "cold"))
    CLUSTERS.append(cluster)
    cluster.root = root
    os.makedirs(cluster.work)
    cluster.start_coordinator()  # its recovery scan finds the steps committed
    cluster.start_daemons("planned", peer=True, cgroup=True)
    result = measure_load(args, cluster)
    stop(cluster)
    return result


# ---- the baseline ----

def listening(port):
    """Whether some socket listens on TCP `port` (without connecting to it)."""
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            rows = open(table).read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            local, state = row.split()[1], row.split()[3]
            if state == "0A" and int(local.rsplit(":", 1)[1], 16) == port:
                return True
    return False


def tcp_loopback_bytes_per_s():
    """One TCP stream over loopback for 3 s (iperf3), or None when iperf3 is not on PATH."""
    exe = shutil.which("iperf3")
    if not exe:
        print("note: iperf3 is not on PATH: no raw TCP loopback baseline for the replication "
              "throughput (skipped)", flush=True)
        return None
    port = cold.free_port()
    server = subprocess.Popen([exe, "-s", "-p", str(port)], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    try:
        cold.wait_for(lambda: listening(port), "iperf3's server")
        run = subprocess.run([exe, "-c", "127.0.0.1", "-p", str(port), "-t", "3", "-J"],
                             capture_output=True, timeout=60)
        if run.returncode != 0:
            fail("iperf3 -c failed:\n" + run.stdout.decode() + run.stderr.decode())
        return json.loads(run.stdout)["end"]["sum_received"]["bits_per_second"] / 8
    finally:
        server.kill()
        server.wait()


# ---- report ----

def median(rows, key):
    values = [x[key] for x in rows if x.get(key) is not None]
    return statistics.median(values) if values else None


def summarise(args, results, unique, tcp):
    modes = list(results)
    load = {m: median(results[m], "load_seconds") for m in modes}
    return {
        "nodes": cold.NODES, "unique_bytes": unique, "throttle_bytes_per_s": args.throttle,
        "host_pool": args.host_pool, "peer_pool": args.peer_pool,
        "ranks_in_step": not args.overlapped, "rounds": results,
        "median_seconds": {m: median(results[m], "seconds") for m in modes},
        "median_load_seconds": load,
        "median_daemon_load_seconds": {m: median(results[m], "daemon_load_seconds")
                                       for m in modes},
        "storage_reads_over_unique": {m: median(results[m], "storage_bytes") / unique
                                      for m in modes},
        "peer_received_over_unique": {m: median(results[m], "peer_received_bytes") / unique
                                      for m in modes},
        "load_ratio_cold_over_peer": load["cold"] / load["peer"],
        "goal_load_ratio": GOAL,
        "replication": {k: median(results["peer"], k) for k in (
            "replicated_bytes", "held_bytes", "persisted_to_replicated_seconds",
            "committed_to_replicated_seconds", "replication_bytes_per_s", "save_seconds")},
        "tcp_loopback_bytes_per_s": tcp,
    }


def print_round(r, mode, x, unique):
    line = ("round %d %-4s  %6.2f s, the job's load %5.2f s (one in a daemon: %5.2f s)  "
            "storage reads %.2f x unique, from peers %.2f x" % (
                r, mode, x["seconds"], x["load_seconds"], x["daemon_load_seconds"],
                x["storage_bytes"] / unique, x["peer_received_bytes"] / unique))
    if mode == "peer":
        line += "; replicated %.0f MiB in %.2f s" % (x["replicated_bytes"] / MIB,
                                                     x["persisted_to_replicated_seconds"])
    print(line, flush=True)


def print_table(s):
    print("\n| mode | storage reads / unique | from peers / unique | the job's load "
          "| the ranks' run | one load in a daemon |")
    print("|---|--:|--:|--:|--:|--:|")
    for mode, name in (("cold", "cold (planned)"), ("peer", "peer (n0 lost)")):
        print("| %s | %.2fx | %.2fx | %.2f s | %.2f s | %.2f s |" % (
            name, s["storage_reads_over_unique"][mode], s["peer_received_over_unique"][mode],
            s["median_load_seconds"][mode], s["median_seconds"][mode],
            s["median_daemon_load_seconds"][mode]))
    ratio = s["load_ratio_cold_over_peer"]
    print("\ncold / peer, the job's load: %.2fx (goal >= %.0fx: %s)"
          % (ratio, GOAL, "met" if ratio >= GOAL else "missed"))
    rep = s["replication"]
    line = "replication of the last step: %.0f MiB sent, held %.0f MiB, in %.2f s (first rank " \
           "persisted -> step replicated; committed -> replicated %.2f s)" % (
               rep["replicated_bytes"] / MIB, rep["held_bytes"] / MIB,
               rep["persisted_to_replicated_seconds"], rep["committed_to_replicated_seconds"])
    if rep["replication_bytes_per_s"]:
        line += ": %.0f MiB/s, %d senders at once" % (rep["replication_bytes_per_s"] / MIB,
                                                     cold.NODES)
    print(line)
    tcp = s["tcp_loopback_bytes_per_s"]
    print("TCP loopback, one stream (iperf3 -t 3): " +
          ("%.0f MiB/s" % (tcp / MIB) if tcp else "not measured (iperf3 not on PATH)"))


# ---- main ----

def preflight(args):
    for exe in ("ckptd", "ckpt-coordinator", "ckpt_coordinator_rank", "ckptctl"):
        if not os.access(os.path.join(args.bin, exe), os.X_OK):
            sys.exit("restore_from_peers: no %s in %s (--bin)" % (exe, args.bin))
    helptext = subprocess.run([os.path.join(args.bin, "ckpt_coordinator_rank"), "--help"],
                              capture_output=True).stdout.decode()
    if "--wait-replicated" not in helptext:
        sys.exit("restore_from_peers: %s/ckpt_coordinator_rank has no --wait-replicated: "
                 "rebuild it" % args.bin)
    if os.geteuid() != 0:
        sys.exit("restore_from_peers: needs root (blkio cgroup, drop_caches)")


def main():
    ap = argparse.ArgumentParser()
    # --host-pool: twice the cold script's, since a survivor keeps its step in its hot cache and
    # takes what it fetches there too (a full pool reads storage).
    cold.add_cluster_args(ap, __doc__, "1GiB")
    ap.add_argument("--peer-pool", default="1GiB",
                    help="each daemon's budget for other nodes' copies (a holder may hold for two "
                         "nodes, two steps each)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--step", type=int, default=2,
                    help="steps 1..STEP are saved and STEP restored: from step 2 on, the writer "
                         "plan spreads the shards over the ranks' files (step 1 is written by "
                         "every rank, and rank 0's file alone is restored)")
    ap.add_argument("--json")
    args = ap.parse_args()
    preflight(args)
    work = cold.WORK = tempfile.mkdtemp(prefix="ckptd-peer-bench-", dir=args.dir)
    unique = cold.unique_bytes(args.tensors)
    results = {"peer": [], "cold": []}
    os.makedirs(cold.CGROUP, exist_ok=True)
    try:
        cold.throttle_reads(work, args.throttle)  # every round's root is under `work`
        tcp = tcp_loopback_bytes_per_s()
        for r in range(args.rounds):
            peer, root = peer_round(args, work, r)
            results["peer"].append(peer)
            print_round(r, "peer", peer, unique)
            results["cold"].append(cold_round(args, work, r, root))
            print_round(r, "cold", results["cold"][-1], unique)
            shutil.rmtree(root)  # the step's files; the logs stay in `work`
    finally:
        teardown()
    summary = summarise(args, results, unique, tcp)
    print_table(summary)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=1)


if __name__ == "__main__":
    main()
