#!/usr/bin/python3
"""Save latency against tensor count: ckptd.Client.save, ckptd.torch.Checkpointer.save and the
C++ client side by side, with the descriptors the trainer holds.

For each count N (default 300, 1,000, 3,000, 10,000), against one ckptd started here:

  Client.save         a dict of N float32 tensors holding 64 MiB together, saved step after
                      step (save → wait_snapshot → wait committed, only save timed), after a
                      first save that shares and registers them (reported apart).
  Checkpointer.save   a model of N/4 parameters (N/8 square Linear layers) with AdamW after one
                      real optimizer step, so about N tensors with the moments and steps, and
                      64 MiB of parameters and moments at every N (the width shrinks as the
                      count grows). Each save is followed by a real training step in the usual
                      order — zero_grad, forward and backward, the fence, opt.step() — and the
                      commit wait, so the save comes right after opt.step(). Timed is
                      Checkpointer.save alone. The step matters: without it the 300-tensor
                      state of a toy model stays in the CPU's cache between saves while a
                      10,000-tensor one cannot, and the ratio measures the cache, not ckptd.
  C++ client          bench_daemon's save section (the same daemon binary; 64 MiB in N tensors
                      of one memfd), run with --sections save when --cpp is given.

Per row: median, p99 and max over --saves saves, the median of the wait_snapshot (Client) or
fence (Checkpointer) — where a held save's memory check runs when the client's thread has not
run it yet (client/python/ckptd/held_save.py): the Client loop calls it right after the save and
gives that thread no time, the Checkpointer loop after forward and backward — and the
descriptors this process holds
(/proc/self/fd) after the saves. Goal (bench/README.md): p50 at 10,000 tensors ≤ 2× p50 at 300,
Client.save p99 < 1 ms at 10,000; descriptors ≤ 64 for the 10,000-tensor Checkpointer.

    PYTHONPATH=build/python /usr/bin/python3 bench/python/scale.py --bin build/bin \
        [--counts 300,1000,3000,10000] [--saves 60] [--dir /tmp] [--json out.json] [--cpp]
        [--work-ms 20] [--on-full skip] [--zero-grad-before-save] [--plot out.png]
        [--from-json earlier.json --plot out.png]

--zero-grad-before-save moves zero_grad(set_to_none=True) between opt.step() and the save, as
loops that clear gradients at the end of a step do. Freeing the gradients leaves glibc chunks
to sort, ~0.4 µs each, which the next allocation missing malloc's per-thread cache sorts, whoever
makes it: the save pays ~1 ms at 10,000 tensors (2,500 gradients). The flag adds a baseline row per
count: the same loop with an 8 KiB bytearray allocated, and timed, right before each save.

--on-full skip saves with on_full="skip", which the client does not post: save() waits for the
daemon's answer (the pool never fills here, so nothing is skipped). Against the default, it
measures what posting a save takes off the trainer's path (ckpt::SaveOptions::post).
"""
import argparse
import json
import math
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

import torch

import ckptd
import ckptd.torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from stall import Daemon, loadavg  # noqa: E402

MiB = 1 << 20


def fds():
    return len(os.listdir("/proc/self/fd"))


def percentile(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def summary(times, first, n, what, fd_count, fences):
    ms = [t * 1e3 for t in times]
    return {"what": what, "tensors": n, "first_ms": first * 1e3, "p50_ms": statistics.median(ms),
            "p99_ms": percentile(ms, 0.99), "max_ms": max(ms), "saves": len(ms), "fds": fd_count,
            "fence_p50_ms": statistics.median(fences) * 1e3}


def work(ms, _a=[]):
    """About `ms` of GIL-free compute (matrix products), standing in for forward and backward
    between a save and its fence. 0: none."""
    if ms <= 0:
        return
    if not _a:
        _a.append(torch.randn(256, 256))
    end = time.perf_counter() + ms / 1e3
    while time.perf_counter() < end:
        torch.mm(_a[0], _a[0])


def bench_client(daemon, n, saves, step0, work_ms=0, on_full="wait"):
    client = daemon.client("scale-client-%d" % n)
    numel = (64 * MiB // 4) // n
    tensors = {"layer.%05d.weight" % i: torch.full((numel,), float(i)) for i in range(n)}
    t0 = time.perf_counter()
    client.save(step0, tensors)
    first = time.perf_counter() - t0
    client.wait(step0, "committed", timeout=120)
    times, fences = [], []
    for k in range(1, saves + 1):
        t0 = time.perf_counter()
        client.save(step0 + k, tensors, on_full=on_full)
        t1_save = time.perf_counter()
        work(work_ms)
        t1 = time.perf_counter()
        client.wait_snapshot()
        times.append(t1_save - t0)
        fences.append(time.perf_counter() - t1)
        client.wait(step0 + k, "committed", timeout=120)
    row = summary(times, first, n, "Client.save", fds(), fences)
    client.close()
    return row


STATE_BYTES = 64 * MiB  # parameters + both AdamW moments, the same at every count


def build_model(n):
    """About n tensors after one optimizer step: n/8 Linear layers (weight + bias, each with
    exp_avg, exp_avg_sq and step: 8 tensors), square, sized so that parameters and moments
    hold STATE_BYTES together at every count, as the Client rows do. Returns model, optimizer
    and one training step (forward, backward) whose batch fits the width."""
    layers = max(1, n // 8)
    width = max(4, int(math.sqrt(STATE_BYTES / 3 / 4 / layers)))
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(layers)])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randn(4, width)

    def forward_backward():
        model(x).sum().backward()

    forward_backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return model, opt, forward_backward


def bench_checkpointer(daemon, n, saves, step0, work_ms=0, on_full="wait",
                       zero_grad_before_save=False, allocate_first=False):
    """The Checkpointer row. ``allocate_first`` (with ``zero_grad_before_save``): an 8 KiB
    bytearray is allocated, and timed, right before each save — the baseline that takes glibc's
    sorting of the freed gradients off the save (--zero-grad-before-save)."""
    client = daemon.client("scale-ckpt-%d" % n)
    model, opt, forward_backward = build_model(n)
    ck = ckptd.torch.Checkpointer(client, model, opt, on_error="raise")
    t0 = time.perf_counter()
    ck.save(step0)
    first = time.perf_counter() - t0
    client.wait(step0, "committed", timeout=120)
    count = len(model.state_dict()) + sum(
        sum(1 for v in s.values() if torch.is_tensor(v)) for s in opt.state.values())
    times, fences, allocations = [], [], []
    for k in range(1, saves + 1):
        if allocate_first:
            t0 = time.perf_counter()
            bytearray(8192)
            allocations.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        ck.save(step0 + k, on_full=on_full)
        t1_save = time.perf_counter()
        if not zero_grad_before_save:
            opt.zero_grad(set_to_none=True)
        forward_backward()
        work(work_ms)
        t1 = time.perf_counter()
        ck.fence()
        times.append(t1_save - t0)
        fences.append(time.perf_counter() - t1)
        opt.step()  # the pre-step hook's fence has nothing left to wait for
        if zero_grad_before_save:
            opt.zero_grad(set_to_none=True)
        client.wait(step0 + k, "committed", timeout=120)
    row = summary(times, first, count, "Checkpointer.save", fds(), fences)
    if allocate_first:
        row["what"] = "Checkpointer.save after an 8 KiB allocation"
        row["allocation_p50_ms"] = statistics.median(allocations) * 1e3
    ck.remove_hook()
    client.close()
    return row


def bench_cpp(bin_dir, work, counts, saves):
    """bench_daemon's save section with 64 MiB in each count of tensors; [] when not built."""
    exe = os.path.join(bin_dir, "bench_daemon")
    if not os.access(exe, os.X_OK):
        return []
    out = os.path.join(work, "cpp.json")
    configs = ["64MiB:%d" % n for n in counts]
    subprocess.run([exe, "--sections", "save", "--save-configs"] + configs + [
                    "--save-samples", str(saves), "--dir", work, "--json", out, "--bin", bin_dir],
                   check=True, stdout=subprocess.DEVNULL)
    with open(out) as f:
        data = json.load(f)
    data = data.get("results", data)
    rows = []
    for key in sorted(data):
        # save.<bytes>B_<tensors>t.save.p50_s (bytes rounded down to a multiple of the count)
        m = re.fullmatch(r"save\.(\d+)B_(\d+)t\.save\.p50_s", key)
        if not m:
            continue
        prefix = key[:-len("p50_s")]
        rows.append({"what": "C++ Client::Save", "tensors": int(m.group(2)), "first_ms": None,
                     "p50_ms": data[prefix + "p50_s"] * 1e3, "p99_ms": data[prefix + "p99_s"] * 1e3,
                     "max_ms": data[prefix + "max_s"] * 1e3, "saves": data[prefix + "samples"],
                     "fds": None, "fence_p50_ms": None})
    rows.sort(key=lambda r: r["tensors"])
    return rows


def plot(rows, path):
    """p50 and p99 of each call against tensor count, on log axes (matplotlib, no display)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for what, color in (("Client.save", "C0"), ("Checkpointer.save", "C1"),
                        ("C++ Client::Save", "C2")):
        sel = sorted((r for r in rows if r["what"] == what), key=lambda r: r["tensors"])
        if not sel:
            continue
        xs = [r["tensors"] for r in sel]
        ax.plot(xs, [r["p50_ms"] for r in sel], "o-", color=color, label=what + " p50")
        ax.plot(xs, [r["p99_ms"] for r in sel], "s--", color=color, alpha=0.5,
                label=what + " p99")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("tensors per rank")
    ax.set_ylabel("save() latency, ms")
    ax.set_title("save() latency vs tensor count (Python and C++ clients)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", default="build/bin")
    ap.add_argument("--dir", default="/tmp")
    ap.add_argument("--counts", default="300,1000,3000,10000")
    ap.add_argument("--saves", type=int, default=60)
    ap.add_argument("--json")
    ap.add_argument("--cpp", action="store_true", help="also run bench_daemon's save section")
    ap.add_argument("--plot", help="write the latency-vs-tensor-count plot here (PNG)")
    ap.add_argument("--from-json", help="plot and print the rows of an earlier --json instead "
                    "of measuring")
    ap.add_argument("--work-ms", type=float, default=0,
                    help="GIL-free compute between each save and its fence (a training step)")
    ap.add_argument("--on-full", choices=("wait", "skip"), default="wait",
                    help="skip: saves that wait for the daemon's answer (not posted)")
    ap.add_argument("--zero-grad-before-save", action="store_true",
                    help="Checkpointer loop: opt.zero_grad(set_to_none=True) between opt.step() "
                    "and the save, not before forward; adds the baseline row with an 8 KiB "
                    "allocation before each save")
    args = ap.parse_args()
    counts = [int(c) for c in args.counts.split(",")]
    torch.set_num_threads(1)
    rows = []
    if args.from_json:
        with open(args.from_json) as f:
            rows = json.load(f)["rows"]
        if args.plot:
            plot(rows, args.plot)
        return
    with tempfile.TemporaryDirectory(prefix="ckpt-scale-", dir=args.dir) as work:
        daemon = Daemon(args.bin, work, 1 << 30, [])
        try:
            step = 1
            for n in counts:
                rows.append(bench_client(daemon, n, args.saves, step, args.work_ms, args.on_full))
                step += args.saves + 10
                rows.append(bench_checkpointer(daemon, n, args.saves, step, args.work_ms,
                                               args.on_full, args.zero_grad_before_save))
                if args.zero_grad_before_save:
                    step += args.saves + 10
                    rows.append(bench_checkpointer(daemon, n, args.saves, step, args.work_ms,
                                                   args.on_full, True, allocate_first=True))
                step += args.saves + 10
        finally:
            daemon.stop()
        if args.cpp:
            rows += bench_cpp(args.bin, work, counts, args.saves)
    print("load average %s; %d saves per row; %g ms of compute between save and fence; "
          "on_full=%s; zero_grad %s; descriptors of this process after the row"
          % (loadavg(), args.saves, args.work_ms, args.on_full,
             "between opt.step() and the save" if args.zero_grad_before_save
             else "before forward"))
    print("| call | tensors | first save ms | p50 ms | p99 ms | max ms | fence p50 ms | fds |")
    print("|---|--:|--:|--:|--:|--:|--:|--:|")
    for r in rows:
        print("| %s | %d | %s | %.3f | %.3f | %.3f | %s | %s |" % (
            r["what"], r["tensors"], "—" if r["first_ms"] is None else "%.1f" % r["first_ms"],
            r["p50_ms"], r["p99_ms"], r["max_ms"],
            "—" if r["fence_p50_ms"] is None else "%.3f" % r["fence_p50_ms"],
            "—" if r["fds"] is None else r["fds"]))
    for r in rows:
        if "allocation_p50_ms" in r:
            print("%d tensors: the 8 KiB allocation before each save, p50 %.3f ms"
                  % (r["tensors"], r["allocation_p50_ms"]))
    for what in ("Client.save", "Checkpointer.save", "Checkpointer.save after an 8 KiB allocation",
                 "C++ Client::Save"):
        sel = [r for r in rows if r["what"] == what]
        if len(sel) >= 2:
            lo, hi = sel[0], sel[-1]
            print("%s: p50 at %d tensors / p50 at %d = %.2f (goal ≤ 2)"
                  % (what, hi["tensors"], lo["tensors"], hi["p50_ms"] / lo["p50_ms"]))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": rows, "loadavg": loadavg(), "work_ms": args.work_ms,
                       "on_full": args.on_full,
                       "zero_grad_before_save": args.zero_grad_before_save}, f, indent=1)
    if args.plot:
        plot(rows, args.plot)


if __name__ == "__main__":
    main()
