#!/usr/bin/env python3
"""Training loop overhead of a memory-only checkpoint every step, persisted every 10th.

What is measured, and why. The peer-memory tier makes a checkpoint of every step affordable in
storage terms: `Checkpointer(persist_every=10)` saves every step, but only every 10th is written
and committed; the other nine are memory-only (proto/README.md §4.2), kept in the node's hot
cache and replicated into another node's memory. Storage no longer bounds how often a job may
checkpoint; what still costs is the daemon's work on the node: a copy of the whole state per
step into its pool, checksums, and the bytes sent to the holder, on the cores the trainers use.
This benchmark asks what that costs the training loop (goal: at most 5 % over the same loop
without checkpoints, measured in the same run).

How. One ckpt-coordinator and --nodes ckptd (default 2) on this machine over one storage root
on disk (--dir), each daemon with --peer-listen, --peer-pool and --replicas 1 (the Cluster of
bench/load/cold_across_nodes.py; the tier's flags and the wait for each daemon's holder are
bench/peer/restore_from_peers.py's). One trainer process per daemon (this script with --worker),
a data-parallel job of world size --nodes: each holds the same model, a few Linear layers whose
parameters, exp_avg and exp_avg_sq are --state in all (bench/python/stall.py's model). A step
is what stall.py's loop does, in training order:

  forward/backward   --compute-ms of 1-thread 256x256 matmuls on a separate buffer (calibrated
                     on rank 0, the same number of passes on every rank)
  gradient sync      a 4-byte all_reduce over gloo: the ranks step in lockstep, as in data
                     parallel training (the gradient bytes themselves are not sent)
  optimizer step     Checkpointer.fence() (what the optimizer pre-step hook does: wait until the
                     previous save is captured), then stall.py's stand-in step, which writes one
                     float in every 4 KiB page of every parameter and state tensor in place
  checkpoint         per mode, below

Three modes, in the same run, interleaved: per round, one block of each mode, in an order that
rotates from round to round.

  none                no checkpoint (the baseline)
  every-step          Checkpointer(persist_every=10).save(step): every step a checkpoint, a
                      memory-only one except where step % 10 == 0 (written and committed)
  persist-every-step  save(step, persist=True) every step, what Checkpointer().save(step) does:
                      every step written and committed (a reference)

Before the rounds, a warm-up of each mode (the first save moves the tensors into shared memory
and registers them: excluded). Each block starts with one untimed lead-in step, so that every
timed step follows a step that saved (as in steady state the daemon is still copying, checksumming
or sending the previous step's checkpoint while the next one computes), then --steps / --rounds
timed steps. After each block the trainers wait, untimed, until each of its checkpoints ended
(committed and replicated, or replicated for a memory-only step, or failed) so that a block's
daemon work never runs into the next block; the time that took after the block's last step is
reported as "drain" (more than a step or two means the daemons fall behind the loop).

Reported per mode: the wall time of a step (per step the slowest rank's: the ranks step
together), median and mean, and the overhead mean(mode) / mean(none) - 1 with two standard
errors (this is what the goal is judged on; the verdict says when 5 % is within them), and by
round: the median over rounds of each block's mean against the same round's none block, taken
seconds apart (robust to a machine whose speed drifts over seconds); the median compute
window (stretched when the daemons take the trainers' cores), save() and fence times; what
became of every checkpoint of the measured blocks (lead-ins included): memory-only steps
replicated or not, persisted ones committed and replicated, saves the Checkpointer counted as
failed (failed_saves, last_error), every one counted; per step, the bytes the daemons sent over
the data plane (ckptd_peer_bytes_total{direction="sent"}) and wrote to storage
(ckptd_persisted_bytes_total), and the daemons' and coordinator's CPU time; the cores, each
process's CPU affinity, the load average and the CPU other processes used during the run.

Not measured here: real nodes and a real network (here every daemon and trainer shares this
machine's cores, and "replication" goes over loopback: on a node the daemon has cores of its
own, and its copy and sends compete with the trainers' compute only for memory bandwidth); GPU
tensors (the copy here is host memory to host memory); the gradient all_reduce's bytes; a real
optimizer step; storage slower than this disk. --trainer-cpus pins the trainers to some CPUs and
everything else (coordinator, daemons) to the others; by default nothing is pinned.

  PYTHONPATH=build/python /usr/bin/python3 bench/peer/training_overhead.py [--bin build/bin]
      [--dir /tmp] [--nodes 2] [--state 128MiB] [--compute-ms 200] [--steps 30] [--rounds 3]
      [--host-pool 1GiB] [--peer-pool 1GiB] [--trainer-cpus 0] [--json out.json]
"""
import argparse
import datetime
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "load"))
sys.path.insert(0, os.path.join(HERE, "..", "python"))
import cold_across_nodes as cold  # noqa: E402  (Cluster, its options, metrics)
import restore_from_peers as peer  # noqa: E402  (the tier's flags, holders, teardown)
import stall  # noqa: E402  (the model, the compute window, CPU time; needs build/python)
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import ckptd  # noqa: E402
import ckptd.torch  # noqa: E402

JOB = "overheadbench"
MODES = ("none", "every-step", "persist-every-step")
PERSIST_EVERY = 10
GOAL = 0.05  # every-step's mean step time over none's, minus 1
WAIT_S = 120.0  # the longest wait for one checkpoint's end
MIB = float(1 << 20)


def fail(message):
    sys.exit("training_overhead: %s" % message)


# ---- the trainer (--worker): one rank of the data-parallel job ----

def scrape(args):
    """The daemons' counters, summed, and the CPU seconds of the daemons and the coordinator."""
    sums = {"sent": 0.0, "persisted": 0.0}
    for address in args.metrics.split(","):
        page = cold.metrics_page({"metrics": address})
        sums["sent"] += cold.sample(page, peer.SERIES["sent"])
        sums["persisted"] += cold.sample(page, "ckptd_persisted_bytes_total")
    pids = [int(p) for p in args.pids.split(",")]
    sums["cpu"] = stall.own_cpu_seconds(pids) - stall.own_cpu_seconds([])
    return sums


class Trainer:
    def __init__(self, args):
        self.args = args
        torch.set_num_threads(1)
        dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % args.dist_port,
                                rank=args.rank, world_size=args.nodes,
                                timeout=datetime.timedelta(seconds=args.timeout))
        self.model, self.optimizer, _, self.state_bytes = stall.build_state(args.state, 4)
        self.tensors = stall.state_tensors(self.model, self.optimizer)
        self.compute = stall.Compute()
        self.pass_s = self.compute.calibrate()
        self.compute.set_target(args.compute_ms / 1e3)
        passes = torch.tensor([self.compute.passes])
        dist.broadcast(passes, 0)  # every rank computes as much as rank 0
        self.compute.passes = int(passes.item())
        self.client = ckptd.Client(JOB, args.rank, args.nodes, socket=args.socket,
                                   connect_timeout=30.0)
        self.ckpt = ckptd.torch.Checkpointer(self.client, self.model, self.optimizer,
                                             persist_every=PERSIST_EVERY)
        self.token = torch.zeros(1)
        self.step = 0

    def train_step(self, mode):
        """One training step; its timings and, when it saved, its checkpoint."""
        self.step += 1
        t0 = time.perf_counter()
        self.compute.run()                       # forward/backward
        t1 = time.perf_counter()
        dist.all_reduce(self.token)              # gradient sync
        t2 = time.perf_counter()
        if mode != "none":
            self.ckpt.fence()                    # the optimizer pre-step hook
        t3 = time.perf_counter()
        stall.touch_step(self.tensors, self.step)  # optimizer step, in place
        failed = self.ckpt.failed_saves
        t4 = time.perf_counter()
        persist = None
        if mode == "every-step":
            persist = self.step % PERSIST_EVERY == 0
            self.ckpt.save(self.step)            # persist_every=10 decides
        elif mode == "persist-every-step":
            persist = True
            self.ckpt.save(self.step, persist=True)
        t5 = time.perf_counter()
        return {"step": self.step, "persist": persist, "seconds": t5 - t0, "compute": t1 - t0,
                "sync": t2 - t1, "fence": t3 - t2, "optimizer": t4 - t3, "save": t5 - t4,
                "save_failed": self.ckpt.failed_saves > failed}

    def outcome(self, row):
        """What became of a saved step: waits (untimed) until it ended."""
        if row["save_failed"]:
            return {"step": row["step"], "failed": "save: %s" % self.ckpt.last_error}
        out = {"step": row["step"], "persist": row["persist"]}
        states = ("committed", "replicated") if row["persist"] else ("replicated",)
        for state in states:
            try:
                self.client.wait(row["step"], state, timeout=WAIT_S)
                out[state] = True
            except ckptd.Error as e:
                out[state] = False
                out.setdefault("reasons", []).append("%s: %s %s" % (
                    state, getattr(e, "code", "?"), getattr(e, "message", e)))
        return out

    def block(self, mode, timed_steps):
        """A lead-in step, the timed steps, then the wait for every checkpoint to end."""
        rows = [self.train_step(mode) for _ in range(1 + timed_steps)]
        rows[0]["lead_in"] = True
        t_end = time.perf_counter()
        outcomes = [self.outcome(r) for r in rows if r["persist"] is not None]
        drain = time.perf_counter() - t_end
        self.ckpt.fence()  # the last save is captured: the tensors are free
        dist.barrier()
        result = {"mode": mode, "steps": rows, "outcomes": outcomes, "drain_s": drain}
        if self.args.rank == 0:
            result["counters"] = scrape(self.args)
        dist.barrier()
        return result

    def run(self):
        args = self.args
        per_block = args.steps // args.rounds
        warmup = [self.block(mode, args.warmup) for mode in MODES]
        blocks = []
        for r in range(args.rounds):
            order = MODES[r % len(MODES):] + MODES[:r % len(MODES)]
            for mode in order:
                before = (blocks[-1] if blocks else warmup[-1]).get("counters")
                b = self.block(mode, per_block)
                b["round"] = r
                if args.rank == 0:
                    b["delta"] = {k: b["counters"][k] - before[k] for k in before}
                blocks.append(b)
        return {"rank": args.rank, "state_bytes": self.state_bytes,
                "compute_passes": self.compute.passes, "compute_pass_s": self.pass_s,
                "affinity": sorted(os.sched_getaffinity(0)), "warmup": warmup, "blocks": blocks,
                "failed_saves": self.ckpt.failed_saves, "last_error": str(self.ckpt.last_error),
                "reattaches": self.client.reattaches}


# ---- the run: cluster, trainers, results ----

def start_cluster(args, work):
    cluster = cold.Cluster(args, work)
    peer.CLUSTERS.append(cluster)  # peer.teardown() kills what it holds
    os.makedirs(cluster.root)
    cluster.start_coordinator()
    cluster.start_daemons("node", peer=True, cgroup=False, extra=peer.tier_flags(args))
    peer.wait_for_holders(args, cluster.daemons)
    return cluster


def start_trainers(args, cluster, work, trainers):
    port = cold.free_port()
    pids = [d["proc"].pid for d in cluster.daemons] + [cluster.coordinator.pid]
    cpus = parse_cpus(args.trainer_cpus)
    pin = (lambda: os.sched_setaffinity(0, cpus)) if cpus else None
    for rank, d in enumerate(cluster.daemons):  # this script again, with the run's options
        cmd = [sys.executable, os.path.abspath(__file__)] + sys.argv[1:] + [
            "--worker", "--rank", str(rank), "--socket", d["socket"], "--dist-port", str(port),
            "--out", os.path.join(work, "trainer-%d.json" % rank), "--metrics",
            ",".join(x["metrics"] for x in cluster.daemons), "--pids", ",".join(map(str, pids))]
        with open(os.path.join(work, "trainer-%d.log" % rank), "wb") as log:
            trainers.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                             preexec_fn=pin))


def wait_trainers(args, work, trainers):
    """The trainers' results; on the first that fails (or at --timeout), its log and exit."""
    deadline = time.monotonic() + args.timeout
    while any(p.poll() is None for p in trainers) and time.monotonic() < deadline:
        if any(p.returncode for p in trainers):
            break
        time.sleep(0.2)  # polling the trainer processes
    bad = ([i for i, p in enumerate(trainers) if p.returncode] or
           [i for i, p in enumerate(trainers) if p.returncode is None])
    if bad:
        rc = trainers[bad[0]].returncode
        with open(os.path.join(work, "trainer-%d.log" % bad[0]), errors="replace") as f:
            tail = "".join(f.readlines()[-30:])
        fail("trainer %d %s; its log ends:\n%s" % (
            bad[0], "ran past --timeout" if rc is None else "failed (rc %d)" % rc, tail))
    results = []
    for rank in range(len(trainers)):
        with open(os.path.join(work, "trainer-%d.json" % rank)) as f:
            results.append(json.load(f))
    return results


def parse_cpus(text):
    return {int(c) for c in text.split(",")} if text else set()


# ---- summary ----

def fates(mode, ranks):
    """What became of each checkpoint of the mode's blocks: a step whose save failed on some
    rank is a failed save; otherwise rank 0's answers (a step's end is the job's)."""
    f = dict.fromkeys(("memory_only", "memory_only_replicated", "persisted",
                       "persisted_committed", "persisted_replicated", "failed_saves"), 0)
    f["reasons"] = []
    per_step = {}
    for r in ranks:
        for o in (o for b in r["blocks"] if b["mode"] == mode for o in b["outcomes"]):
            per_step.setdefault(o["step"], []).append(o)
    for step, outs in sorted(per_step.items()):
        failed = [o["failed"] for o in outs if "failed" in o]
        if failed:
            f["failed_saves"] += 1
            f["reasons"].append("step %d: %s" % (step, failed[0]))
            continue
        o = outs[0]
        kind = "persisted" if o["persist"] else "memory_only"
        f[kind] += 1
        for state in ("committed", "replicated") if o["persist"] else ("replicated",):
            f[kind + "_" + state] += 1 if o[state] else 0
        f["reasons"] += ["step %d: %s" % (step, x) for x in o.get("reasons", [])]
    return f


def mode_summary(mode, ranks):
    """Per mode: step times (per step, the slowest rank), their parts, daemons' work."""
    blocks = [[b for b in r["blocks"] if b["mode"] == mode] for r in ranks]
    seconds, parts = [], {k: [] for k in ("compute", "sync", "fence", "optimizer", "save")}
    block_means = []  # one per round, in round order
    for per_rank in zip(*blocks):
        for rows in zip(*(b["steps"] for b in per_rank)):
            if not rows[0].get("lead_in"):
                seconds.append(max(x["seconds"] for x in rows))
                for k in parts:
                    parts[k] += [x[k] for x in rows]
        block_means.append(statistics.mean(seconds[-(len(per_rank[0]["steps"]) - 1):]))
    delta = {k: sum(b["delta"][k] for b in blocks[0]) for k in ("sent", "persisted", "cpu")}
    steps_run = sum(len(b["steps"]) for b in blocks[0])
    return {"steps_timed": len(seconds), "median_s": statistics.median(seconds),
            "mean_s": statistics.mean(seconds), "step_seconds": seconds,
            "sem_s": statistics.stdev(seconds) / len(seconds) ** 0.5, "block_means_s": block_means,
            "parts_mean_s": {k: statistics.mean(v) for k, v in parts.items()},
            "compute_median_s": statistics.median(parts["compute"]),
            "save_median_s": statistics.median(parts["save"]),
            "fence_median_s": statistics.median(parts["fence"]),
            "fence_max_s": max(parts["fence"]),
            "drain_max_s": max(b["drain_s"] for bs in blocks for b in bs),
            "checkpoints": fates(mode, ranks), "steps_run": steps_run,
            "peer_sent_bytes_per_step": delta["sent"] / steps_run,
            "storage_bytes_per_step": delta["persisted"] / steps_run,
            "daemon_cpu_s_per_step": delta["cpu"] / steps_run}


def machine(trainer_cpus):
    return {"date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "cpu_count": os.cpu_count(),
            "trainer_affinity": trainer_cpus,
            "daemon_affinity": sorted(os.sched_getaffinity(0)),
            "loadavg": open("/proc/loadavg").read().split()[:3]}


def summarise(args, ranks, mach):
    modes = {m: mode_summary(m, ranks) for m in MODES}
    base = modes["none"]
    for m in modes.values():
        m["overhead_mean"] = m["mean_s"] / base["mean_s"] - 1
        # two standard errors of the ratio of means (the steps taken as independent)
        m["overhead_mean_2se"] = 2 * (m["mean_s"] / base["mean_s"]) * (
            (m["sem_s"] / m["mean_s"]) ** 2 + (base["sem_s"] / base["mean_s"]) ** 2) ** 0.5
        m["overhead_median"] = m["median_s"] / base["median_s"] - 1
        # each round's block against the same round's none block (seconds apart), median
        m["overhead_by_round"] = [a / b - 1 for a, b in zip(m["block_means_s"],
                                                            base["block_means_s"])]
        m["overhead_round_median"] = statistics.median(m["overhead_by_round"])
    return {"nodes": args.nodes, "state_bytes": ranks[0]["state_bytes"],
            "compute_ms": args.compute_ms, "compute_passes": ranks[0]["compute_passes"],
            "steps": args.steps, "rounds": args.rounds, "persist_every": PERSIST_EVERY,
            "host_pool": args.host_pool, "peer_pool": args.peer_pool, "modes": modes,
            "goal_overhead": GOAL, "goal_met": modes["every-step"]["overhead_mean"] <= GOAL,
            "machine": mach, "trainers": [{k: r[k] for k in (
                "rank", "affinity", "failed_saves", "last_error", "reattaches")} for r in ranks]}


def print_report(s):
    print("\n| mode | step median | step mean | vs none (mean, ± 2 SE) | vs none (median) | "
          "vs none, by round (median) | compute median | save() median | fence median / max "
          "| drain, worst block |")
    print("|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|")
    for name in MODES:
        m = s["modes"][name]
        print("| %s | %.1f ms | %.1f ms | %+.1f %% ± %.1f | %+.1f %% | %+.1f %% | %.1f ms "
              "| %.2f ms | %.1f / %.1f ms | %.2f s |" % (
                  name, m["median_s"] * 1e3, m["mean_s"] * 1e3, m["overhead_mean"] * 100,
                  m["overhead_mean_2se"] * 100, m["overhead_median"] * 100,
                  m["overhead_round_median"] * 100,
                  m["compute_median_s"] * 1e3, m["save_median_s"] * 1e3,
                  m["fence_median_s"] * 1e3, m["fence_max_s"] * 1e3, m["drain_max_s"]))
    print("\n| mode | memory-only: replicated | persisted: committed, replicated | failed saves "
          "| data plane sent / step | storage written / step | daemons' CPU / step |")
    print("|---|--:|--:|--:|--:|--:|--:|")
    for name in MODES:
        m, f = s["modes"][name], s["modes"][name]["checkpoints"]
        print("| %s | %d of %d | %d, %d of %d | %d | %.1f MiB | %.1f MiB | %.0f ms |" % (
            name, f["memory_only_replicated"], f["memory_only"], f["persisted_committed"],
            f["persisted_replicated"], f["persisted"], f["failed_saves"],
            m["peer_sent_bytes_per_step"] / MIB, m["storage_bytes_per_step"] / MIB,
            m["daemon_cpu_s_per_step"] * 1e3))
        for reason in f["reasons"]:
            print("    %s: %s" % (name, reason))
    for t in s["trainers"]:
        if t["failed_saves"] or t["reattaches"]:
            print("rank %d: failed_saves %d, reattaches %d, last_error %s" % (
                t["rank"], t["failed_saves"], t["reattaches"], t["last_error"]))
    mach = s["machine"]
    every = s["modes"]["every-step"]
    print("\nverdict: a memory-only checkpoint every step, persisted every %d: %+.1f %% (± %.1f, "
          "two standard errors; by round, median %+.1f %%) against the loop without checkpoints "
          "(goal <= %.0f %%): %s%s" % (
              PERSIST_EVERY, every["overhead_mean"] * 100, every["overhead_mean_2se"] * 100,
              every["overhead_round_median"] * 100, GOAL * 100,
              "met" if s["goal_met"] else "MISSED",
              "" if abs(every["overhead_mean"] - GOAL) > every["overhead_mean_2se"] else
              " (not conclusive: 5 % is within two standard errors)"))
    print("cores: %d; trainers (%d, one compute thread each) on CPUs %s, the coordinator and "
          "daemons on CPUs %s; load average %s at the start; other processes used %.2f cores "
          "over the run.%s" % (
              mach["cpu_count"], s["nodes"], mach["trainer_affinity"], mach["daemon_affinity"],
              " ".join(mach["loadavg"]), mach["others_cores"],
              " The cores that compute also run the daemons' copies, checksums and sends (on a "
              "real node the daemon has cores of its own)."
              if set(mach["trainer_affinity"]) & set(mach["daemon_affinity"]) else ""))
    if mach["others_cores"] > 0.25:
        print("WARNING: other processes used %.2f cores during the run: the numbers are suspect"
              % mach["others_cores"])


# ---- main ----

def parse_args():
    ap = argparse.ArgumentParser()
    cold.add_cluster_args(ap, __doc__, "1GiB")
    for action in ap._actions:  # the cold script's, unused here
        if action.dest in ("tensors", "throttle"):
            action.help = argparse.SUPPRESS
    ap.add_argument("--peer-pool", default="1GiB")
    ap.add_argument("--nodes", type=int, default=2, help="daemons, and trainers (world size)")
    ap.add_argument("--state", type=cold.parse_bytes, default=cold.parse_bytes("128MiB"),
                    help="parameters + exp_avg + exp_avg_sq per rank")
    ap.add_argument("--compute-ms", type=float, default=200, help="forward/backward per step")
    ap.add_argument("--steps", type=int, default=30, help="timed steps per mode")
    ap.add_argument("--rounds", type=int, default=3, help="blocks per mode (interleaved)")
    ap.add_argument("--warmup", type=int, default=2, help="untimed steps per mode first")
    ap.add_argument("--trainer-cpus", default="",
                    help="pin the trainers to these CPUs (e.g. 0), everything else to the others")
    ap.add_argument("--timeout", type=float, default=900, help="seconds for the whole run")
    ap.add_argument("--keep", action="store_true", help="keep the work directory")
    ap.add_argument("--json")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)  # a trainer:
    for name in ("--rank", "--dist-port", "--socket", "--out", "--metrics", "--pids"):
        ap.add_argument(name, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.steps < args.rounds or args.steps % args.rounds:
        ap.error("--steps must be a multiple of --rounds")
    return args


def main():
    args = parse_args()
    if args.worker:
        args.rank, args.dist_port = int(args.rank), int(args.dist_port)
        with open(args.out, "w") as f:
            json.dump(Trainer(args).run(), f)
        return
    for exe in ("ckptd", "ckpt-coordinator", "ckptctl"):
        if not os.access(os.path.join(args.bin, exe), os.X_OK):
            fail("no %s in %s (--bin)" % (exe, args.bin))
    cpus = parse_cpus(args.trainer_cpus)
    if cpus:
        rest = os.sched_getaffinity(0) - cpus
        if not rest:
            fail("--trainer-cpus leaves no CPU for the daemons")
        os.sched_setaffinity(0, rest)  # the coordinator and daemons inherit it
    signal.signal(signal.SIGTERM, lambda *_: fail("terminated"))  # the cleanup below runs
    cold.NODES, cold.JOB = args.nodes, JOB
    work = cold.WORK = tempfile.mkdtemp(prefix="ckptd-overhead-bench-", dir=args.dir)
    mach = machine(sorted(cpus or os.sched_getaffinity(0)))
    print("training_overhead: %s, %d nodes, %.0f MiB of state per rank, %.0f ms compute, %d x %d "
          "timed steps per mode; %d cores, trainers on CPUs %s, daemons on CPUs %s; load average "
          "%s; work dir %s" % (mach["date"], args.nodes, args.state / MIB, args.compute_ms,
                               args.rounds, args.steps // args.rounds, mach["cpu_count"],
                               mach["trainer_affinity"], mach["daemon_affinity"],
                               " ".join(mach["loadavg"]), work), flush=True)
    t0, busy0, own0 = time.monotonic(), stall.cpu_busy_seconds(), stall.own_cpu_seconds([])
    trainers = []
    try:
        cluster = start_cluster(args, work)
        start_trainers(args, cluster, work, trainers)
        ranks = wait_trainers(args, work, trainers)
    finally:
        for p in trainers:
            p.kill()
            p.wait()
        peer.teardown()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    own = stall.own_cpu_seconds([]) - own0  # every child reaped: trainers, daemons
    mach["others_cores"] = max(0.0, stall.cpu_busy_seconds() - busy0 - own) / (
        time.monotonic() - t0)
    mach["loadavg_end"] = open("/proc/loadavg").read().split()[:3]
    summary = summarise(args, ranks, mach)
    print_report(summary)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=1)


if __name__ == "__main__":
    main()
