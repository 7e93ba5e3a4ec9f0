"""ckptd.arena — pack many small CPU tensors into a few big shared-memory storages ("arenas").

    import ckptd.arena
    tensors = list(model.parameters()) + [v for st in optimizer.state.values()
                                          for v in st.values() if isinstance(v, torch.Tensor)]
    keep = ckptd.arena.move_into_arenas(tensors)   # hold on to `keep` as long as the tensors

Why. ckptd hands the daemon file descriptors of CPU tensors' shared memory, never bytes. Moved
into shared memory one by one (``Tensor.share_memory_()``), every storage becomes a
shared-memory object of its own whose descriptor PyTorch keeps open for the storage's whole
life: a model whose parameters and optimizer state make 10,000 tensors holds 10,000 descriptors
(enough to run a process out of them), and the daemon maps 10,000 objects. After
:func:`move_into_arenas` those tensors are views into a few arenas of up to ``arena_bytes``
each, so:

- the descriptors are bounded by the total size (one per arena), not by the number of tensors;
- the daemon maps each arena once (it dedupes mappings by the object's st_dev/st_ino) and
  registers every tensor as an offset into it;
- nothing is copied at save or restore time: the tensors already live in shared memory, so the
  daemon reads (and a load writes) them where training uses them.

What it costs: one copy of each moved tensor's bytes, once (normally at the first save), and up
to 63 bytes of padding per tensor. The old storages are freed as the tensors leave them, arena by
arena, so the peak is at most one arena above the model's size.

The rules — a tensor is moved only when all of these hold, and is otherwise left as it is
(``Client.save`` then shares it the usual way, with its own descriptor):

(a) it is a dense (strided) CPU tensor: CUDA tensors are handed over as CUDA IPC handles, and
    other devices and layouts are not ckptd's to move;
(b) it is not in shared memory yet (``is_shared()`` false): an already shared tensor has its
    descriptor already, and someone may have shared it on purpose (a DataLoader worker, another
    process) — moving it would cut that link;
(c) it is contiguous and alone covers its whole storage (storage offset 0, storage size ==
    numel * element size), with no conjugate/negative view bit. A tensor that is a view of a bigger
    buffer (FSDP/ZeRO flat parameters, a slice) is skipped with every other input tensor on that
    storage: moving it would detach it from the buffer that the rest of the program writes. The
    same object given twice (tied weights: one Parameter in two modules) is one tensor, moved
    once. Several distinct tensor objects that each cover the whole of one storage (``w`` and
    ``w.view(-1)``) are moved together onto one slice, so they still alias each other;
(d) it is non-empty: an empty tensor owns no memory (ckptd registers it without any).

How. Each moved tensor's values are copied into a 64-byte aligned slice of an arena (the
arena's bytes viewed as the tensor's dtype and shape), and the tensor is made that slice in place
with ``t.data = slice``. An arena holds one dtype: torch.save refuses tensors that view one
storage as different types, and a model moved into arenas must still torch.save as before.
The Python object stays the same: an ``nn.Parameter`` stays the Parameter the optimizer's
param_groups and ``optimizer.state`` keys refer to, and a plain state tensor
(``optimizer.state[p]["exp_avg"]``) stays the object its dict holds; autograd and in-place
optimizer updates then work on the arena's memory. Arenas are sized to what they hold (never more
than ``arena_bytes``; a tensor larger than that gets an arena of its own) and are filled in input
order, so neighbouring tensors stay neighbours.

Only the tensor objects given are re-pointed: any other tensor that viewed the same memory
(a ``p.data`` kept aside somewhere, a ``.view`` taken before the move) keeps the old storage and
no longer aliases the moved tensor. Give every alias that must stay one, or move before such
views are taken (model construction and the first optimizer step are over before the first
save, which is when the Checkpointer moves).

Later changes. When a user later gives a moved tensor new memory (``param.data = new``), the
tensor leaves the arena; the next save's layout check in ``ckptd.Client`` sees the new data_ptr
and re-registers that tensor with shared memory of its own. Its old slice is then just unused
memory, freed with the arena once every view of it is gone — the returned arena storages, which
the caller keeps so that the memory the daemon has mapped stays owned, and any tensor still
viewing it.
"""

__all__ = ["move_into_arenas", "ALIGNMENT"]

# Every slice starts at a multiple of this many bytes: a cache line, and a multiple of every
# element size ckptd knows (the element size is honoured too, should a larger one come).
ALIGNMENT = 64


def _round_up(n, multiple):
    return (n + multiple - 1) // multiple * multiple


def _storage_of(t):
    """The storage object under ``t`` (torch >= 2.0: UntypedStorage; 1.13: TypedStorage)."""
    return t.untyped_storage() if hasattr(t, "untyped_storage") else t.storage()


def _storage_nbytes(t):
    return _storage_of(t).nbytes()


def _new_shared_bytes(torch, nbytes):
    """(storage, uint8 tensor over all of it) of a new shared-memory object of ``nbytes`` bytes,
    zero-filled by the kernel, pages faulted in on first touch (by the daemon's copy, for a
    load target: nothing is written twice)."""
    try:
        storage = torch.UntypedStorage._new_shared(nbytes)
    except (AttributeError, TypeError, RuntimeError):  # a torch without it: share a fresh one
        data = torch.empty(nbytes, dtype=torch.uint8).share_memory_()
        return _storage_of(data), data
    data = torch.empty(0, dtype=torch.uint8)
    try:
        data.set_(storage)
    except (TypeError, RuntimeError):  # a torch whose set_ wants a typed storage
        data.set_(torch.TypedStorage(wrap_storage=storage, dtype=torch.uint8))
    return storage, data


def _movable(torch, t):
    """Rules (a)-(d) of the module docstring that one tensor can be judged on by itself:
    whether ``t`` is a dense, non-empty CPU tensor outside shared memory that is contiguous and
    covers its whole storage."""
    if t.device.type != "cpu" or t.layout != torch.strided or t.is_quantized:
        return False
    if t.is_conj() or t.is_neg():   # lazy views: .data would drop the bit, not the values
        return False
    if t.grad_fn is not None:       # an autograd intermediate, not a parameter or state
        return False
    if t.is_shared():
        return False
    nbytes = t.numel() * t.element_size()
    if nbytes == 0:
        return False
    return (t.is_contiguous() and t.storage_offset() == 0
            and _storage_nbytes(t) == nbytes)


def _plan(torch, tensors):
    """[(nbytes, element_size, [tensors sharing one storage])] to move, in input order."""
    groups = {}     # storage data_ptr -> {id(tensor): tensor}, in input order
    seen = set()
    for t in tensors:
        if not isinstance(t, torch.Tensor):
            raise TypeError("move_into_arenas takes torch tensors, not %s" % type(t).__name__)
        if id(t) in seen:
            continue
        seen.add(id(t))
        if t.device.type != "cpu" or t.layout != torch.strided or t.numel() == 0:
            continue
        groups.setdefault(_storage_of(t).data_ptr(), {})[id(t)] = t
    plan = []
    for group in groups.values():
        members = list(group.values())
        # Every alias on the storage must be movable as a whole, or none is moved (rule c).
        if all(_movable(torch, t) for t in members):
            nbytes = members[0].numel() * members[0].element_size()
            element = max(t.element_size() for t in members)
            plan.append((nbytes, element, members))
    return plan


def _arena_layouts(plan, arena_bytes):
    """Packs the plan into arenas: [(arena nbytes, [(offset, entry)])]. Input order is kept; a
    tensor that does not fit the current arena starts the next one, and one larger than
    ``arena_bytes`` gets an arena of its own without closing the current one."""
    arenas, current, used = [], [], 0
    for entry in plan:
        nbytes, element, _ = entry
        alignment = max(ALIGNMENT, element)
        if nbytes > arena_bytes:
            arenas.append((_round_up(nbytes, ALIGNMENT), [(0, entry)]))
            continue
        offset = _round_up(used, alignment)
        if current and offset + nbytes > arena_bytes:
            arenas.append((_round_up(used, ALIGNMENT), current))
            current, offset = [], 0
        current.append((offset, entry))
        used = offset + nbytes
    if current:
        arenas.append((_round_up(used, ALIGNMENT), current))
    return arenas


def move_into_arenas(tensors, arena_bytes=1 << 30, copy=True):
    """Moves the CPU tensors of ``tensors`` (an iterable of torch tensors: parameters, optimizer
    state) that are not in shared memory into a few shared-memory arenas of at most
    ``arena_bytes`` bytes each, in place (``t.data = slice``: the same Python objects, values
    bit-identical). Tensors that the rules of the module docstring exclude are left untouched.

    Returns the arena storages, one per arena (an empty list when nothing was moved). Keep them
    as long as the tensors: they own the memory the daemon maps even after a tensor is given new
    ``.data``. TypeError for an element that is not a tensor; ValueError for a non-positive
    ``arena_bytes``. ``copy=False`` leaves the moved tensors' values undefined (zeros): for
    tensors a load is about to overwrite, which then costs no copy at all.
    """
    import torch

    arena_bytes = int(arena_bytes)
    if arena_bytes <= 0:
        raise ValueError("arena_bytes must be positive, not %d" % arena_bytes)
    # One dtype per arena: torch.save refuses tensors that view one storage as different types
    # ("Cannot save multiple tensors or storages that view the same data as different types"),
    # and a trainer that moved its model into arenas must still be able to torch.save it.
    by_dtype = {}
    for entry in _plan(torch, tensors):
        by_dtype.setdefault(entry[2][0].dtype, []).append(entry)
    layouts = [layout for entries in by_dtype.values()
               for layout in _arena_layouts(entries, arena_bytes)]
    storages = []
    with torch.no_grad():
        # One arena at a time: the old storages of its tensors are freed (when nothing else holds
        # them) before the next arena is allocated, so memory peaks one arena above the model.
        for size, placed in layouts:
            storage, data = _new_shared_bytes(torch, size)
            for offset, (nbytes, _, members) in placed:
                raw = data[offset:offset + nbytes]
                first = members[0]
                slot = raw.view(first.dtype).view(first.shape)
                if copy:
                    slot.copy_(first)
                for t in members:
                    # The same slice for every alias, each with its own dtype and shape.
                    t.data = slot if t is first else raw.view(t.dtype).view(t.shape)
            storages.append(storage)
    return storages
