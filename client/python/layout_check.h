// LayoutCheck: "is this still the registration the daemon has?", answered in one native pass.
//
// Every save hands the client a dict {name: tensor | Shard | FlatShard}. After the first save the
// daemon already holds a registration of those tensors, and a save only sends the step — if the
// dict still describes the same memory. Checking that in Python costs about 1 µs per tensor
// (attribute lookups, tuples, method calls): 10 ms per save at 10,000 tensors, a hundred times
// what the save itself costs. This class remembers what was registered and compares in C++:
//
//   - the same names in the same order (identity first, then string equality: a state_dict
//     builds new name strings on every call);
//   - for each entry the same tensor object (for a Shard/FlatShard, which callers often build
//     anew per save, the same `tensor` and equal `global_shape`, `offsets`, `flat_offset`,
//     `partial`);
//   - that tensor still at the same address (`data_ptr`: catches `param.data = ...`, `.to()`,
//     a storage moved into shared memory) with the same shape (catches views and `resize_` that
//     keep the address), the same dtype and still contiguous (catches the views that keep both:
//     `p.data = p.data.t()` of a square matrix, whose bytes the daemon would save in the wrong
//     order, and `p.data = p.data.view(torch.int32)`).
//
// The device needs no check of its own: a tensor cannot change it without new memory.
//
// Two ways to read an address and a shape:
//   - with a TensorProbe (tensor_probe.h; the _ckptd_torch module, where it is built and matches
//     the running torch), straight from PyTorch's C++ objects, in a loop that prefetches the
//     objects of the tensors a few entries ahead: ~0.1 µs per tensor when a checkpoint's copy
//     has just flushed the caches (~6 cold cache lines each), ~40 ns warm. The constructor
//     checks the probe against the bindings on every tensor it registers and drops it for good
//     on any difference.
//   - otherwise through the C functions behind torch.Tensor's data_ptr and shape descriptors,
//     found once: two C calls and two compares per tensor, no attribute lookup, but a Python
//     int and a torch.Size built per tensor (~0.1 µs warm, ~0.5 µs cold).
// Anything unexpected (an exception, a descriptor of another kind) answers "changed", and the
// caller takes the slow path, which re-describes every tensor and reports errors properly.
//
// The check holds strong references to what it remembers, so no remembered tensor can be freed
// and its id or address reused by another while the check exists.
#pragma once

#include <pybind11/pybind11.h>

#include <cstdint>
#include <vector>

#include "client/python/tensor_probe.h"

namespace ckpt::python {

class LayoutCheck {
 public:
  // `tensors`: the dict just registered; `tensor_type`: torch.Tensor (the module never imports
  // torch itself); `tensor_probe`: None, or _ckptd_torch.probe()'s capsule.
  LayoutCheck(pybind11::dict tensors, pybind11::object tensor_type,
              pybind11::object tensor_probe = pybind11::none());

  // True when `tensors` still describes exactly the remembered memory (see above):
  // SameObjects(tensors) && SameMemory().
  bool Matches(pybind11::dict tensors) const;
  // The two halves, for a caller that sends a held save after the first and checks the second
  // off the trainer's path (ckptd/__init__.py): the same names and objects (a Shard built anew:
  // the same tensor and geometry), reading only the dict and this check — a few ns per entry;
  // and every remembered tensor still at its address with its shape, and every remembered
  // Shard object still with its tensor and geometry — the part that reads each tensor's objects.
  // SameObjects of the very dict object registered, not modified since (CPython's dict version
  // tag, where the headers have it), reads nothing of it.
  bool SameObjects(pybind11::dict tensors) const;
  bool SameMemory() const;
  // The registered dict {name: value}, rebuilt from what is remembered.
  pybind11::dict Registered() const;

  size_t size() const { return entries_.size(); }
  // How many entries the TensorProbe reads (0 without one).
  size_t probed() const;

 private:
  struct Entry {
    pybind11::object name;
    pybind11::object value;   // what the dict held: a tensor, or a Shard/FlatShard
    pybind11::object tensor;  // the tensor itself
    uintptr_t data_ptr = 0;
    pybind11::object shape;     // torch.Size when registered
    pybind11::object dtype;     // torch.dtype when registered (the bindings' check)
    bool contiguous = false;    // when registered (the bindings' check)
    int32_t form = 0;           // the probe's dtype and contiguity when registered
    pybind11::object geometry;  // None for a plain tensor, else the shard's fields as a tuple
    // Where the probe reads this entry: the tensor's type when registered (nullptr: not probed)
    // and its sizes in dims_[dims_at, dims_at + ndim).
    PyTypeObject* probed_type = nullptr;
    uint32_t dims_at = 0;
    int ndim = 0;
  };

  // (tensor, geometry) of a dict value; geometry None for a plain tensor. Throws on anything
  // else.
  std::pair<pybind11::object, pybind11::object> Split(PyObject* value) const;
  // The tensor's data_ptr() and shape, through the cached C functions when there are any; its
  // dtype and is_contiguous() (false on an error, which is left set).
  uintptr_t DataPtr(PyObject* tensor) const;
  pybind11::object Shape(PyObject* tensor) const;
  pybind11::object Dtype(PyObject* tensor) const;
  bool Contiguous(PyObject* tensor) const;
  bool SameObjects(const Entry& e, PyObject* name, PyObject* value) const;
  bool SameMemory(const Entry& e) const;
  // A Shard/FlatShard `value` with e's tensor (the same object) and e's geometry.
  bool SameShard(const Entry& e, PyObject* value) const;
  // Registers e with the probe when it can read e's tensor and agrees with the bindings; false
  // when it disagrees (then the probe is not to be trusted for any entry).
  bool Probe(Entry& e);
  // SameMemory's check through the probe, for an entry with probed_type.
  bool SameProbed(const Entry& e, PyObject* tensor) const;
  // Prefetches what the probe will read of the entries ahead of index i.
  void PrefetchAhead(size_t i) const;

  pybind11::object tensor_type_;
  pybind11::object probe_owner_;  // the capsule, kept alive while probe_ points into it
  const TensorProbe* probe_ = nullptr;
  std::vector<int64_t> dims_;
  PyCFunction data_ptr_fn_ = nullptr;  // METH_NOARGS C function of torch.Tensor.data_ptr
  getter shape_get_ = nullptr;         // getter of the torch.Tensor.shape descriptor
  void* shape_closure_ = nullptr;
  std::vector<Entry> entries_;
  // The dict registered and its version tag then (0: unknown): SameObjects of that same dict,
  // unmodified, needs no pass over it.
  pybind11::dict dict_;
  uint64_t dict_version_ = 0;
};

// SlotWatch: "did any of these containers change?", for the structures a checkpointer walks to
// find its tensors (a module's _parameters, an optimizer's state and param_groups). Built from
// the walk: (container, length) pairs and (container, key, value) slots; `Unchanged()` is true
// when every container still has its length and every slot still holds the same object. Dicts
// are read with PyDict_GetItem, so a defaultdict (optimizer.state) never grows by being
// checked; lists by index. The keys' hashes are taken once (a tensor's __hash__ is a Python
// function: ~150 ns per call), and the containers of the slots ahead are prefetched.
class SlotWatch {
 public:
  SlotWatch(pybind11::list lengths, pybind11::list slots);
  bool Unchanged() const;

 private:
  struct Length {
    pybind11::object container;
    Py_ssize_t length;
  };
  struct Slot {
    pybind11::object container, key, value;
    Py_hash_t hash = -1;  // the key's, for a dict container (-1: look it up the usual way)
  };
  void PrefetchAhead(size_t i) const;
  std::vector<Length> lengths_;
  std::vector<Slot> slots_;
};

// Adds the classes to the module (as _ckptd.LayoutCheck and _ckptd.SlotWatch).
void BindLayoutCheck(pybind11::module_& m);

}  // namespace ckpt::python
