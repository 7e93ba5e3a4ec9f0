"""Crash and resume through ckptd.torch.Checkpointer is bit-exact.

A deterministic CPU training loop (an MLP with dropout and batch norm, AdamW, a StepLR schedule,
data drawn from a seeded torch.Generator) checkpoints every step:
  1. a child process trains and SIGKILLs itself at a random (seeded) step and phase;
  2. a fresh process resumes with Checkpointer.load() from the newest committed step (a fresh
     model and a fresh optimizer: the optimizer state is rebuilt from the checkpoint) and
     finishes the run;
  3. a third process trains the same number of steps without interruption.
Parameters, buffers, optimizer state and the RNG state of (2) and (3) must be bit-identical.
"""

import argparse
import os
import random
import signal
import subprocess
import sys
import tempfile
import unittest

TOTAL_STEPS = 24
JOB = "resume"


def build(seed=1234):
    import torch
    torch.manual_seed(seed)
    model = torch.nn.Sequential(
        torch.nn.Linear(16, 64),
        torch.nn.BatchNorm1d(64),
        torch.nn.GELU(),
        torch.nn.Dropout(0.2),
        torch.nn.Linear(64, 64),
        torch.nn.Tanh(),
        torch.nn.Linear(64, 4),
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.05)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=5, gamma=0.7)
    data = torch.Generator().manual_seed(99)
    return model, optimizer, scheduler, data


class TrainerState:
    """extra_state: RNGs (global torch RNG for dropout, the data generator) + the LR schedule."""

    def __init__(self, scheduler, data):
        import ckptd.torch
        self.scheduler = scheduler
        self.rng = ckptd.torch.RNGState(data)

    def state(self):
        return {"rng": self.rng.state(), "scheduler": self.scheduler.state_dict()}

    def load(self, state):
        self.rng.load(state["rng"])
        self.scheduler.load_state_dict(state["scheduler"])


def train_step(model, optimizer, scheduler, data, kill=None):
    import torch
    x = torch.randn(32, 16, generator=data)
    y = torch.randn(32, 4, generator=data)
    model.train()
    loss = torch.nn.functional.mse_loss(model(x), y)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    if kill == "after_backward":
        os.kill(os.getpid(), signal.SIGKILL)
    optimizer.step()
    scheduler.step()


def dump(model, optimizer, path):
    import torch
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                "rng": torch.get_rng_state()}, path)


def worker(args):
    import torch
    import ckptd
    import ckptd.torch
    torch.set_num_threads(1)
    model, optimizer, scheduler, data = build()
    if args.mode == "plain":
        for _ in range(TOTAL_STEPS):
            train_step(model, optimizer, scheduler, data)
        dump(model, optimizer, args.out)
        return 0
    client = ckptd.Client(JOB, 0, 1, socket=args.socket)
    ckpt = ckptd.torch.Checkpointer(client, model, optimizer,
                                    extra_state=TrainerState(scheduler, data))
    start = 1
    if args.mode == "resume":
        loaded = ckpt.load()
        assert loaded is not None, "nothing committed to resume from"
        print("resumed-from", loaded, flush=True)
        start = loaded + 1
    for step in range(start, TOTAL_STEPS + 1):
        kill = args.kill_phase if step == args.kill_at else None
        train_step(model, optimizer, scheduler, data, kill)
        ckpt.save(step)
        if kill == "after_save":
            os.kill(os.getpid(), signal.SIGKILL)   # the daemon is still capturing this step
    ckpt.fence()
    client.wait(TOTAL_STEPS, "committed", timeout=60)
    dump(model, optimizer, args.out)
    client.close()
    return 0


class ResumeTest(unittest.TestCase):
    def test_crash_and_resume_is_bit_exact(self):
        import torch
        import ckptd_testutil as util

        rnd = random.Random(int(os.environ.get("CKPTD_TEST_SEED", "20240611")))
        kill_at = rnd.randint(4, TOTAL_STEPS - 4)
        kill_phase = rnd.choice(["after_save", "after_backward"])
        print("killing the trainer at step %d (%s)" % (kill_at, kill_phase), flush=True)

        with util.Daemon() as d, tempfile.TemporaryDirectory() as out:
            me = os.path.abspath(__file__)
            common = ["--socket", d.socket]

            crashed = util.run_python([me, "--worker", "crash", "--kill-at", str(kill_at),
                                       "--kill-phase", kill_phase, "--out",
                                       os.path.join(out, "never")] + common)
            self.assertEqual(crashed.returncode, -signal.SIGKILL, crashed.stderr)
            # A step is safe once it was fenced: the optimizer step after its save waited for its
            # capture. Killed after saving step K, step K-1 was fenced; killed after the backward
            # pass of step K (before its optimizer step), only K-2 was. The step after the fenced
            # one may or may not have been captured when the trainer died: wait until the daemon
            # decided (committed, or aborted naming the dead rank), then resume from what is.
            fenced = kill_at - 1 if kill_phase == "after_save" else kill_at - 2
            import ckptd
            with d.client(JOB) as c:
                c.wait(fenced, "committed", timeout=60)
                for undecided in range(fenced + 1, kill_at + 1):
                    try:
                        c.wait(undecided, "committed", timeout=60)
                    except ckptd.Error as e:
                        # Aborted because the trainer died before its capture, or never saved.
                        self.assertIn(e.code, ("ABORTED", "NOT_FOUND"), str(e))
                latest = c.latest()
            self.assertGreaterEqual(latest, fenced)

            # The resumed run and the uninterrupted run go on concurrently.
            procs = {}
            for mode in ("resume", "plain"):
                procs[mode] = subprocess.Popen(
                    [sys.executable, me, "--worker", mode, "--out", os.path.join(out, mode)]
                    + common, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            results = {m: p.communicate(timeout=120) for m, p in procs.items()}
            for m, p in procs.items():
                self.assertEqual(p.returncode, 0, "%s: %s" % (m, results[m][1]))
            self.assertIn("resumed-from %d" % latest, results["resume"][0])

            resumed = torch.load(os.path.join(out, "resume"))
            plain = torch.load(os.path.join(out, "plain"))

        self.assertTrue(torch.equal(resumed["rng"], plain["rng"]), "torch RNG state differs")
        for name, t in plain["model"].items():
            self.assertTrue(torch.equal(resumed["model"][name], t), "model tensor %s" % name)
        so, ro = plain["optimizer"], resumed["optimizer"]
        self.assertEqual(ro["param_groups"], so["param_groups"])
        self.assertEqual(sorted(ro["state"]), sorted(so["state"]))
        self.assertGreater(len(so["state"]), 0)
        for idx, st in so["state"].items():
            self.assertEqual(sorted(ro["state"][idx]), sorted(st))
            for key, v in st.items():
                if isinstance(v, torch.Tensor):
                    self.assertTrue(torch.equal(ro["state"][idx][key], v),
                                    "optimizer state %s.%s" % (idx, key))
                else:
                    self.assertEqual(ro["state"][idx][key], v)
        # And the run really trained: the final model differs from the initial one.
        initial = build()[0].state_dict()
        self.assertFalse(torch.equal(initial["0.weight"], plain["model"]["0.weight"]))


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--worker", dest="mode", choices=["crash", "resume", "plain"])
    parser.add_argument("--socket")
    parser.add_argument("--kill-at", type=int, default=-1)
    parser.add_argument("--kill-phase", default=None)
    parser.add_argument("--out")
    args, rest = parser.parse_known_args()
    if args.mode:
        sys.exit(worker(args))
    unittest.main(argv=[sys.argv[0]] + rest, verbosity=2)
