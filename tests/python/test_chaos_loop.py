"""Chaos under a real training loop: a PyTorch trainer with a Checkpointer (on_error="warn")
saves every step while a background thread SIGKILLs the daemon (and starts a new one on the same
socket and storage) at least 10 times and freezes it (SIGSTOP, hold 1-4 s, SIGCONT) at least 3
times, at random moments relative to the loop.

test_training_loop_through_daemon_kills_and_freezes asserts, every message naming the seed:
- the loop never raises, and no step takes longer than CALL_TIMEOUT + STEP_SLACK;
- the newest committed step (client.latest() of a fresh client) is the loop's last step and
  restores bit-exactly (torch.equal on every parameter and optimizer state tensor, equal
  param_groups) into a fresh model + AdamW through a new Checkpointer;
- every committed step holds exactly the state the trainer had right after that step's
  optimizer.step() (a per-tensor digest of every step, compared after loading each committed
  step): no torn checkpoint, not even of a save the client gave up on; every committed step
  directory passes `ckptctl verify`;
- at least half of the steps outside the fault windows (below) committed;
- no step is both aborted/failed and committed (the daemon log's state lines; node_state.h: "a
  failed or aborted step is never committed");
- the client re-attached (client.reattaches >= 1), and the Checkpointer warned at most once per
  kind of failure.
Each property is a subTest, so one run reports every property it breaks.

Fault windows. A fault lasts from its start (SIGKILL / SIGSTOP) until the daemon serves again
("served": the restarted daemon's start() returned, i.e. a client hello worked; or SIGCONT). Its
window is [start - PRE_MARGIN, served + CALL_TIMEOUT + min(MAX_BACKOFF, served - start)]:
- before: a save accepted less than PRE_MARGIN before the fault may not have committed yet
  (commit latency of this ~6 MiB state here: ~40 ms median, ~60 ms max);
- after: the client re-attaches at its next attempt, and its re-attach backoff (0.1 s doubling
  to MAX_BACKOFF = 5 s, grown only by failed attempts, each of which takes time) never exceeds
  the time the daemon was unreachable; plus one call_timeout for a call still waiting on the
  old connection.
A step is "outside" when the moment it called save() lies in no window. The stall of each step
(its wall time, less the test's own bookkeeping) is reported per kind: "frozen" (the step
overlaps a SIGSTOP..SIGCONT interval), "killed" (overlaps a SIGKILL..served interval),
"recovering" (in a window otherwise) and "none".

Seed: $CKPT_CHAOS_SEED, else time-based; printed at the start. The seed fixes the fault schedule
(order of kills and freezes, gaps, hold and down times), not the exact interleaving with the
loop, which depends on timing. The temporary directory (daemon log: ckptd.log, storage) is kept
when the test fails and its path printed. Prints a one-line summary to stderr ("chaos-loop: ...")
for bench/README.md; CKPT_CHAOS_VERBOSE=1 also prints the faults and every step that failed or
took over 1 s. ~65 s on 2 cores (~50 s of training, ~8 s of checks).

No sleep is a synchronisation: the injector's gaps, hold and down times are the fault schedule
(waited on a stop Event, so cleanup can cut them short); everything else waits on real
conditions (Daemon.start()'s client hello, client.wait(step, "committed")).
"""

import concurrent.futures
import hashlib
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import unittest
import warnings

import torch

import ckptd
import ckptd.torch
import ckptd_testutil as util

JOB = "chaos"
CALL_TIMEOUT = 2.0       # the client's call_timeout (and so the Checkpointer's fence timeout)
# A step may take one call deadline (a save or a fence giving up on a frozen or dead daemon) plus
# its own compute (~0.25 s here) and scheduling noise on a 2-core machine shared with the daemon.
STEP_SLACK = 1.5
MAX_BACKOFF = 5.0        # the client's largest re-attach backoff (client/src/client.cc)
PRE_MARGIN = 0.5         # see "Fault windows" above
KILLS = 10
FREEZES = 3
MIN_STEPS = 150
FIRST_GAP = (2.0, 3.0)   # seconds of clean training before the first fault
GAP = (1.5, 4.0)         # seconds from a fault's end (daemon serving) to the next fault's start
KILL_DOWN = (0.0, 1.0)   # seconds between SIGKILL and starting the new daemon
FREEZE_HOLD = (1.0, 4.0)  # seconds between SIGSTOP and SIGCONT
BATCH = 192              # forward + backward + AdamW of the model below: ~0.25 s on one thread
FINAL_LIMIT = 60.0       # after the last fault, a save must be accepted and commit within this
KEEP_SNAPSHOTS = 4       # full state copies kept (of the newest accepted steps)


def _model():
    """~2 MiB of float32 parameters; with AdamW's exp_avg and exp_avg_sq ~6 MiB per step."""
    return torch.nn.Sequential(torch.nn.Linear(512, 512), torch.nn.GELU(),
                               torch.nn.Linear(512, 512))


def _state(model, opt):
    """{name: value} of everything the Checkpointer saves that is a tensor (model state_dict and
    optimizer state, keyed by parameter name) plus the optimizer's non-tensor state. Live
    tensors, not copies."""
    names = {id(p): n for n, p in model.named_parameters()}
    out = {}
    for name, t in model.state_dict().items():
        out["model." + name] = t
    for p, st in opt.state.items():
        for key, v in st.items():
            out["optimizer.%s.%s" % (names[id(p)], key)] = v
    return out


def _snapshot(model, opt):
    return {k: (v.detach().clone() if isinstance(v, torch.Tensor) else v)
            for k, v in _state(model, opt).items()}


def _digest(state):
    """{name: digest} of a _state/_snapshot dict (tensors by their bytes, dtype and shape)."""
    out = {}
    for k, v in state.items():
        if isinstance(v, torch.Tensor):
            h = hashlib.sha256()
            h.update(repr((str(v.dtype), tuple(v.shape))).encode())
            h.update(memoryview(v.detach().contiguous().numpy()).cast("B"))
            out[k] = h.digest()
        else:
            out[k] = repr(v)
    return out


def _step_dir(root, step):
    return os.path.join(root, JOB, "step-%010d" % step)


class Fault:
    __slots__ = ("kind", "start", "served", "served_wall", "old_pid", "new_pid")

    def __init__(self, kind):
        self.kind = kind
        self.start = self.served = self.served_wall = None
        self.old_pid = self.new_pid = None

    def window(self):
        outage = self.served - self.start
        return (self.start - PRE_MARGIN, self.served + CALL_TIMEOUT + min(MAX_BACKOFF, outage))

    def __repr__(self):
        return "%s@%.2f..%.2f" % (self.kind, self.start, self.served or -1)


class Step:
    """One training step as the trainer saw it (times: time.monotonic())."""

    __slots__ = ("step", "t0", "t_save", "t1", "stall", "accepted", "fence_error", "save_error")

    def __init__(self, step):
        self.step = step
        self.t0 = self.t_save = self.t1 = None
        self.stall = 0.0
        self.accepted = False
        self.fence_error = self.save_error = None

    def __repr__(self):
        return ("Step(%d, t0=%.2f, save at %.2f, stall %.2f s, accepted=%s, fence_error=%s, "
                "save_error=%s)" % (self.step, self.t0, self.t_save, self.stall, self.accepted,
                                    self.fence_error, self.save_error))


class Injector(threading.Thread):
    """Runs the seeded fault schedule against the current daemon (self.current), replacing it on
    every kill. Times are time.monotonic(), recorded in self.faults."""

    def __init__(self, schedule, daemon, on_new_daemon):
        super().__init__(name="fault-injector", daemon=True)
        self.schedule = schedule        # [(gap, kind, duration)]
        self.current = daemon  # the daemon the next fault hits
        self.on_new_daemon = on_new_daemon
        self.faults = []
        self.error = None
        self.stop = threading.Event()   # cleanup: cut the schedule short
        self.done = threading.Event()   # the schedule is over (or failed)
        self.stopped_pid = None         # a SIGSTOPped daemon's pid, until its SIGCONT

    def run(self):
        try:
            for gap, kind, duration in self.schedule:
                if self.stop.wait(gap):  # the schedule's gap, not a synchronisation
                    return
                fault = Fault(kind)
                if kind == "kill":
                    fault.old_pid = self.current.proc.pid
                    fault.start = time.monotonic()
                    self.current.kill()
                    self.faults.append(fault)
                    if self.stop.wait(duration):  # the daemon's down time
                        return
                    new = util.Daemon(directory=self.current.dir)
                    self.on_new_daemon(new)
                    new.start()  # returns once a client hello works: serving again
                    fault.served = time.monotonic()
                    fault.served_wall = time.time()
                    fault.new_pid = new.proc.pid
                    self.current = new
                else:
                    pid = self.current.proc.pid
                    fault.old_pid = fault.new_pid = pid
                    self.stopped_pid = pid
                    fault.start = time.monotonic()
                    os.kill(pid, signal.SIGSTOP)
                    self.faults.append(fault)
                    self.stop.wait(duration)  # the freeze's hold time
                    os.kill(pid, signal.SIGCONT)
                    fault.served = time.monotonic()
                    fault.served_wall = time.time()
                    self.stopped_pid = None
        except BaseException:  # noqa: BLE001 - reported by the test
            self.error = traceback.format_exc()
        finally:
            if self.stopped_pid is not None:
                try:
                    os.kill(self.stopped_pid, signal.SIGCONT)
                except ProcessLookupError:
                    pass
                self.stopped_pid = None
            self.done.set()


def _make_schedule(rng):
    kinds = ["kill"] * KILLS + ["freeze"] * FREEZES
    rng.shuffle(kinds)
    schedule = []
    for i, kind in enumerate(kinds):
        gap = rng.uniform(*(FIRST_GAP if i == 0 else GAP))
        duration = rng.uniform(*(KILL_DOWN if kind == "kill" else FREEZE_HOLD))
        schedule.append((gap, kind, duration))
    return schedule


def _median(values):
    v = sorted(values)
    if not v:
        return float("nan")
    n = len(v)
    return v[n // 2] if n % 2 else (v[n // 2 - 1] + v[n // 2]) / 2


class ChaosLoopTest(unittest.TestCase):
    def setUp(self):
        env = os.environ.get("CKPT_CHAOS_SEED")
        self.seed = int(env) if env else (time.time_ns() // 1000) % (1 << 31)
        sys.stderr.write("\nchaos-loop: seed %d (rerun: CKPT_CHAOS_SEED=%d)\n"
                         % (self.seed, self.seed))
        self.t_begin = time.monotonic()
        self.dir = tempfile.mkdtemp(prefix="ckptd-chaos-")
        self.passed = False
        self.daemons = []
        self.daemons_lock = threading.Lock()
        self.clients = []
        self.injector = None
        self.addCleanup(self._cleanup)

    def m(self, text):
        """An assertion message naming the seed."""
        return "[CKPT_CHAOS_SEED=%d, dir %s] %s" % (self.seed, self.dir, text)

    def _add_daemon(self, d):
        with self.daemons_lock:
            self.daemons.append(d)

    def _shutdown(self):
        """Stops the injector, thaws and stops every daemon, closes the clients. Idempotent;
        runs at the end of the test and, on failure, from cleanup."""
        inj = self.injector
        if inj is not None:
            inj.stop.set()
            inj.join(60)
        with self.daemons_lock:
            daemons = list(self.daemons)
        for d in daemons:  # a frozen daemon cannot act on SIGTERM (or SIGKILL's reaping)
            if d.proc is not None and d.proc.poll() is None:
                try:
                    os.kill(d.proc.pid, signal.SIGCONT)
                except ProcessLookupError:
                    pass
        for c in self.clients:
            c.close()
        for d in daemons:
            d.stop(timeout=10)

    def _cleanup(self):
        self._shutdown()
        with self.daemons_lock:
            alive = [d.proc.pid for d in self.daemons if d.proc is not None
                     and d.proc.poll() is None]
        for pid in alive:  # not expected (stop() kills after its timeout); never leave them
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if self.passed:
            shutil.rmtree(self.dir, ignore_errors=True)
        else:
            sys.stderr.write("chaos-loop: seed %d failed; kept %s (daemon log: %s)\n"
                             % (self.seed, self.dir, os.path.join(self.dir, "ckptd.log")))

    def test_training_loop_through_daemon_kills_and_freezes(self):
        rng = random.Random(self.seed)
        schedule = _make_schedule(rng)
        torch.manual_seed(self.seed)
        torch.set_num_threads(1)  # one core for the trainer, one for the daemon

        first = util.Daemon(directory=self.dir)
        self._add_daemon(first)
        first.start()
        root = first.root
        client = first.client(JOB, call_timeout=CALL_TIMEOUT)
        self.clients.append(client)
        model = _model()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        ck = ckptd.torch.Checkpointer(client, model, opt)
        x = torch.randn(BATCH, 512)

        steps = []         # Step records, in order
        digests = {}       # step -> _digest of its state right after optimizer.step()
        snapshots = {}     # step -> _snapshot, for the newest KEEP_SNAPSHOTS accepted steps
        loop_error = None
        final_step = None
        final_errors = []  # why the final steps did not commit (if any)
        step = 0

        def error_text(e):
            return "%s: %s" % (getattr(e, "code", "?"), e)

        self.injector = Injector(schedule, first, self._add_daemon)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            self.injector.start()
            try:
                injector_done_at = None
                while True:
                    step += 1
                    rec = Step(step)
                    failed = ck.failed_saves
                    rec.t0 = time.monotonic()
                    loss = model(x).square().mean()
                    loss.backward()
                    opt.step()        # the Checkpointer's fence (pre-step hook) runs first
                    t_opt = time.monotonic()
                    if ck.failed_saves != failed:
                        rec.fence_error = error_text(ck.last_error)
                    snap = _snapshot(model, opt)  # bookkeeping: not counted as the stall
                    opt.zero_grad()
                    failed = ck.failed_saves
                    rec.t_save = time.monotonic()
                    ck.save(step)
                    rec.t1 = time.monotonic()
                    rec.accepted = ck.failed_saves == failed
                    if not rec.accepted:
                        rec.save_error = error_text(ck.last_error)
                    rec.stall = (t_opt - rec.t0) + (rec.t1 - rec.t_save)
                    steps.append(rec)
                    digests[step] = _digest(snap)
                    if rec.accepted:
                        snapshots[step] = snap
                        while len(snapshots) > KEEP_SNAPSHOTS:
                            del snapshots[min(snapshots)]

                    if not self.injector.done.is_set() or step < MIN_STEPS:
                        continue
                    if injector_done_at is None:
                        injector_done_at = time.monotonic()
                    if time.monotonic() - injector_done_at > FINAL_LIMIT:
                        raise AssertionError("no save accepted and committed within %.0f s after "
                                             "the last fault: %r" % (FINAL_LIMIT, final_errors))
                    if not rec.accepted:
                        final_errors.append((step, rec.save_error))
                        continue
                    # After the schedule: this save was accepted; end once it commits.
                    failed = ck.failed_saves
                    ck.fence()
                    if ck.failed_saves != failed:
                        final_errors.append((step, "fence: " + error_text(ck.last_error)))
                        continue
                    try:
                        client.wait(step, "committed", timeout=30)
                    except ckptd.Error as e:
                        final_errors.append((step, "wait: " + error_text(e)))
                        continue
                    final_step = step
                    break
            except BaseException:  # noqa: BLE001 - asserted below, with the seed
                loop_error = traceback.format_exc()
            self.injector.stop.set()
            self.injector.join(60)
        ours = [str(w.message) for w in caught if "ckptd" in str(w.message)]
        inj = self.injector
        t_loop_end = time.monotonic()
        self.assertIsNone(loop_error, self.m("the training loop raised at step %d:\n%s"
                                             % (step, loop_error)))
        self.assertFalse(inj.is_alive(), self.m("the fault injector did not finish"))
        self.assertIsNone(inj.error, self.m("the fault injector failed:\n%s" % inj.error))

        # -- what was committed -------------------------------------------------------------
        t_checks = {}
        t = time.monotonic()
        c2 = inj.current.client(JOB, call_timeout=10.0)
        self.clients.append(c2)
        latest = c2.latest()
        committed = util.committed_steps(root, JOB)
        committed_set = set(committed)

        # The newest committed step, bit for bit, through a fresh model, AdamW and Checkpointer.
        restore_problems = []
        if latest is None:
            restore_problems.append("nothing committed")
        else:
            fresh = _model()
            fresh_opt = torch.optim.AdamW(fresh.parameters(), lr=1e-3)
            loaded = ckptd.torch.Checkpointer(c2, fresh, fresh_opt).load()
            if loaded != latest:
                restore_problems.append("load() restored %r, latest() is %r" % (loaded, latest))
            want = snapshots.get(latest)
            if want is None:
                restore_problems.append("no snapshot of step %r (kept: %r)"
                                        % (latest, sorted(snapshots)))
            else:
                got = _state(fresh, fresh_opt)
                if sorted(got) != sorted(want):
                    restore_problems.append("restored names differ: %r vs %r"
                                            % (sorted(got), sorted(want)))
                for k, v in want.items():
                    g = got.get(k)
                    if isinstance(v, torch.Tensor):
                        same = isinstance(g, torch.Tensor) and torch.equal(v, g)
                    else:
                        same = v == g
                    if not same:
                        restore_problems.append("%s differs" % k)
                if fresh_opt.state_dict()["param_groups"] != opt.state_dict()["param_groups"]:
                    restore_problems.append("param_groups differ")
        t_checks["restore"] = time.monotonic() - t

        # Every committed step holds what the trainer had after that step's optimizer.step():
        # no torn checkpoint, not even of a save the client gave up on.
        t = time.monotonic()
        fresh = _model()
        fresh_opt = torch.optim.AdamW(fresh.parameters(), lr=1e-3)
        restorer = ckptd.torch.Checkpointer(c2, fresh, fresh_opt)
        torn = []
        for s in committed:
            if s not in digests:
                torn.append((s, "committed, but the loop never ran this step"))
                continue
            try:
                restorer.load(step=s)
            except ckptd.Error as e:
                torn.append((s, "load failed: " + error_text(e)))
                continue
            got = _digest(_state(fresh, fresh_opt))
            if got != digests[s]:
                bad = sorted(k for k in set(got) | set(digests[s])
                             if got.get(k) != digests[s].get(k))
                torn.append((s, "differs in %s" % bad[:6]))
        t_checks["digests"] = time.monotonic() - t

        # No committed step is torn on storage: ckptctl verify re-reads every byte of each.
        t = time.monotonic()
        ckptctl = os.path.join(util.BIN_DIR, "ckptctl")

        def verify(s):
            r = subprocess.run([ckptctl, "verify", _step_dir(root, s)], stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, timeout=60)
            return s, r.returncode, r.stdout.strip()[-300:]

        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            unverified = [(s, rc, out) for s, rc, out in pool.map(verify, committed) if rc != 0]
        t_checks["verify"] = time.monotonic() - t

        # -- classification and figures ------------------------------------------------------
        faults = inj.faults
        windows = [f.window() for f in faults]

        def in_window(t):
            return any(a <= t <= b for a, b in windows)

        def kind_of(rec):
            """frozen / killed: the step overlaps a fault's raw interval; recovering: a window."""
            for kind, name in (("freeze", "frozen"), ("kill", "killed")):
                for f in faults:
                    if f.kind == kind and rec.t0 <= f.served and f.start <= rec.t1:
                        return name
            if any(a <= rec.t1 and rec.t0 <= b for a, b in windows):
                return "recovering"
            return "none"

        longest = {}
        for rec in steps:
            kind = kind_of(rec)
            if rec.stall > longest.get(kind, (0.0, None))[0]:
                longest[kind] = (rec.stall, rec.step)
        limit = CALL_TIMEOUT + STEP_SLACK
        too_long = [rec for rec in steps if rec.stall > limit]
        outside = [rec.step for rec in steps if not in_window(rec.t_save)]
        outside_committed = [s for s in outside if s in committed_set]
        save_times = {rec.step: rec.t_save for rec in steps}

        # From each restart (start() returned) to the first commit of a step saved after it
        # (MANIFEST mtime), unless the next fault came first.
        restart_to_commit, no_commit = [], 0
        for i, f in enumerate(faults):
            if f.kind != "kill":
                continue
            next_start = faults[i + 1].start if i + 1 < len(faults) else float("inf")
            best = None
            for s in committed:
                if save_times.get(s, -1.0) >= f.served:
                    mtime = os.stat(os.path.join(_step_dir(root, s), "MANIFEST")).st_mtime
                    d = mtime - f.served_wall
                    if f.served + d < next_start and (best is None or d < best):
                        best = d
            if best is None:
                no_commit += 1
            else:
                restart_to_commit.append(best)

        kills = sum(1 for f in faults if f.kind == "kill")
        freezes = sum(1 for f in faults if f.kind == "freeze")

        def fmt(kind):
            v = longest.get(kind)
            return "%.2fs" % v[0] if v else "-"

        sys.stderr.write(
            "chaos-loop: seed=%d steps=%d accepted=%d committed=%d failed_saves=%d kills=%d "
            "freezes=%d reattaches=%d longest_stall frozen=%s killed=%s recovering=%s none=%s "
            "steps_over_%.1fs=%d restart_to_commit median=%.2fs max=%.2fs (%d of %d restarts; "
            "%d: next fault first) outside_windows=%d/%d committed call_timeout=%.0fs "
            "state=6MiB loop=%.0fs checks=%.0fs\n"
            % (self.seed, len(steps), sum(1 for r in steps if r.accepted), len(committed),
               ck.failed_saves, kills, freezes, client.reattaches, fmt("frozen"), fmt("killed"),
               fmt("recovering"), fmt("none"), limit, len(too_long), _median(restart_to_commit),
               max(restart_to_commit or [float("nan")]), len(restart_to_commit), kills,
               no_commit, len(outside_committed), len(outside), CALL_TIMEOUT,
               t_loop_end - self.t_begin, sum(t_checks.values())))
        if os.environ.get("CKPT_CHAOS_VERBOSE"):
            sys.stderr.write("chaos-loop: checks %r\nfaults %r\n" % (t_checks, faults))
            for rec in steps:
                if rec.fence_error or rec.save_error or rec.stall > 1.0:
                    sys.stderr.write("  %r %s\n" % (rec, kind_of(rec)))

        # -- assertions (each its own subTest: one run reports every property it breaks) ------
        with self.subTest("faults"):
            self.assertEqual((kills, freezes), (KILLS, FREEZES), self.m("faults run: %r" % faults))
            self.assertGreaterEqual(len(steps), MIN_STEPS, self.m("too few steps"))
        with self.subTest("stall"):
            self.assertEqual(
                too_long, [],
                self.m("%d steps stalled the trainer longer than call_timeout %.1f s + %.1f s "
                       "(kind, step record):\n%s\nfaults %r"
                       % (len(too_long), CALL_TIMEOUT, STEP_SLACK,
                          "\n".join("  %s %r" % (kind_of(r), r) for r in too_long[:5]), faults)))
        with self.subTest("latest restores bit-exactly"):
            self.assertIsNotNone(final_step, self.m("the loop ended without a committed step"))
            self.assertEqual(latest, final_step,
                             self.m("latest() is %r, the loop's last committed step %r"
                                    % (latest, final_step)))
            self.assertEqual(restore_problems, [],
                             self.m("restore of step %r is not bit-exact" % latest))
        with self.subTest("committed steps hold the trainer's state"):
            self.assertEqual(torn, [], self.m("committed steps that differ from the trainer's "
                                              "state (step, what): %r" % torn[:10]))
        with self.subTest("ckptctl verify"):
            self.assertEqual(unverified, [], self.m("ckptctl verify failed (step, rc, output): "
                                                    "%r" % unverified[:5]))
        with self.subTest("outside the fault windows"):
            self.assertGreater(len(outside), 0, self.m("no step outside the fault windows"))
            missing = [r for r in steps if r.step in set(outside) - committed_set]
            self.assertGreaterEqual(
                2 * len(outside_committed), len(outside),
                self.m("only %d of the %d steps outside the fault windows committed; not "
                       "committed: %r" % (len(outside_committed), len(outside), missing[:10])))
        with self.subTest("an aborted step is never committed"):
            # node_state.h: "a failed or aborted step is never committed". The daemons' own
            # state log (one file for all of them; step numbers never repeat) must not show a
            # step both ended (aborted / failed) and committed.
            ended, done = {}, set()
            for n, state, rest in re.findall(r"job '%s' step (\d+): (aborted|failed|committed)(.*)"
                                             % JOB, first.log()):
                if state == "committed":
                    done.add(int(n))
                else:
                    ended[int(n)] = state + rest
            both = sorted(set(ended) & done)
            self.assertEqual(both, [], self.m("steps the daemon reported as ended and then "
                                              "committed: %r" % [(n, ended[n]) for n in both][:5]))
        with self.subTest("re-attached"):
            self.assertGreaterEqual(client.reattaches, 1, self.m("the client never re-attached"))
        with self.subTest("warned once per kind"):
            # "ckptd: <what> of step N failed (<code>): ..." — one warning per (what, code).
            kinds = {(w.split(" of step")[0], w.split(" failed (")[1].split(")")[0])
                     for w in ours}
            self.assertEqual(len(ours), len(kinds),
                             self.m("the Checkpointer warned more than once per kind: %r" % ours))

        # Everything stops; no daemon of this test is left running.
        self._shutdown()
        with self.daemons_lock:
            alive = [d.proc.pid for d in self.daemons if d.proc.poll() is None]
        self.assertEqual(alive, [], self.m("daemons still running"))
        sys.stderr.write("chaos-loop: test wall time %.1f s\n" % (time.monotonic() - self.t_begin))
        # Keep the directory when a subTest failed (the test fails, but reaches here).
        self.passed = not self._outcome_failed()

    def _outcome_failed(self):
        """Whether a subTest of this test failed (unittest records it in self._outcome)."""
        outcome = getattr(self, "_outcome", None)
        return outcome is None or not getattr(outcome, "success", False)


if __name__ == "__main__":
    util.require_env()
    unittest.main(verbosity=2)
