"""Held saves: a save() that costs the same at 10,000 tensors as at 300.

After its first save a Client sends only the step — if its registration still describes the
tensors. Proving that means reading every tensor's PyTorch objects (its address, shape, dtype
and contiguity: ``param.data = ...``, ``resize_`` and ``set_`` change them under the same tensor
object), and after a training step those objects are cold: ~90 ns per tensor, most of a
millisecond at 10,000 tensors, paid inside save(). The rest of the proof — the same names, the
same tensor objects — reads only the dict and costs a few nanoseconds per entry.

So save() does only the cheap half and sends the step as a *held* save (local protocol 3,
proto/README.md): the daemon accepts it, with every check and answer of a save, but reads none
of the memory until the client confirms it. The save is also posted (the native client's
SaveOptions::post): save() returns once the request is written, and the daemon's answer is taken
by the fence — on a 2-core node, waiting for it meant three thread wake-ups, each of which could
wait milliseconds for a CPU. The expensive half runs meanwhile on this module's
thread, which gets the GIL whenever the trainer lets go of it (a CUDA synchronize, backward,
data loading), and confirms the step when the memory checks out. The contract already forbids
touching the saved tensors until wait_snapshot() returns, so a check made any time before then
sees the memory the save meant.

When the check fails, the daemon has read nothing: on the trainer's thread (re-registering may
move storages into shared memory, which must not race the training loop), the client registers
the tensors as they are now and sends the step again in place of the held one (Save.replace_held).
The checkpoint holds what the trainer held at save(); the step is never lost.

ckptd.torch.Checkpointer sends its saves held too, and its check adds the walk's SlotWatch (has
the model or the optimizer changed shape?). Its re-send walks again at the fence, after a forward
pass and perhaps an LR scheduler step: it takes the buffers from the staging copies save() made,
and the hyper-parameters and extra_state save() read (Checkpointer._send_again). A buffer added
between two saves has no staging copy, and its value at save() is gone: that one step fails,
and the next save walks at save() time.

Every call that needs the step settled — the next save, wait_snapshot, wait, load — settles it
first: confirmed at once if the thread already checked it, else checked there (what save() used
to pay, now paid only by a trainer that waits at once). A step is sent again by a save,
wait_snapshot or load (the calls that come before the tensors change), or by any call of the
thread that saved; a wait() on another thread — a monitor — that finds the check failed leaves
it to them.
"""

import threading


class HeldSave:
    """A step the daemon holds unread. ``verify()``: True while what was registered still
    describes the tensors (it needs the GIL, nothing else, and may run on any thread).
    ``resend()``: on the trainer's thread, registers anew and sends the step again with
    replace_held (ckptd.Client._send_again)."""

    __slots__ = ("step", "verify", "resend", "failed", "thread")

    def __init__(self, step, verify, resend):
        self.step, self.verify, self.resend = step, verify, resend
        self.failed = False  # the thread found a change; the trainer re-sends it
        self.thread = threading.current_thread()  # the one that saved


class HeldSaves:
    """The one held save of a Client, and the daemon thread that checks and confirms it.
    ``confirm(step)`` sends ConfirmSave (the native client's confirm_save)."""

    def __init__(self, confirm):
        self._confirm = confirm
        self._cv = threading.Condition()
        self._held = None
        self._thread = None
        self._closed = False

    def hold(self, save):
        """The daemon holds ``save``: check it as soon as the GIL allows."""
        with self._cv:
            self._held = save
            if self._thread is None or not self._thread.is_alive():  # none yet, or forked
                self._thread = threading.Thread(target=self._run, name="ckptd-held-save",
                                                daemon=True)
                self._thread.start()
            self._cv.notify()

    def settle(self, owner):
        """Confirms the held save if its memory checks out and returns None (also when nothing
        is held). Otherwise returns it, taken, for the caller to send again — if the caller
        ``owner``s the tensors (a save, wait_snapshot or load: calls that precede changing
        them), or is the thread that saved, or that thread has ended; else (a wait() on a
        monitoring thread) it is left for them: registering anew moves the trainer's tensors.
        Raises what confirm raises (UNAVAILABLE: the connection broke after the save, which
        aborted the step)."""
        with self._cv:
            save = self._held
            if save is None:
                return None
            if not save.failed and _verified(save):
                self._held = None
                self._confirm(save.step)
                return None
            save.failed = True
            if not (owner or save.thread is threading.current_thread()
                    or not save.thread.is_alive()):
                return None
            self._held = None
            return save

    def pending(self):
        """Whether a held save waits to be settled."""
        with self._cv:
            return self._held is not None

    def drop(self, step=None):
        """Forgets the held save (of ``step``; None: whichever): it was abandoned."""
        with self._cv:
            if self._held is not None and (step is None or self._held.step == step):
                self._held = None

    def close(self):
        with self._cv:
            self._closed = True
            self._held = None
            self._cv.notify()

    def _run(self):
        from . import Error
        with self._cv:
            while not self._closed:
                save = self._held
                if save is None or save.failed:
                    self._cv.wait()
                    continue
                if not _verified(save):
                    save.failed = True  # registering anew is the trainer thread's
                    continue
                self._held = None
                try:
                    self._confirm(save.step)
                except Error:
                    pass  # the connection broke, which aborted the step: the next wait says so


def _verified(save):
    """save.verify(), with anything it raises taken for "changed": the re-send path then
    registers anew and reports what is wrong properly."""
    try:
        return bool(save.verify())
    except Exception:  # noqa: BLE001 - a check that cannot tell must not confirm
        return False
