"""ckptd.offline: checkpoints read, converted and written with no daemon running.

A real daemon saves a ckptd.torch.Checkpointer checkpoint (a model with a BatchNorm, AdamW after
two steps) and a 2-rank checkpoint of ckptd.Shard / ckptd.FlatShard pieces, and is stopped. Then,
from the storage root alone: committed steps are listed (an uncommitted directory is not), every
tensor reads back bit-exact, regions across shards read right, torch.save files of the model and
of model + optimizer load into fresh PyTorch objects, a flipped data byte fails with a checksum
error naming the tensor, and a torch.save file written back into a ckptd checkpoint passes
`ckptctl verify` and restores through a new daemon into a fresh Checkpointer.

ckptd.load_checkpoint reads the 2-rank step whole. The ckptctl binary's torch conversions:
`export --format torch` (model weights only by default, --include-optimizer, --only PREFIX,
--tensors GLOB) read back with torch.load, and `import` of a plain state_dict and of a
{"model", "optimizer", "param_names"} file restored by a Checkpointer bit-exact.
"""

import os
import shutil
import subprocess
import sys
import tempfile
import unittest

import torch

import ckptd
import ckptd.offline
import ckptd.torch
import ckptd_testutil as util

JOB = "offline"
SHARDED = "offline-sharded"
CKPTCTL = os.path.join(util.BIN_DIR, "ckptctl")


def ckptctl(*args):
    """Runs the ckptctl binary; (exit code, stdout and stderr together). Its torch conversions
    run in this test's Python (the one with PyTorch), whatever python3 is first on PATH."""
    env = dict(os.environ, CKPTCTL_PYTHON=sys.executable)
    run = subprocess.run([CKPTCTL] + list(args), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         text=True, env=env, timeout=120)
    return run.returncode, run.stdout


def make_model():
    torch.manual_seed(7)
    return torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.BatchNorm1d(16), torch.nn.ReLU(),
                               torch.nn.Linear(16, 3))


def train(model, optimizer, steps=2):
    g = torch.Generator().manual_seed(11)
    for _ in range(steps):
        loss = model(torch.randn(5, 6, generator=g)).square().sum()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()


def bits(t):
    """The tensor's bytes, so that equality is bit-exact (NaNs, -0.0)."""
    return t.detach().contiguous().view(-1).view(torch.uint8) if t.numel() else t


def same_tensor(a, b):
    return a.dtype == b.dtype and tuple(a.shape) == tuple(b.shape) and torch.equal(bits(a),
                                                                                  bits(b))


class OfflineTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="ckptd-offline-")
        daemon = util.Daemon(directory=os.path.join(cls.tmp, "saver"))
        os.makedirs(daemon.dir)
        daemon.start()
        try:
            model = make_model()
            opt = torch.optim.AdamW(model.parameters(), lr=0.01, weight_decay=0.1)
            client = daemon.client(JOB)
            ck = ckptd.torch.Checkpointer(client, model, opt, extra_state={"epoch": 3})
            train(model, opt)
            ck.save(1)
            client.wait(1, "committed", timeout=60)
            ck.remove_hook()
            client.close()
            cls.model_state = {k: v.clone() for k, v in model.state_dict().items()}
            cls.opt_state = opt.state_dict()
            cls.param_names = [n for n, _ in model.named_parameters()]

            # Two ranks: W row-split (Shard), v split as flat ranges (FlatShard).
            g = torch.Generator().manual_seed(5)
            cls.W = torch.randn(8, 6, generator=g)
            cls.v = torch.randint(-1000, 1000, (3, 5), generator=g).to(torch.int32)
            clients = [daemon.client(SHARDED, rank=r, world_size=2) for r in range(2)]
            for r, c in enumerate(clients):
                c.save(4, {"W": ckptd.Shard(cls.W[4 * r:4 * r + 4].clone(), (8, 6), (4 * r, 0)),
                           "v": ckptd.FlatShard(cls.v.view(-1)[7 * r:7 + 8 * r].clone(), (3, 5),
                                                7 * r)},
                       extra=b"rank %d" % r)
            for c in clients:
                c.wait(4, "committed", timeout=60)
                c.close()
        finally:
            daemon.stop()
        cls.root = daemon.root
        # A save that never committed: a step directory with a data file and no MANIFEST.
        leftover = os.path.join(cls.root, JOB, "step-0000000009")
        os.makedirs(leftover)
        with open(os.path.join(leftover, "rank-00000.data"), "wb") as f:
            f.write(b"\0" * 4096)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def path(self, name):
        return os.path.join(self.tmp, name)

    def assertError(self, code, fn, *args, contains=(), **kwargs):
        with self.assertRaises(ckptd.Error) as cm:
            fn(*args, **kwargs)
        self.assertEqual(cm.exception.code, code, str(cm.exception))
        for text in contains:
            self.assertIn(text, str(cm.exception))
        return cm.exception

    def assertOptimizerState(self, got, want):
        self.assertEqual(got["param_groups"], want["param_groups"])
        self.assertEqual(sorted(got["state"]), sorted(want["state"]))
        for index, st in want["state"].items():
            self.assertEqual(sorted(got["state"][index]), sorted(st))
            for key, v in st.items():
                self.assertTrue(same_tensor(got["state"][index][key], v), (index, key))

    # -- listing and reading ---------------------------------------------------------------

    def test_steps_lists_committed_only(self):
        self.assertEqual(ckptd.offline.steps(self.root, JOB), [1])
        self.assertEqual(ckptd.offline.latest(self.root, JOB), 1)
        self.assertEqual(ckptd.offline.steps(self.root, "no-such-job"), [])
        self.assertEqual(ckptd.offline.open(self.root, JOB).step, 1)
        self.assertError("NOT_FOUND", ckptd.offline.open, self.root, JOB, 9,
                         contains=("step 9",))
        self.assertError("NOT_FOUND", ckptd.offline.open, self.root, "no-such-job")

    def test_read_is_bit_exact(self):
        ck = ckptd.offline.open(self.root, JOB)
        self.assertEqual(ck.world_size, 1)
        for name, want in self.model_state.items():
            self.assertEqual(ck.tensors[name].shape, tuple(want.shape))
            self.assertTrue(same_tensor(ck.read(name), want), name)
        for index, st in self.opt_state["state"].items():
            pname = self.param_names[index]
            for key, want in st.items():
                got = ck.read("optimizer.state.%s.%s" % (pname, key))
                self.assertTrue(same_tensor(got, want), (pname, key))
        out = torch.empty(16, 6)
        self.assertIs(ck.read("0.weight", out=out), out)
        self.assertTrue(same_tensor(out, self.model_state["0.weight"]))
        model_only = ck.state_dict(what="model")
        self.assertEqual(sorted(model_only), sorted(self.model_state))
        self.assertEqual(sorted(ck.state_dict("1.")), sorted(
            k for k in self.model_state if k.startswith("1.")))
        self.assertEqual(ck.verify(), [])
        self.assertEqual(ck.checkpointer_meta()["extra_state"], {
            "ckptd.extra_state.dict/1": {"epoch": 3}})
        self.assertError("NOT_FOUND", ck.read, "decoder.weight", contains=("decoder.weight",))
        self.assertError("INVALID_ARGUMENT", ck.read, "0.weight", out=torch.empty(16, 6,
                                                                                  dtype=torch.half),
                         contains=("0.weight",))

    def test_sharded_regions(self):
        ck = ckptd.offline.open(self.root, SHARDED, 4)
        self.assertEqual(ck.world_size, 2)
        self.assertEqual([ck.extras(r) for r in range(2)], [b"rank 0", b"rank 1"])
        self.assertError("NOT_FOUND", ck.extras, 2)
        self.assertTrue(same_tensor(ck.read("W"), self.W))
        self.assertTrue(same_tensor(ck.read("v"), self.v))
        # Rows 2..6 of W cross both ranks' shards; columns 1..4 only.
        part = ck.read("W", ckptd.Shard(torch.empty(4, 3), (8, 6), (2, 1)))
        self.assertTrue(same_tensor(part, self.W[2:6, 1:4]))
        flat = ck.read("v", ckptd.FlatShard(torch.empty(6, dtype=torch.int32), (3, 5), 4))
        self.assertTrue(same_tensor(flat, self.v.view(-1)[4:10]))
        # A non-contiguous destination gets its region all the same.
        target = torch.zeros(6, 8).t()
        ck.read("W", out=target)
        self.assertTrue(same_tensor(target.contiguous(), self.W))
        self.assertError("INVALID_ARGUMENT", ck.read, "W",
                         ckptd.Shard(torch.empty(4, 3), (8, 7), (0, 0)), contains=("'W'",))

    def test_corrupted_byte_is_a_checksum_error(self):
        root = self.path("corrupt")
        shutil.copytree(os.path.join(self.root, JOB), os.path.join(root, JOB))
        data = os.path.join(root, JOB, "step-0000000001", "rank-00000.data")
        with open(data, "r+b") as f:
            content = f.read()
            at = next(i for i, b in enumerate(content) if b)  # a byte of some tensor
            f.seek(at)
            f.write(bytes([content[at] ^ 0x5A]))
        ck = ckptd.offline.open(root, JOB)
        failed = {}
        for name in ck.tensors:
            try:
                ck.read(name)
            except ckptd.Error as e:
                failed[name] = e
        self.assertEqual(len(failed), 1, failed)
        (name, e), = failed.items()
        self.assertEqual(e.code, "DATA_LOSS", str(e))
        for text in ("checksum", name, "rank-00000.data"):
            self.assertIn(text, str(e))
        self.assertTrue(ck.verify())
        self.assertError("DATA_LOSS", ckptd.offline.to_torch_save, root, JOB, 1,
                         self.path("corrupt.pt"))
        self.assertFalse(os.path.exists(self.path("corrupt.pt")))

    # -- torch.save files --------------------------------------------------------------------

    def test_to_torch_save_model(self):
        out = self.path("model.pt")
        self.assertEqual(ckptd.offline.to_torch_save(self.root, JOB, None, out), 1)
        sd = torch.load(out)
        self.assertFalse([k for k in sd if k.startswith("optimizer.")])
        fresh = make_model()
        torch.nn.init.zeros_(fresh[0].weight)
        fresh.load_state_dict(sd)  # strict: exactly the model's keys
        for k, v in fresh.state_dict().items():
            self.assertTrue(same_tensor(v, self.model_state[k]), k)
        self.assertFalse(os.path.exists(out + ".tmp"))

    def test_to_torch_save_checkpointer_restores_the_optimizer(self):
        out = self.path("full.pt")
        ckptd.offline.to_torch_save(self.root, JOB, 1, out, what="checkpointer")
        saved = torch.load(out)
        self.assertEqual(saved["extra_state"], {"ckptd.extra_state.dict/1": {"epoch": 3}})
        self.assertEqual(saved["param_names"], self.param_names)
        model = make_model()
        opt = torch.optim.AdamW(model.parameters(), lr=0.5)
        model.load_state_dict(saved["model"])
        opt.load_state_dict(saved["optimizer"])
        self.assertOptimizerState(opt.state_dict(), self.opt_state)
        self.assertError("INVALID_ARGUMENT", ckptd.offline.to_torch_save, self.root, JOB, 1, out,
                         what="weights")
        self.assertError("FAILED_PRECONDITION", ckptd.offline.to_torch_save, self.root, SHARDED,
                         4, out, what="checkpointer", contains=("Checkpointer",))

    def test_from_torch_save_round_trip(self):
        full = self.path("roundtrip.pt")
        ckptd.offline.to_torch_save(self.root, JOB, 1, full, what="checkpointer")
        daemon = util.Daemon(directory=self.path("importer"))
        os.makedirs(daemon.dir)
        step_dir = ckptd.offline.from_torch_save(full, daemon.root, "imported", 5)
        self.assertTrue(os.path.exists(os.path.join(step_dir, "MANIFEST")))
        self.assertError("FAILED_PRECONDITION", ckptd.offline.from_torch_save, full, daemon.root,
                         "imported", 5, contains=("committed step 5",))
        self.assertEqual(ckptd.offline.steps(daemon.root, "imported"), [5])
        with open(os.path.join(daemon.root, "imported", "LATEST")) as f:
            self.assertEqual(f.read(), "5\n")
        ckptctl = os.path.join(util.BIN_DIR, "ckptctl")
        verify = subprocess.run([ckptctl, "verify", step_dir], stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)
        self.assertEqual(verify.returncode, 0, verify.stdout)

        # A plain state_dict too, for a job that starts from weights trained elsewhere.
        weights = self.path("weights.pt")
        torch.save(self.model_state, weights)
        ckptd.offline.from_torch_save(weights, daemon.root, "weights", 0)

        with daemon:
            model = make_model()
            opt = torch.optim.AdamW(model.parameters(), lr=0.5)
            client = daemon.client("imported")
            ck = ckptd.torch.Checkpointer(client, model, opt, extra_state={"epoch": 0})
            self.assertEqual(ck.load(), 5)
            client.close()
            for k, v in model.state_dict().items():
                self.assertTrue(same_tensor(v, self.model_state[k]), k)
            self.assertOptimizerState(opt.state_dict(), self.opt_state)
            self.assertEqual(ck.loaded_extra_state, {"epoch": 3})

            fresh = make_model()
            with daemon.client("weights") as c:
                targets = {k: v.clone() for k, v in fresh.state_dict().items()}
                c.load(targets)
                self.assertEqual(c.last_load.step, 0)
            for k, v in targets.items():
                self.assertTrue(same_tensor(v, self.model_state[k]), k)


    # -- ckptd.load_checkpoint ------------------------------------------------------------------

    def test_load_checkpoint_assembles_two_ranks_row_shards(self):
        step_dir = os.path.join(self.root, SHARDED, "step-0000000004")
        got = ckptd.load_checkpoint(step_dir)
        self.assertEqual(sorted(got), ["W", "v"])
        self.assertTrue(same_tensor(got["W"], self.W))  # rows 0-3 from rank 0, 4-7 from rank 1
        self.assertTrue(same_tensor(got["v"], self.v))
        self.assertEqual(list(ckptd.load_checkpoint(step_dir, names=["v"])), ["v"])
        self.assertError("NOT_FOUND", ckptd.load_checkpoint, step_dir, names=["W", "u"],
                         contains=("'u'",))
        self.assertError("INVALID_ARGUMENT", ckptd.load_checkpoint, step_dir, names="W")
        # A Checkpointer's step: every tensor, optimizer state under its stored names.
        full = ckptd.load_checkpoint(os.path.join(self.root, JOB, "step-0000000001"))
        for name, want in self.model_state.items():
            self.assertTrue(same_tensor(full[name], want), name)
        for index, st in self.opt_state["state"].items():
            for key, want in st.items():
                name = "optimizer.state.%s.%s" % (self.param_names[index], key)
                self.assertTrue(same_tensor(full[name], want), name)
        # A save that never committed is not a checkpoint.
        leftover = os.path.join(self.root, JOB, "step-0000000009")
        with self.assertRaises(ckptd.Error) as cm:
            ckptd.load_checkpoint(leftover)
        self.assertIn("MANIFEST", str(cm.exception))

    # -- ckptctl export --format torch / import ---------------------------------------------------

    def test_ckptctl_export_torch_is_the_model(self):
        step_dir = os.path.join(self.root, JOB, "step-0000000001")
        out = self.path("ctl-model.pt")
        rc, text = ckptctl("export", step_dir, "--format", "torch", "--out", out)
        self.assertEqual(rc, 0, text)
        self.assertIn("job offline step 1", text)
        fresh = make_model()
        fresh.load_state_dict(torch.load(out))  # strict: exactly the model's keys
        for k, v in fresh.state_dict().items():
            self.assertTrue(same_tensor(v, self.model_state[k]), k)
        self.assertFalse(os.path.exists(out + ".tmp"))

        rc, text = ckptctl("export", step_dir, "--format", "torch", "--out", out,
                           "--include-optimizer")
        self.assertEqual(rc, 0, text)
        bundle = torch.load(out)
        self.assertEqual(bundle["param_names"], self.param_names)
        model = make_model()
        opt = torch.optim.AdamW(model.parameters(), lr=0.5)
        model.load_state_dict(bundle["model"])
        opt.load_state_dict(bundle["optimizer"])
        self.assertOptimizerState(opt.state_dict(), self.opt_state)

        # --only PREFIX (with the optimizer: the state of those parameters), --tensors GLOB.
        rc, text = ckptctl("export", step_dir, "--format", "torch", "--out", out, "--only", "3.",
                           "--include-optimizer")
        self.assertEqual(rc, 0, text)
        part = torch.load(out)
        self.assertEqual(sorted(part["model"]), ["3.bias", "3.weight"])
        kept = {self.param_names[i] for i in part["optimizer"]["state"]}
        self.assertEqual(kept, {"3.bias", "3.weight"})
        # (the same Selection in process: each ckptctl call above starts a Python with PyTorch)
        ckptd.offline.export_torch(step_dir, out, ckptd.offline.Selection(only="3."))
        self.assertEqual(sorted(torch.load(out)), ["3.bias", "3.weight"])
        ckptd.offline.export_torch(step_dir, out, ckptd.offline.Selection(tensors="*.weight"))
        self.assertEqual(sorted(torch.load(out)), ["0.weight", "1.weight", "3.weight"])

        # Errors: nothing selected (no file), the old --only values, a directory that is no step.
        none = self.path("none.pt")
        rc, text = ckptctl("export", step_dir, "--format", "torch", "--out", none, "--only",
                           "decoder.")
        self.assertEqual(rc, 1, text)
        self.assertIn("no tensor", text)
        self.assertFalse(os.path.exists(none))
        rc, text = ckptctl("export", step_dir, "--format", "torch", "--out", none, "--only",
                           "model")
        self.assertEqual(rc, 2, text)
        self.assertIn("--include-optimizer", text)
        rc, text = ckptctl("export", os.path.join(self.root, JOB, "step-0000000009"), "--format",
                           "torch", "--out", none)
        self.assertEqual(rc, 2, text)
        self.assertIn("MANIFEST", text)
        self.assertFalse(os.path.exists(none))

    def test_ckptctl_import_restores_bit_exact(self):
        # A Checkpointer-shaped file as a training script writes it, and a plain state_dict.
        bundle = self.path("trained.pt")
        torch.save({"model": self.model_state, "optimizer": self.opt_state,
                    "param_names": self.param_names}, bundle)
        weights = self.path("plain.pt")
        torch.save(self.model_state, weights)
        daemon = util.Daemon(directory=self.path("ctl-importer"))
        os.makedirs(daemon.root)
        rc, text = ckptctl("import", bundle, "--storage-root", daemon.root, "--job", "ctl-full")
        self.assertEqual(rc, 0, text)
        self.assertIn("step 0", text)  # a new job starts at 0
        rc, text = ckptctl("import", bundle, "--storage-root", daemon.root, "--job", "ctl-full")
        self.assertEqual(rc, 0, text)
        self.assertIn("step 1", text)  # then the step after the newest committed one
        rc, text = ckptctl("import", weights, "--storage-root", daemon.root, "--job", "ctl-plain",
                           "--step", "7")
        self.assertEqual(rc, 0, text)
        self.assertEqual(ckptd.offline.steps(daemon.root, "ctl-plain"), [7])
        rc, text = ckptctl("verify", os.path.join(daemon.root, "ctl-plain", "step-0000000007"))
        self.assertEqual(rc, 0, text)
        # An optimizer without parameter names cannot be mapped: a clear error, no step.
        nameless = self.path("nameless.pt")
        torch.save({"model": self.model_state, "optimizer": self.opt_state}, nameless)
        rc, text = ckptctl("import", nameless, "--storage-root", daemon.root, "--job", "ctl-x")
        self.assertEqual(rc, 1, text)
        self.assertIn("param_names", text)
        self.assertEqual(ckptd.offline.steps(daemon.root, "ctl-x"), [])

        with daemon:
            model = make_model()
            opt = torch.optim.AdamW(model.parameters(), lr=0.5)
            with daemon.client("ctl-full") as client:
                ck = ckptd.torch.Checkpointer(client, model, opt, on_error="raise")
                self.assertEqual(ck.load(), 1)
            for k, v in model.state_dict().items():
                self.assertTrue(same_tensor(v, self.model_state[k]), k)
            self.assertOptimizerState(opt.state_dict(), self.opt_state)

            plain = make_model()
            torch.nn.init.zeros_(plain[0].weight)
            with daemon.client("ctl-plain") as client:
                ck = ckptd.torch.Checkpointer(client, plain, None, on_error="raise")
                self.assertEqual(ck.load(), 7)
            for k, v in plain.state_dict().items():
                self.assertTrue(same_tensor(v, self.model_state[k]), k)


if __name__ == "__main__":
    unittest.main()
