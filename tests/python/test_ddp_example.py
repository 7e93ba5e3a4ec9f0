"""client/python/examples/ddp_train.py, run as torchrun runs it, against one real daemon.

Each rank is a process with torchrun's environment set here (RANK, WORLD_SIZE, LOCAL_RANK,
MASTER_ADDR, MASTER_PORT, TORCHELASTIC_RUN_ID): Debian's torchrun binary does not start on this
Python, and the example needs nothing from torchrun but those variables. The daemon uses its
embedded coordinator; the ranks save every step.

1. A reference run: 2 ranks train steps 1..40 uninterrupted.
2. The same training in another job, SIGKILLed (both ranks) once rank 0 has reported step 12,
   then restarted with 2 ranks up to step 40: it restores a committed step S < 40 and from there
   every loss, and the final parameters, optimizer, scheduler, scaler and loader of each rank, are
   bit-identical to the reference run's.
3. A restart of the finished job with 3 ranks: every rank restores step 40 with parameters,
   optimizer state and scheduler state bit-identical to the reference run's final state (rank 2,
   which the checkpoint did not have, those of rank 0, as ckptd.torch documents).
"""

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import unittest

import torch

import ckptd_testutil as util

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLE = os.path.join(HERE, "..", "..", "client", "python", "examples", "ddp_train.py")
STEPS = 40
KILL_AFTER = 12


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def bits(t):
    return t.detach().contiguous().view(-1).view(torch.uint8) if t.numel() else t


def assert_same(test, got, want, where):
    """Equal structure, equal plain values, bit-identical tensors."""
    if isinstance(want, torch.Tensor):
        test.assertIsInstance(got, torch.Tensor, where)
        test.assertEqual((got.dtype, tuple(got.shape)), (want.dtype, tuple(want.shape)), where)
        test.assertTrue(torch.equal(bits(got), bits(want)), where)
    elif isinstance(want, dict):
        test.assertIsInstance(got, dict, where)
        test.assertEqual(sorted(got, key=repr), sorted(want, key=repr), where)
        for k in want:
            assert_same(test, got[k], want[k], "%s[%r]" % (where, k))
    elif isinstance(want, (list, tuple)):
        test.assertEqual(len(got), len(want), where)
        for i, (g, w) in enumerate(zip(got, want)):
            assert_same(test, g, w, "%s[%d]" % (where, i))
    else:
        test.assertEqual(got, want, where)


class DdpExampleTest(util.DaemonTestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="ckptd-ddp-")
        self.procs = []

    def tearDown(self):
        for p in self.procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        shutil.rmtree(self.tmp, ignore_errors=True)

    def launch(self, job, world_size, steps, dump=None):
        """Starts the example's ranks as torchrun would; rank 0's stdout is a pipe."""
        port = free_port()
        procs = []
        for rank in range(world_size):
            env = dict(os.environ)
            env.update({"RANK": str(rank), "WORLD_SIZE": str(world_size),
                        "LOCAL_RANK": str(rank), "LOCAL_WORLD_SIZE": str(world_size),
                        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
                        "TORCHELASTIC_RUN_ID": job, "OMP_NUM_THREADS": "1"})
            args = [sys.executable, EXAMPLE, "--socket", self.daemon.socket,
                    "--steps", str(steps)]
            if dump:
                args += ["--dump", dump]
            log = open(os.path.join(self.tmp, "%s-%d-rank%d.log" % (job, len(self.procs), rank)),
                       "w")
            procs.append(subprocess.Popen(
                args, env=env, stdout=subprocess.PIPE if rank == 0 else log,
                stderr=log, text=True))
            log.close()
        self.procs += procs
        return procs

    def finish(self, procs, what):
        """Waits for every rank; rank 0's output."""
        out = procs[0].communicate(timeout=90)[0]
        for rank, p in enumerate(procs):
            rc = p.wait(timeout=90)
            if rc != 0:
                logs = "".join(open(os.path.join(self.tmp, n)).read()
                               for n in sorted(os.listdir(self.tmp)) if n.endswith(".log"))
                self.fail("%s: rank %d exited %d\n%s\n%s" % (what, rank, rc, out, logs))
        return out

    def dumps(self, directory, world_size):
        return [torch.load(os.path.join(directory, "rank-%d.pt" % r)) for r in range(world_size)]

    def test_kill_and_restart_continue_bit_identically(self):
        ref_dir = os.path.join(self.tmp, "ref")
        self.finish(self.launch("ddp-ref", 2, STEPS, ref_dir), "reference run")
        ref = self.dumps(ref_dir, 2)
        self.assertEqual(sorted(ref[0]["losses"]), list(range(1, STEPS + 1)))
        # The runs differ from the initial weights: training did something.
        self.assertNotEqual(ref[0]["losses"][1], ref[0]["losses"][STEPS])

        # Killed mid-run: rank 0 reported step KILL_AFTER; steps after it may be in flight.
        procs = self.launch("ddp-run", 2, 100000)
        seen = 0
        for line in procs[0].stdout:
            if line.startswith("step "):
                seen = int(line.split()[1])
                if seen >= KILL_AFTER:
                    break
        self.assertGreaterEqual(seen, KILL_AFTER, "rank 0 stopped before step %d" % KILL_AFTER)
        for p in procs:
            p.send_signal(signal.SIGKILL)
        for p in procs:
            p.wait(timeout=30)
            self.assertEqual(p.returncode, -signal.SIGKILL)
        procs[0].stdout.close()

        run_dir = os.path.join(self.tmp, "run")
        out = self.finish(self.launch("ddp-run", 2, STEPS, run_dir), "restart with 2 ranks")
        run = self.dumps(run_dir, 2)
        restored = run[0]["restored"]
        self.assertIsNotNone(restored, out)
        self.assertGreaterEqual(restored, 1)
        self.assertLess(restored, STEPS, "the killed run got to step %d" % restored)
        self.assertEqual(run[1]["restored"], restored)
        for rank in range(2):
            self.assertEqual(sorted(run[rank]["losses"]), list(range(restored + 1, STEPS + 1)))
            for step, loss in run[rank]["losses"].items():
                self.assertEqual(loss, ref[rank]["losses"][step], "rank %d step %d" % (rank, step))
            for key in ("model", "optimizer", "scheduler", "scaler", "loader"):
                assert_same(self, run[rank][key], ref[rank][key], "rank %d %s" % (rank, key))

        # Three ranks restore the finished job: step 40 on each, bit-exact.
        wide_dir = os.path.join(self.tmp, "wide")
        out = self.finish(self.launch("ddp-run", 3, STEPS, wide_dir), "restart with 3 ranks")
        wide = self.dumps(wide_dir, 3)
        for rank in range(3):
            self.assertEqual(wide[rank]["restored"], STEPS, out)
            self.assertEqual(wide[rank]["world_size"], 3)
            self.assertEqual(wide[rank]["losses"], {})
            like = ref[rank % 2]
            for key in ("model", "optimizer", "scheduler", "scaler"):
                assert_same(self, wide[rank][key], like[key], "3 ranks: rank %d %s" % (rank, key))


if __name__ == "__main__":
    unittest.main()
