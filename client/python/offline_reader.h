// The native half of ckptd.offline: checkpoints read (and written) without a daemon.
//
// Binds into _ckptd:
//   CheckpointReader(step_dir)  ckpt::CheckpointReader over one committed step directory: its
//                               manifest (info, tensors, extra), read (one shard or the whole
//                               tensor into caller memory, every checksum piece verified) and
//                               verify (every stored byte);
//   offline_steps(root, job)    the committed steps (those with a MANIFEST), ascending;
//   offline_latest(root, job)   the newest committed step whose MANIFEST reads, or None;
//   offline_step_dir(root, job, step);
//   offline_write(root, job, step, tensors, extra, writer)  a committed world-size-1 step
//                               (offline_writer.h).
// Like the client calls, every call that touches storage releases the GIL. Memory is handed over
// as (address, byte count) of a contiguous CPU tensor that the Python caller keeps alive for the
// call: this module never imports torch. Errors raise ckptd.Error with the status code's name.
#pragma once

#include <pybind11/pybind11.h>

namespace ckpt::python {

// Call after ckptd.Error has been added to the module: errors are raised as that type.
void BindOfflineReader(pybind11::module_& m);

}  // namespace ckpt::python
