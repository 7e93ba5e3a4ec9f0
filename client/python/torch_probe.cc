// _ckptd_torch: the TensorProbe of tensor_probe.h, read straight from PyTorch's C++ tensor
// objects. Built only where PyTorch's headers are (libtorch-dev); linked to that libtorch, so
// ckptd/__init__.py imports it only into a process whose torch runs the very same library.
#include <pybind11/pybind11.h>
// PyTorch's headers after pybind11's (they include it themselves).
#include <c10/core/TensorImpl.h>
#include <torch/csrc/autograd/python_variable.h>

#include "client/python/tensor_probe.h"

namespace py = pybind11;

namespace {

const c10::TensorImpl* Impl(const void* impl) { return static_cast<const c10::TensorImpl*>(impl); }

const void* ImplOfTensor(PyObject* tensor) {
  return THPVariable_Unpack(tensor).unsafeGetTensorImpl();
}

// Only torch.Tensor and nn.Parameter themselves: a Python subclass may mean something else by
// its data (a __torch_function__ wrapper, a tensor-like) and is left to the Python bindings.
const void* ImplOf(PyObject* tensor) {
  if (!THPVariable_CheckExact(tensor)) return nullptr;
  const c10::TensorImpl* impl = Impl(ImplOfTensor(tensor));
  return impl != nullptr && impl->has_storage() && !impl->is_sparse() ? impl : nullptr;
}

int Read(const void* p, uintptr_t* data, int64_t* dims, int32_t* form) {
  const c10::TensorImpl* impl = Impl(p);
  try {
    // What TensorImpl::data() computes, which torch.Tensor.data_ptr() returns. sizes(),
    // numel(), storage_offset() and storage() are inline field reads for a dense tensor and
    // PyTorch's own customization points (which may throw) for anything else.
    if (!impl->has_storage()) return -1;
    const c10::IntArrayRef sizes = impl->sizes();
    if (sizes.size() > static_cast<size_t>(ckpt::python::kTensorProbeMaxDims)) return -1;
    for (size_t i = 0; i < sizes.size(); ++i) dims[i] = sizes[i];
    // Field reads for a dense tensor, like sizes(): a transposed view (`p.data = p.data.t()` of
    // a square matrix) or another dtype of the same bytes keeps the address and the shape.
    caffe2::TypeMeta dtype = impl->dtype();  // toScalarType() is not const in every torch
    *form = static_cast<int32_t>(dtype.toScalarType()) * 2 + (impl->is_contiguous() ? 1 : 0);
    if (impl->numel() == 0) {
      *data = 0;
    } else {
      const auto* base = static_cast<const char*>(impl->storage().data());
      *data = reinterpret_cast<uintptr_t>(base + impl->itemsize() * impl->storage_offset());
    }
    return static_cast<int>(sizes.size());
  } catch (...) {
    return -1;
  }
}

void PrefetchImpl(PyObject* tensor) {
  // The fields Read uses (sizes, contiguity, numel, storage offset, dtype, storage) span the
  // object's lines.
  const auto* impl = static_cast<const char*>(ImplOfTensor(tensor));
  for (size_t at = 0; at < sizeof(c10::TensorImpl); at += 64) __builtin_prefetch(impl + at);
}

void PrefetchStorage(PyObject* tensor) {
  __builtin_prefetch(Impl(ImplOfTensor(tensor))->unsafe_storage().unsafeGetStorageImpl());
}

const ckpt::python::TensorProbe kProbe{ImplOf, ImplOfTensor, Read, PrefetchImpl, PrefetchStorage};

}  // namespace

PYBIND11_MODULE(_ckptd_torch, m) {
  m.doc() =
      "The TensorProbe of ckptd's LayoutCheck: tensor addresses, shapes, dtypes and contiguity "
      "read from PyTorch's C++ objects (client/python/tensor_probe.h).";
  m.attr("capsule_name") = ckpt::python::kTensorProbeCapsule;
  m.def(
      "probe",
      [] {
        return py::capsule(const_cast<ckpt::python::TensorProbe*>(&kProbe),
                           ckpt::python::kTensorProbeCapsule);
      },
      "The TensorProbe table as a PyCapsule, for _ckptd.LayoutCheck(tensor_probe=...).");
}
