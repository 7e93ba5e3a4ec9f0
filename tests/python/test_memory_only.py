"""Memory-only steps (``save(..., persist=False)``) with real daemons and real PyTorch.

A memory-only step is captured, and replicated into other daemons' memory (``--replicas``; none
here: one daemon with the embedded coordinator and replicas 0 holds the newest memory-only step
of a job in its own memory), but never written to storage. What these tests prove:

1. Client level (MemoryOnlyClientTest). A persisted step 1 and then a memory-only step 2: the
   storage root holds nothing of step 2 — no step directory, no data file, no node manifest, no
   MANIFEST, not even a temporary file — and LATEST still names 1. ``wait(2, "replicated")``
   returns; ``wait(2, "committed")`` and ``wait(2, "persisted")`` raise FAILED_PRECONDITION
   ("memory-only"), from the saving client and from another one. ``latest()`` and
   ``restore_point()`` answer 2, and a fresh client's ``load()`` restores step 2 bit-exactly
   (several dtypes) entirely from the daemon's memory (``bytes_from_storage == 0``), with its
   extra bytes. ``persist`` must be a bool: "no", 1 or None raise INVALID_ARGUMENT.
2. Restart (RestartTest). The same two steps, then the daemon is stopped (SIGTERM) or killed
   (SIGKILL) and started again on the same storage root: the memory is gone, so ``latest()``
   falls back to 1, ``load()`` restores step 1 bit-exactly from storage
   (``bytes_from_memory == 0``), an explicit load of step 2 raises NOT_FOUND, and the shutdown
   wrote nothing of step 2 either.
3. Commits go on (MemoryOnlyClientTest). A persisted step 3 after the memory-only step 2
   commits as usual (a memory-only step is never in the way of a commit): ``latest() == 3``,
   storage holds steps 1 and 3 only, and a load restores step 3.
4. Ranks that disagree (MemoryOnlyClientTest). Two ranks of one job on one daemon, each with its
   own half of a tensor: rank 0 saves step 2 memory-only, rank 1 saves it to storage. The
   mismatched save is refused (INVALID_ARGUMENT naming the rule) and fails the step at once, so
   no rank gets a committed step 2, nothing of it reaches storage, ``latest()`` never answers 2, and the
   daemon keeps working: step 3, saved alike by both ranks, commits and loads bit-exactly. The
   same with the persisted rank first (rank 0 to storage, rank 1 memory-only): the half-saved
   persisted step must not hold up the commit of step 3 either.
5. The PyTorch Checkpointer (CheckpointerTest). An MLP trained with AdamW and checkpointed every
   step with ``persist_every=3``: of steps 1..5 only step 3 has a directory on storage (it
   commits; 1, 2, 4 and 5 end "replicated"). A fresh model and optimizer restored through a new
   Checkpointer get step 5 — memory-only, the newest — from memory, with parameters, buffers and
   optimizer state (moments and step counters) equal to the trained ones. ``save(step,
   persist=True|False)`` overrides the rule for one step (SGD with momentum); ``persist_every``
   of 0, -1, True, 1.5 or "3" and ``persist="no"`` raise ValueError.

Every wait has a timeout; nothing sleeps. Each test class starts its own ckptd(s) in a temporary
directory (tests/python/ckptd_testutil.py).
"""

import os
import unittest

import torch

import ckptd
import ckptd_testutil as util

TIMEOUT = 30  # seconds; every wait below is bounded (a healthy step takes milliseconds)
# The wait for the commit of the step after two ranks disagreed: a step that blocks it would hold
# it for --step-timeout (10 min); this is enough for a healthy commit (~30 ms) on a loaded machine.
COMMIT_TIMEOUT = 15


def make_tensors(seed, n=1 << 20):
    """A few tensors of different dtypes (~5.6 MiB), distinct per seed."""
    g = torch.Generator().manual_seed(seed)
    return {
        "w": torch.randn(n, generator=g),                                  # 4 MiB, one slot
        "b16": torch.randn(3, 1000, generator=g).to(torch.bfloat16),
        "i64": torch.randint(-(1 << 40), 1 << 40, (4096,), generator=g, dtype=torch.int64),
        "mask": torch.rand(777, generator=g) > 0.5,
    }


def nbytes(tensors):
    return sum(t.numel() * t.element_size() for t in tensors.values())


def bump(tensors):
    """Changes every tensor in place (a training step), so that consecutive steps differ."""
    with torch.no_grad():
        tensors["w"].add_(1.0)
        tensors["b16"].mul_(2)
        tensors["i64"].add_(7)
        tensors["mask"].logical_not_()


def clone(tensors):
    return {k: v.clone() for k, v in tensors.items()}


def zeros_like(tensors):
    return {k: torch.zeros_like(v) for k, v in tensors.items()}


def raw_bytes(t):
    """The bytes of tensor t, as a flat uint8 tensor."""
    return t.detach().contiguous().reshape(-1).view(torch.uint8)


def step_dir(root, job, step):
    return os.path.join(root, job, "step-%010d" % step)


def stored_files(root):
    """Every file under the storage root, as paths relative to it."""
    out = []
    for dirpath, _dirs, files in os.walk(root):
        for f in files:
            out.append(os.path.relpath(os.path.join(dirpath, f), root))
    return sorted(out)


def step_dirs(root, job):
    """The step numbers that have a directory under <root>/<job> (committed or not)."""
    try:
        names = os.listdir(os.path.join(root, job))
    except FileNotFoundError:
        return []
    return sorted(int(n[len("step-"):].split(".")[0]) for n in names if n.startswith("step-"))


class Checks(unittest.TestCase):
    def assertError(self, code, fn, *args, contains=(), **kwargs):
        with self.assertRaises(ckptd.Error) as cm:
            fn(*args, **kwargs)
        e = cm.exception
        self.assertEqual(e.code, code, str(e))
        for text in contains:
            self.assertIn(text, str(e))
        return e

    def assertTensorsEqual(self, got, want, what=""):
        """Same names, dtypes, shapes and bytes (bit-exact: -0.0 is not 0.0)."""
        self.assertEqual(sorted(got), sorted(want))
        for k in want:
            g, w = got[k], want[k]
            self.assertEqual((g.dtype, g.shape), (w.dtype, w.shape), "%s%s" % (what, k))
            self.assertTrue(torch.equal(raw_bytes(g), raw_bytes(w)), "%s%s differs" % (what, k))

    def assertNothingOfStep(self, root, job, step):
        """Storage holds no trace of `step`: no directory, no file anywhere under the root."""
        name = "step-%010d" % step
        self.assertFalse(os.path.exists(step_dir(root, job, step)))
        leftovers = [f for f in stored_files(root) if name in f]
        self.assertEqual(leftovers, [], "files of memory-only step %d on storage" % step)
        self.assertNotIn(step, step_dirs(root, job))
        self.assertNotIn(step, util.committed_steps(root, job))

    def assertLatestFile(self, root, job, step):
        with open(os.path.join(root, job, "LATEST")) as f:
            self.assertEqual(int(f.read().strip()), step)


def save_persisted_then_memory_only(test, daemon, job):
    """Step 1 to storage, then step 2 memory-only, both waited for; returns (step 1's tensors,
    step 2's tensors) as values (clones)."""
    t = make_tensors(1)
    with daemon.client(job) as c:
        c.save(1, t, extra=b"one")
        c.wait_snapshot(timeout=TIMEOUT)
        c.wait(1, "committed", timeout=TIMEOUT)
        one = clone(t)
        bump(t)
        c.save(2, t, extra=b"two", persist=False)
        c.wait_snapshot(timeout=TIMEOUT)
        c.wait(2, "replicated", timeout=TIMEOUT)
        two = clone(t)
        for state in ("committed", "persisted"):  # the saving rank hears it too
            with test.assertRaises(ckptd.Error) as cm:
                c.wait(2, state, timeout=TIMEOUT)
            test.assertEqual(cm.exception.code, "FAILED_PRECONDITION", str(cm.exception))
        test.assertEqual(c.latest(), 2)
    test.assertFalse(torch.equal(one["w"], two["w"]))
    return one, two


class MemoryOnlyClientTest(util.DaemonTestCase, Checks):
    def client(self, job, **kwargs):
        c = self.daemon.client(job, **kwargs)
        self.addCleanup(c.close)
        return c

    def test_memory_only_step_is_replicated_never_stored_and_loads_from_memory(self):
        root, job = self.daemon.root, "mem"
        one, two = save_persisted_then_memory_only(self, self.daemon, job)

        # Nothing of step 2 on storage: step 1 as committed, LATEST still 1.
        self.assertNothingOfStep(root, job, 2)
        self.assertEqual(sorted(os.listdir(os.path.join(root, job))),
                         ["LATEST", "step-0000000001"])
        self.assertEqual(util.committed_steps(root, job), [1])
        self.assertLatestFile(root, job, 1)

        c = self.client(job)
        c.wait(2, "captured", timeout=TIMEOUT)
        c.wait(2, "replicated", timeout=TIMEOUT)
        for state in ("committed", "persisted"):
            self.assertError("FAILED_PRECONDITION", c.wait, 2, state, timeout=TIMEOUT,
                             contains=("memory-only",))
        # The persisted step before it reached every state, "replicated" included (replicas 0).
        for state in ("persisted", "committed", "replicated"):
            c.wait(1, state, timeout=TIMEOUT)
        self.assertEqual(c.latest(), 2)

        # A fresh client (a restarted trainer) restores step 2 from the daemon's memory.
        fresh = zeros_like(two)
        self.assertEqual(c.load(fresh), b"two")
        info = c.last_load
        self.assertEqual(info.step, 2)
        self.assertEqual(info.bytes_from_storage, 0)
        self.assertEqual(info.bytes_from_memory, nbytes(two))
        self.assertEqual(info.missing, [])
        self.assertTensorsEqual(fresh, two, "step 2: ")
        # Step 1 is still there, from storage or memory, and differs.
        older = zeros_like(one)
        self.assertEqual(c.load(older, step=1), b"one")
        self.assertEqual(c.last_load.step, 1)
        self.assertTensorsEqual(older, one, "step 1: ")
        # The restore point of a restart (every rank gets the same) is the memory-only step too.
        with self.daemon.client(job) as again:
            self.assertEqual(again.restore_point(), 2)
        # Loading wrote nothing either.
        self.assertNothingOfStep(root, job, 2)

    def test_persist_must_be_a_bool(self):
        c = self.client("badpersist")
        t = {"t": torch.ones(16)}
        for bad in ("no", 1, None, 0.0):
            self.assertError("INVALID_ARGUMENT", c.save, 1, t, persist=bad, contains=("persist",))
        # Nothing was saved: step 1 is still free, and saves normally.
        self.assertIsNone(c.latest())
        c.save(1, t, persist=True)
        c.wait(1, "committed", timeout=TIMEOUT)
        self.assertEqual(c.latest(), 1)

    def test_a_persisted_step_after_a_memory_only_one_commits(self):
        root, job = self.daemon.root, "after"
        one, two = save_persisted_then_memory_only(self, self.daemon, job)
        t = clone(two)
        bump(t)
        c = self.client(job)
        c.save(3, t, extra=b"three")
        c.wait_snapshot(timeout=TIMEOUT)
        c.wait(3, "committed", timeout=TIMEOUT)
        c.wait(3, "replicated", timeout=TIMEOUT)
        three = clone(t)
        self.assertEqual(c.latest(), 3)
        self.assertEqual(util.committed_steps(root, job), [1, 3])
        self.assertEqual(step_dirs(root, job), [1, 3])
        self.assertLatestFile(root, job, 3)
        self.assertNothingOfStep(root, job, 2)
        with self.daemon.client(job) as other:
            self.assertEqual(other.latest(), 3)
            fresh = zeros_like(three)
            self.assertEqual(other.load(fresh), b"three")
            self.assertEqual(other.last_load.step, 3)
            self.assertTensorsEqual(fresh, three, "step 3: ")

    # -- two ranks that disagree ------------------------------------------------------------

    def two_ranks(self, job):
        """Two ranks of `job`, each holding its own half of a [2, 4096] tensor (and its own
        extra); returns (clients, tensors, halves as Shards)."""
        clients = [self.client(job, rank=r, world_size=2) for r in range(2)]
        halves = [(torch.arange(4096, dtype=torch.float32) + 10000 * (r + 1)).reshape(1, 4096)
                  for r in range(2)]
        shards = [{"m": ckptd.Shard(halves[r], (2, 4096), (r, 0))} for r in range(2)]
        return clients, halves, shards

    def save_both(self, clients, shards, step, **kwargs):
        for c, s in zip(clients, shards):
            c.save(step, s, extra=b"rank%d" % c.rank, **kwargs)
        for c in clients:
            c.wait_snapshot(timeout=TIMEOUT)

    def mismatched_save(self, clients, shards, step, first_persist):
        """Rank 0 saves `step` with persist=first_persist, rank 1 the other way. Returns the
        refusal (ckptd.Error) or None when the daemon accepted rank 1's save."""
        clients[0].save(step, shards[0], persist=first_persist)
        clients[0].wait_snapshot(timeout=TIMEOUT)
        try:
            # Posted (the registered tensors): the refusal comes with the fence.
            clients[1].save(step, shards[1], persist=not first_persist)
            clients[1].wait_snapshot(timeout=TIMEOUT)
        except ckptd.Error as e:
            self.assertEqual(e.code, "INVALID_ARGUMENT", str(e))
            self.assertIn("same way", str(e))
            return e
        return None

    def check_not_committed(self, clients, step, refused):
        """No rank gets `step` committed: the mismatch fails the step at once (the wait raises
        ABORTED "failed", or FAILED_PRECONDITION for a memory-only step, which is never
        committed), it does not wait for the step timeout."""
        self.assertIsNotNone(refused, "the mismatched save was accepted")
        for c in clients:
            with self.assertRaises(ckptd.Error) as cm:
                c.wait(step, "committed", timeout=TIMEOUT)
            self.assertIn(cm.exception.code, ("ABORTED", "FAILED_PRECONDITION"),
                          str(cm.exception))
            self.assertNotEqual(c.latest(), step)

    def check_next_step_commits(self, job, clients, halves, shards, step):
        for h in halves:
            h.add_(0.5)
        self.save_both(clients, shards, step)
        for c in clients:
            try:
                # A commit takes milliseconds; a step in the way ends only at --step-timeout
                # (10 min).
                c.wait(step, "committed", timeout=COMMIT_TIMEOUT)
            except ckptd.Error as e:
                self.fail("rank %d: step %d, saved alike by both ranks after the mismatched "
                          "step %d, did not commit within %d s (%s: %s)"
                          % (c.rank, step, step - 1, COMMIT_TIMEOUT, e.code, e))
            self.assertEqual(c.latest(), step)
        self.assertEqual(util.committed_steps(self.daemon.root, job), [1, step])
        # Both halves restore bit-exactly, whole, into one rank of a world of one.
        with self.daemon.client(job) as one:
            whole = torch.zeros(2, 4096)
            one.load({"m": whole})
            self.assertEqual(one.last_load.step, step)
            self.assertTrue(torch.equal(whole, torch.cat(halves)))

    def test_ranks_that_disagree_memory_only_rank_first(self):
        job = "mixed"
        clients, halves, shards = self.two_ranks(job)
        self.save_both(clients, shards, 1)
        clients[1].wait(1, "committed", timeout=TIMEOUT)
        refused = self.mismatched_save(clients, shards, 2, first_persist=False)
        self.check_not_committed(clients, 2, refused is not None)
        self.assertNothingOfStep(self.daemon.root, job, 2)
        self.check_next_step_commits(job, clients, halves, shards, 3)

    def test_ranks_that_disagree_persisted_rank_first(self):
        job = "mixed2"
        clients, halves, shards = self.two_ranks(job)
        self.save_both(clients, shards, 1)
        clients[1].wait(1, "committed", timeout=TIMEOUT)
        refused = self.mismatched_save(clients, shards, 2, first_persist=True)
        self.check_not_committed(clients, 2, refused is not None)
        self.assertNotIn(2, util.committed_steps(self.daemon.root, job))
        # The half-saved step 2 (rank 0 wrote its part) must not hold up later commits.
        self.check_next_step_commits(job, clients, halves, shards, 3)


class RestartTest(Checks):
    """Memory-only steps do not survive their daemon: after a restart the job restores its
    newest committed step, from storage."""

    def restart_falls_back(self, how):
        d = util.Daemon().start()
        self.addCleanup(d.cleanup)
        job = "restart"
        one, _two = save_persisted_then_memory_only(self, d, job)
        if how == "kill":
            d.kill()
        d.stop()  # SIGTERM (after a kill: closes the log only)
        d.start()
        self.assertNothingOfStep(d.root, job, 2)
        self.assertEqual(util.committed_steps(d.root, job), [1])
        with d.client(job) as c:
            self.assertEqual(c.latest(), 1)
            self.assertError("NOT_FOUND", c.load, zeros_like(one), step=2)
            fresh = zeros_like(one)
            self.assertEqual(c.load(fresh), b"one")
            info = c.last_load
            self.assertEqual(info.step, 1)
            self.assertEqual(info.bytes_from_memory, 0)
            # Reads are whole aligned pieces: at least the tensors' bytes.
            self.assertGreaterEqual(info.bytes_from_storage, nbytes(one))
            self.assertTensorsEqual(fresh, one, "step 1 after restart: ")
            self.assertError("NOT_FOUND", c.wait, 2, "replicated", timeout=TIMEOUT)

    def test_stopped_daemon_falls_back_to_the_committed_step(self):
        self.restart_falls_back("stop")

    def test_killed_daemon_falls_back_to_the_committed_step(self):
        self.restart_falls_back("kill")


def build_trainer(seed, opt="adamw"):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.BatchNorm1d(32),
                                torch.nn.ReLU(), torch.nn.Linear(32, 3))
    if opt == "adamw":
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    else:
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    return model, optimizer


def train_step(model, optimizer, data):
    x = torch.randn(16, 8, generator=data)
    y = torch.randn(16, 3, generator=data)
    model.train()
    loss = torch.nn.functional.mse_loss(model(x), y)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()


def snapshot(model, optimizer):
    sd = optimizer.state_dict()
    return ({k: v.detach().clone() for k, v in model.state_dict().items()},
            {i: {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in st.items()}
             for i, st in sd["state"].items()},
            sd["param_groups"])


class CheckpointerTest(util.DaemonTestCase, Checks):
    def client(self, job):
        c = self.daemon.client(job)
        self.addCleanup(c.close)
        return c

    def assertSameTrainer(self, got, want):
        (gm, gs, gg), (wm, ws, wg) = got, want
        self.assertTensorsEqual(gm, wm, "model ")
        self.assertEqual(gg, wg)
        self.assertEqual(sorted(gs), sorted(ws))
        self.assertGreater(len(ws), 0)
        for i, st in ws.items():
            self.assertEqual(sorted(gs[i]), sorted(st), "optimizer state %s" % i)
            for k, v in st.items():
                if isinstance(v, torch.Tensor):
                    self.assertTrue(torch.equal(gs[i][k], v), "optimizer state %s.%s" % (i, k))
                else:
                    self.assertEqual(gs[i][k], v, "optimizer state %s.%s" % (i, k))

    def test_persist_every_writes_every_nth_step_and_restores_the_newest(self):
        import ckptd.torch
        root, job = self.daemon.root, "every3"
        model, optimizer = build_trainer(0)
        data = torch.Generator().manual_seed(5)
        ck = ckptd.torch.Checkpointer(self.client(job), model, optimizer, persist_every=3,
                                      on_error="raise")
        states = {}
        for step in range(1, 6):
            train_step(model, optimizer, data)
            ck.save(step)
            ck.fence()
            states[step] = snapshot(model, optimizer)
            if step % 3 == 0:
                ck.client.wait(step, "committed", timeout=TIMEOUT)
            else:
                ck.client.wait(step, "replicated", timeout=TIMEOUT)
                self.assertError("FAILED_PRECONDITION", ck.client.wait, step, "committed",
                                 timeout=TIMEOUT, contains=("memory-only",))
            self.assertEqual(ck.client.latest(), step)
        self.assertEqual(ck.failed_saves, 0)
        self.assertEqual(step_dirs(root, job), [3])
        self.assertEqual(util.committed_steps(root, job), [3])
        self.assertEqual(sorted(os.listdir(os.path.join(root, job))),
                         ["LATEST", "step-0000000003"])
        self.assertLatestFile(root, job, 3)
        # The trained state really moved between the steps.
        self.assertFalse(torch.equal(states[3][0]["0.weight"], states[5][0]["0.weight"]))

        # A restarted trainer: fresh model (other initial values) and a fresh optimizer.
        fresh_model, fresh_opt = build_trainer(1)
        self.assertFalse(torch.equal(fresh_model[0].weight, model[0].weight))
        ck2 = ckptd.torch.Checkpointer(self.client(job), fresh_model, fresh_opt, persist_every=3,
                                       on_error="raise")
        self.assertEqual(ck2.load(), 5)
        self.assertEqual(ck2.last_restore["step"], 5)
        self.assertEqual(ck2.last_restore["bytes_from_storage"], 0)
        self.assertGreater(ck2.last_restore["bytes_from_memory"], 0)
        self.assertSameTrainer(snapshot(fresh_model, fresh_opt), states[5])
        self.assertSameTrainer(snapshot(model, optimizer), states[5])
        # The committed step 3 still loads explicitly, and is step 3's state.
        model3, opt3 = build_trainer(2)
        ck3 = ckptd.torch.Checkpointer(self.client(job), model3, opt3, on_error="raise")
        self.assertEqual(ck3.load(step=3), 3)
        self.assertSameTrainer(snapshot(model3, opt3), states[3])

    def test_save_persist_overrides_the_rule(self):
        import ckptd.torch
        root, job = self.daemon.root, "override"
        model, optimizer = build_trainer(3, opt="sgd")
        data = torch.Generator().manual_seed(6)
        ck = ckptd.torch.Checkpointer(self.client(job), model, optimizer, persist_every=2,
                                      on_error="raise")
        # step: (persist argument, stored?) — 1 and 2 override the rule, 3 and 4 follow it.
        plan = {1: (True, True), 2: (False, False), 3: (None, False), 4: (None, True)}
        for step, (persist, stored) in plan.items():
            train_step(model, optimizer, data)
            ck.save(step, persist=persist)
            ck.fence()
            ck.client.wait(step, "committed" if stored else "replicated", timeout=TIMEOUT)
        with self.assertRaises(ValueError):
            ck.save(5, persist="no")
        self.assertEqual(ck.failed_saves, 0)
        self.assertEqual(step_dirs(root, job), [1, 4])
        self.assertEqual(util.committed_steps(root, job), [1, 4])
        self.assertEqual(ck.client.latest(), 4)

    def test_invalid_persist_every(self):
        import ckptd.torch
        model, optimizer = build_trainer(4)
        c = self.client("invalid")
        for bad in (0, -1, True, False, 1.5, "3", 3.0):
            with self.assertRaises(ValueError, msg=repr(bad)):
                ckptd.torch.Checkpointer(c, model, optimizer, persist_every=bad)
        for good in (None, 1, 7):
            self.assertEqual(ckptd.torch.Checkpointer(c, model, optimizer,
                                                      persist_every=good).persist_every, good)


if __name__ == "__main__":
    unittest.main(verbosity=2)
