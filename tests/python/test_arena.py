"""ckptd.arena: many small tensors moved into a few shared-memory arenas keep their values, their
Python identity and their training behaviour, and cost one descriptor per arena — in this
process and in the daemon's registration."""

import copy
import io
import os
import re
import time
import unittest

import torch
import torch.nn as nn

import ckptd
import ckptd.arena
import ckptd_testutil as util

# Linear layers cycle through these dtypes (float16 has no CPU matmul in torch 1.13).
LAYER_DTYPES = (torch.float32, torch.bfloat16, torch.float32, torch.float64)
# Every dtype ckptd knows (and complex64, which only the arena need handle), for the dtype test.
ALL_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int8,
              torch.int16, torch.int32, torch.int64, torch.uint8, torch.bool, torch.complex64)


class ManySmallLayers(nn.Module):
    """A residual stack of tiny Linear layers of mixed dtypes: 2 parameters per layer, and
    AdamW adds 3 state tensors per parameter (step, exp_avg, exp_avg_sq)."""

    def __init__(self, layers, width=4):
        super().__init__()
        self.layers = nn.ModuleList(
            nn.Linear(width, width, dtype=LAYER_DTYPES[i % len(LAYER_DTYPES)])
            for i in range(layers))

    def forward(self, x):
        for layer in self.layers:
            x = x + torch.tanh(layer(x.to(layer.weight.dtype))).to(x.dtype)
        return x


def train_step(model, optimizer, x):
    optimizer.zero_grad()
    model(x).square().sum().backward()
    optimizer.step()


def optimizer_tensors(optimizer):
    return [v for st in optimizer.state.values() for v in st.values()
            if isinstance(v, torch.Tensor)]


def open_fds():
    return len(os.listdir("/proc/self/fd"))


def distinct_shared_objects(tensors):
    """How many distinct shared-memory objects the tensors would register with ckptd (what the
    daemon maps: one per (st_dev, st_ino) of the descriptors ckptd.Client hands over)."""
    objects = set()
    for t in tensors:
        if t.numel() == 0:
            continue
        fd, _ = ckptd._storage_fd(t)
        st = os.fstat(fd)
        objects.add((st.st_dev, st.st_ino))
    return len(objects)


def snapshot(tensors):
    return [t.detach().clone() for t in tensors]


def bits(t):
    """The tensor's bytes, for bit-exact comparison (NaN-safe, -0.0 distinct from 0.0)."""
    t = t.detach().contiguous()
    return t.reshape(-1).view(torch.uint8) if t.dtype != torch.bool else t.reshape(-1)


class ArenaTest(util.DaemonTestCase):
    def assertBitIdentical(self, actual, expected, what=""):
        self.assertEqual(len(actual), len(expected))
        for i, (a, e) in enumerate(zip(actual, expected)):
            self.assertEqual((a.dtype, tuple(a.shape)), (e.dtype, tuple(e.shape)), what)
            self.assertTrue(torch.equal(bits(a), bits(e)), "%s tensor %d differs" % (what, i))

    def trained_pair(self, layers):
        """(model, optimizer, twin model, twin optimizer, input): two identical models after one
        identical AdamW step, so their optimizer state exists."""
        torch.manual_seed(1234)
        model = ManySmallLayers(layers)
        twin = copy.deepcopy(model)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        twin_opt = torch.optim.AdamW(twin.parameters(), lr=1e-2)
        x = torch.randn(3, 4)
        train_step(model, opt, x)
        train_step(twin, twin_opt, x)
        return model, opt, twin, twin_opt, x

    # -- many tensors, few descriptors -----------------------------------------------------

    def test_ten_thousand_tensors_few_descriptors(self):
        model, opt, twin, twin_opt, x = self.trained_pair(layers=1250)
        params = list(model.parameters())
        state = optimizer_tensors(opt)
        tensors = params + state
        self.assertEqual(len(tensors), 10000)
        ids = [id(t) for t in tensors]
        state_ids = {(id(p), k): id(v) for p, st in opt.state.items() for k, v in st.items()}
        before = snapshot(tensors)
        fds_before = open_fds()

        t0 = time.monotonic()
        arenas = ckptd.arena.move_into_arenas(tensors)
        elapsed = time.monotonic() - t0

        fds_moved = open_fds()
        dtypes = len({t.dtype for t in tensors})
        self.assertEqual(len(arenas), dtypes, "a few MiB of tensors fit one 1 GiB arena per dtype")
        self.assertBitIdentical(tensors, before, "after the move")
        self.assertEqual([id(t) for t in tensors], ids)
        self.assertTrue(all(t.is_shared() for t in tensors))
        self.assertTrue(all(isinstance(p, nn.Parameter) for p in model.parameters()))
        self.assertEqual([id(p) for p in model.parameters()], ids[:len(params)])
        self.assertEqual([id(p) for p in opt.param_groups[0]["params"]], ids[:len(params)])
        self.assertEqual({(id(p), k): id(v) for p, st in opt.state.items() for k, v in st.items()},
                         state_ids)
        self.assertTrue(all(t.data_ptr() % ckptd.arena.ALIGNMENT == 0 for t in tensors))
        self.assertEqual(len({t.data_ptr() for t in tensors}), len(tensors))
        self.assertEqual(distinct_shared_objects(tensors), dtypes)
        fds_registered = open_fds()
        self.assertLessEqual(fds_moved - fds_before, dtypes + 1)
        self.assertLessEqual(fds_registered - fds_before, dtypes + 1)
        print("\n10000 tensors moved in %.3f s; open descriptors %d before, %d after the move, "
              "%d after asking each tensor for its descriptor"
              % (elapsed, fds_before, fds_moved, fds_registered))

        # Training goes on, bit-identical to the untouched twin.
        for _ in range(2):
            train_step(model, opt, x)
            train_step(twin, twin_opt, x)
        self.assertBitIdentical(list(model.parameters()), list(twin.parameters()), "params")
        self.assertBitIdentical(optimizer_tensors(opt), optimizer_tensors(twin_opt), "state")
        self.assertTrue(all(t.is_shared() for t in params + optimizer_tensors(opt)))
        self.assertEqual(distinct_shared_objects(params + optimizer_tensors(opt)), dtypes)

    def test_every_dtype(self):
        torch.manual_seed(7)
        tensors = []
        for dtype in ALL_DTYPES:
            for shape in ((), (1,), (3,), (5, 7), (2, 3, 5)):
                t = torch.randn(shape, dtype=torch.float64) * 100
                if dtype == torch.bool:
                    t = t > 0
                elif dtype == torch.complex64:
                    t = torch.complex(t.float(), -t.float())
                tensors.append(t.to(dtype))
        before = snapshot(tensors)
        arenas = ckptd.arena.move_into_arenas(tensors)
        # One arena per dtype, so that torch.save still takes the moved tensors (it refuses
        # one storage viewed as two types).
        self.assertEqual(len(arenas), len(ALL_DTYPES))
        self.assertBitIdentical(tensors, before)
        for t in tensors:
            self.assertTrue(t.is_shared())
            self.assertTrue(t.is_contiguous())
            self.assertEqual(t.data_ptr() % 64, 0)
        self.assertEqual(distinct_shared_objects(tensors), len(ALL_DTYPES))
        buffer = io.BytesIO()
        torch.save({"t%d" % i: t for i, t in enumerate(tensors)}, buffer)
        buffer.seek(0)
        self.assertBitIdentical(list(torch.load(buffer).values()), before, "torch.save round trip")
        # The slices are independent: writing one leaves its neighbours alone.
        tensors[3].fill_(1)
        self.assertBitIdentical(tensors[:3] + tensors[4:], before[:3] + before[4:])

    # -- the rules -------------------------------------------------------------------------

    def test_rules(self):
        plain = torch.randn(4, 4)
        shared = torch.randn(4).share_memory_()
        flat = torch.randn(100)
        view_of_flat = flat[10:30].view(4, 5)
        empty = torch.empty(0, 3)
        transposed = torch.randn(3, 5).t()
        alias_a = torch.randn(6)
        alias_b = alias_a.view(2, 3)               # another object on the same whole storage
        inputs = [plain, shared, view_of_flat, empty, transposed, alias_a, alias_b, plain]
        before = {id(t): (t.data_ptr(), t.clone()) for t in inputs}
        shared_ptr = shared.data_ptr()

        arenas = ckptd.arena.move_into_arenas(inputs)

        self.assertEqual(len(arenas), 1)
        for t in inputs:
            self.assertTrue(torch.equal(t, before[id(t)][1]))
        # Moved: the plain tensor (given twice, moved once) and the two aliases, together.
        self.assertTrue(plain.is_shared())
        self.assertTrue(alias_a.is_shared() and alias_b.is_shared())
        self.assertEqual(alias_a.data_ptr(), alias_b.data_ptr())
        alias_a.add_(1)
        self.assertTrue(torch.equal(alias_b.reshape(-1), alias_a))
        self.assertEqual(distinct_shared_objects([plain, alias_a, alias_b]), 1)
        # Left alone: already shared, a view of a bigger buffer, empty, non-contiguous.
        self.assertEqual(shared.data_ptr(), shared_ptr)
        for t in (view_of_flat, empty, transposed):
            self.assertEqual(t.data_ptr(), before[id(t)][0])
            self.assertFalse(t.is_shared())
        view_of_flat.fill_(7)
        self.assertTrue(torch.equal(flat[10:30], torch.full((20,), 7.0)))

    def test_partially_viewed_storage_is_left_alone(self):
        whole = torch.randn(8)
        part = whole[2:6]                          # same storage, not all of it
        ptr = whole.data_ptr()
        self.assertEqual(ckptd.arena.move_into_arenas([whole, part]), [])
        self.assertEqual(whole.data_ptr(), ptr)
        part.fill_(0)
        self.assertTrue(torch.equal(whole[2:6], torch.zeros(4)))

    def test_non_cpu_and_non_tensor(self):
        meta = torch.empty(4, device="meta")
        self.assertEqual(ckptd.arena.move_into_arenas([meta]), [])
        with self.assertRaises(TypeError):
            ckptd.arena.move_into_arenas([torch.zeros(2), 3])
        with self.assertRaises(ValueError):
            ckptd.arena.move_into_arenas([torch.zeros(2)], arena_bytes=0)

    def test_tied_weights_train_like_the_twin(self):
        class Tied(nn.Module):
            def __init__(self):
                super().__init__()
                self.embed = nn.Embedding(16, 8)
                self.hidden = nn.Linear(8, 8)
                self.out = nn.Linear(8, 16, bias=False)
                self.out.weight = self.embed.weight     # one Parameter in two modules

            def forward(self, idx):
                return self.out(torch.relu(self.hidden(self.embed(idx))))

        torch.manual_seed(3)
        model = Tied()
        twin = copy.deepcopy(model)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        twin_opt = torch.optim.AdamW(twin.parameters(), lr=1e-2)
        idx = torch.tensor([1, 5, 9, 5])

        def step(m, o):
            o.zero_grad()
            m(idx).logsumexp(-1).sum().backward()
            o.step()

        step(model, opt)
        step(twin, twin_opt)
        # The tied Parameter is given twice (once per module) and moved once.
        tensors = [m.weight for m in (model.embed, model.out)] + list(model.parameters())
        tensors += optimizer_tensors(opt)
        ckptd.arena.move_into_arenas(tensors)
        self.assertIs(model.out.weight, model.embed.weight)
        self.assertTrue(model.embed.weight.is_shared())
        for _ in range(2):
            step(model, opt)
            step(twin, twin_opt)
        self.assertIs(model.out.weight, model.embed.weight)
        self.assertBitIdentical(list(model.parameters()), list(twin.parameters()), "params")
        self.assertBitIdentical(optimizer_tensors(opt), optimizer_tensors(twin_opt), "state")

    # -- arena sizes -----------------------------------------------------------------------

    def test_tensor_larger_than_an_arena_gets_its_own(self):
        small_a = torch.randn(10)                  # 40 bytes
        big = torch.randn(1000)                    # 4000 bytes > 1024
        small_b = torch.randn(10, dtype=torch.float64)
        filler = [torch.randn(64) for _ in range(5)]   # 256 bytes each: spill into a new arena
        tensors = [small_a, big, small_b] + filler
        before = snapshot(tensors)
        arenas = ckptd.arena.move_into_arenas(tensors, arena_bytes=1024)
        self.assertBitIdentical(tensors, before)
        # float32: [small_a, 3 fillers] = 832 bytes with alignment, [2 fillers], [big];
        # float64: [small_b] (one dtype per arena).
        self.assertEqual(sorted(a.nbytes() for a in arenas), [128, 512, 832, 4032])
        # The big tensor alone in its arena; it did not close the arena of the small ones.
        self.assertEqual(big.storage_offset(), 0)
        self.assertEqual(distinct_shared_objects([big]), 1)
        self.assertEqual(distinct_shared_objects([small_a] + filler[:3]), 1)
        self.assertEqual(distinct_shared_objects(tensors), 4)

    # -- through a real daemon -------------------------------------------------------------

    def daemon_mappings(self, job):
        """(tensors, mappings) of the daemon's last registration for ``job``."""
        found = re.findall(r"job '%s' rank 0 registered (\d+) tensors, \d+ bytes, (\d+) mappings"
                           % re.escape(job), self.daemon.log())
        self.assertTrue(found, "no registration of %s in the daemon log" % job)
        return tuple(int(v) for v in found[-1])

    def test_round_trip_through_the_daemon(self):
        model, opt, _, _, _ = self.trained_pair(layers=250)
        named = {"model.%s" % n: p for n, p in model.named_parameters()}
        for i, t in enumerate(optimizer_tensors(opt)):
            named["state.%d" % i] = t
        for i, dtype in enumerate(d for d in ALL_DTYPES if d != torch.complex64):
            named["extra.%d" % i] = (torch.arange(-7, 29) * (i + 3)).to(dtype).view(4, 9)
        tensors = list(named.values())
        arenas = ckptd.arena.move_into_arenas(tensors, arena_bytes=64 << 10)
        self.assertGreater(len(arenas), 1)
        self.assertLess(len(arenas), 16)
        expected = snapshot(tensors)

        fds_before = open_fds()
        with self.daemon.client("arena-roundtrip") as c:
            c.save(1, named)
            c.wait_snapshot()
            c.wait(1, "committed")
            self.assertEqual(self.daemon_mappings("arena-roundtrip"), (len(named), len(arenas)))

            targets = {n: torch.zeros_like(t) for n, t in named.items()}
            target_arenas = ckptd.arena.move_into_arenas(targets.values(), arena_bytes=64 << 10)
            self.assertEqual(len(target_arenas), len(arenas))
            self.assertEqual(distinct_shared_objects(targets.values()), len(target_arenas))
        with self.daemon.client("arena-roundtrip") as c:
            c.load(targets, step=1)
            self.assertEqual(self.daemon_mappings("arena-roundtrip"),
                             (len(named), len(target_arenas)))
        self.assertLessEqual(open_fds() - fds_before, len(target_arenas) + 2)
        self.assertBitIdentical(list(targets.values()), expected, "loaded")

        # A tensor given new memory leaves its arena; the next save registers it on its own.
        p = model.layers[0].weight
        p.data = torch.full_like(p, 0.5)
        self.assertFalse(p.is_shared())
        with self.daemon.client("arena-roundtrip") as c:
            c.save(2, named)
            c.wait(2, "committed")
            self.assertEqual(self.daemon_mappings("arena-roundtrip"),
                             (len(named), len(arenas) + 1))
            c.load(targets, step=2)
        self.assertTrue(torch.equal(targets["model.layers.0.weight"], torch.full_like(p, 0.5)))


if __name__ == "__main__":
    unittest.main()
