# CKPT_WITH_CUDA: AUTO builds the CUDA backend when the toolkit is found (CUDA 13 lives in
# /usr/local/cuda on the build machines); ON requires it; OFF skips it. The backend links
# cudart statically and reaches the driver only through cudaGetDriverEntryPointByVersion, so
# binaries start on machines without a driver.
set(CKPT_HAVE_CUDA OFF)
if(NOT CKPT_WITH_CUDA STREQUAL "OFF")
  if(NOT CUDAToolkit_ROOT AND EXISTS /usr/local/cuda)
    set(CUDAToolkit_ROOT /usr/local/cuda)
  endif()
  find_package(CUDAToolkit QUIET)
  if(CUDAToolkit_FOUND)
    set(CKPT_HAVE_CUDA ON)
    message(STATUS "ckptd: CUDA backend ON (toolkit ${CUDAToolkit_VERSION})")
  elseif(CKPT_WITH_CUDA STREQUAL "ON")
    message(FATAL_ERROR "CKPT_WITH_CUDA=ON but no CUDA toolkit was found")
  else()
    message(STATUS "ckptd: CUDA backend OFF (no toolkit found)")
  endif()
endif()
