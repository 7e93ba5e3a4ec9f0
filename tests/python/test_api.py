"""ckptd Python API: errors, latest/wait/load, extra, shards, context manager, dead daemon."""

import os
import threading
import time
import unittest
import unittest.mock

import torch

import ckptd
import ckptd_testutil as util


class ApiTest(util.DaemonTestCase):
    def client(self, job, **kwargs):
        c = self.daemon.client(job, **kwargs)
        self.addCleanup(c.close)
        return c

    def assertError(self, code, fn, *args, contains=(), **kwargs):
        with self.assertRaises(ckptd.Error) as cm:
            fn(*args, **kwargs)
        e = cm.exception
        self.assertIsInstance(e, RuntimeError)
        self.assertEqual(e.code, code, str(e))
        for text in contains:
            self.assertIn(text, str(e))
        return e

    # -- errors ----------------------------------------------------------------------------

    def test_bad_job_name(self):
        self.assertError("INVALID_ARGUMENT", ckptd.Client, "../etc", 0, 1,
                         socket=self.daemon.socket, contains=("../etc",))
        self.assertError("INVALID_ARGUMENT", ckptd.Client, "job", 2, 2, socket=self.daemon.socket)

    def test_no_daemon(self):
        t0 = time.monotonic()
        self.assertError("UNAVAILABLE", ckptd.Client, "job", 0, 1,
                         socket=os.path.join(self.daemon.dir, "nobody.sock"), connect_timeout=0.3)
        self.assertLess(time.monotonic() - t0, 5)

    def test_non_contiguous(self):
        c = self.client("noncontig")
        t = torch.zeros(8, 6).t()
        self.assertError("INVALID_ARGUMENT", c.save, 1, {"transposed.weight": t},
                         contains=("transposed.weight", "not contiguous"))

    def test_not_cpu(self):
        c = self.client("device")
        self.assertError("INVALID_ARGUMENT", c.save, 1, {"m": torch.empty(4, device="meta")},
                         contains=("'m'", "CPU only"))

    def test_unknown_dtype(self):
        c = self.client("dtype")
        self.assertError("INVALID_ARGUMENT", c.save, 1,
                         {"z": torch.zeros(4, dtype=torch.complex64)},
                         contains=("'z'", "complex64"))
        self.assertError("INVALID_ARGUMENT", c.save, 1, {"l": [1, 2, 3]}, contains=("'l'",))

    def test_bad_arguments(self):
        c = self.client("args")
        t = torch.zeros(4)
        self.assertError("INVALID_ARGUMENT", c.save, -1, {"t": t})
        self.assertError("INVALID_ARGUMENT", c.save, 1, {"t": t}, on_full="drop")
        self.assertError("INVALID_ARGUMENT", c.save, 1, {"t": t}, extra="text")
        self.assertError("INVALID_ARGUMENT", c.wait, 1, state="done")
        self.assertError("INVALID_ARGUMENT", c.save, 1,
                         {"t": ckptd.Shard(t, (3,), (0,))}, contains=("outside",))
        self.assertError("INVALID_ARGUMENT", c.save, 1,
                         {"t": ckptd.FlatShard(t, (2, 3), 4)}, contains=("outside",))
        with self.assertRaises(ValueError):
            c.wait_snapshot(timeout=-1)

    def test_rank_and_job_from_the_launcher(self):
        launch_vars = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "TORCHELASTIC_RUN_ID", "SLURM_PROCID",
                       "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_JOB_ID", "OMPI_COMM_WORLD_RANK",
                       "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "CKPTD_JOB")
        clean = {k: v for k, v in os.environ.items() if k not in launch_vars}

        def connect(env, **kwargs):
            with unittest.mock.patch.dict(os.environ, env, clear=True):
                c = ckptd.Client(socket=self.daemon.socket, **kwargs)
            self.addCleanup(c.close)
            return c

        c = connect(dict(clean, RANK="0", WORLD_SIZE="1", LOCAL_RANK="0",
                         TORCHELASTIC_RUN_ID="launched"))
        self.assertEqual((c.job, c.rank, c.world_size), ("launched", 0, 1))
        c.save(1, {"t": torch.arange(8, dtype=torch.float32)})
        c.wait(1)
        self.assertEqual(c.latest(), 1)
        c = connect(dict(clean, SLURM_PROCID="0", SLURM_NTASKS="1", SLURM_JOB_ID="4242",
                         CKPTD_JOB="resumable"))
        self.assertEqual((c.job, c.rank, c.world_size), ("resumable", 0, 1))
        c = connect(dict(clean, OMPI_COMM_WORLD_RANK="0", OMPI_COMM_WORLD_SIZE="1"), job="mpi")
        self.assertEqual((c.job, c.rank, c.world_size), ("mpi", 0, 1))
        with unittest.mock.patch.dict(os.environ, clean, clear=True):
            self.assertError("INVALID_ARGUMENT", ckptd.Client, socket=self.daemon.socket,
                             contains=("RANK/WORLD_SIZE (torchrun)", "SLURM_PROCID"))
        with unittest.mock.patch.dict(os.environ, dict(clean, RANK="0", WORLD_SIZE="1",
                                                        TORCHELASTIC_RUN_ID="none"), clear=True):
            self.assertError("INVALID_ARGUMENT", ckptd.Client, socket=self.daemon.socket,
                             contains=("CKPTD_JOB",))
        with unittest.mock.patch.dict(os.environ, dict(clean, RANK="one", WORLD_SIZE="1"),
                                      clear=True):
            self.assertError("INVALID_ARGUMENT", ckptd.Client, "j", socket=self.daemon.socket,
                             contains=("RANK='one'",))

    def test_save_must_increase(self):
        c = self.client("monotonic")
        t = torch.ones(16)
        c.save(5, {"t": t})
        c.wait_snapshot()
        # A save of the registered tensors is posted: it returns once written, and the daemon's
        # refusal comes with the fence...
        c.save(5, {"t": t})
        self.assertError("FAILED_PRECONDITION", c.wait_snapshot, contains=("step 5",))
        # ...or with the next save, when that comes first; that save is not sent.
        c.save(5, {"t": t})
        self.assertError("FAILED_PRECONDITION", c.save, 6, {"t": t},
                         contains=("step 5", "step 6 not sent"))
        # A save that waits for its answer raises it itself: on_full="skip", whose caller must
        # know at once, and one that registers first.
        self.assertError("FAILED_PRECONDITION", c.save, 5, {"t": t}, on_full="skip")
        self.assertError("FAILED_PRECONDITION", c.save, 5, {"t": torch.ones(8)})
        # Refused saves leave nothing behind: the next one commits.
        c.save(6, {"t": t})
        c.wait_snapshot()
        c.wait(6, "committed", timeout=60)
        self.assertEqual(c.latest(), 6)

    # -- the normal path -------------------------------------------------------------------

    def test_incomplete_coverage_is_never_committed(self):
        # Half of an [8] tensor: the step fails at commit, naming the tensor and the hole —
        # not at some later restore.
        c = self.client("coverage")
        c.save(1, {"v": ckptd.Shard(torch.ones(4), global_shape=(8,), offsets=(0,))})
        c.wait_snapshot(timeout=30)
        with self.assertRaises(ckptd.Error) as cm:
            c.wait(1, "committed", timeout=30)
        self.assertIn("'v'", str(cm.exception))
        self.assertIn("element [4]", str(cm.exception))
        self.assertIsNone(c.latest())
        # The whole tensor commits.
        c.save(2, {"v": torch.ones(8)})
        c.wait(2, "committed", timeout=30)
        self.assertEqual(c.latest(), 2)

    def test_a_tensor_too_large_to_count_in_bytes_is_refused(self):
        # float32 [2^62] is 2^64 bytes: refused at save, not committed as "0 B".
        c = self.client("overflow")
        self.assertError("INVALID_ARGUMENT", c.save, 1,
                         {"huge": ckptd.FlatShard(torch.ones(4), global_shape=(1 << 62,),
                                                  flat_offset=0)},
                         contains=("huge", "2^63 bytes"))

    def test_latest_wait_extra_load(self):
        c = self.client("basic")
        self.assertIsNone(c.latest())
        tensors = {
            "f32": torch.randn(33, 17),
            "bf16": torch.randn(1000).to(torch.bfloat16),
            "f16": torch.randn(5, 5).half(),
            "f64": torch.randn(3, dtype=torch.float64),
            "i8": torch.arange(-50, 50, dtype=torch.int8),
            "u8": torch.arange(0, 200, dtype=torch.uint8),
            "i16": torch.arange(7, dtype=torch.int16),
            "i32": torch.arange(9, dtype=torch.int32),
            "i64": torch.tensor(123456789012, dtype=torch.int64),   # a scalar
            "bool": torch.tensor([True, False, True]),
            "empty": torch.zeros(0, 4),
        }
        expected = {k: v.clone() for k, v in tensors.items()}
        c.save(1, tensors, extra=b"\x00extra\xff")
        c.wait_snapshot(timeout=30)
        # One daemon without a coordinator holds its steps with --replicas 0: replicated once
        # persisted (1 + 0 copies in memory).
        for state in ("captured", "persisted", "committed", "replicated"):
            c.wait(1, state, timeout=30)
        self.assertEqual(c.latest(), 1)
        self.assertEqual(c.node_id, "pytest")

        # A second step; then load step 1 explicitly and the latest (2) into fresh tensors.
        tensors["f32"].add_(1)
        c.save(2, tensors, extra=b"two")
        c.wait(2, "committed", timeout=30)
        self.assertEqual(c.latest(), 2)

        fresh = {k: torch.zeros_like(v) for k, v in tensors.items()}
        extra = c.load(fresh, step=1)
        self.assertEqual(extra, b"\x00extra\xff")
        self.assertEqual(c.last_load.step, 1)
        for k in tensors:
            self.assertTrue(torch.equal(fresh[k], expected[k]), k)
        with self.client("basic", connect_timeout=5) as other:
            fresh2 = {"f32": torch.zeros(33, 17)}
            self.assertEqual(other.load(fresh2), b"two")
            self.assertEqual(other.last_load.step, 2)
            self.assertTrue(torch.equal(fresh2["f32"], expected["f32"] + 1))

    def test_wait_timeout_and_state_errors(self):
        c = self.client("waits")
        self.assertError("NOT_FOUND", c.wait, 42, "committed", timeout=5, contains=("42",))
        # Rank 0 of 2 saves; rank 1 never does: the step stays in flight, a timed wait expires.
        c0 = self.client("waits2", rank=0, world_size=2)
        c0.save(3, {"t": torch.ones(8)})
        c0.wait(3, "captured", timeout=30)
        t0 = time.monotonic()
        self.assertError("DEADLINE_EXCEEDED", c0.wait, 3, "committed", timeout=0.2,
                         contains=("3",))
        self.assertLess(time.monotonic() - t0, 5)
        self.assertError("INVALID_ARGUMENT", c0.wait, 3, "durable", timeout=1,
                         contains=("replicated",))

    def test_views_of_one_storage(self):
        # Several tensors on one storage travel as one fd with different offsets.
        c = self.client("views")
        flat = torch.arange(100, dtype=torch.float32)
        parts = {"a": flat[0:10], "b": flat[10:40].view(5, 6), "c": flat[40:100]}
        c.save(1, parts)
        c.wait(1, "committed", timeout=30)
        fresh = {"a": torch.zeros(10), "b": torch.zeros(5, 6), "c": torch.zeros(60)}
        c.load(fresh)
        for k in parts:
            self.assertTrue(torch.equal(fresh[k], parts[k]), k)
        self.assertTrue(flat.is_shared())

    def test_shards_and_strict(self):
        full = torch.arange(6 * 8, dtype=torch.int32).view(6, 8)
        c = self.client("shards")
        # "m": rows 0-2 as a box shard; "m2": rows 3-5 as a flat shard (elements 24..47): saved
        # in part on purpose.
        c.save(1, {"m": ckptd.Shard(full[0:3].clone(), (6, 8), (0, 0), partial=True),
                   "m2": ckptd.FlatShard(full[3:6].clone().view(-1), (6, 8), 24, partial=True)})
        c.wait(1, "committed", timeout=30)
        # Load a column block of "m", a box and a flat range of "m2", and (strict=False) a tensor
        # the step does not have.
        block = torch.zeros(3, 4, dtype=torch.int32)
        rows = torch.zeros(2, 8, dtype=torch.int32)
        run = torch.zeros(10, dtype=torch.int32)
        unknown = torch.full((2,), 7, dtype=torch.int32)
        c2 = self.client("shards")
        c2.load({"m": ckptd.Shard(block, (6, 8), (0, 2)),
                 "m2": ckptd.Shard(rows, (6, 8), (4, 0)),
                 "nope": unknown}, strict=False)
        self.assertTrue(torch.equal(block, full[0:3, 2:6]))
        self.assertTrue(torch.equal(rows, full[4:6]))
        self.assertEqual(c2.last_load.missing, ["nope"])
        self.assertTrue(torch.equal(unknown, torch.full((2,), 7, dtype=torch.int32)))
        c2.load({"m2": ckptd.FlatShard(run, (6, 8), 27)})
        self.assertTrue(torch.equal(run, full.view(-1)[27:37]))
        self.assertError("NOT_FOUND", c2.load, {"nope": unknown}, contains=("nope",))
        # Bytes the step does not hold are an error, never silently left as they were.
        with self.assertRaises(ckptd.Error) as cm:
            c2.load({"m": torch.zeros(6, 8, dtype=torch.int32)})
        self.assertIn("'m'", str(cm.exception))

    def test_reregister_when_memory_changes(self):
        c = self.client("rereg")
        a = torch.ones(100)
        c.save(1, {"t": a})
        c.wait_snapshot()
        c.save(2, {"t": torch.full((100,), 2.0)})       # another tensor under the same name
        c.wait_snapshot()
        a.data = torch.full((100,), 3.0)                 # same object, new memory
        c.save(3, {"t": a})
        c.wait(3, "committed", timeout=30)
        for step, value in ((1, 1.0), (2, 2.0), (3, 3.0)):
            out = torch.zeros(100)
            c.load({"t": out}, step=step)
            self.assertTrue(torch.equal(out, torch.full((100,), value)), step)

    def test_checkpointer_shard_fn(self):
        import ckptd.torch
        # Two tensor-parallel ranks (in this process) each hold half of the rows of "proj".
        torch.manual_seed(3)
        full = torch.nn.Linear(6, 8)
        halves = []
        for r in range(2):
            m = torch.nn.Linear(6, 4)
            with torch.no_grad():
                m.weight.copy_(full.weight[4 * r:4 * r + 4])
                m.bias.copy_(full.bias[4 * r:4 * r + 4])
            halves.append(m)

        def shard_fn_for(r):
            def shard_fn(name, t):
                if t.dim() >= 1 and t.shape[0] == 4:   # weight, bias and their Adam moments
                    return ckptd.Shard(t, (8,) + tuple(t.shape[1:]), (4 * r,) + (0,) * (t.dim() - 1))
                return t                                # the replicated step counter
            return shard_fn

        x = torch.randn(3, 6)
        for r, m in enumerate(halves):
            opt = torch.optim.Adam(m.parameters(), lr=0.01)
            m(x).pow(2).sum().backward()
            opt.step()
            ck = ckptd.torch.Checkpointer(self.client("tp", rank=r, world_size=2), m, opt,
                                          shard_fn=shard_fn_for(r))
            ck.save(1)
            ck.fence()
            if r == 1:
                ck.client.wait(1, "committed", timeout=30)
            halves[r] = (m, opt)

        # One rank loads everything, with a fresh optimizer: state tensors come from metadata.
        whole = torch.nn.Linear(6, 8)
        opt = torch.optim.Adam(whole.parameters(), lr=0.5)
        ck = ckptd.torch.Checkpointer(self.client("tp"), whole, opt)
        self.assertEqual(ck.load(), 1)
        self.assertEqual(opt.param_groups[0]["lr"], 0.01)
        self.assertTrue(torch.equal(whole.weight, torch.cat([halves[0][0].weight,
                                                             halves[1][0].weight])))
        st = opt.state[whole.weight]
        self.assertTrue(torch.equal(st["exp_avg"], torch.cat(
            [halves[r][1].state[halves[r][0].weight]["exp_avg"] for r in range(2)])))
        self.assertTrue(torch.equal(opt.state[whole.bias]["exp_avg_sq"], torch.cat(
            [halves[r][1].state[halves[r][0].bias]["exp_avg_sq"] for r in range(2)])))

    def test_checkpointer_load_into_a_fresh_trainer_keeps_ties_and_survives_failure(self):
        import ckptd.torch

        def trainer(seed):
            torch.manual_seed(seed)
            emb = torch.nn.Embedding(10, 4)
            head = torch.nn.Linear(4, 10, bias=False)
            head.weight = emb.weight                       # tied: one Parameter, two names
            model = torch.nn.ModuleDict({"emb": emb, "head": head})
            return model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

        model, opt = trainer(0)
        model["head"](model["emb"](torch.tensor([1, 2]))).sum().backward()
        opt.step()
        ck = ckptd.torch.Checkpointer(self.client("fresh"), model, opt)
        ck.save(1)
        ck.client.wait(1, "committed", timeout=30)

        # A restarted trainer: different initial values, not in shared memory, no momentum yet.
        fresh, fresh_opt = trainer(1)
        weight = fresh["emb"].weight
        before = weight.detach().clone()
        self.assertFalse(weight.is_shared())
        ck2 = ckptd.torch.Checkpointer(self.client("fresh"), fresh, fresh_opt)
        with self.assertRaises(ckptd.Error):
            ck2.load(step=5)                               # no such step: nothing changes
        self.assertTrue(torch.equal(fresh["emb"].weight, before))
        self.assertEqual(ck2.load(), 1)
        self.assertIs(fresh["emb"].weight, weight)         # the same Parameter object...
        self.assertIs(fresh["head"].weight, weight)        # ...still tied
        self.assertIs(fresh_opt.param_groups[0]["params"][0], weight)
        self.assertTrue(weight.is_shared())                # rebacked: saves register it as is
        self.assertTrue(torch.equal(weight, model["emb"].weight))
        self.assertTrue(torch.equal(fresh_opt.state[weight]["momentum_buffer"],
                                    opt.state[model["emb"].weight]["momentum_buffer"]))

    def test_context_manager(self):
        with self.daemon.client("ctx") as c:
            self.assertIsNone(c.latest())
        e = self.assertError("CANCELLED", c.latest)
        self.assertIn("closed", str(e))
        c.close()  # idempotent

    def test_gil_released_while_waiting(self):
        c = self.client("gil", rank=0, world_size=2)
        c.save(7, {"t": torch.ones(8)})  # rank 1 never saves: step 7 cannot commit
        done = []

        def waiter():
            try:
                # Long enough to outlast the main thread's calls below on a loaded machine.
                c.wait(7, "committed", timeout=5)
            except ckptd.Error as e:
                done.append(e.code)

        th = threading.Thread(target=waiter)
        th.start()
        # The main thread keeps running Python (and the same client answers) meanwhile.
        self.assertIsNone(c.latest())
        c.wait(7, "captured", timeout=30)
        counted = sum(range(10000))
        self.assertTrue(th.is_alive())
        th.join(30)
        self.assertFalse(th.is_alive())
        self.assertEqual(done, ["DEADLINE_EXCEEDED"])
        self.assertEqual(counted, 49995000)


class DeadDaemonTest(unittest.TestCase):
    def test_daemon_killed(self):
        d = util.Daemon().start()
        self.addCleanup(d.cleanup)
        c = d.client("dies", rank=0, world_size=2)
        self.addCleanup(c.close)
        t = torch.ones(1024)
        c.save(1, {"t": t})
        c.wait(1, "captured", timeout=30)
        errors = []

        def blocked():
            try:
                c.wait(1, "committed")  # rank 1 never saves, no timeout: only the daemon's
            except ckptd.Error as e:  # death ends this call
                errors.append(e)

        th = threading.Thread(target=blocked)
        th.start()
        self.assertIsNone(c.wait(1, "captured", timeout=10))  # the connection works meanwhile
        d.kill()
        th.join(10)
        self.assertFalse(th.is_alive(), "a call hung on a dead daemon")
        self.assertEqual(len(errors), 1)
        self.assertEqual(errors[0].code, "UNAVAILABLE", str(errors[0]))
        t0 = time.monotonic()
        with self.assertRaises(ckptd.Error) as cm:
            c.save(2, {"t": t})
        self.assertEqual(cm.exception.code, "UNAVAILABLE")
        # The connection is lost, and the re-attach the save tries finds nothing listening.
        self.assertRegex(str(cm.exception), "lost|not listening")
        with self.assertRaises(ckptd.Error) as cm:
            c.latest()
        self.assertEqual(cm.exception.code, "UNAVAILABLE")
        self.assertLess(time.monotonic() - t0, 5)


class SharedJobTest(unittest.TestCase):
    """load(job=...) reads another job's checkpoint when the daemon shares it, never otherwise."""

    def setUp(self):
        self.daemon = util.Daemon("--shared-jobs", "pretrain").start()
        self.addCleanup(self.daemon.cleanup)

    def commit(self, job, value):
        with self.daemon.client(job) as c:
            c.save(1, {"w": torch.full((64,), value)}, extra=job.encode())
            c.wait(1, "committed", timeout=30)

    def test_load_from_a_shared_job_only(self):
        self.commit("pretrain", 2.5)
        self.commit("private", 7.0)
        with self.daemon.client("finetune") as c:
            target = {"w": torch.zeros(64)}
            self.assertEqual(c.load(target, job="pretrain"), b"pretrain")
            self.assertEqual(c.last_load.step, 1)
            self.assertTrue(torch.equal(target["w"], torch.full((64,), 2.5)))

            untouched = {"w": torch.zeros(64)}
            with self.assertRaises(ckptd.Error) as cm:
                c.load(untouched, job="private")
            self.assertEqual(cm.exception.code, "PERMISSION_DENIED", str(cm.exception))
            self.assertIn("'private'", str(cm.exception))
            self.assertTrue(torch.equal(untouched["w"], torch.zeros(64)))
            with self.assertRaises(ckptd.Error):
                c.load(untouched, job=3)


if __name__ == "__main__":
    unittest.main(verbosity=2)
