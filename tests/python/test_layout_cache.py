"""The cached layout of a save is never stale: every change a training loop can make between two
saves reaches the checkpoint.

After the first save, ckptd.Client checks the registered tensors natively (_ckptd.LayoutCheck)
and ckptd.torch.Checkpointer reuses its walk of model and optimizer while a _ckptd.SlotWatch
says nothing changed. LayoutCheck reads addresses, shapes, dtypes and contiguity through the
TensorProbe of _ckptd_torch where it is built (client/python/tensor_probe.h), else through
torch's bindings; ctest runs this file both ways ($CKPTD_TENSOR_PROBE=0 for the bindings). Each
test makes one change after a save, saves again, and restores the second step into fresh tensors
(or a fresh model and optimizer): the restored values must be the ones the trainer held at the
second save — never the first save's, never another tensor's.
"""

import importlib.util
import os
import pickle
import threading
import unittest

import torch

import ckptd
import ckptd.offline
import ckptd.torch
import ckptd_testutil as util
from ckptd import checkpointer_meta


def build(seed=3, width=8):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.BatchNorm1d(width),
                                torch.nn.Tanh(), torch.nn.Linear(width, 2))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    return model, optimizer


def train_step(model, optimizer, seed):
    g = torch.Generator().manual_seed(seed)
    model(torch.randn(16, model[0].in_features, generator=g)).pow(2).sum().backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def snapshot(model, optimizer):
    out = {"model." + k: v.detach().clone() for k, v in model.state_dict().items()}
    names = {id(p): n for n, p in model.named_parameters()}
    for p, st in optimizer.state.items():
        for k, v in st.items():
            out["opt.%s.%s" % (names[id(p)], k)] = v.clone() if torch.is_tensor(v) else v
    out["groups"] = [{k: v for k, v in g.items() if k != "params"} | {"n": len(g["params"])}
                     for g in optimizer.param_groups]
    return out


def assert_same_state(test, got, want):
    """`got` (a restored snapshot()) is `want`, key for key, tensors bit for bit."""
    test.assertEqual(set(got), set(want))
    for k, v in want.items():
        if torch.is_tensor(v):
            test.assertTrue(torch.equal(got[k], v), "%s differs" % k)
        else:
            test.assertEqual(got[k], v, k)


class ClientLayoutTest(util.DaemonTestCase):
    def save_and_load(self, client, step, tensors, into):
        client.save(step, tensors)
        client.wait_snapshot()
        client.wait(step, "committed", timeout=60)
        with self.daemon.client(client.job) as reader:
            reader.load(into, step=step)

    def test_replaced_data_same_shape(self):
        with self.daemon.client("client-data") as c:
            w = torch.arange(64, dtype=torch.float32)
            self.save_and_load(c, 1, {"w": w}, {"w": torch.zeros(64)})
            w.data = torch.full((64,), 7.0)  # new memory under the same tensor object
            out = torch.zeros(64)
            self.save_and_load(c, 2, {"w": w}, {"w": out})
            self.assertTrue(torch.equal(out, torch.full((64,), 7.0)))

    def test_reshaped_at_the_same_address(self):
        with self.daemon.client("client-view") as c:
            w = torch.arange(64, dtype=torch.float32)
            self.save_and_load(c, 1, {"w": w}, {"w": torch.zeros(64)})
            w.data = w.data.view(8, 8)  # same memory, same data_ptr, another shape
            out = torch.zeros(8, 8)
            self.save_and_load(c, 2, {"w": w}, {"w": out})
            self.assertTrue(torch.equal(out, torch.arange(64, dtype=torch.float32).view(8, 8)))
            with self.daemon.client("client-view") as reader, self.assertRaises(ckptd.Error):
                reader.load({"w": torch.zeros(64)}, step=2)  # the old shape is not step 2's

    def test_transposed_at_the_same_address(self):
        # A view that keeps the address and the shape but not the order of the bytes: the daemon
        # would save the matrix as its storage holds it, not as the trainer reads it. The save
        # fails, clearly, and the next one of a contiguous tensor is saved as it is.
        with self.daemon.client("client-transposed") as c:
            w = torch.arange(64, dtype=torch.float32).view(8, 8)
            self.save_and_load(c, 1, {"w": w}, {"w": torch.zeros(8, 8)})
            w.data = w.data.t()
            with self.assertRaisesRegex(ckptd.Error, "not contiguous"):
                c.save(2, {"w": w})  # checked before sending ($CKPTD_HELD_SAVES=0) raises here
                c.wait_snapshot()  # a held save is checked after, and raises at the fence
            w.data = w.data.contiguous()  # what the trainer reads, in new memory
            out = torch.zeros(8, 8)
            self.save_and_load(c, 3, {"w": w}, {"w": out})
            self.assertTrue(torch.equal(out, torch.arange(64, dtype=torch.float32).view(8, 8).t()))
            self.assertEqual(c.latest(), 3)

    def test_another_dtype_at_the_same_address(self):
        with self.daemon.client("client-dtype") as c:
            w = torch.arange(16, dtype=torch.float32)
            self.save_and_load(c, 1, {"w": w}, {"w": torch.zeros(16)})
            w.data = w.data.view(torch.int32)  # the same bytes, the same shape, read as int32
            out = torch.zeros(16, dtype=torch.int32)
            self.save_and_load(c, 2, {"w": w}, {"w": out})
            expected = torch.arange(16, dtype=torch.float32).view(torch.int32)
            self.assertTrue(torch.equal(out, expected))
            with self.daemon.client("client-dtype") as reader, self.assertRaises(ckptd.Error):
                reader.load({"w": torch.zeros(16)}, step=2)  # float32 is not step 2's dtype

    def test_new_tensor_and_new_dict_each_save(self):
        with self.daemon.client("client-dicts") as c:
            a, b = torch.ones(16), torch.full((16,), 2.0)
            self.save_and_load(c, 1, {"a": a}, {"a": torch.zeros(16)})
            out = {"a": torch.zeros(16), "b": torch.zeros(16)}
            self.save_and_load(c, 2, dict(a=a, b=b), out)
            self.assertTrue(torch.equal(out["b"], b))
            # Same names, the tensors swapped between them.
            out = {"a": torch.zeros(16), "b": torch.zeros(16)}
            self.save_and_load(c, 3, {"a": b, "b": a}, out)
            self.assertTrue(torch.equal(out["a"], b) and torch.equal(out["b"], a))

    def test_shard_geometry_change(self):
        with self.daemon.client("client-shard") as c:
            t = torch.arange(8, dtype=torch.float32)
            # One rank holding half of the tensor, on purpose (partial): first one half, then
            # the other.
            self.save_and_load(c, 1, {"w": ckptd.Shard(t, (16,), (0,), partial=True)},
                               {"w": ckptd.Shard(torch.zeros(8), (16,), (0,))})
            c.save(2, {"w": ckptd.Shard(t, (16,), (8,), partial=True)})
            c.wait_snapshot()
            c.wait(2, "committed", timeout=60)
            out = torch.zeros(8)
            with self.daemon.client("client-shard") as reader:
                reader.load({"w": ckptd.Shard(out, (16,), (8,))}, step=2)
            self.assertTrue(torch.equal(out, t))

    def test_probe_reads_what_it_can(self):
        probe = ckptd._tensor_probe()
        # Written by the build where _ckptd_torch is built.
        built = importlib.util.find_spec("ckptd._torch_probe_build") is not None
        if os.environ.get("CKPTD_TENSOR_PROBE") == "0" or not built:
            self.assertIsNone(probe)
        else:
            self.assertIsNotNone(probe, "_ckptd_torch is built but not used")

        class Tagged(torch.Tensor):  # a Python subclass: left to the bindings
            pass

        plain, param = torch.zeros(4, 2), torch.nn.Parameter(torch.ones(3))
        square, bits = torch.zeros(3, 3), torch.zeros(5)
        tagged = torch.zeros(4).as_subclass(Tagged)
        tensors = {"plain": plain, "param": param, "tagged": tagged, "square": square,
                   "bits": bits, "shard": ckptd.Shard(torch.ones(2), (4,), (2,)),
                   "empty": torch.empty(0)}
        check = ckptd._ckptd.LayoutCheck(tensors, torch.Tensor, probe)
        self.assertEqual(check.probed, 0 if probe is None else 6)
        self.assertTrue(check.matches(tensors))
        for change in (lambda: setattr(plain, "data", plain.data.view(2, 4)),  # same address
                       lambda: setattr(param, "data", torch.ones(3)),
                       # The same address and shape: transposed, another dtype of the bytes.
                       lambda: setattr(square, "data", square.data.t()),
                       lambda: setattr(bits, "data", bits.data.view(torch.int32)),
                       lambda: tagged.resize_(2),
                       lambda: tensors["empty"].resize_(1)):
            change()
            self.assertFalse(check.matches(tensors))
            check = ckptd._ckptd.LayoutCheck(tensors, torch.Tensor, probe)
            self.assertTrue(check.matches(tensors))
        with self.assertRaises(ValueError):  # not the probe's capsule
            ckptd._ckptd.LayoutCheck(tensors, torch.Tensor, object())

    def test_unchanged_save_does_not_register_again(self):
        with self.daemon.client("client-same") as c:
            ts = {"t%d" % i: torch.full((4,), float(i)) for i in range(100)}
            c.save(1, ts)
            check = c._layout
            c.wait_snapshot()
            c.save(2, dict(ts))  # a new dict, the same tensors
            self.assertIs(c._layout, check)
            c.wait_snapshot()


class HeldSaveTest(util.DaemonTestCase):
    """After its first save a Client sends a step held (ckptd/held_save.py): the daemon reads
    nothing until the client's thread has checked the registered tensors' memory and confirmed.
    """

    def assert_step(self, client, step, want):
        """Step `step` of `client`'s job holds `want` as tensor "w"."""
        out = torch.zeros(want.shape)
        client.load({"w": out}, step=step)
        self.assertTrue(torch.equal(out, want))

    def test_the_check_thread_confirms_while_the_trainer_is_elsewhere(self):
        with self.daemon.client("held-thread") as c, self.daemon.client("held-thread") as other:
            self.assertGreaterEqual(c._c.protocol, 3)
            w = torch.arange(1024, dtype=torch.float32)
            c.save(1, {"w": w})
            c.wait(1, "committed", timeout=60)
            w.add_(1)
            c.save(2, {"w": w})
            self.assertIsNotNone(c._held._thread)  # it went out held
            # This trainer makes no call into ckptd: only the thread can confirm step 2.
            other.wait(2, "committed", timeout=60)
            self.assert_step(other, 2, torch.arange(1024, dtype=torch.float32) + 1)

    def test_a_wait_on_another_thread_leaves_the_resend_to_the_trainer(self):
        with self.daemon.client("held-other-thread") as c:
            w = torch.arange(64, dtype=torch.float32)
            c.save(1, {"w": w})
            c.wait_snapshot()
            w.data = torch.full((64,), 4.0)  # the check of step 2 fails
            c.save(2, {"w": w})
            sent_by = []
            send_again = c._send_again
            c._send_again = lambda *a: (sent_by.append(threading.get_ident()), send_again(*a))
            # A monitor's wait settles first: it must not register (that would move the
            # trainer's tensors under it), so step 2 stays held for the trainer.
            other = threading.Thread(target=lambda: c._settle(owner=False))
            other.start()
            other.join()
            self.assertEqual(sent_by, [])
            self.assertTrue(c._held.pending())
            seen = []
            waiter = threading.Thread(target=lambda: seen.append(
                c.wait(2, "committed", timeout=60)))
            waiter.start()
            c.wait_snapshot()  # the trainer sends it again
            waiter.join()
            self.assertEqual(sent_by, [threading.get_ident()])
            self.assertEqual(seen, [None])
            self.assert_step(c, 2, torch.full((64,), 4.0))

    def test_a_save_made_on_a_thread_that_ended_is_sent_again_by_a_wait(self):
        with self.daemon.client("held-ended") as c:
            w = torch.arange(64, dtype=torch.float32)
            c.save(1, {"w": w})
            c.wait_snapshot()
            w.data = torch.full((64,), 6.0)
            saver = threading.Thread(target=lambda: c.save(2, {"w": w}))
            saver.start()
            saver.join()
            c.wait(2, "committed", timeout=60)  # nobody else will: this wait sends it again
            self.assert_step(c, 2, torch.full((64,), 6.0))

    def test_the_dict_may_change_after_save(self):
        with self.daemon.client("held-dict") as c:
            w = torch.arange(64, dtype=torch.float32)
            d = {"w": w}
            c.save(1, d)
            c.wait_snapshot()
            c.save(2, d)
            d["w"] = torch.full((64,), -1.0)  # the dict, not the tensor: step 2 is still w
            c.wait_snapshot()
            c.wait(2, "committed", timeout=60)
            self.assert_step(c, 2, torch.arange(64, dtype=torch.float32))

    def test_replaced_memory_is_saved_as_it_was_at_save(self):
        # Found either by the thread or by wait_snapshot: the step is sent again, from the
        # tensors' memory at save(), never from the old registration.
        with self.daemon.client("held-moved") as c:
            ts = {"t%d" % i: torch.full((256,), float(i)) for i in range(64)}
            c.save(1, ts)
            c.wait_snapshot()
            for step in range(2, 6):
                ts["t7"].data = torch.full((256,), 100.0 * step)
                ts["t9"].resize_(128)
                ts["t9"].fill_(-float(step))
                c.save(step, ts)
                c.wait_snapshot()
            c.wait(5, "committed", timeout=60)
            out = {k: torch.zeros(v.shape) for k, v in ts.items()}
            c.load(out, step=5)
            for k, v in ts.items():
                self.assertTrue(torch.equal(out[k], v), k)

    def test_a_shard_object_given_another_tensor_is_saved_anew(self):
        # The same Shard object in the same dict: only its fields say what changed.
        with self.daemon.client("held-shard") as c:
            a = torch.arange(8, dtype=torch.float32)
            shard = ckptd.Shard(a, (16,), (0,), partial=True)
            d = {"w": shard}
            c.save(1, d)
            c.wait_snapshot()
            shard.tensor = torch.full((8,), 9.0)
            c.save(2, d)
            c.wait_snapshot()
            shard.offsets = (8,)
            c.save(3, d)
            c.wait_snapshot()
            c.wait(3, "committed", timeout=60)
            with self.daemon.client("held-shard") as reader:
                out = torch.zeros(8)
                reader.load({"w": ckptd.Shard(out, (16,), (0,))}, step=2)
                self.assertTrue(torch.equal(out, torch.full((8,), 9.0)))
                reader.load({"w": ckptd.Shard(out, (16,), (8,))}, step=3)
                self.assertTrue(torch.equal(out, torch.full((8,), 9.0)))


class CheckpointerLayoutTest(util.DaemonTestCase):
    def restore(self, job, step, model, optimizer):
        with self.daemon.client(job) as c:
            ck = ckptd.torch.Checkpointer(c, model, optimizer, on_error="raise")
            self.assertEqual(ck.load(step), step)
        return snapshot(model, optimizer)

    def check_step(self, job, step, ck, model, optimizer, fresh):
        """Saves `step`, waits for the commit and restores it into `fresh` (model, optimizer)."""
        want = snapshot(model, optimizer)
        ck.save(step)
        ck.fence()
        ck.client.wait(step, "committed", timeout=60)
        assert_same_state(self, self.restore(job, step, *fresh), want)

    def run_change(self, job, change, fresh_after=build):
        model, optimizer = build()
        with self.daemon.client(job) as c:
            ck = ckptd.torch.Checkpointer(c, model, optimizer, on_error="raise")
            train_step(model, optimizer, 1)
            self.check_step(job, 1, ck, model, optimizer, build(seed=50))
            walked = ck._layout
            ck.save(2)  # unchanged: the walk is reused
            self.assertIs(ck._layout, walked)
            ck.fence()
            model, optimizer = change(model, optimizer) or (model, optimizer)
            self.check_step(job, 3, ck, model, optimizer, fresh_after(seed=60))
            ck.remove_hook()

    def test_optimizer_state_appears_after_the_first_step(self):
        model, optimizer = build()
        with self.daemon.client("ck-state") as c:
            ck = ckptd.torch.Checkpointer(c, model, optimizer, on_error="raise")
            self.check_step("ck-state", 1, ck, model, optimizer, build(seed=9))  # no state yet
            train_step(model, optimizer, 2)  # AdamW creates exp_avg, exp_avg_sq, step
            self.check_step("ck-state", 2, ck, model, optimizer, build(seed=10))
            ck.remove_hook()

    def test_param_data_replaced(self):
        def change(model, optimizer):
            model[0].weight.data = torch.full_like(model[0].weight, 0.25)
        self.run_change("ck-data", change)

    def test_lr_scheduler_step(self):
        def change(model, optimizer):
            sched = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
            train_step(model, optimizer, 3)
            sched.step()
        self.run_change("ck-lr", change)

    def test_buffers_follow_the_forward_pass(self):
        def change(model, optimizer):
            with torch.no_grad():
                model(torch.randn(16, 8) * 5)  # BatchNorm running statistics move
        self.run_change("ck-bn", change)

    def test_new_param_group(self):
        def grown(seed):
            model, optimizer = build(seed)
            model.append(torch.nn.Linear(2, 2))
            optimizer.add_param_group({"params": model[4].parameters(), "lr": 0.5})
            return model, optimizer

        def change(model, optimizer):
            model.append(torch.nn.Linear(2, 2))
            optimizer.add_param_group({"params": model[4].parameters(), "lr": 0.5})
            train_step(model, optimizer, 4)
        self.run_change("ck-group", change, fresh_after=grown)

    def test_replaced_submodule_and_parameter(self):
        def change(model, optimizer):
            new = torch.nn.Parameter(torch.full_like(model[3].bias, 3.0))
            model[3].bias = new  # a new Parameter object under the same name
            optimizer.param_groups[0]["params"][-1] = new
            optimizer.state.pop(next(p for p in optimizer.state if p.shape == new.shape
                                     and p is not new and p not in set(model.parameters())),
                                None)
            train_step(model, optimizer, 5)
        self.run_change("ck-param", change)


class CheckpointerHeldSaveTest(util.DaemonTestCase):
    """A Checkpointer save after the first goes out held (ckptd/held_save.py); when the walk it
    was sent with no longer holds, the fence walks again — before the optimizer steps, but after
    a forward pass and an LR scheduler step: the step must still be what the trainer held at
    save(), never what it held at the fence."""

    def test_state_appears_and_the_fence_comes_after_forward_and_scheduler(self):
        model, optimizer = build()
        sched = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
        with self.daemon.client("ck-held") as c:
            ck = ckptd.torch.Checkpointer(c, model, optimizer, on_error="raise")
            ck.save(1)  # no optimizer state yet: the walk has none
            ck.fence()
            train_step(model, optimizer, 2)  # the optimizer state appears (the hook fences)
            want = snapshot(model, optimizer)
            ck.save(2)  # held, over a walk without the state
            sched.step()  # the learning rate halves
            with torch.no_grad():
                model(torch.randn(16, 8) * 5)  # BatchNorm statistics move
            train_step(model, optimizer, 3)  # the hook's fence walks again first
            c.wait(2, "committed", timeout=60)
            got = CheckpointerLayoutTest.restore(self, "ck-held", 2, *build(seed=70))
            assert_same_state(self, got, want)
            ck.remove_hook()

    def test_a_buffer_the_forward_pass_replaces_is_saved_as_it_is_at_save(self):
        class Ema(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.lin = torch.nn.Linear(4, 4)
                self.register_buffer("ema", torch.zeros(4))

            def forward(self, x):
                y = self.lin(x)
                self.ema = self.ema * 0.5 + y.detach().mean(0)  # a new tensor each pass
                return y

        def step(model, opt, seed):
            g = torch.Generator().manual_seed(seed)
            model(torch.randn(8, 4, generator=g)).pow(2).sum().backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

        torch.manual_seed(5)
        model = Ema()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        with self.daemon.client("ck-ema") as c:
            ck = ckptd.torch.Checkpointer(c, model, opt, on_error="raise")
            step(model, opt, 1)
            ck.save(1)
            step(model, opt, 2)  # the walk's buffer object is no longer the module's
            want = model.ema.clone()
            ck.save(2)
            step(model, opt, 3)  # moves ema on before the fence
            c.wait(2, "committed", timeout=60)
            fresh = Ema()
            with self.daemon.client("ck-ema") as r:
                ckptd.torch.Checkpointer(r, fresh, torch.optim.SGD(fresh.parameters(), lr=0.1),
                                         on_error="raise").load(2)
            self.assertTrue(torch.equal(fresh.ema, want))
            ck.remove_hook()

    def test_a_shared_buffer_one_module_replaces_is_saved_as_it_is_at_save(self):
        shared = torch.ones(4)
        model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 4))
        model[0].register_buffer("scale", shared)
        model[1].register_buffer("scale", shared)  # the same tensor in two modules
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        with self.daemon.client("ck-shared") as c:
            ck = ckptd.torch.Checkpointer(c, model, opt, on_error="raise")
            train_step(model, opt, 1)
            ck.save(1)
            train_step(model, opt, 2)  # the hook fences step 1
            model[1].scale = model[1].scale * 3  # only the second module's
            ck.save(2)
            model[1].scale.fill_(-1)  # after save(): not step 2's
            train_step(model, opt, 3)
            c.wait(2, "committed", timeout=60)
            fresh = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 4))
            fresh[0].register_buffer("scale", torch.zeros(4))
            fresh[1].register_buffer("scale", torch.zeros(4))
            with self.daemon.client("ck-shared") as r:
                ckptd.torch.Checkpointer(r, fresh, torch.optim.SGD(fresh.parameters(), lr=0.1),
                                         on_error="raise").load(2)
            self.assertTrue(torch.equal(fresh[0].scale, torch.ones(4)))
            self.assertTrue(torch.equal(fresh[1].scale, torch.full((4,), 3.0)))
            ck.remove_hook()

    def test_a_buffer_added_before_a_held_save_fails_that_step_only(self):
        model, optimizer = build()
        with self.daemon.client("ck-buffer") as c:
            ck = ckptd.torch.Checkpointer(c, model, optimizer, on_error="raise")
            train_step(model, optimizer, 1)
            ck.save(1)
            ck.fence()
            model.register_buffer("added", torch.full((3,), 5.0))
            ck.save(2)  # held over the walk without the buffer
            with self.assertRaises(ckptd.Error) as failed:
                ck.fence()  # its value at save() is not known: the step is given up
            self.assertIn("'added' appeared", str(failed.exception))
            with self.assertRaises(ckptd.Error):
                c.wait(2, "committed", timeout=60)
            ck.save(3)  # walked at save(): the buffer is in it
            ck.fence()
            c.wait(3, "committed", timeout=60)
            fresh_model, fresh_opt = build(seed=80)
            fresh_model.register_buffer("added", torch.zeros(3))
            with self.daemon.client("ck-buffer") as r:
                ckptd.torch.Checkpointer(r, fresh_model, fresh_opt, on_error="raise").load(3)
            self.assertTrue(torch.equal(fresh_model.added, torch.full((3,), 5.0)))
            ck.remove_hook()


class OptimizerLayoutTest(util.DaemonTestCase):
    """The optimizer's layout is a tensor of its own, named by its content, registered once; a
    save's extra blob only names it (format 3 of ckptd/checkpointer_meta.py)."""

    def test_layout_is_a_tensor_saved_once_and_read_back(self):
        def wide(seed):
            torch.manual_seed(seed)
            model = torch.nn.Sequential(*[torch.nn.Linear(3, 3) for _ in range(150)])
            return model, torch.optim.AdamW(model.parameters(), lr=1e-3)

        model, optimizer = wide(1)
        train_step(model, optimizer, 1)
        with self.daemon.client("layout") as c:
            ck = ckptd.torch.Checkpointer(c, model, optimizer, on_error="raise")
            ck.save(1)
            name, size = ck._layout.layout
            self.assertTrue(name.startswith(checkpointer_meta.LAYOUT_PREFIX))
            held, check = ck._layout_tensor, c._layout
            ck.fence()
            ck.save(2)  # unchanged: the same tensor, no second registration
            self.assertIs(ck._layout_tensor, held)
            self.assertIs(c._layout, check)
            ck.fence()
            c.wait(2, "committed", timeout=60)
            ck.remove_hook()
        step = ckptd.offline.open(self.daemon.root, "layout", 2)
        blob = step.extras(0)
        self.assertGreater(size, 10 * 1024)  # 300 params with three state tensors each
        self.assertLess(len(blob), 2048, "the extra blob carries the layout again")
        self.assertEqual(pickle.loads(blob)["optimizer_layout"], (name, size))
        self.assertIn(name, step.names())
        self.assertNotIn(name, step.names("model") + step.names("optimizer"))
        self.assertEqual(step.checkpointer_meta()["optimizer"]["order"][:2],
                         ["0.weight", "0.bias"])
        # Another trainer with the same model and optimizer names the same tensor.
        other, other_opt = wide(2)
        train_step(other, other_opt, 1)
        with self.daemon.client("layout-other") as c:
            ck = ckptd.torch.Checkpointer(c, other, other_opt, on_error="raise")
            ck.save(1)
            self.assertEqual(ck._layout.layout, (name, size))
            ck.fence()
            ck.remove_hook()
        fresh, fresh_opt = wide(3)
        with self.daemon.client("layout") as c:
            ck = ckptd.torch.Checkpointer(c, fresh, fresh_opt, on_error="raise")
            self.assertEqual(ck.load(2), 2)
        got, want = snapshot(fresh, fresh_opt), snapshot(model, optimizer)
        for k, v in want.items():
            if torch.is_tensor(v):
                self.assertTrue(torch.equal(got[k], v), k)

    def test_older_formats_still_decode(self):
        static = checkpointer_meta.static_blob({"w": {"exp_avg": ("tensor", "float32", (2,), True),
                                                      "lr": ("value", 0.5)}}, ["w"], [["w"]])
        v2 = pickle.dumps({"format": 2, "step": 7, "model_other": {}, "optimizer_static": static,
                           "param_groups": [{"lr": 0.1}], "dynamic_state": {"w": {"n": 3}},
                           "extra_state": None})
        meta = checkpointer_meta.decode(v2)
        self.assertEqual(meta["optimizer"]["param_groups"], [{"lr": 0.1, "params": ["w"]}])
        self.assertEqual(meta["optimizer"]["state"]["w"],
                         {"exp_avg": ("tensor", "float32", (2,), True), "n": ("value", 3)})
        v3 = checkpointer_meta.encode(7, {}, (checkpointer_meta.layout_name(static), len(static)),
                                      [{"lr": 0.1}], {"w": {"n": 3}}, None)
        self.assertEqual(checkpointer_meta.decode(v3, lambda name, size: static), meta)
        with self.assertRaises(ValueError):  # the layout tensor must hold what its name says
            checkpointer_meta.decode(v3, lambda name, size: static[:-1] + b"x")
        with self.assertRaises(ValueError):
            checkpointer_meta.decode(v3)


def open_fds():
    return len(os.listdir("/proc/self/fd"))


class ScaleTest(unittest.TestCase):
    """10,000 tensors through a Checkpointer and back: bit-exact, with the descriptors the
    trainer holds bounded (parameters and optimizer state live in a few shared arenas)."""

    def test_ten_thousand_tensors_round_trip_with_few_descriptors(self):
        def model_and_optimizer(seed):
            # 527 blocks of Linear + BatchNorm: 4 params with 3 AdamW state tensors each and 3
            # buffers (staged), 19 tensors a block.
            torch.manual_seed(seed)
            model = torch.nn.Sequential(*[m for _ in range(527) for m in (
                torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4))])
            return model, torch.optim.AdamW(model.parameters(), lr=1e-3)

        with util.Daemon() as daemon:
            before = open_fds()
            model, optimizer = model_and_optimizer(1)
            train_step(model, optimizer, 1)
            with daemon.client("scale") as c:
                ck = ckptd.torch.Checkpointer(c, model, optimizer, on_error="raise")
                want = snapshot(model, optimizer)
                self.assertGreaterEqual(sum(k.startswith(("model.", "opt.")) for k in want), 10000)
                ck.save(1)
                ck.fence()
                c.wait(1, "committed", timeout=120)
                self.assertLessEqual(open_fds() - before, 64)
                ck.remove_hook()
            fresh_model, fresh_optimizer = model_and_optimizer(2)
            with daemon.client("scale") as c:
                ck = ckptd.torch.Checkpointer(c, fresh_model, fresh_optimizer, on_error="raise")
                self.assertEqual(ck.load(1), 1)
                got = snapshot(fresh_model, fresh_optimizer)
                self.assertLessEqual(open_fds() - before, 64)
            self.assertEqual(set(got), set(want))
            for k, v in want.items():
                if torch.is_tensor(v):
                    self.assertTrue(torch.equal(got[k], v), k)
                else:
                    self.assertEqual(got[k], v, k)


if __name__ == "__main__":
    unittest.main()
