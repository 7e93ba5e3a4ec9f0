"""The lazy-snapshot fence works (docs/design.md §2.3): a tensor is never modified while the daemon
still copies it, because Checkpointer's optimizer pre-step hook calls wait_snapshot().

The daemon runs with --capture-throttle 8MiB (bytes/s) and the state is 64 MiB, so a capture
takes ~7.5 s: the first 4 MiB slot is copied at once, every further slot only when the average
rate allows. Mutating the tensors right after save() therefore races the capture by seconds.

- test_checkpointer_fences_the_optimizer_step: save, then optimizer.step() at once (it mutates
  every parameter in place). The hook blocks the step until the capture is complete, so the
  checkpoint holds exactly the pre-step values.
- test_control_without_fence_is_torn: the same mutation (t.add_(1)) without waiting. The
  checkpoint then differs from the pre-mutation values — proof that the first test would notice
  a missing fence. Only a mutation delayed by more than the whole throttled capture (~7 s of the
  test process being descheduled) could make this control pass through as "not torn"; the
  64 MiB state and the 8 MiB/s throttle are sized for that margin.
"""

import time
import unittest

import torch

import ckptd
import ckptd.torch
import ckptd_testutil as util

SIDE = 2048          # 4 square fp32 matrices of 2048x2048 = 64 MiB
LAYERS = 4


def fresh_like(named):
    return {name: torch.zeros_like(t) for name, t in named.items()}


class FenceTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        torch.manual_seed(0)
        cls.daemon = util.Daemon("--capture-throttle", "8MiB").start()

    @classmethod
    def tearDownClass(cls):
        cls.daemon.cleanup()

    def load_checkpoint(self, job, like):
        with self.daemon.client(job) as c:
            out = fresh_like(like)
            c.load(out, step=1)
            return out

    def test_checkpointer_fences_the_optimizer_step(self):
        model = torch.nn.Sequential(*[torch.nn.Linear(SIDE, SIDE, bias=False)
                                      for _ in range(LAYERS)])
        optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
        for p in model.parameters():
            p.grad = torch.ones_like(p)     # every step subtracts 1 from every element, in place
        client = self.daemon.client("fence-hook")
        self.addCleanup(client.close)
        ckpt = ckptd.torch.Checkpointer(client, model, optimizer)

        optimizer.step()
        ckpt.save(1)
        before = {n: p.detach().clone() for n, p in model.named_parameters()}
        t0 = time.monotonic()
        optimizer.step()                    # mutates at once — unless the hook fences it
        blocked = time.monotonic() - t0
        for n, p in model.named_parameters():
            self.assertTrue(torch.equal(p.detach(), before[n] - 1), n)  # it did mutate
        # The throttled capture takes ~7.5 s; the hook must have waited for most of it.
        self.assertGreater(blocked, 2.0, "optimizer.step() did not wait for the capture")

        client.wait(1, "committed", timeout=60)
        saved = self.load_checkpoint("fence-hook", before)
        for n in before:
            self.assertTrue(torch.equal(saved[n], before[n]), "checkpoint of %s is torn" % n)

    def test_control_without_fence_is_torn(self):
        tensors = {"w%d" % i: torch.randn(SIDE, SIDE) for i in range(LAYERS)}
        before = {n: t.clone() for n, t in tensors.items()}
        client = self.daemon.client("fence-control")
        self.addCleanup(client.close)

        client.save(1, tensors)
        for t in tensors.values():
            t.add_(1)                       # no wait_snapshot(): races the capture
        with self.assertRaises(ckptd.Error) as cm:  # the throttled capture is far from done
            client.wait_snapshot(timeout=0.05)
        self.assertEqual(cm.exception.code, "DEADLINE_EXCEEDED")
        client.wait_snapshot()
        client.wait(1, "committed", timeout=60)

        saved = self.load_checkpoint("fence-control", before)
        equal = [n for n in before if torch.equal(saved[n], before[n])]
        mutated = sum(int((saved[n] != before[n]).sum()) for n in before)
        self.assertGreater(mutated, 0, "no mutation reached the checkpoint")
        self.assertLess(len(equal), len(before),
                        "the unfenced checkpoint equals the pre-mutation values")
        print("control: %d of %d elements captured after the mutation"
              % (mutated, LAYERS * SIDE * SIDE))


if __name__ == "__main__":
    unittest.main(verbosity=2)
