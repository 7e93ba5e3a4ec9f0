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
//     keep the address).
//
// dtype and device need no check of their own: a tensor cannot change either without new memory.
// `data_ptr` and `shape` are read through the C functions behind torch.Tensor's descriptors,
// found once, so the per-tensor cost is two C calls and two compares, no attribute lookup.
// Anything unexpected (an exception, a descriptor of another kind) answers "changed", and the
// caller takes the slow path, which re-describes every tensor and reports errors properly.
//
// The check holds strong references to what it remembers, so no remembered tensor can be freed
// and its id or address reused by another while the check exists.
#pragma once

#include <pybind11/pybind11.h>

#include <cstdint>
#include <vector>

namespace ckpt::python {

class LayoutCheck {
 public:
  // `tensors`: the dict just registered; `tensor_type`: torch.Tensor (the module never imports
  // torch itself).
  LayoutCheck(pybind11::dict tensors, pybind11::object tensor_type);

  // True when `tensors` still describes exactly the remembered memory (see above).
  bool Matches(pybind11::dict tensors) const;

  size_t size() const { return entries_.size(); }

 private:
  struct Entry {
    pybind11::object name;
    pybind11::object value;   // what the dict held: a tensor, or a Shard/FlatShard
    pybind11::object tensor;  // the tensor itself
    uintptr_t data_ptr = 0;
    pybind11::object shape;     // torch.Size when registered
    pybind11::object geometry;  // None for a plain tensor, else the shard's fields as a tuple
  };

  // (tensor, geometry) of a dict value; geometry None for a plain tensor. Throws on anything
  // else.
  std::pair<pybind11::object, pybind11::object> Split(PyObject* value) const;
  // The tensor's data_ptr() and shape, through the cached C functions when there are any.
  uintptr_t DataPtr(PyObject* tensor) const;
  pybind11::object Shape(PyObject* tensor) const;
  bool SameEntry(const Entry& e, PyObject* name, PyObject* value) const;

  pybind11::object tensor_type_;
  PyCFunction data_ptr_fn_ = nullptr;  // METH_NOARGS C function of torch.Tensor.data_ptr
  getter shape_get_ = nullptr;         // getter of the torch.Tensor.shape descriptor
  void* shape_closure_ = nullptr;
  std::vector<Entry> entries_;
};

// SlotWatch: "did any of these containers change?", for the structures a checkpointer walks to
// find its tensors (a module's _parameters, an optimizer's state and param_groups). Built from
// the walk: (container, length) pairs and (container, key, value) slots; `Unchanged()` is true
// when every container still has its length and every slot still holds the same object. Dicts
// are read with PyDict_GetItem, so a defaultdict (optimizer.state) never grows by being
// checked; lists by index.
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
  };
  std::vector<Length> lengths_;
  std::vector<Slot> slots_;
};

// Adds the classes to the module (as _ckptd.LayoutCheck and _ckptd.SlotWatch).
void BindLayoutCheck(pybind11::module_& m);

}  // namespace ckpt::python
