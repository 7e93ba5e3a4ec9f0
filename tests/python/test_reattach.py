"""The first promise from a PyTorch trainer's side: a frozen, killed or restarted daemon never
holds training longer than the client's call timeout, the same Client object goes on once the
daemon is back, and the Checkpointer turns failures into warnings and counts (on_error="warn").

- test_frozen_daemon: SIGSTOP -> save() raises DEADLINE_EXCEEDED within call_timeout + 1 s;
  SIGCONT -> the same client saves and commits; the save that timed out never commits.
- test_restart_same_client: kill -9, restart on the same socket -> the same client's next save
  commits, load() is bit-exact, and the new daemon counts the re-attach in /metrics.
- test_checkpointer_rides_out_a_restart: a training loop through a killed and restarted daemon
  never raises; it warns once, counts failed saves and resumes committing.
- test_checkpointer_fence_gives_up: a daemon frozen while it captures: the fence returns after
  fence_timeout, the step is abandoned and never committed, training goes on.
"""

import os
import shutil
import signal
import subprocess
import time
import unittest
import warnings

import torch

import ckptd
import ckptd.torch
import ckptd_testutil as util


def committed(daemon, job, step):
    return step in util.committed_steps(daemon.root, job)


def save_until_accepted(client, step, tensors, limit=20.0):
    """Saves, retrying while the client is between re-attach attempts (UNAVAILABLE)."""
    deadline = time.monotonic() + limit
    while True:
        try:
            client.save(step, tensors)
            return
        except ckptd.Error as e:
            if e.code != "UNAVAILABLE" or time.monotonic() > deadline:
                raise


class ReattachTest(unittest.TestCase):
    def daemon(self, *args, directory=None):
        d = util.Daemon(*args, directory=directory).start()
        self.addCleanup(d.cleanup)
        return d

    def test_frozen_daemon(self):
        d = self.daemon()
        c = d.client("frozen", call_timeout=1.0)
        self.addCleanup(c.close)
        self.assertEqual(c.call_timeout, 1.0)
        t = torch.arange(1 << 16, dtype=torch.float32)
        c.save(1, {"t": t})
        c.wait_snapshot()
        c.wait(1, "committed", timeout=60)

        os.kill(d.proc.pid, signal.SIGSTOP)
        try:
            # A save of the registered tensors is posted: it returns once written, and the fence
            # reports the daemon that never answered it.
            c.save(2, {"t": t})
            t0 = time.monotonic()
            with self.assertRaises(ckptd.Error) as cm:
                c.wait_snapshot()
            self.assertEqual(cm.exception.code, "DEADLINE_EXCEEDED", str(cm.exception))
            self.assertLess(time.monotonic() - t0, c.call_timeout + 1.0)
            self.assertIn(d.socket, str(cm.exception))
            t.add_(1)  # training goes on: step 2 was abandoned
            # A save that waits for its answer (on_full="skip") reports it itself.
            t0 = time.monotonic()
            with self.assertRaises(ckptd.Error) as cm:
                c.save(3, {"t": t}, on_full="skip")
            self.assertEqual(cm.exception.code, "DEADLINE_EXCEEDED", str(cm.exception))
            self.assertLess(time.monotonic() - t0, c.call_timeout + 1.0)
            self.assertIn(d.socket, str(cm.exception))
            t.add_(1)  # step 3 was abandoned too
            with self.assertRaises(ckptd.Error) as cm:
                c.latest()
            self.assertEqual(cm.exception.code, "DEADLINE_EXCEEDED")
        finally:
            os.kill(d.proc.pid, signal.SIGCONT)
        c.save(4, {"t": t})
        c.wait_snapshot()
        c.wait(4, "committed", timeout=60)
        self.assertEqual(c.latest(), 4)
        for step in (2, 3):
            self.assertFalse(committed(d, "frozen", step), "abandoned step %d committed" % step)
        out = torch.zeros_like(t)
        c.load({"t": out}, step=4)
        self.assertTrue(torch.equal(out, t))

    def test_restart_same_client(self):
        first = self.daemon()
        c = first.client("restart", call_timeout=5.0)
        self.addCleanup(c.close)
        t = torch.randn(1 << 16)
        c.save(1, {"t": t})
        c.wait(1, "committed", timeout=60)
        first.kill()
        second = self.daemon(directory=first.dir)  # same socket, same storage
        t.mul_(2)
        save_until_accepted(c, 2, {"t": t})
        c.wait_snapshot()
        c.wait(2, "committed", timeout=60)
        self.assertEqual(c.reattaches, 1)
        self.assertEqual(util.metric(second, "ckptd_client_reattach_total"), 1.0)
        promtool = shutil.which("promtool")
        if promtool is not None:  # the exposition follows Prometheus conventions
            lint = subprocess.run([promtool, "check", "metrics"], input=util.metrics_text(second),
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            self.assertEqual(lint.returncode, 0, lint.stdout)
        expected = t.clone()
        t.zero_()
        c.load({"t": t})
        self.assertEqual(c.last_load.step, 2)
        self.assertTrue(torch.equal(t, expected))
        c.load({"t": t}, step=1)
        self.assertTrue(torch.equal(t, expected / 2))

    def test_checkpointer_rides_out_a_restart(self):
        first = self.daemon()
        client = first.client("loop", call_timeout=2.0)
        self.addCleanup(client.close)
        torch.manual_seed(0)
        model = torch.nn.Linear(64, 64)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        ck = ckptd.torch.Checkpointer(client, model, opt)
        second = None
        step, accepted = 0, False
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            # Train on; past step 30, until a save is accepted again (the client may still be in
            # its re-attach backoff, at most 5 s, when the new daemon is up).
            while step < 30 or not accepted:
                step += 1
                self.assertLess(step, 1_000_000, "saves never resumed after the restart")
                model(torch.randn(8, 64)).sum().backward()
                opt.step()
                opt.zero_grad()
                if step == 10:
                    first.kill()
                if step == 15:
                    second = self.daemon(directory=first.dir)
                failed = ck.failed_saves
                ck.save(step)
                accepted = ck.failed_saves == failed
            ck.fence()
        self.assertGreaterEqual(ck.failed_saves, 1)
        self.assertIsNotNone(ck.last_error)
        ours = [w for w in caught if "ckptd" in str(w.message)]
        kinds = {(str(w.message).split(" failed")[0].split(" of step")[0],
                  str(w.message).split("(")[1].split(")")[0]) for w in ours}
        self.assertEqual(len(ours), len(kinds), "warned more than once per kind of failure")
        client.wait(step, "committed", timeout=60)
        self.assertEqual(client.latest(), step)
        # The restored state is the final one, bit for bit.
        fresh = torch.nn.Linear(64, 64)
        fresh_opt = torch.optim.AdamW(fresh.parameters(), lr=1e-3)
        c2 = second.client("loop")
        self.addCleanup(c2.close)
        self.assertEqual(ckptd.torch.Checkpointer(c2, fresh, fresh_opt).load(), step)
        for a, b in zip(model.parameters(), fresh.parameters()):
            self.assertTrue(torch.equal(a, b))

    def test_checkpointer_fence_gives_up(self):
        # ~3 s to capture 16 MiB: long enough to freeze the daemon in the middle of it.
        d = self.daemon("--capture-throttle", "6MiB")
        client = d.client("fence", call_timeout=5.0)
        self.addCleanup(client.close)
        model = torch.nn.Linear(2048, 2048)  # 16 MiB of weights
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        ck = ckptd.torch.Checkpointer(client, model, opt, fence_timeout=0.5)
        model(torch.randn(4, 2048)).sum().backward()
        opt.step()
        ck.save(1)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            t0 = time.monotonic()
            opt.step()  # the fence gives up after 0.5 s, abandons step 1, and the step runs
            self.assertLess(time.monotonic() - t0, 0.5 + 1.0)
        self.assertEqual(ck.failed_saves, 1)
        self.assertEqual(ck.last_error.code, "DEADLINE_EXCEEDED")
        self.assertTrue(any("fence of step 1" in str(w.message) for w in caught))
        with self.assertRaises(ckptd.Error) as cm:
            client.wait(1, "committed", timeout=60)
        self.assertEqual(cm.exception.code, "ABORTED")
        self.assertIn("abandoned", str(cm.exception))
        self.assertFalse(committed(d, "fence", 1))
        # The save right after a fence that gave up is skipped (one wait per training step);
        # the next one commits, with the values after the abandoned step.
        ck.fence_timeout = 60.0
        ck.save(2)
        self.assertEqual(ck.failed_saves, 2)
        self.assertIn("skipped", str(ck.last_error))
        opt.step()
        ck.save(3)
        ck.fence()
        client.wait(3, "committed", timeout=60)


if __name__ == "__main__":
    unittest.main(verbosity=2)
