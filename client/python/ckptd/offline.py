"""ckptd.offline — read, convert and write checkpoints straight from the storage root, no daemon.

    import ckptd.offline
    ckptd.offline.steps("/ckpt", "myjob")                  # [100, 200, 300]: committed steps
    ck = ckptd.offline.open("/ckpt", "myjob")              # the newest committed step
    ck.tensors["layers.0.weight"]                          # TensorInfo(dtype, shape, partial)
    w = ck.read("layers.0.weight")                         # a torch tensor, checksums verified
    part = ck.read("layers.0.weight", ckptd.Shard(torch.empty(512, 1024), (4096, 1024), (512, 0)))
    model.load_state_dict(ck.state_dict(what="model"))
    ckptd.offline.to_torch_save("/ckpt", "myjob", 300, "model.pt")               # weights only
    ckptd.offline.to_torch_save("/ckpt", "myjob", 300, "full.pt", what="checkpointer")
    ckptd.offline.from_torch_save("pretrained.pt", "/ckpt", "finetune", step=0)
    ckptd.load_checkpoint("/ckpt/myjob/step-0000000300")   # {name: full CPU tensor}

The same module is the converter behind ``ckptctl export --format torch`` and ``ckptctl import``
(:func:`main`; ``python3 -m ckptd.offline --help``).

Everything here follows the on-disk format (proto/README.md §1) through the same C++ reader the
daemon loads with (common/checkpoint_reader.h): a step exists iff its MANIFEST does (directories
without one are saves in flight or leftovers, never listed), any region of a tensor is read from
whatever stored shards cover it, and every checksum piece a read touches is verified — a damaged
byte raises ckptd.Error DATA_LOSS naming the tensor and the data file, never returns bad values.

Names follow ckptd.torch.Checkpointer: model tensors under their state_dict names, optimizer
state as ``optimizer.state.<param name>.<key>``, and the rest — param_groups, non-tensor state,
the model's non-tensor state, ``extra_state`` — pickled in each rank's extra blob. Conversions
that need that metadata (``what="checkpointer"``, the model's non-tensor state) unpickle rank 0's
blob: as with ``Checkpointer.load``, convert only checkpoints you trust.

``from_torch_save`` writes a committed step of world size 1 with the daemon's layout and commit
order (client/python/offline_writer.h), so ``ckptctl verify`` passes on it, a daemon loads it
(``ckptd.Client.load``) and a Checkpointer restores it.
"""

import builtins
import collections
import fnmatch
import os
import pickle

import ckptd
from ckptd import checkpointer_meta
from ckptd import _ckptd

__all__ = ["steps", "latest", "open", "Checkpoint", "TensorInfo", "to_torch_save",
           "from_torch_save", "load_checkpoint", "export_torch", "import_torch", "Selection",
           "OPTIMIZER_PREFIX"]

# What ckptd.torch.Checkpointer names optimizer state tensors with.
OPTIMIZER_PREFIX = "optimizer.state."

# from_torch_save writes the Checkpointer's metadata in format 1, whole; a Checkpointer saves
# format 3 (ckptd/checkpointer_meta.py), and checkpointer_meta.decode reads every format.
_CHECKPOINTER_FORMAT = 1

TensorInfo = collections.namedtuple("TensorInfo", ["dtype", "shape", "partial"])
TensorInfo.__doc__ = ("A stored tensor: torch dtype, global shape (a tuple), and whether it was "
                      "saved in part on purpose (then only its stored regions can be read).")


def _error(message, code="INVALID_ARGUMENT"):
    e = ckptd.Error(message)
    e.code = code
    e.message = message
    return e


def steps(root, job):
    """The committed steps of ``job`` under the storage root ``root``, ascending (a step is
    committed iff its MANIFEST exists). [] when the job has none."""
    return list(_ckptd.offline_steps(os.fspath(root), job))


def latest(root, job):
    """The newest committed step whose MANIFEST reads and validates (falling back past damaged
    ones, like a daemon's load of the latest step), or None."""
    return _ckptd.offline_latest(os.fspath(root), job)


def open(root, job, step=None):  # noqa: A001 - the module's verb, as in ckptd.offline.open
    """The committed ``step`` of ``job`` (None: the newest readable one) as a :class:`Checkpoint`.
    ckptd.Error NOT_FOUND when the job has no such committed step."""
    root = os.fspath(root)
    if step is None:
        step = latest(root, job)
        if step is None:
            raise _error("job '%s' has no committed checkpoint under %s" % (job, root),
                         "NOT_FOUND")
    step = ckptd._as_uint(step, "step")
    path = _ckptd.offline_step_dir(root, job, step)
    if not os.path.exists(os.path.join(path, "MANIFEST")):
        raise _error("job '%s' has no committed step %d under %s (committed: %s)"
                     % (job, step, root, steps(root, job) or "none"), "NOT_FOUND")
    return Checkpoint(path)


def _region(value, torch):
    """(destination tensor or None, kind, global_shape, offsets, lengths, flat_offset, numel) of a
    Shard / FlatShard."""
    t = value.tensor
    if not isinstance(t, torch.Tensor):
        raise _error("the shard's tensor is a %s, not a torch.Tensor" % type(t).__name__)
    shape = [int(d) for d in t.shape]
    if isinstance(value, ckptd.Shard):
        return t, "box", list(value.global_shape), list(value.offsets), shape, 0, 0
    return t, "flat", list(value.global_shape), [], [], value.flat_offset, t.numel()


class Checkpoint:
    """One committed step, open for reading (:func:`open`). Attributes: ``job``, ``step``,
    ``world_size`` (how many ranks saved it), ``path`` (the step directory), ``writer``,
    ``created_unix_ms`` and ``tensors`` ({name: :class:`TensorInfo`} in manifest order). Reads
    may run from several threads at once."""

    def __init__(self, path):
        self._reader = _ckptd.CheckpointReader(os.fspath(path))
        info = self._reader.info()
        self.job = info["job"]
        self.step = info["step"]
        self.world_size = info["world_size"]
        self.path = info["step_dir"]
        self.writer = info["writer"]
        self.created_unix_ms = info["created_unix_ms"]
        self._dtype_names = {}
        self.tensors = {}
        for name, dtype, shape, partial, _shards in self._reader.tensors():
            self._dtype_names[name] = dtype
            self.tensors[name] = TensorInfo(ckptd._dtype_from_name(dtype), tuple(shape), partial)
        self._meta = {}

    def __repr__(self):
        return "ckptd.offline.Checkpoint(job=%r, step=%d, world_size=%d, %d tensors)" % (
            self.job, self.step, self.world_size, len(self.tensors))

    def extras(self, rank=0):
        """The extra blob (bytes) that ``rank`` saved with this step; ``world_size`` says how many
        ranks saved it. ckptd.Error NOT_FOUND for a rank the step does not have."""
        return self._reader.extra(ckptd._as_uint(rank, "rank"))

    def read(self, name, shard=None, out=None):
        """Tensor ``name`` as a CPU torch tensor: the whole global tensor (into ``out`` when given:
        contiguous, CPU, of its dtype and shape), or the region a ``ckptd.Shard`` /
        ``ckptd.FlatShard`` describes, read into that shard's tensor and returned. Every checksum
        piece read is verified: ckptd.Error NOT_FOUND for an unknown tensor, DATA_LOSS for damaged
        bytes, INVALID_ARGUMENT for a region or destination that does not fit; each names the
        tensor."""
        torch = ckptd._import_torch()
        info = self.tensors.get(name)
        if info is None:
            raise _error("job '%s' step %d has no tensor '%s' (%d tensors; e.g. %s)"
                         % (self.job, self.step, name, len(self.tensors),
                            ", ".join(repr(n) for n in list(self.tensors)[:3]) or "none"),
                         "NOT_FOUND")
        if shard is None:
            kind, global_shape, offsets, lengths, flat_offset, numel = (
                "whole", list(info.shape), [], [], 0, 0)
            if out is None:
                out = torch.empty(info.shape, dtype=info.dtype)
            elif tuple(out.shape) != info.shape:
                raise _error("tensor '%s': out has shape %s, the tensor %s"
                             % (name, tuple(out.shape), info.shape))
        else:
            if out is not None:
                raise _error("tensor '%s': give the destination as the shard's tensor, not out"
                             % name)
            if not isinstance(shard, (ckptd.Shard, ckptd.FlatShard)):
                raise _error("tensor '%s': shard must be a ckptd.Shard or ckptd.FlatShard, not %s"
                             % (name, type(shard).__name__))
            out, kind, global_shape, offsets, lengths, flat_offset, numel = _region(shard, torch)
            if tuple(global_shape) != info.shape:
                raise _error("tensor '%s': the shard's global_shape %s differs from the stored %s"
                             % (name, tuple(global_shape), info.shape))
        if out.dtype != info.dtype:
            raise _error("tensor '%s': the destination is %s, the stored tensor %s"
                         % (name, out.dtype, info.dtype))
        if out.device.type != "cpu":
            raise _error("tensor '%s': offline reads go to CPU tensors, not %s" % (name, out.device))
        # A non-contiguous destination gets a contiguous copy of its region, copied back after.
        target = out if out.is_contiguous() else torch.empty(out.shape, dtype=out.dtype)
        self._reader.read(name, self._dtype_names[name], global_shape, kind, offsets, lengths,
                          flat_offset, numel, target.data_ptr(),
                          target.numel() * target.element_size())
        if target is not out:
            out.copy_(target)
        return out

    def names(self, what="all", tensors=None):
        """Tensor names in manifest order: ``what`` "all", "model" (everything but
        ``optimizer.state.*`` and a Checkpointer's optimizer layouts, ``ckptd.optimizer_layout.*``)
        or "optimizer" (only ``optimizer.state.*``); ``tensors`` an optional glob (fnmatch) or a
        callable taking the name."""
        if what not in ("all", "model", "optimizer"):
            raise _error('what must be "all", "model" or "optimizer", not %r' % (what,))
        out = []
        for name in self.tensors:
            optimizer = name.startswith(OPTIMIZER_PREFIX)
            if what != "all" and name.startswith(checkpointer_meta.LAYOUT_PREFIX):
                continue
            if (what == "model" and optimizer) or (what == "optimizer" and not optimizer):
                continue
            if tensors is not None and not (tensors(name) if callable(tensors)
                                            else fnmatch.fnmatchcase(name, tensors)):
                continue
            out.append(name)
        return out

    def state_dict(self, prefix_filter=None, what="all"):
        """{name: tensor} of every whole tensor selected: ``prefix_filter`` a name prefix (a
        string), a callable taking the name, or None (all); ``what`` as in :meth:`names`. Names
        are kept as stored. Partial tensors (saved in part on purpose) cannot be read whole and
        raise; leave them out with the filter."""
        if isinstance(prefix_filter, str):
            prefix = prefix_filter
            prefix_filter = lambda name: name.startswith(prefix)  # noqa: E731
        elif prefix_filter is not None and not callable(prefix_filter):
            raise _error("prefix_filter must be a string, a callable or None, not %r"
                         % (prefix_filter,))
        return {name: self.read(name) for name in self.names(what, prefix_filter)}

    def verify(self):
        """Reads every stored byte and checks every checksum (what ``ckptctl verify`` does):
        one line per problem, [] when the step is intact."""
        return list(self._reader.verify())

    def _read_layout(self, name, size):
        """The bytes of a Checkpointer's optimizer layout tensor (checkpointer_meta format 3;
        decode checks them against the name)."""
        if name not in self.tensors:
            raise ValueError("its optimizer layout tensor %r is not in the step" % name)
        return self.read(name).numpy().tobytes()

    def checkpointer_meta(self, rank=0):
        """The metadata ckptd.torch.Checkpointer pickled into ``rank``'s extra blob (a dict with
        ``model_other``, ``optimizer`` and ``extra_state``), or None when the step was not written
        by a Checkpointer. Unpickles: read only checkpoints you trust."""
        if rank not in self._meta:
            meta = None
            blob = self.extras(rank)
            if blob:
                try:
                    meta = checkpointer_meta.decode(blob, self._read_layout)
                except ValueError:  # a blob of another writer: not ours to judge
                    meta = None
            self._meta[rank] = meta
        return self._meta[rank]

    # -- conversions --------------------------------------------------------------------------

    def model_state_dict(self):
        """The model's state_dict: every tensor but ``optimizer.state.*`` and, for a Checkpointer
        checkpoint, the model's non-tensor entries (``get_extra_state``) from rank 0's blob."""
        out = self.state_dict(what="model")
        meta = self.checkpointer_meta()
        if meta and meta.get("model_other"):
            out.update(meta["model_other"])
        return out

    def optimizer_state_dict(self, keep=None):
        """The optimizer's state_dict in PyTorch's own format — ``{"state": {index: {key: value}},
        "param_groups": [{..., "params": [index, ...]}]}`` with indices in param_groups order — as
        ``optimizer.load_state_dict`` takes it, rebuilt from a Checkpointer's metadata (rank 0's
        param_groups and state layout) and the stored whole state tensors. Also returns the
        parameter names in index order. ckptd.Error FAILED_PRECONDITION for a step that was not
        written by ckptd.torch.Checkpointer. ``keep`` (a callable taking the stored tensor name,
        ``optimizer.state.<param name>.<key>``) leaves out the state tensors it refuses, and a
        parameter's non-tensor state with the last of them."""
        meta = self.checkpointer_meta()
        if meta is None:
            raise _error("job '%s' step %d was not written by ckptd.torch.Checkpointer: it has no "
                         "optimizer metadata" % (self.job, self.step), "FAILED_PRECONDITION")
        saved = meta["optimizer"]
        groups, names = [], []
        for g in saved["param_groups"]:
            entry = {k: v for k, v in g.items() if k != "params"}
            entry["params"] = list(range(len(names), len(names) + len(g["params"])))
            names.extend(g["params"])
            groups.append(entry)
        state = {}
        for index, pname in enumerate(names):
            entries = saved["state"].get(pname)
            if not entries:
                continue
            st, kept_tensor = {}, keep is None
            for key, entry in entries.items():
                if entry[0] == "value":
                    st[key] = entry[1]
                    continue
                name = "%s%s.%s" % (OPTIMIZER_PREFIX, pname, key)
                if keep is None or keep(name):
                    st[key] = self.read(name)
                    kept_tensor = True
            if kept_tensor:
                state[index] = st
        return {"state": state, "param_groups": groups}, names


def to_torch_save(root, job, step, path, what="model"):
    """Writes committed ``step`` of ``job`` (None: the newest) as a ``torch.save`` file at
    ``path`` (written to ``path``.tmp, fsync'd, renamed). ``what``:

    - "model": the model's state_dict only (:meth:`Checkpoint.model_state_dict`) — every tensor
      but ``optimizer.state.*``, plus the model's non-tensor state of a Checkpointer checkpoint;
      ``model.load_state_dict(torch.load(path))`` takes it;
    - "checkpointer": ``{"model": ..., "optimizer": ..., "extra_state": ..., "param_names":
      [...]}`` — the optimizer state_dict in PyTorch's own format
      (:meth:`Checkpoint.optimizer_state_dict`), ``extra_state`` as the Checkpointer saved it
      (rank 0's), ``param_names`` the parameter name of each optimizer index (what
      :func:`from_torch_save` maps them back with).

    Returns the step written."""
    torch = ckptd._import_torch()
    if what not in ("model", "checkpointer"):
        raise _error('what must be "model" or "checkpointer", not %r' % (what,))
    ck = open(root, job, step)
    if what == "model":
        obj = ck.model_state_dict()
    else:
        optimizer, names = ck.optimizer_state_dict()
        meta = ck.checkpointer_meta()
        obj = {"model": ck.model_state_dict(), "optimizer": optimizer,
               "extra_state": meta.get("extra_state"), "param_names": names}
    _atomic_torch_save(obj, path, torch)
    return ck.step


def _atomic_torch_save(obj, path, torch):
    """torch.save(obj) to ``path``.tmp, fsync'd, renamed over ``path``, directory synced: a reader
    sees the old file or the whole new one, never a torn one."""
    path = os.fspath(path)
    tmp = path + ".tmp"
    try:
        with builtins.open(tmp, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    directory = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


def _is_bundle(obj):
    """A {"model": state_dict, "optimizer": ...} file, rather than a plain state_dict (whose values
    are tensors, never dicts)."""
    return isinstance(obj, dict) and isinstance(obj.get("model"), dict)


def _optimizer_meta(optimizer, model, param_names, torch):
    """(Checkpointer optimizer metadata, {tensor name: tensor}) of a PyTorch optimizer state_dict
    whose integer ids are named by ``param_names`` (in param_groups order)."""
    groups, meta_state, tensors = [], {}, {}
    ids = [i for g in optimizer["param_groups"] for i in g["params"]]
    if len(param_names) != len(ids):
        raise _error("the optimizer has %d params, param_names names %d"
                     % (len(ids), len(param_names)))
    name_of = dict(zip(ids, param_names))
    for g in optimizer["param_groups"]:
        entry = {k: v for k, v in g.items() if k not in ("params", "param_names")}
        entry["params"] = [name_of[i] for i in g["params"]]
        groups.append(entry)
    for i, st in optimizer["state"].items():
        if i not in name_of:
            raise _error("the optimizer has state for param %r, which no param group holds" % (i,))
        pname = name_of[i]
        param = model.get(pname)
        entries = {}
        for key, v in st.items():
            if isinstance(v, torch.Tensor):
                like_param = isinstance(param, torch.Tensor) and tuple(v.shape) == tuple(
                    param.shape)
                entries[key] = ("tensor", ckptd.dtype_name(v.dtype), tuple(v.shape), like_param)
                tensors["%s%s.%s" % (OPTIMIZER_PREFIX, pname, key)] = v
            else:
                entries[key] = ("value", v)
        meta_state[pname] = entries
    return {"param_groups": groups, "state": meta_state, "order": list(param_names)}, tensors


def from_torch_save(path, root, job, step, param_names=None):
    """Writes a committed checkpoint of ``job`` at ``step`` (world size 1) from the ``torch.save``
    file ``path`` (loaded with ``map_location="cpu"``): either a model state_dict, or
    ``{"model": state_dict, "optimizer": optimizer state_dict[, "extra_state": ...]}`` (what
    ``to_torch_save(what="checkpointer")`` writes). The step is laid out as
    ckptd.torch.Checkpointer saves: state_dict names, ``optimizer.state.<param name>.<key>``, and
    the metadata a Checkpointer restores from in rank 0's extra blob — so ``Checkpointer.load``
    restores it (a plain state_dict carries no optimizer: restore it with ``optimizer=None``, or
    with ``ckptd.Client.load`` of the model's tensors). The optimizer's integer param ids are named
    by ``param_names`` (e.g. ``[n for n, _ in model.named_parameters()]``), else by the file's
    ``param_names`` (or param_groups' ``param_names``). ``step`` must come after the job's newest
    committed step. Durable like a daemon's commit: data file synced, MANIFEST last, then LATEST.
    Returns the step directory."""
    torch = ckptd._import_torch()
    step = ckptd._as_uint(step, "step")
    obj = torch.load(os.fspath(path), map_location="cpu")
    optimizer, extra_state = None, None
    if _is_bundle(obj):
        model, optimizer, extra_state = obj["model"], obj.get("optimizer"), obj.get("extra_state")
    elif isinstance(obj, dict):
        model = obj
    else:
        raise _error("%s holds a %s, not a state_dict or {\"model\": ..., \"optimizer\": ...}"
                     % (path, type(obj).__name__))
    tensors, model_other = {}, {}
    for name, v in model.items():
        if not isinstance(name, str):
            raise _error("state_dict key %r is not a string" % (name,))
        if isinstance(v, torch.Tensor):
            tensors[name] = v
        else:
            model_other[name] = v
    opt_meta = {"param_groups": [], "state": {}, "order": []}
    if optimizer is not None:
        if param_names is None:
            param_names = obj.get("param_names")
        if param_names is None and all("param_names" in g for g in optimizer["param_groups"]):
            param_names = [n for g in optimizer["param_groups"] for n in g["param_names"]]
        if param_names is None:
            raise _error("the optimizer state_dict numbers its params: pass param_names (e.g. "
                         "[n for n, _ in model.named_parameters()]) to name them")
        opt_meta, opt_tensors = _optimizer_meta(optimizer, model, list(param_names), torch)
        for name, t in opt_tensors.items():
            if name in tensors:
                raise _error("optimizer state name %r collides with a model tensor" % name)
            tensors[name] = t
    meta = {"format": _CHECKPOINTER_FORMAT, "step": step, "model_other": model_other,
            "optimizer": opt_meta, "extra_state": extra_state}
    extra = pickle.dumps(meta, protocol=pickle.HIGHEST_PROTOCOL)
    specs, keep = [], []
    for name, t in tensors.items():
        if t.device.type != "cpu" or t.is_sparse or t.layout != torch.strided:
            raise _error("tensor '%s': only dense CPU tensors can be written" % name)
        try:
            dtype = ckptd.dtype_name(t.dtype)
        except ckptd.Error as e:
            raise _error("tensor '%s': %s" % (name, e)) from None
        t = t.detach().contiguous()
        keep.append(t)  # alive until the write returned: the native writer reads its memory
        specs.append((name, dtype, [int(d) for d in t.shape], t.data_ptr(),
                      t.numel() * t.element_size()))
    _ckptd.offline_write(os.fspath(root), job, step, specs, extra, "ckptd.offline.from_torch_save")
    return _ckptd.offline_step_dir(os.fspath(root), job, step)


# -- whole-checkpoint reads, export and import (ckptd.load_checkpoint, ckptctl export / import) --

def load_checkpoint(step_dir, names=None):
    """{name: full CPU tensor} of the committed step directory ``step_dir``
    (``<root>/<job>/step-<step:010d>``), read from storage with no daemon: every tensor, or those
    in ``names``, each assembled whole from whatever shards the ranks stored, every checksum piece
    verified. ckptd.Error NOT_FOUND for a directory without a MANIFEST or an unknown name,
    DATA_LOSS for damaged bytes, FAILED_PRECONDITION for a tensor saved only in part on purpose
    (it has no whole value: ask for the others by ``names``, or read its regions with
    :meth:`Checkpoint.read`). Unlike :meth:`Checkpoint.model_state_dict` this returns tensors
    only, optimizer state included, under their stored names, and unpickles nothing."""
    ck = Checkpoint(step_dir)
    if names is None:
        names = list(ck.tensors)
        partial = [n for n in names if ck.tensors[n].partial]
        if partial:
            raise _error("job '%s' step %d: tensor%s %s %s saved in part on purpose and cannot be "
                         "read whole; pass names= without %s"
                         % (ck.job, ck.step, "s" if len(partial) > 1 else "",
                            ", ".join(repr(n) for n in partial[:3]),
                            "were" if len(partial) > 1 else "was",
                            "them" if len(partial) > 1 else "it"), "FAILED_PRECONDITION")
    elif isinstance(names, str):
        raise _error("names must be a list of tensor names, not the string %r" % (names,))
    return {name: ck.read(name) for name in names}


class Selection:
    """Which tensors an export writes — the same rule as ``ckptctl export`` (client/ckptctl/
    export_commands.cc): model tensors always; optimizer state (``optimizer.state.*``) only with
    ``include_optimizer``; ``only`` a name prefix, matched against a model tensor's name and
    against the parameter name of optimizer state (so ``only="encoder."`` keeps the encoder's
    weights and, with the optimizer, their Adam moments); ``tensors`` a glob (fnmatch, ``*``
    matches dots too) matched against the stored name. Callable on a stored name."""

    def __init__(self, include_optimizer=False, only=None, tensors=None):
        self.include_optimizer = bool(include_optimizer)
        self.only = only or None
        self.tensors = tensors or None

    def __call__(self, name):
        subject = name
        if name.startswith(OPTIMIZER_PREFIX):
            if not self.include_optimizer:
                return False
            subject = name[len(OPTIMIZER_PREFIX):]
        if self.only is not None and not (subject.startswith(self.only)
                                          or name.startswith(self.only)):
            return False
        return self.tensors is None or fnmatch.fnmatchcase(name, self.tensors)

    @property
    def filters(self):
        """Whether ``only`` or ``tensors`` narrows the selection."""
        return self.only is not None or self.tensors is not None

    def __str__(self):
        parts = ["--include-optimizer" if self.include_optimizer else "model weights only"]
        if self.only is not None:
            parts.append("--only %r" % self.only)
        if self.tensors is not None:
            parts.append("--tensors %r" % self.tensors)
        return " ".join(parts)


def export_torch(step_dir, path, selection=None):
    """Writes the committed step directory ``step_dir`` (or an open :class:`Checkpoint`) as a
    ``torch.save`` file at ``path`` (``path``.tmp, fsync'd, renamed) and returns (the
    :class:`Checkpoint`, tensors written, their bytes). ``selection`` a
    :class:`Selection` (default: model weights only). What the file holds:

    - without the optimizer: the model's state_dict ``{name: tensor}`` —
      ``model.load_state_dict(torch.load(path))`` takes it; with no filter, the model's non-tensor
      state of a Checkpointer checkpoint too;
    - with ``include_optimizer``, for a checkpoint written by ckptd.torch.Checkpointer:
      ``{"model": ..., "optimizer": ..., "extra_state": ..., "param_names": [...]}`` as
      :func:`to_torch_save` ``what="checkpointer"`` writes it (the optimizer state cut to the
      selection), which ``ckptctl import`` reads back;
    - with ``include_optimizer``, for any other checkpoint: one flat ``{name: tensor}``, optimizer
      state under its stored names.

    ckptd.Error NOT_FOUND when nothing is selected (no file is written)."""
    torch = ckptd._import_torch()
    selection = selection or Selection()
    ck = step_dir if isinstance(step_dir, Checkpoint) else Checkpoint(step_dir)
    meta = ck.checkpointer_meta() if selection.include_optimizer or not selection.filters else None
    model_names = [n for n in ck.names("model") if selection(n)]
    optimizer_names = [n for n in ck.names("optimizer") if selection(n)]
    if not model_names and not optimizer_names:
        raise _error("no tensor of job '%s' step %d (%s) matches %s (%d tensors in the checkpoint)"
                     % (ck.job, ck.step, ck.path, selection, len(ck.tensors)), "NOT_FOUND")
    model = {n: ck.read(n) for n in model_names}
    if not selection.filters and meta and meta.get("model_other"):
        model.update(meta["model_other"])
    if not selection.include_optimizer:
        obj = model
    elif meta is not None:
        optimizer, names = ck.optimizer_state_dict(keep=selection)
        obj = {"model": model, "optimizer": optimizer, "extra_state": meta.get("extra_state"),
               "param_names": names}
    else:
        obj = dict(model)
        obj.update((n, ck.read(n)) for n in optimizer_names)
    _atomic_torch_save(obj, path, torch)
    written = model_names + optimizer_names
    nbytes = 0
    for n in written:
        info = ck.tensors[n]
        numel = 1
        for d in info.shape:
            numel *= d
        nbytes += numel * torch.empty((), dtype=info.dtype).element_size()
    return ck, len(written), nbytes


def import_torch(path, root, job, step=None, param_names=None):
    """:func:`from_torch_save` with ``step`` None meaning the step after the job's newest committed
    one (0 for a new job). Returns (step, step directory)."""
    if step is None:
        committed = steps(root, job)
        step = committed[-1] + 1 if committed else 0
    return step, from_torch_save(path, root, job, step, param_names=param_names)


def main(argv=None, prog=None):
    """The command line of ``ckptctl export --format torch`` and ``ckptctl import`` (ckptctl runs
    it with the same arguments) — also ``python3 -m ckptd.offline``. Exit codes as ckptctl's: 0
    done, 1 the conversion failed (damaged data, nothing selected, an unreadable file), 2 usage
    errors and checkpoints that cannot be opened."""
    import argparse
    import sys

    parser = argparse.ArgumentParser(
        prog=prog or "python3 -m ckptd.offline",
        description="Convert ckptd checkpoints to and from torch.save files, with no daemon "
        "running.")
    sub = parser.add_subparsers(dest="command", required=True)
    exp = sub.add_parser("export", help="write a committed step as a torch.save file")
    exp.add_argument("dir", metavar="DIR", help="committed step directory")
    exp.add_argument("--out", required=True, help="output file (FILE.tmp, then renamed)")
    exp.add_argument("--include-optimizer", action="store_true",
                     help="add the optimizer state (default: model weights only)")
    exp.add_argument("--only", metavar="PREFIX", help="only tensors whose name (or parameter "
                     "name, for optimizer state) starts with PREFIX")
    exp.add_argument("--tensors", metavar="GLOB", help="only tensors whose stored names match")
    imp = sub.add_parser("import", help="write a torch.save file as a committed ckptd step")
    imp.add_argument("file", metavar="FILE", help="a torch.save state_dict, or {\"model\": ..., "
                     "\"optimizer\": ..., \"param_names\": [...]}")
    imp.add_argument("--storage-root", required=True, help="the daemon's storage root")
    imp.add_argument("--job", required=True, help="job name")
    imp.add_argument("--step", type=int, help="step to write (default: after the newest "
                     "committed step of the job, 0 for a new job)")
    args = parser.parse_args(argv)
    name = prog or "ckptd.offline"

    def fail(message, rc):
        sys.stderr.write("%s: error: %s\n" % (name, message))
        return rc

    if args.command == "export":
        if args.only is not None and args.only in ("model", "optimizer", "all"):
            return fail(_OLD_ONLY % {"value": args.only}, 2)
        try:
            ck = Checkpoint(args.dir)
        except ckptd.Error as e:
            return fail("cannot open checkpoint %s: %s" % (args.dir, e), 2)
        try:
            ck, count, nbytes = export_torch(
                ck, args.out, Selection(args.include_optimizer, args.only, args.tensors))
        except Exception as e:  # noqa: BLE001 - a command line reports, it does not trace back
            return fail("exporting %s to %s: %s" % (args.dir, args.out, _describe_error(e)), 1)
        print("exported %d of %d tensors (%d bytes) of job %s step %d to %s"
              % (count, len(ck.tensors), nbytes, ck.job, ck.step, args.out))
        return 0
    try:
        step, step_dir = import_torch(args.file, args.storage_root, args.job, args.step)
    except Exception as e:  # noqa: BLE001 - torch.load of a foreign file raises many kinds
        return fail("importing %s into job '%s' under %s: %s"
                    % (args.file, args.job, args.storage_root, _describe_error(e)), 1)
    print("imported %s as job %s step %d: %s" % (args.file, args.job, step, step_dir))
    return 0


def _describe_error(e):
    """ckptd.Error's message as is; any other exception with its type, which often says more
    than its text (a KeyError's is just the key)."""
    return str(e) if isinstance(e, ckptd.Error) else "%s: %s" % (type(e).__name__, e)


# The old export selection (--only model|optimizer|all) and what replaced it; ckptctl says the
# same (client/ckptctl/export_commands.cc).
_OLD_ONLY = ("--only takes a name prefix now, not '%(value)s': model weights are exported by "
             "default, --include-optimizer adds the optimizer state, and --only PREFIX / --tensors "
             "GLOB narrow by name (for tensors whose names start with '%(value)s', write --only "
             "'%(value)s.')")


if __name__ == "__main__":
    import sys
    sys.exit(main())
