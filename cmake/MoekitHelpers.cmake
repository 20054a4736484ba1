# Small helpers shared by the library and the tests/, bench/, examples/ subdirectories.

# moekit_enable_warnings(<target>)
#   -Wall -Wextra for the target's C and C++ sources (host code only; nvcc's
#   generated host stubs are noisy, so CUDA sources are left at nvcc's defaults).
#   Warnings stay warnings: pass -DCMAKE_COMPILE_WARNING_AS_ERROR=ON to promote them.
function(moekit_enable_warnings target)
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:C,CXX>:-Wall -Wextra>)
endfunction()

# moekit_glob(<out-var> [RECURSE] <pattern>...)
#   Sorted CONFIGURE_DEPENDS glob (recursive with RECURSE), so a file added
#   under a globbed folder re-runs the configure step on the next build without
#   anyone touching CMake. Sorted so the link order is stable across machines.
function(moekit_glob out)
  set(_mode GLOB)
  if(ARGV1 STREQUAL "RECURSE")
    set(_mode GLOB_RECURSE)
    list(REMOVE_AT ARGN 0)
  endif()
  file(${_mode} _files CONFIGURE_DEPENDS LIST_DIRECTORIES false ${ARGN})
  list(SORT _files)
  set(${out} ${_files} PARENT_SCOPE)
endfunction()
