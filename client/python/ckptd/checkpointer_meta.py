"""The metadata ckptd.torch.Checkpointer keeps beside the tensors, and its three formats.

The blob is what a restore needs beyond the tensors: the model's non-tensor state, the
optimizer's param groups (hyper-parameters and the names of their params), the dtype and shape
of every optimizer state tensor (so a fresh optimizer can be rebuilt), non-tensor optimizer
state, and the user's ``extra_state``.

Format 1 pickled all of it into each rank's extra blob at every save. At 10,000 tensors the
optimizer's layout is ~170 KB and its pickling ~2 ms of every save, though it changes only when
the layout does. Format 2 pickles that static part once per layout (``static_blob``) and embeds
the bytes; a save pickles only what changes between steps (hyper-parameters, non-tensor
optimizer state, extra_state) around it. It still sent the ~170 KB with every save (~1 ms of the
save request at 10,000 tensors). Format 3 keeps the static part in a tensor of its own, uint8,
registered and checkpointed like the others: ``layout_name`` names it by its content
(``ckptd.optimizer_layout.<blake2b-128>``), so data-parallel ranks with the same layout hold one
tensor that the write-once plan stores once, and the extra blob names it and its size. ``decode``
reads every format and always returns format 1's shape; format 3 needs the tensor's bytes, which
the caller reads (``read_layout``):

    {"format": 1, "step", "model_other", "extra_state",
     "optimizer": {"param_groups": [{..., "params": [names]}],
                   "state": {param name: {key: ("tensor", dtype, shape, like_param)
                                               | ("value", v)}},
                   "order": [param names]}}

Unpickling runs code: load only checkpoints you trust.
"""

import hashlib
import pickle

FORMAT = 3
_PROTOCOL = pickle.HIGHEST_PROTOCOL
# The names of format 3's layout tensors; neither model nor optimizer state.
LAYOUT_PREFIX = "ckptd.optimizer_layout."


def static_blob(opt_state, order, group_names):
    """The optimizer layout of one walk: state entries (non-tensor values left out: they are
    ``dynamic``), the params' order, each group's param names."""
    tensors_only = {pname: {k: e for k, e in entries.items() if e[0] == "tensor"}
                    for pname, entries in opt_state.items()}
    return pickle.dumps({"state": tensors_only, "order": order, "group_names": group_names},
                        protocol=_PROTOCOL)


def layout_name(static):
    """The name of the tensor that holds ``static`` (format 3): the same bytes, the same name."""
    return LAYOUT_PREFIX + hashlib.blake2b(static, digest_size=16).hexdigest()


def encode(step, model_other, layout, param_groups, dynamic, extra_state):
    """The blob of one save. ``layout``: (name, size) of the tensor holding the walk's
    static_blob; ``param_groups``: each group's entries but "params"; ``dynamic``: {param name:
    {key: value}} of non-tensor optimizer state."""
    return pickle.dumps({"format": FORMAT, "step": step, "model_other": model_other,
                         "optimizer_layout": tuple(layout), "param_groups": param_groups,
                         "dynamic_state": dynamic, "extra_state": extra_state},
                        protocol=_PROTOCOL)


def decode(blob, read_layout=None):
    """Format 1's dict from a blob of any format; ValueError when the blob is not a
    Checkpointer's (another writer, a newer format). ``read_layout(name, size)`` returns the bytes
    of a format 3 layout tensor (None: a format 3 blob raises ValueError)."""
    try:
        meta = pickle.loads(blob)
    except Exception as e:  # noqa: BLE001 - anything unpicklable is the same problem
        raise ValueError("not a ckptd.torch checkpoint (%s)" % e) from None
    if not isinstance(meta, dict):
        raise ValueError("not a ckptd.torch checkpoint")
    if meta.get("format") == 1:
        return meta
    if meta.get("format") == 2:
        static = meta["optimizer_static"]
    elif meta.get("format") == FORMAT:
        name, size = meta["optimizer_layout"]
        if read_layout is None:
            raise ValueError("a format %d blob needs its layout tensor %r" % (FORMAT, name))
        static = read_layout(name, size)
        if layout_name(static) != name:
            raise ValueError("layout tensor %r holds other bytes than its name says" % name)
    else:
        raise ValueError("written by ckptd.torch.Checkpointer format %r, this one reads 1 to %d"
                         % (meta.get("format"), FORMAT))
    static = pickle.loads(static)
    state = {pname: dict(entries) for pname, entries in static["state"].items()}
    for pname, values in meta["dynamic_state"].items():
        entries = state.setdefault(pname, {})
        for key, value in values.items():
            entries[key] = ("value", value)
    groups = [dict(g, params=names)
              for g, names in zip(meta["param_groups"], static["group_names"])]
    return {"format": 1, "step": meta["step"], "model_other": meta["model_other"],
            "extra_state": meta["extra_state"],
            "optimizer": {"param_groups": groups, "state": state, "order": static["order"]}}
