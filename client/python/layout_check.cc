#include "client/python/layout_check.h"

#include <algorithm>
#include <utility>

namespace py = pybind11;

namespace ckpt::python {
namespace {

// The shard fields that make up a Shard's or FlatShard's geometry (ckptd/__init__.py).
constexpr const char* kGeometryFields[] = {"global_shape", "offsets", "flat_offset", "partial"};

// getattr(obj, name, None) without raising.
py::object AttrOrNone(PyObject* obj, const char* name) {
  PyObject* v = PyObject_GetAttrString(obj, name);
  if (v == nullptr) {
    PyErr_Clear();
    return py::none();
  }
  return py::reinterpret_steal<py::object>(v);
}

// a == b for Python objects, false on an error.
bool Equal(PyObject* a, PyObject* b) {
  if (a == b) return true;
  const int r = PyObject_RichCompareBool(a, b, Py_EQ);
  if (r < 0) PyErr_Clear();
  return r == 1;
}

// CPython's version tag of a dict (PEP 509): a value no other dict and no other state of this
// dict ever had. Public in the headers until 3.12, which deprecates it: there, 0 (unknown).
uint64_t DictVersion(PyObject* dict) {
#if PY_VERSION_HEX < 0x030C0000
  return reinterpret_cast<PyDictObject*>(dict)->ma_version_tag;
#else
  (void)dict;
  return 0;
#endif
}

}  // namespace

LayoutCheck::LayoutCheck(py::dict tensors, py::object tensor_type, py::object tensor_probe)
    : tensor_type_(std::move(tensor_type)) {
  if (!PyType_Check(tensor_type_.ptr())) throw py::type_error("tensor_type must be a type");
  if (!tensor_probe.is_none()) {
    void* table = PyCapsule_GetPointer(tensor_probe.ptr(), kTensorProbeCapsule);
    if (table == nullptr) throw py::error_already_set();  // not the probe's capsule
    probe_ = static_cast<const TensorProbe*>(table);
    probe_owner_ = std::move(tensor_probe);
  }
  // The C functions behind torch.Tensor.data_ptr (a method descriptor) and .shape (a getset
  // descriptor). Another kind of descriptor (a future torch, a mock): the generic calls.
  py::object data_ptr = tensor_type_.attr("data_ptr");
  if (Py_IS_TYPE(data_ptr.ptr(), &PyMethodDescr_Type)) {
    PyMethodDef* def = reinterpret_cast<PyMethodDescrObject*>(data_ptr.ptr())->d_method;
    if ((def->ml_flags & (METH_VARARGS | METH_KEYWORDS | METH_O | METH_NOARGS)) == METH_NOARGS) {
      data_ptr_fn_ = def->ml_meth;
    }
  }
  PyObject* shape = PyObject_GetAttrString(tensor_type_.ptr(), "shape");
  if (shape != nullptr && Py_IS_TYPE(shape, &PyGetSetDescr_Type)) {
    PyGetSetDef* def = reinterpret_cast<PyGetSetDescrObject*>(shape)->d_getset;
    shape_get_ = def->get;
    shape_closure_ = def->closure;
  }
  Py_XDECREF(shape);
  PyErr_Clear();

  dict_ = tensors;
  dict_version_ = DictVersion(tensors.ptr());
  entries_.reserve(static_cast<size_t>(PyDict_Size(tensors.ptr())));
  PyObject* name = nullptr;
  PyObject* value = nullptr;
  Py_ssize_t pos = 0;
  while (PyDict_Next(tensors.ptr(), &pos, &name, &value)) {
    auto [tensor, geometry] = Split(value);
    Entry e;
    e.name = py::reinterpret_borrow<py::object>(name);
    e.value = py::reinterpret_borrow<py::object>(value);
    // Each read stops at its error: the next would run with it pending.
    auto check = [] {
      if (PyErr_Occurred() != nullptr) throw py::error_already_set();
    };
    e.data_ptr = DataPtr(tensor.ptr());
    check();
    e.shape = Shape(tensor.ptr());
    check();
    e.dtype = Dtype(tensor.ptr());
    check();
    e.contiguous = Contiguous(tensor.ptr());
    check();
    e.tensor = std::move(tensor);
    e.geometry = std::move(geometry);
    if (probe_ != nullptr && !Probe(e)) {
      // The probe reads something else than the bindings: a torch it does not understand.
      probe_ = nullptr;
      for (Entry& earlier : entries_) earlier.probed_type = nullptr;
      dims_.clear();
    }
    entries_.push_back(std::move(e));
  }
}

bool LayoutCheck::Probe(Entry& e) {
  const void* impl = probe_->impl_of(e.tensor.ptr());
  if (impl == nullptr) return true;  // not a tensor the probe reads: the bindings check it
  int64_t dims[kTensorProbeMaxDims];
  uintptr_t data = 0;
  int32_t form = 0;
  const int n = probe_->read(impl, &data, dims, &form);
  if (n < 0) return true;
  if (data != e.data_ptr || !PyTuple_Check(e.shape.ptr()) || PyTuple_GET_SIZE(e.shape.ptr()) != n) {
    return false;
  }
  for (int i = 0; i < n; ++i) {
    const long long d = PyLong_AsLongLong(PyTuple_GET_ITEM(e.shape.ptr(), i));
    if (d == -1 && PyErr_Occurred() != nullptr) {
      PyErr_Clear();
      return false;
    }
    if (d != dims[i]) return false;
  }
  e.probed_type = Py_TYPE(e.tensor.ptr());
  e.form = form;
  e.dims_at = static_cast<uint32_t>(dims_.size());
  e.ndim = n;
  dims_.insert(dims_.end(), dims, dims + n);
  return true;
}

size_t LayoutCheck::probed() const {
  return static_cast<size_t>(std::count_if(
      entries_.begin(), entries_.end(), [](const Entry& e) { return e.probed_type != nullptr; }));
}

bool LayoutCheck::SameProbed(const Entry& e, PyObject* tensor) const {
  // The type as registered (impl_of accepted it), so the object is a tensor the probe reads.
  if (Py_TYPE(tensor) != e.probed_type) return false;
  int64_t dims[kTensorProbeMaxDims];
  uintptr_t data = 0;
  int32_t form = 0;
  const int n = probe_->read(probe_->impl_of_tensor(tensor), &data, dims, &form);
  return n == e.ndim && data == e.data_ptr && form == e.form &&
         std::equal(dims, dims + n, dims_.begin() + e.dims_at);
}

void LayoutCheck::PrefetchAhead(size_t i) const {
  // Each level needs the one before it in cache: the object (its type and the pointer to the
  // TensorImpl), the TensorImpl (sizes, storage offset, the pointer to the storage), the storage
  // (the base address). Distances of 8 entries per level keep ~8 loads of each in flight.
  constexpr size_t kStep = 8;
  const size_t n = entries_.size();
  if (i + 3 * kStep < n && entries_[i + 3 * kStep].probed_type != nullptr) {
    __builtin_prefetch(entries_[i + 3 * kStep].tensor.ptr());
  }
  if (i + 2 * kStep < n && entries_[i + 2 * kStep].probed_type != nullptr) {
    probe_->prefetch_impl(entries_[i + 2 * kStep].tensor.ptr());
  }
  if (i + kStep < n && entries_[i + kStep].probed_type != nullptr) {
    probe_->prefetch_storage(entries_[i + kStep].tensor.ptr());
  }
}

std::pair<py::object, py::object> LayoutCheck::Split(PyObject* value) const {
  auto* type = reinterpret_cast<PyTypeObject*>(tensor_type_.ptr());
  if (PyObject_TypeCheck(value, type)) {
    return {py::reinterpret_borrow<py::object>(value), py::none()};
  }
  py::object tensor = AttrOrNone(value, "tensor");
  if (!PyObject_TypeCheck(tensor.ptr(), type)) {
    throw py::type_error("LayoutCheck: a value is neither a tensor nor a shard of one");
  }
  py::tuple geometry(1 + std::size(kGeometryFields));
  geometry[0] = py::reinterpret_borrow<py::object>(reinterpret_cast<PyObject*>(Py_TYPE(value)));
  for (size_t i = 0; i < std::size(kGeometryFields); ++i) {
    geometry[i + 1] = AttrOrNone(value, kGeometryFields[i]);
  }
  return {std::move(tensor), std::move(geometry)};
}

uintptr_t LayoutCheck::DataPtr(PyObject* tensor) const {
  PyObject* r = data_ptr_fn_ != nullptr ? data_ptr_fn_(tensor, nullptr)
                                        : PyObject_CallMethod(tensor, "data_ptr", nullptr);
  if (r == nullptr) return 0;
  const auto p = reinterpret_cast<uintptr_t>(PyLong_AsVoidPtr(r));
  Py_DECREF(r);
  return p;
}

py::object LayoutCheck::Shape(PyObject* tensor) const {
  PyObject* r = shape_get_ != nullptr ? shape_get_(tensor, shape_closure_)
                                      : PyObject_GetAttrString(tensor, "shape");
  if (r == nullptr) return py::none();
  return py::reinterpret_steal<py::object>(r);
}

py::object LayoutCheck::Dtype(PyObject* tensor) const {
  PyObject* r = PyObject_GetAttrString(tensor, "dtype");
  if (r == nullptr) return py::none();
  return py::reinterpret_steal<py::object>(r);
}

bool LayoutCheck::Contiguous(PyObject* tensor) const {
  PyObject* r = PyObject_CallMethod(tensor, "is_contiguous", nullptr);
  if (r == nullptr) return false;
  const bool contiguous = r == Py_True;
  Py_DECREF(r);
  return contiguous;
}

bool LayoutCheck::SameObjects(const Entry& e, PyObject* name, PyObject* value) const {
  if (!Equal(name, e.name.ptr())) return false;
  // The registered object itself. For a Shard/FlatShard (mutable) SameMemory compares its
  // fields, so that this half stays free of attribute reads for the same objects.
  if (value == e.value.ptr()) return true;
  if (e.geometry.is_none()) return false;  // another tensor object
  return SameShard(e, value);
}

bool LayoutCheck::SameShard(const Entry& e, PyObject* value) const {
  // A Shard/FlatShard, possibly built anew for this call: same tensor, equal geometry.
  py::object shard_tensor = AttrOrNone(value, "tensor");
  if (shard_tensor.ptr() != e.tensor.ptr()) return false;
  if (reinterpret_cast<PyObject*>(Py_TYPE(value)) != PyTuple_GET_ITEM(e.geometry.ptr(), 0)) {
    return false;
  }
  for (size_t i = 0; i < std::size(kGeometryFields); ++i) {
    py::object field = AttrOrNone(value, kGeometryFields[i]);
    if (!Equal(field.ptr(), PyTuple_GET_ITEM(e.geometry.ptr(), i + 1))) return false;
  }
  return true;
}

bool LayoutCheck::SameMemory(const Entry& e) const {
  // A registered Shard/FlatShard object may have been given another tensor or geometry since.
  if (!e.geometry.is_none() && !SameShard(e, e.value.ptr())) return false;
  PyObject* tensor = e.tensor.ptr();
  if (e.probed_type != nullptr) return SameProbed(e, tensor);
  const uintptr_t p = DataPtr(tensor);
  if (PyErr_Occurred() != nullptr) {
    PyErr_Clear();
    return false;
  }
  if (p != e.data_ptr) return false;
  py::object shape = Shape(tensor);
  if (shape.is_none()) {
    PyErr_Clear();
    return false;
  }
  if (!Equal(shape.ptr(), e.shape.ptr())) return false;
  // torch.dtype objects are singletons.
  const bool same = Dtype(tensor).ptr() == e.dtype.ptr() && Contiguous(tensor) == e.contiguous;
  if (PyErr_Occurred() != nullptr) {
    PyErr_Clear();
    return false;
  }
  return same;
}

bool LayoutCheck::SameObjects(py::dict tensors) const {
  // The very dict registered, not modified since (a trainer that saves the same dict each
  // step): the same names and objects without reading them.
  if (tensors.ptr() == dict_.ptr() && dict_version_ != 0 &&
      DictVersion(tensors.ptr()) == dict_version_) {
    return true;
  }
  if (static_cast<size_t>(PyDict_Size(tensors.ptr())) != entries_.size()) return false;
  PyObject* name = nullptr;
  PyObject* value = nullptr;
  Py_ssize_t pos = 0;
  size_t i = 0;
  while (PyDict_Next(tensors.ptr(), &pos, &name, &value)) {
    if (i >= entries_.size() || !SameObjects(entries_[i], name, value)) return false;
    ++i;
  }
  return i == entries_.size();
}

bool LayoutCheck::SameMemory() const {
  for (size_t i = 0; i < entries_.size(); ++i) {
    if (probe_ != nullptr) PrefetchAhead(i);
    if (!SameMemory(entries_[i])) return false;
  }
  return true;
}

bool LayoutCheck::Matches(py::dict tensors) const { return SameObjects(tensors) && SameMemory(); }

py::dict LayoutCheck::Registered() const {
  py::dict out;
  for (const Entry& e : entries_) out[e.name] = e.value;
  return out;
}

SlotWatch::SlotWatch(py::list lengths, py::list slots) {
  for (py::handle item : lengths) {
    auto pair = item.cast<py::tuple>();
    if (pair.size() != 2) throw py::value_error("SlotWatch: lengths are (container, length)");
    lengths_.push_back({pair[0], pair[1].cast<Py_ssize_t>()});
  }
  for (py::handle item : slots) {
    auto triple = item.cast<py::tuple>();
    if (triple.size() != 3) throw py::value_error("SlotWatch: slots are (container, key, value)");
    Slot slot{triple[0], triple[1], triple[2]};
    if (PyDict_Check(slot.container.ptr())) {
      slot.hash = PyObject_Hash(slot.key.ptr());
      if (slot.hash == -1) PyErr_Clear();  // unhashable: the lookup will say it is missing
    }
    slots_.push_back(std::move(slot));
  }
}

void SlotWatch::PrefetchAhead(size_t i) const {
  // The container of the slot 16 ahead, then the keys table of the one 8 ahead (its object
  // prefetched 8 slots ago). Most slots share their container with their neighbours.
  constexpr size_t kStep = 8;
  if (i + 2 * kStep < slots_.size()) __builtin_prefetch(slots_[i + 2 * kStep].container.ptr());
  if (i + kStep < slots_.size()) {
    PyObject* c = slots_[i + kStep].container.ptr();
    if (PyDict_Check(c)) __builtin_prefetch(reinterpret_cast<PyDictObject*>(c)->ma_keys);
  }
}

bool SlotWatch::Unchanged() const {
  for (const Length& l : lengths_) {
    const Py_ssize_t n = PyObject_Length(l.container.ptr());
    if (n < 0) PyErr_Clear();
    if (n != l.length) return false;
  }
  for (size_t i = 0; i < slots_.size(); ++i) {
    PrefetchAhead(i);
    const Slot& s = slots_[i];
    PyObject* c = s.container.ptr();
    PyObject* held = nullptr;  // borrowed
    if (PyDict_Check(c)) {
#if PY_VERSION_HEX < 0x030D0000  // CPython's known-hash lookup, public in its headers until 3.13
      held = s.hash != -1 ? _PyDict_GetItem_KnownHash(c, s.key.ptr(), s.hash)
                          : PyDict_GetItemWithError(c, s.key.ptr());
#else
      held = PyDict_GetItemWithError(c, s.key.ptr());
#endif
    } else if (PyList_Check(c)) {
      const Py_ssize_t i = PyLong_AsSsize_t(s.key.ptr());
      if (i >= 0 && i < PyList_GET_SIZE(c)) held = PyList_GET_ITEM(c, i);
    } else {
      PyObject* v = PyObject_GetItem(c, s.key.ptr());
      Py_XDECREF(v);  // still alive in the container, which the watch holds
      held = v;
    }
    if (PyErr_Occurred() != nullptr) PyErr_Clear();
    if (held != s.value.ptr()) return false;
  }
  return true;
}

void BindLayoutCheck(py::module_& m) {
  py::class_<SlotWatch>(m, "SlotWatch",
                        "(container, length) pairs and (container, key, value) slots; "
                        "unchanged() is true while every one still holds.")
      .def(py::init<py::list, py::list>(), py::arg("lengths"), py::arg("slots"))
      .def("unchanged", &SlotWatch::Unchanged);
  py::class_<LayoutCheck>(m, "LayoutCheck",
                          "What a registration was made of, to tell in one native pass whether "
                          "a later dict of tensors still describes the same memory.")
      .def(py::init<py::dict, py::object, py::object>(), py::arg("tensors"), py::arg("tensor_type"),
           py::arg("tensor_probe") = py::none())
      .def("matches", &LayoutCheck::Matches, py::arg("tensors"),
           "True when the dict has the same names in order, the same tensors at the same "
           "addresses with the same shapes, dtypes and contiguity, and the same shard geometry.")
      .def("same_objects", py::overload_cast<py::dict>(&LayoutCheck::SameObjects, py::const_),
           py::arg("tensors"),
           "The first half of matches(): the same names in order, the same tensor objects, the "
           "same shard geometry. Reads no tensor.")
      .def("same_memory", py::overload_cast<>(&LayoutCheck::SameMemory, py::const_),
           "The second half of matches(): every registered tensor still at its address with "
           "its shape, dtype and contiguity.")
      .def("registered", &LayoutCheck::Registered,
           "The registered dict {name: value}, as it was given.")
      .def("__len__", &LayoutCheck::size)
      .def_property_readonly("probed", &LayoutCheck::probed,
                             "How many entries are read through the TensorProbe.");
}

}  // namespace ckpt::python
