"""Hung storage must not reach the trainer: a daemon whose storage root is a filesystem that stops
answering (every call blocks, as on a parallel-filesystem client whose server died) keeps the
trainer's steps short, fails the checkpoints it cannot take, and commits again once storage
answers.

- FrozenFSTest: the emulated hung filesystem itself (fusefreeze.py): writes go through when
  thawed, block while frozen and complete after the thaw; stop() leaves no mount behind.
- HungStorageTest.test_checkpointer_through_a_storage_freeze: a PyTorch training loop with a
  Checkpointer (on_error="warn") saving every step into a daemon whose storage root lives on a
  FrozenFS; storage freezes for 25 s and thaws. The loop never raises, at most two steps take
  more than 1 s and none longer than the client's call timeout + 2 s; failed saves are counted
  and warned about; after the thaw a later step commits and restores bit-exactly.

What the daemon does (its flush threads are the only ones that touch storage): captures go on
into its bounded host pool while there is room; once no write has completed for
--storage-stall-timeout and the pool has no room, waiting captures fail and new saves are skipped
at once ("storage stalled"); when storage answers again, flushing resumes.

Needs /dev/fuse, fusepy (python3-fusepy) and fusermount3 (fuse3); skipped otherwise. Prints a
one-line summary to stderr ("hung-storage: ...") for the benchmark tables.
"""

import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import unittest
import warnings

import torch

import ckptd
import ckptd.torch
import ckptd_testutil as util
from fusefreeze import FrozenFS, mounted_at

JOB = "hung"
CALL_TIMEOUT = 10.0      # the client's call_timeout (and so the Checkpointer's fence timeout)
FREEZE_SECONDS = 25.0    # how long storage hangs (a duration of the fault, not a synchronisation)
RESUME_LIMIT = 60.0      # after the thaw, a step must commit within this
SLOW_STEP = 1.0          # a step longer than this is a stall the trainer felt
MAX_SLOW_STEPS = 2
# The pool holds ~2.5 steps of the ~26 MiB state below: the freeze fills it within a few steps.
POOL_ARGS = ["--host-pool", "64MiB", "--slot-size", "4MiB"]
STALL_SECONDS = 3.0
STALL_ARGS = ["--storage-stall-timeout", "%ds" % STALL_SECONDS]


def _skip_unless_fuse(test):
    ok, reason = FrozenFS.available()
    if not ok:
        test.skipTest(reason)


def _tempdir(test, prefix):
    d = tempfile.mkdtemp(prefix=prefix)
    test.addCleanup(shutil.rmtree, d, True)
    return d


def _frozen_fs(test, top):
    """A started FrozenFS over top/backing at top/mnt; stopped (thawed, unmounted) at cleanup."""
    fs = FrozenFS(os.path.join(top, "backing"), os.path.join(top, "mnt"),
                  control_file=os.path.join(top, "frozen"))
    fs.start()
    test.addCleanup(fs.stop)
    return fs


class FrozenFSTest(unittest.TestCase):
    def setUp(self):
        _skip_unless_fuse(self)

    def test_write_blocks_while_frozen(self):
        top = _tempdir(self, "fusefreeze-test-")
        fs = _frozen_fs(self, top)
        self.assertTrue(fs.mounted())
        path = os.path.join(fs.mountpoint, "dir", "file")

        # Thawed: a write (with mkdir, create, fsync, close) goes through to the backing dir.
        os.mkdir(os.path.dirname(path))
        with open(path, "wb") as f:
            f.write(b"before")
            f.flush()
            os.fsync(f.fileno())
        with open(os.path.join(fs.backing, "dir", "file"), "rb") as f:
            self.assertEqual(f.read(), b"before")

        fd = os.open(path, os.O_WRONLY)  # opened before the freeze: only the write is tested
        self.addCleanup(os.close, fd)
        self.addCleanup(fs.thaw)  # before the close (a close flushes: it would block)
        fs.freeze()
        done = threading.Event()
        result = {}

        def write():
            try:
                result["n"] = os.pwrite(fd, b"during", 0)
            except OSError as e:
                result["error"] = e
            done.set()

        t = threading.Thread(target=write, daemon=True)
        t.start()
        self.assertTrue(fs.wait_blocked(1, timeout=10.0), "the write never reached the FS")
        # Bounded wait for something that must not happen.
        self.assertFalse(done.wait(timeout=1.0), "a write completed while frozen: %r" % result)
        with open(os.path.join(fs.backing, "dir", "file"), "rb") as f:
            self.assertEqual(f.read(), b"before")

        fs.thaw()
        self.assertTrue(done.wait(timeout=10.0), "the write did not complete after the thaw")
        t.join()
        self.assertEqual(result, {"n": 6})
        with open(os.path.join(fs.backing, "dir", "file"), "rb") as f:
            self.assertEqual(f.read(), b"during")

    def test_metadata_blocks_while_frozen(self):
        # A hung client hangs everything that goes to the server: mkdir, rename, stat. Each in
        # its own directory: the kernel holds a directory's lock across a call blocked in it,
        # so calls in the same directory would queue in the kernel, not reach the FS.
        top = _tempdir(self, "fusefreeze-test-")
        fs = _frozen_fs(self, top)
        for name in ("x", "y", "y/a", "z"):
            os.mkdir(os.path.join(fs.mountpoint, name))
        fs.freeze()
        calls = {
            "mkdir": lambda: os.mkdir(os.path.join(fs.mountpoint, "x", "b")),
            "rename": lambda: os.rename(os.path.join(fs.mountpoint, "y", "a"),
                                        os.path.join(fs.mountpoint, "y", "c")),
            "stat": lambda: os.stat(os.path.join(fs.mountpoint, "z", "never-looked-up")),
        }
        done = {name: threading.Event() for name in calls}
        errors = {}

        def run(name):
            try:
                calls[name]()
            except OSError as e:
                errors[name] = e
            done[name].set()

        for name in calls:
            threading.Thread(target=run, args=(name,), daemon=True).start()
        self.assertTrue(fs.wait_blocked(len(calls), timeout=10.0),
                        "only %d of %d calls reached the FS" % (fs.blocked_ops(), len(calls)))
        self.assertFalse(any(e.wait(timeout=1.0) for e in done.values()),
                         "a call completed while frozen")
        fs.thaw()
        for name, e in done.items():
            self.assertTrue(e.wait(timeout=10.0), "%s did not complete after the thaw" % name)
        self.assertEqual(set(errors), {"stat"})  # ENOENT: it reached the FS and was answered
        self.assertEqual(os.listdir(os.path.join(fs.backing, "x")), ["b"])
        self.assertEqual(os.listdir(os.path.join(fs.backing, "y")), ["c"])

    def test_o_direct_and_fallocate(self):
        # What the daemon's data writer does: O_DIRECT where the FS takes it (else EINVAL and
        # buffered), fallocate where supported (else EOPNOTSUPP and nothing).
        import ctypes
        import mmap
        top = _tempdir(self, "fusefreeze-test-")
        fs = _frozen_fs(self, top)
        path = os.path.join(fs.mountpoint, "data")
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_DIRECT, 0o644)
        except OSError as e:
            self.assertEqual(e.errno, 22, "O_DIRECT open failed with %s, not EINVAL" % e)
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            rc = libc.fallocate(fd, 0, ctypes.c_long(0), ctypes.c_long(1 << 20))
            if rc != 0:
                self.assertIn(ctypes.get_errno(), (95, 38), os.strerror(ctypes.get_errno()))
            buf = mmap.mmap(-1, 1 << 20)  # page-aligned, as O_DIRECT wants
            buf.write(bytes(range(256)) * 4096)
            self.assertEqual(os.pwrite(fd, buf, 0), 1 << 20)
            os.ftruncate(fd, 1 << 20)
            os.fdatasync(fd)
        finally:
            os.close(fd)
        with open(os.path.join(fs.backing, "data"), "rb") as f:
            self.assertEqual(f.read(), bytes(range(256)) * 4096)

    def test_stop_leaves_no_mount(self):
        top = _tempdir(self, "fusefreeze-test-")
        fs = FrozenFS(os.path.join(top, "backing"), os.path.join(top, "mnt"))
        self.addCleanup(fs.stop)
        with fs:
            self.assertTrue(mounted_at(fs.mountpoint))
            pid = fs.proc.pid
            fs.freeze()  # stop() thaws first
        self.assertFalse(mounted_at(fs.mountpoint))
        self.assertIsNone(fs.proc)
        with self.assertRaises(ProcessLookupError):
            os.kill(pid, 0)  # reaped, not a zombie
        with open("/proc/mounts") as f:
            self.assertNotIn(fs.mountpoint, f.read())


def _ckptctl_status(daemon):
    """`ckptctl status` of the daemon (its admin endpoint is a Unix socket in its directory)."""
    out = subprocess.run([os.path.join(util.BIN_DIR, "ckptctl"), "--admin",
                          "unix:" + os.path.join(daemon.dir, "admin.sock"), "status"],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=30)
    return out.stdout


def _model():
    """~8.7 MiB of float32 parameters: with AdamW's exp_avg and exp_avg_sq, ~26 MiB per step."""
    return torch.nn.Sequential(torch.nn.Linear(1024, 1536), torch.nn.GELU(),
                               torch.nn.Linear(1536, 448))


class HungStorageTest(unittest.TestCase):
    def test_checkpointer_through_a_storage_freeze(self):
        _skip_unless_fuse(self)
        top = _tempdir(self, "ckptd-hung-")
        fs = _frozen_fs(self, top)  # cleanup: unmounted last (after the daemon stopped)
        root = os.path.join(fs.mountpoint, "storage")
        backing_root = os.path.join(fs.backing, "storage")
        ddir = os.path.join(top, "daemon")  # socket and log: not on the frozen mount
        os.mkdir(ddir)
        # A repeated flag takes its last value (daemon_config.cc: MultiOptionPolicy::TakeLast):
        # these override Daemon's <dir>/storage and its SMALL_POOL.
        d = util.Daemon("--storage-root", root, *POOL_ARGS, *STALL_ARGS, directory=ddir)
        d.root = root
        self.addCleanup(d.stop)
        # Runs first: a daemon blocked on the frozen FS could not stop.
        self.addCleanup(fs.thaw)
        d.start()
        client = d.client(JOB, call_timeout=CALL_TIMEOUT)
        self.addCleanup(client.close)

        torch.manual_seed(0)
        model = _model()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        ck = ckptd.torch.Checkpointer(client, model, opt, on_error="warn")
        x = torch.randn(16, 1024)

        durations = []         # (step, seconds, phase)
        errors = []            # (step, phase, str(error)) of every failure counted
        step = 0

        def train_step(phase):
            """One training step with its save; True when the save was accepted."""
            nonlocal step
            step += 1
            failed = ck.failed_saves
            t0 = time.monotonic()
            loss = model(x).square().mean()
            loss.backward()
            opt.step()        # the Checkpointer's fence waits here for the last capture
            opt.zero_grad()
            before_save = ck.failed_saves
            ck.save(step)
            durations.append((step, time.monotonic() - t0, phase))
            if ck.failed_saves != failed:
                errors.append((step, phase, str(ck.last_error)))
            return ck.failed_saves == before_save

        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")

            # Normal training until a step has committed.
            accepted = []
            while len(accepted) < 3:
                if train_step("before"):
                    accepted.append(step)
                self.assertLess(step, 50, "saves are not accepted before the freeze: %r"
                                % errors)
            client.wait(accepted[-1], "committed", timeout=60)

            # Storage hangs.
            fs.freeze()
            frozen_at = time.monotonic()
            failed_at_freeze = ck.failed_saves
            ops_seen = None
            while time.monotonic() - frozen_at < FREEZE_SECONDS:
                train_step("frozen")
                if ops_seen is None and ck.failed_saves > failed_at_freeze:
                    # Saves are being skipped: operators see why, in ckptctl and /metrics.
                    ops_seen = (_ckptctl_status(d), util.metric(d, "ckptd_storage_writes_in_flight"),
                                util.metric(d, "ckptd_storage_oldest_write_seconds"))
            failed_during_freeze = ck.failed_saves - failed_at_freeze
            self.assertIsNotNone(ops_seen, "no save failed while storage was frozen")
            status_text, writes_in_flight, oldest_write = ops_seen
            self.assertIn("STALLED", status_text)
            self.assertGreaterEqual(writes_in_flight, 1)
            self.assertGreaterEqual(oldest_write, STALL_SECONDS)
            steps_at_thaw = step

            # Storage answers again: train on until a save accepted after the thaw has committed
            # and the current save is accepted.
            fs.thaw()
            thawed_at = time.monotonic()
            since_thaw = []  # steps accepted after the thaw, not committed yet
            first_commit_after_thaw = None
            while True:
                if train_step("thawed"):
                    since_thaw.append(step)
                    last_accepted = True
                else:
                    last_accepted = False
                if first_commit_after_thaw is None:
                    done = set(util.committed_steps(backing_root, JOB)).intersection(since_thaw)
                    if done:
                        first_commit_after_thaw = time.monotonic() - thawed_at
                if first_commit_after_thaw is not None and last_accepted:
                    break
                self.assertLess(
                    time.monotonic() - thawed_at, RESUME_LIMIT,
                    "no step committed within %.0f s of the thaw (%d steps, errors since the "
                    "thaw: %r)" % (RESUME_LIMIT, step - steps_at_thaw,
                                   [e for e in errors if e[1] == "thawed"][:5]))
            last_step = step
            failed = ck.failed_saves
            ck.fence()
            self.assertEqual(ck.failed_saves, failed,
                             "the fence of step %d failed: %s" % (last_step, ck.last_error))
            client.wait(last_step, "committed", timeout=60)

        committed = util.committed_steps(root, JOB)
        longest = max(durations, key=lambda e: e[1])
        slow = [(s, round(t, 2), p) for s, t, p in durations if t > SLOW_STEP]
        sys.stderr.write(
            "\nhung-storage: steps=%d committed=%d failed_saves=%d longest_stall=%.2fs "
            "(step %d, %s) slow_steps=%d thaw_to_commit=%.2fs freeze=%.0fs pool=64MiB "
            "stall_timeout=%s call_timeout=%.0fs\n"
            % (step, len(committed), ck.failed_saves, longest[1], longest[0], longest[2],
               len(slow), first_commit_after_thaw, FREEZE_SECONDS,
               STALL_ARGS[1] if STALL_ARGS else "none", CALL_TIMEOUT))

        # The trainer did not feel the hang.
        self.assertLessEqual(len(slow), MAX_SLOW_STEPS,
                             "steps longer than %.1f s (step, s, phase): %r"
                             % (SLOW_STEP, slow))
        self.assertLessEqual(longest[1], CALL_TIMEOUT + 2.0,
                             "step %d took %.1f s" % (longest[0], longest[1]))
        # ... but it was told: failures counted and warned about.
        self.assertGreaterEqual(failed_during_freeze, 1, "no save failed during the freeze")
        ours = [str(w.message) for w in caught if "ckptd" in str(w.message)]
        self.assertTrue(ours, "no ckptd warning was emitted")
        frozen_errors = [e for e in errors if e[1] == "frozen"]
        self.assertTrue(any("storage stalled" in e[2] for e in frozen_errors),
                        "no failure during the freeze says 'storage stalled': %r"
                        % (frozen_errors[:5],))

        # After the thaw the last step committed, and it is on storage.
        self.assertEqual(client.latest(), last_step)
        self.assertIn(last_step, committed)

        # It restores bit-exactly into a fresh model and optimizer through a new client.
        fresh = _model()
        fresh_opt = torch.optim.AdamW(fresh.parameters(), lr=1e-3)
        c2 = d.client(JOB, call_timeout=CALL_TIMEOUT)
        self.addCleanup(c2.close)
        self.assertEqual(ckptd.torch.Checkpointer(c2, fresh, fresh_opt).load(), last_step)
        for (name, a), (_, b) in zip(model.state_dict().items(), fresh.state_dict().items()):
            self.assertTrue(torch.equal(a, b), name)
        want, got = opt.state_dict(), fresh_opt.state_dict()
        self.assertEqual(sorted(want["state"]), sorted(got["state"]))
        for index, state in want["state"].items():
            self.assertEqual(sorted(state), sorted(got["state"][index]))
            for key, value in state.items():
                other = got["state"][index][key]
                if isinstance(value, torch.Tensor):
                    self.assertTrue(torch.equal(value, other), "state %d %s" % (index, key))
                else:
                    self.assertEqual(value, other, "state %d %s" % (index, key))
        self.assertEqual(want["param_groups"], got["param_groups"])


if __name__ == "__main__":
    unittest.main(verbosity=2)
