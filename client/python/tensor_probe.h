// TensorProbe: where a torch.Tensor's memory is, read from PyTorch's C++ objects in a few
// nanoseconds instead of through the Python bindings.
//
// LayoutCheck (layout_check.h) must prove on every save that each registered tensor still has
// its address, shape, dtype and contiguity. Through torch.Tensor.data_ptr and .shape that costs
// ~100 ns per tensor on a warm cache and ~500 ns once a checkpoint's copy has flushed the caches (a
// Python int and a torch.Size are built per call, each behind several dependent loads): 5 ms at
// 10,000 tensors. The fields themselves sit two pointers away from the Python object — PyObject →
// c10::TensorImpl (sizes, storage offset) → c10::StorageImpl (base address) — and a loop that
// prefetches those a few tensors ahead reads them for 10,000 tensors in ~0.3 ms.
//
// Reading them needs PyTorch's headers and libraries (libtorch-dev), which the _ckptd module
// must not depend on: ckptd works without torch installed, and a module linked to one libtorch
// must never be loaded into a process running another. So the reader is a second module,
// _ckptd_torch (torch_probe.cc), built only where the headers are found and imported by the
// Python package only when the running torch is the very libtorch it was linked against
// (ckptd/__init__.py: _tensor_probe). It hands _ckptd this table of plain C functions in a
// PyCapsule named kTensorProbeCapsule; nothing of PyTorch crosses the boundary.
//
// An `impl` is the address of the tensor's c10::TensorImpl, opaque to the caller and valid only
// until the GIL is released: the caller asks for it afresh on every check and keeps none (a later
// torch can swap the TensorImpls of two tensor objects).
#pragma once

#include <Python.h>

#include <cstddef>
#include <cstdint>

namespace ckpt::python {

// Versioned with the table below: a _ckptd and a _ckptd_torch of different builds do not share a
// table that changed (both modules export the name; ckptd/__init__.py compares them).
inline constexpr const char* kTensorProbeCapsule = "ckptd._ckptd_torch.TensorProbe.2";

// The most dimensions a probed shape may have; a tensor with more is not probed.
inline constexpr int kTensorProbeMaxDims = 16;

struct TensorProbe {
  // The TensorImpl behind `tensor`, or nullptr when it is not a torch.Tensor with storage.
  // Needs the GIL; never raises. For registration: it checks the object's type.
  const void* (*impl_of)(PyObject* tensor);
  // The same for an object whose type impl_of has already accepted (the caller compares
  // Py_TYPE): no type check, one load.
  const void* (*impl_of_tensor)(PyObject* tensor);
  // The address of the tensor's first element as torch.Tensor.data_ptr() gives it (0 for an
  // empty tensor) into *data, its sizes into dims[0..n), and into *form its dtype and whether it
  // is contiguous (a number equal for equal pairs, nothing more); returns n, or -1 when the
  // tensor cannot be read this way (more than kTensorProbeMaxDims dimensions, no storage any
  // more, sizes that only PyTorch's dispatcher knows). Never raises.
  int (*read)(const void* impl, uintptr_t* data, int64_t* dims, int32_t* form);
  // Prefetch hints for a loop over many tensors whose types impl_of accepted: the TensorImpl
  // behind a tensor object (this reads the object: prefetch the object itself a little earlier),
  // and the storage behind it (reads the object and its TensorImpl: prefetch those earlier).
  void (*prefetch_impl)(PyObject* tensor);
  void (*prefetch_storage)(PyObject* tensor);
};

}  // namespace ckpt::python
