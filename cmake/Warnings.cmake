# ckpt_set_warnings(target): the project's warning set. Warnings are errors in CI
# (CKPT_WERROR=ON there) so the tree stays clean.
option(CKPT_WERROR "Treat warnings as errors" OFF)
function(ckpt_set_warnings target)
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic -Wno-missing-field-initializers>
    $<$<AND:$<COMPILE_LANGUAGE:CXX>,$<BOOL:${CKPT_WERROR}>>:-Werror>)
  if(CMAKE_CXX_COMPILER_ID MATCHES "Clang")
    target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-Wthread-safety>)
  endif()
endfunction()
