#!/usr/bin/python3
"""Trainer-visible stall per checkpoint: ckptd.torch.Checkpointer against torch.save, same run.

For each state size (model + AdamW state, default 256 MiB, 512 MiB, 1 GiB, 2 GiB) this builds a
model of a few big Linear layers whose parameters, exp_avg and exp_avg_sq together are that size,
and measures in one run, in one work directory on the disk (--dir, default /tmp; not tmpfs):

  baseline  torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, path)
            as a trainer calls it: the time from building the state dicts to the end of the save,
            with os.fsync of the file (durable, like ckptd's checkpoints) and without (the bytes
            only reach the page cache). --save-reps each; the file is deleted and os.sync() runs,
            untimed, after each, so that one save's write-back does not slow the next.
  ckptd     a training loop on the same model through the same ckptd (started here from --bin
            with a pool of twice the largest state): per step "forward/backward" (a fixed number
            of 1-thread matmuls on a separate small buffer: --compute-ms-per-gib of state, 1 s per
            GiB by default, so that the window grows with the model as in training; or a fixed
            --compute-ms), the fence the optimizer pre-step hook performs (Checkpointer.fence(),
            as examples/demo_train.py calls it), an "optimizer step" and Checkpointer.save(step).
            The stall of a checkpoint is save(step) plus the fence before the next optimizer step:
            all the trainer waits for it. Median over --steps checkpoints, after a first save that
            is reported apart (it moves the tensors into shared memory and registers them, once).
  snapshot+thread  the in-process "snapshot to host, then write in a background thread" pattern
            (CheckFreq, DataStates): at each checkpoint, wait for the previous background write,
            copy every tensor of both state dicts (the snapshot), start a thread that
            torch.save's the snapshot and fsyncs it; the same compute and optimizer step follow.
            Its stall = that wait + the copy. The thread shares the trainer's process (and, when
            the trainer is pinned to one core, its core and the GIL).

The optimizer step is a stand-in: AdamW's real step on this 1-thread CPU torch takes ~10 s for a
2 GiB state, so the loop writes one float in every 4 KiB page of every parameter and state
tensor instead (the memory changes, behind the fence, as after a real step); the optimizer state
itself is AdamW's, built directly (exp_avg, exp_avg_sq, step) rather than by a real step.

Also reported, for reading the stall: an empty request timed just before each save (wait_snapshot
on a step already captured: the socket round trip, and the machine's scheduling noise at that
moment), the capture time (save → wait_snapshot with no compute in between — what the fence waits
for when forward/backward is shorter than that) and the compute time per step with ckptd
capturing vs without (the background copy shares the two cores).
Goal: ckptd's stall >= 100x lower than torch.save's.

    PYTHONPATH=build/python /usr/bin/python3 bench/python/stall.py [--bin build/bin] [--dir /tmp]
        [--sizes 256MiB,512MiB,1GiB,2GiB] [--steps 8] [--compute-ms-per-gib 1000] [--json out.json]
"""
import argparse
import gc
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import torch

import ckptd
import ckptd.torch

MiB = 1 << 20
GiB = 1 << 30


def parse_size(text):
    t = text.strip()
    for suffix, mult in (("GiB", GiB), ("MiB", MiB), ("KiB", 1 << 10), ("G", GiB), ("M", MiB),
                         ("K", 1 << 10), ("B", 1)):
        if t.endswith(suffix):
            return int(float(t[: -len(suffix)]) * mult)
    return int(t)


def fmt_size(n):
    return "%d GiB" % (n // GiB) if n % GiB == 0 else "%d MiB" % (n // MiB)


def filesystem_of(path):
    try:
        out = subprocess.run(["stat", "-f", "-c", "%T", path], capture_output=True, text=True,
                             check=True).stdout.strip()
        return out
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def loadavg():
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def cpu_busy_seconds():
    """(busy, idle) CPU seconds of the whole machine, from /proc/stat."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:9]]
    hz = os.sysconf("SC_CLK_TCK")
    busy = v[0] + v[1] + v[2] + v[5] + v[6] + v[7]
    return busy / hz


def own_cpu_seconds(pids):
    """CPU seconds of this process, its reaped children and the given live pids."""
    t = os.times()
    total = t.user + t.system + t.children_user + t.children_system
    hz = os.sysconf("SC_CLK_TCK")
    for pid in pids:
        try:
            with open("/proc/%d/stat" % pid) as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / hz
        except OSError:
            pass
    return total


# ---------------------------------------------------------------------------- the state

def build_state(total_bytes, layers):
    """A model of `layers` Linear(d, d) layers and an AdamW whose state (exp_avg, exp_avg_sq,
    step) exists, together about total_bytes of float32. Built without running AdamW's step:
    parameters are created uninitialized and filled with constants (fast; nothing compresses
    either checkpoint), the state tensors are made directly."""
    params = total_bytes // 3 // 4  # float32 elements of parameters (and of each moment)
    d = max(64, int(round((params / layers) ** 0.5 / 64)) * 64)
    layer_list = []
    for i in range(layers):
        lin = torch.nn.utils.skip_init(torch.nn.Linear, d, d)
        with torch.no_grad():
            lin.weight.fill_(0.01 * (i + 1))
            lin.bias.fill_(0.001 * (i + 1))
        layer_list.append(lin)
    model = torch.nn.Sequential(*layer_list)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for p in model.parameters():
        optimizer.state[p] = {
            "step": torch.tensor(1.0),
            "exp_avg": torch.full_like(p, 1e-3),
            "exp_avg_sq": torch.full_like(p, 1e-6),
        }
    nbytes = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    for st in optimizer.state.values():
        nbytes += sum(v.numel() * v.element_size() for v in st.values())
    return model, optimizer, d, nbytes


def state_tensors(model, optimizer):
    out = [p for p in model.parameters()]
    for st in optimizer.state.values():
        out.extend(v for v in st.values() if torch.is_tensor(v) and v.dim() > 0)
    return out


def touch_step(tensors, step):
    """The stand-in optimizer step: one float32 written in every 4 KiB page of every tensor."""
    with torch.no_grad():
        for t in tensors:
            t.view(-1)[::1024].add_(1e-7 * step)


# ---------------------------------------------------------------------------- compute

class Compute:
    """Forward/backward stand-in: `passes` 1-thread matmuls of 256x256 float32 matrices."""

    def __init__(self):
        g = torch.Generator().manual_seed(1)
        self.a = torch.randn(256, 256, generator=g)
        self.b = torch.randn(256, 256, generator=g)
        self.out = torch.empty(256, 256)
        self.passes = 1
        self.pass_s = None

    def run(self, passes=None):
        for _ in range(self.passes if passes is None else passes):
            torch.mm(self.a, self.b, out=self.out)

    def calibrate(self):
        """Seconds per pass: the best of 3 runs of at least 0.3 s."""
        n = 4
        while True:
            t0 = time.perf_counter()
            self.run(n)
            dt = time.perf_counter() - t0
            if dt > 0.3:
                break
            n *= 2
        best = dt
        for _ in range(2):
            t0 = time.perf_counter()
            self.run(n)
            best = min(best, time.perf_counter() - t0)
        self.pass_s = best / n
        return self.pass_s

    def set_target(self, target_s):
        """Passes for target_s; returns the median of 3 timed runs (no checkpoint running)."""
        self.passes = max(1, int(round(target_s / self.pass_s)))
        times = []
        for _ in range(3):
            t0 = time.perf_counter()
            self.run()
            times.append(time.perf_counter() - t0)
        return statistics.median(times)


# ---------------------------------------------------------------------------- daemon

class Daemon:
    def __init__(self, bin_dir, work, pool_bytes, extra_args):
        self.socket = os.path.join(work, "ckptd.sock")
        self.root = os.path.join(work, "root")
        self.log = os.path.join(work, "ckptd.log")
        args = [os.path.join(bin_dir, "ckptd"), "--socket", self.socket, "--storage-root",
                self.root, "--host-pool", str(pool_bytes), "--slot-size", "16MiB",
                "--checksum-chunk", "1MiB", "--capture-threads", "2", "--flush-threads", "4",
                "--keep", "1", "--node-id", "bench", "--log-level", "warn",
                "--admin", "unix:" + self.socket + ".admin", "--metrics", "127.0.0.1:0"] + list(extra_args)
        env = {k: v for k, v in os.environ.items() if not k.startswith("CKPTD_")}
        self.log_file = open(self.log, "ab")
        self.proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=self.log_file,
                                     stderr=subprocess.STDOUT, env=env)

    def client(self, job):
        deadline = time.monotonic() + 120
        while True:
            try:
                return ckptd.Client(job, 0, 1, socket=self.socket, connect_timeout=1.0)
            except ckptd.Error as e:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("ckptd did not come up (%s); log %s:\n%s"
                                       % (e, self.log, self.tail())) from None

    def tail(self, n=20):
        try:
            with open(self.log, errors="replace") as f:
                return "".join(f.readlines()[-n:])
        except OSError:
            return ""

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log_file.close()


# ---------------------------------------------------------------------------- measurements

def torch_save_once(model, optimizer, path, fsync):
    t0 = time.perf_counter()
    state = {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
    torch.save(state, path)
    if fsync:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    dt = time.perf_counter() - t0
    size = os.path.getsize(path)
    del state
    os.unlink(path)
    os.sync()  # untimed: no write-back of this save left to slow the next measurement
    return dt, size


def clone_tree(x):
    """A copy of every tensor in a nested dict/list state (the host snapshot)."""
    if torch.is_tensor(x):
        return x.detach().clone()
    if isinstance(x, dict):
        return {k: clone_tree(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return type(x)(clone_tree(v) for v in x)
    return x


def snapshot_thread_loop(model, optimizer, compute, steps, path):
    """The CheckFreq/DataStates pattern in a few lines: per checkpoint, wait for the previous
    background write (one snapshot buffer), copy the state to host memory, hand the copy to a
    thread that torch.save's and fsyncs it. Returns the per-checkpoint waits, copies and stalls
    (the first checkpoint, which waits for nothing, is left out)."""
    tensors = state_tensors(model, optimizer)

    def write(snapshot):
        with open(path, "wb") as f:
            torch.save(snapshot, f)
            f.flush()
            os.fsync(f.fileno())

    writer = None
    waits, copies, stalls = [], [], []
    for i in range(steps + 1):
        t0 = time.perf_counter()
        if writer is not None:
            writer.join()
        t1 = time.perf_counter()
        snapshot = {"model": clone_tree(model.state_dict()),
                    "optimizer": clone_tree(optimizer.state_dict())}
        t2 = time.perf_counter()
        writer = threading.Thread(target=write, args=(snapshot,), daemon=True)
        writer.start()
        del snapshot
        if i > 0:
            waits.append(t1 - t0)
            copies.append(t2 - t1)
            stalls.append(t2 - t0)
        compute.run()
        touch_step(tensors, i + 2)
    writer.join()
    os.unlink(path)
    os.sync()
    return {"waits": waits, "copies": copies, "stalls": stalls}


def ckptd_loop(daemon, job, model, optimizer, compute, steps):
    client = daemon.client(job)
    ckpt = ckptd.torch.Checkpointer(client, model, optimizer)
    tensors = state_tensors(model, optimizer)
    r = {}
    # First save: share_memory_() of every tensor + Register; then its capture.
    t0 = time.perf_counter()
    ckpt.save(1)
    r["first_save_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    ckpt.fence()
    r["first_fence_s"] = time.perf_counter() - t0
    client.wait(1, "committed")

    saves, fences, stalls, computes, rpcs = [], [], [], [], []
    for i in range(steps):
        step = i + 2
        # Baseline for the machine's scheduling noise, not part of the stall: an empty request
        # at the same moment (wait_snapshot when the last save is already captured and fenced
        # is answered at once) — the socket round trip that save() cannot beat.
        r0 = time.perf_counter()
        client.wait_snapshot()
        rpcs.append(time.perf_counter() - r0)
        s0 = time.perf_counter()
        ckpt.save(step)
        save_s = time.perf_counter() - s0
        c0 = time.perf_counter()
        compute.run()
        computes.append(time.perf_counter() - c0)
        f0 = time.perf_counter()
        ckpt.fence()                       # what the optimizer pre-step hook does
        fence_s = time.perf_counter() - f0
        touch_step(tensors, step)          # the optimizer step (stand-in, see the docstring)
        saves.append(save_s)
        fences.append(fence_s)
        stalls.append(save_s + fence_s)
    last = steps + 1
    client.wait(last, "committed")
    # Capture time: save → wait_snapshot with nothing in between (after the flushes drained).
    captures = []
    for k in range(2):
        step = last + 1 + k
        t0 = time.perf_counter()
        ckpt.save(step)
        ckpt.fence()
        captures.append(time.perf_counter() - t0)
        client.wait(step, "committed")
    ckpt.remove_hook()
    client.close()
    r.update(saves=saves, fences=fences, stalls=stalls, computes=computes, captures=captures,
             rpcs=rpcs)
    return r


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--bin", default="build/bin", help="directory holding ckptd")
    p.add_argument("--dir", default="/tmp", help="a fresh work directory is made here (a disk)")
    p.add_argument("--sizes", default="256MiB,512MiB,1GiB,2GiB",
                   help="comma-separated state sizes (model + AdamW state)")
    p.add_argument("--layers", type=int, default=4, help="Linear layers of the model")
    p.add_argument("--steps", type=int, default=8, help="timed checkpoints per size (median)")
    p.add_argument("--save-reps", type=int, default=3, help="torch.save runs per size and mode")
    p.add_argument("--snapshot-steps", type=int, default=4,
                   help="checkpoints of the snapshot+thread baseline per size (0: skip it)")
    p.add_argument("--compute-ms-per-gib", type=float, default=1000,
                   help="forward/backward stand-in per step, ms per GiB of state (compute grows "
                   "with the model, as in training)")
    p.add_argument("--compute-ms", type=float, default=0,
                   help="a fixed forward/backward stand-in per step, ms, for every size "
                   "(overrides --compute-ms-per-gib)")
    p.add_argument("--pool", default="", help="ckptd --host-pool (default: 2x the largest state "
                   "+ 256 MiB)")
    p.add_argument("--ckptd-arg", action="append", default=[], help="extra ckptd argument")
    p.add_argument("--json", default="", help="write the results as JSON here")
    p.add_argument("--keep", action="store_true", help="keep the work directory")
    args = p.parse_args()

    if not os.path.exists(os.path.join(args.bin, "ckptd")):
        sys.exit("stall.py: no ckptd in %s (build the ckptd target, or --bin)" % args.bin)
    sizes = [parse_size(s) for s in args.sizes.split(",") if s]
    pool = parse_size(args.pool) if args.pool else 2 * max(sizes) + 256 * MiB
    torch.set_num_threads(1)
    work = tempfile.mkdtemp(prefix="ckpt-bench-stall.", dir=args.dir)
    fs = filesystem_of(work)
    date = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    print("stall.py: %s, %d cores, torch %s (%d thread), work dir %s (%s), ckptd from %s, pool %s; "
          "load average %s" % (date, os.cpu_count(), torch.__version__, torch.get_num_threads(),
                               work, fs, args.bin, fmt_size(pool), loadavg()))
    if fs == "tmpfs":
        print("WARNING: %s is tmpfs: torch.save's fsync and ckptd's writes touch no disk" % work)
    results = {"date": date, "cores": os.cpu_count(), "torch": torch.__version__,
               "work_dir_filesystem": fs, "host_pool_bytes": pool, "loadavg_start": loadavg(),
               "compute_ms_fixed": args.compute_ms,
               "compute_ms_per_gib": args.compute_ms_per_gib, "sizes": []}
    start = time.perf_counter()
    busy0, own0 = cpu_busy_seconds(), own_cpu_seconds([])
    compute = Compute()
    pass_s = compute.calibrate()
    print("compute stand-in: 256x256 matmuls, %.2f ms each; per step %s" % (
        pass_s * 1e3, "%.0f ms" % args.compute_ms if args.compute_ms else
        "%.0f ms per GiB of state" % args.compute_ms_per_gib))
    results["compute_pass_s"] = pass_s
    sys.stdout.flush()

    daemon = Daemon(args.bin, work, pool, args.ckptd_arg)
    rows = []
    try:
        for size in sizes:
            gc.collect()
            model, optimizer, d, nbytes = build_state(size, args.layers)
            label = fmt_size(size)
            print("\n== %s: %d x Linear(%d, %d) + AdamW state = %.0f MiB" % (
                label, args.layers, d, d, nbytes / MiB))
            target = (args.compute_ms if args.compute_ms else
                      args.compute_ms_per_gib * nbytes / GiB) / 1e3
            base_compute = compute.set_target(target)
            path = os.path.join(work, "torch_save.pt")
            with_fsync, without = [], []
            file_size = 0
            for _ in range(args.save_reps):
                dt, file_size = torch_save_once(model, optimizer, path, True)
                with_fsync.append(dt)
                dt, _ = torch_save_once(model, optimizer, path, False)
                without.append(dt)
            print("  torch.save + fsync: %s s; without fsync: %s s (file %.0f MiB)" % (
                ", ".join("%.2f" % x for x in with_fsync), ", ".join("%.2f" % x for x in without),
                file_size / MiB))
            sys.stdout.flush()
            snap = {"waits": [], "copies": [], "stalls": []}
            if args.snapshot_steps > 0:
                snap = snapshot_thread_loop(model, optimizer, compute, args.snapshot_steps, path)
                print("  snapshot+thread: stall %s ms (wait for the previous write %s, copy %s)" % (
                    " ".join("%.0f" % (x * 1e3) for x in snap["stalls"]),
                    " ".join("%.0f" % (x * 1e3) for x in snap["waits"]),
                    " ".join("%.0f" % (x * 1e3) for x in snap["copies"])))
                sys.stdout.flush()
            loop = ckptd_loop(daemon, "stall-" + label.replace(" ", ""), model, optimizer,
                              compute, args.steps)
            stall = statistics.median(loop["stalls"])
            ts_f, ts_n = statistics.median(with_fsync), statistics.median(without)
            comp = statistics.median(loop["computes"])
            print("  ckptd: first save %.0f ms (shares + registers) + fence %.0f ms; then per "
                  "checkpoint save() %s ms, fence %s ms" % (
                      loop["first_save_s"] * 1e3, loop["first_fence_s"] * 1e3,
                      " ".join("%.2f" % (x * 1e3) for x in loop["saves"]),
                      " ".join("%.2f" % (x * 1e3) for x in loop["fences"])))
            print("  ckptd: stall median %.2f ms (max %.2f); an empty request just before each "
                  "save: median %.2f ms (max %.2f)" % (
                      stall * 1e3, max(loop["stalls"]) * 1e3,
                      statistics.median(loop["rpcs"]) * 1e3, max(loop["rpcs"]) * 1e3))
            print("  ckptd: capture alone %s ms; compute per "
                  "step %.0f ms vs %.0f ms without checkpointing" % (
                      " ".join("%.0f" % (x * 1e3) for x in loop["captures"]), comp * 1e3,
                      base_compute * 1e3))
            sys.stdout.flush()
            results["sizes"].append({
                "size": size, "state_bytes": nbytes, "width": d, "torch_save_file_bytes": file_size,
                "torch_save_fsync_s": with_fsync, "torch_save_nofsync_s": without,
                "ckptd_first_save_s": loop["first_save_s"],
                "ckptd_first_fence_s": loop["first_fence_s"],
                "ckptd_save_s": loop["saves"], "ckptd_fence_s": loop["fences"],
                "ckptd_stall_s": loop["stalls"], "ckptd_stall_median_s": stall,
                "empty_request_s": loop["rpcs"],
                "ckptd_capture_s": loop["captures"], "compute_passes": compute.passes,
                "snapshot_thread_stall_s": snap["stalls"], "snapshot_thread_wait_s": snap["waits"],
                "snapshot_thread_copy_s": snap["copies"],
                "compute_s_no_checkpoint": base_compute, "compute_s": loop["computes"]})
            baselines = [("torch.save + fsync", ts_f), ("torch.save, no fsync", ts_n)]
            if snap["stalls"]:
                baselines.append(("snapshot+thread", statistics.median(snap["stalls"])))
            for what, base in baselines:
                ratio = base / stall if stall > 0 else float("inf")
                goal = what.startswith("torch.save")  # the snapshot+thread row is for information
                rows.append(("stall, %s state, vs %s" % (label, what), "%.2f ms" % (stall * 1e3),
                             "%.0f ms" % (base * 1e3), ratio, ">= 100x" if goal else "(info)",
                             ratio >= 100 if goal else None))
            del model, optimizer, loop
    finally:
        daemon.stop()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)

    total = time.perf_counter() - start
    elapsed_busy = cpu_busy_seconds() - busy0
    own = own_cpu_seconds([]) - own0
    others = max(0.0, (elapsed_busy - own) / total)
    results.update(total_seconds=total, others_cpu_cores=others, loadavg_end=loadavg(),
                   table=[{"metric": r[0], "ckptd": r[1], "baseline": r[2], "ratio": r[3],
                           "goal": r[4], "met": r[5]} for r in rows])
    print("\n== summary (%.0f s; other processes used %.2f of %d cores on average; load average "
          "at end %s)\n" % (total, others, os.cpu_count(), loadavg()))
    w = [max(len(h), *(len(str(r[i])) for r in rows)) for i, h in
         enumerate(("metric", "ckptd", "baseline"))]
    print("| %-*s | %*s | %*s | %7s | %-8s | %-4s |" % (w[0], "metric", w[1], "ckptd", w[2],
                                                       "baseline", "ratio", "goal", "met?"))
    print("|%s|%s:|%s:|--------:|----------|------|" % ("-" * (w[0] + 2), "-" * (w[1] + 1),
                                                       "-" * (w[2] + 1)))
    for r in rows:
        print("| %-*s | %*s | %*s | %7.0f | %-8s | %-4s |" % (w[0], r[0], w[1], r[1], w[2], r[2],
                                                            r[3], r[4],
                                                            "-" if r[5] is None else
                                                            "yes" if r[5] else "NO"))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
        print("\nJSON: %s" % args.json)


if __name__ == "__main__":
    main()
