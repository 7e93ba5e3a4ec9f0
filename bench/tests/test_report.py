#!/usr/bin/python3
"""bench/report.py on hand-made results: the goal rows it derives, the plots it draws and the
README section it rewrites (and only that section). Runs report.py as bench/run does, in a
subprocess, on JSON shaped like each benchmark's."""
import json
import os
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
REPORT = os.path.join(os.path.dirname(HERE), "report.py")
PYTHON = sys.executable
MiB = 1 << 20


def write(path, obj):
    with open(path, "w") as f:
        json.dump(obj, f)


def daemon_results(overhead_every1, flush, fio, compute_cpu=(0.1, 0.1)):
    results = {
        "train.bytes": 512 * MiB, "train.none_step_s": 0.5, "train.none_compute_s": 0.49,
        "train.none_compute_cpu_s": compute_cpu[0],
        "train.every1.ckptd_step_s": 0.5 * (1 + overhead_every1),
        "train.every1.sync_step_s": 1.0, "train.every1.ckptd_overhead": overhead_every1,
        "train.every1.sync_overhead": 1.0, "train.every1.ckptd_compute_s": 0.5,
        "train.every1.ckptd_compute_cpu_s": compute_cpu[1],
        "train.every10.ckptd_step_s": 0.51, "train.every10.sync_step_s": 0.6,
        "flush.bytes_per_s": flush, "flush.fio_bytes_per_s": fio,
        "capture.bytes_per_s": 8e9, "capture.memcpy_bytes_per_s": 10e9,
    }
    for n in (10, 100, 1000):
        nbytes = (64 * MiB // n // 4) * 4 * n  # what equal float32 tensors leave of 64 MiB
        key = "save.%dB_%dt" % (nbytes, n)
        for what, p50, p99 in (("save", 1e-4, 5e-4), ("rpc", 9e-5, 3e-4)):
            results["%s.%s.p50_s" % (key, what)] = p50
            results["%s.%s.p99_s" % (key, what)] = p99
    return {"results": results, "table": [
        {"metric": "flush 1.5 GiB", "ckptd": "%.0f MB/s" % (flush / 1e6),
         "baseline": "%.0f MB/s fio" % (fio / 1e6), "ratio": flush / fio, "goal": ">= 0.9",
         "met": flush / fio >= 0.9}]}


class ReportTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.out = os.path.join(self.tmp.name, "results")
        os.mkdir(self.out)
        write(os.path.join(self.out, "machine.json"), {
            "date": "2026-01-01 00:00 UTC", "mode": "full", "host": "h", "kernel": "k",
            "cpu": "c", "cores": 2, "memory_bytes": 1 << 34, "loadavg_start": "0.01 0.02 0.03",
            "others_cores_start": 0.01, "busy": False, "pinning": "none", "dir": "/tmp",
            "filesystem": "ext2/ext3"})
        write(os.path.join(self.out, "daemon.json"),
              daemon_results(overhead_every1=0.03, flush=1.5e9, fio=1.6e9))
        write(os.path.join(self.out, "load.json"), {"results": {}, "table": [
            {"metric": "cold load, 4 ranks rows, same layout", "ckptd": "800 MB/s",
             "baseline": "1000 MB/s fio", "ratio": 0.8, "goal": ">= 0.9", "met": False},
            {"metric": "hot restore, 4 ranks rows, same layout", "ckptd": "6000 MB/s",
             "baseline": "800 MB/s cold", "ratio": 7.5, "goal": ">= 5x", "met": True}]})
        write(os.path.join(self.out, "stall.json"), {"sizes": [
            {"size": s * MiB, "state_bytes": s * MiB, "ckptd_stall_median_s": 0.001,
             "torch_save_fsync_s": [t * 2, t * 2], "torch_save_nofsync_s": [t, t],
             "snapshot_thread_stall_s": [t / 2]}
            for s, t in ((256, 0.2), (1024, 0.8))], "table": []})
        write(os.path.join(self.out, "rss.json"), {"pools": [
            {"pool_bytes": p * MiB, "rss_bytes": (p + 8) * MiB} for p in (256, 1024)],
            "table": []})
        write(os.path.join(self.out, "pyscale.json"), {"rows": [
            {"what": what, "tensors": n, "p50_ms": p50, "p99_ms": p99, "fds": fds}
            for what, n, p50, p99, fds in (("Client.save", 300, 0.25, 0.4, 308),
                                           ("Client.save", 10000, 0.30, 1.5, 10008),
                                           ("Checkpointer.save", 296, 0.2, 0.4, 11),
                                           ("Checkpointer.save", 10000, 0.5, 2.0, 11))]})
        self.readme = os.path.join(self.tmp.name, "README.md")
        with open(self.readme, "w") as f:
            f.write("# Title\n\nbefore\n\n<!-- bench/run: generated section, rewritten by "
                    "bench/report.py; edit the script -->\nold table\n<!-- bench/run: end of "
                    "generated section -->\n\nafter\n")

    def tearDown(self):
        self.tmp.cleanup()

    def report(self, *extra):
        proc = subprocess.run([PYTHON, REPORT, "--results", self.out, "--readme", self.readme,
                               "--seconds", "600", "--loadavg-end", "0.1 0.1 0.1", *extra],
                              capture_output=True, text=True)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        with open(os.path.join(self.out, "summary.json")) as f:
            return json.load(f), proc.stdout

    def goal(self, summary, prefix):
        rows = [g for g in summary["goals"] if g["metric"].startswith(prefix)]
        self.assertEqual(len(rows), 1, [g["metric"] for g in summary["goals"]])
        return rows[0]

    def test_goal_rows_follow_the_numbers(self):
        summary, out = self.report()
        stall = self.goal(summary, "GOAL trainer stall")
        # Worst size (256 MiB) against the cheaper baseline (no fsync): 0.2 s / 1 ms.
        self.assertAlmostEqual(stall["ratio"], 200, places=6)
        self.assertTrue(stall["met"])
        self.assertIn("256 MiB", stall["metric"])
        loop = self.goal(summary, "GOAL training loop overhead")
        self.assertTrue(loop["met"])  # +3 % <= 5 %
        flush = self.goal(summary, "GOAL flush")
        self.assertAlmostEqual(flush["ratio"], 1.5 / 1.6, places=6)
        self.assertTrue(flush["met"])
        self.assertFalse(self.goal(summary, "GOAL cold load")["met"])  # 0.8 < 0.9
        self.assertTrue(self.goal(summary, "GOAL hot restore")["met"])
        self.assertIn("goals missed: GOAL cold load", out)
        flat = self.goal(summary, "GOAL Client.save p50")
        self.assertAlmostEqual(flat["ratio"], 0.30 / 0.25, places=6)
        self.assertTrue(flat["met"])
        self.assertFalse(self.goal(summary, "GOAL Checkpointer.save p50")["met"])  # 2.5x
        self.assertFalse(self.goal(summary, "GOAL Client.save p99")["met"])  # 1.5 ms
        self.assertTrue(self.goal(summary, "GOAL trainer descriptors")["met"])  # 11
        # Every benchmark's own rows follow, tagged with the benchmark.
        self.assertIn(("daemon", "flush 1.5 GiB"),
                      [(r["bench"], r["metric"]) for r in summary["rows"]])

    def test_a_missed_loop_goal_is_reported(self):
        write(os.path.join(self.out, "daemon.json"),
              daemon_results(overhead_every1=0.20, flush=1.0e9, fio=1.6e9,
                             compute_cpu=(0.1, 0.1)))
        summary, out = self.report()
        self.assertFalse(self.goal(summary, "GOAL training loop overhead")["met"])
        self.assertFalse(self.goal(summary, "GOAL flush")["met"])
        cpu = self.goal(summary, "trainer compute CPU time")
        self.assertAlmostEqual(cpu["ratio"], 1.0, places=6)
        self.assertIn("GOAL flush", out)

    def test_plots_are_drawn(self):
        summary, _ = self.report()
        for name in ("stall_vs_size.png", "train_loop.png", "throughput.png",
                     "save_latency_vs_tensors.png", "rss_vs_pool.png"):
            path = os.path.join(self.out, name)
            self.assertIn(name, summary["figures"])
            with open(path, "rb") as f:
                self.assertEqual(f.read(8), b"\x89PNG\r\n\x1a\n", name)
        # No daemon_cache.json: no plot claims to show it.
        self.assertNotIn("train_loop_cache.png", summary["figures"])

    def test_readme_section_is_replaced_and_nothing_else(self):
        self.report()
        with open(self.readme) as f:
            first = f.read()
        self.assertTrue(first.startswith("# Title\n\nbefore\n\n<!-- bench/run: generated"))
        self.assertTrue(first.endswith("generated section -->\n\nafter\n"))
        self.assertNotIn("old table", first)
        self.assertIn("| load | GOAL cold load vs fio O_DIRECT read | 800 MB/s", first)
        self.assertNotIn("WARNING", first)
        self.report()  # a second run rewrites the same section in place
        with open(self.readme) as f:
            self.assertEqual(f.read(), first)

    def test_busy_quick_failed_run_says_so(self):
        with open(os.path.join(self.out, "machine.json")) as f:
            machine = json.load(f)
        machine.update(busy=True, mode="quick")
        write(os.path.join(self.out, "machine.json"), machine)
        self.report("--failed", "pyload (exit 1)")
        with open(self.readme) as f:
            text = f.read()
        self.assertIn("WARNING: the machine was busy", text)
        self.assertIn("`--quick` run", text)
        self.assertIn("Failed or cut short: pyload (exit 1)", text)


if __name__ == "__main__":
    unittest.main()
