#!/usr/bin/python3
"""Restore time of one PyTorch state: ckptd.torch.Checkpointer.load vs torch.load, same run.

One model + AdamW state of --size bytes (stall.py's build_state: a few big Linear layers, their
exp_avg and exp_avg_sq) is checkpointed once through a ckptd started here (step 1, committed) and
once with torch.save + fsync, in the same work directory on the disk (--dir; not tmpfs). Then, per
round, each restore goes into a fresh model and a fresh AdamW without state, as a restarted
trainer's would, and is timed from the call to the end of the restore:

  hot       Checkpointer.load(1) from the running daemon (served from its memory).
  cold      the daemon stopped (SIGTERM) and started again on the same storage root, the page
            cache dropped (echo 3 > /proc/sys/vm/drop_caches; said when refused), then
            Checkpointer.load(1): read from the data files.
  torch.load cold   the page cache dropped, torch.load(path) + model.load_state_dict +
            optimizer.load_state_dict.
  torch.load warm   the same with the file in the page cache (a restore right after the save).
  fresh memory  a memfd of the same size mapped and faulted in here (the kernel allocates and
            zeroes every page): what any restore into a fresh trainer's new memory pays first.
  fio read  O_DIRECT sequential read of a file of the same size in the same directory (bs=16M,
            libaio, iodepth 4 and 8, the better): what the disk gives.

Every ckptd restore is checked (outside the clock): the bytes equal the saved ones, and
last_restore says where they came from (hot: all from memory; cold: all from storage).
Checkpointer.load includes moving the fresh tensors into shared memory and registering them
(Tensor.share_memory_() copies each storage once), as it does in a restarted trainer.

    PYTHONPATH=build/python /usr/bin/python3 bench/python/load.py [--bin build/bin] [--dir /tmp]
        [--size 1GiB] [--rounds 3] [--json out.json]
"""
import argparse
import json
import mmap
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import torch

import ckptd
import ckptd.torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from stall import Daemon, build_state, filesystem_of, fmt_size, loadavg, parse_size  # noqa: E402

MiB = 1 << 20


def fresh_trainer(width, layers):
    """A restarted trainer's model (uninitialised) and an AdamW without state."""
    model = torch.nn.Sequential(*[torch.nn.utils.skip_init(torch.nn.Linear, width, width)
                                  for _ in range(layers)])
    return model, torch.optim.AdamW(model.parameters(), lr=1e-4)


def drop_caches():
    """Writes back and drops the page cache; False when the kernel refuses (not root)."""
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError:
        return False


def same_state(a_model, a_opt, b_model, b_opt):
    for x, y in zip(a_model.state_dict().values(), b_model.state_dict().values()):
        if not torch.equal(x, y):
            return False
    for p, q in zip(a_model.parameters(), b_model.parameters()):
        sa, sb = a_opt.state.get(p, {}), b_opt.state.get(q, {})
        for key in ("exp_avg", "exp_avg_sq"):
            if key not in sb or not torch.equal(sa[key], sb[key]):
                return False
    return True


def fio_read(work, nbytes):
    """Best of fio O_DIRECT sequential reads at iodepth 4 and 8 (bytes/s); the file is written
    first (untimed) and removed after."""
    best = 0
    try:
        for rw, depth in (("write", 8), ("read", 4), ("read", 8)):
            out = subprocess.run(
                ["fio", "--name=" + rw, "--rw=" + rw, "--directory=" + work, "--filename=fio.dat",
                 "--bs=16M", "--size=%d" % nbytes, "--direct=1", "--ioengine=libaio",
                 "--iodepth=%d" % depth, "--output-format=json"],
                capture_output=True, text=True, check=True).stdout
            if rw == "read":
                best = max(best, json.loads(out)["jobs"][0]["read"]["bw_bytes"])
    finally:
        try:
            os.unlink(os.path.join(work, "fio.dat"))
        except OSError:
            pass
    return best


class TimedNative:
    """Wraps a ckptd.Client's native connection (its private ``_c``) to add up the time spent
    in its load and register requests: the daemon's part of a restore, without what
    Checkpointer.load does around it in Python (moving fresh tensors into shared arenas,
    allocating the optimizer's state, unpickling). Registering fresh memory is most of it: the
    daemon maps the trainer's new shared memory and faults it in, page by page, which allocates
    and zeroes every page (fresh_memory_floor measures that alone)."""

    def __init__(self, native):
        self._native = native
        self.load_s = 0.0
        self.register_s = 0.0

    def load(self, *args):
        t0 = time.perf_counter()
        try:
            return self._native.load(*args)
        finally:
            self.load_s += time.perf_counter() - t0

    def register(self, *args):
        t0 = time.perf_counter()
        try:
            return self._native.register(*args)
        finally:
            self.register_s += time.perf_counter() - t0

    def __getattr__(self, name):
        return getattr(self._native, name)


MADV_POPULATE_READ = 22  # linux/mman.h, 5.14


def fresh_memory_floor(nbytes):
    """Seconds to make nbytes of fresh shared memory usable, as a restore into a fresh trainer
    must: a memfd of that size, mapped and faulted in (MADV_POPULATE_READ, as the daemon's
    registration does; MAP_POPULATE before 5.14). The kernel allocates and zeroes every 4 KiB
    page: no restore into new memory is faster than this, whoever does it."""
    fd = os.memfd_create("ckpt-bench-fresh")
    try:
        os.ftruncate(fd, nbytes)
        t0 = time.perf_counter()
        m = mmap.mmap(fd, nbytes, flags=mmap.MAP_SHARED)
        try:
            m.madvise(MADV_POPULATE_READ)
        except OSError:
            m.close()
            m = mmap.mmap(fd, nbytes, flags=mmap.MAP_SHARED | mmap.MAP_POPULATE)
        dt = time.perf_counter() - t0
        m.close()
        return dt
    finally:
        os.close(fd)


def ckptd_restore(daemon, job, width, layers):
    """Checkpointer.load(1) into a fresh trainer: (seconds, model, optimizer, last_restore);
    last_restore gains native_load_s and native_register_s, the time inside the daemon's load
    and register requests."""
    client = daemon.client(job)
    native = client._c = TimedNative(client._c)
    model, optimizer = fresh_trainer(width, layers)
    ckpt = ckptd.torch.Checkpointer(client, model, optimizer)
    t0 = time.perf_counter()
    step = ckpt.load(1)
    dt = time.perf_counter() - t0
    if step != 1:
        raise RuntimeError("Checkpointer.load(1) returned %r" % step)
    info = dict(ckpt.last_restore, native_load_s=native.load_s,
                native_register_s=native.register_s)
    client.close()
    return dt, model, optimizer, info


def torch_restore(path, width, layers):
    model, optimizer = fresh_trainer(width, layers)
    t0 = time.perf_counter()
    state = torch.load(path)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    dt = time.perf_counter() - t0
    del state
    return dt


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--bin", default="build/bin", help="directory holding ckptd")
    p.add_argument("--dir", default="/tmp", help="a fresh work directory is made here (a disk)")
    p.add_argument("--size", default="1GiB", help="state size (model + AdamW state)")
    p.add_argument("--layers", type=int, default=4, help="Linear layers of the model")
    p.add_argument("--rounds", type=int, default=3, help="rounds of each restore (median)")
    p.add_argument("--ckptd-arg", action="append", default=[], help="extra ckptd argument")
    p.add_argument("--json", default="", help="write the results as JSON here")
    p.add_argument("--keep", action="store_true", help="keep the work directory")
    args = p.parse_args()

    if not os.path.exists(os.path.join(args.bin, "ckptd")):
        sys.exit("load.py: no ckptd in %s (build the ckptd target, or --bin)" % args.bin)
    torch.set_num_threads(1)
    size = parse_size(args.size)
    work = tempfile.mkdtemp(prefix="ckpt-bench-pyload.", dir=args.dir)
    fs = filesystem_of(work)
    pool = size + 512 * MiB
    date = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    print("load.py: %s, %d cores, torch %s, work dir %s (%s), ckptd from %s, pool %s; load "
          "average %s" % (date, os.cpu_count(), torch.__version__, work, fs, args.bin,
                          fmt_size(pool), loadavg()))
    if fs == "tmpfs":
        print("WARNING: %s is tmpfs: no disk under the cold numbers" % work)
    start = time.perf_counter()
    model, optimizer, width, nbytes = build_state(size, args.layers)
    print("state: %d x Linear(%d, %d) + AdamW state = %.0f MiB" % (args.layers, width, width,
                                                                   nbytes / MiB))
    path = os.path.join(work, "torch_save.pt")
    daemon = Daemon(args.bin, work, pool, args.ckptd_arg)
    hot, cold, tl_cold, tl_warm, fio = [], [], [], [], []
    hot_native, cold_native, hot_register, floor = [], [], [], []
    dropped = True
    try:
        client = daemon.client("load")
        ckpt = ckptd.torch.Checkpointer(client, model, optimizer)
        ckpt.save(1)
        ckpt.fence()
        client.wait(1, "committed")
        ckpt.remove_hook()
        client.close()
        with open(path, "wb") as f:
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, f)
            f.flush()
            os.fsync(f.fileno())
        print("saved step 1 through ckptd and %s with torch.save (%.0f MiB)"
              % (path, os.path.getsize(path) / MiB))

        for r in range(args.rounds):  # hot: right after the save, the daemon still up
            dt, m, o, info = ckptd_restore(daemon, "load", width, args.layers)
            if info["bytes_from_storage"] != 0 or not same_state(model, optimizer, m, o):
                raise RuntimeError("hot restore: wrong bytes or read from storage: %s" % info)
            hot.append(dt)
            hot_native.append(info["native_load_s"])
            hot_register.append(info["native_register_s"])
            del m, o
            floor.append(fresh_memory_floor(nbytes))
        print("hot restores: %s ms (in the daemon's register requests: %s ms, load requests: %s "
              "ms); fresh shared memory of the same size faulted in: %s ms" % (
                  " ".join("%.0f" % (x * 1e3) for x in hot),
                  " ".join("%.0f" % (x * 1e3) for x in hot_register),
                  " ".join("%.0f" % (x * 1e3) for x in hot_native),
                  " ".join("%.0f" % (x * 1e3) for x in floor)))
        for r in range(args.rounds):  # cold, and the baselines of the same round
            daemon.stop()
            dropped &= drop_caches()
            daemon = Daemon(args.bin, work, pool, args.ckptd_arg)
            dt, m, o, info = ckptd_restore(daemon, "load", width, args.layers)
            if info["bytes_from_memory"] != 0 or not same_state(model, optimizer, m, o):
                raise RuntimeError("cold restore: wrong bytes or served from memory: %s" % info)
            cold.append(dt)
            cold_native.append(info["native_load_s"])
            del m, o
            dropped &= drop_caches()
            tl_cold.append(torch_restore(path, width, args.layers))
            tl_warm.append(torch_restore(path, width, args.layers))
            fio.append(fio_read(work, nbytes))
            print("round %d: ckptd cold %.0f ms (load requests %.0f ms); torch.load cold %.0f ms, "
                  "warm %.0f ms; fio read %.0f MB/s" % (
                      r + 1, cold[-1] * 1e3, cold_native[-1] * 1e3, tl_cold[-1] * 1e3,
                      tl_warm[-1] * 1e3, fio[-1] / 1e6))
            sys.stdout.flush()
    finally:
        daemon.stop()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)

    med = statistics.median
    rate = lambda seconds: nbytes / med(seconds)  # noqa: E731
    rows = [
        ("python cold restore %s vs fio read" % fmt_size(size), rate(cold), med(fio), "(info)"),
        ("python cold restore %s vs torch.load cold" % fmt_size(size), rate(cold), rate(tl_cold),
         "(info)"),
        ("python hot restore %s vs cold" % fmt_size(size), rate(hot), rate(cold), "(info)"),
        ("python hot restore %s vs torch.load warm" % fmt_size(size), rate(hot), rate(tl_warm),
         "(info)"),
        ("python cold, daemon's load requests only, vs fio", rate(cold_native), med(fio),
         "(info)"),
        ("python hot, daemon's load requests only, vs cold", rate(hot_native), rate(cold_native),
         "(info)"),
        # What Python adds around the daemon's work (fresh tensors into arenas, the optimizer's
        # state, unpickling): the whole Checkpointer.load against its register and load
        # requests, same bytes, same restores. Registering the fresh memory faults it in, which
        # the load requests did themselves before registration moved off the daemon's loop.
        ("python hot restore %s vs the daemon's hot requests (register + load)" % fmt_size(size),
         rate(hot), rate([a + b for a, b in zip(hot_register, hot_native)]), ">= 0.5"),
        ("python hot restore %s vs the daemon's hot load requests alone" % fmt_size(size),
         rate(hot), rate(hot_native), "(info)"),
        ("python hot, daemon's register requests vs fresh memory faulted in",
         rate(hot_register), rate(floor), "(info)"),
    ]
    table = []
    for metric, ck, base, goal in rows:
        ratio = ck / base
        # The other goals apply to the daemon's load path: bench/load (see bench/README.md).
        met = ratio >= 0.5 if goal == ">= 0.5" else None
        table.append({"metric": metric, "ckptd": "%.0f MB/s" % (ck / 1e6),
                      "baseline": "%.0f MB/s" % (base / 1e6), "ratio": ratio, "goal": goal,
                      "met": met})
    total = time.perf_counter() - start
    results = {"date": date, "cores": os.cpu_count(), "torch": torch.__version__,
               "work_dir_filesystem": fs, "state_bytes": nbytes, "page_cache_dropped": dropped,
               "ckptd_hot_s": hot, "ckptd_cold_s": cold, "ckptd_hot_native_load_s": hot_native,
               "ckptd_cold_native_load_s": cold_native,
               "ckptd_hot_native_register_s": hot_register, "fresh_memory_floor_s": floor,
               "torch_load_cold_s": tl_cold,
               "torch_load_warm_s": tl_warm, "fio_read_bytes_per_s": fio,
               "total_seconds": total, "loadavg_end": loadavg(), "table": table}
    if not dropped:
        print("NOTE: the page cache could not be dropped (not root): torch.load 'cold' may have "
              "read from memory")
    print("\n== summary (%.0f s; load average at end %s)\n" % (total, loadavg()))
    for t in table:
        print("| %-45s | %10s | %10s | %6.2f | %-6s | %-4s |" % (
            t["metric"], t["ckptd"], t["baseline"], t["ratio"], t["goal"],
            "-" if t["met"] is None else "yes" if t["met"] else "NO"))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
        print("\nJSON: %s" % args.json)


if __name__ == "__main__":
    main()
