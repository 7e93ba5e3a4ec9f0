"""ckptd — checkpoint PyTorch tensors through the node's checkpoint daemon (docs/design.md §7.4).

    import ckptd
    c = ckptd.Client("myjob", rank, world_size, socket="/run/ckptd/ckptd.sock")
    c.save(step, {"w": w, "b": ckptd.Shard(b_part, (1024,), (rank * 256,))}, extra=b"...")
    ...                                  # forward / backward; the daemon copies meanwhile
    c.wait_snapshot()                    # before the tensors change again (optimizer step)
    c.wait(step, "committed")            # optional: block until durable
    extra = c.load({"w": w, "b": b_part})  # latest committed step, any sharding

CPU tensors are handed to the daemon as file descriptors of their shared memory: the first
save()/load() of a tensor moves its storage into shared memory (``Tensor.share_memory_()``, in
place — views and parameters see the same memory) and registers it; later calls with the same
tensors send nothing but the step. CUDA tensors are handed over as CUDA IPC handles of their
allocation (or VMM fds for expandable segments), exported by the native client from
``Tensor.data_ptr()`` — never from PyTorch's private IPC bytes; save() records an event on the
tensors' device's current stream, so the daemon copies after the pending writes without any
host synchronize. Between save() and the end of the next wait_snapshot() the
saved tensors must not be modified (``ckptd.torch.Checkpointer`` enforces this with an
optimizer pre-step hook). Every failure raises :class:`ckptd.Error`.

A sick daemon never holds the trainer for long: every prompt call (connect, register, save,
latest) gives up after ``call_timeout`` seconds with ``ckptd.Error`` code DEADLINE_EXCEEDED, and
wait/wait_snapshot/load fail the same way when the daemon answers nothing, not even a liveness
probe, for that long. When the connection breaks (the daemon was killed, restarted or upgraded),
the next call connects again and re-registers the tensors by itself: the same Client object
survives a daemon restart. A step in flight at the break commits only if the old daemon had
captured it; committed steps are never touched.
"""

import operator
import os
import threading

from ._ckptd import Error  # noqa: F401  (re-exported: ckptd.Error)
from . import _ckptd
from .held_save import HeldSave, HeldSaves

__all__ = ["Client", "Shard", "FlatShard", "Error", "LoadInfo", "DEFAULT_SOCKET", "dtype_name",
           "load_checkpoint"]

DEFAULT_SOCKET = "/run/ckptd/ckptd.sock"

# docs/design.md §7.6: dtype names follow PyTorch; float8 types only where this torch has them.
_DTYPE_NAMES = ("float32", "bfloat16", "float16", "float64", "int8", "uint8", "int16", "int32",
                "int64", "bool", "float8_e4m3fn", "float8_e5m2")

_torch = None
_dtype_to_name = None
_name_to_dtype = None
_probe = False  # not looked for yet; then None or _ckptd_torch.probe()'s capsule
# Held saves (ckptd/held_save.py); $CKPTD_HELD_SAVES=0 checks every save before it is sent.
_HELD_SAVES = os.environ.get("CKPTD_HELD_SAVES", "1") != "0"


def _error(message, code="INVALID_ARGUMENT"):
    e = Error(message)
    e.code = code
    e.message = message
    return e


def _import_torch():
    global _torch, _dtype_to_name, _name_to_dtype
    if _torch is None:
        import torch
        to_name, to_dtype = {}, {}
        for name in _DTYPE_NAMES:
            dt = getattr(torch, name, None)
            if isinstance(dt, torch.dtype):
                to_name[dt] = name
                to_dtype[name] = dt
        _dtype_to_name, _name_to_dtype = to_name, to_dtype
        _torch = torch
    return _torch


def _tensor_probe():
    """The TensorProbe capsule (client/python/tensor_probe.h) that lets _ckptd.LayoutCheck read
    tensor addresses from PyTorch's C++ objects, or None: where _ckptd_torch was not built, where
    $CKPTD_TENSOR_PROBE is 0, where the running torch is not the libtorch it was linked
    against (importing it there would load a second libc10 into the process), or where it
    hands out another version of the probe table than _ckptd reads (a stale build)."""
    global _probe
    if _probe is False:
        _probe = None
        _import_torch()
        if os.environ.get("CKPTD_TENSOR_PROBE", "1") != "0":
            try:
                from ._torch_probe_build import LINKED_C10
                with open("/proc/self/maps") as f:
                    same = any(line.rstrip("\n").endswith(" " + LINKED_C10) for line in f)
                if same:
                    from . import _ckptd_torch
                    if (getattr(_ckptd_torch, "capsule_name", None)
                            == _ckptd.tensor_probe_capsule):
                        _probe = _ckptd_torch.probe()
            except (ImportError, OSError):
                pass
    return _probe


def dtype_name(dtype):
    """The ckptd name of a torch dtype ("float32", "bfloat16", ...); ckptd.Error if unsupported."""
    _import_torch()
    name = _dtype_to_name.get(dtype)
    if name is None:
        raise _error("dtype %s is not supported by ckptd (supported: %s)"
                     % (dtype, ", ".join(sorted(_name_to_dtype))))
    return name


def _dtype_from_name(name):
    _import_torch()
    dt = _name_to_dtype.get(name)
    if dt is None:
        raise _error("dtype '%s' is not available in this PyTorch" % (name,))
    return dt


def _as_uint_list(values, what):
    try:
        out = [operator.index(v) for v in values]
    except TypeError:
        raise _error("%s must be a sequence of integers, not %r" % (what, values)) from None
    if any(v < 0 for v in out):
        raise _error("%s must not be negative: %r" % (what, out))
    return out


def _as_uint(value, what):
    try:
        v = operator.index(value)
    except TypeError:
        raise _error("%s must be an integer, not %r" % (what, value)) from None
    if v < 0:
        raise _error("%s must not be negative: %d" % (what, v))
    return v


def _as_timeout(timeout, what="timeout"):
    if timeout is None:
        return None
    t = float(timeout)
    if t != t or t < 0:
        raise ValueError("%s must be None or a non-negative number of seconds, not %r"
                         % (what, timeout))
    return t


class Shard:
    """A box shard: ``tensor`` holds ``global[offsets[d] : offsets[d] + tensor.shape[d]]`` in every
    dimension d of the global tensor of shape ``global_shape`` (tensor / pipeline / row splits).

        ckptd.Shard(w_local, global_shape=(4096, 1024), offsets=(tp_rank * 1024, 0))

    ``partial=True``: the job saves this tensor in part on purpose. Without it, a step whose
    ranks' shards leave part of a tensor uncovered fails at commit (``wait()`` names the tensor
    and the first missing element) instead of committing a checkpoint that cannot be restored.
    """

    __slots__ = ("tensor", "global_shape", "offsets", "partial")

    def __init__(self, tensor, global_shape, offsets, partial=False):
        self.tensor = tensor
        self.global_shape = tuple(_as_uint_list(global_shape, "Shard global_shape"))
        self.offsets = tuple(_as_uint_list(offsets, "Shard offsets"))
        self.partial = bool(partial)

    def __repr__(self):
        return "ckptd.Shard(shape=%s, global_shape=%s, offsets=%s)" % (
            tuple(self.tensor.shape), self.global_shape, self.offsets)


class FlatShard:
    """A flat shard: ``tensor`` (any shape) holds elements ``[flat_offset, flat_offset + numel)``
    of the row-major flattened global tensor of shape ``global_shape`` (ZeRO / FSDP flat
    parameters whose splits cut across rows).

        ckptd.FlatShard(flat_part, global_shape=(4096, 1024), flat_offset=rank * flat_part.numel())
    """

    __slots__ = ("tensor", "global_shape", "flat_offset", "partial")

    def __init__(self, tensor, global_shape, flat_offset, partial=False):
        self.tensor = tensor
        self.global_shape = tuple(_as_uint_list(global_shape, "FlatShard global_shape"))
        self.flat_offset = _as_uint(flat_offset, "FlatShard flat_offset")
        self.partial = bool(partial)  # as Shard.partial

    def __repr__(self):
        return "ckptd.FlatShard(numel=%d, global_shape=%s, flat_offset=%d)" % (
            self.tensor.numel(), self.global_shape, self.flat_offset)


class LoadInfo:
    """What the last :meth:`Client.load` did (``Client.last_load``)."""

    __slots__ = ("step", "extra", "bytes_from_memory", "bytes_from_storage", "missing",
                 "extra_rank", "saved_world_size", "bytes_from_peers")

    def __init__(self, step, extra, bytes_from_memory, bytes_from_storage, missing,
                 extra_rank=0, saved_world_size=0, bytes_from_peers=0):
        self.step = step                              # the step that was loaded
        self.extra = extra                            # this rank's extra bytes (see extra_rank)
        self.bytes_from_memory = bytes_from_memory    # served from the daemon's host memory
        self.bytes_from_storage = bytes_from_storage  # read from storage
        self.missing = missing                        # strict=False: tensors not in the step
        # Whose extra bytes these are: this rank's, or for a rank beyond the saved world size
        # (the job grew) those of rank (rank % saved_world_size).
        self.extra_rank = extra_rank
        self.saved_world_size = saved_world_size      # how many ranks saved the step
        # Read from storage by other nodes' daemons and sent to this one (a cold load of a job
        # across nodes); bytes_from_storage then also counts what this load read to serve them.
        self.bytes_from_peers = bytes_from_peers

    def __repr__(self):
        return ("ckptd.LoadInfo(step=%d, extra=%d bytes, bytes_from_memory=%d, "
                "bytes_from_storage=%d, missing=%r)" % (self.step, len(self.extra),
                                                        self.bytes_from_memory,
                                                        self.bytes_from_storage, self.missing))


_empty_fd = None
_empty_fd_lock = threading.Lock()


def _empty_memory_fd():
    """An open fd of a small zero-filled memfd: what zero-element tensors (which own no memory)
    register, as 0 bytes at offset 0 (the daemon maps only non-empty objects)."""
    global _empty_fd
    with _empty_fd_lock:
        if _empty_fd is None:
            fd = os.memfd_create("ckptd-empty", os.MFD_CLOEXEC)
            os.ftruncate(fd, 4096)
            _empty_fd = fd
        return _empty_fd


def _storage_fd(t):
    """(fd, fd_offset) of CPU tensor t's shared memory. The fd belongs to torch (it lives as long as
    the storage): it is only ever duplicated, never closed."""
    if not t.is_shared():
        t.share_memory_()  # in place: the storage object now lives in shared memory
    if hasattr(t, "untyped_storage"):   # torch >= 2.0: UntypedStorage, size in bytes
        fd, _size = t.untyped_storage()._share_fd_cpu_()
    else:                               # torch 1.13: TypedStorage, size in elements
        fd, _size = t.storage()._share_fd_cpu_()
    return fd, t.storage_offset() * t.element_size()


def _describe(name, value):
    """(tensor, spec tuple for _ckptd.Client.register) of one entry of `tensors`; ckptd.Error for
    anything ckptd cannot register (non-CPU, non-contiguous, unknown dtype, bad geometry)."""
    torch = _import_torch()
    if not isinstance(name, str):
        raise _error("tensor names must be strings, not %r" % (name,))
    if isinstance(value, Shard):
        t, kind = value.tensor, "box"
    elif isinstance(value, FlatShard):
        t, kind = value.tensor, "flat"
    elif isinstance(value, torch.Tensor):
        t, kind = value, "whole"
    else:
        raise _error("tensor '%s': expected a torch.Tensor, ckptd.Shard or ckptd.FlatShard, not %s"
                     % (name, type(value).__name__))
    if not isinstance(t, torch.Tensor):
        raise _error("tensor '%s': the shard's tensor is a %s, not a torch.Tensor"
                     % (name, type(t).__name__))
    if t.device.type not in ("cpu", "cuda"):
        raise _error("tensor '%s': tensors on %s are not supported (CPU only, or CUDA)"
                     % (name, t.device))
    if t.is_sparse or t.layout != torch.strided:
        raise _error("tensor '%s': only dense (strided) tensors can be checkpointed" % name)
    if not t.is_contiguous():
        raise _error("tensor '%s' is not contiguous (shape %s, strides %s): pass a contiguous "
                     "tensor (a .contiguous() copy would not be the memory you train)"
                     % (name, tuple(t.shape), t.stride()))
    try:
        dtype = dtype_name(t.dtype)
    except Error as e:
        raise _error("tensor '%s': %s" % (name, e)) from None
    shape = [int(d) for d in t.shape]
    numel = t.numel()
    nbytes = numel * t.element_size()
    if kind == "whole":
        global_shape, flat, offsets, lengths, flat_offset = shape, False, [], [], 0
    elif kind == "box":
        global_shape = list(value.global_shape)
        offsets = list(value.offsets)
        if len(global_shape) != t.dim() or len(offsets) != t.dim():
            raise _error("tensor '%s': Shard of a %d-dimensional tensor with a %d-dimensional "
                         "global_shape and %d offsets" % (name, t.dim(), len(global_shape),
                                                          len(offsets)))
        for d in range(t.dim()):
            if offsets[d] + shape[d] > global_shape[d]:
                raise _error("tensor '%s': Shard [%d, %d) of dimension %d lies outside the "
                             "global size %d" % (name, offsets[d], offsets[d] + shape[d], d,
                                                 global_shape[d]))
        flat, lengths, flat_offset = False, shape, 0
    else:
        global_shape = list(value.global_shape)
        total = 1
        for d in global_shape:
            total *= d
        if value.flat_offset + numel > total:
            raise _error("tensor '%s': FlatShard [%d, %d) lies outside the %d elements of the "
                         "global tensor" % (name, value.flat_offset, value.flat_offset + numel,
                                            total))
        flat, offsets, lengths, flat_offset = True, [], [], value.flat_offset
    device_ptr = 0
    if nbytes == 0:
        fd, fd_offset = _empty_memory_fd(), 0
    elif t.device.type == "cuda":
        fd, fd_offset, device_ptr = -1, 0, t.data_ptr()
    else:
        fd, fd_offset = _storage_fd(t)
    spec = (name, dtype, global_shape, flat, offsets, lengths, flat_offset, numel, fd, fd_offset,
            nbytes, device_ptr, bool(getattr(value, "partial", False)))
    return t, spec


def _cuda_device(tensors):
    """The CUDA device of the first non-empty CUDA tensor among ``tensors``, or None."""
    for t in tensors:
        if t.device.type == "cuda" and t.numel() > 0:
            return t.device
    return None


def _cuda_stream(device):
    """The current stream (int handle) of ``device`` (None: no CUDA tensors), or 0."""
    if device is None:
        return 0
    return _import_torch().cuda.current_stream(device).cuda_stream


def _storage_object(t):
    """The storage under tensor ``t`` (holding it keeps the memory alive)."""
    return t.untyped_storage() if hasattr(t, "untyped_storage") else t.storage()


def _from_launcher(job, rank, world_size, local_rank):
    """(job, rank, world_size, local_rank) with what the caller left as None filled in from the
    launcher's environment: torchrun, Slurm or Open MPI (client/include/ckpt/launch_env.h lists
    the variables); $CKPTD_JOB names the job whatever the launcher."""
    if job is not None and rank is not None and world_size is not None and local_rank is not None:
        return job, rank, world_size, local_rank
    env = _ckptd.launch_environment()
    if rank is None or world_size is None:
        if env["launcher"] is None:
            raise _error("rank and world_size were not given and no launcher set them: looked "
                         "for %s" % env["looked_for"])
        rank = env["rank"] if rank is None else rank
        world_size = env["world_size"] if world_size is None else world_size
    if job is None:
        job = env["job"]
        if job is None:
            raise _error("job was not given and the launcher named none: pass job= or set "
                         "CKPTD_JOB (torchrun's TORCHELASTIC_RUN_ID is 'none' without "
                         "--rdzv-id)")
    if local_rank is None:
        local_rank = env["local_rank"]
        if local_rank is None:
            local_rank = int(os.environ.get("LOCAL_RANK", rank))
    return job, rank, world_size, local_rank


class Client:
    """One trainer rank's connection to its node's ckptd (see the module docstring).

    ``job``, ``rank``, ``world_size`` and ``local_rank`` left out (None) come from the launcher:
    torchrun (RANK, WORLD_SIZE, LOCAL_RANK, TORCHELASTIC_RUN_ID), Slurm (SLURM_PROCID,
    SLURM_NTASKS, SLURM_LOCALID, SLURM_JOB_ID) or Open MPI (OMPI_COMM_WORLD_RANK, ..._SIZE,
    ..._LOCAL_RANK); $CKPTD_JOB names the job whatever the launcher (set it for a job that
    resumes across allocations). ``local_rank`` otherwise defaults to $LOCAL_RANK, else
    ``rank``. ``connect_timeout`` (seconds) is how long the constructor keeps retrying while the
    daemon is not listening yet. ``call_timeout``
    (seconds; None: $CKPTD_CALL_TIMEOUT, else 10) bounds every prompt call and how long a wait
    tolerates a daemon that answers nothing (``self.call_timeout``).
    Thread-safe: calls may come from several threads (the GIL is released while waiting).
    """

    def __init__(self, job=None, rank=None, world_size=None, socket=DEFAULT_SOCKET,
                 local_rank=None, connect_timeout=10.0, call_timeout=None):
        job, rank, world_size, local_rank = _from_launcher(job, rank, world_size, local_rank)
        if not isinstance(job, str):
            raise _error("job must be a string, not %r" % (job,))
        rank = _as_uint(rank, "rank")
        world_size = _as_uint(world_size, "world_size")
        local_rank = _as_uint(local_rank, "local_rank")
        connect_timeout = _as_timeout(connect_timeout, "connect_timeout")
        if call_timeout is not None:
            call_timeout = _as_timeout(call_timeout, "call_timeout")
            if call_timeout <= 0:
                raise ValueError("call_timeout must be positive, not %r" % (call_timeout,))
        self.job, self.rank, self.world_size, self.socket = job, rank, world_size, str(socket)
        self._lock = threading.Lock()
        self._layout = None     # _ckptd.LayoutCheck of the registered dict
        self._registered = ()   # the registered tensors, kept alive while registered
        self._registered_storages = ()  # and their storages (see _register)
        self._cuda = None       # the CUDA device of the registered tensors, if any
        self.last_load = None
        self._c = _ckptd.Client(job, rank, world_size, self.socket, local_rank,
                                10.0 if connect_timeout is None else connect_timeout,
                                call_timeout)
        # The step the daemon holds unread while its registration check runs (held_save.py).
        self._held = HeldSaves(self._c.confirm_save)

    @property
    def call_timeout(self):
        """Seconds every prompt call may take (and a wait may hear nothing from the daemon)."""
        return self._c.call_timeout

    @property
    def reattaches(self):
        """How often this client connected again after losing its connection to the daemon."""
        return self._c.reattaches

    @property
    def node_id(self):
        """The daemon's node id."""
        return self._c.node_id

    def _settle(self, owner=True):
        """Confirms the held save, or — when its tensors' memory changed since they were
        registered — registers them as they are now and sends the step again in its place
        (held_save.py). The daemon read nothing of it meanwhile. ``owner``: the caller is about
        to change the tensors or save them (save, wait_snapshot, load), not a monitor's wait."""
        save = self._held.settle(owner)
        if save is None:
            return
        try:
            save.resend()
        except BaseException as e:
            self._c.abandon(save.step, "its tensors changed since they were registered and "
                            "could not be registered again: %s" % (e,))
            raise

    def _send_again(self, step, tensors, extra, on_full, persist):
        """Registers ``tensors`` and sends ``step`` in place of its held save (Save.replace_held),
        whose check failed: the daemon read nothing of it."""
        self._register(tensors)
        self._c.save(step, extra, on_full, _cuda_stream(self._cuda), persist, False, True)

    def _register(self, tensors):
        if not hasattr(tensors, "items"):
            raise _error("tensors must be a dict {name: torch.Tensor | Shard | FlatShard}, not %s"
                         % type(tensors).__name__)
        if self._registered_as(tensors):
            # The daemon has exactly this set (the common case: every save after the first; a
            # re-attach re-registers it inside the native client). One native pass: no Python
            # work per tensor (_ckptd.LayoutCheck says what it compares).
            return
        kept, specs = [], []
        for name, value in tensors.items():
            t, spec = _describe(name, value)
            kept.append(t)
            specs.append(spec)
        with self._lock:
            self._layout = None
            self._c.register(specs)
            # Remembered after _describe, which may have moved storages into shared memory (their
            # data_ptr changed). The check and the lists below hold the registered tensors *and
            # their storages*: neither their ids nor their memory can be reused meanwhile, so a
            # tensor whose .data was replaced cannot come back at the old address (and the old
            # descriptor number) and pass for the registered one.
            # The dict itself when it is one (not a subclass, whose order may not be the
            # dict's): a save of the same dict, unmodified, is then known without a pass.
            self._layout = _ckptd.LayoutCheck(
                tensors if type(tensors) is dict else dict(tensors), _import_torch().Tensor,
                _tensor_probe())
            self._registered = tuple(kept)
            self._registered_storages = tuple(_storage_object(t) for t in kept)
            self._cuda = _cuda_device(kept)

    def _registered_as(self, tensors):
        """True when the daemon holds a registration of exactly ``tensors`` (their memory as it
        is now): a save of them would send only the step."""
        check = self._layout
        return (check is not None and isinstance(tensors, dict) and self._c.registered
                and check.matches(tensors))

    def _save_registered(self, step, extra, on_full, persist=True):
        """save() of the registered tensors, for a caller that has just checked
        :meth:`_registered_as` (ckptd.torch.Checkpointer): the same request without a second
        layout check."""
        self._settle()
        self._c.save(_as_uint(step, "step"), bytes(extra), on_full, _cuda_stream(self._cuda),
                     bool(persist))

    def _holdable(self, tensors):
        """The registration's LayoutCheck when a save of ``tensors`` may go out held — the daemon
        speaks local protocol 3, $CKPTD_HELD_SAVES is not 0, and the dict has the registered
        names and objects — else None."""
        check = self._layout
        if (not _HELD_SAVES or self._c.protocol < 3 or check is None
                or not isinstance(tensors, dict) or not self._c.registered
                or not check.same_objects(tensors)):
            return None
        return check

    def _save_held(self, step, tensors, extra, on_full, persist, watch=None, resend=None,
                   check=None):
        """The save of a dict whose names and tensor objects are the registered ones: the step
        goes out held, and its memory is checked after (held_save.py). False when that cannot
        be (nothing registered, other objects, a daemon before protocol 3): save() then checks
        and registers first. ``watch()``, when given, is checked with the memory (the
        Checkpointer's walk), and ``resend()`` then replaces the default re-send, which
        registers ``tensors`` as the check remembers them. ``check``: what :meth:`_holdable`
        answered for ``tensors`` just now, when the caller asked it first."""
        if check is None or check is not self._layout:  # none given, or registered anew since
            check = self._holdable(tensors)
        if check is None:
            return False
        # Posted: save() returns once the request is written. The daemon's answer is taken by
        # the next save or wait_snapshot, which raises a refusal (on_full="skip" is answered at
        # once: its caller expects RESOURCE_EXHAUSTED from save()).
        held = self._c.save(step, extra, on_full, _cuda_stream(self._cuda), persist, True, False,
                            on_full == "wait")
        if watch is None:
            verify = check.same_memory
        else:
            def verify():
                return watch() and check.same_memory()
        if resend is None:
            def resend():
                # What save() was given: its names and objects were checked to be these.
                self._send_again(step, check.registered(), extra, on_full, persist)
        if held:
            self._held.hold(HeldSave(step, verify, resend))
            return True
        # The connection was made again meanwhile, to a daemon that reads at once: check now.
        if not verify():
            self._c.abandon(step, "its tensors changed since they were registered, and the "
                            "daemon (an older version) read them at once")
            raise _error("save of step %d: a tensor's memory changed since it was registered, and "
                         "this daemon does not hold saves (local protocol < 3), so it read the "
                         "old memory: the step is abandoned; the next save registers anew"
                         % step, "ABORTED")
        return True

    def save(self, step, tensors, extra=b"", on_full="wait", persist=True):
        """Checkpoint ``tensors`` ({name: torch.Tensor | Shard | FlatShard}) as ``step``.

        Returns once the request is on its way to the daemon, which copies in the background.
        The tensors must not change until the next :meth:`wait_snapshot` returns. A save of the
        registered tensors does not wait for the daemon's answer: a refusal (a step that is not
        newer than the last, a save skipped while storage is stalled, a daemon that answers
        nothing within ``call_timeout``) is raised by that :meth:`wait_snapshot`, or by the next
        save if it comes first. ``extra`` (bytes) is this
        rank's opaque blob, given back by :meth:`load`. ``on_full="skip"``: when the daemon's
        pool has no room the step is skipped and ckptd.Error RESOURCE_EXHAUSTED is raised.
        ``persist=False``: a memory-only step, captured and replicated into other daemons'
        memory (``ckptd --replicas``) but never written to storage; wait for it with
        ``wait(step, "replicated")`` (a wait for "persisted" or "committed" raises
        FAILED_PRECONDITION). Every rank must save a step the same way.
        """
        step = _as_uint(step, "step")
        if isinstance(extra, str):
            raise _error("extra must be bytes, not str (encode it first)")
        extra = bytes(extra)
        if on_full not in ("wait", "skip"):
            raise _error('on_full must be "wait" or "skip", not %r' % (on_full,))
        if not isinstance(persist, bool):
            raise _error("persist must be True or False, not %r" % (persist,))
        self._settle()
        if self._save_held(step, tensors, extra, on_full, persist):
            return
        self._register(tensors)
        self._c.save(step, extra, on_full, _cuda_stream(self._cuda), persist)

    def wait_snapshot(self, timeout=None):
        """Block until the last save's bytes are captured; afterwards the tensors may change.
        ``timeout`` in seconds (None: no limit); on expiry ckptd.Error DEADLINE_EXCEEDED and the
        tensors must still be left alone — or given up with :meth:`abandon` first. UNAVAILABLE
        when the connection broke after the save (that step commits only if the daemon had
        captured it; the tensors are free). A refusal of a save that did not wait for the
        daemon's answer (see :meth:`save`) is raised here, once any earlier save is captured:
        the tensors are free then too."""
        self._settle()
        self._c.wait_snapshot(_as_timeout(timeout))

    def wait(self, step, state="committed", timeout=None):
        """Block until ``step`` reaches ``state``: "captured" (this rank's bytes), "persisted"
        (this node's data durable), "committed" (the global checkpoint) or "replicated" (every
        rank's bytes also held in other nodes' memory, ``ckptd --replicas``; the end of a
        memory-only step). ckptd.Error ABORTED when the step failed, FAILED_PRECONDITION when it
        will not be replicated (the message says why) or when a memory-only step is waited for
        "persisted" or "committed", DEADLINE_EXCEEDED when ``timeout`` seconds pass first."""
        if state not in ("captured", "persisted", "committed", "replicated"):
            raise _error('state must be "captured", "persisted", "committed" or "replicated", '
                         'not %r' % (state,))
        self._settle(owner=False)
        self._c.wait(_as_uint(step, "step"), state, _as_timeout(timeout))

    def latest(self):
        """The newest step of this job that restores now, or None: the newest committed step,
        or a newer memory-only step (``save(..., persist=False)``) whose every rank is held in
        memory by a live daemon."""
        return self._c.latest(False)

    def restore_point(self):
        """The step this job restores from after a restart, or None when there is none:
        :meth:`latest` (a committed step, or a memory-only step still held in memory), resolved
        once for the whole job. Every rank (of the same world
        size) that asks gets the same answer, once, even when a step of the previous incarnation
        commits between two ranks' calls — that step is then restored by no rank (number the
        next saves after it: a committed step is never saved again). ``load(step=None)`` and
        ``ckptd.torch.Checkpointer.load()`` restore this step."""
        return self._c.latest(True)

    def load(self, tensors, step=None, strict=True, job=None):
        """Fill ``tensors`` ({name: torch.Tensor | Shard | FlatShard}, CPU or CUDA, contiguous)
        in place from ``step`` (None: the job's restore point, :meth:`restore_point`), whatever
        sharding it was saved with.
        Returns this rank's ``extra`` bytes (a rank the step never had, because the job grew,
        gets those of rank ``rank % saved_world_size``); details in ``self.last_load``.
        strict=False leaves tensors missing from the step untouched (listed in
        ``last_load.missing``) instead of raising NOT_FOUND. ``job`` loads another job's
        checkpoint (e.g. fine-tuning from a pretraining run): the daemon allows it only for jobs
        its ``shared-jobs`` setting lists, and raises PERMISSION_DENIED otherwise."""
        if step is not None:
            step = _as_uint(step, "step")
        if job is not None and not isinstance(job, str):
            raise _error("job must be a string, not %r" % (job,))
        if self._held.pending():
            # A save not yet read: it must be read before this load writes into the tensors.
            self._settle()
            self._c.wait_snapshot(None)
        self._register(tensors)
        (loaded, extra, from_memory, from_storage, missing, extra_rank, saved_world,
         from_peers) = self._c.load(step, bool(strict), _cuda_stream(self._cuda), job or "")
        self.last_load = LoadInfo(loaded, extra, from_memory, from_storage, list(missing),
                                  extra_rank, saved_world, from_peers)
        return extra

    def abandon(self, step=None, reason=""):
        """Give up on ``step`` (None: the last save) before modifying its tensors, e.g. after
        :meth:`wait_snapshot` timed out: the daemon aborts the step and never commits it.
        Returns at once (it never waits for the daemon)."""
        if step is not None:
            step = _as_uint(step, "step")
        self._held.drop(step)
        self._c.abandon(step, str(reason))

    def close(self):
        """Close the connection (idempotent). Calls waiting in other threads raise CANCELLED."""
        # A held save is left unconfirmed: like any save not captured yet, closing the
        # connection aborts it (the daemon read nothing of it).
        self._held.close()
        self._c.close()
        with self._lock:
            self._layout = None
            self._registered = ()
            self._registered_storages = ()
            self._cuda = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def __repr__(self):
        return "ckptd.Client(job=%r, rank=%d, world_size=%d, socket=%r)" % (
            self.job, self.rank, self.world_size, self.socket)


def load_checkpoint(step_dir, names=None):
    """{name: full CPU tensor} of a committed step directory (``<root>/<job>/step-<step:010d>``),
    read from storage with no daemon: every stored tensor (optimizer state included, under its
    stored names), or only ``names``; each tensor is assembled whole from the shards the ranks
    wrote and every checksum piece is verified. Raises ckptd.Error: NOT_FOUND (no MANIFEST, an
    unknown name), DATA_LOSS (damaged bytes), FAILED_PRECONDITION (a tensor saved only in part).
    See ckptd.offline.load_checkpoint, which this is."""
    from . import offline
    return offline.load_checkpoint(step_dir, names)


def __getattr__(name):
    # ckptd.torch and ckptd.offline are imported on first use, so `import ckptd` does not load
    # PyTorch.
    if name in ("torch", "offline"):
        import importlib
        return importlib.import_module("." + name, __name__)
    raise AttributeError("module 'ckptd' has no attribute %r" % (name,))
