# MOEKIT_SANITIZE: a sanitizer build of the library and the CPU tests (or, for "fuzzer", the fuzz targets).
#   ""                   (default) no sanitizer
#   "address,undefined"  AddressSanitizer (leak checking included) + UndefinedBehaviorSanitizer
#   "thread"             ThreadSanitizer
#   "fuzzer"             ASan + UBSan with libFuzzer's coverage instrumentation (Clang only): a build of the
#                        fuzz targets of tests/fuzz/, which link -fsanitize=fuzzer themselves
# Adds -fsanitize=<value> -fno-omit-frame-pointer (and -fno-sanitize-recover=undefined with UBSan, so a finding
# fails the program) to every C and C++ compile and link of this project. nvcc cannot take these flags and the
# sanitizers cannot see into the GPU, so a sanitizer build is reference-only (MOEKIT_CUDA forced to OFF); the
# bench CLI (which needs nlohmann_json) is left out. Included by the top CMakeLists.txt before CUDA detection.
# The normal build runs sanitizer builds of the CPU tests as the tests sanitize_* (tests/sanitize/) and a fuzzer
# build as the test fuzz_c_abi (tests/fuzz/).
set(MOEKIT_SANITIZE "" CACHE STRING
    "Sanitizer build (reference backend only): empty, address,undefined, thread or fuzzer")
set_property(CACHE MOEKIT_SANITIZE PROPERTY STRINGS "" "address,undefined" "thread" "fuzzer")

if(NOT MOEKIT_SANITIZE STREQUAL "")
  if(NOT MOEKIT_SANITIZE MATCHES "^(address,undefined|thread|fuzzer)$")
    message(FATAL_ERROR
            "moekit: MOEKIT_SANITIZE=${MOEKIT_SANITIZE}: expected empty, address,undefined, thread or fuzzer")
  endif()
  if(MOEKIT_SANITIZE STREQUAL "fuzzer" AND
     (NOT CMAKE_C_COMPILER_ID MATCHES "Clang" OR NOT CMAKE_CXX_COMPILER_ID MATCHES "Clang"))
    message(FATAL_ERROR "moekit: MOEKIT_SANITIZE=fuzzer needs Clang (libFuzzer)")
  endif()
  if(NOT CMAKE_C_COMPILER_ID MATCHES "GNU|Clang" OR NOT CMAKE_CXX_COMPILER_ID MATCHES "GNU|Clang")
    message(FATAL_ERROR "moekit: MOEKIT_SANITIZE needs GCC or Clang")
  endif()
  if(NOT MOEKIT_CUDA STREQUAL "OFF")
    message(STATUS "moekit: MOEKIT_SANITIZE=${MOEKIT_SANITIZE} - forcing MOEKIT_CUDA=OFF (reference backend only)")
    set(MOEKIT_CUDA OFF CACHE STRING "Build the CUDA backend: AUTO (if nvcc is found), ON, OFF" FORCE)
  endif()
  set(MOEKIT_BUILD_BENCH OFF CACHE BOOL "Build the moekit-bench CLI (bench/)" FORCE)

  set(_moekit_sanitizers "${MOEKIT_SANITIZE}")
  if(MOEKIT_SANITIZE STREQUAL "fuzzer")
    # Coverage for libFuzzer everywhere; only the fuzz targets link libFuzzer's main.
    set(_moekit_sanitizers "fuzzer-no-link,address,undefined")
  endif()
  set(_moekit_sanitize_flags "-fsanitize=${_moekit_sanitizers}" -fno-omit-frame-pointer)
  if(_moekit_sanitizers MATCHES "undefined")
    list(APPEND _moekit_sanitize_flags -fno-sanitize-recover=undefined)
  endif()
  add_compile_options("$<$<COMPILE_LANGUAGE:C,CXX>:${_moekit_sanitize_flags}>")
  add_link_options("$<$<LINK_LANGUAGE:C,CXX>:${_moekit_sanitize_flags}>")
  message(STATUS "moekit: sanitizer build: ${_moekit_sanitize_flags}")
endif()
