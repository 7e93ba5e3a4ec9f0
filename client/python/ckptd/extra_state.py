"""What ``ckptd.torch.Checkpointer(..., extra_state=...)`` accepts, and how it is saved and put back.

Training code keeps more than model and optimizer: an LR scheduler, a ``GradScaler``, a data
loader's position, RNGs. PyTorch's convention for all of them is ``state_dict()`` /
``load_state_dict()`` (DCP calls such objects *Stateful*). ``extra_state`` takes, in order of
preference:

- a dict ``{name: object}``, each object one of: a Stateful (``state_dict``/``load_state_dict``),
  an object with ``state()``/``load(state)`` (:class:`ckptd.torch.RNGState` has both forms), or a
  plain picklable value (saved as is, given back in ``loaded_extra_state[name]``);
- one Stateful, or one object with ``state()``/``load(state)``;
- a callable returning a picklable value (nothing to load into: see ``loaded_extra_state``).

Saved in the rank's extra blob (pickled with the rest of the Checkpointer's metadata). Every rank
keeps its own: RNG streams and data-loader positions differ per rank. A restore into another
world size gives each rank the blob of the rank it replaces when that rank existed, and otherwise
that of rank ``rank % saved_world_size`` (``Checkpointer.last_restore["extra_rank"]``): a job
that grew starts its new ranks from a copy of an old rank's state, which for RNGs means
correlated streams until the user reseeds them (documented in client/python/README.md).

Load is strict: a name of the dict that the checkpoint lacks raises ckptd.Error NOT_FOUND before
anything is loaded into any object, so a half-restored training state never runs; names the
checkpoint has beyond the dict are kept in ``loaded_extra_state`` and otherwise ignored.
"""

import ckptd

# The saved form of a dict of objects, told apart from a user value that happens to be a dict.
_DICT_TAG = "ckptd.extra_state.dict/1"


def _stateful(obj):
    return callable(getattr(obj, "state_dict", None)) and callable(
        getattr(obj, "load_state_dict", None))


def _state_load(obj):
    return callable(getattr(obj, "state", None)) and callable(getattr(obj, "load", None))


def _one(obj):
    """The saved form of one object."""
    if _stateful(obj):
        return obj.state_dict()
    if _state_load(obj):
        return obj.state()
    return obj


def collect(extra_state):
    """What to save for ``extra_state`` (see the module docstring); None for None."""
    if extra_state is None:
        return None
    if isinstance(extra_state, dict):
        for name in extra_state:
            if not isinstance(name, str):
                raise TypeError("extra_state dict keys must be strings, not %r" % (name,))
        return {_DICT_TAG: {name: _one(obj) for name, obj in extra_state.items()}}
    if _stateful(extra_state) or _state_load(extra_state):
        return _one(extra_state)
    if callable(extra_state):
        return extra_state()
    raise TypeError("extra_state must be a dict of objects, an object with state_dict()/"
                    "load_state_dict() or state()/load(), or a callable returning a value")


def restore(extra_state, saved):
    """Puts ``saved`` back into the objects of ``extra_state``; returns what
    ``loaded_extra_state`` shows (for the dict form: {name: saved state})."""
    if isinstance(saved, dict) and _DICT_TAG in saved:
        entries = saved[_DICT_TAG]
        if isinstance(extra_state, dict):
            missing = sorted(name for name in extra_state if name not in entries)
            if missing:
                e = ckptd.Error("extra_state: the checkpoint has no state for %s (it has %s)"
                                % (", ".join(repr(n) for n in missing),
                                   ", ".join(repr(n) for n in sorted(entries)) or "none"))
                e.code = "NOT_FOUND"
                e.message = str(e)
                raise e
            for name, obj in extra_state.items():
                if _stateful(obj):
                    obj.load_state_dict(entries[name])
                elif _state_load(obj):
                    obj.load(entries[name])
        return dict(entries)
    if isinstance(extra_state, dict) and extra_state:
        e = ckptd.Error("extra_state: the checkpoint holds no dict of states for %s"
                        % ", ".join(repr(n) for n in sorted(extra_state)))
        e.code = "NOT_FOUND"
        e.message = str(e)
        raise e
    if extra_state is not None and not isinstance(extra_state, dict):
        if _stateful(extra_state):
            extra_state.load_state_dict(saved)
        elif _state_load(extra_state):
            extra_state.load(saved)
    return saved
