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

# ckpt_use_cuda_runtime(target): the daemon's CUDA shim (daemon/device/cuda_api.h). With the
# toolkit: the real runtime implementation, cudart linked statically (so binaries start on
# machines without a driver; the driver is reached through cudaGetDriverEntryPointByVersion),
# and CKPT_HAVE_CUDA=1. Without: a stub that reports no runtime. Compiled in every CI run that
# has the toolkit, so a CUDA compile break fails the build.
function(ckpt_use_cuda_runtime target)
  if(CKPT_HAVE_CUDA)
    target_sources(${target} PRIVATE ${PROJECT_SOURCE_DIR}/daemon/device/cuda_runtime_api.cc)
    target_link_libraries(${target} PUBLIC CUDA::cudart_static)
    target_compile_definitions(${target} PUBLIC CKPT_HAVE_CUDA=1)
  else()
    target_sources(${target} PRIVATE ${PROJECT_SOURCE_DIR}/daemon/device/cuda_api_none.cc)
  endif()
endfunction()

# ckpt_use_cuda_headers(target): CUDA driver *types* only (cuda.h), for code that reaches the
# driver through dlopen("libcuda.so.1") — the client library, which must load into trainers on
# machines with or without a GPU and must not bring a second CUDA runtime into them.
function(ckpt_use_cuda_headers target)
  if(CKPT_HAVE_CUDA)
    target_include_directories(${target} SYSTEM PRIVATE ${CUDAToolkit_INCLUDE_DIRS})
    target_compile_definitions(${target} PRIVATE CKPT_HAVE_CUDA=1)
  endif()
  target_link_libraries(${target} PRIVATE ${CMAKE_DL_LIBS})
endfunction()
