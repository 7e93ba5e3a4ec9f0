# CKPT_SANITIZE=address|undefined|thread (or "address,undefined"): applied to every target.
# CKPT_BUILD_FUZZ=ON (clang only): every target is compiled with coverage for libFuzzer plus
# AddressSanitizer and UndefinedBehaviorSanitizer, and tests/fuzz/ builds the harnesses (target
# ckpt_fuzz; tests/fuzz/run.sh runs them).
option(CKPT_BUILD_FUZZ "Build the libFuzzer harnesses in tests/fuzz (needs clang)" OFF)
if(CKPT_BUILD_FUZZ)
  if(NOT CMAKE_CXX_COMPILER_ID MATCHES "Clang")
    message(FATAL_ERROR "CKPT_BUILD_FUZZ needs clang: configure with -DCMAKE_CXX_COMPILER=clang++ "
                        "-DCMAKE_C_COMPILER=clang")
  endif()
  if(NOT CKPT_SANITIZE)
    set(CKPT_SANITIZE "address,undefined")
  endif()
  add_compile_options(-fsanitize=fuzzer-no-link)
endif()
if(CKPT_SANITIZE)
  string(REPLACE "," ";" _ckpt_sanitizers "${CKPT_SANITIZE}")
  foreach(_s IN LISTS _ckpt_sanitizers)
    if(NOT _s MATCHES "^(address|undefined|thread)$")
      message(FATAL_ERROR "CKPT_SANITIZE: unknown sanitizer '${_s}'")
    endif()
  endforeach()
  string(REPLACE ";" "," _ckpt_flag "${_ckpt_sanitizers}")
  # -g1: line tables are all a sanitizer report needs; full debug info makes these builds (which
  # CI runs on two cores next to the main one) much slower to compile and link. -O1, as the
  # sanitizers' documentation recommends: good stacks, and a quicker build than -O2.
  add_compile_options(-fsanitize=${_ckpt_flag} -fno-omit-frame-pointer -fno-sanitize-recover=undefined
                      -g1 -O1)
  add_link_options(-fsanitize=${_ckpt_flag})
  if("thread" IN_LIST _ckpt_sanitizers AND CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
    # GCC warns (-Wtsan) that TSan does not model std::atomic_thread_fence, which Boost.Asio's
    # headers use in its executor; the warning is about their code, and -Werror would stop the
    # build. Races through such a fence could be missed or misreported; tests/tsan.supp says so.
    add_compile_options(-Wno-tsan)
  endif()
  message(STATUS "ckptd: sanitizers ${_ckpt_flag}")
endif()
