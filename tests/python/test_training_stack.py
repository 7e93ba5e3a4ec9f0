"""ckptd.torch where training code lives: the stateful extras a real loop keeps (LR scheduler,
GradScaler, a stateful data loader, RNGs, plain values) and DistributedDataParallel models.

- extra_state as a dict of Stateful objects and values: saved per rank, put back on load, a
  name the checkpoint lacks raises NOT_FOUND before anything is touched; the old
  state()/load() form keeps working.
- A DDP-wrapped model (gloo, one rank) saves under the plain model's names: its checkpoint loads
  into the plain model and a plain model's checkpoint into a DDP-wrapped one, bit-exact.
"""

import os
import random
import tempfile
import unittest

import torch
import torch.distributed as dist

import ckptd
import ckptd.torch
import ckptd_testutil as util


class Loader:
    """A stateful data loader: its position is state_dict()/load_state_dict()."""

    def __init__(self):
        self.position = 0

    def state_dict(self):
        return {"position": self.position}

    def load_state_dict(self, state):
        self.position = state["position"]


def build(seed):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(6, 6), torch.nn.ReLU(), torch.nn.Linear(6, 2))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    return model, optimizer


def step(model, optimizer):
    model(torch.randn(3, 6)).pow(2).sum().backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def extras(optimizer):
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    generator = torch.Generator().manual_seed(5)
    return {"scheduler": scheduler, "scaler": torch.cuda.amp.GradScaler(enabled=False),
            "loader": Loader(), "rng": ckptd.torch.RNGState(generator), "epoch": 3}, generator


class StatefulExtrasTest(util.DaemonTestCase):
    def save(self, job, model, optimizer, extra):
        with self.daemon.client(job) as c:
            ck = ckptd.torch.Checkpointer(c, model, optimizer, extra_state=extra,
                                          on_error="raise")
            ck.save(1)
            ck.fence()
            c.wait(1, "committed", timeout=60)
            ck.remove_hook()

    def test_dict_of_stateful_objects_and_values(self):
        model, optimizer = build(1)
        extra, generator = extras(optimizer)
        step(model, optimizer)
        extra["scheduler"].step()
        extra["scheduler"].step()
        extra["loader"].position = 1234
        random.seed(99)
        torch.manual_seed(77)
        generator.manual_seed(11)
        want_draws = (torch.rand(3), random.random(), torch.rand(2, generator=generator))
        random.seed(99)
        torch.manual_seed(77)
        generator.manual_seed(11)
        want_lr = optimizer.param_groups[0]["lr"]
        self.save("extras", model, optimizer, extra)

        model2, optimizer2 = build(2)
        extra2, generator2 = extras(optimizer2)
        extra2["epoch"] = 0
        with self.daemon.client("extras") as c:
            ck = ckptd.torch.Checkpointer(c, model2, optimizer2, extra_state=extra2,
                                          on_error="raise")
            self.assertEqual(ck.load(), 1)
        self.assertEqual(extra2["loader"].position, 1234)
        self.assertEqual(extra2["scheduler"].last_epoch, 2)
        self.assertEqual(optimizer2.param_groups[0]["lr"], want_lr)
        self.assertEqual(ck.loaded_extra_state["epoch"], 3)
        got = (torch.rand(3), random.random(), torch.rand(2, generator=generator2))
        self.assertTrue(torch.equal(got[0], want_draws[0]))
        self.assertEqual(got[1], want_draws[1])
        self.assertTrue(torch.equal(got[2], want_draws[2]))

    def test_a_name_the_checkpoint_lacks_raises_before_anything_loads(self):
        model, optimizer = build(1)
        self.save("extras-missing", model, optimizer, {"loader": Loader()})
        model2, optimizer2 = build(2)
        loader = Loader()
        loader.position = 5
        with self.daemon.client("extras-missing") as c:
            ck = ckptd.torch.Checkpointer(c, model2, optimizer2,
                                          extra_state={"loader": loader, "scaler": Loader()},
                                          on_error="raise")
            with self.assertRaises(ckptd.Error) as raised:
                ck.load()
        self.assertEqual(raised.exception.code, "NOT_FOUND")
        self.assertIn("'scaler'", str(raised.exception))
        self.assertEqual(loader.position, 5)  # nothing was put back

    def test_single_stateful_object(self):
        model, optimizer = build(1)
        loader = Loader()
        loader.position = 42
        self.save("extras-one", model, optimizer, loader)
        model2, optimizer2 = build(2)
        loader2 = Loader()
        with self.daemon.client("extras-one") as c:
            ckptd.torch.Checkpointer(c, model2, optimizer2, extra_state=loader2,
                                     on_error="raise").load()
        self.assertEqual(loader2.position, 42)


class DistributedDataParallelTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.store_dir = tempfile.mkdtemp(prefix="ckptd-ddp-")
        dist.init_process_group("gloo", init_method="file://" + os.path.join(cls.store_dir, "s"),
                                rank=0, world_size=1)
        cls.daemon = util.Daemon().start()

    @classmethod
    def tearDownClass(cls):
        cls.daemon.cleanup()
        dist.destroy_process_group()

    def roundtrip(self, job, wrap_saver, wrap_loader):
        model, optimizer = build(1)
        saver = torch.nn.parallel.DistributedDataParallel(model) if wrap_saver else model
        step(saver, optimizer)
        want = {k: v.clone() for k, v in model.state_dict().items()}
        with self.daemon.client(job) as c:
            ck = ckptd.torch.Checkpointer(c, saver, optimizer, on_error="raise")
            ck.save(1)
            ck.fence()
            c.wait(1, "committed", timeout=60)
            ck.remove_hook()
        model2, optimizer2 = build(2)
        loader = torch.nn.parallel.DistributedDataParallel(model2) if wrap_loader else model2
        with self.daemon.client(job) as c:
            ckptd.torch.Checkpointer(c, loader, optimizer2, on_error="raise").load()
        for k, v in want.items():
            self.assertTrue(torch.equal(model2.state_dict()[k], v), k)
        # The checkpoint's tensors carry the plain names: a plain Client load by name works.
        with self.daemon.client(job) as c:
            w = torch.zeros(6, 6)
            c.load({"0.weight": w}, step=1, strict=True)
            self.assertTrue(torch.equal(w, want["0.weight"]))

    def test_ddp_checkpoint_loads_into_a_plain_model(self):
        self.roundtrip("ddp-to-plain", wrap_saver=True, wrap_loader=False)

    def test_plain_checkpoint_loads_into_a_ddp_model(self):
        self.roundtrip("plain-to-ddp", wrap_saver=False, wrap_loader=True)


if __name__ == "__main__":
    unittest.main()
