#!/usr/bin/python3
"""The coordinator's curve: bench_coordinator --json from 1,024 to 131,072 ranks, and a plot.

Runs build/bin/bench_coordinator (--no-baseline) at each size, one process per size so each peak
RSS is that size's, and, with --before BIN, a build of the previous coordinator at the sizes
given by --before-sizes (its registration of every rank × tensor is too slow for the large
ones). Writes coordinator_scale.json and coordinator_scale.png (time and RSS vs ranks) into
--results, and prints a Markdown table for bench/README.md.

    /usr/bin/python3 bench/coordinator/scale.py --results bench/results \
        [--before /path/to/old/bench_coordinator --before-sizes 1024,4096 |
         --before-json an/earlier/coordinator_scale.json]
"""
import argparse
import json
import os
import subprocess
import sys

# ranks, pp: TP 8 everywhere, 8 ranks per node, 2,000 tensors per rank.
SIZES = [(1024, 1), (4096, 1), (16384, 1), (32768, 2), (65536, 8), (131072, 16)]


def run(binary, ranks, pp, tensors, json_flag=True):
    cmd = [binary, "--ranks", str(ranks), "--tensors", str(tensors), "--tp", "8",
           "--repeat", "1", "--no-baseline"]
    if pp != 1:
        cmd += ["--pp", str(pp)]
    if json_flag:
        cmd.append("--json")
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return out


def run_before(binary, ranks, tensors):
    """The previous bench_coordinator: no --json/--no-baseline/--pp; parse its table."""
    cmd = ["/usr/bin/time", "-f", "RSS %M", binary, "--ranks", str(ranks), "--tensors",
           str(tensors), "--tp", "8", "--repeat", "1"]
    p = subprocess.run(cmd, check=True, capture_output=True, text=True)
    row = {"ranks": ranks, "tensors": tensors, "pp": 1}
    for line in p.stdout.splitlines():
        if line.startswith("registration of"):
            # registration of N ranks: X ms; plan (the last registration): Y ms
            parts = line.split(":")
            row["registration_ms"] = float(parts[1].split("ms")[0])
            row["plan_ms"] = float(parts[2].split("ms")[0])
        if line.startswith("write-once plan"):
            row["commit_ms"] = float(line.split()[4])
    for line in p.stderr.splitlines():
        if line.startswith("RSS "):
            row["peak_rss_mib"] = int(line.split()[1]) / 1024.0
    return row


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--results", default="bench/results")
    ap.add_argument("--bin", default="build/bin/bench_coordinator")
    ap.add_argument("--tensors", type=int, default=2000)
    ap.add_argument("--max-ranks", type=int, default=131072)
    ap.add_argument("--before", help="a bench_coordinator built from the previous coordinator")
    ap.add_argument("--before-sizes", default="1024,4096")
    ap.add_argument("--before-json",
                    help="take the 'before' rows from an earlier coordinator_scale.json instead "
                         "(the previous coordinator measured in that run)")
    args = ap.parse_args()
    os.makedirs(args.results, exist_ok=True)
    rows = []
    for ranks, pp in SIZES:
        if ranks > args.max_ranks:
            continue
        row = json.loads(run(args.bin, ranks, pp, args.tensors))
        print(json.dumps(row), file=sys.stderr)
        rows.append(row)
    before = []
    if args.before_json:
        with open(args.before_json) as f:
            before = json.load(f)["before"]
    elif args.before:
        for ranks in (int(x) for x in args.before_sizes.split(",")):
            row = run_before(args.before, ranks, args.tensors)
            print("before:", json.dumps(row), file=sys.stderr)
            before.append(row)
    with open(os.path.join(args.results, "coordinator_scale.json"), "w") as f:
        json.dump({"after": rows, "before": before}, f, indent=1)

    print("| ranks (TP 8 × PP × DP) | registered shards | distinct shards | registration (ms) "
          "| plan (ms) | commit (ms) | peak RSS (MiB) |")
    print("|---|--:|--:|--:|--:|--:|--:|")
    for r in rows:
        print(f"| {r['ranks']:,} (8 × {r['pp']} × {r['ranks'] // (8 * r['pp']):,}) "
              f"| {r['registered_shards']:,} | {r['distinct_shards']:,} "
              f"| {r['registration_ms']:,.0f} | {r['plan_ms']:,.0f} | {r['commit_ms']:,.0f} "
              f"| {r['peak_rss_mib']:,.0f} |")
    for r in before:
        print(f"| before: {r['ranks']:,} (8 × 1 × {r['ranks'] // 8:,}) "
              f"| {r['ranks'] * r['tensors']:,} | — | {r.get('registration_ms', 0):,.0f} "
              f"| {r.get('plan_ms', 0):,.0f} | {r.get('commit_ms', 0):,.0f} "
              f"| {r.get('peak_rss_mib', 0):,.0f} |")

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    xs = [r["ranks"] for r in rows]
    for key, label in (("registration_ms", "registration of every rank"),
                       ("plan_ms", "plan"), ("commit_ms", "commit")):
        ax1.plot(xs, [r[key] / 1000 for r in rows], marker="o", label=label)
        if before:
            ax1.plot([r["ranks"] for r in before], [r.get(key, 0) / 1000 for r in before],
                     marker="x", linestyle="--", label=label + " (before)")
    ax1.set_xscale("log", base=2)
    ax1.set_yscale("log")
    ax1.set_xlabel("ranks (TP 8, 2,000 tensors per rank)")
    ax1.set_ylabel("seconds")
    ax1.legend(fontsize=7)
    ax1.grid(True, which="both", alpha=0.3)
    ax2.plot(xs, [r["peak_rss_mib"] for r in rows], marker="o", label="peak RSS")
    if before:
        ax2.plot([r["ranks"] for r in before], [r.get("peak_rss_mib", 0) for r in before],
                 marker="x", linestyle="--", label="peak RSS (before)")
    ax2.set_xscale("log", base=2)
    ax2.set_yscale("log")
    ax2.set_xlabel("ranks")
    ax2.set_ylabel("MiB")
    ax2.legend(fontsize=7)
    ax2.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(os.path.join(args.results, "coordinator_scale.png"), dpi=110)


if __name__ == "__main__":
    main()
