"""The metadata ckptd.torch.Checkpointer keeps in each rank's extra blob, and its two formats.

The blob is what a restore needs beyond the tensors: the model's non-tensor state, the
optimizer's param groups (hyper-parameters and the names of their params), the dtype and shape
of every optimizer state tensor (so a fresh optimizer can be rebuilt), non-tensor optimizer
state, and the user's ``extra_state``.

Format 1 pickled all of it at every save. At 10,000 tensors the optimizer's layout is ~170 KB
and its pickling ~2 ms of every save, though it changes only when the layout does. Format 2
pickles that static part once per layout (``static_blob``) and embeds the bytes; a save pickles
only what changes between steps (hyper-parameters, non-tensor optimizer state, extra_state)
around it. ``decode`` reads both formats and always returns format 1's shape:

    {"format": 1, "step", "model_other", "extra_state",
     "optimizer": {"param_groups": [{..., "params": [names]}],
                   "state": {param name: {key: ("tensor", dtype, shape, like_param)
                                               | ("value", v)}},
                   "order": [param names]}}

Unpickling runs code: load only checkpoints you trust.
"""

import pickle

FORMAT = 2
_PROTOCOL = pickle.HIGHEST_PROTOCOL


def static_blob(opt_state, order, group_names):
    """The optimizer layout of one walk: state entries (non-tensor values left out: they are
    ``dynamic``), the params' order, each group's param names."""
    tensors_only = {pname: {k: e for k, e in entries.items() if e[0] == "tensor"}
                    for pname, entries in opt_state.items()}
    return pickle.dumps({"state": tensors_only, "order": order, "group_names": group_names},
                        protocol=_PROTOCOL)


def encode(step, model_other, static, param_groups, dynamic, extra_state):
    """The blob of one save. ``param_groups``: each group's entries but "params";
    ``dynamic``: {param name: {key: value}} of non-tensor optimizer state."""
    return pickle.dumps({"format": FORMAT, "step": step, "model_other": model_other,
                         "optimizer_static": static, "param_groups": param_groups,
                         "dynamic_state": dynamic, "extra_state": extra_state},
                        protocol=_PROTOCOL)


def decode(blob):
    """Format 1's dict from a blob of either format; ValueError when the blob is not a
    Checkpointer's (another writer, a newer format)."""
    try:
        meta = pickle.loads(blob)
    except Exception as e:  # noqa: BLE001 - anything unpicklable is the same problem
        raise ValueError("not a ckptd.torch checkpoint (%s)" % e) from None
    if not isinstance(meta, dict):
        raise ValueError("not a ckptd.torch checkpoint")
    if meta.get("format") == 1:
        return meta
    if meta.get("format") != FORMAT:
        raise ValueError("written by ckptd.torch.Checkpointer format %r, this one reads 1 and %d"
                         % (meta.get("format"), FORMAT))
    static = pickle.loads(meta["optimizer_static"])
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
