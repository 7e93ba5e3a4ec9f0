// Builds without the CUDA toolkit (CKPT_WITH_CUDA=OFF, or AUTO with none found): no runtime.
#include "daemon/device/cuda_api.h"

namespace ckpt::device {

std::unique_ptr<CudaApi> CreateCudaRuntimeApi() { return nullptr; }
bool CudaBackendCompiledIn() { return false; }

}  // namespace ckpt::device
