"""ckptd.torch — checkpoint a PyTorch model and its optimizer through ckptd.

    import ckptd, ckptd.torch
    client = ckptd.Client("myjob", rank, world_size)
    ckpt = ckptd.torch.Checkpointer(client, model, optimizer,
                                    extra_state=ckptd.torch.RNGState())
    start = (ckpt.load() or 0) + 1          # newest committed step, or a fresh start
    for step in range(start, steps + 1):
        loss = model(next_batch()).sum()
        loss.backward()
        optimizer.step()                    # waits for the previous snapshot first (hook)
        optimizer.zero_grad()
        ckpt.save(step)                     # microseconds; the daemon copies in the background

What is saved, per rank:
- every tensor of ``model.state_dict()`` under its state_dict name;
- every tensor of the optimizer state as ``optimizer.state.<param name>.<key>`` (e.g.
  ``optimizer.state.layers.0.weight.exp_avg``), where the param name comes from
  ``model.named_parameters()`` (params the model does not know: ``param_groups.<g>.<i>``);
- in the rank's ``extra`` blob (pickled): non-tensor optimizer state, the param_groups
  (lr, betas, ...), the dtype/shape of every optimizer state tensor (so a fresh optimizer can be
  rebuilt), non-tensor model state (``get_extra_state``) and the user's ``extra_state``.
  ``load`` unpickles this blob: load only checkpoints you trust. A job may restore with more
  ranks than saved: a rank the step never had reads the blob of rank (rank % saved world size),
  so its optimizer layout and user state come from that rank (``last_restore["extra_rank"]``).
"""

import pickle
import random
import sys
import time
import types
import warnings
import weakref

import torch

import ckptd
from ckptd import arena, checkpointer_meta
from ckptd import extra_state as _extras

__all__ = ["Checkpointer", "RNGState"]



class RNGState:
    """An ``extra_state`` that saves and restores the random number generators: torch's CPU RNG,
    the CUDA generators of every visible GPU (when CUDA is initialised in this process), Python's
    ``random``, numpy's global RNG (when numpy is imported) and any ``torch.Generator`` objects
    given here (e.g. the data loader's). Both forms: ``state()``/``load()`` and
    ``state_dict()``/``load_state_dict()``. A restore on a machine with fewer GPUs sets those it
    has; CUDA state saved where CUDA was not initialised is left as it is."""

    def __init__(self, *generators):
        self.generators = generators

    def state(self):
        np = sys.modules.get("numpy")
        cuda = None
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            cuda = [s.numpy().tobytes() for s in torch.cuda.get_rng_state_all()]
        return {
            "torch": torch.get_rng_state().numpy().tobytes(),
            "cuda": cuda,
            "random": random.getstate(),
            "numpy": np.random.get_state() if np is not None else None,
            "generators": [g.get_state().numpy().tobytes() for g in self.generators],
        }

    def load(self, state):
        def tensor(b):
            return torch.frombuffer(bytearray(b), dtype=torch.uint8)

        saved = state.get("generators", [])
        if len(saved) != len(self.generators):
            raise ckptd.Error("RNGState: the checkpoint has %d generators, this RNGState %d"
                              % (len(saved), len(self.generators)))
        torch.set_rng_state(tensor(state["torch"]))
        random.setstate(state["random"])
        np = sys.modules.get("numpy")
        if state.get("numpy") is not None and np is not None:
            np.random.set_state(state["numpy"])
        cuda = state.get("cuda")
        if cuda and torch.cuda.is_available():
            for device in range(min(len(cuda), torch.cuda.device_count())):
                torch.cuda.set_rng_state(tensor(cuda[device]), device)
        for g, s in zip(self.generators, saved):
            g.set_state(tensor(s))

    state_dict = state
    load_state_dict = load


def _back_with_arenas(tensors, copy):
    """Before a load that overwrites them: moves the CPU tensors of ``tensors`` that are not yet
    in shared memory into shared arenas, in place (``t.data = ...``: a Parameter stays the same
    object, so the optimizer's references hold; ckptd/arena.py says which tensors qualify).
    ``copy=False`` (a strict load, which fills every tensor) copies nothing, where
    ``Tensor.share_memory_()`` would copy the old values into a new shared-memory file per
    tensor just before the daemon overwrites them — most of a Python restore's time, and one
    descriptor per tensor. Returns [(tensor, previous data)] for _put_back."""
    candidates = [t for t in tensors.values() if isinstance(t, torch.Tensor)]
    previous = [(t, t.data) for t in candidates if t.device.type == "cpu" and not t.is_shared()]
    arena.move_into_arenas(candidates, copy=copy)
    return [(t, data) for t, data in previous if t.is_shared()]


def _put_back(rebacked):
    """Undoes _back_with_arenas after a failed load: the old values come back."""
    for t, previous in rebacked:
        t.data = previous


def _fail(message, code="FAILED_PRECONDITION"):
    e = ckptd.Error(message)
    e.code = code
    e.message = message
    return e


class _SaveLayout:
    """What a Checkpointer's save sends, found by walking the model and the optimizer once, and
    kept for the saves after it (a save at 10,000 tensors would otherwise spend ~100 ms of the
    training step re-walking them in Python).

    A walk records, next to the tensors and the metadata, a ``_ckptd.SlotWatch`` of everything
    it read: every module's ``_parameters``, ``_buffers`` and ``_modules`` (their lengths and
    what each name holds), the optimizer's ``param_groups`` (their lists of params) and
    ``state`` (which params have state, each state's keys and tensors). The next save reuses the
    walk when the watch holds, in one native pass; any change — optimizer state created by the
    first step, a new param group, a replaced Parameter or submodule, a state tensor swapped —
    fails it, and the save walks again. Changes inside a tensor (``param.data = ...``, a resize)
    are not the walk's business: the client's layout check compares every registered tensor's
    address, shape, dtype and contiguity at each save and re-registers what moved. Both checks
    run after a save that went out held (ckptd/held_save.py; Checkpointer._save_held), and a
    failed one walks again at the fence.

    Values that change every step without changing the layout are read at every save: the
    param groups' hyper-parameters (an LR scheduler), non-tensor optimizer state, the buffers
    (copied into their staging tensors), ``extra_state``. A model whose state_dict can hold
    anything else — a module with state_dict hooks or its own ``get_extra_state``,
    ``_save_to_state_dict`` or ``state_dict`` — is walked at every save (``cacheable`` False).
    ``shard_fn`` is called by the walk only, so it must answer the same for the same tensor.
    """

    def __init__(self, ck):
        self.checked = False
        self.cacheable = _cacheable(ck.model)
        lengths, slots = [], []
        for m in ck.model.modules():
            attrs = vars(m)
            for attr in ("_parameters", "_buffers", "_modules", "_non_persistent_buffers_set"):
                d = attrs.get(attr)
                slots.append((attrs, attr, d))
                if d is None:
                    continue
                lengths.append((d, len(d)))
                if isinstance(d, dict):
                    slots.extend((d, k, v) for k, v in d.items())
        tensors, self.model_other = ck._model_state(staged=True)
        self.tensors = tensors
        buffers = {id(b): b for b in ck.model.buffers()} if ck.copy_buffers else {}
        self.staged = [(name, buffers[id(v)]) for name, v in ck.model.state_dict(
            keep_vars=True).items() if id(v) in buffers] if buffers else []
        # Where each staged buffer lives, (module._buffers, key) by its state_dict name (a buffer
        # shared by two modules has two): a held save stages a buffer only while it is still
        # that module's (Checkpointer._save_held).
        owners = {}
        for prefix, m in ck.model.named_modules(remove_duplicate=False):
            for key in m._buffers:
                owners[prefix + "." + key if prefix else key] = (m._buffers, key)
        self.staged_from = [(name, buf, owners[name]) for name, buf in self.staged]
        self.opt_meta, self.order, self.group_names, self.dynamic = {}, [], [], []
        opt = ck.optimizer
        if opt is not None:
            attrs = vars(opt)
            slots += [(attrs, "param_groups", opt.param_groups), (attrs, "state", opt.state)]
            lengths += [(opt.param_groups, len(opt.param_groups)), (opt.state, len(opt.state))]
            params = ck._optimizer_params()
            index = 0
            for group in opt.param_groups:
                plist = group["params"]
                slots.append((group, "params", plist))
                lengths.append((plist, len(plist)))
                slots.extend((plist, i, p) for i, p in enumerate(plist))
                self.group_names.append([name for _, name in params[index:index + len(plist)]])
                index += len(plist)
            for p, pname in params:
                self.order.append(pname)
                st = opt.state.get(p)
                slots.append((opt.state, p, st))
                if not st:
                    continue
                lengths.append((st, len(st)))
                entries = {}
                for key, v in st.items():
                    if isinstance(v, torch.Tensor):
                        tname = "optimizer.state.%s.%s" % (pname, key)
                        if tname in tensors:
                            raise _fail("optimizer state name %r collides with a model tensor"
                                        % tname)
                        tensors[tname] = v
                        slots.append((st, key, v))
                        like_param = tuple(v.shape) == tuple(p.shape)
                        entries[key] = ("tensor", ckptd.dtype_name(v.dtype), tuple(v.shape),
                                        like_param)
                    else:
                        entries[key] = ("value", v)
                        self.dynamic.append((pname, key, st))
                self.opt_meta[pname] = entries
        # The optimizer's layout, pickled once per walk, is saved as a uint8 tensor of its own
        # named by its content (format 3 of ckptd/checkpointer_meta.py): a save's extra blob
        # only names it. A walk that finds the same bytes keeps the previous walk's tensor, so
        # an unchanged layout is not registered again.
        static = checkpointer_meta.static_blob(self.opt_meta, self.order, self.group_names)
        layout_name = checkpointer_meta.layout_name(static)
        if layout_name in tensors:
            raise _fail("tensor name %r is ckptd's: rename it" % layout_name)
        if ck._layout_tensor is None or ck._layout_tensor[0] != layout_name:
            ck._layout_tensor = (layout_name,
                                 torch.frombuffer(bytearray(static), dtype=torch.uint8))
        layout_tensor = ck._layout_tensor[1]
        self.layout = (layout_name, len(static))
        # Parameters and optimizer state into a few shared arenas, once: the trainer then holds a
        # few descriptors whatever its tensor count (ckptd/arena.py). The client keeps the
        # registered storages, and so the arenas, alive.
        # The model's tensors and the optimizer's go into arenas of their own, so that a
        # torch.save of the model's state_dict writes the model's bytes, not the optimizer's.
        opt_names = {"optimizer.state.%s.%s" % (pname, key) for pname, entries in
                     self.opt_meta.items() for key in entries}
        for optimizer_part in (False, True):
            arena.move_into_arenas([v for name, v in tensors.items()
                                    if isinstance(v, torch.Tensor)
                                    and (name in opt_names) == optimizer_part]
                                   + ([layout_tensor] if optimizer_part else []))
        # Every rank saves its layout whole, whatever shard_fn does with the state.
        self.sharded = dict(ck._shard(tensors))
        self.sharded[layout_name] = layout_tensor
        self.watch = ckptd._ckptd.SlotWatch(lengths, slots)


def _cacheable(model):
    """False when some module can put into its state_dict what the walk cannot watch."""
    base = torch.nn.Module
    for m in model.modules():
        t = type(m)
        if (t.state_dict is not base.state_dict or t._save_to_state_dict is not
                base._save_to_state_dict or t.get_extra_state is not base.get_extra_state):
            return False
        if getattr(m, "_state_dict_hooks", None) or getattr(m, "_state_dict_pre_hooks", None):
            return False
    return True


def _unwrap(model):
    """The module whose state is saved: a model wrapped in DistributedDataParallel or
    DataParallel saves under its inner module's names (no ``module.`` prefix), and so does one
    compiled with torch.compile (``_orig_mod``), so a checkpoint moves between the wrapped model
    used for training and the plain one used for evaluation or export, both ways."""
    parallel = (torch.nn.parallel.DistributedDataParallel, torch.nn.DataParallel)
    while True:
        if isinstance(model, parallel):
            model = model.module
        elif type(model).__name__ == "OptimizedModule" and isinstance(
                getattr(model, "_orig_mod", None), torch.nn.Module):
            model = model._orig_mod
        else:
            return model


class Checkpointer:
    """Saves and restores ``model``, ``optimizer`` and user state through a ``ckptd.Client``.

    ``save(step)`` — right after ``optimizer.step()`` — shares and registers the tensors (the
    first time; later saves only send the step) and returns once the daemon accepted the step.
    The first save installs a hook on ``optimizer`` that calls ``client.wait_snapshot()`` before
    every optimizer step, so training never modifies a tensor the daemon is still capturing
    (``optimizer.register_step_pre_hook`` where PyTorch has it, otherwise ``optimizer.step`` is
    wrapped on the instance). Only that wait can stall training, and only when capturing takes
    longer than forward + backward. Anything else that modifies saved tensors in place between
    ``save`` and the next optimizer step must call ``checkpointer.fence()`` first. ``optimizer``
    may be None (model only; nothing is fenced automatically then).

    ``persist_every=N`` checkpoints every step but writes only every N-th to storage: the other
    saves are memory-only (``client.save(..., persist=False)``: replicated into other daemons'
    memory, ``ckptd --replicas``), so losing a node costs neither storage writes nor the steps
    since the last persisted one. ``save(step, persist=...)`` decides for one step. Every rank
    must decide alike (the rule depends on the step only).

    ``load(step=None)`` restores the job's restore point (the newest committed step, or a newer
    memory-only step still held in memory; or ``step``) into the model and the optimizer —
    creating the optimizer's state tensors when the optimizer is fresh — and returns the step, or
    None when the job has no committed checkpoint. It works with any sharding the checkpoint was
    written with (each rank describes its own shards through ``shard_fn``).

    ``extra_state``: user state stored with the checkpoint, per rank: a dict of objects with
    ``state_dict()``/``load_state_dict()`` (LR schedulers, ``GradScaler``, stateful data
    loaders, :class:`RNGState`) or plain picklable values, e.g.
    ``{"scheduler": sched, "scaler": scaler, "rng": ckptd.torch.RNGState(), "epoch": 3}``; or
    one such object, one object with ``state()``/``load(state)``, or a callable returning a
    value. ``load`` puts the states back into the objects and shows what was saved in
    ``checkpointer.loaded_extra_state`` (ckptd/extra_state.py has the rules).

    Buffers (BatchNorm running statistics, counters) change during the forward pass, while the
    daemon may still be capturing; so ``save`` copies them into shared staging tensors of their
    own and registers those (``copy_buffers=False`` registers the live buffers instead, for models
    whose buffers change only in the optimizer step). Parameters and optimizer state are never
    copied: they change only in ``optimizer.step()``, behind the fence.

    ``shard_fn(name, tensor) -> tensor | ckptd.Shard | ckptd.FlatShard | None`` tells ckptd which
    part of the global tensor this rank's ``tensor`` is (default: the whole tensor). It is called
    for model tensors (state_dict names) and optimizer state tensors
    (``optimizer.state.<param name>.<key>``, same shape as the param for Adam's moments); None
    leaves a tensor out. It is called when the checkpointer walks the model (the first save,
    and a save after the model's or optimizer's layout changed), not at every save, so it must
    answer the same for the same tensor. Tensor parallel, rows of every ``proj`` weight split
    across ``tp`` ranks::

        def shard_fn(name, t):
            if "proj" in name and t.dim() == 2:
                rows = t.shape[0]
                return ckptd.Shard(t, (rows * tp, t.shape[1]), (tp_rank * rows, 0))
            return t                  # replicated: every rank has all of it

    ZeRO-style flat partitions: ``ckptd.FlatShard(t, full_shape, flat_offset)``.

    Checkpointing never stops training: ``on_error="warn"`` (the default) turns a save that
    fails — the daemon frozen past ``call_timeout``, killed or restarting, the step aborted or
    skipped, storage failing — into one warning per kind of failure, ``last_error`` and a count
    in ``failed_saves``, and training goes on (the client re-attaches to a restarted daemon by
    itself). The fence waits at most ``fence_timeout`` seconds (None: the client's
    ``call_timeout``) and then abandons the step, which is then never committed.
    ``on_error="raise"`` raises ckptd.Error instead. Invalid arguments always raise.
    """

    def __init__(self, client, model, optimizer, extra_state=None, shard_fn=None,
                 copy_buffers=True, on_error="warn", fence_timeout=None, persist_every=None):
        if on_error not in ("warn", "raise"):
            raise ValueError('on_error must be "warn" or "raise", not %r' % (on_error,))
        if persist_every is not None and (isinstance(persist_every, bool)
                                          or not isinstance(persist_every, int)
                                          or persist_every < 1):
            raise ValueError("persist_every must be a positive int or None, not %r"
                             % (persist_every,))
        self.persist_every = persist_every
        if fence_timeout is not None:
            fence_timeout = float(fence_timeout)
            if not fence_timeout > 0:
                raise ValueError("fence_timeout must be a positive number of seconds or None")
        self.client = client
        self.model = _unwrap(model)
        self.optimizer = optimizer
        self.extra_state = extra_state
        self.shard_fn = shard_fn
        self.copy_buffers = copy_buffers
        self.on_error = on_error
        self.fence_timeout = fence_timeout
        self._staging = {}              # buffer name -> its shared staging copy
        # While a held save is walked again at its fence: buffers are taken from their staging
        # copies as save() left them, not copied anew (_send_again).
        self._staging_frozen = False
        self.loaded_extra_state = None
        self.last_restore = None        # {step, bytes_from_memory/_storage/_peers} of load()
        self.last_error = None          # the last failure of a save or a fence
        self.failed_saves = 0           # saves that failed or whose fence gave up
        self._warned = set()            # (what, code) already warned about
        self._snapshot_pending = None   # the step whose capture the next fence waits for
        self._fence_gave_up_at = None   # a fence timed out since the last save (monotonic time)
        self._hook_handle = None
        self._hook_installed = False
        self._layout = None             # _SaveLayout of the last save
        # (name, uint8 tensor) holding the optimizer layout of the last walk (format 3 of
        # ckptd/checkpointer_meta.py), kept across walks while its bytes do not change
        self._layout_tensor = None

    # -- failures --------------------------------------------------------------------------

    def _failed(self, what, step, error):
        """A save or fence of ``step`` failed: count it, keep it, warn once per kind of failure
        (``on_error="warn"``) or raise (``"raise"``)."""
        self.last_error = error
        self.failed_saves += 1
        if self.on_error == "raise" or getattr(error, "code", None) == "INVALID_ARGUMENT":
            raise error  # bad input is the caller's bug, not a checkpoint that failed
        kind = (what, getattr(error, "code", "UNKNOWN"))
        if kind not in self._warned:
            self._warned.add(kind)
            warnings.warn("ckptd: %s of step %s failed (%s): %s — training goes on; further "
                          "failures of this kind are counted in failed_saves, not warned about"
                          % (what, step, kind[1], error), RuntimeWarning, stacklevel=4)

    # -- the fence -------------------------------------------------------------------------

    def fence(self):
        """Wait until the last save is captured (no-op when none is pending). Called by the
        optimizer pre-step hook. Never waits longer than ``fence_timeout`` (None: the client's
        ``call_timeout``): past it the step is abandoned — the daemon never commits it, since its
        bytes may be torn by the optimizer step that follows. A failed or abandoned step is
        handled by ``on_error``: "warn" (the default) warns once per kind of failure, sets
        ``last_error``, counts ``failed_saves`` and lets training go on; "raise" raises
        ckptd.Error (the tensors are free to change either way)."""
        step = self._snapshot_pending
        if step is None:
            return
        self._snapshot_pending = None
        timeout = self._fence_timeout()
        try:
            self.client.wait_snapshot(timeout)
        except ckptd.Error as e:
            if e.code == "DEADLINE_EXCEEDED":
                # Before the optimizer touches the tensors: the daemon must learn first.
                self.client.abandon(step, "the Checkpointer's fence gave up after %.1f s"
                                    % (timeout,))
                # This training step has paid its one wait on the daemon: its save is skipped.
                self._fence_gave_up_at = time.monotonic()
            self._failed("fence", step, e)
    def _fence_timeout(self):
        if self.fence_timeout is not None:
            return self.fence_timeout
        return getattr(self.client, "call_timeout", None)

    def _install_hook(self):
        if self._hook_installed or self.optimizer is None:
            return
        ref = weakref.ref(self)

        def fence():
            checkpointer = ref()
            if checkpointer is not None:
                checkpointer.fence()

        opt = self.optimizer
        if hasattr(opt, "register_step_pre_hook"):
            self._hook_handle = opt.register_step_pre_hook(lambda *args, **kwargs: fence())
        else:
            # torch 1.13: wrap step on the instance. A bound method, so that LR schedulers created
            # later (which look at step.__self__ / __func__) still work.
            original = opt.step

            def step(self_opt, *args, **kwargs):
                fence()
                return original(*args, **kwargs)

            if getattr(original, "_with_counter", False):
                step._with_counter = True  # an LR scheduler's counting wrapper is still inside
            opt.step = types.MethodType(step, opt)
            self._hook_handle = (opt, original)
        self._hook_installed = True

    def remove_hook(self):
        """Uninstall the optimizer pre-step hook (after a final ``fence()``)."""
        if not self._hook_installed:
            return
        if isinstance(self._hook_handle, tuple):
            opt, original = self._hook_handle
            opt.step = original
        else:
            self._hook_handle.remove()
        self._hook_handle = None
        self._hook_installed = False

    # -- naming ----------------------------------------------------------------------------

    def _param_names(self):
        names = {}
        for name, p in self.model.named_parameters():
            names.setdefault(id(p), name)
        return names

    def _optimizer_params(self):
        """[(param, name)] in param_groups order."""
        if self.optimizer is None:
            return []
        names = self._param_names()
        out = []
        for g, group in enumerate(self.optimizer.param_groups):
            for i, p in enumerate(group["params"]):
                out.append((p, names.get(id(p), "param_groups.%d.%d" % (g, i))))
        return out

    def _shard(self, tensors):
        if self.shard_fn is None:
            return tensors
        out = {}
        for name, t in tensors.items():
            v = self.shard_fn(name, t)
            if v is not None:
                out[name] = v
        return out

    def _model_state(self, staged=False):
        """(tensors, non-tensor entries) of the model's state_dict, with the live tensors; with
        ``staged``, buffers are replaced by fresh copies in their staging tensors."""
        tensors, other = {}, {}
        buffers = set()
        if staged and self.copy_buffers:
            buffers = {id(b) for b in self.model.buffers()}
        for name, v in self.model.state_dict(keep_vars=True).items():
            if isinstance(v, torch.Tensor):
                tensors[name] = self._stage(name, v) if id(v) in buffers else v
            else:
                other[name] = v
        return tensors, other

    def _stage(self, name, buf):
        s = self._staging.get(name)
        if self._staging_frozen:
            if s is None:
                # A buffer that appeared before the save but after the walk it was sent with:
                # its value at save() is gone (the forward pass since may have changed it).
                raise _fail("buffer %r appeared since the previous save; this step cannot be "
                            "saved as it was, and the next save walks the model anew" % name)
            return s
        if s is None or s.dtype != buf.dtype or s.shape != buf.shape or s.device != buf.device:
            # On the buffer's device: for CUDA, the copy below is enqueued on the current stream
            # before save() records its event there, so the daemon copies the staged values.
            # On the CPU the walk that follows a new staging tensor moves it into an arena with
            # the model's other tensors (_SaveLayout), so buffers cost no descriptor each.
            s = torch.empty(buf.shape, dtype=buf.dtype, device=buf.device)
            self._staging[name] = s
        s.copy_(buf.detach())
        return s

    # -- save ------------------------------------------------------------------------------

    def save(self, step, on_full="wait", persist=None):
        """Checkpoint model, optimizer and extra state as ``step``; returns once the request is
        on its way (ckptd.Client.save). Call it right after ``optimizer.step()``. A save the
        daemon refuses or does not answer within the client's ``call_timeout`` is handled by
        ``on_error`` (see :meth:`fence`), here or — for a save of the cached layout, which does
        not wait for the daemon's answer — in the fence that takes the answer; with "warn"
        neither raises. ``persist``: write the step to
        storage (True) or keep it in peers' memory only (False); None follows ``persist_every``
        (every step is written without it)."""
        if persist is None:
            persist = self.persist_every is None or step % self.persist_every == 0
        elif not isinstance(persist, bool):
            raise ValueError("persist must be True, False or None, not %r" % (persist,))
        self._install_hook()
        self.fence()  # a previous save still capturing (no optimizer step since) reads staging
        gave_up, self._fence_gave_up_at = self._fence_gave_up_at, None
        if gave_up is not None:
            # The fence before this save gave up (the daemon froze, or its capture could not keep
            # up): waiting on the daemon again for this save would make the training step pay a
            # second deadline. This save is skipped; the next one tries again.
            self._failed("save", step, _fail(
                "save of step %s skipped: the fence before it gave up after %s s"
                % (step, self._fence_timeout()), "DEADLINE_EXCEEDED"))
            return
        layout = self._layout
        if layout is not None:
            try:
                held = self._save_held(step, layout, on_full, persist)
            except ckptd.Error as e:
                self._failed("save", step, e)
                return
            if held:
                self._snapshot_pending = step
                return
        if layout is not None and not self._refresh(layout):
            layout = None
        if layout is None:
            layout = self._layout = _SaveLayout(self)
        # Per save, only what changes between steps is pickled: the groups' hyper-parameters
        # (an LR scheduler), non-tensor optimizer state, extra_state; the optimizer's layout was
        # pickled once by the walk (ckptd/checkpointer_meta.py).
        extra = checkpointer_meta.encode(step, layout.model_other, layout.layout,
                                         self._hyper_parameters(), self._dynamic_state(layout),
                                         self._user_state())
        try:
            if layout.checked:
                self.client._save_registered(step, extra, on_full, persist)
            else:
                self.client.save(step, layout.sharded, extra, on_full, persist)
        except ckptd.Error as e:
            self._failed("save", step, e)
            return
        self._snapshot_pending = step

    def _save_held(self, step, layout, on_full, persist):
        """The save as a held save over the last walk (ckptd/held_save.py): only the buffers are
        copied and the metadata encoded here; the walk's watch and the registration are checked
        after the step went out, and a change re-walks at the fence (_send_again). False when it
        cannot be (a model walked at every save, a buffer that needs a new staging tensor, a
        client or daemon that does not hold saves): save() walks or checks first. Raises what
        the save raises."""
        check = self.client._holdable(layout.sharded) if layout.cacheable else None
        if check is None:
            return False  # decided before any copy: the path below would make them again
        for name, buf, (owner, key) in layout.staged_from:
            # The buffer object the walk found, still the module's (a forward pass that assigns
            # a new tensor instead of updating it in place replaces it): else walk again now,
            # while its value is the one to save.
            if owner.get(key) is not buf or self._stage(name, buf) is not layout.tensors[name]:
                return False  # or it changed shape or dtype: a new staging tensor
        try:
            extra = checkpointer_meta.encode(step, layout.model_other, layout.layout,
                                             self._hyper_parameters(),
                                             self._dynamic_state(layout), self._user_state())
        except Exception:
            return False  # the walk no longer matches the optimizer: walk again, as before

        def resend():
            self._send_again(step, extra, on_full, persist)

        return self.client._save_held(step, layout.sharded, extra, on_full, persist,
                                      watch=layout.watch.unchanged, resend=resend, check=check)

    def _send_again(self, step, extra, on_full, persist):
        """A held save whose check failed, at its fence (the optimizer has not stepped since the
        save): walk again, with the buffers as save() staged them and the hyper-parameters and
        extra state save() pickled into ``extra``, register, and send the step in place of the
        held one."""
        saved = pickle.loads(extra)
        self._staging_frozen = True
        try:
            layout = _SaveLayout(self)
        except BaseException:
            self._layout = None  # the next save walks at save() time
            raise
        finally:
            self._staging_frozen = False
        self._layout = layout
        extra = checkpointer_meta.encode(step, layout.model_other, layout.layout,
                                         saved["param_groups"], self._dynamic_state(layout),
                                         saved["extra_state"])
        self.client._send_again(step, layout.sharded, extra, on_full, persist)

    def _hyper_parameters(self):
        return [{k: v for k, v in group.items() if k != "params"}
                for group in (self.optimizer.param_groups if self.optimizer else ())]

    @staticmethod
    def _dynamic_state(layout):
        dynamic = {}
        for pname, key, st in layout.dynamic:
            dynamic.setdefault(pname, {})[key] = st[key]
        return dynamic

    def _refresh(self, layout):
        """Brings the cached layout up to date for a save: copies the buffers into their staging
        tensors and checks that nothing the layout was built from has changed. False: build it
        again (the model or optimizer changed shape, or the client's registration no longer
        matches the tensors' memory)."""
        if not layout.cacheable or not layout.watch.unchanged():
            return False
        for name, buf in layout.staged:
            s = self._stage(name, buf)
            if s is not layout.tensors[name]:
                return False  # the buffer changed shape or dtype: a new staging tensor
        layout.checked = self.client._registered_as(layout.sharded)
        return True

    def _user_state(self):
        return _extras.collect(self.extra_state)

    # -- load ------------------------------------------------------------------------------

    def load(self, step=None, strict=True):
        """Restore ``step`` (None: the job's restore point, the newest committed step resolved once
        for all ranks: :meth:`ckptd.Client.restore_point`). Returns the step loaded, or None
        when nothing is committed for this job (then nothing is touched). A step of the previous
        trainers that commits while the ranks restore is restored by none of them; the next
        save of that step number is refused (a warning under ``on_error="warn"``) and the saves
        after it go on as usual."""
        if step is None:
            step = self.client.restore_point()
            if step is None:
                return None
        # Phase 1: the model's tensors (their registration does not depend on the checkpoint);
        # this also brings back the rank's extra blob.
        tensors, _ = self._model_state()
        # A strict load fills every tensor or fails: the tensors can be given empty shared
        # memory instead of having their old values copied there (put back if it fails).
        rebacked = _back_with_arenas(tensors, copy=not strict)
        try:
            extra = self.client.load(self._shard(tensors), step=step, strict=strict)
        except BaseException:
            _put_back(rebacked)
            raise
        from_memory = self.client.last_load.bytes_from_memory
        from_storage = self.client.last_load.bytes_from_storage
        from_peers = self.client.last_load.bytes_from_peers

        def read_layout(name, size):
            # Format 3: the optimizer's layout is a tensor of the step.
            nonlocal from_memory, from_storage, from_peers
            buf = torch.empty(size, dtype=torch.uint8)
            self.client.load({name: buf}, step=step, strict=True)
            from_memory += self.client.last_load.bytes_from_memory
            from_storage += self.client.last_load.bytes_from_storage
            from_peers += self.client.last_load.bytes_from_peers
            return buf.numpy().tobytes()

        try:
            meta = checkpointer_meta.decode(extra, read_layout)
        except ValueError as e:
            raise _fail("step %d: the rank's extra blob is not a ckptd.torch checkpoint (%s)"
                        % (step, e), "DATA_LOSS") from None
        if meta["model_other"]:
            self.model.load_state_dict(meta["model_other"], strict=False)
        # Phase 2: the optimizer's state tensors, created from the metadata when missing.
        opt_tensors = self._restore_optimizer(meta["optimizer"], strict)
        if opt_tensors:
            rebacked = _back_with_arenas(opt_tensors, copy=not strict)
            try:
                self.client.load(self._shard(opt_tensors), step=step, strict=strict)
            except BaseException:
                _put_back(rebacked)
                raise
            from_memory += self.client.last_load.bytes_from_memory
            from_storage += self.client.last_load.bytes_from_storage
            from_peers += self.client.last_load.bytes_from_peers
        # Where the restore came from: the daemon's memory (hot), other nodes' daemons, storage.
        self.last_restore = {"step": step, "bytes_from_memory": from_memory,
                             "bytes_from_storage": from_storage, "bytes_from_peers": from_peers,
                             "extra_rank": self.client.last_load.extra_rank}
        self.loaded_extra_state = _extras.restore(self.extra_state, meta["extra_state"])
        return step

    def _restore_optimizer(self, saved, strict):
        opt = self.optimizer
        if opt is None:
            return {}
        params = self._optimizer_params()
        groups = saved["param_groups"]
        if len(groups) != len(opt.param_groups):
            raise _fail("the checkpoint's optimizer has %d param groups, this one %d"
                        % (len(groups), len(opt.param_groups)))
        names = [name for _, name in params]
        saved_names = [n for g in groups for n in g["params"]]
        if names != saved_names:
            diff = next((i for i, (a, b) in enumerate(zip(names, saved_names)) if a != b),
                        min(len(names), len(saved_names)))
            raise _fail("the checkpoint's optimizer parameters differ from this optimizer's "
                        "(%d vs %d params; first difference at index %d: %r vs %r)"
                        % (len(saved_names), len(names), diff,
                           saved_names[diff] if diff < len(saved_names) else None,
                           names[diff] if diff < len(names) else None))
        # The existing state tensors are reused when they fit (their registration stays valid).
        old = {id(p): dict(st) for p, st in opt.state.items()}
        state_dict = {"state": {}, "param_groups": []}
        index = 0
        for g in groups:
            n = len(g["params"])
            entry = {k: v for k, v in g.items() if k != "params"}
            entry["params"] = list(range(index, index + n))
            index += n
            state_dict["param_groups"].append(entry)
        opt.load_state_dict(state_dict)  # hyper-parameters; resets the state
        tensors = {}
        for p, pname in params:
            entries = saved["state"].get(pname)
            if not entries:
                continue
            prev = old.get(id(p), {})
            st = {}
            for key, entry in entries.items():
                if entry[0] == "value":
                    st[key] = entry[1]
                    continue
                _, dtype_name, shape, like_param = entry
                dtype = ckptd._dtype_from_name(dtype_name)
                shape = tuple(p.shape) if like_param else tuple(shape)
                t = prev.get(key)
                if not (isinstance(t, torch.Tensor) and t.dtype == dtype
                        and tuple(t.shape) == shape and t.device == p.device
                        and t.is_contiguous()):
                    # Where the parameter lives: CUDA state loads straight into GPU memory.
                    # Where the parameter lives (CUDA state loads straight into GPU memory); CPU
                    # state goes into an arena before the load (_back_with_arenas). A strict
                    # load fills every byte: nothing to zero (zeroing fresh memory costs more
                    # than the load itself).
                    make = torch.empty if strict else torch.zeros
                    t = make(shape, dtype=dtype, device=p.device)
                st[key] = t
                tensors["optimizer.state.%s.%s" % (pname, key)] = t
            opt.state[p] = st
        return tensors
