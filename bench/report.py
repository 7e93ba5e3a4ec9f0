#!/usr/bin/python3
"""bench/run's report: one table of ratios from the benchmarks' JSON, the plots, the README.

Reads what bench/run left in --results (machine.json, storage.json, daemon.json,
daemon_cache.json, load.json, stall.json, pyload.json, pyscale.json, rss.json; any may be missing
when a benchmark was skipped or failed) and:
  - prints one table: first the goals of the numbers page (each a ratio to a baseline measured
    in the same run), then every row of every benchmark's own table;
  - writes summary.json (the same rows) and summary.md (the table as Markdown);
  - draws stall_vs_size.png, train_loop.png, train_loop_cache.png, throughput.png,
    save_latency_vs_tensors.png and rss_vs_pool.png with matplotlib (Agg: no display needed);
  - with --readme, replaces the generated section of bench/README.md (between the two marker
    lines) with the table, where and when it was produced, and how busy the machine was.

    /usr/bin/python3 bench/report.py --results bench/results [--readme bench/README.md]
"""
import argparse
import json
import math
import os
import re
import statistics
import sys

BEGIN = "<!-- bench/run: generated section, rewritten by bench/report.py; edit the script -->"
END = "<!-- bench/run: end of generated section -->"
MiB = 1 << 20


def load_json(results, name):
    path = os.path.join(results, name + ".json")
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def row(bench, metric, ckptd, baseline, ratio, goal, met):
    return {"bench": bench, "metric": metric, "ckptd": ckptd, "baseline": baseline,
            "ratio": ratio, "goal": goal, "met": met}


def ms(seconds):
    return "%.2f ms" % (seconds * 1e3) if seconds < 0.1 else "%.0f ms" % (seconds * 1e3)


def mbps(bytes_per_s):
    return "%.0f MB/s" % (bytes_per_s / 1e6)


# ---------------------------------------------------------------------------- goals

def goal_rows(r):
    """The goals of the numbers page, where their benchmark ran."""
    out = []
    stall = r.get("stall")
    if stall and stall.get("sizes"):
        worst = None
        for s in stall["sizes"]:
            ck = s["ckptd_stall_median_s"]
            for key, what in (("torch_save_nofsync_s", "torch.save"),
                              ("torch_save_fsync_s", "torch.save+fsync")):
                base = statistics.median(s[key])
                ratio = base / ck if ck > 0 else math.inf
                if worst is None or ratio < worst[0]:
                    worst = (ratio, ck, base, what, s["size"])
        ratio, ck, base, what, size = worst
        out.append(row("stall", "GOAL trainer stall per checkpoint vs torch.save (worst of %d "
                       "sizes: %d MiB, vs %s)" % (len(stall["sizes"]), size // MiB, what),
                       ms(ck), ms(base), ratio, ">= 100x", ratio >= 100))
    daemon = (r.get("daemon") or {}).get("results", {})
    if "train.every1.ckptd_overhead" in daemon:
        over = daemon["train.every1.ckptd_overhead"]
        sync = daemon.get("train.every1.sync_overhead", 0)
        out.append(row("daemon", "GOAL training loop overhead, checkpoint every step (%.0f MiB "
                       "state)" % (daemon.get("train.bytes", 0) / MiB),
                       "%+.1f %%" % (over * 100), "%+.1f %% sync save" % (sync * 100),
                       max(over, 0) / sync if sync > 0 else 0, "<= 5 %", over <= 0.05))
    for name, res in (("daemon", daemon),
                      ("daemon_cache", (r.get("daemon_cache") or {}).get("results", {}))):
        # Scheduling-proof view of the loop: the trainer's compute CPU time per step with ckptd
        # checkpointing every step vs without; wall time above it is time spent off the CPU.
        if "train.every1.ckptd_compute_cpu_s" in res and res.get("train.none_compute_cpu_s"):
            c, n = res["train.every1.ckptd_compute_cpu_s"], res["train.none_compute_cpu_s"]
            out.append(row(name, "trainer compute CPU time per step, every step vs never "
                           "(wall: %.0f vs %.0f ms)" % (res["train.every1.ckptd_compute_s"] * 1e3,
                                                        res["train.none_compute_s"] * 1e3),
                           ms(c), ms(n), c / n, "(info)", None))
    cache = (r.get("daemon_cache") or {}).get("results", {})
    if "train.every1.ckptd_overhead" in cache:
        over = cache["train.every1.ckptd_overhead"]
        sync = cache.get("train.every1.sync_overhead", 0)
        out.append(row("daemon_cache", "training loop overhead, checkpoint every step, compute "
                       "in cache", "%+.1f %%" % (over * 100), "%+.1f %% sync save" % (sync * 100),
                       max(over, 0) / sync if sync > 0 else 0, "(info)", None))
    if "flush.bytes_per_s" in daemon:
        c, f = daemon["flush.bytes_per_s"], daemon["flush.fio_bytes_per_s"]
        out.append(row("daemon", "GOAL flush (save -> persisted) vs fio O_DIRECT write", mbps(c),
                       mbps(f), c / f, ">= 0.9", c / f >= 0.9))
    for t in (r.get("load") or {}).get("table", []):
        if t["metric"].startswith("cold load,"):
            out.append(row("load", "GOAL cold load vs fio O_DIRECT read", t["ckptd"],
                           t["baseline"], t["ratio"], ">= 0.9", t["ratio"] >= 0.9))
        if t["metric"].startswith("hot restore,"):
            out.append(row("load", "GOAL hot restore vs cold load", t["ckptd"], t["baseline"],
                           t["ratio"], ">= 5x", t["ratio"] >= 5))
    rows = (r.get("pyscale") or {}).get("rows", [])
    for what in ("Client.save", "Checkpointer.save"):
        sel = sorted((x for x in rows if x["what"] == what), key=lambda x: x["tensors"])
        if len(sel) >= 2:
            lo, hi = sel[0], sel[-1]
            ratio = hi["p50_ms"] / lo["p50_ms"]
            out.append(row("pyscale", "GOAL %s p50 at %d tensors vs at %d" % (
                what, hi["tensors"], lo["tensors"]), "%.3f ms" % hi["p50_ms"],
                "%.3f ms" % lo["p50_ms"], ratio, "<= 2x", ratio <= 2))
        if what == "Client.save" and sel:
            hi = sel[-1]
            out.append(row("pyscale", "GOAL Client.save p99 at %d tensors" % hi["tensors"],
                           "%.3f ms" % hi["p99_ms"], "1 ms", hi["p99_ms"], "< 1 ms",
                           hi["p99_ms"] < 1))
        if what == "Checkpointer.save" and sel and sel[-1].get("fds") is not None:
            hi = sel[-1]
            out.append(row("pyscale", "GOAL trainer descriptors, Checkpointer of %d tensors"
                           % hi["tensors"], str(hi["fds"]), "64", hi["fds"], "<= 64",
                           hi["fds"] <= 64))
    if "capture.bytes_per_s" in daemon:
        c, m = daemon["capture.bytes_per_s"], daemon["capture.memcpy_bytes_per_s"]
        out.append(row("daemon", "capture (save -> snapshot) vs single-thread memcpy", mbps(c),
                       mbps(m), c / m, "(info)", None))
    return out


def all_rows(r):
    out = []
    for bench in ("storage", "daemon", "daemon_cache", "load", "stall", "pyload", "rss"):
        for t in (r.get(bench) or {}).get("table", []):
            out.append(row(bench, t["metric"], t["ckptd"], t["baseline"], t["ratio"], t["goal"],
                           t["met"]))
    return out


def fmt_ratio(x):
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    if math.isinf(x):
        return "inf"
    return "%.2f" % x if x < 10 else "%.0f" % x


def met_text(m):
    return "-" if m is None else "yes" if m else "NO"


def markdown_table(rows):
    lines = ["| bench | metric | ckptd | baseline | ratio | goal | met? |",
             "|---|---|--:|--:|--:|---|---|"]
    for x in rows:
        lines.append("| %s | %s | %s | %s | %s | %s | %s |" % (
            x["bench"], x["metric"], x["ckptd"], x["baseline"], fmt_ratio(x["ratio"]), x["goal"],
            met_text(x["met"])))
    return "\n".join(lines)


def print_table(rows):
    cols = [[x["bench"], x["metric"], x["ckptd"], x["baseline"], fmt_ratio(x["ratio"]),
             x["goal"], met_text(x["met"])] for x in rows]
    head = ["bench", "metric", "ckptd", "baseline", "ratio", "goal", "met?"]
    w = [max(len(h), *(len(c[i]) for c in cols)) if cols else len(h) for i, h in enumerate(head)]
    right = {2, 3, 4}
    fmt = lambda c: "| " + " | ".join(  # noqa: E731
        c[i].rjust(w[i]) if i in right else c[i].ljust(w[i]) for i in range(len(c))) + " |"
    print(fmt(head))
    print("|" + "|".join("-" * (x + 2) for x in w) + "|")
    for c in cols:
        print(fmt(c))


# ---------------------------------------------------------------------------- plots

def plots(r, out):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    made = []

    def save(fig, name, what):
        fig.tight_layout()
        fig.savefig(os.path.join(out, name), dpi=110)
        plt.close(fig)
        made.append((name, what))

    stall = r.get("stall")
    if stall and stall.get("sizes"):
        sizes = [s["state_bytes"] / MiB for s in stall["sizes"]]
        fig, ax = plt.subplots(figsize=(7, 4.5))
        series = [("ckptd (save + fence)", [s["ckptd_stall_median_s"] for s in stall["sizes"]]),
                  ("torch.save + fsync", [statistics.median(s["torch_save_fsync_s"])
                                          for s in stall["sizes"]]),
                  ("torch.save (page cache)", [statistics.median(s["torch_save_nofsync_s"])
                                               for s in stall["sizes"]])]
        if all(s.get("snapshot_thread_stall_s") for s in stall["sizes"]):
            series.append(("snapshot + background thread",
                           [statistics.median(s["snapshot_thread_stall_s"])
                            for s in stall["sizes"]]))
        for label, v in series:
            ax.plot(sizes, [x * 1e3 for x in v], marker="o", label=label)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("state size (model + AdamW), MiB")
        ax.set_ylabel("trainer stall per checkpoint, ms (median)")
        ax.set_title("Trainer-visible stall per checkpoint")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
        save(fig, "stall_vs_size.png", "trainer-visible stall per checkpoint vs state size")

    def train_plot(d, name, what):
        if "train.none_step_s" not in d:
            return
        bars = [("never", d["train.none_step_s"])]
        for key, label in (("every10", "every 10 steps"), ("every1", "every step")):
            for who in ("ckptd", "sync"):
                k = "train.%s.%s_step_s" % (key, who)
                if k in d:
                    bars.append(("%s\n%s" % (label, "ckptd" if who == "ckptd" else "sync save"),
                                 d[k]))
        fig, ax = plt.subplots(figsize=(7.5, 4.5))
        xs = range(len(bars))
        colors = ["#888888"] + ["#1f77b4" if "ckptd" in b[0] else "#d62728" for b in bars[1:]]
        ax.bar(xs, [b[1] * 100 for b in bars], color=colors)
        for x, b in zip(xs, bars):
            ax.text(x, b[1] * 100, "%+.1f%%" % ((b[1] / bars[0][1] - 1) * 100) if x else "",
                    ha="center", va="bottom", fontsize=9)
        ax.set_xticks(list(xs))
        ax.set_xticklabels([b[0] for b in bars], fontsize=8)
        ax.set_ylabel("end-to-end time of 100 steps, s")
        buffer = d.get("train.compute_buffer_bytes", 64 * MiB)
        ax.set_title("Training loop, %.0f MiB state, ~%.0f ms compute/step over %s" % (
            d.get("train.bytes", 0) / MiB, d.get("train.none_compute_s", 0) * 1e3,
            "%.0f MiB" % (buffer / MiB) if buffer >= MiB else "%.0f KiB (in cache)" % (
                buffer / 1024)), fontsize=10)
        save(fig, name, what)

    d = (r.get("daemon") or {}).get("results", {})
    train_plot(d, "train_loop.png", "end-to-end time of a training loop checkpointing every "
               "step, every 10 steps, never (memory-bound compute)")
    train_plot((r.get("daemon_cache") or {}).get("results", {}), "train_loop_cache.png",
               "the same with the compute in cache")

    pairs = []  # (label, ckptd B/s, baseline B/s, baseline label)
    if "capture.bytes_per_s" in d:
        pairs.append(("capture", d["capture.bytes_per_s"], d["capture.memcpy_bytes_per_s"],
                      "memcpy"))
    if "flush.bytes_per_s" in d:
        pairs.append(("flush", d["flush.bytes_per_s"], d["flush.fio_bytes_per_s"], "fio write"))
    num = lambda s: float(re.match(r"\s*([\d.]+)", s).group(1)) * 1e6  # noqa: E731
    names = {"cold load,": ("cold load", "fio read"), "hot restore,": ("hot restore", "cold load"),
             "cold resharded load, 4 rows -> 1": ("resharded 4->1", "cold load"),
             "cold resharded load": ("resharded 4->3 cols", "cold load")}
    for t in (r.get("load") or {}).get("table", []):
        for prefix, (label, base) in names.items():
            if t["metric"].startswith(prefix):
                pairs.append((label, num(t["ckptd"]), num(t["baseline"]), base))
                break
    py = r.get("pyload")
    if py:
        n = py["state_bytes"]
        pairs.append(("python cold restore", n / statistics.median(py["ckptd_cold_s"]),
                      n / statistics.median(py["torch_load_cold_s"]), "torch.load cold"))
        pairs.append(("python hot restore", n / statistics.median(py["ckptd_hot_s"]),
                      n / statistics.median(py["torch_load_warm_s"]), "torch.load warm"))
    if pairs:
        fig, ax = plt.subplots(figsize=(8, 0.55 * len(pairs) + 1.5))
        ys = list(range(len(pairs)))[::-1]
        ax.barh([y + 0.2 for y in ys], [p[1] / 1e6 for p in pairs], height=0.4, label="ckptd",
                color="#1f77b4")
        ax.barh([y - 0.2 for y in ys], [p[2] / 1e6 for p in pairs], height=0.4,
                label="baseline (same run)", color="#bbbbbb")
        for y, p in zip(ys, pairs):
            ax.text(p[1] / 1e6, y + 0.2, " %.2fx %s" % (p[1] / p[2], p[3]), va="center",
                    fontsize=8)
        ax.set_yticks(ys)
        ax.set_yticklabels([p[0] for p in pairs], fontsize=9)
        ax.set_xscale("log")
        ax.set_xlabel("MB/s (log)")
        ax.set_title("Throughput vs same-run baselines")
        ax.legend(loc="lower right", fontsize=8)
        save(fig, "throughput.png", "capture, flush, loads and restores against memcpy, fio "
             "and torch.load")

    lat = {}
    for k, v in d.items():
        m = re.match(r"save\.(\d+)B_(\d+)t\.(save|rpc)\.(p50|p99)_s$", k)
        if m:  # n tensors of equal size leave a few bytes out: group by the nearest 2^k
            size = 1 << round(math.log2(int(m.group(1))))
            lat.setdefault(size, {}).setdefault(int(m.group(2)), {})[
                m.group(3) + "_" + m.group(4)] = v
    # The state size with the most tensor counts is the tensor-count sweep.
    sweep = max(lat.items(), key=lambda kv: len(kv[1]), default=None)
    if sweep and len(sweep[1]) > 1:
        counts = sorted(sweep[1])
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for key, label, style in (("save_p50", "save() p50", "o-"), ("save_p99", "save() p99",
                                                                     "s-"),
                                  ("rpc_p50", "empty request p50", "o--"),
                                  ("rpc_p99", "empty request p99", "s--")):
            ax.plot(counts, [sweep[1][c].get(key, math.nan) * 1e3 for c in counts], style,
                    label=label)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("tensors registered (%d MiB state)" % (sweep[0] // MiB))
        ax.set_ylabel("latency, ms")
        ax.set_title("save() latency vs number of tensors")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
        save(fig, "save_latency_vs_tensors.png", "save() latency vs number of tensors")

    rss = r.get("rss")
    if rss and rss.get("pools"):
        p = [x["pool_bytes"] / MiB for x in rss["pools"]]
        fig, ax = plt.subplots(figsize=(7, 4.5))
        ax.plot(p, [x["rss_bytes"] / MiB for x in rss["pools"]], "o-", label="ckptd RSS")
        ax.plot(p, p, "--", color="#888888", label="pool size")
        for x in rss["pools"]:
            ax.annotate("+%.0f MiB" % ((x["rss_bytes"] - x["pool_bytes"]) / MiB),
                        (x["pool_bytes"] / MiB, x["rss_bytes"] / MiB), textcoords="offset points",
                        xytext=(4, -12), fontsize=8)
        ax.set_xlabel("--host-pool, MiB")
        ax.set_ylabel("resident memory, MiB")
        ax.set_title("Daemon RSS vs pool size (idle daemon)")
        ax.grid(True, alpha=0.3)
        ax.legend()
        save(fig, "rss_vs_pool.png", "daemon RSS vs pool size")
    return made


# ---------------------------------------------------------------------------- README

def readme_section(machine, args, goals, rows, figures, results_rel):
    quick = machine.get("mode") == "quick"
    lines = [BEGIN, "", "### Latest `bench/run` results", ""]
    if quick:
        lines += ["**`--quick` run: small sizes, one or two rounds. It checks that every "
                  "benchmark, the table and the plots work; its numbers are not results.**", ""]
    lines.append("Produced by `bench/run%s` on %s, host `%s`: %s, %d cores, %.0f GiB, kernel %s, "
                 "work directory on %s; pinning: %s. Took %d s." % (
                     " --quick" if quick else "", machine.get("date", "?"),
                     machine.get("host", "?"), machine.get("cpu", "?"), machine.get("cores", 0),
                     machine.get("memory_bytes", 0) / (1 << 30), machine.get("kernel", "?"),
                     machine.get("filesystem", "?"), machine.get("pinning", "?"), args.seconds))
    lines.append("")
    lines.append("Machine load: load average %s at the start (other processes used %.2f cores "
                 "just before) and %s at the end." % (machine.get("loadavg_start", "?"),
                                                       machine.get("others_cores_start", 0),
                                                       args.loadavg_end))
    if machine.get("busy"):
        lines += ["", "**WARNING: the machine was busy when this ran; the numbers are suspect "
                  "(other work shared the two cores). Run `bench/run` again on a quiet machine "
                  "before quoting them.**"]
    if args.failed:
        lines += ["", "Failed or cut short: %s (logs in `%s/`)." % (", ".join(args.failed),
                                                                    results_rel)]
    lines += ["", "Goals first, then every benchmark's own rows; each ratio is ckptd against a "
              "baseline measured in the same run.", "", markdown_table(goals + rows), ""]
    if figures:
        lines.append("Figures (in `%s/`, with the JSON and logs of the run):" % results_rel)
        lines.append("")
        for name, what in figures:
            lines.append("- [%s](results/%s): %s" % (name, name, what))
        lines.append("")
    lines.append(END)
    return "\n".join(lines)


def update_readme(path, section):
    with open(path) as f:
        text = f.read()
    if BEGIN in text and END in text:
        a = text.index(BEGIN)
        b = text.index(END) + len(END)
        text = text[:a] + section + text[b:]
    else:
        text = text.rstrip("\n") + "\n\n" + section + "\n"
    with open(path, "w") as f:
        f.write(text)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--results", required=True, help="bench/run's output directory")
    p.add_argument("--readme", default="", help="rewrite the generated section of this README")
    p.add_argument("--seconds", type=int, default=0, help="how long the benchmarks took")
    p.add_argument("--loadavg-end", default="?", help="load average when they ended")
    p.add_argument("--failed", action="append", default=[], help="a benchmark that failed")
    args = p.parse_args()

    r = {name: load_json(args.results, name)
         for name in ("machine", "storage", "daemon", "daemon_cache", "load", "stall", "pyload",
                      "pyscale", "rss")}
    machine = r["machine"] or {}
    goals, rows = goal_rows(r), all_rows(r)
    print("== bench/run summary (%s run, %s, load average at start %s, at end %s)%s\n" % (
        machine.get("mode", "?"), machine.get("date", "?"), machine.get("loadavg_start", "?"),
        args.loadavg_end, "  BUSY MACHINE: numbers suspect" if machine.get("busy") else ""))
    print_table(goals + rows)
    figures = plots(r, args.results)
    with open(os.path.join(args.results, "summary.json"), "w") as f:
        json.dump({"machine": machine, "seconds": args.seconds, "loadavg_end": args.loadavg_end,
                   "failed": args.failed, "goals": goals, "rows": rows,
                   "figures": [n for n, _ in figures]}, f, indent=2)
    readme_dir = os.path.dirname(os.path.abspath(args.readme)) if args.readme else ""
    results_rel = (os.path.relpath(os.path.abspath(args.results), os.path.dirname(readme_dir))
                   if readme_dir else args.results)
    section = readme_section(machine, args, goals, rows, figures, results_rel)
    with open(os.path.join(args.results, "summary.md"), "w") as f:
        f.write(section + "\n")
    print("\nresults: %s (summary.json, summary.md, %s)" % (
        args.results, ", ".join(n for n, _ in figures) or "no figures"))
    if args.readme:
        update_readme(args.readme, section)
        print("updated the generated section of %s" % args.readme)
    missed = [g["metric"] for g in goals if g["met"] is False]
    if missed:
        print("goals missed: %s (bench/README.md says why)" % "; ".join(missed))
    return 0


if __name__ == "__main__":
    sys.exit(main())
